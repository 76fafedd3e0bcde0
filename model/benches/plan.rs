//! What a plan costs on one core (`gpuprof whatif --scale`): a transformer-shaped job's requests
//! (weights kept; per step and layer an activation linear in the batch and attention scores,
//! freed in reverse; a million requests) at batch 8 and 16, against the baseline of one replay
//! of the recording at 16 under its settings:
//! - aligning the two traces,
//! - the requests at batch 32 (the fit),
//! - a replay at 32,
//! - the largest batch on an 80 GiB device (doubling, then halving: a replay per value tried).
//!
//!     cargo bench -p gpuprof-model --bench plan

use std::hint::black_box;
use std::time::Instant;

use gpuprof_model::allocator::{
    replay, AllocatorConfig, AllocatorTrace, Budget, Largest, Request, ScalePoint, Scaling, MIB,
};

const ROUNDS: usize = 3;
const STEPS: u64 = 5_000;
const LAYERS: u64 = 24;

/// The job's trace at `batch`: each step allocates 4 × LAYERS blocks and frees them.
fn trace(batch: u64) -> AllocatorTrace {
    let mut requests = Vec::new();
    let mut id = 0;
    for size in [96 * MIB, 96 * MIB, 4 * MIB] {
        requests.push(Request::Alloc { id, size });
        id += 1;
    }
    for step in 0..STEPS {
        let mut live = Vec::new();
        for layer in 0..LAYERS {
            let length = 1 + (step + layer) % 4;
            for size in [batch * length * 3 * MIB / 2, batch * length * length * MIB / 4, 2 * MIB + 512 * layer, 4096] {
                requests.push(Request::Alloc { id, size });
                live.push(id);
                id += 1;
            }
        }
        while let Some(id) = live.pop() {
            requests.push(Request::Free { id });
        }
    }
    AllocatorTrace::of_requests(1, 0, requests)
}

fn timed<T>(what: &str, baseline: Option<f64>, mut run: impl FnMut() -> T) -> (f64, T) {
    let mut best = f64::MAX;
    let mut out = None;
    for _ in 0..ROUNDS {
        let start = Instant::now();
        out = Some(black_box(run()));
        best = best.min(start.elapsed().as_secs_f64());
    }
    let ratio = baseline.map(|b| format!("  {:.2}x one replay", best / b)).unwrap_or_default();
    println!("{what:<48} {best:>8.3} s{ratio}");
    (best, out.expect("ran"))
}

fn main() {
    let (b8, b16) = (trace(8), trace(16));
    println!("{} requests a trace, best of {ROUNDS} rounds", b16.requests.len());
    let config = AllocatorConfig::parse("").unwrap();
    let (one, _) = timed("one replay at 16 (baseline)", None, || replay(&config, None, &b16.requests).unwrap());
    let points = || vec![ScalePoint { value: 8, trace: &b8 }, ScalePoint { value: 16, trace: &b16 }];
    let (_, scaling) = timed("aligning 8 and 16", Some(one), || Scaling::align(points()).unwrap());
    timed("the requests at 32 (the fit)", Some(one), || scaling.requests_at(32).unwrap());
    timed("a replay at 32", Some(one), || scaling.replay(32, &config, Budget::Unbounded).unwrap());
    let device = Budget::Recorded(80 << 30);
    let (_, largest) = timed("the largest batch on 80 GiB", Some(one), || scaling.largest(&config, device, 1).unwrap());
    let Largest::At(at) = largest else { panic!("{largest:?}") };
    println!("largest batch: {at}");
}
