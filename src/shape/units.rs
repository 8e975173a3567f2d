//! The serde and schema glue that lets config structs hold durations and sizes as typed values
//! (`Dur`, `Size`) and read numbers that `${VAR}` expansion turned into strings. The grammar itself
//! (parsing and formatting) is in [`crate::units`], below config, because the running layers print
//! values with it too. It does not know which fields use them or which ranges are allowed there: that
//! is validation, in each entry's `config.rs`.

use std::fmt;
use std::time::Duration;

#[cfg(feature = "schema")]
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer};

use crate::units::{fmt_duration, parse_duration, parse_size};

/// A duration as written in the file. Kept as a newtype so the schema can describe the string form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Dur(pub Duration);

/// A byte size as written in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Size(pub u64);

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&fmt_duration(self.0))
    }
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        match v {
            serde_json::Value::String(s) => parse_duration(&s)
                .map(Dur)
                .map_err(serde::de::Error::custom),
            serde_json::Value::Number(n) => Err(serde::de::Error::custom(format!(
                "duration {n} has no unit (write e.g. {n}s or {n}ms)"
            ))),
            other => Err(serde::de::Error::custom(format!(
                "expected a duration such as 30s, found {other}"
            ))),
        }
    }
}

#[cfg(feature = "schema")]
impl JsonSchema for Dur {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "description": "a duration: a number and a unit (ns, us, ms, s, m, h, d), e.g. 500ms, 30s, 1h30m, 7d; or ${VAR}",
            "pattern": "^(([0-9]+(ns|us|ms|s|m|h|d))+|.*\\$\\{.*)$"
        })
    }
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        match v {
            serde_json::Value::String(s) => {
                parse_size(&s).map(Size).map_err(serde::de::Error::custom)
            }
            serde_json::Value::Number(n) => n.as_u64().map(Size).ok_or_else(|| {
                serde::de::Error::custom(format!("size {n} is not a whole number of bytes"))
            }),
            other => Err(serde::de::Error::custom(format!(
                "expected a size such as 64MiB, found {other}"
            ))),
        }
    }
}

#[cfg(feature = "schema")]
impl JsonSchema for Size {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Size".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "a size in bytes: a number with an optional unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB), e.g. 64MiB",
            "anyOf": [
                { "type": "integer", "minimum": 0 },
                { "type": "string", "pattern": "^([0-9]+ ?(B|KiB|MiB|GiB|TiB|KB|kB|MB|GB|TB)?|.*\\$\\{.*)$" }
            ]
        })
    }
}

/// How [`de_u32`]'s refusal of a number written as a string begins: `shape::de_all` reads a string
/// that `${VAR}` expansion wrote (`workers: ${WORKERS:-4}` becomes `"4"`) as its number instead.
pub(super) const QUOTED_NUMBER: &str = "expected a whole number, found the string ";

/// Deserializes an unsigned integer. A string is refused, even one holding digits: `qos: "1"` is a
/// type error in the file as it is in the schema; `shape::de_all` reads a string that came from
/// `${VAR}` expansion as its number (it knows where the expansions are, a deserializer does not).
pub fn de_u32<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let v = serde_json::Value::deserialize(d)?;
    match &v {
        serde_json::Value::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
        serde_json::Value::String(s) if s.trim().parse::<u64>().is_ok() => {
            return Err(serde::de::Error::custom(format!(
                "{QUOTED_NUMBER}{v} (write {} without quotes)",
                s.trim()
            )));
        }
        _ => None,
    }
    .ok_or_else(|| serde::de::Error::custom(format!("expected a whole number, found {v}")))
}

/// Same as [`de_u32`] for optional fields.
pub fn de_opt_u32<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    de_u32(d).map(Some)
}

/// Schema of a field read by [`de_u32`]: an integer, or a string holding `${VAR}`.
#[cfg(feature = "schema")]
pub fn u32_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "anyOf": [
            { "type": "integer", "minimum": 0, "maximum": u32::MAX },
            { "type": "string", "pattern": "\\$\\{" }
        ]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_refuse_strings_of_digits() {
        #[derive(Deserialize)]
        struct T {
            #[serde(deserialize_with = "de_u32")]
            n: u32,
        }
        let e = serde_json::from_str::<T>(r#"{"n":"12"}"#)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.starts_with(QUOTED_NUMBER), "{e}");
        let t: T = serde_json::from_str(r#"{"n":7}"#).unwrap();
        assert_eq!(t.n, 7);
        assert!(serde_json::from_str::<T>(r#"{"n":"x"}"#).is_err());
        assert!(serde_json::from_str::<T>(r#"{"n":-1}"#).is_err());
    }

    #[test]
    fn bare_number_duration_is_refused_with_a_hint() {
        let e = serde_json::from_str::<Dur>("30").unwrap_err().to_string();
        assert!(e.contains("has no unit"), "{e}");
    }
}
