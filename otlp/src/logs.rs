//! gpuprof's OTLP log records (OpenTelemetry events), both ways:
//! - a captured event: `event_name` `gpuprof.<op>`, the body the event's line of the jsonl
//!   output (docs/events.md) as a string, read back into the very event the agent captured. A
//!   JSON string rather than a key-value tree: the same contract, and it decodes straight into
//!   an event, several times faster (docs/benchmarks.md);
//! - a finding: `gpuprof.finding`, the body the finding of docs/findings.md as JSON;
//! - a memory profile: `gpuprof.memory_profile`, the body a pprof profile (bytes), with why it
//!   was taken. A log record carries it through every OTLP pipeline (the OpenTelemetry
//!   Collector's load balancer among them), which the profiles signal does not yet (docs/otlp.md).

use gpuprof_model::otel::log::{ATTR_PROFILE_FORMAT, ATTR_PROFILE_REASON, EVENT_NAME_PREFIX, FINDING, MEMORY_PROFILE};
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
    #[error("log record body is not bytes (a memory profile's is pprof)")]
    NotBytes,
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
    /// Another producer's log: not gpuprof's.
    Foreign,
}

pub fn kind_of(record: &LogRecord) -> RecordKind {
    match record.event_name.as_str() {
        FINDING => RecordKind::Finding,
        MEMORY_PROFILE => RecordKind::Profile,
        name if name.starts_with(EVENT_NAME_PREFIX) => RecordKind::Event,
        _ => RecordKind::Foreign,
    }
}

/// Whether a record claims to be one of gpuprof's captured events.
pub fn is_gpuprof_event(record: &LogRecord) -> bool {
    kind_of(record) == RecordKind::Event
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
