//! Sinks: where a stream's jobs are delivered. A closed set chosen by `type:` in the file, a
//! folder or file each: [`http`] (with, under the `remote-write` feature, `http::remote_write`:
//! Prometheus remote write over the same transport), [`file`] (a job becomes one file, written
//! atomically), [`stdout`], with the `mqtt` feature `mqtt` (an MQTT 5 or 3.1.1 broker), with the
//! `nats` feature `nats` (NATS JetStream). What the kinds share lives here, below them: the
//! contract in `deliver` ([`Batch`] in, [`DeliveryError`] out: may not reach, may pass, too large,
//! never, one record never), the broker sinks' `template`, the local sinks' `local` and the
//! streamed file body `file_body`; what they share with the sources lives lower still (`net`,
//! `record`, `setting`). No kind imports another (`tests/it/layers.rs`). This file holds the
//! compiled settings ([`SinkConfig`], with the kind's own in [`SinkKind`]) and [`Sink`], which
//! builds the kind's sink and dispatches to it, so nothing outside `sink/` knows the kinds but
//! `config` (which compiles them). Retry timing, the link state and dead letters are the delivery
//! worker's, the link monitor's and the store's business. `agent` builds a [`Sink`] from the
//! config and `delivery` drives it.
//!
//! A new kind of sink is a folder (or file) here with its settings and its built sink
//! (implementing `Deliver`), a variant in [`SinkKind`] and in `Built`, and their arms in this file.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::record::RecordFormat;
use crate::setting::SettingError;
use crate::store::FileJob;
use deliver::Deliver;
pub use deliver::{Batch, DeliveryError, Payload, Probe};

mod deliver;
pub mod file;
pub mod file_body;
pub mod http;
mod local;
#[cfg(feature = "mqtt")]
pub mod mqtt;
#[cfg(feature = "nats")]
pub mod nats;
pub mod stdout;
#[cfg(any(feature = "mqtt", feature = "nats"))]
pub mod template;

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
    File {
        dir: PathBuf,
    },
    Stdout,
    Http(Box<http::HttpConfig>),
    #[cfg(feature = "remote-write")]
    RemoteWrite(Box<http::remote_write::RemoteWriteConfig>),
    #[cfg(feature = "mqtt")]
    Mqtt(Box<mqtt::MqttConfig>),
    #[cfg(feature = "nats")]
    Nats(Box<nats::NatsConfig>),
}

impl SinkConfig {
    /// What the records of a stream delivered here must be.
    pub fn record_format(&self) -> RecordFormat {
        match &self.kind {
            SinkKind::Http(h) => h.record_format(),
            #[cfg(feature = "remote-write")]
            SinkKind::RemoteWrite(r) => r.record_format(),
            #[cfg(feature = "mqtt")]
            SinkKind::Mqtt(m) => m.record_format(),
            #[cfg(feature = "nats")]
            SinkKind::Nats(n) => n.record_format(),
            SinkKind::File { .. } | SinkKind::Stdout => RecordFormat::Lines,
        }
    }

    /// Whether the sink sends a job stored as a zstd frame of lines as it is (so its streams store
    /// every job compressed under `compression: auto`).
    pub fn sends_zstd_lines(&self) -> bool {
        match &self.kind {
            SinkKind::Http(h) => h.sends_zstd_lines(),
            #[cfg(feature = "remote-write")]
            SinkKind::RemoteWrite(_) => false,
            #[cfg(feature = "mqtt")]
            SinkKind::Mqtt(_) => false,
            #[cfg(feature = "nats")]
            SinkKind::Nats(_) => false,
            SinkKind::File { .. } | SinkKind::Stdout => false,
        }
    }

    /// For logs: the sink's type and target (never header values).
    pub fn describe(&self) -> String {
        match &self.kind {
            SinkKind::Http(h) => h.describe(&self.name),
            #[cfg(feature = "remote-write")]
            SinkKind::RemoteWrite(r) => r.describe(&self.name),
            #[cfg(feature = "mqtt")]
            SinkKind::Mqtt(m) => m.describe(&self.name),
            #[cfg(feature = "nats")]
            SinkKind::Nats(n) => n.describe(&self.name),
            SinkKind::File { dir } => file::describe(&self.name, dir),
            SinkKind::Stdout => stdout::describe(&self.name),
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
    /// The first wait before a probe (and before a trial after a failed one); doubled with jitter
    /// after each failure.
    pub backoff_base: Duration,
    /// The longest wait between probes: with a cheap probe, the bound on how late a link's return
    /// is noticed.
    pub backoff_cap: Duration,
    /// The longest wait before the next trial after failed ones (a probe passed, but the requests
    /// it let through still got no answer): a trial sends real requests, so it backs off like an
    /// expensive probe even when the probe itself is cheap.
    pub trial_cap: Duration,
}

/// The probe backoff's cap when the probe is cheap (a TCP connect, a directory's presence): it may
/// run every few seconds forever, so a link's return is noticed within this whatever the outage
/// length.
pub const CHEAP_PROBE_CAP: Duration = Duration::from_secs(2);
/// The cap when a probe (a GET) or a trial costs a request on the wire and work at the receiver.
pub const EXPENSIVE_PROBE_CAP: Duration = Duration::from_secs(60);

impl LinkConfig {
    /// The defaults for `probe`: base 1 s; cap [`CHEAP_PROBE_CAP`] for a TCP probe,
    /// [`EXPENSIVE_PROBE_CAP`] for an HTTP one; failed trials back off to [`EXPENSIVE_PROBE_CAP`].
    pub fn for_probe(probe: Probe) -> LinkConfig {
        let backoff_cap = match probe {
            Probe::Tcp => CHEAP_PROBE_CAP,
            Probe::Http(_) => EXPENSIVE_PROBE_CAP,
        };
        LinkConfig {
            probe,
            down_after: 3,
            backoff_base: Duration::from_secs(1),
            backoff_cap,
            trial_cap: EXPENSIVE_PROBE_CAP,
        }
    }
}

impl Default for LinkConfig {
    /// A TCP probe's defaults (a `file` sink's probe, a look at its directory, is as cheap).
    fn default() -> Self {
        LinkConfig::for_probe(Probe::Tcp)
    }
}

/// The built sink of each kind.
enum Built {
    Http(Box<http::HttpSink>),
    #[cfg(feature = "remote-write")]
    RemoteWrite(Box<http::remote_write::RemoteWriteSink>),
    #[cfg(feature = "mqtt")]
    Mqtt(Box<mqtt::MqttSink>),
    #[cfg(feature = "nats")]
    Nats(Box<nats::NatsSink>),
    File(file::FileSink),
    Stdout(stdout::StdoutSink),
}

/// `$call` on the built sink, whatever its kind (`$s` names it).
macro_rules! on_built {
    ($built:expr, $s:ident => $call:expr) => {
        match $built {
            Built::Http($s) => $call,
            #[cfg(feature = "remote-write")]
            Built::RemoteWrite($s) => $call,
            #[cfg(feature = "mqtt")]
            Built::Mqtt($s) => $call,
            #[cfg(feature = "nats")]
            Built::Nats($s) => $call,
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
            SinkKind::Http(spec) => {
                Built::Http(Box::new(http::HttpSink::new(spec, &config.link.probe)?))
            }
            #[cfg(feature = "remote-write")]
            SinkKind::RemoteWrite(spec) => Built::RemoteWrite(Box::new(
                http::remote_write::RemoteWriteSink::new(spec, &config.link.probe)?,
            )),
            #[cfg(feature = "mqtt")]
            SinkKind::Mqtt(spec) => Built::Mqtt(Box::new(mqtt::MqttSink::new(spec)?)),
            #[cfg(feature = "nats")]
            SinkKind::Nats(spec) => Built::Nats(Box::new(nats::NatsSink::new(spec)?)),
            SinkKind::File { dir } => Built::File(file::FileSink::new(&config.name, dir)),
            SinkKind::Stdout => Built::Stdout(stdout::StdoutSink::new(&config.name)),
        };
        Ok(Sink { config, built })
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Starts what the sink runs on its own (an MQTT connection), on the current runtime; until
    /// then a built sink holds no connection, so one built only to be checked (a reload that is
    /// refused later) never dials. Idempotent.
    pub fn start(&self) {
        on_built!(&self.built, s => s.start())
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

    /// Whether a job stored as a zstd frame of lines is sent as it is ([`Payload::ZstdLines`]).
    pub fn sends_zstd_lines(&self) -> bool {
        self.config.sends_zstd_lines()
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
    use super::deliver::tests::batch;
    use super::*;
    use std::path::Path;

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
            link: LinkConfig::default(),
        };
        Sink::new(std::sync::Arc::new(cfg)).unwrap()
    }

    #[tokio::test]
    async fn a_job_becomes_one_whole_file_named_by_store_and_job_and_a_replay_overwrites_it() {
        let dir = tempfile::tempdir().unwrap();
        let sink = file_sink(dir.path());
        let recs: [&[u8]; 2] = [b"{\"a\":1}", b"{\"b\":2}"];
        deliver(&sink, &batch(7, &recs)).await.unwrap();
        let path = dir
            .path()
            .join("logs-0000000000000abc-00000000000000000007.ndjson");
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
        // The same job id from another store file (one that replaced a damaged file starts its
        // ids over): a file of its own, the first one kept.
        let mut other = batch(7, &recs);
        other.store_id = 0xdef;
        deliver(&sink, &other).await.unwrap();
        assert!(path.exists());
        assert!(
            dir.path()
                .join("logs-0000000000000def-00000000000000000007.ndjson")
                .exists()
        );
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
