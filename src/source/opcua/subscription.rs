//! The opcua source's subscription, driven by colibri rather than by the client library, so
//! that **a notification is acknowledged only after the commit that holds it**: the Publish
//! requests are colibri's own ([`publish`]), each carrying the acknowledgements the appender
//! handed back since the last one. What the server sent and colibri did not acknowledge stays in
//! the server's retransmission queue; a later session takes the subscription over
//! ([`transfer`]: colibri's next session after a lost connection, or colibri's next start, the
//! subscription's id kept in a file of the `data_dir`, [`Saved`]) and has the server send it
//! again ([`republish`]). Only a server that lost the subscription (restarted, or its lifetime
//! over) makes a new one, whose items start with their current values. Also the subscription's
//! creation and its messages read into changes ([`changes`]). Called by `session`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use opcua_client::Session;
use opcua_client::UARequest as _;
use opcua_client::services::{
    CreateMonitoredItems, CreateSubscription, Publish, Republish, TransferSubscriptions,
};
use opcua_types::{
    DataChangeNotification, DataValue, MonitoredItemCreateRequest, NotificationMessage,
    PublishResponse, StatusChangeNotification, StatusCode, SubscriptionAcknowledgement,
    TimestampsToReturn,
};
use serde::{Deserialize, Serialize};

use super::{Mode, Node, OpcuaSourceConfig};

/// The server's keep-alive, at most this far apart (it answers a Publish at least this often).
const KEEP_ALIVE: Duration = Duration::from_secs(5);
/// How long the server keeps the subscription without a Publish request: the longest colibri
/// restart (or outage) after which what it did not acknowledge is still sent again.
pub const LIFETIME: Duration = Duration::from_secs(300);
/// Changes per notification message at most (a server may send more: `connect` decodes up to
/// 100,000).
const MOST_PER_MESSAGE: u32 = 5000;

/// What is kept in the `data_dir` so colibri's next start takes the subscription over.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct Saved {
    /// Of the source's endpoint, nodes and intervals: a subscription made for other settings is
    /// not taken over.
    pub settings: String,
    pub subscription: u32,
    /// The nodes (by index) that have a monitored item in it.
    pub items: Vec<usize>,
}

impl Saved {
    /// The fingerprint a saved subscription must carry: the endpoint, the mode and what the
    /// server was asked of each node, in order (their indexes are the items' handles); a node's
    /// name and tags are colibri's, and may change without giving the subscription up.
    pub fn settings_of(cfg: &OpcuaSourceConfig, nodes: &[Node]) -> String {
        let mut text = format!("{}|{:?}", cfg.endpoint.url, cfg.mode);
        for n in nodes {
            text.push_str(&format!(
                "|{} {:?} {} {:?}",
                n.id.text, n.sampling, n.queue_size, n.deadband
            ));
        }
        format!("{:016x}", crate::files::fnv1a(text.as_bytes()))
    }

    /// The saved subscription, if any was saved for these settings.
    pub fn load(path: &Path, settings: &str) -> Option<Saved> {
        let bytes = std::fs::read(path).ok()?;
        let saved: Saved = serde_json::from_slice(&bytes).ok()?;
        (saved.settings == settings).then_some(saved)
    }

    /// Written whole (a new file renamed over the old one): a crash leaves one or the other.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let tmp = path.with_extension("tmp");
        std::fs::write(
            &tmp,
            serde_json::to_vec(self).map_err(std::io::Error::other)?,
        )?;
        std::fs::rename(&tmp, path)
    }
}

/// How long a Publish may wait for its answer: the server answers at least every keep-alive
/// (publishing interval times keep-alive count), with room for a slow network.
pub fn publish_timeout(keep_alive: Duration) -> Duration {
    keep_alive.mul_f64(1.5) + Duration::from_secs(5)
}

/// The keep-alive colibri asks for at `publishing` (the server may revise it: [`create`] gives
/// the revised one; a subscription taken over keeps what it was given, assumed to be this).
pub fn keep_alive_of(publishing: Duration) -> Duration {
    publishing.max(KEEP_ALIVE)
}

/// A new subscription for the source's publishing interval; its id and its keep-alive as the
/// server revised it.
pub async fn create(session: &Session, cfg: &OpcuaSourceConfig) -> Result<(u32, Duration), String> {
    let Mode::Subscribe(publishing) = cfg.mode else {
        return Err("a polled source has no subscription".into());
    };
    let ms = publishing.as_millis().max(1);
    let keep_alive = u32::try_from(KEEP_ALIVE.as_millis() / ms)
        .unwrap_or(u32::MAX)
        .max(1);
    let lifetime = u32::try_from(LIFETIME.as_millis() / ms)
        .unwrap_or(u32::MAX)
        .max(keep_alive.saturating_mul(3));
    let r = CreateSubscription::new(session)
        .publishing_interval(publishing)
        .max_keep_alive_count(keep_alive)
        .max_lifetime_count(lifetime)
        .max_notifications_per_publish(MOST_PER_MESSAGE)
        .publishing_enabled(true)
        .send(session.channel())
        .await
        .map_err(|e| e.to_string())?;
    let revised = Duration::from_secs_f64(
        (r.revised_publishing_interval / 1000.0).max(0.0)
            * f64::from(r.revised_max_keep_alive_count.max(1)),
    );
    Ok((r.subscription_id, revised.max(publishing)))
}

/// Monitored items in subscription `id`; each request's status, in order.
pub async fn add_items(
    session: &Session,
    id: u32,
    items: Vec<MonitoredItemCreateRequest>,
) -> Result<Vec<StatusCode>, String> {
    let r = CreateMonitoredItems::new(id, session)
        .timestamps_to_return(TimestampsToReturn::Both)
        .items_to_create(items)
        .send(session.channel())
        .await
        .map_err(|e| e.to_string())?;
    Ok(r.results
        .into_iter()
        .map(|c| c.result.status_code)
        .collect())
}

/// Subscription `id` taken over by this session; the sequence numbers of the messages the
/// server still has unacknowledged, oldest first. `None` when the server no longer has it.
pub async fn transfer(session: &Session, id: u32) -> Result<Option<Vec<u32>>, String> {
    let r = TransferSubscriptions::new(session)
        .subscription(id)
        .send_initial_values(false)
        .send(session.channel())
        .await;
    let results = match r {
        Ok(r) => r.results.unwrap_or_default(),
        // A server without the service, or one that refuses it for this session.
        Err(e)
            if matches!(
                e.status(),
                StatusCode::BadServiceUnsupported
                    | StatusCode::BadSubscriptionIdInvalid
                    | StatusCode::BadUserAccessDenied
                    | StatusCode::BadNothingToDo
            ) =>
        {
            return Ok(None);
        }
        // The connection, not the subscription: the next session tries again.
        Err(e) => return Err(e.to_string()),
    };
    match results.into_iter().next() {
        Some(t) if t.status_code.is_good() => {
            let mut seqs = t.available_sequence_numbers.unwrap_or_default();
            seqs.sort_unstable();
            Ok(Some(seqs))
        }
        _ => Ok(None),
    }
}

/// The message `seq` of subscription `id` sent again.
pub async fn republish(
    session: &Session,
    id: u32,
    seq: u32,
) -> Result<Option<NotificationMessage>, String> {
    match Republish::new(id, seq, session)
        .send(session.channel())
        .await
    {
        Ok(r) => Ok(Some(r.notification_message)),
        // The server dropped it meanwhile (its queue is bounded): nothing to send.
        Err(e) if e.status() == StatusCode::BadMessageNotAvailable => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

/// One Publish request with the acknowledgements `acks`, answered with the next message (or a
/// keep-alive). Owns its session handle, so it can wait while the session's loop does more.
pub async fn publish(
    session: Arc<Session>,
    acks: Vec<SubscriptionAcknowledgement>,
    timeout: Duration,
) -> Result<PublishResponse, StatusCode> {
    Publish::new(&session)
        .timeout(timeout)
        .acks(acks)
        .send(session.channel())
        .await
        .map_err(|e| e.status())
}

/// What a message holds: the data changes (client handle and value) in the server's order,
/// and the subscription's new status when the server reports one (it is over).
pub fn changes(msg: NotificationMessage) -> (Vec<(u32, DataValue)>, Option<StatusCode>) {
    let mut out = Vec::new();
    let mut status = None;
    for obj in msg.notification_data.unwrap_or_default() {
        if let Some(d) = obj.inner_as::<DataChangeNotification>() {
            for n in d.monitored_items.iter().flatten() {
                out.push((n.client_handle, n.value.clone()));
            }
        } else if let Some(s) = obj.inner_as::<StatusChangeNotification>() {
            status = Some(s.status);
        }
    }
    (out, status)
}
