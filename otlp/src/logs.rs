//! gpuprof's OTLP log records (OpenTelemetry events), both ways:
//! - a captured event: `event_name` `gpuprof.<op>`, the body the event's line of the jsonl
//!   output (docs/events.md) as a string, read back into the very event the agent captured. A
//!   JSON string rather than a key-value tree: the same contract, and it decodes straight into
//!   an event, several times faster (docs/benchmarks.md);
//! - a finding: `gpuprof.finding`, the body the finding of docs/findings.md as JSON;
//! - a memory profile: `gpuprof.memory_profile`, the body a pprof profile (bytes), with why it
//!   was taken. A log record carries it through every OTLP pipeline (the OpenTelemetry
//!   Collector's load balancer among them), which the profiles signal does not yet (docs/otlp.md);
//! - a post-mortem's report: `gpuprof.postmortem`, the body the HTML report gzipped (bytes) and
//!   the finding it is for, or no body and why (too large to send).

use gpuprof_model::otel::log::{
    ATTR_FINDING_ID, ATTR_POSTMORTEM_ENCODING, ATTR_POSTMORTEM_HTML_BYTES, ATTR_POSTMORTEM_OMITTED,
    ATTR_POSTMORTEM_REPORT, ATTR_PROFILE_FORMAT, ATTR_PROFILE_REASON, EVENT_NAME_PREFIX, FINDING, MEMORY_PROFILE,
    POSTMORTEM,
};
use gpuprof_model::{Event, Finding};
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, SeverityNumber};

use crate::{attribute_str, kv_str};

#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("log record has no body")]
    NoBody,
    #[error("log record body is not a gpuprof event: {0}")]
    NotAnEvent(serde_json::Error),
    #[error("log record body is not a string")]
    NotAString,
    #[error("log record body is not a gpuprof finding: {0}")]
    NotAFinding(serde_json::Error),
    #[error("log record body is not bytes (a memory profile's is pprof, a post-mortem's gzipped HTML)")]
    NotBytes,
    #[error("post-mortem record names no finding ({ATTR_FINDING_ID})")]
    NoFindingId,
    #[error("post-mortem record has neither a report nor why it has none ({ATTR_POSTMORTEM_OMITTED})")]
    NoReport,
}

pub fn record_of(event: &Event) -> LogRecord {
    let body = serde_json::to_string(event).expect("an event always serializes");
    let event_name = format!("{EVENT_NAME_PREFIX}{}", event.op.as_str());
    LogRecord {
        time_unix_nano: event.ts,
        observed_time_unix_nano: event.ts,
        // A failed call is worth a look; everything else is routine.
        severity_number: if event.succeeded() { SeverityNumber::Info } else { SeverityNumber::Warn } as i32,
        event_name,
        body: Some(AnyValue { value: Some(any_value::Value::StringValue(body)) }),
        ..Default::default()
    }
}

pub fn event_of(record: &LogRecord) -> Result<Event, DecodeError> {
    match record.body.as_ref().and_then(|b| b.value.as_ref()) {
        None => Err(DecodeError::NoBody),
        Some(any_value::Value::StringValue(json)) => serde_json::from_str(json).map_err(DecodeError::NotAnEvent),
        Some(_) => Err(DecodeError::NotAString),
    }
}

/// What a log record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    Event,
    Finding,
    Profile,
    Postmortem,
    /// Another producer's log: not gpuprof's.
    Foreign,
}

pub fn kind_of(record: &LogRecord) -> RecordKind {
    match record.event_name.as_str() {
        FINDING => RecordKind::Finding,
        MEMORY_PROFILE => RecordKind::Profile,
        POSTMORTEM => RecordKind::Postmortem,
        name if name.starts_with(EVENT_NAME_PREFIX) => RecordKind::Event,
        _ => RecordKind::Foreign,
    }
}

pub fn finding_record(finding: &Finding, ts: u64) -> LogRecord {
    let body = serde_json::to_string(finding).expect("a finding always serializes");
    LogRecord {
        time_unix_nano: ts,
        observed_time_unix_nano: ts,
        severity_number: match finding.severity {
            gpuprof_model::findings::Severity::Leak => SeverityNumber::Warn as i32,
            gpuprof_model::findings::Severity::Info => SeverityNumber::Info as i32,
        },
        event_name: FINDING.to_string(),
        body: Some(AnyValue { value: Some(any_value::Value::StringValue(body)) }),
        ..Default::default()
    }
}

pub fn finding_of(record: &LogRecord) -> Result<Finding, DecodeError> {
    match record.body.as_ref().and_then(|b| b.value.as_ref()) {
        None => Err(DecodeError::NoBody),
        Some(any_value::Value::StringValue(json)) => serde_json::from_str(json).map_err(DecodeError::NotAFinding),
        Some(_) => Err(DecodeError::NotAString),
    }
}

/// A memory profile (pprof bytes) taken at `ts`, and why (`periodic`, `finding`, `exit`, …).
pub fn profile_record(pprof: Vec<u8>, ts: u64, reason: &str) -> LogRecord {
    LogRecord {
        time_unix_nano: ts,
        observed_time_unix_nano: ts,
        severity_number: SeverityNumber::Info as i32,
        event_name: MEMORY_PROFILE.to_string(),
        body: Some(AnyValue { value: Some(any_value::Value::BytesValue(pprof)) }),
        attributes: vec![kv_str(ATTR_PROFILE_REASON, reason), kv_str(ATTR_PROFILE_FORMAT, "pprof")],
        ..Default::default()
    }
}

/// A profile record's pprof bytes and reason.
pub fn profile_of(record: &LogRecord) -> Result<(&[u8], &str), DecodeError> {
    match record.body.as_ref().and_then(|b| b.value.as_ref()) {
        Some(any_value::Value::BytesValue(bytes)) => {
            Ok((bytes, attribute_str(&record.attributes, ATTR_PROFILE_REASON).unwrap_or("")))
        }
        None => Err(DecodeError::NoBody),
        Some(_) => Err(DecodeError::NotBytes),
    }
}

/// A post-mortem's report as a record: the finding it is for, the report's path on the node
/// and its size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostmortemRecord {
    pub finding_id: String,
    pub report: String,
    pub html_bytes: u64,
    pub body: PostmortemBody,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PostmortemBody {
    /// The HTML report, gzipped.
    Gzip(Vec<u8>),
    /// Not sent, and why.
    Omitted(String),
}

pub fn postmortem_record(postmortem: PostmortemRecord, ts: u64) -> LogRecord {
    let mut attributes = vec![
        kv_str(ATTR_FINDING_ID, postmortem.finding_id),
        kv_str(ATTR_POSTMORTEM_REPORT, postmortem.report),
        crate::kv_int(ATTR_POSTMORTEM_HTML_BYTES, postmortem.html_bytes as i64),
    ];
    let body = match postmortem.body {
        PostmortemBody::Gzip(bytes) => {
            attributes.push(kv_str(ATTR_POSTMORTEM_ENCODING, "gzip"));
            Some(AnyValue { value: Some(any_value::Value::BytesValue(bytes)) })
        }
        PostmortemBody::Omitted(why) => {
            attributes.push(kv_str(ATTR_POSTMORTEM_OMITTED, why));
            None
        }
    };
    LogRecord {
        time_unix_nano: ts,
        observed_time_unix_nano: ts,
        severity_number: SeverityNumber::Info as i32,
        event_name: POSTMORTEM.to_string(),
        body,
        attributes,
        ..Default::default()
    }
}

pub fn postmortem_of(record: &LogRecord) -> Result<PostmortemRecord, DecodeError> {
    let attribute = |key| attribute_str(&record.attributes, key);
    let finding_id = attribute(ATTR_FINDING_ID).filter(|id| !id.is_empty()).ok_or(DecodeError::NoFindingId)?;
    let body = match (record.body.as_ref().and_then(|b| b.value.as_ref()), attribute(ATTR_POSTMORTEM_OMITTED)) {
        (Some(any_value::Value::BytesValue(bytes)), _) => PostmortemBody::Gzip(bytes.clone()),
        (Some(_), _) => return Err(DecodeError::NotBytes),
        (None, Some(why)) => PostmortemBody::Omitted(why.to_string()),
        (None, None) => return Err(DecodeError::NoReport),
    };
    Ok(PostmortemRecord {
        finding_id: finding_id.to_string(),
        report: attribute(ATTR_POSTMORTEM_REPORT).unwrap_or_default().to_string(),
        html_bytes: crate::attribute_int(&record.attributes, ATTR_POSTMORTEM_HTML_BYTES).unwrap_or(0).max(0) as u64,
        body,
    })
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use gpuprof_model::{Frame, Kind, Layer, Op, Source};

    use super::*;

    #[test]
    fn an_event_survives_the_round_trip_field_for_field() {
        let mut event = Event::new(
            1_700_000_000_123_456_789,
            41,
            42,
            Source::Ebpf,
            Layer::Driver,
            Op::IpcOpen,
            Cow::Borrowed("cuIpcOpenMemHandle_v2"),
        );
        event.kind = Some(Kind::Device);
        event.addr = Some(0x7f12_3400_0000);
        event.handle = Some((0..64).collect());
        event.peer_pid = Some(40);
        event.result = 0;
        event.comm = "python3".into();
        event.stack = vec![Frame { function: "rebuild".into(), file: "/w/données.py".into(), line: 180 }].into();
        let record = record_of(&event);
        assert_eq!(record.event_name, "gpuprof.ipc_open");
        assert_eq!(record.time_unix_nano, 1_700_000_000_123_456_789);
        assert_eq!(record.severity_number, SeverityNumber::Info as i32);
        assert_eq!(event_of(&record).unwrap(), event);

        event.result = 2;
        assert_eq!(record_of(&event).severity_number, SeverityNumber::Warn as i32);
    }

    #[test]
    fn a_postmortem_report_survives_the_round_trip_and_one_without_a_body_says_why() {
        let sent = PostmortemRecord {
            finding_id: "5f0c2a9d41e7b3c8".into(),
            report: "/var/lib/gpuprof/postmortems/n-1-python3-oom-20261127-120304.html".into(),
            html_bytes: 912_345,
            body: PostmortemBody::Gzip(vec![0x1f, 0x8b, 8, 0]),
        };
        let record = postmortem_record(sent.clone(), 7);
        assert_eq!((record.event_name.as_str(), kind_of(&record)), ("gpuprof.postmortem", RecordKind::Postmortem));
        assert_eq!(attribute_str(&record.attributes, ATTR_POSTMORTEM_ENCODING), Some("gzip"));
        assert_eq!(postmortem_of(&record).unwrap(), sent);

        let note = PostmortemRecord { body: PostmortemBody::Omitted("9.0 MiB gzipped".into()), ..sent };
        assert_eq!(postmortem_of(&postmortem_record(note.clone(), 7)).unwrap(), note);
        let mut bare = postmortem_record(note, 7);
        bare.attributes.retain(|a| a.key != ATTR_POSTMORTEM_OMITTED);
        assert_eq!(
            postmortem_of(&bare).unwrap_err().to_string(),
            "post-mortem record has neither a report nor why it has none (gpuprof.postmortem.omitted)"
        );
        bare.attributes.clear();
        assert_eq!(
            postmortem_of(&bare).unwrap_err().to_string(),
            "post-mortem record names no finding (gpuprof.finding.id)"
        );
    }

    #[test]
    fn a_record_that_is_not_an_event_is_an_error() {
        assert!(matches!(event_of(&LogRecord::default()), Err(DecodeError::NoBody)));
        let mut record = LogRecord {
            body: Some(AnyValue { value: Some(any_value::Value::StringValue(r#"{"ts": "soon"}"#.into())) }),
            ..LogRecord::default()
        };
        assert!(event_of(&record).unwrap_err().to_string().starts_with("log record body is not a gpuprof event"));
        record.body = Some(AnyValue { value: Some(any_value::Value::IntValue(3)) });
        assert_eq!(event_of(&record).unwrap_err().to_string(), "log record body is not a string");
    }
}
