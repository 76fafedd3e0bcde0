//! The line a capture keeps up to date on a terminal (stderr): what it has seen so far and how
//! to stop it, redrawn in place once a second. Nothing when stderr is a file or a pipe. Anything
//! else gpuprof writes to stderr first takes the line away (`clear`), so it never runs into it.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use gpuprof_model::bytes::human;
use gpuprof_model::findings::wording::count;

const REDRAW: Duration = Duration::from_secs(1);

/// Whether the line is on the terminal now.
static SHOWN: AtomicBool = AtomicBool::new(false);

/// What the line says.
pub struct Progress {
    pub events: u64,
    pub processes: u64,
    pub live_bytes: u64,
    pub lost: u64,
}

pub struct LiveLine {
    started: Instant,
    last: Option<Instant>,
}

impl LiveLine {
    /// A line when stderr is a terminal.
    pub fn for_stderr() -> Option<LiveLine> {
        std::io::stderr().is_terminal().then(|| LiveLine { started: Instant::now(), last: None })
    }

    /// Redraws the line when a second has passed since the last time.
    pub fn tick(&mut self, progress: impl FnOnce() -> Progress) {
        if self.last.is_some_and(|t| t.elapsed() < REDRAW) {
            return;
        }
        self.last = Some(Instant::now());
        let text = describe(&progress(), self.started.elapsed());
        // Erased, written, and the cursor back at its start: output of the job that follows
        // begins at the left edge.
        let mut stderr = std::io::stderr().lock();
        let _ = write!(stderr, "\r\x1b[2K{text}\r");
        let _ = stderr.flush();
        SHOWN.store(true, Ordering::Relaxed);
    }
}

/// "gpuprof: 12345 events · 3 CUDA processes · 1.2 GiB live · 8 s · Ctrl-C to stop"
pub(crate) fn describe(progress: &Progress, elapsed: Duration) -> String {
    let lost = if progress.lost > 0 { format!(" · {} lost", progress.lost) } else { String::new() };
    format!(
        "gpuprof: {} · {} · {} live{lost} · {} s · Ctrl-C to stop",
        count(progress.events, "event", "events"),
        count(progress.processes, "CUDA process", "CUDA processes"),
        human(progress.live_bytes),
        elapsed.as_secs()
    )
}

/// Takes the line away, if it is shown, before something else is written to stderr.
pub fn clear() {
    if SHOWN.swap(false, Ordering::Relaxed) {
        let mut stderr = std::io::stderr().lock();
        let _ = write!(stderr, "\r\x1b[2K");
        let _ = stderr.flush();
    }
}
