//! Reading a recorded event file (jsonl, as `attach`/`run` write it): line by line, every line
//! an event, a corrupt or truncated file an error naming the line.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;

use anyhow::{anyhow, Context, Result};
use gpuprof_model::Event;

/// Calls `each` with every event of the file, in order.
pub fn for_each_event(input: &Path, mut each: impl FnMut(Event) -> Result<()>) -> Result<()> {
    let file = File::open(input).with_context(|| format!("cannot read {}", input.display()))?;
    for (index, line) in BufReader::new(file).lines().enumerate() {
        let number = index + 1;
        let line = line.with_context(|| format!("cannot read {} at line {number}", input.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let event: Event = serde_json::from_str(&line).map_err(|e| {
            anyhow!("{}:{number}: not a gpuprof event ({e}); the file is corrupt or truncated", input.display())
        })?;
        each(event)?;
    }
    Ok(())
}
