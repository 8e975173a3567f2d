//! The `type: syslog` source: UDP and TCP listeners (TCP framed by octet counting or newlines,
//! RFC 6587) whose messages, parsed ([`parse`]), are appended to a stream as JSON records.
//!
//! The listeners ([`listen`]) parse what they read into chunks of records and hand them over a
//! channel to one appender ([`append`]), which gathers what is waiting into one append (one
//! commit) at a time. Syslog has no acknowledgement above TCP's, so a message counts as taken once
//! it is read; what is read and not yet committed is bounded by a budget of record bytes the
//! readers take a share of before handing a chunk over. Backpressure: under `when_full: block` the
//! append waits in the store's writer, the budget is spent, TCP connections stop reading (the
//! senders' TCP windows fill and they pause), and UDP datagrams that find it spent are dropped and
//! counted (UDP has no way to pause a sender). Owns the listeners and the appender of one source;
//! the agent starts and stops it.

pub mod append;
pub mod frame;
pub mod listen;
pub mod parse;
pub mod udp;

pub use config::SyslogSpec as Spec;

mod config;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::record::filter::Filter;
use crate::store::writer::StoreHandle;

/// `max_message_bytes` when the config does not say.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 64 << 10;
/// `max_connections` when the config does not say.
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;
/// `idle_timeout` when the config does not say. Long enough that a quiet sender is not made to
/// reconnect more than a few times an hour (rsyslog, syslog-ng and `logger` connect again for the
/// next message), short enough that connections a vanished or hostile peer left open give back
/// their slot and read buffer within minutes rather than never.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(600);

/// How long a stopping source waits for its appender before leaving it to finish on its own.
const STOP_WAIT: Duration = Duration::from_secs(2);

/// A compiled `type: syslog` source.
#[derive(Debug, Clone)]
pub struct SyslogConfig {
    pub name: String,
    pub stream: String,
    pub udp: Option<SocketAddr>,
    /// `SO_RCVBUF` of the UDP socket, in bytes (`None`: the kernel's default).
    pub receive_buffer: Option<usize>,
    pub tcp: Option<SocketAddr>,
    pub max_connections: usize,
    pub max_message_bytes: usize,
    /// Messages less severe than this (a larger number: 0 emergency .. 7 debug) are dropped;
    /// messages without a severity are kept.
    pub min_severity: Option<u8>,
    /// `include_lines` / `exclude_lines`, matched against the whole message as received.
    pub filter: Filter,
    /// A TCP connection silent this long is closed.
    pub idle_timeout: Duration,
    pub labels: Vec<(String, String)>,
    /// TLS on the TCP listener.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

impl crate::source::kind::Settings for SyslogConfig {
    fn name(&self) -> &str {
        &self.name
    }

    fn streams(&self) -> Vec<&str> {
        vec![&self.stream]
    }

    fn listens(&self) -> Vec<crate::source::Listen> {
        let udp = self.udp.map(|a| ("udp", "udp", a));
        let tcp = self.tcp.map(|a| ("tcp", "tcp", a));
        udp.into_iter().chain(tcp).collect()
    }

    fn bind(&self) -> anyhow::Result<crate::source::Sockets> {
        Ok(crate::source::Sockets {
            syslog: bind(self)
                .map_err(|e| anyhow::anyhow!("{e} (sources.{}.{})", self.name, e.proto))?,
        })
    }

    fn describe(&self) -> String {
        let mut on = Vec::new();
        if let Some(a) = self.udp {
            match self.receive_buffer {
                Some(b) => on.push(format!("udp {a} (receive buffer {b} bytes)")),
                None => on.push(format!("udp {a}")),
            }
        }
        if let Some(a) = self.tcp {
            let tls = if self.tls.is_some() { "TLS, " } else { "" };
            on.push(format!(
                "tcp {a} ({tls}at most {} connections)",
                self.max_connections
            ));
        }
        format!("syslog on {} -> stream {}", on.join(", "), self.stream)
    }
}

crate::counters::counters! {
    /// What a syslog source did since the process started (kept by name in the agent's registry,
    /// so they outlive a reload; read by the metrics endpoint; logged at stop).
    pub struct SyslogStats, logged as "syslog summary" by source with { stream: &str } {
        /// Messages read (after framing), parsed or not, kept or filtered.
        messages => ("colibri_syslog_messages_total", "Messages a syslog source read (parsed or not, kept or filtered)."),
        bytes,
        /// Records the stream acknowledged as durable.
        records_appended => ("colibri_syslog_records_total", "Records a syslog source appended (durable)."),
        /// Records the stream refused while full (`when_full: drop_newest`).
        records_dropped => ("colibri_syslog_dropped_total", "Records refused by a full drop_newest stream."),
        /// UDP messages dropped because the appender was behind (a full `block` stream).
        udp_dropped => ("colibri_syslog_udp_dropped_total", "UDP messages dropped because the stream could not take them (a full block stream)."),
        /// UDP datagrams the kernel dropped before colibri read them: the socket's receive buffer
        /// was full (`receive_buffer`).
        udp_receive_buffer_dropped => ("colibri_syslog_udp_receive_buffer_dropped_total", "UDP datagrams the kernel dropped before colibri read them because the socket's receive buffer was full."),
        /// Records read and never stored: a store that failed at stop, or a record larger than the
        /// stream can ever hold.
        records_lost => ("colibri_syslog_lost_total", "Records read and never stored: unstorable, or still unstored when colibri stopped."),
        /// Messages kept whole because neither RFC describes them.
        unparsed => ("colibri_syslog_unparsed_total", "Messages neither RFC 5424 nor RFC 3164 describes, kept whole."),
        /// Messages cut at `max_message_bytes`.
        truncated => ("colibri_syslog_truncated_total", "Messages cut at max_message_bytes."),
        /// Messages dropped by `min_severity`, `include_lines` or `exclude_lines`.
        filtered => ("colibri_syslog_filtered_total", "Messages dropped by min_severity, include_lines or exclude_lines."),
        connections => ("colibri_syslog_connections_total", "TCP connections accepted."),
        /// Idle connections closed to make room for a newcomer because `max_connections` were open.
        connections_closed_idle => ("colibri_syslog_idle_connections_closed_total", "Idle TCP connections closed to make room for a newcomer because max_connections were open."),
        /// Connections closed for breaking the framing, or ended inside an octet-counted message.
        framing_errors => ("colibri_syslog_framing_errors_total", "TCP connections closed for a broken octet-counting frame, or ended inside one."),
        /// TLS connections whose handshake failed or timed out (no certificate the CA signed, a
        /// plain-text client).
        tls_failures => ("colibri_syslog_tls_failures_total", "TLS connections whose handshake failed or timed out."),
        /// Messages cut short because colibri stopped reading (a stop or reload) or the connection
        /// broke mid-message: not stored (they are not what the sender sent).
        cut => ("colibri_syslog_cut_total", "Messages cut short by a stop, a reload or a broken connection, and not stored."),
    }
}

/// What the listeners share.
pub struct Shared {
    pub cfg: Arc<SyslogConfig>,
    pub stats: Arc<SyslogStats>,
    /// `,"labels":{...}` or empty, rendered once.
    pub labels: String,
    /// Bytes of records read and not yet committed ([`append::BUDGET_BYTES`]).
    pub budget: Arc<tokio::sync::Semaphore>,
}

/// The sockets of a source, bound before it runs: at colibri's start a port that is taken stops
/// the start, naming the source and the address.
#[derive(Default)]
pub struct Bound {
    pub udp: Option<udp::Opened>,
    pub tcp: Option<tokio::net::TcpListener>,
}

/// A socket of a source that cannot be bound.
#[derive(Debug)]
pub struct BindError {
    /// `udp` or `tcp`: the setting that names the address.
    pub proto: &'static str,
    pub addr: SocketAddr,
    pub error: std::io::Error,
}

impl std::fmt::Display for BindError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let BindError { proto, addr, error } = self;
        write!(f, "cannot listen on {proto} {addr}: {error}")
    }
}

impl std::error::Error for BindError {}

/// Binds the source's sockets now (inside the runtime).
pub fn bind(cfg: &SyslogConfig) -> Result<Bound, BindError> {
    let failed = |proto, addr| move |error| BindError { proto, addr, error };
    let udp = cfg
        .udp
        .map(|a| udp::open(a, cfg.receive_buffer).map_err(failed("udp", a)))
        .transpose()?;
    let tcp = cfg
        .tcp
        .map(|a| crate::net::server::bind(a).map_err(failed("tcp", a)))
        .transpose()?;
    Ok(Bound { udp, tcp })
}

impl crate::source::kind::KindConfig for SyslogConfig {
    type Stats = SyslogStats;

    fn run(
        self: Arc<Self>,
        stats: Arc<SyslogStats>,
        store: StoreHandle,
        stopping: CancellationToken,
        sockets: crate::source::Sockets,
    ) -> impl std::future::Future<Output = ()> + Send {
        run(self, stats, store, stopping, sockets.syslog)
    }
}

/// Runs one source until `stopping`: takes its sockets from `bound` (at colibri's start) or binds
/// them (a source a reload started: a port that cannot be bound is logged and retried, so a
/// reload does not fail on it), then appends what they read.
pub async fn run(
    cfg: Arc<SyslogConfig>,
    stats: Arc<SyslogStats>,
    store: StoreHandle,
    stopping: CancellationToken,
    bound: Bound,
) {
    let Some(stream) = store
        .stream_settings(&cfg.name, &cfg.stream, &stopping)
        .await
    else {
        return;
    };
    let shared = Arc::new(Shared {
        labels: crate::record::labels_field(&cfg.labels)
            .map_or_else(String::new, |l| format!(",{l}")),
        cfg: Arc::clone(&cfg),
        stats: Arc::clone(&stats),
        budget: append::budget(),
    });
    // Unbounded in count, bounded in bytes by the budget the readers wait for (at the stop each
    // connection may hand over one last read without waiting).
    let (tx, rx) = mpsc::unbounded_channel();
    let mut appender = tokio::spawn(append::run(
        Arc::clone(&cfg),
        Arc::clone(&stats),
        store.clone(),
        stream,
        rx,
        stopping.clone(),
    ));
    let mut listeners = tokio::task::JoinSet::new();
    if let Some(addr) = cfg.udp {
        listeners.spawn(listen::udp(
            addr,
            Arc::clone(&shared),
            tx.clone(),
            stopping.clone(),
            bound.udp,
        ));
    }
    if let Some(addr) = cfg.tcp {
        listeners.spawn(listen::tcp(
            addr,
            Arc::clone(&shared),
            tx.clone(),
            stopping.clone(),
            bound.tcp,
        ));
    }
    drop(tx);
    while listeners.join_next().await.is_some() {}
    if tokio::time::timeout(STOP_WAIT, &mut appender)
        .await
        .is_err()
    {
        tracing::info!(source = %cfg.name, stream = %cfg.stream, "syslog records read and waiting for room in the stream are left with their appender: stored when the stream has room (or counted lost if colibri stops first)");
    }
    stats.log_summary(&cfg.name, &cfg.stream);
}
