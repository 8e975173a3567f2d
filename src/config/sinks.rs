//! The `sinks:` section: each entry's name checked, its `type` split off, and the rest handed to
//! that kind's file shape through the sinks' list (`sink::compile_kind`), which gives the
//! `sink::SinkConfig` the delivery layer runs. The kinds' shapes live beside them in `sink/`; this
//! does not deliver anything (`sink` and `delivery` do) and does not know which streams use a sink
//! (`streams`). Called by `config::compile`.

use std::path::Path;

use serde_json::Value;

use super::{Problems, named, split_type};
use crate::sink::{Compile, SINK_TYPES, SinkConfig, compile_kind};

pub(super) fn compile_sink(
    name: String,
    value: Value,
    base: &Path,
    data_dir: &Path,
    problems: &mut Problems<'_>,
) -> Option<SinkConfig> {
    let (value, mut err) = named("sinks", "sink", &name, value, problems);
    let (kind, rest) = split_type(value, SINK_TYPES, &mut err)?;
    let mut cx = Compile::new(&name, base, data_dir, &mut err);
    let kind = compile_kind(&kind, rest, &mut cx)?;
    Some(cx.finish(kind))
}
