//! JSON responses into line-protocol records, through an operator's [`JsonMapping`]: which part of
//! the document holds the records, which values become fields and tags, where each record's time
//! is. It owns that mapping's meaning and [`check_pointer`], the config-time check of its JSON
//! pointers; it does not fetch or bound the body (the caller does), nor parse the config file.
//! Called by the `http_scrape` task handler for `format: json`, and by config validation for the
//! pointers.
//!
//! Decisions: an extra tag (set by the operator for the task) wins over a mapped tag of the same
//! name; a record's time that is present but unusable (wrong type, not RFC 3339, out of range)
//! fails the whole response rather than being silently replaced by the scrape time; `null` counts
//! as missing everywhere; with no `fields` named, the members a tag or the time takes are not
//! fields as well (a timestamp or an id is not a measurement). JSON has one number type, and every
//! number becomes a float field: a source that writes `19` one time and `19.5` the next would
//! otherwise give InfluxDB two types for one field, and InfluxDB refuses the second write for good.

use std::borrow::Cow;

use serde_json::Value;

use super::lineproto::{FieldValue, FieldsBuilder, LineBuilder, Precision};

/// How a JSON document becomes records. Pointers are RFC 6901 (`/data/items/0/name`, `~1` for `/`
/// and `~0` for `~` inside a key); `""` is the whole value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonMapping {
    /// Where the records are: an array (one record per element) or any other value (one record).
    /// `None`: the whole document is one record, even when it is an array (write `""` to take a
    /// top-level array's elements as records).
    pub records: Option<String>,
    pub measurement: String,
    /// Field name -> pointer relative to the record. Empty: every top-level number and boolean of
    /// the record, under its own key, except members that a tag or the time already takes
    /// (pointers of one token, `/name`).
    pub fields: Vec<(String, String)>,
    /// Tag name -> pointer relative to the record.
    pub tags: Vec<(String, String)>,
    /// Pointer to the record's own timestamp and its unit; absent or `null`: the scrape time.
    pub time: Option<(String, TimeUnit)>,
}

/// The unit of a record's own timestamp; also the file's word (`time_unit:`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum TimeUnit {
    /// A number of seconds since 1970 (a fraction is kept to the nanosecond).
    S,
    /// A number of milliseconds since 1970 (the default).
    #[default]
    Ms,
    /// A number of nanoseconds since 1970.
    Ns,
    /// A string such as `2024-03-01T12:00:00.250+01:00`.
    Rfc3339,
}

/// What one response gave.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JsonStats {
    /// Records written.
    pub records: u64,
    /// Records left out because not one field could be taken from them.
    pub skipped: u64,
}

/// InfluxDB's timestamp range, ±9223372036854775806 ns: it reserves the extremes of `i64`.
const MIN_NS: i64 = i64::MIN + 2;
const MAX_NS: i64 = i64::MAX - 1;

/// Converts a JSON body, appending one record per element to `out`. On error `out` is left as it
/// was on entry, so the caller never stores half a response.
pub fn to_lines(
    body: &[u8],
    m: &JsonMapping,
    extra_tags: &[(String, String)],
    scrape_ts_ns: i64,
    precision: Precision,
    out: &mut Vec<Vec<u8>>,
) -> Result<JsonStats, String> {
    let entry_len = out.len();
    let result = convert(body, m, extra_tags, scrape_ts_ns, precision, out);
    if result.is_err() {
        out.truncate(entry_len);
    }
    result
}

fn convert(
    body: &[u8],
    m: &JsonMapping,
    extra_tags: &[(String, String)],
    scrape_ts_ns: i64,
    precision: Precision,
    out: &mut Vec<Vec<u8>>,
) -> Result<JsonStats, String> {
    // serde_json refuses nesting deeper than 128, so a hostile body cannot exhaust the stack.
    let doc: Value =
        serde_json::from_slice(body).map_err(|e| format!("response is not valid json: {e}"))?;
    let selected = match &m.records {
        None => None,
        Some(p) => Some(
            doc.pointer(p)
                .ok_or_else(|| format!("records pointer {p:?} not found in the response"))?,
        ),
    };
    // Both tag lists sorted once per response; a name given twice: the first wins.
    let mut extra: Vec<(&str, &str)> = extra_tags
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    extra.sort_by(|a, b| a.0.cmp(b.0));
    extra.dedup_by(|later, earlier| later.0 == earlier.0);
    let mut mapped: Vec<(&str, &str)> = m
        .tags
        .iter()
        .map(|(k, p)| (k.as_str(), p.as_str()))
        .collect();
    mapped.sort_by(|a, b| a.0.cmp(b.0));
    mapped.dedup_by(|later, earlier| later.0 == earlier.0);
    // Top-level members named by the time or a tag pointer: not fields when `fields` is empty.
    let mut taken: Vec<Cow<str>> = mapped
        .iter()
        .map(|(_, p)| *p)
        .chain(m.time.as_ref().map(|(p, _)| p.as_str()))
        .filter_map(top_level_key)
        .collect();
    taken.sort_unstable();
    let ctx = Context {
        m,
        extra: &extra,
        mapped: &mapped,
        taken: &taken,
        scrape_ts_ns,
        precision,
    };

    let mut stats = JsonStats::default();
    let mut emit = |record: Option<Vec<u8>>| match record {
        Some(r) => {
            out.push(r);
            stats.records += 1;
        }
        None => stats.skipped += 1,
    };
    match selected {
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                emit(ctx.record(item).map_err(|e| format!("record {i}: {e}"))?);
            }
        }
        Some(one) => emit(ctx.record(one).map_err(|e| format!("record: {e}"))?),
        None => emit(ctx.record(&doc).map_err(|e| format!("record: {e}"))?),
    }
    Ok(stats)
}

/// What every record of one response shares.
struct Context<'a> {
    m: &'a JsonMapping,
    extra: &'a [(&'a str, &'a str)],
    /// Tag name -> pointer, sorted by name.
    mapped: &'a [(&'a str, &'a str)],
    /// Sorted keys of the top-level members used as tags or the time.
    taken: &'a [Cow<'a, str>],
    scrape_ts_ns: i64,
    precision: Precision,
}

impl Context<'_> {
    /// One record; `None` when it has no field.
    fn record(&self, item: &Value) -> Result<Option<Vec<u8>>, String> {
        let ts_ns = match &self.m.time {
            Some((p, unit)) => match item.pointer(p) {
                None | Some(Value::Null) => self.scrape_ts_ns,
                Some(v) => time_ns(v, *unit).map_err(|e| format!("time {p:?}: {e}"))?,
            },
            None => self.scrape_ts_ns,
        };

        let mut tags: Vec<(&str, Cow<str>)> = Vec::with_capacity(self.mapped.len());
        for &(name, p) in self.mapped {
            let value = match item.pointer(p) {
                Some(Value::String(s)) => Cow::Borrowed(s.as_str()),
                Some(Value::Number(n)) => Cow::Owned(n.to_string()),
                Some(Value::Bool(b)) => Cow::Borrowed(if *b { "true" } else { "false" }),
                // Missing, null, arrays and objects: no tag.
                _ => continue,
            };
            tags.push((name, value));
        }

        let mut b = LineBuilder::new(&self.m.measurement);
        // `tags` follows `mapped`, sorted by name; the task's own tags win over the response's.
        b.merged_tags(&tags, self.extra);

        let mut f = b.fields();
        if self.m.fields.is_empty() {
            if let Value::Object(map) = item {
                let mut members: Vec<(&String, &Value)> = map.iter().collect();
                // Sorted whatever order the map keeps (serde_json's `preserve_order` changes it).
                members.sort_unstable_by(|a, b| a.0.cmp(b.0));
                for (key, value) in members {
                    let taken = self
                        .taken
                        .binary_search_by(|t| t.as_ref().cmp(key.as_str()))
                        .is_ok();
                    if !taken && matches!(value, Value::Number(_) | Value::Bool(_)) {
                        add_field(&mut f, key, value);
                    }
                }
            }
        } else {
            for (name, p) in &self.m.fields {
                if let Some(value) = item.pointer(p) {
                    add_field(&mut f, name, value);
                }
            }
        }
        Ok(f.finish(Some(self.precision.from_unix_ns(ts_ns))))
    }
}

/// Adds `value` as a field when it is a number, a bool or a string; other kinds are left out.
fn add_field(f: &mut FieldsBuilder, key: &str, value: &Value) {
    match value {
        Value::Number(n) => {
            // Always a float, as Prometheus samples are: a source that sends `19` and later
            // `19.5` would otherwise give one field two types, and InfluxDB refuses the second
            // write for good. serde_json never yields a non-finite float (and the builder would
            // leave one out anyway).
            let v = FieldValue::Float(n.as_f64().unwrap_or(f64::NAN));
            f.field(key, &v);
        }
        Value::Bool(b) => {
            f.field(key, &FieldValue::Bool(*b));
        }
        Value::String(s) => {
            f.field_str(key, s);
        }
        Value::Null | Value::Array(_) | Value::Object(_) => {}
    }
}

/// A record's own timestamp in nanoseconds since 1970.
fn time_ns(v: &Value, unit: TimeUnit) -> Result<i64, String> {
    let (per_unit, unit_name) = match unit {
        TimeUnit::S => (1_000_000_000_i64, "seconds"),
        TimeUnit::Ms => (1_000_000, "milliseconds"),
        TimeUnit::Ns => (1, "nanoseconds"),
        TimeUnit::Rfc3339 => {
            let Value::String(s) = v else {
                return Err(format!(
                    "expected an RFC 3339 time string, found {}",
                    kind(v)
                ));
            };
            let t = chrono::DateTime::parse_from_rfc3339(s)
                .map_err(|e| format!("{s:?} is not an RFC 3339 time: {e}"))?;
            return t
                .timestamp_nanos_opt()
                .filter(|ns| (MIN_NS..=MAX_NS).contains(ns))
                .ok_or_else(|| format!("{s:?} is out of range"));
        }
    };
    let Value::Number(n) = v else {
        return Err(format!(
            "expected a number of {unit_name}, found {}",
            kind(v)
        ));
    };
    let out_of_range = || format!("{n} {unit_name} is out of range");
    let ns = match n.as_i64() {
        Some(i) => i.checked_mul(per_unit).ok_or_else(out_of_range)?,
        None => {
            // A fraction (`1700000000.25` s), or an integer beyond i64. f64 keeps about 16
            // digits, so a fractional time is exact to well under a microsecond today.
            let x = n.as_f64().unwrap_or(f64::NAN) * per_unit as f64;
            // The bounds are exact in f64 (±2^63); anything inside them converts without loss of
            // range, and `as` would saturate rather than wrap.
            if !(x.is_finite()
                && x > -9_223_372_036_854_775_808.0
                && x < 9_223_372_036_854_775_808.0)
            {
                return Err(out_of_range());
            }
            x.round() as i64
        }
    };
    if !(MIN_NS..=MAX_NS).contains(&ns) {
        return Err(out_of_range());
    }
    Ok(ns)
}

/// The member key a one-token pointer (`/name`) names, unescaped; `None` for deeper pointers.
fn top_level_key(p: &str) -> Option<Cow<'_, str>> {
    let token = p.strip_prefix('/')?;
    if token.contains('/') {
        return None;
    }
    Some(if token.contains('~') {
        // RFC 6901 order: `~1` first, so `~01` becomes `~1`, not `/`.
        Cow::Owned(token.replace("~1", "/").replace("~0", "~"))
    } else {
        Cow::Borrowed(token)
    })
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Config-time check of a JSON pointer (RFC 6901): empty, or `/` followed by reference tokens in
/// which `~` only appears as `~0` (for `~`) or `~1` (for `/`). serde_json would read an invalid
/// pointer as one that matches nothing, so a typo would silently drop data.
pub fn check_pointer(p: &str) -> Result<(), String> {
    if p.is_empty() {
        return Ok(());
    }
    if !p.starts_with('/') {
        return Err(format!(
            "json pointer {p:?} must be empty or start with \"/\""
        ));
    }
    let bytes = p.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        if b == b'~' && !matches!(bytes.get(i + 1), Some(b'0' | b'1')) {
            return Err(format!(
                "json pointer {p:?}: \"~\" must be followed by 0 or 1 (\"~0\" is \"~\", \"~1\" is \"/\")"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TS: i64 = 1_700_000_000_123_456_789;

    fn mapping(records: Option<&str>) -> JsonMapping {
        JsonMapping {
            records: records.map(str::to_string),
            measurement: "plc".into(),
            fields: Vec::new(),
            tags: Vec::new(),
            time: None,
        }
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    fn run(
        body: &str,
        m: &JsonMapping,
        extra: &[(String, String)],
        precision: Precision,
    ) -> (Vec<String>, JsonStats) {
        let mut out = Vec::new();
        let stats = to_lines(body.as_bytes(), m, extra, TS, precision, &mut out).expect("converts");
        let lines = out
            .into_iter()
            .map(|r| String::from_utf8(r).expect("utf-8"))
            .collect();
        (lines, stats)
    }

    fn fail(body: &str, m: &JsonMapping) -> String {
        let mut out = vec![b"kept".to_vec()];
        let err =
            to_lines(body.as_bytes(), m, &[], TS, Precision::Ns, &mut out).expect_err("must fail");
        assert_eq!(out, vec![b"kept".to_vec()], "output left as on entry");
        err
    }

    #[test]
    fn an_object_with_numbers_becomes_one_record() {
        let body = r#"{
            "uptime_s": 86400,
            "temperature": 41.5,
            "fan_on": true,
            "voltage": 2.3e1,
            "serial": "A-1234",
            "config": {"mode": 3},
            "errors": [1, 2],
            "last_error": null
        }"#;
        let (lines, stats) = run(body, &mapping(None), &[], Precision::S);
        assert_eq!(
            lines,
            ["plc fan_on=true,temperature=41.5,uptime_s=86400,voltage=23 1700000000"]
        );
        assert_eq!(
            stats,
            JsonStats {
                records: 1,
                skipped: 0
            }
        );
    }

    fn items_mapping(time: TimeUnit) -> JsonMapping {
        JsonMapping {
            records: Some("/data/items".into()),
            measurement: "sensors".into(),
            fields: pairs(&[("temp", "/reading/temp"), ("ok", "/ok")]),
            tags: pairs(&[("id", "/id"), ("zone", "/location/zone"), ("bus", "/bus")]),
            time: Some(("/ts".into(), time)),
        }
    }

    #[test]
    fn array_with_tags_and_a_time_in_ms() {
        let body = r#"{"data": {"count": 3, "items": [
            {"id": "s-1", "location": {"zone": "hall 2"}, "bus": 3, "reading": {"temp": 21.25}, "ok": true, "ts": 1709294400250},
            {"id": "s-2", "location": {"zone": null}, "reading": {"temp": 19}, "ts": 1709294401000},
            {"id": "s-3", "reading": {}, "ts": 1709294402000},
            {"id": "s-4", "reading": {"temp": -3.5}}
        ]}}"#;
        let extra = pairs(&[("site", "factory-7")]);
        let (lines, stats) = run(body, &items_mapping(TimeUnit::Ms), &extra, Precision::Ms);
        assert_eq!(
            lines,
            [
                r"sensors,bus=3,id=s-1,site=factory-7,zone=hall\ 2 temp=21.25,ok=true 1709294400250",
                "sensors,id=s-2,site=factory-7 temp=19 1709294401000",
                "sensors,id=s-4,site=factory-7 temp=-3.5 1700000000123",
            ]
        );
        assert_eq!(
            stats,
            JsonStats {
                records: 3,
                skipped: 1
            }
        );
    }

    #[test]
    fn array_with_an_rfc3339_time() {
        let body = r#"{"data": {"items": [
            {"id": "s-1", "reading": {"temp": 21.25}, "ts": "2024-03-01T12:00:00.250Z"},
            {"id": "s-2", "reading": {"temp": 22}, "ts": "2024-03-01T13:00:01+01:00"}
        ]}}"#;
        let (ns, _) = run(body, &items_mapping(TimeUnit::Rfc3339), &[], Precision::Ns);
        assert_eq!(
            ns,
            [
                "sensors,id=s-1 temp=21.25 1709294400250000000",
                "sensors,id=s-2 temp=22 1709294401000000000",
            ]
        );
        let (s, _) = run(body, &items_mapping(TimeUnit::Rfc3339), &[], Precision::S);
        assert_eq!(s[0], "sensors,id=s-1 temp=21.25 1709294400");
    }

    #[test]
    fn times_in_seconds_and_nanoseconds() {
        let m = |unit| JsonMapping {
            records: Some(String::new()),
            time: Some(("/t".into(), unit)),
            ..mapping(None)
        };
        let body =
            r#"[{"v": 1, "t": 1709294400}, {"v": 2, "t": 1709294400.5}, {"v": 3, "t": null}]"#;
        let (lines, _) = run(body, &m(TimeUnit::S), &[], Precision::Ns);
        assert_eq!(
            lines,
            [
                "plc v=1 1709294400000000000",
                "plc v=2 1709294400500000000",
                "plc v=3 1700000000123456789",
            ]
        );
        let (lines, _) = run(
            r#"[{"v": 1, "t": 1709294400250000001}]"#,
            &m(TimeUnit::Ns),
            &[],
            Precision::Us,
        );
        assert_eq!(lines, ["plc v=1 1709294400250000"]);
    }

    #[test]
    fn bad_times_fail_the_response() {
        let m = |unit| JsonMapping {
            records: Some(String::new()),
            time: Some(("/t".into(), unit)),
            ..mapping(None)
        };
        let cases = [
            (
                TimeUnit::Ms,
                r#"[{"v": 1, "t": 5}, {"v": 1, "t": "soon"}]"#,
                r#"record 1: time "/t": expected a number of milliseconds, found a string"#,
            ),
            (
                TimeUnit::Rfc3339,
                r#"[{"v": 1, "t": 1709294400}]"#,
                r#"record 0: time "/t": expected an RFC 3339 time string, found a number"#,
            ),
            (
                TimeUnit::Rfc3339,
                r#"[{"v": 1, "t": "2024-03-01 noon"}]"#,
                r#"record 0: time "/t": "2024-03-01 noon" is not an RFC 3339 time: premature end of input"#,
            ),
            (
                TimeUnit::S,
                r#"[{"v": 1, "t": 1e300}]"#,
                r#"record 0: time "/t": 1e+300 seconds is out of range"#,
            ),
            (
                TimeUnit::S,
                r#"[{"v": 1, "t": 9223372037}]"#,
                r#"record 0: time "/t": 9223372037 seconds is out of range"#,
            ),
            (
                TimeUnit::Ns,
                r#"[{"v": 1, "t": 9223372036854775807}]"#,
                r#"record 0: time "/t": 9223372036854775807 nanoseconds is out of range"#,
            ),
            (
                TimeUnit::Ns,
                r#"{"v": 1, "t": true}"#,
                r#"record: time "/t": expected a number of nanoseconds, found a boolean"#,
            ),
        ];
        for (unit, body, want) in cases {
            assert_eq!(fail(body, &m(unit)), want, "{body}");
        }
    }

    #[test]
    fn a_missing_records_pointer_names_it() {
        let m = mapping(Some("/data/items"));
        assert_eq!(
            fail(r#"{"data": {"rows": []}}"#, &m),
            r#"records pointer "/data/items" not found in the response"#
        );
    }

    #[test]
    fn invalid_json_fails() {
        let err = fail(r#"{"a": 1,"#, &mapping(None));
        assert!(err.starts_with("response is not valid json: "), "{err}");
        let deep = "[".repeat(10_000);
        let err = fail(&deep, &mapping(None));
        assert!(err.contains("recursion limit"), "{err}");
    }

    #[test]
    fn records_without_fields_are_skipped_and_counted() {
        let body = r#"[{"name": "a", "v": 1}, {"name": "b"}, 7, "text", {"v": 2}]"#;
        let (lines, stats) = run(body, &mapping(Some("")), &[], Precision::S);
        assert_eq!(lines, ["plc v=1 1700000000", "plc v=2 1700000000"]);
        assert_eq!(
            stats,
            JsonStats {
                records: 2,
                skipped: 3
            }
        );
        // Without a records pointer, the whole array is one record, and it has no field.
        let (lines, stats) = run(body, &mapping(None), &[], Precision::S);
        assert!(lines.is_empty());
        assert_eq!(
            stats,
            JsonStats {
                records: 0,
                skipped: 1
            }
        );
    }

    #[test]
    fn every_number_is_a_float() {
        let body = r#"{"small": -42, "big": 9223372036854775807, "huge": 18446744073709551615,
                       "frac": 0.5, "exp": 1e3, "zero_point": 3.0}"#;
        let (lines, _) = run(body, &mapping(None), &[], Precision::S);
        assert_eq!(
            lines,
            [
                "plc big=9.223372036854776e+18,exp=1000,frac=0.5,huge=1.8446744073709552e+19,small=-42,zero_point=3 1700000000"
            ]
        );
    }

    #[test]
    fn strings_only_when_named() {
        let mut m = mapping(None);
        let body = r#"{"state": "running \"ok\"\nsince boot", "rpm": 1200}"#;
        let (lines, _) = run(body, &m, &[], Precision::S);
        assert_eq!(lines, ["plc rpm=1200 1700000000"]);
        m.fields = pairs(&[("state", "/state"), ("rpm", "/rpm"), ("missing", "/nope")]);
        let (lines, _) = run(body, &m, &[], Precision::S);
        assert_eq!(
            lines,
            [r#"plc state="running \"ok\"\nsince boot",rpm=1200 1700000000"#]
        );
    }

    #[test]
    fn tags_from_numbers_bools_and_strings_and_extra_tags_win() {
        let mut m = mapping(None);
        m.tags = pairs(&[
            ("unit", "/unit"),
            ("line", "/line"),
            ("primary", "/primary"),
            ("site", "/site"),
            ("nested", "/nested"),
            ("empty", "/empty"),
        ]);
        let body = r#"{"unit": "m/s", "line": 4, "primary": false, "site": "from-device",
                       "nested": {"a": 1}, "empty": "", "speed": 1.25}"#;
        let extra = pairs(&[("site", "edge-1")]);
        let (lines, _) = run(body, &m, &extra, Precision::S);
        assert_eq!(
            lines,
            // With no `fields` given, members taken as tags are not fields too.
            ["plc,line=4,primary=false,site=edge-1,unit=m/s speed=1.25 1700000000"]
        );
    }

    #[test]
    fn escaping_in_mapped_names() {
        let m = JsonMapping {
            records: None,
            measurement: "plant floor,A".into(),
            fields: pairs(&[("motor speed", "/a~1b"), ("x=y", "/m~0n")]),
            tags: pairs(&[("line id", "/id")]),
            time: None,
        };
        let body = r#"{"a/b": 3, "m~n": 4.5, "id": "L 1,2"}"#;
        let (lines, _) = run(body, &m, &[], Precision::S);
        assert_eq!(
            lines,
            [r"plant\ floor\,A,line\ id=L\ 1\,2 motor\ speed=3,x\=y=4.5 1700000000"]
        );
    }

    #[test]
    fn a_scalar_record_with_an_empty_field_pointer() {
        let m = JsonMapping {
            records: Some("/value".into()),
            fields: pairs(&[("value", "")]),
            ..mapping(None)
        };
        let (lines, _) = run(r#"{"value": 17.5}"#, &m, &[], Precision::S);
        assert_eq!(lines, ["plc value=17.5 1700000000"]);
    }

    #[test]
    fn top_level_keys_of_pointers() {
        assert_eq!(top_level_key("/ts").as_deref(), Some("ts"));
        assert_eq!(top_level_key("/a~1b~0c~01").as_deref(), Some("a/b~c~1"));
        assert_eq!(top_level_key("/a/b"), None);
        assert_eq!(top_level_key(""), None);
        assert_eq!(top_level_key("/").as_deref(), Some(""));
    }

    #[test]
    fn pointers_are_checked() {
        for ok in ["", "/", "/data/items", "/a~0b/c~1d", "/0"] {
            assert_eq!(check_pointer(ok), Ok(()), "{ok}");
        }
        assert_eq!(
            check_pointer("data/items"),
            Err(r#"json pointer "data/items" must be empty or start with "/""#.into())
        );
        for bad in ["/a~", "/a~2", "/~x/b"] {
            assert_eq!(
                check_pointer(bad),
                Err(format!(
                    r#"json pointer {bad:?}: "~" must be followed by 0 or 1 ("~0" is "~", "~1" is "/")"#
                )),
                "{bad}"
            );
        }
    }
}
