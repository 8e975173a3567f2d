//! The `storage:` section: the disk budget every stream shares, as written in the file and as the
//! store's `StorageConfig`. It does not enforce the budget (the store does). Called by
//! `config::compile`.

use super::Problems;
use serde::Deserialize;

use super::units::Size;
use crate::store::StorageConfig;

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

/// The budget, with its defaults (2GiB of jobs, 256MiB kept free).
pub(super) fn compile(spec: &StorageSpec, err: &mut Problems<'_>) -> StorageConfig {
    let storage = StorageConfig {
        max_bytes: spec.max_bytes.map_or(2 << 30, |s| s.0),
        min_free: spec.min_free.map_or(256 << 20, |s| s.0),
    };
    if storage.max_bytes == 0 {
        err.add("storage.max_bytes", "must be positive".into());
    }
    storage
}
