//! `gpuprof doctor`: what this machine can capture, and why not. Each check asks what the
//! capture itself asks — the capture crate's preflight probes, its libcuda and shim lookups, its
//! NVML opening, pystack's interpreter discovery — so that what the doctor says is what `run`,
//! `attach` and the daemon would find. `ebpf` checks the kernel and the privileges, `libraries`
//! the files a capture opens, `processes` the CUDA processes running, `collector` where a
//! daemon would send; `render` writes them for a person or as JSON.

mod collector;
mod ebpf;
mod libraries;
mod processes;
mod render;

use std::path::Path;

use anyhow::Result;
use serde::Serialize;

/// How the report is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DoctorFormat {
    /// One line per check, for a person.
    Table,
    /// One JSON document.
    Json,
}

/// A check's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Status {
    #[serde(rename = "ok")]
    Ok,
    #[serde(rename = "fail")]
    Fail,
    /// Not applicable here, or not configured.
    #[serde(rename = "n/a")]
    NotApplicable,
}

/// One thing looked at, what was seen, and for a failure how to mend it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub status: Status,
    pub detail: String,
    pub fix: Option<String>,
    /// Why eBPF capture cannot run here, when this check is the reason (the verdict's words).
    #[serde(skip)]
    stops_ebpf: Option<String>,
}

impl Check {
    fn ok(name: &'static str, detail: impl Into<String>) -> Check {
        Check { name, status: Status::Ok, detail: detail.into(), fix: None, stops_ebpf: None }
    }

    fn not_applicable(name: &'static str, detail: impl Into<String>) -> Check {
        Check { name, status: Status::NotApplicable, detail: detail.into(), fix: None, stops_ebpf: None }
    }

    fn fail(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check { name, status: Status::Fail, detail: detail.into(), fix: Some(fix.into()), stops_ebpf: None }
    }

    /// This failure is why eBPF capture cannot run, in `why`'s words.
    fn stopping_ebpf(mut self, why: impl Into<String>) -> Check {
        self.stops_ebpf = Some(why.into());
        self
    }
}

/// Whether one way of capturing works here, and why (not).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Way {
    pub works: bool,
    pub why: String,
}

/// What the checks add up to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    pub ebpf: Way,
    pub shim: Way,
    /// Both in one line, as the table ends.
    pub line: String,
}

impl Verdict {
    fn of(checks: &[Check], shim: Way) -> Verdict {
        let stops: Vec<&str> = checks.iter().filter_map(|c| c.stops_ebpf.as_deref()).collect();
        let ebpf = if stops.is_empty() {
            Way { works: true, why: "privileges and kernel features all there".to_string() }
        } else {
            Way { works: false, why: stops.join("; ") }
        };
        let yes_no = |works: bool| if works { "yes" } else { "no" };
        let mut line =
            format!("eBPF capture: {} ({}); shim: {} ({})", yes_no(ebpf.works), ebpf.why, yes_no(shim.works), shim.why);
        match (ebpf.works, shim.works) {
            (false, true) => line.push_str("; shim only: `gpuprof run --via shim -- CMD`"),
            (false, false) => line.push_str("; nothing can capture here"),
            _ => {}
        }
        Verdict { ebpf, shim, line }
    }

    /// gpuprof's exit code: 0 when at least one way of capturing works.
    pub fn exit_code(&self) -> u8 {
        u8::from(!(self.ebpf.works || self.shim.works))
    }
}

/// Every check, in the order they are shown, and the verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    pub checks: Vec<Check>,
    pub verdict: Verdict,
}

/// What a refusal of the machine ends with: where to see everything it lacks at once.
pub const SEE_DOCTOR: &str = "(gpuprof doctor says what this machine can capture)";

/// The capture's own preflight (`gpuprof_capture::preflight`) for the verbs that load probes,
/// its refusal, still one line, pointing at the doctor.
pub fn check_ebpf_capture() -> Result<()> {
    gpuprof_capture::preflight::check_ebpf_capture().map_err(|error| anyhow::anyhow!("{error:#} {SEE_DOCTOR}"))
}

/// Runs the checks and writes the report; gpuprof's exit code.
pub fn run(format: DoctorFormat, shim: Option<&Path>) -> Result<u8> {
    let report = examine(shim);
    let mut stdout = std::io::stdout().lock();
    match format {
        DoctorFormat::Table => render::table(&report, &mut stdout)?,
        DoctorFormat::Json => render::json(&report, &mut stdout)?,
    }
    Ok(report.verdict.exit_code())
}

fn examine(shim: Option<&Path>) -> Report {
    let privileges = ebpf::Privileges::here();
    let mut checks = ebpf::checks(&privileges);
    checks.push(libraries::libcuda());
    checks.push(libraries::libc10());
    checks.push(libraries::nvml());
    checks.push(processes::check(&privileges));
    let (shim_check, shim_path) = libraries::shim(shim);
    checks.push(shim_check);
    checks.push(collector::check());
    let verdict = Verdict::of(&checks, shim_path);
    Report { checks, verdict }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shim(works: bool) -> Way {
        let why = if works {
            "/opt/gpuprof/libgpuprof_shim.so"
        } else {
            "no libgpuprof_shim.so at /opt/gpuprof/libgpuprof_shim.so"
        };
        Way { works, why: why.to_string() }
    }

    #[test]
    fn the_verdict_names_every_reason_ebpf_cannot_run_and_exits_1_only_when_nothing_can_capture() {
        let fine = [Check::ok("kernel", "Linux 6.8.0"), Check::not_applicable("nvml", "no libnvidia-ml.so.1")];
        let both = Verdict::of(&fine, shim(true));
        assert_eq!(
            both.line,
            "eBPF capture: yes (privileges and kernel features all there); shim: yes (/opt/gpuprof/libgpuprof_shim.so)"
        );
        assert_eq!(both.exit_code(), 0);

        let stopped = [
            Check::fail("privileges", "uid 1000 without CAP_BPF", "run it as root").stopping_ebpf("missing CAP_BPF"),
            Check::fail("btf", "/sys/kernel/btf/vmlinux is missing", "another kernel").stopping_ebpf("no BTF"),
            Check::fail("libcuda", "no libcuda.so.1", "install the driver"),
        ];
        let shim_only = Verdict::of(&stopped, shim(true));
        assert_eq!(
            shim_only.line,
            "eBPF capture: no (missing CAP_BPF; no BTF); shim: yes (/opt/gpuprof/libgpuprof_shim.so); shim only: `gpuprof run --via shim -- CMD`"
        );
        assert_eq!(shim_only.exit_code(), 0);

        let nothing = Verdict::of(&stopped, shim(false));
        assert_eq!(
            nothing.line,
            "eBPF capture: no (missing CAP_BPF; no BTF); shim: no (no libgpuprof_shim.so at /opt/gpuprof/libgpuprof_shim.so); nothing can capture here"
        );
        assert_eq!(nothing.exit_code(), 1);

        let ebpf_only = Verdict::of(&fine, shim(false));
        assert_eq!(ebpf_only.exit_code(), 0);
    }

    #[test]
    fn a_table_line_carries_the_fix_of_a_failure_only() {
        let report = Report {
            checks: vec![
                Check::ok("btf", "/sys/kernel/btf/vmlinux"),
                Check::fail("libcuda", "no libcuda.so.1 in /lib64", "install the NVIDIA driver"),
                Check::not_applicable("cuda_processes", "none running"),
            ],
            verdict: Verdict::of(&[], shim(true)),
        };
        let mut out = Vec::new();
        render::table(&report, &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "✓ btf             /sys/kernel/btf/vmlinux\n\
             ✗ libcuda         no libcuda.so.1 in /lib64; fix: install the NVIDIA driver\n\
             – cuda_processes  none running\n\
             eBPF capture: yes (privileges and kernel features all there); shim: yes (/opt/gpuprof/libgpuprof_shim.so)\n"
        );
        let mut out = Vec::new();
        render::json(&report, &mut out).unwrap();
        let document: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            document["checks"][1],
            serde_json::json!({"name": "libcuda", "status": "fail", "detail": "no libcuda.so.1 in /lib64", "fix": "install the NVIDIA driver"})
        );
        assert_eq!(document["checks"][2]["status"], "n/a");
        assert_eq!(
            document["verdict"]["ebpf"],
            serde_json::json!({"works": true, "why": "privileges and kernel features all there"})
        );
    }
}
