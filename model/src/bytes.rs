//! Byte counts the way people read them.

/// 1536 → "1.5 KiB"; below 1 KiB, exact bytes.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// "40GiB", "81559 MiB", "80GB", "512M", "1073741824" → bytes. Binary units (KiB, MiB, GiB,
/// TiB, and K, M, G, T as `nvidia-smi` and PyTorch print them) and decimal ones (KB, MB, GB, TB);
/// a bare number is bytes. Fractions are allowed ("79.6GiB").
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 =
        number.parse().map_err(|_| format!("`{text}` is not a size: write it as 40GiB, 81559MiB or 80GB"))?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tib" => 1024.0f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        other => {
            return Err(format!("`{text}`: unknown unit `{other}` (use B, KiB, MiB, GiB, TiB, or KB, MB, GB, TB)"))
        }
    };
    Ok((value * scale).round() as u64)
}

/// The least memory a device is taken to have: a smaller `--device-memory` is a slip (a unit
/// left out), not a device.
pub const LEAST_DEVICE_MEMORY: u64 = 64 << 20;

/// A device's memory as a person writes it: `parse_size` with a unit required (a bare number is
/// too easily taken for GiB) and at least `LEAST_DEVICE_MEMORY`.
pub fn parse_device_memory(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    if !trimmed.is_empty() && trimmed.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return Err(format!(
            "`{text}` has no unit: write the device's memory as {trimmed}GiB, {trimmed}GB or {trimmed}MiB"
        ));
    }
    let bytes = parse_size(text)?;
    if bytes < LEAST_DEVICE_MEMORY {
        return Err(format!(
            "`{text}` is {}: no device has less than {}; write it as 40GiB, 81559MiB or 80GB",
            human(bytes),
            human(LEAST_DEVICE_MEMORY)
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_as_written() {
        assert_eq!(super::parse_size("40GiB"), Ok(40 << 30));
        assert_eq!(super::parse_size("81559 MiB"), Ok(81559 << 20));
        assert_eq!(super::parse_size("80GB"), Ok(80_000_000_000));
        assert_eq!(super::parse_size("512M"), Ok(512 << 20));
        assert_eq!(super::parse_size("1.5KiB"), Ok(1536));
        assert_eq!(super::parse_size("4096"), Ok(4096));
        assert!(super::parse_size("forty").unwrap_err().contains("not a size"));
        assert!(super::parse_size("40 GiBs").unwrap_err().contains("unknown unit `gibs`"));
    }

    #[test]
    fn a_device_memory_needs_a_unit_and_a_size_a_device_has() {
        assert_eq!(super::parse_device_memory("24GiB"), Ok(24 << 30));
        assert_eq!(
            super::parse_device_memory("24").unwrap_err(),
            "`24` has no unit: write the device's memory as 24GiB, 24GB or 24MiB"
        );
        assert_eq!(
            super::parse_device_memory("0GiB").unwrap_err(),
            "`0GiB` is 0 B: no device has less than 64.0 MiB; write it as 40GiB, 81559MiB or 80GB"
        );
        assert!(super::parse_device_memory("GiB").unwrap_err().contains("not a size"));
    }

    #[test]
    fn human_sizes() {
        assert_eq!(super::human(0), "0 B");
        assert_eq!(super::human(1023), "1023 B");
        assert_eq!(super::human(1536), "1.5 KiB");
        assert_eq!(super::human(2 << 20), "2.0 MiB");
        assert_eq!(super::human(80 << 30), "80.0 GiB");
    }
}
