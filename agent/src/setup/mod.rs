//! Turning the command line into settings, in one place: here a capture's setup (where the
//! events go, the flow they go through — rules, output, findings, OTLP —, the kernel's options
//! and how a person sees it run); in `daemon`, the daemon's flags, `GPUPROF_*` variables and
//! TOML file merged into its one configuration. The flags themselves are `flags`'; what they
//! configure lives in `gpuprof_capture`, `gpuprof_views`, `gpuprof_otlp` and `gpuprof_fleet`.

mod daemon;

use std::path::PathBuf;

use std::ops::ControlFlow;
use std::time::Duration;

use gpuprof_capture::flow::{EventFlow, FlowOptions};
use gpuprof_capture::kernel::CaptureOptions;
use gpuprof_capture::session::{EbpfOptions, Every, Session};
use gpuprof_model::Reporter;
use gpuprof_views::output::live_line::{self, LiveLine, Progress};
use gpuprof_views::output::progress::{self, Pending};
use gpuprof_views::output::{self, Destination, EventOutput, EventSink, Format, Terminal, TerminalOptions};

use crate::flags::{CaptureArgs, Compression, OtlpArgs, RuleArgs};

impl CaptureArgs {
    /// Where the capture goes; `name` names the file when gpuprof chooses it.
    pub fn destination(&self, name: &str) -> anyhow::Result<Destination> {
        let destination = Destination::resolve(self.format.map(Into::into), self.output.as_deref(), name)?;
        let readable = matches!(destination.format, Format::Recording | Format::Jsonl) && destination.file.is_some();
        if let Some(html) = self.html.as_deref().filter(|_| !readable) {
            anyhow::bail!(
                "--html {} reads the events from the file the capture writes: leave --output and --format out (a recording named after the job) or give --output FILE.gpuprof or FILE.jsonl",
                html.display()
            );
        }
        Ok(destination)
    }

    /// gpuprof's exit status after a capture: the command's (`code`), or with `--fail-on` and a
    /// command that exited 0, `FAIL_ON_EXIT` when the run's findings match (said on stderr).
    pub fn exit_status(&self, findings: &[gpuprof_model::Finding], code: u8) -> u8 {
        let fail_on: Option<gpuprof_model::findings::FailOn> = self.fail_on.map(Into::into);
        match fail_on.and_then(|f| f.verdict(findings)).filter(|_| code == 0) {
            Some(said) => {
                eprintln!("gpuprof: {said}");
                gpuprof_model::findings::FAIL_ON_EXIT
            }
            None => code,
        }
    }

    /// The end of a capture: its reporters finished (the events' file closed, the findings
    /// said), then `--html`. Either can take a while after a large capture: a person at the
    /// terminal is told what is still being written.
    pub fn finish(
        &self,
        session: Session<'_>,
        destination: &Destination,
    ) -> anyhow::Result<Vec<gpuprof_model::Finding>> {
        let events = session.flow().events();
        let what = match (&destination.file, destination.format) {
            (Some(file), Format::Recording) => {
                format!("writing the recording of {} events to {}", progress::grouped(events), file.display())
            }
            (Some(file), _) => format!("writing {} events to {}", progress::grouped(events), file.display()),
            (None, _) => format!("finishing the capture of {} events", progress::grouped(events)),
        };
        // Events going onto the terminal are not drawn over (their table ends now, on stdout).
        let writing = (!events_on_stdout(destination)).then(|| Pending::start(what));
        let findings = session.finish()?;
        drop(writing);
        self.write_html(destination, events)?;
        Ok(findings)
    }

    /// `--html`: the report of the file the capture wrote (none when it kept no file).
    fn write_html(&self, destination: &Destination, events: u64) -> anyhow::Result<()> {
        let (Some(html), Some(file)) = (self.html.as_deref(), destination.file.as_deref()) else { return Ok(()) };
        if !file.is_file() {
            return Ok(());
        }
        let _progress = progress::show(Some(format!(
            "writing the HTML report of {} events to {}",
            progress::grouped(events),
            html.display()
        )));
        // The capture is done and kept: a report that fails is said, not the run's outcome.
        match gpuprof_views::export::html::write_file(file, html, &[]) {
            Ok(()) => eprintln!("gpuprof: wrote the report to {}; open it in a browser", html.display()),
            Err(error) => eprintln!(
                "gpuprof: warning: no report written to {}: {error:#}; the events are in {}",
                html.display(),
                file.display()
            ),
        }
        Ok(())
    }

    pub fn sink(&self, destination: &Destination) -> anyhow::Result<Box<dyn EventSink>> {
        output::capture_sink(destination, self.compress == Compression::Zstd, self.all_processes)
    }

    /// The flow the capture's events go through, to its reporters: what the terminal says, the
    /// events' output, OTLP.
    pub fn flow(&self, destination: &Destination) -> anyhow::Result<EventFlow> {
        let options = FlowOptions { rules: self.rules.config()?, keep_findings: true, pids_are_ours: true };
        let terminal = TerminalOptions {
            format: destination.format,
            output_file: destination.file.clone(),
            findings_file: self.findings.clone(),
            notices: true,
            findings_at_the_end: true,
        };
        let mut reporters: Vec<Box<dyn Reporter>> = vec![
            Box::new(Terminal::new(terminal)),
            Box::new(EventOutput::new(self.sink(destination)?, destination.file.as_deref())),
        ];
        reporters.extend(self.otlp.start()?);
        Ok(EventFlow::new(options, reporters))
    }

    /// The counters at the end of the run with `--stats` (always when events were lost).
    pub fn watched<'c>(&self, session: Session<'c>) -> Session<'c> {
        session.with_counters(self.stats)
    }

    /// How a person sees the capture go, as the capture loop's hooks: the live line on a
    /// terminal (unless the events themselves stream to stdout), the counters each second with
    /// `--stats`.
    pub fn watching<'h, 'c: 'h>(&self, destination: &Destination) -> Vec<Every<'h, 'c>> {
        let mut hooks = Vec::new();
        if let Some(mut line) = LiveLine::for_stderr().filter(|_| !events_on_stdout(destination)) {
            hooks.push(Every::new(Duration::ZERO, move |session: &mut Session<'c>| {
                line.tick(|| progress(session));
                Ok(ControlFlow::Continue(()))
            }));
        }
        if self.stats {
            hooks.push(Every::new(Duration::from_secs(1), |session: &mut Session<'c>| {
                live_line::clear();
                eprintln!("gpuprof: {}", session.stats());
                Ok(ControlFlow::Continue(()))
            }));
        }
        hooks
    }

    /// `--duration`, checked.
    pub fn duration(&self) -> anyhow::Result<Option<std::time::Duration>> {
        self.duration
            .map(|secs| {
                gpuprof_model::seconds::positive_seconds(secs)
                    .map_err(|error| anyhow::anyhow!("--duration {secs}: {error}"))
            })
            .transpose()
    }

    /// The kernel side of an eBPF capture.
    pub fn capture_options(&self) -> anyhow::Result<CaptureOptions> {
        let mib = self.buffer_mib;
        if !mib.is_power_of_two() || mib > 1024 {
            anyhow::bail!("--buffer-mib {mib}: give a power of two from 1 to 1024");
        }
        Ok(CaptureOptions {
            ring_buffer_bytes: mib << 20,
            python_stacks: !self.no_stacks,
            placement: self.probe_at.into(),
            empty_allocator_probe: self.empty_probes,
            profile_phases: self.profile_probes,
            ..CaptureOptions::default()
        })
    }

    /// The user-space side of an eBPF capture.
    pub fn ebpf_options(&self) -> EbpfOptions {
        EbpfOptions { autograd: !self.no_stacks && !self.no_autograd, level: self.level }
    }
}

impl OtlpArgs {
    /// The OTLP export, when `--otlp-endpoint` names a collector.
    pub fn start(&self) -> anyhow::Result<Option<Box<dyn Reporter>>> {
        let Some(endpoint) = &self.otlp_endpoint else { return Ok(None) };
        let tuning = gpuprof_otlp::reporter::OtlpTuning::from(&self.tuning);
        let options =
            tuning.options(endpoint, self.otlp_protocol.into(), self.otlp_token.clone(), self.node_name.clone())?;
        let telemetry = gpuprof_otlp::reporter::Telemetry::start(options)?;
        Ok(Some(Box::new(telemetry)))
    }
}

/// What the live line says of the capture so far.
fn progress(session: &Session<'_>) -> Progress {
    let flow = session.flow();
    let mut live = flow.analyzer().tracker().live_processes();
    live.retain(|p| p.uses_cuda());
    Progress {
        events: flow.events(),
        processes: live.len() as u64,
        live_bytes: live.iter().map(|p| p.device_bytes()).sum(),
        lost: session.lost_events(),
    }
}

impl RuleArgs {
    pub fn config(&self) -> anyhow::Result<gpuprof_model::RuleConfig> {
        if !(self.growth_window.is_finite() && self.growth_window > 0.0) {
            anyhow::bail!("--growth-window {}: give a positive number of seconds", self.growth_window);
        }
        if self.growth_rises == 0 {
            anyhow::bail!("--growth-rises 0: give at least 1");
        }
        if !(self.orphan_grace.is_finite() && self.orphan_grace >= 0.0) {
            anyhow::bail!("--orphan-grace {}: give a number of seconds, 0 or more", self.orphan_grace);
        }
        Ok(gpuprof_model::RuleConfig {
            growth_window_ns: (self.growth_window * 1e9) as u64,
            growth_rises: self.growth_rises,
            orphan_grace_ns: (self.orphan_grace * 1e9) as u64,
        })
    }
}

/// The one event file a view reads. Several (a shell pattern that matched more than one) are
/// refused with the newest named, rather than clap's "unexpected argument".
pub fn one_input(verb: &str, positional: Vec<PathBuf>, flag: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let mut given: Vec<PathBuf> = positional.into_iter().chain(flag).collect();
    if given.len() == 1 {
        return Ok(given.remove(0));
    }
    let modified = |p: &PathBuf| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let newest = given.iter().max_by_key(|p| modified(p)).map(|p| p.display().to_string()).unwrap_or_default();
    let names: Vec<String> = given.iter().map(|p| p.display().to_string()).collect();
    anyhow::bail!(
        "{verb} reads one event file, and {} were given ({}): name one, e.g. the newest: gpuprof {verb} {newest}",
        given.len(),
        names.join(", ")
    )
}

/// Whether the captured events themselves go to stdout (no line is drawn on the terminal then).
fn events_on_stdout(destination: &Destination) -> bool {
    destination.file.is_none() && destination.format != Format::None
}
