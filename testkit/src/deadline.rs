//! Every wait of a test has a deadline: a child process, a line it should print, an HTTP answer.
//! What overstays fails the test naming what it waited for and how long, instead of hanging the
//! suite (the test runner's limit, scripts/test-runner.py, is the last resort behind these).

use std::io::{BufRead, BufReader, Read};
use std::os::fd::{AsFd, AsRawFd};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long a test waits for what should end on its own — a command, a capture, a server's
/// answer — before it takes it for hung. Generous: a loaded CI machine is slow, not stuck.
pub const PATIENCE: Duration = Duration::from_secs(300);

/// How long a workload gets to say it is ready.
pub const READY_LIMIT: Duration = Duration::from_secs(60);

/// How long one HTTP request of a test may take, connection included.
pub const HTTP_LIMIT: Duration = Duration::from_secs(30);

/// `Command::output` and `Command::status` with a deadline: the command is killed when it
/// overstays and the test fails naming it (its program and arguments).
pub trait CommandWithin {
    /// Runs to the end with stdout and stderr captured and stdin closed, as `output()` does.
    fn output_within(&mut self, limit: Duration) -> Output;
    /// Runs to the end with the test's stdio, as `status()` does.
    fn status_within(&mut self, limit: Duration) -> ExitStatus;
}

impl CommandWithin for Command {
    fn output_within(&mut self, limit: Duration) -> Output {
        let what = describe(self);
        self.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let child = self.spawn().unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        child.output_within(limit, &what)
    }

    fn status_within(&mut self, limit: Duration) -> ExitStatus {
        let what = describe(self);
        let mut child = self.spawn().unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        child.wait_within(limit, &what)
    }
}

/// `Child::wait` and `Child::wait_with_output` with a deadline, naming `what` when it passes;
/// as those do, the child's stdin is closed first.
pub trait ChildWithin {
    fn wait_within(&mut self, limit: Duration, what: &str) -> ExitStatus;
    /// Reads what the child's piped stdout and stderr carry until it ends (an unpiped one comes
    /// back empty).
    fn output_within(self, limit: Duration, what: &str) -> Output;
}

impl ChildWithin for Child {
    fn wait_within(&mut self, limit: Duration, what: &str) -> ExitStatus {
        // As `wait` does: a child reading its stdin to the end would otherwise wait for us.
        drop(self.stdin.take());
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.try_wait().unwrap_or_else(|e| panic!("cannot wait for {what}: {e}")) {
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.kill();
                let _ = self.wait();
                panic!("{what} (pid {}) did not end within {limit:?}: killed", self.id());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn output_within(mut self, limit: Duration, what: &str) -> Output {
        let deadline = Instant::now() + limit;
        let stdout = self.stdout.take().map(|pipe| drain(Box::new(pipe)));
        let stderr = self.stderr.take().map(|pipe| drain(Box::new(pipe)));
        let status = self.wait_within(limit, what);
        // A process the child left behind may hold its pipes open past its end: what was read by
        // the deadline is what the test gets, and it is said.
        let collect = |pipe: Option<mpsc::Receiver<Vec<u8>>>, name: &str| {
            let Some(pipe) = pipe else { return Vec::new() };
            let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_secs(1));
            pipe.recv_timeout(left).unwrap_or_else(|_| {
                panic!("{what} ended, but its {name} stayed open past {limit:?} (a process it started holds it)")
            })
        };
        Output { status, stdout: collect(stdout, "stdout"), stderr: collect(stderr, "stderr") }
    }
}

fn drain(mut pipe: Box<dyn Read + Send>) -> mpsc::Receiver<Vec<u8>> {
    let (done, read) = mpsc::channel();
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        let _ = done.send(bytes);
    });
    read
}

/// "`gpuprof report -f json /tmp/x.gpuprof`": the program's file name and its arguments, cut
/// at 160 characters.
fn describe(command: &Command) -> String {
    let program = std::path::Path::new(command.get_program());
    let mut words = vec![program.file_name().unwrap_or(program.as_os_str()).to_string_lossy().into_owned()];
    words.extend(command.get_args().map(|arg| arg.to_string_lossy().into_owned()));
    let mut said = words.join(" ");
    if said.len() > 160 {
        let cut = (0..=160).rev().find(|&at| said.is_char_boundary(at)).unwrap_or(0);
        said.truncate(cut);
        said.push('…');
    }
    format!("`{said}`")
}

/// An HTTP client for tests: every request ends within [`HTTP_LIMIT`], and an answer with an
/// error status is an answer (the tests check statuses), not an error.
pub fn http_client() -> ureq::Agent {
    ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(HTTP_LIMIT)).build().into()
}

/// Why a line did not come.
#[derive(Debug)]
pub enum NoLine {
    /// The deadline passed; what had come of the line.
    TimedOut(String),
    /// The stream ended (the process exited); what had come of the line.
    Ended(String),
}

impl std::fmt::Display for NoLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NoLine::TimedOut(partial) => write!(f, "nothing more came in time; the line so far: {partial:?}"),
            NoLine::Ended(partial) => write!(f, "the stream ended; the line so far: {partial:?}"),
        }
    }
}

/// One line from `reader`, waiting no later than `deadline` whether or not anything arrives: a
/// silent process fails the test, saying what it waited for, instead of hanging it.
pub fn read_line_before<R: Read + AsFd>(reader: &mut BufReader<R>, deadline: Instant) -> Result<String, NoLine> {
    let mut line = Vec::new();
    loop {
        let buffered = reader.buffer();
        if let Some(end) = buffered.iter().position(|&b| b == b'\n') {
            line.extend_from_slice(&buffered[..=end]);
            reader.consume(end + 1);
            return Ok(String::from_utf8_lossy(&line).into_owned());
        }
        let taken = buffered.len();
        line.extend_from_slice(buffered);
        reader.consume(taken);
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(NoLine::TimedOut(String::from_utf8_lossy(&line).into_owned()));
        }
        let mut ready = libc::pollfd { fd: reader.get_ref().as_fd().as_raw_fd(), events: libc::POLLIN, revents: 0 };
        let millis = left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        // SAFETY: one pollfd of ours, for the length of the call.
        if unsafe { libc::poll(&mut ready, 1, millis) } <= 0 {
            // Nothing yet (or a signal): the deadline is checked again above.
            continue;
        }
        if reader.fill_buf().unwrap().is_empty() {
            return Err(NoLine::Ended(String::from_utf8_lossy(&line).into_owned()));
        }
    }
}

/// One line within `limit`, or the test fails naming `what` it waited for.
pub fn line_within<R: Read + AsFd>(reader: &mut BufReader<R>, limit: Duration, what: &str) -> String {
    read_line_before(reader, Instant::now() + limit).unwrap_or_else(|no| panic!("waited {limit:?} for {what}: {no}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stdout_of(script: &str) -> (Child, BufReader<std::process::ChildStdout>) {
        let mut child = Command::new("sh").args(["-c", script]).stdout(Stdio::piped()).spawn().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        (child, stdout)
    }

    #[test]
    fn a_silent_process_times_out_at_the_deadline_and_an_ended_one_says_so() {
        let (mut child, mut stdout) = stdout_of("printf 'one\\npart'; sleep 5");
        let soon = Instant::now() + Duration::from_millis(300);
        assert_eq!(read_line_before(&mut stdout, soon).unwrap(), "one\n");
        let began = Instant::now();
        match read_line_before(&mut stdout, soon) {
            Err(NoLine::TimedOut(partial)) => assert_eq!(partial, "part"),
            other => panic!("{other:?}"),
        }
        assert!(began.elapsed() < Duration::from_secs(2), "{:?}", began.elapsed());
        child.kill().unwrap();
        child.wait().unwrap();

        let (mut child, mut stdout) = stdout_of("printf 'last'");
        match read_line_before(&mut stdout, Instant::now() + Duration::from_secs(10)) {
            Err(NoLine::Ended(partial)) => assert_eq!(partial, "last"),
            other => panic!("{other:?}"),
        }
        child.wait().unwrap();
    }

    /// What a wait that fails said, and how long it took to fail.
    fn failure_of(wait: impl FnOnce() + std::panic::UnwindSafe) -> (String, Duration) {
        let began = Instant::now();
        let panic = std::panic::catch_unwind(wait).expect_err("the wait fails");
        let said = panic.downcast_ref::<String>().cloned().unwrap_or_default();
        (said, began.elapsed())
    }

    #[test]
    fn a_command_that_overstays_is_killed_and_named() {
        let (said, took) = failure_of(|| {
            Command::new("sleep").arg("30").output_within(Duration::from_millis(300));
        });
        assert!(said.starts_with("`sleep 30` (pid ") && said.ends_with(") did not end within 300ms: killed"), "{said}");
        assert!(took < Duration::from_secs(5), "{took:?}");

        let (said, _) = failure_of(|| {
            Command::new("sleep").arg("30").status_within(Duration::from_millis(200));
        });
        assert!(said.ends_with("did not end within 200ms: killed"), "{said}");
    }

    #[test]
    fn a_command_that_ends_gives_its_output_and_status() {
        let output = Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]).output_within(PATIENCE);
        assert_eq!(
            (output.status.code(), &output.stdout[..], &output.stderr[..]),
            (Some(3), &b"out\n"[..], &b"err\n"[..])
        );
        assert_eq!(Command::new("true").status_within(PATIENCE).code(), Some(0));
    }

    #[test]
    fn a_pipe_held_open_by_what_the_command_left_behind_fails_at_the_deadline() {
        let (said, took) = failure_of(|| {
            Command::new("sh").args(["-c", "sleep 3 & echo started"]).output_within(Duration::from_millis(500));
        });
        assert_eq!(said, "`sh -c sleep 3 & echo started` ended, but its stdout stayed open past 500ms (a process it started holds it)");
        assert!(took < Duration::from_secs(5), "{took:?}");
    }
}
