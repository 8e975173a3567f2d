//! The `sinks:` section: the file shape of each sink kind (file, stdout, http and its link, TLS,
//! retry and probe settings) and `compile_sink`, which checks an entry and builds the
//! `sink::SinkConfig` the delivery layer runs. It does not deliver anything (`sink` and `delivery`
//! do) and does not know which streams use a sink (`streams`). Called by `config::compile`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

#[cfg(feature = "schema")]
use super::units::u32_schema;
use super::units::{self, Dur, Size};
use super::{Problems, de_all, named, split_type};
use crate::shape::tls::TlsSpec;
use crate::shape::url::http as parse_http_url;
use crate::sink::{LinkConfig, Probe, SinkConfig, SinkKind, SinkRetry};

#[cfg(any(feature = "mqtt", feature = "nats"))]
pub(super) mod broker;
#[cfg(feature = "mqtt")]
mod mqtt;
#[cfg(feature = "mqtt")]
pub use mqtt::{MqttSinkSpec, MqttStatusSpec};
#[cfg(feature = "nats")]
mod nats;
#[cfg(feature = "nats")]
pub use nats::{NatsSinkSpec, NatsUrls};

/// A destination for a stream's jobs.
// Read by `compile_sink` through the variant's own struct (`split_type`), so a problem inside an
// entry keeps its field path; the enum is the file's shape for the schema.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SinkSpec {
    /// Each job becomes one file in `path` (`<stream>-<store id>-<job id>.ndjson`, `.lp` or `.txt`, named by what its lines are: all JSON, all line protocol, or anything else; a record per line), written
    /// under a temporary name, fsync'd and renamed into place, so a reader never sees half a file and
    /// a job delivered twice after a crash overwrites itself. The directory must exist: colibri does
    /// not create it, so an unmounted disk is noticed instead of filled on the root filesystem.
    File(FileSinkSpec),
    /// Each job's records are written to colibri's stdout, a record per line.
    Stdout(StdoutSinkSpec),
    /// Each job is one HTTP request (a job refused with 413 is sent in halves). Every request carries
    /// an `Idempotency-Key` (store, stream, job and, for a part, its record range) and a
    /// `User-Agent: colibri/<version>`.
    Http(Box<HttpSinkSpec>),
    /// Prometheus remote write 1.0 (a snappy protobuf `WriteRequest` per job) to Prometheus
    /// (`--web.enable-remote-write-receiver`), VictoriaMetrics (`/api/v1/write`), Mimir, Thanos
    /// and the like. The stream's records are line-protocol samples timestamped in ms: an
    /// `http_scrape` task's. Each numeric field is a sample of the series it names, labelled by
    /// the record's tags, `job` (the measurement) and `external_labels`. Built only with the
    /// `remote-write` feature (release builds have it).
    #[cfg(feature = "remote-write")]
    PrometheusRemoteWrite(Box<RemoteWriteSinkSpec>),
    /// Each record (or, with `batch`, each job) published to an MQTT 5 broker at QoS 1 or 2;
    /// delivered once every message is acknowledged. Every message carries the user property
    /// `idempotency-key`. Built only with the `mqtt` feature (release builds have it).
    #[cfg(feature = "mqtt")]
    Mqtt(Box<MqttSinkSpec>),
    /// Each record (or, with `batch`, each job) published to NATS JetStream with a `Nats-Msg-Id`
    /// JetStream deduplicates by; delivered once every PubAck is in. Built only with the `nats`
    /// feature (release builds have it).
    #[cfg(feature = "nats")]
    Nats(Box<NatsSinkSpec>),
}

const SINK_TYPES: &[&str] = &[
    "file",
    "stdout",
    "http",
    "prometheus_remote_write",
    "mqtt",
    "nats",
];

/// What a build without the sink says of `type: nats`.
#[cfg(not(feature = "nats"))]
const NO_NATS: &str = "this colibri was built without the nats sink (cargo feature nats)";

/// What a build without the sink says of `type: mqtt`.
#[cfg(not(feature = "mqtt"))]
const NO_MQTT: &str = "this colibri was built without the mqtt sink (cargo feature mqtt)";

/// What a build without the sink says of `type: prometheus_remote_write`.
#[cfg(not(feature = "remote-write"))]
const NO_REMOTE_WRITE: &str =
    "this colibri was built without the prometheus_remote_write sink (cargo feature remote-write)";

/// `type: prometheus_remote_write` settings (left out of a build without the sink, which refuses
/// the type by name).
// The transport's fields repeat `HttpSinkSpec`'s: serde's `flatten` would share them but turns
// `deny_unknown_fields` off, and a misspelt key must stay an error naming it.
#[cfg(feature = "remote-write")]
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RemoteWriteSinkSpec {
    /// The receiver's write URL (`http://` or `https://`), e.g.
    /// `http://prometheus:9090/api/v1/write` or `http://victoria:8428/api/v1/write`.
    pub url: String,
    /// Labels added to every series that has no label of that name (e.g. `gateway: gw-17`).
    /// Names are Prometheus label names (`[a-zA-Z_][a-zA-Z0-9_]*`).
    #[serde(default)]
    pub external_labels: BTreeMap<String, String>,
    /// Extra request headers, e.g. `Authorization: "Bearer ${TOKEN}"`. Values are never logged.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Longest wait for a whole request and its answer. Default 10s.
    #[serde(default)]
    pub timeout: Option<Dur>,
    /// Requests in flight at once, 1-64. Default 1, which keeps samples in order (a receiver
    /// without an out-of-order window needs that).
    #[serde(default, deserialize_with = "units::de_opt_u32")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "u32_schema"))]
    pub concurrency: Option<u32>,
    #[serde(default)]
    pub tls: TlsSpec,
    #[serde(default)]
    pub retry: RetrySpec,
    #[serde(default)]
    pub link: LinkSpec,
    /// Bytes per second (compressed) while a backlog is replayed. Unset: unlimited.
    #[serde(default)]
    pub replay_rate: Option<Size>,
}

/// `type: file` settings.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct FileSinkSpec {
    /// The directory. Relative paths are read from the config file's directory.
    pub path: String,
    #[serde(default)]
    pub retry: RetrySpec,
}

/// `type: stdout` settings.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct StdoutSinkSpec {
    #[serde(default)]
    pub retry: RetrySpec,
}

/// `type: http` settings.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct HttpSinkSpec {
    /// Where requests go: an `http://` or `https://` URL.
    pub url: String,
    /// `post` (default) or `put`.
    #[serde(default)]
    pub method: Option<HttpMethodSpec>,
    /// How records become a body; they are passed through as stored. Default `ndjson`.
    #[serde(default)]
    pub encoding: Option<EncodingSpec>,
    /// With `encoding: influx_line`: the unit of the records' timestamps, sent as the request's
    /// `precision` parameter (`u` for microseconds on `/write`, as InfluxDB 1.x and VictoriaMetrics
    /// expect; `us` on `/api/v2/write`). `http_scrape` tasks writing to a stream of this sink
    /// timestamp their records in it. Default `ns`.
    #[serde(default)]
    pub precision: Option<PrecisionSpec>,
    /// Body compression (`Content-Encoding`). Default `none`.
    #[serde(default)]
    pub compression: Option<CompressionSpec>,
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

#[derive(Debug, Clone, Copy, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum HttpMethodSpec {
    Post,
    Put,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum EncodingSpec {
    /// A record per line, `application/x-ndjson`: the stream's records are JSON values.
    Ndjson,
    /// One JSON array of the records, `application/json`: the stream's records are JSON values.
    JsonArray,
    /// A record per line, `text/plain` (InfluxDB / VictoriaMetrics `/write`): the stream's records
    /// are line-protocol points (ingest takes `text/plain` for it, `queue push` checks each line;
    /// tail sources and `format: raw` scrapes cannot feed it).
    InfluxLine,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum PrecisionSpec {
    Ns,
    Us,
    Ms,
    S,
}

impl PrecisionSpec {
    fn compile(self) -> crate::scrape::lineproto::Precision {
        use crate::scrape::lineproto::Precision;
        match self {
            PrecisionSpec::Ns => Precision::Ns,
            PrecisionSpec::Us => Precision::Us,
            PrecisionSpec::Ms => Precision::Ms,
            PrecisionSpec::S => Precision::S,
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum CompressionSpec {
    None,
    Gzip,
    Zstd,
}

/// When the destination counts as unreachable and how it is probed until it answers.
#[derive(Debug, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
// The schema keeps the name the type had when `LinkSpec` was a runtime type: the committed schema
// (and editors' references into it) stay as they are.
#[cfg_attr(feature = "schema", schemars(rename = "LinkSpecFile"))]
pub struct LinkSpec {
    /// `tcp` (default: connect to the URL's host and port) or `http` (a GET of `probe_url`, or of
    /// `url`, that gets any answer).
    #[serde(default)]
    pub probe: Option<ProbeSpec>,
    /// The URL an `http` probe GETs. Default: the sink's `url`.
    #[serde(default)]
    pub probe_url: Option<String>,
    /// Consecutive requests without an answer that turn the link down. Default 3.
    #[serde(default, deserialize_with = "units::de_opt_u32")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "u32_schema"))]
    pub down_after: Option<u32>,
    /// First probe delay; then doubling with jitter. Default 1s.
    #[serde(default)]
    pub backoff_base: Option<Dur>,
    /// Longest probe delay. Default: 2s with `probe: tcp` (a connect is cheap, so it runs every 2s
    /// however long the outage, and the link's return is noticed within about 2s, plus the
    /// connect's SYN retries, within the sink's `timeout`, on a path that drops packets), 60s with
    /// `probe: http` (a GET costs the receiver a request); never below a `backoff_base` that is
    /// set. A probe that passes while requests still get no answer (TLS, credentials) makes the
    /// next tries back off to 60s, or to this when it is set.
    #[serde(default)]
    pub backoff_cap: Option<Dur>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ProbeSpec {
    Tcp,
    Http,
}

/// How failed deliveries are retried.
#[derive(Debug, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RetrySpec {
    /// First retry delay; attempt n waits `base * 2^n * (0.5 + random)`, at most `cap`. Default 1s.
    #[serde(default)]
    pub base: Option<Dur>,
    /// Longest retry delay. Default 5m.
    #[serde(default)]
    pub cap: Option<Dur>,
    /// Attempts before a job goes to the dead letters. Default 8.
    #[serde(default, deserialize_with = "units::de_opt_u32")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "u32_schema"))]
    pub max_attempts: Option<u32>,
}

pub(super) fn compile_sink(
    name: String,
    value: Value,
    base: &Path,
    #[cfg_attr(
        not(feature = "mqtt"),
        expect(unused_variables, reason = "only mqtt client ids are made from it")
    )]
    data_dir: &Path,
    problems: &mut Problems<'_>,
) -> Option<SinkConfig> {
    let (value, mut err) = named("sinks", "sink", &name, value, problems);
    let (kind, rest) = split_type(value, SINK_TYPES, &mut err)?;
    let spec = match kind.as_str() {
        "file" => de_all(rest, &mut err).map(SinkSpec::File),
        "stdout" => de_all(rest, &mut err).map(SinkSpec::Stdout),
        #[cfg(feature = "remote-write")]
        "prometheus_remote_write" => {
            de_all(rest, &mut err).map(|r| SinkSpec::PrometheusRemoteWrite(Box::new(r)))
        }
        #[cfg(not(feature = "remote-write"))]
        "prometheus_remote_write" => {
            err.add("type", NO_REMOTE_WRITE.into());
            return None;
        }
        #[cfg(feature = "mqtt")]
        "mqtt" => de_all(rest, &mut err).map(|m| SinkSpec::Mqtt(Box::new(m))),
        #[cfg(not(feature = "mqtt"))]
        "mqtt" => {
            err.add("type", NO_MQTT.into());
            return None;
        }
        #[cfg(feature = "nats")]
        "nats" => de_all(rest, &mut err).map(|n| SinkSpec::Nats(Box::new(n))),
        #[cfg(not(feature = "nats"))]
        "nats" => {
            err.add("type", NO_NATS.into());
            return None;
        }
        _ => de_all(rest, &mut err).map(|h| SinkSpec::Http(Box::new(h))),
    }?;
    let mut link = LinkConfig::default();
    let (kind, retry) = match spec {
        SinkSpec::File(FileSinkSpec { path, retry }) => {
            let dir = base.join(&path);
            if dir.exists() && !dir.is_dir() {
                err.add(
                    "path",
                    format!("{} exists and is not a directory", dir.display()),
                );
            }
            // A missing directory is definite: no point in waiting for more failures.
            link.down_after = 1;
            (SinkKind::File { dir }, retry)
        }
        SinkSpec::Stdout(StdoutSinkSpec { retry }) => (SinkKind::Stdout, retry),
        SinkSpec::Http(spec) => {
            let spec = *spec;
            let retry = spec.retry;
            link = compile_link(&spec.link, &spec.url, &mut err);
            let http = compile_http(
                HttpSinkSpec {
                    retry: RetrySpec::default(),
                    ..spec
                },
                &link.probe,
                base,
                &mut err,
            )?;
            (SinkKind::Http(Box::new(http)), retry)
        }
        #[cfg(feature = "remote-write")]
        SinkSpec::PrometheusRemoteWrite(spec) => {
            let spec = *spec;
            link = compile_link(&spec.link, &spec.url, &mut err);
            let kind = compile_remote_write(
                RemoteWriteSinkSpec {
                    retry: RetrySpec::default(),
                    ..spec
                },
                &link.probe,
                base,
                &mut err,
            )?;
            (kind, spec.retry)
        }
        #[cfg(feature = "mqtt")]
        SinkSpec::Mqtt(spec) => {
            let mut spec = *spec;
            link = broker_link(std::mem::take(&mut spec.link), "an mqtt", &mut err);
            let retry = std::mem::take(&mut spec.retry);
            (
                mqtt::compile_mqtt(&name, spec, base, data_dir, &mut err)?,
                retry,
            )
        }
        #[cfg(feature = "nats")]
        SinkSpec::Nats(spec) => {
            let mut spec = *spec;
            link = broker_link(std::mem::take(&mut spec.link), "a nats", &mut err);
            let retry = std::mem::take(&mut spec.retry);
            (nats::compile_nats(&name, spec, base, &mut err)?, retry)
        }
    };
    let retry = SinkRetry {
        base: retry.base.map_or(Duration::from_secs(1), |d| d.0),
        cap: retry.cap.map_or(Duration::from_secs(300), |d| d.0),
        max_attempts: retry.max_attempts.unwrap_or(8),
    };
    if retry.base.is_zero() {
        err.add("retry.base", "must be positive".into());
    }
    if retry.cap < retry.base {
        err.add("retry.cap", "must not be shorter than retry.base".into());
    }
    if retry.max_attempts == 0 {
        err.add("retry.max_attempts", "must be at least 1".into());
    }
    Some(SinkConfig {
        name,
        kind,
        retry,
        link,
    })
}

/// Headers colibri sets itself; a configured one would be overwritten or would break the framing.
const RESERVED_HEADERS: &[&str] = &[
    "content-type",
    "content-encoding",
    "content-length",
    "transfer-encoding",
    "host",
    "idempotency-key",
    "user-agent",
];

fn compile_http(
    spec: HttpSinkSpec,
    probe: &Probe,
    base: &Path,
    err: &mut Problems<'_>,
) -> Option<crate::sink::http::HttpConfig> {
    let mut url = match parse_http_url(&spec.url) {
        Ok(u) => u,
        Err(m) => {
            err.add("url", m);
            return None;
        }
    };
    let influx = matches!(spec.encoding, Some(EncodingSpec::InfluxLine));
    let precision = match (influx, spec.precision) {
        (false, Some(_)) => {
            err.add("precision", "only applies to encoding: influx_line".into());
            None
        }
        (false, None) => None,
        (true, p) => Some(p.unwrap_or(PrecisionSpec::Ns).compile()),
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
            crate::scrape::lineproto::Precision::Us if !v2 => "u",
            p => p.name(),
        };
        url.query_pairs_mut().append_pair("precision", value);
    }
    let mut headers_ok = true;
    let mut seen = std::collections::HashSet::new();
    for (k, v) in &spec.headers {
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
    let timeout = spec.timeout.map_or(Duration::from_secs(10), |d| d.0);
    if timeout.is_zero() {
        err.add("timeout", "must be positive".into());
    }
    let concurrency = spec.concurrency.unwrap_or(1);
    if !(1..=64).contains(&concurrency) {
        err.add(
            "concurrency",
            format!("must be between 1 and 64, not {concurrency}"),
        );
    }
    if spec.replay_rate.is_some_and(|r| r.0 == 0) {
        err.add(
            "replay_rate",
            "must be positive (leave it out for unlimited)".into(),
        );
    }
    let http = crate::sink::http::HttpConfig {
        url,
        method: match spec.method {
            None | Some(HttpMethodSpec::Post) => crate::sink::http::HttpMethod::Post,
            Some(HttpMethodSpec::Put) => crate::sink::http::HttpMethod::Put,
        },
        encoding: match spec.encoding {
            None | Some(EncodingSpec::Ndjson) => crate::sink::http::Encoding::Ndjson,
            Some(EncodingSpec::JsonArray) => crate::sink::http::Encoding::JsonArray,
            Some(EncodingSpec::InfluxLine) => crate::sink::http::Encoding::InfluxLine,
        },
        precision,
        compression: match spec.compression {
            None | Some(CompressionSpec::None) => crate::sink::http::Compression::None,
            Some(CompressionSpec::Gzip) => crate::sink::http::Compression::Gzip,
            Some(CompressionSpec::Zstd) => crate::sink::http::Compression::Zstd,
        },
        headers: spec.headers.into_iter().collect(),
        timeout,
        concurrency,
        tls: crate::shape::tls::files(spec.tls, base),
        replay_rate: spec.replay_rate.map(|r| r.0),
    };
    // Building the client reads and parses the TLS files: a bad CA is reported now, not at the
    // first delivery.
    if headers_ok && let Err(e) = crate::sink::http::HttpSink::new(&http, probe) {
        err.add(&e.field, e.message);
    }
    Some(http)
}

/// A `prometheus_remote_write` entry: its HTTP transport compiled as an `http` sink's, and its
/// external labels checked.
#[cfg(feature = "remote-write")]
fn compile_remote_write(
    spec: RemoteWriteSinkSpec,
    probe: &Probe,
    base: &Path,
    err: &mut Problems<'_>,
) -> Option<SinkKind> {
    use crate::sink::http::remote_write::{RemoteWriteConfig, valid_label_name};
    for (name, value) in &spec.external_labels {
        let problem = if !valid_label_name(name) {
            Some("is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)")
        } else if name.starts_with("__") {
            Some("names starting with __ are Prometheus' own")
        } else if value.is_empty() {
            Some("an empty value is no label at all in Prometheus")
        } else {
            None
        };
        if let Some(m) = problem {
            err.add(&format!("external_labels.{name}"), m.into());
        }
    }
    let http = HttpSinkSpec {
        url: spec.url,
        method: None,
        encoding: None,
        precision: None,
        compression: None,
        headers: spec.headers,
        timeout: spec.timeout,
        concurrency: spec.concurrency,
        tls: spec.tls,
        retry: spec.retry,
        link: LinkSpec::default(),
        replay_rate: spec.replay_rate,
    };
    let http = compile_http(http, probe, base, err)?;
    Some(SinkKind::RemoteWrite(Box::new(RemoteWriteConfig {
        http,
        external_labels: spec.external_labels.into_iter().collect(),
    })))
}

/// A broker sink's link: probed by connecting (only the broker's answer proves it takes messages),
/// so `probe` and `probe_url` are refused; the rest as for any sink.
#[cfg(any(feature = "mqtt", feature = "nats"))]
fn broker_link(spec: LinkSpec, what: &str, err: &mut Problems<'_>) -> LinkConfig {
    if spec.probe.is_some() || spec.probe_url.is_some() {
        err.add(
            "link.probe",
            format!("does not apply: {what} sink is probed by connecting to the broker"),
        );
    }
    let spec = LinkSpec {
        probe: None,
        probe_url: None,
        ..spec
    };
    compile_link(&spec, "", err)
}

pub(super) fn compile_link(spec: &LinkSpec, url: &str, err: &mut Problems<'_>) -> LinkConfig {
    let probe = match (spec.probe, &spec.probe_url) {
        (None | Some(ProbeSpec::Tcp), None) => Probe::Tcp,
        (None | Some(ProbeSpec::Tcp), Some(_)) => {
            err.add("link.probe_url", "is only used with probe: http".into());
            Probe::Tcp
        }
        (Some(ProbeSpec::Http), u) => {
            match parse_http_url(u.as_deref().unwrap_or(url)) {
                Ok(u) => Probe::Http(u),
                // A bad sink URL is reported under `url` already.
                Err(m) => {
                    if u.is_some() {
                        err.add("link.probe_url", m);
                    }
                    Probe::Tcp
                }
            }
        }
    };
    let d = LinkConfig::for_probe(probe);
    let backoff_base = spec.backoff_base.map_or(d.backoff_base, |x| x.0);
    // A cap that is set is honoured for probes and trials alike (and refused below a base); an
    // unset one is the probe kind's, never below a base that is set, so a file that sets only a
    // long `backoff_base` stays valid whatever the kind's default cap.
    let (backoff_cap, trial_cap) = match spec.backoff_cap {
        Some(cap) => (cap.0, cap.0),
        None => (
            d.backoff_cap.max(backoff_base),
            d.trial_cap.max(backoff_base),
        ),
    };
    let link = LinkConfig {
        down_after: spec.down_after.unwrap_or(d.down_after),
        backoff_base,
        backoff_cap,
        trial_cap,
        ..d
    };
    if link.down_after == 0 {
        err.add("link.down_after", "must be at least 1".into());
    }
    if link.backoff_base.is_zero() {
        err.add("link.backoff_base", "must be positive".into());
    }
    if link.backoff_cap < link.backoff_base {
        err.add(
            "link.backoff_cap",
            "must not be shorter than link.backoff_base".into(),
        );
    }
    link
}
