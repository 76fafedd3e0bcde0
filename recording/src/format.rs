//! The recording's layout, in one place (docs/events.md describes it for people).
//!
//! A file is a 12-byte header — the magic `GPUPROF\0`, the version (u16, little-endian) and
//! flags (u16; bit 0: the rest is zstd-compressed) — then entries. An entry is a tag byte and
//! a varint length, then that many bytes:
//!
//! | tag | entry | payload |
//! |---|---|---|
//! | 1 | string | UTF-8 bytes; the n-th string has id n (from 1) |
//! | 2 | frame | function string id, file string id, line; the n-th frame has id n (from 1) |
//! | 3 | stack | frame count, then frame ids, innermost first; the n-th stack has id n (from 1; 0 is the empty stack) |
//! | 4 | event | see [`Field`] |
//! | 5 | end | events written, events the capture lost: present only when the recording was closed cleanly |
//!
//! Strings, frames and stacks are written once, just before the first event that needs them,
//! so a reader that streams the file has every id it meets. A reader skips entries whose tag it
//! does not know (their length says how far), so later versions can add entries.
//!
//! An event is: a varint of [`Field`] bits (which optional fields follow), one byte of source,
//! layer and op, then the fields always present — time, pid, tid, comm, api, size, result,
//! stack — and then the optional ones in bit order. Numbers are varints; time, pid, address and
//! the allocator totals are deltas from the previous event's (the totals: from the previous
//! event of the same process), so a training loop's event is ~20 bytes before compression.
//!
//! A field is added with the next bit, its bytes last: a reader that does not know the bit stops
//! before them (the entry's length says where the event ends) and reads the rest of the event
//! as before. Adding one needs no new version; `VERSION` changes only for a change an older
//! reader would misread.

pub(crate) const MAGIC: &[u8; 8] = b"GPUPROF\0";
pub(crate) const VERSION: u16 = 1;
pub(crate) const HEADER_LEN: usize = 12;
/// Header flag: the entries are one zstd stream.
pub(crate) const FLAG_ZSTD: u16 = 1;

pub(crate) mod tag {
    pub(crate) const STRING: u8 = 1;
    pub(crate) const FRAME: u8 = 2;
    pub(crate) const STACK: u8 = 3;
    pub(crate) const EVENT: u8 = 4;
    pub(crate) const END: u8 = 5;
}

/// Optional event fields, by their bit in the event's field mask; written in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum Field {
    NsPid = 0,
    Ppid = 1,
    Kind = 2,
    Device = 3,
    /// Delta from the previous event's address.
    Addr = 4,
    /// Length, then the bytes.
    Handle = 5,
    /// String id.
    HandleType = 6,
    HandleObject = 7,
    PeerPid = 8,
    VmmHandle = 9,
    Pitch = 10,
    Total = 11,
    /// Delta from the process's previous allocated total.
    Allocated = 12,
    /// Delta from the process's previous reserved total.
    Reserved = 13,
    /// Delta from the event's address (a block lies a little after its segment's start).
    Segment = 14,
    DurationNs = 15,
    ExitCode = 16,
    Signal = 17,
    /// String id.
    Filename = 18,
    /// Count, then (symbol string id, module string id, offset) each.
    Native = 19,
    /// String id.
    CallerModule = 20,
    /// String id.
    AutogradNode = 21,
    AutogradSeq = 22,
    AutogradThread = 23,
    /// 0 forward, 1 forward_near, 2 backward_caller.
    StackOrigin = 24,
    /// On a process's first call only.
    Rank = 25,
    /// String id; on a process's first call only.
    AllocatorSettings = 26,
    /// The framework's code (`codes::framework_code`).
    AllocatorSegment = 27,
    /// String id; on a process's first call only, as the three after it.
    Job = 28,
    LocalRank = 29,
    WorldSize = 30,
}

impl Field {
    pub(crate) const fn bit(self) -> u32 {
        1 << self as u32
    }
}

/// Source, layer and op in one byte: source in bits 6–7, layer in 4–5, op in 0–3.
pub(crate) mod codes {
    use gpuprof_model::stack::StackOrigin;
    use gpuprof_model::{Framework, Kind, Layer, Op, Source};

    /// A value's index is its code in recordings already written: append, never reorder.
    pub(crate) const SOURCES: [Source; 2] = [Source::Ebpf, Source::Shim];
    pub(crate) const LAYERS: [Layer; 3] = [Layer::Driver, Layer::Allocator, Layer::Process];
    pub(crate) const OPS: [Op; 15] = [
        Op::Alloc,
        Op::Free,
        Op::Reserve,
        Op::Unreserve,
        Op::Map,
        Op::Unmap,
        Op::IpcExport,
        Op::IpcOpen,
        Op::IpcClose,
        Op::CtxCreate,
        Op::CtxDestroy,
        Op::MemInfo,
        Op::Fork,
        Op::Exec,
        Op::Exit,
    ];

    fn index<T: PartialEq>(all: &[T], value: &T) -> u8 {
        all.iter().position(|v| v == value).expect("every value is in its table") as u8
    }

    pub(crate) fn pack(source: Source, layer: Layer, op: Op) -> u8 {
        (index(&SOURCES, &source) << 6) | (index(&LAYERS, &layer) << 4) | index(&OPS, &op)
    }

    pub(crate) fn unpack(byte: u8) -> Option<(Source, Layer, Op)> {
        Some((
            *SOURCES.get(usize::from(byte >> 6))?,
            *LAYERS.get(usize::from((byte >> 4) & 3))?,
            *OPS.get(usize::from(byte & 15))?,
        ))
    }

    pub(crate) fn kind_code(kind: Kind) -> u8 {
        index(&Kind::ALL, &kind)
    }

    pub(crate) fn kind_of(code: u8) -> Option<Kind> {
        Kind::ALL.get(usize::from(code)).copied()
    }

    const ORIGINS: [StackOrigin; 3] = [StackOrigin::Forward, StackOrigin::ForwardNear, StackOrigin::BackwardCaller];

    pub(crate) fn origin_code(origin: StackOrigin) -> u8 {
        index(&ORIGINS, &origin)
    }

    pub(crate) fn origin_of(code: u8) -> Option<StackOrigin> {
        ORIGINS.get(usize::from(code)).copied()
    }

    pub(crate) fn framework_code(framework: Framework) -> u8 {
        index(&Framework::ALL, &framework)
    }

    pub(crate) fn framework_of(code: u8) -> Option<Framework> {
        Framework::ALL.get(usize::from(code)).copied()
    }
}

#[cfg(test)]
mod tests {
    use gpuprof_model::{Layer, Op, Source};

    use super::codes::*;

    #[test]
    fn every_source_layer_and_op_packs_into_one_byte_and_back() {
        for source in SOURCES {
            for layer in LAYERS {
                for op in OPS {
                    assert_eq!(unpack(pack(source, layer, op)), Some((source, layer, op)));
                }
            }
        }
        assert_eq!(unpack(0xff), None);
        // The codes of recordings already written (the shim's events were `cupti` then).
        assert_eq!(pack(Source::Ebpf, Layer::Driver, Op::Alloc), 0);
        // Source in bits 6–7, layer in 4–5, op in 0–3: shim (1), allocator (1), free (1).
        assert_eq!(pack(Source::Shim, Layer::Allocator, Op::Free), (1 << 6) | (1 << 4) | 1);
    }
}
