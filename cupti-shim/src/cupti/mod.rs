//! The driver's memory entry points, in-process, through CUPTI's callback API (declarations from
//! cudarc, the library found and bound at run time: `library`). Subscribed once per process, from
//! `InitializeInjection` — which the driver calls at `cuInit` when `CUDA_INJECTION64_PATH` names
//! the shim; a preloaded shim names itself there (`arrange_injection`), so a process that never
//! initializes CUDA never loads CUPTI. Only the entry points of gpuprof's driver table are
//! enabled (`callback`); CUPTI's memory activity records count the same calls independently
//! (`activity`), compared at exit.
//!
//! CUPTI allows one subscriber per process, and a profiler (PyTorch's, Nsight) must not lose its
//! traces to gpuprof: a profiler that subscribes through the shim's interposed `cuptiSubscribe`
//! gets the slot handed over, and when it unsubscribes the shim takes it back; one that holds
//! the slot first leaves the shim without it. Either is said once; the allocator path goes on.

mod activity;
mod callback;
pub mod caller;
mod device;
mod library;
mod params;
mod tally;

use std::ffi::{c_void, CStr, CString};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, Ordering};
use std::sync::{Mutex, Once};

use cudarc::cupti::sys::{CUpti_CallbackFunc, CUpti_SubscriberHandle};
use gpuprof_model::shim::CuptiState;

use tally::{group_sum, Counts, COMPARED};

const INJECTION_VAR: &str = "CUDA_INJECTION64_PATH";
/// `CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED`, `CUPTI_ERROR_NOT_INITIALIZED`.
const MULTIPLE_SUBSCRIBERS: u32 = 39;
const NOT_INITIALIZED: u32 = 15;

/// The states the shim sets; `STATE` holds an index here.
const STATES: [CuptiState; 6] = [
    CuptiState::NotStarted,
    CuptiState::Subscribed,
    CuptiState::SlotTaken,
    CuptiState::NoLibrary,
    CuptiState::Failed,
    CuptiState::HandedOver,
];

/// Starts at 0: not started.
static STATE: AtomicU8 = AtomicU8::new(0);
static SUBSCRIBE: Once = Once::new();
/// The shim's subscriber handle while it holds the slot.
static OURS: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
/// Serializes taking and handing over the slot (the program's threads may race for it).
static SLOT: Mutex<()> = Mutex::new(());
/// Set once the slot changed hands: the two sides of the cross-check no longer cover one span.
static CROSS_CHECK_INTERRUPTED: AtomicBool = AtomicBool::new(false);
static EXIT_FLUSH: Once = Once::new();
/// Set when the shim is preloaded but the driver will inject another library: subscribe on the
/// first allocator report instead (CUDA is initialized by then).
static SUBSCRIBE_ON_FIRST_REPORT: AtomicBool = AtomicBool::new(false);

/// The libcupti the shim bound, if it did.
pub fn library_path() -> Option<&'static str> {
    library::cupti().map(|c| c.path.as_str())
}

pub fn state() -> CuptiState {
    STATES[usize::from(STATE.load(Ordering::Acquire))]
}

/// Whether the shim sees this process's driver calls, for a program that loaded it (the pytest
/// plugin, through ctypes): the index of its state in `STATES` — 0 not started (CUDA not
/// initialized, or the driver injected another library), 1 subscribed, 2 another subscriber holds
/// the slot, 3 no libcupti, 4 CUPTI refused, 5 handed over to a profiler.
#[no_mangle]
pub extern "C" fn gpuprof_shim_driver_calls() -> libc::c_int {
    libc::c_int::from(STATE.load(Ordering::Acquire))
}

fn set_state(state: CuptiState) {
    let index = STATES.iter().position(|known| *known == state).expect("the shim sets only the states it lists");
    STATE.store(index as u8, Ordering::Release);
}

fn say(what: &str) {
    eprintln!("gpuprof shim: pid {}: {what}", std::process::id());
}

/// Preloaded: has the driver call the shim's `InitializeInjection` at `cuInit`, by naming the
/// shim in `CUDA_INJECTION64_PATH` (children inherit it, and so are watched even where the
/// preload is lost). If the variable names another library already, that one keeps it.
pub fn arrange_injection() {
    let Some(ours) = own_path() else { return };
    match std::env::var_os(INJECTION_VAR) {
        None => {
            let (name, value) =
                (CString::new(INJECTION_VAR).expect("no NUL"), CString::new(ours).expect("a path has no NUL"));
            // SAFETY: the constructor runs before the program's threads; both are NUL-terminated.
            unsafe { libc::setenv(name.as_ptr(), value.as_ptr(), 0) };
        }
        Some(named) if same_file(&named, &ours) => {}
        Some(_) => SUBSCRIBE_ON_FIRST_REPORT.store(true, Ordering::Relaxed),
    }
}

/// Subscribes now if the driver will not call the shim itself (see `arrange_injection`).
pub fn start_if_driver_unwatched() {
    if SUBSCRIBE_ON_FIRST_REPORT.load(Ordering::Relaxed) && SUBSCRIBE_ON_FIRST_REPORT.swap(false, Ordering::Relaxed) {
        start();
    }
}

/// Subscribes to the driver's memory entry points, once per process; says once why not.
pub fn start() {
    SUBSCRIBE.call_once(|| {
        let outcome = std::panic::catch_unwind(|| {
            let cupti = library::load().map_err(|why| (CuptiState::NoLibrary, why))?;
            let _slot = SLOT.lock().unwrap_or_else(|e| e.into_inner());
            subscribe(cupti)
        })
        .unwrap_or_else(|_| Err((CuptiState::Failed, "CUPTI's bindings panicked".to_string())));
        match outcome {
            Ok(()) => set_state(CuptiState::Subscribed),
            Err((state, why)) => {
                say(&format!("driver calls are not captured in-process: {why}"));
                set_state(state);
            }
        }
    });
}

/// Takes the slot and enables the memory entry points and activity records. Called with SLOT held.
fn subscribe(cupti: &'static library::Cupti) -> Result<(), (CuptiState, String)> {
    let mut subscriber: CUpti_SubscriberHandle = std::ptr::null_mut();
    // SAFETY: a valid out-pointer and callback; no user data.
    let result = unsafe { (cupti.subscribe)(&mut subscriber, Some(callback::on_callback), std::ptr::null_mut()) };
    if result == MULTIPLE_SUBSCRIBERS {
        return Err((
            CuptiState::SlotTaken,
            "another CUPTI subscriber (a profiler: PyTorch's, Nsight) holds this process's only slot; allocator events go on".to_string(),
        ));
    }
    if result != library::SUCCESS {
        return Err((CuptiState::Failed, format!("cuptiSubscribe failed: {}", describe(cupti, result))));
    }
    for (name, cbid) in callback::CALLBACK_IDS {
        // SAFETY: the subscriber just made; a driver-domain callback id.
        let result = unsafe { (cupti.enable_callback)(1, subscriber, callback::DOMAIN_DRIVER_API, cbid) };
        if result != library::SUCCESS {
            // SAFETY: our own subscriber.
            unsafe { (cupti.unsubscribe)(subscriber) };
            return Err((
                CuptiState::Failed,
                format!("cuptiEnableCallback({name}) failed: {}", describe(cupti, result)),
            ));
        }
    }
    OURS.store(subscriber as *mut c_void, Ordering::Release);
    if activity::enable(cupti) {
        // Registered after the driver's own exit handlers (this runs inside cuInit): runs before them.
        // SAFETY: registering a plain function.
        EXIT_FLUSH.call_once(|| unsafe {
            libc::atexit(at_exit);
        });
    }
    Ok(())
}

/// Another CUPTI client subscribes (PyTorch's profiler does, through libtorch's import of this
/// name): the shim lets go of the slot first, so the profiler keeps its traces.
///
/// SAFETY: CUPTI's `cuptiSubscribe` contract.
#[no_mangle]
pub unsafe extern "C" fn cuptiSubscribe(
    subscriber: *mut CUpti_SubscriberHandle,
    callback: CUpti_CallbackFunc,
    userdata: *mut c_void,
) -> u32 {
    let Ok(cupti) = library::load() else { return NOT_INITIALIZED };
    let _slot = SLOT.lock().unwrap_or_else(|e| e.into_inner());
    let ours = OURS.swap(std::ptr::null_mut(), Ordering::AcqRel);
    if !ours.is_null() {
        activity::disable(cupti);
        // SAFETY: the shim's own subscriber.
        unsafe { (cupti.unsubscribe)(ours as CUpti_SubscriberHandle) };
        CROSS_CHECK_INTERRUPTED.store(true, Ordering::Relaxed);
        set_state(CuptiState::HandedOver);
        say("a profiler subscribed to CUPTI: gpuprof handed it the process's only slot; driver calls are not captured in-process until it unsubscribes (allocator events go on)");
    }
    // SAFETY: the caller's arguments, to the real function.
    unsafe { (cupti.subscribe)(subscriber, callback, userdata) }
}

/// Another CUPTI client lets go of the slot: the shim takes it back if it had it, or wanted it.
///
/// SAFETY: CUPTI's `cuptiUnsubscribe` contract.
#[no_mangle]
pub unsafe extern "C" fn cuptiUnsubscribe(subscriber: CUpti_SubscriberHandle) -> u32 {
    let Ok(cupti) = library::load() else { return NOT_INITIALIZED };
    let _slot = SLOT.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: the caller's argument, to the real function.
    let result = unsafe { (cupti.unsubscribe)(subscriber) };
    if result == library::SUCCESS
        && matches!(state(), CuptiState::HandedOver | CuptiState::SlotTaken)
        && subscribe(cupti).is_ok()
    {
        CROSS_CHECK_INTERRUPTED.store(true, Ordering::Relaxed);
        set_state(CuptiState::Subscribed);
        say("the other CUPTI subscriber let go: gpuprof captures driver calls in-process again");
    }
    result
}

/// The addresses other libraries' imports of the two names above are pointed at, when the shim
/// was injected rather than preloaded (nothing binds to it by name then).
pub fn interposers() -> [(&'static CStr, *const c_void); 2] {
    [(c"cuptiSubscribe", cuptiSubscribe as *const c_void), (c"cuptiUnsubscribe", cuptiUnsubscribe as *const c_void)]
}

extern "C" fn at_exit() {
    activity::flush();
    if let Some(disagreement) = cross_check().disagreement() {
        say(&disagreement);
    }
}

/// The callbacks' counts beside CUPTI's activity records', by memory kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CrossCheck {
    pub enabled: bool,
    /// The slot changed hands: the two sides do not cover one span, nothing to compare.
    pub interrupted: bool,
    pub callbacks: Counts,
    pub activity: Counts,
    pub activity_pool_records: u64,
    pub activity_dropped: u64,
    pub activity_buffers: u64,
}

impl CrossCheck {
    /// What disagrees, said for a person; None when the two sides agree (or nothing to compare).
    pub fn disagreement(&self) -> Option<String> {
        if !self.enabled || self.interrupted {
            return None;
        }
        let seen: u64 = self.callbacks.iter().flatten().sum();
        if self.activity_buffers == 0 && seen > 0 {
            return Some("CUPTI's memory activity records never came back (another tool took the activity buffers over): no cross-check".into());
        }
        let differing: Vec<String> = COMPARED
            .iter()
            .map(|(name, kinds)| (name, group_sum(&self.callbacks, kinds), group_sum(&self.activity, kinds)))
            .filter(|(_, seen, recorded)| seen != recorded)
            .map(|(name, [a, r], [b, s])| format!("{name} allocations {a} vs {b}, releases {r} vs {s}"))
            .collect();
        (!differing.is_empty() || self.activity_dropped > 0).then(|| {
            format!(
                "CUPTI cross-check (callbacks vs activity records): {}; {} records dropped by CUPTI",
                if differing.is_empty() { "same counts".to_string() } else { differing.join("; ") },
                self.activity_dropped
            )
        })
    }

    /// The counts and the verdict, as the counters line carries them.
    pub fn report(&self) -> gpuprof_model::shim::CrossCheck {
        gpuprof_model::shim::CrossCheck {
            callbacks: tally::by_kind_name(&self.callbacks),
            activity: tally::by_kind_name(&self.activity),
            activity_pool_records: self.activity_pool_records,
            activity_dropped: self.activity_dropped,
            interrupted: self.interrupted,
            agrees: self.disagreement().is_none(),
        }
    }
}

pub fn cross_check() -> CrossCheck {
    let load = |counter: &std::sync::atomic::AtomicU64| counter.load(Ordering::Relaxed);
    CrossCheck {
        enabled: activity::enabled() || activity::BUFFERS.load(Ordering::Relaxed) > 0,
        interrupted: CROSS_CHECK_INTERRUPTED.load(Ordering::Relaxed),
        callbacks: callback::SEEN.counts(),
        activity: activity::RECORDED.counts(),
        activity_pool_records: load(&activity::POOL_RECORDS),
        activity_dropped: load(&activity::DROPPED),
        activity_buffers: load(&activity::BUFFERS),
    }
}

fn describe(cupti: &library::Cupti, result: library::Status) -> String {
    let mut text: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: CUPTI returns a static string for any result.
    let named = unsafe { (cupti.get_result_string)(result, &mut text) } == library::SUCCESS && !text.is_null();
    // SAFETY: a static NUL-terminated string.
    let name = if named { unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned() } else { String::new() };
    format!("{result} {name}")
}

/// This library's path, as the loader opened it.
fn own_path() -> Option<String> {
    // SAFETY: Dl_info is pointers and integers, for which all zeros (null) is a value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: any address inside this library; info is a valid out-struct.
    let found = unsafe { libc::dladdr(arrange_injection as *const c_void, &mut info) } != 0;
    if !found || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: a NUL-terminated path owned by the loader.
    let path = unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned();
    std::fs::canonicalize(&path).ok().map(|p| p.to_string_lossy().into_owned()).or(Some(path))
}

fn same_file(a: &std::ffi::OsStr, b: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::tally::{DEVICE, MANAGED};
    use super::*;

    fn check(callbacks: Counts, activity: Counts) -> CrossCheck {
        CrossCheck {
            enabled: true,
            interrupted: false,
            callbacks,
            activity,
            activity_pool_records: 0,
            activity_dropped: 0,
            activity_buffers: 1,
        }
    }

    #[test]
    fn a_managed_free_seen_as_device_memory_agrees_and_a_missed_release_is_said() {
        let mut callbacks = [[0; 2]; 8];
        let mut activity = [[0; 2]; 8];
        // cuMemFree_v2 of managed memory: the callback cannot tell it from device memory.
        callbacks[DEVICE] = [3, 3];
        callbacks[MANAGED] = [1, 0];
        activity[DEVICE] = [3, 2];
        activity[MANAGED] = [1, 1];
        activity[6] = [38, 0];
        assert_eq!(check(callbacks, activity).disagreement(), None);
        activity[DEVICE] = [3, 1];
        assert_eq!(
            check(callbacks, activity).disagreement().as_deref(),
            Some("CUPTI cross-check (callbacks vs activity records): device and managed allocations 4 vs 4, releases 3 vs 2; 0 records dropped by CUPTI")
        );
        // Across a hand-over the two sides do not cover one span: nothing compared.
        let mut interrupted = check(callbacks, activity);
        interrupted.interrupted = true;
        assert_eq!(interrupted.disagreement(), None);
        assert!(interrupted.report().agrees);
        // Buffers never handed back while the callbacks saw calls: said as such.
        let mut taken = check(callbacks, activity);
        taken.activity_buffers = 0;
        assert!(taken.disagreement().unwrap().starts_with("CUPTI's memory activity records never came back"));
    }
}
