//! The doctor's report written out: a line per check for a person (✓, ✗ with its fix on the
//! same line, – for what does not apply), or one JSON document.

use std::io::Write;

use super::{Report, Status};

pub(super) fn table(report: &Report, out: &mut impl Write) -> std::io::Result<()> {
    let width = report.checks.iter().map(|check| check.name.len()).max().unwrap_or(0);
    for check in &report.checks {
        let mark = match check.status {
            Status::Ok => '✓',
            Status::Fail => '✗',
            Status::NotApplicable => '–',
        };
        write!(out, "{mark} {:<width$}  {}", check.name, check.detail)?;
        match &check.fix {
            Some(fix) => writeln!(out, "; fix: {fix}")?,
            None => writeln!(out)?,
        }
    }
    writeln!(out, "{}", report.verdict.line)
}

pub(super) fn json(report: &Report, out: &mut impl Write) -> std::io::Result<()> {
    serde_json::to_writer_pretty(&mut *out, report)?;
    writeln!(out)
}
