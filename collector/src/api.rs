//! The read side: `GET /api/v1/findings` (filters node, pid, kind, severity, since, until),
//! `GET /api/v1/processes` (node, detail), `GET /api/v1/profile` (node, pid: the process's
//! latest memory profile as pprof, for `go tool pprof`, Pyroscope or Parca), Prometheus
//! `GET /metrics`, and `GET /healthz`.

use std::sync::Arc;

use axum::extract::{Query, Request, State};
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
