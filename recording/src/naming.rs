//! How files of a capture are named: the parts a name is made of, the same on every node (a
//! run's recording, a post-mortem's recording and report).

/// File-name-safe: letters, digits, '.', '_' and '-'; the rest become '_'.
pub fn file_name_safe(name: &str) -> String {
    let cleaned: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' }).collect();
    if cleaned.is_empty() {
        "run".to_string()
    } else {
        cleaned
    }
}

/// `YYYYmmdd-HHMMSS` of `ts` (ns since the Unix epoch) in UTC: files named after a moment of a
/// capture (post-mortems), the same on every node whatever its time zone.
pub fn utc_stamp(ts: u64) -> String {
    let seconds = ts / 1_000_000_000;
    let (year, month, day) = civil_from_days(seconds / 86_400);
    let time = seconds % 86_400;
    format!("{year:04}{month:02}{day:02}-{:02}{:02}{:02}", time / 3600, time / 60 % 60, time % 60)
}

/// The proleptic Gregorian date of a day counted from 1970-01-01, by eras of 400 years (146,097
/// days), each starting on March 1st so that the leap day ends its year.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let days = days + 719_468;
    let era = days / 146_097;
    let day_of_era = days % 146_097;
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 { month_from_march + 3 } else { month_from_march - 9 };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_keep_to_safe_characters() {
        assert_eq!(file_name_safe("my model"), "my_model");
        assert_eq!(file_name_safe("a/b:c"), "a_b_c");
        assert_eq!(file_name_safe(""), "run");
    }

    #[test]
    fn stamps_are_the_utc_moment() {
        assert_eq!(utc_stamp(1_795_742_177_000_000_000), "20261127-011617");
        assert_eq!(utc_stamp(0), "19700101-000000");
        // A leap day, and the last second of a leap year.
        assert_eq!(utc_stamp(951_782_400_000_000_000), "20000229-000000");
        assert_eq!(utc_stamp(1_735_689_599_999_999_999), "20241231-235959");
    }
}
