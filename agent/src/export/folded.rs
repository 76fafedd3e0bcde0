//! Live bytes by Python stack as folded lines (root first: process, kind, outermost frame … innermost
//! frame, then bytes) and as a flame graph.

use std::collections::BTreeMap;
use std::io::Write;

use anyhow::{Context, Result};
use gpuprof_model::event::Frame;
use gpuprof_model::track::{Allocation, ProcessMemory, Tracker};

use super::StackLayer;

/// One line per (process, kind, stack) with live bytes, sorted.
pub fn lines(tracker: &Tracker, layer: StackLayer, include_exited: bool) -> Vec<String> {
    let processes: Vec<&ProcessMemory> = if include_exited { tracker.processes() } else { tracker.live_processes() };
    let mut totals: BTreeMap<String, u64> = BTreeMap::new();
    for process in processes {
        let use_blocks = match layer {
            StackLayer::Allocator => true,
            StackLayer::Driver => false,
            StackLayer::Auto => !process.allocator_totals().is_empty(),
        };
        let (what, live): (&str, Vec<&Allocation>) =
            if use_blocks { ("tensors", process.blocks()) } else { ("", process.allocations()) };
        for allocation in live {
            let kind = if what.is_empty() { allocation.kind.as_str() } else { what };
            let key = format!("pid {} {};{kind};{}", process.pid, clean(&process.comm), path(&allocation.stack));
            *totals.entry(key).or_default() += allocation.size;
        }
    }
    totals.into_iter().map(|(stack, bytes)| format!("{stack} {bytes}")).collect()
}

/// Outermost first; "(no Python stack)" for a thread without one.
fn path(stack: &[Frame]) -> String {
    if stack.is_empty() {
        return "(no Python stack)".to_string();
    }
    stack
        .iter()
        .rev()
        .map(|f| format!("{} ({}:{})", clean(&f.function), clean(f.file.rsplit('/').next().unwrap_or(&f.file)), f.line))
        .collect::<Vec<_>>()
        .join(";")
}

/// Folded lines use ';' between frames and ' ' before the count.
fn clean(text: &str) -> String {
    text.replace([';', '\n'], ":")
}

pub fn flamegraph(lines: &[String], title: String, writer: &mut dyn Write) -> Result<()> {
    let mut options = inferno::flamegraph::Options::default();
    options.title = title;
    options.count_name = "bytes".to_string();
    options.name_type = "Stack:".to_string();
    inferno::flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), writer)
        .context("cannot draw the flame graph")
}
