//! One process's last seconds of events, in bounded memory: a ring of chunks, each a recording of
//! a few seconds of its events. The chunk being written is a plain recording in memory (a zstd
//! encoder per process would cost more memory than most windows hold); it is compressed whole
//! when it closes — when its time is up, when it reaches its size, or when a post-mortem takes
//! it. Closed chunks go oldest first: when they are older than the window, or a cap needs room.
//!
//! A chunk also keeps what a replay of it could not learn from its events: what the process
//! stood at when it opened (contexts, the allocator's totals), and what its events released that
//! was made before it — a free of memory allocated before the window needs that memory in the
//! post-mortem's prologue, and once freed the tracker no longer has it.

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::sync::Arc;

use gpuprof_model::event::{Event, Op, Source};
use gpuprof_model::track::{ProcessMemory, Tracker};
use gpuprof_recording::{Compressor, Writer};

use super::holdings::{released_by, Held};

/// How a window is cut into chunks.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// How far back a window reaches (ns).
    pub window_ns: u64,
    /// A chunk closes once its first event is this old (ns).
    pub chunk_ns: u64,
    /// A chunk closes once its plain bytes reach this.
    pub chunk_bytes: usize,
}

/// What a process stood at when a chunk opened, before its first event.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Opening {
    pub comm: Arc<str>,
    pub ppid: Option<u32>,
    pub contexts: u32,
    /// The allocator's (allocated, reserved) per device.
    pub totals: BTreeMap<i32, (u64, u64)>,
}

impl Opening {
    fn of(process: Option<&ProcessMemory>, event: &Event) -> Opening {
        match process {
            Some(p) => Opening {
                comm: p.comm.clone(),
                ppid: p.ppid,
                contexts: p.contexts(),
                totals: p.allocator_totals().iter().map(|(&d, t)| (d, (t.allocated, t.reserved))).collect(),
            },
            None => Opening { comm: event.comm.clone(), ppid: event.ppid, contexts: 0, totals: BTreeMap::new() },
        }
    }
}

enum Body {
    Open(Box<Writer<Vec<u8>>>),
    /// A whole recording, zstd-compressed.
    Closed(Arc<[u8]>),
}

struct Chunk {
    body: Body,
    first_ts: u64,
    last_ts: u64,
    events: u64,
    /// The latest time of the process's events before this chunk (0: none).
    before: u64,
    opening: Opening,
    /// Released by this chunk's events, made no later than `before`.
    freed: Vec<Held>,
    freed_bytes: u64,
}

impl Chunk {
    fn bytes(&self) -> u64 {
        let body = match &self.body {
            Body::Open(writer) => writer.output().len(),
            Body::Closed(bytes) => bytes.len(),
        };
        body as u64 + self.freed_bytes
    }

    /// Compresses it; returns its plain bytes' buffer, emptied (for the next chunk).
    fn close(&mut self, compressor: &mut Compressor) -> io::Result<Vec<u8>> {
        let Body::Open(writer) = std::mem::replace(&mut self.body, Body::Closed(Arc::from(Vec::new()))) else {
            return Ok(Vec::new());
        };
        let mut plain = writer.finish(0)?;
        self.body = Body::Closed(compressor.compress(&plain)?.into());
        plain.clear();
        Ok(plain)
    }
}

/// What a post-mortem takes of a window: its chunks, all closed, and what opens them.
pub(crate) struct Kept {
    /// Recordings, oldest first.
    pub chunks: Vec<Arc<[u8]>>,
    /// The first event kept (None: none is).
    pub first_ts: Option<u64>,
    /// Things made no later than this that the process holds now are the prologue's.
    pub before: u64,
    /// What the process stood at before the first event kept.
    pub opening: Option<Opening>,
    /// Made no later than `before` and released by an event kept.
    pub freed: Vec<Held>,
    /// The newest event a cap dropped (0: none): the window reaches back no further.
    pub shed_until: u64,
}

/// One process instance's recent events.
pub(crate) struct Window {
    /// The tracker's instance: when it was first seen.
    pub since: u64,
    /// The capture its events came from, for the prologue's.
    pub source: Source,
    /// PyTorch's settings, from the process's first call (the prologue's first event says them).
    pub allocator_settings: Option<Arc<str>>,
    chunks: VecDeque<Chunk>,
    max_ts: u64,
    /// The last closed chunk's buffer, for the next of a process that keeps making events: a
    /// buffer grown anew for each chunk costs a copy and fresh pages every time.
    spare: Vec<u8>,
    /// Events a cap dropped before they were a window old, and the newest of them.
    pub shed_events: u64,
    shed_until: u64,
}

impl Window {
    pub(crate) fn new(since: u64, source: Source) -> Window {
        Window {
            since,
            source,
            allocator_settings: None,
            chunks: VecDeque::new(),
            max_ts: 0,
            spare: Vec::new(),
            shed_events: 0,
            shed_until: 0,
        }
    }

    fn open(&mut self) -> Option<&mut Chunk> {
        self.chunks.back_mut().filter(|c| matches!(c.body, Body::Open(_)))
    }

    /// Before the tracker applies `event`: a chunk open for it (the one before closed when its
    /// time or size is up), and what the event releases from before that chunk kept. Returns
    /// whether a chunk closed. Its process (looked up only when needed: most events need not)
    /// is `tracker`'s instance of the event's pid.
    pub(crate) fn prepare(
        &mut self,
        event: &Event,
        tracker: &Tracker,
        limits: &Limits,
        compressor: &mut Compressor,
    ) -> io::Result<bool> {
        let mut closed = false;
        if let Some(open) = self.open() {
            let full = match &open.body {
                Body::Open(writer) => writer.output().len() >= limits.chunk_bytes,
                Body::Closed(_) => false,
            };
            if full || event.ts >= open.first_ts.saturating_add(limits.chunk_ns) {
                self.spare = open.close(compressor)?;
                closed = true;
            }
        }
        if closed {
            self.expire(event.ts.saturating_sub(limits.window_ns));
        }
        if self.open().is_none() {
            self.begin_chunk(event, tracker.process(event.pid))?;
        }
        if !event.succeeded() || !matches!(event.op, Op::Free | Op::Unmap | Op::IpcClose) {
            return Ok(closed);
        }
        if let (Some(process), Some(open)) = (tracker.process(event.pid), self.chunks.back_mut()) {
            for held in released_by(event, process, tracker, open.before) {
                open.freed_bytes += held.footprint();
                open.freed.push(held);
            }
        }
        Ok(closed)
    }

    fn begin_chunk(&mut self, event: &Event, process: Option<&ProcessMemory>) -> io::Result<()> {
        let buffer = std::mem::take(&mut self.spare);
        self.chunks.push_back(Chunk {
            body: Body::Open(Box::new(Writer::new(buffer, false)?)),
            first_ts: event.ts,
            last_ts: event.ts,
            events: 0,
            before: self.max_ts,
            opening: Opening::of(process, event),
            freed: Vec::new(),
            freed_bytes: 0,
        });
        Ok(())
    }

    /// Keeps `event` (after the tracker applied it); the tracker's instance of its process
    /// opens a chunk that opens now (the first event after a fork or exec).
    pub(crate) fn write(&mut self, event: &Event, tracker: &Tracker) -> io::Result<()> {
        if self.open().is_none() {
            self.begin_chunk(event, tracker.process(event.pid))?;
        }
        let Some(chunk) = self.chunks.back_mut() else { return Ok(()) };
        let Body::Open(writer) = &mut chunk.body else { return Ok(()) };
        writer.write(event)?;
        chunk.events += 1;
        chunk.first_ts = chunk.first_ts.min(event.ts);
        chunk.last_ts = chunk.last_ts.max(event.ts);
        self.max_ts = self.max_ts.max(event.ts);
        self.source = event.source;
        if self.allocator_settings.is_none() {
            self.allocator_settings.clone_from(&event.allocator_settings);
        }
        Ok(())
    }

    /// Closes the chunk being written once its time is up at `now` (an idle process's chunk
    /// gives its writer back), and drops the chunks older than the window.
    pub(crate) fn tick(&mut self, now: u64, limits: &Limits, compressor: &mut Compressor) -> io::Result<()> {
        if let Some(open) = self.open() {
            if now >= open.first_ts.saturating_add(limits.chunk_ns) {
                open.close(compressor)?;
                // An idle process's buffer goes back too.
                self.spare = Vec::new();
            }
        }
        self.expire(now.saturating_sub(limits.window_ns));
        Ok(())
    }

    /// Closes the chunk being written now (the process exited: no event will follow).
    pub(crate) fn close(&mut self, compressor: &mut Compressor) -> io::Result<()> {
        self.spare = Vec::new();
        match self.open() {
            Some(open) => open.close(compressor).map(drop),
            None => Ok(()),
        }
    }

    /// Drops closed chunks whose events all came before `horizon`.
    pub(crate) fn expire(&mut self, horizon: u64) {
        while self.chunks.front().is_some_and(|c| matches!(c.body, Body::Closed(_)) && c.last_ts < horizon) {
            self.chunks.pop_front();
        }
    }

    /// Drops the oldest closed chunk for a cap; returns how many events it held.
    pub(crate) fn shed_oldest(&mut self) -> Option<u64> {
        if !matches!(self.chunks.front()?.body, Body::Closed(_)) {
            return None;
        }
        let chunk = self.chunks.pop_front()?;
        self.shed_events += chunk.events;
        self.shed_until = self.shed_until.max(chunk.last_ts);
        Some(chunk.events)
    }

    /// When its oldest closed chunk began, for the node's cap (oldest first).
    pub(crate) fn oldest_closed(&self) -> Option<u64> {
        self.chunks.front().filter(|c| matches!(c.body, Body::Closed(_))).map(|c| c.first_ts)
    }

    /// Bytes it holds.
    pub(crate) fn bytes(&self) -> u64 {
        self.chunks.iter().map(Chunk::bytes).sum::<u64>() + self.spare.capacity() as u64
    }

    /// Events it holds.
    pub(crate) fn events(&self) -> u64 {
        self.chunks.iter().map(|c| c.events).sum()
    }

    /// Everything kept, for a post-mortem: the chunk being written closes (the next event opens
    /// another).
    pub(crate) fn kept(&mut self, compressor: &mut Compressor) -> io::Result<Kept> {
        self.close(compressor)?;
        let before = self.chunks.front().map_or(self.max_ts, |c| c.before);
        let freed = self.chunks.iter().flat_map(|c| &c.freed).filter(|h| h.ts() <= before).cloned().collect();
        Ok(Kept {
            chunks: self
                .chunks
                .iter()
                .filter_map(|c| match &c.body {
                    Body::Closed(bytes) => Some(bytes.clone()),
                    Body::Open(_) => None,
                })
                .collect(),
            first_ts: self.chunks.iter().filter(|c| c.events > 0).map(|c| c.first_ts).next(),
            before,
            opening: self.chunks.front().map(|c| c.opening.clone()),
            freed,
            shed_until: self.shed_until,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use gpuprof_model::event::{Layer, Op};

    use super::*;

    const S: u64 = 1_000_000_000;

    fn event(ts: u64) -> Event {
        let mut event = Event::new(ts, 7, 7, Source::Ebpf, Layer::Driver, Op::Alloc, Cow::Borrowed("cuMemAlloc_v2"));
        event.addr = Some(0x7f00_0000_0000 + ts);
        event.size = 4096;
        event
    }

    fn keep(window: &mut Window, tracker: &Tracker, limits: &Limits, ts: u64) -> bool {
        let event = event(ts);
        let closed = window.prepare(&event, tracker, limits, &mut Compressor::new().unwrap()).unwrap();
        window.write(&event, tracker).unwrap();
        closed
    }

    fn read(chunk: &[u8]) -> Vec<u64> {
        let mut reader = gpuprof_recording::Reader::new(io::Cursor::new(chunk.to_vec())).unwrap();
        std::iter::from_fn(|| reader.next_event().unwrap()).map(|e| e.ts).collect()
    }

    #[test]
    fn chunks_close_on_time_expire_past_the_window_and_a_post_mortem_takes_them_whole() {
        let limits = Limits { window_ns: 4 * S, chunk_ns: S, chunk_bytes: 1 << 20 };
        let tracker = Tracker::new();
        let mut window = Window::new(0, Source::Ebpf);
        // Four events a second for 6 s: a chunk closes at each second's first event.
        let closed: Vec<bool> = (0..24).map(|n| keep(&mut window, &tracker, &limits, 10 * S + n * S / 4)).collect();
        assert_eq!(closed.iter().filter(|c| **c).count(), 5);
        // Closing the chunk of 14 s at 15 s dropped the one that ended before 11 s.
        assert_eq!(window.events(), 20);
        // At 16.2 s the chunks that ended before 12.2 s are gone: those of 10 s and 11 s.
        let mut compressor = Compressor::new().unwrap();
        window.tick(16 * S + S / 5, &limits, &mut compressor).unwrap();
        assert_eq!(window.events(), 16);
        let kept = window.kept(&mut compressor).unwrap();
        assert_eq!(kept.chunks.len(), 4);
        assert_eq!((kept.first_ts, kept.before, kept.shed_until), (Some(12 * S), 11 * S + 3 * S / 4, 0));
        let times: Vec<u64> = kept.chunks.iter().flat_map(|c| read(c)).collect();
        assert_eq!(times, (8..24).map(|n| 10 * S + n * S / 4).collect::<Vec<u64>>());
        // The post-mortem closed the chunk being written: the next event opens another.
        assert!(!keep(&mut window, &tracker, &limits, 16 * S + S / 2));
        assert_eq!(window.kept(&mut compressor).unwrap().chunks.len(), 5);
    }

    #[test]
    fn a_chunk_closes_at_its_size_and_shedding_counts_what_it_drops() {
        let limits = Limits { window_ns: 60 * S, chunk_ns: 60 * S, chunk_bytes: 64 << 10 };
        let tracker = Tracker::new();
        let mut window = Window::new(0, Source::Ebpf);
        let mut closes = Vec::new();
        for n in 0..20_000 {
            if keep(&mut window, &tracker, &limits, S + n * 1000) {
                closes.push(n);
            }
        }
        assert!(closes.len() >= 2, "{closes:?}");
        let first_chunk = closes[0];
        // Shedding the oldest chunk drops exactly its events; the chunk being written is never shed.
        assert_eq!(window.shed_oldest(), Some(first_chunk));
        assert_eq!(window.events(), 20_000 - first_chunk);
        while window.shed_oldest().is_some() {}
        let written = 20_000 - closes[closes.len() - 1];
        assert_eq!((window.events(), window.shed_events), (written, closes[closes.len() - 1]));
        assert_eq!(
            window.kept(&mut Compressor::new().unwrap()).unwrap().shed_until,
            S + (closes[closes.len() - 1] - 1) * 1000
        );
    }
}
