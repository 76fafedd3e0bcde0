//! The event: one captured call or process transition, as every output writes it
//! (one JSON object per line in `--format jsonl`). Field names are the contract of
//! `docs/events.md`: add fields freely, never rename.

use std::borrow::Cow;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::framework::Framework;
use crate::hex::{serde_addr, serde_bytes};
// A frame and a stack's origin are the stack's; events name them as `event::…` too.
pub use crate::stack::{Frame, Stack, StackOrigin};

/// Where an event was captured: by the agent's eBPF probes, or inside the process by gpuprof's
/// shim (its allocator hook, its CUPTI callbacks, its fork and exit records).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    Ebpf,
    /// Earlier shims wrote `cupti` for all their events, CUPTI's or not: still read as the shim.
    #[serde(alias = "cupti")]
    Shim,
}

/// Which level of the stack saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Layer {
    /// libcuda entry points: segments, VMM, IPC, contexts.
    Driver,
    /// A framework's caching allocator (PyTorch blocks).
    Allocator,
    /// fork, exec, exit.
    Process,
}

impl Layer {
    pub fn as_str(self) -> &'static str {
        match self {
            Layer::Driver => "driver",
            Layer::Allocator => "allocator",
            Layer::Process => "process",
        }
    }
}

/// What the call or transition did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Alloc,
    Free,
    /// Virtual address range reserved (VMM), no memory behind it yet.
    Reserve,
    Unreserve,
    /// Memory made reachable at an address: a VMM handle mapped into a reserved range, or host
    /// memory registered (pinned) for the device.
    Map,
    Unmap,
    IpcExport,
    IpcOpen,
    IpcClose,
    CtxCreate,
    CtxDestroy,
    /// `cuMemGetInfo`: `size` is the free device memory, `total` the device's total.
    MemInfo,
    Fork,
    Exec,
    Exit,
}

/// The kind of memory an allocation or mapping is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Device,
    Managed,
    HostPinned,
    Vmm,
    Pool,
}

impl Kind {
    pub const ALL: [Kind; 5] = [Kind::Device, Kind::Managed, Kind::HostPinned, Kind::Vmm, Kind::Pool];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Device => "device",
            Kind::Managed => "managed",
            Kind::HostPinned => "host_pinned",
            Kind::Vmm => "vmm",
            Kind::Pool => "pool",
        }
    }
}

impl Op {
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Alloc => "alloc",
            Op::Free => "free",
            Op::Reserve => "reserve",
            Op::Unreserve => "unreserve",
            Op::Map => "map",
            Op::Unmap => "unmap",
            Op::IpcExport => "ipc_export",
            Op::IpcOpen => "ipc_open",
            Op::IpcClose => "ipc_close",
            Op::CtxCreate => "ctx_create",
            Op::CtxDestroy => "ctx_destroy",
            Op::MemInfo => "mem_info",
            Op::Fork => "fork",
            Op::Exec => "exec",
            Op::Exit => "exit",
        }
    }
}

/// One native frame.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NativeFrame {
    pub symbol: String,
    pub module: String,
    pub offset: u64,
}

/// A captured call or process transition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Wall-clock nanoseconds since the Unix epoch.
    pub ts: u64,
    pub pid: u32,
    pub tid: u32,
    /// The pid inside the process's own pid namespace, when it differs from `pid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ns_pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ppid: Option<u32>,
    /// The distributed job the process is one rank of, qualified by its launcher
    /// (`torchrun:…`, `slurm:…`, `mpi:…`, `k8s:…`, or `GPUPROF_JOB_ID` as given: `model::job`),
    /// on its first call as `rank` is; absent where its environment names none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<Arc<str>>,
    /// The process's rank in a distributed job (`RANK` in the environment it was started with,
    /// else its MPI or Slurm launcher's), on the first call of the process a live capture saw:
    /// said once per process, so a file carries it at no cost per event, and a replay learns it
    /// where the capture did (`rank`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    /// Its rank among the job's processes on its node (`LOCAL_RANK`, else its launcher's), on
    /// its first call as `rank` is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_rank: Option<u32>,
    /// How many processes its job has (`WORLD_SIZE`, else its launcher's), on its first call as
    /// `rank` is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world_size: Option<u32>,
    /// PyTorch's allocator settings in the environment the process was started with
    /// (`PYTORCH_CUDA_ALLOC_CONF`, else `PYTORCH_ALLOC_CONF`; empty when neither is set), on its
    /// first call as `rank` is: what `whatif` replays it under. Settings made from inside the
    /// program (`os.environ[...]` before importing torch) do not show here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocator_settings: Option<Arc<str>>,
    /// Shared between the events of a process (a name per event would be an allocation per event).
    #[serde(default)]
    pub comm: Arc<str>,
    pub source: Source,
    pub layer: Layer,
    pub op: Op,
    /// The entry point as exported (`cuMemAlloc_v2`) or the tracepoint (`sched_process_fork`).
    pub api: Cow<'static, str>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<Kind>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<i32>,
    /// Device pointer, host pointer (pinned), VMM handle (`cuMemCreate`/`cuMemRelease`), or
    /// context (`ctx_*`).
    #[serde(default, with = "serde_addr", skip_serializing_if = "Option::is_none")]
    pub addr: Option<u64>,
    #[serde(default)]
    pub size: u64,
    #[serde(default)]
    pub result: i32,
    /// IPC / shareable handle bytes (`ipc_*` events).
    #[serde(default, with = "serde_bytes", skip_serializing_if = "Option::is_none")]
    pub handle: Option<Vec<u8>>,
    /// `posix_fd`, `fabric`, `win32`, `win32_kmt` for VMM shareable handles.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handle_type: Option<Cow<'static, str>>,
    /// The kernel object behind a POSIX-fd shareable handle: equal in exporter and importer.
    #[serde(default, with = "serde_addr", skip_serializing_if = "Option::is_none")]
    pub handle_object: Option<u64>,
    /// The exporting process of an `ipc_open`, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_pid: Option<u32>,
    /// For `map` of VMM memory: the `cuMemCreate` handle mapped.
    #[serde(default, with = "serde_addr", skip_serializing_if = "Option::is_none")]
    pub vmm_handle: Option<u64>,
    /// Row pitch of a pitched allocation (`size` = pitch × height).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pitch: Option<u64>,
    /// `mem_info`: the device's total memory (`size` is the free memory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<u64>,
    /// Allocator events: the allocator's live-block total on the device after the call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated: Option<u64>,
    /// Allocator events: the allocator's reserved (segment) total on the device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved: Option<u64>,
    /// Allocator events: the driver segment (allocation or VMM mapping) the block lies in.
    #[serde(default, with = "serde_addr", skip_serializing_if = "Option::is_none")]
    pub segment: Option<u64>,
    /// Time spent inside the driver call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ns: Option<u64>,
    /// `exit`: the exit status, or 128 + signal when killed by a signal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// `exit`: the signal that killed the process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// `exec`: the program executed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filename: Option<String>,
    /// Driver events: the file name of the module whose code called libcuda (libnccl.so.2,
    /// libcublasLt.so.13, libcudart.so.13, a user's extension), from the call's return address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller_module: Option<Arc<str>>,
    /// Driver events: the framework whose caching allocator made this call for its segments
    /// (`pytorch`, `xla`, `tensorflow`; `model::framework`): memory its process keeps as that
    /// allocator's cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocator_segment: Option<Framework>,
    /// Allocator events of PyTorch's backward pass: the class of the autograd node being evaluated
    /// (`AddmmBackward0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autograd_node: Option<Arc<str>>,
    /// Allocator events: with `autograd_node`, that node's sequence number; without, the thread's
    /// autograd sequence counter (the number the next node it makes takes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autograd_seq: Option<u64>,
    /// Allocator events: with `autograd_node`, the thread that made the node; without, this
    /// thread; as `at::RecordFunction` numbers threads (not a tid).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autograd_thread: Option<u64>,
    /// Set when `stack` is not the thread's own: `forward` (the Python stack of the forward call
    /// that made `autograd_node`, under a frame naming the node) or `forward_near`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack_origin: Option<StackOrigin>,
    /// Python frames, innermost first; empty when the thread had none.
    #[serde(default)]
    pub stack: Stack,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub native: Vec<NativeFrame>,
}

impl Event {
    /// An event with the fields every layer has; the rest empty.
    pub fn new(ts: u64, pid: u32, tid: u32, source: Source, layer: Layer, op: Op, api: Cow<'static, str>) -> Self {
        Event {
            ts,
            pid,
            tid,
            ns_pid: None,
            ppid: None,
            job: None,
            rank: None,
            local_rank: None,
            world_size: None,
            allocator_settings: None,
            comm: no_comm(),
            source,
            layer,
            op,
            api,
            kind: None,
            device: None,
            addr: None,
            size: 0,
            result: 0,
            handle: None,
            handle_type: None,
            handle_object: None,
            peer_pid: None,
            vmm_handle: None,
            pitch: None,
            total: None,
            allocated: None,
            reserved: None,
            segment: None,
            duration_ns: None,
            exit_code: None,
            signal: None,
            filename: None,
            caller_module: None,
            allocator_segment: None,
            autograd_node: None,
            autograd_seq: None,
            autograd_thread: None,
            stack_origin: None,
            stack: Stack::empty(),
            native: Vec::new(),
        }
    }

    /// The stack memory is attributed to: the Python frames, else the module that called the
    /// driver (`Stack::of_module`), else none.
    pub fn attributed_stack(&self) -> Stack {
        match &self.caller_module {
            Some(module) if self.stack.is_empty() => Stack::of_module(module),
            _ => self.stack.clone(),
        }
    }

    /// The call succeeded (CUDA_SUCCESS); process events always succeed.
    pub fn succeeded(&self) -> bool {
        self.result == 0
    }
}

/// The name of a process not known yet (shared: making an event allocates nothing).
pub fn no_comm() -> Arc<str> {
    static EMPTY: std::sync::LazyLock<Arc<str>> = std::sync::LazyLock::new(|| Arc::from(""));
    EMPTY.clone()
}

/// Now, in the events' clock: wall-clock nanoseconds since the Unix epoch.
pub fn wall_clock_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// The `api` of allocator-level events from PyTorch.
pub const PYTORCH_ALLOCATOR_API: &str = "c10::reportMemoryUsageToProfiler";

/// The `api` of an allocator-level failed allocation from PyTorch: its caching allocator gave up
/// on a request (out of memory), with its totals at the failure.
pub const PYTORCH_OOM_API: &str = "c10::reportOutOfMemoryToProfiler";

/// `CUDA_ERROR_OUT_OF_MEMORY`.
pub const CUDA_ERROR_OUT_OF_MEMORY: i32 = 2;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_event_serializes_with_contract_names() {
        let mut event = Event::new(
            1_700_000_000_000_000_000,
            4711,
            4712,
            Source::Ebpf,
            Layer::Driver,
            Op::IpcOpen,
            Cow::Borrowed("cuIpcOpenMemHandle_v2"),
        );
        event.comm = "python3".into();
        event.kind = Some(Kind::Device);
        event.addr = Some(0x7f00_0020_0000);
        event.size = 0;
        event.handle = Some(vec![0xab, 0x01]);
        let json = serde_json::to_string(&event).unwrap();
        assert_eq!(
            json,
            r#"{"ts":1700000000000000000,"pid":4711,"tid":4712,"comm":"python3","source":"ebpf","layer":"driver","op":"ipc_open","api":"cuIpcOpenMemHandle_v2","kind":"device","addr":"0x7f0000200000","size":0,"result":0,"handle":"ab01","stack":[]}"#
        );
        let back: Event = serde_json::from_str(&json).unwrap();
        assert_eq!(back, event);
    }

    #[test]
    fn a_first_call_says_its_job_after_the_parent() {
        let mut event =
            Event::new(1, 4711, 4711, Source::Ebpf, Layer::Driver, Op::Alloc, Cow::Borrowed("cuMemAlloc_v2"));
        event.ppid = Some(4700);
        event.job = Some("torchrun:llama-7b-3".into());
        event.rank = Some(11);
        event.local_rank = Some(3);
        event.world_size = Some(16);
        let json = serde_json::to_string(&event).unwrap();
        assert_eq!(
            json,
            r#"{"ts":1,"pid":4711,"tid":4711,"ppid":4700,"job":"torchrun:llama-7b-3","rank":11,"local_rank":3,"world_size":16,"comm":"","source":"ebpf","layer":"driver","op":"alloc","api":"cuMemAlloc_v2","size":0,"result":0,"stack":[]}"#
        );
        assert_eq!(serde_json::from_str::<Event>(&json).unwrap(), event);
    }

    #[test]
    fn the_shims_events_say_shim_and_an_old_cupti_line_reads_as_the_shim() {
        let event = Event::new(1, 7, 7, Source::Shim, Layer::Process, Op::Exit, Cow::Borrowed("exit"));
        assert!(serde_json::to_string(&event).unwrap().contains(r#""source":"shim""#));
        let old = r#"{"ts":1,"pid":7,"tid":7,"source":"cupti","layer":"allocator","op":"alloc","api":"c10::reportMemoryUsageToProfiler","kind":"device","device":0,"addr":"0x7f0000000000","size":512,"result":0,"stack":[]}"#;
        let read: Event = serde_json::from_str(old).unwrap();
        assert_eq!((read.source, read.layer, read.size), (Source::Shim, Layer::Allocator, 512));
    }

    #[test]
    fn bad_address_is_an_error() {
        let line = r#"{"ts":1,"pid":1,"tid":1,"source":"ebpf","layer":"driver","op":"alloc","api":"cuMemAlloc_v2","addr":"nope"}"#;
        let err = serde_json::from_str::<Event>(line).unwrap_err().to_string();
        assert!(err.contains("address \"nope\" is not 0x-prefixed hex"), "{err}");
    }
}
