//! Planning before running: from traces of one job recorded at two or more values of one size
//! (the batch size, the sequence length), the requests it would make at any other value, and
//! the largest value that fits a device.
//!
//! The traces must be the same program path: the same requests in the same order, allocations
//! and frees of the same blocks and `empty_cache` at the same places; only sizes may differ, and
//! the order of frees with nothing between them (`parting`).
//! Where they part, nothing is predicted and the first request where they do is said: a job
//! whose path depends on the size (another kernel chosen, a cuBLAS workspace made at one size
//! only) cannot be scaled soundly by fitting sizes.
//!
//! Each allocation's size is fitted through its recorded points by the polynomial of least
//! degree through them (Lagrange's: two recordings give a line, three a parabola for attention
//! scores that grow with the square of the length; a size that does not change stays as it is)
//! and rounded by the replay as the allocator rounds a request. Recorded sizes are block sizes
//! (already rounded to 512 bytes, or a whole block handed out), so a fitted size may be off by
//! the rounding of the recorded ones, more the farther it is extrapolated.

use super::{replay_at, AllocatorConfig, AllocatorTrace, Budget, Divergence, Replay, Request};

/// One trace and the value of the size it was recorded at.
#[derive(Debug, Clone, Copy)]
pub struct ScalePoint<'t> {
    pub value: u64,
    pub trace: &'t AllocatorTrace,
}

/// Traces of one job at several values of a size, aligned request by request.
#[derive(Debug, Clone)]
pub struct Scaling<'t> {
    /// By value, smallest first.
    points: Vec<ScalePoint<'t>>,
}

/// How far a value lies from the recorded ones.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Reach {
    /// One of the recorded values: its recording, as it is.
    Recorded,
    /// Between the smallest and the largest recorded value.
    Interpolated,
    /// Outside them: `times` the largest (above) or the smallest (below) recorded value.
    Extrapolated { times: f64 },
}

impl Reach {
    pub fn describe(&self) -> String {
        match *self {
            Reach::Recorded => "recorded".to_string(),
            Reach::Interpolated => "interpolated".to_string(),
            Reach::Extrapolated { times } if times >= 1.0 => {
                format!("extrapolated, {times:.2}× the largest recorded")
            }
            Reach::Extrapolated { times } => format!("extrapolated, {:.2}× below the smallest recorded", 1.0 / times),
        }
    }
}

/// Why traces cannot be scaled, or a value cannot be predicted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScaleError {
    #[error("scaling needs recordings at two values of the size at least; {0} given")]
    TooFew(usize),
    #[error("two recordings are at the same value {0}: each must be at a value of its own")]
    SameValue(u64),
    #[error("the recording at {value} cannot be scaled: {why}")]
    Unusable { value: u64, why: String },
    #[error(
        "the recordings at {first} and {second} part at request {step}: {first_has} at {first}, {second_has} at {second}; \
         the job does not take the same path at both sizes, so no size between or beyond them can be predicted"
    )]
    Parted { step: usize, first: u64, second: u64, first_has: String, second_has: String },
    #[error("a value of the size must be 1 or more")]
    Zero,
}

impl<'t> Scaling<'t> {
    /// Aligns the traces one request to one; refuses, naming the first request where they part.
    pub fn align(mut points: Vec<ScalePoint<'t>>) -> Result<Self, ScaleError> {
        if points.len() < 2 {
            return Err(ScaleError::TooFew(points.len()));
        }
        points.sort_by_key(|p| p.value);
        if let Some(pair) = points.windows(2).find(|pair| pair[0].value == pair[1].value) {
            return Err(ScaleError::SameValue(pair[0].value));
        }
        for point in &points {
            if point.value == 0 {
                return Err(ScaleError::Zero);
            }
            if let Some(why) = &point.trace.incomplete {
                return Err(ScaleError::Unusable { value: point.value, why: why.clone() });
            }
            if let Some(step) = point.trace.recorded.iter().position(|r| r.out_of_memory) {
                return Err(ScaleError::Unusable {
                    value: point.value,
                    why: format!(
                        "it ran out of memory at request {step}, and a job that dies there asks nothing after it; record it at a size that fits"
                    ),
                });
            }
        }
        let first = &points[0];
        for other in &points[1..] {
            let (a, b) = (&first.trace.requests, &other.trace.requests);
            if let Some(step) = parting(a, b) {
                return Err(ScaleError::Parted {
                    step,
                    first: first.value,
                    second: other.value,
                    first_has: described(a.get(step)),
                    second_has: described(b.get(step)),
                });
            }
        }
        Ok(Scaling { points })
    }

    pub fn values(&self) -> Vec<u64> {
        self.points.iter().map(|p| p.value).collect()
    }

    /// The trace recorded at `value`, if one was.
    pub fn recorded(&self, value: u64) -> Option<&'t AllocatorTrace> {
        self.points.iter().find(|p| p.value == value).map(|p| p.trace)
    }

    pub fn reach(&self, value: u64) -> Reach {
        let (least, most) = (self.points[0].value, self.points[self.points.len() - 1].value);
        if self.recorded(value).is_some() {
            Reach::Recorded
        } else if (least..=most).contains(&value) {
            Reach::Interpolated
        } else if value > most {
            Reach::Extrapolated { times: value as f64 / most as f64 }
        } else {
            Reach::Extrapolated { times: value as f64 / least as f64 }
        }
    }

    /// The requests at `value`: each allocation's size fitted through its recorded points. A
    /// size that shrinks as the size grows (a library's workspace picked by a heuristic) may
    /// fit to nothing or less far enough out: it is held at the least it was recorded at, which
    /// over-states what the job asks rather than under-state it, and counted (`held`).
    pub fn requests_at(&self, value: u64) -> Result<Scaled, ScaleError> {
        if value == 0 {
            return Err(ScaleError::Zero);
        }
        if let Some(trace) = self.recorded(value) {
            return Ok(Scaled { requests: trace.requests.clone(), held: 0 });
        }
        let first = self.points[0].trace;
        let mut sizes = vec![0u64; self.points.len()];
        let mut scaled = Scaled { requests: Vec::with_capacity(first.requests.len()), held: 0 };
        for (step, request) in first.requests.iter().enumerate() {
            let Request::Alloc { id, .. } = *request else {
                scaled.requests.push(*request);
                continue;
            };
            for (size, point) in sizes.iter_mut().zip(&self.points) {
                let Request::Alloc { size: recorded, .. } = point.trace.requests[step] else {
                    unreachable!("aligned traces allocate at the same requests")
                };
                *size = recorded;
            }
            let fitted = self.fitted(&sizes, value);
            let size = if fitted > 0 {
                fitted as u64
            } else {
                scaled.held += 1;
                sizes.iter().copied().min().expect("two points at least")
            };
            scaled.requests.push(Request::Alloc { id, size });
        }
        Ok(scaled)
    }

    /// Lagrange's polynomial through `(value of each point, its size)` at `value`, to the byte.
    fn fitted(&self, sizes: &[u64], value: u64) -> i128 {
        if sizes.iter().all(|&s| s == sizes[0]) {
            return sizes[0] as i128;
        }
        let x = value as f64;
        let mut sum = 0.0;
        for (i, point) in self.points.iter().enumerate() {
            let mut term = sizes[i] as f64;
            for (j, other) in self.points.iter().enumerate() {
                if i != j {
                    term *= (x - other.value as f64) / (point.value as f64 - other.value as f64);
                }
            }
            sum += term;
        }
        sum.round() as i128
    }

    /// The recorded trace nearest `value`, whose segment addresses a replay at `value` borrows
    /// (a replay lays each segment where the job's of the same size, made in the same order,
    /// lay).
    fn nearest(&self, value: u64) -> &'t AllocatorTrace {
        self.points.iter().min_by_key(|p| p.value.abs_diff(value)).map(|p| p.trace).expect("two points at least")
    }

    /// The replay at `value` under `config` within `budget`.
    pub fn replay(&self, value: u64, config: &AllocatorConfig, budget: Budget) -> Result<Planned, PlanError> {
        let scaled = self.requests_at(value)?;
        let addresses = &self.nearest(value).segment_addresses;
        let replay = replay_at(config, budget.bytes(), &scaled.requests, addresses)?;
        Ok(Planned { replay, held: scaled.held })
    }

    /// The largest value (a multiple of `step`) whose replay under `config` within `budget`
    /// never runs out of memory, found by doubling from the largest recorded value, then
    /// halving the interval; `None` when even `step` does not fit. Memory is taken to grow with
    /// the size (it does wherever a size scales tensors); values past `LARGEST_TRIED` are not
    /// tried, and a job that fits there is said to fit at any size.
    pub fn largest(&self, config: &AllocatorConfig, budget: Budget, step: u64) -> Result<Largest, PlanError> {
        let step = step.max(1);
        let fits = |value: u64| -> Result<bool, PlanError> {
            Ok(self.replay(value, config, budget)?.replay.out_of_memory.is_empty())
        };
        let most = self.points[self.points.len() - 1].value;
        let start = (most / step).max(1) * step;
        let (mut low, mut high) = if fits(start)? {
            let mut low = start;
            loop {
                let next = low.saturating_mul(2);
                if next > LARGEST_TRIED {
                    return Ok(Largest::Unbounded { tried: low });
                }
                if !fits(next)? {
                    break (low, next);
                }
                low = next;
            }
        } else {
            if !fits(step)? {
                return Ok(Largest::None);
            }
            (step, start)
        };
        // `low` fits, `high` does not; both multiples of `step`.
        while high - low > step {
            let middle = low + (high - low) / step / 2 * step;
            if fits(middle)? {
                low = middle;
            } else {
                high = middle;
            }
        }
        Ok(Largest::At(low))
    }
}

/// A job's requests at a value of the size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scaled {
    pub requests: Vec<Request>,
    /// Sizes whose fit reached nothing at that value, held at the least they were recorded at.
    pub held: usize,
}

/// A replay at a value of the size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    pub replay: Replay,
    /// As `Scaled::held`.
    pub held: usize,
}

/// Values beyond this are not tried when searching the largest that fits.
pub const LARGEST_TRIED: u64 = 1 << 20;

/// What `Scaling::largest` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Largest {
    At(u64),
    /// Even the least value runs out of memory.
    None,
    /// Memory does not grow enough with the size to run out by `tried`.
    Unbounded {
        tried: u64,
    },
}

/// Why a value could not be planned.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Scale(#[from] ScaleError),
    #[error("the replay cannot go on at {0}")]
    Replay(#[from] Divergence),
}

/// The first request where two traces take different paths, if they do. Frees with nothing else
/// between them are one set, their order free: the allocator ends them in the same state
/// whatever the order (a freed block merges with its free neighbours either way, and nothing is
/// reserved or handed out meanwhile), and a job frees such sets in an order that depends on
/// addresses — autocast's cache of casts, a dictionary of tensors.
fn parting(a: &[Request], b: &[Request]) -> Option<usize> {
    let mut step = 0;
    while step < a.len().max(b.len()) {
        match (a.get(step), b.get(step)) {
            (Some(Request::Free { .. }), Some(Request::Free { .. })) => {
                let frees = |trace: &[Request]| -> Vec<u64> {
                    trace[step..]
                        .iter()
                        .map_while(|r| if let Request::Free { id } = r { Some(*id) } else { None })
                        .collect()
                };
                let (mut x, mut y) = (frees(a), frees(b));
                if x.len() != y.len() {
                    return Some(step + x.len().min(y.len()));
                }
                let length = x.len();
                x.sort_unstable();
                y.sort_unstable();
                if x != y {
                    return Some(step);
                }
                step += length;
            }
            (Some(Request::Alloc { id: x, .. }), Some(Request::Alloc { id: y, .. })) if x == y => step += 1,
            (Some(Request::EmptyCache), Some(Request::EmptyCache)) => step += 1,
            _ => return Some(step),
        }
    }
    None
}

fn described(request: Option<&Request>) -> String {
    match request {
        None => "nothing more".to_string(),
        Some(Request::Alloc { id, size }) => format!("block {id} allocated ({} bytes)", size),
        Some(Request::Free { id }) => format!("block {id} freed"),
        Some(Request::EmptyCache) => "empty_cache".to_string(),
    }
}
