//! Reading a recording back, streaming: memory grows with the distinct strings, frames and
//! stacks, not with the events. Each stack is made once and shared by every event that has it.
//! A recording cut short (a capture that was killed, a full disk) is read up to its last whole
//! entry and says so; a corrupt one is an error that names the byte.

use std::borrow::Cow;
use std::io::{self, BufRead, BufReader, Read};

use gpuprof_model::event::{Event, Frame, NativeFrame};
use gpuprof_model::{Stack, DRIVER_APIS};

use crate::format::{codes, tag, Field, FLAG_ZSTD, HEADER_LEN, MAGIC, VERSION};
use crate::varint;
use crate::write::Deltas;

/// Entries larger than this are taken for corruption rather than allocated.
const MAX_ENTRY: u64 = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("not a gpuprof recording (it does not start with GPUPROF)")]
    NotARecording,
    #[error("recording version {0} is newer than this gpuprof reads ({VERSION}): use a newer gpuprof")]
    NewerVersion(u16),
    #[error("corrupt at byte {offset} of the recording's entries: {what}")]
    Corrupt { offset: u64, what: String },
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// How the recording ended, once it has been read to its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Closed cleanly: the events its writer wrote, and those the capture lost.
    Closed { events: u64, lost: u64 },
    /// Cut short after this many events (the writer never closed it).
    Truncated { events: u64 },
}

/// Reads the events of a recording, in order.
pub struct Reader {
    input: BufReader<Box<dyn Read>>,
    strings: Vec<std::sync::Arc<str>>,
    /// The same strings as entry points and handle types (`Cow::Borrowed` for every name gpuprof
    /// itself uses, so events carry no copy).
    names: Vec<Cow<'static, str>>,
    frames: Vec<Frame>,
    stacks: Vec<Stack>,
    deltas: Deltas,
    entry: Vec<u8>,
    /// Bytes of entries read so far (for error messages).
    offset: u64,
    events: u64,
    ending: Option<Ending>,
}

/// The value of an optional field, or, when the entry ends before it, the entry is cut short: the
/// decoding function returns `Ok(None)`.
macro_rules! take {
    ($value:expr) => {
        match $value {
            Some(v) => v,
            None => return Ok(None),
        }
    };
}

impl Reader {
    pub fn new(mut input: impl Read + 'static) -> Result<Self, ReadError> {
        let mut header = [0u8; HEADER_LEN];
        input.read_exact(&mut header).map_err(|_| ReadError::NotARecording)?;
        if &header[..8] != MAGIC {
            return Err(ReadError::NotARecording);
        }
        let version = u16::from_le_bytes([header[8], header[9]]);
        if version > VERSION {
            return Err(ReadError::NewerVersion(version));
        }
        let flags = u16::from_le_bytes([header[10], header[11]]);
        let body: Box<dyn Read> = if flags & FLAG_ZSTD != 0 { Box::new(Unzstd::new(input)?) } else { Box::new(input) };
        Ok(Reader {
            input: BufReader::with_capacity(1 << 16, body),
            strings: Vec::new(),
            names: Vec::new(),
            frames: Vec::new(),
            stacks: Vec::new(),
            deltas: Deltas::default(),
            entry: Vec::with_capacity(256),
            offset: 0,
            events: 0,
            ending: None,
        })
    }

    /// How the recording ended; None until the last event has been read.
    pub(crate) fn ending(&self) -> Option<Ending> {
        self.ending
    }

    /// The next event, or None at the end (see [`Reader::ending`]).
    pub fn next_event(&mut self) -> Result<Option<Event>, ReadError> {
        loop {
            if self.ending.is_some() {
                return Ok(None);
            }
            let Some(entry_tag) = self.read_entry()? else {
                self.ending = Some(Ending::Truncated { events: self.events });
                return Ok(None);
            };
            match entry_tag {
                tag::STRING => self.add_string()?,
                tag::FRAME => self.add_frame()?,
                tag::STACK => self.add_stack()?,
                tag::EVENT => {
                    let event = self.event()?;
                    self.events += 1;
                    return Ok(Some(event));
                }
                tag::END => {
                    let mut at = 0;
                    let events =
                        varint::get(&self.entry, &mut at).ok_or_else(|| self.corrupt("an end entry cut short"))?;
                    let lost =
                        varint::get(&self.entry, &mut at).ok_or_else(|| self.corrupt("an end entry cut short"))?;
                    self.ending = Some(Ending::Closed { events, lost });
                }
                _ => {} // a later version's entry: skipped
            }
        }
    }

    /// Reads one entry into `self.entry`; None when the recording ends (cleanly between
    /// entries, or cut inside one).
    fn read_entry(&mut self) -> Result<Option<u8>, ReadError> {
        let mut tag_byte = [0u8; 1];
        match self.input.read(&mut tag_byte) {
            Ok(0) => return Ok(None),
            Ok(_) => {}
            Err(e) if cut_short(&e) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        let len = match varint::read(&mut self.input) {
            Ok(Some(len)) => len,
            Ok(None) => return Ok(None),
            Err(e) if cut_short(&e) => return Ok(None),
            Err(e) => return Err(self.corrupt(&e.to_string())),
        };
        if len > MAX_ENTRY {
            return Err(self.corrupt(&format!("an entry of {len} bytes")));
        }
        self.entry.resize(len as usize, 0);
        match self.input.read_exact(&mut self.entry) {
            Ok(()) => {}
            Err(e) if cut_short(&e) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        self.offset += 1 + varint::len(len) as u64 + len;
        Ok(Some(tag_byte[0]))
    }

    fn corrupt(&self, what: &str) -> ReadError {
        ReadError::Corrupt { offset: self.offset, what: what.to_string() }
    }

    fn add_string(&mut self) -> Result<(), ReadError> {
        let text = std::str::from_utf8(&self.entry).map_err(|_| self.corrupt("a string that is not UTF-8"))?;
        self.names.push(static_name(text));
        self.strings.push(text.into());
        Ok(())
    }

    fn string(&self, id: u64) -> Result<&std::sync::Arc<str>, ReadError> {
        self.strings
            .get((id as usize).wrapping_sub(1))
            .ok_or_else(|| self.corrupt(&format!("string {id} was never written")))
    }

    fn name(&self, id: u64) -> Result<Cow<'static, str>, ReadError> {
        self.names
            .get((id as usize).wrapping_sub(1))
            .cloned()
            .ok_or_else(|| self.corrupt(&format!("string {id} was never written")))
    }

    fn add_frame(&mut self) -> Result<(), ReadError> {
        let data = &self.entry;
        let mut at = 0;
        let (Some(function), Some(file), Some(line)) =
            (varint::get(data, &mut at), varint::get(data, &mut at), varint::get(data, &mut at))
        else {
            return Err(self.corrupt("a frame entry cut short"));
        };
        let frame = Frame {
            function: self.string(function)?.to_string(),
            file: self.string(file)?.to_string(),
            line: line as u32,
        };
        self.frames.push(frame);
        Ok(())
    }

    fn add_stack(&mut self) -> Result<(), ReadError> {
        let data = &self.entry;
        let mut at = 0;
        let count = varint::get(data, &mut at).ok_or_else(|| self.corrupt("a stack entry cut short"))?;
        let mut frames = Vec::with_capacity(count.min(1024) as usize);
        for _ in 0..count {
            let id = varint::get(data, &mut at).ok_or_else(|| self.corrupt("a stack entry cut short"))?;
            let frame = self
                .frames
                .get((id as usize).wrapping_sub(1))
                .ok_or_else(|| self.corrupt(&format!("frame {id} was never written")))?;
            frames.push(frame.clone());
        }
        self.stacks.push(Stack::new(frames));
        Ok(())
    }

    fn event(&mut self) -> Result<Event, ReadError> {
        let entry = std::mem::take(&mut self.entry);
        let result = self.decode_event(&entry);
        self.entry = entry;
        result.and_then(|e| e.ok_or_else(|| self.corrupt("an event entry cut short")))
    }

    fn decode_event(&mut self, data: &[u8]) -> Result<Option<Event>, ReadError> {
        let mut at = 0;
        let d = &mut at;
        let Some(fields) = varint::get(data, d) else { return Ok(None) };
        let Some(&packed) = data.get(*d) else { return Ok(None) };
        *d += 1;
        let (source, layer, op) =
            codes::unpack(packed).ok_or_else(|| self.corrupt(&format!("an event of unknown kind {packed:#x}")))?;
        let Some(ts) = varint::get_delta(data, d, self.deltas.ts) else { return Ok(None) };
        let Some(pid) = varint::get_delta(data, d, u64::from(self.deltas.pid)) else { return Ok(None) };
        let pid = pid as u32;
        let Some(tid) = varint::get_delta(data, d, u64::from(pid)) else { return Ok(None) };
        let (Some(comm), Some(api)) = (varint::get(data, d), varint::get(data, d)) else { return Ok(None) };
        let mut event = Event::new(ts, pid, tid as u32, source, layer, op, self.name(api)?);
        event.comm = self.string(comm)?.clone();
        let (Some(size), Some(result), Some(stack)) =
            (varint::get(data, d), varint::get_signed(data, d), varint::get(data, d))
        else {
            return Ok(None);
        };
        event.size = size;
        event.result = result as i32;
        if stack != 0 {
            event.stack = self
                .stacks
                .get(stack as usize - 1)
                .cloned()
                .ok_or_else(|| self.corrupt(&format!("stack {stack} was never written")))?;
        }
        let fields = fields as u32;
        if self.decode_memory_fields(data, d, fields, &mut event)?.is_none()
            || self.decode_context_fields(data, d, fields, &mut event)?.is_none()
        {
            return Ok(None);
        }
        self.deltas.ts = ts;
        self.deltas.pid = pid;
        if event.op == gpuprof_model::Op::Exit {
            self.deltas.totals.remove(&pid);
        }
        Ok(Some(event))
    }

    /// The optional fields that place the call (its process's other ids, the memory, handle and
    /// totals it touched), in `Field` order; None when the entry ends among them.
    fn decode_memory_fields(
        &mut self,
        data: &[u8],
        d: &mut usize,
        fields: u32,
        event: &mut Event,
    ) -> Result<Option<()>, ReadError> {
        let has = |field: Field| fields & field.bit() != 0;
        if has(Field::NsPid) {
            event.ns_pid = Some(take!(varint::get(data, d)) as u32);
        }
        if has(Field::Ppid) {
            event.ppid = Some(take!(varint::get(data, d)) as u32);
        }
        if has(Field::Kind) {
            let code = *take!(data.get(*d));
            *d += 1;
            event.kind = Some(codes::kind_of(code).ok_or_else(|| self.corrupt(&format!("memory kind {code}")))?);
        }
        if has(Field::Device) {
            event.device = Some(take!(varint::get_signed(data, d)) as i32);
        }
        if has(Field::Addr) {
            let addr = take!(varint::get_delta(data, d, self.deltas.addr));
            self.deltas.addr = addr;
            event.addr = Some(addr);
        }
        if has(Field::Handle) {
            let len = take!(varint::get(data, d)) as usize;
            let bytes = take!(data.get(*d..d.saturating_add(len)));
            *d += len;
            event.handle = Some(bytes.to_vec());
        }
        if has(Field::HandleType) {
            event.handle_type = Some(self.name(take!(varint::get(data, d)))?);
        }
        if has(Field::HandleObject) {
            event.handle_object = Some(take!(varint::get(data, d)));
        }
        if has(Field::PeerPid) {
            event.peer_pid = Some(take!(varint::get(data, d)) as u32);
        }
        if has(Field::VmmHandle) {
            event.vmm_handle = Some(take!(varint::get(data, d)));
        }
        if has(Field::Pitch) {
            event.pitch = Some(take!(varint::get(data, d)));
        }
        if has(Field::Total) {
            event.total = Some(take!(varint::get(data, d)));
        }
        if has(Field::Allocated) || has(Field::Reserved) {
            let previous = self.deltas.totals.entry(event.pid).or_default();
            if has(Field::Allocated) {
                previous.0 = take!(varint::get_delta(data, d, previous.0));
                event.allocated = Some(previous.0);
            }
            if has(Field::Reserved) {
                previous.1 = take!(varint::get_delta(data, d, previous.1));
                event.reserved = Some(previous.1);
            }
        }
        if has(Field::Segment) {
            event.segment = Some(take!(varint::get_delta(data, d, event.addr.unwrap_or(0))));
        }
        Ok(Some(()))
    }

    /// The optional fields that tell the rest (the call's duration, a process's exit or exec,
    /// what the call is attributed to), in `Field` order; None when the entry ends among them.
    fn decode_context_fields(
        &self,
        data: &[u8],
        d: &mut usize,
        fields: u32,
        event: &mut Event,
    ) -> Result<Option<()>, ReadError> {
        let has = |field: Field| fields & field.bit() != 0;
        if has(Field::DurationNs) {
            event.duration_ns = Some(take!(varint::get(data, d)));
        }
        if has(Field::ExitCode) {
            event.exit_code = Some(take!(varint::get_signed(data, d)) as i32);
        }
        if has(Field::Signal) {
            event.signal = Some(take!(varint::get_signed(data, d)) as i32);
        }
        if has(Field::Filename) {
            event.filename = Some(self.string(take!(varint::get(data, d)))?.to_string());
        }
        if has(Field::Native) {
            let count = take!(varint::get(data, d));
            for _ in 0..count {
                let (symbol, module, offset) =
                    (take!(varint::get(data, d)), take!(varint::get(data, d)), take!(varint::get(data, d)));
                event.native.push(NativeFrame {
                    symbol: self.string(symbol)?.to_string(),
                    module: self.string(module)?.to_string(),
                    offset,
                });
            }
        }
        if has(Field::CallerModule) {
            event.caller_module = Some(self.string(take!(varint::get(data, d)))?.clone());
        }
        if has(Field::AutogradNode) {
            event.autograd_node = Some(self.string(take!(varint::get(data, d)))?.clone());
        }
        if has(Field::AutogradSeq) {
            event.autograd_seq = Some(take!(varint::get(data, d)));
        }
        if has(Field::AutogradThread) {
            event.autograd_thread = Some(take!(varint::get(data, d)));
        }
        if has(Field::StackOrigin) {
            let code = *take!(data.get(*d));
            *d += 1;
            event.stack_origin =
                Some(codes::origin_of(code).ok_or_else(|| self.corrupt(&format!("stack origin {code}")))?);
        }
        if has(Field::Rank) {
            event.rank = Some(take!(varint::get(data, d)) as u32);
        }
        if has(Field::AllocatorSettings) {
            event.allocator_settings = Some(self.string(take!(varint::get(data, d)))?.clone());
        }
        if has(Field::AllocatorSegment) {
            let code = *take!(data.get(*d));
            *d += 1;
            event.allocator_segment =
                Some(codes::framework_of(code).ok_or_else(|| self.corrupt(&format!("framework {code}")))?);
        }
        if has(Field::Job) {
            event.job = Some(self.string(take!(varint::get(data, d)))?.clone());
        }
        if has(Field::LocalRank) {
            event.local_rank = Some(take!(varint::get(data, d)) as u32);
        }
        if has(Field::WorldSize) {
            event.world_size = Some(take!(varint::get(data, d)) as u32);
        }
        Ok(Some(()))
    }
}

/// A file cut short ends in an incomplete entry, or, compressed, in an incomplete zstd frame.
fn cut_short(error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::UnexpectedEof
}

/// zstd decompression that hands out everything it could decompress before reporting that the
/// input ended inside a frame (the zstd crate's reader drops the last piece then: the events
/// a killed capture had flushed would be lost).
struct Unzstd<R: Read> {
    input: R,
    decoder: zstd::stream::raw::Decoder<'static>,
    compressed: Vec<u8>,
    /// compressed[used..filled] is still to be decompressed.
    used: usize,
    filled: usize,
    input_ended: bool,
    /// True between frames (a clean place for the input to end).
    frame_done: bool,
}

impl<R: Read> Unzstd<R> {
    fn new(input: R) -> io::Result<Self> {
        Ok(Unzstd {
            input,
            decoder: zstd::stream::raw::Decoder::new()?,
            compressed: vec![0; 1 << 16],
            used: 0,
            filled: 0,
            input_ended: false,
            frame_done: true,
        })
    }
}

impl<R: Read> Read for Unzstd<R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        use zstd::stream::raw::{InBuffer, Operation, OutBuffer};
        loop {
            if self.used == self.filled && !self.input_ended {
                self.filled = self.input.read(&mut self.compressed)?;
                self.used = 0;
                self.input_ended = self.filled == 0;
            }
            // Run even without new input: the decoder may hold output it had no room for.
            let mut input = InBuffer::around(&self.compressed[self.used..self.filled]);
            let mut output = OutBuffer::around(&mut *out);
            let hint = self.decoder.run(&mut input, &mut output)?;
            self.used += input.pos();
            self.frame_done = hint == 0;
            let produced = output.pos();
            if produced > 0 {
                return Ok(produced);
            }
            if self.used == self.filled && self.input_ended {
                return if self.frame_done { Ok(0) } else { Err(io::ErrorKind::UnexpectedEof.into()) };
            }
        }
    }
}

/// Names gpuprof itself writes are 'static: events read back carry no copy of them.
fn static_name(text: &str) -> Cow<'static, str> {
    const OTHERS: &[&str] = &[
        gpuprof_model::event::PYTORCH_ALLOCATOR_API,
        "sched_process_fork",
        "sched_process_exec",
        "sched_process_exit",
        "fork",
        "exit",
    ];
    let known = DRIVER_APIS
        .iter()
        .map(|api| api.name)
        .chain(OTHERS.iter().copied())
        .chain((0..=u8::MAX).filter_map(gpuprof_model::driver_api::handle_type_name))
        .find(|name| *name == text);
    match known {
        Some(name) => Cow::Borrowed(name),
        None => Cow::Owned(text.to_string()),
    }
}

/// Whether `input` starts like a recording (rather than jsonl); the bytes are not consumed.
pub(crate) fn is_recording(input: &mut impl BufRead) -> io::Result<bool> {
    Ok(input.fill_buf()?.starts_with(&MAGIC[..7]))
}
