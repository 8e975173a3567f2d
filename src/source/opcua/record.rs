//! One data change (or one polled value) as a record, in the format of the stream's sink
//! ([`Output`]): an influx line-protocol point (measurement, the `node` tag and the node's tags,
//! fields `value`, `status`, `quality`, `server_time_ms`, at the source timestamp) or a JSON
//! object. Values keep their type: integers stay integers (an unsigned one beyond i64 becomes a
//! float), booleans and strings stay so, arrays and structures are written as JSON (a string
//! field in line protocol). Pure: the session hands it the node and the value.

use opcua_types::{DataValue, DateTime, StatusCode, Variant};

use super::Node;
use crate::scrape::lineproto::{FieldValue, Precision, line};

/// What the records are, as the stream's sink sends them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// A line-protocol point, its time in this precision.
    Line(Precision),
    Json,
}

/// OPC UA's epoch (1601-01-01) in 100 ns ticks before the Unix epoch.
const TICKS_TO_UNIX: i64 = 116_444_736_000_000_000;

/// Unix nanoseconds of an OPC UA time; `None` for a time the server left unset (its minimum).
pub fn unix_ns(t: &Option<DateTime>) -> Option<i64> {
    let t = t.as_ref()?;
    if t.is_null() {
        return None;
    }
    t.ticks()
        .checked_sub(TICKS_TO_UNIX)
        .and_then(|ticks| ticks.checked_mul(100))
}

/// `good`, `uncertain` or `bad`.
pub fn quality(status: StatusCode) -> &'static str {
    if status.is_good() {
        "good"
    } else if status.is_uncertain() {
        "uncertain"
    } else {
        "bad"
    }
}

/// The record of `value` read from `node`; `now_ns` stands in for a value without timestamps.
/// `None` only for a line-protocol point that cannot be written (a measurement or tag line
/// protocol refuses, which `config` keeps out).
pub fn record(
    out: Output,
    measurement: &str,
    node: &Node,
    value: &DataValue,
    now_ns: i64,
) -> Option<Vec<u8>> {
    let status = value.status.unwrap_or(StatusCode::Good);
    let source_ns = unix_ns(&value.source_timestamp);
    let server_ns = unix_ns(&value.server_timestamp);
    let at = source_ns.or(server_ns).unwrap_or(now_ns);
    let status_name = status.sub_code().name();
    match out {
        Output::Line(precision) => {
            let mut tags: Vec<(&str, &str)> = vec![("node", &node.name)];
            tags.extend(node.tags.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            let mut fields = Vec::with_capacity(4);
            if let Some(v) = value.value.as_ref().and_then(field) {
                fields.push(("value", v));
            }
            fields.push(("status", FieldValue::Str(status_name.to_string())));
            fields.push(("quality", FieldValue::Str(quality(status).to_string())));
            if let Some(ns) = server_ns {
                fields.push(("server_time_ms", FieldValue::Int(ns.div_euclid(1_000_000))));
            }
            line(
                measurement,
                &tags,
                &fields,
                Some(precision.from_unix_ns(at)),
            )
        }
        Output::Json => {
            let ms = |ns: Option<i64>| ns.map(|n| n.div_euclid(1_000_000));
            let tags: serde_json::Map<String, serde_json::Value> = node
                .tags
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().into()))
                .collect();
            let record = serde_json::json!({
                "node": node.name,
                "id": node.id.text,
                "value": value.value.as_ref().map_or(serde_json::Value::Null, json),
                "status": status_name,
                "quality": quality(status),
                "source_time_ms": ms(source_ns).unwrap_or_else(|| at.div_euclid(1_000_000)),
                "server_time_ms": ms(server_ns),
                "tags": tags,
            });
            Some(record.to_string().into_bytes())
        }
    }
}

/// A value as a line-protocol field; `None` for an empty one or a float line protocol cannot
/// write (NaN, infinities).
fn field(v: &Variant) -> Option<FieldValue> {
    let f = match v {
        Variant::Empty => return None,
        Variant::Boolean(b) => FieldValue::Bool(*b),
        Variant::SByte(n) => FieldValue::Int((*n).into()),
        Variant::Byte(n) => FieldValue::Int((*n).into()),
        Variant::Int16(n) => FieldValue::Int((*n).into()),
        Variant::UInt16(n) => FieldValue::Int((*n).into()),
        Variant::Int32(n) => FieldValue::Int((*n).into()),
        Variant::UInt32(n) => FieldValue::Int((*n).into()),
        Variant::Int64(n) => FieldValue::Int(*n),
        Variant::UInt64(n) => {
            i64::try_from(*n).map_or(FieldValue::Float(*n as f64), FieldValue::Int)
        }
        Variant::Float(x) => FieldValue::Float((*x).into()),
        Variant::Double(x) => FieldValue::Float(*x),
        Variant::String(s) => FieldValue::Str(s.as_ref().to_string()),
        Variant::LocalizedText(t) => FieldValue::Str(t.text.as_ref().to_string()),
        Variant::Array(_) | Variant::ExtensionObject(_) | Variant::Variant(_) => {
            FieldValue::Str(json(v).to_string())
        }
        other => FieldValue::Str(other.to_string()),
    };
    f.is_writable().then_some(f)
}

/// A value as JSON: numbers, booleans and strings as themselves (NaN and infinities as null),
/// arrays as arrays, anything else as its text.
pub fn json(v: &Variant) -> serde_json::Value {
    use serde_json::Value as J;
    match v {
        Variant::Empty => J::Null,
        Variant::Boolean(b) => J::Bool(*b),
        Variant::SByte(n) => (*n).into(),
        Variant::Byte(n) => (*n).into(),
        Variant::Int16(n) => (*n).into(),
        Variant::UInt16(n) => (*n).into(),
        Variant::Int32(n) => (*n).into(),
        Variant::UInt32(n) => (*n).into(),
        Variant::Int64(n) => (*n).into(),
        Variant::UInt64(n) => (*n).into(),
        Variant::Float(x) => serde_json::Number::from_f64((*x).into()).map_or(J::Null, J::Number),
        Variant::Double(x) => serde_json::Number::from_f64(*x).map_or(J::Null, J::Number),
        Variant::String(s) => J::String(s.as_ref().to_string()),
        Variant::LocalizedText(t) => J::String(t.text.as_ref().to_string()),
        Variant::Array(a) => J::Array(a.values.iter().map(json).collect()),
        Variant::Variant(inner) => json(inner),
        // A structure (a PLC's user-defined type) is named, not decoded: decoding it needs the
        // server's type dictionary.
        Variant::ExtensionObject(o) => J::String(format!(
            "(structure {})",
            o.type_name().unwrap_or("of a type the server defines")
        )),
        other => J::String(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::opcua::node::NodeRef;

    fn node() -> Node {
        Node {
            id: NodeRef::parse("nsu=urn:plant;s=Temp").expect("parses"),
            name: "temp".into(),
            sampling: std::time::Duration::from_secs(1),
            queue_size: 10,
            deadband: None,
            tags: vec![("line".into(), "1".into())],
        }
    }

    fn at_unix_ms(ms: i64) -> DateTime {
        DateTime::from(chrono_ms(ms))
    }

    fn chrono_ms(ms: i64) -> i64 {
        ms * 10_000 + TICKS_TO_UNIX
    }

    #[test]
    fn a_change_as_line_protocol_at_its_source_time() {
        let dv = DataValue {
            value: Some(Variant::Int32(-7)),
            status: Some(StatusCode::Good),
            source_timestamp: Some(at_unix_ms(1_700_000_000_123)),
            server_timestamp: Some(at_unix_ms(1_700_000_000_200)),
            ..Default::default()
        };
        let r = record(Output::Line(Precision::Ms), "opcua", &node(), &dv, 0).expect("a point");
        assert_eq!(
            String::from_utf8(r).expect("utf-8"),
            "opcua,line=1,node=temp value=-7i,status=\"Good\",quality=\"good\",server_time_ms=1700000000200i 1700000000123"
        );
    }

    #[test]
    fn a_bad_status_and_an_array_as_json() {
        let dv = DataValue {
            value: Some(Variant::from(vec![1.5f64, 2.0])),
            status: Some(StatusCode::BadSensorFailure),
            source_timestamp: Some(at_unix_ms(5_000)),
            ..Default::default()
        };
        let r = record(Output::Json, "opcua", &node(), &dv, 0).expect("a record");
        let v: serde_json::Value = serde_json::from_slice(&r).expect("json");
        assert_eq!(v["value"], serde_json::json!([1.5, 2.0]));
        assert_eq!(v["status"], "BadSensorFailure");
        assert_eq!(v["quality"], "bad");
        assert_eq!(v["source_time_ms"], 5_000);
        assert_eq!(v["server_time_ms"], serde_json::Value::Null);
        assert_eq!(v["id"], "nsu=urn:plant;s=Temp");
        assert_eq!(v["tags"]["line"], "1");
    }
}
