//! Live bytes by Python stack as folded lines (root first: process, kind, outermost frame … innermost
//! frame, then bytes) and as a flame graph.

use std::collections::BTreeMap;
use std::io::Write;

use anyhow::{Context, Result};
use gpuprof_model::event::Frame;
use gpuprof_model::track::{Allocation, ProcessMemory, Tracker};

use super::request::StackLayer;

/// Live bytes of one (process, kind, stack).
pub(crate) struct LiveStack<'a> {
    pub pid: u32,
    pub comm: &'a str,
    /// "tensors" for allocator blocks, else the driver allocation's kind.
    pub kind: &'a str,
    /// Innermost frame first, as events carry it.
    pub stack: &'a [Frame],
    pub bytes: u64,
}

/// Every (process, kind, stack) holding live bytes, by process then stack.
pub(crate) fn stacks(tracker: &Tracker, layer: StackLayer, include_exited: bool) -> Vec<LiveStack<'_>> {
    let processes: Vec<&ProcessMemory> = if include_exited { tracker.processes() } else { tracker.live_processes() };
    let mut totals: BTreeMap<(u32, &str, &[Frame]), (&str, u64)> = BTreeMap::new();
    for process in processes {
        let use_blocks = layer.counts_tensors(process);
        let live: Vec<&Allocation> = if use_blocks { process.blocks() } else { process.allocations() };
        for allocation in live {
            let kind = if use_blocks { "tensors" } else { allocation.kind.as_str() };
            totals.entry((process.pid, kind, &allocation.stack)).or_insert((&process.comm, 0)).1 += allocation.size;
        }
    }
    totals.into_iter().map(|((pid, kind, stack), (comm, bytes))| LiveStack { pid, comm, kind, stack, bytes }).collect()
}

/// One folded line per stack as it reads (two files of one base name are one frame), sorted.
pub(crate) fn lines(stacks: &[LiveStack<'_>]) -> Vec<String> {
    let mut totals: BTreeMap<String, u64> = BTreeMap::new();
    for s in stacks {
        *totals.entry(format!("pid {} {};{};{}", s.pid, clean(s.comm), s.kind, path(s.stack))).or_default() += s.bytes;
    }
    totals.into_iter().map(|(stack, bytes)| format!("{stack} {bytes}")).collect()
}

/// Outermost first; "(no Python stack)" for a thread without one.
fn path(stack: &[Frame]) -> String {
    if stack.is_empty() {
        return "(no Python stack)".to_string();
    }
    stack.iter().rev().map(frame_name).collect::<Vec<_>>().join(";")
}

/// "forward (model.py:12)", as flame graphs and speedscope name a frame.
pub(crate) fn frame_name(frame: &Frame) -> String {
    format!(
        "{} ({}:{})",
        clean(&frame.function),
        clean(frame.file.rsplit('/').next().unwrap_or(&frame.file)),
        frame.line
    )
}

/// Folded lines use ';' between frames and ' ' before the count.
fn clean(text: &str) -> String {
    text.replace([';', '\n'], ":")
}

pub(crate) fn flamegraph(lines: &[String], title: String, writer: &mut dyn Write) -> Result<()> {
    let mut options = inferno::flamegraph::Options::default();
    options.title = title;
    options.count_name = "bytes".to_string();
    options.name_type = "Stack:".to_string();
    inferno::flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), writer)
        .context("cannot draw the flame graph")
}
