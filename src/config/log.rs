//! The `log:` section: level, format and the optional log file with its rotation, and
//! `compile_log`, which resolves and checks the file. It does not log (`logging` does, with the
//! values read here). Called by `config::compile`.

use super::Problems;
use std::path::Path;

use serde::Deserialize;

use super::io_reason;
#[cfg(feature = "schema")]
use super::units::u32_schema;
use super::units::{self, Size};
use crate::logging::{LogFile, LogFormat, LogLevel};

/// Logging settings.
#[derive(Debug, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct LogSpec {
    /// The least severe level written.
    #[serde(default)]
    pub level: LogLevel,
    /// `text` for people at a terminal, `json` (one object per line) for machines.
    #[serde(default)]
    pub format: LogFormat,
    /// Write events to this file instead of stderr, for machines without journald. The directory
    /// must exist: colibri does not create it. The file is created with mode 0640 and appended to.
    /// Relative paths are read from the config file's directory.
    #[serde(default)]
    pub file: Option<String>,
    /// With `file`: rotate when the next event would take the file past this size (at least
    /// 64KiB). Default 50MiB.
    #[serde(default)]
    pub max_size: Option<Size>,
    /// With `file`: rotated files kept, `<file>.1` the newest to `<file>.<max_files>` the oldest;
    /// older ones are deleted. Default 10.
    #[serde(default, deserialize_with = "units::de_opt_u32")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "u32_schema"))]
    pub max_files: Option<u32>,
}

const DEFAULT_LOG_MAX_SIZE: u64 = 50 << 20;
const MIN_LOG_MAX_SIZE: u64 = 64 << 10;
const DEFAULT_LOG_MAX_FILES: u32 = 10;

/// `log.file` and its rotation; `None` when events go to stderr.
pub(super) fn compile_log(spec: &LogSpec, base: &Path, err: &mut Problems<'_>) -> Option<LogFile> {
    let Some(file) = &spec.file else {
        for (key, set) in [
            ("log.max_size", spec.max_size.is_some()),
            ("log.max_files", spec.max_files.is_some()),
        ] {
            if set {
                err.add(
                    key,
                    "only applies with log.file (without it events go to stderr)".into(),
                );
            }
        }
        return None;
    };
    let max_size = spec.max_size.map_or(DEFAULT_LOG_MAX_SIZE, |s| s.0);
    let max_files = spec.max_files.unwrap_or(DEFAULT_LOG_MAX_FILES);
    if max_size < MIN_LOG_MAX_SIZE {
        err.add("log.max_size", "must be at least 64KiB".into());
    }
    if max_files == 0 {
        err.add("log.max_files", "must be at least 1".into());
    }
    if file.trim().is_empty() {
        err.add("log.file", "must name a file".into());
        return None;
    }
    let path = base.join(file);
    // The directory must be there already, as for every other path: a missing one usually means
    // an unmounted disk, which should not be filled from the root filesystem.
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    match std::fs::metadata(dir) {
        Err(e) => err.add(
            "log.file",
            format!(
                "directory {}: {} (colibri does not create it)",
                dir.display(),
                io_reason(&e)
            ),
        ),
        Ok(m) if !m.is_dir() => {
            err.add("log.file", format!("{} is not a directory", dir.display()))
        }
        Ok(_) => {
            if path.is_dir() {
                err.add("log.file", format!("{} is a directory", path.display()));
            }
        }
    }
    Some(LogFile {
        path,
        max_size,
        max_files,
    })
}
