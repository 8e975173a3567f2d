//! The Sparkplug B payload (Eclipse Sparkplug 3.0, `sparkplug_b.proto`, proto2) as far as colibri
//! writes and reads it: a payload's timestamp, seq, uuid and metrics; a metric's name, alias,
//! timestamp, datatype, historical and null flags and its scalar value. Encoded and decoded by
//! prost (already in the release build for remote write); the field numbers are the spec's, so
//! any Sparkplug decoder reads what this writes. It knows no topic, session or record: `node`
//! and `data` build these, `node` reads NCMD payloads with them.

/// `Payload` (tags 1-4; `body`, tag 5, is never written).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Payload {
    #[prost(uint64, optional, tag = "1")]
    pub timestamp: Option<u64>,
    #[prost(message, repeated, tag = "2")]
    pub metrics: Vec<Metric>,
    #[prost(uint64, optional, tag = "3")]
    pub seq: Option<u64>,
    #[prost(string, optional, tag = "4")]
    pub uuid: Option<String>,
}

/// `Payload.Metric`: the scalar values only (datasets, templates and metadata are never written).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Metric {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(uint64, optional, tag = "2")]
    pub alias: Option<u64>,
    #[prost(uint64, optional, tag = "3")]
    pub timestamp: Option<u64>,
    #[prost(uint32, optional, tag = "4")]
    pub datatype: Option<u32>,
    #[prost(bool, optional, tag = "5")]
    pub is_historical: Option<bool>,
    #[prost(bool, optional, tag = "7")]
    pub is_null: Option<bool>,
    #[prost(oneof = "Value", tags = "10, 11, 12, 13, 14, 15")]
    pub value: Option<Value>,
}

/// `Payload.Metric.value`, the scalar members.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Value {
    #[prost(uint32, tag = "10")]
    Int(u32),
    /// Int64 as its two's complement, UInt64 and DateTime as they are.
    #[prost(uint64, tag = "11")]
    Long(u64),
    #[prost(float, tag = "12")]
    Float(f32),
    #[prost(double, tag = "13")]
    Double(f64),
    #[prost(bool, tag = "14")]
    Boolean(bool),
    #[prost(string, tag = "15")]
    String(String),
}

/// The `DataType` numbers colibri writes.
pub mod datatype {
    pub const INT64: u32 = 4;
    pub const UINT64: u32 = 8;
    pub const DOUBLE: u32 = 10;
    pub const BOOLEAN: u32 = 11;
    pub const STRING: u32 = 12;
}

impl Metric {
    /// A named metric with its datatype (births and deaths carry both).
    pub fn named(name: &str, datatype: u32, value: Value) -> Metric {
        Metric {
            name: Some(name.to_string()),
            datatype: Some(datatype),
            value: Some(value),
            ..Metric::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    #[test]
    fn a_payload_encodes_as_the_spec_numbers_its_fields() {
        let p = Payload {
            timestamp: Some(1),
            metrics: vec![Metric {
                alias: Some(2),
                value: Some(Value::Long(u64::MAX)),
                ..Metric::default()
            }],
            seq: Some(0),
            uuid: None,
        };
        let bytes = p.encode_to_vec();
        // timestamp (1, varint), metrics (2, bytes: alias 2 = 0x10 0x02, long_value 11 = 0x58 ..).
        assert_eq!(&bytes[..2], &[0x08, 0x01]);
        assert_eq!(bytes[2], 0x12);
        assert_eq!(&bytes[4..6], &[0x10, 0x02]);
        assert_eq!(bytes[6], 0x58);
        // seq 0 is written (proto2 optional): tag 3.
        assert_eq!(&bytes[bytes.len() - 2..], &[0x18, 0x00]);
        assert_eq!(Payload::decode(bytes.as_slice()).expect("decodes"), p);
    }
}
