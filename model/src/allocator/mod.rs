//! PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp, 2.x), as a model: given
//! the requests a job made, in order, it says which segments the allocator would have asked the
//! driver for, how much it would have reserved, and whether and why it would have run out — under
//! the settings the job ran with, or any others. It is the ground of `gpuprof whatif` (docs/whatif.md), and of
//! planning a size before running (`scale`).
//!
//! What it follows, each in the function named after PyTorch's: the small (<= 1 MiB) and large
//! pools, request rounding (`round_size`, `roundup_power2_next_division`), segment sizes
//! (`get_allocation_size`), best fit (`get_free_block`), splitting (`should_split`), merging on
//! free (`free_block`, `try_merge_blocks`), the retries on a failed device allocation
//! (`alloc_block`, `release_available_cached_blocks`, `release_cached_blocks`),
//! `garbage_collection_threshold` (`garbage_collect_cached_blocks`), `empty_cache` and
//! `expandable_segments` (`try_allocate_expandable_block`, `map_block`, `unmap_block`).
//!
//! What it leaves out: streams other than the default one (blocks freed on another stream, and
//! `record_stream`'s deferred frees), CUDA graphs' private pools, the free-memory callbacks, and
//! other processes on the device. The device is a byte budget (`device_capacity`): the driver's own
//! reservations and cudaMalloc's page granularity are the caller's to subtract. cudaMalloc's
//! addresses are not known, so segments are laid out in creation order; where two free blocks
//! of equal size tie for best fit, the older segment's wins, which real addresses may not.
//! A recording names neither streams nor pools: where they changed what the allocator did, the
//! replay check parts from the recording (`replay_check`), and nothing is predicted.

mod caching;
mod config;
mod replay;
mod scale;
#[cfg(test)]
mod scale_tests;
#[cfg(test)]
mod tests;
mod trace;
#[cfg(test)]
mod trace_tests;
mod whatif;

pub use caching::{CachingAllocator, OutOfMemory, Outcome, SegmentInfo, UnknownRequest};
#[cfg(test)]
use config::ROUNDUP_INTERVALS;
pub use config::{settings_in_environment, AllocatorConfig, ConfigError, SETTINGS_VARIABLES};
#[cfg(test)]
use replay::replay_check;
pub use replay::{replay, Divergence, Recorded, Replay, Request};
use replay::{replay_at, replay_checked};
pub use scale::{Largest, PlanError, Planned, Reach, ScaleError, ScalePoint, Scaled, Scaling, LARGEST_TRIED};
pub use trace::{traces, AllocatorTrace, Origin, TraceBuilder};
pub use whatif::{Budget, NonAllocatorSource, Prediction, RecordedRun, SettingsSource, WhatifError, USUAL_SETTINGS};

pub const MIB: u64 = 1 << 20;
/// All sizes are rounded to at least this (`kMinBlockSize`).
pub(crate) const K_MIN_BLOCK_SIZE: u64 = 512;
/// The largest request served from the small pool (`kSmallSize`).
pub(crate) const K_SMALL_SIZE: u64 = MIB;
/// Small-pool segments, and expandable small-pool pages (`kSmallBuffer`).
pub(crate) const K_SMALL_BUFFER: u64 = 2 * MIB;
/// Requests below this share 20 MiB segments (`kMinLargeAlloc`).
pub(crate) const K_MIN_LARGE_ALLOC: u64 = 10 * MIB;
/// Large-pool segments for requests under 10 MiB, and expandable large-pool pages
/// (`kLargeBuffer`).
pub(crate) const K_LARGE_BUFFER: u64 = 20 * MIB;
/// Larger requests get segments rounded up to this (`kRoundLarge`).
pub(crate) const K_ROUND_LARGE: u64 = 2 * MIB;

/// `DeviceCachingAllocator::round_size`: the block size a request is served with.
pub(crate) fn round_size(size: u64, config: &AllocatorConfig) -> u64 {
    if size < K_MIN_BLOCK_SIZE {
        return K_MIN_BLOCK_SIZE;
    }
    let divisions = config.divisions_for(size);
    if divisions > 1 && size > K_MIN_BLOCK_SIZE * divisions {
        roundup_power2_next_division(size, divisions)
    } else {
        size.div_ceil(K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE
    }
}

/// `roundup_power2_next_division`: the next of `divisions` equal steps between the powers of two
/// around `size`.
pub(crate) fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> (63 - divisions.leading_zeros());
    if step == 0 {
        return floor << 1;
    }
    let rounded_down = size & !(step - 1);
    if rounded_down == size {
        size
    } else {
        rounded_down + step
    }
}

/// `get_pool`: whether a rounded size is served from the small pool.
pub(crate) fn is_small(rounded: u64) -> bool {
    rounded <= K_SMALL_SIZE
}

/// `get_allocation_size`: the segment a rounded size asks the driver for when nothing cached fits.
pub(crate) fn allocation_size(rounded: u64) -> u64 {
    if rounded <= K_SMALL_SIZE {
        K_SMALL_BUFFER
    } else if rounded < K_MIN_LARGE_ALLOC {
        K_LARGE_BUFFER
    } else {
        rounded.div_ceil(K_ROUND_LARGE) * K_ROUND_LARGE
    }
}

/// `should_split`: whether handing out `size` bytes of a `block_size` block leaves a remainder
/// worth keeping as a block of its own. Large-pool blocks keep small tails attached so that a
/// segment is not cut into pieces nobody can use.
pub(crate) fn should_split(block_size: u64, size: u64, small_pool: bool, config: &AllocatorConfig) -> bool {
    let remaining = block_size - size;
    if small_pool || config.expandable_segments {
        remaining >= K_MIN_BLOCK_SIZE
    } else {
        size < config.max_split_size && remaining > K_SMALL_SIZE
    }
}
