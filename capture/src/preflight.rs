//! Checks made before loading anything into the kernel, so that a missing privilege or kernel
//! feature is one clear sentence instead of a libbpf error code. Each check is public on its own
//! too: `gpuprof doctor` reports them one by one, from the same probes the refusal comes from.

use std::fs;
use std::path::Path;

use anyhow::{bail, Result};
use libbpf_rs::libbpf_sys;
use libbpf_rs::{MapType, ProgramType};

/// The kernel's BTF, which the CO-RE programs are relocated against at load.
pub const BTF_PATH: &str = "/sys/kernel/btf/vmlinux";
/// Present when the kernel can put uprobes through perf events.
pub const UPROBE_PMU: &str = "/sys/bus/event_source/devices/uprobe/type";

/// How a process gets the capabilities the capture needs (the refusal and `gpuprof doctor` say it).
pub const PRIVILEGES_FIX: &str =
    "run it as root (sudo), grant them with `setcap cap_bpf,cap_perfmon,cap_sys_ptrace+ep $(command -v gpuprof)`";

const CAP_SYS_PTRACE: u32 = 19;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Everything eBPF capture needs from this process and this kernel.
pub fn check_ebpf_capture() -> Result<()> {
    check_privileges()?;
    check_kernel()
}

fn check_privileges() -> Result<()> {
    let missing = missing_capabilities()?;
    if !missing.is_empty() {
        bail!(
            "missing privileges {}: gpuprof loads eBPF probes (CAP_BPF, CAP_PERFMON) and reads other processes' memory maps (CAP_SYS_PTRACE); {PRIVILEGES_FIX}, or capture without them from inside the process: `gpuprof run --via shim -- CMD`",
            missing.join(", ")
        );
    }
    Ok(())
}

/// The capabilities the eBPF capture needs that this process's effective set lacks, in the
/// order the refusal names them; none for root. CAP_SYS_ADMIN stands in for CAP_BPF and
/// CAP_PERFMON, as the kernel lets it.
pub fn missing_capabilities() -> Result<Vec<&'static str>> {
    Ok(lacking(effective_capabilities()?))
}

fn lacking(effective: u64) -> Vec<&'static str> {
    let has = |cap: u32| effective & (1u64 << cap) != 0;
    let mut missing = Vec::new();
    if !(has(CAP_BPF) || has(CAP_SYS_ADMIN)) {
        missing.push("CAP_BPF");
    }
    if !(has(CAP_PERFMON) || has(CAP_SYS_ADMIN)) {
        missing.push("CAP_PERFMON");
    }
    if !has(CAP_SYS_PTRACE) {
        missing.push("CAP_SYS_PTRACE");
    }
    missing
}

/// Whether the kernel publishes its BTF.
pub fn has_btf() -> bool {
    Path::new(BTF_PATH).exists()
}

/// Whether the kernel can put uprobes through perf events.
pub fn has_uprobes() -> bool {
    Path::new(UPROBE_PMU).exists()
}

fn check_kernel() -> Result<()> {
    if !has_btf() {
        bail!(
            "this kernel has no BTF ({BTF_PATH} is missing): gpuprof's CO-RE probes need a kernel built with CONFIG_DEBUG_INFO_BTF=y (the default of current distributions' kernels)"
        );
    }
    if !has_uprobes() {
        bail!(
            "this kernel has no uprobe support ({UPROBE_PMU} is missing): gpuprof needs a kernel built with CONFIG_UPROBE_EVENTS=y"
        );
    }
    // A probe that cannot tell is taken as yes: loading then says what is wrong.
    let missing = missing_features(|feature| feature.probe().unwrap_or(true));
    if !missing.is_empty() {
        bail!("{}", refusal(&kernel_release(), &missing));
    }
    Ok(())
}

/// A kernel feature the probes use, with the mainline release that brought it (README's floor
/// is the newest of them). Probed, not read off the version: distributions backport them.
pub struct KernelFeature {
    /// Its short name, as `gpuprof doctor` lists it.
    pub name: &'static str,
    /// What it is and what gpuprof uses it for, as a refusal names it.
    pub what: &'static str,
    pub since: &'static str,
    probe: fn() -> Option<bool>,
}

impl KernelFeature {
    /// Whether this kernel has it; None when the probe itself failed. Probing loads a BPF program
    /// or map: without CAP_BPF its answer means nothing.
    pub fn probe(&self) -> Option<bool> {
        (self.probe)()
    }
}

/// Newest first: the first one missing names the release to run.
pub const KERNEL_FEATURES: [KernelFeature; 5] = [
    KernelFeature {
        name: "bpf_loop",
        what: "bpf_loop (the Python stack walk)",
        since: "5.17",
        probe: || uprobe_helper(libbpf_sys::BPF_FUNC_loop),
    },
    KernelFeature {
        name: "uprobe_cookies",
        what: "bpf_get_attach_cookie in uprobes (one program for every driver entry point)",
        since: "5.15",
        probe: || uprobe_helper(libbpf_sys::BPF_FUNC_get_attach_cookie),
    },
    KernelFeature {
        name: "task_storage",
        what: "task storage in uprobes (the calls in flight of each thread)",
        since: "5.13",
        probe: || uprobe_helper(libbpf_sys::BPF_FUNC_task_storage_get),
    },
    KernelFeature {
        name: "task_btf",
        what: "bpf_get_current_task_btf",
        since: "5.11",
        probe: || uprobe_helper(libbpf_sys::BPF_FUNC_get_current_task_btf),
    },
    KernelFeature {
        name: "ring_buffer",
        what: "the BPF ring buffer",
        since: "5.8",
        probe: || MapType::RingBuf.is_supported().ok(),
    },
];

/// Whether a uprobe program may call `helper` here (uprobes are kprobe-type programs).
fn uprobe_helper(helper: libbpf_sys::bpf_func_id) -> Option<bool> {
    ProgramType::Kprobe.is_helper_supported(helper).ok()
}

fn missing_features(present: impl Fn(&KernelFeature) -> bool) -> Vec<&'static KernelFeature> {
    KERNEL_FEATURES.iter().filter(|feature| !present(feature)).collect()
}

/// The one line that refuses a kernel lacking `missing` (newest first).
fn refusal(release: &str, missing: &[&KernelFeature]) -> String {
    let features: Vec<String> = missing.iter().map(|f| format!("{} (Linux {})", f.what, f.since)).collect();
    format!(
        "this kernel ({release}) lacks what gpuprof's probes use: {}: run gpuprof on Linux {} or newer, or capture without eBPF: `gpuprof run --via shim -- CMD` (docs/shim.md)",
        features.join(", "),
        missing[0].since
    )
}

/// The running kernel's release (`uname -r`).
pub fn kernel_release() -> String {
    fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_or_else(|_| "release unknown".to_string(), |r| r.trim().to_string())
}

fn effective_capabilities() -> Result<u64> {
    let status = fs::read_to_string("/proc/self/status")
        .map_err(|e| anyhow::anyhow!("cannot read /proc/self/status to check privileges: {e}"))?;
    parse_cap_eff(&status).ok_or_else(|| anyhow::anyhow!("/proc/self/status has no CapEff line"))
}

fn parse_cap_eff(status: &str) -> Option<u64> {
    let line = status.lines().find_map(|line| line.strip_prefix("CapEff:"))?;
    u64::from_str_radix(line.trim(), 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_without_bpf_loop_is_refused_in_one_line_naming_the_release_to_run() {
        let missing = missing_features(|feature| feature.since != "5.17" && feature.since != "5.15");
        assert_eq!(missing.iter().map(|f| f.since).collect::<Vec<_>>(), ["5.17", "5.15"]);
        assert_eq!(
            refusal("5.14.0-70.el9.x86_64", &missing),
            "this kernel (5.14.0-70.el9.x86_64) lacks what gpuprof's probes use: bpf_loop (the Python stack walk) (Linux 5.17), bpf_get_attach_cookie in uprobes (one program for every driver entry point) (Linux 5.15): run gpuprof on Linux 5.17 or newer, or capture without eBPF: `gpuprof run --via shim -- CMD` (docs/shim.md)"
        );
    }

    #[test]
    fn this_kernel_has_every_feature_the_probes_use() {
        // The kernel tests run on (README: 5.17 or newer), probed for real.
        let missing: Vec<&str> =
            missing_features(|feature| feature.probe() == Some(true)).iter().map(|f| f.what).collect();
        assert_eq!(missing, Vec::<&str>::new());
        // The probe tells, rather than failing into "yes": a helper uprobes may not call is no.
        assert_eq!(ProgramType::Kprobe.is_helper_supported(libbpf_sys::BPF_FUNC_loop).ok(), Some(true));
        assert_eq!(ProgramType::Kprobe.is_helper_supported(libbpf_sys::BPF_FUNC_sk_redirect_map).ok(), Some(false));
    }

    #[test]
    fn reads_effective_capabilities() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n";
        assert_eq!(parse_cap_eff(status), Some(0x1ff_ffff_ffff));
        assert_eq!(parse_cap_eff("Name: x\n"), None);
    }

    #[test]
    fn cap_sys_admin_stands_in_for_bpf_and_perfmon_but_not_ptrace() {
        assert_eq!(lacking(0), ["CAP_BPF", "CAP_PERFMON", "CAP_SYS_PTRACE"]);
        assert_eq!(lacking(1 << CAP_SYS_ADMIN), ["CAP_SYS_PTRACE"]);
        assert_eq!(lacking(1 << CAP_BPF | 1 << CAP_PERFMON | 1 << CAP_SYS_PTRACE), Vec::<&str>::new());
        assert_eq!(lacking(0x1ff_ffff_ffff), Vec::<&str>::new());
    }
}
