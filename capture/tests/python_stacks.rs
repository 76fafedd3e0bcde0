//! Python stacks from outside an unmodified process, on every CPython from 3.8 to 3.13: the
//! workload logs the stack it sees at each driver call (function — qualified from 3.11 —, file,
//! line, innermost first, at most 64), and gpuprof must report exactly that for every call, in
//! every process and thread; a native thread gets an empty stack. The offset tables these walks
//! use are held to each version's own headers in pystack/tests/offsets.rs.

use std::collections::BTreeSet;

use gpuprof_model::event::Layer;
use gpuprof_pystack::offsets::Version;
use gpuprof_testkit::*;

fn version_of(label: &str) -> Version {
    let (major, minor) = label.split_once('.').unwrap();
    Version { major: major.parse().unwrap(), minor: minor.parse().unwrap() }
}

#[test]
fn known_lines_on_every_cpython() {
    for (label, python) in pythons() {
        let dir = scratch(&format!("stacks_{label}"));
        let (log, out) = (dir.join("expected.jsonl"), dir.join("events.jsonl"));
        let script = workloads().join("stacks.py");
        let output = gpuprof_run(
            &["--stats", "--output", out.to_str().unwrap()],
            &[python.to_str().unwrap(), script.to_str().unwrap()],
            &log,
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "CPython {label}: {stderr}");
        assert!(
            counters_line(&stderr).contains("unresolved 0 (unreadable in the kernel 0)"),
            "CPython {label}: {stderr}"
        );

        let expected = read_expected(&log);
        let calls = expected_calls(&expected);
        let events = read_events(&out);
        let captured = driver_events(&events);
        let pids: BTreeSet<u32> = calls.iter().map(|e| e["pid"].as_u64().unwrap() as u32).collect();
        assert_eq!(pids.len(), 3, "CPython {label}: parent, forked and spawned child");
        for pid in &pids {
            let want: Vec<serde_json::Value> = calls.iter().filter(|e| e["pid"] == *pid).cloned().collect();
            let got: Vec<&gpuprof_model::Event> = captured.iter().filter(|e| e.pid == *pid).copied().collect();
            eprintln!("CPython {label}: pid {pid}, {} calls", want.len());
            assert_same_calls(&want, &got);
        }
        assert_eq!(captured.len(), calls.len(), "CPython {label}");

        // Spot checks that say what the comparison covered.
        let parent = pid_of_role(&expected, "parent");
        let qualified = if version_of(&label).minor >= 11 { "Trainer.forward" } else { "forward" };
        assert!(captured.iter().any(|e| e.stack.get(2).is_some_and(|f| f.function == qualified)), "CPython {label}");
        assert!(captured
            .iter()
            .any(|e| e.stack.get(2).is_some_and(|f| f.function == "café_分配" && f.file.contains("données_模块"))));
        let native: Vec<_> = captured.iter().filter(|e| e.pid == parent && e.size == 6 << 20).collect();
        assert_eq!(native.len(), 1);
        assert!(native[0].stack.is_empty() && native[0].tid != parent, "CPython {label}: native thread");
        let thread_tid = expected.iter().find(|e| e["role"] == "thread").unwrap()["tid"].as_u64().unwrap() as u32;
        assert!(captured
            .iter()
            .any(|e| e.tid == thread_tid && e.stack.last().is_some_and(|f| f.function.ends_with("_bootstrap"))));
        let deepest = captured.iter().map(|e| e.stack.len()).max().unwrap();
        assert_eq!(deepest, 64, "CPython {label}: the innermost 64 frames of a deeper stack");
        assert!(events.iter().all(|e| e.layer != Layer::Driver || e.stack.is_empty() || e.stack.len() <= 64));
    }
}
