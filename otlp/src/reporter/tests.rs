//! The reporter as a whole: what its requests say of each process, built from the events it was
//! handed and what /proc says of real processes.

use std::borrow::Cow;
use std::os::unix::process::CommandExt;
use std::sync::{Arc, Mutex};

use gpuprof_model::otel::resource as attr;
use gpuprof_model::{Event, Layer, Op, Source, Tracker};

use super::*;
use crate::client::Protocol;
use crate::{attribute_int, attribute_str};

/// Keeps the log requests an export hands over.
struct Recorded(Arc<Mutex<Vec<ResourceLogs>>>);

impl Outbox for Recorded {
    fn logs(&mut self, resource_logs: Vec<ResourceLogs>) {
        self.0.lock().expect("recorded").extend(resource_logs);
    }

    fn spans(&mut self, _: Vec<ResourceSpans>) {}

    fn metrics(&mut self, _: Vec<ResourceMetrics>) {}

    fn endpoint(&self) -> String {
        "(recorded)".into()
    }

    fn delivery(&self) -> Delivery {
        Delivery::default()
    }

    fn queued_bytes(&self) -> usize {
        0
    }

    fn finish(self: Box<Self>, _: Duration) -> Delivery {
        Delivery::default()
    }
}

/// A process started with an environment that names no job, in a process group of its own.
fn unnamed_process() -> std::process::Child {
    std::process::Command::new("sleep")
        .arg("30")
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .process_group(0)
        .spawn()
        .expect("sleep runs")
}

fn event(pid: u32, ts: u64, layer: Layer, op: Op, api: &'static str) -> Event {
    let mut event = Event::new(ts, pid, pid, Source::Ebpf, layer, op, Cow::Borrowed(api));
    event.comm = "python3".into();
    event
}

#[test]
fn every_record_of_a_process_names_the_job_its_first_call_says_else_its_launchers() {
    let (mut told, mut untold) = (unnamed_process(), unnamed_process());
    let recorded = Arc::new(Mutex::new(Vec::new()));
    let options = OtlpTuning::default()
        .options("http://recorded", Protocol::Grpc, None, Some("node-a".into()))
        .expect("the defaults are valid");
    let mut telemetry = Telemetry::with_outbox(options, Box::new(Recorded(recorded.clone())), 1);
    let tracker = Tracker::new();
    for pid in [told.id(), untold.id()] {
        // The identity is made at the fork, before the first call says the job.
        telemetry.after(&event(pid, 2, Layer::Process, Op::Fork, "sched_process_fork"), &[], &tracker);
        let mut first = event(pid, 3, Layer::Driver, Op::Alloc, "cuMemAlloc_v2");
        if pid == told.id() {
            first.job = Some("torchrun:r7".into());
            (first.rank, first.local_rank, first.world_size) = (Some(1), Some(1), Some(2));
        }
        telemetry.after(&first, &[], &tracker);
    }
    telemetry.flush(&tracker, 4);
    for child in [&mut told, &mut untold] {
        child.kill().expect("the child is ours");
        child.wait().expect("the child is ours");
    }

    let recorded = recorded.lock().expect("recorded");
    let of = |pid: u32| {
        let resource = recorded
            .iter()
            .filter_map(|logs| logs.resource.as_ref())
            .find(|r| attribute_int(&r.attributes, attr::PROCESS_PID) == Some(i64::from(pid)))
            .expect("the process's records went out");
        let text = |key| attribute_str(&resource.attributes, key).map(str::to_string);
        let number = |key| attribute_int(&resource.attributes, key);
        (
            text(attr::SERVICE_INSTANCE_ID),
            text(attr::JOB_ID),
            number(attr::RANK),
            number(attr::LOCAL_RANK),
            number(attr::WORLD_SIZE),
        )
    };
    let named = |v: String| Some(v);
    assert_eq!(
        of(told.id()),
        (named(format!("node-a/{}", told.id())), named("torchrun:r7".into()), Some(1), Some(1), Some(2))
    );
    assert_eq!(
        of(untold.id()),
        (named(format!("node-a/{}", untold.id())), named(format!("node-a/pgid-{}", untold.id())), None, None, None)
    );
}

/// A post-mortem written after its process exited (a window later) goes out under the process's
/// resource, so to its job's shard: the identity outlives the exit.
#[test]
fn what_comes_after_an_exit_goes_out_under_the_process_own_job() {
    let recorded = Arc::new(Mutex::new(Vec::new()));
    let options = OtlpTuning::default()
        .options("http://recorded", Protocol::Grpc, None, Some("node-a".into()))
        .expect("the defaults are valid");
    let mut telemetry = Telemetry::with_outbox(options, Box::new(Recorded(recorded.clone())), 1);
    let tracker = Tracker::new();
    // A pid no process has now: its /proc says nothing, its first call named its job.
    let pid = u32::MAX - 7;
    let mut first = event(pid, 3, Layer::Driver, Op::Alloc, "cuMemAlloc_v2");
    (first.job, first.rank) = (Some("torchrun:r9".into()), Some(0));
    telemetry.after(&first, &[], &tracker);
    telemetry.after(&event(pid, 4, Layer::Process, Op::Exit, "sched_process_exit"), &[], &tracker);
    telemetry.flush(&tracker, 5);
    telemetry.postmortem(&PostmortemReport {
        finding_id: "00000000000000aa".into(),
        kind: gpuprof_model::FindingKind::Oom,
        pid,
        recording: "/pm/a.gpuprof".into(),
        report: "/pm/a.html".into(),
        events: 3,
        processes: 1,
        span_ns: 1,
        html_bytes: 10,
        gzip: vec![1, 2, 3],
    });
    telemetry.flush(&tracker, 6);
    let recorded = recorded.lock().expect("recorded");
    let jobs: Vec<Option<String>> = recorded
        .iter()
        .filter_map(|logs| logs.resource.as_ref())
        .map(|r| attribute_str(&r.attributes, attr::JOB_ID).map(str::to_string))
        .collect();
    assert_eq!(jobs.len(), 2, "the call's batch, then the post-mortem's");
    assert!(jobs.iter().all(|job| job.as_deref() == Some("torchrun:r9")), "{jobs:?}");
}
