//! The opcua source's sessions, one after another until colibri stops: each connects (the
//! endpoint matched by policy and mode, colibri's certificate generated on first start), looks
//! up the server's namespace table, resolves every node, then subscribes (monitored items, the
//! data changes handed to the appender from the client library's callback) or polls (a Read of
//! every node each interval). A session ends when its connection or session is lost, after
//! which a new one is made from nothing after a backoff: the library's own reconnection is off,
//! so namespace URIs are looked up again and every item is created again on the server that
//! came back, whatever it kept or forgot. Nodes the server does not know are logged once,
//! counted, and asked for again every `RETRY_UNKNOWN`. Called by [`super::run`].

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use opcua_client::Session;
use opcua_types::{
    AttributeId, DataChangeFilter, DataChangeTrigger, DataValue, DeadbandType, ExtensionObject,
    MonitoredItemCreateRequest, MonitoringMode, MonitoringParameters, NodeId, ReadValueId,
    StatusCode, SubscriptionAcknowledgement, TimestampsToReturn,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::append::Batch;
use super::connect::{self, namespace_table, request};
use super::subscription::{self, Saved};
use super::{Deadband, Mode, Node, OpcuaSourceConfig, OpcuaSourceStats, RETRY_UNKNOWN, record};

const BACKOFF_BASE: Duration = Duration::from_millis(250);
const BACKOFF_CAP: Duration = Duration::from_secs(10);
/// Items created, or nodes read, per request (servers cap both; a thousand is under every
/// limit seen in practice).
const CHUNK: usize = 1000;

/// How a session ended.
enum Outcome {
    Stopped,
    /// It had been up.
    Lost(String),
    /// It never came up.
    Failed(String),
}

/// What the sessions share: the source, its counters, the appender's channels, and what one
/// session leaves the next.
struct Cx {
    cfg: Arc<OpcuaSourceConfig>,
    stats: Arc<OpcuaSourceStats>,
    tx: mpsc::Sender<Batch>,
    /// The acknowledgements of what the appender committed, for the next Publish.
    acks: mpsc::UnboundedReceiver<SubscriptionAcknowledgement>,
    /// Those received and not yet sent: a lost session leaves them to the next, which sends
    /// them for the subscription it took over (the server answers "unknown" for one it lost).
    owed: Vec<SubscriptionAcknowledgement>,
    /// Nodes already logged as unknown (each is logged once while it stays so).
    logged_unknown: HashSet<usize>,
    /// Per node, the source time of the last change handed over: a new subscription's first
    /// report of a value already stored (its current value, unchanged) is not stored again.
    last_source_ns: Vec<Option<i64>>,
}

/// Sessions one after another until `stopping`.
pub async fn run(
    cfg: Arc<OpcuaSourceConfig>,
    stats: Arc<OpcuaSourceStats>,
    tx: mpsc::Sender<Batch>,
    acks: mpsc::UnboundedReceiver<SubscriptionAcknowledgement>,
    stopping: CancellationToken,
) {
    let nodes = cfg.nodes.len();
    let mut cx = Cx {
        cfg,
        stats,
        tx,
        acks,
        owed: Vec::new(),
        logged_unknown: HashSet::new(),
        last_source_ns: vec![None; nodes],
    };
    let mut attempt = 0u32;
    let mut had_session = false;
    let mut last_failure: Option<String> = None;
    loop {
        let outcome = one_session(&mut cx, had_session, &stopping).await;
        cx.stats.connected.store(0, Relaxed);
        match outcome {
            Outcome::Stopped => break,
            Outcome::Lost(reason) => {
                cx.stats.session_failures.fetch_add(1, Relaxed);
                tracing::warn!(source = %cx.cfg.name, url = %cx.cfg.endpoint.url, "opcua session lost: {reason}; reconnecting (nothing is read until it is back)");
                had_session = true;
                attempt = 0;
                last_failure = None;
            }
            Outcome::Failed(reason) => {
                cx.stats.session_failures.fetch_add(1, Relaxed);
                if last_failure.as_deref() != Some(reason.as_str()) {
                    tracing::warn!(source = %cx.cfg.name, url = %cx.cfg.endpoint.url, "opcua server not reachable: {reason}; retrying");
                    last_failure = Some(reason);
                }
                attempt = attempt.saturating_add(1);
            }
        }
        let pause = crate::backoff::jittered(attempt, BACKOFF_BASE, BACKOFF_CAP);
        tokio::select! {
            _ = stopping.cancelled() => break,
            _ = tokio::time::sleep(pause) => {}
        }
    }
}

/// One session, from its connection to its loss or colibri's stop.
async fn one_session(cx: &mut Cx, had_session: bool, stopping: &CancellationToken) -> Outcome {
    let cfg = Arc::clone(&cx.cfg);
    let name = format!("colibri {}", cfg.name);
    let mut up = match connect::open(&cfg.endpoint, (&cfg.name, &name), stopping).await {
        Ok(up) => up,
        Err(None) => return Outcome::Stopped,
        Err(Some(e)) => return Outcome::Failed(e),
    };
    cx.stats.sessions.fetch_add(1, Relaxed);
    cx.stats.connected.store(1, Relaxed);
    let outcome = serve(cx, &up.session, had_session, &mut up.driver, stopping).await;
    if matches!(outcome, Outcome::Stopped) {
        // The subscription is kept: colibri's next start takes it over, with what it did not
        // acknowledge.
        let _ = tokio::time::timeout(
            Duration::from_secs(2),
            up.session.disconnect_without_delete_subscriptions(),
        )
        .await;
    }
    up.driver.abort();
    outcome
}

/// The session's life once up: its items made or taken over, then data until the loss or the
/// stop.
async fn serve(
    cx: &mut Cx,
    session: &Arc<Session>,
    had_session: bool,
    driver: &mut tokio::task::JoinHandle<String>,
    stopping: &CancellationToken,
) -> Outcome {
    let cfg = Arc::clone(&cx.cfg);
    let mut items = Items::default();
    let opened = match cfg.mode {
        Mode::Subscribe(_) => match open(cx, session, &mut items).await {
            Ok(o) => Some(o),
            Err(e) => return Outcome::Lost(e),
        },
        Mode::Poll(_) => {
            let all: Vec<usize> = (0..cfg.nodes.len()).collect();
            if let Err(e) = items.add(cx, session, None, &all).await {
                return Outcome::Lost(e);
            }
            None
        }
    };
    let verb = if had_session { "restored" } else { "started" };
    let how = match &opened {
        Some(o) if o.resent.is_some() => format!(
            "monitored (subscription {} taken over, {} unacknowledged messages sent again)",
            o.id,
            o.resent.unwrap_or(0)
        ),
        Some(o) => format!("monitored (new subscription {})", o.id),
        None => "polled".into(),
    };
    tracing::info!(
        source = %cfg.name,
        url = %cfg.endpoint.url,
        namespaces = items.namespaces,
        "opcua session {verb}: {} of {} nodes {how} ({} unknown to the server)",
        items.ok.len(),
        cfg.nodes.len(),
        items.unknown.len(),
    );
    let taken_over = opened.as_ref().is_some_and(|o| o.resent.is_some());
    let mut answered = false;
    let subscription = opened.map(|o| o.id);
    let mut retry =
        tokio::time::interval_at(tokio::time::Instant::now() + RETRY_UNKNOWN, RETRY_UNKNOWN);
    let poll_every = match cfg.mode {
        Mode::Poll(d) => d,
        Mode::Subscribe(_) => Duration::from_secs(3600),
    };
    let mut poll = tokio::time::interval(poll_every);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut inflight =
        subscription.map(|_| Box::pin(subscription::publish(Arc::clone(session), Vec::new())));
    loop {
        tokio::select! {
            _ = stopping.cancelled() => return Outcome::Stopped,
            r = &mut *driver => return Outcome::Lost(r.unwrap_or_else(|e| e.to_string())),
            Some(a) = cx.acks.recv() => cx.owed.push(a),
            r = async { inflight.as_mut().expect("polled only with a subscription").await }, if inflight.is_some() => {
                let resp = match r {
                    Ok(resp) => resp,
                    Err(code) if taken_over && !answered => {
                        // Some servers accept the takeover and never publish for the subscription
                        // again (asyncua 2.1 among them): the next session makes a new one.
                        let _ = std::fs::remove_file(&cfg.state_file);
                        return Outcome::Lost(format!("the server took the subscription over but sends nothing for it ({code}): a new one is made"));
                    }
                    Err(code) => return Outcome::Lost(format!("publish refused: {code}")),
                };
                answered = true;
                // The next request goes out at once, with what was committed meanwhile.
                while let Ok(a) = cx.acks.try_recv() {
                    cx.owed.push(a);
                }
                inflight = Some(Box::pin(subscription::publish(Arc::clone(session), std::mem::take(&mut cx.owed))));
                if let Some(status) = hand_over(cx, resp.subscription_id, resp.notification_message).await {
                    return Outcome::Lost(format!("the server ended the subscription: {status}"));
                }
            }
            _ = retry.tick(), if !items.unknown.is_empty() => {
                let again: Vec<usize> = std::mem::take(&mut items.unknown);
                if let Err(e) = items.add(cx, session, subscription, &again).await {
                    return Outcome::Lost(e);
                }
                if let Some(id) = subscription {
                    save(cx, id, &items);
                }
            }
            _ = poll.tick(), if subscription.is_none() => {
                if let Err(e) = read_all(cx, session, &mut items).await {
                    return Outcome::Lost(e);
                }
            }
        }
    }
}

/// The subscription a session reads from.
struct Opened {
    id: u32,
    /// Taken over (with so many messages sent again), or made new (`None`).
    resent: Option<usize>,
}

/// The subscription saved for these settings taken over, what the server still has of it sent
/// again; else a new one with an item per node.
async fn open(cx: &mut Cx, session: &Arc<Session>, items: &mut Items) -> Result<Opened, String> {
    let settings = Saved::settings_of(&cx.cfg);
    if let Some(saved) = Saved::load(&cx.cfg.state_file, &settings)
        && let Some(seqs) = request(subscription::transfer(session, saved.subscription)).await?
    {
        let table = namespace_table(session).await?;
        items.namespaces = table.len();
        for i in 0..cx.cfg.nodes.len() {
            match cx.cfg.nodes[i].id.resolve(&table) {
                Some(id) if saved.items.contains(&i) => items.ok.push((i, id)),
                _ => items.unknown.push(i),
            }
        }
        items.count(cx);
        let mut resent = 0;
        for seq in seqs {
            if let Some(msg) =
                request(subscription::republish(session, saved.subscription, seq)).await?
            {
                resent += 1;
                // A message of a subscription the server still keeps; its status is no end.
                let _ = hand_over(cx, saved.subscription, msg).await;
            }
        }
        return Ok(Opened {
            id: saved.subscription,
            resent: Some(resent),
        });
    }
    let id = request(subscription::create(session, &cx.cfg)).await?;
    let all: Vec<usize> = (0..cx.cfg.nodes.len()).collect();
    items.add(cx, session, Some(id), &all).await?;
    save(cx, id, items);
    Ok(Opened { id, resent: None })
}

/// The subscription's id and items kept for colibri's next start (a failure only costs the
/// takeover: logged).
fn save(cx: &Cx, id: u32, items: &Items) {
    let saved = Saved {
        settings: Saved::settings_of(&cx.cfg),
        subscription: id,
        items: items.ok.iter().map(|(i, _)| *i).collect(),
    };
    if let Err(e) = saved.save(&cx.cfg.state_file) {
        tracing::warn!(source = %cx.cfg.name, path = %cx.cfg.state_file.display(), error = %e, "opcua subscription not saved: colibri's next start makes a new one");
    }
}

/// A notification message's changes as records, handed to the appender with the
/// acknowledgement they are owed (waiting while it is behind: meanwhile no Publish goes out and
/// the server holds what changes); the subscription's end, if the message says so.
async fn hand_over(
    cx: &mut Cx,
    subscription: u32,
    msg: opcua_types::NotificationMessage,
) -> Option<StatusCode> {
    let seq = msg.sequence_number;
    let has_data = msg
        .notification_data
        .as_ref()
        .is_some_and(|d| !d.is_empty());
    let (changes, status) = subscription::changes(msg);
    let mut records = Vec::with_capacity(changes.len());
    for (handle, value) in changes {
        let i = (handle as usize).wrapping_sub(1);
        if i < cx.cfg.nodes.len()
            && let Some(r) = to_record(cx, i, &value, true)
        {
            records.push(r);
        }
    }
    if has_data {
        let ack = SubscriptionAcknowledgement {
            subscription_id: subscription,
            sequence_number: seq,
        };
        // The appender is gone only when colibri stops: the message stays unacknowledged.
        let _ = cx
            .tx
            .send(Batch {
                records,
                ack: Some(ack),
            })
            .await;
    }
    status.filter(|s| s.is_bad())
}

/// The nodes of one session: read (monitored or polled, with the id the server has for each),
/// and unknown to the server (asked for again later).
#[derive(Default)]
struct Items {
    ok: Vec<(usize, NodeId)>,
    unknown: Vec<usize>,
    /// Entries in the server's namespace table when last read.
    namespaces: usize,
}

impl Items {
    /// Resolves `which` nodes against the server's namespace table (read now) and, with a
    /// subscription, creates their monitored items; a node that cannot be is unknown.
    async fn add(
        &mut self,
        cx: &mut Cx,
        session: &Session,
        subscription: Option<u32>,
        which: &[usize],
    ) -> Result<(), String> {
        let table = namespace_table(session).await?;
        self.namespaces = table.len();
        let mut resolved = Vec::new();
        for &i in which {
            match cx.cfg.nodes[i].id.resolve(&table) {
                Some(id) => resolved.push((i, id)),
                None => self.unknown(cx, i, "its namespace URI is not in the server's table"),
            }
        }
        match subscription {
            // Polled: a node's read answers whether the server knows it.
            None => self.ok.extend(resolved),
            Some(sub) => {
                for chunk in resolved.chunks(CHUNK) {
                    let requests = chunk
                        .iter()
                        .map(|(i, id)| item(&cx.cfg.nodes[*i], *i, id))
                        .collect();
                    let created = request(subscription::add_items(session, sub, requests)).await?;
                    for ((i, id), status) in chunk.iter().zip(created) {
                        if status.is_good() {
                            self.ok.push((*i, id.clone()));
                        } else {
                            self.unknown(cx, *i, &status.to_string());
                        }
                    }
                }
            }
        }
        self.count(cx);
        Ok(())
    }

    fn count(&self, cx: &Cx) {
        cx.stats.items_ok.store(self.ok.len() as u64, Relaxed);
        cx.stats
            .items_unknown
            .store(self.unknown.len() as u64, Relaxed);
    }

    fn unknown(&mut self, cx: &mut Cx, i: usize, why: &str) {
        self.unknown.push(i);
        if cx.logged_unknown.insert(i) {
            let node = &cx.cfg.nodes[i];
            tracing::warn!(source = %cx.cfg.name, node = %node.name, id = %node.id.text, "opcua node not read: {why}; asked for again every {}s", RETRY_UNKNOWN.as_secs());
        }
    }
}

/// The monitored item of node `i` (its client handle `i + 1`: 0 is the library's "assign one").
fn item(node: &Node, i: usize, id: &NodeId) -> MonitoredItemCreateRequest {
    let filter = node.deadband.map_or_else(ExtensionObject::null, |d| {
        let (kind, value) = match d {
            Deadband::Absolute(v) => (DeadbandType::Absolute, v),
            Deadband::Percent(v) => (DeadbandType::Percent, v),
        };
        ExtensionObject::from_message(DataChangeFilter {
            trigger: DataChangeTrigger::StatusValue,
            deadband_type: kind as u32,
            deadband_value: value,
        })
    });
    MonitoredItemCreateRequest {
        item_to_monitor: ReadValueId {
            node_id: id.clone(),
            attribute_id: AttributeId::Value as u32,
            ..Default::default()
        },
        monitoring_mode: MonitoringMode::Reporting,
        requested_parameters: MonitoringParameters {
            client_handle: u32::try_from(i + 1).unwrap_or(u32::MAX),
            sampling_interval: node.sampling.as_secs_f64() * 1000.0,
            filter,
            queue_size: node.queue_size,
            discard_oldest: true,
        },
    }
}

/// Every known node read once; the values handed to the appender as one batch (a value that
/// cannot be appended before colibri stops is lost: nothing sends it again). A node the server
/// does not know is moved to the unknown, asked for again later.
async fn read_all(cx: &mut Cx, session: &Session, items: &mut Items) -> Result<(), String> {
    let mut records = Vec::with_capacity(items.ok.len());
    let mut gone = Vec::new();
    for chunk in items.ok.chunks(CHUNK) {
        let reads: Vec<ReadValueId> = chunk
            .iter()
            .map(|(_, id)| ReadValueId {
                node_id: id.clone(),
                attribute_id: AttributeId::Value as u32,
                ..Default::default()
            })
            .collect();
        let values = request(session.read(&reads, TimestampsToReturn::Both, 0.0)).await?;
        for ((i, _), value) in chunk.iter().zip(&values) {
            match value.status {
                Some(s @ (StatusCode::BadNodeIdUnknown | StatusCode::BadNodeIdInvalid)) => {
                    gone.push((*i, s));
                }
                _ => records.extend(to_record(cx, *i, value, false)),
            }
        }
    }
    for (i, status) in gone {
        items.ok.retain(|(n, _)| *n != i);
        items.unknown(cx, i, &status.to_string());
    }
    items.count(cx);
    if !records.is_empty() {
        let _ = cx.tx.send(Batch { records, ack: None }).await;
    }
    Ok(())
}

/// Node `i`'s value as a record, counted; `None` for a change already handed over (`dedupe`: a
/// subscription's report of a source time it reported before) or one line protocol cannot
/// write.
fn to_record(cx: &mut Cx, i: usize, value: &DataValue, dedupe: bool) -> Option<Vec<u8>> {
    let source = record::unix_ns(&value.source_timestamp);
    if dedupe && source.is_some() && cx.last_source_ns[i] == source {
        return None;
    }
    cx.last_source_ns[i] = source;
    cx.stats.notifications.fetch_add(1, Relaxed);
    let now = crate::clock::unix_ns();
    cx.stats
        .last_change
        .store((now / 1_000_000_000).max(0) as u64, Relaxed);
    let r = record::record(
        cx.cfg.output,
        &cx.cfg.measurement,
        &cx.cfg.nodes[i],
        value,
        now,
    );
    if r.is_none() {
        cx.stats.records_lost.fetch_add(1, Relaxed);
    }
    r
}
