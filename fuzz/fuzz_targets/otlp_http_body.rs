//! An OTLP/HTTP request's body as the collector's HTTP receiver reads it
//! (`receive::http::encoding_of`, `decode_body`): protobuf or JSON by its content type, gzip or
//! none by its content encoding, within the request limit; then handed to the collector. The
//! first byte picks the signal, the second the content type, the third the content encoding.
//!
//! Checked: every refusal is a 400, 413 or 415 with a one-line message (never a panic); a body
//! that decodes as sent decodes the same gzipped; a gzipped body past the limit is refused 413;
//! what decodes is taken by the collector.

#![no_main]

use gpuprof_collector::receive::http::{decode_body, encoding_of, Refused};
use gpuprof_fuzz::{collector, Signal, MAX_REQUEST_BYTES};
use gpuprof_otlp::proto::collector::logs::v1::ExportLogsServiceRequest;
use gpuprof_otlp::proto::collector::metrics::v1::ExportMetricsServiceRequest;
use gpuprof_otlp::proto::collector::trace::v1::ExportTraceServiceRequest;
use http::HeaderValue;
use libfuzzer_sys::fuzz_target;

const CONTENT_TYPES: [Option<&str>; 6] = [
    Some("application/x-protobuf"),
    Some("application/json"),
    Some("application/json; charset=utf-8"),
    Some(" application/x-protobuf ;x=1"),
    Some("text/plain"),
    None,
];
const CONTENT_ENCODINGS: [Option<&str>; 5] = [None, Some("identity"), Some("gzip"), Some(" gzip "), Some("br")];

fuzz_target!(|data: &[u8]| {
    let [signal, content_type, content_encoding, body @ ..] = data else { return };
    let content_type = CONTENT_TYPES[usize::from(*content_type) % CONTENT_TYPES.len()].map(header);
    let content_encoding = CONTENT_ENCODINGS[usize::from(*content_encoding) % CONTENT_ENCODINGS.len()].map(header);
    let collector = collector();
    match Signal::of(*signal) {
        Signal::Logs => {
            if let Some(request) = read::<ExportLogsServiceRequest>(content_type, content_encoding, body) {
                collector.logs(request);
            }
        }
        Signal::Traces => {
            if let Some(request) = read::<ExportTraceServiceRequest>(content_type, content_encoding, body) {
                collector.traces(request);
            }
        }
        Signal::Metrics => {
            if let Some(request) = read::<ExportMetricsServiceRequest>(content_type, content_encoding, body) {
                collector.metrics(request);
            }
        }
    }
});

fn header(value: &str) -> HeaderValue {
    HeaderValue::from_str(value).expect("a header value")
}

/// The body read as the receiver reads it, its properties checked.
fn read<R>(content_type: Option<HeaderValue>, content_encoding: Option<HeaderValue>, body: &[u8]) -> Option<R>
where
    R: prost::Message + Default + serde::de::DeserializeOwned + PartialEq + Clone,
{
    let encoding = match encoding_of(content_type.as_ref()) {
        Ok(encoding) => encoding,
        Err(refused) => return refusal(refused),
    };
    let request = match decode_body::<R>(encoding, content_encoding.as_ref(), body.to_vec().into(), MAX_REQUEST_BYTES) {
        Ok(request) => request,
        Err(refused) => return refusal(refused),
    };
    if content_encoding.is_none() {
        let zipped = gzip(body);
        let unzipped = decode_body::<R>(encoding, Some(&header("gzip")), zipped.into(), MAX_REQUEST_BYTES);
        assert!(unzipped.ok() == Some(request.clone()), "the body gzipped decodes otherwise");
    }
    Some(request)
}

fn refusal<R>(refused: Refused) -> Option<R> {
    assert!(matches!(refused.status.as_u16(), 400 | 413 | 415), "refused with {}", refused.status);
    assert!(refused.message.ends_with('\n') && refused.message.lines().count() == 1, "{:?}", refused.message);
    None
}

fn gzip(body: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(body).expect("gzip in memory");
    encoder.finish().expect("gzip in memory")
}
