//! The `sources:` section: its file shape (a closed set chosen by `type:`, today `tail`) and its
//! compilation into [`crate::tail::TailConfig`]. Called by `config::compile`; the sources themselves
//! live in `crate::tail`.

use std::path::Path;

use schemars::JsonSchema;
use serde::Deserialize;

/// Something that produces records for a stream on its own.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum SourceSpec {
    /// Follows log files.
    Tail(Box<TailSpec>),
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TailSpec {
    /// The stream the lines go to.
    pub stream: String,
    /// Glob patterns of the files to follow.
    pub paths: Vec<String>,
}

/// Compiles one source; problems go to `err(path, message)` with paths relative to the source.
pub fn compile(
    name: &str,
    spec: SourceSpec,
    base: &Path,
    streams: &[&str],
    err: &mut impl FnMut(&str, String),
) -> Option<crate::tail::TailConfig> {
    let SourceSpec::Tail(spec) = spec;
    if !streams.contains(&spec.stream.as_str()) {
        err(
            "stream",
            format!("stream {:?} is not defined under streams:", spec.stream),
        );
    }
    let _ = base;
    Some(crate::tail::TailConfig {
        name: name.to_string(),
        stream: spec.stream,
        paths: spec.paths,
    })
}
