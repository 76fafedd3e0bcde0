//! A number of seconds someone gave (a flag, a setting, a request), checked once before it
//! becomes a `Duration`: converting one beyond what a `Duration` holds panics, and so does
//! adding one near that bound to an `Instant` (a deadline, an expiry). Every such number goes
//! through here.

use std::time::Duration;

/// The most seconds taken: a century (of 365.25 days). Longer than any interval, window or
/// deadline means, and far within what an `Instant` plus a `Duration` holds.
pub const MAX_SECONDS: f64 = 3_155_760_000.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SecondsError {
    #[error("give a positive number of seconds")]
    NotPositive,
    #[error("too long: give at most {MAX_SECONDS} seconds")]
    TooLong,
}

/// `value` seconds, positive and at most `MAX_SECONDS`.
pub fn positive_seconds(value: f64) -> Result<Duration, SecondsError> {
    if !(value.is_finite() && value > 0.0) {
        return Err(SecondsError::NotPositive);
    }
    seconds_at_most_a_century(value)
}

/// `value` seconds, finite and not negative (0 is taken), at most `MAX_SECONDS`.
pub fn seconds_at_most_a_century(value: f64) -> Result<Duration, SecondsError> {
    if !(value.is_finite() && value >= 0.0) {
        return Err(SecondsError::NotPositive);
    }
    if value > MAX_SECONDS {
        return Err(SecondsError::TooLong);
    }
    Ok(Duration::from_secs_f64(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_are_positive_and_at_most_a_century_and_a_deadline_from_them_holds() {
        assert_eq!(positive_seconds(120.0), Ok(Duration::from_secs(120)));
        assert_eq!(positive_seconds(0.0), Err(SecondsError::NotPositive));
        assert_eq!(positive_seconds(f64::NAN), Err(SecondsError::NotPositive));
        assert_eq!(positive_seconds(-1.0), Err(SecondsError::NotPositive));
        assert_eq!(positive_seconds(f64::INFINITY), Err(SecondsError::NotPositive));
        assert_eq!(positive_seconds(1e19), Err(SecondsError::TooLong));
        assert_eq!(seconds_at_most_a_century(0.0), Ok(Duration::ZERO));
        let longest = positive_seconds(MAX_SECONDS).unwrap();
        assert_eq!(longest, Duration::from_secs(3_155_760_000));
        assert!(std::time::Instant::now().checked_add(longest).is_some());
        assert_eq!(SecondsError::TooLong.to_string(), "too long: give at most 3155760000 seconds");
    }
}
