//! The config file: its YAML shape (serde structs that mirror it and reject unknown fields, and the
//! JSON Schema generated from them), `${VAR}` expansion, and `compile`, which validates everything and
//! turns the file into the runtime types the rest of colibri uses (`Config`, `task::TaskDef`, parsed
//! schedules, `Duration`s, resolved paths). This is the only module that knows the file's shape;
//! nothing downstream sees a serde struct. Called by the CLI (`run`, `check`, `queue`, `schema`) and
//! by the agent's reload.
//!
//! Validation collects every problem before refusing, each with its path in the file, e.g.
//! `tasks[3] "rotate": schedule "61 * * * *": minute 61 out of range 0-59`. A value that came from
//! `${VAR}` is never shown in a problem (it may be a secret): the message names the variable.

pub mod admin;
pub mod env;
pub mod ingest;
pub mod sources;
pub mod units;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "schema")]
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::logging::{LogFile, LogFormat, LogLevel};
use crate::schedule::{self, Offset, Schedule, Zone};
use crate::sink::{LinkConfig, Probe, RecordFormat, SinkConfig, SinkKind, SinkRetry};
use crate::store::{BatchConfig, StorageConfig, StreamConfig, WhenFull};
use crate::task::file_move::{FileMove, OnConflict};
use crate::task::{Action, RetryPolicy, TaskDef, exec::Exec};
use admin::AdminConfig;
#[cfg(feature = "schema")]
use units::u32_schema;
use units::{Dur, Size, de_u32};

// ---------------------------------------------------------------------------------------------------
// The file's shape. Field docs become the schema's descriptions, which editors show on hover.

/// colibri's configuration file.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "schema", schemars(title = "colibri configuration"))]
pub struct FileSpec {
    /// Directory for colibri's queues and state. Relative paths are read from the config file's directory.
    #[serde(default = "default_data_dir")]
    pub data_dir: String,
    /// How many task runs may execute at once; runs that find every worker busy wait for one.
    #[serde(default = "default_workers", deserialize_with = "de_u32")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "u32_schema"))]
    pub workers: u32,
    /// On SIGTERM, how long running tasks may take to finish before they are killed. Every task's
    /// timeout must be shorter.
    #[serde(default = "default_grace")]
    pub shutdown_grace: Dur,
    /// Logging: to stderr, or to a file colibri rotates by size.
    #[serde(default)]
    pub log: LogSpec,
    /// The data directory's disk budget, shared by every stream.
    #[serde(default)]
    pub storage: StorageSpec,
    /// Where streams are delivered, by name.
    #[serde(default)]
    pub sinks: BTreeMap<String, SinkSpec>,
    /// Durable queues of transfer jobs, by name. What a stream accepts is on disk (fsync'd) before
    /// anyone is told "stored".
    #[serde(default)]
    pub streams: BTreeMap<String, StreamSpec>,
    /// Scheduled chores.
    #[serde(default)]
    pub tasks: Vec<TaskSpec>,
    /// The local ingest API (off unless `listen` is set).
    #[serde(default)]
    pub ingest: Option<ingest::IngestSpec>,
    /// The admin endpoint: `GET /metrics` (Prometheus text), `/healthz`, `/readyz`, `POST /-/reload`.
    /// On by default, on 127.0.0.1:9464.
    #[serde(default)]
    pub admin: Option<admin::AdminSpec>,
    /// Producers of records that run on their own (log tailing), by name.
    #[serde(default)]
    pub sources: BTreeMap<String, sources::SourceSpec>,
}

fn yes() -> bool {
    true
}

/// What each entry of the file said (after `${VAR}` expansion), to tell what a reload changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fingerprint {
    /// Top-level settings other than the four maps below (`data_dir`, `log`, `ingest`, ...).
    pub top: BTreeMap<String, String>,
    pub tasks: BTreeMap<String, String>,
    pub sinks: BTreeMap<String, String>,
    pub streams: BTreeMap<String, String>,
    pub sources: BTreeMap<String, String>,
}

/// A destination for a stream's jobs.
// Read by `compile_sink` through the variant's own struct (`split_type`), so a problem inside an
// entry keeps its field path; the enum is the file's shape for the schema.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SinkSpec {
    /// Each job becomes one file in `path` (`<stream>-<job id>.ndjson`, a record per line), written
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
}

const SINK_TYPES: &[&str] = &["file", "stdout", "http"];

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
    pub link: LinkSpecFile,
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

/// TLS for `https://` URLs (rustls; the system's roots unless `ca_file` is set).
#[derive(Debug, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct TlsSpec {
    /// PEM bundle of the CAs to trust instead of the system's. Relative to the config file.
    #[serde(default)]
    pub ca_file: Option<String>,
    /// PEM client certificate for mutual TLS (with `client_key`).
    #[serde(default)]
    pub client_cert: Option<String>,
    /// PEM private key of `client_cert`.
    #[serde(default)]
    pub client_key: Option<String>,
    /// The name the server certificate must carry (and the SNI sent), when the URL's host differs.
    #[serde(default)]
    pub server_name: Option<String>,
}

/// When the destination counts as unreachable and how it is probed until it answers.
#[derive(Debug, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct LinkSpecFile {
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
    /// Longest probe delay. Default 60s.
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

/// Global storage limits.
#[derive(Debug, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct StorageSpec {
    /// Most bytes of queued jobs (ready, retry and dead, all streams together). Default 2GiB.
    #[serde(default)]
    pub max_bytes: Option<Size>,
    /// Free space on the data directory's filesystem that colibri never eats into; below it every
    /// stream behaves as full. Default 256MiB.
    #[serde(default)]
    pub min_free: Option<Size>,
}

/// One stream: a bounded, durable FIFO of transfer jobs.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct StreamSpec {
    /// The sink the stream is delivered to (a name under `sinks:`). A stream without one only queues.
    #[serde(default)]
    pub sink: Option<String>,
    /// How records are cut into transfer jobs.
    #[serde(default)]
    pub batch: BatchSpec,
    /// Most jobs queued (ready and retry). Default 100000.
    #[serde(default, deserialize_with = "units::de_opt_u32")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "u32_schema"))]
    pub max_jobs: Option<u32>,
    /// Most bytes queued (ready and retry). Default 256MiB.
    #[serde(default)]
    pub max_bytes: Option<Size>,
    /// What a full stream does: `block` (producers wait, then get an error), `drop_oldest` (the oldest
    /// ready jobs are deleted and counted), `drop_newest` (new records are refused and counted).
    #[serde(default)]
    pub when_full: WhenFullSpec,
    /// Jobs older than this are deleted and counted as expired. Default: kept until delivered.
    #[serde(default)]
    pub ttl: Option<Dur>,
    /// Dead letters: jobs that failed for good.
    #[serde(default)]
    pub dead_letter: DeadLetterSpec,
}

#[derive(Debug, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct BatchSpec {
    /// Most records in one job. Default 1000.
    #[serde(default, deserialize_with = "units::de_opt_u32")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "u32_schema"))]
    pub max_records: Option<u32>,
    /// Most bytes of records in one job. Default 1MiB.
    #[serde(default)]
    pub max_bytes: Option<Size>,
    /// How long a source may hold records back to fill a job. Default 1s.
    #[serde(default)]
    pub linger: Option<Dur>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum WhenFullSpec {
    #[default]
    Block,
    DropOldest,
    DropNewest,
}

#[derive(Debug, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct DeadLetterSpec {
    /// Most dead jobs kept; beyond it the oldest is deleted and counted. Default 10000.
    #[serde(default, deserialize_with = "units::de_opt_u32")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "u32_schema"))]
    pub max_jobs: Option<u32>,
}

fn default_data_dir() -> String {
    "/var/lib/colibri".into()
}
fn default_workers() -> u32 {
    8
}
fn default_grace() -> Dur {
    Dur(Duration::from_secs(15))
}

/// Logging settings.
#[derive(Debug, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct LogSpec {
    /// The least severe level written.
    #[serde(default)]
    pub level: LogLevel,
    /// `text` for people at a terminal, `json` (one object per line) for machines.
    #[serde(default)]
    pub format: LogFormat,
    /// Write events to this file instead of stderr, for machines without journald. The directory
    /// must exist: colibri does not create it. The file is created with mode 0640 and appended to.
    /// Relative paths are read from the config file's directory.
    #[serde(default)]
    pub file: Option<String>,
    /// With `file`: rotate when the next event would take the file past this size (at least
    /// 64KiB). Default 50MiB.
    #[serde(default)]
    pub max_size: Option<Size>,
    /// With `file`: rotated files kept, `<file>.1` the newest to `<file>.<max_files>` the oldest;
    /// older ones are deleted. Default 10.
    #[serde(default, deserialize_with = "units::de_opt_u32")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "u32_schema"))]
    pub max_files: Option<u32>,
}

const DEFAULT_LOG_MAX_SIZE: u64 = 50 << 20;
const MIN_LOG_MAX_SIZE: u64 = 64 << 10;
const DEFAULT_LOG_MAX_FILES: u32 = 10;

/// One scheduled task: the fields every task has, plus those of its `type`.
// `compile_task` reads the two halves separately so each can reject unknown keys, which `flatten`
// cannot; this struct exists for the schema.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TaskSpec {
    #[serde(flatten)]
    pub common: TaskCommon,
    #[serde(flatten)]
    pub kind: TaskKind,
}

/// Fields shared by every task type. Keep [`COMMON_KEYS`] in step (a test checks).
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct TaskCommon {
    /// Unique name: letters, digits, `-`, `_` and `.`. It appears in every log line of the task.
    pub name: String,
    /// A crontab expression: 5 fields (minute hour day-of-month month day-of-week), or 6 with seconds
    /// first; names like MON-FRI; or a macro: @reboot (once at start), @hourly, @daily, @midnight,
    /// @weekly, @monthly, @yearly, @annually. Exclusive with `every`.
    #[serde(default)]
    pub schedule: Option<String>,
    /// A fixed interval such as 30s, measured on the monotonic clock. Exclusive with `schedule`.
    #[serde(default)]
    pub every: Option<Dur>,
    /// With `every`: when the first run falls after start. A duration, or `random` for a uniform offset
    /// within one period, so many tasks with one interval do not fire together. Default 0s.
    #[serde(default)]
    pub offset: Option<OffsetSpec>,
    /// With `schedule`: the IANA time zone the expression is read in, e.g. Europe/Berlin. Default: the
    /// machine's local zone.
    #[serde(default)]
    pub tz: Option<String>,
    /// How long one attempt may run before its process group is terminated. Default 10s; must be
    /// shorter than `shutdown_grace`.
    #[serde(default)]
    pub timeout: Option<Dur>,
    /// Extra attempts after a failure (non-zero exit, timeout). Default 0.
    #[serde(default, deserialize_with = "units::de_opt_u32")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "u32_schema"))]
    pub max_retry: Option<u32>,
    /// First retry delay; attempt n waits `retry_base * 2^n * (0.5 + random)`, at most `retry_cap`.
    /// Default 1s.
    #[serde(default)]
    pub retry_base: Option<Dur>,
    /// Longest retry delay. Default 5m.
    #[serde(default)]
    pub retry_cap: Option<Dur>,
}

/// The keys of [`TaskCommon`]; everything else in a task belongs to its type.
pub const COMMON_KEYS: [&str; 9] = [
    "name",
    "schedule",
    "every",
    "offset",
    "tz",
    "timeout",
    "max_retry",
    "retry_base",
    "retry_cap",
];

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_RETRY_BASE: Duration = Duration::from_secs(1);
const DEFAULT_RETRY_CAP: Duration = Duration::from_secs(300);

/// `offset:` is a duration or the word `random`.
#[derive(Debug, Clone, Copy)]
pub struct OffsetSpec(pub Offset);

impl<'de> Deserialize<'de> for OffsetSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        match &v {
            Value::String(s) if s.trim() == "random" => Ok(OffsetSpec(Offset::Random)),
            Value::String(s) => crate::units::parse_duration(s)
                .map(|d| OffsetSpec(Offset::Fixed(d)))
                .map_err(|e| serde::de::Error::custom(format!("{e}, or write random"))),
            other => Err(serde::de::Error::custom(format!(
                "expected a duration such as 10s or the word random, found {other}"
            ))),
        }
    }
}

#[cfg(feature = "schema")]
impl JsonSchema for OffsetSpec {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Offset".into()
    }
    fn json_schema(g: &mut SchemaGenerator) -> Schema {
        let dur = g.subschema_for::<Dur>();
        json_schema!({ "anyOf": [ { "const": "random" }, dur ] })
    }
}

/// The task types. A closed set: each variant is a handler in `task::`.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TaskKind {
    /// Run a program. No shell is involved unless the command names one (`["sh", "-c", "..."]`).
    Exec(ExecSpec),
    /// Move settled files from one directory to another: rename(2) on one filesystem; across
    /// filesystems copy, fsync, rename into place, then remove the source. Or, with `to_stream`,
    /// ship them upstream.
    FileMove(FileMoveSpec),
    /// GET a (local) endpoint and turn the answer into records of a stream, each carrying the
    /// scrape's time: Prometheus text (a line-protocol record per sample, labels as tags), JSON
    /// (line-protocol records through a mapping), or the raw body.
    HttpScrape(Box<HttpScrapeSpec>),
}

const TASK_TYPES: &str = "exec, file_move, http_scrape";

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
    pub time_unit: Option<TimeUnitSpec>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum TimeUnitSpec {
    S,
    Ms,
    Ns,
    Rfc3339,
}

const DEFAULT_SCRAPE_MAX_BODY: u64 = 16 << 20;

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ExecSpec {
    /// The program and its arguments. A program named by an absolute path must exist and be
    /// executable; a relative path with a `/` is read from the config file's directory; a bare name is
    /// looked up in PATH when the task runs. colibri expands `${VAR}` here before any shell sees the
    /// text: write `$${VAR}` for a shell variable in braces and `$$$$` for the shell's `$$`.
    pub command: Vec<Scalar>,
    /// Extra environment variables for the program (colibri's own environment is inherited).
    #[serde(default)]
    pub env: BTreeMap<String, Scalar>,
    /// Working directory. Default: colibri's own. Relative paths are read from the config file's
    /// directory.
    #[serde(default)]
    pub cwd: Option<String>,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct FileMoveSpec {
    /// The directory files are taken from (not recursive). Must exist when the config is loaded.
    /// Relative paths are read from the config file's directory.
    pub from: String,
    /// Globs on the file name (`*.csv`, `scan-??.pdf`); a file matching any of them is taken. A name
    /// starting with `.` only matches a pattern that starts with `.`, so writers' hidden temporary
    /// files are left alone.
    pub pattern: Vec<String>,
    /// Globs on the file name that are never taken, even when `pattern` matches.
    #[serde(default)]
    pub exclude: Vec<String>,
    /// The directory files are moved into. Must exist when the config is loaded and differ from
    /// `from`. Relative paths are read from the config file's directory. Either this or
    /// `to_stream`.
    #[serde(default)]
    pub to: Option<String>,
    /// Instead of `to`: ship each file upstream through this stream. The file is moved into the
    /// data directory's spool (`spool/<task>/`, counted in the stream's and the store's byte
    /// bounds) and queued as one job; its sink uploads it whole as the request body, streamed from
    /// disk, with its name in `Content-Disposition`. After delivery it is deleted, or moved to
    /// `archive`. A full stream leaves files in `from`.
    #[serde(default)]
    pub to_stream: Option<String>,
    /// With `to_stream`: delivered files are moved into this directory (a name already there gets
    /// a number) instead of being deleted. Must exist when the config is loaded.
    #[serde(default)]
    pub archive: Option<String>,
    /// Only files whose modification time is at least this old are moved, so a file still being
    /// written is never taken. Default 30s.
    #[serde(default)]
    pub settle: Option<Dur>,
    /// When the name already exists in `to` (not used with `to_stream`): `rename` (default) moves the file as `name.1.ext`,
    /// `name.2.ext`, ...; `overwrite` replaces the existing file; `skip` leaves the file in `from`.
    #[serde(default)]
    pub on_conflict: Option<OnConflictSpec>,
    /// At most this many files per run (oldest first); the rest wait for the next run. Default 1000.
    #[serde(default, deserialize_with = "units::de_opt_u32")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "u32_schema"))]
    pub max_files: Option<u32>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum OnConflictSpec {
    Rename,
    Overwrite,
    Skip,
}

const DEFAULT_SETTLE: Duration = Duration::from_secs(30);
const DEFAULT_MAX_FILES: u32 = 1000;

/// A string that may be written as a YAML number or boolean (`command: [sleep, 5]`).
#[derive(Debug, Clone)]
pub struct Scalar(pub String);

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::String(s) => Ok(Scalar(s)),
            Value::Number(n) => Ok(Scalar(n.to_string())),
            Value::Bool(b) => Ok(Scalar(b.to_string())),
            other => Err(serde::de::Error::custom(format!(
                "expected a string, number or boolean, found {other}"
            ))),
        }
    }
}

#[cfg(feature = "schema")]
impl JsonSchema for Scalar {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Scalar".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "type": ["string", "number", "boolean"] })
    }
}

/// The JSON Schema of the file, as committed in `schemas/colibri.schema.json`: generated from the
/// types above.
#[cfg(feature = "schema")]
pub fn json_schema() -> String {
    let schema = schemars::schema_for!(FileSpec);
    let mut text = serde_json::to_string_pretty(&schema).expect("a schema is plain JSON");
    text.push('\n');
    text
}

/// The JSON Schema of the file. A build without the `schema` feature (the release binary, to stay
/// within its size budget) carries the committed copy, which a test keeps identical to the generated
/// one.
#[cfg(not(feature = "schema"))]
pub fn json_schema() -> String {
    include_str!("../../schemas/colibri.schema.json").to_string()
}

// ---------------------------------------------------------------------------------------------------
// Runtime configuration: what the file means, checked.

#[derive(Debug)]
pub struct Config {
    /// The file it came from.
    pub source: PathBuf,
    pub data_dir: PathBuf,
    pub workers: usize,
    pub shutdown_grace: Duration,
    pub log_level: LogLevel,
    pub log_format: LogFormat,
    /// Where events go instead of stderr, and its rotation.
    pub log_file: Option<LogFile>,
    pub storage: StorageConfig,
    pub sinks: Vec<Arc<SinkConfig>>,
    pub streams: Vec<StreamConfig>,
    pub tasks: Vec<Arc<TaskDef>>,
    pub ingest: Option<crate::ingest::IngestConfig>,
    pub sources: Vec<Arc<crate::tail::TailConfig>>,
    /// `None`: switched off.
    pub admin: Option<AdminConfig>,
    /// Per entry, what the file said: a reload compares these.
    pub fingerprint: Fingerprint,
    /// SHA-256 of the file's bytes (hex).
    pub sha256: String,
    /// Unset variables the command went on without ([`Unset::Warn`]), one line each, for the
    /// command to print; empty under [`Unset::Refuse`].
    pub warnings: Vec<String>,
}

impl Config {
    /// What the records of `stream` must be: its sink's format ([`RecordFormat::Lines`] for a
    /// stream without a sink, or one not defined here).
    pub fn record_format(&self, stream: &str) -> RecordFormat {
        stream_format(&self.streams, &self.sinks, stream)
    }
}

fn stream_format(
    streams: &[StreamConfig],
    sinks: &[Arc<SinkConfig>],
    stream: &str,
) -> RecordFormat {
    streams
        .iter()
        .find(|s| s.name == stream)
        .and_then(|s| s.sink.as_deref())
        .and_then(|name| sinks.iter().find(|k| k.name == name))
        .map_or(RecordFormat::Lines, |k| k.record_format())
}

/// One problem in the file: where, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub path: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    // The reason is part of the message and not a `source`: a caller printing the chain
    // (`{:#}`) would show it twice.
    #[error("cannot read config file {}: {error}", path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{}: not valid UTF-8 at line {line}, column {column} (byte {byte:#04x}); save the file as UTF-8", path.display())]
    NotUtf8 {
        path: PathBuf,
        line: usize,
        column: usize,
        byte: u8,
    },
    #[error("{}: not valid YAML: {message}", path.display())]
    Syntax { path: PathBuf, message: String },
    #[error("{}: {} problem{}:\n{}", path.display(), problems.len(), if problems.len() == 1 { "" } else { "s" },
        problems.iter().map(|p| format!("  {p}")).collect::<Vec<_>>().join("\n"))]
    Invalid {
        path: PathBuf,
        problems: Vec<Problem>,
        /// Unset variables the command went on without (see [`Unset::Warn`]), as for
        /// [`Config::warnings`]: printed beside the problems, not part of them.
        warnings: Vec<String>,
    },
}

impl ConfigError {
    /// Each problem as one line without line breaks, for a log event that must stay on one line
    /// (the caller joins them and names the file: only `Invalid`'s problems leave it out).
    pub fn lines(&self) -> Vec<String> {
        match self {
            ConfigError::Invalid { problems, .. } => problems
                .iter()
                .map(|p| p.to_string().replace('\n', " "))
                .collect(),
            other => vec![other.to_string().replace('\n', " ")],
        }
    }

    /// Unset variables the command would have gone on without.
    pub fn warnings(&self) -> &[String] {
        match self {
            ConfigError::Invalid { warnings, .. } => warnings,
            _ => &[],
        }
    }
}

/// What an unset `${VAR}` without a default means for the command loading the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unset {
    /// An error: `colibri run` and reloads never start with a value missing.
    Refuse,
    /// A warning (`Config::warnings`), and the reference expands to nothing, for commands that
    /// do not run the file: packaged installs keep secrets in an environment file only the unit
    /// reads, and `check` or `queue stats` from a shell must work without them. A setting that
    /// cannot be empty (a token, a number) is then left out, as a bad setting is, without a
    /// problem of its own. Under the top-level keys in `needed` an unset variable stays an error:
    /// the queue commands must not guess where the store is or how it is bounded.
    Warn { needed: &'static [&'static str] },
}

/// The settings the `queue` commands take from the file: where the store is and its streams.
pub const QUEUE_NEEDS: &[&str] = &["data_dir", "storage", "streams"];

/// Reads, expands and validates the file at `path` against the process environment; an unset
/// variable is an error.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    load_with(path, Unset::Refuse)
}

/// [`load`], with unset variables treated as `unset` says.
pub fn load_with(path: &Path, unset: Unset) -> Result<Config, ConfigError> {
    let bytes = std::fs::read(path).map_err(|error| ConfigError::Read {
        path: path.to_path_buf(),
        error,
    })?;
    let text = String::from_utf8(bytes).map_err(|e| {
        let bytes = e.as_bytes();
        let good = &bytes[..e.utf8_error().valid_up_to()];
        let line_start = good.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        let column = String::from_utf8_lossy(&good[line_start..]).chars().count() + 1;
        ConfigError::NotUtf8 {
            path: path.to_path_buf(),
            line: good.iter().filter(|b| **b == b'\n').count() + 1,
            column,
            byte: bytes[good.len()],
        }
    })?;
    load_str_with(&text, path, &|name| std::env::var(name).ok(), unset)
}

/// Same as [`load`] for text already in memory; `path` names the file in messages and anchors relative
/// paths; `lookup` stands in for the environment.
pub fn load_str(
    text: &str,
    path: &Path,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigError> {
    load_str_with(text, path, lookup, Unset::Refuse)
}

/// [`load_str`], with unset variables treated as `unset` says.
pub fn load_str_with(
    text: &str,
    path: &Path,
    lookup: &dyn Fn(&str) -> Option<String>,
    unset: Unset,
) -> Result<Config, ConfigError> {
    let mut root: Value = if text.trim().is_empty() {
        Value::Object(Default::default())
    } else {
        // YAML 1.2 core booleans only: `name: off` or `env: {FEATURE: no}` stay the strings the user
        // wrote instead of turning into false (the "Norway problem"); `0755` stays a string too.
        let options = serde_saphyr::options! {
            strict_booleans: true,
            leading_zero_numbers_as_strings: true,
        };
        serde_saphyr::from_str_with_options(text, options).map_err(|e| ConfigError::Syntax {
            path: path.to_path_buf(),
            message: syntax_message(&e),
        })?
    };
    if root.is_null() {
        root = Value::Object(Default::default());
    }
    let tolerate = |at: &str| match unset {
        Unset::Refuse => false,
        Unset::Warn { needed } => !needed.iter().any(|k| under(at, k)),
    };
    let expanded = env::expand_tree(&mut root, lookup, &tolerate);
    let mut problems: Vec<Problem> = expanded
        .problems
        .iter()
        .map(|(path, message)| Problem {
            path: path.clone(),
            message: message.clone(),
        })
        .collect();
    let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let mut compiled = Vec::new();
    let config = compile(root, path, &base, &mut compiled).map(|mut c| {
        let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
        c.sha256 = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        c
    });
    // A value that could not be expanded was left as written; what compile says about it would
    // only repeat the problem.
    compiled.retain(|p| {
        let at = tree_path(&p.path);
        !expanded.problems.iter().any(|(failed, _)| *failed == at)
    });
    problems.append(&mut compiled);
    // A value left empty for a variable the command goes on without may not be one the field
    // can take (an empty token, a number): that is the warning's to say, not a problem. The
    // part of the file it was in is then left out of what the command sees (a `check` summary,
    // say), and nothing that runs the file ever gets here.
    problems.retain(|p| {
        let at = tree_path(&p.path);
        !expanded
            .expansions
            .iter()
            .any(|e| e.path == at && !e.unset.is_empty())
    });
    for p in &mut problems {
        let at = tree_path(&p.path);
        p.message = redact(&expanded.expansions, &at, std::mem::take(&mut p.message));
    }
    let warnings = unset_warnings(&expanded.expansions, path);
    match config {
        Some(mut c) if problems.is_empty() => {
            c.warnings = warnings;
            Ok(c)
        }
        _ => Err(ConfigError::Invalid {
            path: path.to_path_buf(),
            problems,
            warnings,
        }),
    }
}

/// A YAML error in words for people: the location but no source snippet (it would span lines in
/// a log) and none of the library's hints about its own options.
fn syntax_message(e: &serde_saphyr::Error) -> String {
    let formatter = serde_saphyr::UserMessageFormatter;
    e.render_with_options(serde_saphyr::render_options! {
        formatter: &formatter,
        snippets: serde_saphyr::SnippetMode::Off,
    })
}

/// One warning per unset variable the command went on without, naming where the file uses it.
fn unset_warnings(expansions: &[env::Expansion], file: &Path) -> Vec<String> {
    let mut by_var: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for e in expansions {
        for name in &e.unset {
            by_var.entry(name).or_default().push(&e.path);
        }
    }
    by_var
        .into_iter()
        .map(|(name, paths)| {
            format!(
                "${{{name}}} is not set ({}: {}); this command goes on without it, `colibri run` refuses the file until it is set",
                file.display(),
                paths.join(", ")
            )
        })
        .collect()
}

/// Whether tree path `path` is `at` or inside it (`sinks.up.url` is inside `sinks` and
/// `sinks.up`; `tasks[1]` is inside `tasks`). Everything is inside the root, `""`.
fn under(path: &str, at: &str) -> bool {
    at.is_empty()
        || path
            .strip_prefix(at)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
}

/// The tree path (as `env` records them) of a problem's path: task problems are shown as
/// `tasks[3] "rotate": schedule`, everything else is shown as its tree path already.
fn tree_path(shown: &str) -> String {
    let Some(rest) = shown.strip_prefix("tasks[") else {
        return shown.to_string();
    };
    let Some(close) = rest.find(']') else {
        return shown.to_string();
    };
    let (index, mut rest) = (&rest[..close], &rest[close + 1..]);
    // The name, Debug-quoted: skip to its closing quote.
    if let Some(quoted) = rest.strip_prefix(" \"") {
        let mut escaped = false;
        let end = quoted.char_indices().find_map(|(i, c)| {
            let close = c == '"' && !escaped;
            escaped = c == '\\' && !escaped;
            close.then_some(i)
        });
        rest = end.map_or("", |i| &quoted[i + 1..]);
    }
    match rest.strip_prefix(": ") {
        Some(field) if !field.is_empty() => format!("tasks[{index}].{field}"),
        _ => format!("tasks[{index}]"),
    }
}

/// `message`, a problem at tree path `at`, with every value that came from `${...}` at or inside
/// `at` replaced by the words that name its variable (`the value of ${TOKEN}`): the value may be
/// a secret and is never shown. The value is replaced in every form a message quotes it in
/// (serde's backticks, Rust's and JSON's quotes, and as a bare word), and the message's own
/// producers quote a value whole or not at all; a message that still holds the value afterwards
/// is dropped for a plain one.
fn redact(expansions: &[env::Expansion], at: &str, message: String) -> String {
    let mut m = message;
    let mut names = Vec::new();
    for e in expansions
        .iter()
        .filter(|e| !e.value.is_empty() && under(&e.path, at))
    {
        // A marker first, the words last, so one value's words are never taken for another value.
        let marker = format!("\u{0}{}\u{0}", names.len());
        names.push(e.shown());
        let variant = format!("unknown variant `{}`, expected ", e.value);
        if let Some(rest) = m.strip_prefix(&variant) {
            m = format!("expected {rest}, found {marker}");
        }
        let json = serde_json::to_string(&e.value).expect("a string serializes");
        for form in [format!("`{}`", e.value), format!("{:?}", e.value), json] {
            m = m.replace(&form, &marker);
        }
        // Bare, only where it is surely this value: at its own path, or long enough not to be
        // a word of the message.
        if e.path == at || e.value.chars().count() >= 8 {
            m = replace_word(&m, &e.value, &marker);
        }
        if e.value.chars().count() >= 4 && m.contains(&e.value) {
            m = format!("{marker} is not valid here");
        }
    }
    for (i, shown) in names.iter().enumerate() {
        m = m.replace(&format!("\u{0}{i}\u{0}"), shown);
    }
    m
}

/// `text` with each occurrence of `word` that is not part of a longer word replaced.
fn replace_word(text: &str, word: &str, with: &str) -> String {
    if word.is_empty() {
        return text.to_string();
    }
    let is_word = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(word) {
        out.push_str(&rest[..i]);
        let before = out.chars().next_back();
        let after = rest[i + word.len()..].chars().next();
        if before.is_some_and(is_word) || after.is_some_and(is_word) {
            out.push_str(word);
        } else {
            out.push_str(with);
        }
        rest = &rest[i + word.len()..];
    }
    out.push_str(rest);
    out
}

fn de_at<T: serde::de::DeserializeOwned>(value: Value) -> Result<T, (String, String)> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let path = if path == "." { String::new() } else { path };
        (path, e.into_inner().to_string())
    })
}

/// Validates the expanded tree and builds the runtime config. Returns `None` only when the file's top
/// level is unusable; otherwise keeps going so every problem is reported.
fn compile(root: Value, source: &Path, base: &Path, problems: &mut Vec<Problem>) -> Option<Config> {
    let Value::Object(mut map) = root else {
        problems.push(Problem {
            path: String::new(),
            message: "the file must be a mapping of settings (data_dir, tasks, ...)".into(),
        });
        return None;
    };
    let tasks_value = map.remove("tasks");
    let streams_value = map.remove("streams");
    let sinks_value = map.remove("sinks");
    let sources_value = map.remove("sources");
    let entries = |v: &Option<Value>| match v {
        Some(Value::Object(m)) => m.iter().map(|(k, v)| (k.clone(), v.to_string())).collect(),
        _ => BTreeMap::new(),
    };
    let mut fingerprint = Fingerprint {
        top: map
            .iter()
            .map(|(k, v)| (k.clone(), v.to_string()))
            .collect(),
        tasks: BTreeMap::new(),
        sinks: entries(&sinks_value),
        streams: entries(&streams_value),
        sources: entries(&sources_value),
    };
    if let Some(Value::Array(items)) = &tasks_value {
        for v in items {
            if let Some(name) = v.get("name").and_then(Value::as_str) {
                fingerprint.tasks.insert(name.to_string(), v.to_string());
            }
        }
    }
    // Each top-level key on its own first, so one bad setting neither hides another nor stops the
    // tasks from being checked; bad keys are left out and their defaults stand in.
    let mut good = serde_json::Map::new();
    for (key, value) in map {
        let single = Value::Object(std::iter::once((key.clone(), value.clone())).collect());
        match de_at::<FileSpec>(single) {
            Ok(_) => {
                good.insert(key, value);
            }
            Err((path, message)) => problems.push(Problem { path, message }),
        }
    }
    let spec: FileSpec = match de_at(Value::Object(good)) {
        Ok(s) => s,
        Err((path, message)) => {
            problems.push(Problem { path, message });
            return None;
        }
    };
    let mut top = |path: &str, message: String| {
        problems.push(Problem {
            path: path.into(),
            message,
        })
    };
    if spec.data_dir.trim().is_empty() {
        top("data_dir", "must not be empty".into());
    }
    if spec.workers == 0 {
        top("workers", "must be at least 1".into());
    }
    let grace = spec.shutdown_grace.0;
    if grace.is_zero() {
        top("shutdown_grace", "must be positive".into());
    }

    let log_file = compile_log(&spec.log, base, &mut top);

    let storage = StorageConfig {
        max_bytes: spec.storage.max_bytes.map_or(2 << 30, |s| s.0),
        min_free: spec.storage.min_free.map_or(256 << 20, |s| s.0),
    };
    if storage.max_bytes == 0 {
        top("storage.max_bytes", "must be positive".into());
    }
    // Every name the file declares, compiled or not: an entry with a problem of its own is still
    // known to the entries that refer to it, which must not add a false "not defined".
    let declared = |v: &Option<Value>| match v {
        Some(Value::Object(m)) => m.keys().cloned().collect(),
        _ => Vec::<String>::new(),
    };
    let (declared_sinks, declared_streams) = (declared(&sinks_value), declared(&streams_value));
    let sinks: Vec<Arc<SinkConfig>> = match sinks_value {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Object(entries)) => entries
            .into_iter()
            .filter_map(|(name, value)| compile_sink(name, value, base, problems))
            .map(Arc::new)
            .collect(),
        Some(other) => {
            problems.push(Problem {
                path: "sinks".into(),
                message: format!("expected a mapping of sink names to settings, found {other}"),
            });
            Vec::new()
        }
    };
    let sink_names: Vec<&str> = declared_sinks.iter().map(String::as_str).collect();
    let streams = match streams_value {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Object(entries)) => entries
            .into_iter()
            .filter_map(|(name, value)| compile_stream(name, value, &sink_names, problems))
            .collect(),
        Some(other) => {
            problems.push(Problem {
                path: "streams".into(),
                message: format!("expected a mapping of stream names to settings, found {other}"),
            });
            Vec::new()
        }
    };
    let stream_names: Vec<&str> = declared_streams.iter().map(String::as_str).collect();
    let stream_formats: Vec<(&str, RecordFormat)> = stream_names
        .iter()
        .map(|&s| (s, stream_format(&streams, &sinks, s)))
        .collect();
    let sources: Vec<Arc<crate::tail::TailConfig>> = match sources_value {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Object(entries)) => entries
            .into_iter()
            .filter_map(|(name, value)| {
                let (value, mut err) = named("sources", "source", &name, value, problems);
                let (_, rest) = split_type(value, &["tail"], &mut err)?;
                let spec = de_at(rest)
                    .map(sources::SourceSpec::Tail)
                    .map_err(|(p, m)| err(&p, m))
                    .ok()?;
                sources::compile(&name, spec, base, &stream_names, &mut err)
            })
            .map(Arc::new)
            .collect(),
        Some(other) => {
            problems.push(Problem {
                path: "sources".into(),
                message: format!("expected a mapping of source names to settings, found {other}"),
            });
            Vec::new()
        }
    };
    let ingest = spec.ingest.and_then(|i| {
        let mut err = |path: &str, message: String| {
            problems.push(Problem {
                path: format!("ingest.{path}"),
                message,
            })
        };
        ingest::compile(i, &stream_formats, &mut err)
    });
    for src in &sources {
        if let RecordFormat::LineProtocol(_) = stream_format(&streams, &sinks, &src.stream) {
            problems.push(Problem {
                path: format!("sources.{}.stream", src.name),
                message: format!(
                    "stream {:?} is delivered as influx line protocol (its sink has encoding: influx_line), but a tail source's records are JSON objects ({{\"line\": ...}}) its sink would send unreadable: send this source to a stream with a JSON or file sink",
                    src.stream
                ),
            });
        }
    }
    let mut top = |path: &str, message: String| {
        problems.push(Problem {
            path: path.into(),
            message,
        })
    };
    let admin = admin::compile_admin(spec.admin, &mut top);

    let task_values = match tasks_value {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items,
        Some(other) => {
            top("tasks", format!("expected a list of tasks, found {other}"));
            Vec::new()
        }
    };
    let data_dir = base.join(&spec.data_dir);
    let ctx = TaskCtx {
        base,
        grace,
        data_dir: &data_dir,
        streams: &streams,
        declared_streams: &declared_streams,
        sinks: &sinks,
        storage,
    };
    let mut tasks = Vec::with_capacity(task_values.len());
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (i, value) in task_values.into_iter().enumerate() {
        let name = value
            .get("name")
            .and_then(Value::as_str)
            .map(str::to_string);
        let at = match &name {
            Some(n) => format!("tasks[{i}] {n:?}"),
            None => format!("tasks[{i}]"),
        };
        if let Some(n) = &name {
            if let Some(first) = seen.get(n) {
                problems.push(Problem {
                    path: at.clone(),
                    message: format!("duplicate name (first used by tasks[{first}])"),
                });
            } else {
                seen.insert(n.clone(), i);
            }
        }
        if let Some(task) = compile_task(value, &at, &ctx, problems) {
            tasks.push(Arc::new(task));
        }
    }

    Some(Config {
        source: source.to_path_buf(),
        data_dir,
        workers: spec.workers as usize,
        shutdown_grace: grace,
        log_level: spec.log.level,
        log_format: spec.log.format,
        log_file,
        storage,
        sinks,
        streams,
        tasks,
        ingest,
        sources,
        admin,
        fingerprint,
        sha256: String::new(),
        warnings: Vec::new(),
    })
}

/// `log.file` and its rotation; `None` when events go to stderr.
fn compile_log(spec: &LogSpec, base: &Path, err: &mut dyn FnMut(&str, String)) -> Option<LogFile> {
    let Some(file) = &spec.file else {
        for (key, set) in [
            ("log.max_size", spec.max_size.is_some()),
            ("log.max_files", spec.max_files.is_some()),
        ] {
            if set {
                err(
                    key,
                    "only applies with log.file (without it events go to stderr)".into(),
                );
            }
        }
        return None;
    };
    let max_size = spec.max_size.map_or(DEFAULT_LOG_MAX_SIZE, |s| s.0);
    let max_files = spec.max_files.unwrap_or(DEFAULT_LOG_MAX_FILES);
    if max_size < MIN_LOG_MAX_SIZE {
        err("log.max_size", "must be at least 64KiB".into());
    }
    if max_files == 0 {
        err("log.max_files", "must be at least 1".into());
    }
    if file.trim().is_empty() {
        err("log.file", "must name a file".into());
        return None;
    }
    let path = base.join(file);
    // The directory must be there already, as for every other path: a missing one usually means
    // an unmounted disk, which should not be filled from the root filesystem.
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    match std::fs::metadata(dir) {
        Err(e) => err(
            "log.file",
            format!(
                "directory {}: {} (colibri does not create it)",
                dir.display(),
                io_reason(&e)
            ),
        ),
        Ok(m) if !m.is_dir() => err("log.file", format!("{} is not a directory", dir.display())),
        Ok(_) => {
            if path.is_dir() {
                err("log.file", format!("{} is a directory", path.display()));
            }
        }
    }
    Some(LogFile {
        path,
        max_size,
        max_files,
    })
}

/// Names of tasks and streams: they appear in logs, metric labels and table names.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// The first step for one entry of a named map (`sinks.<name>`, `streams.<name>`): the name is
/// checked. Returns the entry and a reporter for the caller's own checks (paths relative to the
/// entry).
fn named<'p>(
    section: &str,
    what: &str,
    name: &str,
    value: Value,
    problems: &'p mut Vec<Problem>,
) -> (Value, impl FnMut(&str, String) + 'p) {
    let at = format!("{section}.{name}");
    let mut err = move |path: &str, message: String| {
        let path = if path.is_empty() {
            at.clone()
        } else {
            format!("{at}.{path}")
        };
        problems.push(Problem { path, message })
    };
    if !valid_name(name) {
        err(
            "",
            format!("a {what} name must be 1-64 letters, digits, -, _ or ."),
        );
    }
    (value, err)
}

/// [`named`], then the entry deserialized, problems reported under its path.
fn named_entry<'p, T: serde::de::DeserializeOwned>(
    section: &str,
    what: &str,
    name: &str,
    value: Value,
    problems: &'p mut Vec<Problem>,
) -> (Option<T>, impl FnMut(&str, String) + 'p) {
    let (value, mut err) = named(section, what, name, value, problems);
    let spec = de_at(value).map_err(|(p, m)| err(&p, m)).ok();
    (spec, err)
}

/// Splits the `type` off an entry of a closed set (`{type: http, url: ...}`), so the caller reads
/// the rest as that type's own struct. Reading the internally tagged enum whole would lose the
/// path of a problem inside it (serde buffers the entry first), and `encoding: xml` would be
/// reported at the entry instead of at `encoding`.
fn split_type(
    value: Value,
    types: &[&str],
    err: &mut impl FnMut(&str, String),
) -> Option<(String, Value)> {
    let one_of = || {
        types
            .iter()
            .map(|t| format!("`{t}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let Value::Object(mut map) = value else {
        err(
            "",
            format!(
                "expected a mapping with a type ({}) and its settings, found {value}",
                one_of()
            ),
        );
        return None;
    };
    match map.remove("type") {
        None => {
            err("", format!("missing field `type` (one of {})", one_of()));
            None
        }
        Some(Value::String(t)) if types.contains(&t.as_str()) => Some((t, Value::Object(map))),
        Some(Value::String(t)) => {
            err(
                "type",
                format!("unknown variant `{t}`, expected one of {}", one_of()),
            );
            None
        }
        Some(other) => {
            err(
                "type",
                format!("expected one of {}, found {other}", one_of()),
            );
            None
        }
    }
}

fn compile_sink(
    name: String,
    value: Value,
    base: &Path,
    problems: &mut Vec<Problem>,
) -> Option<SinkConfig> {
    let (value, mut err) = named("sinks", "sink", &name, value, problems);
    let (kind, rest) = split_type(value, SINK_TYPES, &mut err)?;
    let spec = match kind.as_str() {
        "file" => de_at(rest).map(SinkSpec::File),
        "stdout" => de_at(rest).map(SinkSpec::Stdout),
        _ => de_at(rest).map(|h| SinkSpec::Http(Box::new(h))),
    }
    .map_err(|(p, m)| err(&p, m))
    .ok()?;
    let mut link = LinkConfig::default();
    let (kind, retry) = match spec {
        SinkSpec::File(FileSinkSpec { path, retry }) => {
            let dir = base.join(&path);
            if dir.exists() && !dir.is_dir() {
                err(
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
            let kind = compile_http(
                HttpSinkSpec {
                    retry: RetrySpec::default(),
                    ..spec
                },
                base,
                &mut err,
            )?;
            (kind, retry)
        }
    };
    let retry = SinkRetry {
        base: retry.base.map_or(Duration::from_secs(1), |d| d.0),
        cap: retry.cap.map_or(Duration::from_secs(300), |d| d.0),
        max_attempts: retry.max_attempts.unwrap_or(8),
    };
    if retry.base.is_zero() {
        err("retry.base", "must be positive".into());
    }
    if retry.cap < retry.base {
        err("retry.cap", "must not be shorter than retry.base".into());
    }
    if retry.max_attempts == 0 {
        err("retry.max_attempts", "must be at least 1".into());
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
    base: &Path,
    err: &mut impl FnMut(&str, String),
) -> Option<SinkKind> {
    let mut url = match parse_http_url(&spec.url) {
        Ok(u) => u,
        Err(m) => {
            err("url", m);
            return None;
        }
    };
    let influx = matches!(spec.encoding, Some(EncodingSpec::InfluxLine));
    let precision = match (influx, spec.precision) {
        (false, Some(_)) => {
            err("precision", "only applies to encoding: influx_line".into());
            None
        }
        (false, None) => None,
        (true, p) => Some(p.unwrap_or(PrecisionSpec::Ns).compile()),
    };
    if let Some(p) = precision {
        if url.query_pairs().any(|(k, _)| k == "precision") {
            err(
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
            err(&format!("headers.{k}"), m.into());
        }
    }
    let timeout = spec.timeout.map_or(Duration::from_secs(10), |d| d.0);
    if timeout.is_zero() {
        err("timeout", "must be positive".into());
    }
    let concurrency = spec.concurrency.unwrap_or(1);
    if !(1..=64).contains(&concurrency) {
        err(
            "concurrency",
            format!("must be between 1 and 64, not {concurrency}"),
        );
    }
    if spec.replay_rate.is_some_and(|r| r.0 == 0) {
        err(
            "replay_rate",
            "must be positive (leave it out for unlimited)".into(),
        );
    }
    let file = |p: &Option<String>| p.as_ref().map(|p| base.join(p));
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
        tls: crate::sink::http::TlsConfig {
            ca_file: file(&spec.tls.ca_file),
            client_cert: file(&spec.tls.client_cert),
            client_key: file(&spec.tls.client_key),
            server_name: spec.tls.server_name,
        },
        replay_rate: spec.replay_rate.map(|r| r.0),
    };
    // Building the client reads and parses the TLS files: a bad CA is reported now, not at the
    // first delivery.
    if headers_ok && let Err(e) = crate::sink::http::HttpSink::new(&http) {
        err(&e.field, e.message);
    }
    Some(SinkKind::Http(Box::new(http)))
}

fn parse_http_url(s: &str) -> Result<reqwest::Url, String> {
    let url = reqwest::Url::parse(s).map_err(|e| format!("{s:?} is not a valid URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "{s:?}: the scheme must be http or https, not {}",
            url.scheme()
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("{s:?} has no host"));
    }
    Ok(url)
}

fn compile_link(spec: &LinkSpecFile, url: &str, err: &mut impl FnMut(&str, String)) -> LinkConfig {
    let d = LinkConfig::default();
    let probe = match (spec.probe, &spec.probe_url) {
        (None | Some(ProbeSpec::Tcp), None) => Probe::Tcp,
        (None | Some(ProbeSpec::Tcp), Some(_)) => {
            err("link.probe_url", "is only used with probe: http".into());
            Probe::Tcp
        }
        (Some(ProbeSpec::Http), u) => {
            match parse_http_url(u.as_deref().unwrap_or(url)) {
                Ok(u) => Probe::Http(u),
                // A bad sink URL is reported under `url` already.
                Err(m) => {
                    if u.is_some() {
                        err("link.probe_url", m);
                    }
                    Probe::Tcp
                }
            }
        }
    };
    let link = LinkConfig {
        probe,
        down_after: spec.down_after.unwrap_or(d.down_after),
        backoff_base: spec.backoff_base.map_or(d.backoff_base, |x| x.0),
        backoff_cap: spec.backoff_cap.map_or(d.backoff_cap, |x| x.0),
    };
    if link.down_after == 0 {
        err("link.down_after", "must be at least 1".into());
    }
    if link.backoff_base.is_zero() {
        err("link.backoff_base", "must be positive".into());
    }
    if link.backoff_cap < link.backoff_base {
        err(
            "link.backoff_cap",
            "must not be shorter than link.backoff_base".into(),
        );
    }
    link
}

fn compile_stream(
    name: String,
    value: Value,
    sinks: &[&str],
    problems: &mut Vec<Problem>,
) -> Option<StreamConfig> {
    let (spec, mut err) = named_entry::<StreamSpec>("streams", "stream", &name, value, problems);
    let spec = spec?;
    if let Some(sink) = &spec.sink
        && !sinks.contains(&sink.as_str())
    {
        let known = if sinks.is_empty() {
            "none".to_string()
        } else {
            sinks.join(", ")
        };
        err(
            "sink",
            format!("sink {sink:?} is not defined under sinks: (defined: {known})"),
        );
    }
    let batch = BatchConfig {
        max_records: spec.batch.max_records.unwrap_or(1000),
        max_bytes: spec.batch.max_bytes.map_or(1 << 20, |s| s.0),
        linger: spec.batch.linger.map_or(Duration::from_secs(1), |d| d.0),
    };
    if batch.max_records == 0 {
        err("batch.max_records", "must be at least 1".into());
    }
    if batch.max_bytes == 0 {
        err("batch.max_bytes", "must be positive".into());
    }
    let max_jobs = spec.max_jobs.unwrap_or(100_000);
    if max_jobs == 0 {
        err("max_jobs", "must be at least 1".into());
    }
    let max_bytes = spec.max_bytes.map_or(256 << 20, |s| s.0);
    // A full job is its records plus a header and 4 bytes per record.
    let job_max = batch.max_bytes + 64 + 4 * u64::from(batch.max_records);
    if max_bytes < job_max {
        err(
            "max_bytes",
            format!(
                "{max_bytes} bytes cannot hold one full job of batch.max_bytes ({job_max} bytes with its framing)"
            ),
        );
    }
    if spec.ttl.is_some_and(|d| d.0.is_zero()) {
        err(
            "ttl",
            "must be positive (leave it out to keep jobs until delivered)".into(),
        );
    }
    Some(StreamConfig {
        name,
        sink: spec.sink,
        batch,
        max_jobs: u64::from(max_jobs),
        max_bytes,
        when_full: match spec.when_full {
            WhenFullSpec::Block => WhenFull::Block,
            WhenFullSpec::DropOldest => WhenFull::DropOldest,
            WhenFullSpec::DropNewest => WhenFull::DropNewest,
        },
        ttl: spec.ttl.map(|d| d.0),
        dead_max_jobs: u64::from(spec.dead_letter.max_jobs.unwrap_or(10_000)),
    })
}

/// What a task's checks need from the rest of the file.
struct TaskCtx<'a> {
    /// The config file's directory.
    base: &'a Path,
    grace: Duration,
    data_dir: &'a Path,
    streams: &'a [StreamConfig],
    /// Every stream the file names, including those with problems of their own.
    declared_streams: &'a [String],
    sinks: &'a [Arc<SinkConfig>],
    storage: StorageConfig,
}

impl TaskCtx<'_> {
    /// The stream `name`. `Err(None)`: it is declared but has problems of its own, already
    /// reported; `Err(Some(..))`: it is not defined.
    fn stream(&self, name: &str) -> Result<&StreamConfig, Option<String>> {
        if let Some(s) = self.streams.iter().find(|s| s.name == name) {
            return Ok(s);
        }
        if self.declared_streams.iter().any(|s| s == name) {
            return Err(None);
        }
        Err(Some(format!(
            "stream {name:?} is not defined under streams: (defined: {})",
            if self.declared_streams.is_empty() {
                "none".to_string()
            } else {
                self.declared_streams.join(", ")
            }
        )))
    }
}

fn compile_task(
    value: Value,
    at: &str,
    ctx: &TaskCtx<'_>,
    problems: &mut Vec<Problem>,
) -> Option<TaskDef> {
    let (base, grace) = (ctx.base, ctx.grace);
    let mut err = |path: &str, message: String| {
        let path = if path.is_empty() {
            at.to_string()
        } else {
            format!("{at}: {path}")
        };
        problems.push(Problem { path, message })
    };
    let Value::Object(map) = value else {
        err(
            "",
            format!("expected a mapping with name, type, schedule ..., found {value}"),
        );
        return None;
    };
    // Split the shared fields from the type's own, so each half can reject unknown keys.
    let (common_map, kind_map): (serde_json::Map<_, _>, serde_json::Map<_, _>) = map
        .into_iter()
        .partition(|(k, _)| COMMON_KEYS.contains(&k.as_str()));
    let kind_ok = match kind_map.get("type") {
        None => {
            err("", format!("missing field `type` (one of: {TASK_TYPES})"));
            false
        }
        Some(Value::String(t)) if !TASK_TYPES.split(", ").any(|k| k == t) => {
            err("type", format!("unknown type {t:?} (one of: {TASK_TYPES})"));
            false
        }
        Some(Value::String(_)) => true,
        Some(other) => {
            err(
                "type",
                format!("expected one of: {TASK_TYPES}, found {other}"),
            );
            false
        }
    };
    let common: Option<TaskCommon> = de_at(Value::Object(common_map))
        .map_err(|(p, m)| err(&p, m))
        .ok();
    // The type's own struct, so a problem inside it keeps its field (see `split_type`).
    let kind: Option<TaskKind> = if kind_ok {
        let mut kind_map = kind_map;
        let kind = kind_map.remove("type");
        let rest = Value::Object(kind_map);
        match kind.as_ref().and_then(Value::as_str) {
            Some("exec") => de_at(rest).map(TaskKind::Exec),
            Some("file_move") => de_at(rest).map(TaskKind::FileMove),
            // Checked above: the only type left.
            _ => de_at(rest).map(|s| TaskKind::HttpScrape(Box::new(s))),
        }
        .map_err(|(p, m)| err(&p, m))
        .ok()
    } else {
        None
    };
    let common = common?;

    if !valid_name(&common.name) {
        err(
            "name",
            format!("{:?} must be 1-64 letters, digits, -, _ or .", common.name),
        );
    }

    let zone = match &common.tz {
        None => Zone::Local,
        Some(tz) => match crate::zone::NamedZone::load(tz) {
            Ok(z) => Zone::Named(z),
            Err(m) => {
                err("tz", m);
                Zone::Local
            }
        },
    };
    let schedule = match (&common.schedule, common.every) {
        (Some(_), Some(_)) => {
            err("", "has both schedule and every; use one".into());
            None
        }
        (None, None) => {
            err(
                "",
                "needs a schedule (crontab expression) or every (interval)".into(),
            );
            None
        }
        (Some(text), None) => {
            if common.offset.is_some() {
                err("offset", "only applies to every, not to schedule".into());
            }
            match schedule::parse_cron(text, zone) {
                Ok(s) => Some(s),
                Err(e) => {
                    err("", format!("schedule {text:?}: {e}"));
                    None
                }
            }
        }
        (None, Some(Dur(period))) => {
            if common.tz.is_some() {
                err(
                    "tz",
                    "only applies to schedule; an interval does not depend on the time zone".into(),
                );
            }
            if period.is_zero() {
                err("every", "must be positive".into());
                None
            } else {
                let offset = common.offset.map_or(Offset::Fixed(Duration::ZERO), |o| o.0);
                Some(Schedule::Every { period, offset })
            }
        }
    };

    let timeout = common.timeout.map_or(DEFAULT_TIMEOUT, |d| d.0);
    if timeout.is_zero() {
        err("timeout", "must be positive".into());
    } else if timeout >= grace {
        err(
            "timeout",
            format!(
                "{}{} must be shorter than shutdown_grace ({}), so a stop can let the run finish",
                crate::units::fmt_duration(timeout),
                if common.timeout.is_none() {
                    " (the default)"
                } else {
                    ""
                },
                crate::units::fmt_duration(grace)
            ),
        );
    }
    let retry = RetryPolicy {
        max_retry: common.max_retry.unwrap_or(0),
        base: common.retry_base.map_or(DEFAULT_RETRY_BASE, |d| d.0),
        cap: common.retry_cap.map_or(DEFAULT_RETRY_CAP, |d| d.0),
    };
    if retry.base.is_zero() {
        err("retry_base", "must be positive".into());
    }
    if retry.cap < retry.base {
        err(
            "retry_cap",
            format!(
                "{} is shorter than retry_base ({})",
                crate::units::fmt_duration(retry.cap),
                crate::units::fmt_duration(retry.base)
            ),
        );
    }

    let action = match kind? {
        TaskKind::Exec(spec) => compile_exec(spec, base, &mut err).map(Action::Exec),
        TaskKind::FileMove(spec) => {
            compile_file_move(spec, &common.name, ctx, &mut err).map(Action::FileMove)
        }
        TaskKind::HttpScrape(spec) => {
            compile_scrape(*spec, &common.name, ctx, &mut err).map(Action::HttpScrape)
        }
    };
    Some(TaskDef {
        name: common.name,
        schedule: schedule?,
        timeout,
        retry,
        action: action?,
    })
}

fn compile_exec(spec: ExecSpec, base: &Path, err: &mut dyn FnMut(&str, String)) -> Option<Exec> {
    let mut argv: Vec<String> = spec.command.into_iter().map(|s| s.0).collect();
    let mut ok = true;
    match argv.first_mut() {
        None => {
            err(
                "command",
                "must name a program, e.g. [\"/usr/bin/env\", \"true\"]".into(),
            );
            ok = false;
        }
        Some(p) if p.is_empty() => {
            err("command[0]", "the program name is empty".into());
            ok = false;
        }
        Some(program) => {
            let path = Path::new(program.as_str());
            if path.is_relative() && program.contains('/') {
                *program = base.join(path).to_string_lossy().into_owned();
            }
            let path = Path::new(program.as_str());
            if path.is_absolute() {
                match std::fs::metadata(path) {
                    Err(e) => {
                        err("command[0]", format!("{program}: {}", io_reason(&e)));
                        ok = false;
                    }
                    Ok(m) if !m.is_file() => {
                        err("command[0]", format!("{program} is not a regular file"));
                        ok = false;
                    }
                    Ok(m) if m.permissions().mode() & 0o111 == 0 => {
                        err("command[0]", format!("{program} is not executable"));
                        ok = false;
                    }
                    Ok(_) => {}
                }
            }
        }
    }
    let cwd = spec.cwd.map(|c| base.join(c));
    if let Some(dir) = &cwd
        && !dir.is_dir()
    {
        err("cwd", format!("{} is not a directory", dir.display()));
        ok = false;
    }
    let mut env = Vec::with_capacity(spec.env.len());
    for (k, v) in spec.env {
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.0.contains('\0') {
            err(
                &format!("env.{k}"),
                "variable names must be non-empty without = or NUL".into(),
            );
            ok = false;
        }
        env.push((k, v.0));
    }
    ok.then_some(Exec { argv, env, cwd })
}

fn compile_file_move(
    spec: FileMoveSpec,
    task: &str,
    ctx: &TaskCtx<'_>,
    err: &mut dyn FnMut(&str, String),
) -> Option<FileMove> {
    let base = ctx.base;
    let mut ok = true;
    let dir = |field: &str, text: &str, err: &mut dyn FnMut(&str, String)| {
        if text.is_empty() {
            err(field, "must name a directory".into());
            return None;
        }
        let path = base.join(text);
        match std::fs::metadata(&path) {
            Err(e) => {
                err(field, format!("{}: {}", path.display(), io_reason(&e)));
                None
            }
            Ok(m) if !m.is_dir() => {
                err(field, format!("{} is not a directory", path.display()));
                None
            }
            Ok(_) => Some(path),
        }
    };
    let from = dir("from", &spec.from, err);
    let (to, ship) = match (&spec.to, &spec.to_stream) {
        (Some(_), Some(_)) => {
            err("to_stream", "is instead of to; set one of them".into());
            (None, None)
        }
        (None, None) => {
            err(
                "",
                "needs to (a directory) or to_stream (a stream to ship the files through)".into(),
            );
            (None, None)
        }
        (Some(to), None) => {
            if spec.archive.is_some() {
                err("archive", "only applies to to_stream".into());
                ok = false;
            }
            (dir("to", to, err), None)
        }
        (None, Some(stream)) => {
            if spec.on_conflict.is_some() {
                err(
                    "on_conflict",
                    "only applies to to; spooled files get unique names".into(),
                );
                ok = false;
            }
            let max_bytes = match ctx.stream(stream) {
                Ok(s) => s.max_bytes.min(ctx.storage.max_bytes),
                Err(m) => {
                    if let Some(m) = m {
                        err("to_stream", m);
                    }
                    ok = false;
                    0
                }
            };
            let archive = match &spec.archive {
                None => None,
                Some(a) => {
                    let d = dir("archive", a, err);
                    if d.is_none() {
                        ok = false;
                    }
                    d
                }
            };
            let spool_rel = crate::store::spool::task_dir(task);
            let spool_dir = ctx.data_dir.join(&spool_rel);
            let ship = crate::task::file_move::Ship {
                stream: stream.clone(),
                spool_dir: spool_dir.clone(),
                spool_rel,
                archive,
                min_free: ctx.storage.min_free,
                max_bytes,
                recovered: Default::default(),
            };
            (Some(spool_dir), Some(ship))
        }
    };
    if let (Some(f), Some(t)) = (&from, &to)
        && ship.is_none()
    {
        let same = match (std::fs::canonicalize(f), std::fs::canonicalize(t)) {
            (Ok(a), Ok(b)) => a == b,
            _ => f == t,
        };
        if same {
            err(
                "to",
                format!("{} is the same directory as from", t.display()),
            );
            ok = false;
        }
    }
    let mut globs = |field: &str, list: &[String], err: &mut dyn FnMut(&str, String)| {
        let mut out = Vec::with_capacity(list.len());
        for (i, g) in list.iter().enumerate() {
            if g.is_empty() || g.contains('/') {
                err(
                    &format!("{field}[{i}]"),
                    format!("{g:?} must be a non-empty glob on the file name, without /"),
                );
                ok = false;
                continue;
            }
            match glob::Pattern::new(g) {
                Ok(p) => out.push(p),
                Err(e) => {
                    err(&format!("{field}[{i}]"), format!("{g:?}: {e}"));
                    ok = false;
                }
            }
        }
        out
    };
    let pattern = globs("pattern", &spec.pattern, err);
    let exclude = globs("exclude", &spec.exclude, err);
    if spec.pattern.is_empty() {
        err(
            "pattern",
            "must list at least one glob, e.g. [\"*.csv\"]".into(),
        );
        ok = false;
    }
    let settle = spec.settle.map_or(DEFAULT_SETTLE, |d| d.0);
    if settle.is_zero() {
        err(
            "settle",
            "must be positive, so a file still being written is never taken".into(),
        );
        ok = false;
    }
    let max_files = spec.max_files.unwrap_or(DEFAULT_MAX_FILES);
    if max_files == 0 {
        err("max_files", "must be at least 1".into());
        ok = false;
    }
    let on_conflict = match spec.on_conflict.unwrap_or(OnConflictSpec::Rename) {
        OnConflictSpec::Rename => OnConflict::Rename,
        OnConflictSpec::Overwrite => OnConflict::Overwrite,
        OnConflictSpec::Skip => OnConflict::Skip,
    };
    let (from, to) = (from?, to?);
    ok.then_some(FileMove {
        from,
        to,
        ship,
        pattern,
        exclude,
        settle,
        on_conflict,
        max_files: max_files as usize,
    })
}

fn compile_scrape(
    spec: HttpScrapeSpec,
    task: &str,
    ctx: &TaskCtx<'_>,
    err: &mut dyn FnMut(&str, String),
) -> Option<crate::task::scrape::Scrape> {
    use crate::scrape::json::{JsonMapping, TimeUnit, check_pointer};
    use crate::scrape::lineproto::Precision;
    use crate::task::scrape::{Format, Scrape, ScrapeConfig};
    let mut ok = true;
    let url = match parse_http_url(&spec.url) {
        Ok(u) => Some(u),
        Err(m) => {
            err("url", m);
            None
        }
    };
    // The precision of the stream's sink, so timestamps mean what the write URL says.
    let precision = match ctx.stream(&spec.stream) {
        Err(m) => {
            if let Some(m) = m {
                err("stream", m);
            }
            ok = false;
            Precision::Ns
        }
        Ok(st) => st
            .sink
            .as_deref()
            .and_then(|name| ctx.sinks.iter().find(|s| s.name == name))
            .and_then(|s| match &s.kind {
                SinkKind::Http(h) => h.precision,
                _ => None,
            })
            .unwrap_or(Precision::Ns),
    };
    let measurement = spec.measurement.unwrap_or_else(|| task.to_string());
    let line_protocol = !matches!(spec.format, ScrapeFormatSpec::Raw);
    // What the scrape writes must be what the stream's sink sends.
    let carries = stream_format(ctx.streams, ctx.sinks, &spec.stream);
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
        err("stream", format!("{:?}: {why}", spec.stream));
        ok = false;
    }
    if line_protocol && let Err(m) = crate::scrape::lineproto::check_measurement(&measurement) {
        err("measurement", m);
        ok = false;
    }
    if !line_protocol && !spec.tags.is_empty() {
        err(
            "tags",
            "only apply to line protocol (format: prometheus or json)".into(),
        );
        ok = false;
    }
    let mut headers = Vec::with_capacity(spec.headers.len());
    for (k, v) in spec.headers {
        if reqwest::header::HeaderName::from_bytes(k.as_bytes()).is_err() {
            err(&format!("headers.{k}"), "is not a valid header name".into());
            ok = false;
        } else if reqwest::header::HeaderValue::from_str(&v).is_err() {
            err(
                &format!("headers.{k}"),
                "the value has characters a header cannot carry (control characters or non-ASCII)"
                    .into(),
            );
            ok = false;
        }
        headers.push((k, v));
    }
    let max_body = spec.max_body.map_or(DEFAULT_SCRAPE_MAX_BODY, |s| s.0);
    if max_body == 0 {
        err("max_body", "must be positive".into());
        ok = false;
    }
    let format = match (spec.format, spec.json) {
        (ScrapeFormatSpec::Json, j) => {
            let j = j.unwrap_or_default();
            let mut pointer = |field: &str, p: &str| {
                if let Err(m) = check_pointer(p) {
                    err(field, format!("{p:?}: {m}"));
                    ok = false;
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
                err("json.time_unit", "only applies with json.time".into());
                ok = false;
            }
            let unit = match j.time_unit.unwrap_or(TimeUnitSpec::Ms) {
                TimeUnitSpec::S => TimeUnit::S,
                TimeUnitSpec::Ms => TimeUnit::Ms,
                TimeUnitSpec::Ns => TimeUnit::Ns,
                TimeUnitSpec::Rfc3339 => TimeUnit::Rfc3339,
            };
            Format::Json(JsonMapping {
                records: j.records,
                measurement: measurement.clone(),
                fields: j.fields.into_iter().collect(),
                tags: j.tags.into_iter().collect(),
                time: j.time.map(|t| (t, unit)),
            })
        }
        (f, Some(_)) => {
            err(
                "json",
                format!(
                    "only applies to format: json (this task is format: {})",
                    match f {
                        ScrapeFormatSpec::Prometheus => "prometheus",
                        _ => "raw",
                    }
                ),
            );
            ok = false;
            Format::Raw
        }
        (ScrapeFormatSpec::Prometheus, None) => Format::Prometheus,
        (ScrapeFormatSpec::Raw, None) => Format::Raw,
    };
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
        })
    })
}

fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests;
