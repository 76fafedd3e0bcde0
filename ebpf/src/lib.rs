//! gpuprof's BPF side: the skeletons generated from `bpf/*.bpf.c` and the record types of
//! `bpf/gpuprof.h`, the one contract between kernel and user space.
//!
//! - `driver`: entry/return probes shared by every libcuda memory entry point.
//! - `allocator`: the entry probe on PyTorch's c10::reportMemoryUsageToProfiler (tensor blocks).
//! - `process`: fork/exec/exit tracepoints that follow the tracked process tree.

#[allow(clippy::all, non_camel_case_types, non_upper_case_globals, dead_code, missing_docs)]
pub mod driver {
    include!(concat!(env!("OUT_DIR"), "/driver.skel.rs"));
}

#[allow(clippy::all, non_camel_case_types, non_upper_case_globals, dead_code, missing_docs)]
pub mod allocator {
    include!(concat!(env!("OUT_DIR"), "/allocator.skel.rs"));
}

#[allow(clippy::all, non_camel_case_types, non_upper_case_globals, dead_code, missing_docs)]
pub mod process {
    include!(concat!(env!("OUT_DIR"), "/process.skel.rs"));
}

/// The record and cookie types shared with the BPF programs (generated from `gpuprof.h`).
pub use driver::types;

/// The numeric `#define GP_*` of `gpuprof.h` (record flags, lengths, limits), as constants.
pub mod header {
    include!(concat!(env!("OUT_DIR"), "/header.rs"));
}
