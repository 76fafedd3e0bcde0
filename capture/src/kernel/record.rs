//! Ring-buffer records as Rust values. The layout is `gpuprof.h`'s: a `gp_record` header, then
//! the handle (GP_FLAG_HANDLE), the Python frames (`stack_depth` of them), and for exec records
//! the filename.

use gpuprof_ebpf::types::{gp_allocator, gp_code, gp_frame, gp_record, gp_record_kind};

/// `GP_FLAG_*` of gpuprof.h, as the header's `flags` byte holds them.
#[allow(dead_code)] // all of the header's flags, those only the kernel side reads too
pub mod flags {
    use gpuprof_ebpf::header as h;

    pub(crate) const OUT_UNREAD: u8 = h::GP_FLAG_OUT_UNREAD as u8;
    pub(crate) const EXIT_SIGNALED: u8 = h::GP_FLAG_EXIT_SIGNALED as u8;
    pub(crate) const HANDLE: u8 = h::GP_FLAG_HANDLE as u8;
    pub(crate) const STACK_TRUNCATED: u8 = h::GP_FLAG_STACK_TRUNCATED as u8;
    pub(crate) const STACK_LOST: u8 = h::GP_FLAG_STACK_LOST as u8;
    pub(crate) const AUTOGRAD: u8 = h::GP_FLAG_AUTOGRAD as u8;
    pub(crate) const STACK_KNOWN: u8 = h::GP_FLAG_STACK_KNOWN as u8;
    pub(crate) const ALLOCATOR_SEGMENT: u8 = h::GP_FLAG_ALLOCATOR_SEGMENT as u8;
}

pub const HANDLE_LEN: usize = gpuprof_ebpf::header::GP_HANDLE_LEN as usize;
const FILENAME_LEN: usize = gpuprof_ebpf::header::GP_FILENAME_LEN as usize;
const HEADER_LEN: usize = std::mem::size_of::<gp_record>();
const FRAME_LEN: usize = std::mem::size_of::<gp_frame>();

/// One record from the kernel.
#[derive(Debug, Clone, Default)]
pub struct Record {
    pub header: gp_record,
    pub handle: Option<[u8; HANDLE_LEN]>,
    /// (code object, instruction) pairs, innermost first.
    pub frames: Vec<(u64, u64)>,
    pub filename: Option<[u8; FILENAME_LEN]>,
    /// Code records: the description and its data (function name, file name, line table).
    pub code: Option<(gp_code, Vec<u8>)>,
    /// Allocator records: the allocator's totals after the call.
    pub totals: Option<gp_allocator>,
}

impl Record {
    /// Parses what the ring buffer handed over; None when it is shorter than it says it is.
    #[cfg(test)]
    pub(crate) fn parse(data: &[u8]) -> Option<Record> {
        let mut record = Record::default();
        record.parse_into(data).then_some(record)
    }

    /// Parses into this record, reusing its frame buffer (the capture's hot path allocates
    /// nothing per record once its buffers have grown). False when `data` is shorter than it
    /// says it is; the record is then empty.
    pub(crate) fn parse_into(&mut self, data: &[u8]) -> bool {
        let parsed = self.fill(data).is_some();
        if !parsed {
            self.clear();
        }
        parsed
    }

    fn clear(&mut self) {
        self.header = gp_record::default();
        self.handle = None;
        self.frames.clear();
        self.filename = None;
        self.code = None;
        self.totals = None;
    }

    fn fill(&mut self, data: &[u8]) -> Option<()> {
        self.clear();
        let header: gp_record = read(data, 0)?;
        let mut at = HEADER_LEN;
        self.header = header;
        if header.flags & flags::HANDLE != 0 {
            self.handle = Some(data.get(at..at + HANDLE_LEN)?.try_into().ok()?);
            at += HANDLE_LEN;
        }
        if header.kind == gp_record_kind::GP_RECORD_ALLOCATOR.0
            || header.kind == gp_record_kind::GP_RECORD_ALLOCATOR_OOM.0
        {
            self.totals = Some(read(data, at)?);
            at += std::mem::size_of::<gp_allocator>();
        }
        let depth = usize::from(header.stack_depth);
        let frames = data.get(at..at + depth * FRAME_LEN)?;
        self.frames.extend(
            frames.chunks_exact(FRAME_LEN).map(|f| {
                (u64::from_ne_bytes(f[..8].try_into().unwrap()), u64::from_ne_bytes(f[8..].try_into().unwrap()))
            }),
        );
        at += depth * FRAME_LEN;
        if header.kind == gp_record_kind::GP_RECORD_EXEC.0 {
            self.filename = Some(data.get(at..at + FILENAME_LEN)?.try_into().ok()?);
        }
        if header.kind == gp_record_kind::GP_RECORD_CODE.0 {
            let code: gp_code = read(data, at)?;
            at += std::mem::size_of::<gp_code>();
            let len = usize::from(code.function_len) + usize::from(code.file_len) + usize::from(code.table_len);
            self.code = Some((code, data.get(at..at + len)?.to_vec()));
        }
        Some(())
    }

    /// The handle bytes the call carried.
    pub(crate) fn handle_bytes(&self) -> Option<&[u8]> {
        let len = usize::from(self.header.handle_len).min(HANDLE_LEN);
        self.handle.as_ref().filter(|_| len > 0).map(|h| &h[..len])
    }
}

fn read<T: Copy>(data: &[u8], at: usize) -> Option<T> {
    let bytes = data.get(at..at + std::mem::size_of::<T>())?;
    // SAFETY: T is a plain-old-data #[repr(C)] type generated from gpuprof.h, and `bytes` holds
    // exactly its size; the ring buffer may hand it out unaligned.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header_bytes(header: &gp_record) -> Vec<u8> {
        // SAFETY: a plain-old-data struct viewed as its bytes.
        unsafe { std::slice::from_raw_parts((header as *const gp_record).cast::<u8>(), HEADER_LEN) }.to_vec()
    }

    #[test]
    fn header_then_handle_then_frames() {
        let header = gp_record {
            kind: gp_record_kind::GP_RECORD_DRIVER.0,
            flags: flags::HANDLE,
            handle_len: HANDLE_LEN as u8,
            stack_depth: 2,
            ..gp_record::default()
        };
        let mut bytes = header_bytes(&header);
        bytes.extend([0xab; 64]);
        for (code, instr) in [(0x1000u64, 0x1010u64), (0x2000, 0x2020)] {
            bytes.extend(code.to_ne_bytes());
            bytes.extend(instr.to_ne_bytes());
        }
        let record = Record::parse(&bytes).unwrap();
        assert_eq!(record.handle_bytes(), Some(&[0xab; HANDLE_LEN][..]));
        assert_eq!(record.frames, vec![(0x1000, 0x1010), (0x2000, 0x2020)]);
        // Cut short: the record says two frames, one came.
        assert!(Record::parse(&bytes[..bytes.len() - 16]).is_none());
        assert_eq!(HEADER_LEN, 96);
    }
}
