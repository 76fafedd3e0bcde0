//! A process's memory profile: what it holds right now by Python stack, per layer (tensors,
//! driver allocations) and device, as pprof. Bounded: the stacks holding the most bytes, and one
//! "(other stacks)" sample with the rest — so a profile's size does not grow with the job.

use std::collections::HashMap;

use crate::pprof::{self, ProfileBuilder, StackSample};
use gpuprof_model::track::{Allocation, ProcessMemory};
use gpuprof_model::Stack;

/// (layer, device) → stack → (bytes, count)
type Totals<'a> = HashMap<(&'static str, Option<i32>), HashMap<&'a Stack, (u64, u64)>>;

/// The process's profile at `ts`, at most `top` stacks per layer and device.
pub(crate) fn of_process(process: &ProcessMemory, ts: u64, top: usize) -> Vec<u8> {
    let mut totals: Totals<'_> = HashMap::new();
    let blocks = process.blocks();
    let allocations = process.allocations();
    add(&mut totals, "allocator", &blocks);
    let device_memory: Vec<&Allocation> = allocations.iter().copied().filter(|a| a.is_device_memory()).collect();
    add(&mut totals, "driver", &device_memory);
    let mut groups: Vec<_> = totals.into_iter().collect();
    groups.sort_by_key(|((layer, device), _)| (*layer, *device));
    let mut builder = ProfileBuilder::of_program(ts, &process.comm);
    for ((layer, device), stacks) in groups {
        let mut rows: Vec<(&Stack, (u64, u64))> = stacks.into_iter().collect();
        rows.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then_with(|| a.0.cmp(b.0)));
        let (kept, rest) = rows.split_at(rows.len().min(top));
        for (stack, (bytes, count)) in kept {
            builder.add(&StackSample { stack, bytes: *bytes, count: *count, layer, device });
        }
        let (bytes, count) = rest.iter().fold((0, 0), |(b, c), (_, (bytes, count))| (b + bytes, c + count));
        if count > 0 {
            builder.add_other(bytes, count, layer, device);
        }
    }
    pprof::encode(&builder.finish())
}

fn add<'a>(totals: &mut Totals<'a>, layer: &'static str, live: &[&'a Allocation]) {
    for allocation in live {
        let total = totals.entry((layer, allocation.device)).or_default().entry(&allocation.stack).or_default();
        total.0 += allocation.size;
        total.1 += 1;
    }
}
