//! Leak findings end to end: multiprocessing workloads against the libcuda stand-in under
//! `gpuprof run`, each rule with a case that fires and one that must not; `gpuprof report` on the
//! same event files gives the same findings (views/tests/report.rs: files it cannot read whole).

use std::path::PathBuf;
use std::process::Command;

use gpuprof_model::{Finding, FindingKind, Frame};
use gpuprof_testkit::*;

const MIB: u64 = 1 << 20;

struct Run {
    findings: Vec<Finding>,
    events: PathBuf,
    expected: Vec<serde_json::Value>,
}

impl Run {
    fn pid(&self, role: &str) -> u32 {
        pid_of_role(&self.expected, role)
    }

    /// The Python stack the workload saw at its `nth` call of `api` in process `pid`.
    fn stack_of(&self, pid: u32, api: &str, nth: usize) -> Vec<Frame> {
        let line = self
            .expected
            .iter()
            .filter(|e| e["pid"] == pid && e["api"] == api)
            .nth(nth)
            .unwrap_or_else(|| panic!("no call {nth} of {api} in pid {pid}"));
        serde_json::from_value(line["stack"].clone()).unwrap()
    }

    /// "at file:line in function" of the innermost frame of that call.
    fn at(&self, pid: u32, api: &str, nth: usize) -> String {
        let stack = self.stack_of(pid, api, nth);
        format!("at {}:{} in {}", stack[0].file, stack[0].line, stack[0].function)
    }

    /// (kind, pid, peer_pid, bytes, count) of every finding, in the order they fired.
    fn summary(&self) -> Vec<(FindingKind, u32, Option<u32>, u64, u64)> {
        self.findings.iter().map(|f| (f.kind, f.pid, f.peer_pid, f.bytes, f.count)).collect()
    }
}

fn scenario(name: &str, env: &[(&str, String)], rule_args: &[&str]) -> Run {
    let LeaksRun { findings, events, expected, stderr } = run_leaks(&format!("findings_{name}"), name, env, rule_args);
    assert!(stderr.contains(", none lost\n"), "{stderr}");

    // The same file through `gpuprof report` gives the same findings.
    let report = Command::new(gpuprof())
        .args(["report", "--input", events.to_str().unwrap(), "--format", "json"])
        .args(rule_args)
        .output_within(PATIENCE);
    assert_eq!(report.status.code(), Some(0), "{}", String::from_utf8_lossy(&report.stderr));
    let reported: Vec<Finding> = serde_json::from_slice(&report.stdout).unwrap();
    assert_eq!(reported, findings, "report and the live capture disagree");

    Run { findings, events, expected }
}

#[test]
fn ipc_opened_and_closed_by_a_worker_is_clean() {
    let run = scenario("ipc-closed", &[], &[]);
    let (parent, worker) = (run.pid("parent"), run.pid("worker"));
    // The worker's context serves its import of the parent's buffer: nothing to say.
    assert_eq!(run.summary(), vec![], "{:#?} (parent {parent}, worker {worker})", run.findings);
}

#[test]
fn ipc_mapping_left_open_by_an_exiting_worker() {
    let run = scenario("ipc-left-open", &[], &[]);
    let (parent, worker) = (run.pid("parent"), run.pid("worker"));
    // The worker's context serves the import: not a worker_cuda_context.
    assert_eq!(run.summary(), vec![(FindingKind::IpcHandleNotClosed, worker, Some(parent), 4 * MIB, 1)]);
    let finding = &run.findings[0];
    assert_eq!(finding.api.as_deref(), Some("cuIpcOpenMemHandle_v2"));
    assert!(finding.detail.starts_with(&format!(
        "pid {worker} (python3) exited without closing 1 IPC mapping (4.0 MiB) of pid {parent}'s memory, opened by cuIpcOpenMemHandle_v2 {}:",
        run.at(worker, "cuIpcOpenMemHandle_v2", 0)
    )), "{}", finding.detail);
    assert_eq!(finding.stack, run.stack_of(worker, "cuIpcOpenMemHandle_v2", 0));
    // The event stream itself names the exporter of the open.
    let events = read_events(&run.events);
    let open = events.iter().find(|e| e.api == "cuIpcOpenMemHandle_v2").unwrap();
    assert_eq!(open.peer_pid, Some(parent));
}

#[test]
fn exporter_frees_while_the_worker_still_has_it_open() {
    let run = scenario("export-freed", &[], &[]);
    let (parent, worker) = (run.pid("parent"), run.pid("worker"));
    assert_eq!(run.summary(), vec![(FindingKind::IpcExportFreedWhileImported, parent, Some(worker), 4 * MIB, 1)]);
    assert_eq!(run.findings[0].api.as_deref(), Some("cuMemAlloc_v2"));
    // The buffer's own stack; the free's is in the sentence.
    assert_eq!(run.findings[0].stack, run.stack_of(parent, "cuMemAlloc_v2", 0));
    assert!(
        run.findings[0].detail.contains(&format!("freed (cuMemFree_v2 {})", run.at(parent, "cuMemFree_v2", 0))),
        "{}",
        run.findings[0].detail
    );
}

#[test]
fn worker_exiting_with_a_live_allocation() {
    let run = scenario("worker-exit-live", &[], &[]);
    let worker = run.pid("worker");
    assert_eq!(run.summary(), vec![(FindingKind::ExitWithLiveAllocations, worker, None, 8 * MIB, 1)]);
    assert_eq!(run.findings[0].api.as_deref(), Some("cuMemAlloc_v2"));
    assert_eq!(run.findings[0].stack, run.stack_of(worker, "cuMemAlloc_v2", 0));
    assert_eq!(run.findings[0].stack[2].function, "keeper");
}

#[test]
fn forked_worker_that_cleans_up_has_no_finding() {
    let run = scenario("fork-clean", &[], &[]);
    assert_eq!(run.summary(), vec![]);
}

#[test]
fn worker_creating_its_own_context() {
    let run = scenario("worker-context", &[], &[]);
    assert_eq!(run.summary(), vec![(FindingKind::WorkerCudaContext, run.pid("worker"), Some(run.pid("parent")), 0, 1)]);
}

#[test]
fn growth_of_one_worker_not_of_the_one_that_plateaus() {
    let run = scenario("growth", &[], &["--growth-window", "0.3", "--growth-rises", "3"]);
    let grower = run.pid("worker");
    let summary = run.summary();
    assert_eq!(summary.len(), 2, "{:#?}", run.findings);
    let (kind, pid, peer, grew, count) = summary[0];
    assert_eq!((kind, pid, peer), (FindingKind::Growth, grower, None));
    // At least one MiB per 0.3 s window, three windows in a row, all allocations still live.
    assert!(grew >= 3 * MIB && grew % MIB == 0, "{grew}");
    assert!(count * MIB >= grew, "{count}");
    assert_eq!(summary[1], (FindingKind::ExitWithLiveAllocations, grower, None, 40 * MIB, 40));
    // Growth is of one stack: the line in `grower` that keeps allocating.
    assert_eq!(run.findings[0].stack, run.stack_of(grower, "cuMemAlloc_v2", 0));
    assert_eq!(run.findings[0].stack[2].function, "grower");
}

#[test]
fn out_of_memory_pictures_every_process() {
    let dir = scratch("findings_oom_device");
    let env = [
        ("GPUPROF_STANDIN_DEVICE_MEMORY", (64 * MIB).to_string()),
        ("GPUPROF_STANDIN_DEVICE_FILE", dir.join("device").to_str().unwrap().to_string()),
    ];
    let run = scenario("oom", &env, &[]);
    let (parent, worker) = (run.pid("parent"), run.pid("worker"));
    assert_eq!(
        run.summary(),
        vec![
            (FindingKind::Oom, parent, None, 16 * MIB, 1),
            (FindingKind::WorkerCudaContext, worker, Some(parent), 0, 1),
        ]
    );
    // The worker computes on its own (it imports nothing, it allocates 40 MiB): a design, worth
    // a word, not a leak.
    assert_eq!(run.findings[1].severity, gpuprof_model::Severity::Info);
    assert_eq!(
        run.findings[1].detail,
        format!("pid {worker} (python3), a child of CUDA process pid {parent} (python3), created its own CUDA context on device 0 (cuDevicePrimaryCtxRetain {}): each context takes hundreds of MiB of device memory. It allocated 40.0 MiB of its own: GPU work by design (a worker per GPU or per task); nothing to do unless the device is short of memory.", run.at(worker, "cuDevicePrimaryCtxRetain", 0))
    );
    assert_eq!(run.findings[0].diagnosis, Some(gpuprof_model::Diagnosis::DeviceFull));
    assert_eq!(run.findings[1].stack, run.stack_of(worker, "cuDevicePrimaryCtxRetain", 0));
    let oom = &run.findings[0];
    let picture: Vec<(u32, u64)> =
        oom.processes.iter().map(|p| (p.pid, p.live[&gpuprof_model::Kind::Device])).collect();
    assert_eq!(picture, vec![(worker, 40 * MIB), (parent, 16 * MIB)]);
    assert!(oom.detail.starts_with(&format!(
        "cuMemAlloc_v2 of 16.0 MiB failed with out of memory in pid {parent} (python3) {}; at that moment gpuprof saw 56.0 MiB of device memory live",
        run.at(parent, "cuMemAlloc_v2", 1)
    )), "{}", oom.detail);
    assert_eq!(oom.stack, run.stack_of(parent, "cuMemAlloc_v2", 1));
    // Each process's top stack is the allocation it holds.
    assert_eq!(oom.processes[0].top_stacks[0].stack, run.stack_of(worker, "cuMemAlloc_v2", 0));
    assert_eq!(oom.processes[1].top_stacks[0].stack, run.stack_of(parent, "cuMemAlloc_v2", 0));
}
