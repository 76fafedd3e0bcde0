//! JSON values as OTLP `AnyValue`s and back: an event's body is the event of docs/events.md as a
//! key-value map, so the wire form follows the contract field for field.

use opentelemetry_proto::tonic::common::v1::{any_value::Value as Any, AnyValue, ArrayValue, KeyValue, KeyValueList};
use serde_json::{Map, Number, Value};

pub fn any_of_json(value: &Value) -> AnyValue {
    let inner = match value {
        Value::Null => None,
        Value::Bool(b) => Some(Any::BoolValue(*b)),
        Value::Number(n) => Some(match n.as_i64() {
            Some(i) => Any::IntValue(i),
            // Beyond i64 (no contract field gets there) or fractional.
            None => Any::DoubleValue(n.as_f64().unwrap_or(0.0)),
        }),
        Value::String(s) => Some(Any::StringValue(s.clone())),
        Value::Array(items) => Some(Any::ArrayValue(ArrayValue { values: items.iter().map(any_of_json).collect() })),
        Value::Object(fields) => Some(Any::KvlistValue(KeyValueList {
            values: fields
                .iter()
                .map(|(key, value)| KeyValue { key: key.clone(), value: Some(any_of_json(value)), ..Default::default() })
                .collect(),
        })),
    };
    AnyValue { value: inner }
}

pub fn json_of_any(value: &AnyValue) -> Value {
    match &value.value {
        None => Value::Null,
        Some(Any::BoolValue(b)) => Value::Bool(*b),
        Some(Any::IntValue(i)) => Value::Number((*i).into()),
        Some(Any::DoubleValue(d)) => Number::from_f64(*d).map(Value::Number).unwrap_or(Value::Null),
        Some(Any::StringValue(s)) => Value::String(s.clone()),
        Some(Any::BytesValue(b)) => Value::String(gpuprof_model::hex::format_bytes(b)),
        Some(Any::ArrayValue(array)) => Value::Array(array.values.iter().map(json_of_any).collect()),
        Some(Any::KvlistValue(list)) => {
            let mut fields = Map::new();
            for kv in &list.values {
                fields.insert(kv.key.clone(), kv.value.as_ref().map(json_of_any).unwrap_or(Value::Null));
            }
            Value::Object(fields)
        }
        Some(_) => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_survives_the_round_trip() {
        let value = serde_json::json!({"a": 1, "b": [true, "x", {"c": -5}], "d": null, "e": 2.5});
        assert_eq!(json_of_any(&any_of_json(&value)), value);
    }
}
