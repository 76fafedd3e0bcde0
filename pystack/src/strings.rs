//! CPython `str` objects as Rust strings. Code objects' names and file names are compact
//! strings: ASCII data right after the `PyASCIIObject` header, other kinds (Latin-1, UCS-2,
//! UCS-4) after the `PyCompactUnicodeObject` header.

use crate::memory::{Memory, MemoryError};
use crate::offsets::Offsets;

/// Longest string read, in code points: file paths and qualified names fit well within it.
pub(crate) const MAX_CHARS: u64 = 4096;

/// `PyASCIIObject.state`, a bit field laid out alike in every version read: interned:2, kind:3,
/// compact:1, ascii:1, then bits that differ.
const STATE_KIND_SHIFT: u32 = 2;
const STATE_KIND_MASK: u32 = 0b111;
const STATE_COMPACT: u32 = 1 << 5;
const STATE_ASCII: u32 = 1 << 6;

pub(crate) fn read_str(memory: &dyn Memory, offsets: &Offsets, addr: u64) -> Result<String, MemoryError> {
    if addr == 0 {
        return Err(MemoryError::Implausible { what: "string pointer", addr });
    }
    let length = memory.read_u64(addr + u64::from(offsets.unicode_length))?;
    let state = memory.read_u32(addr + u64::from(offsets.unicode_state))?;
    let kind = (state >> STATE_KIND_SHIFT) & STATE_KIND_MASK;
    let compact = state & STATE_COMPACT != 0;
    let ascii = state & STATE_ASCII != 0;
    if !compact || length > MAX_CHARS || !matches!(kind, 1 | 2 | 4) {
        return Err(MemoryError::Implausible { what: "string", addr });
    }
    let header = if ascii { offsets.unicode_ascii_size } else { offsets.unicode_compact_size };
    let data = memory.read_vec(addr + u64::from(header), (length * u64::from(kind)) as usize)?;
    Ok(decode(&data, kind))
}

/// A str's data of a PyUnicode kind (1: Latin-1, 2: UCS-2, 4: UCS-4) as a Rust string.
pub fn decode(data: &[u8], kind: u32) -> String {
    match kind {
        1 => data.iter().map(|&b| char::from(b)).collect(),
        2 => char::decode_utf16(data.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])))
            .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
            .collect(),
        _ => data
            .chunks_exact(4)
            .map(|c| {
                char::from_u32(u32::from_le_bytes([c[0], c[1], c[2], c[3]])).unwrap_or(char::REPLACEMENT_CHARACTER)
            })
            .collect(),
    }
}

/// The contents of a `bytes` object (line tables), at most `limit` bytes.
pub(crate) fn read_bytes(
    memory: &dyn Memory,
    offsets: &Offsets,
    addr: u64,
    limit: u64,
) -> Result<Vec<u8>, MemoryError> {
    if addr == 0 {
        return Err(MemoryError::Implausible { what: "bytes pointer", addr });
    }
    let size = memory.read_u64(addr + u64::from(offsets.bytes_size))?;
    if size > limit {
        return Err(MemoryError::Implausible { what: "bytes object", addr });
    }
    memory.read_vec(addr + u64::from(offsets.bytes_data), size as usize)
}

#[cfg(test)]
mod tests {
    use super::decode;

    #[test]
    fn every_kind_decodes() {
        assert_eq!(decode(b"caf\xe9", 1), "café");
        let ucs2: Vec<u8> = "模块".encode_utf16().flat_map(|u| u.to_le_bytes()).collect();
        assert_eq!(decode(&ucs2, 2), "模块");
        let ucs4: Vec<u8> = "🐍x".chars().flat_map(|c| (c as u32).to_le_bytes()).collect();
        assert_eq!(decode(&ucs4, 4), "🐍x");
    }
}
