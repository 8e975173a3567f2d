//! The mqtt source's connection (rumqttc-v5-next, MQTT 5): the client options (a persistent
//! session resumed at every connect, manual acknowledgements, the Receive Maximum and Maximum
//! Packet Size, TLS, credentials), and the driver task that polls the event loop: it reconnects
//! after a pause, subscribes when the broker has no session for colibri, turns each message into
//! a record for the appender, and sends the acknowledgements the appender hands back. Owns the
//! connection and its numbering; the records' shape is [`super::record`]'s, the appends
//! [`super::append`]'s. Started by [`super::run`].
//!
//! An acknowledgement names a packet id, which means something only on the connection the
//! message came on (and, with a kept session, on those after it, where the broker sends it again
//! under the same id): rumqttc refuses an ack for an id its current connection has not received,
//! by dropping the connection. So each message carries the number of its connection, and an ack
//! for an older connection is not sent (counted in `acks_lost`): the broker sends that message
//! again, and it is stored twice rather than acknowledged for another. The check and the send are
//! made in this task, between polls, so no connection can change in between; acks queued to the
//! client when a connection breaks are dropped by rumqttc itself.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use rumqttc::{
    AsyncClient, ConnectReturnCode, ConnectionError, Event, EventLoop, Incoming, ManualAck,
    MqttOptions, PubAck, PubRec, QoS, RetainForwardRule, SubscribeFilter, SubscribeReasonCode,
    TlsConfiguration, Transport,
};
use tokio::sync::{Semaphore, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::append::{Ack, Msg};
use super::{BUDGET_BYTES, MqttSourceConfig, MqttSourceStats};
use crate::net::client::chain;
use crate::sink::SettingError;

/// The longest pause between connection attempts.
const MAX_PAUSE: Duration = Duration::from_secs(30);
/// How long a stopping driver waits for the appender's last acknowledgements.
const STOP_WAIT: Duration = Duration::from_secs(2);

/// The client and its event loop; nothing is dialled. Reads the TLS files.
pub fn build(cfg: &MqttSourceConfig) -> Result<(AsyncClient, EventLoop), SettingError> {
    let mut opts = MqttOptions::new(
        cfg.client_id.clone(),
        rumqttc::Broker::tcp(cfg.server_name(), cfg.port),
    );
    if let Some(tls) = &cfg.tls {
        let config = crate::sink::tls_client_config(tls)?;
        opts.set_transport(Transport::tls_with_config(TlsConfiguration::Rustls(
            Arc::new(config),
        )));
    }
    // With `tls.server_name`, the certificate is checked for that name while the URL's host is
    // dialled.
    let dial = (cfg.server_name() != cfg.host).then(|| format!("{}:{}", cfg.host, cfg.port));
    opts.set_socket_connector(move |addr, net| crate::sink::mqtt_connect(dial.clone(), addr, net));
    let mut net = rumqttc::NetworkOptions::new();
    net.set_tcp_nodelay(true);
    opts.set_network_options(net);
    let expiry = u32::try_from(cfg.session_expiry.as_secs()).unwrap_or(u32::MAX);
    opts.set_keep_alive(u16::try_from(cfg.keep_alive.as_secs()).unwrap_or(u16::MAX))
        .set_connect_timeout(cfg.timeout)
        // Always the session the broker kept: what was published while colibri was away, and
        // what it had not acknowledged when it stopped, is sent to it now.
        .set_clean_start(false)
        .set_session_expiry_interval(Some(expiry))
        // The session the broker kept holds only what it sends colibri (colibri publishes
        // nothing): nothing of it needs local state this process lacks. A QoS 2 message
        // PUBRECed by the process before is completed by the broker's PUBREL, which rumqttc
        // answers without knowing it.
        .set_broker_session_resume_policy(rumqttc::BrokerSessionResumePolicy::AllowBrokerOnly)
        .set_ack_mode(rumqttc::AckMode::Manual)
        .set_receive_maximum(Some(cfg.max_in_flight))
        .set_max_packet_size(Some(cfg.max_message_bytes))
        // colibri publishes nothing: one slot for outgoing messages instead of rumqttc's 65,535
        // (16 MB of resident memory, measured).
        .set_outgoing_inflight_upper_limit(1);
    match (&cfg.username, &cfg.password) {
        (Some(u), Some(p)) => {
            opts.set_credentials(u.clone(), p.0.clone().into_bytes());
        }
        (Some(u), None) => {
            opts.set_username(u.clone());
        }
        (None, Some(p)) => {
            opts.set_password(p.0.clone().into_bytes());
        }
        (None, None) => {}
    }
    // Room for every ack the broker's window can owe at once, and the subscribe: an ack never
    // waits for room (this task is also the one that empties the queue).
    let capacity = usize::from(cfg.max_in_flight) + 64;
    Ok(AsyncClient::builder(opts).capacity(capacity).build())
}

/// The task that owns the event loop.
pub struct Driver {
    cfg: Arc<MqttSourceConfig>,
    stats: Arc<MqttSourceStats>,
    client: AsyncClient,
    events: EventLoop,
    /// Bytes of records handed to the appender and not yet settled.
    budget: Arc<Semaphore>,
    /// The number of the current connection (0: none yet).
    connection: u64,
    connected: bool,
    /// Subscribed at least once in this life: the broker's kept session has the filters.
    subscribed: bool,
    /// `stream` names, by index, for routing.
    streams: Vec<String>,
    labels: String,
    /// The current outage was reported.
    down_reported: bool,
    /// QoS 0 drops were reported since the budget was last free.
    drop_reported: bool,
    /// Acks for the current connection waiting for room in the client's request queue (which
    /// the event loop empties as it is polled), in order.
    unsent: VecDeque<(u64, ManualAck)>,
}

impl Driver {
    pub fn new(
        cfg: Arc<MqttSourceConfig>,
        stats: Arc<MqttSourceStats>,
        client: AsyncClient,
        events: EventLoop,
    ) -> Driver {
        Driver {
            streams: cfg.streams().into_iter().map(String::from).collect(),
            labels: super::record::render_labels(&cfg.labels),
            cfg,
            stats,
            client,
            events,
            budget: Arc::new(Semaphore::new(BUDGET_BYTES)),
            connection: 0,
            connected: false,
            subscribed: false,
            down_reported: false,
            drop_reported: false,
            unsent: VecDeque::new(),
        }
    }

    /// Polls until `stopping`; then hands the appender nothing more, sends the acknowledgements
    /// of what it still commits (for up to [`STOP_WAIT`]) and says goodbye to the broker.
    pub async fn run(
        mut self,
        tx: mpsc::UnboundedSender<Msg>,
        mut acks: mpsc::UnboundedReceiver<Vec<Ack>>,
        stopping: CancellationToken,
    ) {
        let mut tx = Some(tx);
        let mut pause = Duration::from_secs(1);
        let mut retry_at: Option<Instant> = None;
        let mut stop_by: Option<Instant> = None;
        let mut acks_open = true;
        loop {
            tokio::select! {
                biased;
                () = stopping.cancelled(), if tx.is_some() => {
                    // The appender ends once it has settled what it holds.
                    tx = None;
                    stop_by = Some(Instant::now() + STOP_WAIT);
                }
                owed = acks.recv(), if acks_open && (self.connected || tx.is_none()) => match owed {
                    Some(owed) => self.acknowledge(&owed),
                    None => {
                        acks_open = false;
                        if tx.is_none() {
                            break;
                        }
                    }
                },
                () = sleep_until(stop_by) => break,
                () = sleep_until(retry_at) => retry_at = None,
                polled = self.events.poll(), if retry_at.is_none() => {
                    match polled {
                        Ok(Event::Incoming(packet)) => self.incoming(packet, tx.as_ref()).await,
                        Ok(_) => {}
                        Err(e) => {
                            self.failed(&e);
                            retry_at = Some(Instant::now() + pause);
                            pause = (pause * 2).min(MAX_PAUSE);
                        }
                    }
                    // The poll took requests from the queue: room for acks that waited.
                    self.send_acks();
                }
            }
            if self.connected {
                pause = Duration::from_secs(1);
            }
        }
        if self.connected {
            self.goodbye().await;
        }
    }

    async fn incoming(&mut self, packet: Incoming, tx: Option<&mpsc::UnboundedSender<Msg>>) {
        match packet {
            Incoming::ConnAck(ack) => {
                self.connection += 1;
                self.connected = true;
                self.stats.connects.fetch_add(1, Relaxed);
                if self.down_reported {
                    tracing::info!(source = %self.cfg.name, broker = %self.cfg.shown(), "mqtt broker reachable again");
                    self.down_reported = false;
                }
                if !ack.session_present || !self.subscribed {
                    self.subscribe(ack.session_present);
                }
            }
            Incoming::SubAck(ack) => {
                for (filter, code) in self.cfg.topics.iter().zip(&ack.return_codes) {
                    if !matches!(code, SubscribeReasonCode::Success(_)) {
                        self.stats.subscriptions_refused.fetch_add(1, Relaxed);
                        tracing::warn!(source = %self.cfg.name, broker = %self.cfg.shown(), filter, "the broker refused the subscription ({code:?}): nothing arrives through it until the broker allows it and colibri restarts");
                    }
                }
            }
            Incoming::Publish(p) => {
                if let Some(tx) = tx {
                    self.message(p, tx).await;
                }
                // Stopping: not handed over, not acknowledged; the broker keeps it.
            }
            Incoming::Disconnect(d) => {
                tracing::warn!(source = %self.cfg.name, broker = %self.cfg.shown(), reason = ?d.reason_code, "the broker closed the connection");
            }
            _ => {}
        }
    }

    /// Subscribes to every filter (also when the broker kept a session: the config may have
    /// changed since). Retained messages are sent only for a subscription the session did not
    /// have, so a restart does not store them again.
    fn subscribe(&mut self, session_present: bool) {
        let qos = match self.cfg.qos {
            0 => QoS::AtMostOnce,
            1 => QoS::AtLeastOnce,
            _ => QoS::ExactlyOnce,
        };
        let filters = self.cfg.topics.iter().map(|t| SubscribeFilter {
            retain_forward_rule: RetainForwardRule::OnNewSubscribe,
            ..SubscribeFilter::new(t.clone(), qos)
        });
        match self.client.try_subscribe_many(filters) {
            Ok(()) => {
                self.subscribed = true;
                tracing::info!(source = %self.cfg.name, broker = %self.cfg.shown(), topics = ?self.cfg.topics, session_present, "mqtt source subscribed");
            }
            Err(e) => {
                tracing::warn!(source = %self.cfg.name, error = %e, "subscribe not queued; retried at the next connect");
            }
        }
    }

    /// A message made a record and handed to the appender.
    async fn message(&mut self, p: rumqttc::Publish, tx: &mpsc::UnboundedSender<Msg>) {
        let stats = &*self.stats;
        stats.messages.fetch_add(1, Relaxed);
        stats.bytes.fetch_add(p.payload.len() as u64, Relaxed);
        let qos = p.qos as u8;
        let ack = (qos > 0).then_some(Ack {
            connection: self.connection,
            pkid: p.pkid,
            qos,
        });
        // MQTT topics are UTF-8 (the client checks); a lossy view costs nothing when they are.
        let topic = String::from_utf8_lossy(&p.topic);
        if !self
            .cfg
            .topics
            .iter()
            .any(|f| super::topic::matches(f, &topic))
        {
            stats.unsubscribed.fetch_add(1, Relaxed);
            if stats.unsubscribed.load(Relaxed) == 1 {
                tracing::warn!(source = %self.cfg.name, topic = %topic, "a message of no configured topic filter (a subscription an older config left in the broker's session): acknowledged and dropped, and counted");
            }
            let _ = tx.send(Msg {
                stream: None,
                record: Vec::new(),
                ack,
                _permit: None,
            });
            return;
        }
        let streams: Vec<&str> = self.streams.iter().map(String::as_str).collect();
        let stream = self.cfg.route(&topic, &streams);
        let received = format!(
            "\"{}\"",
            chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
        );
        let mut record = Vec::with_capacity(p.topic.len() + p.payload.len() + 96);
        let kept = super::record::write(
            &mut record,
            &topic,
            &p.payload,
            qos,
            p.retain,
            &received,
            &self.labels,
        );
        if kept == super::record::Kept::Base64 {
            stats.binary.fetch_add(1, Relaxed);
        }
        let permits =
            u32::try_from(record.len().clamp(1, BUDGET_BYTES)).expect("the budget fits u32");
        let permit = if qos == 0 {
            match Arc::clone(&self.budget).try_acquire_many_owned(permits) {
                Ok(p) => {
                    self.drop_reported = false;
                    p
                }
                Err(_) => {
                    stats.qos0_dropped.fetch_add(1, Relaxed);
                    if !self.drop_reported {
                        self.drop_reported = true;
                        tracing::warn!(source = %self.cfg.name, "the stream cannot keep up: QoS 0 messages are dropped and counted (QoS 1 and 2 wait in the broker)");
                    }
                    return;
                }
            }
        } else {
            // Rarely waited for: the broker's window bounds what is unacknowledged first.
            match Arc::clone(&self.budget).acquire_many_owned(permits).await {
                Ok(p) => p,
                Err(_) => return,
            }
        };
        let _ = tx.send(Msg {
            stream: Some(stream),
            record,
            ack,
            _permit: Some(permit),
        });
    }

    /// Queues the acks owed on the current connection, in order; those of an older one are not
    /// sent (the broker sends their messages again).
    fn acknowledge(&mut self, owed: &[Ack]) {
        for a in owed {
            if !self.connected || a.connection != self.connection {
                self.stats.acks_lost.fetch_add(1, Relaxed);
                continue;
            }
            let ack = if a.qos == 1 {
                ManualAck::PubAck(PubAck::new(a.pkid, None))
            } else {
                ManualAck::PubRec(PubRec::new(a.pkid, None))
            };
            self.unsent.push_back((a.connection, ack));
        }
        self.send_acks();
    }

    /// Hands waiting acks to the client while its request queue has room. A broker may send more
    /// than the Receive Maximum (mosquitto 2.0 does), so the queue can be full: what does not fit
    /// waits here for the next poll, never dropped while its connection lasts.
    fn send_acks(&mut self) {
        while let Some((connection, ack)) = self.unsent.front() {
            if !self.connected || *connection != self.connection {
                self.stats.acks_lost.fetch_add(1, Relaxed);
                self.unsent.pop_front();
                continue;
            }
            if self.client.try_manual_ack(ack.clone()).is_err() {
                return;
            }
            self.unsent.pop_front();
        }
    }

    fn failed(&mut self, e: &ConnectionError) {
        let was_up = std::mem::replace(&mut self.connected, false);
        self.stats.connection_failures.fetch_add(1, Relaxed);
        if !self.down_reported {
            self.down_reported = true;
            let shown = self.cfg.shown();
            let why = reason(&shown, e);
            if was_up {
                tracing::warn!(source = %self.cfg.name, broker = %shown, "mqtt connection lost ({why}); reconnecting (messages not yet acknowledged are sent again by the broker)");
            } else {
                tracing::warn!(source = %self.cfg.name, broker = %shown, "{why}; retrying");
            }
        }
    }

    /// A DISCONNECT, so the broker does not count colibri's going as a failure; the session
    /// stays (its expiry says how long).
    async fn goodbye(&mut self) {
        if self.client.try_disconnect().is_err() {
            return;
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            while self.events.poll().await.is_ok() {}
        })
        .await;
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Why the connection is down, for the log.
fn reason(shown: &str, e: &ConnectionError) -> String {
    use ConnectReturnCode as C;
    match e {
        ConnectionError::ConnectionRefused(
            code @ (C::BadUserNamePassword
            | C::NotAuthorized
            | C::Banned
            | C::BadAuthenticationMethod),
        ) => format!(
            "{shown}: the broker refused colibri's credentials ({code:?}); nothing is received until they are accepted"
        ),
        ConnectionError::ConnectionRefused(code) => {
            format!("{shown}: the broker refused the connection ({code:?})")
        }
        other => format!("{shown}: {}", chain(other)),
    }
}
