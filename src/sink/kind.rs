//! What a sink kind's folder provides to the list in `sink/mod.rs`, and the list's machinery. A
//! kind is a folder with its file shape (`config.rs`: the entry's `Spec`, implementing
//! [`KindSpec`]), its compiled settings (implementing [`KindConfig`]) and its built sink
//! (implementing `Deliver`); `sink_kinds!` turns the list's one line per kind into the closed enums
//! (`SinkSpec` for the file's schema, `SinkKind`, `Built`), the `type:` names, the refusal of a kind
//! left out of the build, and the dispatch from each enum to the kind. It knows no kind itself and
//! no YAML: `config` hands it an entry as a JSON value ([`Compile`] is what a kind compiles with).

use std::path::Path;
use std::time::Duration;

use super::config::RetrySpec;
use super::{Deliver, LinkConfig, SinkConfig, SinkRetry};
use crate::record::RecordFormat;
use crate::setting::SettingError;
use crate::shape::Problems;

/// A sink kind's file shape: its entry, read without the `type` field, and compiled.
pub trait KindSpec: serde::de::DeserializeOwned {
    type Config: KindConfig;

    /// The kind's settings, with what every sink has set in `cx`; `None` when the entry cannot
    /// be used (its problems are reported in `cx.err`).
    fn compile(self, cx: &mut Compile<'_, '_>) -> Option<Self::Config>;
}

/// What a stream, a log line and a reload ask of a kind's compiled settings.
pub trait Settings {
    /// For logs: the sink's type and target (never header values, no credentials).
    fn describe(&self, name: &str) -> String;

    /// What the records of a stream delivered here must be.
    fn record_format(&self) -> RecordFormat {
        RecordFormat::Lines
    }

    /// Whether a job stored as a zstd frame of lines is sent as it is (so its streams store every
    /// job compressed under `compression: auto`).
    fn sends_zstd_lines(&self) -> bool {
        false
    }

    /// Whether several small jobs may go out in one request (a [`super::Batch`] of a group),
    /// under the group's key: a sink whose key travels beside the records (a header), not in
    /// each message.
    fn sends_groups(&self) -> bool {
        false
    }
}

/// A sink kind's compiled settings, which build its sink.
pub trait KindConfig: Settings {
    type Built: Deliver;

    /// The kind's sink, built with the settings every sink has (`sink`). Reads what the kind
    /// reads at start (TLS files, credentials); errors name the setting.
    fn build(&self, sink: &SinkConfig) -> Result<Self::Built, SettingError>;
}

/// The longest a request may take unless the entry says (`timeout`).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// What a kind's [`KindSpec::compile`] works with: the entry's name and places, the reporter for
/// its problems, and the settings every sink has, which the kind sets from its entry (those it
/// does not have keep their defaults).
pub struct Compile<'a, 'p> {
    pub name: &'a str,
    /// The config file's directory: relative paths are read from it.
    pub base: &'a Path,
    pub data_dir: &'a Path,
    pub err: &'a mut Problems<'p>,
    pub link: LinkConfig,
    /// Checked after the kind's own settings (`finish`), so its problems come last.
    pub retry: RetrySpec,
    pub timeout: Duration,
    pub concurrency: usize,
    pub replay_rate: Option<u64>,
}

impl<'a, 'p> Compile<'a, 'p> {
    pub fn new(
        name: &'a str,
        base: &'a Path,
        data_dir: &'a Path,
        err: &'a mut Problems<'p>,
    ) -> Self {
        Compile {
            name,
            base,
            data_dir,
            err,
            link: LinkConfig::default(),
            retry: RetrySpec::default(),
            timeout: DEFAULT_TIMEOUT,
            concurrency: 1,
            replay_rate: None,
        }
    }

    /// `timeout` (default 10s), `concurrency` (1-64, default 1) and `replay_rate` checked and set.
    pub fn limits(
        &mut self,
        timeout: Option<crate::shape::units::Dur>,
        concurrency: Option<u32>,
        replay_rate: Option<crate::shape::units::Size>,
    ) {
        self.timeout = timeout.map_or(DEFAULT_TIMEOUT, |d| d.0);
        if self.timeout.is_zero() {
            self.err.add("timeout", "must be positive".into());
        }
        let concurrency = concurrency.unwrap_or(1);
        if !(1..=64).contains(&concurrency) {
            self.err.add(
                "concurrency",
                format!("must be between 1 and 64, not {concurrency}"),
            );
        }
        self.concurrency = concurrency.clamp(1, 64) as usize;
        if replay_rate.is_some_and(|r| r.0 == 0) {
            self.err.add(
                "replay_rate",
                "must be positive (leave it out for unlimited)".into(),
            );
        }
        self.replay_rate = replay_rate.map(|r| r.0);
    }

    /// The entry compiled: `kind` with the settings every sink has, `retry` checked last.
    pub fn finish(self, kind: super::SinkKind) -> SinkConfig {
        let spec = self.retry;
        let retry = SinkRetry {
            base: spec.base.map_or(Duration::from_secs(1), |d| d.0),
            cap: spec.cap.map_or(Duration::from_secs(300), |d| d.0),
            max_attempts: spec.max_attempts.unwrap_or(8),
        };
        if retry.base.is_zero() {
            self.err.add("retry.base", "must be positive".into());
        }
        if retry.cap < retry.base {
            self.err
                .add("retry.cap", "must not be shorter than retry.base".into());
        }
        if retry.max_attempts == 0 {
            self.err
                .add("retry.max_attempts", "must be at least 1".into());
        }
        SinkConfig {
            name: self.name.to_string(),
            kind,
            retry,
            link: self.link,
            timeout: self.timeout,
            concurrency: self.concurrency,
            replay_rate: self.replay_rate,
        }
    }
}

/// The closed set of sink kinds from one line per kind: `Variant(module) = "type";`, with the
/// kind's documentation (the schema's description of the type) above it and, for a kind behind a
/// cargo feature, `#[feature = "name"]`. The module holds `Spec` (its [`KindSpec`]).
macro_rules! sink_kinds {
    ($(
        $(#[doc = $doc:literal])*
        $(#[feature = $feature:literal])?
        $variant:ident($($module:ident)::+) = $type:literal;
    )+) => {
        /// A destination for a stream's jobs.
        // Read by `compile_kind` through the variant's own struct (`config::split_type`), so a
        // problem inside an entry keeps its field path; the enum is the file's shape for the schema.
        #[derive(Debug, serde::Deserialize)]
        #[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
        #[serde(tag = "type")]
        pub enum SinkSpec {
            $(
                $(#[doc = $doc])*
                $(#[cfg(feature = $feature)])?
                #[serde(rename = $type)]
                $variant(Box<$($module)::+::Spec>),
            )+
        }

        /// Every `type:` a sink entry may name, built into this binary or not.
        pub const SINK_TYPES: &[&str] = &[$($type),+];

        /// Each kind's own compiled settings (its folder says what they mean).
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum SinkKind {
            $(
                $(#[cfg(feature = $feature)])?
                $variant(Box<<$($module)::+::Spec as $crate::sink::kind::KindSpec>::Config>),
            )+
        }

        /// The built sink of each kind.
        enum Built {
            $(
                $(#[cfg(feature = $feature)])?
                $variant(Box<<<$($module)::+::Spec as $crate::sink::kind::KindSpec>::Config
                    as $crate::sink::kind::KindConfig>::Built>),
            )+
        }

        /// The entry of sink kind `kind` (its `type`, one of [`SINK_TYPES`]; `rest` the entry
        /// without it) read and compiled; problems reported in `cx.err`.
        pub fn compile_kind(
            kind: &str,
            rest: serde_json::Value,
            cx: &mut $crate::sink::kind::Compile<'_, '_>,
        ) -> Option<SinkKind> {
            use $crate::sink::kind::KindSpec as _;
            match kind {
                $(
                    $(#[cfg(feature = $feature)])?
                    $type => {
                        let spec: $($module)::+::Spec = $crate::shape::de_all(rest, cx.err)?;
                        spec.compile(cx).map(|c| SinkKind::$variant(Box::new(c)))
                    }
                    $(
                        #[cfg(not(feature = $feature))]
                        $type => {
                            let _ = rest;
                            $crate::shape::built_without(cx.err, "sink", $type, $feature);
                            None
                        }
                    )?
                )+
                // `config` lets only the list's types through (`split_type`); a caller that does not still
                // gets a problem rather than a panic.
                other => {
                    cx.err.add("type", format!("unknown sink type {other:?}"));
                    None
                }
            }
        }

        impl SinkKind {
            /// The kind's settings, as streams, logs and reloads ask of them.
            pub fn settings(&self) -> &dyn $crate::sink::kind::Settings {
                match self {
                    $( $(#[cfg(feature = $feature)])? SinkKind::$variant(c) => &**c, )+
                }
            }

            fn build(&self, sink: &SinkConfig) -> Result<Built, SettingError> {
                use $crate::sink::kind::KindConfig as _;
                Ok(match self {
                    $(
                        $(#[cfg(feature = $feature)])?
                        SinkKind::$variant(c) => Built::$variant(Box::new(c.build(sink)?)),
                    )+
                })
            }
        }

        impl Built {
            fn start(&self) {
                match self {
                    $( $(#[cfg(feature = $feature)])? Built::$variant(s) => s.start(), )+
                }
            }

            async fn body(&self, batch: &Batch<'_>) -> Result<Vec<u8>, DeliveryError> {
                match self {
                    $( $(#[cfg(feature = $feature)])? Built::$variant(s) => s.body(batch).await, )+
                }
            }

            async fn send(&self, batch: &Batch<'_>, body: Vec<u8>) -> Result<(), DeliveryError> {
                match self {
                    $( $(#[cfg(feature = $feature)])? Built::$variant(s) => s.send(batch, body).await, )+
                }
            }

            async fn send_file(&self, batch: &Batch<'_>, file: &FileJob) -> Result<(), DeliveryError> {
                match self {
                    $( $(#[cfg(feature = $feature)])? Built::$variant(s) => s.send_file(batch, file).await, )+
                }
            }

            async fn probe(&self, how: &Probe) -> Result<(), String> {
                match self {
                    $( $(#[cfg(feature = $feature)])? Built::$variant(s) => s.probe(how).await, )+
                }
            }
        }
    };
}
