//! A `gpuprof daemon` under test: started with its stderr read line by line (the line it says
//! when ready gives its HTTP address), its endpoints and metrics, stopped with SIGTERM.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{gpuprof, http_client, ChildWithin};

/// A daemon sees every CUDA process of the machine: two at once would see each other's
/// workloads, so the tests that run one take turns.
static NODE: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub fn one_daemon_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    NODE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub struct Daemon {
    pub child: Child,
    /// The line it said when it started.
    pub started: String,
    pub health: String,
    agent: ureq::Agent,
    pub stderr: std::sync::mpsc::Receiver<String>,
}

impl Daemon {
    pub fn start(args: &[&str]) -> Daemon {
        Daemon::start_under(&[], args)
    }

    /// `wrapper… gpuprof daemon args…` (a wrapper such as setpriv).
    pub fn start_under(wrapper: &[&str], args: &[&str]) -> Daemon {
        let mut command = match wrapper.split_first() {
            Some((program, rest)) => {
                let mut command = Command::new(program);
                command.args(rest).arg(gpuprof());
                command
            }
            None => Command::new(gpuprof()),
        };
        command.arg("daemon").args(["--listen", "127.0.0.1:0"]);
        // Post-mortems go to a directory of the test run's own, not the machine's.
        let sidecar = args.contains(&"--sidecar") || std::env::var_os("GPUPROF_SIDECAR").is_some();
        if !sidecar && !args.iter().any(|a| a.starts_with("--postmortem-dir") || *a == "--no-postmortems") {
            static DAEMONS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = DAEMONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let dir = crate::scratch(&format!("daemon-postmortems-{}-{n}", std::process::id()));
            command.arg("--postmortem-dir").arg(dir);
        }
        let mut child = command.args(args).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
        let (lines, stderr) = std::sync::mpsc::channel();
        let mut reader = BufReader::new(child.stderr.take().unwrap());
        std::thread::spawn(move || {
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap_or(0) > 0 {
                eprint!("daemon: {line}");
                let _ = lines.send(std::mem::take(&mut line));
            }
        });
        // "gpuprof: daemon on node N following K CUDA process(es); /healthz /readyz /metrics on ADDR; exporting to …"
        let deadline = Instant::now() + Duration::from_secs(30);
        let health = loop {
            let line = stderr
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .expect("the daemon never said it started");
            if let Some(rest) = line.split("/metrics on ").nth(1) {
                break (format!("http://{}", rest.split(';').next().unwrap()), line.clone());
            }
        };
        let (health, started) = health;
        let agent = http_client();
        Daemon { child, started, health, agent, stderr }
    }

    pub fn get(&self, path: &str) -> (u16, String) {
        self.get_as(path, None)
    }

    /// GET with `Authorization: Bearer <token>`.
    pub fn get_as(&self, path: &str, token: Option<&str>) -> (u16, String) {
        let mut request = self.agent.get(&format!("{}{path}", self.health));
        if let Some(token) = token {
            request = request.header("authorization", &format!("Bearer {token}"));
        }
        let mut response = request.call().unwrap();
        (response.status().as_u16(), response.body_mut().read_to_string().unwrap())
    }

    /// The daemon's own metrics, by sample name.
    pub fn metrics(&self) -> BTreeMap<String, u64> {
        let (status, text) = self.get("/metrics");
        assert_eq!(status, 200);
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split_once(' '))
            .map(|(name, value)| (name.to_string(), value.parse().unwrap()))
            .collect()
    }

    pub fn metric(&self, name: &str) -> u64 {
        *self.metrics().get(name).unwrap_or_else(|| panic!("no {name} in the daemon's metrics"))
    }

    /// Waits until `name` reaches `value` (metrics are published each second).
    pub fn wait_for(&self, name: &str, value: u64, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let now = self.metric(name);
            if now == value {
                return;
            }
            assert!(Instant::now() < deadline, "{name} stayed at {now}, expected {value}: {:?}", self.metrics());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until `name` reaches at least `value`: for counts that other processes of the
    /// machine (a test binary's helpers, a CI runner's) can add to.
    pub fn wait_for_at_least(&self, name: &str, value: u64, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.metric(name) < value {
            assert!(Instant::now() < deadline, "{name} stayed under {value}: {:?}", self.metrics());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGTERM: flushes, exits 0; returns what it said on the way out.
    pub fn stop(mut self) -> String {
        // SAFETY: kill takes no memory; the pid is our own child's, not yet waited for, so not reused.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait_within(Duration::from_secs(15), "the daemon, stopped with SIGTERM");
        assert_eq!(status.code(), Some(0));
        let mut said = String::new();
        while let Ok(line) = self.stderr.recv_timeout(Duration::from_millis(500)) {
            said.push_str(&line);
        }
        said
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Daemon {
    /// POST with an empty body.
    pub fn post(&self, path: &str) -> (u16, String) {
        let mut response = self.agent.post(&format!("{}{path}", self.health)).send("").unwrap();
        (response.status().as_u16(), response.body_mut().read_to_string().unwrap())
    }

    /// Waits (up to `limit`) for a line of its stderr containing `text`; returns it.
    pub fn wait_for_line(&self, text: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr.recv_timeout(left) {
                Ok(line) if line.contains(text) => return line,
                Ok(_) => {}
                Err(_) => panic!("the daemon did not say {text:?} within {limit:?}"),
            }
        }
    }
}
