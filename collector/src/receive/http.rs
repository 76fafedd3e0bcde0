//! OTLP/HTTP: POST /v1/logs, /v1/traces, /v1/metrics with protobuf or JSON bodies, answered in
//! the same encoding; refusals with the status codes of the OTLP specification (401, 413, 415,
//! 400, 429 with Retry-After).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{ConnectInfo, DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use prost::Message;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::collector::{Collector, Refusal};

pub fn routes(collector: Arc<Collector>) -> Router {
    let limit = collector.config.max_request_bytes;
    Router::new()
        .route("/v1/logs", post(|s, c, h, b| receive(s, c, h, b, Collector::logs)))
        .route("/v1/traces", post(|s, c, h, b| receive(s, c, h, b, Collector::traces)))
        .route("/v1/metrics", post(|s, c, h, b| receive(s, c, h, b, Collector::metrics)))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(collector)
}

enum Encoding {
    Protobuf,
    Json,
}

enum Gunzip {
    TooLarge,
    Corrupt(std::io::Error),
}

/// A gzip body unzipped, refused past `limit` bytes (a small body may unzip to gigabytes).
fn gunzip(body: &[u8], limit: usize) -> Result<Vec<u8>, Gunzip> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(body).take(limit as u64 + 1).read_to_end(&mut out).map_err(Gunzip::Corrupt)?;
    if out.len() > limit {
        return Err(Gunzip::TooLarge);
    }
    Ok(out)
}

async fn receive<Req, Resp>(
    State(collector): State<Arc<Collector>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
    handle: fn(&Collector, Req) -> Resp,
) -> Response
where
    Req: Message + Default + DeserializeOwned,
    Resp: Message + Serialize,
{
    let refuse = |why: Refusal, status: StatusCode, message: String| {
        collector.stats.refused(why);
        let mut response = (status, message).into_response();
        if why == Refusal::RateLimited {
            response.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        }
        if why == Refusal::Unauthenticated {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        }
        response
    };
    if !collector.admit(peer) {
        return refuse(
            Refusal::RateLimited,
            StatusCode::TOO_MANY_REQUESTS,
            "too many requests on this connection; retry later\n".into(),
        );
    }
    if !collector.authorized(headers.get(header::AUTHORIZATION).map(|v| v.as_bytes())) {
        return refuse(Refusal::Unauthenticated, StatusCode::UNAUTHORIZED, "missing or wrong bearer token\n".into());
    }
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let encoding = match content_type.split(';').next().unwrap_or("").trim() {
        "application/x-protobuf" => Encoding::Protobuf,
        "application/json" => Encoding::Json,
        other => {
            return refuse(
                Refusal::UnsupportedMediaType,
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!("content type {other:?}: send application/x-protobuf or application/json\n"),
            )
        }
    };
    let body = match body {
        Ok(body) => body,
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return refuse(
                Refusal::TooLarge,
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request larger than {} bytes; send smaller batches\n", collector.config.max_request_bytes),
            )
        }
        Err(rejection) => return refuse(Refusal::Malformed, StatusCode::BAD_REQUEST, format!("{rejection}\n")),
    };
    // The OpenTelemetry Collector's OTLP/HTTP exporter gzips unless told otherwise.
    let body = match headers.get(header::CONTENT_ENCODING).map(|v| v.to_str().unwrap_or("?").trim()) {
        None | Some("identity") => body,
        Some("gzip") => match gunzip(&body, collector.config.max_request_bytes) {
            Ok(body) => Bytes::from(body),
            Err(Gunzip::TooLarge) => {
                return refuse(
                    Refusal::TooLarge,
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!(
                        "request larger than {} bytes once unzipped; send smaller batches\n",
                        collector.config.max_request_bytes
                    ),
                )
            }
            Err(Gunzip::Corrupt(e)) => {
                return refuse(Refusal::Malformed, StatusCode::BAD_REQUEST, format!("malformed gzip body: {e}\n"))
            }
        },
        Some(other) => {
            return refuse(
                Refusal::UnsupportedMediaType,
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!("content encoding {other:?}: send gzip or none\n"),
            )
        }
    };
    let request = match encoding {
        Encoding::Protobuf => Req::decode(body).map_err(|e| format!("malformed OTLP protobuf: {e}\n")),
        Encoding::Json => serde_json::from_slice(&body).map_err(|e| format!("malformed OTLP JSON: {e}\n")),
    };
    let request = match request {
        Ok(request) => request,
        Err(message) => return refuse(Refusal::Malformed, StatusCode::BAD_REQUEST, message),
    };
    let response = tokio::task::block_in_place(|| handle(&collector, request));
    match encoding {
        Encoding::Protobuf => {
            ([(header::CONTENT_TYPE, "application/x-protobuf")], response.encode_to_vec()).into_response()
        }
        Encoding::Json => {
            ([(header::CONTENT_TYPE, "application/json")], serde_json::to_vec(&response).unwrap_or_default())
                .into_response()
        }
    }
}
