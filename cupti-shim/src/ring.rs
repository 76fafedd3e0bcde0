//! A bounded ring of call records written in place: a calling thread reserves a slot, fills it
//! and publishes it, so an event costs one pass over the bytes it uses instead of building a
//! record and copying it in. Many writers, one reader (the shim's sender thread); a full ring
//! refuses at once and hands the writer's work back (the queue decides whether to wait). (The
//! sequence-number scheme of Dmitry Vyukov's bounded queue.)

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;

struct Slot<T> {
    /// `position` when free for the writer of that position, `position + 1` once published.
    sequence: AtomicUsize,
    value: UnsafeCell<T>,
}

pub struct Ring<T> {
    slots: Box<[Slot<T>]>,
    mask: usize,
    /// Next position to write, shared by the writers.
    tail: CachePadded<AtomicUsize>,
    /// Next position to read (the one reader's). On a cache line of its own: the reader writes
    /// it at every record, and sharing the writers' line cost each write a transfer between cores.
    head: CachePadded<AtomicUsize>,
}

// SAFETY: a slot's value is touched by one thread at a time: its writer between reserving and
// publishing, the reader between seeing it published and freeing it; the sequence numbers order
// those hand-overs (acquire/release).
unsafe impl<T: Send> Sync for Ring<T> {}
// SAFETY: the ring owns its values, so it may move to another thread whenever they may.
unsafe impl<T: Send> Send for Ring<T> {}

impl<T: Copy> Ring<T> {
    /// `capacity` (a power of two) slots, each starting as `empty`.
    pub fn new(capacity: usize, empty: T) -> Self {
        assert!(capacity.is_power_of_two());
        let slots =
            (0..capacity).map(|i| Slot { sequence: AtomicUsize::new(i), value: UnsafeCell::new(empty) }).collect();
        Ring {
            slots,
            mask: capacity - 1,
            tail: CachePadded::new(AtomicUsize::new(0)),
            head: CachePadded::new(AtomicUsize::new(0)),
        }
    }

    /// Reserves a slot, lets `fill` write it in place, publishes it; when the ring is full,
    /// nothing is written and `fill` comes back.
    pub fn push_with<F: FnOnce(&mut T)>(&self, fill: F) -> Result<(), F> {
        let mut position = self.tail.load(Ordering::Relaxed);
        loop {
            let slot = &self.slots[position & self.mask];
            let sequence = slot.sequence.load(Ordering::Acquire);
            match sequence.wrapping_sub(position) as isize {
                0 => {
                    match self.tail.compare_exchange_weak(position, position + 1, Ordering::Relaxed, Ordering::Relaxed)
                    {
                        Ok(_) => {
                            // SAFETY: this thread reserved the slot; no one else touches it until
                            // the sequence number below publishes it.
                            fill(unsafe { &mut *slot.value.get() });
                            slot.sequence.store(position + 1, Ordering::Release);
                            self.prefetch(position + 1);
                            return Ok(());
                        }
                        Err(current) => position = current,
                    }
                }
                // The reader has not freed this slot yet: full.
                gap if gap < 0 => return Err(fill),
                _ => position = self.tail.load(Ordering::Relaxed),
            }
        }
    }

    /// Starts bringing the slot of `position` into this core's cache for writing, while the
    /// caller goes on: the next record most likely goes there, and the slot was last touched by
    /// the reader, long ago (a cache miss for every line of it otherwise).
    #[inline]
    fn prefetch(&self, position: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            let start = (&self.slots[position & self.mask] as *const Slot<T>).cast::<i8>();
            for line in (0..std::mem::size_of::<Slot<T>>()).step_by(64) {
                // SAFETY: a hint, inside the slot; prefetching never faults.
                unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_ET0 }>(start.add(line)) };
            }
        }
    }

    /// Positions reserved by writers so far: a record pushed before this call is at a lower one.
    pub fn reserved(&self) -> usize {
        self.tail.load(Ordering::Acquire)
    }

    /// Positions the reader has taken so far (every record below it has been read).
    pub fn taken(&self) -> usize {
        self.head.load(Ordering::Acquire)
    }

    /// Hands the oldest published record to `read` and frees its slot; false when there is none
    /// (or the oldest is still being written). One thread only may read.
    pub fn pop_with(&self, read: impl FnOnce(&T)) -> bool {
        let position = self.head.load(Ordering::Relaxed);
        let slot = &self.slots[position & self.mask];
        if slot.sequence.load(Ordering::Acquire) != position + 1 {
            return false;
        }
        // SAFETY: published and not yet freed: the writer is done with it.
        read(unsafe { &*slot.value.get() });
        slot.sequence.store(position + self.mask + 1, Ordering::Release);
        self.head.store(position + 1, Ordering::Release);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_come_out_in_order_and_a_full_ring_refuses() {
        let ring = Ring::new(4, 0u64);
        for i in 1..=4 {
            assert!(ring.push_with(|v| *v = i).is_ok());
        }
        assert!(ring.push_with(|v| *v = 99).is_err());
        let mut out = Vec::new();
        while ring.pop_with(|v| out.push(*v)) {}
        assert_eq!(out, [1, 2, 3, 4]);
        assert!(ring.push_with(|v| *v = 5).is_ok());
        assert_eq!((ring.reserved(), ring.taken()), (5, 4));
        assert!(ring.pop_with(|v| assert_eq!(*v, 5)));
        assert!(!ring.pop_with(|_| unreachable!()));
        assert_eq!((ring.reserved(), ring.taken()), (5, 5));
    }

    #[test]
    fn many_writers_lose_nothing_that_fits() {
        let ring = std::sync::Arc::new(Ring::new(1 << 12, 0u64));
        let writers: Vec<_> = (0..4u64)
            .map(|w| {
                let ring = ring.clone();
                std::thread::spawn(move || {
                    (0..1000u64).filter(|i| ring.push_with(|v| *v = w * 1000 + i).is_ok()).count()
                })
            })
            .collect();
        let pushed: usize = writers.into_iter().map(|w| w.join().unwrap()).sum();
        let mut seen = std::collections::BTreeSet::new();
        while ring.pop_with(|v| {
            seen.insert(*v);
        }) {}
        assert_eq!((pushed, seen.len()), (4000, 4000));
    }
}
