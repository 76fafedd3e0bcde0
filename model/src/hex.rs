//! Hex text for addresses (`0x7f…`) and handle bytes, the way the event contract writes them.

use std::fmt::Write as _;

/// `0x` followed by lower-case hex digits, no padding.
pub fn format_addr(addr: u64) -> String {
    format!("{addr:#x}")
}

/// Parses `0x…` (or bare) hex into an address.
pub(crate) fn parse_addr(text: &str) -> Option<u64> {
    let digits = text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")).unwrap_or(text);
    if digits.is_empty() {
        return None;
    }
    u64::from_str_radix(digits, 16).ok()
}

/// Bytes as contiguous lower-case hex pairs.
pub fn format_bytes(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        let _ = write!(text, "{byte:02x}");
    }
    text
}

/// Parses contiguous hex pairs back into bytes.
pub(crate) fn parse_bytes(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

/// Serde adapter for `Option<u64>` addresses written as `0x…` strings.
pub(crate) mod serde_addr {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(addr: &Option<u64>, serializer: S) -> Result<S::Ok, S::Error> {
        match addr {
            Some(addr) => serializer.collect_str(&format_args!("{addr:#x}")),
            None => serializer.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<u64>, D::Error> {
        let text: Option<String> = Option::deserialize(deserializer)?;
        text.map(|text| {
            super::parse_addr(&text)
                .ok_or_else(|| serde::de::Error::custom(format!("address {text:?} is not 0x-prefixed hex")))
        })
        .transpose()
    }
}

/// Serde adapter for `Option<Vec<u8>>` handle bytes written as hex strings.
pub(crate) mod serde_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(bytes: &Option<Vec<u8>>, serializer: S) -> Result<S::Ok, S::Error> {
        match bytes {
            Some(bytes) => serializer.serialize_str(&super::format_bytes(bytes)),
            None => serializer.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Vec<u8>>, D::Error> {
        let text: Option<String> = Option::deserialize(deserializer)?;
        text.map(|text| {
            super::parse_bytes(&text)
                .ok_or_else(|| serde::de::Error::custom(format!("handle {text:?} is not hex bytes")))
        })
        .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip() {
        assert_eq!(format_addr(0x7f12_3400_0000), "0x7f1234000000");
        assert_eq!(format_addr(0), "0x0");
        assert_eq!(parse_addr("0x7f1234000000"), Some(0x7f12_3400_0000));
        assert_eq!(parse_addr("0x"), None);
        assert_eq!(parse_addr("0xzz"), None);
    }

    #[test]
    fn bytes_round_trip() {
        assert_eq!(format_bytes(&[0x00, 0xab, 0x10]), "00ab10");
        assert_eq!(parse_bytes("00ab10"), Some(vec![0x00, 0xab, 0x10]));
        assert_eq!(parse_bytes("0ab"), None);
        assert_eq!(parse_bytes("zz"), None);
    }
}
