// The fixture of every field, and tests that read as one scenario each, may run past the length limit.
#![allow(clippy::too_many_lines)]

use std::borrow::Cow;
use std::io::Write;

use gpuprof_model::event::{Frame, NativeFrame};
use gpuprof_model::{Event, Kind, Layer, Op, Source, Stack};

use super::*;

fn frame(function: &str, line: u32) -> Frame {
    Frame { function: function.into(), file: "/srv/train.py".into(), line }
}

/// Events with every field the contract has, each set somewhere.
fn events() -> Vec<Event> {
    let deep = Stack::new((0..40).map(|i| frame(&format!("layer_{i}"), 100 + i)).collect());
    let mut out = Vec::new();
    let mut fork = Event::new(
        1_800_000_000_000_000_000,
        4711,
        4711,
        Source::Ebpf,
        Layer::Process,
        Op::Fork,
        Cow::Borrowed("sched_process_fork"),
    );
    fork.ppid = Some(4700);
    fork.comm = "python3".into();
    out.push(fork);
    let mut exec = Event::new(
        1_800_000_000_000_000_100,
        4711,
        4711,
        Source::Ebpf,
        Layer::Process,
        Op::Exec,
        Cow::Borrowed("sched_process_exec"),
    );
    exec.filename = Some("/usr/bin/python3.12".into());
    exec.ns_pid = Some(7);
    exec.comm = "python3".into();
    out.push(exec);
    let mut segment = Event::new(
        1_800_000_000_000_001_000,
        4711,
        4712,
        Source::Ebpf,
        Layer::Driver,
        Op::Alloc,
        Cow::Borrowed("cuMemAlloc_v2"),
    );
    segment.kind = Some(Kind::Device);
    segment.device = Some(0);
    segment.addr = Some(0x7f20_0000_0000);
    segment.size = 20 << 20;
    segment.duration_ns = Some(91_000);
    segment.caller_module = Some("libcudart.so.13".into());
    segment.job = Some("torchrun:llama-7b-3".into());
    segment.rank = Some(3);
    segment.local_rank = Some(1);
    segment.world_size = Some(16);
    segment.allocator_settings = Some("expandable_segments:True".into());
    segment.stack = deep.clone();
    segment.comm = "python3".into();
    out.push(segment);
    for i in 0..3u64 {
        let mut block = Event::new(
            1_800_000_000_000_002_000 + i,
            4711,
            4712,
            Source::Shim,
            Layer::Allocator,
            Op::Alloc,
            Cow::Borrowed("c10::reportMemoryUsageToProfiler"),
        );
        block.kind = Some(Kind::Device);
        block.device = Some(0);
        block.addr = Some(0x7f20_0000_0000 + i * 512);
        block.size = 512;
        block.allocated = Some(512 * (i + 1));
        block.reserved = Some(20 << 20);
        block.segment = Some(0x7f20_0000_0000);
        block.stack = deep.clone();
        block.comm = "python3".into();
        // The third is a backward block with its node's forward stack.
        block.autograd_seq = Some(41 + i);
        block.autograd_thread = Some(1 + i / 2);
        if i == 2 {
            block.autograd_node = Some("AddmmBackward0".into());
            block.stack_origin = Some(gpuprof_model::stack::StackOrigin::ForwardNear);
        }
        out.push(block);
    }
    let mut export = Event::new(
        1_800_000_000_000_003_000,
        4711,
        4711,
        Source::Ebpf,
        Layer::Driver,
        Op::IpcExport,
        Cow::Borrowed("cuMemExportToShareableHandle"),
    );
    export.kind = Some(Kind::Vmm);
    export.addr = Some(0x55);
    export.handle = Some((0..64).collect());
    export.handle_type = Some(Cow::Borrowed("posix_fd"));
    export.handle_object = Some(0xffff_8881_0000_1000);
    export.comm = "python3".into();
    out.push(export);
    let mut open = Event::new(
        1_800_000_000_000_003_500,
        4800,
        4801,
        Source::Ebpf,
        Layer::Driver,
        Op::IpcOpen,
        Cow::Borrowed("cuIpcOpenMemHandle_v2"),
    );
    open.peer_pid = Some(4711);
    open.addr = Some(0x7fa0_0000_0000);
    open.handle = Some(vec![0xab; 64]);
    open.caller_module = Some("libnccl.so.2".into());
    open.native =
        vec![NativeFrame { symbol: "ncclCommInitRank".into(), module: "libnccl.so.2".into(), offset: 0x1234 }];
    open.comm = "worker".into();
    out.push(open);
    let mut map = Event::new(
        1_800_000_000_000_003_600,
        4711,
        4711,
        Source::Ebpf,
        Layer::Driver,
        Op::Map,
        Cow::Borrowed("cuMemMap"),
    );
    map.vmm_handle = Some(0x55);
    map.addr = Some(0x7f40_0000_0000);
    map.size = 2 << 20;
    out.push(map);
    let mut pitched = Event::new(
        1_800_000_000_000_003_700,
        4711,
        4711,
        Source::Ebpf,
        Layer::Driver,
        Op::Alloc,
        Cow::Borrowed("cuMemAllocPitch_v2"),
    );
    pitched.pitch = Some(512);
    pitched.size = 512 * 3;
    pitched.result = 2;
    out.push(pitched);
    let mut info = Event::new(
        1_800_000_000_000_003_800,
        4711,
        4711,
        Source::Ebpf,
        Layer::Driver,
        Op::MemInfo,
        Cow::Borrowed("cuMemGetInfo_v2"),
    );
    info.size = 1 << 30;
    info.total = Some(80 << 30);
    out.push(info);
    let mut unknown = Event::new(
        1_799_999_999_000_000_000,
        4711,
        4711,
        Source::Ebpf,
        Layer::Driver,
        Op::Free,
        Cow::Owned("cuSomethingNew".into()),
    );
    unknown.addr = Some(0x1000);
    out.push(unknown);
    let mut exit = Event::new(
        1_800_000_000_000_004_000,
        4711,
        4711,
        Source::Ebpf,
        Layer::Process,
        Op::Exit,
        Cow::Borrowed("sched_process_exit"),
    );
    exit.exit_code = Some(137);
    exit.signal = Some(9);
    out.push(exit);
    out
}

fn record(events: &[Event], compress: bool) -> Vec<u8> {
    let mut writer = Writer::new(Vec::new(), compress).unwrap();
    for event in events {
        writer.write(event).unwrap();
    }
    writer.finish(3).unwrap()
}

fn read_all(bytes: Vec<u8>) -> (Vec<Event>, Option<Ending>) {
    let mut reader = Reader::new(std::io::Cursor::new(bytes)).unwrap();
    let mut out = Vec::new();
    while let Some(event) = reader.next_event().unwrap() {
        out.push(event);
    }
    (out, reader.ending())
}

#[test]
fn every_field_survives_the_round_trip_compressed_or_not() {
    let events = events();
    for compress in [false, true] {
        let (back, ending) = read_all(record(&events, compress));
        assert_eq!(back, events);
        assert_eq!(ending, Some(Ending::Closed { events: events.len() as u64, lost: 3 }));
        // Stacks come back shared, names as gpuprof's own ('static) strings.
        assert!(back[2].stack.same(&back[3].stack));
        assert!(matches!(back[2].api, Cow::Borrowed("cuMemAlloc_v2")));
        assert!(matches!(back[6].handle_type, Some(Cow::Borrowed("posix_fd"))));
    }
}

#[test]
fn a_string_at_an_address_another_had_is_still_itself() {
    // Names are looked up by address first: text that changed in place is a new string.
    let mut first = events()[2].clone();
    first.api = Cow::Owned("cuMemAlloc_v2".to_string());
    let mut second = first.clone();
    second.api = Cow::Owned(String::new());
    let mut writer = Writer::new(Vec::new(), false).unwrap();
    writer.write(&first).unwrap();
    first.api.to_mut().make_ascii_uppercase();
    writer.write(&first).unwrap();
    writer.write(&second).unwrap();
    let (back, _) = read_all(writer.finish(0).unwrap());
    let apis: Vec<&str> = back.iter().map(|e| e.api.as_ref()).collect();
    assert_eq!(apis, ["cuMemAlloc_v2", "CUMEMALLOC_V2", ""]);
}

#[test]
fn a_plain_recording_compressed_afterwards_reads_as_one_compressed_as_it_was_written() {
    let events = events();
    let plain = record(&events, false);
    let compressed = crate::compress(&plain).unwrap();
    assert_eq!(&compressed[..crate::HEADER_LEN], &record(&events, true)[..crate::HEADER_LEN]);
    assert!(compressed.len() < plain.len(), "{} of {} bytes", compressed.len(), plain.len());
    let (back, ending) = read_all(compressed.clone());
    assert_eq!(back, events);
    assert_eq!(ending, Some(Ending::Closed { events: events.len() as u64, lost: 3 }));
    // Only a plain recording is taken.
    let error = crate::compress(&compressed).unwrap_err();
    assert_eq!(
        (error.kind(), error.to_string()),
        (std::io::ErrorKind::InvalidInput, "not a plain recording".to_string())
    );
    assert!(crate::compress(b"GPUPROF").is_err());
}

#[test]
fn a_recording_cut_anywhere_gives_its_whole_events_and_says_it_was_cut() {
    let events = events();
    let bytes = record(&events, false);
    let whole_entries_end = bytes.len();
    for cut in HEADER_LEN..whole_entries_end {
        let (back, ending) = read_all(bytes[..cut].to_vec());
        assert!(back[..] == events[..back.len()], "cut at {cut}");
        assert_eq!(ending, Some(Ending::Truncated { events: back.len() as u64 }), "cut at {cut}");
    }
    // Compressed and cut: what was flushed is read.
    let mut writer = Writer::new(Vec::new(), true).unwrap();
    for event in &events[..5] {
        writer.write(event).unwrap();
    }
    writer.flush_now().unwrap();
    let flushed_len = writer_len(&writer);
    let whole = writer.finish(0).unwrap();
    assert!(whole.len() > flushed_len);
    for cut in flushed_len..whole.len() {
        let (back, ending) = read_all(whole[..cut].to_vec());
        assert!(back == events[..5], "cut at {cut}: {} events", back.len());
        assert_eq!(ending, Some(Ending::Truncated { events: 5 }));
    }
}

fn writer_len(writer: &Writer<Vec<u8>>) -> usize {
    writer.output().len()
}

#[test]
fn a_corrupt_recording_is_an_error_naming_the_byte() {
    let mut bytes = record(&events(), false);
    // The first entry is the string "python3"'s: make its length claim 64 MiB + 1.
    assert_eq!(bytes[HEADER_LEN], 1);
    bytes.splice(HEADER_LEN + 1..HEADER_LEN + 2, [0x81, 0x80, 0x80, 0x20]);
    let mut reader = Reader::new(std::io::Cursor::new(bytes)).unwrap();
    let error = reader.next_event().unwrap_err().to_string();
    assert_eq!(error, "corrupt at byte 0 of the recording's entries: an entry of 67108865 bytes");
    assert_eq!(
        Reader::new(std::io::Cursor::new(b"{\"ts\":1}".to_vec())).err().unwrap().to_string(),
        "not a gpuprof recording (it does not start with GPUPROF)"
    );
    let mut newer = record(&[], false);
    newer[8] = 9;
    assert_eq!(
        Reader::new(std::io::Cursor::new(newer)).err().unwrap().to_string(),
        "recording version 9 is newer than this gpuprof reads (1): use a newer gpuprof"
    );
}

#[test]
fn a_field_a_reader_does_not_know_is_skipped() {
    // What an older reader meets in a newer recording: a field bit it has no name for, its
    // bytes after every field it knows.
    let event = &events()[2];
    let bytes = record(std::slice::from_ref(event), false);
    let (mut rewritten, mut at) = (bytes[..HEADER_LEN].to_vec(), HEADER_LEN);
    while at < bytes.len() {
        let entry_tag = bytes[at];
        at += 1;
        let len = crate::varint::get(&bytes, &mut at).unwrap() as usize;
        let mut payload = bytes[at..at + len].to_vec();
        at += len;
        if entry_tag == crate::format::tag::EVENT {
            let mut fields_end = 0;
            let fields = crate::varint::get(&payload, &mut fields_end).unwrap();
            let mut newer = Vec::new();
            crate::varint::put(&mut newer, fields | 1 << 31);
            newer.extend_from_slice(&payload[fields_end..]);
            newer.extend_from_slice(&[0x96, 0x01]);
            payload = newer;
        }
        rewritten.push(entry_tag);
        crate::varint::put(&mut rewritten, payload.len() as u64);
        rewritten.extend_from_slice(&payload);
    }
    assert_ne!(rewritten, bytes);
    let (back, ending) = read_all(rewritten);
    assert_eq!(back, std::slice::from_ref(event));
    assert_eq!(ending, Some(Ending::Closed { events: 1, lost: 3 }));
}

#[test]
fn event_files_of_either_format_read_the_same() {
    let dir = std::env::temp_dir().join(format!("gpuprof-recording-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let events = events();
    let recording = dir.join("a.gpuprof");
    std::fs::write(&recording, record(&events, true)).unwrap();
    let jsonl = dir.join("a.jsonl");
    let mut text = String::new();
    for event in &events {
        text.push_str(&serde_json::to_string(event).unwrap());
        text.push('\n');
    }
    std::fs::write(&jsonl, &text).unwrap();
    for (path, format) in [(&recording, FileFormat::Recording), (&jsonl, FileFormat::Jsonl)] {
        let file = EventFile::open(path).unwrap();
        assert_eq!(file.format(), format);
        let mut back = Vec::new();
        let ending = file
            .for_each(|event| {
                back.push(event);
                Ok::<(), FileError>(())
            })
            .unwrap();
        assert_eq!(back, events);
        assert!(back[2].stack.same(&back[3].stack), "{format:?}: stacks shared");
        assert!(matches!(ending, Ending::Closed { events: 13, .. }), "{ending:?}");
        // Read to its end, every byte of it was taken, and no more.
        let mut file = EventFile::open(path).unwrap();
        let size = std::fs::metadata(path).unwrap().len();
        assert_eq!((file.size(), file.bytes_read() <= size), (size, true), "{format:?}");
        while file.next_event().unwrap().is_some() {}
        assert_eq!(file.bytes_read(), size, "{format:?}");
    }
    // jsonl cut inside its last line: truncated after the whole lines; a bad line elsewhere is an error.
    std::fs::write(&jsonl, &text[..text.len() - 20]).unwrap();
    let mut file = EventFile::open(&jsonl).unwrap();
    let mut count = 0;
    while file.next_event().unwrap().is_some() {
        count += 1;
    }
    assert_eq!((count, file.ending()), (12, Some(Ending::Truncated { events: 12 })));
    let mut broken = text.clone();
    broken.insert_str(0, "{\"ts\": \"soon\"}\n");
    std::fs::write(&jsonl, broken).unwrap();
    let error = EventFile::open(&jsonl).unwrap().next_event().unwrap_err().to_string();
    assert!(error.starts_with(&format!("{}:1: not a gpuprof event (", jsonl.display())), "{error}");
    let missing = EventFile::open(&dir.join("missing.gpuprof")).err().unwrap().to_string();
    assert!(missing.starts_with(&format!("cannot read {}: ", dir.join("missing.gpuprof").display())), "{missing}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_training_loop_costs_a_few_bytes_an_event() {
    // 200 distinct 40-frame stacks; blocks allocated and freed in steps, as PyTorch's allocator reports them.
    let stacks: Vec<Stack> =
        (0..200).map(|s| Stack::new((0..40).map(|i| frame(&format!("module_{s}_{i}"), 10 + i)).collect())).collect();
    let mut events = Vec::new();
    let mut ts = 1_800_000_000_000_000_000u64;
    let (mut allocated, reserved) = (0u64, 2u64 << 30);
    for step in 0..100u64 {
        let mut live = Vec::new();
        for (i, stack) in stacks.iter().enumerate() {
            ts += 15_000 + (i as u64 * 37) % 5_000;
            let size = 512 * (1 + (i as u64 % 64));
            allocated += size;
            let addr = 0x7f20_0000_0000 + (i as u64) * 0x10_0000;
            let mut e = Event::new(
                ts,
                4711,
                if i % 3 == 0 { 4790 } else { 4711 },
                Source::Ebpf,
                Layer::Allocator,
                Op::Alloc,
                Cow::Borrowed("c10::reportMemoryUsageToProfiler"),
            );
            e.comm = "python3".into();
            (e.kind, e.device, e.addr, e.size) = (Some(Kind::Device), Some(0), Some(addr), size);
            (e.allocated, e.reserved, e.segment) = (Some(allocated), Some(reserved), Some(addr & !0xf_ffff));
            e.stack = stack.clone();
            live.push((addr, size, stack.clone()));
            events.push(e);
        }
        for (addr, size, stack) in live {
            ts += 9_000 + step;
            allocated -= size;
            let mut e = Event::new(
                ts,
                4711,
                4711,
                Source::Ebpf,
                Layer::Allocator,
                Op::Free,
                Cow::Borrowed("c10::reportMemoryUsageToProfiler"),
            );
            e.comm = "python3".into();
            (e.kind, e.device, e.addr, e.size) = (Some(Kind::Device), Some(0), Some(addr), size);
            (e.allocated, e.reserved, e.segment) = (Some(allocated), Some(reserved), Some(addr & !0xf_ffff));
            e.stack = stack;
            events.push(e);
        }
    }
    let plain = record(&events, false);
    let compressed = record(&events, true);
    let per_event = |bytes: &[u8]| bytes.len() as f64 / events.len() as f64;
    assert!(per_event(&plain) <= 40.0, "{} bytes an event uncompressed", per_event(&plain));
    assert!(per_event(&compressed) <= 12.0, "{} bytes an event compressed", per_event(&compressed));
    let (back, _) = read_all(compressed.clone());
    assert!(back == events);
    let mut jsonl = Vec::new();
    for event in &events {
        serde_json::to_writer(&mut jsonl, event).unwrap();
        jsonl.write_all(b"\n").unwrap();
    }
    assert!(jsonl.len() > 50 * plain.len(), "jsonl {} vs recording {}", jsonl.len(), plain.len());
    eprintln!(
        "bytes an event: recording {:.1}, compressed {:.1}, jsonl {:.1}",
        per_event(&plain),
        per_event(&compressed),
        per_event(&jsonl)
    );
}

#[test]
fn an_export_given_for_events_is_named() {
    assert_eq!(export_kind(b"<!DOCTYPE html>\n<html>"), Some("an HTML page (open it in a browser)"));
    assert_eq!(export_kind(b"<?xml version=\"1.0\"?><svg"), Some("an SVG image (a flame graph: open it in a browser)"));
    assert_eq!(
        export_kind(b"{\"$schema\": \"https://www.speedscope.app/file-format-schema.json\""),
        Some("a speedscope profile (open it at https://www.speedscope.app)")
    );
    assert_eq!(
        export_kind(&[0x80, 0x04, 0x95]),
        Some("a Python pickle (a memory_viz snapshot: open it at https://pytorch.org/memory_viz)")
    );
    // Events are not exports, whatever their paths say.
    assert_eq!(export_kind(b"{\"ts\":1,\"pid\":2}"), None);
    assert_eq!(export_kind(b"{\"ts\":1,\"pid\":2,\"stack\":[{\"file\":\"/srv/speedscope/train.py\"}]}"), None);
    assert_eq!(export_kind(MAGIC), None);
}
