//! libgpuprof_shim.so: gpuprof's capture from inside a process, where eBPF is not allowed or a
//! uprobe's trap per call costs too much. Loaded with `LD_PRELOAD` (its constructor starts it) or
//! named by `CUDA_INJECTION64_PATH` (the driver calls `InitializeInjection`); either way it
//! starts once.
//!
//! It captures PyTorch's caching allocator by interposing `c10::reportMemoryUsageToProfiler`
//! (every tensor block, with the allocator's totals, the Python stack and autograd's state:
//! `autograd`), forwarding each call
//! to the real function: preloaded, by symbol resolution; injected, by rewriting the callers'
//! GOT slots. And the driver's memory entry points through CUPTI's callbacks (`cupti`, with the
//! module that called the driver),
//! cross-checked with CUPTI's memory activity records. Events leave through a bounded queue drained by a thread of the shim's
//! own: to the local agent's Unix socket (`GPUPROF_SHIM_SOCKET`) or to a jsonl file
//! (`GPUPROF_SHIM_OUTPUT`). The calling thread never waits: a full queue drops and counts.

mod allocator;
mod autograd;
mod cupti;
mod forward;
mod got;
mod python;
mod queue;
mod ring;
mod sink;
mod stacks;

use std::sync::Once;

static START: Once = Once::new();

/// Everything the shim sets up, once per process image, whichever way it was loaded.
fn start() {
    START.call_once(|| {
        queue::install_fork_handler();
        sink::register_exit_flush();
    });
}

/// Run by the dynamic loader when the library is preloaded (and when it is loaded any other way).
extern "C" fn on_load() {
    start();
    cupti::arrange_injection();
}

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

/// The CUDA driver's entry point for an injection library (`CUDA_INJECTION64_PATH`), called at
/// `cuInit`; returns nonzero for success, as the driver expects. Loaded this way the shim is not
/// in the global symbol scope: the allocator's already-bound imports are pointed at it. Then the
/// driver's memory entry points are subscribed to through CUPTI (once, however often this runs).
#[no_mangle]
pub extern "C" fn InitializeInjection() -> libc::c_int {
    start();
    got::redirect(forward::SYMBOL, allocator::report_memory_usage_to_profiler as *const std::ffi::c_void);
    for (name, interposer) in cupti::interposers() {
        got::redirect(name, interposer);
    }
    cupti::start();
    1
}
