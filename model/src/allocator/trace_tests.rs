//! From event streams, as a capture writes them, to traces: what each driver call around the
//! allocator's reports is taken for, and what the check says of them.

use std::borrow::Cow;

use super::*;
use crate::event::{Event, Kind, Layer, Op, Source};

const PID: u32 = 4242;
const SEGMENT: u64 = 0x7f00_0000_0000;

/// Events of one process, numbered by their timestamps.
#[derive(Default)]
struct Stream(Vec<Event>);

impl Stream {
    fn event(&mut self, layer: Layer, op: Op, api: &'static str) -> &mut Event {
        let ts = self.0.len() as u64 + 1;
        let mut event = Event::new(ts, PID, PID, Source::Ebpf, layer, op, Cow::Borrowed(api));
        event.device = Some(0);
        self.0.push(event);
        self.0.last_mut().unwrap()
    }

    fn segment(&mut self, addr: u64, size: u64) -> &mut Self {
        let e = self.event(Layer::Driver, Op::Alloc, "cuMemAlloc_v2");
        (e.kind, e.addr, e.size) = (Some(Kind::Device), Some(addr), size);
        self
    }

    fn failed_segment(&mut self, size: u64) -> &mut Self {
        let e = self.event(Layer::Driver, Op::Alloc, "cuMemAlloc_v2");
        (e.kind, e.addr, e.size, e.result) = (Some(Kind::Device), Some(0), size, 2);
        self
    }

    fn segment_freed(&mut self, addr: u64) -> &mut Self {
        let e = self.event(Layer::Driver, Op::Free, "cuMemFree_v2");
        (e.kind, e.addr) = (Some(Kind::Device), Some(addr));
        self
    }

    fn mem_info(&mut self, free: u64) -> &mut Self {
        let e = self.event(Layer::Driver, Op::MemInfo, "cuMemGetInfo_v2");
        (e.size, e.total) = (free, Some(80 << 30));
        self
    }

    /// An allocator report: a block at `addr` of `size` (negative: freed) in `segment`.
    fn block(&mut self, op: Op, addr: u64, size: u64, segment: u64, allocated: u64, reserved: u64) -> &mut Self {
        let e = self.event(Layer::Allocator, op, "c10::reportMemoryUsageToProfiler");
        (e.kind, e.addr, e.size, e.segment) = (Some(Kind::Device), Some(addr), size, Some(segment));
        (e.allocated, e.reserved) = (Some(allocated), Some(reserved));
        self
    }

    fn trace(&self) -> AllocatorTrace {
        let mut all = traces(&self.0);
        assert_eq!(all.len(), 1);
        all.remove(0)
    }
}

#[test]
fn blocks_become_requests_and_segment_frees_without_a_failure_an_empty_cache() {
    let mut s = Stream::default();
    s.segment(SEGMENT, 20 * MIB)
        .block(Op::Alloc, SEGMENT, 4 * MIB, SEGMENT, 4 * MIB, 20 * MIB)
        .block(Op::Alloc, SEGMENT + 4 * MIB, 4 * MIB, SEGMENT, 8 * MIB, 20 * MIB)
        .block(Op::Free, SEGMENT, 4 * MIB, SEGMENT, 4 * MIB, 20 * MIB)
        .block(Op::Free, SEGMENT + 4 * MIB, 4 * MIB, SEGMENT, 0, 20 * MIB)
        .segment_freed(SEGMENT)
        .segment(SEGMENT, 2 * MIB)
        .block(Op::Alloc, SEGMENT, 512, SEGMENT, 512, 2 * MIB);
    let trace = s.trace();
    assert_eq!(
        trace.requests,
        vec![
            Request::Alloc { id: 0, size: 4 * MIB },
            Request::Alloc { id: 1, size: 4 * MIB },
            Request::Free { id: 0 },
            Request::Free { id: 1 },
            Request::EmptyCache,
            Request::Alloc { id: 2, size: 512 },
        ]
    );
    assert_eq!(trace.origins.iter().map(|o| o.event).collect::<Vec<_>>(), vec![1, 2, 3, 4, 5, 7]);
    assert_eq!(trace.segment_addresses, vec![(SEGMENT, 20 * MIB), (SEGMENT, 2 * MIB)]);
    assert_eq!(
        (trace.segments_allocated, trace.expandable, trace.budget, trace.incomplete.as_deref()),
        (2, false, None, None)
    );
    let run = RecordedRun::new(&trace, None);
    assert_eq!(run.ran_with, "");
    assert_eq!(run.check(), Ok(()));
}

#[test]
fn a_failed_segment_then_the_error_message_is_an_out_of_memory_request_and_the_budget() {
    let mut s = Stream::default();
    s.segment(SEGMENT, 60 * MIB)
        .block(Op::Alloc, SEGMENT, 60 * MIB, SEGMENT, 60 * MIB, 60 * MIB)
        // torch.empty(100 MiB) with 30 MiB free on the device: two tries, then the message.
        .failed_segment(100 * MIB)
        .failed_segment(100 * MIB)
        .mem_info(30 * MIB);
    let trace = s.trace();
    assert_eq!(trace.requests[1], Request::Alloc { id: 1, size: 100 * MIB });
    assert_eq!(trace.recorded[1], Recorded { allocated: None, reserved: None, out_of_memory: true });
    assert_eq!(trace.origins[1].event, 2, "the first failed device allocation");
    assert_eq!(trace.budget, Some(90 * MIB));
    assert_eq!(trace.device_memory, Some(80 << 30));
    let run = RecordedRun::new(&trace, None);
    assert_eq!(run.check(), Ok(()));
    let oom = &run.as_it_ran().unwrap().replay.out_of_memory;
    assert_eq!(oom.len(), 1);
    assert_eq!((oom[0].0, oom[0].1.request, oom[0].1.reserved), (1, 100 * MIB, 60 * MIB));
    // On a device of 1 GiB more, measured from this failure, it fits.
    let bigger = Budget::for_device(&trace, Some((80 << 30) + (1 << 30)));
    assert_eq!(bigger.bytes(), Some(90 * MIB + (1 << 30)));
    assert!(run.predict(&[], bigger).unwrap().replay.out_of_memory.is_empty());
}

#[test]
fn a_small_failed_request_is_taken_as_the_largest_its_segment_serves() {
    let mut s = Stream::default();
    s.segment(SEGMENT, 20 * MIB)
        .block(Op::Alloc, SEGMENT, 20 * MIB, SEGMENT, 20 * MIB, 20 * MIB)
        .failed_segment(20 * MIB)
        .mem_info(0);
    assert_eq!(s.trace().requests[1], Request::Alloc { id: 1, size: 10 * MIB - 512 });
}

#[test]
fn frees_after_a_failure_are_the_allocators_own_retry_not_an_empty_cache() {
    let mut s = Stream::default();
    s.segment(SEGMENT, 40 * MIB)
        .block(Op::Alloc, SEGMENT, 40 * MIB, SEGMENT, 40 * MIB, 40 * MIB)
        .block(Op::Free, SEGMENT, 40 * MIB, SEGMENT, 0, 40 * MIB)
        .failed_segment(60 * MIB)
        .segment_freed(SEGMENT)
        .segment(SEGMENT + (1 << 30), 60 * MIB)
        .block(Op::Alloc, SEGMENT + (1 << 30), 60 * MIB, SEGMENT + (1 << 30), 60 * MIB, 60 * MIB);
    let trace = s.trace();
    assert!(!trace.requests.contains(&Request::EmptyCache), "{:?}", trace.requests);
    // The device refused 100 MiB and then gave 60: the budget is at least what it was seen to give.
    assert_eq!(trace.budget, Some(60 * MIB));
    assert_eq!(RecordedRun::new(&trace, None).check(), Ok(()));
}

#[test]
fn a_recording_that_begins_mid_job_is_refused_with_why() {
    let mut s = Stream::default();
    s.block(Op::Free, SEGMENT, 4 * MIB, SEGMENT, 0, 20 * MIB).block(
        Op::Alloc,
        SEGMENT,
        4 * MIB,
        SEGMENT,
        8 * MIB,
        20 * MIB,
    );
    let trace = s.trace();
    let why = "it frees a block at 0x7f0000000000 it never saw allocated: the recording began after the job's first allocation";
    assert_eq!(trace.incomplete.as_deref(), Some(why));
    assert_eq!(RecordedRun::new(&trace, None).check(), Err(WhatifError::Incomplete(why.to_string())));
}

#[test]
fn a_replay_that_parts_from_the_recording_says_where() {
    let mut s = Stream::default();
    // The allocator says 40 MiB reserved where a default allocator makes a 20 MiB segment: the
    // job ran with other settings than the ones given.
    s.segment(SEGMENT, 40 * MIB).block(Op::Alloc, SEGMENT, 4 * MIB, SEGMENT, 4 * MIB, 40 * MIB);
    let trace = s.trace();
    assert_eq!(
        RecordedRun::new(&trace, None).check(),
        Err(WhatifError::Diverged(Divergence::Counters {
            step: 0,
            expected_allocated: Some(4 * MIB),
            expected_reserved: Some(40 * MIB),
            allocated: 4 * MIB,
            reserved: 20 * MIB,
        }))
    );
}

#[test]
fn expandable_segments_show_as_mapped_pages() {
    let mut s = Stream::default();
    let e = s.event(Layer::Driver, Op::Reserve, "cuMemAddressReserve");
    (e.kind, e.addr, e.size) = (Some(Kind::Vmm), Some(SEGMENT), 90 << 30);
    let e = s.event(Layer::Driver, Op::Alloc, "cuMemCreate");
    (e.kind, e.addr, e.size, e.result) = (Some(Kind::Vmm), Some(0), 20 * MIB, 800);
    // 30 MiB asked: two 20 MiB pages mapped.
    for page in 0..2 {
        let e = s.event(Layer::Driver, Op::Alloc, "cuMemCreate");
        (e.kind, e.addr, e.size) = (Some(Kind::Vmm), Some(0x5000 + page), 20 * MIB);
        let e = s.event(Layer::Driver, Op::Map, "cuMemMap");
        (e.kind, e.addr, e.size, e.vmm_handle) =
            (Some(Kind::Vmm), Some(SEGMENT + page * 20 * MIB), 20 * MIB, Some(0x5000 + page));
    }
    s.block(Op::Alloc, SEGMENT, 30 * MIB, SEGMENT, 30 * MIB, 40 * MIB);
    let trace = s.trace();
    assert_eq!((trace.expandable, trace.segments_allocated, trace.budget), (true, 2, None));
    let run = RecordedRun::new(&trace, None);
    assert_eq!(run.ran_with, "expandable_segments:True");
    assert_eq!(run.check(), Ok(()));
    // Taken for the defaults (a 30 MiB segment), the same job parts from its recording at once.
    assert!(matches!(RecordedRun::new(&trace, Some("")).check(), Err(WhatifError::Diverged(_))));

    // Started with a split limit in its environment, expandable segments set from inside the
    // program: both.
    s.0[0].allocator_settings = Some("max_split_size_mb:64".into());
    let trace = s.trace();
    let run = RecordedRun::new(&trace, None);
    assert_eq!(
        (run.ran_with.as_str(), run.ran_with_source),
        ("max_split_size_mb:64,expandable_segments:True", SettingsSource::EnvironmentAndDriver)
    );
    assert_eq!(run.check(), Ok(()));
}

#[test]
fn a_request_that_ran_out_is_never_freed_in_the_replay() {
    let requests = [
        Request::Alloc { id: 0, size: 30 * MIB },
        Request::Alloc { id: 1, size: 30 * MIB },
        Request::Free { id: 1 },
        Request::Free { id: 0 },
    ];
    let replay = replay(&AllocatorConfig::default(), Some(40 * MIB), &requests).unwrap();
    assert_eq!(replay.out_of_memory.iter().map(|(step, _)| *step).collect::<Vec<_>>(), vec![1]);
    assert_eq!(replay.allocated, vec![30 * MIB, 30 * MIB, 30 * MIB, 0]);
}
