//! The jsonl event contract (docs/events.md), as every reader of event files takes it:
//! `EventFile::open` over a file, one event per line.
//!
//! Checked: every failure is an error value naming the line (never a panic), reading stops (no
//! more events than lines), a file read to its end stays there, and the events written again as
//! jsonl (as `--format jsonl` writes them) read back the same.

#![no_main]

use gpuprof_fuzz::{read_to_end, scratch_file};
use gpuprof_recording::EventFile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.starts_with(b"GPUPROF") {
        return; // a recording: the `recording` target's
    }
    let lines = data.iter().filter(|&&b| b == b'\n').count() + 1;
    let Ok(mut file) = EventFile::open(&scratch_file(data)) else { return };
    let (events, _) = read_to_end(&mut file, lines);

    let mut written = Vec::new();
    for event in &events {
        serde_json::to_writer(&mut written, event).expect("an event is written as JSON");
        written.push(b'\n');
    }
    let mut file = EventFile::open(&scratch_file(&written)).expect("jsonl gpuprof wrote opens");
    let (again, error) = read_to_end(&mut file, events.len());
    assert!(error.is_none(), "jsonl gpuprof wrote reads without error: {error:?}");
    assert_eq!(again, events, "events written again as jsonl read back otherwise");
});
