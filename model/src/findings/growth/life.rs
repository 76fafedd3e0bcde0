//! A series' live bytes through its whole life, sampled on the clock: the live windows need a
//! run longer than `growth_rises` windows (30 s by default), while a test, an evaluation script
//! or a notebook cell that leaks ends in seconds. Sampled at a step that doubles whenever the
//! samples fill up, a life of any length keeps at most [`SAMPLES`] points, and the curve can be
//! judged when the process ends: steady rise, or churn and plateaus.

use serde::{Deserialize, Serialize};

/// Points kept per series.
const SAMPLES: usize = 64;
/// The first sampling step; it doubles as the life grows.
const FIRST_STEP_NS: u64 = 50_000_000;
/// Where the life is judged: at these many equal steps of it.
const CHECKPOINTS: usize = 8;
/// Checkpoints that must each be higher than the one before (of `CHECKPOINTS`): a steady rise,
/// which churn (blocks allocated and freed every step, sampled at random phases) is not.
const RISES: usize = 6;
/// A life shorter than this is not judged: too few steps to tell a rise from one step's peak.
pub(crate) const MIN_LIFE_NS: u64 = 1_000_000_000;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Life {
    /// When the first allocation was made.
    start: u64,
    step: u64,
    /// Live bytes at `start + (i + 1) * step`.
    values: Vec<u64>,
    /// Live bytes right after the first allocation.
    first: u64,
}

/// How a life rose: from `from` bytes at `start` to `to` at the end judged.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Rise {
    pub start: u64,
    pub from: u64,
    pub to: u64,
}

impl Life {
    pub(crate) fn begin(ts: u64, live: u64) -> Life {
        Life { start: ts, step: FIRST_STEP_NS, values: Vec::new(), first: live }
    }

    /// Not begun: the series has made no allocation since it was known.
    pub(crate) fn is_empty(&self) -> bool {
        self.step == 0
    }

    /// The series changes at `ts`; `live` is what it held until then.
    pub(crate) fn advance(&mut self, ts: u64, live: u64) {
        if self.is_empty() {
            return;
        }
        loop {
            let next = self.start + self.step * (self.values.len() as u64 + 1);
            if next > ts {
                return;
            }
            if self.values.len() == SAMPLES {
                // Every other point, at twice the step: values[j] is then at start + (j+1)·2·step.
                self.values = self.values.iter().skip(1).step_by(2).copied().collect();
                self.step *= 2;
                continue;
            }
            let crossed = ((ts - next) / self.step + 1) as usize;
            let room = SAMPLES - self.values.len();
            self.values.extend(std::iter::repeat_n(live, crossed.min(room)));
        }
    }

    /// The rise over `[start, end]` when it was steady, `at_end` being what the series held at
    /// `end`; `None` for churn, a plateau, a fall, or a life too short to tell.
    pub(crate) fn steady_rise(&self, end: u64, at_end: u64) -> Option<Rise> {
        if self.is_empty() || end < self.start + MIN_LIFE_NS {
            return None;
        }
        let span = end - self.start;
        let mut points = vec![self.first];
        for k in 1..CHECKPOINTS {
            points.push(self.value_at(self.start + span * k as u64 / CHECKPOINTS as u64, at_end));
        }
        points.push(at_end);
        let rises = points.windows(2).filter(|pair| pair[1] > pair[0]).count();
        let grew = at_end.saturating_sub(self.first);
        // A dip of a step's own blocks between two checkpoints is allowed; giving back what grew is not.
        let dips = points.windows(2).any(|pair| pair[1] + grew / (2 * CHECKPOINTS as u64) < pair[0]);
        let highest = points.iter().copied().max().unwrap_or(0);
        (rises >= RISES && !dips && at_end >= highest && grew > 0).then_some(Rise {
            start: self.start,
            from: self.first,
            to: at_end,
        })
    }

    /// Live bytes at `t`: the sample taken at or before it; `latest` past the last sample (the
    /// series did not change after it).
    fn value_at(&self, t: u64, latest: u64) -> u64 {
        let Some(index) = ((t - self.start) / self.step).checked_sub(1) else { return self.first };
        self.values.get(index as usize).copied().unwrap_or(latest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const MS: u64 = 1_000_000;

    /// A series driven step by step: `during` bytes live while a step runs, `kept` more after
    /// each step.
    fn life_of(steps: u64, step_ms: u64, during: u64, kept: u64) -> (Life, u64, u64) {
        let mut live = during;
        let mut life = Life::begin(0, live);
        for step in 0..steps {
            let ts = step * step_ms * MS;
            life.advance(ts + step_ms * MS / 2, live);
            live -= during;
            live += kept;
            life.advance(ts + step_ms * MS, live);
            live += during;
        }
        (life, steps * step_ms * MS, live - during)
    }

    #[test]
    fn a_leak_of_six_seconds_rises_steadily() {
        let (life, end, held) = life_of(300, 20, 8 * MIB, MIB);
        assert_eq!(held, 300 * MIB);
        let rise = life.steady_rise(end, held).unwrap();
        assert_eq!(rise, Rise { start: 0, from: 8 * MIB, to: 300 * MIB });
        // Four hours at the same pace keep 64 points and the same judgment.
        let (life, end, held) = life_of(720_000, 20, 0, 64 << 10);
        assert!(life.values.len() <= SAMPLES);
        assert!(life.steady_rise(end, held).is_some());
    }

    #[test]
    fn churn_a_plateau_and_given_back_are_not_rises() {
        let (life, end, held) = life_of(300, 20, 8 * MIB, 0);
        assert_eq!(life.steady_rise(end, held), None, "churn");
        // A warm-up: 20 steps keep memory, then it stays.
        let mut life = Life::begin(0, MIB);
        for step in 1..300u64 {
            life.advance(step * 20 * MS, MIB * step.min(20));
        }
        assert_eq!(life.steady_rise(6_000 * MS, 20 * MIB), None, "plateau");
        // Rose, then given back before the end.
        let (life, _, held) = life_of(300, 20, 0, MIB);
        assert!(life.steady_rise(6_000 * MS, held).is_some());
        assert_eq!(life.steady_rise(6_000 * MS, held / 2), None, "given back");
        assert_eq!(life.steady_rise(900 * MS, held), None, "too short to tell");
    }
}
