//! Which framework's caching allocator made a driver allocation. A framework keeps device memory
//! it takes from the driver as its own pool of segments (PyTorch's caching allocator, XLA's and
//! TensorFlow's BFC allocators) and holds it until the process ends: memory a process exits
//! holding there is its cache, not a missing free. Told apart where the capture can see it:
//!
//! - PyTorch: the driver call is made while the caching allocator's segment functions run
//!   (`DeviceCachingAllocator::alloc_block`, `ExpandableSegment::map` of libc10_cuda.so): the
//!   eBPF capture marks calls nested in them (`ebpf/bpf/driver.bpf.c`), the shim calls whose
//!   stack passes through libc10_cuda.so. It calls the driver through libcudart, like any
//!   program that calls `cudaMalloc`, so the calling module alone cannot tell.
//! - XLA (JAX) and TensorFlow: their BFC allocators call the driver from their own libraries,
//!   so the calling module tells (`of_caller_module`).
//!
//! CuPy's pool calls `cudaMalloc` through libcudart from its Cython modules, which keep no
//! symbols to probe: its segments look like a program's own.

use serde::{Deserialize, Serialize};

/// A framework whose allocator keeps driver segments as its cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Framework {
    Pytorch,
    Xla,
    Tensorflow,
}

impl Framework {
    pub const ALL: [Framework; 3] = [Framework::Pytorch, Framework::Xla, Framework::Tensorflow];

    pub fn as_str(self) -> &'static str {
        match self {
            Framework::Pytorch => "pytorch",
            Framework::Xla => "xla",
            Framework::Tensorflow => "tensorflow",
        }
    }

    #[cfg(test)]
    pub(crate) fn from_name(name: &str) -> Option<Framework> {
        Framework::ALL.into_iter().find(|f| f.as_str() == name)
    }

    /// The allocator, as a sentence names it.
    pub(crate) fn allocator(self) -> &'static str {
        match self {
            Framework::Pytorch => "PyTorch's caching allocator",
            Framework::Xla => "XLA's BFC allocator",
            Framework::Tensorflow => "TensorFlow's BFC allocator",
        }
    }

    /// The framework whose allocator is the module that called the driver (its file name, as
    /// `Event::caller_module` has it): XLA's and TensorFlow's libraries allocate device memory
    /// through their BFC allocators only.
    pub fn of_caller_module(module: &str) -> Option<Framework> {
        const XLA: [&str; 4] = ["xla_extension", "xla_cuda_plugin", "libjax_common", "libxla"];
        const TENSORFLOW: [&str; 3] = ["libtensorflow_framework", "_pywrap_tensorflow_internal", "libtensorflow_cc"];
        if XLA.iter().any(|prefix| module.starts_with(prefix)) {
            Some(Framework::Xla)
        } else if TENSORFLOW.iter().any(|prefix| module.starts_with(prefix)) {
            Some(Framework::Tensorflow)
        } else {
            None
        }
    }
}

/// The file name of PyTorch's CUDA library, whose caching allocator makes PyTorch's segments.
pub fn is_pytorch_cuda_library(file_name: &str) -> bool {
    file_name.starts_with("libc10_cuda.so")
}

/// The caching allocator's functions that take segments from the driver, as the static symbol
/// table of libc10_cuda.so names them (local symbols: PyTorch 2.x keeps its `.symtab`):
/// `DeviceCachingAllocator::alloc_block` (every new segment, `cudaMalloc` or expandable) and
/// `ExpandableSegment::map` (the pages of an expandable segment). Matched as parts of the
/// mangled name, so the argument types may change between releases.
pub const PYTORCH_SEGMENT_FUNCTIONS: [&str; 2] = ["22DeviceCachingAllocator11alloc_blockE", "17ExpandableSegment3mapE"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_the_calling_module_tells_xla_and_tensorflow() {
        for framework in Framework::ALL {
            assert_eq!(Framework::from_name(framework.as_str()), Some(framework));
            assert_eq!(serde_json::to_string(&framework).unwrap(), format!("\"{}\"", framework.as_str()));
        }
        assert_eq!(Framework::of_caller_module("xla_extension.so"), Some(Framework::Xla));
        assert_eq!(Framework::of_caller_module("xla_cuda_plugin.so"), Some(Framework::Xla));
        assert_eq!(Framework::of_caller_module("libtensorflow_framework.so.2"), Some(Framework::Tensorflow));
        assert_eq!(Framework::of_caller_module("libcudart.so.13"), None);
        assert_eq!(Framework::of_caller_module("libnccl.so.2"), None);
        assert!(is_pytorch_cuda_library("libc10_cuda.so"));
        assert!(!is_pytorch_cuda_library("libc10.so"));
        // PyTorch 2.11's mangled names (nm of libc10_cuda.so on an H200 machine).
        let alloc_block = "_ZN3c104cuda20CUDACachingAllocator6Native22DeviceCachingAllocator11alloc_blockERNS2_12_GLOBAL__N_111AllocParamsEbRKSt10shared_ptrINS_15GatheredContextEERSt11unique_lockISt15recursive_mutexE";
        let map = "_ZN3c104cuda20CUDACachingAllocator6Native12_GLOBAL__N_117ExpandableSegment3mapENS3_12SegmentRangeE";
        let unmap = "_ZN3c104cuda20CUDACachingAllocator6Native22DeviceCachingAllocator11unmap_blockEPNS2_12_GLOBAL__N_15BlockERKSt10shared_ptrINS_15GatheredContextEE";
        let matches = |name: &str| PYTORCH_SEGMENT_FUNCTIONS.iter().any(|part| name.contains(part));
        assert!(matches(alloc_block) && matches(map) && !matches(unmap));
    }
}
