//! README.md shows what `bash scripts/demo.sh` prints. This test runs the demo's capture as the
//! script does (the bundled job, the libcuda stand-in alone on the library path, the recording
//! into target/demo/demo.gpuprof) and holds README's block to it, pids, times and the checkout's
//! path made the README's own, so that the sample cannot go stale. When the output changes on
//! purpose: `GPUPROF_BLESS_README=1 cargo test -p gpuprof --test readme` rewrites the block.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use gpuprof_testkit::*;

const START: &str = "<!-- demo output, checked by agent/tests/readme.rs -->\n```text\n";
const END: &str = "```\n";
/// Where the README's reader has the checkout.
const CHECKOUT: &str = "/home/me/gpuprof";

#[test]
fn the_readme_shows_what_the_demo_prints() {
    let checkout = scratch("readme_demo");
    let demo = checkout.join("target/demo");
    std::fs::create_dir_all(&demo).unwrap();
    std::fs::copy(standin_dir().join("libcuda.so.1"), demo.join("libcuda.so.1")).unwrap();
    let output = Command::new(gpuprof())
        .current_dir(&checkout)
        .args(["run", "-o", "target/demo/demo.gpuprof", "--", python3()])
        .arg(workloads().join("process_tree.py"))
        .env("LD_LIBRARY_PATH", &demo)
        .env("PYTHONPATH", workloads())
        .env_remove("NO_COLOR")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let printed = format!("$ sudo bash scripts/demo.sh\n{}", as_in_the_readme(&stderr, &checkout));

    let readme_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let readme = std::fs::read_to_string(&readme_path).unwrap();
    let start = readme.find(START).expect("README.md has the demo's output block") + START.len();
    let end = start + readme[start..].find(END).unwrap();
    if readme[start..end] != printed && std::env::var_os("GPUPROF_BLESS_README").is_some() {
        std::fs::write(&readme_path, format!("{}{printed}{}", &readme[..start], &readme[end..])).unwrap();
        return;
    }
    assert_eq!(
        readme[start..end],
        printed,
        "README.md's demo output is stale: GPUPROF_BLESS_README=1 cargo test -p gpuprof --test readme rewrites it"
    );
}

/// The run's stderr with what differs between runs and machines made fixed: the checkout's path,
/// the seconds the capture took, and pids (numbered from 4710 in the order they appear).
fn as_in_the_readme(stderr: &str, checkout: &Path) -> String {
    let text = stderr.replace(checkout.to_str().unwrap(), CHECKOUT);
    let mut pids: HashMap<String, String> = HashMap::new();
    let mut lines = Vec::new();
    for line in text.lines() {
        let mut line = line.to_string();
        if let Some((before, after)) = line.split_once(" s, ").filter(|_| line.starts_with("gpuprof: captured ")) {
            let (head, _secs) = before.rsplit_once(' ').unwrap();
            line = format!("{head} 0.3 s, {after}");
        }
        // A row of the live-memory table: pid and ppid, right-aligned, first.
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() > 3 && fields[0].parse::<u32>().is_ok() && fields[1].parse::<u32>().is_ok() {
            let (pid, ppid) = (fields[0].to_string(), fields[1].to_string());
            for original in [&ppid, &pid] {
                let next = format!("{}", 4710 + pids.len());
                pids.entry(original.clone()).or_insert(next);
            }
            let after_pid = line.find(fields[0]).unwrap() + fields[0].len();
            let rest = &line[after_pid + line[after_pid..].find(fields[1]).unwrap() + fields[1].len()..];
            line = format!("{:>7} {:>7}{rest}", pids[&pid], pids[&ppid]);
        }
        lines.push(line);
    }
    lines.join("\n") + "\n"
}
