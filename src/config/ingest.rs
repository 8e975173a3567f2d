//! The `ingest:` section: its file shape and its compilation into [`crate::ingest::IngestConfig`].
//! Called by `config::compile`; the server itself is `crate::ingest`.

use schemars::JsonSchema;
use serde::Deserialize;

/// The local ingest API: programs on this machine POST records to streams over HTTP. Off unless
/// `listen` is set.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IngestSpec {
    /// Address to listen on, e.g. `127.0.0.1:8080`.
    #[serde(default)]
    pub listen: Option<String>,
}

/// Compiles the section; `None` when ingest is off. Problems go to `err(path, message)` with paths
/// relative to `ingest`.
pub fn compile(
    spec: IngestSpec,
    _streams: &[&str],
    err: &mut impl FnMut(&str, String),
) -> Option<crate::ingest::IngestConfig> {
    let listen = spec.listen?;
    match listen.parse() {
        Ok(addr) => Some(crate::ingest::IngestConfig { listen: addr }),
        Err(e) => {
            err("listen", format!("{listen:?} is not an address:port: {e}"));
            None
        }
    }
}
