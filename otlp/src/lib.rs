//! gpuprof over OTLP, both ways: the agent's `reporter` turns a capture's events into log records
//! (the lossless event stream), allocation lifetimes into spans and live bytes into gauges and
//! profiles; the collector turns the log records back into the same events and its findings into
//! spans. Both sides use this crate, so the encoding is written once. Attribute names come from
//! `gpuprof_model::otel`.

#![warn(unreachable_pub)]

pub mod bearer;
pub mod client;
pub(crate) mod findings;
pub mod ids;
pub mod lifetimes;
pub mod logs;
pub(crate) mod metrics;
pub mod pprof;
pub mod reporter;
pub mod resource;

pub use opentelemetry_proto::tonic as proto;

use proto::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};

/// gpuprof's instrumentation scope.
pub fn scope() -> InstrumentationScope {
    InstrumentationScope {
        name: gpuprof_model::otel::SCOPE.to_string(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        ..Default::default()
    }
}

pub(crate) fn kv(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue { key: key.to_string(), value: Some(AnyValue { value: Some(value) }), ..Default::default() }
}

pub(crate) fn kv_str(key: &str, value: impl Into<String>) -> KeyValue {
    kv(key, any_value::Value::StringValue(value.into()))
}

pub(crate) fn kv_int(key: &str, value: i64) -> KeyValue {
    kv(key, any_value::Value::IntValue(value))
}

/// The value of attribute `key`, if present.
pub(crate) fn attribute<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
    attributes.iter().find(|a| a.key == key).and_then(|a| a.value.as_ref()).and_then(|v| v.value.as_ref())
}

pub fn attribute_str<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a str> {
    match attribute(attributes, key)? {
        any_value::Value::StringValue(s) => Some(s),
        _ => None,
    }
}

pub(crate) fn attribute_int(attributes: &[KeyValue], key: &str) -> Option<i64> {
    match attribute(attributes, key)? {
        any_value::Value::IntValue(i) => Some(*i),
        any_value::Value::StringValue(s) => s.parse().ok(),
        _ => None,
    }
}
