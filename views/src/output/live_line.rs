//! The line a capture keeps up to date on a terminal (stderr): what it has seen so far and how
//! to stop it, redrawn in place once a second. Nothing when stderr is a file or a pipe, or when
//! the person asked for plain text (`drawn_on_stderr`). Anything else gpuprof writes to stderr
//! first takes the line away (`clear`), so it never runs into it. The progress of long work
//! (`progress`) is drawn, and taken away, the same way, as the same one line.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use gpuprof_model::bytes::human;
use gpuprof_model::findings::wording::count;

use super::colour;

const REDRAW: Duration = Duration::from_secs(1);

/// Whether a line is on the terminal now. Held while one is drawn or erased, so that a line
/// drawn from another thread (`progress::Pending`) and its erasure never cross.
static SHOWN: Mutex<bool> = Mutex::new(false);

/// How many times the line was taken away: a line drawn late (`draw_unless_cleared_since`) is
/// not drawn over what was said in between.
static CLEARED: AtomicU64 = AtomicU64::new(0);

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
    /// A line when stderr gets lines drawn in place (`drawn_on_stderr`).
    pub fn for_stderr() -> Option<LiveLine> {
        drawn_on_stderr().then(|| LiveLine { started: Instant::now(), last: None })
    }

    /// Redraws the line when a second has passed since the last time.
    pub fn tick(&mut self, progress: impl FnOnce() -> Progress) {
        if self.last.is_some_and(|t| t.elapsed() < REDRAW) {
            return;
        }
        self.last = Some(Instant::now());
        draw(&describe(&progress(), self.started.elapsed()));
    }
}

/// Whether stderr gets lines drawn in place: a terminal, unless the person asked for plain text
/// (`NO_COLOR`, `TERM=dumb`) — the rule of colour, as erasing a line is an escape sequence as
/// colour is. The capture's live line and the progress of long work both follow it.
pub fn drawn_on_stderr() -> bool {
    colour::on_stderr()
}

/// Draws `text` as the line, over the one shown.
pub(crate) fn draw(text: &str) {
    let mut shown = SHOWN.lock().unwrap_or_else(PoisonError::into_inner);
    write_line(text);
    *shown = true;
}

/// The count of clears so far, for `draw_unless_cleared_since`.
pub(crate) fn clears() -> u64 {
    CLEARED.load(Ordering::SeqCst)
}

/// Draws `text` as the line unless it was taken away since `clears` said `since`: something
/// else was said meanwhile, and a line drawn now would run into it.
pub(crate) fn draw_unless_cleared_since(since: u64, text: &str) {
    let mut shown = SHOWN.lock().unwrap_or_else(PoisonError::into_inner);
    if CLEARED.load(Ordering::SeqCst) == since {
        write_line(text);
        *shown = true;
    }
}

/// Erased, written, and the cursor back at its start: output of the job that follows begins at
/// the left edge.
fn write_line(text: &str) {
    let mut stderr = std::io::stderr().lock();
    let _ = write!(stderr, "\r\x1b[2K{text}\r");
    let _ = stderr.flush();
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
    let mut shown = SHOWN.lock().unwrap_or_else(PoisonError::into_inner);
    CLEARED.fetch_add(1, Ordering::SeqCst);
    if std::mem::take(&mut *shown) {
        let mut stderr = std::io::stderr().lock();
        let _ = write!(stderr, "\r\x1b[2K");
        let _ = stderr.flush();
    }
}
