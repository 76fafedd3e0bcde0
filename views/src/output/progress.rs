//! How far long work has gone, for a person waiting on it at a terminal: a pass over an event
//! file says its share of the file's bytes, events a second and the time left; replays say how
//! many are done; work that cannot count its steps (`Pending`) says what it is still doing. All
//! of it is one line on stderr, drawn in place as the capture's live line is (`live_line`: the
//! same rule of where, the same drawing), at most ten times a second, and erased when the work
//! ends. Nothing is drawn before the work has lasted half a second, so quick work stays quiet.
//!
//! A command a person runs turns it on (`show`); without that, as in the daemon, whose
//! post-mortem reports nobody waits on, passes say nothing.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::live_line;

/// The least time between two drawings of the line.
const REDRAW: Duration = Duration::from_millis(100);

/// How long work goes on before its line is drawn.
const AFTER: Duration = Duration::from_millis(500);

/// The progress of this command's passes, once it asked for it (`show`).
static SHOWN_FOR: Mutex<Option<Shown>> = Mutex::new(None);

struct Shown {
    /// What the passes are for, in words; None: "reading FILE".
    saying: Option<String>,
    /// Passes begun over each file: a second pass starts again from 0%, and says so.
    passes: HashMap<PathBuf, u32>,
}

/// While it lives, this command's long passes over event files draw their progress, where
/// stderr gets lines drawn in place.
#[must_use = "the progress is shown while this lives"]
pub struct Showing(());

impl Drop for Showing {
    fn drop(&mut self) {
        *SHOWN_FOR.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }
}

/// Long passes over event files say how far they are, from now until the `Showing` is dropped.
/// `saying`: what they are for ("writing the HTML report of 4,000,000 events to run.html");
/// None: "reading FILE".
pub fn show(saying: Option<String>) -> Showing {
    if live_line::drawn_on_stderr() {
        *SHOWN_FOR.lock().unwrap_or_else(PoisonError::into_inner) = Some(Shown { saying, passes: HashMap::new() });
    }
    Showing(())
}

/// One piece of long work's line: drawn once the work has lasted `AFTER`, erased when dropped.
pub(crate) struct ProgressLine {
    doing: String,
    started: Instant,
    after: Duration,
    drawn: Option<Instant>,
}

impl ProgressLine {
    /// The line of a pass over `input`, when the command shows progress.
    pub(crate) fn reading(input: &Path) -> Option<ProgressLine> {
        let mut shown = SHOWN_FOR.lock().unwrap_or_else(PoisonError::into_inner);
        let shown = shown.as_mut()?;
        let pass = shown.passes.entry(input.to_path_buf()).or_default();
        *pass += 1;
        let name = input.file_name().map_or_else(|| input.display().to_string(), |n| n.to_string_lossy().into_owned());
        let doing = shown.saying.clone().unwrap_or_else(|| format!("reading {name}"));
        let doing = if *pass > 1 { format!("{doing} (pass {pass})") } else { doing };
        Some(ProgressLine::new(doing))
    }

    /// The line of other work (`doing`, in words) the command does, when it shows progress.
    pub(crate) fn doing(doing: String) -> Option<ProgressLine> {
        SHOWN_FOR.lock().unwrap_or_else(PoisonError::into_inner).as_ref()?;
        Some(ProgressLine::new(doing))
    }

    fn new(doing: String) -> ProgressLine {
        ProgressLine { doing, started: Instant::now(), after: after(), drawn: None }
    }

    /// Redraws the line, `done` (0 to 1) of the work done, when it is due; `rate` says how fast
    /// it goes, from the seconds it has taken ("310,512 events/s").
    pub(crate) fn tick(&mut self, done: f64, rate: impl FnOnce(f64) -> String) {
        let now = Instant::now();
        let elapsed = now.duration_since(self.started);
        if elapsed < self.after || self.drawn.is_some_and(|t| now.duration_since(t) < REDRAW) {
            return;
        }
        self.drawn = Some(now);
        live_line::draw(&describe(&self.doing, done, &rate(elapsed.as_secs_f64()), elapsed));
    }
}

impl Drop for ProgressLine {
    fn drop(&mut self) {
        if self.drawn.is_some() {
            live_line::clear();
        }
    }
}

/// When work's line is drawn. GPUPROF_PROGRESS_AFTER_MS, not a setting people are told of, lets
/// the tests see the line on a file small enough to make quickly.
fn after() -> Duration {
    std::env::var("GPUPROF_PROGRESS_AFTER_MS").ok().and_then(|ms| ms.parse().ok()).map_or(AFTER, Duration::from_millis)
}

/// "gpuprof: reading run.gpuprof: 42% · 310,512 events/s · 3 s left"
pub(crate) fn describe(doing: &str, done: f64, rate: &str, elapsed: Duration) -> String {
    let done = done.clamp(0.0, 1.0);
    let left = if done > 0.0 { elapsed.as_secs_f64() * (1.0 - done) / done } else { f64::INFINITY };
    format!("gpuprof: {doing}: {}% · {rate} · {} left", (done * 100.0).floor() as u64, left_in_words(left))
}

/// "3 s", "2 min 05 s", "1 h 10 min"; "?" before anything is done.
fn left_in_words(secs: f64) -> String {
    if !secs.is_finite() {
        return "?".to_string();
    }
    let secs = secs.ceil() as u64;
    match secs {
        s if s < 60 => format!("{s} s"),
        s if s < 3600 => format!("{} min {:02} s", s / 60, s % 60),
        s => format!("{} h {:02} min", s / 3600, s % 3600 / 60),
    }
}

/// "4,000,000": a count people read at a glance.
pub fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// Work that cannot count its steps, said while it lasts: once it has gone on for half a second,
/// "gpuprof: TEXT…" is drawn as the line (from a thread of its own: the work gives no ticks) and
/// stays until the `Pending` is dropped. Not drawn when anything else was said meanwhile.
pub struct Pending {
    stop: Option<Sender<()>>,
    waiting: Option<JoinHandle<()>>,
    /// Drawn at once (no wait asked for).
    drawn: bool,
}

impl Pending {
    /// `text`: what is still being done ("writing the recording of 4,000,000 events to run.gpuprof").
    pub fn start(text: String) -> Pending {
        if !live_line::drawn_on_stderr() {
            return Pending { stop: None, waiting: None, drawn: false };
        }
        let text = format!("gpuprof: {text}…");
        let after = after();
        if after.is_zero() {
            live_line::draw(&text);
            return Pending { stop: None, waiting: None, drawn: true };
        }
        let (stop, stopped) = mpsc::channel::<()>();
        let since = live_line::clears();
        let waiting = std::thread::spawn(move || {
            if let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(after) {
                live_line::draw_unless_cleared_since(since, &text);
            }
        });
        Pending { stop: Some(stop), waiting: Some(waiting), drawn: false }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        // The sender gone, the thread wakes at once.
        drop(self.stop.take());
        let waited = self.waiting.take().map(JoinHandle::join).is_some();
        if waited || self.drawn {
            live_line::clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_says_how_far_how_fast_and_how_long_is_left() {
        let line = describe("reading run.gpuprof", 0.42, "310,512 events/s", Duration::from_secs(3));
        assert_eq!(line, "gpuprof: reading run.gpuprof: 42% · 310,512 events/s · 5 s left");
        let line = describe("reading run.gpuprof (pass 2)", 0.1, "3 of 9 replays", Duration::from_secs(20));
        assert_eq!(line, "gpuprof: reading run.gpuprof (pass 2): 10% · 3 of 9 replays · 3 min 00 s left");
        let line = describe("reading run.gpuprof", 0.0, "0 events/s", Duration::from_secs(1));
        assert_eq!(line, "gpuprof: reading run.gpuprof: 0% · 0 events/s · ? left");
        assert_eq!(left_in_words(4000.0), "1 h 06 min");
    }

    #[test]
    fn counts_are_grouped_by_thousands() {
        let counts = [0, 7, 999, 1000, 4_000_000, 12_345_678].map(grouped);
        assert_eq!(counts, ["0", "7", "999", "1,000", "4,000,000", "12,345,678"]);
    }
}
