//! The `type: http` sink entry: its file shape ([`HttpSinkSpec`]) and its compilation into
//! [`HttpConfig`] (the URL and its `precision=`, method, encoding, compression, headers checked and
//! the client built once, so a bad CA file is reported at load). It sends nothing: the sink does.
//! `remote_write` compiles its transport with [`compile_http`]. Called through the sinks' list
//! (`sink::compile_kind`) for `type: http`.

use std::collections::{BTreeMap, HashSet};

use serde::Deserialize;

use super::{Compression, Encoding, HttpConfig, HttpMethod, HttpSink};
use crate::scrape::lineproto::Precision;
use crate::shape::Problems;
use crate::shape::tls::TlsSpec;
#[cfg(feature = "schema")]
use crate::shape::units::u32_schema;
use crate::shape::units::{self, Dur, Size};
use crate::shape::url::http as parse_http_url;
use crate::sink::config::{LinkSpec, RetrySpec, compile_link};
use crate::sink::kind::{Compile, KindSpec};

/// `type: http` settings.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct HttpSinkSpec {
    /// Where requests go: an `http://` or `https://` URL.
    pub url: String,
    /// `post` (default) or `put`.
    #[serde(default)]
    pub method: Option<HttpMethod>,
    /// How records become a body; they are passed through as stored. Default `ndjson`.
    #[serde(default)]
    pub encoding: Option<Encoding>,
    /// With `encoding: influx_line`: the unit of the records' timestamps, sent as the request's
    /// `precision` parameter (`u` for microseconds on `/write`, as InfluxDB 1.x and VictoriaMetrics
    /// expect; `us` on `/api/v2/write`). `http_scrape` tasks writing to a stream of this sink
    /// timestamp their records in it. Default `ns`.
    #[serde(default)]
    pub precision: Option<Precision>,
    /// Body compression (`Content-Encoding`). Default `none`.
    #[serde(default)]
    pub compression: Option<Compression>,
    /// Extra request headers, e.g. `Authorization: "Bearer ${TOKEN}"`. Values are never logged.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Longest wait for a whole request and its answer. Default 10s.
    #[serde(default)]
    pub timeout: Option<Dur>,
    /// Requests in flight at once, 1-64. Default 1, which keeps strict order.
    #[serde(default, deserialize_with = "units::de_opt_u32")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "u32_schema"))]
    pub concurrency: Option<u32>,
    #[serde(default)]
    pub tls: TlsSpec,
    #[serde(default)]
    pub retry: RetrySpec,
    #[serde(default)]
    pub link: LinkSpec,
    /// Bytes per second while a backlog is replayed (after an outage or at start), e.g. `256KiB`,
    /// so a reconnecting cellular link is not flooded. Unset: unlimited.
    #[serde(default)]
    pub replay_rate: Option<Size>,
}

impl KindSpec for HttpSinkSpec {
    type Config = HttpConfig;

    fn compile(mut self, cx: &mut Compile<'_, '_>) -> Option<HttpConfig> {
        cx.retry = std::mem::take(&mut self.retry);
        cx.link = compile_link(&self.link, &self.url, cx.err);
        compile_http(self, cx)
    }
}

/// Headers colibri sets itself; a configured one would be overwritten or would break the framing.
const RESERVED_HEADERS: &[&str] = &[
    "content-type",
    "content-encoding",
    "content-length",
    "transfer-encoding",
    "host",
    "idempotency-key",
    crate::sink::REPLAYED,
    "user-agent",
];

/// The transport of an `http` entry (and of a `prometheus_remote_write` one), with `timeout`,
/// `concurrency` and `replay_rate` set in `cx`; its `retry` and `link` are the caller's.
pub(super) fn compile_http(spec: HttpSinkSpec, cx: &mut Compile<'_, '_>) -> Option<HttpConfig> {
    let mut url = match parse_http_url(&spec.url) {
        Ok(u) => u,
        Err(m) => {
            cx.err.add("url", m);
            return None;
        }
    };
    let precision = precision(&spec, &mut url, cx.err);
    let headers_ok = headers_ok(&spec.headers, cx.err);
    cx.limits(spec.timeout, spec.concurrency, spec.replay_rate);
    let http = HttpConfig {
        url,
        method: spec.method.unwrap_or(HttpMethod::Post),
        encoding: spec.encoding.unwrap_or(Encoding::Ndjson),
        precision,
        compression: spec.compression.unwrap_or(Compression::None),
        headers: spec.headers.into_iter().collect(),
        tls: crate::shape::tls::files(spec.tls, cx.base),
    };
    // Building the client reads and parses the TLS files: a bad CA is reported now, not at the
    // first delivery.
    if headers_ok && let Err(e) = HttpSink::new(&http, &cx.link.probe, cx.timeout, cx.concurrency) {
        cx.err.add(&e.field, e.message);
    }
    Some(http)
}

/// `precision` (only with `encoding: influx_line`, default `ns`), added to `url` as the
/// `precision=` every request carries.
fn precision(
    spec: &HttpSinkSpec,
    url: &mut reqwest::Url,
    err: &mut Problems<'_>,
) -> Option<Precision> {
    let influx = matches!(spec.encoding, Some(Encoding::InfluxLine));
    let precision = match (influx, spec.precision) {
        (false, Some(_)) => {
            err.add("precision", "only applies to encoding: influx_line".into());
            None
        }
        (false, None) => None,
        (true, p) => Some(p.unwrap_or_default()),
    };
    if let Some(p) = precision {
        if url.query_pairs().any(|(k, _)| k == "precision") {
            err.add(
                "url",
                "names a precision: set the precision setting instead (it is added to every request)"
                    .into(),
            );
        }
        // InfluxDB 1.x (and VictoriaMetrics' /write) call microseconds `u`; 2.x calls them `us`.
        let v2 = url.path().trim_end_matches('/').ends_with("/api/v2/write");
        let value = match p {
            Precision::Us if !v2 => "u",
            p => p.name(),
        };
        url.query_pairs_mut().append_pair("precision", value);
    }
    precision
}

/// Whether every configured header can be sent: each problem reported under `headers.<name>`.
fn headers_ok(headers: &BTreeMap<String, String>, err: &mut Problems<'_>) -> bool {
    let mut headers_ok = true;
    let mut seen = HashSet::new();
    for (k, v) in headers {
        let lower = k.to_ascii_lowercase();
        let problem = if !seen.insert(lower.clone()) {
            Some("is set twice (header names are case-insensitive)")
        } else if RESERVED_HEADERS.contains(&lower.as_str()) {
            Some("is set by colibri itself and cannot be configured")
        } else if reqwest::header::HeaderName::from_bytes(k.as_bytes()).is_err() {
            Some("is not a valid header name")
        } else if reqwest::header::HeaderValue::from_str(v).is_err() {
            // The value itself is never echoed: it may be a credential.
            Some("the value has characters a header cannot carry (control characters or non-ASCII)")
        } else {
            None
        };
        if let Some(m) = problem {
            headers_ok = false;
            err.add(&format!("headers.{k}"), m.into());
        }
    }
    headers_ok
}
