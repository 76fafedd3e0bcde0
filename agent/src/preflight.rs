//! Checks made before loading anything into the kernel, so that a missing privilege or kernel
//! feature is one clear sentence instead of a libbpf error code.

use std::fs;
use std::path::Path;

use anyhow::{bail, Result};

const BTF_PATH: &str = "/sys/kernel/btf/vmlinux";
const UPROBE_PMU: &str = "/sys/bus/event_source/devices/uprobe/type";

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
    let effective = effective_capabilities()?;
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
    if !missing.is_empty() {
        bail!(
            "missing privileges {}: gpuprof loads eBPF probes (CAP_BPF, CAP_PERFMON) and reads other processes' memory maps (CAP_SYS_PTRACE); run it as root (sudo) or grant them with `setcap cap_bpf,cap_perfmon,cap_sys_ptrace+ep $(command -v gpuprof)`",
            missing.join(", ")
        );
    }
    Ok(())
}

fn check_kernel() -> Result<()> {
    if !Path::new(BTF_PATH).exists() {
        bail!(
            "this kernel has no BTF ({BTF_PATH} is missing): gpuprof's CO-RE probes need a kernel built with CONFIG_DEBUG_INFO_BTF=y (the default of current distributions' kernels)"
        );
    }
    if !Path::new(UPROBE_PMU).exists() {
        bail!(
            "this kernel has no uprobe support ({UPROBE_PMU} is missing): gpuprof needs a kernel built with CONFIG_UPROBE_EVENTS=y"
        );
    }
    Ok(())
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
    fn reads_effective_capabilities() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n";
        assert_eq!(parse_cap_eff(status), Some(0x1ff_ffff_ffff));
        assert_eq!(parse_cap_eff("Name: x\n"), None);
    }
}
