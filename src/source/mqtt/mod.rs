//! The `type: mqtt` source (feature `mqtt`): subscribes to topic filters on an MQTT 5 broker
//! with a persistent session and appends each message, as one JSON record ([`record`]), to the
//! stream its topic routes to; **a QoS 1 message is PUBACKed (a QoS 2 one PUBRECed) only after
//! the commit that holds it**.
//!
//! The session driver ([`session`]) owns the connection: it reads messages, makes their records
//! and hands them to the appender ([`append`]), which gathers what is waiting into one append per
//! stream (one commit) and hands the acknowledgements back, in the order the messages came. So a
//! colibri killed at any moment leaves every message it had not acknowledged with the broker,
//! which sends it again: nothing is lost, and what repeats is what was committed and not yet
//! acknowledged. That is bounded by colibri, not by the broker: a message owed an
//! acknowledgement takes a slot of a window of `max_in_flight` before its commit, given back only
//! once its acknowledgement is written (or its connection has ended), so at most `max_in_flight`
//! messages are ever committed and not acknowledged, and a kill -9 or a broken connection stores
//! at most that many twice. The window is also the MQTT 5 Receive Maximum colibri asks for, but a
//! broker need not keep to it (mosquitto 2.0 sends its whole queue once acknowledgements flow):
//! what it sends beyond waits in memory, uncommitted, under the budget below. The session
//! outlives colibri (`session_expiry`): what is published while colibri is down waits in the
//! broker. Backpressure: a stream that blocks holds the appender, no acknowledgement goes out,
//! and the broker holds the rest; QoS 0 messages (never acknowledged) that find the
//! memory budget spent are dropped and counted. Owns one source's session and appender; the
//! agent starts and stops it.

pub mod append;
pub mod record;
pub mod session;
pub mod topic;

pub use config::MqttSourceSpec as Spec;

mod config;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use crate::net::tls_client::TlsConfig;
use crate::setting::Secret;
use crate::store::writer::StoreHandle;

/// `max_in_flight` when the config does not say.
pub const DEFAULT_MAX_IN_FLIGHT: u16 = 1000;
/// `max_message_bytes` when the config does not say.
pub const DEFAULT_MAX_MESSAGE_BYTES: u32 = 1 << 20;
/// Bytes of QoS 1 and 2 records read and not yet committed: a message that finds it spent waits
/// for it, and reading with it (the broker's window bounds them first, as a rule).
pub const BUDGET_BYTES: usize = 8 << 20;
/// The same for QoS 0 records, apart: a message that finds it spent is dropped and counted.
pub const QOS0_BUDGET_BYTES: usize = 4 << 20;

/// A compiled `type: mqtt` source.
#[derive(Debug, Clone)]
pub struct MqttSourceConfig {
    pub name: String,
    /// Where a message goes when no route takes it.
    pub stream: String,
    /// Topic filter → stream, the first that matches a message's topic wins.
    pub routes: Vec<(String, String)>,
    /// The filters subscribed to.
    pub topics: Vec<String>,
    /// The QoS subscribed with (0, 1 or 2): the broker sends each message at the lower of this
    /// and the QoS it was published with.
    pub qos: u8,
    pub host: String,
    pub port: u16,
    /// `mqtts://`: TLS with these settings.
    pub tls: Option<TlsConfig>,
    pub client_id: String,
    pub username: Option<String>,
    pub password: Option<Secret>,
    pub keep_alive: Duration,
    /// How long the broker keeps the session (and what is published for it) while colibri is
    /// away.
    pub session_expiry: Duration,
    /// Longest wait for a CONNACK.
    pub timeout: Duration,
    /// The Receive Maximum: QoS 1 and 2 messages the broker may have unacknowledged at once.
    pub max_in_flight: u16,
    /// The Maximum Packet Size colibri announces: the broker does not send larger messages.
    pub max_message_bytes: u32,
    pub labels: Vec<(String, String)>,
}

impl MqttSourceConfig {
    /// The name the broker's certificate is checked for (and SNI sent to).
    pub fn server_name(&self) -> String {
        self.tls
            .as_ref()
            .and_then(|t| t.server_name.clone())
            .unwrap_or_else(|| self.host.clone())
    }

    /// The broker's address, for messages (no credentials).
    pub fn shown(&self) -> String {
        let scheme = if self.tls.is_some() { "mqtts" } else { "mqtt" };
        format!("{scheme}://{}:{}", self.host, self.port)
    }

    /// Every stream its messages may go to: `stream` first, then the routes' in order.
    pub fn streams(&self) -> Vec<&str> {
        let mut out = vec![self.stream.as_str()];
        for (_, s) in &self.routes {
            if !out.contains(&s.as_str()) {
                out.push(s);
            }
        }
        out
    }

    /// The index in [`Self::streams`] of the stream `topic` goes to.
    pub fn route<S: AsRef<str>>(&self, topic: &str, streams: &[S]) -> usize {
        self.routes
            .iter()
            .find(|(f, _)| topic::matches(f, topic))
            .and_then(|(_, s)| streams.iter().position(|x| x.as_ref() == s))
            .unwrap_or(0)
    }

    pub fn describe(&self) -> String {
        let routes = match self.routes.len() {
            0 => String::new(),
            1 => " (and 1 route)".to_string(),
            n => format!(" (and {n} routes)"),
        };
        format!(
            "mqtt {} subscribed to {} at QoS {} -> stream {}{routes}",
            self.shown(),
            self.topics.join(", "),
            self.qos,
            self.stream
        )
    }
}

crate::counters::counters! {
    /// What an mqtt source did since the process started (kept by name in the agent's registry,
    /// so they outlive a reload; read by the metrics endpoint; logged at stop).
    pub struct MqttSourceStats, logged as "mqtt source summary" by source {
        /// Messages received (a message the broker sends again counts again).
        messages => ("colibri_mqtt_source_messages_total", "Messages an mqtt source received (a message the broker sent again counts again)."),
        /// Their payload bytes.
        bytes => ("colibri_mqtt_source_bytes_total", "Their payload bytes."),
        /// Records the streams acknowledged as durable.
        records_appended => ("colibri_mqtt_source_records_total", "Records an mqtt source appended (durable, then acknowledged)."),
        /// Records a full `drop_newest` stream refused (acknowledged: the stream's policy took them).
        records_dropped => ("colibri_mqtt_source_dropped_total", "Records refused by a full drop_newest stream (acknowledged)."),
        /// QoS 0 messages dropped because the budget of what is read and not committed was spent.
        qos0_dropped => ("colibri_mqtt_source_qos0_dropped_total", "QoS 0 messages dropped because the stream could not keep up."),
        /// Records no stream can hold (larger than a job may be): acknowledged and dropped; and
        /// QoS 0 messages read and still unstored when colibri stopped (no one sends them again).
        records_lost => ("colibri_mqtt_source_lost_total", "Messages no stream can hold (larger than a job may be), acknowledged and dropped, and QoS 0 messages still unstored when colibri stopped."),
        /// Payloads that were not UTF-8, kept as base64.
        binary => ("colibri_mqtt_source_binary_total", "Payloads that were not UTF-8, kept as base64."),
        /// Messages of no configured filter (a subscription an older config left in the session):
        /// acknowledged and dropped.
        unsubscribed => ("colibri_mqtt_source_unsubscribed_total", "Messages of no configured topic filter (a subscription an older config left in the session): acknowledged and dropped."),
        /// Messages committed whose acknowledgement could not go out (their connection had ended):
        /// the broker sends them again, and they are stored twice.
        acks_lost => ("colibri_mqtt_source_acks_lost_total", "Messages committed whose acknowledgement could not go out (their connection had ended): sent again by the broker, stored twice."),
        /// CONNACKs that accepted colibri.
        connects => ("colibri_mqtt_source_connects_total", "Connections the broker accepted."),
        /// Connections that failed or were refused, and connections that broke.
        connection_failures => ("colibri_mqtt_source_connection_failures_total", "Connections that failed, were refused or broke."),
        /// Topic filters the broker refused to subscribe colibri to.
        subscriptions_refused => ("colibri_mqtt_source_subscriptions_refused_total", "Topic filters the broker refused to subscribe to."),
    }
}

impl crate::source::kind::Settings for MqttSourceConfig {
    fn name(&self) -> &str {
        &self.name
    }

    fn streams(&self) -> Vec<&str> {
        MqttSourceConfig::streams(self)
    }

    fn describe(&self) -> String {
        MqttSourceConfig::describe(self)
    }
}

impl crate::source::kind::KindConfig for MqttSourceConfig {
    type Stats = MqttSourceStats;

    fn run(
        self: Arc<Self>,
        stats: Arc<MqttSourceStats>,
        store: StoreHandle,
        stopping: CancellationToken,
        _sockets: crate::source::Sockets,
    ) -> impl std::future::Future<Output = ()> + Send {
        run(self, stats, store, stopping)
    }
}

/// Runs one source until `stopping`: connects (retrying; a refusal is logged once per outage),
/// subscribes, and appends what arrives. At a stop, what was received and not committed is left
/// unacknowledged: the broker sends it again to the next session.
pub async fn run(
    cfg: Arc<MqttSourceConfig>,
    stats: Arc<MqttSourceStats>,
    store: StoreHandle,
    stopping: CancellationToken,
) {
    let mut streams = Vec::new();
    for name in cfg.streams() {
        let Some(s) = store.stream_settings(&cfg.name, name, &stopping).await else {
            return;
        };
        streams.push(s);
    }
    let (client, events) = match session::build(&cfg) {
        Ok(c) => c,
        Err(e) => {
            // The config check builds the same client: only a file changed since can fail here.
            tracing::error!(source = %cfg.name, field = %e.field, "mqtt source not started: {}", e.message);
            return;
        }
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let (ack_tx, ack_rx) = mpsc::unbounded_channel();
    let window = Arc::new(Semaphore::new(usize::from(cfg.max_in_flight)));
    let appender = tokio::spawn(append::run(
        Arc::clone(&cfg),
        Arc::clone(&stats),
        store,
        streams,
        rx,
        ack_tx,
        Arc::clone(&window),
        stopping.clone(),
    ));
    session::Driver::new(Arc::clone(&cfg), Arc::clone(&stats), client, window)
        .run(events, tx, ack_rx, stopping)
        .await;
    // The driver ends after the appender, or after its wait for it. An append still waiting for
    // room stays queued in the store's writer (until the room comes, or colibri's stop answers
    // it): its messages were not acknowledged, so the broker sends them again to the next
    // session, and they may be stored twice, never lost.
    appender.abort();
    stats.log_summary(&cfg.name);
}
