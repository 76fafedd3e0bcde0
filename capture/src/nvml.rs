//! Per-process GPU memory as the driver accounts it, from NVML (`libnvidia-ml.so.1`: what
//! nvidia-smi shows), beside what gpuprof saw allocated. The difference is memory no probed call
//! made: the CUDA context, loaded modules (kernels), anything allocated before the capture began
//! or through entry points gpuprof does not probe. A person comparing with nvidia-smi sees both.
//!
//! NVML is opened at run time: a machine without an NVIDIA driver simply has no such figures.

pub use gpuprof_model::nvml::{Reconciled, READING_API};
use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::time::{Duration, Instant};

use gpuprof_model::Tracker;

pub const LIBRARY: &str = "libnvidia-ml.so.1";

/// How often the driver is asked (each ask walks every device).
const SAMPLE_INTERVAL: Duration = Duration::from_secs(1);

type NvmlReturn = c_int;
const NVML_SUCCESS: NvmlReturn = 0;
const NVML_ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
/// `usedGpuMemory` where the driver cannot say (e.g. without the right to see other processes).
const NVML_VALUE_NOT_AVAILABLE: u64 = u64::MAX;

/// `nvmlProcessInfo_t` as `nvmlDeviceGetComputeRunningProcesses_v3` fills it.
#[repr(C)]
#[derive(Clone, Copy, Default)]
#[allow(dead_code, reason = "the instance ids are part of the C layout; MIG is not told apart")]
struct ProcessInfo {
    pid: c_uint,
    used_gpu_memory: u64,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

type Device = *mut c_void;

/// `nvmlMemory_t` as `nvmlDeviceGetMemoryInfo` fills it.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Memory {
    total: u64,
    free: u64,
    used: u64,
}

/// The NVML entry points used, resolved from the library.
struct Nvml {
    get_handle: unsafe extern "C" fn(c_uint, *mut Device) -> NvmlReturn,
    running_processes: unsafe extern "C" fn(Device, *mut c_uint, *mut ProcessInfo) -> NvmlReturn,
    memory_info: Option<unsafe extern "C" fn(Device, *mut Memory) -> NvmlReturn>,
    error_string: Option<unsafe extern "C" fn(NvmlReturn) -> *const c_char>,
    devices: c_uint,
}

impl Nvml {
    /// None when the library is not there; an error when it is but does not work.
    fn open() -> Result<Option<Nvml>, String> {
        let name = std::ffi::CString::new(LIBRARY).expect("no NUL in the name");
        // SAFETY: dlopen with a valid C string; the handle is kept for the life of the process.
        let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Ok(None);
        }
        let symbol = |name: &str| -> Result<*mut c_void, String> {
            let c_name = std::ffi::CString::new(name).expect("no NUL in the name");
            // SAFETY: dlsym on a live handle with a valid C string.
            let found = unsafe { libc::dlsym(handle, c_name.as_ptr()) };
            if found.is_null() {
                Err(format!("{LIBRARY} has no {name}: an NVIDIA driver older than 510 is not supported"))
            } else {
                Ok(found)
            }
        };
        // SAFETY: the symbols have these C signatures in every NVML since driver 510 (nvml.h).
        let (init, count, get_handle, running_processes) = unsafe {
            (
                std::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> NvmlReturn>(symbol("nvmlInit_v2")?),
                std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_uint) -> NvmlReturn>(symbol(
                    "nvmlDeviceGetCount_v2",
                )?),
                std::mem::transmute::<*mut c_void, unsafe extern "C" fn(c_uint, *mut Device) -> NvmlReturn>(symbol(
                    "nvmlDeviceGetHandleByIndex_v2",
                )?),
                std::mem::transmute::<
                    *mut c_void,
                    unsafe extern "C" fn(Device, *mut c_uint, *mut ProcessInfo) -> NvmlReturn,
                >(symbol("nvmlDeviceGetComputeRunningProcesses_v3")?),
            )
        };
        let error_string = symbol("nvmlErrorString")
            .ok()
            // SAFETY: `const char *nvmlErrorString(nvmlReturn_t)`.
            .map(|f| unsafe {
                std::mem::transmute::<*mut c_void, unsafe extern "C" fn(NvmlReturn) -> *const c_char>(f)
            });
        let memory_info = symbol("nvmlDeviceGetMemoryInfo")
            .ok()
            // SAFETY: `nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t, nvmlMemory_t *)`.
            .map(|f| unsafe {
                std::mem::transmute::<*mut c_void, unsafe extern "C" fn(Device, *mut Memory) -> NvmlReturn>(f)
            });
        let mut nvml = Nvml { get_handle, running_processes, memory_info, error_string, devices: 0 };
        // SAFETY: plain calls into NVML with valid out-pointers.
        let rc = unsafe { init() };
        if rc != NVML_SUCCESS {
            return Err(format!("nvmlInit_v2 failed: {}", nvml.error(rc)));
        }
        let mut devices: c_uint = 0;
        // SAFETY: as above.
        let rc = unsafe { count(&mut devices) };
        if rc != NVML_SUCCESS {
            return Err(format!("nvmlDeviceGetCount_v2 failed: {}", nvml.error(rc)));
        }
        nvml.devices = devices;
        Ok(Some(nvml))
    }

    fn error(&self, rc: NvmlReturn) -> String {
        let text = self.error_string.map(|f| {
            // SAFETY: NVML returns a static NUL-terminated string.
            let ptr = unsafe { f(rc) };
            if ptr.is_null() {
                String::new()
            } else {
                // SAFETY: non-null, NUL-terminated, static.
                unsafe { CStr::from_ptr(ptr) }.to_string_lossy().into_owned()
            }
        });
        match text {
            Some(text) if !text.is_empty() => format!("{text} ({rc})"),
            _ => format!("NVML error {rc}"),
        }
    }

    /// Each device's (free, total) memory; a device NVML cannot tell of is left out.
    fn device_memory(&self) -> BTreeMap<u32, (u64, u64)> {
        let mut memory = BTreeMap::new();
        let Some(memory_info) = self.memory_info else { return memory };
        for index in 0..self.devices {
            let mut device: Device = std::ptr::null_mut();
            let mut info = Memory::default();
            // SAFETY: valid out-pointers.
            let rc = unsafe { (self.get_handle)(index, &mut device) };
            // SAFETY: as above, with the handle NVML gave.
            if rc == NVML_SUCCESS && unsafe { memory_info(device, &mut info) } == NVML_SUCCESS {
                memory.insert(index, (info.free, info.total));
            }
        }
        memory
    }

    /// Used device memory per pid, summed over the devices.
    fn used_by_process(&self) -> Result<BTreeMap<u32, u64>, String> {
        let mut used: BTreeMap<u32, u64> = BTreeMap::new();
        for index in 0..self.devices {
            let mut device: Device = std::ptr::null_mut();
            // SAFETY: a valid out-pointer.
            let rc = unsafe { (self.get_handle)(index, &mut device) };
            if rc != NVML_SUCCESS {
                return Err(format!("nvmlDeviceGetHandleByIndex_v2({index}) failed: {}", self.error(rc)));
            }
            let mut infos: Vec<ProcessInfo> = vec![ProcessInfo::default(); 64];
            loop {
                let mut count = infos.len() as c_uint;
                // SAFETY: `infos` has room for `count` entries.
                let rc = unsafe { (self.running_processes)(device, &mut count, infos.as_mut_ptr()) };
                match rc {
                    NVML_SUCCESS => {
                        for info in &infos[..(count as usize).min(infos.len())] {
                            if info.used_gpu_memory != NVML_VALUE_NOT_AVAILABLE {
                                *used.entry(info.pid).or_default() += info.used_gpu_memory;
                            }
                        }
                        break;
                    }
                    // More processes than room: NVML said how many; a few more may start meanwhile.
                    NVML_ERROR_INSUFFICIENT_SIZE => infos.resize(count as usize + 16, ProcessInfo::default()),
                    _ => {
                        return Err(format!(
                            "nvmlDeviceGetComputeRunningProcesses_v3 on device {index} failed: {}",
                            self.error(rc)
                        ))
                    }
                }
            }
        }
        Ok(used)
    }
}

// SAFETY: NVML's calls are thread-safe (nvml.h); the handles it returns are process-wide.
unsafe impl Send for Nvml {}

/// NVML as this process finds it, opened as a capture opens it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmlHere {
    /// The file the loader opened, where it can say.
    pub path: Option<std::path::PathBuf>,
    pub devices: u32,
}

/// Whether NVML works here (`gpuprof doctor`): its file and devices, None when there is no
/// library, or why it does not work.
pub fn open_here() -> Result<Option<NvmlHere>, String> {
    let Some(nvml) = Nvml::open()? else { return Ok(None) };
    // SAFETY: Dl_info is pointers and nothing else, for which zero is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr reads the address of a function NVML exported, and fills `info`.
    let known = unsafe { libc::dladdr(nvml.get_handle as *const c_void, &mut info) } != 0;
    let path = (known && !info.dli_fname.is_null())
        // SAFETY: dladdr's file name is a NUL-terminated string that lives as long as the library.
        .then(|| std::path::PathBuf::from(unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned()));
    Ok(Some(NvmlHere { path, devices: nvml.devices }))
}

/// NVML's figures for the processes gpuprof follows, sampled every second.
pub struct NvmlView {
    nvml: Option<Nvml>,
    last_sample: Option<Instant>,
    /// The processes in the latest sample.
    now: BTreeMap<u32, Reconciled>,
    /// Every followed process's latest sample while it ran (an exited process keeps its last).
    last_seen: BTreeMap<u32, Reconciled>,
    /// Each device's (free, total) memory in the latest sample, until taken.
    devices: BTreeMap<u32, (u64, u64)>,
    /// Why NVML is left out, until the flow says it.
    warnings: Vec<String>,
}

impl NvmlView {
    /// Opens NVML when the machine has it; keeps a warning saying why it cannot when it is there
    /// but broken.
    pub(crate) fn open() -> NvmlView {
        let mut view = NvmlView::none();
        match Nvml::open() {
            Ok(nvml) => view.nvml = nvml,
            Err(error) => view
                .warnings
                .push(format!("{LIBRARY}: {error}; per-process used memory as nvidia-smi shows it is left out")),
        }
        view
    }

    /// What went wrong with NVML since the last call, to be said.
    pub(crate) fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings)
    }

    /// A view with no NVML (a replay on another machine).
    pub(crate) fn none() -> NvmlView {
        NvmlView {
            nvml: None,
            last_sample: None,
            now: BTreeMap::new(),
            last_seen: BTreeMap::new(),
            devices: BTreeMap::new(),
            warnings: Vec::new(),
        }
    }

    /// Asks the driver when a second has passed since the last time; keeps the processes the
    /// tracker follows.
    pub(crate) fn sample(&mut self, tracker: &Tracker, now_ns: u64) {
        let Some(nvml) = &self.nvml else { return };
        if self.last_sample.is_some_and(|t| t.elapsed() < SAMPLE_INTERVAL) {
            return;
        }
        self.last_sample = Some(Instant::now());
        let used = match nvml.used_by_process() {
            Ok(used) => used,
            Err(error) => {
                self.warnings.push(format!(
                    "{LIBRARY}: {error}; per-process used memory as nvidia-smi shows it is left out from now on"
                ));
                self.nvml = None;
                return;
            }
        };
        self.devices = nvml.device_memory();
        self.now.clear();
        for (pid, nvml_used) in used {
            let Some(process) = tracker.process(pid) else { continue };
            let reconciled = Reconciled { nvml_used, probed: process.device_bytes(), ts: now_ns };
            self.now.insert(pid, reconciled);
            self.last_seen.insert(pid, reconciled);
        }
    }

    /// The followed processes the latest sample had.
    pub fn now(&self) -> &BTreeMap<u32, Reconciled> {
        &self.now
    }

    /// Each followed process's latest sample while it ran.
    pub(crate) fn last_seen(&self) -> &BTreeMap<u32, Reconciled> {
        &self.last_seen
    }

    /// Each device's memory from the latest sample, once, as `mem_info` events the capture
    /// records and the rules read (a growth finding's time until the device is full is worked
    /// from them; a report of the recording reads the same). An event belongs to a process: the
    /// followed process holding the most device memory, the one such a reading is most about;
    /// none while no followed process lives.
    pub(crate) fn take_readings(&mut self, tracker: &Tracker, now_ns: u64) -> Vec<gpuprof_model::Event> {
        let devices = std::mem::take(&mut self.devices);
        let live = tracker.live_processes();
        let Some(holder) = live.iter().max_by_key(|p| (p.device_bytes(), std::cmp::Reverse(p.pid))) else {
            return Vec::new();
        };
        devices
            .into_iter()
            .map(|(index, (free, total))| {
                let mut event = gpuprof_model::Event::new(
                    now_ns,
                    holder.pid,
                    holder.pid,
                    gpuprof_model::Source::Ebpf,
                    gpuprof_model::Layer::Driver,
                    gpuprof_model::Op::MemInfo,
                    std::borrow::Cow::Borrowed(READING_API),
                );
                event.comm = holder.comm.clone();
                event.size = free;
                event.total = Some(total);
                event.device = Some(index as i32);
                event
            })
            .collect()
    }
}
