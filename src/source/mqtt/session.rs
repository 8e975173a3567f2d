//! The mqtt source's connection (rumqttc-v5-next, MQTT 5): the client options (a persistent
//! session resumed at every connect, manual acknowledgements, the Receive Maximum and Maximum
//! Packet Size, TLS, credentials), and the driver task that polls the event loop: it reconnects
//! after a pause, subscribes at its first connect and whenever the broker kept no session, turns
//! each message into a record for the appender, and sends the acknowledgements the appender hands
//! back. Owns the connection and its numbering; the records' shape is [`super::record`]'s, the
//! appends [`super::append`]'s. Started by [`super::run`].
//!
//! An acknowledgement names a packet id, which means something only on the connection the
//! message came on (and, with a kept session, on those after it, where the broker sends it again
//! under the same id): rumqttc refuses an ack for an id its current connection has not received,
//! by dropping the connection. So each message carries the number of its connection, and an ack
//! for an older connection is not sent (counted in `acks_lost`): the broker sends that message
//! again, and it is stored twice rather than acknowledged for another. The check and the send are
//! made in this task, between polls, so no connection can change in between; acks queued to the
//! client when a connection breaks are dropped by rumqttc itself.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use rumqttc::{
    AsyncClient, ConnectionError, DisconnectReasonCode, Event, EventLoop, Incoming, ManualAck,
    Outgoing, PersistedAckMode, PersistedSession, PubAck, PubRec, QoS, RetainForwardRule,
    SessionStore, SessionStoreError, SessionStoreKey, SubscribeFilter, SubscribeReasonCode,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::append::{Ack, Msg};
use super::{BUDGET_BYTES, MqttSourceConfig, MqttSourceStats, QOS0_BUDGET_BYTES};
use crate::setting::SettingError;

/// The longest pause between connection attempts.
const MAX_PAUSE: Duration = Duration::from_secs(30);
/// Slots for messages colibri publishes: none, but rumqttc needs one.
const OUTGOING_IN_FLIGHT: u16 = 1;
/// How long a stopping driver waits for the appender's last acknowledgements.
const STOP_WAIT: Duration = Duration::from_secs(2);

/// The client and its event loop; nothing is dialled. Reads the TLS files.
pub fn build(cfg: &MqttSourceConfig) -> Result<(AsyncClient, EventLoop), SettingError> {
    // With `tls.server_name`, the certificate is checked for that name while the URL's host is
    // dialled.
    let dial = (cfg.server_name() != cfg.host).then(|| format!("{}:{}", cfg.host, cfg.port));
    let mut opts = crate::net::mqtt::connection_options(
        &cfg.client_id,
        cfg.server_name(),
        cfg.port,
        dial,
        cfg.tls.as_ref(),
        cfg.username.as_ref(),
        cfg.password.as_ref(),
    )?;
    let expiry = u32::try_from(cfg.session_expiry.as_secs()).unwrap_or(u32::MAX);
    opts.set_keep_alive(u16::try_from(cfg.keep_alive.as_secs()).unwrap_or(u16::MAX))
        .set_connect_timeout(cfg.timeout)
        // Always the session the broker kept: what was published while colibri was away, and
        // what it had not acknowledged when it stopped, is sent to it now.
        .set_clean_start(false)
        .set_session_expiry_interval(Some(expiry))
        // The client side of the session a new process resumes: see `LocalSession`.
        .set_session_store(LocalSession::new(cfg, expiry))
        .set_ack_mode(rumqttc::AckMode::Manual)
        .set_receive_maximum(Some(cfg.max_in_flight))
        .set_max_packet_size(Some(cfg.max_message_bytes))
        // colibri publishes nothing: one slot for outgoing messages instead of rumqttc's 65,535
        // (16 MB of resident memory, measured).
        .set_outgoing_inflight_upper_limit(OUTGOING_IN_FLIGHT);
    // Room for the acks the broker's window owes at once, and the subscribe; acks that find it
    // full wait in the driver for the next poll (`Driver::send_acks`).
    let capacity = usize::from(cfg.max_in_flight) + 64;
    Ok(AsyncClient::builder(opts).capacity(capacity).build())
}

/// What rumqttc's session store answers (the type it names but does not export).
type SessionStoreFuture<'a, T> =
    Pin<Box<dyn Future<Output = Result<T, SessionStoreError>> + Send + 'a>>;

/// rumqttc's store of the client side of the session, kept in memory. A process starts from an
/// empty one: colibri publishes nothing, so the broker's session holds no flow colibri started
/// (a QoS 2 message PUBRECed by the process before is completed by the broker's PUBREL, which
/// rumqttc answers without knowing it). Without a store rumqttc resumes the broker's session in a
/// mode that refuses every SUBSCRIBE, so a topic added to the config would never be subscribed.
#[derive(Debug)]
struct LocalSession {
    empty: PersistedSession,
    saved: std::sync::Mutex<Option<PersistedSession>>,
}

impl LocalSession {
    fn new(cfg: &MqttSourceConfig, expiry: u32) -> LocalSession {
        LocalSession {
            empty: PersistedSession {
                format_version: 1,
                client_id: cfg.client_id.clone(),
                clean_start: false,
                session_expiry_interval: Some(expiry),
                outgoing_inflight_upper_limit: Some(OUTGOING_IN_FLIGHT),
                ack_mode: PersistedAckMode::Manual,
                last_pkid: 0,
                last_puback: 0,
                replay: Vec::new(),
                incoming_qos2: Vec::new(),
            },
            saved: std::sync::Mutex::new(None),
        }
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<PersistedSession>> {
        self.saved
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl SessionStore for LocalSession {
    fn load<'a>(
        &'a self,
        _key: &'a SessionStoreKey,
    ) -> SessionStoreFuture<'a, Option<PersistedSession>> {
        let session = self.slot().clone().unwrap_or_else(|| self.empty.clone());
        Box::pin(std::future::ready(Ok(Some(session))))
    }

    fn save<'a>(
        &'a self,
        _key: &'a SessionStoreKey,
        session: &'a PersistedSession,
    ) -> SessionStoreFuture<'a, ()> {
        *self.slot() = Some(session.clone());
        Box::pin(std::future::ready(Ok(())))
    }

    fn clear<'a>(&'a self, _key: &'a SessionStoreKey) -> SessionStoreFuture<'a, ()> {
        *self.slot() = None;
        Box::pin(std::future::ready(Ok(())))
    }
}

/// A QoS 1 or 2 message and the wait for its share of the budget.
type Blocked = (
    Msg,
    Pin<Box<dyn Future<Output = Option<OwnedSemaphorePermit>> + Send>>,
);

fn budget_bytes(qos: u8) -> usize {
    if qos == 0 {
        QOS0_BUDGET_BYTES
    } else {
        BUDGET_BYTES
    }
}

/// One poll of the event loop as a future that owns it, so a poll cut short by another branch
/// of the driver's `select!` is not dropped half-way (rumqttc may be between recording an ack as
/// sent and writing it): it is polled on at the next turn.
type Polling = Pin<Box<dyn Future<Output = (EventLoop, Result<Event, ConnectionError>)> + Send>>;

fn poll_owned(mut events: EventLoop) -> Polling {
    Box::pin(async move {
        let r = events.poll().await;
        (events, r)
    })
}

/// The task that owns the event loop.
pub struct Driver {
    cfg: Arc<MqttSourceConfig>,
    stats: Arc<MqttSourceStats>,
    client: AsyncClient,
    /// Bytes of QoS 1 and 2 records handed to the appender and not yet settled.
    budget: Arc<Semaphore>,
    /// The same for QoS 0 records, apart: a flood of them cannot hold up an acknowledged message.
    qos0_budget: Arc<Semaphore>,
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
    /// The broker acknowledged the subscription: rumqttc's session store has done its part.
    store_done: bool,
    /// Acks for the current connection waiting for room in the client's request queue (which
    /// the event loop empties as it is polled), in order.
    unsent: VecDeque<(u64, ManualAck)>,
    /// The appender's window: a slot per message committed (or being committed) whose ack is not
    /// yet written, given back here when it is written or its connection has ended.
    window: Arc<Semaphore>,
    /// Acks handed to the client and not yet written on the current connection, by packet id
    /// (a count, should a broker reuse an id before its ack is written).
    unwritten: HashMap<u16, u32>,
}

impl Driver {
    pub fn new(
        cfg: Arc<MqttSourceConfig>,
        stats: Arc<MqttSourceStats>,
        client: AsyncClient,
        window: Arc<Semaphore>,
    ) -> Driver {
        Driver {
            streams: cfg.streams().into_iter().map(String::from).collect(),
            labels: crate::record::labels_field(&cfg.labels)
                .map_or_else(String::new, |l| format!(",{l}")),
            cfg,
            stats,
            client,
            budget: Arc::new(Semaphore::new(BUDGET_BYTES)),
            qos0_budget: Arc::new(Semaphore::new(QOS0_BUDGET_BYTES)),
            connection: 0,
            connected: false,
            subscribed: false,
            down_reported: false,
            drop_reported: false,
            unsent: VecDeque::new(),
            store_done: false,
            window,
            unwritten: HashMap::new(),
        }
    }

    /// Polls until `stopping`; then hands the appender nothing more, sends the acknowledgements
    /// of what it still commits (for up to [`STOP_WAIT`]) and says goodbye to the broker.
    pub async fn run(
        mut self,
        events: EventLoop,
        tx: mpsc::UnboundedSender<Msg>,
        mut acks: mpsc::UnboundedReceiver<Vec<Ack>>,
        stopping: CancellationToken,
    ) {
        let mut tx = Some(tx);
        let mut pause = Duration::from_secs(1);
        let mut retry_at: Option<Instant> = None;
        let mut stop_by: Option<Instant> = None;
        let mut acks_open = true;
        let mut polling = poll_owned(events);
        // A QoS 1 or 2 message waiting for its share of the budget; polling waits with it (the
        // broker holds the rest), the stop does not. Except while acks handed to the client wait
        // to be written (only a poll writes them, and the appender's window waits for them):
        // messages read meanwhile (a read batch or two) wait behind it in `backlog`.
        let mut blocked: Option<Blocked> = None;
        let mut backlog: VecDeque<rumqttc::Publish> = VecDeque::new();
        loop {
            tokio::select! {
                biased;
                () = stopping.cancelled(), if tx.is_some() => {
                    // The appender ends once it has settled what it holds.
                    tx = None;
                    blocked = None;
                    backlog.clear();
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
                permit = async { blocked.as_mut().expect("branch taken only when blocked").1.as_mut().await }, if blocked.is_some() => {
                    let (mut msg, _) = blocked.take().expect("branch taken only when blocked");
                    msg._permit = permit;
                    if let Some(tx) = &tx {
                        let _ = tx.send(msg);
                        while blocked.is_none() {
                            let Some(p) = backlog.pop_front() else { break };
                            blocked = self.message(p, tx);
                        }
                    }
                }
                (mut events, polled) = &mut polling, if retry_at.is_none() && (blocked.is_none() || self.acks_waiting()) => {
                    if std::mem::take(&mut self.store_done) {
                        // Needed to resume the broker's session at the first connect (see
                        // `LocalSession`); after that its checkpoints, built at every read and
                        // flush, cost a third of the CPU per message and keep nothing colibri
                        // needs (measured: BENCHMARKS.md).
                        events.options.clear_session_store();
                    }
                    polling = poll_owned(events);
                    match polled {
                        Ok(Event::Incoming(Incoming::Publish(p))) => {
                            // Stopping: not handed over, not acknowledged; the broker keeps it.
                            if let Some(tx) = &tx {
                                if blocked.is_some() {
                                    backlog.push_back(p);
                                } else {
                                    blocked = self.message(p, tx);
                                }
                            }
                        }
                        Ok(Event::Incoming(packet)) => self.incoming(packet),
                        Ok(Event::Outgoing(Outgoing::PubAck(pkid) | Outgoing::PubRec(pkid))) => {
                            self.written(pkid);
                        }
                        Ok(_) => {}
                        Err(e) => {
                            self.failed(&e);
                            // Read on a connection that has ended and not handed over: the broker
                            // sends them again (acknowledged on the next connection, never here).
                            blocked = None;
                            backlog.clear();
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
            self.goodbye(polling).await;
        }
    }

    fn incoming(&mut self, packet: Incoming) {
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
                self.store_done = true;
                for (filter, code) in self.cfg.topics.iter().zip(&ack.return_codes) {
                    if !matches!(code, SubscribeReasonCode::Success(_)) {
                        self.stats.subscriptions_refused.fetch_add(1, Relaxed);
                        tracing::warn!(source = %self.cfg.name, broker = %self.cfg.shown(), filter, "the broker refused the subscription ({code:?}): nothing arrives through it until the broker allows it and colibri restarts or reloads the source");
                    }
                }
            }
            Incoming::Disconnect(d) if d.reason_code == DisconnectReasonCode::SessionTakenOver => {
                // Whoever took the session takes what is published for it until colibri
                // connects again and takes it back: another agent with this client_id.
                tracing::warn!(source = %self.cfg.name, broker = %self.cfg.shown(), client_id = %self.cfg.client_id, "another client connected with this source's client_id and took over its session (messages meant for this source may go to it): give each agent its own client_id");
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
    /// A message made a record and handed to the appender, or, when a QoS 1 or 2 message finds
    /// the budget spent, returned with the wait for its share.
    fn message(&mut self, p: rumqttc::Publish, tx: &mpsc::UnboundedSender<Msg>) -> Option<Blocked> {
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
                tracing::warn!(source = %self.cfg.name, topic = %topic, client_id = %self.cfg.client_id, "a message of no configured topic filter: the broker's session holds a subscription this config did not make (an older config's, or another agent's that connected with this client_id): acknowledged and dropped, and counted");
            }
            // Acknowledged in its turn (QoS 0: nothing to do). At most the broker's window of
            // these wait in the channel, and they hold no record.
            if ack.is_some() {
                let _ = tx.send(Msg {
                    stream: None,
                    record: Vec::new(),
                    ack,
                    _permit: None,
                });
            }
            return None;
        }
        let stream = self.cfg.route(&topic, &self.streams);
        let received = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
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
        let budget = if qos == 0 {
            &self.qos0_budget
        } else {
            &self.budget
        };
        let permits =
            u32::try_from(record.len().clamp(1, budget_bytes(qos))).expect("the budgets fit u32");
        let mut msg = Msg {
            stream: Some(stream),
            record,
            ack,
            _permit: None,
        };
        match Arc::clone(budget).try_acquire_many_owned(permits) {
            Ok(permit) => {
                if qos == 0 {
                    self.drop_reported = false;
                }
                msg._permit = Some(permit);
                if let Err(unsent) = tx.send(msg) {
                    // The appender has ended (colibri stops).
                    super::append::count_unstored(stats, [unsent.0]);
                }
                None
            }
            Err(_) if qos == 0 => {
                stats.qos0_dropped.fetch_add(1, Relaxed);
                if !self.drop_reported {
                    self.drop_reported = true;
                    tracing::warn!(source = %self.cfg.name, "the stream cannot keep up: QoS 0 messages are dropped and counted (QoS 1 and 2 wait in the broker)");
                }
                None
            }
            Err(_) => {
                // Polling stops until the appender gives some back: the broker holds the rest.
                let wait = Arc::clone(budget).acquire_many_owned(permits);
                Some((msg, Box::pin(async move { wait.await.ok() })))
            }
        }
    }

    /// Queues the acks owed on the current connection, in order; those of an older one are not
    /// sent (the broker sends their messages again).
    fn acknowledge(&mut self, owed: &[Ack]) {
        for a in owed {
            if !self.connected || a.connection != self.connection {
                self.lost_ack();
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
                self.lost_ack();
                self.unsent.pop_front();
                continue;
            }
            if self.client.try_manual_ack(ack.clone()).is_err() {
                return;
            }
            let pkid = match ack {
                ManualAck::PubAck(a) => a.pkid,
                ManualAck::PubRec(a) => a.pkid,
            };
            *self.unwritten.entry(pkid).or_default() += 1;
            self.unsent.pop_front();
        }
    }

    /// Acks owed on the current connection and not yet written: polling must go on for them.
    fn acks_waiting(&self) -> bool {
        !self.unwritten.is_empty() || !self.unsent.is_empty()
    }

    /// rumqttc wrote an ack: its slot of the window is free. An ack rumqttc wrote of itself (a
    /// QoS 2 message sent again after its PUBREC) held none.
    fn written(&mut self, pkid: u16) {
        if let Some(n) = self.unwritten.get_mut(&pkid) {
            *n -= 1;
            if *n == 0 {
                self.unwritten.remove(&pkid);
            }
            self.window.add_permits(1);
        }
    }

    /// An ack that cannot go out (its connection has ended): its message is sent again by the
    /// broker and stored twice; its slot is free.
    fn lost_ack(&mut self) {
        self.stats.acks_lost.fetch_add(1, Relaxed);
        self.window.add_permits(1);
    }

    fn failed(&mut self, e: &ConnectionError) {
        let was_up = std::mem::replace(&mut self.connected, false);
        // rumqttc drops the acks its queue held when a connection ends: never written.
        let unwritten: u32 = self.unwritten.drain().map(|(_, n)| n).sum();
        if unwritten > 0 {
            self.stats
                .acks_lost
                .fetch_add(u64::from(unwritten), Relaxed);
            self.window.add_permits(unwritten as usize);
        }
        self.stats.connection_failures.fetch_add(1, Relaxed);
        if !self.down_reported {
            self.down_reported = true;
            let shown = self.cfg.shown();
            let why = crate::net::mqtt::reason(&shown, e);
            if was_up {
                tracing::warn!(source = %self.cfg.name, broker = %shown, "mqtt connection lost ({why}); reconnecting (messages not yet acknowledged are sent again by the broker)");
            } else {
                tracing::warn!(source = %self.cfg.name, broker = %shown, "{why}; retrying");
            }
        }
    }

    /// A DISCONNECT, so the broker does not count colibri's going as a failure; the session
    /// stays (its expiry says how long). The poll in progress goes on until the event loop ends.
    async fn goodbye(&mut self, mut polling: Polling) {
        if self.client.try_disconnect().is_err() {
            return;
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            loop {
                let (events, polled) = polling.await;
                if polled.is_err() {
                    return;
                }
                polling = poll_owned(events);
            }
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
