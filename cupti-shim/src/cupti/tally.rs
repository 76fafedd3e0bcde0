//! Counts of memory operations by the memory kind CUPTI's activity records name
//! (`CUpti_ActivityMemoryKind`), kept for both sides of the cross-check: what the callbacks saw
//! and what the activity records said.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use gpuprof_model::event::{Kind, Op};

/// `CUpti_ActivityMemoryKind` values 0..=7, by name.
pub const MEMORY_KINDS: [&str; 8] =
    ["unknown", "pageable", "pinned", "device", "array", "managed", "device_static", "managed_static"];
pub const PINNED: usize = 2;
pub const DEVICE: usize = 3;
pub const MANAGED: usize = 5;
/// The kinds a driver entry point of gpuprof's table allocates, compared in groups: one
/// cuMemFree releases device and managed memory alike, so those two are compared together.
pub const COMPARED: [(&str, &[usize]); 2] = [("device and managed", &[DEVICE, MANAGED]), ("pinned host", &[PINNED])];

/// Allocations and releases of a group of kinds.
pub fn group_sum(counts: &Counts, kinds: &[usize]) -> [u64; 2] {
    kinds.iter().fold([0, 0], |[a, r], &kind| [a + counts[kind][0], r + counts[kind][1]])
}

/// Allocations and releases per memory kind.
pub struct Tally([[AtomicU64; 2]; MEMORY_KINDS.len()]);

/// A tally's values at one moment.
pub type Counts = [[u64; 2]; MEMORY_KINDS.len()];

impl Tally {
    pub const fn new() -> Tally {
        Tally([const { [AtomicU64::new(0), AtomicU64::new(0)] }; MEMORY_KINDS.len()])
    }

    /// One operation: `release` false for an allocation.
    pub fn add(&self, memory_kind: usize, release: bool) {
        if let Some(kind) = self.0.get(memory_kind) {
            kind[usize::from(release)].fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn counts(&self) -> Counts {
        std::array::from_fn(|kind| [0, 1].map(|op| self.0[kind][op].load(Ordering::Relaxed)))
    }
}

/// How a successful driver call counts in the activity records: (memory kind, is a release), or
/// None for calls CUPTI's memory records do not report. Seen on an H100 machine: VMM handles
/// (cuMemCreate/cuMemRelease) and opened IPC handles count as device memory; a free of the null
/// pointer (cuBLAS makes one) has no record.
pub fn counted_as(kind: Option<Kind>, op: Op, addr: u64) -> Option<(usize, bool)> {
    let memory_kind = match kind? {
        Kind::Device | Kind::Pool | Kind::Vmm => DEVICE,
        Kind::HostPinned => PINNED,
        Kind::Managed => MANAGED,
    };
    match op {
        Op::Alloc => Some((memory_kind, false)),
        Op::Free if addr != 0 => Some((memory_kind, true)),
        Op::IpcOpen if kind == Some(Kind::Device) => Some((DEVICE, false)),
        Op::IpcClose if kind == Some(Kind::Device) => Some((DEVICE, true)),
        _ => None,
    }
}

/// `{"device": [allocations, releases], …}` with the kinds that counted anything.
pub fn by_kind_name(counts: &Counts) -> BTreeMap<String, [u64; 2]> {
    MEMORY_KINDS
        .iter()
        .zip(counts)
        .filter(|(_, [allocations, releases])| allocations + releases > 0)
        .map(|(name, pair)| (name.to_string(), *pair))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_calls_count_under_the_memory_kind_cuptis_records_name() {
        assert_eq!(counted_as(Some(Kind::Device), Op::Alloc, 0x7f00_0000_0000), Some((DEVICE, false)));
        assert_eq!(counted_as(Some(Kind::Vmm), Op::Free, 0x1), Some((DEVICE, true)));
        assert_eq!(counted_as(Some(Kind::Pool), Op::Alloc, 0x7f00_0000_0000), Some((DEVICE, false)));
        assert_eq!(counted_as(Some(Kind::HostPinned), Op::Free, 0x5555_0000), Some((PINNED, true)));
        assert_eq!(counted_as(Some(Kind::Managed), Op::Alloc, 0x7f00_0000_0000), Some((MANAGED, false)));
        // cuBLAS frees the null pointer: no record for it.
        assert_eq!(counted_as(Some(Kind::Device), Op::Free, 0), None);
        assert_eq!(counted_as(Some(Kind::Device), Op::IpcOpen, 0x7f00_0000_0000), Some((DEVICE, false)));
        assert_eq!(counted_as(Some(Kind::Device), Op::IpcClose, 0x7f00_0000_0000), Some((DEVICE, true)));
        assert_eq!(counted_as(Some(Kind::Vmm), Op::IpcOpen, 0x3), None);
        assert_eq!(counted_as(Some(Kind::Vmm), Op::Map, 0x7f00_0000_0000), None);
        assert_eq!(counted_as(None, Op::CtxCreate, 0x1), None);
    }

    #[test]
    fn groups_sum_device_and_managed_and_json_lists_what_counted() {
        let tally = Tally::new();
        tally.add(DEVICE, false);
        tally.add(DEVICE, true);
        tally.add(MANAGED, false);
        tally.add(6, false);
        tally.add(99, false); // a kind CUPTI may add later: not counted, no panic
        let counts = tally.counts();
        assert_eq!(group_sum(&counts, COMPARED[0].1), [2, 1]);
        assert_eq!(group_sum(&counts, COMPARED[1].1), [0, 0]);
        assert_eq!(
            serde_json::to_string(&by_kind_name(&counts)).unwrap(),
            r#"{"device":[1,1],"device_static":[1,0],"managed":[1,0]}"#
        );
    }
}
