//! Scaling traces by a size: alignment and its refusals, the fit through two and three points,
//! and the search for the largest value that fits.

use super::*;

/// A step of a job at batch `b`: weights of 40 MiB kept, then per layer an activation of
/// `b` × 4 MiB and a score of `b`² × 2 MiB, freed in reverse; `empty_cache` at the end.
fn job(b: u64, layers: u64) -> AllocatorTrace {
    let mut requests = vec![Request::Alloc { id: 0, size: 40 * MIB }];
    let mut id = 1;
    let mut live = Vec::new();
    for _ in 0..layers {
        for size in [b * 4 * MIB, b * b * 2 * MIB] {
            requests.push(Request::Alloc { id, size });
            live.push(id);
            id += 1;
        }
    }
    while let Some(id) = live.pop() {
        requests.push(Request::Free { id });
    }
    requests.push(Request::EmptyCache);
    AllocatorTrace::of_requests(1, 0, requests)
}

fn scaling<'t>(points: &[(u64, &'t AllocatorTrace)]) -> Result<Scaling<'t>, ScaleError> {
    Scaling::align(points.iter().map(|&(value, trace)| ScalePoint { value, trace }).collect())
}

#[test]
fn three_recordings_predict_a_size_that_grows_with_its_square_exactly() {
    let (b2, b4, b6, b9) = (job(2, 3), job(4, 3), job(6, 3), job(9, 3));
    let scaling = scaling(&[(6, &b6), (2, &b2), (4, &b4)]).unwrap();
    assert_eq!(scaling.values(), [2, 4, 6]);
    assert_eq!(scaling.requests_at(9).unwrap().requests, b9.requests);
    assert_eq!(scaling.requests_at(4).unwrap().requests, b4.requests);
    assert_eq!(scaling.reach(5), Reach::Interpolated);
    assert_eq!(scaling.reach(9), Reach::Extrapolated { times: 1.5 });
    assert_eq!(scaling.reach(4), Reach::Recorded);
}

#[test]
fn two_recordings_draw_a_line() {
    let (b2, b4) = (job(2, 1), job(4, 1));
    let scaling = scaling(&[(2, &b2), (4, &b4)]).unwrap();
    // The activation is linear and exact; the score, b² × 2 MiB, is 8 MiB at 2 and 32 at 4:
    // the line through them gives 56 MiB at 6, not 72: a square needs a third point.
    let at6 = scaling.requests_at(6).unwrap().requests;
    assert_eq!(at6[1], Request::Alloc { id: 1, size: 24 * MIB });
    assert_eq!(at6[2], Request::Alloc { id: 2, size: 56 * MIB });
    assert_eq!(at6[0], Request::Alloc { id: 0, size: 40 * MIB }, "the weights do not scale");
    // Below the recorded values the scores' line reaches zero and less (-4 MiB at 1): held at
    // the least they were recorded at, and counted; the activations' line is still above zero.
    let at1 = scaling.requests_at(1).unwrap();
    assert_eq!(
        (at1.requests[1], at1.requests[2]),
        (Request::Alloc { id: 1, size: 4 * MIB }, Request::Alloc { id: 2, size: 8 * MIB })
    );
    assert_eq!(at1.held, 1);
    assert_eq!(scaling.requests_at(6).unwrap().held, 0);
}

#[test]
fn recordings_that_take_other_paths_are_refused_with_where() {
    let (b2, mut b4) = (job(2, 2), job(4, 2));
    b4.requests.insert(3, Request::EmptyCache);
    let error = scaling(&[(2, &b2), (4, &b4)]).unwrap_err();
    assert_eq!(
        error,
        ScaleError::Parted {
            step: 3,
            first: 2,
            second: 4,
            first_has: format!("block 3 allocated ({} bytes)", 8 * MIB),
            second_has: "empty_cache".to_string()
        }
    );
    let longer = job(4, 3);
    let error = scaling(&[(2, &b2), (4, &longer)]).unwrap_err();
    assert!(matches!(error, ScaleError::Parted { step: 5, .. }), "{error}");
    assert_eq!(scaling(&[(2, &b2)]).unwrap_err(), ScaleError::TooFew(1));
    assert_eq!(scaling(&[(2, &b2), (2, &b2)]).unwrap_err(), ScaleError::SameValue(2));
}

/// Frees with nothing between them may come in another order at another size (autocast's cache
/// of casts is freed in the order of their addresses): the same set, the same path.
#[test]
fn frees_together_in_another_order_are_the_same_path() {
    let (b2, mut b4) = (job(2, 3), job(4, 3));
    let frees = b4.requests.iter().position(|r| matches!(r, Request::Free { .. })).unwrap();
    b4.requests[frees..frees + 6].reverse();
    let scaling = scaling(&[(2, &b2), (4, &b4)]).unwrap();
    assert_eq!(scaling.requests_at(4).unwrap().requests, b4.requests);
    assert_eq!(scaling.requests_at(6).unwrap().requests[frees..frees + 6], b2.requests[frees..frees + 6]);
    // Another set is another path: at 4 the first of them frees block 1 instead of block 6.
    let mut other = job(4, 3);
    other.requests[frees] = Request::Free { id: 1 };
    assert!(matches!(scaling_error(&b2, &other), ScaleError::Parted { step, .. } if step == frees));
}

fn scaling_error(a: &AllocatorTrace, b: &AllocatorTrace) -> ScaleError {
    scaling(&[(2, a), (4, b)]).unwrap_err()
}

#[test]
fn a_recording_that_ran_out_of_memory_is_refused() {
    let (b2, mut b4) = (job(2, 1), job(4, 1));
    b4.recorded[2].out_of_memory = true;
    let error = scaling(&[(2, &b2), (4, &b4)]).unwrap_err();
    assert!(
        error.to_string().starts_with("the recording at 4 cannot be scaled: it ran out of memory at request 2"),
        "{error}"
    );
}

#[test]
fn the_largest_that_fits_is_the_brute_force_answer() {
    let traces: Vec<AllocatorTrace> = (1..=40).map(|b| job(b, 4)).collect();
    let scaling = scaling(&[(2, &traces[1]), (4, &traces[3]), (6, &traces[5])]).unwrap();
    let config = AllocatorConfig::parse("").unwrap();
    for budget in [600 * MIB, 2048 * MIB, 9000 * MIB] {
        let fits =
            |trace: &AllocatorTrace| replay(&config, Some(budget), &trace.requests).unwrap().out_of_memory.is_empty();
        let brute = traces.iter().rposition(fits).map(|i| i as u64 + 1);
        let found = scaling.largest(&config, Budget::Recorded(budget), 1).unwrap();
        assert_eq!(found, brute.map_or(Largest::None, Largest::At), "budget {budget}");
    }
    // In steps of 4: the largest multiple of 4 that fits.
    let found = scaling.largest(&config, Budget::Recorded(2048 * MIB), 4).unwrap();
    let fits = |b: u64| replay(&config, Some(2048 * MIB), &job(b, 4).requests).unwrap().out_of_memory.is_empty();
    let Largest::At(at) = found else { panic!("{found:?}") };
    assert!(at % 4 == 0 && fits(at) && !fits(at + 4), "{at}");
    assert_eq!(scaling.largest(&config, Budget::Recorded(10 * MIB), 1).unwrap(), Largest::None);
}

#[test]
fn a_job_whose_memory_does_not_grow_fits_at_any_size() {
    let (b2, b4) = (job(2, 0), job(4, 0));
    let scaling = scaling(&[(2, &b2), (4, &b4)]).unwrap();
    let config = AllocatorConfig::parse("").unwrap();
    assert_eq!(
        scaling.largest(&config, Budget::Recorded(1 << 30), 1).unwrap(),
        Largest::Unbounded { tried: LARGEST_TRIED }
    );
}
