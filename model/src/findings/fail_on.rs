//! `--fail-on`: which findings make `report`, `run` and `attach` exit non-zero, so that a CI job
//! can gate on them as it gates on a linter's or a test tool's exit status.

use super::{Finding, FindingKind, Severity};

/// The exit status when findings of the kinds `--fail-on` names were made (and the command a run
/// started exited 0): apart from 1 (gpuprof could not do what was asked) and 2 (a usage error).
pub const FAIL_ON_EXIT: u8 = 3;

/// The findings that fail a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailOn {
    /// Memory held that should not be: every finding that asks for action but an out-of-memory.
    Leak,
    /// An out-of-memory failure.
    Oom,
    /// Any finding that asks for action (never an `info` one: a process exiting with its
    /// allocator's cache, say).
    Any,
}

impl FailOn {
    pub fn fails(self, finding: &Finding) -> bool {
        let acts = finding.severity == Severity::Leak;
        match self {
            FailOn::Leak => acts && finding.kind != FindingKind::Oom,
            FailOn::Oom => finding.kind == FindingKind::Oom,
            FailOn::Any => acts,
        }
    }

    /// The exit status for `findings`: `FAIL_ON_EXIT` when one of them fails the run, else 0;
    /// with the line that says why.
    pub fn verdict(self, findings: &[Finding]) -> Option<String> {
        let failing = findings.iter().filter(|f| self.fails(f)).count();
        (failing > 0).then(|| {
            format!(
                "{} matched --fail-on {}: exit status {FAIL_ON_EXIT}",
                super::wording::count(failing as u64, "finding", "findings"),
                self.as_str()
            )
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            FailOn::Leak => "leak",
            FailOn::Oom => "oom",
            FailOn::Any => "any",
        }
    }
}
