//! One test per rule, with numbers worked by hand from CUDACachingAllocator.cpp.

use super::*;

const KIB: u64 = 1024;

fn conf(s: &str) -> AllocatorConfig {
    AllocatorConfig::parse(s).expect("valid config")
}

fn fresh(s: &str, capacity: Option<u64>) -> CachingAllocator {
    CachingAllocator::new(conf(s), capacity)
}

fn sizes(a: &CachingAllocator) -> Vec<u64> {
    a.segments().iter().map(|s| s.size).collect()
}

#[test]
fn round_size_and_segment_sizes() {
    let d = AllocatorConfig::default();
    assert_eq!(round_size(1, &d), 512);
    assert_eq!(round_size(512, &d), 512);
    assert_eq!(round_size(513, &d), 1024);
    assert_eq!(round_size(1_000_000, &d), 1_000_448);
    assert!(is_small(MIB) && !is_small(MIB + 512));
    assert_eq!(allocation_size(1_000_448), 2 * MIB);
    assert_eq!(allocation_size(MIB + 512), 20 * MIB);
    assert_eq!(allocation_size(5 * MIB), 20 * MIB);
    assert_eq!(allocation_size(10 * MIB - 512), 20 * MIB);
    assert_eq!(allocation_size(10 * MIB), 10 * MIB);
    assert_eq!(allocation_size(11 * MIB), 12 * MIB);
}

#[test]
fn malloc_uses_the_pool_and_segment_of_its_size() {
    let mut a = fresh("", None);
    // 11 MiB gets a 12 MiB segment, and the 1 MiB tail is not > kSmallSize: no split.
    let eleven = a.malloc(1, 11 * MIB).unwrap();
    assert_eq!((eleven.rounded, eleven.block_size), (11 * MIB, 12 * MIB));
    let five = a.malloc(2, 5 * MIB).unwrap();
    assert_eq!((five.block_size, five.from_cache), (5 * MIB, false));
    let small = a.malloc(3, 1_000_000).unwrap();
    assert_eq!((small.rounded, small.block_size), (1_000_448, 1_000_448));
    assert_eq!(sizes(&a), vec![12 * MIB, 20 * MIB, 2 * MIB]);
    assert!(a.segments()[2].small_pool);
    assert_eq!(a.reserved(), 34 * MIB);
    assert_eq!(a.allocated(), 12 * MIB + 5 * MIB + 1_000_448);
    // A later 11 MiB request fits the 15 MiB left in the 5 MiB request's segment.
    let again = a.malloc(4, 11 * MIB).unwrap();
    assert_eq!((again.segment, again.block_size), (five.segment, 11 * MIB));
}

#[test]
fn splitting_limits() {
    let d = AllocatorConfig::default();
    // Large pool: the remainder must exceed 1 MiB.
    assert!(!should_split(20 * MIB, 19 * MIB, false, &d));
    assert!(should_split(20 * MIB, 18 * MIB + 512 * KIB, false, &d));
    // Small pool: a 512-byte remainder is kept.
    assert!(should_split(MIB, MIB - 512, true, &d));
    // With max_split_size, oversize requests never split.
    let m = conf("max_split_size_mb:64");
    assert!(!should_split(200 * MIB, 64 * MIB, false, &m));
    assert!(should_split(200 * MIB, 63 * MIB, false, &m));
    // Expandable segments split like the small pool.
    assert!(should_split(20 * MIB, 20 * MIB - 512, false, &conf("expandable_segments:True")));

    let mut a = fresh("", None);
    assert_eq!(a.malloc(1, 19 * MIB).unwrap().block_size, 20 * MIB);
    assert_eq!(a.allocated(), 20 * MIB);
    let mut s = fresh("", None);
    s.malloc(1, MIB).unwrap();
    assert_eq!(s.malloc(2, MIB - 512).unwrap().block_size, MIB - 512);
    let last = s.malloc(3, 100).unwrap();
    assert!(last.from_cache);
    assert_eq!((last.block_size, s.reserved()), (512, 2 * MIB));
}

#[test]
fn best_fit_takes_the_smallest_free_block_that_fits() {
    let mut a = fresh("", None);
    a.malloc(1, 40 * MIB).unwrap();
    let thirty = a.malloc(2, 30 * MIB).unwrap().segment;
    a.malloc(3, 50 * MIB).unwrap();
    a.free(1).unwrap();
    a.free(2).unwrap();
    a.free(3).unwrap();
    let got = a.malloc(4, 25 * MIB).unwrap();
    assert!(got.from_cache);
    assert_eq!((got.segment, got.block_size), (thirty, 25 * MIB));
    assert_eq!(a.largest_free_block(), 50 * MIB);
    assert_eq!(a.reserved(), 120 * MIB);
}

#[test]
fn max_split_size_keeps_oversize_blocks_whole() {
    // Default: the cached 100 MiB block is split for a 30 MiB request.
    let mut d = fresh("", None);
    d.malloc(1, 100 * MIB).unwrap();
    d.free(1).unwrap();
    assert!(d.malloc(2, 30 * MIB).unwrap().from_cache);
    assert_eq!(d.reserved(), 100 * MIB);

    // max_split_size_mb:64: a request under the limit may not take an oversize block.
    let mut m = fresh("max_split_size_mb:64", None);
    m.malloc(1, 100 * MIB).unwrap();
    m.free(1).unwrap();
    assert!(!m.malloc(2, 30 * MIB).unwrap().from_cache);
    assert_eq!(m.reserved(), 130 * MIB);
    // An oversize request takes an oversize block whole if it is less than 20 MiB larger...
    let whole = m.malloc(3, 81 * MIB).unwrap();
    assert!(whole.from_cache);
    assert_eq!(whole.block_size, 100 * MIB);
    // ...and not otherwise.
    m.free(3).unwrap();
    assert!(!m.malloc(4, 80 * MIB).unwrap().from_cache);
    assert_eq!(m.reserved(), 210 * MIB);
}

#[test]
fn a_failed_allocation_releases_oversize_blocks_then_retries() {
    // One oversize block covers the request.
    let mut a = fresh("max_split_size_mb:64", Some(150 * MIB));
    a.malloc(1, 100 * MIB).unwrap();
    a.free(1).unwrap();
    let got = a.malloc(2, 80 * MIB).unwrap();
    assert!(!got.from_cache);
    assert_eq!(sizes(&a), vec![80 * MIB]);

    // None does: the largest ones go until they add up to the request.
    let mut b = fresh("max_split_size_mb:64", Some(200 * MIB));
    b.malloc(1, 70 * MIB).unwrap();
    b.malloc(2, 70 * MIB).unwrap();
    b.free(1).unwrap();
    b.free(2).unwrap();
    b.malloc(3, 100 * MIB).unwrap();
    assert_eq!(sizes(&b), vec![100 * MIB]);
}

#[test]
fn a_failed_allocation_releases_free_segments_then_retries() {
    let mut a = fresh("", Some(60 * MIB));
    a.malloc(1, 30 * MIB).unwrap();
    a.free(1).unwrap();
    a.malloc(2, 40 * MIB).unwrap();
    assert_eq!(sizes(&a), vec![40 * MIB]);

    // A free block that is part of a live segment cannot be given back.
    let mut b = fresh("", Some(60 * MIB));
    b.malloc(1, 30 * MIB).unwrap();
    b.free(1).unwrap();
    b.malloc(2, 20 * MIB).unwrap(); // splits the 30 MiB block: 10 MiB stays free in it
    let oom = b.malloc(3, 40 * MIB).unwrap_err();
    assert_eq!((oom.reserved, oom.allocated), (30 * MIB, 20 * MIB));
    assert_eq!((oom.reserved_unallocated, oom.largest_free_block), (10 * MIB, 10 * MIB));
    assert!(oom.every_unit_pinned());
}

#[test]
fn roundup_power2_divisions() {
    assert_eq!(roundup_power2_next_division(1200, 4), 1280);
    assert_eq!(roundup_power2_next_division(4 * MIB, 4), 4 * MIB);
    let c = conf("roundup_power2_divisions:4");
    assert_eq!(round_size(5 * MIB + 1, &c), 6 * MIB);
    assert_eq!(round_size(1_258_291, &c), 1_310_720);
    assert_eq!(round_size(33 * MIB + 1, &c), 40 * MIB);
    // Not above kMinBlockSize * divisions: plain 512-byte rounding.
    assert_eq!(round_size(1200, &c), 1536);
    assert_eq!(round_size(33 * MIB + 1, &AllocatorConfig::default()), 33 * MIB + 512);

    // Per-interval form; `>` fills from the last named interval on, overriding its value.
    let per = conf("roundup_power2_divisions:[256:1,512:2,>:4]");
    assert_eq!(per.divisions_for(1000), 1);
    assert_eq!(per.divisions_for(300 * MIB), 1);
    assert_eq!(per.divisions_for(600 * MIB), 4);
    assert_eq!(per.divisions_for(100 << 30), 4);
}

#[test]
fn empty_cache_gives_back_whole_free_segments_only() {
    let mut a = fresh("", None);
    a.malloc(1, 12 * MIB).unwrap();
    a.malloc(2, 30 * MIB).unwrap();
    a.malloc(3, 100).unwrap();
    a.malloc(4, 5 * MIB).unwrap();
    a.malloc(5, 4 * MIB).unwrap(); // shares the 5 MiB request's 20 MiB segment
    a.free(1).unwrap();
    a.free(3).unwrap();
    a.free(4).unwrap();
    assert_eq!(a.empty_cache(), 12 * MIB + 2 * MIB);
    assert_eq!(sizes(&a), vec![30 * MIB, 20 * MIB]);
    assert_eq!(a.allocated(), 34 * MIB);
}

#[test]
fn free_merges_with_free_neighbours() {
    let mut a = fresh("", None);
    for id in 1..=3 {
        a.malloc(id, 4 * MIB).unwrap();
    }
    assert_eq!(sizes(&a), vec![20 * MIB]);
    a.free(1).unwrap();
    a.free(2).unwrap();
    assert_eq!(a.largest_free_block(), 8 * MIB);
    assert_eq!(a.empty_cache(), 0);
    a.free(3).unwrap();
    assert_eq!(a.largest_free_block(), 20 * MIB);
    assert_eq!(a.empty_cache(), 20 * MIB);
    assert_eq!(a.reserved(), 0);
    assert_eq!(a.free(3), Err(UnknownRequest(3)));
}

/// The H100 case, scaled down: 4 MiB blocks fill the device, one is kept per 20 MiB,
/// then a large request fails with most of the device reserved but unallocated — under every
/// setting, because every segment (or page) holds a live block.
#[test]
fn fragmentation_oom_that_no_setting_fixes() {
    for setting in ["", "max_split_size_mb:128", "expandable_segments:True"] {
        let mut a = fresh(setting, Some(1000 * MIB));
        for id in 0..250 {
            a.malloc(id, 4 * MIB).unwrap();
        }
        assert_eq!(a.reserved(), 1000 * MIB, "{setting}");
        for id in (0..250).filter(|id| id % 5 != 0) {
            a.free(id).unwrap();
        }
        let oom = a.malloc(1000, 512 * MIB).unwrap_err();
        assert_eq!(oom.reserved, 1000 * MIB, "{setting}");
        assert_eq!(oom.allocated, 200 * MIB, "{setting}");
        assert_eq!(oom.reserved_unallocated, 800 * MIB, "{setting}");
        assert_eq!(oom.largest_free_block, 16 * MIB, "{setting}");
        assert_eq!((oom.units, oom.pinned_units), (50, 50), "{setting}");
        assert!(oom.every_unit_pinned());
    }
}

/// A cached block split by a smaller request strands its tail; both settings avoid it.
#[test]
fn fragmentation_oom_that_a_setting_fixes() {
    let requests = [
        Request::Alloc { id: 1, size: 100 * MIB },
        Request::Free { id: 1 },
        Request::Alloc { id: 2, size: 60 * MIB },
        Request::Alloc { id: 3, size: 50 * MIB },
        Request::Alloc { id: 4, size: 60 * MIB },
    ];
    let run = |s: &str| replay(&conf(s), Some(200 * MIB), &requests).unwrap();

    let default = run("");
    assert_eq!(default.out_of_memory.len(), 1);
    let (step, oom) = &default.out_of_memory[0];
    assert_eq!(*step, 4);
    assert_eq!((oom.reserved, oom.allocated, oom.largest_free_block), (150 * MIB, 110 * MIB, 40 * MIB));
    assert!(oom.every_unit_pinned());

    let split = run("max_split_size_mb:64");
    assert!(split.out_of_memory.is_empty());
    assert_eq!(split.reserved, [100, 100, 160, 110, 170].map(|m| m * MIB).to_vec());
    assert_eq!((split.peak_reserved, split.peak_step), (170 * MIB, Some(4)));

    let expandable = run("expandable_segments:True");
    assert!(expandable.out_of_memory.is_empty());
    assert_eq!(expandable.reserved, [100, 100, 100, 120, 180].map(|m| m * MIB).to_vec());
    assert_eq!(expandable.allocated[4], 170 * MIB);
}

#[test]
fn expandable_segments_map_pages_and_unmap_free_ones() {
    let mut a = fresh("expandable_segments:True", Some(1000 * MIB));
    a.malloc(1, 30 * MIB).unwrap();
    assert_eq!(a.reserved(), 40 * MIB); // two 20 MiB pages
    assert!(a.malloc(2, 5 * MIB).unwrap().from_cache); // the 10 MiB left in the second page
    a.free(1).unwrap();
    // Only the first page is wholly free; the rest of the freed block stays mapped.
    assert_eq!(a.empty_cache(), 20 * MIB);
    assert_eq!(sizes(&a), vec![20 * MIB]);
    a.free(2).unwrap();
    assert_eq!(a.empty_cache(), 20 * MIB);
    assert!(a.segments().is_empty());

    let mut s = fresh("expandable_segments:True", None);
    s.malloc(1, 1000).unwrap();
    assert_eq!(s.reserved(), 2 * MIB);
    assert!(s.segments()[0].small_pool && s.segments()[0].expandable);
}

#[test]
fn garbage_collection_gives_back_the_oldest_free_segments() {
    let requests = |a: &mut CachingAllocator| {
        a.malloc(1, 30 * MIB).unwrap();
        a.free(1).unwrap();
        a.malloc(2, 40 * MIB).unwrap();
        a.free(2).unwrap();
        a.malloc(3, 60 * MIB).unwrap();
    };
    // Threshold 50 MiB of 100: the 30 MiB segment, idle longer than average, goes first and
    // that is enough; the 40 MiB one stays cached.
    let mut gc = fresh("garbage_collection_threshold:0.5", Some(100 * MIB));
    gc.set_memory_fraction(1.0);
    requests(&mut gc);
    assert_eq!(sizes(&gc), vec![40 * MIB, 60 * MIB]);

    // Without a memory fraction the threshold does nothing; the failed cudaMalloc frees both.
    let mut plain = fresh("garbage_collection_threshold:0.5", Some(100 * MIB));
    requests(&mut plain);
    assert_eq!(sizes(&plain), vec![60 * MIB]);
}

#[test]
fn config_parses_and_names_bad_settings() {
    let c = conf(
        "max_split_size_mb:128, expandable_segments:True,roundup_power2_divisions:4,garbage_collection_threshold:0.8",
    );
    assert_eq!(c.max_split_size, 128 * MIB);
    assert!(c.expandable_segments);
    assert_eq!(c.roundup_power2_divisions, [4; ROUNDUP_INTERVALS]);
    assert_eq!(c.garbage_collection_threshold, 0.8);
    assert_eq!(conf(""), AllocatorConfig::default());
    assert_eq!(conf("backend:native"), AllocatorConfig::default());

    let err = |s: &str| AllocatorConfig::parse(s).unwrap_err().to_string();
    assert!(err("max_split_size:128").contains("unknown key `max_split_size`"));
    assert!(err("max_split_size_mb:10").contains("`max_split_size_mb:10`"));
    assert!(err("garbage_collection_threshold:1.5").contains("strictly between"));
    assert!(err("expandable_segments:yes").contains("True or False"));
    assert!(err("roundup_power2_divisions:3").contains("power of 2"));
    assert!(err("max_split_size_mb:").contains("no value"));
    assert!(err("max_split_size_mb").contains("expected `:` near `max_split_size_mb`"));
}

#[test]
fn replay_check_finds_the_first_divergence() {
    let requests = [
        Request::Alloc { id: 1, size: 5 * MIB },
        Request::Alloc { id: 2, size: 16 * MIB },
        Request::Free { id: 1 },
        Request::EmptyCache,
    ];
    let c = AllocatorConfig::default();
    let r = replay(&c, None, &requests).unwrap();
    assert_eq!(r.reserved, [20, 36, 36, 16].map(|m| m * MIB).to_vec());
    let mut recorded: Vec<Recorded> = r
        .reserved
        .iter()
        .zip(&r.allocated)
        .map(|(&res, &all)| Recorded { allocated: Some(all), reserved: Some(res), out_of_memory: false })
        .collect();
    assert_eq!(replay_check(&c, None, &requests, &recorded, &[]), None);

    recorded[3].reserved = Some(36 * MIB); // as if empty_cache had kept the segment
    assert_eq!(
        replay_check(&c, None, &requests, &recorded, &[]),
        Some(Divergence::Counters {
            step: 3,
            expected_allocated: Some(16 * MIB),
            expected_reserved: Some(36 * MIB),
            allocated: 16 * MIB,
            reserved: 16 * MIB,
        })
    );
    let bad = [Request::Free { id: 9 }];
    assert!(matches!(replay(&c, None, &bad), Err(Divergence::BadRequest { step: 0, .. })));
}
