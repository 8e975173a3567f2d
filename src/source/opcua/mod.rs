//! The `type: opcua` source (feature `opcua`): reads nodes of an OPC UA server, by subscription
//! (monitored items, the server reports each change) or by polling reads, and appends each data
//! change as one record (`record`: line protocol for a metrics stream, JSON otherwise) with its
//! source and server timestamps and its status.
//!
//! The session ([`session`]) owns the connection and comes back by itself: a dropped connection,
//! an expired session or a restarted server ends the session, and a new one is made from
//! nothing after a backoff (namespace URIs looked up again, so `nsu=` ids survive a server that
//! renumbered its namespaces; the subscription taken over, or made again with its items on a
//! server that lost it; one log line says what was restored). A node the server does not know is logged once, counted, and asked for
//! again every [`RETRY_UNKNOWN`] while the others go on. The appender ([`append`]) turns what
//! the session hands it into appends.
//!
//! **A notification is acknowledged only after the commit that holds it** ([`subscription`]:
//! colibri sends the Publish requests itself, the appender's acknowledgements in them), and a
//! session that follows a lost one, or colibri's next start, takes the subscription over and has
//! the server send again what was not acknowledged. So a kill -9 loses nothing the server still
//! had: what repeats is what was committed and not yet acknowledged when the process died (at
//! most the [`CHANNEL_MESSAGES`] messages waiting for the appender and the one it was
//! appending). The server's own limits bound it: it keeps the subscription for
//! `subscription::LIFETIME` without colibri, each item's last `queue_size` changes, and a
//! retransmission queue of its choosing. Polled values are never acknowledged: a kill -9 loses
//! the poll in flight. Owns one source's session and appender; the agent starts and stops it.

pub mod append;
pub mod browse;
pub mod connect;
pub mod node;
pub mod record;
pub mod session;
pub mod subscription;

pub use config::OpcuaSourceSpec as Spec;

pub mod config;

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::setting::Secret;
use crate::store::writer::StoreHandle;
use node::NodeRef;
use record::Output;

/// How often nodes the server did not know are asked for again.
pub const RETRY_UNKNOWN: Duration = Duration::from_secs(60);
/// Messages (a notification message's changes, or a poll's values) read and not yet appended:
/// beyond, the session waits and sends no Publish request, so the server holds what changes.
pub const CHANNEL_MESSAGES: usize = 16;

/// A compiled `type: opcua` source.
#[derive(Debug, Clone)]
pub struct OpcuaSourceConfig {
    pub name: String,
    pub endpoint: Endpoint,
    pub stream: String,
    pub mode: Mode,
    /// Where the subscription's id is kept for colibri's next start (`subscription::Saved`).
    pub state_file: std::path::PathBuf,
    pub measurement: String,
    pub output: Output,
    pub nodes: Vec<Node>,
    /// Folders browsed at every session for more nodes.
    pub folders: Vec<Folder>,
}

/// A `browse` entry: the variables under `folder` whose browse name matches `pattern`.
#[derive(Debug, Clone)]
pub struct Folder {
    pub folder: NodeRef,
    pub pattern: Option<regex_lite::Regex>,
    pub depth: usize,
    /// The settings each variable found is read with (its id and name replaced).
    pub template: Node,
}

/// A server and how colibri connects to it (the source's, or `opcua browse`'s).
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// `opc.tcp://host:port/path`.
    pub url: String,
    pub security: Security,
    /// Anonymous when unset.
    pub username: Option<String>,
    pub password: Option<Secret>,
    /// A user certificate and its private key, the identity instead of a user name.
    pub user_certificate: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// colibri's certificate and key, and the servers it trusts.
    pub pki_dir: std::path::PathBuf,
    pub trust_on_first_use: bool,
}

/// How the source reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Monitored items in one subscription with this publishing interval.
    Subscribe(Duration),
    /// A Read of every node at this interval.
    Poll(Duration),
}

/// The security policy (as OPC UA's URI ends) and message security mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Security {
    pub policy: String,
    pub mode: String,
}

/// A server-side data change filter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Deadband {
    Absolute(f64),
    Percent(f64),
}

/// One node to read, with its settings.
#[derive(Debug, Clone)]
pub struct Node {
    pub id: NodeRef,
    /// The name its records carry.
    pub name: String,
    pub sampling: Duration,
    pub queue_size: u32,
    pub deadband: Option<Deadband>,
    /// Its tags (the source's and its own), sorted by key.
    pub tags: Vec<(String, String)>,
}

impl OpcuaSourceConfig {
    pub fn describe(&self) -> String {
        let how = match self.mode {
            Mode::Subscribe(d) => format!("subscribed every {}", crate::units::fmt_duration(d)),
            Mode::Poll(d) => format!("polled every {}", crate::units::fmt_duration(d)),
        };
        let folders = match self.folders.len() {
            0 => String::new(),
            1 => " and the variables of 1 folder".into(),
            n => format!(" and the variables of {n} folders"),
        };
        format!(
            "opcua {} ({} {}): {} nodes{folders} {how} -> stream {}",
            self.endpoint.url,
            self.endpoint.security.policy,
            self.endpoint.security.mode,
            self.nodes.len(),
            self.stream
        )
    }
}

crate::counters::counters! {
    /// What an opcua source did since the process started (kept by name in the agent's
    /// registry, so they outlive a reload; read by the metrics endpoint; logged at stop).
    pub struct OpcuaSourceStats, logged as "opcua source summary" by source {
        /// 1 while a session is up.
        connected => ("colibri_opcua_source_connected", "1 while an opcua source has a session with its server."),
        /// Sessions made (the first, and each one after a loss).
        sessions => ("colibri_opcua_source_sessions_total", "Sessions an opcua source made with its server (the first and each one after a loss)."),
        /// Sessions lost or refused, and connections that failed.
        session_failures => ("colibri_opcua_source_session_failures_total", "Connections and sessions that failed, were refused or were lost."),
        /// Nodes read now (monitored, or polled), and nodes the server does not know.
        items_ok => ("colibri_opcua_source_items" [state = "ok"], "Nodes an opcua source reads now, and nodes its server does not know."),
        items_unknown => ("colibri_opcua_source_items" [state = "unknown"]),
        /// Data changes (or polled values) received.
        notifications => ("colibri_opcua_source_notifications_total", "Data changes (or polled values) an opcua source received."),
        /// Records the stream committed.
        records_appended => ("colibri_opcua_source_records_total", "Records an opcua source appended (durable)."),
        /// Records a full `drop_newest` stream refused.
        records_dropped => ("colibri_opcua_source_dropped_total", "Records refused by a full drop_newest stream."),
        /// Records no stream can hold (larger than a job may be), and polled values still
        /// unstored at the stop (a subscription's are left unacknowledged with the server).
        records_lost => ("colibri_opcua_source_lost_total", "Records no stream can hold, and polled values still unstored at the stop."),
        /// Changes the server marked with the Overflow bit: it had discarded older values of the
        /// item (more changes between two Publishes than its `queue_size`).
        overflows => ("colibri_opcua_source_overflows_total", "Changes the server marked as overflowed: it had discarded older values of the item (raise queue_size)."),
        /// Unix time (seconds) of the last data change received: its age is the gap.
        last_change => ("colibri_opcua_source_last_change_timestamp_seconds", "Unix time of the last data change an opcua source received (time() minus it: the gap)."),
    }
}

impl crate::source::kind::Settings for OpcuaSourceConfig {
    fn name(&self) -> &str {
        &self.name
    }

    fn streams(&self) -> Vec<&str> {
        vec![self.stream.as_str()]
    }

    fn describe(&self) -> String {
        OpcuaSourceConfig::describe(self)
    }

    fn follows_sink_format(&self) -> bool {
        true
    }
}

impl crate::source::kind::KindConfig for OpcuaSourceConfig {
    type Stats = OpcuaSourceStats;

    fn run(
        self: Arc<Self>,
        stats: Arc<OpcuaSourceStats>,
        store: StoreHandle,
        stopping: CancellationToken,
        _sockets: crate::source::Sockets,
    ) -> impl std::future::Future<Output = ()> + Send {
        run(self, stats, store, stopping)
    }
}

/// Runs one source until `stopping`: sessions one after another, their records appended.
pub async fn run(
    cfg: Arc<OpcuaSourceConfig>,
    stats: Arc<OpcuaSourceStats>,
    store: StoreHandle,
    stopping: CancellationToken,
) {
    let Some(stream) = store
        .stream_settings(&cfg.name, &cfg.stream, &stopping)
        .await
    else {
        return;
    };
    let limits = crate::store::AppendLimits::for_stream(&stream).per_append();
    let (tx, rx) = tokio::sync::mpsc::channel(CHANNEL_MESSAGES);
    let (ack_tx, ack_rx) = tokio::sync::mpsc::unbounded_channel();
    let appender = tokio::spawn(append::run(
        Arc::clone(&cfg),
        Arc::clone(&stats),
        store,
        limits,
        rx,
        ack_tx,
        stopping.clone(),
    ));
    session::run(Arc::clone(&cfg), Arc::clone(&stats), tx, ack_rx, stopping).await;
    // The session has ended and dropped its sender: the appender stores what is left, then ends.
    if appender.await.is_err() {
        tracing::error!(source = %cfg.name, "opcua appender failed");
    }
    stats.log_summary(&cfg.name);
}
