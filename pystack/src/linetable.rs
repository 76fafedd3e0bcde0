//! Instruction → line number, for each of CPython's three line-table formats.

use crate::offsets::LineTableFormat;

/// The line of the instruction at `offset` — a byte offset for `Lnotab` and `Pep626`, a code
/// unit index for `Locations` — or None when the instruction has no line.
pub(crate) fn line_for(format: LineTableFormat, table: &[u8], first_line: i32, offset: u64) -> Option<u32> {
    let line = match format {
        LineTableFormat::Lnotab => lnotab(table, first_line, offset),
        LineTableFormat::Pep626 => pep626(table, first_line, offset),
        LineTableFormat::Locations => locations(table, first_line, offset),
    }?;
    u32::try_from(line).ok()
}

/// 3.8, 3.9: (byte increment, signed line increment) pairs.
fn lnotab(table: &[u8], first_line: i32, offset: u64) -> Option<i32> {
    let mut line = first_line;
    let mut addr: u64 = 0;
    for pair in table.chunks_exact(2) {
        addr += u64::from(pair[0]);
        if addr > offset {
            break;
        }
        line += i32::from(pair[1] as i8);
    }
    Some(line)
}

/// 3.10: (byte delta, signed line delta) pairs; a line delta of -128 means "no line".
fn pep626(table: &[u8], first_line: i32, offset: u64) -> Option<i32> {
    let mut computed = first_line;
    let mut end: u64 = 0;
    for pair in table.chunks_exact(2) {
        let start = end;
        end += u64::from(pair[0]);
        let delta = pair[1] as i8;
        let line = if delta == -128 {
            None
        } else {
            computed += i32::from(delta);
            Some(computed)
        };
        if start <= offset && offset < end {
            return line;
        }
    }
    None
}

// Kinds of location-table entry (`_PyCodeLocationInfoKind`, Include/cpython/code.h); those
// below ONE_LINE0 are short forms: the same line, one column byte.
/// The line moves by 0 (`ONE_LINE0`) to 2 (`ONE_LINE2`); two column bytes follow.
const ONE_LINE0: u8 = 10;
const ONE_LINE2: u8 = 12;
/// A signed line delta, no columns.
const NO_COLUMNS: u8 = 13;
/// A signed line delta, then the end line delta and both columns.
const LONG: u8 = 14;
/// No location: the instructions have no line.
const NONE: u8 = 15;

/// 3.11+: the location table. Each entry starts with a byte `1ccccnnn`: kind `c`, and n + 1 code
/// units covered; the kind says how the line changes and which varints follow.
fn locations(table: &[u8], first_line: i32, offset: u64) -> Option<i32> {
    let mut reader = Varints { bytes: table, at: 0 };
    let mut line = first_line;
    let mut addr: u64 = 0;
    while let Some(first) = reader.byte() {
        if first & 0x80 == 0 {
            return None; // not the start of an entry: a corrupt table
        }
        let kind = (first >> 3) & 0x0f;
        let units = u64::from(first & 0x07) + 1;
        let entry_line = match kind {
            NONE => None,
            LONG => {
                line += reader.signed()?;
                reader.unsigned()?; // end line delta
                reader.unsigned()?; // column + 1
                reader.unsigned()?; // end column + 1
                Some(line)
            }
            NO_COLUMNS => {
                line += reader.signed()?;
                Some(line)
            }
            ONE_LINE0..=ONE_LINE2 => {
                line += i32::from(kind - ONE_LINE0);
                reader.byte()?;
                reader.byte()?;
                Some(line)
            }
            _ => {
                reader.byte()?;
                Some(line)
            }
        };
        if addr <= offset && offset < addr + units {
            return entry_line;
        }
        addr += units;
    }
    None
}

struct Varints<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Varints<'_> {
    fn byte(&mut self) -> Option<u8> {
        let byte = *self.bytes.get(self.at)?;
        self.at += 1;
        Some(byte)
    }

    /// 6 bits a byte, least significant first; bit 6 says another byte follows.
    fn unsigned(&mut self) -> Option<u32> {
        let mut byte = self.byte()?;
        let mut value = u32::from(byte & 63);
        let mut shift = 6;
        while byte & 64 != 0 {
            byte = self.byte()?;
            value |= u32::from(byte & 63).checked_shl(shift)?;
            shift += 6;
        }
        Some(value)
    }

    /// Zig-zag: the low bit is the sign.
    fn signed(&mut self) -> Option<i32> {
        let value = self.unsigned()?;
        let magnitude = (value >> 1) as i32;
        Some(if value & 1 == 1 { -magnitude } else { magnitude })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lnotab_accumulates_until_past_the_offset() {
        // first line 10; bytes 0..6 → 10, 6..10 → 12, 10.. → 11 (negative increment)
        let table = [6, 2, 4, 0xff];
        assert_eq!(line_for(LineTableFormat::Lnotab, &table, 10, 0), Some(10));
        assert_eq!(line_for(LineTableFormat::Lnotab, &table, 10, 7), Some(12));
        assert_eq!(line_for(LineTableFormat::Lnotab, &table, 10, 12), Some(11));
    }

    #[test]
    fn pep626_ranges_and_missing_lines() {
        // [0,4) line 3, [4,8) no line, [8,10) line 5
        let table = [4, 2, 4, 0x80, 2, 2];
        assert_eq!(line_for(LineTableFormat::Pep626, &table, 1, 2), Some(3));
        assert_eq!(line_for(LineTableFormat::Pep626, &table, 1, 6), None);
        assert_eq!(line_for(LineTableFormat::Pep626, &table, 1, 8), Some(5));
        assert_eq!(line_for(LineTableFormat::Pep626, &table, 1, 10), None);
    }

    #[test]
    fn location_table_entry_forms() {
        // Entry headers: 0x80 | kind << 3 | (units - 1); each kind with the bytes that follow it.
        #[rustfmt::skip]
        let table = [
            0x80 | (NO_COLUMNS << 3), 2,            // line +1, 1 unit      → unit 0: line 8
            0x80 | (ONE_LINE0 + 1) << 3 | 1, 0, 0,  // line +1, 2 units     → units 1-2: line 9
            0x80 | (3 << 3), 0,                     // short form: same line, 1 unit → unit 3: line 9
            0x80 | (NONE << 3),                     // no location, 1 unit  → unit 4: none
            0x80 | (LONG << 3), 3, 0, 1, 1,         // line -1, 1 unit      → unit 5: line 8
        ];
        let at = |unit| line_for(LineTableFormat::Locations, &table, 7, unit);
        assert_eq!(
            [at(0), at(1), at(2), at(3), at(4), at(5), at(6)],
            [Some(8), Some(9), Some(9), Some(9), None, Some(8), None]
        );
    }

    #[test]
    fn varints_span_bytes() {
        let mut reader = Varints { bytes: &[0x40 | 5, 2], at: 0 };
        assert_eq!(reader.unsigned(), Some(5 | (2 << 6)));
        let mut reader = Varints { bytes: &[7], at: 0 };
        assert_eq!(reader.signed(), Some(-3));
    }
}
