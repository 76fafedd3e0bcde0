//! What eBPF capture needs from this kernel and this process: the release, BTF, uprobes, each
//! kernel feature the probes use, and the capabilities — asked of `gpuprof_capture::preflight`,
//! which refuses a capture on the same answers.

use gpuprof_capture::preflight::{self, KERNEL_FEATURES};

use super::Check;

/// What this process may do, read once: the capabilities it lacks, or why that is unknown.
pub(super) struct Privileges {
    uid: u32,
    missing: Result<Vec<&'static str>, String>,
}

impl Privileges {
    pub(super) fn here() -> Privileges {
        // SAFETY: geteuid cannot fail and touches no memory.
        let uid = unsafe { libc::geteuid() };
        Privileges { uid, missing: preflight::missing_capabilities().map_err(|e| format!("{e:#}")) }
    }

    /// Whether it may load BPF programs, which probing a kernel feature does.
    fn may_load_bpf(&self) -> bool {
        self.missing.as_ref().is_ok_and(|missing| !missing.contains(&"CAP_BPF"))
    }

    /// Whether it may read every process's maps and memory.
    pub(super) fn sees_every_process(&self) -> bool {
        self.missing.as_ref().is_ok_and(|missing| !missing.contains(&"CAP_SYS_PTRACE"))
    }

    pub(super) fn uid(&self) -> u32 {
        self.uid
    }
}

/// The kernel's release, the privileges, BTF, uprobes, then each feature, newest first.
pub(super) fn checks(privileges: &Privileges) -> Vec<Check> {
    let mut checks =
        vec![Check::ok("kernel", format!("Linux {}", preflight::kernel_release())), privileges_check(privileges)];
    checks.push(if preflight::has_btf() {
        Check::ok("btf", preflight::BTF_PATH)
    } else {
        Check::fail(
            "btf",
            format!("{} is missing", preflight::BTF_PATH),
            "run a kernel built with CONFIG_DEBUG_INFO_BTF=y (the default of current distributions' kernels)",
        )
        .stopping_ebpf("no BTF")
    });
    checks.push(if preflight::has_uprobes() {
        Check::ok("uprobes", preflight::UPROBE_PMU)
    } else {
        Check::fail(
            "uprobes",
            format!("{} is missing", preflight::UPROBE_PMU),
            "run a kernel built with CONFIG_UPROBE_EVENTS=y",
        )
        .stopping_ebpf("no uprobes")
    });
    for feature in &KERNEL_FEATURES {
        let name = feature.name;
        let what = format!("{} (Linux {})", feature.what, feature.since);
        checks.push(if !privileges.may_load_bpf() {
            // Probing loads a program, which the kernel refuses without CAP_BPF before its
            // verifier looks at the call: such a probe cannot tell yes from no.
            Check::not_applicable(name, format!("{what}: not probed, probing loads a BPF program (CAP_BPF)"))
        } else {
            match feature.probe() {
                Some(true) => Check::ok(name, what),
                Some(false) => Check::fail(
                    name,
                    format!("this kernel lacks {what}"),
                    format!(
                        "run Linux {} or newer (or a kernel with it backported), or capture without eBPF: `gpuprof run --via shim -- CMD`",
                        feature.since
                    ),
                )
                .stopping_ebpf(format!("the kernel lacks {}", feature.name)),
                None => Check::not_applicable(name, format!("{what}: the probe could not tell; loading the probes will")),
            }
        });
    }
    checks
}

fn privileges_check(privileges: &Privileges) -> Check {
    let uid = privileges.uid;
    match &privileges.missing {
        Ok(missing) if missing.is_empty() => {
            let who = if uid == 0 { "uid 0 (root)".to_string() } else { format!("uid {uid}") };
            Check::ok("privileges", format!("{who} with CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE"))
        }
        Ok(missing) => {
            let missing = missing.join(", ");
            Check::fail(
                "privileges",
                format!("uid {uid} without {missing}: shim only (eBPF probes need them)"),
                preflight::PRIVILEGES_FIX,
            )
            .stopping_ebpf(format!("missing {missing}"))
        }
        Err(error) => {
            Check::fail("privileges", error.clone(), "mount /proc (gpuprof reads CapEff from /proc/self/status)")
                .stopping_ebpf("privileges unknown")
        }
    }
}
