//! The names gpuprof's OpenTelemetry output uses — resource, span, span-event, log and metric
//! attributes — in one place, so the agent that writes them and the collector that reads them
//! cannot drift apart. OpenTelemetry's semantic conventions are used where one exists
//! (`host.name`, `process.pid`, `code.*`, `k8s.*`); the rest live under `gpu.memory.*` and
//! `gpuprof.*`. docs/otlp.md documents each one.

/// The instrumentation scope of everything gpuprof emits.
pub const SCOPE: &str = "gpuprof";

pub mod resource {
    pub const HOST_NAME: &str = "host.name";
    pub const PROCESS_PID: &str = "process.pid";
    pub const PROCESS_PARENT_PID: &str = "process.parent_pid";
    pub const PROCESS_COMMAND_LINE: &str = "process.command_line";
    pub const PROCESS_EXECUTABLE_NAME: &str = "process.executable.name";
    pub const CONTAINER_ID: &str = "container.id";
    pub const K8S_POD_UID: &str = "k8s.pod.uid";
    pub const K8S_POD_NAME: &str = "k8s.pod.name";
    pub const K8S_NAMESPACE_NAME: &str = "k8s.namespace.name";
    pub const K8S_NODE_NAME: &str = "k8s.node.name";
    pub const K8S_CONTAINER_NAME: &str = "k8s.container.name";
    /// The UUIDs of the node's GPUs (`GPU-…`), as the driver lists them.
    pub const GPU_UUIDS: &str = "gpu.uuids";
    pub const SERVICE_NAME: &str = "service.name";
    /// One process instance of the fleet: `host/pid`.
    pub const SERVICE_INSTANCE_ID: &str = "service.instance.id";
    /// The Kubernetes Job (or JobSet, PyTorchJob) that owns the pod, where the pod says it.
    pub const K8S_JOB_NAME: &str = "k8s.job.name";
    /// The distributed job the process is one rank of (`model::job`): the launcher's id
    /// (`torchrun:…`, `slurm:…`, `mpi:…`, `k8s:…`, or `GPUPROF_JOB_ID`), else the launcher
    /// process on the node (`host/pgid-N`; `host/pid-N` for a process gone before it was read),
    /// else, for a sidecar's processes, the pod's Job or the pod (`k8s:…`, `host/pod`). Every
    /// process has one: the OpenTelemetry Collector routes a job's data whole to one collector
    /// shard on it.
    pub const JOB_ID: &str = "gpuprof.job.id";
    /// The process's rank, local rank and the job's world size, as its launcher gave them.
    pub const RANK: &str = "gpuprof.rank";
    pub const LOCAL_RANK: &str = "gpuprof.local_rank";
    pub const WORLD_SIZE: &str = "gpuprof.world_size";
}

/// Attributes of an allocation-lifetime span and of a finding span.
pub mod span {
    pub const ADDR: &str = "gpu.memory.addr";
    pub const SIZE: &str = "gpu.memory.size";
    pub const KIND: &str = "gpu.memory.kind";
    pub const LAYER: &str = "gpu.memory.layer";
    pub const API: &str = "gpu.memory.api";
    pub const DEVICE: &str = "gpu.device.index";
    /// The entry point that released it (`cuMemFree_v2`), when it was released.
    pub const FREE_API: &str = "gpu.memory.free_api";
    /// True when the span ended because the process exited (or exec'd) still holding it.
    pub const LEAKED: &str = "gpu.memory.leaked";
    pub const THREAD_ID: &str = "thread.id";
    pub const CODE_FUNCTION: &str = "code.function.name";
    pub const CODE_FILE: &str = "code.file.path";
    pub const CODE_LINE: &str = "code.line.number";
    /// The whole Python stack, innermost first, one `file:line in function` per line.
    pub const CODE_STACKTRACE: &str = "code.stacktrace";
    pub const HANDLE: &str = "gpu.memory.ipc.handle";
    pub const PEER_PID: &str = "gpu.memory.ipc.peer_pid";
    pub const MAPPED_ADDR: &str = "gpu.memory.mapped_addr";

    pub const FINDING_KIND: &str = "gpuprof.finding.kind";
    pub const FINDING_BYTES: &str = "gpuprof.finding.bytes";
    pub const FINDING_COUNT: &str = "gpuprof.finding.count";
    pub const FINDING_DETAIL: &str = "gpuprof.finding.detail";
    /// `leak` or `info`.
    pub const FINDING_SEVERITY: &str = "gpuprof.finding.severity";
    /// The finding's id, the same in a report, the node's agent and the collector.
    pub const FINDING_ID: &str = "gpuprof.finding.id";
    /// The user's own line (`file:line in function`): the innermost frame outside the standard
    /// library and installed packages.
    pub const FINDING_USER_FRAME: &str = "gpuprof.finding.user_frame";
    /// The cause the events show (`autograd_graph_retained`, `fragmentation`, …; docs/findings.md).
    pub const FINDING_DIAGNOSIS: &str = "gpuprof.finding.diagnosis";
    /// `growth`: seconds until the device is full at the rate it grew.
    pub const FINDING_SECONDS_TO_FULL: &str = "gpuprof.finding.seconds_to_full";
    /// The process's rank in a distributed job (`RANK` in its environment).
    pub const RANK: &str = "gpuprof.rank";
    /// A rank's span in its job's trace: what its allocator held as the span ended.
    pub const RANK_ALLOCATED_BYTES: &str = "gpuprof.rank.allocated_bytes";
    pub const RANK_RESERVED_BYTES: &str = "gpuprof.rank.reserved_bytes";
    /// A finding's post-mortem: where the collector serves its report
    /// (`/api/v1/findings/{id}/report`), and its two files on the node.
    pub const POSTMORTEM_URL: &str = "gpuprof.postmortem.url";
    pub const POSTMORTEM_REPORT: &str = "gpuprof.postmortem.report";
    pub const POSTMORTEM_RECORDING: &str = "gpuprof.postmortem.recording";
}

/// Names of the span events on an allocation's span.
pub mod span_event {
    pub const IPC_EXPORT: &str = "gpu.memory.ipc_export";
    pub const IPC_OPEN: &str = "gpu.memory.ipc_open";
    pub const IPC_CLOSE: &str = "gpu.memory.ipc_close";
    pub const MAP: &str = "gpu.memory.map";
    pub const UNMAP: &str = "gpu.memory.unmap";
}

/// Log records (OpenTelemetry events): captured events (one record each: every driver and
/// process event, allocator events only in the full stream), findings, memory profiles, and
/// post-mortems' reports.
pub mod log {
    /// `event_name` of a captured event's record: this prefix and the event's `op` (`gpuprof.alloc`).
    pub const EVENT_NAME_PREFIX: &str = "gpuprof.";
    /// `event_name` of a finding's record; its body is the finding (docs/findings.md) as JSON.
    pub const FINDING: &str = "gpuprof.finding";
    /// `event_name` of a memory profile's record; its body is a pprof profile (bytes).
    pub const MEMORY_PROFILE: &str = "gpuprof.memory_profile";
    /// Why a profile was taken: `periodic`, `finding`, `oom`, `exit`, `end`.
    pub const ATTR_PROFILE_REASON: &str = "gpuprof.profile.reason";
    /// The body's format: `pprof`.
    pub const ATTR_PROFILE_FORMAT: &str = "gpuprof.profile.format";
    /// `event_name` of a post-mortem's report; its body is the HTML report (bytes, gzipped), or
    /// none when it was too large to send (`ATTR_POSTMORTEM_OMITTED` says so).
    pub const POSTMORTEM: &str = "gpuprof.postmortem";
    /// The finding the post-mortem is for (its `finding_id`).
    pub const ATTR_FINDING_ID: &str = "gpuprof.finding.id";
    /// How the body is encoded: `gzip`.
    pub const ATTR_POSTMORTEM_ENCODING: &str = "gpuprof.postmortem.encoding";
    /// The report's path on the node, and its size before encoding.
    pub const ATTR_POSTMORTEM_REPORT: &str = "gpuprof.postmortem.report";
    pub const ATTR_POSTMORTEM_HTML_BYTES: &str = "gpuprof.postmortem.html_bytes";
    /// Why there is no body (the report was over the size one request carries).
    pub const ATTR_POSTMORTEM_OMITTED: &str = "gpuprof.postmortem.omitted";
}

pub mod metric {
    /// Live bytes of a process, per device, layer and kind (gauge).
    pub const LIVE_BYTES: &str = "gpuprof.memory.live";
    /// A framework allocator's bytes in live blocks, per device (gauge).
    pub const ALLOCATOR_ALLOCATED: &str = "gpuprof.allocator.allocated";
    /// A framework allocator's bytes in segments, cache included, per device (gauge).
    pub const ALLOCATOR_RESERVED: &str = "gpuprof.allocator.reserved";
    /// Device memory the driver accounts to a process, all devices (NVML; nvidia-smi's
    /// figure): what gpuprof's probes saw plus the context, modules and anything not probed.
    pub const NVML_USED: &str = "gpuprof.memory.nvml_used";
    pub const ATTR_DEVICE: &str = "gpu.device.index";
    pub const ATTR_KIND: &str = "gpu.memory.kind";
    pub const ATTR_LAYER: &str = "gpu.memory.layer";
}
