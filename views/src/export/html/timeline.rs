//! One curve of the report's timeline (a process's allocated, reserved or driver bytes on one
//! device) as a step function: every change while there are few, then, past `EXACT_POINTS`,
//! the first, lowest, highest and last value of each of `SLICES` equal slices of the run (M4
//! aggregation: drawn a pixel column a slice, the line looks as it would with every point, and
//! no peak is lost), so that a run of any length makes a curve of bounded size. At the instants
//! the report keeps the stacks of (`pin`), a summarized curve keeps its exact value too: what the
//! page reads there is what the capture held.

use serde::Serialize;

/// Changes kept one by one before a curve is summarized.
pub(crate) const EXACT_POINTS: usize = 6_000;
/// Slices of the run a summarized curve keeps four points of.
pub(crate) const SLICES: u64 = 1_500;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Metric {
    /// The allocator's live blocks (tensors), as it reported them.
    Allocated,
    /// The allocator's segments, its cache included.
    Reserved,
    /// Live driver allocations of device memory.
    Driver,
}

/// A curve: times (nanoseconds after the first event) and bytes from then on.
#[derive(Debug, Serialize)]
pub(crate) struct Curve {
    pub process: u32,
    pub device: Option<i32>,
    pub metric: Metric,
    /// True once the curve keeps four points a slice rather than every change.
    pub summarized: bool,
    pub t: Vec<u64>,
    pub v: Vec<u64>,
    #[serde(skip)]
    slice_ns: u64,
    #[serde(skip)]
    slice: Option<Slice>,
    /// Instants pinned while every change was kept, to pin again when summarizing.
    #[serde(skip)]
    exact_pins: Vec<u64>,
}

/// The four points kept of one slice.
#[derive(Debug, Clone)]
struct Slice {
    index: u64,
    first: (u64, u64),
    low: (u64, u64),
    high: (u64, u64),
    last: (u64, u64),
    /// Exact values at instants pinned within the slice.
    pins: Vec<(u64, u64)>,
}

impl Curve {
    /// `span_ns`: how long the run lasts, for the width of its slices.
    pub(crate) fn new(process: u32, device: Option<i32>, metric: Metric, span_ns: u64) -> Curve {
        Curve {
            process,
            device,
            metric,
            summarized: false,
            t: Vec::new(),
            v: Vec::new(),
            slice_ns: (span_ns / SLICES).max(1),
            slice: None,
            exact_pins: Vec::new(),
        }
    }

    /// The latest value.
    pub(crate) fn last(&self) -> Option<u64> {
        match &self.slice {
            Some(slice) => Some(slice.last.1),
            None => self.v.last().copied(),
        }
    }

    /// The value from `t` on; a value equal to the latest changes nothing.
    pub(crate) fn set(&mut self, t: u64, value: u64) {
        if self.last() == Some(value) {
            return;
        }
        if self.summarized {
            self.summarize(t, value);
            return;
        }
        if self.t.last() == Some(&t) {
            // Two changes in one nanosecond: the later one is what holds from then on.
            *self.v.last_mut().expect("t and v grow together") = value;
            return;
        }
        self.t.push(t);
        self.v.push(value);
        if self.t.len() > EXACT_POINTS {
            self.summarized = true;
            let points: Vec<(u64, u64)> = self.t.drain(..).zip(self.v.drain(..)).collect();
            let mut pins = std::mem::take(&mut self.exact_pins).into_iter().peekable();
            for (t, v) in points {
                while let Some(pin) = pins.next_if(|&pin| pin < t) {
                    self.pin(pin);
                }
                self.summarize(t, v);
            }
            for pin in pins {
                self.pin(pin);
            }
        }
    }

    fn summarize(&mut self, t: u64, value: u64) {
        let index = t / self.slice_ns;
        match &mut self.slice {
            Some(slice) if slice.index == index => {
                if value < slice.low.1 {
                    slice.low = (t, value);
                }
                if value > slice.high.1 {
                    slice.high = (t, value);
                }
                slice.last = (t, value);
            }
            _ => {
                self.close_slice();
                let point = (t, value);
                self.slice =
                    Some(Slice { index, first: point, low: point, high: point, last: point, pins: Vec::new() });
            }
        }
    }

    /// Keeps the exact value at `t` (the state after every change up to then), however the
    /// curve is kept.
    pub(crate) fn pin(&mut self, t: u64) {
        let Some(value) = self.last() else { return };
        if !self.summarized {
            self.exact_pins.push(t);
            return;
        }
        match &mut self.slice {
            Some(slice) if slice.index == t / self.slice_ns => slice.pins.push((t, value)),
            _ => {
                self.close_slice();
                self.push(t, value);
            }
        }
    }

    fn close_slice(&mut self) {
        let Some(slice) = self.slice.take() else { return };
        let mut points = vec![slice.first, slice.low, slice.high, slice.last];
        // A pin is taken after the changes at its instant: sorted after them.
        points.extend(slice.pins);
        points.sort_by_key(|&(t, _)| t);
        for (t, v) in points {
            self.push(t, v);
        }
    }

    /// A point; at the same instant as the last one, it replaces it (the later value holds).
    fn push(&mut self, t: u64, value: u64) {
        if self.t.last() == Some(&t) {
            *self.v.last_mut().expect("t and v grow together") = value;
        } else {
            self.t.push(t);
            self.v.push(value);
        }
    }

    /// The curve as written: its open slice closed.
    pub(crate) fn finish(&mut self) {
        self.close_slice();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn few_changes_are_kept_exactly_and_repeats_dropped() {
        let mut curve = Curve::new(0, Some(0), Metric::Allocated, 1_000);
        for (t, v) in [(0, 10), (5, 10), (7, 30), (7, 20), (9, 0)] {
            curve.set(t, v);
        }
        curve.finish();
        assert!(!curve.summarized);
        assert_eq!(curve.t, vec![0, 7, 9]);
        assert_eq!(curve.v, vec![10, 20, 0]);
    }

    #[test]
    fn many_changes_keep_each_slices_extremes_and_last_value() {
        let span = SLICES * 100;
        let mut curve = Curve::new(0, None, Metric::Driver, span);
        // A saw tooth: every slice of 100 ns climbs from 0 to 99 and the run ends at 7.
        for t in 0..span {
            curve.set(t, t % 100);
        }
        curve.set(span, 7);
        curve.finish();
        assert!(curve.summarized);
        assert!(curve.t.len() <= 3 * SLICES as usize + 2, "{} points", curve.t.len());
        assert_eq!(curve.v.iter().max(), Some(&99));
        assert_eq!(curve.v.iter().filter(|&&v| v == 99).count(), SLICES as usize);
        assert_eq!((curve.t.last(), curve.v.last()), (Some(&span), Some(&7)));
        assert!(curve.t.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn a_summarized_curve_is_exact_at_its_pins() {
        let span = SLICES * 100;
        let mut curve = Curve::new(0, None, Metric::Allocated, span);
        let pins = [1_234, 5_055, 77_777, span - 1];
        for t in 0..span {
            // A value that rises and falls within every slice.
            curve.set(t, 1_000 + (t * 37) % 91);
            if pins.contains(&t) {
                curve.pin(t);
            }
        }
        curve.finish();
        assert!(curve.summarized);
        let at = |t: u64| curve.v[curve.t.partition_point(|&x| x <= t) - 1];
        for t in pins {
            assert_eq!(at(t), 1_000 + (t * 37) % 91, "at {t}");
        }
    }
}
