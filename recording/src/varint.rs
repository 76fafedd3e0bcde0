//! LEB128 unsigned integers and zigzag-encoded signed ones: small numbers in few bytes, which is
//! what deltas between consecutive events are.

use std::io::{self, Read};

pub(crate) fn put(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

pub(crate) fn put_signed(out: &mut Vec<u8>, value: i64) {
    put(out, ((value << 1) ^ (value >> 63)) as u64);
}

/// The difference `value - base`, wrapping, as a signed number (addresses and totals move both ways).
pub(crate) fn put_delta(out: &mut Vec<u8>, value: u64, base: u64) {
    put_signed(out, value.wrapping_sub(base) as i64);
}

/// How many bytes `put` writes for `value`.
pub(crate) fn len(value: u64) -> usize {
    (64 - value.max(1).leading_zeros() as usize).div_ceil(7)
}

/// Reads from a byte slice; `at` advances past the number. None when the slice ends first or
/// the number runs past 64 bits.
pub(crate) fn get(data: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *data.get(*at)?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

pub(crate) fn get_signed(data: &[u8], at: &mut usize) -> Option<i64> {
    let raw = get(data, at)?;
    Some(((raw >> 1) as i64) ^ -((raw & 1) as i64))
}

pub(crate) fn get_delta(data: &[u8], at: &mut usize, base: u64) -> Option<u64> {
    Some(base.wrapping_add(get_signed(data, at)? as u64))
}

/// Reads one number from a stream: Ok(None) at a clean end (no byte at all).
pub(crate) fn read(input: &mut impl Read) -> io::Result<Option<u64>> {
    let mut value = 0u64;
    for (index, shift) in (0..64).step_by(7).enumerate() {
        let mut byte = [0u8; 1];
        if input.read(&mut byte)? == 0 {
            if index == 0 {
                return Ok(None);
            }
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        value |= u64::from(byte[0] & 0x7f) << shift;
        if byte[0] & 0x80 == 0 {
            return Ok(Some(value));
        }
    }
    Err(io::Error::new(io::ErrorKind::InvalidData, "a number longer than 64 bits"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_round_trip_in_few_bytes() {
        for value in [0u64, 1, 127, 128, 300, 1 << 35, u64::MAX] {
            let mut out = Vec::new();
            put(&mut out, value);
            let mut at = 0;
            assert_eq!(get(&out, &mut at), Some(value));
            assert_eq!(at, out.len());
            assert_eq!(read(&mut &out[..]).unwrap(), Some(value));
        }
        let mut out = Vec::new();
        put(&mut out, 300);
        assert_eq!(out, [0xac, 0x02]);
        assert_eq!((len(0), len(127), len(128), len(300), len(u64::MAX)), (1, 1, 2, 2, 10));
        for value in [0i64, -1, 1, -64, 64, i64::MIN, i64::MAX] {
            let mut out = Vec::new();
            put_signed(&mut out, value);
            let mut at = 0;
            assert_eq!(get_signed(&out, &mut at), Some(value));
        }
        let mut out = Vec::new();
        put_delta(&mut out, 0x7f00_0000_1000, 0x7f00_0000_2000);
        assert_eq!(out.len(), 2);
        let mut at = 0;
        assert_eq!(get_delta(&out, &mut at, 0x7f00_0000_2000), Some(0x7f00_0000_1000));
    }

    #[test]
    fn a_cut_number_is_no_number() {
        let mut at = 0;
        assert_eq!(get(&[0x80, 0x80], &mut at), None);
        assert_eq!(read(&mut &[][..]).unwrap(), None);
        assert_eq!(read(&mut &[0x80u8][..]).unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    }
}
