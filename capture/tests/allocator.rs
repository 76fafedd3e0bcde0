//! Tensor-level events from outside: PyTorch's c10::reportMemoryUsageToProfiler, probed in a
//! libc10 stand-in (same mangled name, same ABI: c10::Device in one register), driven by a toy
//! caching allocator in Python over the libcuda stand-in. Every block, its totals, its segment
//! and its stack are compared with what the workload did.

use std::process::Command;

use gpuprof_model::event::{Layer, Op};
use gpuprof_testkit::*;

#[test]
fn blocks_totals_segments_and_stacks() {
    let dir = scratch("allocator");
    let (log, out) = (dir.join("expected.jsonl"), dir.join("events.jsonl"));
    let script = workloads().join("tensors.py");
    let output = gpuprof_run(
        &["--stats", "--output", out.to_str().unwrap(), "--format", "jsonl"],
        &[python3(), script.to_str().unwrap()],
        &log,
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("probing c10::reportMemoryUsageToProfiler of "), "{stderr}");
    // The one CPU report is counted, not recorded.
    assert!(counters_line(&stderr).contains("allocator reports of other devices 1"), "{stderr}");

    let expected = expected_calls(&read_expected(&log));
    let events = read_events(&out);
    let captured = memory_events(&events);
    assert_same_calls(&expected, &captured);

    let blocks: Vec<_> = captured.iter().filter(|e| e.layer == Layer::Allocator).collect();
    assert_eq!(blocks.len(), 2 + 4 * 4 + 4 * 3 + 2 + 4);
    assert_eq!(blocks.iter().filter(|e| e.op == Op::Alloc).count(), blocks.iter().filter(|e| e.op == Op::Free).count());
    // The last free leaves nothing allocated; segments are returned afterwards by empty_cache.
    assert_eq!(blocks.last().unwrap().allocated, Some(0));
    // Every block lies in a segment the process allocated from the driver.
    let segments: Vec<u64> = captured.iter().filter(|e| e.api == "cuMemAlloc_v2").map(|e| e.addr.unwrap()).collect();
    assert!(blocks.iter().all(|b| segments.contains(&b.segment.unwrap())));
}

/// The backward pass runs on autograd's own thread, with no Python frames: each of its blocks
/// carries the node being evaluated and the Python stack of the forward line that made the node.
#[test]
fn backward_blocks_carry_their_node_and_its_forward_line() {
    let dir = scratch("allocator_autograd");
    let (log, out) = (dir.join("expected.jsonl"), dir.join("events.jsonl"));
    let script = workloads().join("autograd.py");
    let mut cmd = Command::new(gpuprof());
    cmd.args(["run", "--format", "jsonl", "--output", out.to_str().unwrap(), "--"]).arg(python3()).arg(&script);
    workload_env(&mut cmd, &log);
    cmd.env("GPUPROF_LIBTORCH_CPU", libtorch_cpu_standin());
    let output = cmd.output_within(PATIENCE);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));

    let events = read_events(&out);
    assert_backward_attribution(&read_expected(&log), &events);
    // The kernel names the thread that made each call.
    let backward: Vec<&str> = events.iter().filter(|e| e.autograd_node.is_some()).map(|e| &*e.comm).collect();
    assert_eq!(backward, ["pt_autograd_0"; 24]);
}

#[test]
fn table_shows_the_allocator_curves_at_the_end() {
    let dir = scratch("allocator_table");
    let (log, out) = (dir.join("expected.jsonl"), dir.join("table.txt"));
    let script = workloads().join("tensors.py");
    // Every block is freed at the end, then empty_cache returns the segments: the allocator never
    // reports that, gpuprof takes it from the driver frees.
    let mut cmd = Command::new(gpuprof());
    cmd.args(["run", "--format", "table", "--output", out.to_str().unwrap(), "--"])
        .arg(python3())
        .arg(&script)
        .args(["--hold", "0.6"]);
    workload_env(&mut cmd, &log);
    let output = cmd.output_within(PATIENCE);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let table = std::fs::read_to_string(&out).unwrap();
    let expected = read_expected(&log);
    let pid = pid_of_role(&expected, "parent");
    let last = expected.iter().rev().find(|e| e["layer"] == "allocator").unwrap();
    assert!(last["reserved"].as_u64().unwrap() > 0);
    let at = table.lines().position(|l| l == "PyTorch caching allocator at end:").expect("allocator section");
    let row: Vec<&str> = table.lines().nth(at + 2).unwrap().split_whitespace().collect();
    assert_eq!(row, [pid.to_string().as_str(), "0", "B", "0", "B", "0", "B", "0"]);
}

#[test]
fn emptying_the_cache_lowers_reserved_on_the_driver_free() {
    let dir = scratch("allocator_empty_cache");
    let (log, out) = (dir.join("expected.jsonl"), dir.join("events.jsonl"));
    let script = workloads().join("tensors.py");
    let output = gpuprof_run(&["--output", out.to_str().unwrap()], &[python3(), script.to_str().unwrap()], &log);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let events = read_events(&out);
    let last_block = events.iter().rposition(|e| e.layer == Layer::Allocator).unwrap();
    let reported = events[last_block].reserved.unwrap();
    // empty_cache returns every segment to the driver after the last block report: each
    // cuMemFree_v2 carries the allocator's reserved total, lowered by that segment's size.
    let frees: Vec<&gpuprof_model::Event> = events[last_block..].iter().filter(|e| e.api == "cuMemFree_v2").collect();
    assert_eq!(frees.len(), 3);
    let mut reserved = reported;
    for free in &frees {
        reserved -= events.iter().find(|e| e.api == "cuMemAlloc_v2" && e.addr == free.addr).unwrap().size;
        assert_eq!((free.reserved, free.allocated), (Some(reserved), Some(0)));
    }
    assert_eq!(reserved, 0);
}
