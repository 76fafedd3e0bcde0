//! README.md shows what `bash scripts/demo.sh` prints. This test runs the script as a reader
//! would (with this build's gpuprof instead of a release build: GPUPROF_BIN) and holds README's
//! block to its output — the checkout's path made the README's own, pids numbered from 4710 in
//! the order the tables list them, and what differs from run to run by timing alone (seconds,
//! rates, finding ids) taken as it comes — and checks what the demo is for: every finding's kind,
//! line and diagnosis, and the HTML report. When the output changes on purpose:
//! `GPUPROF_BLESS_README=1 cargo test -p gpuprof --test readme` rewrites the block.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use gpuprof_model::{Finding, FindingKind};
use gpuprof_testkit::*;

const START: &str = "<!-- demo output, checked by agent/tests/readme.rs -->\n```text\n";
const END: &str = "```\n";
/// Where the README's reader has the checkout.
const CHECKOUT: &str = "/home/me/gpuprof";

#[test]
fn the_readme_shows_what_the_demo_prints_and_the_demo_finds_its_four_problems() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    standin_dir();
    let mut demo = Command::new("bash");
    demo.args(["-c", "bash scripts/demo.sh 2>&1"])
        .current_dir(root)
        .env("GPUPROF_BIN", gpuprof())
        .env("PYTHON", python3())
        .env_remove("NO_COLOR")
        .env_remove("LD_LIBRARY_PATH");
    let output = demo.output_within(Duration::from_secs(300));
    let said = String::from_utf8_lossy(&output.stdout).into_owned();
    assert_eq!(output.status.code(), Some(0), "{said}");
    let printed = format!("$ sudo bash scripts/demo.sh\n{}", as_in_the_readme(&said, root));

    let readme_path = root.join("README.md");
    let readme = std::fs::read_to_string(&readme_path).unwrap();
    let start = readme.find(START).expect("README.md has the demo's output block") + START.len();
    let end = start + readme[start..].find(END).unwrap();
    let shown = &readme[start..end];
    if timing_aside(shown) != timing_aside(&printed) && std::env::var_os("GPUPROF_BLESS_README").is_some() {
        std::fs::write(&readme_path, format!("{}{printed}{}", &readme[..start], &readme[end..])).unwrap();
        return;
    }
    assert!(
        timing_aside(shown) == timing_aside(&printed),
        "README.md's demo output is stale ({}): GPUPROF_BLESS_README=1 cargo test -p gpuprof --test readme rewrites it; the demo printed:\n{printed}",
        first_difference(&timing_aside(shown), &timing_aside(&printed))
    );

    // What the demo is for: each problem at its line, with its diagnosis.
    let demo_dir = root.join("target/demo");
    let mut report = Command::new(gpuprof());
    report.args(["report", "-f", "json"]).arg(demo_dir.join("demo.gpuprof"));
    let report = report.output_within(Duration::from_secs(60));
    let findings: Vec<Finding> = serde_json::from_slice(&report.stdout).unwrap();
    let job = std::fs::read_to_string(workloads().join("demo_job.py")).unwrap();
    let line_of = |marker: &str| job.lines().position(|l| l.contains(marker)).unwrap() as u32 + 1;
    let found: Vec<Seen> = findings
        .iter()
        .map(|f| {
            let at = f.user_frame.as_ref().map(|u| (u.function.clone(), u.line));
            assert!(f.user_frame.as_ref().is_none_or(|u| u.file.ends_with("/demo_job.py")), "{f:?}");
            (f.kind, f.severity.as_str(), at, f.diagnosis.map(|d| d.as_str()))
        })
        .collect();
    let at = |function: &str, marker: &str| Some((function.to_string(), line_of(marker)));
    assert_eq!(
        found,
        [
            (
                FindingKind::WorkerCudaContext,
                "leak",
                at("CudaDataset.__getitem__", "# a CUDA context in the worker"),
                Some("cuda_in_dataloader_worker")
            ),
            (
                FindingKind::ExitWithLiveAllocations,
                "info",
                at("CudaDataset.__getitem__", "# a CUDA context in the worker"),
                None
            ),
            (FindingKind::IpcExportFreedWhileImported, "leak", at("share", "# the shared buffer"), None),
            (
                FindingKind::IpcHandleNotClosed,
                "leak",
                at("consume", "# opened, never closed"),
                Some("ipc_handle_not_released")
            ),
            (
                FindingKind::Growth,
                "leak",
                at("forward", "# the loss, kept by train"),
                Some("tensors_kept_by_user_code")
            ),
            (FindingKind::Oom, "leak", at("grow_buffers", "# the growing buffer"), Some("fragmentation")),
            (FindingKind::ExitWithLiveAllocations, "info", at("grow_buffers", "# the growing buffer"), None),
        ]
    );
    // The report the demo says to open, with the job's lines in it; and whatif's answer.
    let html = std::fs::read_to_string(demo_dir.join("demo.html")).unwrap();
    assert!(html.contains("tensors_kept_by_user_code") && html.contains("demo_job.py"));
    let whatif = said.find("$ gpuprof whatif").unwrap();
    let ran_out = said[whatif..].lines().find(|l| l.starts_with("  out of memory ")).unwrap();
    assert!(ran_out.starts_with("  out of memory           request ") && ran_out.ends_with("  no"), "{ran_out}");
}

/// A finding as the demo is checked for it: kind, severity, the user's function and line, why.
type Seen<'f> = (FindingKind, &'f str, Option<(String, u32)>, Option<&'f str>);

/// The output with what differs between machines made fixed: the checkout's path, the binary's
/// (a release build's, as the reader's), Python's standard library (Debian's) and pids (numbered
/// from 4710 in the order the first table lists them, PPID first).
fn as_in_the_readme(said: &str, checkout: &Path) -> String {
    let mut ask = Command::new(python3());
    ask.args(["-c", "import sysconfig; print(sysconfig.get_paths()['stdlib'])"]);
    let stdlib = ask.output_within(Duration::from_secs(30));
    let stdlib = String::from_utf8(stdlib.stdout).unwrap();
    let version = stdlib.trim().rsplit('/').next().unwrap().to_string();
    let text = said
        .replace(gpuprof(), "target/release/gpuprof")
        .replace(stdlib.trim(), &format!("/usr/lib/{version}"))
        .replace(checkout.to_str().unwrap(), CHECKOUT);
    let mut pids: HashMap<String, String> = HashMap::new();
    for line in text.lines() {
        // A row of the live-memory table: pid and ppid, right-aligned, first.
        let fields: Vec<&str> = line.split_whitespace().collect();
        let is_pid = |field: &str| field.len() > 1 && field.parse::<u32>().is_ok();
        if fields.len() > 3 && is_pid(fields[0]) && is_pid(fields[1]) && fields[2] != "B" {
            for original in [fields[1], fields[0]] {
                let next = format!("{}", 4710 + pids.len());
                pids.entry(original.to_string()).or_insert(next);
            }
        }
    }
    let mut lines = Vec::new();
    for line in text.lines() {
        let chars: Vec<char> = line.chars().collect();
        let leading_fields = leading_pid_columns(line, &pids);
        let mut out = String::new();
        let mut field = 0;
        let mut i = 0;
        while i < chars.len() {
            if !chars[i].is_ascii_digit() {
                if !chars[i].is_whitespace() && (i == 0 || chars[i - 1].is_whitespace()) {
                    field += 1;
                }
                out.push(chars[i]);
                i += 1;
                continue;
            }
            let start = i;
            if start == 0 || chars[start - 1].is_whitespace() {
                field += 1;
            }
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            // A number is a pid by its place alone: in a table's leading pid columns, or after
            // "pid ", "peer ", "/proc/" or "kill ". Pids can be as small as the other numbers
            // printed (request counts, line numbers) on a machine that has just started.
            let said_as_pid = ["pid ", "peer ", "/proc/", "kill "].iter().any(|before| out.ends_with(before));
            let in_pid_column = field <= leading_fields;
            let renamed = pids.get(&word).filter(|_| said_as_pid || in_pid_column);
            match renamed {
                Some(pid) => {
                    // In a table the column keeps its width: spaces and pid, right-aligned.
                    let spaces = out.len() - out.trim_end_matches(' ').len();
                    if spaces > 1 {
                        out.truncate(out.len() - spaces);
                        out.push_str(&format!("{pid:>width$}", width = spaces + word.len()));
                    } else {
                        out.push_str(pid);
                    }
                }
                None => out.push_str(&word),
            }
        }
        lines.push(out);
    }
    lines.join("\n") + "\n"
}

/// Where two texts of words part, as "README: … | demo: …", a few words either side.
fn first_difference(readme: &str, demo: &str) -> String {
    let (readme, demo): (Vec<&str>, Vec<&str>) = (readme.split(' ').collect(), demo.split(' ').collect());
    let at = readme.iter().zip(&demo).position(|(a, b)| a != b).unwrap_or(readme.len().min(demo.len()));
    let around = |words: &[&str]| words[at.saturating_sub(8).min(words.len())..(at + 8).min(words.len())].join(" ");
    format!("README: {} | demo: {}", around(&readme), around(&demo))
}

/// How many of a table row's first columns (at most two: PID, PPID) hold known pids.
fn leading_pid_columns(line: &str, pids: &HashMap<String, String>) -> usize {
    if !line.starts_with(' ') {
        return 0;
    }
    line.split_whitespace().take(2).take_while(|field| pids.contains_key(*field)).count()
}

/// The text with what timing alone changes set aside (numbers before " s" and "/s", and finding
/// ids), as words.
fn timing_aside(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let mut kept = String::new();
        let chars: Vec<char> = line.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            if chars[i].is_ascii_digit() {
                let start = i;
                while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                    i += 1;
                }
                let after: String = chars[i..].iter().take(6).collect();
                let timed = after.starts_with(" s") || after.starts_with(" MiB/s") || after.starts_with(" GiB/s");
                if timed {
                    kept.push('#');
                } else {
                    kept.extend(&chars[start..i]);
                }
                continue;
            }
            kept.push(chars[i]);
            i += 1;
        }
        if let Some(at) = kept.find("(id ") {
            kept.replace_range(at + 4..(at + 20).min(kept.len()), "#");
        }
        out.push_str(&kept);
        out.push('\n');
    }
    // A finding's sentences are wrapped at 120 columns before the checkout's path is made the
    // README's, so where they wrap depends on the length of that path: words, not lines. For the
    // same reason a table cuts a long path in its middle ("workloads…emo_job.py:45") in one
    // checkout and not in another: a path is compared by its end, which a cut keeps.
    out.split_whitespace().map(path_end).collect::<Vec<_>>().join(" ")
}

/// A word that is a path (or a path cut with "…"): its last 12 characters; any other word whole.
fn path_end(word: &str) -> &str {
    if !word.contains('/') && !word.contains('…') {
        return word;
    }
    let start = word.char_indices().rev().nth(11).map_or(0, |(at, _)| at);
    &word[start..]
}
