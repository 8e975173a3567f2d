//! The `sources:` section: each entry's name checked, its `type` split off, and the rest handed
//! to that kind's file shape through the sources' list (`source::compile_kind`), which gives the
//! compiled `source::Source` the agent runs. The kinds' shapes live beside them in `source/`.
//! Called by `config::compile`.

use std::path::Path;

use super::{Problems, named, split_type};
use crate::source::{Compile, SOURCE_TYPES, Source, compile_kind};

/// One `sources.<name>` entry: its name checked, its `type` read (one of the sources' list), its
/// settings read as that kind's and compiled.
pub(super) fn compile_entry(
    name: &str,
    value: serde_json::Value,
    base: &Path,
    data_dir: &Path,
    streams: &[&str],
    format: &dyn Fn(&str) -> crate::record::RecordFormat,
    problems: &mut Problems<'_>,
) -> Option<Source> {
    let (value, mut err) = named("sources", "source", name, value, problems);
    let (kind, rest) = split_type(value, SOURCE_TYPES, &mut err)?;
    let mut cx = Compile {
        name,
        base,
        data_dir,
        streams,
        format,
        err: &mut err,
    };
    compile_kind(&kind, rest, &mut cx)
}
