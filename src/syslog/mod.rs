//! The `type: syslog` source: UDP and TCP listeners (TCP framed by octet counting or newlines,
//! RFC 6587) whose messages, parsed ([`parse`]), are appended to a stream as JSON records.
//!
//! The listeners ([`listen`]) parse what they read into chunks of records and hand them over a
//! bounded channel to one appender (this file), which gathers what is waiting into one append
//! (one commit) at a time. Syslog has no acknowledgement above TCP's, so a message counts as taken
//! once it is read; the channel and the one append in flight are all that is read and not yet
//! committed. Backpressure: under `when_full: block` the append waits in the store's writer, the
//! channel fills, TCP connections stop reading (the senders' TCP windows fill and they pause), and
//! UDP datagrams that find the channel full are dropped and counted (UDP has no way to pause a
//! sender). Owns the listeners and the appender of one source; the agent starts and stops it.

pub mod frame;
pub mod listen;
pub mod parse;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::store::writer::StoreHandle;
use crate::store::{AppendError, RecordBuf};
use crate::tail::record::Filter;

/// `max_message_bytes` when the config does not say.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 64 << 10;
/// `max_connections` when the config does not say.
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;

/// Chunks waiting for the appender. A chunk is what one read (16 KiB, or up to 256 datagrams and
/// 256 KiB) held, so this bounds what is read and not committed to 32 reads.
const CHANNEL_CHUNKS: usize = 32;
/// An append gathers waiting chunks up to about this much (the tail source's measure).
const APPEND_BYTES: usize = crate::tail::batch::APPEND_BYTES;
const APPEND_RECORDS: usize = crate::tail::batch::APPEND_RECORDS;
/// How long one append may wait for room in a full `block` stream before it is asked again.
const APPEND_WAIT: Duration = Duration::from_secs(3600);
/// An append waiting this long is reported (once) as "stream full, reading paused".
const SLOW_APPEND: Duration = Duration::from_secs(5);
/// How long appends may still take once colibri stops.
const STOP_WAIT: Duration = Duration::from_secs(2);
/// Waits between tries of an append that failed in the store.
const RETRY_BASE: Duration = Duration::from_millis(100);
const RETRY_CAP: Duration = Duration::from_secs(5);

/// A compiled `type: syslog` source.
#[derive(Debug, Clone)]
pub struct SyslogConfig {
    pub name: String,
    pub stream: String,
    pub udp: Option<SocketAddr>,
    pub tcp: Option<SocketAddr>,
    pub max_connections: usize,
    pub max_message_bytes: usize,
    /// Messages less severe than this (a larger number: 0 emergency .. 7 debug) are dropped;
    /// messages without a severity are kept.
    pub min_severity: Option<u8>,
    /// `include_lines` / `exclude_lines`, matched against the whole message as received.
    pub filter: Filter,
    /// A TCP connection silent this long is closed (`None`: never).
    pub idle_timeout: Option<Duration>,
    pub labels: Vec<(String, String)>,
}

impl SyslogConfig {
    pub fn describe(&self) -> String {
        let mut on = Vec::new();
        if let Some(a) = self.udp {
            on.push(format!("udp {a}"));
        }
        if let Some(a) = self.tcp {
            on.push(format!(
                "tcp {a} (at most {} connections)",
                self.max_connections
            ));
        }
        format!("syslog on {} -> stream {}", on.join(", "), self.stream)
    }
}

/// What a syslog source did since the process started (kept by name in the agent's registry, so
/// they outlive a reload; read by the metrics endpoint; logged at stop).
#[derive(Debug, Default)]
pub struct SyslogStats {
    /// Messages read (after framing), parsed or not, kept or filtered.
    pub messages: AtomicU64,
    pub bytes: AtomicU64,
    /// Messages kept whole because neither RFC describes them.
    pub unparsed: AtomicU64,
    /// Messages cut at `max_message_bytes`.
    pub truncated: AtomicU64,
    /// Messages dropped by `min_severity`, `include_lines` or `exclude_lines`.
    pub filtered: AtomicU64,
    /// Records the stream acknowledged as durable.
    pub records_appended: AtomicU64,
    /// Records the stream refused while full (`when_full: drop_newest`).
    pub records_dropped: AtomicU64,
    /// UDP messages dropped because the appender was behind (a full `block` stream).
    pub udp_dropped: AtomicU64,
    /// Records read and never stored: a store that failed at stop, or a record larger than the
    /// stream can ever hold.
    pub records_lost: AtomicU64,
    pub connections: AtomicU64,
    /// Connections closed at once because `max_connections` were open.
    pub connections_refused: AtomicU64,
    /// Connections closed for breaking the framing, or ended inside an octet-counted message.
    pub framing_errors: AtomicU64,
}

/// What the listeners share.
pub struct Shared {
    pub cfg: Arc<SyslogConfig>,
    pub stats: Arc<SyslogStats>,
    /// `,"labels":{...}` or empty, rendered once.
    pub labels: String,
}

/// Runs one source until `stopping`: binds its listeners (a port that cannot be bound is logged
/// and retried, so a reload or a start does not fail on it), then appends what they read.
pub async fn run(
    cfg: Arc<SyslogConfig>,
    stats: Arc<SyslogStats>,
    store: StoreHandle,
    stopping: CancellationToken,
) {
    let Some(stream) =
        crate::tail::stream_settings(&store, &cfg.name, &cfg.stream, &stopping).await
    else {
        return;
    };
    let shared = Arc::new(Shared {
        labels: render_labels(&cfg.labels),
        cfg: Arc::clone(&cfg),
        stats: Arc::clone(&stats),
    });
    let (tx, rx) = mpsc::channel(CHANNEL_CHUNKS);
    let mut listeners = tokio::task::JoinSet::new();
    if let Some(addr) = cfg.udp {
        listeners.spawn(listen::udp(
            addr,
            Arc::clone(&shared),
            tx.clone(),
            stopping.clone(),
        ));
    }
    if let Some(addr) = cfg.tcp {
        listeners.spawn(listen::tcp(
            addr,
            Arc::clone(&shared),
            tx.clone(),
            stopping.clone(),
        ));
    }
    drop(tx);
    let max_bytes = APPEND_BYTES.min(usize::try_from(stream.max_bytes / 4).unwrap_or(usize::MAX));
    append_loop(&cfg, &stats, &store, rx, max_bytes.max(1), &stopping).await;
    while listeners.join_next().await.is_some() {}
    tracing::info!(
        source = %cfg.name,
        stream = %cfg.stream,
        messages = stats.messages.load(Relaxed),
        bytes = stats.bytes.load(Relaxed),
        records_appended = stats.records_appended.load(Relaxed),
        records_dropped = stats.records_dropped.load(Relaxed),
        udp_dropped = stats.udp_dropped.load(Relaxed),
        records_lost = stats.records_lost.load(Relaxed),
        unparsed = stats.unparsed.load(Relaxed),
        truncated = stats.truncated.load(Relaxed),
        filtered = stats.filtered.load(Relaxed),
        connections = stats.connections.load(Relaxed),
        connections_refused = stats.connections_refused.load(Relaxed),
        framing_errors = stats.framing_errors.load(Relaxed),
        "syslog summary"
    );
}

fn render_labels(labels: &[(String, String)]) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let mut out = b",\"labels\":{".to_vec();
    for (i, (k, v)) in labels.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        parse::string(&mut out, k);
        out.push(b':');
        parse::string(&mut out, v);
    }
    out.push(b'}');
    String::from_utf8(out).expect("JSON written from strings is UTF-8")
}

/// Appends what the listeners send, one append at a time, until every listener has ended (they
/// end at `stopping`, after handing over what they read).
async fn append_loop(
    cfg: &SyslogConfig,
    stats: &SyslogStats,
    store: &StoreHandle,
    mut rx: mpsc::Receiver<RecordBuf>,
    max_bytes: usize,
    stopping: &CancellationToken,
) {
    let mut full_logged = false;
    while let Some(mut records) = rx.recv().await {
        while records.len() < APPEND_RECORDS && records.record_bytes() < max_bytes {
            match rx.try_recv() {
                Ok(more) => records.extend_from(&more),
                Err(_) => break,
            }
        }
        let records = Arc::new(records);
        let n = records.len() as u64;
        let mut attempt = 0u32;
        loop {
            let wait = if stopping.is_cancelled() {
                STOP_WAIT
            } else {
                APPEND_WAIT
            };
            let append = store.append_shared(&cfg.stream, Arc::clone(&records), None, Some(wait));
            tokio::pin!(append);
            // An append that waits this long waits for room: the listeners are paused meanwhile.
            let outcome = tokio::select! {
                o = &mut append => o,
                _ = tokio::time::sleep(SLOW_APPEND), if !full_logged => {
                    tracing::warn!(source = %cfg.name, stream = %cfg.stream, "stream full: reading paused (TCP senders wait, UDP messages are dropped and counted)");
                    full_logged = true;
                    append.await
                }
            };
            match outcome {
                Ok(_) => {
                    stats.records_appended.fetch_add(n, Relaxed);
                    if full_logged {
                        tracing::info!(source = %cfg.name, stream = %cfg.stream, "stream has room again: reading resumed");
                        full_logged = false;
                    }
                    break;
                }
                Err(AppendError::Refused { records, .. }) => {
                    stats.records_dropped.fetch_add(records, Relaxed);
                    break;
                }
                Err(AppendError::Full { reason, .. }) if !stopping.is_cancelled() => {
                    if !full_logged {
                        tracing::warn!(source = %cfg.name, stream = %cfg.stream, %reason, "stream full: reading paused (TCP senders wait, UDP messages are dropped and counted)");
                        full_logged = true;
                    }
                }
                Err(e @ AppendError::TooLarge { .. }) => {
                    tracing::error!(source = %cfg.name, stream = %cfg.stream, error = %e, records = n, "records can never be stored in this stream: dropped");
                    stats.records_lost.fetch_add(n, Relaxed);
                    break;
                }
                Err(e) if stopping.is_cancelled() => {
                    tracing::error!(source = %cfg.name, stream = %cfg.stream, error = %e, records = n, "colibri is stopping: records read and not stored are lost");
                    stats.records_lost.fetch_add(n, Relaxed);
                    break;
                }
                Err(e) => {
                    if attempt == 0 {
                        tracing::warn!(source = %cfg.name, stream = %cfg.stream, error = %e, "append failed; retrying");
                    }
                    let pause = crate::backoff::jittered(attempt, RETRY_BASE, RETRY_CAP);
                    attempt = attempt.saturating_add(1);
                    tokio::select! {
                        _ = stopping.cancelled() => {}
                        _ = tokio::time::sleep(pause) => {}
                    }
                }
            }
        }
    }
}
