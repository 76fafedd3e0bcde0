//! One span per allocation lifetime: it starts at the allocation and ends at its free, or at the
//! exit (or exec) of a process that still held it, marked `gpu.memory.leaked`. IPC exports,
//! the opens and closes of other processes, and VMM maps/unmaps of the allocation are span
//! events on it. Driver allocations (segments, VMM, pinned memory: hundreds in a process's
//! life) each get a span; a framework allocator's blocks (tensors: tens of thousands a second)
//! only from a size up, and a trace takes a bounded number of spans ([`SpanPolicy`]), so that a
//! process's trace stays readable. All spans of a process instance share one trace (see `ids`).

use std::collections::HashMap;

use gpuprof_model::otel::{span as attr, span_event};
use gpuprof_model::track::Space;
use gpuprof_model::{Event, Frame, Kind, Layer, Op, Tracker};
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use opentelemetry_proto::tonic::trace::v1::{span, Span};

use crate::ids::{process_trace_id, span_id};
use crate::{kv, kv_int, kv_str};

type SpanKey = (u32, Layer, Space, u64);
/// A span's key within its process.
type LocalKey = (Layer, Space, u64);

struct OpenSpan {
    trace: [u8; 16],
    id: [u8; 8],
    start: Event,
    events: Vec<span::Event>,
}

struct Trace {
    id: [u8; 16],
    spans: u64,
}

/// Which allocations become spans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpanPolicy {
    /// Allocator blocks (tensors) smaller than this get no span; driver allocations always do.
    pub block_min_bytes: u64,
    /// Spans one process instance's trace gets at most; allocations past it get none (counted).
    pub max_per_process: u64,
}

impl SpanPolicy {
    /// A span for every allocation.
    pub(crate) const ALL: SpanPolicy = SpanPolicy { block_min_bytes: 0, max_per_process: u64::MAX };
}

/// Folds events into finished spans; call `observe` before the tracker applies each event.
pub struct Lifetimes {
    host: String,
    policy: SpanPolicy,
    /// Allocations that got no span because their trace was full.
    over_cap: u64,
    /// Open spans by process, so an exit ends its own without a look at anyone else's.
    open: HashMap<u32, HashMap<LocalKey, OpenSpan>>,
    traces: HashMap<u32, Trace>,
    /// An importer's mapping (pid, address) → the exporter's allocation.
    imports: HashMap<(u32, u64), SpanKey>,
    /// A VMM mapping (pid, address) → the `cuMemCreate` allocation mapped there.
    maps: HashMap<(u32, u64), SpanKey>,
    finished: Vec<(u32, Span)>,
}

impl Lifetimes {
    pub fn new(host: impl Into<String>) -> Self {
        Lifetimes::with_policy(host, SpanPolicy::ALL)
    }

    pub(crate) fn with_policy(host: impl Into<String>, policy: SpanPolicy) -> Self {
        Lifetimes {
            host: host.into(),
            policy,
            over_cap: 0,
            open: HashMap::new(),
            traces: HashMap::new(),
            imports: HashMap::new(),
            maps: HashMap::new(),
            finished: Vec::new(),
        }
    }

    /// Allocations that got no span because their process's trace had its share.
    pub(crate) fn over_cap(&self) -> u64 {
        self.over_cap
    }

    /// Spans that ended since the last call, with the pid of their process.
    pub fn take_finished(&mut self) -> Vec<(u32, Span)> {
        std::mem::take(&mut self.finished)
    }

    pub fn observe(&mut self, event: &Event, tracker: &Tracker) {
        let pid = event.pid;
        match (event.layer, event.op) {
            (Layer::Process, Op::Fork | Op::Exec) => {
                self.end_process(pid, event.ts);
                self.traces.insert(pid, Trace { id: process_trace_id(&self.host, pid, event.ts), spans: 0 });
            }
            (Layer::Process, Op::Exit) => {
                self.end_process(pid, event.ts);
                self.traces.remove(&pid);
            }
            _ if !event.succeeded() => {}
            (Layer::Driver | Layer::Allocator, Op::Alloc) => {
                let (Some(addr), Some(kind)) = (event.addr, event.kind) else { return };
                if event.layer == Layer::Allocator && event.size < self.policy.block_min_bytes {
                    return;
                }
                let since = tracker.process(pid).map_or(event.ts, |p| p.first_ts);
                let host = &self.host;
                let trace = self
                    .traces
                    .entry(pid)
                    .or_insert_with(|| Trace { id: process_trace_id(host, pid, since), spans: 0 });
                if trace.spans >= self.policy.max_per_process {
                    self.over_cap += 1;
                    return;
                }
                trace.spans += 1;
                let open = OpenSpan {
                    trace: trace.id,
                    id: span_id(&trace.id, trace.spans),
                    start: event.clone(),
                    events: Vec::new(),
                };
                if let Some(replaced) =
                    self.open.entry(pid).or_default().insert((event.layer, Space::of(kind), addr), open)
                {
                    // The free was never seen (lost, or made by a path not probed).
                    self.finish(pid, replaced, event.ts, None);
                }
            }
            (Layer::Driver, Op::Free) => {
                let Some(addr) = event.addr else { return };
                let kind = tracker.process(pid).and_then(|p| p.released_by(event)).map(|a| a.kind);
                let space = Space::of(kind.or(event.kind).unwrap_or(Kind::Device));
                if let Some(open) = self.take(&(pid, Layer::Driver, space, addr)) {
                    self.finish(pid, open, event.ts, Some(&event.api));
                }
            }
            (Layer::Allocator, Op::Free) => {
                let Some(addr) = event.addr else { return };
                if let Some(open) = self.take(&(pid, Layer::Allocator, Space::Pointer, addr)) {
                    self.finish(pid, open, event.ts, Some(&event.api));
                }
            }
            (Layer::Driver, Op::IpcExport) => {
                let (Some(addr), Some(kind)) = (event.addr, event.kind) else { return };
                let mut attributes = Vec::new();
                if let Some(handle) = &event.handle {
                    attributes.push(kv_str(attr::HANDLE, gpuprof_model::hex::format_bytes(handle)));
                }
                self.add_event(&(pid, Layer::Driver, Space::of(kind), addr), event, span_event::IPC_EXPORT, attributes);
            }
            (Layer::Driver, Op::IpcOpen) => {
                let Some(export) = tracker.exporter_of(event) else { return };
                let key = (export.exporter.pid, Layer::Driver, export.space, export.addr);
                let mut attributes = vec![kv_int(attr::PEER_PID, i64::from(pid))];
                if let Some(addr) = event.addr {
                    attributes.push(kv_str(attr::MAPPED_ADDR, gpuprof_model::hex::format_addr(addr)));
                    self.imports.insert((pid, addr), key);
                }
                self.add_event(&key, event, span_event::IPC_OPEN, attributes);
            }
            (Layer::Driver, Op::IpcClose) => {
                let Some(key) = event.addr.and_then(|addr| self.imports.remove(&(pid, addr))) else { return };
                self.add_event(&key, event, span_event::IPC_CLOSE, vec![kv_int(attr::PEER_PID, i64::from(pid))]);
            }
            (Layer::Driver, Op::Map) => {
                let (Some(handle), Some(addr)) = (event.vmm_handle, event.addr) else { return };
                let key = (pid, Layer::Driver, Space::VmmHandle, handle);
                let attributes = vec![
                    kv_str(attr::MAPPED_ADDR, gpuprof_model::hex::format_addr(addr)),
                    kv_int(attr::SIZE, event.size as i64),
                ];
                self.add_event(&key, event, span_event::MAP, attributes);
                self.maps.insert((pid, addr), key);
            }
            (Layer::Driver, Op::Unmap) => {
                let Some(addr) = event.addr else { return };
                let Some(key) = self.maps.remove(&(pid, addr)) else { return };
                let attributes = vec![kv_str(attr::MAPPED_ADDR, gpuprof_model::hex::format_addr(addr))];
                self.add_event(&key, event, span_event::UNMAP, attributes);
            }
            _ => {}
        }
    }

    fn take(&mut self, key: &SpanKey) -> Option<OpenSpan> {
        let (pid, layer, space, addr) = *key;
        self.open.get_mut(&pid)?.remove(&(layer, space, addr))
    }

    fn add_event(&mut self, key: &SpanKey, event: &Event, name: &str, attributes: Vec<KeyValue>) {
        let (pid, layer, space, addr) = *key;
        if let Some(open) = self.open.get_mut(&pid).and_then(|spans| spans.get_mut(&(layer, space, addr))) {
            open.events.push(span::Event {
                time_unix_nano: event.ts,
                name: name.to_string(),
                attributes,
                dropped_attributes_count: 0,
            });
        }
    }

    /// The process exited or exec'd: what it still held ends here, leaked.
    fn end_process(&mut self, pid: u32, ts: u64) {
        let mut ending: Vec<OpenSpan> =
            self.open.remove(&pid).map(|spans| spans.into_values().collect()).unwrap_or_default();
        ending.sort_by_key(|o| o.start.ts);
        for open in ending {
            self.finish(pid, open, ts, None);
        }
        self.imports.retain(|(importer, _), _| *importer != pid);
        self.maps.retain(|(mapper, _), _| *mapper != pid);
    }

    fn finish(&mut self, pid: u32, open: OpenSpan, end: u64, freed_by: Option<&str>) {
        let start = &open.start;
        let mut attributes = vec![
            kv_str(attr::ADDR, gpuprof_model::hex::format_addr(start.addr.unwrap_or(0))),
            kv_int(attr::SIZE, start.size as i64),
            kv_str(attr::KIND, start.kind.map_or("", Kind::as_str)),
            kv_str(attr::LAYER, start.layer.as_str()),
            kv_str(attr::API, start.api.as_ref()),
            kv_int(attr::THREAD_ID, i64::from(start.tid)),
            kv(attr::LEAKED, any_value::Value::BoolValue(freed_by.is_none())),
        ];
        if let Some(device) = start.device {
            attributes.push(kv_int(attr::DEVICE, i64::from(device)));
        }
        if let Some(api) = freed_by {
            attributes.push(kv_str(attr::FREE_API, api));
        }
        attributes.extend(code_attributes(&start.stack));
        let span = Span {
            trace_id: open.trace.to_vec(),
            span_id: open.id.to_vec(),
            name: start.api.to_string(),
            kind: span::SpanKind::Internal as i32,
            start_time_unix_nano: start.ts,
            end_time_unix_nano: end.max(start.ts),
            attributes,
            events: open.events,
            ..Default::default()
        };
        self.finished.push((pid, span));
    }
}

/// The innermost frame as OpenTelemetry's `code.*` attributes, and the whole stack as text.
pub(crate) fn code_attributes(stack: &[Frame]) -> Vec<KeyValue> {
    let Some(innermost) = stack.first() else { return Vec::new() };
    let trace: Vec<String> = stack.iter().map(|f| format!("{}:{} in {}", f.file, f.line, f.function)).collect();
    vec![
        kv_str(attr::CODE_FUNCTION, &innermost.function),
        kv_str(attr::CODE_FILE, &innermost.file),
        kv_int(attr::CODE_LINE, i64::from(innermost.line)),
        kv_str(attr::CODE_STACKTRACE, trace.join("\n")),
    ]
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use gpuprof_model::Source;

    use super::*;
    use crate::{attribute, attribute_int, attribute_str};

    fn driver(ts: u64, pid: u32, op: Op, api: &'static str, addr: u64, size: u64) -> Event {
        let mut event = Event::new(ts, pid, pid, Source::Ebpf, Layer::Driver, op, Cow::Borrowed(api));
        event.kind = Some(Kind::Device);
        event.addr = Some(addr);
        event.size = size;
        event
    }

    fn run(events: &[Event]) -> Vec<(u32, Span)> {
        let mut tracker = Tracker::new();
        let mut lifetimes = Lifetimes::new("node-1");
        for event in events {
            lifetimes.observe(event, &tracker);
            tracker.apply(event);
        }
        lifetimes.take_finished()
    }

    #[test]
    fn a_freed_allocation_and_a_leaked_one_with_the_ipc_story_on_the_exporters_span() {
        let mut alloc = driver(10, 40, Op::Alloc, "cuMemAlloc_v2", 0xA000, 4096);
        alloc.stack = vec![Frame { function: "share".into(), file: "train.py".into(), line: 7 }].into();
        let mut export = driver(11, 40, Op::IpcExport, "cuIpcGetMemHandle", 0xA000, 0);
        export.handle = Some(vec![0xAB; 64]);
        let mut open = driver(12, 41, Op::IpcOpen, "cuIpcOpenMemHandle_v2", 0xF000, 0);
        open.handle = Some(vec![0xAB; 64]);
        let close = driver(13, 41, Op::IpcClose, "cuIpcCloseMemHandle", 0xF000, 0);
        let free = driver(14, 40, Op::Free, "cuMemFree_v2", 0xA000, 0);
        let kept = driver(15, 40, Op::Alloc, "cuMemAlloc_v2", 0xB000, 8192);
        let mut failed = driver(16, 40, Op::Alloc, "cuMemAlloc_v2", 0, 1 << 40);
        failed.result = 2;
        let exit = Event::new(20, 40, 40, Source::Ebpf, Layer::Process, Op::Exit, Cow::Borrowed("sched_process_exit"));
        let spans = run(&[alloc, export, open, close, free, kept, failed, exit]);
        assert_eq!(spans.len(), 2);

        let (pid, freed) = &spans[0];
        assert_eq!(*pid, 40);
        assert_eq!(
            (freed.name.as_str(), freed.start_time_unix_nano, freed.end_time_unix_nano),
            ("cuMemAlloc_v2", 10, 14)
        );
        let a = &freed.attributes;
        assert_eq!(attribute_str(a, attr::ADDR), Some("0xa000"));
        assert_eq!(attribute_int(a, attr::SIZE), Some(4096));
        assert_eq!(attribute_str(a, attr::FREE_API), Some("cuMemFree_v2"));
        assert_eq!(attribute(a, attr::LEAKED), Some(&any_value::Value::BoolValue(false)));
        assert_eq!(attribute_str(a, attr::CODE_FUNCTION), Some("share"));
        assert_eq!(attribute_int(a, attr::CODE_LINE), Some(7));
        let names: Vec<(&str, u64)> = freed.events.iter().map(|e| (e.name.as_str(), e.time_unix_nano)).collect();
        assert_eq!(names, vec![(span_event::IPC_EXPORT, 11), (span_event::IPC_OPEN, 12), (span_event::IPC_CLOSE, 13)]);
        assert_eq!(attribute_int(&freed.events[1].attributes, attr::PEER_PID), Some(41));

        let (_, leaked) = &spans[1];
        assert_eq!((leaked.start_time_unix_nano, leaked.end_time_unix_nano), (15, 20));
        assert_eq!(attribute(&leaked.attributes, attr::LEAKED), Some(&any_value::Value::BoolValue(true)));
        assert_eq!(leaked.trace_id, freed.trace_id);
        assert_eq!(leaked.trace_id, process_trace_id("node-1", 40, 10).to_vec());
        assert_ne!(leaked.span_id, freed.span_id);
    }
}
