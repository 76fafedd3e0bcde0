//! Live bytes by stack in speedscope's file format (www.speedscope.app/file-format-schema.json):
//! one "sampled" profile per process, whose samples are the stacks (outermost frame first, the
//! memory's kind as the root) weighted by their bytes.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;

use anyhow::{Context, Result};
use serde_json::{json, Value};

use super::folded::{frame_name, LiveStack};

pub(crate) fn write(stacks: &[LiveStack<'_>], title: &str, writer: &mut dyn Write) -> Result<()> {
    let mut frames: Vec<Value> = Vec::new();
    let mut index: HashMap<(String, String, u32), usize> = HashMap::new();
    let mut frame_of = |name: String, file: &str, line: u32| -> usize {
        *index.entry((name.clone(), file.to_string(), line)).or_insert_with(|| {
            frames.push(if file.is_empty() {
                json!({ "name": name })
            } else {
                json!({ "name": name, "file": file, "line": line })
            });
            frames.len() - 1
        })
    };
    // Per process: samples (frame indices, root first) and their weights.
    type Samples = (Vec<Vec<usize>>, Vec<u64>);
    let mut by_process: BTreeMap<(u32, &str), Samples> = BTreeMap::new();
    for stack in stacks {
        let mut sample = vec![frame_of(stack.kind.to_string(), "", 0)];
        if stack.stack.is_empty() {
            sample.push(frame_of("(no Python stack)".to_string(), "", 0));
        }
        sample.extend(stack.stack.iter().rev().map(|f| frame_of(frame_name(f), &f.file, f.line)));
        let (samples, weights) = by_process.entry((stack.pid, stack.comm)).or_default();
        samples.push(sample);
        weights.push(stack.bytes);
    }
    let profiles: Vec<Value> = by_process
        .into_iter()
        .map(|((pid, comm), (samples, weights))| {
            let total: u64 = weights.iter().sum();
            json!({
                "type": "sampled",
                "name": format!("pid {pid} {comm}"),
                "unit": "bytes",
                "startValue": 0,
                "endValue": total,
                "samples": samples,
                "weights": weights,
            })
        })
        .collect();
    let document = json!({
        "$schema": "https://www.speedscope.app/file-format-schema.json",
        "name": title,
        "exporter": concat!("gpuprof ", env!("CARGO_PKG_VERSION")),
        "activeProfileIndex": 0,
        "shared": { "frames": frames },
        "profiles": profiles,
    });
    serde_json::to_writer(&mut *writer, &document).context("cannot write the speedscope file")?;
    writeln!(writer).context("cannot write the speedscope file")
}
