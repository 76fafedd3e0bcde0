//! OTLP/HTTP: POST /v1/logs, /v1/traces, /v1/metrics with protobuf or JSON bodies, answered in
//! the same encoding; refusals with the status codes of the OTLP specification (401, 413, 415,
//! 400, 429 with Retry-After).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{ConnectInfo, DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use prost::Message;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::collector::{Collector, Refusal, Stats};

pub fn routes(collector: Arc<Collector>) -> Router {
    let limit = collector.config.max_request_bytes;
    Router::new()
        .route("/v1/logs", post(|s, c, h, b| receive(s, c, h, b, Collector::logs)))
        .route("/v1/traces", post(|s, c, h, b| receive(s, c, h, b, Collector::traces)))
        .route("/v1/metrics", post(|s, c, h, b| receive(s, c, h, b, Collector::metrics)))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(collector)
}

/// How a request's body is encoded (its content type); the response is encoded the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
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
    body: Result<Bytes, BytesRejection>,
    handle: fn(&Collector, Req) -> Resp,
) -> Response
where
    Req: Message + Default + DeserializeOwned,
    Resp: Message + Serialize,
{
    answer(&collector, peer, &headers, body, handle).unwrap_or_else(|refused| refused.respond(&collector.stats))
}

/// The request admitted, decoded and handled; or why it was turned away.
fn answer<Req, Resp>(
    collector: &Collector,
    peer: SocketAddr,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    handle: fn(&Collector, Req) -> Resp,
) -> Result<Response, Refused>
where
    Req: Message + Default + DeserializeOwned,
    Resp: Message + Serialize,
{
    admitted(collector, peer, headers)?;
    let encoding = encoding_of(headers.get(header::CONTENT_TYPE))?;
    let limit = collector.config.max_request_bytes;
    let request = decode_body::<Req>(encoding, headers.get(header::CONTENT_ENCODING), received(body, limit)?, limit)?;
    let response = tokio::task::block_in_place(|| handle(collector, request));
    Ok(encode(encoding, &response))
}

/// A request turned away: counted by reason, answered with the status OTLP gives it.
#[derive(Debug)]
pub struct Refused {
    pub why: Refusal,
    pub status: StatusCode,
    /// The response's body: one line, ending in a newline.
    pub message: String,
}

impl Refused {
    fn new(why: Refusal, status: StatusCode, message: String) -> Refused {
        Refused { why, status, message }
    }

    /// Counted under its reason, then answered.
    fn respond(self, stats: &Stats) -> Response {
        stats.refused(self.why);
        let mut response = (self.status, self.message).into_response();
        if self.why == Refusal::RateLimited {
            response.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        }
        if self.why == Refusal::Unauthenticated {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// The peer within its rate and holding the agents' token, checked in that order.
fn admitted(collector: &Collector, peer: SocketAddr, headers: &HeaderMap) -> Result<(), Refused> {
    if !collector.admit(peer) {
        return Err(Refused::new(
            Refusal::RateLimited,
            StatusCode::TOO_MANY_REQUESTS,
            "too many requests on this connection; retry later\n".into(),
        ));
    }
    if !collector.authorized(headers.get(header::AUTHORIZATION).map(|v| v.as_bytes())) {
        return Err(Refused::new(
            Refusal::Unauthenticated,
            StatusCode::UNAUTHORIZED,
            "missing or wrong bearer token\n".into(),
        ));
    }
    Ok(())
}

/// The body's encoding, from the request's `content-type` (parameters such as a charset are
/// left alone).
pub fn encoding_of(content_type: Option<&HeaderValue>) -> Result<Encoding, Refused> {
    let content_type = content_type.and_then(|v| v.to_str().ok()).unwrap_or("");
    match content_type.split(';').next().unwrap_or("").trim() {
        "application/x-protobuf" => Ok(Encoding::Protobuf),
        "application/json" => Ok(Encoding::Json),
        other => Err(Refused::new(
            Refusal::UnsupportedMediaType,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("content type {other:?}: send application/x-protobuf or application/json\n"),
        )),
    }
}

/// The body as axum read it, within the request limit.
fn received(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<Bytes, Refused> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Refused::new(
                Refusal::TooLarge,
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request larger than {limit} bytes; send smaller batches\n"),
            )
        } else {
            Refused::new(Refusal::Malformed, StatusCode::BAD_REQUEST, format!("{rejection}\n"))
        }
    })
}

/// A request's body, as axum read it within `limit` bytes, decoded: unzipped as its
/// `content-encoding` says (within `limit` bytes again), then read as `encoding`. Pure: the same
/// bytes get the same request or the same refusal.
pub fn decode_body<Req: Message + Default + DeserializeOwned>(
    encoding: Encoding,
    content_encoding: Option<&HeaderValue>,
    body: Bytes,
    limit: usize,
) -> Result<Req, Refused> {
    decode(encoding, unzipped(content_encoding, body, limit)?)
}

/// The body as sent, or unzipped: the OpenTelemetry Collector's OTLP/HTTP exporter gzips unless
/// told otherwise.
fn unzipped(content_encoding: Option<&HeaderValue>, body: Bytes, limit: usize) -> Result<Bytes, Refused> {
    match content_encoding.map(|v| v.to_str().unwrap_or("?").trim()) {
        None | Some("identity") => Ok(body),
        Some("gzip") => match gunzip(&body, limit) {
            Ok(body) => Ok(Bytes::from(body)),
            Err(Gunzip::TooLarge) => Err(Refused::new(
                Refusal::TooLarge,
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request larger than {limit} bytes once unzipped; send smaller batches\n"),
            )),
            Err(Gunzip::Corrupt(e)) => {
                Err(Refused::new(Refusal::Malformed, StatusCode::BAD_REQUEST, format!("malformed gzip body: {e}\n")))
            }
        },
        Some(other) => Err(Refused::new(
            Refusal::UnsupportedMediaType,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("content encoding {other:?}: send gzip or none\n"),
        )),
    }
}

fn decode<Req: Message + Default + DeserializeOwned>(encoding: Encoding, body: Bytes) -> Result<Req, Refused> {
    let request = match encoding {
        Encoding::Protobuf => Req::decode(body).map_err(|e| format!("malformed OTLP protobuf: {e}\n")),
        Encoding::Json => serde_json::from_slice(&body).map_err(|e| format!("malformed OTLP JSON: {e}\n")),
    };
    request.map_err(|message| Refused::new(Refusal::Malformed, StatusCode::BAD_REQUEST, message))
}

/// The response in the request's encoding.
fn encode<Resp: Message + Serialize>(encoding: Encoding, response: &Resp) -> Response {
    match encoding {
        Encoding::Protobuf => {
            ([(header::CONTENT_TYPE, "application/x-protobuf")], response.encode_to_vec()).into_response()
        }
        Encoding::Json => {
            ([(header::CONTENT_TYPE, "application/json")], serde_json::to_vec(response).unwrap_or_default())
                .into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use gpuprof_otlp::proto::collector::trace::v1::ExportTraceServiceRequest;

    use super::*;

    fn header(value: &str) -> HeaderValue {
        HeaderValue::from_str(value).unwrap()
    }

    fn refused(encoding: Encoding, content_encoding: Option<&str>, body: &[u8]) -> (Refusal, u16, String) {
        let content_encoding = content_encoding.map(header);
        let refused = decode_body::<ExportTraceServiceRequest>(
            encoding,
            content_encoding.as_ref(),
            Bytes::from(body.to_vec()),
            64,
        )
        .unwrap_err();
        (refused.why, refused.status.as_u16(), refused.message)
    }

    fn gzip(body: &[u8]) -> Vec<u8> {
        use std::io::Write;
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(body).unwrap();
        encoder.finish().unwrap()
    }

    #[test]
    fn a_body_is_read_as_its_headers_say_or_refused_with_the_status_otlp_gives() {
        let content_type = |value: &str| encoding_of(Some(&header(value))).map_err(|r| (r.status.as_u16(), r.message));
        assert_eq!(content_type("application/json; charset=utf-8"), Ok(Encoding::Json));
        assert_eq!(content_type("application/x-protobuf"), Ok(Encoding::Protobuf));
        assert_eq!(
            content_type("text/plain"),
            Err((415, "content type \"text/plain\": send application/x-protobuf or application/json\n".to_string()))
        );
        let empty = ExportTraceServiceRequest::default();
        let gzipped = Bytes::from(gzip(&[]));
        assert_eq!(decode_body(Encoding::Protobuf, Some(&header("gzip")), gzipped, 64).ok(), Some(empty));
        assert_eq!(
            refused(Encoding::Protobuf, Some("gzip"), &gzip(&[0; 65])),
            (Refusal::TooLarge, 413, "request larger than 64 bytes once unzipped; send smaller batches\n".into())
        );
        assert_eq!(
            refused(Encoding::Protobuf, Some("br"), b""),
            (Refusal::UnsupportedMediaType, 415, "content encoding \"br\": send gzip or none\n".into())
        );
        assert_eq!(
            refused(Encoding::Json, None, b"{"),
            (Refusal::Malformed, 400, "malformed OTLP JSON: EOF while parsing an object at line 1 column 1\n".into())
        );
        let (why, status, message) = refused(Encoding::Protobuf, Some("gzip"), b"not gzip");
        assert_eq!((why, status), (Refusal::Malformed, 400));
        assert!(message.starts_with("malformed gzip body: "), "{message}");
    }
}
