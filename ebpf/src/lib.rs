//! gpuprof's BPF side: the skeletons generated from `bpf/*.bpf.c` and the record types of
//! `bpf/gpuprof.h`, the one contract between kernel and user space.
//!
//! - `driver`: entry/return probes shared by every libcuda memory entry point.
//! - `allocator`: the entry probe on PyTorch's c10::reportMemoryUsageToProfiler (tensor blocks).
//! - `process`: fork/exec/exit tracepoints that follow the tracked process tree.

// The skeletons are generated in build.rs: their lints are the generator's to answer, and nothing
// (a `// SAFETY:` comment, a split of a long function) can be written into them.
#[allow(
    clippy::all,
    clippy::undocumented_unsafe_blocks,
    clippy::too_many_lines,
    non_camel_case_types,
    non_upper_case_globals,
    dead_code,
    missing_docs
)]
pub mod driver {
    include!(concat!(env!("OUT_DIR"), "/driver.skel.rs"));
}

#[allow(
    clippy::all,
    clippy::undocumented_unsafe_blocks,
    clippy::too_many_lines,
    non_camel_case_types,
    non_upper_case_globals,
    dead_code,
    missing_docs
)]
pub mod allocator {
    include!(concat!(env!("OUT_DIR"), "/allocator.skel.rs"));
}

#[allow(
    clippy::all,
    clippy::undocumented_unsafe_blocks,
    clippy::too_many_lines,
    non_camel_case_types,
    non_upper_case_globals,
    dead_code,
    missing_docs
)]
pub mod process {
    include!(concat!(env!("OUT_DIR"), "/process.skel.rs"));
}

/// The record and cookie types shared with the BPF programs (generated from `gpuprof.h`).
pub use driver::types;

/// The numeric `#define GP_*` of `gpuprof.h` (record flags, lengths, limits), as constants, and
/// those it leaves to the model (`GP_HANDLE_LEN`).
pub mod header {
    include!(concat!(env!("OUT_DIR"), "/header.rs"));
}

#[cfg(test)]
mod tests {
    //! What the driver probes read of CUDA's structs, as clang laid it out for BPF (the skeleton's
    //! types, generated from the object's BTF), against cuda.h (cudarc's bindings of it) and
    //! against the libcuda stand-in the tests run (its header, compiled by cc): a change on any
    //! side fails here rather than as a wrong device or handle in a capture.
    use std::mem::{offset_of, size_of, MaybeUninit};

    use cudarc::driver::sys as cuda;

    use gpuprof_testkit::standin_values;

    use super::driver::types;
    use super::header::GP_HANDLE_LEN;

    /// The size of what a raw pointer points at, without reading it.
    fn size_of_pointee<T>(_: *const T) -> usize {
        size_of::<T>()
    }

    /// (offset, size) of each named field of a struct.
    macro_rules! layout {
        ($type:ty { $($field:ident),* }) => {{
            let value = MaybeUninit::<$type>::uninit();
            // SAFETY: only the fields' addresses are taken, nothing is read.
            vec![$((offset_of!($type, $field), size_of_pointee(unsafe { std::ptr::addr_of!((*value.as_ptr()).$field) }))),*]
        }};
    }

    /// (offset, size) pairs of `fields` of the stand-in's `type_name`, flattened as `layout!` is.
    fn standin_layout(type_name: &str, fields: &[&str]) -> Vec<(usize, usize)> {
        let expressions: Vec<String> = fields
            .iter()
            .flat_map(|field| {
                [format!("offsetof({type_name}, {field})"), format!("sizeof((({type_name} *)0)->{field})")]
            })
            .collect();
        let expressions: Vec<&str> = expressions.iter().map(String::as_str).collect();
        let values = standin_values("libcuda_standin.h", &expressions);
        values.chunks(2).map(|pair| (pair[0], pair[1])).collect()
    }

    #[test]
    fn the_allocation_properties_cu_mem_create_is_given_are_read_as_cuda_h_lays_them_out() {
        let bpf = layout!(types::CUmemAllocationProp_st {
            r#type,
            requestedHandleTypes,
            location,
            win32HandleMetaData,
            allocFlags
        });
        let cuda_h = layout!(cuda::CUmemAllocationProp_st {
            type_,
            requestedHandleTypes,
            location,
            win32HandleMetaData,
            allocFlags
        });
        assert_eq!(bpf, [(0, 4), (4, 4), (8, 8), (16, 8), (24, 8)]);
        assert_eq!(bpf, cuda_h);
        let fields = ["type", "requestedHandleTypes", "location", "win32HandleMetaData", "allocFlags"];
        assert_eq!(bpf, standin_layout("CUmemAllocationProp", &fields));

        let bpf = layout!(types::CUmemLocation_st { r#type, id });
        assert_eq!(bpf, [(0, 4), (4, 4)]);
        assert_eq!(bpf, layout!(cuda::CUmemLocation_st { type_, id }));
        assert_eq!(bpf, standin_layout("CUmemLocation", &["type", "id"]));

        // The device the probe reads: `location.id`.
        assert_eq!(offset_of!(types::CUmemAllocationProp_st, location) + offset_of!(types::CUmemLocation_st, id), 12);
        assert_eq!(size_of::<types::CUmemAllocationProp_st>(), 32);
        assert_eq!(size_of::<types::CUmemAllocationProp_st>(), size_of::<cuda::CUmemAllocationProp_st>());
    }

    #[test]
    fn the_ipc_handle_passed_by_value_is_read_above_the_return_address() {
        assert_eq!(layout!(types::stack_at_entry { return_address, ipc_open_handle }), [(0, 8), (8, 64)]);
        let handle = size_of::<types::CUipcMemHandle_st>();
        assert_eq!(handle as u64, GP_HANDLE_LEN);
        assert_eq!(handle, size_of::<cuda::CUipcMemHandle_st>());
        assert_eq!([handle], standin_values("libcuda_standin.h", &["sizeof(CUipcMemHandle)"])[..]);
    }
}
