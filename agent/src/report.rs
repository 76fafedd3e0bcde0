//! `gpuprof report`: the leak rules over a recorded event file, in the file's order (the order
//! calls completed, as captured). The file is read line by line and every line must be an
//! event: a corrupt or truncated file is an error naming the line.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;

use anyhow::{Context, Result};
use gpuprof_model::{Analyzer, Event, Finding};

use crate::cli::{ReportFormat, RuleArgs};
use crate::output::{self, findings};

/// Returns gpuprof's exit code: 0 whenever the report ran, whatever it found.
pub fn run(input: &Path, format: ReportFormat, output_path: Option<&Path>, rules: &RuleArgs) -> Result<u8> {
    let mut analyzer = Analyzer::new(rules.config()?);
    let file = File::open(input).with_context(|| format!("cannot read {}", input.display()))?;
    let mut found: Vec<Finding> = Vec::new();
    for (index, line) in BufReader::new(file).lines().enumerate() {
        let number = index + 1;
        let line = line.with_context(|| format!("cannot read {} at line {number}", input.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let mut event: Event = serde_json::from_str(&line).map_err(|e| {
            anyhow::anyhow!("{}:{number}: not a gpuprof event ({e}); the file is corrupt or truncated", input.display())
        })?;
        found.extend(analyzer.observe(&mut event));
    }
    found.extend(analyzer.finish());

    let mut writer = output::open_writer(output_path)?;
    match format {
        ReportFormat::Json => findings::write_json(&mut writer, &found),
        ReportFormat::Table => {
            output::write_live_summary(&mut writer, &analyzer.tracker().summaries()).and_then(|_| findings::write_table(&mut writer, &found))
        }
    }
    .and_then(|_| writer.flush())
    .context("cannot write the report")?;
    Ok(0)
}
