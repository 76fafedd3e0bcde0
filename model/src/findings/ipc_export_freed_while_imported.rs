//! `ipc_export_freed_while_imported`: an exporter freed (or lost, by exiting) a buffer that
//! another process still had open through a legacy IPC handle or pool export. VMM shareable
//! handles are left out: the importer's handle keeps that memory alive by design.

use super::{wording, Finding, FindingKind};
use crate::event::{Event, Layer, Op};
use crate::track::{Export, ExportKey, ProcessMemory, Tracker};

/// Looks at a free, exit or exec before the tracker applies it.
pub(crate) fn check(event: &Event, world: &Tracker) -> Vec<Finding> {
    let Some(exporter) = world.process(event.pid) else { return Vec::new() };
    let (addr, how) = match (event.layer, event.op) {
        (Layer::Process, Op::Exit) => (None, "exited, losing".to_string()),
        (Layer::Process, Op::Exec) => (None, "exec'd, losing".to_string()),
        (Layer::Driver, Op::Free) => match exporter.released_by(event) {
            Some(allocation) => {
                (Some(allocation.addr), format!("freed ({} {})", event.api, wording::at(&event.attributed_stack())))
            }
            None => return Vec::new(),
        },
        _ => return Vec::new(),
    };
    world
        .exports_of(exporter.as_ref(), addr)
        .into_iter()
        .filter(|(key, _)| matches!(key, ExportKey::Legacy(_) | ExportKey::Pool(_)))
        .flat_map(|(key, export)| {
            world
                .importers_of(key, exporter.as_ref())
                .into_iter()
                .map(|(importer, _)| finding(exporter, export, importer, event, &how))
                .collect::<Vec<_>>()
        })
        .collect()
}

fn finding(exporter: &ProcessMemory, export: &Export, importer: &ProcessMemory, event: &Event, how: &str) -> Finding {
    let allocation = exporter.allocation(export.space, export.addr);
    let stack = allocation.map(|a| a.stack.to_vec()).unwrap_or_default();
    let detail = format!(
        "{} {how} {} at {:#x} that it had exported to {}, which still had it open: the importer now uses freed memory; keep the buffer until every importer has closed it.",
        wording::process(exporter.pid, &exporter.comm),
        wording::bytes(export.size),
        export.addr,
        wording::process(importer.pid, &importer.comm),
    );
    let mut finding = Finding::new(
        FindingKind::IpcExportFreedWhileImported,
        exporter.pid,
        &exporter.comm,
        export.size,
        1,
        export.ts,
        event.ts,
        &stack,
        detail,
    );
    finding.peer_pid = Some(importer.pid);
    finding.api = allocation.map(|a| a.api.to_string());
    finding
}
