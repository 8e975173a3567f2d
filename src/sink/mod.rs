//! Sinks: where a stream's jobs are delivered. A closed set chosen by `type:` in the file, one file
//! each: [`http`], [`file`] (a job becomes one file, written atomically) and [`stdout`]. This file
//! holds what they have in common: the compiled settings ([`SinkConfig`], with the kind's own in
//! [`SinkKind`]), what a request carries ([`Batch`]), how a delivery fails ([`DeliveryError`]: may
//! not reach, may pass, too large, never), and [`Sink`], which builds the kind's sink and
//! dispatches to it, so nothing outside `sink/` knows the kinds but `config` (which compiles
//! them). Retry timing, the link state and dead letters are the delivery worker's, the link
//! monitor's and the store's business. `agent` builds a [`Sink`] from the config and `delivery`
//! drives it.
//!
//! A new kind of sink is a file here with its settings and its built sink (implementing
//! `Deliver`), a variant in [`SinkKind`] and in `Built`, and their arms below.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::store::FileJob;

pub mod file;
pub mod file_body;
pub mod http;
mod local;
pub mod stdout;

/// The compiled `sinks.<name>` entry: what every kind has, and the kind's own settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkConfig {
    pub name: String,
    pub kind: SinkKind,
    pub retry: SinkRetry,
    pub link: LinkConfig,
}

/// Each kind's own compiled settings (its file in `sink/` says what they mean).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinkKind {
    File { dir: PathBuf },
    Stdout,
    Http(Box<http::HttpConfig>),
}

impl SinkConfig {
    /// What the records of a stream delivered here must be.
    pub fn record_format(&self) -> RecordFormat {
        match &self.kind {
            SinkKind::Http(h) => h.record_format(),
            SinkKind::File { .. } | SinkKind::Stdout => RecordFormat::Lines,
        }
    }

    /// For logs: the sink's type and target (never header values).
    pub fn describe(&self) -> String {
        match &self.kind {
            SinkKind::Http(h) => h.describe(&self.name),
            SinkKind::File { dir } => file::describe(&self.name, dir),
            SinkKind::Stdout => stdout::describe(&self.name),
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
pub struct LinkConfig {
    pub probe: Probe,
    /// Consecutive transport failures that turn the link down.
    pub down_after: u32,
    pub backoff_base: Duration,
    pub backoff_cap: Duration,
}

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig {
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
    pub(crate) fn transient(reason: String) -> Self {
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
}

/// A setting that cannot be used, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{}{message}", .field, if .field.is_empty() { "" } else { ": " })]
pub struct SettingError {
    /// The setting's path within the sink, e.g. `tls.ca_file`; empty for the sink as a whole.
    pub field: String,
    pub message: String,
}

impl SettingError {
    fn new(field: impl Into<String>, message: String) -> Self {
        SettingError {
            field: field.into(),
            message,
        }
    }
}

/// What every kind of built sink does; [`Sink`] calls it on the kind it was built as. The defaults
/// are a local sink's: one write at a time, never paced, a record per line.
trait Deliver {
    /// Requests in flight at once.
    fn concurrency(&self) -> usize {
        1
    }
    /// The longest a request may take (for a local write, only what the link's trial waits for:
    /// such writes have no timeout of their own).
    fn timeout(&self) -> Duration {
        Duration::from_secs(10)
    }
    /// Bytes per second while a backlog drains, if limited.
    fn replay_rate(&self) -> Option<u64> {
        None
    }
    /// The body that carries `batch`, as it goes over the wire.
    async fn body(&self, batch: &Batch<'_>) -> Result<Vec<u8>, DeliveryError> {
        Ok(http::encode(http::Encoding::Ndjson, batch.records))
    }
    /// Delivers `body` (made by `body` for `batch`).
    async fn send(&self, batch: &Batch<'_>, body: Vec<u8>) -> Result<(), DeliveryError>;
    /// Delivers the file of a file job, streamed from disk.
    async fn send_file(&self, batch: &Batch<'_>, file: &FileJob) -> Result<(), DeliveryError>;
    /// Whether the destination can be reached again (`how`: the sink's `link.probe`).
    async fn probe(&self, how: &Probe) -> Result<(), String>;
}

/// The built sink of each kind.
enum Built {
    Http(Box<http::HttpSink>),
    File(file::FileSink),
    Stdout(stdout::StdoutSink),
}

/// `$call` on the built sink, whatever its kind (`$s` names it).
macro_rules! on_built {
    ($built:expr, $s:ident => $call:expr) => {
        match $built {
            Built::Http($s) => $call,
            Built::File($s) => $call,
            Built::Stdout($s) => $call,
        }
    };
}

/// A sink ready to deliver: its settings and its kind's built sink (for HTTP, the client).
pub struct Sink {
    pub config: Arc<SinkConfig>,
    built: Built,
}

impl Sink {
    /// Builds the sink (for HTTP: reads TLS files, builds the client). Errors name the setting.
    pub fn new(config: Arc<SinkConfig>) -> Result<Sink, SettingError> {
        let built = match &config.kind {
            SinkKind::Http(spec) => Built::Http(Box::new(http::HttpSink::new(spec)?)),
            SinkKind::File { dir } => Built::File(file::FileSink::new(&config.name, dir)),
            SinkKind::Stdout => Built::Stdout(stdout::StdoutSink::new(&config.name)),
        };
        Ok(Sink { config, built })
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Requests in flight at once.
    pub fn concurrency(&self) -> usize {
        on_built!(&self.built, s => s.concurrency())
    }

    /// The longest a request may take.
    pub fn timeout(&self) -> Duration {
        on_built!(&self.built, s => s.timeout())
    }

    /// Bytes per second while a backlog drains, if limited.
    pub fn replay_rate(&self) -> Option<u64> {
        on_built!(&self.built, s => s.replay_rate())
    }

    /// The body that carries `batch`: encoded (and for HTTP compressed), so its size is what goes
    /// over the wire and what `replay_rate` paces.
    pub async fn body(&self, batch: &Batch<'_>) -> Result<Vec<u8>, DeliveryError> {
        on_built!(&self.built, s => s.body(batch).await)
    }

    /// Delivers `body` (made by [`Sink::body`] for `batch`).
    pub async fn send(&self, batch: &Batch<'_>, body: Vec<u8>) -> Result<(), DeliveryError> {
        on_built!(&self.built, s => s.send(batch, body).await)
    }

    /// Delivers the file of a file job (`batch.file`), streamed from disk.
    pub async fn send_file(&self, batch: &Batch<'_>, file: &FileJob) -> Result<(), DeliveryError> {
        on_built!(&self.built, s => s.send_file(batch, file).await)
    }

    /// Whether the destination can be reached again, for the link monitor.
    pub async fn probe(&self) -> Result<(), String> {
        on_built!(&self.built, s => s.probe(&self.config.link.probe).await)
    }

    /// For logs: the sink's type and target.
    pub fn describe(&self) -> String {
        self.config.describe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn batch<'a>(id: u64, records: &'a [&'a [u8]]) -> Batch<'a> {
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

    pub(super) async fn deliver(sink: &Sink, batch: &Batch<'_>) -> Result<(), DeliveryError> {
        let body = sink.body(batch).await?;
        sink.send(batch, body).await
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
}
