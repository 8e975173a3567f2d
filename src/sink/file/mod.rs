//! The `file` sink: each job (or part of a job) becomes one file in a directory, written so that it
//! appears whole or not at all and survives a power cut; a replay of the same records writes the
//! same name again. The directory is never created: a missing one (an unmounted disk) is an outage
//! and the link's probe waits for it. It does not retry or touch the store (the delivery worker
//! does). Its file shape is [`config`]'s. Built by `sink::Sink::new`.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::SinkConfig;
use super::deliver::{Batch, Deliver, DeliveryError, Probe};
use super::kind::{KindConfig, Settings};
use super::local;
use crate::scrape::lineparse;
use crate::setting::SettingError;
use crate::store::FileJob;

pub use config::FileSinkSpec as Spec;

mod config;

/// The compiled `type: file` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileConfig {
    /// Where each job becomes a file; never created by colibri.
    pub dir: PathBuf,
}

impl Settings for FileConfig {
    fn describe(&self, name: &str) -> String {
        describe(name, &self.dir)
    }
}

impl KindConfig for FileConfig {
    type Built = FileSink;

    fn build(&self, sink: &SinkConfig) -> Result<FileSink, SettingError> {
        Ok(FileSink::new(&sink.name, &self.dir))
    }
}

/// For logs: the sink's type, name and directory.
fn describe(name: &str, dir: &Path) -> String {
    format!("file sink {name} ({})", dir.display())
}

/// A file sink ready to write.
pub struct FileSink {
    dir: PathBuf,
    /// [`describe`]'s line, for failure reasons.
    shown: String,
}

impl FileSink {
    pub fn new(name: &str, dir: &Path) -> FileSink {
        FileSink {
            dir: dir.to_path_buf(),
            shown: describe(name, dir),
        }
    }
}

impl Deliver for FileSink {
    /// Writes `body` as the batch's file.
    async fn send(&self, batch: &Batch<'_>, body: Vec<u8>) -> Result<(), DeliveryError> {
        let (dir, name) = (self.dir.clone(), file_name(batch));
        let written = local::off_the_loop(&self.shown, move || {
            let name = format!("{name}.{}", extension(&body));
            write_atomically(&dir, name.as_ref(), |f| f.write_all(&body))
        })
        .await?;
        match written {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(DeliveryError::Unavailable(format!("{}: {e}", self.shown)))
            }
            Err(e) => Err(DeliveryError::transient(format!("{}: {e}", self.shown))),
        }
    }

    /// Copies a file job's file into the directory, under the job's name and the file's own.
    async fn send_file(&self, batch: &Batch<'_>, file: &FileJob) -> Result<(), DeliveryError> {
        use std::os::unix::ffi::OsStrExt;
        let mut name = format!(
            "{}-{:016x}-{:020}-",
            batch.key_stream, batch.store_id, batch.job
        )
        .into_bytes();
        // Cut so the name (and its temporary `.<name>.tmp`) stays within NAME_MAX (255).
        let original = file.name.as_bytes();
        let room = 250usize.saturating_sub(name.len() + 5);
        name.extend_from_slice(&original[..original.len().min(room)]);
        let (dir, src, len) = (self.dir.clone(), file.path.clone(), file.len);
        let written = local::off_the_loop(&self.shown, move || {
            write_atomically(&dir, std::ffi::OsStr::from_bytes(&name), |f| {
                local::short(local::copy_prefix(&src, len, f)?, len)
            })
        })
        .await?;
        local::spooled_outcome(&self.shown, written, &file.path)
    }

    /// Whether the directory is there (again).
    async fn probe(&self, _how: &Probe) -> Result<(), String> {
        let dir = self.dir.clone();
        tokio::task::spawn_blocking(move || {
            if dir.is_dir() {
                Ok(())
            } else {
                Err(format!("{} does not exist", dir.display()))
            }
        })
        .await
        .unwrap_or_else(|e| Err(format!("probe stopped: {e}")))
    }
}

/// The name of a batch's file without its extension: the same for every re-send of the same
/// records, and, as the idempotency key, never the same for two store files (job ids start over in
/// a store that replaced a damaged one: its job 1 must not overwrite the old one's).
fn file_name(batch: &Batch<'_>) -> String {
    let (stream, store, job) = (batch.key_stream, batch.store_id, batch.job);
    if batch.whole {
        format!("{stream}-{store:016x}-{job:020}")
    } else {
        format!(
            "{stream}-{store:016x}-{job:020}-{}-{}",
            batch.first, batch.end
        )
    }
}

/// The extension that says what a body's lines are: `ndjson` when every line is JSON (ingest's
/// records, syslog's), `lp` when every line is an InfluxDB line-protocol point (a scrape's or a
/// poll's samples, which a `file` sink gets as line protocol), `txt` otherwise. A `file` sink
/// takes any lines, so only what it holds can say; the same records always get the same name.
fn extension(body: &[u8]) -> &'static str {
    let lines = || body.split(|&b| b == b'\n').filter(|l| !l.is_empty());
    if lines().all(|l| serde_json::from_slice::<serde::de::IgnoredAny>(l).is_ok()) {
        "ndjson"
    } else if lines().all(|l| lineparse::check(l).is_ok()) {
        "lp"
    } else {
        "txt"
    }
}

/// Writes `dir/name` so that it appears whole or not at all, and stays after a power cut: `fill`
/// writes a temporary file, which is fsync'd and renamed over the final name, then the directory is
/// fsync'd. The directory must exist (a missing one is `NotFound`: an outage, not created).
fn write_atomically(
    dir: &Path,
    name: &std::ffi::OsStr,
    fill: impl FnOnce(&mut std::fs::File) -> std::io::Result<()>,
) -> std::io::Result<()> {
    if !dir.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "the directory does not exist (colibri does not create it)",
        ));
    }
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(".tmp");
    let tmp = dir.join(tmp_name);
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        fill(&mut f)?;
        f.sync_all()?;
        std::fs::rename(&tmp, dir.join(name))?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::extension;

    #[test]
    fn files_are_named_by_what_their_lines_are() {
        assert_eq!(extension(b"{\"a\":1}\n[2]\n"), "ndjson");
        assert_eq!(
            extension(b"m,site=a v=3.14159 1700000000000000000\nm v=1i\n"),
            "lp"
        );
        assert_eq!(extension(b"{\"a\":1}\nm v=1\n"), "txt");
        assert_eq!(extension(b"<13>Dec  4 host app: hello\n"), "txt");
    }
}
