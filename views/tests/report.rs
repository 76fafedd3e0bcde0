//! `gpuprof report` on files it cannot read whole: a capture cut short is reported up to its cut
//! with a warning, a corrupt or missing file is refused in one line naming it, and a good file
//! gives its findings as JSON and as a table.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use gpuprof_model::{Finding, FindingKind};
use gpuprof_testkit::*;

fn report(input: &Path, format: &str) -> std::process::Output {
    Command::new(gpuprof())
        .args(["report", "--input", input.to_str().unwrap(), "--format", format])
        .output_within(PATIENCE)
}

#[test]
fn report_refuses_corrupt_files_and_reads_truncated_ones_up_to_their_cut() {
    let dir = scratch("report_bad_input");
    let good = r#"{"ts":1,"pid":7,"tid":7,"source":"ebpf","layer":"driver","op":"alloc","api":"cuMemAlloc_v2","kind":"device","addr":"0x7f0000000000","size":4096,"result":0,"stack":[]}"#;

    // A capture killed while writing its last line: the whole lines are reported, with a warning.
    let truncated = dir.join("truncated.jsonl");
    std::fs::write(&truncated, format!("{good}\n{}", &good[..good.len() / 2])).unwrap();
    let output = report(&truncated, "json");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        format!(
            "gpuprof: warning: {} is cut short after 1 events (its capture did not finish); what follows covers those",
            truncated.display()
        )
    );
    let findings: Vec<Finding> = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(findings, vec![]);

    // A bad line with more after it is corruption, not a cut.
    let corrupt = dir.join("corrupt.jsonl");
    std::fs::write(&corrupt, format!("{good}\n{}\n{good}\n", &good[..good.len() / 2])).unwrap();
    let output = report(&corrupt, "json");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr.starts_with(&format!("gpuprof: error: {}:2: not a gpuprof event (", corrupt.display())), "{stderr}");
    assert!(stderr.trim_end().ends_with("the file is corrupt"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1);

    let garbage = dir.join("garbage.jsonl");
    std::fs::write(&garbage, format!("{good}\n{good}\n\u{0}\u{1}binary\n")).unwrap();
    let stderr = String::from_utf8_lossy(&report(&garbage, "json").stderr).to_string();
    assert!(stderr.starts_with(&format!("gpuprof: error: {}:3: not a gpuprof event", garbage.display())), "{stderr}");

    let missing = dir.join("missing.jsonl");
    let output = report(&missing, "json");
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr).trim_end(),
        format!("gpuprof: error: cannot read {}: No such file or directory (os error 2)", missing.display())
    );

    // A good file with a process that exits holding memory: one finding, exit code 0.
    let clean = dir.join("good.jsonl");
    let exit = r#"{"ts":2,"pid":7,"tid":7,"source":"ebpf","layer":"process","op":"exit","api":"sched_process_exit","exit_code":0,"stack":[]}"#;
    std::fs::write(&clean, format!("{good}\n{exit}\n")).unwrap();
    let output = report(&clean, "json");
    assert_eq!(output.status.code(), Some(0));
    let findings: Vec<Finding> = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(findings.len(), 1);
    assert_eq!((findings[0].kind, findings[0].pid, findings[0].bytes), (FindingKind::ExitWithLiveAllocations, 7, 4096));
    let table = String::from_utf8(report(&clean, "table").stdout).unwrap();
    assert!(
        table.contains(&format!(
            "Findings (1 leak, 0 info):\n  exit_with_live_allocations [leak] pid 7: 4.0 KiB in 1 (id {})\n",
            findings[0].finding_id
        )),
        "{table}"
    );
}

/// `--fail-on`: a recording with a leak fails a CI job (exit status 3, said on stderr), a clean
/// one does not, and a kind the recording does not have does not.
#[test]
fn fail_on_gives_exit_status_3_for_the_findings_it_names() {
    let dir = scratch("report_fail_on");
    let alloc = r#"{"ts":1,"pid":7,"tid":7,"source":"ebpf","layer":"driver","op":"alloc","api":"cuMemAlloc_v2","kind":"device","addr":"0x7f0000000000","size":4096,"result":0,"stack":[]}"#;
    let free = r#"{"ts":2,"pid":7,"tid":7,"source":"ebpf","layer":"driver","op":"free","api":"cuMemFree_v2","kind":"device","addr":"0x7f0000000000","size":0,"result":0,"stack":[]}"#;
    let exit = r#"{"ts":3,"pid":7,"tid":7,"source":"ebpf","layer":"process","op":"exit","api":"sched_process_exit","size":0,"result":0,"exit_code":0,"stack":[]}"#;
    let (leaking, clean) = (dir.join("leaking.jsonl"), dir.join("clean.jsonl"));
    std::fs::write(&leaking, format!("{alloc}\n{exit}\n")).unwrap();
    std::fs::write(&clean, format!("{alloc}\n{free}\n{exit}\n")).unwrap();
    let report_failing_on = |input: &Path, kind: &str| {
        let mut report = Command::new(gpuprof());
        report.args(["report", input.to_str().unwrap(), "-f", "json", "--fail-on", kind]);
        let output = report.output_within(Duration::from_secs(60));
        let findings: Vec<Finding> = serde_json::from_slice(&output.stdout).unwrap();
        let kinds: Vec<FindingKind> = findings.iter().map(|f| f.kind).collect();
        (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned(), kinds)
    };
    let said = "gpuprof: 1 finding matched --fail-on leak: exit status 3\n";
    assert_eq!(
        report_failing_on(&leaking, "leak"),
        (Some(3), said.to_string(), vec![FindingKind::ExitWithLiveAllocations])
    );
    assert_eq!(report_failing_on(&leaking, "any").0, Some(3));
    assert_eq!(
        report_failing_on(&leaking, "oom"),
        (Some(0), String::new(), vec![FindingKind::ExitWithLiveAllocations])
    );
    assert_eq!(report_failing_on(&clean, "any"), (Some(0), String::new(), vec![]));
    let mut report = Command::new(gpuprof());
    report.args(["report", leaking.to_str().unwrap(), "--fail-on", "leaks"]);
    let output = report.output_within(Duration::from_secs(60));
    assert_eq!(output.status.code(), Some(2), "a kind it does not know is a usage error");
}
