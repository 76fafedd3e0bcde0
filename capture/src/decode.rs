//! Turns ring-buffer records into contract events: names from the driver table, wall-clock
//! time, parents from the processes' fork and exec records, handles, exit statuses. Pure: it
//! reads the record and what earlier records said, nothing else (no /proc, no other process's
//! memory); what the record only points at is `enrich`'s. The hot path of the agent.

use std::borrow::Cow;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::Arc;

use gpuprof_ebpf::types::{gp_record, gp_record_kind};
use gpuprof_model::driver_api::{self, CallValues};
use gpuprof_model::event::{
    Event, Kind, Layer, Op, Source, CUDA_ERROR_OUT_OF_MEMORY, PYTORCH_ALLOCATOR_API, PYTORCH_OOM_API,
};
use gpuprof_model::Framework;

use crate::clock::Clock;
use crate::kernel::{flags, Record};

/// A backward block's node until `enrich` reads its class (or for good, when the process is gone
/// before its records are read: still a backward block).
pub(crate) const UNNAMED_NODE: &str = "Node";

pub struct Decoder {
    clock: Clock,
    /// Each process's parent, as its fork or exec record said: driver records do not carry it.
    parents: HashMap<u32, u32>,
    /// `UNNAMED_NODE`, shared: a backward pass makes thousands of blocks a second.
    unnamed_node: Arc<str>,
    /// Each thread's name as its records carry it, and the shared copy events get: a record
    /// names its thread on every call, an event must not allocate a name each time.
    names: HashMap<u32, ([u8; 16], Arc<str>)>,
}

/// Why a record could not become an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    UnknownApi(u16),
    UnknownKind(u32),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::UnknownApi(id) => write!(f, "record names driver API id {id}, which the table lacks"),
            DecodeError::UnknownKind(kind) => write!(f, "record kind {kind} is unknown"),
        }
    }
}

impl Decoder {
    pub fn new(clock: Clock) -> Self {
        Decoder { clock, parents: HashMap::new(), names: HashMap::new(), unnamed_node: Arc::from(UNNAMED_NODE) }
    }

    pub fn decode(&mut self, record: &Record) -> Result<Event, DecodeError> {
        let (full, record) = (record, &record.header);
        let kind = gp_record_kind(record.kind);
        let (layer, op, api): (Layer, Op, Cow<'static, str>) = match kind {
            gp_record_kind::GP_RECORD_DRIVER => {
                let api = driver_api::by_id(record.api).ok_or(DecodeError::UnknownApi(record.api))?;
                (Layer::Driver, api.op, Cow::Borrowed(api.name))
            }
            gp_record_kind::GP_RECORD_FORK => (Layer::Process, Op::Fork, Cow::Borrowed("sched_process_fork")),
            gp_record_kind::GP_RECORD_EXEC => (Layer::Process, Op::Exec, Cow::Borrowed("sched_process_exec")),
            gp_record_kind::GP_RECORD_EXIT => (Layer::Process, Op::Exit, Cow::Borrowed("sched_process_exit")),
            gp_record_kind::GP_RECORD_ALLOCATOR => {
                let op = if (record.aux as i64) < 0 { Op::Free } else { Op::Alloc };
                (Layer::Allocator, op, Cow::Borrowed(PYTORCH_ALLOCATOR_API))
            }
            gp_record_kind::GP_RECORD_ALLOCATOR_OOM => (Layer::Allocator, Op::Alloc, Cow::Borrowed(PYTORCH_OOM_API)),
            _ => return Err(DecodeError::UnknownKind(record.kind)),
        };
        let mut event =
            Event::new(self.clock.wall_ns(record.ts_ns), record.pid, record.tid, Source::Ebpf, layer, op, api);
        event.comm = self.name_of(record);
        event.ppid = self.parent_of(record, op);
        match layer {
            Layer::Driver => fill_driver(full, &mut event),
            Layer::Allocator => fill_allocator(full, &mut event, &self.unnamed_node),
            Layer::Process => fill_process(full, &mut event),
        }
        if op == Op::Exit {
            self.parents.remove(&record.pid);
            self.names.remove(&record.pid);
        }
        Ok(event)
    }

    fn name_of(&mut self, record: &gp_record) -> Arc<str> {
        match self.names.get(&record.tid) {
            Some((raw, name)) if *raw == record.comm => name.clone(),
            _ => {
                let name: Arc<str> = c_string(&record.comm).into();
                self.names.insert(record.tid, (record.comm, name.clone()));
                name
            }
        }
    }

    /// The record's parent, else the one its process's fork or exec record named.
    fn parent_of(&mut self, record: &gp_record, op: Op) -> Option<u32> {
        let pid = record.pid;
        if matches!(op, Op::Fork | Op::Exec) {
            // A new process, or a new program: what was learned of the pid before is another's.
            self.parents.remove(&pid);
        }
        // One lookup a record: this is the hot path.
        match (self.parents.entry(pid), record.ppid) {
            (Entry::Occupied(mut known), ppid) => {
                if ppid != 0 {
                    *known.get_mut() = ppid;
                }
                Some(*known.get())
            }
            (Entry::Vacant(unknown), ppid) if ppid != 0 => Some(*unknown.insert(ppid)),
            (Entry::Vacant(_), _) => None,
        }
    }
}

fn fill_driver(full: &Record, event: &mut Event) {
    let record = &full.header;
    let api = driver_api::by_id(record.api).expect("checked by decode");
    let mut call = CallValues {
        result: record.result,
        addr: record.addr,
        size: record.size,
        aux: record.aux,
        device: record.device,
        duration_ns: record.duration_ns,
        handle_type: record.handle_type,
        ..CallValues::EMPTY
    };
    if let Some(handle) = full.handle_bytes() {
        call.set_handle(handle);
    }
    api.fill_event(event, &call);
    if record.flags & flags::ALLOCATOR_SEGMENT != 0 {
        event.allocator_segment = Some(Framework::Pytorch);
    }
}

fn fill_allocator(full: &Record, event: &mut Event, unnamed_node: &Arc<str>) {
    let record = &full.header;
    event.kind = Some(Kind::Device);
    event.device = Some(record.device);
    event.size = record.size;
    if record.kind == gp_record_kind::GP_RECORD_ALLOCATOR_OOM.0 {
        // The request the allocator gave up on: no block, a failed allocation.
        event.result = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        event.addr = Some(record.addr);
    }
    let Some(totals) = full.totals else { return };
    event.allocated = Some(totals.allocated);
    event.reserved = Some(totals.reserved);
    if record.flags & flags::AUTOGRAD == 0 {
        return;
    }
    event.autograd_seq = Some(totals.autograd_seq);
    event.autograd_thread = Some(totals.autograd_thread);
    if totals.autograd_node != 0 {
        event.autograd_node = Some(unnamed_node.clone());
    }
}

fn fill_process(full: &Record, event: &mut Event) {
    let record = &full.header;
    match event.op {
        Op::Exec => event.filename = full.filename.as_ref().map(|f| c_string(f)),
        Op::Exit => {
            // wait(2) status: a signal in bits 0..6, else the exit status in bits 8..15.
            let status = record.result;
            let signal = status & 0x7f;
            if signal != 0 {
                event.signal = Some(signal);
                event.exit_code = Some(128 + signal);
            } else {
                event.exit_code = Some((status >> 8) & 0xff);
            }
        }
        _ => {}
    }
}

fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::HANDLE_LEN;

    fn record(kind: gp_record_kind) -> Record {
        let mut record = Record::default();
        let header = &mut record.header;
        header.kind = kind.0;
        header.ts_ns = 5_000;
        header.pid = 42;
        header.tid = 43;
        header.ppid = 7;
        header.comm[..7].copy_from_slice(b"python3");
        record
    }

    #[test]
    fn decodes_an_ipc_open_with_its_handle() {
        let (id, _) = driver_api::by_name("cuIpcOpenMemHandle_v2").unwrap();
        let mut raw = record(gp_record_kind::GP_RECORD_DRIVER);
        raw.header.api = id;
        raw.header.addr = 0x7f00_0040_0000;
        raw.header.handle_len = HANDLE_LEN as u8;
        raw.header.flags = flags::HANDLE;
        let mut handle = [0u8; HANDLE_LEN];
        handle[0] = 0xab;
        raw.handle = Some(handle);
        raw.header.device = -1;
        let event = Decoder::new(Clock::with_offset(1_000_000)).decode(&raw).unwrap();
        assert_eq!(event.ts, 1_005_000);
        assert_eq!((event.pid, event.tid, event.ppid), (42, 43, Some(7)));
        // Driver records carry no parent: it comes from the process's fork or exec record.
        let mut decoder = Decoder::new(Clock::with_offset(0));
        let mut fork = record(gp_record_kind::GP_RECORD_FORK);
        fork.header.ppid = 9;
        decoder.decode(&fork).unwrap();
        raw.header.ppid = 0;
        assert_eq!(decoder.decode(&raw).unwrap().ppid, Some(9));
        assert_eq!(&*event.comm, "python3");
        assert_eq!((event.layer, event.op, event.kind), (Layer::Driver, Op::IpcOpen, Some(Kind::Device)));
        assert_eq!(event.api, "cuIpcOpenMemHandle_v2");
        assert_eq!(event.addr, Some(0x7f00_0040_0000));
        assert_eq!(event.device, None);
        let handle = event.handle.unwrap();
        assert_eq!(handle.len(), HANDLE_LEN);
        assert_eq!(handle[0], 0xab);
    }

    #[test]
    fn exit_status_and_signal() {
        let mut raw = record(gp_record_kind::GP_RECORD_EXIT);
        raw.header.result = 3 << 8;
        let event = Decoder::new(Clock::with_offset(0)).decode(&raw).unwrap();
        assert_eq!((event.exit_code, event.signal), (Some(3), None));
        raw.header.result = 9;
        let event = Decoder::new(Clock::with_offset(0)).decode(&raw).unwrap();
        assert_eq!((event.exit_code, event.signal), (Some(137), Some(9)));
    }

    #[test]
    fn unknown_ids_are_errors_not_panics() {
        let mut raw = record(gp_record_kind::GP_RECORD_DRIVER);
        raw.header.api = 60_000;
        assert_eq!(Decoder::new(Clock::with_offset(0)).decode(&raw), Err(DecodeError::UnknownApi(60_000)));
        raw.header.kind = 99;
        assert_eq!(Decoder::new(Clock::with_offset(0)).decode(&raw), Err(DecodeError::UnknownKind(99)));
    }
}
