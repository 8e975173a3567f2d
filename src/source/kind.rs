//! What a source kind's folder provides to the list in `source/mod.rs`, and the list's machinery.
//! A kind is a folder with its file shape (`config.rs`: the entry's `Spec`, implementing
//! [`KindSpec`]) and its compiled settings (implementing [`KindConfig`]: what it is called, where
//! its records go, how it runs); `source_kinds!` turns the list's one line per kind into the
//! closed enums (`SourceSpec` for the file's schema, `Source`), the kinds' counters
//! (`SourceStats`), the `type:` names, the refusal of a kind left out of the build, and the
//! dispatch. It knows no kind itself and no YAML: `config` hands it an entry as a JSON value.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::{Listen, Sockets};
use crate::shape::Problems;
use crate::store::writer::StoreHandle;

/// A source kind's file shape: its entry, read without the `type` field, and compiled.
pub trait KindSpec: serde::de::DeserializeOwned {
    type Config: KindConfig;

    /// The kind's settings; `None` when the entry cannot be used (its problems are reported in
    /// `cx.err`).
    fn compile(self, cx: &mut Compile<'_, '_>) -> Option<Self::Config>;
}

/// What the agent, `check` and the metrics page ask of a source kind's compiled settings.
pub trait Settings {
    /// The entry's name under `sources:`.
    fn name(&self) -> &str;

    /// The streams its records go to.
    fn streams(&self) -> Vec<&str>;

    /// For `colibri check`.
    fn describe(&self) -> String;

    /// The addresses it listens on (what `colibri check --bind` tries); most listen on none.
    fn listens(&self) -> Vec<Listen> {
        Vec::new()
    }

    /// True when its records are written in the format of its stream's sink (line protocol for a
    /// metrics stream); most write JSON objects, which `config` keeps out of a line-protocol
    /// stream.
    fn follows_sink_format(&self) -> bool {
        false
    }

    /// Binds its sockets now, so that a taken port stops colibri's start; most have none.
    fn bind(&self) -> anyhow::Result<Sockets> {
        Ok(Sockets::default())
    }
}

/// A source kind's compiled settings, which run it.
pub trait KindConfig: Settings + std::fmt::Debug + Send + Sync + 'static {
    /// Its counters, one set per source name (kept across restarts by `SourceStats`).
    type Stats: Default + Send + Sync + crate::counters::Declared;

    /// Runs the source until `stopping`, on `sockets` when bound.
    fn run(
        self: Arc<Self>,
        stats: Arc<Self::Stats>,
        store: StoreHandle,
        stopping: CancellationToken,
        sockets: Sockets,
    ) -> impl Future<Output = ()> + Send;
}

/// What a kind's [`KindSpec::compile`] works with: the entry's name and places, the streams the
/// file declares, and the reporter for its problems.
pub struct Compile<'a, 'p> {
    pub name: &'a str,
    /// The config file's directory: relative paths are read from it.
    pub base: &'a Path,
    pub data_dir: &'a Path,
    /// The names under `streams:`.
    pub streams: &'a [&'a str],
    /// What a stream's records must be: its sink's format.
    pub format: &'a dyn Fn(&str) -> crate::record::RecordFormat,
    pub err: &'a mut Problems<'p>,
}

/// The closed set of source kinds from one line per kind: `Variant(module) = "type";`, with the
/// kind's documentation (the schema's description of the type) above it and, for a kind behind a
/// cargo feature, `#[feature = "name"]`. The module holds `Spec` (its [`KindSpec`]); its counters
/// are `SourceStats`' field of the module's name.
macro_rules! source_kinds {
    ($(
        $(#[doc = $doc:literal])*
        $(#[feature = $feature:literal])?
        $variant:ident($module:ident) = $type:literal;
    )+) => {
        /// Something that produces records for a stream on its own.
        // Read by `compile_kind` through the variant's own struct, so a problem inside an entry
        // keeps its field path; the enum is the file's shape for the schema.
        #[derive(Debug, serde::Deserialize)]
        #[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
        #[serde(tag = "type", deny_unknown_fields)]
        pub enum SourceSpec {
            $(
                $(#[doc = $doc])*
                $(#[cfg(feature = $feature)])?
                #[serde(rename = $type)]
                $variant(Box<$module::Spec>),
            )+
        }

        /// Every `type:` a source entry may name, built into this binary or not.
        pub const SOURCE_TYPES: &[&str] = &[$($type),+];

        /// A compiled `sources:` entry.
        #[derive(Debug, Clone)]
        pub enum Source {
            $(
                $(#[cfg(feature = $feature)])?
                $variant(Arc<<$module::Spec as $crate::source::kind::KindSpec>::Config>),
            )+
        }

        /// Every source's counters, by kind and name (kept by the agent, read by the metrics
        /// page): a source restarted by a reload, or removed and added again, goes on counting
        /// into the same ones.
        #[derive(Default)]
        pub struct SourceStats {
            $(
                $(#[cfg(feature = $feature)])?
                pub $module: $crate::metrics::Registry<
                    <<$module::Spec as $crate::source::kind::KindSpec>::Config
                        as $crate::source::kind::KindConfig>::Stats,
                >,
            )+
        }

        impl SourceStats {
            /// Every kind's counter families (as the kind declares them with `counters!`), a
            /// sample per source.
            pub fn write_metrics(&self, t: &mut $crate::metrics::Text) {
                use $crate::counters::Declared;
                $(
                    $(#[cfg(feature = $feature)])?
                    {
                        let all = self.$module.all();
                        let items: Vec<_> = all.iter().map(|(n, s)| (n.as_str(), &**s)).collect();
                        $crate::counters::write(t, "source", &items, Declared::FAMILIES);
                    }
                )+
            }
        }

        /// The entry of source kind `kind` (its `type`, one of [`SOURCE_TYPES`]; `rest` the
        /// entry without it) read and compiled; problems reported in `cx.err`.
        pub fn compile_kind(
            kind: &str,
            rest: serde_json::Value,
            cx: &mut $crate::source::kind::Compile<'_, '_>,
        ) -> Option<Source> {
            use $crate::source::kind::KindSpec as _;
            match kind {
                $(
                    $(#[cfg(feature = $feature)])?
                    $type => {
                        let spec: $module::Spec = $crate::shape::de_all(rest, cx.err)?;
                        spec.compile(cx).map(|c| Source::$variant(Arc::new(c)))
                    }
                    $(
                        #[cfg(not(feature = $feature))]
                        $type => {
                            let _ = rest;
                            $crate::shape::built_without(cx.err, "source", $type, $feature);
                            None
                        }
                    )?
                )+
                // `config` lets only the list's types through (`split_type`); a caller that does not still
                // gets a problem rather than a panic.
                other => {
                    cx.err.add("type", format!("unknown source type {other:?}"));
                    None
                }
            }
        }

        impl Source {
            /// The kind's settings, as the agent, `check` and the metrics page ask of them.
            pub fn settings(&self) -> &dyn $crate::source::kind::Settings {
                match self {
                    $( $(#[cfg(feature = $feature)])? Source::$variant(c) => &**c, )+
                }
            }

            /// The kind, as `type:` names it.
            pub fn kind(&self) -> &'static str {
                match self {
                    $( $(#[cfg(feature = $feature)])? Source::$variant(_) => $type, )+
                }
            }

            /// Runs the source until `stopping` (the agent's task for it), on `sockets` when
            /// bound, counting into its kind's counters of its name.
            pub async fn run(
                self,
                stats: &SourceStats,
                store: StoreHandle,
                stopping: CancellationToken,
                sockets: Sockets,
            ) {
                use $crate::source::kind::{KindConfig as _, Settings as _};
                match self {
                    $(
                        $(#[cfg(feature = $feature)])?
                        Source::$variant(c) => {
                            let stats = stats.$module.get(c.name());
                            c.run(stats, store, stopping, sockets).await
                        }
                    )+
                }
            }
        }
    };
}
