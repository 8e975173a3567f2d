//! The `type: http_scrape` task entry: its file shape ([`HttpScrapeSpec`]) and its compilation
//! into [`Scrape`]: the URL and headers, the answer's format (and for JSON its mapping) against
//! what the stream's sink sends, the timestamps' precision from that sink. It fetches nothing.
//! Called through the tasks' list (`task::read_kind`, `TaskKind::compile`) for `type: http_scrape`.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{ByException, Format, Scrape, ScrapeConfig};
use crate::record::RecordFormat;
use crate::scrape::exception::Rule;
use crate::scrape::json::{JsonMapping, TimeUnit, check_pointer};
use crate::scrape::lineproto::Precision;
use crate::shape::Problems;
use crate::shape::deadband::{self, DeadbandSpec, RuleSpec};
use crate::shape::units::{Dur, Size};
use crate::shape::url::http as parse_http_url;
use crate::task::kind::{Compile, KindSpec};

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct HttpScrapeSpec {
    /// What to GET: an `http://` or `https://` URL.
    pub url: String,
    /// How the answer becomes records: `prometheus` (text exposition format: each sample becomes an
    /// InfluxDB line-protocol record `<measurement>,<labels> <metric>=<value> <time>`), `json`
    /// (line-protocol records through `json:`), or `raw` (one JSON record per answer:
    /// `{"time_ms", "task", "url", "status", "body"}`).
    pub format: ScrapeFormatSpec,
    /// The stream the records go to. Line-protocol timestamps are written in the `precision` of
    /// the stream's sink (ns when it has none).
    pub stream: String,
    /// Extra request headers, e.g. `Authorization: "Bearer ${TOKEN}"`. Values are never logged.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The line-protocol measurement (`prometheus`, `json`). Default: the task's name.
    #[serde(default)]
    pub measurement: Option<String>,
    /// Tags added to every line-protocol record; they win over labels of the same name.
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// Answers larger than this fail the scrape. Default 16MiB.
    #[serde(default)]
    pub max_body: Option<Size>,
    /// With `format: json`: which parts of the document become records, fields and tags.
    #[serde(default)]
    pub json: Option<JsonMappingSpec>,
    /// Report by exception (`prometheus`, `json`): a field of a series (a measurement and its
    /// tags) is appended only when its number moved more than this from the value last sent,
    /// absolute (`0.5`) or a percent of that value (`"2%"`), or its boolean or string changed; a
    /// record left without fields is not appended. The first value after start, after a failed
    /// scrape or a change of the task, is always sent. Default: every value of every scrape.
    #[serde(default)]
    pub deadband: Option<DeadbandSpec>,
    /// Report by exception: a value is sent anyway when this long has passed since it was last
    /// sent. Default: never.
    #[serde(default)]
    pub heartbeat: Option<Dur>,
    /// A field's own `deadband` and `heartbeat`, by its name (a Prometheus metric's name, a JSON
    /// mapping's field), over the task's.
    #[serde(default)]
    pub fields: BTreeMap<String, RuleSpec>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ScrapeFormatSpec {
    Prometheus,
    Json,
    Raw,
}

/// How a JSON answer becomes line-protocol records. Pointers are RFC 6901 (`/data/items`, `~1` for a
/// `/` in a key).
#[derive(Debug, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct JsonMappingSpec {
    /// Pointer to an array (one record per element) or to one object. Default: the whole document
    /// is one record.
    #[serde(default)]
    pub records: Option<String>,
    /// Field name -> pointer within a record. Numbers (always written as floats), booleans and
    /// strings. Default: every top-level number and boolean of the record.
    #[serde(default)]
    pub fields: BTreeMap<String, String>,
    /// Tag name -> pointer within a record (strings, or numbers and booleans as text).
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// Pointer to the record's own timestamp. Default: the scrape's time.
    #[serde(default)]
    pub time: Option<String>,
    /// The unit of `time`: `s`, `ms` (default), `ns` or `rfc3339`.
    #[serde(default)]
    pub time_unit: Option<TimeUnit>,
}

const DEFAULT_SCRAPE_MAX_BODY: u64 = 16 << 20;

impl KindSpec for HttpScrapeSpec {
    type Handler = Scrape;

    fn compile(self, cx: &Compile<'_>, err: &mut Problems<'_>) -> Option<Scrape> {
        compile_scrape(self, cx, err)
    }
}

fn compile_scrape(
    spec: HttpScrapeSpec,
    ctx: &Compile<'_>,
    err: &mut Problems<'_>,
) -> Option<Scrape> {
    let task = ctx.task;
    let mut ok = true;
    let url = match parse_http_url(&spec.url) {
        Ok(u) => Some(u),
        Err(m) => {
            err.add("url", m);
            None
        }
    };
    let precision = scrape_precision(&spec.stream, ctx, err, &mut ok);
    let measurement = spec.measurement.unwrap_or_else(|| task.to_string());
    let line_protocol = !matches!(spec.format, ScrapeFormatSpec::Raw);
    ok &= check_scrape_stream(&spec.stream, line_protocol, ctx, err);
    if line_protocol && let Err(m) = crate::scrape::lineproto::check_measurement(&measurement) {
        err.add("measurement", m);
        ok = false;
    }
    if !line_protocol && !spec.tags.is_empty() {
        err.add(
            "tags",
            "only apply to line protocol (format: prometheus or json)".into(),
        );
        ok = false;
    }
    let headers = compile_headers(spec.headers, err, &mut ok);
    let max_body = spec.max_body.map_or(DEFAULT_SCRAPE_MAX_BODY, |s| s.0);
    if max_body == 0 {
        err.add("max_body", "must be positive".into());
        ok = false;
    }
    let format = compile_scrape_format(spec.format, spec.json, &measurement, err, &mut ok);
    let before = err.count();
    let exceptions = compile_exceptions(
        (spec.deadband.as_ref(), spec.heartbeat),
        &spec.fields,
        line_protocol,
        err,
    );
    ok &= err.count() == before;
    let url = url?;
    ok.then(|| {
        Scrape::new(ScrapeConfig {
            url,
            headers,
            format,
            stream: spec.stream,
            measurement,
            tags: spec.tags.into_iter().collect(),
            precision,
            max_body,
            exceptions,
        })
    })
}

/// Report by exception: the task's rule and the fields' own, when any filters (line protocol only).
fn compile_exceptions(
    (deadband, heartbeat): (Option<&DeadbandSpec>, Option<Dur>),
    fields: &BTreeMap<String, RuleSpec>,
    line_protocol: bool,
    err: &mut Problems<'_>,
) -> Option<ByException> {
    let rule = deadband::compile(deadband, heartbeat, err);
    let fields: Vec<(String, Rule)> = fields
        .iter()
        .map(|(name, r)| {
            let own = deadband::compile(
                r.deadband.as_ref(),
                r.heartbeat,
                &mut err.under(&format!("fields.{name}")),
            );
            (name.clone(), rule.with(own))
        })
        .collect();
    if !(rule.filters() || fields.iter().any(|(_, r)| r.filters())) {
        return None;
    }
    if !line_protocol {
        err.add(
            "deadband",
            "report by exception applies to values: format: prometheus or json, not raw".into(),
        );
        return None;
    }
    Some(ByException::new(rule, fields))
}

/// The precision of the stream's sink, so timestamps mean what the write URL says.
fn scrape_precision(
    stream: &str,
    ctx: &Compile<'_>,
    err: &mut Problems<'_>,
    ok: &mut bool,
) -> Precision {
    match ctx.stream(stream) {
        Err(m) => {
            if let Some(m) = m {
                err.add("stream", m);
            }
            *ok = false;
            Precision::Ns
        }
        // What the sink says its records are (an influx_line http sink's precision; ms for
        // prometheus_remote_write).
        Ok(_) => match ctx.format(stream) {
            RecordFormat::LineProtocol(p) => p,
            _ => Precision::Ns,
        },
    }
}

/// Whether what the scrape writes (line protocol or not) is what the stream's sink sends; when
/// not, that is reported.
fn check_scrape_stream(
    stream: &str,
    line_protocol: bool,
    ctx: &Compile<'_>,
    err: &mut Problems<'_>,
) -> bool {
    let carries = ctx.format(stream);
    let refused = match (line_protocol, carries) {
        (false, RecordFormat::LineProtocol(_)) => Some(
            "format: raw writes JSON records, but the stream's sink sends influx line protocol (encoding: influx_line): use format: prometheus or json, or a stream with a JSON sink",
        ),
        (true, RecordFormat::Json) => Some(
            "this format writes influx line protocol, but the stream's sink sends JSON (encoding: ndjson or json_array): use format: raw, or a stream whose sink has encoding: influx_line",
        ),
        _ => None,
    };
    if let Some(why) = refused {
        err.add("stream", format!("{stream:?}: {why}"));
        return false;
    }
    true
}

/// `headers`, each name and value one an HTTP header can carry.
fn compile_headers(
    headers: BTreeMap<String, String>,
    err: &mut Problems<'_>,
    ok: &mut bool,
) -> Vec<(String, String)> {
    let mut out = Vec::with_capacity(headers.len());
    for (k, v) in headers {
        if reqwest::header::HeaderName::from_bytes(k.as_bytes()).is_err() {
            err.add(&format!("headers.{k}"), "is not a valid header name".into());
            *ok = false;
        } else if reqwest::header::HeaderValue::from_str(&v).is_err() {
            err.add(
                &format!("headers.{k}"),
                "the value has characters a header cannot carry (control characters or non-ASCII)"
                    .into(),
            );
            *ok = false;
        }
        out.push((k, v));
    }
    out
}

/// How the answer becomes records: `format`, with `json` only for `format: json`.
fn compile_scrape_format(
    format: ScrapeFormatSpec,
    json: Option<JsonMappingSpec>,
    measurement: &str,
    err: &mut Problems<'_>,
    ok: &mut bool,
) -> Format {
    match (format, json) {
        (ScrapeFormatSpec::Json, j) => Format::Json(compile_json_mapping(
            j.unwrap_or_default(),
            measurement,
            err,
            ok,
        )),
        (f, Some(_)) => {
            err.add(
                "json",
                format!(
                    "only applies to format: json (this task is format: {})",
                    match f {
                        ScrapeFormatSpec::Prometheus => "prometheus",
                        _ => "raw",
                    }
                ),
            );
            *ok = false;
            Format::Raw
        }
        (ScrapeFormatSpec::Prometheus, None) => Format::Prometheus,
        (ScrapeFormatSpec::Raw, None) => Format::Raw,
    }
}

/// `json:`: every pointer checked, `time_unit` only with `time`.
fn compile_json_mapping(
    j: JsonMappingSpec,
    measurement: &str,
    err: &mut Problems<'_>,
    ok: &mut bool,
) -> JsonMapping {
    let mut pointer = |field: &str, p: &str| {
        if let Err(m) = check_pointer(p) {
            err.add(field, format!("{p:?}: {m}"));
            *ok = false;
        }
    };
    if let Some(r) = &j.records {
        pointer("json.records", r);
    }
    for (name, p) in &j.fields {
        pointer(&format!("json.fields.{name}"), p);
    }
    for (name, p) in &j.tags {
        pointer(&format!("json.tags.{name}"), p);
    }
    if let Some(t) = &j.time {
        pointer("json.time", t);
    }
    if j.time.is_none() && j.time_unit.is_some() {
        err.add("json.time_unit", "only applies with json.time".into());
        *ok = false;
    }
    let unit = j.time_unit.unwrap_or_default();
    JsonMapping {
        records: j.records,
        measurement: measurement.to_string(),
        fields: j.fields.into_iter().collect(),
        tags: j.tags.into_iter().collect(),
        time: j.time.map(|t| (t, unit)),
    }
}
