//! `gpuprof report`: the leak rules over a recorded event file, in the file's order (the order
//! calls completed, as captured).

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use gpuprof_model::findings::{FailOn, FAIL_ON_EXIT};
use gpuprof_model::forward_stacks::ForwardStacks;
use gpuprof_model::rank::Ranks;
use gpuprof_model::{Analyzer, Finding, RuleConfig};

use crate::input;
use crate::output::{self, findings};

/// Output formats of `report`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportFormat {
    /// A JSON array of findings (docs/findings.md).
    Json,
    /// A readable list of findings.
    Table,
}

/// Returns gpuprof's exit code: 0 whenever the report ran, or `FAIL_ON_EXIT` when it found what
/// `fail_on` names (said on stderr).
pub fn run(
    input: &Path,
    format: ReportFormat,
    output_path: Option<&Path>,
    rules: RuleConfig,
    fail_on: Option<FailOn>,
) -> Result<u8> {
    let mut analyzer = Analyzer::new(rules);
    // A shim's own file has no forward lines yet.
    let mut forward_stacks = ForwardStacks::default();
    // Findings name ranks as the live capture did: the file has each on its process's first call.
    let mut ranks = Ranks::default();
    let mut found: Vec<Finding> = Vec::new();
    input::for_each_event(input, |mut event| {
        forward_stacks.follow(&mut event);
        ranks.observe(&event);
        let mut fired = analyzer.observe(&mut event);
        ranks.name(&mut fired);
        found.extend(fired);
        Ok(())
    })?;
    let mut ended = analyzer.finish();
    ranks.name(&mut ended);
    found.extend(ended);

    let mut writer = output::open_writer(output_path)?;
    match format {
        ReportFormat::Json => findings::write_json(&mut writer, &found),
        ReportFormat::Table => {
            output::write_live_summary(&mut writer, &analyzer.tracker().summaries()).and_then(|_| {
                findings::write_table(&mut writer, &found, output_path.is_none() && output::colour::on_stdout())
            })
        }
    }
    .and_then(|_| writer.flush())
    .context("cannot write the report")?;
    match fail_on.and_then(|f| f.verdict(&found)) {
        Some(said) => {
            eprintln!("gpuprof: {said}");
            Ok(FAIL_ON_EXIT)
        }
        None => Ok(0),
    }
}
