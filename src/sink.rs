//! Sinks: where a stream's jobs are delivered. A closed set chosen by `type:` in the file: `file`
//! (a job becomes one file, written atomically) and `stdout`. Each delivery either succeeds or says
//! whether trying again can help ([`DeliveryError`]); retry timing and dead letters are the delivery
//! worker's and the store's business. Built by `config::compile`, called by `delivery`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::store::Job;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkConfig {
    pub name: String,
    pub kind: SinkKind,
    pub retry: SinkRetry,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinkKind {
    File { dir: PathBuf },
    Stdout,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SinkRetry {
    pub base: Duration,
    pub cap: Duration,
    /// Attempts before a job is dead-lettered.
    pub max_attempts: u32,
}

/// Why a delivery failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeliveryError {
    /// The destination cannot be reached at all (its link is down: an unmounted directory, later a
    /// refused connection). No attempt is spent: the job goes back to the queue and deliveries pause
    /// until the sink answers again, however long that takes.
    #[error("{0}")]
    Unavailable(String),
    /// The destination answered but the delivery failed in a way that may pass (a full disk, an I/O
    /// error): an attempt is spent and the job is retried later.
    #[error("{0}")]
    Transient(String),
    /// Will never succeed: the job goes to the dead letters with this reason.
    #[error("{0}")]
    Permanent(String),
}

impl SinkConfig {
    /// Delivers one job of `stream`.
    pub async fn deliver(&self, stream: &str, job: &Job) -> Result<(), DeliveryError> {
        let body = ndjson(job.records());
        match &self.kind {
            SinkKind::File { dir } => {
                let dir = dir.clone();
                let name = format!("{stream}-{:020}.ndjson", job.lease.id);
                if !dir.is_dir() {
                    return Err(DeliveryError::Unavailable(format!(
                        "{}: the directory does not exist (colibri does not create it)",
                        self.describe()
                    )));
                }
                tokio::task::spawn_blocking(move || write_atomically(&dir, &name, &body))
                    .await
                    .map_err(|e| DeliveryError::Transient(format!("file writer stopped: {e}")))?
                    .map_err(|e| DeliveryError::Transient(format!("{}: {e}", self.describe())))
            }
            SinkKind::Stdout => tokio::task::spawn_blocking(move || {
                let mut out = std::io::stdout().lock();
                out.write_all(&body)?;
                out.flush()
            })
            .await
            .map_err(|e| DeliveryError::Transient(format!("stdout writer stopped: {e}")))?
            .map_err(|e| DeliveryError::Transient(format!("stdout: {e}"))),
        }
    }

    /// For logs: the sink's type and target.
    pub fn describe(&self) -> String {
        match &self.kind {
            SinkKind::File { dir } => format!("file sink {} ({})", self.name, dir.display()),
            SinkKind::Stdout => format!("stdout sink {}", self.name),
        }
    }
}

/// Records as NDJSON: each record, as stored, on its own line.
fn ndjson<'a>(records: impl Iterator<Item = &'a [u8]> + Clone) -> Vec<u8> {
    let mut body = Vec::with_capacity(records.clone().map(|r| r.len() + 1).sum());
    for r in records {
        body.extend_from_slice(r);
        body.push(b'\n');
    }
    body
}

/// Writes `dir/name` so that it appears whole or not at all, and stays after a power cut: a
/// temporary file, fsync, rename over the final name, fsync of the directory.
fn write_atomically(dir: &Path, name: &str, body: &[u8]) -> std::io::Result<()> {
    if !dir.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "the directory does not exist (colibri does not create it)",
        ));
    }
    let tmp = dir.join(format!(".{name}.tmp"));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(body)?;
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
    use super::*;
    use crate::store::Lease;

    fn job(id: u64, records: &[&str]) -> Job {
        let lease = Lease {
            stream: "s".into(),
            id,
            retry_due: None,
        };
        Job::for_test(lease, records)
    }

    fn file_sink(dir: &Path) -> SinkConfig {
        SinkConfig {
            name: "out".into(),
            kind: SinkKind::File {
                dir: dir.to_path_buf(),
            },
            retry: SinkRetry {
                base: Duration::from_secs(1),
                cap: Duration::from_secs(1),
                max_attempts: 1,
            },
        }
    }

    #[tokio::test]
    async fn a_job_becomes_one_whole_file_and_a_replay_overwrites_it() {
        let dir = tempfile::tempdir().unwrap();
        let sink = file_sink(dir.path());
        sink.deliver("logs", &job(7, &["{\"a\":1}", "{\"b\":2}"]))
            .await
            .unwrap();
        let path = dir.path().join("logs-00000000000000000007.ndjson");
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "{\"a\":1}\n{\"b\":2}\n"
        );
        // Delivered again after a crash: same name, same content, no second file.
        sink.deliver("logs", &job(7, &["{\"a\":1}", "{\"b\":2}"]))
            .await
            .unwrap();
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[tokio::test]
    async fn a_missing_directory_is_an_outage_and_is_not_created() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("not-mounted");
        let sink = file_sink(&gone);
        let e = sink.deliver("logs", &job(1, &["x"])).await.unwrap_err();
        assert!(
            matches!(&e, DeliveryError::Unavailable(m) if m.contains("does not exist")),
            "{e:?}"
        );
        assert!(!gone.exists(), "colibri must not create the directory");
    }
}
