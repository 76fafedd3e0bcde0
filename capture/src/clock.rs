//! BPF stamps records with CLOCK_MONOTONIC; the event contract wants wall-clock nanoseconds.
//! The offset between the two is taken once, at start.

#[derive(Debug, Clone, Copy)]
pub struct Clock {
    offset_ns: i128,
}

fn now_ns(clock: libc::clockid_t) -> i128 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid timespec; both clocks exist on every Linux.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec)
}

impl Clock {
    pub(crate) fn new() -> Self {
        Clock { offset_ns: now_ns(libc::CLOCK_REALTIME) - now_ns(libc::CLOCK_MONOTONIC) }
    }

    /// A clock whose wall time equals monotonic time plus `offset_ns` (benchmarks, tests).
    pub fn with_offset(offset_ns: i128) -> Self {
        Clock { offset_ns }
    }

    pub(crate) fn wall_ns(&self, monotonic_ns: u64) -> u64 {
        (i128::from(monotonic_ns) + self.offset_ns).clamp(0, i128::from(u64::MAX)) as u64
    }

    /// CLOCK_MONOTONIC now, as BPF reads it.
    #[cfg(test)]
    pub(crate) fn monotonic_now() -> u64 {
        now_ns(libc::CLOCK_MONOTONIC) as u64
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wall_time_is_monotonic_plus_offset() {
        let clock = Clock::new();
        let before = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
        let wall = clock.wall_ns(Clock::monotonic_now());
        let after = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
        assert!(before <= wall + 1_000_000 && wall <= after + 1_000_000, "{before} {wall} {after}");
    }
}
