//! Finding libcupti and binding the functions the shim calls, from that one copy. The function
//! types follow cudarc's declarations of CUPTI; cudarc's own loader is not used: it looks the
//! library up by name (`libcupti.so` first), and on a machine with a CUDA toolkit in the loader's
//! cache that is another file than the wheel's copy PyTorch has already loaded — two copies of
//! CUPTI in one process, each believing it owns the driver's callbacks (seen on an H100 machine).
//!
//! Where it looks, in order: a libcupti already loaded (PyTorch's libraries link one); the path in
//! `GPUPROF_CUPTI`; beside the loaded CUDA runtime (the nvidia wheels put both in one folder); the
//! CUDA toolkit (`$CUDA_HOME`, `/usr/local/cuda`); the dynamic loader's own search.

use std::ffi::{c_char, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cudarc::cupti::sys::{
    CUpti_Activity, CUpti_BuffersCallbackCompleteFunc, CUpti_BuffersCallbackRequestFunc, CUpti_CallbackFunc,
    CUpti_SubscriberHandle,
};
use cudarc::driver::sys::CUcontext;

pub const PATH_VAR: &str = "GPUPROF_CUPTI";

/// File names tried in each folder, newest first (a CUDA 12 process gets CUPTI 12's).
const NAMES: [&str; 3] = ["libcupti.so.13", "libcupti.so.12", "libcupti.so"];

/// `CUptiResult`, kept as a number: an enum holding a value it does not list would be UB.
pub type Status = u32;
pub const SUCCESS: Status = 0;

type SubscribeFn = unsafe extern "C" fn(*mut CUpti_SubscriberHandle, CUpti_CallbackFunc, *mut c_void) -> Status;
type UnsubscribeFn = unsafe extern "C" fn(CUpti_SubscriberHandle) -> Status;
type EnableCallbackFn = unsafe extern "C" fn(u32, CUpti_SubscriberHandle, u32, u32) -> Status;
type GetResultStringFn = unsafe extern "C" fn(Status, *mut *const c_char) -> Status;
type ActivityRegisterCallbacksFn =
    unsafe extern "C" fn(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc) -> Status;
type ActivityEnableFn = unsafe extern "C" fn(u32) -> Status;
type ActivityDisableFn = unsafe extern "C" fn(u32) -> Status;
type ActivityFlushAllFn = unsafe extern "C" fn(u32) -> Status;
type ActivityGetNextRecordFn = unsafe extern "C" fn(*mut u8, usize, *mut *mut CUpti_Activity) -> Status;
type ActivityGetNumDroppedRecordsFn = unsafe extern "C" fn(CUcontext, u32, *mut usize) -> Status;

/// The CUPTI functions the shim calls, bound from one loaded copy.
pub struct Cupti {
    pub path: String,
    pub subscribe: SubscribeFn,
    pub unsubscribe: UnsubscribeFn,
    pub enable_callback: EnableCallbackFn,
    pub get_result_string: GetResultStringFn,
    pub activity_register_callbacks: ActivityRegisterCallbacksFn,
    pub activity_enable: ActivityEnableFn,
    pub activity_disable: ActivityDisableFn,
    pub activity_flush_all: ActivityFlushAllFn,
    pub activity_get_next_record: ActivityGetNextRecordFn,
    pub activity_get_num_dropped_records: ActivityGetNumDroppedRecordsFn,
}

static CUPTI: OnceLock<Cupti> = OnceLock::new();

/// The bound functions, once `load` succeeded.
pub fn cupti() -> Option<&'static Cupti> {
    CUPTI.get()
}

/// Finds and binds libcupti; Err(what was tried) when there is none or it lacks a function.
pub fn load() -> Result<&'static Cupti, String> {
    if let Some(bound) = CUPTI.get() {
        return Ok(bound);
    }
    let (path, handle) = find().ok_or_else(|| {
        format!("no libcupti (loaded, ${PATH_VAR}, beside libcudart, $CUDA_HOME, /usr/local/cuda, the loader's path): set {PATH_VAR}=/path/to/libcupti.so")
    })?;
    let function =
        |name: &CStr| symbol(handle, name).ok_or_else(|| format!("{path} has no {}", name.to_string_lossy()));
    // SAFETY: each symbol is CUPTI's function of exactly this signature (cupti_callbacks.h,
    // cupti_activity.h, cupti_result.h), as cudarc declares them.
    let bound = unsafe {
        Cupti {
            subscribe: std::mem::transmute::<*const c_void, SubscribeFn>(function(c"cuptiSubscribe")?),
            unsubscribe: std::mem::transmute::<*const c_void, UnsubscribeFn>(function(c"cuptiUnsubscribe")?),
            enable_callback: std::mem::transmute::<*const c_void, EnableCallbackFn>(function(c"cuptiEnableCallback")?),
            get_result_string: std::mem::transmute::<*const c_void, GetResultStringFn>(function(
                c"cuptiGetResultString",
            )?),
            activity_register_callbacks: std::mem::transmute::<*const c_void, ActivityRegisterCallbacksFn>(function(
                c"cuptiActivityRegisterCallbacks",
            )?),
            activity_enable: std::mem::transmute::<*const c_void, ActivityEnableFn>(function(c"cuptiActivityEnable")?),
            activity_disable: std::mem::transmute::<*const c_void, ActivityDisableFn>(function(
                c"cuptiActivityDisable",
            )?),
            activity_flush_all: std::mem::transmute::<*const c_void, ActivityFlushAllFn>(function(
                c"cuptiActivityFlushAll",
            )?),
            activity_get_next_record: std::mem::transmute::<*const c_void, ActivityGetNextRecordFn>(function(
                c"cuptiActivityGetNextRecord",
            )?),
            activity_get_num_dropped_records: std::mem::transmute::<*const c_void, ActivityGetNumDroppedRecordsFn>(
                function(c"cuptiActivityGetNumDroppedRecords")?,
            ),
            path,
        }
    };
    Ok(CUPTI.get_or_init(|| bound))
}

fn find() -> Option<(String, *mut c_void)> {
    if let Some(path) = loaded_path(|name| name.contains("/libcupti.so")) {
        return open(&path).map(|h| (path, h));
    }
    if let Some(path) = std::env::var_os(PATH_VAR) {
        let path = path.to_string_lossy().into_owned();
        return open(&path).map(|h| (path, h));
    }
    let mut folders: Vec<PathBuf> = Vec::new();
    if let Some(runtime) = loaded_path(|name| name.contains("/libcudart.so")) {
        folders.extend(Path::new(&runtime).parent().map(Path::to_path_buf));
    }
    for home in ["CUDA_HOME", "CUDA_PATH"].iter().filter_map(std::env::var_os) {
        let home = PathBuf::from(home);
        folders.extend([home.join("lib64"), home.join("targets/x86_64-linux/lib"), home.join("extras/CUPTI/lib64")]);
    }
    let toolkit = Path::new("/usr/local/cuda");
    folders.extend([
        toolkit.join("lib64"),
        toolkit.join("targets/x86_64-linux/lib"),
        toolkit.join("extras/CUPTI/lib64"),
    ]);
    for folder in folders {
        for name in NAMES {
            let path = folder.join(name);
            if path.exists() {
                let path = path.to_string_lossy().into_owned();
                if let Some(handle) = open(&path) {
                    return Some((path, handle));
                }
            }
        }
    }
    NAMES.iter().find_map(|name| open(name).map(|h| (name.to_string(), h)))
}

fn open(path: &str) -> Option<*mut c_void> {
    let path = CString::new(path).ok()?;
    // SAFETY: dlopen of a NUL-terminated path; a library that is not CUPTI fails the symbol check.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    (!handle.is_null() && symbol(handle, c"cuptiSubscribe").is_some()).then_some(handle)
}

fn symbol(handle: *mut c_void, name: &CStr) -> Option<*const c_void> {
    // SAFETY: a valid handle and a NUL-terminated name.
    let address = unsafe { libc::dlsym(handle, name.as_ptr()) };
    (!address.is_null()).then_some(address as *const c_void)
}

/// The path of the first loaded object whose path passes `wanted`.
fn loaded_path(wanted: impl Fn(&str) -> bool) -> Option<String> {
    crate::loaded::find_map(|info| {
        let name = crate::loaded::name(info)?.to_string_lossy();
        wanted(&name).then(|| name.into_owned())
    })
}
