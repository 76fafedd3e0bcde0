//! Writing a recording: strings, frames and stacks once each, events as deltas, the whole
//! optionally through zstd. Writing an event whose stack was seen before costs a map lookup by
//! the stack's precomputed hash and ~20 bytes: nothing is allocated.

use std::collections::HashMap;
use std::io::{self, Write};
use std::time::{Duration, Instant};

use gpuprof_model::event::{Event, Frame};
use gpuprof_model::Stack;

use crate::format::{codes, tag, Field, FLAG_ZSTD, HEADER_LEN, MAGIC, VERSION};
use crate::varint;

/// How often buffered entries are handed to the file at most: a capture that is killed loses
/// no more than this, and compression keeps working on large enough pieces.
const FLUSH_INTERVAL: Duration = Duration::from_millis(500);
const ZSTD_LEVEL: i32 = 3;
/// Slots of the cache of strings met last, by address.
const RECENT_STRINGS: usize = 16;

/// What the writer remembers of the previous events (the reader keeps the same).
#[derive(Default)]
pub(crate) struct Deltas {
    pub ts: u64,
    pub pid: u32,
    pub addr: u64,
    /// Per process: the allocator's allocated and reserved totals last written.
    pub totals: HashMap<u32, (u64, u64), gpuprof_model::hashing::Spread>,
}

enum Sink<W: Write> {
    Plain(W),
    Zstd(zstd::stream::write::Encoder<'static, W>),
}

impl<W: Write> Sink<W> {
    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self {
            Sink::Plain(w) => w.write_all(bytes),
            Sink::Zstd(w) => w.write_all(bytes),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Sink::Plain(w) => w.flush(),
            Sink::Zstd(w) => w.flush(),
        }
    }

    fn finish(self) -> io::Result<W> {
        match self {
            Sink::Plain(mut w) => {
                w.flush()?;
                Ok(w)
            }
            Sink::Zstd(w) => {
                let mut w = w.finish()?;
                w.flush()?;
                Ok(w)
            }
        }
    }
}

/// Writes events to a recording.
pub struct Writer<W: Write> {
    sink: Sink<W>,
    /// Entries not yet handed to the sink.
    buffer: Vec<u8>,
    /// One entry's payload, built before its length is known.
    payload: Vec<u8>,
    strings: HashMap<Box<str>, u64>,
    /// The same strings by id (from 1), and where the ones met last lay (address, id): an
    /// event's command and entry point are the same shared text event after event, so most
    /// lookups are an address and a short comparison rather than a hash of the text.
    by_id: Vec<Box<str>>,
    recent: [(usize, u64); RECENT_STRINGS],
    frames: HashMap<Frame, u64>,
    /// Keyed by their content hash, computed once.
    stacks: HashMap<Stack, u64, gpuprof_model::hashing::Spread>,
    deltas: Deltas,
    events: u64,
    last_flush: Instant,
}

impl<W: Write> Writer<W> {
    /// Starts a recording: the header now, entries as events come. `compress`: zstd.
    pub fn new(mut out: W, compress: bool) -> io::Result<Self> {
        let flags = if compress { FLAG_ZSTD } else { 0 };
        out.write_all(MAGIC)?;
        out.write_all(&VERSION.to_le_bytes())?;
        out.write_all(&flags.to_le_bytes())?;
        let sink =
            if compress { Sink::Zstd(zstd::stream::write::Encoder::new(out, ZSTD_LEVEL)?) } else { Sink::Plain(out) };
        Ok(Writer {
            sink,
            // Grown as entries come: a writer kept in memory for a few events stays small.
            buffer: Vec::new(),
            payload: Vec::with_capacity(256),
            strings: HashMap::new(),
            by_id: Vec::new(),
            recent: [(0, 0); RECENT_STRINGS],
            frames: HashMap::new(),
            stacks: HashMap::default(),
            deltas: Deltas::default(),
            events: 0,
            last_flush: Instant::now(),
        })
    }

    /// The output as far as it was handed over.
    pub fn output(&self) -> &W {
        match &self.sink {
            Sink::Plain(w) => w,
            Sink::Zstd(w) => w.get_ref(),
        }
    }

    /// Events written so far.
    pub fn events(&self) -> u64 {
        self.events
    }

    pub fn write(&mut self, event: &Event) -> io::Result<()> {
        let ids = self.ids(event);
        let p = &mut self.payload;
        p.clear();
        varint::put(p, u64::from(present_fields(event, &ids)));
        p.push(codes::pack(event.source, event.layer, event.op));
        varint::put_delta(p, event.ts, self.deltas.ts);
        varint::put_delta(p, u64::from(event.pid), u64::from(self.deltas.pid));
        varint::put_delta(p, u64::from(event.tid), u64::from(event.pid));
        varint::put(p, ids.comm);
        varint::put(p, ids.api);
        varint::put(p, event.size);
        varint::put_signed(p, i64::from(event.result));
        varint::put(p, ids.stack);
        put_memory_fields(p, &mut self.deltas, event, &ids);
        put_context_fields(p, event, &ids);
        self.deltas.ts = event.ts;
        self.deltas.pid = event.pid;
        if event.op == gpuprof_model::Op::Exit {
            self.deltas.totals.remove(&event.pid);
        }
        self.entry_from_payload(tag::EVENT);
        self.events += 1;
        if self.buffer.len() >= 1 << 16 {
            self.sink.write_all(&self.buffer)?;
            self.buffer.clear();
        }
        Ok(())
    }

    /// Hands what is buffered to the file, at most every half second.
    pub fn flush(&mut self) -> io::Result<()> {
        if self.last_flush.elapsed() < FLUSH_INTERVAL {
            return Ok(());
        }
        self.flush_now()
    }

    pub fn flush_now(&mut self) -> io::Result<()> {
        self.last_flush = Instant::now();
        self.sink.write_all(&self.buffer)?;
        self.buffer.clear();
        self.sink.flush()
    }

    /// Closes the recording cleanly (the end entry says how many events and how many the
    /// capture lost) and returns the output.
    pub fn finish(mut self, lost: u64) -> io::Result<W> {
        self.payload.clear();
        varint::put(&mut self.payload, self.events);
        varint::put(&mut self.payload, lost);
        self.entry_from_payload(tag::END);
        self.sink.write_all(&self.buffer)?;
        self.buffer.clear();
        self.sink.finish()
    }

    /// The ids of what `event` names, each string, frame and stack written first if new.
    fn ids(&mut self, event: &Event) -> EventIds {
        EventIds {
            stack: self.stack_id(&event.stack),
            comm: self.string_id(&event.comm),
            api: self.string_id(&event.api),
            handle_type: event.handle_type.as_deref().map(|t| self.string_id(t)),
            filename: event.filename.as_deref().map(|f| self.string_id(f)),
            caller_module: event.caller_module.as_deref().map(|m| self.string_id(m)),
            autograd_node: event.autograd_node.as_deref().map(|n| self.string_id(n)),
            allocator_settings: event.allocator_settings.as_deref().map(|s| self.string_id(s)),
            job: event.job.as_deref().map(|j| self.string_id(j)),
            native: event
                .native
                .iter()
                .map(|n| (self.string_id(&n.symbol), self.string_id(&n.module), n.offset))
                .collect(),
        }
    }

    fn entry_from_payload(&mut self, tag: u8) {
        self.buffer.push(tag);
        varint::put(&mut self.buffer, self.payload.len() as u64);
        self.buffer.extend_from_slice(&self.payload);
    }

    fn string_id(&mut self, text: &str) -> u64 {
        let address = text.as_ptr() as usize;
        let slot = (address >> 4) % RECENT_STRINGS;
        let (seen_at, id) = self.recent[slot];
        // The address is a hint: the text is compared, since freed memory may hold another.
        if seen_at == address && id > 0 && *self.by_id[id as usize - 1] == *text {
            return id;
        }
        let id = match self.strings.get(text) {
            Some(&id) => id,
            None => {
                let id = self.by_id.len() as u64 + 1;
                self.strings.insert(text.into(), id);
                self.by_id.push(text.into());
                self.buffer.push(tag::STRING);
                varint::put(&mut self.buffer, text.len() as u64);
                self.buffer.extend_from_slice(text.as_bytes());
                id
            }
        };
        self.recent[slot] = (address, id);
        id
    }

    fn frame_id(&mut self, frame: &Frame) -> u64 {
        if let Some(&id) = self.frames.get(frame) {
            return id;
        }
        let function = self.string_id(&frame.function);
        let file = self.string_id(&frame.file);
        let id = self.frames.len() as u64 + 1;
        self.frames.insert(frame.clone(), id);
        let mut payload = Vec::with_capacity(12);
        varint::put(&mut payload, function);
        varint::put(&mut payload, file);
        varint::put(&mut payload, u64::from(frame.line));
        self.buffer.push(tag::FRAME);
        varint::put(&mut self.buffer, payload.len() as u64);
        self.buffer.extend_from_slice(&payload);
        id
    }

    fn stack_id(&mut self, stack: &Stack) -> u64 {
        if stack.is_empty() {
            return 0;
        }
        if let Some(&id) = self.stacks.get(stack) {
            return id;
        }
        let frame_ids: Vec<u64> = stack.iter().map(|f| self.frame_id(f)).collect();
        let id = self.stacks.len() as u64 + 1;
        self.stacks.insert(stack.clone(), id);
        let mut payload = Vec::with_capacity(frame_ids.len() * 2 + 2);
        varint::put(&mut payload, frame_ids.len() as u64);
        for frame in frame_ids {
            varint::put(&mut payload, frame);
        }
        self.buffer.push(tag::STACK);
        varint::put(&mut self.buffer, payload.len() as u64);
        self.buffer.extend_from_slice(&payload);
        id
    }
}

/// The ids an event's entry refers to, by field.
struct EventIds {
    stack: u64,
    comm: u64,
    api: u64,
    handle_type: Option<u64>,
    filename: Option<u64>,
    caller_module: Option<u64>,
    autograd_node: Option<u64>,
    allocator_settings: Option<u64>,
    job: Option<u64>,
    /// (symbol, module, offset) of each native frame.
    native: Vec<(u64, u64, u64)>,
}

/// The bits of the optional fields `event` has: the reader learns from them what follows.
fn present_fields(event: &Event, ids: &EventIds) -> u32 {
    let mut fields = 0u32;
    let mut set = |field: Field, present: bool| {
        if present {
            fields |= field.bit();
        }
    };
    set(Field::NsPid, event.ns_pid.is_some());
    set(Field::Ppid, event.ppid.is_some());
    set(Field::Kind, event.kind.is_some());
    set(Field::Device, event.device.is_some());
    set(Field::Addr, event.addr.is_some());
    set(Field::Handle, event.handle.is_some());
    set(Field::HandleType, ids.handle_type.is_some());
    set(Field::HandleObject, event.handle_object.is_some());
    set(Field::PeerPid, event.peer_pid.is_some());
    set(Field::VmmHandle, event.vmm_handle.is_some());
    set(Field::Pitch, event.pitch.is_some());
    set(Field::Total, event.total.is_some());
    set(Field::Allocated, event.allocated.is_some());
    set(Field::Reserved, event.reserved.is_some());
    set(Field::Segment, event.segment.is_some());
    set(Field::DurationNs, event.duration_ns.is_some());
    set(Field::ExitCode, event.exit_code.is_some());
    set(Field::Signal, event.signal.is_some());
    set(Field::Filename, ids.filename.is_some());
    set(Field::Native, !ids.native.is_empty());
    set(Field::CallerModule, ids.caller_module.is_some());
    set(Field::AutogradNode, ids.autograd_node.is_some());
    set(Field::AutogradSeq, event.autograd_seq.is_some());
    set(Field::AutogradThread, event.autograd_thread.is_some());
    set(Field::StackOrigin, event.stack_origin.is_some());
    set(Field::Rank, event.rank.is_some());
    set(Field::AllocatorSettings, ids.allocator_settings.is_some());
    set(Field::AllocatorSegment, event.allocator_segment.is_some());
    set(Field::Job, ids.job.is_some());
    set(Field::LocalRank, event.local_rank.is_some());
    set(Field::WorldSize, event.world_size.is_some());
    fields
}

/// The optional fields that place the call (its process's other ids, the memory, handle and
/// totals it touched), in `Field` order.
fn put_memory_fields(p: &mut Vec<u8>, deltas: &mut Deltas, event: &Event, ids: &EventIds) {
    if let Some(v) = event.ns_pid {
        varint::put(p, u64::from(v));
    }
    if let Some(v) = event.ppid {
        varint::put(p, u64::from(v));
    }
    if let Some(kind) = event.kind {
        p.push(codes::kind_code(kind));
    }
    if let Some(v) = event.device {
        varint::put_signed(p, i64::from(v));
    }
    if let Some(addr) = event.addr {
        varint::put_delta(p, addr, deltas.addr);
        deltas.addr = addr;
    }
    if let Some(handle) = &event.handle {
        varint::put(p, handle.len() as u64);
        p.extend_from_slice(handle);
    }
    if let Some(id) = ids.handle_type {
        varint::put(p, id);
    }
    for v in [event.handle_object, event.peer_pid.map(u64::from), event.vmm_handle, event.pitch, event.total]
        .into_iter()
        .flatten()
    {
        varint::put(p, v);
    }
    if event.allocated.is_some() || event.reserved.is_some() {
        let previous = deltas.totals.entry(event.pid).or_default();
        if let Some(v) = event.allocated {
            varint::put_delta(p, v, previous.0);
            previous.0 = v;
        }
        if let Some(v) = event.reserved {
            varint::put_delta(p, v, previous.1);
            previous.1 = v;
        }
    }
    if let Some(segment) = event.segment {
        varint::put_delta(p, segment, event.addr.unwrap_or(0));
    }
}

/// The optional fields that tell the rest (the call's duration, a process's exit or exec, what
/// the call is attributed to), in `Field` order.
fn put_context_fields(p: &mut Vec<u8>, event: &Event, ids: &EventIds) {
    if let Some(v) = event.duration_ns {
        varint::put(p, v);
    }
    if let Some(v) = event.exit_code {
        varint::put_signed(p, i64::from(v));
    }
    if let Some(v) = event.signal {
        varint::put_signed(p, i64::from(v));
    }
    if let Some(id) = ids.filename {
        varint::put(p, id);
    }
    if !ids.native.is_empty() {
        varint::put(p, ids.native.len() as u64);
        for &(symbol, module, offset) in &ids.native {
            varint::put(p, symbol);
            varint::put(p, module);
            varint::put(p, offset);
        }
    }
    if let Some(id) = ids.caller_module {
        varint::put(p, id);
    }
    for v in [ids.autograd_node, event.autograd_seq, event.autograd_thread].into_iter().flatten() {
        varint::put(p, v);
    }
    if let Some(origin) = event.stack_origin {
        p.push(codes::origin_code(origin));
    }
    if let Some(v) = event.rank {
        varint::put(p, u64::from(v));
    }
    if let Some(id) = ids.allocator_settings {
        varint::put(p, id);
    }
    if let Some(framework) = event.allocator_segment {
        p.push(codes::framework_code(framework));
    }
    if let Some(id) = ids.job {
        varint::put(p, id);
    }
    for v in [event.local_rank, event.world_size].into_iter().flatten() {
        varint::put(p, u64::from(v));
    }
}

/// A plain recording (`Writer::new(out, false)`, finished), compressed: the recording
/// `Writer::new(out, true)` writes, made in one step. For recordings kept in memory, where a
/// zstd stream open for each would cost more than the recordings.
pub fn compress(plain: &[u8]) -> io::Result<Vec<u8>> {
    Compressor::new()?.compress(plain)
}

/// `compress` for many recordings, with one zstd context for all (one made for each would be
/// allocated and freed each time: memory a long-running process does not get back whole).
pub struct Compressor(zstd::bulk::Compressor<'static>);

impl Compressor {
    pub fn new() -> io::Result<Compressor> {
        Ok(Compressor(zstd::bulk::Compressor::new(ZSTD_LEVEL)?))
    }

    pub fn compress(&mut self, plain: &[u8]) -> io::Result<Vec<u8>> {
        let header = plain.get(..HEADER_LEN).filter(|h| h.starts_with(MAGIC));
        let Some(header) = header.filter(|h| u16::from_le_bytes([h[10], h[11]]) & FLAG_ZSTD == 0) else {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a plain recording"));
        };
        let body = self.0.compress(&plain[HEADER_LEN..])?;
        let mut out = Vec::with_capacity(HEADER_LEN + body.len());
        out.extend_from_slice(&header[..10]);
        out.extend_from_slice(&FLAG_ZSTD.to_le_bytes());
        out.extend_from_slice(&body);
        Ok(out)
    }
}
