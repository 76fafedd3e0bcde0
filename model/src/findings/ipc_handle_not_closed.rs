//! `ipc_handle_not_closed`: a process opened another process's memory through an IPC handle and
//! exited (or the capture ended) without closing it. One finding per importer and exporter.

use std::collections::BTreeMap;

use super::{wording, Diagnosis, Finding, FindingKind};
use crate::event::{Event, Layer, Op};
use crate::track::{Import, ProcessMemory, Tracker};

/// At an exit or exec, before the tracker closes the table.
pub(crate) fn at_exit(event: &Event, world: &Tracker) -> Vec<Finding> {
    if event.layer != Layer::Process || !matches!(event.op, Op::Exit | Op::Exec) {
        return Vec::new();
    }
    match world.process(event.pid) {
        Some(process) => unclosed(process, event.ts, "exited without closing"),
        None => Vec::new(),
    }
}

/// At the end of the capture window: imports of live processes still open.
pub(crate) fn at_end(ts: u64, world: &Tracker) -> Vec<Finding> {
    world
        .live_processes()
        .into_iter()
        .flat_map(|process| unclosed(process, ts, "still had open, when the capture ended,"))
        .collect()
}

fn unclosed(process: &ProcessMemory, ts: u64, what: &str) -> Vec<Finding> {
    let mut by_exporter: BTreeMap<Option<u32>, Vec<&Import>> = BTreeMap::new();
    for import in process.imports() {
        by_exporter.entry(import.exporter.map(|e| e.pid)).or_default().push(import);
    }
    by_exporter
        .into_iter()
        .map(|(exporter, imports)| {
            let first = imports[0];
            let bytes: u64 = imports.iter().map(|i| i.mapping.size).sum();
            let count = imports.len() as u64;
            let whose = match exporter {
                Some(pid) => format!("pid {pid}'s memory"),
                None => "memory of a process gpuprof did not see export it".to_string(),
            };
            let detail = format!(
                "{} {what} {} ({}) of {whose}, opened by {} {}: close it (cuIpcCloseMemHandle; in PyTorch, drop the shared tensor in the worker) so the exporter can release the memory.",
                wording::process(process.pid, &process.comm),
                wording::count(count, "IPC mapping", "IPC mappings"),
                wording::bytes(bytes),
                first.mapping.api,
                wording::at(&first.mapping.stack),
            );
            let mut finding = Finding::new(
                FindingKind::IpcHandleNotClosed,
                process.pid,
                &process.comm,
                bytes,
                count,
                first.mapping.ts,
                ts,
                &first.mapping.stack,
                detail,
            );
            finding.peer_pid = exporter;
            finding.api = Some(first.mapping.api.to_string());
            finding.diagnosis = Some(Diagnosis::IpcHandleNotReleased);
            finding
        })
        .collect()
}
