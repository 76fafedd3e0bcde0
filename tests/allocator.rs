//! Tensor-level events from outside: PyTorch's c10::reportMemoryUsageToProfiler, probed in a
//! libc10 stand-in (same mangled name, same ABI: c10::Device in one register), driven by a toy
//! caching allocator in Python over the libcuda stand-in. Every block, its totals, its segment
//! and its stack are compared with what the workload did.

mod support;

use std::process::Command;

use gpuprof_model::event::{Event, Layer, Op};
use serde_json::{json, Value};
use support::*;

#[test]
fn blocks_totals_segments_and_stacks() {
    let dir = scratch("allocator");
    let (log, out) = (dir.join("expected.jsonl"), dir.join("events.jsonl"));
    let script = workloads().join("tensors.py");
    let output = gpuprof_run(
        &["--output", out.to_str().unwrap(), "--format", "jsonl"],
        &[python3(), script.to_str().unwrap()],
        &log,
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("probing c10::reportMemoryUsageToProfiler of "), "{stderr}");
    // The one CPU report is counted, not recorded.
    assert!(stderr.contains("allocator reports of other devices 1"), "{stderr}");

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
    let output = cmd.output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));

    let expected = read_expected(&log);
    assert_eq!(expected.len(), 2 * 2 * 3, "two steps of two blocks of three nodes");
    let events = read_events(&out);
    let backward: Vec<&Event> = events.iter().filter(|e| e.autograd_node.is_some()).collect();
    // Each node's gradient, allocated and freed.
    assert_eq!(backward.len(), 2 * expected.len());
    let forward_thread = events.iter().find(|e| e.layer == Layer::Allocator && e.autograd_node.is_none()).unwrap();
    for node in &expected {
        let grad = node["grad"].as_u64().unwrap();
        let blocks: Vec<&&Event> = backward.iter().filter(|e| e.size == grad).collect();
        assert_eq!(blocks.iter().map(|e| e.op).collect::<Vec<_>>(), [Op::Alloc, Op::Free], "{node}");
        for block in blocks {
            assert_eq!(block.autograd_node.as_deref(), node["node"].as_str(), "{node}");
            assert_ne!(block.tid, forward_thread.tid);
            assert_eq!(&*block.comm, "pt_autograd_0");
            assert_eq!(block.autograd_thread, forward_thread.autograd_thread);
            assert_eq!(block.stack_origin.map(|o| o.as_str()), node["origin"].as_str(), "{node}");
            let frames = block.stack.frames();
            assert_eq!((frames[0].function.as_str(), frames[0].file.as_str()), (node["node"].as_str().unwrap(), "<autograd>"));
            let forward: Vec<Value> = frames[1..].iter().map(|f| json!({"function": f.function, "file": f.file, "line": f.line})).collect();
            assert_eq!(Value::from(forward), node["stack"], "{node}");
        }
    }
    // Forward blocks keep their own stack and carry their thread's sequence counter: 3 nodes a
    // block, the addmm's output right after its node (1), the relu's after its (3).
    let outputs: Vec<u64> = events
        .iter()
        .filter(|e| e.layer == Layer::Allocator && e.autograd_node.is_none())
        .map(|e| e.autograd_seq.unwrap())
        .collect();
    assert_eq!(outputs, [1, 3, 4, 6, 7, 9, 10, 12]);
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
    let output = cmd.output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let table = std::fs::read_to_string(&out).unwrap();
    let expected = read_expected(&log);
    let pid = pid_of_role(&expected, "parent");
    let last = expected.iter().rev().find(|e| e["layer"] == "allocator").unwrap();
    assert!(last["reserved"].as_u64().unwrap() > 0);
    let at = table.lines().position(|l| l == "PyTorch caching allocator at end:").expect("allocator section");
    let row: Vec<&str> = table.lines().nth(at + 2).unwrap().split_whitespace().collect();
    assert_eq!(row, [pid.to_string(), "0".into(), "0".into(), "0".into(), "0".into()]);
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
