//! What gpuprof's fuzz targets share: an input laid down as the event file a user would give, and
//! an event file read to its end with the properties every reader must keep. Each target is one
//! parser (`fuzz_targets/`); `seeds` writes the starting corpora from real data.

use std::path::PathBuf;

use gpuprof_model::Event;
use gpuprof_recording::{EventFile, FileError};

/// The input as a file of this process's own (the readers of event files take a path).
pub fn scratch_file(bytes: &[u8]) -> PathBuf {
    let dir = if std::path::Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
    let path = dir.join(format!("gpuprof-fuzz-{}.events", std::process::id()));
    std::fs::write(&path, bytes).expect("the fuzz input can be written to a scratch file");
    path
}

/// An event file read to its end (or its first error): the events, and the error if one came.
/// Panics when reading does not stop within `most` events, or an error says nothing.
pub fn read_to_end(file: &mut EventFile, most: usize) -> (Vec<Event>, Option<FileError>) {
    let mut events = Vec::new();
    loop {
        match file.next_event() {
            Ok(Some(event)) => {
                events.push(event);
                assert!(events.len() <= most, "reading did not stop after {most} events");
            }
            Ok(None) => {
                assert!(file.ending().is_some(), "the end of an event file says how it ended");
                assert!(matches!(file.next_event(), Ok(None)), "an event file read to its end stays at its end");
                return (events, None);
            }
            Err(error) => {
                assert!(!error.to_string().is_empty(), "an error says what is wrong");
                return (events, Some(error));
            }
        }
    }
}

/// A collector as `gpuprof-collector` starts one with its defaults, its store in memory: what an
/// OTLP request is handed to once decoded.
pub fn collector() -> gpuprof_collector::collector::Collector {
    use gpuprof_collector::{collector::Collector, config::Config, reports::Reports, state::State, store::Store};
    let config = Config {
        grpc_listen: "127.0.0.1:4317".parse().expect("an address"),
        http_listen: "127.0.0.1:4318".parse().expect("an address"),
        db: PathBuf::from("(in memory)"),
        token: None,
        read_token: None,
        max_request_bytes: MAX_REQUEST_BYTES,
        rate_limit: 1000.0,
        forward_endpoint: None,
        retention: std::time::Duration::from_secs(168 * 3600),
        max_findings: 100_000,
        max_report_bytes: 1 << 30,
        checkpoint_every: std::time::Duration::from_secs(5),
    };
    let store = Store::in_memory().expect("a store in memory");
    Collector::new(config, State::new(Vec::new(), Vec::new()), Reports::default(), store, None)
}

/// The request limit of the fuzzed collector: small, so that a gzip body past it is met.
pub const MAX_REQUEST_BYTES: usize = 1 << 20;

/// The three OTLP requests the collector takes, as the first byte of an input picks one.
#[derive(Debug, Clone, Copy)]
pub enum Signal {
    Logs,
    Traces,
    Metrics,
}

impl Signal {
    pub fn of(byte: u8) -> Signal {
        match byte % 3 {
            0 => Signal::Logs,
            1 => Signal::Traces,
            _ => Signal::Metrics,
        }
    }
}
