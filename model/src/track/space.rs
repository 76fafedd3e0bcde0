//! The address spaces allocations live in, which both a process's table and the IPC exports
//! between processes key by.

use crate::event::Kind;

/// The address spaces allocations live in: device/host pointers and VMM handles are different
/// namespaces even when the numbers coincide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Space {
    Pointer,
    VmmHandle,
}

impl Space {
    pub fn of(kind: Kind) -> Space {
        if kind == Kind::Vmm {
            Space::VmmHandle
        } else {
            Space::Pointer
        }
    }
}
