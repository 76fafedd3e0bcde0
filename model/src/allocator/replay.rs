//! Replaying a job's requests through the model: the reserved curve and its peak under any
//! settings, and the check that must pass first — under the settings the job ran with, the
//! replay has to give back the allocator's own counters at every step, or it says where it first
//! went its own way and nothing it predicts should be trusted.

use super::{AllocatorConfig, CachingAllocator, OutOfMemory};

/// One allocator request, in the order the job made them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    Alloc { id: u64, size: u64 },
    Free { id: u64 },
    EmptyCache,
}

/// What the real allocator reported after a step; `None` where the recording does not say.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recorded {
    pub allocated: Option<u64>,
    pub reserved: Option<u64>,
    /// The step's allocation failed with "CUDA out of memory".
    pub out_of_memory: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    /// Reserved bytes after each step.
    pub reserved: Vec<u64>,
    /// Allocated bytes after each step.
    pub allocated: Vec<u64>,
    pub peak_reserved: u64,
    /// The first step at which reserved reached its peak.
    pub peak_step: Option<usize>,
    /// At that step: bytes allocated, and the largest free block of the cache (the rest of the
    /// cache, reserved less allocated, lies in smaller pieces).
    pub allocated_at_peak: u64,
    pub largest_free_at_peak: u64,
    pub peak_allocated: u64,
    /// Device allocations made (`CachingAllocator::device_allocations`).
    pub device_allocations: u64,
    /// Allocations that failed, by step. The replay goes on past them, as a job that catches the
    /// error would; the failed request's id never becomes live.
    pub out_of_memory: Vec<(usize, OutOfMemory)>,
}

/// Where a replay first parted from the recording.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Divergence {
    #[error(
        "request {step}: the job's allocator reported {} allocated and {} reserved after it, the replay has {} and {}",
        reported(*expected_allocated),
        reported(*expected_reserved),
        sized(*allocated),
        sized(*reserved)
    )]
    Counters {
        step: usize,
        expected_allocated: Option<u64>,
        expected_reserved: Option<u64>,
        allocated: u64,
        reserved: u64,
    },
    #[error("request {step}: the replay ran out of memory where the job did not ({oom})")]
    UnexpectedOutOfMemory { step: usize, oom: OutOfMemory },
    #[error("request {step}: the job ran out of memory where the replay did not")]
    MissedOutOfMemory { step: usize },
    #[error("request {step}: {why}")]
    BadRequest { step: usize, why: String },
    #[error("the replay made {replayed} device allocations for its segments, the job {recorded}")]
    Segments { replayed: u64, recorded: u64 },
    #[error("the recording has {recorded} reports of the allocator's totals for {requests} requests")]
    Length { requests: usize, recorded: usize },
}

/// "770.0 MiB (807,403,520 bytes)": read at a glance, and exact where two differ by little.
fn sized(bytes: u64) -> String {
    let digits = bytes.to_string();
    let mut grouped = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    format!("{} ({grouped} bytes)", crate::bytes::human(bytes))
}

fn reported(bytes: Option<u64>) -> String {
    bytes.map_or_else(|| "nothing".to_string(), sized)
}

/// Runs `requests` through a fresh allocator. Fails only on a request stream the allocator could
/// not have seen: a free of an id that is not live, or an id allocated twice.
pub fn replay(
    config: &AllocatorConfig,
    device_capacity: Option<u64>,
    requests: &[Request],
) -> Result<Replay, Divergence> {
    replay_at(config, device_capacity, requests, &[])
}

/// `replay` with the segments laid at the addresses the job's got (`segment_addresses`:
/// address and size, in the order it made them; `CachingAllocator::with_segment_addresses`),
/// so that ties in best fit go the way they went.
pub(crate) fn replay_at(
    config: &AllocatorConfig,
    device_capacity: Option<u64>,
    requests: &[Request],
    segment_addresses: &[(u64, u64)],
) -> Result<Replay, Divergence> {
    let mut out = Replay::with_capacity(requests.len());
    run(config, device_capacity, requests, segment_addresses, |step, allocator, oom| {
        out.after(step, allocator, oom);
        Ok(())
    })?;
    Ok(out)
}

impl Replay {
    fn with_capacity(steps: usize) -> Self {
        Replay {
            reserved: Vec::with_capacity(steps),
            allocated: Vec::with_capacity(steps),
            peak_reserved: 0,
            peak_step: None,
            allocated_at_peak: 0,
            largest_free_at_peak: 0,
            peak_allocated: 0,
            device_allocations: 0,
            out_of_memory: Vec::new(),
        }
    }

    /// What step `step` left the allocator with.
    fn after(&mut self, step: usize, allocator: &CachingAllocator, oom: Option<OutOfMemory>) {
        let (reserved, allocated) = (allocator.reserved(), allocator.allocated());
        self.reserved.push(reserved);
        self.allocated.push(allocated);
        self.peak_allocated = self.peak_allocated.max(allocated);
        if reserved > self.peak_reserved {
            self.peak_reserved = reserved;
            self.peak_step = Some(step);
            self.allocated_at_peak = allocated;
            self.largest_free_at_peak = allocator.largest_free_block();
        }
        if let Some(oom) = oom {
            self.out_of_memory.push((step, oom));
        }
        self.device_allocations = allocator.device_allocations();
    }
}

/// Replays under the settings the job ran with (segments at `segment_addresses`, as in
/// `replay_at`) and compares every step with what the allocator reported; `None` when they agree
/// throughout.
#[cfg(test)]
pub(crate) fn replay_check(
    config: &AllocatorConfig,
    device_capacity: Option<u64>,
    requests: &[Request],
    recorded: &[Recorded],
    segment_addresses: &[(u64, u64)],
) -> Option<Divergence> {
    replay_checked(config, device_capacity, requests, recorded, segment_addresses).err()
}

/// `replay_check`, and the replay itself when it agrees throughout: what happened.
pub(crate) fn replay_checked(
    config: &AllocatorConfig,
    device_capacity: Option<u64>,
    requests: &[Request],
    recorded: &[Recorded],
    segment_addresses: &[(u64, u64)],
) -> Result<Replay, Divergence> {
    if recorded.len() != requests.len() {
        return Err(Divergence::Length { requests: requests.len(), recorded: recorded.len() });
    }
    let mut out = Replay::with_capacity(requests.len());
    run(config, device_capacity, requests, segment_addresses, |step, allocator, oom| {
        let expected = recorded[step];
        match (&oom, expected.out_of_memory) {
            (Some(oom), false) => return Err(Divergence::UnexpectedOutOfMemory { step, oom: oom.clone() }),
            (None, true) => return Err(Divergence::MissedOutOfMemory { step }),
            _ => {}
        }
        let (allocated, reserved) = (allocator.allocated(), allocator.reserved());
        if expected.allocated.is_some_and(|a| a != allocated) || expected.reserved.is_some_and(|r| r != reserved) {
            return Err(Divergence::Counters {
                step,
                expected_allocated: expected.allocated,
                expected_reserved: expected.reserved,
                allocated,
                reserved,
            });
        }
        out.after(step, allocator, oom);
        Ok(())
    })?;
    Ok(out)
}

fn run(
    config: &AllocatorConfig,
    device_capacity: Option<u64>,
    requests: &[Request],
    segment_addresses: &[(u64, u64)],
    mut after_step: impl FnMut(usize, &CachingAllocator, Option<OutOfMemory>) -> Result<(), Divergence>,
) -> Result<(), Divergence> {
    let mut allocator =
        CachingAllocator::new(config.clone(), device_capacity).with_segment_addresses(segment_addresses);
    let mut refused = std::collections::HashSet::new();
    for (step, request) in requests.iter().enumerate() {
        let oom = match *request {
            Request::Alloc { id, size } => {
                if allocator.is_live(id) {
                    return Err(Divergence::BadRequest {
                        step,
                        why: format!("request {id} allocated again while live"),
                    });
                }
                let oom = allocator.malloc(id, size).err();
                if oom.is_some() {
                    refused.insert(id);
                }
                oom
            }
            // A request that ran out of memory holds nothing to free: the replay goes on as a job
            // that caught the error would, without it.
            Request::Free { id } if refused.remove(&id) => None,
            Request::Free { id } => {
                allocator.free(id).map_err(|e| Divergence::BadRequest { step, why: e.to_string() })?;
                None
            }
            Request::EmptyCache => {
                allocator.empty_cache();
                None
            }
        };
        after_step(step, &allocator, oom)?;
    }
    Ok(())
}
