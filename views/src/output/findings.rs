//! Findings for people (a list with the sentence and the stack) and for programs (a JSON array
//! in the contract of docs/findings.md).

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use anyhow::{Context, Result};
use gpuprof_model::bytes::human;
use gpuprof_model::{Finding, Severity};

use super::text::{fit, wrap, COLUMNS};

/// The readable list: leaks first, then facts (`info`), each in the order they fired; `colour`
/// paints each severity (for a terminal).
pub fn write_table(writer: &mut dyn Write, findings: &[Finding], colour: bool) -> io::Result<()> {
    writeln!(writer)?;
    if findings.is_empty() {
        return writeln!(writer, "Findings: none.");
    }
    let leaks = findings.iter().filter(|f| f.severity == Severity::Leak).count();
    writeln!(
        writer,
        "Findings ({}, {} info):",
        gpuprof_model::findings::wording::count(leaks as u64, "leak", "leaks"),
        findings.len() - leaks
    )?;
    let ordered = findings
        .iter()
        .filter(|f| f.severity == Severity::Leak)
        .chain(findings.iter().filter(|f| f.severity != Severity::Leak));
    for finding in ordered {
        let peer = finding.peer_pid.map(|p| format!(" peer {p}")).unwrap_or_default();
        let rank = finding.rank.map(|r| format!(" (rank {r})")).unwrap_or_default();
        writeln!(
            writer,
            "  {} {} pid {}{rank}{peer}: {} in {} (id {})",
            finding.kind.as_str(),
            super::colour::severity(&format!("[{}]", finding.severity.as_str()), finding.severity, colour),
            finding.pid,
            human(finding.bytes),
            finding.count,
            finding.finding_id,
        )?;
        if let Some(diagnosis) = finding.diagnosis {
            writeln!(writer, "    why: {}{}", diagnosis.as_str(), time_to_full(finding))?;
        }
        if let Some(user) = &finding.user_frame {
            writeln!(writer, "{}", fit(&format!("    your line: {user}"), COLUMNS))?;
        }
        for line in wrap(&finding.detail, COLUMNS, "    ") {
            writeln!(writer, "{line}")?;
        }
        for frame in &finding.stack {
            writeln!(writer, "{}", fit(&format!("      {frame}"), COLUMNS))?;
        }
    }
    Ok(())
}

/// ", device full in about 4 minutes" for a growth that says when.
fn time_to_full(finding: &Finding) -> String {
    match (finding.bytes_per_second, finding.seconds_to_full) {
        (Some(rate), Some(left)) => {
            format!(" (at {}/s, device full {})", human(rate as u64), gpuprof_model::findings::wording::within(left))
        }
        _ => String::new(),
    }
}

/// The JSON array.
pub(crate) fn write_json(writer: &mut dyn Write, findings: &[Finding]) -> io::Result<()> {
    serde_json::to_writer_pretty(&mut *writer, findings)?;
    writeln!(writer)
}

/// The JSON array, to a file.
pub(crate) fn save_json(path: &Path, findings: &[Finding]) -> Result<()> {
    let file = File::create(path).with_context(|| format!("cannot create findings file {}", path.display()))?;
    let mut writer = BufWriter::new(file);
    write_json(&mut writer, findings)
        .and_then(|_| writer.flush())
        .with_context(|| format!("cannot write {}", path.display()))
}
