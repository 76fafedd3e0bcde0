//! The interposed `c10::reportMemoryUsageToProfiler`: PyTorch's caching allocator calls it on
//! every block it hands out (positive size) or takes back (negative), with its running totals.
//! Preloaded, this definition is found before libc10's own by every library that imports it
//! (libc10_cuda's allocator does); the call is recorded, then forwarded.

use std::ffi::c_void;

use gpuprof_model::event::wall_clock_ns;

use crate::queue::Call;
use crate::{autograd, cupti, forward, recorder};

/// `c10::DeviceType::CUDA`.
pub const DEVICE_TYPE_CUDA: u8 = 1;

/// c10::Device is two one-byte fields (type, index) passed in one register: here as a u16 whose
/// low byte is the type.
#[export_name = gpuprof_model::allocator_symbol!()]
pub unsafe extern "C" fn report_memory_usage_to_profiler(
    ptr: *mut c_void,
    alloc_size: i64,
    total_allocated: usize,
    total_reserved: usize,
    device: u16,
) {
    let [device_type, device_index] = device.to_le_bytes();
    if device_type == DEVICE_TYPE_CUDA {
        record(ptr as u64, alloc_size, total_allocated as u64, total_reserved as u64, device_index as i8);
    }
    if let Some(real) = forward::real(report_memory_usage_to_profiler as *const c_void) {
        // SAFETY: the real function of the same signature, given the caller's own arguments.
        unsafe { real(ptr, alloc_size, total_allocated, total_reserved, device) };
    }
}

fn record(ptr: u64, delta: i64, allocated: u64, reserved: u64, device_index: i8) {
    cupti::start_if_driver_unwatched();
    let autograd = autograd::state();
    recorder::record(wall_clock_ns(), Call::Allocator { ptr, delta, allocated, reserved, device_index, autograd });
}
