//! The `tasks:` section: the fields every task has (`TaskCommon`), the shape of each task type
//! (file_move, http_scrape here; exec and modbus in `tasks/`) and `compile_task`, which checks an entry against the rest of the
//! file (streams, sinks, shutdown grace) and builds the `task::TaskDef` the scheduler runs. It does
//! not run tasks (`task` and `scheduler` do). Called by `config::compile`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "schema")]
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::sinks::parse_http_url;
#[cfg(feature = "schema")]
use super::units::u32_schema;
use super::units::{self, Dur, Size};
use super::{Problems, de_all, io_reason, stream_format, valid_name};

mod exec;
mod modbus;
use crate::record::RecordFormat;
use crate::schedule::{self, Offset, Schedule, Zone};
use crate::scrape::json::{JsonMapping, TimeUnit, check_pointer};
use crate::scrape::lineproto::Precision;
use crate::sink::SinkConfig;
use crate::store::{StorageConfig, StreamConfig};
use crate::task::file_move::{FileMove, OnConflict, Ship};
use crate::task::scrape::{Format, Scrape, ScrapeConfig};
use crate::task::{Action, RetryPolicy, TaskDef};
pub use exec::{ExecFormatSpec, ExecSpec};
pub use modbus::{ModbusSpec, OrderSpec, PointSpec, PointType, RegisterSpec};

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

pub(super) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
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
    /// Poll a Modbus TCP device: its registers, coils and inputs as one sample per run, stamped
    /// with the poll's time (built with the `modbus` cargo feature; release builds have it).
    #[cfg(feature = "modbus")]
    Modbus(Box<ModbusSpec>),
}

const TASK_TYPES: &str = "exec, file_move, http_scrape, modbus";

/// What a build without the task says of `type: modbus`.
#[cfg(not(feature = "modbus"))]
const NO_MODBUS: &str = "this colibri was built without the modbus task (cargo feature modbus)";

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

/// What a task's checks need from the rest of the file.
pub(super) struct TaskCtx<'a> {
    /// The config file's directory.
    pub(super) base: &'a Path,
    pub(super) grace: Duration,
    pub(super) data_dir: &'a Path,
    pub(super) streams: &'a [StreamConfig],
    /// Every stream the file names, including those with problems of their own.
    pub(super) declared_streams: &'a [String],
    pub(super) sinks: &'a [Arc<SinkConfig>],
    pub(super) storage: StorageConfig,
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

pub(super) fn compile_task(
    value: Value,
    at: &str,
    ctx: &TaskCtx<'_>,
    problems: &mut Problems<'_>,
) -> Option<TaskDef> {
    let mut err = problems.under_task(at);
    let Value::Object(map) = value else {
        err.add(
            "",
            format!("expected a mapping with name, type, schedule ..., found {value}"),
        );
        return None;
    };
    // Split the shared fields from the type's own, so each half can reject unknown keys.
    let (common_map, kind_map): (serde_json::Map<_, _>, serde_json::Map<_, _>) = map
        .into_iter()
        .partition(|(k, _)| COMMON_KEYS.contains(&k.as_str()));
    let kind_ok = check_type(kind_map.get("type"), &mut err);
    // A schedule written but refused is reported at its field: "needs a schedule" would be noise.
    let timed = common_map.contains_key("schedule") || common_map.contains_key("every");
    let common: Option<TaskCommon> = de_all(Value::Object(common_map), &mut err);
    let kind = if kind_ok {
        read_kind(kind_map, &mut err)
    } else {
        None
    };
    let common = common?;

    if !valid_name(&common.name) {
        err.add(
            "name",
            format!("{:?} must be 1-64 letters, digits, -, _ or .", common.name),
        );
    }
    let schedule = compile_schedule(&common, timed, &mut err);
    let timeout = compile_timeout(common.timeout, ctx.grace, &mut err);
    let retry = compile_retry(&common, &mut err);
    let action = compile_action(kind?, &common.name, ctx, &mut err);
    Some(TaskDef {
        name: common.name,
        schedule: schedule?,
        timeout,
        retry,
        action: action?,
    })
}

/// Whether the task's `type` is one of [`TASK_TYPES`]; when not, that is reported.
fn check_type(kind: Option<&Value>, err: &mut Problems<'_>) -> bool {
    match kind {
        None => {
            err.add("", format!("missing field `type` (one of: {TASK_TYPES})"));
            false
        }
        Some(Value::String(t)) if !TASK_TYPES.split(", ").any(|k| k == t) => {
            err.add("type", format!("unknown type {t:?} (one of: {TASK_TYPES})"));
            false
        }
        Some(Value::String(_)) => true,
        Some(other) => {
            err.add(
                "type",
                format!("expected one of: {TASK_TYPES}, found {other}"),
            );
            false
        }
    }
}

/// The type's own fields, read as its own struct so a problem inside it keeps its field (see
/// `split_type`). `kind_map`'s `type` has passed [`check_type`].
fn read_kind(
    mut kind_map: serde_json::Map<String, Value>,
    err: &mut Problems<'_>,
) -> Option<TaskKind> {
    let kind = kind_map.remove("type");
    let rest = Value::Object(kind_map);
    match kind.as_ref().and_then(Value::as_str) {
        Some("exec") => de_all(rest, err).map(TaskKind::Exec),
        Some("file_move") => de_all(rest, err).map(TaskKind::FileMove),
        #[cfg(feature = "modbus")]
        Some("modbus") => de_all(rest, err).map(|s| TaskKind::Modbus(Box::new(s))),
        #[cfg(not(feature = "modbus"))]
        Some("modbus") => {
            err.add("type", NO_MODBUS.to_string());
            None
        }
        // Checked by `check_type`: the only type left.
        _ => de_all(rest, err).map(|s| TaskKind::HttpScrape(Box::new(s))),
    }
}

/// `schedule` or `every` (exactly one), with the settings that apply to each: `tz` to a
/// schedule, `offset` to an interval. `timed`: one was written but refused, already reported.
fn compile_schedule(common: &TaskCommon, timed: bool, err: &mut Problems<'_>) -> Option<Schedule> {
    let zone = compile_zone(common.tz.as_deref(), err);
    match (&common.schedule, common.every) {
        (Some(_), Some(_)) => {
            err.add("", "has both schedule and every; use one".into());
            None
        }
        (None, None) => {
            if !timed {
                err.add(
                    "",
                    "needs a schedule (crontab expression) or every (interval)".into(),
                );
            }
            None
        }
        (Some(text), None) => {
            if common.offset.is_some() {
                err.add("offset", "only applies to every, not to schedule".into());
            }
            match schedule::parse_cron(text, zone) {
                Ok(s) => Some(s),
                Err(e) => {
                    err.add("", format!("schedule {text:?}: {e}"));
                    None
                }
            }
        }
        (None, Some(Dur(period))) => {
            if common.tz.is_some() {
                err.add(
                    "tz",
                    "only applies to schedule; an interval does not depend on the time zone".into(),
                );
            }
            if period.is_zero() {
                err.add("every", "must be positive".into());
                None
            } else {
                let offset = common.offset.map_or(Offset::Fixed(Duration::ZERO), |o| o.0);
                Some(Schedule::Every { period, offset })
            }
        }
    }
}

/// `tz`: the machine's local zone when unset or not loadable (then reported).
fn compile_zone(tz: Option<&str>, err: &mut Problems<'_>) -> Zone {
    match tz {
        None => Zone::Local,
        Some(tz) => match crate::zone::NamedZone::load(tz) {
            Ok(z) => Zone::Named(z),
            Err(m) => {
                err.add("tz", m);
                Zone::Local
            }
        },
    }
}

/// `timeout`, defaulted: positive and shorter than `grace`, so a stop can let the run finish.
fn compile_timeout(timeout: Option<Dur>, grace: Duration, err: &mut Problems<'_>) -> Duration {
    let written = timeout.is_some();
    let timeout = timeout.map_or(DEFAULT_TIMEOUT, |d| d.0);
    if timeout.is_zero() {
        err.add("timeout", "must be positive".into());
    } else if timeout >= grace {
        err.add(
            "timeout",
            format!(
                "{}{} must be shorter than shutdown_grace ({}), so a stop can let the run finish",
                crate::units::fmt_duration(timeout),
                if written { "" } else { " (the default)" },
                crate::units::fmt_duration(grace)
            ),
        );
    }
    timeout
}

/// `max_retry`, `retry_base` and `retry_cap`, defaulted; the cap may not be below the base.
fn compile_retry(common: &TaskCommon, err: &mut Problems<'_>) -> RetryPolicy {
    let retry = RetryPolicy {
        max_retry: common.max_retry.unwrap_or(0),
        base: common.retry_base.map_or(DEFAULT_RETRY_BASE, |d| d.0),
        cap: common.retry_cap.map_or(DEFAULT_RETRY_CAP, |d| d.0),
    };
    if retry.base.is_zero() {
        err.add("retry_base", "must be positive".into());
    }
    if retry.cap < retry.base {
        err.add(
            "retry_cap",
            format!(
                "{} is shorter than retry_base ({})",
                crate::units::fmt_duration(retry.cap),
                crate::units::fmt_duration(retry.base)
            ),
        );
    }
    retry
}

/// What the task does, compiled by its type's own step.
fn compile_action(
    kind: TaskKind,
    task: &str,
    ctx: &TaskCtx<'_>,
    err: &mut Problems<'_>,
) -> Option<Action> {
    match kind {
        TaskKind::Exec(spec) => exec::compile_exec(spec, ctx, err).map(Action::Exec),
        TaskKind::FileMove(spec) => compile_file_move(spec, task, ctx, err).map(Action::FileMove),
        TaskKind::HttpScrape(spec) => compile_scrape(*spec, task, ctx, err).map(Action::HttpScrape),
        #[cfg(feature = "modbus")]
        TaskKind::Modbus(spec) => {
            modbus::compile_modbus(*spec, task, ctx, err).map(|m| Action::Modbus(Box::new(m)))
        }
    }
}

pub(super) fn compile_file_move(
    spec: FileMoveSpec,
    task: &str,
    ctx: &TaskCtx<'_>,
    err: &mut Problems<'_>,
) -> Option<FileMove> {
    let mut ok = true;
    let from = existing_dir(ctx.base, "from", &spec.from, err);
    let (to, ship) = compile_destination(&spec, task, ctx, err, &mut ok);
    if let (Some(f), Some(t)) = (&from, &to)
        && ship.is_none()
        && same_dir(f, t)
    {
        err.add(
            "to",
            format!("{} is the same directory as from", t.display()),
        );
        ok = false;
    }
    let pattern = file_globs("pattern", &spec.pattern, err, &mut ok);
    let exclude = file_globs("exclude", &spec.exclude, err, &mut ok);
    if spec.pattern.is_empty() {
        err.add(
            "pattern",
            "must list at least one glob, e.g. [\"*.csv\"]".into(),
        );
        ok = false;
    }
    let settle = spec.settle.map_or(DEFAULT_SETTLE, |d| d.0);
    if settle.is_zero() {
        err.add(
            "settle",
            "must be positive, so a file still being written is never taken".into(),
        );
        ok = false;
    }
    let max_files = spec.max_files.unwrap_or(DEFAULT_MAX_FILES);
    if max_files == 0 {
        err.add("max_files", "must be at least 1".into());
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

/// Directory setting `field` read from the config file's directory `base`; it must exist.
fn existing_dir(base: &Path, field: &str, text: &str, err: &mut Problems<'_>) -> Option<PathBuf> {
    if text.is_empty() {
        err.add(field, "must name a directory".into());
        return None;
    }
    let path = base.join(text);
    match std::fs::metadata(&path) {
        Err(e) => {
            err.add(field, format!("{}: {}", path.display(), io_reason(&e)));
            None
        }
        Ok(m) if !m.is_dir() => {
            err.add(field, format!("{} is not a directory", path.display()));
            None
        }
        Ok(_) => Some(path),
    }
}

/// Where the files go: the directory `to`, or with `to_stream` the task's spool and how its
/// files ship; exactly one of the two, each with only the settings that apply to it.
fn compile_destination(
    spec: &FileMoveSpec,
    task: &str,
    ctx: &TaskCtx<'_>,
    err: &mut Problems<'_>,
    ok: &mut bool,
) -> (Option<PathBuf>, Option<Ship>) {
    match (&spec.to, &spec.to_stream) {
        (Some(_), Some(_)) => {
            err.add("to_stream", "is instead of to; set one of them".into());
            (None, None)
        }
        (None, None) => {
            err.add(
                "",
                "needs to (a directory) or to_stream (a stream to ship the files through)".into(),
            );
            (None, None)
        }
        (Some(to), None) => {
            if spec.archive.is_some() {
                err.add("archive", "only applies to to_stream".into());
                *ok = false;
            }
            (existing_dir(ctx.base, "to", to, err), None)
        }
        (None, Some(stream)) => {
            if spec.on_conflict.is_some() {
                err.add(
                    "on_conflict",
                    "only applies to to; spooled files get unique names".into(),
                );
                *ok = false;
            }
            let ship = compile_ship(stream, spec.archive.as_deref(), task, ctx, err, ok);
            (Some(ship.spool_dir.clone()), Some(ship))
        }
    }
}

/// How a `to_stream` task ships: its spool under the data directory, its `archive`, and the
/// byte bound of its stream and the store.
fn compile_ship(
    stream: &str,
    archive: Option<&str>,
    task: &str,
    ctx: &TaskCtx<'_>,
    err: &mut Problems<'_>,
    ok: &mut bool,
) -> Ship {
    let max_bytes = match ctx.stream(stream) {
        Ok(s) => s.max_bytes.min(ctx.storage.max_bytes),
        Err(m) => {
            if let Some(m) = m {
                err.add("to_stream", m);
            }
            *ok = false;
            0
        }
    };
    let archive = archive.and_then(|a| {
        let d = existing_dir(ctx.base, "archive", a, err);
        if d.is_none() {
            *ok = false;
        }
        d
    });
    let spool_rel = crate::store::spool::task_dir(task);
    Ship {
        stream: stream.to_string(),
        spool_dir: ctx.data_dir.join(&spool_rel),
        spool_rel,
        archive,
        min_free: ctx.storage.min_free,
        max_bytes,
        recovered: Default::default(),
    }
}

/// Whether `from` and `to` are one directory: compared resolved when both resolve, as written
/// otherwise.
fn same_dir(from: &Path, to: &Path) -> bool {
    match (std::fs::canonicalize(from), std::fs::canonicalize(to)) {
        (Ok(a), Ok(b)) => a == b,
        _ => from == to,
    }
}

/// `list`, globs on a file name (no `/`), compiled; each bad one is reported as `field[i]`.
fn file_globs(
    field: &str,
    list: &[String],
    err: &mut Problems<'_>,
    ok: &mut bool,
) -> Vec<glob::Pattern> {
    let mut out = Vec::with_capacity(list.len());
    for (i, g) in list.iter().enumerate() {
        if g.is_empty() || g.contains('/') {
            err.add(
                &format!("{field}[{i}]"),
                format!("{g:?} must be a non-empty glob on the file name, without /"),
            );
            *ok = false;
            continue;
        }
        match glob::Pattern::new(g) {
            Ok(p) => out.push(p),
            Err(e) => {
                err.add(&format!("{field}[{i}]"), format!("{g:?}: {e}"));
                *ok = false;
            }
        }
    }
    out
}

pub(super) fn compile_scrape(
    spec: HttpScrapeSpec,
    task: &str,
    ctx: &TaskCtx<'_>,
    err: &mut Problems<'_>,
) -> Option<Scrape> {
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

/// The precision of the stream's sink, so timestamps mean what the write URL says.
fn scrape_precision(
    stream: &str,
    ctx: &TaskCtx<'_>,
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
        Ok(_) => match stream_format(ctx.streams, ctx.sinks, stream) {
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
    ctx: &TaskCtx<'_>,
    err: &mut Problems<'_>,
) -> bool {
    let carries = stream_format(ctx.streams, ctx.sinks, stream);
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
    let unit = match j.time_unit.unwrap_or(TimeUnitSpec::Ms) {
        TimeUnitSpec::S => TimeUnit::S,
        TimeUnitSpec::Ms => TimeUnit::Ms,
        TimeUnitSpec::Ns => TimeUnit::Ns,
        TimeUnitSpec::Rfc3339 => TimeUnit::Rfc3339,
    };
    JsonMapping {
        records: j.records,
        measurement: measurement.to_string(),
        fields: j.fields.into_iter().collect(),
        tags: j.tags.into_iter().collect(),
        time: j.time.map(|t| (t, unit)),
    }
}
