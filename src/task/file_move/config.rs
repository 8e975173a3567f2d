//! The `type: file_move` task entry: its file shape ([`FileMoveSpec`]) and its compilation into
//! [`FileMove`]: the directories checked, the settle time, the patterns, what a name taken in the
//! destination means, and with `to_stream` the spool and its bounds. It moves nothing. Called
//! through the tasks' list (`task::read_kind`, `TaskKind::compile`) for `type: file_move`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::{FileMove, OnConflict, Ship};
#[cfg(feature = "schema")]
use crate::shape::units::u32_schema;
use crate::shape::units::{self, Dur};
use crate::shape::{Problems, io_reason};
use crate::task::kind::{Compile, KindSpec};

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct FileMoveSpec {
    /// The directory files are taken from (not recursive). Must exist when the config is loaded.
    /// Relative paths are read from the config file's directory.
    pub from: String,
    /// Globs on the file name (`*.csv`, `scan-??.pdf`); a file matching any of them is taken. A name
    /// starting with `.` only matches a pattern that starts with `.`, so writers' hidden temporary
    /// files are left alone.
    pub pattern: Vec<String>,
    /// Globs on the file name that are never taken, even when `pattern` matches.
    #[serde(default)]
    pub exclude: Vec<String>,
    /// The directory files are moved into. Must exist when the config is loaded and differ from
    /// `from`. Relative paths are read from the config file's directory. Either this or
    /// `to_stream`.
    #[serde(default)]
    pub to: Option<String>,
    /// Instead of `to`: ship each file upstream through this stream. The file is moved into the
    /// data directory's spool (`spool/<task>/`, counted in the stream's and the store's byte
    /// bounds) and queued as one job; its sink uploads it whole as the request body, streamed from
    /// disk, with its name in `Content-Disposition`. After delivery it is deleted, or moved to
    /// `archive`. A full stream leaves files in `from`.
    #[serde(default)]
    pub to_stream: Option<String>,
    /// With `to_stream`: delivered files are moved into this directory (a name already there gets
    /// a number) instead of being deleted. Must exist when the config is loaded.
    #[serde(default)]
    pub archive: Option<String>,
    /// Only files whose modification time is at least this old are moved, so a file still being
    /// written is never taken. Default 30s.
    #[serde(default)]
    pub settle: Option<Dur>,
    /// When the name already exists in `to` (not used with `to_stream`): `rename` (default) moves the file as `name.1.ext`,
    /// `name.2.ext`, ...; `overwrite` replaces the existing file; `skip` leaves the file in `from`.
    #[serde(default)]
    pub on_conflict: Option<OnConflict>,
    /// At most this many files per run (oldest first); the rest wait for the next run. Default 1000.
    #[serde(default, deserialize_with = "units::de_opt_u32")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "u32_schema"))]
    pub max_files: Option<u32>,
}

const DEFAULT_SETTLE: Duration = Duration::from_secs(30);
const DEFAULT_MAX_FILES: u32 = 1000;

impl KindSpec for FileMoveSpec {
    type Handler = FileMove;

    fn compile(self, cx: &Compile<'_>, err: &mut Problems<'_>) -> Option<FileMove> {
        compile_file_move(self, cx, err)
    }
}

fn compile_file_move(
    spec: FileMoveSpec,
    ctx: &Compile<'_>,
    err: &mut Problems<'_>,
) -> Option<FileMove> {
    let task = ctx.task;
    let mut ok = true;
    let from = existing_dir(ctx.base, "from", &spec.from, err);
    let (to, ship) = compile_destination(&spec, task, ctx, err, &mut ok);
    if let (Some(f), Some(t)) = (&from, &to)
        && ship.is_none()
        && same_dir(f, t)
    {
        err.add(
            "to",
            format!("{} is the same directory as from", t.display()),
        );
        ok = false;
    }
    let pattern = file_globs("pattern", &spec.pattern, err, &mut ok);
    let exclude = file_globs("exclude", &spec.exclude, err, &mut ok);
    if spec.pattern.is_empty() {
        err.add(
            "pattern",
            "must list at least one glob, e.g. [\"*.csv\"]".into(),
        );
        ok = false;
    }
    let settle = spec.settle.map_or(DEFAULT_SETTLE, |d| d.0);
    if settle.is_zero() {
        err.add(
            "settle",
            "must be positive, so a file still being written is never taken".into(),
        );
        ok = false;
    }
    let max_files = spec.max_files.unwrap_or(DEFAULT_MAX_FILES);
    if max_files == 0 {
        err.add("max_files", "must be at least 1".into());
        ok = false;
    }
    let on_conflict = spec.on_conflict.unwrap_or_default();
    let (from, to) = (from?, to?);
    ok.then_some(FileMove {
        from,
        to,
        ship,
        pattern,
        exclude,
        settle,
        on_conflict,
        max_files: max_files as usize,
    })
}

/// Directory setting `field` read from the config file's directory `base`; it must exist.
fn existing_dir(base: &Path, field: &str, text: &str, err: &mut Problems<'_>) -> Option<PathBuf> {
    if text.is_empty() {
        err.add(field, "must name a directory".into());
        return None;
    }
    let path = base.join(text);
    match std::fs::metadata(&path) {
        Err(e) => {
            err.add(field, format!("{}: {}", path.display(), io_reason(&e)));
            None
        }
        Ok(m) if !m.is_dir() => {
            err.add(field, format!("{} is not a directory", path.display()));
            None
        }
        Ok(_) => Some(path),
    }
}

/// Where the files go: the directory `to`, or with `to_stream` the task's spool and how its
/// files ship; exactly one of the two, each with only the settings that apply to it.
fn compile_destination(
    spec: &FileMoveSpec,
    task: &str,
    ctx: &Compile<'_>,
    err: &mut Problems<'_>,
    ok: &mut bool,
) -> (Option<PathBuf>, Option<Ship>) {
    match (&spec.to, &spec.to_stream) {
        (Some(_), Some(_)) => {
            err.add("to_stream", "is instead of to; set one of them".into());
            (None, None)
        }
        (None, None) => {
            err.add(
                "",
                "needs to (a directory) or to_stream (a stream to ship the files through)".into(),
            );
            (None, None)
        }
        (Some(to), None) => {
            if spec.archive.is_some() {
                err.add("archive", "only applies to to_stream".into());
                *ok = false;
            }
            (existing_dir(ctx.base, "to", to, err), None)
        }
        (None, Some(stream)) => {
            if spec.on_conflict.is_some() {
                err.add(
                    "on_conflict",
                    "only applies to to; spooled files get unique names".into(),
                );
                *ok = false;
            }
            let ship = compile_ship(stream, spec.archive.as_deref(), task, ctx, err, ok);
            (Some(ship.spool_dir.clone()), Some(ship))
        }
    }
}

/// How a `to_stream` task ships: its spool under the data directory, its `archive`, and the
/// byte bound of its stream and the store.
fn compile_ship(
    stream: &str,
    archive: Option<&str>,
    task: &str,
    ctx: &Compile<'_>,
    err: &mut Problems<'_>,
    ok: &mut bool,
) -> Ship {
    let max_bytes = match ctx.stream(stream) {
        Ok(s) => s.max_bytes.min(ctx.storage.max_bytes),
        Err(m) => {
            if let Some(m) = m {
                err.add("to_stream", m);
            }
            *ok = false;
            0
        }
    };
    let archive = archive.and_then(|a| {
        let d = existing_dir(ctx.base, "archive", a, err);
        if d.is_none() {
            *ok = false;
        }
        d
    });
    let spool_rel = crate::store::spool::task_dir(task);
    Ship {
        stream: stream.to_string(),
        spool_dir: ctx.data_dir.join(&spool_rel),
        spool_rel,
        archive,
        min_free: ctx.storage.min_free,
        max_bytes,
        recovered: Default::default(),
    }
}

/// Whether `from` and `to` are one directory: compared resolved when both resolve, as written
/// otherwise.
fn same_dir(from: &Path, to: &Path) -> bool {
    match (std::fs::canonicalize(from), std::fs::canonicalize(to)) {
        (Ok(a), Ok(b)) => a == b,
        _ => from == to,
    }
}

/// `list`, globs on a file name (no `/`), compiled; each bad one is reported as `field[i]`.
fn file_globs(
    field: &str,
    list: &[String],
    err: &mut Problems<'_>,
    ok: &mut bool,
) -> Vec<glob::Pattern> {
    let mut out = Vec::with_capacity(list.len());
    for (i, g) in list.iter().enumerate() {
        if g.is_empty() || g.contains('/') {
            err.add(
                &format!("{field}[{i}]"),
                format!("{g:?} must be a non-empty glob on the file name, without /"),
            );
            *ok = false;
            continue;
        }
        match glob::Pattern::new(g) {
            Ok(p) => out.push(p),
            Err(e) => {
                err.add(&format!("{field}[{i}]"), format!("{g:?}: {e}"));
                *ok = false;
            }
        }
    }
    out
}
