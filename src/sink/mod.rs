//! Sinks: where a stream's jobs are delivered. A closed set chosen by `type:` in the file: `http`
//! (see [`http`]), `file` (a job becomes one file, written atomically) and `stdout`. Each delivery of
//! a [`Batch`] either succeeds or says what kind of failure it was ([`DeliveryError`]): unreachable,
//! may pass, too large, or never. Retry timing, the link state and dead letters are the delivery
//! worker's, the link monitor's and the store's business. The compiled settings ([`SinkConfig`]) come
//! from `config`; `agent` builds a [`Sink`] from them and `delivery` drives it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub mod file_body;
pub mod http;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkConfig {
    pub name: String,
    pub kind: SinkKind,
    pub retry: SinkRetry,
    pub link: LinkSpec,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinkKind {
    File { dir: PathBuf },
    Stdout,
    Http(Box<http::HttpSpec>),
}

impl SinkConfig {
    /// What the records of a stream delivered here must be.
    pub fn record_format(&self) -> RecordFormat {
        match &self.kind {
            SinkKind::Http(h) => match h.encoding {
                http::Encoding::Ndjson | http::Encoding::JsonArray => RecordFormat::Json,
                http::Encoding::InfluxLine => RecordFormat::LineProtocol(
                    h.precision
                        .unwrap_or(crate::scrape::lineproto::Precision::Ns),
                ),
            },
            SinkKind::File { .. } | SinkKind::Stdout => RecordFormat::Lines,
        }
    }
}

/// What a stream's records must be for its sink to carry them; every producer (ingest, `queue
/// push`, tail sources, scrapes) writes or checks that format, so a sink is never handed a record it
/// would send broken (a receiver that answers 2xx and drops what it cannot read loses it silently).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordFormat {
    /// JSON values: an `http` sink with `encoding: ndjson` or `json_array`.
    Json,
    /// One InfluxDB line-protocol point per record, timestamps in this precision: an `http` sink
    /// with `encoding: influx_line`.
    LineProtocol(crate::scrape::lineproto::Precision),
    /// Any single line: `file` and `stdout` sinks write a record per line, and a stream without a
    /// sink only queues. The ingest API takes JSON for these (its contract); `queue push` and
    /// scrapes may put other lines there.
    Lines,
}

impl RecordFormat {
    /// For messages: what the records are.
    pub fn describe(self) -> &'static str {
        match self {
            RecordFormat::Json => "JSON records",
            RecordFormat::LineProtocol(_) => "influx line protocol",
            RecordFormat::Lines => "lines",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SinkRetry {
    pub base: Duration,
    pub cap: Duration,
    /// Attempts before a job is dead-lettered.
    pub max_attempts: u32,
}

/// When a sink counts as unreachable and how it is watched until it answers again (`link`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkSpec {
    pub probe: Probe,
    /// Consecutive transport failures that turn the link down.
    pub down_after: u32,
    pub backoff_base: Duration,
    pub backoff_cap: Duration,
}

impl Default for LinkSpec {
    fn default() -> Self {
        LinkSpec {
            probe: Probe::Tcp,
            down_after: 3,
            backoff_base: Duration::from_secs(1),
            backoff_cap: Duration::from_secs(60),
        }
    }
}

/// How a down link is tested. File sinks check their directory whatever is set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// A TCP connect to the sink's host and port.
    Tcp,
    /// A GET of this URL that gets any answer.
    Http(reqwest::Url),
}

/// Why a delivery failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeliveryError {
    /// The destination cannot be reached at all: no answer (refused, reset, timed out, TLS
    /// handshake failed) or an unmounted directory. No attempt is spent: the job goes back to the
    /// queue and the link monitor decides when to try again, however long that takes.
    #[error("{0}")]
    Unavailable(String),
    /// The destination answered but the delivery failed in a way that may pass (5xx, 408, 429, a
    /// full disk): an attempt is spent and the job is retried later, after `retry_after` when the
    /// peer said so.
    #[error("{reason}")]
    Transient {
        reason: String,
        retry_after: Option<Duration>,
    },
    /// The destination refused the body as too large (413): send fewer records at a time.
    #[error("{0}")]
    TooLarge(String),
    /// Will never succeed: the job goes to the dead letters with this reason.
    #[error("{0}")]
    Permanent(String),
}

impl DeliveryError {
    fn transient(reason: String) -> Self {
        DeliveryError::Transient {
            reason,
            retry_after: None,
        }
    }
}

/// What one request carries: some of a job's records.
#[derive(Debug)]
pub struct Batch<'a> {
    pub stream: &'a str,
    pub job: u64,
    /// The records' positions in the job as it was first appended: `[first, end)`, and whether
    /// that is the whole job.
    pub first: u32,
    pub end: u32,
    pub whole: bool,
    pub records: &'a [&'a [u8]],
    /// For a file job: the file it ships (`records` then holds only its reference).
    pub file: Option<&'a crate::store::FileJob>,
    /// The store file's id: job ids restart in a new file, keys must not.
    pub store_id: u64,
}

impl Batch<'_> {
    /// The same for every re-send of the same records, different for any other content: a
    /// receiver can drop a replay after a crash. `:` separates the parts because stream names
    /// cannot contain it (they may contain `-`).
    pub fn idempotency_key(&self) -> String {
        if self.whole {
            format!("{:016x}:{}:{}", self.store_id, self.stream, self.job)
        } else {
            format!(
                "{:016x}:{}:{}:{}-{}",
                self.store_id, self.stream, self.job, self.first, self.end
            )
        }
    }

    fn file_name(&self) -> String {
        if self.whole {
            format!("{}-{:020}.ndjson", self.stream, self.job)
        } else {
            format!(
                "{}-{:020}-{}-{}.ndjson",
                self.stream, self.job, self.first, self.end
            )
        }
    }
}

/// A sink ready to deliver: its config and, for HTTP, the client.
pub struct Sink {
    pub config: std::sync::Arc<SinkConfig>,
    http: Option<http::HttpSink>,
}

impl Sink {
    /// Builds the sink (for HTTP: reads TLS files, builds the client). Errors name the setting.
    pub fn new(config: std::sync::Arc<SinkConfig>) -> Result<Sink, http::SettingError> {
        let http = match &config.kind {
            SinkKind::Http(spec) => Some(http::HttpSink::new(spec)?),
            _ => None,
        };
        Ok(Sink { config, http })
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Requests in flight at once.
    pub fn concurrency(&self) -> usize {
        match &self.config.kind {
            SinkKind::Http(spec) => spec.concurrency.max(1) as usize,
            _ => 1,
        }
    }

    /// The longest a request may take.
    pub fn timeout(&self) -> Duration {
        match &self.config.kind {
            SinkKind::Http(spec) => spec.timeout,
            _ => Duration::from_secs(10),
        }
    }

    /// Bytes per second while a backlog drains, if limited.
    pub fn replay_rate(&self) -> Option<u64> {
        match &self.config.kind {
            SinkKind::Http(spec) => spec.replay_rate,
            _ => None,
        }
    }

    /// The body that carries `batch`: encoded (and for HTTP compressed), so its size is what goes
    /// over the wire and what `replay_rate` paces.
    pub async fn body(&self, batch: &Batch<'_>) -> Result<Vec<u8>, DeliveryError> {
        match &self.http {
            Some(h) => h.body(batch.records).await,
            None => Ok(http::encode(http::Encoding::Ndjson, batch.records)),
        }
    }

    /// Delivers `body` (made by [`Sink::body`] for `batch`).
    pub async fn send(&self, batch: &Batch<'_>, body: Vec<u8>) -> Result<(), DeliveryError> {
        match &self.config.kind {
            SinkKind::Http(_) => {
                let h = self.http.as_ref().expect("built with the sink");
                h.send(&batch.idempotency_key(), body).await
            }
            SinkKind::File { dir } => {
                let (dir, name) = (dir.clone(), batch.file_name());
                // Off the event loop: a stat of a stale network mount can block for minutes.
                let written = tokio::task::spawn_blocking(move || {
                    write_atomically(&dir, name.as_ref(), |f| f.write_all(&body))
                })
                .await
                .map_err(|e| {
                    DeliveryError::transient(format!("{}: writer stopped: {e}", self.describe()))
                })?;
                match written {
                    Ok(()) => Ok(()),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(
                        DeliveryError::Unavailable(format!("{}: {e}", self.describe())),
                    ),
                    Err(e) => Err(DeliveryError::transient(format!(
                        "{}: {e}",
                        self.describe()
                    ))),
                }
            }
            SinkKind::Stdout => tokio::task::spawn_blocking(move || {
                let mut out = std::io::stdout().lock();
                out.write_all(&body)?;
                out.flush()
            })
            .await
            .map_err(|e| {
                DeliveryError::transient(format!("{}: writer stopped: {e}", self.describe()))
            })?
            .map_err(|e| DeliveryError::transient(format!("{}: {e}", self.describe()))),
        }
    }

    /// Delivers the file of a file job (`batch.file`), streamed from disk.
    pub async fn send_file(
        &self,
        batch: &Batch<'_>,
        file: &crate::store::FileJob,
    ) -> Result<(), DeliveryError> {
        match &self.config.kind {
            SinkKind::Http(_) => {
                let h = self.http.as_ref().expect("built with the sink");
                h.send_file(&batch.idempotency_key(), &file.path, &file.name, file.len)
                    .await
            }
            SinkKind::File { dir } => {
                use std::os::unix::ffi::OsStrExt;
                let mut name = format!("{}-{:020}-", batch.stream, batch.job).into_bytes();
                // Cut so the name (and its temporary `.<name>.tmp`) stays within NAME_MAX (255).
                let original = file.name.as_bytes();
                let room = 250usize.saturating_sub(name.len() + 5);
                name.extend_from_slice(&original[..original.len().min(room)]);
                let (dir, src, len) = (dir.clone(), file.path.clone(), file.len);
                let written = tokio::task::spawn_blocking(move || {
                    write_atomically(&dir, std::ffi::OsStr::from_bytes(&name), |f| {
                        copy_exactly(&src, len, f)
                    })
                })
                .await
                .map_err(|e| {
                    DeliveryError::transient(format!("{}: writer stopped: {e}", self.describe()))
                })?;
                self.file_outcome(written, &file.path)
            }
            SinkKind::Stdout => {
                let (src, len) = (file.path.clone(), file.len);
                let written = tokio::task::spawn_blocking(move || {
                    let mut f = std::fs::File::open(&src)?;
                    let mut out = std::io::stdout().lock();
                    let n = std::io::copy(&mut std::io::Read::take(&mut f, len), &mut out)?;
                    out.flush()?;
                    short(n, len)
                })
                .await
                .map_err(|e| {
                    DeliveryError::transient(format!("{}: writer stopped: {e}", self.describe()))
                })?;
                self.file_outcome(written, &file.path)
            }
        }
    }

    /// A file job's delivery to a local sink: a missing spooled file is permanent, a missing
    /// directory an outage, anything else may pass.
    fn file_outcome(&self, r: std::io::Result<()>, src: &Path) -> Result<(), DeliveryError> {
        match r {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !src.exists() => Err(
                DeliveryError::Permanent(format!("the spooled file {} is missing", src.display())),
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(DeliveryError::Unavailable(
                format!("{}: {e}", self.describe()),
            )),
            Err(e) => Err(DeliveryError::transient(format!(
                "{}: {e}",
                self.describe()
            ))),
        }
    }

    /// Whether the destination can be reached again, for the link monitor.
    pub async fn probe(&self) -> Result<(), String> {
        match (&self.config.kind, &self.http) {
            (SinkKind::Http(_), Some(h)) => {
                let url = match &self.config.link.probe {
                    Probe::Tcp => None,
                    Probe::Http(u) => Some(u),
                };
                h.probe(url).await
            }
            (SinkKind::File { dir }, _) => {
                let dir = dir.clone();
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
            _ => Ok(()),
        }
    }

    /// For logs: the sink's type and target.
    pub fn describe(&self) -> String {
        self.config.describe()
    }
}

impl SinkConfig {
    /// For logs: the sink's type and target (never header values).
    pub fn describe(&self) -> String {
        match &self.kind {
            SinkKind::File { dir } => format!("file sink {} ({})", self.name, dir.display()),
            SinkKind::Stdout => format!("stdout sink {}", self.name),
            SinkKind::Http(spec) => {
                format!(
                    "http sink {} ({})",
                    self.name,
                    crate::net::client::shown_url(&spec.url)
                )
            }
        }
    }
}

fn short(n: u64, len: u64) -> std::io::Result<()> {
    if n < len {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!(
                "the spooled file ended {} bytes short of its recorded length",
                len - n
            ),
        ));
    }
    Ok(())
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

/// The first `len` bytes of the file at `src`, copied into `out`.
fn copy_exactly(src: &Path, len: u64, out: &mut std::fs::File) -> std::io::Result<()> {
    let mut input = std::fs::File::open(src)?;
    let n = std::io::copy(&mut std::io::Read::take(&mut input, len), out)?;
    short(n, len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch<'a>(id: u64, records: &'a [&'a [u8]]) -> Batch<'a> {
        Batch {
            stream: "logs",
            job: id,
            first: 0,
            end: records.len() as u32,
            whole: true,
            records,
            file: None,
            store_id: 0xabc,
        }
    }

    async fn deliver(sink: &Sink, batch: &Batch<'_>) -> Result<(), DeliveryError> {
        let body = sink.body(batch).await?;
        sink.send(batch, body).await
    }

    fn file_sink(dir: &Path) -> Sink {
        let cfg = SinkConfig {
            name: "out".into(),
            kind: SinkKind::File {
                dir: dir.to_path_buf(),
            },
            retry: SinkRetry {
                base: Duration::from_secs(1),
                cap: Duration::from_secs(1),
                max_attempts: 1,
            },
            link: LinkSpec::default(),
        };
        Sink::new(std::sync::Arc::new(cfg)).unwrap()
    }

    #[test]
    fn idempotency_keys_name_the_store_stream_job_and_part() {
        let recs: [&[u8]; 2] = [b"a", b"b"];
        let mut b = batch(7, &recs);
        assert_eq!(b.idempotency_key(), "0000000000000abc:logs:7");
        b.whole = false;
        b.first = 4;
        b.end = 6;
        assert_eq!(b.idempotency_key(), "0000000000000abc:logs:7:4-6");
    }

    #[tokio::test]
    async fn a_job_becomes_one_whole_file_and_a_replay_overwrites_it() {
        let dir = tempfile::tempdir().unwrap();
        let sink = file_sink(dir.path());
        let recs: [&[u8]; 2] = [b"{\"a\":1}", b"{\"b\":2}"];
        deliver(&sink, &batch(7, &recs)).await.unwrap();
        let path = dir.path().join("logs-00000000000000000007.ndjson");
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "{\"a\":1}\n{\"b\":2}\n"
        );
        // Delivered again after a crash: same name, same content, no second file.
        let recs: [&[u8]; 2] = [b"{\"a\":1}", b"{\"b\":2}"];
        deliver(&sink, &batch(7, &recs)).await.unwrap();
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
        let e = deliver(&sink, &batch(1, &[b"x"])).await.unwrap_err();
        assert!(
            matches!(&e, DeliveryError::Unavailable(m) if m.contains("does not exist")),
            "{e:?}"
        );
        assert!(!gone.exists(), "colibri must not create the directory");
        assert!(sink.probe().await.is_err());
        std::fs::create_dir(&gone).unwrap();
        sink.probe().await.unwrap();
    }
}
