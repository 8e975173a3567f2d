//! The `tasks:` section: the fields every task has (`TaskCommon`: name, schedule, timeout,
//! retries) and `compile_task`, which splits them from the type's own, checks them against the
//! rest of the file (shutdown grace) and hands the type's own fields to its file shape through the
//! tasks' list (`task::read_kind`, `TaskKind::compile`, beside each handler in `task/`), building
//! the `task::TaskDef` the scheduler runs. It does not run tasks (`task` and `scheduler` do).
//! Called by `config::compile`.

use std::time::Duration;

#[cfg(feature = "schema")]
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

#[cfg(feature = "schema")]
use super::units::u32_schema;
use super::units::{self, Dur};
use super::{Problems, de_all, valid_name};

use crate::schedule::{self, Offset, Schedule, Zone};
use crate::task::{RetryPolicy, TASK_TYPES, TaskDef, TaskKind, read_kind};

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

/// What a task's checks need from the rest of the file: the shutdown grace its timeout must stay
/// under, and what its type's own checks get (`task` set per entry).
pub(super) struct TaskCtx<'a> {
    pub(super) grace: Duration,
    pub(super) file: crate::task::Compile<'a>,
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
    let (common_map, mut kind_map): (serde_json::Map<_, _>, serde_json::Map<_, _>) = map
        .into_iter()
        .partition(|(k, _)| COMMON_KEYS.contains(&k.as_str()));
    let kind_name = kind_of(kind_map.remove("type"), &mut err);
    // A schedule written but refused is reported at its field: "needs a schedule" would be noise.
    let timed = common_map.contains_key("schedule") || common_map.contains_key("every");
    let common: Option<TaskCommon> = de_all(Value::Object(common_map), &mut err);
    // The type's own struct, so a problem inside it keeps its field (see `split_type`).
    let kind = kind_name.and_then(|k| read_kind(&k, Value::Object(kind_map), &mut err));
    let common = common?;
    if !valid_name(&common.name) {
        err.add(
            "name",
            format!("{:?} must be 1-64 letters, digits, -, _ or .", common.name),
        );
    }
    let schedule = schedule(&common, timed, &mut err);
    let timeout = timeout(&common, ctx.grace, &mut err);
    let retry = retry(&common, &mut err);
    let cx = crate::task::Compile {
        task: &common.name,
        ..ctx.file
    };
    let action = kind?.compile(&cx, &mut err);
    Some(TaskDef {
        name: common.name,
        schedule: schedule?,
        timeout,
        retry,
        action: action?,
    })
}

/// The task's `type`, one of the tasks' list; `None` (reported) when missing or unknown.
fn kind_of(kind: Option<Value>, err: &mut Problems<'_>) -> Option<String> {
    let one_of = TASK_TYPES.join(", ");
    match kind {
        None => {
            err.add("", format!("missing field `type` (one of: {one_of})"));
            None
        }
        Some(Value::String(t)) if !TASK_TYPES.contains(&t.as_str()) => {
            err.add("type", format!("unknown type {t:?} (one of: {one_of})"));
            None
        }
        Some(Value::String(t)) => Some(t),
        Some(other) => {
            err.add("type", format!("expected one of: {one_of}, found {other}"));
            None
        }
    }
}

/// `schedule` (a crontab expression in `tz`) or `every` (an interval with its `offset`); `timed`:
/// one of them was written, so a missing one is not reported again.
fn schedule(common: &TaskCommon, timed: bool, err: &mut Problems<'_>) -> Option<Schedule> {
    let zone = match &common.tz {
        None => Zone::Local,
        Some(tz) => match crate::zone::NamedZone::load(tz) {
            Ok(z) => Zone::Named(z),
            Err(m) => {
                err.add("tz", m);
                Zone::Local
            }
        },
    };
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

/// `timeout` (default 10s), shorter than `shutdown_grace` so a stop can let the run finish.
fn timeout(common: &TaskCommon, grace: Duration, err: &mut Problems<'_>) -> Duration {
    let timeout = common.timeout.map_or(DEFAULT_TIMEOUT, |d| d.0);
    if timeout.is_zero() {
        err.add("timeout", "must be positive".into());
    } else if timeout >= grace {
        err.add(
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
    timeout
}

/// `max_retry`, `retry_base` and `retry_cap`.
fn retry(common: &TaskCommon, err: &mut Problems<'_>) -> RetryPolicy {
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
