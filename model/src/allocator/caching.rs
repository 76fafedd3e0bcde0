//! The allocator's state: segments, the blocks they are cut into, and the two pools of free
//! blocks. One `DeviceCachingAllocator` on the default stream; each method names the PyTorch
//! function it mirrors, so a divergence found by a replay can be traced to one rule.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use super::{allocation_size, is_small, round_size, should_split, AllocatorConfig, K_LARGE_BUFFER, K_SMALL_BUFFER};

type BlockId = usize;

/// Which end of a block `carve` cuts.
#[derive(Debug, Clone, Copy)]
enum Side {
    Front,
    Back,
}
const LARGE: usize = 0;
const SMALL: usize = 1;
/// Address space of an expandable segment when the device size is unknown: CUDA's 256 TiB.
const UNBOUNDED_ADDRESS_SPACE: u64 = 1 << 48;

#[derive(Debug, Clone)]
struct Block {
    size: u64,
    /// Synthetic address: segments are laid out one after the other in creation order, since
    /// cudaMalloc's real addresses are not in a recording.
    addr: u64,
    segment: u64,
    prev: Option<BlockId>,
    next: Option<BlockId>,
    allocated: bool,
    /// False only for the not-yet-backed address space of an expandable segment.
    mapped: bool,
    /// `gc_count_base`: the pool's `get_free_block` call count when the block entered the pool.
    gc_base: u64,
}

#[derive(Debug, Clone)]
struct Segment {
    pool: usize,
    base: u64,
    /// For an expandable segment, the page size it maps in (`segment_size_`); 0 otherwise.
    page: u64,
    /// Bytes backed by device memory: the whole segment, or the mapped pages.
    reserved: u64,
}

/// A segment as the driver sees it, without addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentInfo {
    pub id: u64,
    /// Bytes of device memory the segment holds (mapped pages, for an expandable segment).
    pub size: u64,
    /// Bytes of it handed out to live requests.
    pub allocated: u64,
    pub small_pool: bool,
    pub expandable: bool,
}

/// What one request got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The request after `round_size`.
    pub rounded: u64,
    /// The block handed out: the rounded size, or more when the remainder was too small to split.
    pub block_size: u64,
    pub segment: u64,
    /// Whether a cached block served it, without asking the device for memory.
    pub from_cache: bool,
}

/// A request the allocator could not serve even after giving back all it could: the numbers
/// PyTorch prints in its "CUDA out of memory" message, plus what explains them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("out of memory: tried to allocate {alloc_size} bytes for a {request}-byte request with {reserved} bytes reserved, {allocated} allocated")]
pub struct OutOfMemory {
    pub request: u64,
    pub rounded: u64,
    /// What was asked of the device: a new segment, or pages of an expandable one.
    pub alloc_size: u64,
    pub allocated: u64,
    pub reserved: u64,
    /// Reserved but not allocated: the cache that fragmentation made unusable for this request.
    pub reserved_unallocated: u64,
    pub largest_free_block: u64,
    /// Segments (pages, for expandable segments) that back device memory.
    pub units: u64,
    /// Of those, the ones holding a live block, which no setting can give back.
    pub pinned_units: u64,
}

impl OutOfMemory {
    /// Every segment (or mapped page) holds a live block: no cache release or setting that only
    /// changes how free memory is cut up can make room; fewer live blocks or a bigger device can.
    pub fn every_unit_pinned(&self) -> bool {
        self.pinned_units == self.units
    }
}

/// A free of a request the allocator never handed out (or handed out and already took back).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("free of request {0}, which holds no block")]
pub struct UnknownRequest(pub u64);

#[derive(Debug, Clone)]
pub struct CachingAllocator {
    config: AllocatorConfig,
    capacity: Option<u64>,
    /// `allowed_memory_maximum` once a memory fraction is set (`set_fraction`).
    allowed: Option<u64>,
    blocks: Vec<Option<Block>>,
    vacant: Vec<BlockId>,
    segments: BTreeMap<u64, Segment>,
    next_segment: u64,
    next_addr: u64,
    /// `BlockPool::blocks`, ordered as `BlockComparatorSize`: size, then address.
    free: [BTreeSet<(u64, u64, BlockId)>; 2],
    /// `BlockPool::unmapped`, ordered as `BlockComparatorAddress`.
    unmapped: [BTreeSet<(u64, BlockId)>; 2],
    /// `get_free_blocks_call_count`, the clock of garbage collection's block ages.
    gc_calls: [u64; 2],
    live: HashMap<u64, BlockId>,
    allocated: u64,
    reserved: u64,
    /// Device allocations made: segments, or pages mapped into expandable segments.
    device_allocations: u64,
    /// The addresses cudaMalloc gave the job's segments, by segment size, in order: where a
    /// replay knows them, best fit breaks ties between equal blocks by address as the job's
    /// allocator did.
    recorded_bases: HashMap<u64, VecDeque<u64>>,
}

impl CachingAllocator {
    /// `device_capacity`: the bytes the device would give this process; `None` for a device that
    /// never runs out.
    pub fn new(config: AllocatorConfig, device_capacity: Option<u64>) -> Self {
        CachingAllocator {
            config,
            capacity: device_capacity,
            allowed: None,
            blocks: Vec::new(),
            vacant: Vec::new(),
            segments: BTreeMap::new(),
            next_segment: 0,
            next_addr: 0,
            free: Default::default(),
            unmapped: Default::default(),
            gc_calls: [0; 2],
            live: HashMap::new(),
            allocated: 0,
            reserved: 0,
            device_allocations: 0,
            recorded_bases: HashMap::new(),
        }
    }

    /// Lays the segments it makes at the addresses a job's segments of the same size got, in the
    /// order it got them (`(address, size)`); once those run out, above the highest of them.
    /// cudaMalloc's placement is not modelled, but the order of equal blocks is what best fit
    /// reads, and segments of equal size made in the same order are laid out alike.
    pub(crate) fn with_segment_addresses(mut self, segments: &[(u64, u64)]) -> Self {
        for &(addr, size) in segments {
            self.recorded_bases.entry(size).or_default().push_back(addr);
            self.next_addr = self.next_addr.max(addr.saturating_add(size));
        }
        self
    }

    /// `torch.cuda.set_per_process_memory_fraction` (`setMemoryFraction`): caps reserved memory
    /// at a fraction of the device, and turns `garbage_collection_threshold` on. Without a device
    /// capacity there is nothing to take a fraction of, and it does nothing.
    #[cfg(test)]
    pub(crate) fn set_memory_fraction(&mut self, fraction: f64) {
        self.allowed = self.capacity.map(|c| (fraction * c as f64) as u64);
    }

    /// Bytes in blocks handed out (`allocated_bytes`).
    pub fn allocated(&self) -> u64 {
        self.allocated
    }

    /// Bytes held from the device (`reserved_bytes`).
    pub fn reserved(&self) -> u64 {
        self.reserved
    }

    /// Device allocations made so far: `cudaMalloc`'d segments, or pages mapped into
    /// expandable segments (what a recording counts as `cuMemAlloc_v2` or `cuMemMap` calls).
    pub(crate) fn device_allocations(&self) -> u64 {
        self.device_allocations
    }

    pub(crate) fn is_live(&self, request_id: u64) -> bool {
        self.live.contains_key(&request_id)
    }

    /// The largest cached free block, in either pool (`cacheInfo`).
    pub(crate) fn largest_free_block(&self) -> u64 {
        self.free.iter().filter_map(|pool| pool.last().map(|&(size, _, _)| size)).max().unwrap_or(0)
    }

    /// Segments in creation order, with what each holds.
    pub fn segments(&self) -> Vec<SegmentInfo> {
        let mut allocated: HashMap<u64, u64> = HashMap::new();
        for &b in self.live.values() {
            let block = self.block(b);
            *allocated.entry(block.segment).or_default() += block.size;
        }
        self.segments
            .iter()
            // An expandable segment with nothing mapped holds address space only.
            .filter(|(_, s)| s.reserved > 0)
            .map(|(&id, s)| SegmentInfo {
                id,
                size: s.reserved,
                allocated: allocated.get(&id).copied().unwrap_or(0),
                small_pool: s.pool == SMALL,
                expandable: s.page != 0,
            })
            .collect()
    }

    /// `DeviceCachingAllocator::malloc`. A request id already live is the caller's error: the
    /// id then names the new block and the old one stays allocated.
    pub fn malloc(&mut self, request_id: u64, request: u64) -> Result<Outcome, OutOfMemory> {
        let rounded = round_size(request, &self.config);
        let pool = if is_small(rounded) { SMALL } else { LARGE };
        let alloc_size = allocation_size(rounded);

        let (block, from_cache) = match self.get_free_block(pool, rounded) {
            Some(b) => (b, true),
            None => {
                if self.gc_enabled() {
                    self.garbage_collect_cached_blocks();
                }
                // The retry ladder of `malloc`: a fresh segment; else give back oversize cached
                // blocks and retry; else give back every fully free segment and retry.
                let block = self
                    .alloc_block(pool, rounded, alloc_size)
                    .or_else(|| {
                        self.release_available_cached_blocks(pool, rounded)
                            .then(|| self.alloc_block(pool, rounded, alloc_size))
                            .flatten()
                    })
                    .or_else(|| {
                        self.release_cached_blocks();
                        self.alloc_block(pool, rounded, alloc_size)
                    });
                match block {
                    Some(b) => (b, false),
                    None => return Err(self.out_of_memory(request, rounded, alloc_size)),
                }
            }
        };
        let split = should_split(self.block(block).size, rounded, pool == SMALL, &self.config);
        let block = self.alloc_found_block(block, rounded, pool, split);
        self.live.insert(request_id, block);
        let b = self.block(block);
        Ok(Outcome { rounded, block_size: b.size, segment: b.segment, from_cache })
    }

    /// `DeviceCachingAllocator::free` and `free_block`: the block goes back to its pool, merged
    /// with free neighbours of the same segment. Returns the block's size.
    pub fn free(&mut self, request_id: u64) -> Result<u64, UnknownRequest> {
        let id = self.live.remove(&request_id).ok_or(UnknownRequest(request_id))?;
        let (size, prev, next) = {
            let b = self.block_mut(id);
            b.allocated = false;
            (b.size, b.prev, b.next)
        };
        self.allocated -= size;
        for neighbour in [prev, next] {
            self.try_merge_blocks(id, neighbour);
        }
        self.insert_free(id);
        Ok(size)
    }

    /// `emptyCache` (`release_cached_blocks`): gives back every fully free segment, and the free
    /// pages of expandable segments. Returns the bytes given back.
    pub(crate) fn empty_cache(&mut self) -> u64 {
        let before = self.reserved;
        self.release_cached_blocks();
        before - self.reserved
    }

    fn gc_enabled(&self) -> bool {
        self.allowed.is_some() && self.config.garbage_collection_threshold > 0.0
    }

    /// `get_free_block`: the smallest free block that fits, except that oversize blocks
    /// (>= max_split_size) only serve requests that are themselves oversize and within
    /// `max_non_split_rounding_size` of the block.
    fn get_free_block(&mut self, pool: usize, size: u64) -> Option<BlockId> {
        if self.gc_enabled() {
            self.gc_calls[pool] += 1;
        }
        let mut candidates = self.free[pool].range((size, 0, 0)..);
        let mut best = candidates.next()?.2;
        if self.is_expandable(best) {
            // Best fit over expandable blocks counts the unmapped space after a block as part of
            // it, so that growing one segment is preferred to cutting into another's middle.
            for &(_, _, next) in candidates {
                if !self.is_expandable(best) || self.expandable_size(next) >= self.expandable_size(best) {
                    break;
                }
                best = next;
            }
        }
        let block_size = self.block(best).size;
        let max_split = self.config.max_split_size;
        if size < max_split && block_size >= max_split {
            return None;
        }
        if size >= max_split && block_size >= size.saturating_add(self.config.max_non_split_rounding_size) {
            return None;
        }
        self.remove_free(best);
        Some(best)
    }

    fn expandable_size(&self, id: BlockId) -> u64 {
        let b = self.block(id);
        b.size + b.next.map(|n| self.block(n)).filter(|n| !n.mapped).map_or(0, |n| n.size)
    }

    /// `alloc_block`: a new segment from the device, or new pages of an expandable segment.
    /// The returned block is outside the pool, ready for `alloc_found_block`.
    fn alloc_block(&mut self, pool: usize, size: u64, alloc_size: u64) -> Option<BlockId> {
        if self.allowed.is_some_and(|allowed| self.reserved + alloc_size > allowed) {
            return None;
        }
        if self.config.expandable_segments {
            return self.try_allocate_expandable_block(pool, size);
        }
        if !self.device_has(alloc_size) {
            return None;
        }
        let segment = self.new_segment(pool, alloc_size, 0);
        self.segments.get_mut(&segment)?.reserved = alloc_size;
        self.reserved += alloc_size;
        self.device_allocations += 1;
        let addr = self.segments[&segment].base;
        Some(self.new_block(Block {
            size: alloc_size,
            addr,
            segment,
            prev: None,
            next: None,
            allocated: false,
            mapped: true,
            gc_base: 0,
        }))
    }

    fn device_has(&self, bytes: u64) -> bool {
        self.capacity.is_none_or(|c| self.reserved + bytes <= c)
    }

    fn new_segment(&mut self, pool: usize, size: u64, page: u64) -> u64 {
        let id = self.next_segment;
        self.next_segment += 1;
        let recorded = if page == 0 { self.recorded_bases.get_mut(&size).and_then(VecDeque::pop_front) } else { None };
        let base = recorded.unwrap_or_else(|| {
            let base = self.next_addr;
            self.next_addr += size;
            base
        });
        self.segments.insert(id, Segment { pool, base, page, reserved: 0 });
        id
    }

    /// `alloc_found_block`: cuts the request off the front of the block when `should_split`
    /// allows, leaving the rest free in the pool.
    fn alloc_found_block(&mut self, id: BlockId, size: u64, pool: usize, split: bool) -> BlockId {
        let handed = if split {
            let front = self.carve(id, Side::Front, size, true);
            debug_assert_eq!(self.segments[&self.block(id).segment].pool, pool);
            self.insert_free(id);
            front
        } else {
            id
        };
        let b = self.block_mut(handed);
        b.allocated = true;
        let size = b.size;
        self.allocated += size;
        handed
    }

    /// `release_available_cached_blocks`: on a failed device allocation with max_split_size set,
    /// gives back the smallest oversize cached block that covers the request, or else the largest
    /// oversize blocks until they add up to it.
    fn release_available_cached_blocks(&mut self, pool: usize, size: u64) -> bool {
        let max_split = self.config.max_split_size;
        if max_split == u64::MAX {
            return false;
        }
        let key = size.max(max_split);
        if let Some(&(_, _, b)) = self.free[pool].range((key, 0, 0)..).next() {
            return self.release_block(b);
        }
        let mut released = 0;
        let oversize: Vec<_> = self.free[pool].iter().rev().take_while(|&&(s, _, _)| s >= max_split).copied().collect();
        for (s, _, b) in oversize {
            if released >= key {
                break;
            }
            if self.release_block(b) {
                released += s;
            }
        }
        released >= key
    }

    /// `release_cached_blocks` (via `release_blocks`, large pool first): every free block that
    /// is a whole segment goes back to the device; expandable segments unmap their free pages.
    fn release_cached_blocks(&mut self) {
        for pool in [LARGE, SMALL] {
            let free: Vec<_> = self.free[pool].iter().map(|&(_, _, b)| b).collect();
            let mut to_unmap = Vec::new();
            for b in free {
                if self.is_expandable(b) {
                    to_unmap.push(b);
                } else if self.block(b).prev.is_none() && self.block(b).next.is_none() {
                    self.release_block(b);
                }
            }
            for b in to_unmap {
                self.unmap_block(b);
                let block = self.block(b);
                if block.prev.is_none() && block.next.is_none() && !block.mapped {
                    // `release_expandable_segment`: nothing of it is mapped any more.
                    let segment = block.segment;
                    self.unmapped[pool].remove(&(block.addr, b));
                    self.segments.remove(&segment);
                    self.drop_block(b);
                }
            }
        }
    }

    /// `release_block`: cudaFree of a cached segment. Expandable blocks are never released this
    /// way in PyTorch (it asserts), and a block that is only part of a segment cannot be; both are
    /// refused here.
    fn release_block(&mut self, id: BlockId) -> bool {
        let b = self.block(id).clone();
        if self.is_expandable(id) || b.prev.is_some() || b.next.is_some() {
            return false;
        }
        self.remove_free(id);
        self.segments.remove(&b.segment);
        self.reserved -= b.size;
        self.drop_block(id);
        true
    }

    /// `garbage_collect_cached_blocks`: once reserved passes the threshold fraction of the
    /// allowed memory, gives back whole free large-pool segments that have waited longer than
    /// average since they were last freed, until reserved is back under the threshold.
    fn garbage_collect_cached_blocks(&mut self) {
        let Some(allowed) = self.allowed else { return };
        let threshold = (self.config.garbage_collection_threshold * allowed as f64) as u64;
        if self.reserved <= threshold {
            return;
        }
        let target = self.reserved - threshold;
        let age = |a: &Self, b: BlockId| a.gc_calls[LARGE] - a.block(b).gc_base;
        let freeable = |a: &Self| -> Vec<BlockId> {
            a.free[LARGE]
                .iter()
                .map(|&(_, _, b)| b)
                .filter(|&b| {
                    let block = a.block(b);
                    block.prev.is_none() && block.next.is_none() && !a.is_expandable(b)
                })
                .collect()
        };
        let mut total_age: u64 = freeable(self).iter().map(|&b| age(self, b)).sum();
        let mut count = freeable(self).len() as u64;
        let mut reclaimed = 0;
        let mut freed_one = true;
        while reclaimed < target && freed_one && count > 0 {
            let threshold_age = total_age as f64 / count as f64;
            freed_one = false;
            for b in freeable(self) {
                let a = age(self, b);
                if a as f64 >= threshold_age {
                    freed_one = true;
                    reclaimed += self.block(b).size;
                    total_age -= a;
                    count -= 1;
                    self.release_block(b);
                }
            }
        }
    }

    /// `try_allocate_expandable_block`: finds room at the lowest address of the pool's
    /// expandable segment (`find_expandable_block`), maps pages until the free block there covers
    /// the request.
    fn try_allocate_expandable_block(&mut self, pool: usize, size: u64) -> Option<BlockId> {
        let mut candidate = self.find_expandable_block(pool, size);
        if !self.block(candidate).mapped {
            let want = self.block(candidate).size.min(size);
            if !self.map_block(candidate, want) {
                return None;
            }
        }
        while self.block(candidate).size < size {
            let remaining = size - self.block(candidate).size;
            let next = self.block(candidate).next?;
            let want = remaining.min(self.block(next).size);
            if !self.map_block(next, want) {
                return None;
            }
            candidate = next;
        }
        self.remove_free(candidate);
        Some(candidate)
    }

    /// `find_expandable_block`: the lowest unmapped range, with the free block before it, that
    /// has room; else a new segment reserving address space for 1 1/8 of the device.
    fn find_expandable_block(&mut self, pool: usize, size: u64) -> BlockId {
        let allocatable = |a: &Self, b: Option<BlockId>| b.filter(|&b| !a.block(b).allocated);
        let unmapped: Vec<_> = self.unmapped[pool].iter().map(|&(_, b)| b).collect();
        for c in unmapped {
            let start = allocatable(self, self.block(c).prev).unwrap_or(c);
            let mut bytes = 0;
            let mut at = Some(start);
            while bytes < size {
                match allocatable(self, at) {
                    Some(b) => {
                        bytes += self.block(b).size;
                        at = self.block(b).next;
                    }
                    None => break,
                }
            }
            if bytes >= size {
                return start;
            }
        }
        let page = if pool == SMALL { K_SMALL_BUFFER } else { K_LARGE_BUFFER };
        let space = self.capacity.map_or(UNBOUNDED_ADDRESS_SPACE, |c| (c + c / 8).div_ceil(page) * page);
        let segment = self.new_segment(pool, space, page);
        let addr = self.segments[&segment].base;
        let b = self.new_block(Block {
            size: space,
            addr,
            segment,
            prev: None,
            next: None,
            allocated: false,
            mapped: false,
            gc_base: 0,
        });
        self.unmapped[pool].insert((addr, b));
        b
    }

    /// `map_block` (with `ExpandableSegment::map`): backs the pages under the first `size` bytes
    /// of an unmapped block, whole pages at a time; all or nothing when the device runs out.
    fn map_block(&mut self, id: BlockId, size: u64) -> bool {
        let b = self.block(id).clone();
        let seg = &self.segments[&b.segment];
        let (pool, page) = (seg.pool, seg.page);
        let offset = b.addr - seg.base;
        let mapped = (offset + size).div_ceil(page) * page - offset;
        if !self.device_has(mapped) {
            return false;
        }
        self.unmapped[pool].remove(&(b.addr, id));
        self.block_mut(id).mapped = true;
        if mapped < b.size {
            let rest = self.carve(id, Side::Back, b.size - mapped, false);
            self.unmapped[pool].insert((b.addr + mapped, rest));
        }
        let (prev, next) = (self.block(id).prev, self.block(id).next);
        self.try_merge_blocks(id, prev);
        self.try_merge_blocks(id, next);
        self.insert_free(id);
        self.reserved += mapped;
        self.device_allocations += mapped / page;
        if let Some(s) = self.segments.get_mut(&b.segment) {
            s.reserved += mapped;
        }
        true
    }

    /// `unmap_block` (with `ExpandableSegment::unmap`): gives back the whole pages inside a free
    /// block; the partial pages at either end stay mapped as free blocks of their own.
    fn unmap_block(&mut self, id: BlockId) {
        let b = self.block(id).clone();
        let seg = &self.segments[&b.segment];
        let (pool, page, base) = (seg.pool, seg.page, seg.base);
        let first = (b.addr - base).div_ceil(page) * page + base;
        let end = (b.addr + b.size - base) / page * page + base;
        if first >= end {
            return;
        }
        self.remove_free(id);
        if first > b.addr {
            let before = self.carve(id, Side::Front, first - b.addr, true);
            self.insert_free(before);
        }
        if b.addr + b.size > end {
            let after = self.carve(id, Side::Back, b.addr + b.size - end, true);
            self.insert_free(after);
        }
        let block = self.block_mut(id);
        block.mapped = false;
        let (prev, next) = (block.prev, block.next);
        self.try_merge_blocks(id, prev);
        self.try_merge_blocks(id, next);
        let addr = self.block(id).addr;
        self.unmapped[pool].insert((addr, id));
        self.reserved -= end - first;
        if let Some(s) = self.segments.get_mut(&b.segment) {
            s.reserved -= end - first;
        }
    }

    /// Cuts `bytes` off the front or the back of block `id` into a free block of its own (of the
    /// given mapped state), linked in beside it; `id` keeps the rest. The new block is in no pool.
    fn carve(&mut self, id: BlockId, side: Side, bytes: u64, mapped: bool) -> BlockId {
        let b = self.block(id).clone();
        let (addr, prev, next) = match side {
            Side::Front => (b.addr, b.prev, Some(id)),
            Side::Back => (b.addr + b.size - bytes, Some(id), b.next),
        };
        let piece = self.new_block(Block {
            size: bytes,
            addr,
            segment: b.segment,
            prev,
            next,
            allocated: false,
            mapped,
            gc_base: 0,
        });
        let block = self.block_mut(id);
        block.size -= bytes;
        match side {
            Side::Front => {
                block.addr += bytes;
                block.prev = Some(piece);
                if let Some(p) = prev {
                    self.block_mut(p).next = Some(piece);
                }
            }
            Side::Back => {
                block.next = Some(piece);
                if let Some(n) = next {
                    self.block_mut(n).prev = Some(piece);
                }
            }
        }
        piece
    }

    /// `try_merge_blocks`: `dst` absorbs a free neighbour in the same mapped state.
    fn try_merge_blocks(&mut self, dst: BlockId, src: Option<BlockId>) {
        let Some(src) = src else { return };
        let s = self.block(src).clone();
        if s.allocated || s.mapped != self.block(dst).mapped {
            return;
        }
        let pool = self.segments[&s.segment].pool;
        if s.mapped {
            self.remove_free(src);
        } else {
            self.unmapped[pool].remove(&(s.addr, src));
        }
        if self.block(dst).prev == Some(src) {
            if let Some(p) = s.prev {
                self.block_mut(p).next = Some(dst);
            }
            let d = self.block_mut(dst);
            d.addr = s.addr;
            d.prev = s.prev;
            d.size += s.size;
        } else {
            if let Some(n) = s.next {
                self.block_mut(n).prev = Some(dst);
            }
            let d = self.block_mut(dst);
            d.next = s.next;
            d.size += s.size;
        }
        self.drop_block(src);
    }

    fn out_of_memory(&self, request: u64, rounded: u64, alloc_size: u64) -> OutOfMemory {
        let (units, pinned_units) = self.pinning();
        OutOfMemory {
            request,
            rounded,
            alloc_size,
            allocated: self.allocated,
            reserved: self.reserved,
            reserved_unallocated: self.reserved - self.allocated,
            largest_free_block: self.largest_free_block(),
            units,
            pinned_units,
        }
    }

    /// Segments (pages, for expandable segments) backing memory, and those holding a live block.
    fn pinning(&self) -> (u64, u64) {
        let units = self.segments.values().map(|s| s.reserved.checked_div(s.page).unwrap_or(1)).sum();
        let mut pinned = BTreeSet::new();
        for &b in self.live.values() {
            let block = self.block(b);
            let s = &self.segments[&block.segment];
            // A fixed segment counts as one page as large as itself.
            let page = if s.page == 0 { u64::MAX } else { s.page };
            let first = (block.addr - s.base) / page;
            let end = (block.addr + block.size - s.base).div_ceil(page);
            pinned.extend((first..end).map(|p| (block.segment, p)));
        }
        (units, pinned.len() as u64)
    }

    fn is_expandable(&self, id: BlockId) -> bool {
        self.segments[&self.block(id).segment].page != 0
    }

    fn insert_free(&mut self, id: BlockId) {
        let calls = {
            let pool = self.segments[&self.block(id).segment].pool;
            self.gc_calls[pool]
        };
        let b = self.block_mut(id);
        b.gc_base = calls;
        let key = (b.size, b.addr, id);
        let pool = self.segments[&self.block(id).segment].pool;
        self.free[pool].insert(key);
    }

    fn remove_free(&mut self, id: BlockId) {
        let b = self.block(id);
        let key = (b.size, b.addr, id);
        let pool = self.segments[&b.segment].pool;
        self.free[pool].remove(&key);
    }

    fn new_block(&mut self, block: Block) -> BlockId {
        match self.vacant.pop() {
            Some(id) => {
                self.blocks[id] = Some(block);
                id
            }
            None => {
                self.blocks.push(Some(block));
                self.blocks.len() - 1
            }
        }
    }

    fn drop_block(&mut self, id: BlockId) {
        self.blocks[id] = None;
        self.vacant.push(id);
    }

    fn block(&self, id: BlockId) -> &Block {
        self.blocks[id].as_ref().expect("block ids are dropped only with their block")
    }

    fn block_mut(&mut self, id: BlockId) -> &mut Block {
        self.blocks[id].as_mut().expect("block ids are dropped only with their block")
    }
}
