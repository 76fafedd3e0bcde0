//! What ties an IPC import to its export: the handle bytes for legacy handles, pool export data
//! and fabric handles; the kernel file object for POSIX-fd shareable handles (the fd numbers
//! differ between processes, the file does not).

use super::space::Space;
use crate::event::{Event, Kind, Op};

#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ExportKey {
    /// `cuIpcGetMemHandle` / `cuIpcOpenMemHandle`: the 64-byte handle.
    Legacy(Vec<u8>),
    /// `cuMemPoolExportPointer` / `cuMemPoolImportPointer`: the 64-byte export data.
    Pool(Vec<u8>),
    /// VMM shareable handles passed as bytes (fabric, win32).
    Shareable(Vec<u8>),
    /// VMM shareable handles passed as a POSIX fd: the kernel file behind it.
    FileObject(u64),
}

impl ExportKey {
    /// The key an `ipc_export` or `ipc_open` event names, if it names one.
    pub(crate) fn of(event: &Event) -> Option<ExportKey> {
        if !matches!(event.op, Op::IpcExport | Op::IpcOpen) {
            return None;
        }
        match event.kind? {
            Kind::Vmm if event.handle_type.as_deref() == Some("posix_fd") => {
                event.handle_object.map(ExportKey::FileObject)
            }
            Kind::Vmm => event.handle.clone().map(ExportKey::Shareable),
            Kind::Pool => event.handle.clone().map(ExportKey::Pool),
            _ => event.handle.clone().map(ExportKey::Legacy),
        }
    }
}

/// One process instance: a pid and when that instance was first seen (pids are reused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ProcessRef {
    pub pid: u32,
    pub since: u64,
}

/// Memory a process made available to others.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Export {
    pub exporter: ProcessRef,
    /// The exported allocation: a device pointer, or a VMM handle.
    pub space: Space,
    pub addr: u64,
    pub size: u64,
    pub ts: u64,
}
