//! The opcua source's sessions, one after another until colibri stops: each connects
//! (`connect`), finds the variables of the `browse` folders, looks up the server's namespace
//! table and resolves every node, then reads: a subscription taken over from the last session
//! (or colibri's last life) or made new, driven by colibri's own Publish loop whose requests
//! carry the acknowledgements of what the appender committed; or polls (a Read of every node each
//! interval). A session ends when its connection or session is lost, after which a new one is
//! made from nothing after a backoff: the library's own reconnection is off, so namespace URIs
//! are looked up again, and the subscription is taken over again or, on a server that lost it,
//! made again with every item. Nodes the server does not know are logged once, counted, and
//! asked for again every `RETRY_UNKNOWN`. Called by [`super::run`].

use std::collections::{HashMap, HashSet};
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
use super::browse;
use super::connect::{self, namespace_table, request};
use super::node::NodeRef;
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
    /// The nodes of this session: the configured ones, then the variables found under the
    /// `browse` folders (found again at every session); a node's index is its client handle - 1.
    nodes: Vec<Node>,
    /// Nodes (by name) already logged as unknown: each is logged once.
    logged_unknown: HashSet<String>,
    /// Per node (by name), the source time of the last change handed over: a new item's first
    /// report of a value already stored (its current value, unchanged) is not stored again.
    last_source_ns: HashMap<String, i64>,
    /// Items created in this session whose first report has not come yet.
    fresh: HashSet<usize>,
    /// Whether this session has read anything (a Publish answered, a poll done): a session
    /// lost before is retried with a growing pause, not at once.
    healthy: bool,
}

/// Sessions one after another until `stopping`.
pub async fn run(
    cfg: Arc<OpcuaSourceConfig>,
    stats: Arc<OpcuaSourceStats>,
    tx: mpsc::Sender<Batch>,
    acks: mpsc::UnboundedReceiver<SubscriptionAcknowledgement>,
    stopping: CancellationToken,
) {
    let mut cx = Cx {
        nodes: cfg.nodes.clone(),
        cfg,
        stats,
        tx,
        acks,
        owed: Vec::new(),
        logged_unknown: HashSet::new(),
        last_source_ns: HashMap::new(),
        fresh: HashSet::new(),
        healthy: false,
    };
    let mut attempt = 0u32;
    let mut had_session = false;
    let mut last_failure: Option<String> = None;
    loop {
        cx.healthy = false;
        let outcome = one_session(&mut cx, had_session, &stopping).await;
        cx.stats.connected.store(0, Relaxed);
        let reason = match outcome {
            Outcome::Stopped => break,
            Outcome::Lost(reason) if cx.healthy => {
                tracing::warn!(source = %cx.cfg.name, url = %cx.cfg.endpoint.url, "opcua session lost: {reason}; reconnecting (nothing is read until it is back)");
                had_session = true;
                attempt = 0;
                last_failure = None;
                None
            }
            // A session that fails before it reads anything fails again as a rule: said once,
            // retried with a growing pause.
            Outcome::Lost(reason) => {
                had_session = true;
                Some(format!(
                    "the session failed before reading anything: {reason}"
                ))
            }
            Outcome::Failed(reason) => Some(format!("opcua server not reachable: {reason}")),
        };
        cx.stats.session_failures.fetch_add(1, Relaxed);
        if let Some(reason) = reason {
            if last_failure.as_deref() != Some(reason.as_str()) {
                tracing::warn!(source = %cx.cfg.name, url = %cx.cfg.endpoint.url, "{reason}; retrying");
                last_failure = Some(reason);
            }
            attempt = attempt.saturating_add(1);
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
    // The session is closed (not left to time out on the server, where sessions are counted);
    // the subscription is kept: the next session takes it over, with what it did not
    // acknowledge.
    let _ = tokio::time::timeout(
        Duration::from_secs(2),
        up.session.disconnect_without_delete_subscriptions(),
    )
    .await;
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
    cx.fresh.clear();
    if let Err(e) = discover(cx, session).await {
        return Outcome::Lost(e);
    }
    let mut items = Items::default();
    let opened = match cfg.mode {
        Mode::Subscribe(_) => match open(cx, session, &mut items, stopping).await {
            Ok(o) => Some(o),
            Err(e) => return Outcome::Lost(e),
        },
        Mode::Poll(_) => {
            let all: Vec<usize> = (0..cx.nodes.len()).collect();
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
        cx.nodes.len(),
        items.unknown.len(),
    );
    read_loop(cx, session, (items, opened), driver, stopping).await
}

/// Data until the loss or the stop: the Publish loop of a subscription (or the polls), and the
/// unknown nodes asked for again every `RETRY_UNKNOWN`.
async fn read_loop(
    cx: &mut Cx,
    session: &Arc<Session>,
    (mut items, opened): (Items, Option<Opened>),
    driver: &mut tokio::task::JoinHandle<String>,
    stopping: &CancellationToken,
) -> Outcome {
    let cfg = Arc::clone(&cx.cfg);
    let taken_over = opened.as_ref().is_some_and(|o| o.resent.is_some());
    let timeout = opened.as_ref().map_or(Duration::ZERO, |o| {
        subscription::publish_timeout(o.keep_alive)
    });
    let subscription = opened.map(|o| o.id);
    let mut retry =
        tokio::time::interval_at(tokio::time::Instant::now() + RETRY_UNKNOWN, RETRY_UNKNOWN);
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let poll_every = match cfg.mode {
        Mode::Poll(d) => d,
        Mode::Subscribe(_) => Duration::from_secs(3600),
    };
    let mut poll = tokio::time::interval(poll_every);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let publish = |cx: &mut Cx| {
        // With what was committed meanwhile.
        while let Ok(a) = cx.acks.try_recv() {
            cx.owed.push(a);
        }
        let acks = std::mem::take(&mut cx.owed);
        Box::pin(subscription::publish(Arc::clone(session), acks, timeout))
    };
    let mut inflight = subscription.map(|_| publish(cx));
    loop {
        tokio::select! {
            _ = stopping.cancelled() => return Outcome::Stopped,
            r = &mut *driver => return Outcome::Lost(r.unwrap_or_else(|e| e.to_string())),
            Some(a) = cx.acks.recv() => cx.owed.push(a),
            r = async { inflight.as_mut().expect("polled only with a subscription").await }, if inflight.is_some() => {
                let resp = match r {
                    Ok(resp) => resp,
                    Err(StatusCode::BadTimeout) if taken_over && !cx.healthy => {
                        // Some servers accept the takeover and never publish for the subscription
                        // again (asyncua 2.1 among them): the next session makes a new one.
                        let _ = std::fs::remove_file(&cfg.state_file);
                        return Outcome::Lost("the server took the subscription over but sends nothing for it (BadTimeout): a new one is made".into());
                    }
                    Err(code) => return Outcome::Lost(format!("publish refused: {code}")),
                };
                cx.healthy = true;
                // The next request goes out at once.
                inflight = Some(publish(cx));
                if let Some(status) = hand_over(cx, resp.subscription_id, resp.notification_message, stopping).await {
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
                if let Err(e) = read_all(cx, session, &mut items, stopping).await {
                    return Outcome::Lost(e);
                }
                cx.healthy = true;
            }
        }
    }
}

/// The session's nodes: the configured ones, then each `browse` folder's variables whose browse
/// name matches, named by it (by their id when another node has the name; a node listed twice
/// is read once). A folder the server does not have is logged (once) and skipped.
async fn discover(cx: &mut Cx, session: &Session) -> Result<(), String> {
    let cfg = Arc::clone(&cx.cfg);
    cx.nodes = cfg.nodes.clone();
    if cfg.folders.is_empty() {
        return Ok(());
    }
    let table = namespace_table(session).await?;
    for f in &cfg.folders {
        let Some(start) = f.folder.resolve(&table) else {
            if cx.logged_unknown.insert(f.folder.text.clone()) {
                tracing::warn!(source = %cfg.name, folder = %f.folder.text, "opcua folder not browsed: its namespace URI is not in the server's table");
            }
            continue;
        };
        let rows = browse::tree(session, &start, f.depth, false).await?;
        for row in rows.into_iter().filter(|r| r.class == "Variable") {
            if f.pattern.as_ref().is_some_and(|p| !p.is_match(&row.name)) {
                continue;
            }
            let Ok(id) = NodeRef::parse(&row.id) else {
                continue;
            };
            if cx.nodes.iter().any(|n| n.id.text == id.text) {
                continue;
            }
            let name = if cx.nodes.iter().any(|n| n.name == row.name) {
                id.text.clone()
            } else {
                row.name
            };
            cx.nodes.push(Node {
                id,
                name,
                ..f.template.clone()
            });
        }
    }
    Ok(())
}

/// The subscription a session reads from.
struct Opened {
    id: u32,
    /// Taken over (with so many messages sent again), or made new (`None`).
    resent: Option<usize>,
    /// The longest the server stays silent (publishing interval times keep-alive count).
    keep_alive: Duration,
}

/// The subscription saved for these settings taken over, what the server still has of it sent
/// again; else a new one with an item per node.
async fn open(
    cx: &mut Cx,
    session: &Arc<Session>,
    items: &mut Items,
    stopping: &CancellationToken,
) -> Result<Opened, String> {
    let Mode::Subscribe(publishing) = cx.cfg.mode else {
        return Err("a polled source has no subscription".into());
    };
    let settings = Saved::settings_of(&cx.cfg, &cx.nodes);
    if let Some(saved) = Saved::load(&cx.cfg.state_file, &settings)
        && let Some(seqs) = request(subscription::transfer(session, saved.subscription)).await?
    {
        let table = namespace_table(session).await?;
        items.namespaces = table.len();
        let had: HashSet<usize> = saved.items.iter().copied().collect();
        for i in 0..cx.nodes.len() {
            match cx.nodes[i].id.resolve(&table) {
                Some(id) if had.contains(&i) => items.ok.push((i, id)),
                _ => items.unknown.push(i),
            }
        }
        items.count(cx);
        // What was committed and not yet acknowledged is acknowledged with the first Publish,
        // not sent again.
        while let Ok(a) = cx.acks.try_recv() {
            cx.owed.push(a);
        }
        let mut resent = 0;
        for seq in seqs {
            let owed = cx
                .owed
                .iter()
                .any(|a| a.subscription_id == saved.subscription && a.sequence_number == seq);
            if owed {
                continue;
            }
            if let Some(msg) =
                request(subscription::republish(session, saved.subscription, seq)).await?
            {
                resent += 1;
                // A message of a subscription the server still keeps; its status is no end.
                let _ = hand_over(cx, saved.subscription, msg, stopping).await;
            }
        }
        return Ok(Opened {
            id: saved.subscription,
            resent: Some(resent),
            keep_alive: subscription::keep_alive_of(publishing),
        });
    }
    let (id, keep_alive) = request(subscription::create(session, &cx.cfg)).await?;
    let all: Vec<usize> = (0..cx.nodes.len()).collect();
    items.add(cx, session, Some(id), &all).await?;
    save(cx, id, items);
    Ok(Opened {
        id,
        resent: None,
        keep_alive,
    })
}

/// The subscription's id and items kept for colibri's next start (a failure only costs the
/// takeover: logged).
fn save(cx: &Cx, id: u32, items: &Items) {
    let saved = Saved {
        settings: Saved::settings_of(&cx.cfg, &cx.nodes),
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
    stopping: &CancellationToken,
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
        if i < cx.nodes.len()
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
        // At a stop (or without the appender) the message stays unacknowledged: the server
        // sends it again to the next session.
        let batch = Batch {
            records,
            ack: Some(ack),
        };
        tokio::select! {
            _ = stopping.cancelled() => {}
            _ = cx.tx.send(batch) => {}
        }
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
            match cx.nodes[i].id.resolve(&table) {
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
                        .map(|(i, id)| item(&cx.nodes[*i], *i, id))
                        .collect();
                    let created = request(subscription::add_items(session, sub, requests)).await?;
                    for ((i, id), status) in chunk.iter().zip(created) {
                        if status.is_good() {
                            self.ok.push((*i, id.clone()));
                            cx.fresh.insert(*i);
                            cx.logged_unknown.remove(&cx.nodes[*i].name);
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
        let node = &cx.nodes[i];
        if cx.logged_unknown.insert(node.name.clone()) {
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
async fn read_all(
    cx: &mut Cx,
    session: &Session,
    items: &mut Items,
    stopping: &CancellationToken,
) -> Result<(), String> {
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
        let n = records.len() as u64;
        let sent = tokio::select! {
            _ = stopping.cancelled() => false,
            r = cx.tx.send(Batch { records, ack: None }) => r.is_ok(),
        };
        if !sent {
            // Polled values are acknowledged to nobody: what a stop leaves is lost, and counted.
            cx.stats.records_lost.fetch_add(n, Relaxed);
        }
    }
    Ok(())
}

/// Node `i`'s value as a record, counted; `None` for a change already handed over (`dedupe`:
/// a new item's first report, of the source time stored last) or one line protocol cannot
/// write.
fn to_record(cx: &mut Cx, i: usize, value: &DataValue, dedupe: bool) -> Option<Vec<u8>> {
    let node = &cx.nodes[i];
    let source = record::unix_ns(&value.source_timestamp);
    if let Some(t) = source {
        // Only an item's first report (its current value) can repeat what was stored.
        if dedupe && cx.fresh.remove(&i) && cx.last_source_ns.get(&node.name) == Some(&t) {
            return None;
        }
        cx.last_source_ns.insert(node.name.clone(), t);
    }
    cx.stats.notifications.fetch_add(1, Relaxed);
    if value.status.is_some_and(|s| s.overflow()) {
        cx.stats.overflows.fetch_add(1, Relaxed);
    }
    let now = crate::clock::unix_ns();
    cx.stats
        .last_change
        .store((now / 1_000_000_000).max(0) as u64, Relaxed);
    let r = record::record(cx.cfg.output, &cx.cfg.measurement, node, value, now);
    if r.is_none() {
        cx.stats.records_lost.fetch_add(1, Relaxed);
    }
    r
}
