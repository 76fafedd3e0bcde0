//! A binary recording (`.gpuprof`), as `report`, `export` and the fleet replay read one: through
//! `Reader::new` over the bytes, and `EventFile::open` over a file (which tells a recording from
//! jsonl and from other tools' exports by its first bytes).
//!
//! Checked: every failure is an error value (never a panic), reading stops (an uncompressed
//! recording holds at most one event per two bytes), a recording read to its end stays there, the
//! two ways in read the same events, and the events written again (`Writer`) read back the same.

#![no_main]

use gpuprof_fuzz::{read_to_end, scratch_file};
use gpuprof_model::Event;
use gpuprof_recording::{EventFile, ReadError, Reader, Writer};
use libfuzzer_sys::fuzz_target;

/// A zstd-compressed recording decompresses to many times its size: a bound on its events that
/// no real input of a fuzz run's size reaches.
const MOST_COMPRESSED_EVENTS: usize = 1 << 22;

fuzz_target!(|data: &[u8]| {
    let compressed = data.len() >= 12 && data[10] & 1 != 0;
    let most = if compressed { MOST_COMPRESSED_EVENTS } else { data.len() / 2 };
    let direct = read_directly(data, most);

    let path = scratch_file(data);
    if let Ok(mut file) = EventFile::open(&path) {
        let (events, error) = read_to_end(&mut file, most.max(data.len()));
        // A recording opened as a file reads as it does from the bytes; jsonl is `jsonl`'s.
        if let Ok((direct_events, direct_error)) = &direct {
            if data.starts_with(b"GPUPROF") {
                assert_eq!(&events, direct_events, "EventFile and Reader read different events");
                assert_eq!(error.is_some(), direct_error.is_some(), "EventFile and Reader end differently");
            }
        }
    }

    if let Ok((events, _)) = direct {
        let mut writer = Writer::new(Vec::new(), false).expect("a recording in memory");
        for event in &events {
            writer.write(event).expect("a recording in memory");
        }
        let written = writer.finish(0).expect("a recording in memory");
        let (again, error) = read_directly(&written, written.len()).expect("a recording gpuprof wrote opens");
        assert!(error.is_none(), "a recording gpuprof wrote reads without error: {error:?}");
        assert_eq!(again, events, "events written again read back otherwise");
    }
});

/// The events of a recording read from its bytes, and the error that stopped them; Err when it
/// does not open.
fn read_directly(data: &[u8], most: usize) -> Result<(Vec<Event>, Option<ReadError>), ReadError> {
    let mut reader = Reader::new(std::io::Cursor::new(data.to_vec()))?;
    let mut events = Vec::new();
    loop {
        match reader.next_event() {
            Ok(Some(event)) => {
                events.push(event);
                assert!(events.len() <= most, "reading did not stop after {most} events");
            }
            Ok(None) => {
                assert!(matches!(reader.next_event(), Ok(None)), "a recording read to its end stays at its end");
                return Ok((events, None));
            }
            Err(error) => {
                assert!(!error.to_string().is_empty(), "an error says what is wrong");
                return Ok((events, Some(error)));
            }
        }
    }
}
