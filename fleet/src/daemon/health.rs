//! The daemon's HTTP endpoints for the kubelet, Prometheus and people: `/healthz` (the capture
//! loop is turning), `/readyz` (probes are loaded and the first scan is done), `/metrics` (what
//! the daemon follows, captures, drops and delivers), and the capture levels: `GET /v1/levels`
//! (the processes recorded at another level than the daemon's) and `POST /v1/level?pid=P&
//! level=L[&seconds=S]` (record a process at another level for a while). Served from a thread of
//! its own so a slow client never touches the capture loop, which only publishes a snapshot each
//! second and answers level requests between polls. The level endpoints take the metrics token
//! when one is set, else only callers on this machine (loopback).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use axum::extract::{ConnectInfo, RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use gpuprof_model::level::{LevelRequest, LevelRequestError};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::levels::{Control, Reply};
use gpuprof_capture::session::Session;

/// The capture loop is taken for stuck when it has not turned for this long.
const STALL_LIMIT: Duration = Duration::from_secs(10);

/// What the capture loop publishes each second.
#[derive(Debug, Default, Clone)]
pub(crate) struct Snapshot {
    pub processes_followed: u64,
    pub processes_followed_total: u64,
    pub processes_exited_total: u64,
    /// Process tables kept in memory: followed ones and exited ones not yet forgotten.
    pub processes_retained: u64,
    pub processes_forgotten_total: u64,
    pub libraries_probed: u64,
    pub events_total: u64,
    pub events_lost_total: u64,
    pub callers_untracked_total: u64,
    pub stacks_unreadable_total: u64,
    pub findings_total: u64,
    pub otlp_sent_total: u64,
    pub otlp_lost_total: u64,
    /// Encoded bytes waiting to be sent to the collector.
    pub otlp_queued_bytes: u64,
    pub resident_bytes: u64,
    pub shim_events_total: u64,
    pub shim_dropped_total: u64,
    pub shim_undecodable_total: u64,
    pub shim_refused_total: u64,
    pub duplicates_dropped_total: u64,
    /// Processes recorded at another level than the daemon's now, and raises since the start.
    pub processes_raised: u64,
    pub raises_total: u64,
    /// Post-mortems: what the windows hold, events a cap dropped before their time, and
    /// post-mortems written, failed, skipped (too many at once) and deleted (cap, retention).
    pub postmortem_window_bytes: u64,
    pub postmortem_window_events_shed_total: u64,
    pub postmortems_written_total: u64,
    pub postmortems_failed_total: u64,
    pub postmortems_skipped_total: u64,
    pub postmortems_deleted_total: u64,
}

impl Snapshot {
    /// What a session has followed, captured, dropped and delivered so far; `forgotten_total`:
    /// exited processes whose tables were dropped.
    pub(crate) fn of(session: &Session<'_>, forgotten_total: u64, levels: &super::levels::Levels) -> Snapshot {
        let stats = session.stats();
        let export = stats.export.unwrap_or_default();
        let mut snapshot = Snapshot {
            processes_retained: stats.processes_tracked,
            processes_forgotten_total: forgotten_total,
            events_total: stats.events,
            events_lost_total: stats.lost,
            findings_total: stats.findings_fired,
            otlp_sent_total: export.sent,
            otlp_lost_total: export.lost,
            otlp_queued_bytes: export.queued_bytes,
            resident_bytes: gpuprof_procfs::process::own_resident_bytes(),
            duplicates_dropped_total: stats.duplicates_dropped,
            processes_raised: levels.raised_now() as u64,
            raises_total: levels.raises_total,
            ..Snapshot::default()
        };
        if let Some(postmortems) = &stats.postmortems {
            snapshot.postmortem_window_bytes = postmortems.window_bytes;
            snapshot.postmortem_window_events_shed_total = postmortems.window_events_shed;
            snapshot.postmortems_written_total = postmortems.written;
            snapshot.postmortems_failed_total = postmortems.failed;
            snapshot.postmortems_skipped_total = postmortems.skipped;
            snapshot.postmortems_deleted_total = postmortems.deleted;
        }
        if let Some(shim) = &stats.shim {
            snapshot.processes_followed = shim.processes_open;
            snapshot.processes_followed_total = shim.totals.processes_seen;
            snapshot.processes_exited_total = shim.totals.processes_closed;
            snapshot.stacks_unreadable_total = shim.totals.counters.stacks_unresolved;
            snapshot.shim_events_total = shim.events;
            snapshot.shim_dropped_total = shim.totals.counters.dropped_queue_full;
            snapshot.shim_undecodable_total = shim.totals.undecodable;
            snapshot.shim_refused_total = shim.totals.refused;
        }
        // With eBPF, the kernel follows every process (the shim's too) and reads their stacks.
        if let Some(kernel) = &stats.kernel {
            snapshot.processes_followed = kernel.processes_followed;
            snapshot.processes_followed_total = kernel.processes_followed_total;
            snapshot.processes_exited_total = kernel.processes_exited_total;
            snapshot.libraries_probed = kernel.libraries_probed;
            snapshot.callers_untracked_total = kernel.drops.tracked_full;
            snapshot.stacks_unreadable_total = kernel.drops.stack_unreadable;
        }
        snapshot
    }
}

pub(crate) struct Health {
    started: Instant,
    ready: AtomicBool,
    /// Milliseconds since `started` when the capture loop last turned.
    heartbeat_ms: AtomicU64,
    snapshot: Mutex<Snapshot>,
}

impl Health {
    pub(crate) fn new() -> Arc<Health> {
        Arc::new(Health {
            started: Instant::now(),
            ready: AtomicBool::new(false),
            heartbeat_ms: AtomicU64::new(0),
            snapshot: Mutex::default(),
        })
    }

    pub(crate) fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    pub(crate) fn publish(&self, snapshot: Snapshot) {
        self.heartbeat_ms.store(self.started.elapsed().as_millis() as u64, Ordering::Relaxed);
        if let Ok(mut slot) = self.snapshot.lock() {
            *slot = snapshot;
        }
    }

    fn stalled(&self) -> bool {
        let last = Duration::from_millis(self.heartbeat_ms.load(Ordering::Relaxed));
        self.started.elapsed().saturating_sub(last) > STALL_LIMIT
    }
}

/// Binds `listen` now (so a taken port is an error at start) and serves from a new thread.
/// Serves /healthz, /readyz, /metrics and the level endpoints (the last three only to who sends
/// `metrics_token`, if one is set; the level endpoints to loopback callers when none is).
pub(crate) fn serve(
    listen: SocketAddr,
    metrics_token: Option<String>,
    health: Arc<Health>,
    control: Control,
) -> Result<SocketAddr> {
    let listener = std::net::TcpListener::bind(listen).with_context(|| {
        format!("cannot listen on {listen} for /healthz and /metrics: give another address with --listen")
    })?;
    listener.set_nonblocking(true).context("cannot set up the health listener")?;
    let bound = listener.local_addr().context("cannot set up the health listener")?;
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().context("cannot start the health server")?;
    std::thread::Builder::new()
        .name("gpuprof-health".into())
        .spawn(move || {
            runtime.block_on(async move {
                let metrics_token: Arc<Option<String>> = Arc::new(metrics_token);
                let token_or_local = {
                    let token = metrics_token.clone();
                    axum::middleware::from_fn(move |request: axum::extract::Request, next: axum::middleware::Next| {
                        let token = token.clone();
                        async move {
                            let authorization =
                                request.headers().get(header::AUTHORIZATION).map(|v| v.as_bytes().to_vec());
                            let local = request
                                .extensions()
                                .get::<ConnectInfo<SocketAddr>>()
                                .is_some_and(|ConnectInfo(peer)| peer.ip().is_loopback());
                            let allowed = match token.as_deref() {
                                Some(_) => gpuprof_otlp::bearer::matches(token.as_deref(), authorization.as_deref()),
                                None => local,
                            };
                            if allowed {
                                next.run(request).await
                            } else {
                                (
                                    StatusCode::FORBIDDEN,
                                    "capture levels are changed from this machine, or with the metrics token (--metrics-token)\n",
                                )
                                    .into_response()
                            }
                        }
                    })
                };
                let scrapers_only =
                    axum::middleware::from_fn(move |request: axum::extract::Request, next: axum::middleware::Next| {
                        let token = metrics_token.clone();
                        async move {
                            let authorization =
                                request.headers().get(header::AUTHORIZATION).map(|v| v.as_bytes().to_vec());
                            if gpuprof_otlp::bearer::matches(token.as_deref(), authorization.as_deref()) {
                                next.run(request).await
                            } else {
                                (
                                    StatusCode::UNAUTHORIZED,
                                    [(header::WWW_AUTHENTICATE, "Bearer")],
                                    "missing or wrong metrics token (--metrics-token)\n",
                                )
                                    .into_response()
                            }
                        }
                    });
                let levels = axum::Router::new()
                    .route("/v1/level", post(set_level))
                    .route("/v1/levels", get(levels))
                    .route_layer(token_or_local)
                    .with_state(control);
                let app = axum::Router::new()
                    .route("/metrics", get(metrics))
                    .route_layer(scrapers_only)
                    .route("/healthz", get(healthz))
                    .route("/readyz", get(readyz))
                    .with_state(health)
                    .merge(levels);
                match tokio::net::TcpListener::from_std(listener) {
                    Ok(listener) => {
                        let app = app.into_make_service_with_connect_info::<SocketAddr>();
                        if let Err(error) = axum::serve(listener, app).await {
                            tracing::error!("health server stopped: {error}");
                        }
                    }
                    Err(error) => tracing::error!("health server cannot start: {error}"),
                }
            })
        })
        .context("cannot start the health server thread")?;
    Ok(bound)
}

async fn healthz(State(health): State<Arc<Health>>) -> impl IntoResponse {
    if health.stalled() {
        (StatusCode::SERVICE_UNAVAILABLE, "capture loop stalled\n")
    } else {
        (StatusCode::OK, "ok\n")
    }
}

async fn readyz(State(health): State<Arc<Health>>) -> impl IntoResponse {
    if health.ready.load(Ordering::Relaxed) && !health.stalled() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

/// `POST /v1/level?pid=P&level=L[&seconds=S]`: the query is read and checked by the model's
/// `LevelRequest`; a query that is no request is answered 400 with what is wrong.
async fn set_level(State(control): State<Control>, RawQuery(query): RawQuery) -> Response {
    let request = match LevelRequest::from_query(query.as_deref().unwrap_or_default()) {
        Ok(request) => request,
        // The framework's own words, as its query extractor answered before (no newline).
        Err(error @ LevelRequestError::Query(_)) => {
            return (StatusCode::BAD_REQUEST, error.to_string()).into_response()
        }
        Err(error) => return (StatusCode::BAD_REQUEST, format!("{error}\n")).into_response(),
    };
    let LevelRequest { pid, level, seconds } = request;
    let asked = tokio::task::spawn_blocking(move || control.ask(pid, level, seconds)).await;
    match asked.ok().flatten() {
        Some(reply @ Reply::Taken(_)) => (StatusCode::OK, axum::Json(reply)).into_response(),
        Some(reply @ Reply::Unknown { .. }) => (StatusCode::NOT_FOUND, axum::Json(reply)).into_response(),
        None => (StatusCode::SERVICE_UNAVAILABLE, "the capture loop did not answer within 5 s\n").into_response(),
    }
}

async fn levels(State(control): State<Control>) -> impl IntoResponse {
    axum::Json(control.raised())
}

async fn metrics(State(health): State<Arc<Health>>) -> impl IntoResponse {
    let snapshot = health.snapshot.lock().map(|s| s.clone()).unwrap_or_default();
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], render(&snapshot))
}

fn render(s: &Snapshot) -> String {
    let mut registry = Registry::default();
    register_processes(&mut registry, s);
    register_capture(&mut registry, s);
    register_export(&mut registry, s);
    register_shims_and_levels(&mut registry, s);
    register_postmortems(&mut registry, s);
    let mut text = String::new();
    encode(&mut text, &registry).expect("writing to a String cannot fail");
    text
}

/// The daemon itself and the processes it follows.
fn register_processes(registry: &mut Registry, s: &Snapshot) {
    gauge(registry, "gpuprof_daemon_processes_followed", "CUDA processes followed now", s.processes_followed);
    gauge(
        registry,
        "gpuprof_daemon_processes_retained",
        "Process tables held in memory (followed, and exited ones not yet forgotten)",
        s.processes_retained,
    );
    gauge(
        registry,
        "gpuprof_daemon_libraries_probed",
        "libcuda and libc10 files with probes on them",
        s.libraries_probed,
    );
    gauge(registry, "gpuprof_daemon_resident_bytes", "The daemon's resident memory", s.resident_bytes);
    counter(
        registry,
        "gpuprof_daemon_processes_discovered",
        "Processes followed since the start",
        s.processes_followed_total,
    );
    counter(registry, "gpuprof_daemon_processes_exited", "Followed processes seen to exit", s.processes_exited_total);
    counter(
        registry,
        "gpuprof_daemon_processes_forgotten",
        "Exited processes whose tables were dropped after the retention time",
        s.processes_forgotten_total,
    );
}

/// What the capture took and lost, and the findings it fired.
fn register_capture(registry: &mut Registry, s: &Snapshot) {
    counter(registry, "gpuprof_daemon_events", "Events captured", s.events_total);
    counter(
        registry,
        "gpuprof_daemon_events_lost",
        "Events lost in the kernel (ring buffer or call table full)",
        s.events_lost_total,
    );
    counter(
        registry,
        "gpuprof_daemon_callers_untracked",
        "Calls of processes the tracked map had no room for (still recorded)",
        s.callers_untracked_total,
    );
    counter(
        registry,
        "gpuprof_daemon_stacks_unreadable",
        "Python stacks that could not be read whole",
        s.stacks_unreadable_total,
    );
    counter(registry, "gpuprof_daemon_findings", "Leak findings fired", s.findings_total);
}

/// Delivery to the OTLP collector.
fn register_export(registry: &mut Registry, s: &Snapshot) {
    counter(
        registry,
        "gpuprof_daemon_otlp_sent_items",
        "Log records, spans and metric points the collector accepted",
        s.otlp_sent_total,
    );
    counter(
        registry,
        "gpuprof_daemon_otlp_lost_items",
        "OTLP items dropped (queue full, delivery failed, too large) or rejected",
        s.otlp_lost_total,
    );
    gauge(
        registry,
        "gpuprof_daemon_otlp_queued_bytes",
        "Encoded OTLP requests waiting for the collector",
        s.otlp_queued_bytes,
    );
}

/// Events from shims, the processes raised to another capture level, and calls both sides saw.
fn register_shims_and_levels(registry: &mut Registry, s: &Snapshot) {
    counter(
        registry,
        "gpuprof_daemon_shim_events",
        "Events received from processes running gpuprof's shim",
        s.shim_events_total,
    );
    counter(
        registry,
        "gpuprof_daemon_shim_dropped",
        "Events shims dropped in their process (queue full), as they reported at exit",
        s.shim_dropped_total,
    );
    counter(
        registry,
        "gpuprof_daemon_shim_undecodable",
        "Lines from shims that were not events",
        s.shim_undecodable_total,
    );
    counter(
        registry,
        "gpuprof_daemon_shim_refused",
        "Events from shims naming a process other than the one connected (refused)",
        s.shim_refused_total,
    );
    gauge(
        registry,
        "gpuprof_daemon_processes_raised",
        "Processes recorded at another capture level than the daemon's now",
        s.processes_raised,
    );
    counter(
        registry,
        "gpuprof_daemon_raises",
        "Times a process was raised above the daemon's capture level (rules or requests)",
        s.raises_total,
    );
    counter(
        registry,
        "gpuprof_daemon_duplicates_dropped",
        "Second copies of calls both the shim and the probes saw",
        s.duplicates_dropped_total,
    );
}

/// The post-mortem windows and the post-mortems written from them.
fn register_postmortems(registry: &mut Registry, s: &Snapshot) {
    gauge(
        registry,
        "gpuprof_daemon_postmortem_window_bytes",
        "Memory the windows of recent events kept for post-mortems take",
        s.postmortem_window_bytes,
    );
    counter(
        registry,
        "gpuprof_daemon_postmortem_window_events_shed",
        "Events a memory cap dropped from a post-mortem window before they were a window old",
        s.postmortem_window_events_shed_total,
    );
    counter(registry, "gpuprof_daemon_postmortems_written", "Post-mortems written", s.postmortems_written_total);
    counter(
        registry,
        "gpuprof_daemon_postmortems_failed",
        "Post-mortems that could not be written (disk full, no permission)",
        s.postmortems_failed_total,
    );
    counter(
        registry,
        "gpuprof_daemon_postmortems_skipped",
        "Findings that got no post-mortem: too many were being written",
        s.postmortems_skipped_total,
    );
    counter(
        registry,
        "gpuprof_daemon_postmortems_deleted",
        "Post-mortems the directory's size cap and retention deleted",
        s.postmortems_deleted_total,
    );
}

fn gauge(registry: &mut Registry, name: &str, help: &str, value: u64) {
    let metric = Gauge::<i64>::default();
    metric.set(value as i64);
    registry.register(name, help, metric);
}

fn counter(registry: &mut Registry, name: &str, help: &str, value: u64) {
    let metric = Counter::<u64>::default();
    metric.inc_by(value);
    registry.register(name, help, metric);
}
