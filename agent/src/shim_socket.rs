//! The agent's end of the shim's Unix socket: every process running gpuprof's shim connects and
//! sends its events as jsonl, then (when it exits normally) a counters line. A thread per
//! connection decodes the lines; the capture loop receives what they decoded.

use std::io::{BufRead, BufReader};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::mpsc::{self, Receiver, Sender};

use anyhow::{Context, Result};
use gpuprof_model::Event;
use serde::Deserialize;

/// The shim's counters, summed over the processes that sent theirs.
#[derive(Debug, Default, Clone, Copy, Deserialize)]
pub struct ShimCounters {
    pub sent: u64,
    pub dropped_queue_full: u64,
    pub stacks_cut: u64,
    pub stacks_unresolved: u64,
}

impl ShimCounters {
    pub fn add(&mut self, other: &ShimCounters) {
        self.sent += other.sent;
        self.dropped_queue_full += other.dropped_queue_full;
        self.stacks_cut += other.stacks_cut;
        self.stacks_unresolved += other.stacks_unresolved;
    }
}

#[derive(Deserialize)]
struct CountersLine {
    gpuprof_shim: ShimCounters,
}

/// What the connections hand the capture loop.
#[allow(clippy::large_enum_variant)] // events are the common case; boxing each would cost more
pub enum ShimMessage {
    Event { connection: u64, event: Event },
    Counters(ShimCounters),
    /// A line that was neither (counted, not fatal).
    Undecodable,
    Closed { connection: u64 },
}

/// Listens on `path` (replacing a stale socket file) and decodes every connection in the background.
pub fn listen(path: &Path) -> Result<Receiver<ShimMessage>> {
    if path.exists() {
        std::fs::remove_file(path).with_context(|| format!("cannot replace {}", path.display()))?;
    }
    let listener = UnixListener::bind(path).with_context(|| format!("cannot listen on {} for the shim", path.display()))?;
    let (messages, received) = mpsc::channel();
    std::thread::Builder::new()
        .name("gpuprof-shim-accept".into())
        .spawn(move || {
            for (connection, stream) in (0u64..).zip(listener.incoming()) {
                let Ok(stream) = stream else { continue };
                let messages = messages.clone();
                let _ = std::thread::Builder::new()
                    .name("gpuprof-shim-read".into())
                    .spawn(move || read_connection(connection, stream, &messages));
            }
        })
        .context("cannot start the shim socket's thread")?;
    Ok(received)
}

fn read_connection(connection: u64, stream: UnixStream, messages: &Sender<ShimMessage>) {
    for line in BufReader::new(stream).lines() {
        let Ok(line) = line else { break };
        if messages.send(decode(connection, &line)).is_err() {
            return;
        }
    }
    let _ = messages.send(ShimMessage::Closed { connection });
}

fn decode(connection: u64, line: &str) -> ShimMessage {
    if line.starts_with("{\"gpuprof_shim\"") {
        return match serde_json::from_str::<CountersLine>(line) {
            Ok(counters) => ShimMessage::Counters(counters.gpuprof_shim),
            Err(_) => ShimMessage::Undecodable,
        };
    }
    match serde_json::from_str::<Event>(line) {
        Ok(event) => ShimMessage::Event { connection, event },
        Err(_) => ShimMessage::Undecodable,
    }
}
