//! Sinks: where a stream's jobs are delivered. A closed set chosen by `type:` in the file, listed
//! once below (`sink_kinds!`), a folder each with its file shape (`config.rs`), its compiled
//! settings and its built sink: `http` (with, under the `remote-write` feature, `http::remote_write`:
//! Prometheus remote write over the same transport), `file` (a job becomes one file, written
//! atomically), `stdout`, with the `mqtt` feature `mqtt` (an MQTT 5 or 3.1.1 broker), with the
//! `nats` feature `nats` (NATS JetStream), with the `kafka` feature `kafka` (Kafka). What the kinds share lives here, below them: the
//! contract in `deliver` ([`Batch`] in, [`DeliveryError`] out: may not reach, may pass, too large,
//! never, one record never), what a kind provides to the list in `kind`, the file shape every kind
//! shares in `config` (`retry`, `link`), the broker sinks' `template`, the local sinks' `local` and
//! the streamed file body `file_body`; what they share with the sources lives lower still (`net`,
//! `record`, `setting`, `shape`). No kind imports another (`tests/it/layers.rs`). This file holds
//! the list, the compiled settings every sink has ([`SinkConfig`]: `retry`, `link`, `timeout`,
//! `concurrency`, `replay_rate`, with the kind's own in [`SinkKind`]) and [`Sink`], which builds
//! the kind's sink and dispatches to it. Retry timing, the link state and dead letters are the
//! delivery worker's, the link monitor's and the store's business. `config` compiles an entry with
//! [`compile_kind`], `agent` builds a [`Sink`] and `delivery` drives it.
//!
//! A new kind of sink is a folder here (its `Spec` implementing `kind::KindSpec`, its compiled
//! settings `kind::KindConfig`, its built sink `Deliver`) and one entry in the list below.

use std::sync::Arc;
use std::time::Duration;

use crate::record::RecordFormat;
use crate::setting::SettingError;
use crate::store::FileJob;
use deliver::Deliver;
pub use deliver::{Batch, DeliveryError, Payload, Probe, REPLAYED};
pub use kind::Compile;

pub mod config;
mod deliver;
pub mod file_body;
#[macro_use]
mod kind;
mod local;
#[cfg(any(feature = "mqtt", feature = "nats", feature = "kafka"))]
pub mod template;

pub mod file;
pub mod http;
#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(feature = "mqtt")]
pub mod mqtt;
#[cfg(feature = "nats")]
pub mod nats;
pub mod stdout;

sink_kinds! {
    /// Each job becomes one file in `path` (`<stream>-<store id>-<job id>.ndjson`, `.lp` or `.txt`, named by what its lines are: all JSON, all line protocol, or anything else; a record per line), written
    /// under a temporary name, fsync'd and renamed into place, so a reader never sees half a file and
    /// a job delivered twice after a crash overwrites itself. The directory must exist: colibri does
    /// not create it, so an unmounted disk is noticed instead of filled on the root filesystem.
    File(file) = "file";
    /// Each job's records are written to colibri's stdout, a record per line.
    Stdout(stdout) = "stdout";
    /// Each job is one HTTP request (a job refused with 413 is sent in halves). Every request carries
    /// an `Idempotency-Key` (store, stream, job and, for a part, its record range) and a
    /// `User-Agent: colibri/<version>`.
    Http(http) = "http";
    /// Prometheus remote write 1.0 (a snappy protobuf `WriteRequest` per job) to Prometheus
    /// (`--web.enable-remote-write-receiver`), VictoriaMetrics (`/api/v1/write`), Mimir, Thanos
    /// and the like. The stream's records are line-protocol samples timestamped in ms: an
    /// `http_scrape` task's. Each numeric field is a sample of the series it names, labelled by
    /// the record's tags, `job` (the measurement) and `external_labels`. Built only with the
    /// `remote-write` feature (release builds have it).
    #[feature = "remote-write"]
    PrometheusRemoteWrite(http::remote_write) = "prometheus_remote_write";
    /// Each record (or, with `batch`, each job) published to an MQTT 5 broker at QoS 1 or 2;
    /// delivered once every message is acknowledged. Every message carries the user property
    /// `idempotency-key`. Built only with the `mqtt` feature (release builds have it).
    #[feature = "mqtt"]
    Mqtt(mqtt) = "mqtt";
    /// Each record (or, with `batch`, each job) published to NATS JetStream with a `Nats-Msg-Id`
    /// JetStream deduplicates by; delivered once every PubAck is in. Built only with the `nats`
    /// feature (release builds have it).
    #[feature = "nats"]
    Nats(nats) = "nats";
    /// Each record (or, with `batch`, each job) produced to Kafka by an idempotent producer with
    /// `acks=all`, a header `idempotency-key` on every message; delivered once every message is
    /// acknowledged. Built only with the `kafka` feature (release builds have it).
    #[feature = "kafka"]
    Kafka(kafka) = "kafka";
}

/// The compiled `sinks.<name>` entry: what every kind has, and the kind's own settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkConfig {
    pub name: String,
    pub kind: SinkKind,
    pub retry: SinkRetry,
    pub link: LinkConfig,
    /// The longest a request (for a broker: a job's publishes and their acknowledgements) may take;
    /// for a local write (`file`, `stdout`), which has no timeout of its own, only what the link's
    /// trial waits for.
    pub timeout: Duration,
    /// Requests in flight at once, 1-64; 1 keeps strict order.
    pub concurrency: usize,
    /// Bytes per second while a backlog drains; `None` is unlimited.
    pub replay_rate: Option<u64>,
}

impl SinkConfig {
    /// What the records of a stream delivered here must be.
    pub fn record_format(&self) -> RecordFormat {
        self.kind.settings().record_format()
    }

    /// Whether the sink sends a job stored as a zstd frame of lines as it is (so its streams store
    /// every job compressed under `compression: auto`).
    pub fn sends_zstd_lines(&self) -> bool {
        self.kind.settings().sends_zstd_lines()
    }

    /// For logs: the sink's type and target (never header values).
    pub fn describe(&self) -> String {
        self.kind.settings().describe(&self.name)
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

/// A sink ready to deliver: its settings and its kind's built sink (for HTTP, the client).
pub struct Sink {
    pub config: Arc<SinkConfig>,
    built: Built,
}

impl Sink {
    /// Builds the sink (for HTTP: reads TLS files, builds the client). Errors name the setting.
    pub fn new(config: Arc<SinkConfig>) -> Result<Sink, SettingError> {
        let built = config.kind.build(&config)?;
        Ok(Sink { config, built })
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Starts what the sink runs on its own (an MQTT connection), on the current runtime; until
    /// then a built sink holds no connection, so one built only to be checked (a reload that is
    /// refused later) never dials. Idempotent.
    pub fn start(&self) {
        self.built.start()
    }

    /// Whether a job stored as a zstd frame of lines is sent as it is ([`Payload::ZstdLines`]).
    pub fn sends_zstd_lines(&self) -> bool {
        self.config.sends_zstd_lines()
    }

    /// Whether several small jobs may go out in one request ([`Batch::group`]).
    pub fn sends_groups(&self) -> bool {
        self.config.kind.settings().sends_groups()
    }

    /// The body that carries `batch`: encoded (and for HTTP compressed), so its size is what goes
    /// over the wire and what `replay_rate` paces.
    pub async fn body(&self, batch: &Batch<'_>) -> Result<Vec<u8>, DeliveryError> {
        self.built.body(batch).await
    }

    /// Delivers `body` (made by [`Sink::body`] for `batch`).
    pub async fn send(&self, batch: &Batch<'_>, body: Vec<u8>) -> Result<(), DeliveryError> {
        self.built.send(batch, body).await
    }

    /// Delivers the file of a file job (`batch.file`), streamed from disk.
    pub async fn send_file(&self, batch: &Batch<'_>, file: &FileJob) -> Result<(), DeliveryError> {
        self.built.send_file(batch, file).await
    }

    /// Whether the destination can be reached again, for the link monitor.
    pub async fn probe(&self) -> Result<(), String> {
        self.built.probe(&self.config.link.probe).await
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
            kind: SinkKind::File(Box::new(file::FileConfig {
                dir: dir.to_path_buf(),
            })),
            retry: SinkRetry {
                base: Duration::from_secs(1),
                cap: Duration::from_secs(1),
                max_attempts: 1,
            },
            link: LinkConfig::default(),
            timeout: Duration::from_secs(10),
            concurrency: 1,
            replay_rate: None,
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
