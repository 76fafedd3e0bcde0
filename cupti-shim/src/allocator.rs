//! The interposed `c10::reportMemoryUsageToProfiler`: PyTorch's caching allocator calls it on
//! every block it hands out (positive size) or takes back (negative), with its running totals.
//! Preloaded, this definition is found before libc10's own by every library that imports it
//! (libc10_cuda's allocator does); the call is recorded (at the tensors level), then forwarded.

use std::ffi::c_void;

use gpuprof_model::event::wall_clock_ns;

use crate::queue::{self, Call};
use crate::timing::{self, Phase};
use crate::{autograd_state, cupti, forward, level, recorder};

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
    let entered = timing::stamp();
    let [device_type, device_index] = device.to_le_bytes();
    let recorded = device_type == DEVICE_TYPE_CUDA && level::now().tensors();
    if recorded {
        record(ptr as u64, alloc_size, total_allocated as u64, total_reserved as u64, device_index as i8, entered);
    } else if device_type == DEVICE_TYPE_CUDA {
        queue::start_sender();
    }
    let forwarding = timing::stamp();
    if let Some(real) = forward::real(report_memory_usage_to_profiler as *const c_void) {
        // SAFETY: the real function of the same signature, given the caller's own arguments.
        unsafe { real(ptr, alloc_size, total_allocated, total_reserved, device) };
    }
    if recorded {
        timing::lap(Phase::Forward, forwarding);
        timing::lap(Phase::Hook, entered);
        timing::counted();
    }
}

fn record(ptr: u64, delta: i64, allocated: u64, reserved: u64, device_index: i8, entered: u64) {
    cupti::start_if_driver_unwatched();
    let autograd = autograd_state::state();
    let recording = timing::lap(Phase::Autograd, entered);
    recorder::record(wall_clock_ns(), Call::Allocator { ptr, delta, allocated, reserved, device_index, autograd });
    timing::lap(Phase::Record, recording);
}
