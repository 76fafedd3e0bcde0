//! The read side: `GET /api/v1/findings` (filters node, pid, kind, severity, since, until),
//! `GET /api/v1/jobs` (each distributed job: its nodes, ranks, memory now and at peak) and
//! `GET /api/v1/jobs/{id}` (rank by rank; the id percent-encoded, as `/` is in some),
//! `GET /api/v1/findings/{id}/report` (a finding's post-mortem, the HTML page its node wrote),
//! `GET /api/v1/processes` (node, detail), `GET /api/v1/profile` (node, pid: the process's
//! latest memory profile as pprof, for `go tool pprof`, Pyroscope or Parca), Prometheus
//! `GET /metrics`, and `GET /healthz`.

use std::sync::Arc;

use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;

use crate::collector::Collector;
use crate::state::FindingFilter;

pub fn routes(collector: Arc<Collector>) -> Router {
    Router::new()
        .route("/api/v1/findings", get(findings))
        .route("/api/v1/findings/{id}/report", get(report))
        .route("/api/v1/jobs", get(jobs))
        .route("/api/v1/jobs/{id}", get(job))
        .route("/api/v1/processes", get(processes))
        .route("/api/v1/profile", get(profile))
        .route("/metrics", get(metrics))
        .route_layer(middleware::from_fn_with_state(collector.clone(), readers_only))
        // Liveness probes carry no token.
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(collector)
}

/// With `--read-token`, what the collector knows is shown only to who sends it.
async fn readers_only(State(collector): State<Arc<Collector>>, request: Request, next: Next) -> Response {
    if collector.may_read(request.headers().get(header::AUTHORIZATION).map(|v| v.as_bytes())) {
        return next.run(request).await;
    }
    (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "Bearer")], "missing or wrong read token (--read-token)\n")
        .into_response()
}

async fn findings(
    State(collector): State<Arc<Collector>>,
    filter: Result<Query<FindingFilter>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Query(filter) = match filter {
        Ok(filter) => filter,
        Err(rejection) => return (StatusCode::BAD_REQUEST, format!("{}\n", rejection.body_text())).into_response(),
    };
    let state = collector.state.lock().expect("state lock");
    Json(state.findings(&filter)).into_response()
}

/// A finding's post-mortem: the HTML page its node wrote of the last seconds before it, gzipped
/// to a client that takes gzip (browsers do) and plain to one that does not. `id` is the
/// finding's `finding_id` or the collector's number for it.
async fn report(State(collector): State<Arc<Collector>>, Path(id): Path<String>, headers: HeaderMap) -> Response {
    use crate::reports::FindingRef;
    let not_found =
        |error: String| (StatusCode::NOT_FOUND, Json(serde_json::json!({ "error": error }))).into_response();
    let (finding_id, postmortem) = {
        let state = collector.state.lock().expect("state lock");
        let finding = match FindingRef::parse(&id) {
            Some(FindingRef::FindingId(finding_id)) => {
                let finding = state.finding_with_id(&finding_id);
                (finding_id, finding.and_then(|f| f.finding.postmortem.clone()))
            }
            Some(FindingRef::Id(number)) => match state.finding_numbered(number) {
                Some(f) => (f.finding.finding_id.clone(), f.finding.postmortem.clone()),
                None => return not_found(format!("no finding {id} here: give a finding's finding_id or id from /api/v1/findings")),
            },
            None => {
                return (
                    StatusCode::BAD_REQUEST,
                    Json(serde_json::json!({ "error": format!("{id:?} names no finding: give its finding_id (16 hex digits) or its id") })),
                )
                    .into_response()
            }
        };
        finding
    };
    let info = collector.reports.lock().expect("reports lock").get(&finding_id).cloned();
    let info = match (info, postmortem) {
        (Some(info), _) => info,
        (None, Some(postmortem)) => {
            return not_found(format!(
                "no post-mortem report of finding {finding_id} here: its node {} has it at {} (sent once written; dropped here past --max-report-mib or --retention-hours)",
                postmortem.node, postmortem.report
            ))
        }
        (None, None) => return not_found(format!("no post-mortem report of finding {finding_id}")),
    };
    if let Some(why) = &info.omitted {
        return not_found(format!("the post-mortem report of finding {finding_id} was not sent: {why}"));
    }
    let page = match collector.store.report_page(&finding_id) {
        Ok(Some(page)) => page,
        Ok(None) => return not_found(format!("no post-mortem report of finding {finding_id}")),
        Err(error) => {
            collector.stats.store_errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot read the report of finding {finding_id}: {error:#}\n"),
            )
                .into_response();
        }
    };
    let html = (header::CONTENT_TYPE, "text/html; charset=utf-8");
    let takes_gzip = headers
        .get(header::ACCEPT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accepted| accepted.split(',').any(|e| e.trim().starts_with("gzip")));
    if takes_gzip {
        return ([html, (header::CONTENT_ENCODING, "gzip")], page).into_response();
    }
    let mut plain = Vec::with_capacity(info.html_bytes as usize);
    match std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(page.as_slice()), &mut plain) {
        Ok(_) => ([html], plain).into_response(),
        Err(error) => {
            (StatusCode::INTERNAL_SERVER_ERROR, format!("the report of finding {finding_id} is corrupt: {error}\n"))
                .into_response()
        }
    }
}

async fn jobs(State(collector): State<Arc<Collector>>) -> Response {
    let state = collector.state.lock().expect("state lock");
    Json(state.jobs()).into_response()
}

async fn job(State(collector): State<Arc<Collector>>, Path(id): Path<String>) -> Response {
    let state = collector.state.lock().expect("state lock");
    match state.job(&id) {
        Some(job) => Json(job).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            Json(serde_json::json!({
                "error": format!("no job {id} on this collector (GET /api/v1/jobs lists those it has; a job's data goes whole to one shard)")
            })),
        )
            .into_response(),
    }
}

#[derive(Debug, Default, Deserialize)]
struct ProcessQuery {
    node: Option<String>,
    #[serde(default)]
    detail: bool,
}

async fn processes(
    State(collector): State<Arc<Collector>>,
    query: Result<Query<ProcessQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Query(query) = match query {
        Ok(query) => query,
        Err(rejection) => return (StatusCode::BAD_REQUEST, format!("{}\n", rejection.body_text())).into_response(),
    };
    let state = collector.state.lock().expect("state lock");
    Json(state.processes(query.node.as_deref(), query.detail)).into_response()
}

#[derive(Debug, Deserialize)]
struct ProfileQuery {
    node: String,
    pid: u32,
}

/// The latest memory profile a node sent of a process, as the pprof it sent.
async fn profile(
    State(collector): State<Arc<Collector>>,
    query: Result<Query<ProfileQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Query(query) = match query {
        Ok(query) => query,
        Err(rejection) => {
            return (StatusCode::BAD_REQUEST, format!("{} (give node and pid)\n", rejection.body_text()))
                .into_response()
        }
    };
    let state = collector.state.lock().expect("state lock");
    match state.summary(&query.node, query.pid).and_then(|s| s.profile.as_ref()) {
        Some(profile) => ([(header::CONTENT_TYPE, "application/octet-stream")], profile.pprof.clone()).into_response(),
        None => (StatusCode::NOT_FOUND, format!("no memory profile of pid {} on node {}\n", query.pid, query.node))
            .into_response(),
    }
}

/// OpenMetrics to a scraper that asks for it (Prometheus does), the classic text format otherwise.
async fn metrics(State(collector): State<Arc<Collector>>, headers: HeaderMap) -> Response {
    let text = crate::prometheus::render(&collector);
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
    if accept.contains("application/openmetrics-text") {
        ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text).into_response()
    } else {
        ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], crate::prometheus::classic(&text))
            .into_response()
    }
}
