//! The daemon's capture levels: every process at the daemon's level (`--level`, the driver's
//! calls by default), and some raised to tensor events for a while — when the escalation rules
//! see a reason (`model::escalation`: growth, a nearly full device, an out-of-memory failure) or
//! someone asks through the API (`POST /v1/level`) — then lowered again when their time is up.
//! A raised process gets allocator probes of its own (eBPF) or a word to its shim; no other
//! process pays for it.

use std::collections::BTreeMap;
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::{Duration, Instant};

use anyhow::Result;
use gpuprof_model::escalation::Reason;
use gpuprof_model::Level;
use serde::Serialize;

use gpuprof_capture::session::Session;

/// A request from the API, answered on `reply`.
pub(crate) struct Request {
    pub pid: u32,
    pub level: Level,
    /// How long a raised level lasts (None: the daemon's `--detail`).
    pub seconds: Option<f64>,
    pub reply: Sender<Reply>,
}

/// The answer to a request.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub(crate) enum Reply {
    Taken(Raised),
    /// The daemon follows no process of that pid.
    Unknown {
        error: String,
    },
}

/// One process recorded above the daemon's level.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Raised {
    pub pid: u32,
    pub level: Level,
    /// Seconds left at this level.
    pub seconds_left: f64,
    #[serde(flatten)]
    pub reason: Reason,
    #[serde(skip)]
    until: Instant,
}

/// The API's side: sends requests to the capture loop.
#[derive(Clone)]
pub(crate) struct Control {
    requests: Sender<Request>,
    /// What is raised now, as the loop last published it.
    published: std::sync::Arc<std::sync::Mutex<Vec<Raised>>>,
}

impl Control {
    /// Asks the loop and waits (up to 5 s) for its answer.
    pub(crate) fn ask(&self, pid: u32, level: Level, seconds: Option<f64>) -> Option<Reply> {
        let (reply, answer) = mpsc::channel();
        self.requests.send(Request { pid, level, seconds, reply }).ok()?;
        answer.recv_timeout(Duration::from_secs(5)).ok()
    }

    pub(crate) fn raised(&self) -> Vec<Raised> {
        let mut raised = self.published.lock().map(|r| r.clone()).unwrap_or_default();
        let now = Instant::now();
        for entry in &mut raised {
            entry.seconds_left = entry.until.saturating_duration_since(now).as_secs_f64();
        }
        raised
    }
}

/// The loop's side: the processes raised, and requests waiting.
pub(crate) struct Levels {
    /// The daemon's level: every process not raised.
    base: Level,
    detail: Duration,
    raised: BTreeMap<u32, Raised>,
    requests: Receiver<Request>,
    published: std::sync::Arc<std::sync::Mutex<Vec<Raised>>>,
    pub raises_total: u64,
}

impl Levels {
    pub(crate) fn new(base: Level, detail: Duration) -> (Levels, Control) {
        let (requests_in, requests) = mpsc::channel();
        let published = std::sync::Arc::default();
        let control = Control { requests: requests_in, published: std::sync::Arc::clone(&published) };
        (Levels { base, detail, raised: BTreeMap::new(), requests, published, raises_total: 0 }, control)
    }

    /// One turn: what the escalation rules decided, the API's requests, the levels whose time
    /// is up.
    pub(crate) fn turn(&mut self, session: &mut Session<'_>) -> Result<()> {
        for raise in session.flow_mut().take_raises() {
            if !self.raise(session, raise.pid, Level::Tensors, self.detail, raise.reason)? {
                // No tensors are coming: a growth finding on its driver calls need not wait.
                session.flow_mut().expect_tensors(raise.pid, gpuprof_model::event::wall_clock_ns(), 0);
            }
        }
        while let Ok(request) = self.requests.try_recv() {
            let reply = self.request(session, &request)?;
            let _ = request.reply.send(reply);
        }
        let now = Instant::now();
        let due: Vec<u32> = self.raised.values().filter(|r| r.until <= now).map(|r| r.pid).collect();
        for pid in due {
            self.lower(session, pid)?;
        }
        self.publish();
        Ok(())
    }

    fn request(&mut self, session: &mut Session<'_>, request: &Request) -> Result<Reply> {
        let unknown = || Reply::Unknown { error: format!("pid {} is not followed by this daemon", request.pid) };
        if request.level <= self.base {
            if self.raised.contains_key(&request.pid) {
                self.lower(session, request.pid)?;
            } else if !session.set_level(request.pid, request.level)? {
                return Ok(unknown());
            }
            let seconds = request.seconds.unwrap_or(0.0);
            let lowered = Raised {
                pid: request.pid,
                level: request.level,
                seconds_left: 0.0,
                reason: Reason::Requested,
                until: Instant::now(),
            };
            // Below the daemon's level (a pause) lasts as asked, then the daemon's level again.
            if request.level < self.base && seconds > 0.0 {
                let until = Instant::now() + Duration::from_secs_f64(seconds);
                self.raised.insert(request.pid, Raised { until, seconds_left: seconds, ..lowered.clone() });
            }
            return Ok(Reply::Taken(lowered));
        }
        let detail = request.seconds.map(Duration::from_secs_f64).unwrap_or(self.detail);
        if !self.raise(session, request.pid, request.level, detail, Reason::Requested)? {
            return Ok(unknown());
        }
        let flow = session.flow_mut();
        if request.level.tensors() {
            flow.tensors_requested(request.pid, gpuprof_model::event::wall_clock_ns(), detail.as_nanos() as u64);
        }
        if let Some(rules) = flow.escalation_mut() {
            rules.raised(request.pid);
        }
        Ok(Reply::Taken(self.raised[&request.pid].clone()))
    }

    /// Returns false for a process no capture follows.
    fn raise(
        &mut self,
        session: &mut Session<'_>,
        pid: u32,
        level: Level,
        detail: Duration,
        reason: Reason,
    ) -> Result<bool> {
        let taken = match session.set_level(pid, level) {
            Ok(taken) => taken,
            Err(error) => {
                session.flow_mut().notice(format!("warning: cannot raise pid {pid} to {level}: {error:#}"));
                false
            }
        };
        if !taken {
            return Ok(false);
        }
        let said = format!("pid {pid}: capturing {level} for {:.0} s ({})", detail.as_secs_f64(), reason.sentence());
        let until = Instant::now() + detail;
        self.raised.insert(pid, Raised { pid, level, seconds_left: detail.as_secs_f64(), reason, until });
        self.raises_total += 1;
        // Published before it is said: whoever reads the line finds it in GET /v1/levels.
        self.publish();
        session.flow_mut().notice(said);
        Ok(true)
    }

    /// What is raised now, for `Control::raised` (the API's thread).
    fn publish(&self) {
        if let Ok(mut published) = self.published.lock() {
            *published = self.raised.values().cloned().collect();
        }
    }

    fn lower(&mut self, session: &mut Session<'_>, pid: u32) -> Result<()> {
        if self.raised.remove(&pid).is_none() {
            return Ok(());
        }
        self.publish();
        // A process that exited meanwhile is simply not there any more.
        if session.set_level(pid, self.base).unwrap_or(false) {
            session.flow_mut().notice(format!("pid {pid}: back to {}", self.base));
        }
        if let Some(rules) = session.flow_mut().escalation_mut() {
            rules.lowered(pid);
        }
        Ok(())
    }

    /// Processes recorded above (or below) the daemon's level now.
    pub(crate) fn raised_now(&self) -> usize {
        self.raised.len()
    }
}
