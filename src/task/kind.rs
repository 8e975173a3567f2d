//! What a task handler's folder provides to the list in `task/mod.rs`, and the list's machinery. A
//! handler is a folder with its file shape (`config.rs`: the entry's `Spec` beside the common task
//! fields, implementing [`KindSpec`]) and its compiled handler (implementing [`Handler`]: what it
//! needs, how it runs); `task_kinds!` turns the list's one line per handler into the closed enums
//! (`TaskKind` for the file's schema, `Action`), the `type:` names, the refusal of a handler left
//! out of the build, and the dispatch. It knows no handler itself and no YAML: `config` hands it
//! the entry's own fields as a JSON value.

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{Attempt, Needs, RunContext};
use crate::record::RecordFormat;
use crate::shape::Problems;
use crate::store::{StorageConfig, StreamConfig};

/// A handler's file shape: the entry's own fields (the common ones split off), compiled.
pub trait KindSpec: serde::de::DeserializeOwned {
    type Handler: Handler;

    /// The handler; `None` when the entry cannot be used (its problems are reported in `err`,
    /// paths relative to the task).
    fn compile(self, cx: &Compile<'_>, err: &mut Problems<'_>) -> Option<Self::Handler>;
}

/// What the scheduler, a reload and the metrics page ask of a compiled handler.
pub trait Settings {
    /// Whether it samples an endpoint into a stream (its records are stamped with the run's time).
    fn is_scrape(&self) -> bool {
        false
    }

    /// Whether it samples values by exception (a `deadband` or `heartbeat`).
    fn by_exception(&self) -> bool {
        false
    }

    /// What a run needs from its surroundings (a stream, a spool, the sink's settings).
    fn needs(&self) -> Needs<'_>;

    /// What a run that took longer than `timeout` says.
    fn timed_out(&self, timeout: Duration) -> String {
        format!("timed out after {}", crate::units::fmt_duration(timeout))
    }
}

/// A compiled handler: one attempt of a run.
pub trait Handler: Settings + std::fmt::Debug + Send + Sync {
    /// One attempt of the run of task `task` due at `due`, within `timeout`.
    fn run(
        &self,
        task: &str,
        due: DateTime<Utc>,
        timeout: Duration,
        ctx: &RunContext,
    ) -> impl Future<Output = Attempt> + Send;
}

/// What a handler's [`KindSpec::compile`] works with: the task's name, the places and streams of
/// the file.
pub struct Compile<'a> {
    pub task: &'a str,
    /// The config file's directory: relative paths are read from it.
    pub base: &'a Path,
    pub data_dir: &'a Path,
    /// The streams that compiled.
    pub streams: &'a [StreamConfig],
    /// Every stream the file names, including those with problems of their own.
    pub declared_streams: &'a [String],
    /// What a stream's records must be: its sink's format.
    pub format: &'a dyn Fn(&str) -> RecordFormat,
    pub storage: &'a StorageConfig,
}

impl Compile<'_> {
    /// What the records of `stream` must be: its sink's format.
    pub fn format(&self, stream: &str) -> RecordFormat {
        (self.format)(stream)
    }

    /// The stream `name`. `Err(None)`: it is declared but has problems of its own, already
    /// reported; `Err(Some(..))`: it is not defined.
    pub fn stream(&self, name: &str) -> Result<&StreamConfig, Option<String>> {
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

/// The closed set of task handlers from one line per handler: `Variant(module) = "type";`, with
/// the handler's documentation (the schema's description of the type) above it and, for one
/// behind a cargo feature, `#[feature = "name"]`. The module holds `Spec` (its [`KindSpec`]).
macro_rules! task_kinds {
    ($(
        $(#[doc = $doc:literal])*
        $(#[feature = $feature:literal])?
        $variant:ident($module:ident) = $type:literal;
    )+) => {
        /// The task types. A closed set: each variant is a handler in `task::`.
        #[derive(Debug, serde::Deserialize)]
        #[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
        #[serde(tag = "type")]
        pub enum TaskKind {
            $(
                $(#[doc = $doc])*
                $(#[cfg(feature = $feature)])?
                #[serde(rename = $type)]
                $variant(Box<$module::Spec>),
            )+
        }

        /// Every `type:` a task may name, built into this binary or not.
        pub const TASK_TYPES: &[&str] = &[$($type),+];

        /// A task's compiled handler.
        #[derive(Debug)]
        pub enum Action {
            $(
                $(#[cfg(feature = $feature)])?
                $variant(Box<<$module::Spec as $crate::task::kind::KindSpec>::Handler>),
            )+
        }

        /// The entry's own fields for handler `kind` (its `type`, one of [`TASK_TYPES`]) read;
        /// problems reported in `err`.
        pub fn read_kind(
            kind: &str,
            rest: serde_json::Value,
            err: &mut $crate::shape::Problems<'_>,
        ) -> Option<TaskKind> {
            match kind {
                $(
                    $(#[cfg(feature = $feature)])?
                    $type => $crate::shape::de_all(rest, err).map(TaskKind::$variant),
                    $(
                        #[cfg(not(feature = $feature))]
                        $type => {
                            let _ = rest;
                            $crate::shape::built_without(err, "task", $type, $feature);
                            None
                        }
                    )?
                )+
                // `config` lets only the list's types through (`kind_of`); a caller that does not still
                // gets a problem rather than a panic.
                other => {
                    err.add("type", format!("unknown type {other:?}"));
                    None
                }
            }
        }

        impl TaskKind {
            /// The handler, checked against the rest of the file (`cx`); problems reported in
            /// `err`.
            pub fn compile(
                self,
                cx: &$crate::task::kind::Compile<'_>,
                err: &mut $crate::shape::Problems<'_>,
            ) -> Option<Action> {
                use $crate::task::kind::KindSpec as _;
                match self {
                    $(
                        $(#[cfg(feature = $feature)])?
                        TaskKind::$variant(spec) => {
                            spec.compile(cx, err).map(|h| Action::$variant(Box::new(h)))
                        }
                    )+
                }
            }
        }

        impl Action {
            /// The handler, as the scheduler, reloads and the metrics page ask of it.
            pub fn settings(&self) -> &dyn $crate::task::kind::Settings {
                match self {
                    $( $(#[cfg(feature = $feature)])? Action::$variant(h) => &**h, )+
                }
            }

            /// The handler's type, as `type:` names it.
            pub fn kind(&self) -> &'static str {
                match self {
                    $( $(#[cfg(feature = $feature)])? Action::$variant(_) => $type, )+
                }
            }

            /// One attempt of the run of task `task` due at `due`, within `timeout`.
            async fn attempt(
                &self,
                task: &str,
                due: DateTime<Utc>,
                timeout: Duration,
                ctx: &RunContext,
            ) -> Attempt {
                match self {
                    $(
                        $(#[cfg(feature = $feature)])?
                        Action::$variant(h) => {
                            $crate::task::kind::Handler::run(&**h, task, due, timeout, ctx).await
                        }
                    )+
                }
            }
        }
    };
}
