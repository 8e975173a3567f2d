//! The edge node's session (Sparkplug 3.0): bdSeq for each connection (in NBIRTH and in the NDEATH
//! will), seq 0-255 on every message from NBIRTH on, NBIRTH then a DBIRTH per known device before
//! any data, a DBIRTH again before the data of a device whose metric set changed, births again on
//! a `Node Control/Rebirth` NCMD, and, with `primary_host_id`, no birth and no data while that
//! host's STATE is not online (offline ends the session: the driver drops the connection, the
//! broker publishes the NDEATH will). It owns [`Node`]: the state the connection's driver changes
//! (`connected`, `lost`, `incoming`), the births, and the session's lock and epoch that a job's
//! messages (`data`) are queued and confirmed under. It does not wait for acknowledgements (the
//! sink does) or connect (`conn` does).

use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use prost::Message as _;

use super::SparkplugConfig;
use super::payload::{Metric, Payload, Value, datatype};
use super::registry::Registry;
use crate::clock::now_ms;
use crate::sink::deliver::DeliveryError;
use crate::sink::mqtt::client::Client;
use crate::sink::mqtt::settings::Qos;
use crate::sink::template::Message;

/// The NBIRTH metric a host writes `true` to, in an NCMD, to ask for births again.
const REBIRTH: &str = "Node Control/Rebirth";

/// The edge node: its settings, the connection's state, and the session's.
pub struct Node {
    pub(super) cfg: SparkplugConfig,
    pub(super) qos: Qos,
    topics: Topics,
    flags: Mutex<Flags>,
    /// Held while a birth or a job's messages are made and queued.
    pub(super) session: tokio::sync::Mutex<Session>,
}

/// What the driver changes, never held across an await.
struct Flags {
    /// This connection's birth-death sequence, in its will and its NBIRTH.
    bd_seq: u8,
    connected: bool,
    /// The primary host's STATE, once read (`None`: none read yet in this connection), and the
    /// timestamp of the newest one (older ones are stale retained copies, ignored).
    host: Option<bool>,
    host_time: u64,
    /// The last STATE read, kept across connections (its retained copy is read at each).
    last_state: Option<(bool, u64)>,
    /// The largest packet this connection takes.
    max_packet: Option<u32>,
    /// NBIRTH queued in this connection (and the host online): data may follow.
    born: bool,
    /// Counts connections and host changes: a birth made for an earlier one is dropped.
    epoch: u64,
}

pub(super) struct Session {
    pub(super) seq: u8,
    pub(super) registry: Registry,
    /// When the node was last born after being dead: a sample taken before it is historical.
    pub(super) born_at_ms: u64,
}

struct Topics {
    nbirth: String,
    ndeath: String,
    ncmd: String,
    /// `spBv1.0/<group>/` and `/<node>/`: around a device message's type.
    group: String,
    node: String,
    state: Option<String>,
}

impl Node {
    pub fn new(cfg: SparkplugConfig, qos: Qos) -> Option<Arc<Node>> {
        let t = |kind: &str| format!("spBv1.0/{}/{kind}/{}", cfg.group_id, cfg.edge_node_id);
        let topics = Topics {
            nbirth: t("NBIRTH"),
            ndeath: t("NDEATH"),
            ncmd: t("NCMD"),
            group: format!("spBv1.0/{}/", cfg.group_id),
            node: format!("/{}/", cfg.edge_node_id),
            state: cfg
                .primary_host_id
                .as_ref()
                .map(|h| format!("spBv1.0/STATE/{h}")),
        };
        // A missing or unreadable file starts at 0 (the first connection of a new node).
        let bd_seq = std::fs::read_to_string(&cfg.bd_seq_file)
            .ok()
            .and_then(|s| s.trim().parse::<u8>().ok())
            .unwrap_or(0);
        Some(Arc::new(Node {
            cfg,
            qos,
            topics,
            flags: Mutex::new(Flags {
                bd_seq,
                connected: false,
                host: None,
                host_time: 0,
                last_state: None,
                max_packet: None,
                born: false,
                epoch: 0,
            }),
            session: tokio::sync::Mutex::new(Session {
                seq: 0,
                registry: Registry::default(),
                born_at_ms: 0,
            }),
        }))
    }

    fn flags(&self) -> MutexGuard<'_, Flags> {
        self.flags
            .lock()
            .expect("nothing panics while holding the flags")
    }

    /// The will for the next connection: NDEATH with its bdSeq.
    pub fn will(&self) -> (String, Vec<u8>) {
        let bd_seq = self.flags().bd_seq;
        (self.topics.ndeath.clone(), death(bd_seq))
    }

    /// A connection was accepted: subscribe to the commands (and the host's STATE), and birth
    /// unless a primary host must be online first.
    /// `max_packet`: the largest packet the broker (or the settings) take, which a birth must fit.
    pub fn connected(self: &Arc<Self>, client: &Client, max_packet: Option<u32>) {
        let (epoch, bd_seq) = {
            let mut f = self.flags();
            f.connected = true;
            f.host = None;
            f.max_packet = max_packet;
            f.epoch += 1;
            (f.epoch, f.bd_seq)
        };
        // The next process's first connection follows this one's. Written, not synced: after a
        // power cut that lost it, the broker still publishes the old connection's NDEATH when
        // the new one takes over the client id, before the new NBIRTH, so a host tells them apart.
        let next = bd_seq.wrapping_add(1).to_string();
        if let Err(e) = std::fs::write(&self.cfg.bd_seq_file, next) {
            tracing::warn!(file = %self.cfg.bd_seq_file.display(), "sparkplug: cannot keep bdSeq: {e}");
        }
        for topic in std::iter::once(&self.topics.ncmd).chain(&self.topics.state) {
            if let Err(e) = client.subscribe(topic) {
                tracing::warn!(topic, "sparkplug: cannot subscribe: {e}");
            }
        }
        if self.topics.state.is_none() {
            self.birth(client, epoch, true);
        }
    }

    /// The connection ended: dead until the next one's births, which carry the next bdSeq. The
    /// next connection's will (NDEATH with that bdSeq).
    pub fn lost(&self) -> (String, Vec<u8>) {
        {
            let mut f = self.flags();
            if f.connected {
                f.bd_seq = f.bd_seq.wrapping_add(1);
            }
            f.connected = false;
            f.born = false;
            f.epoch += 1;
        }
        self.will()
    }

    /// A message on a subscribed topic: the host's STATE or an NCMD. `true`: the session must
    /// end (the driver drops the connection, so the broker publishes the NDEATH will).
    pub fn incoming(self: &Arc<Self>, client: &Client, topic: &str, payload: &[u8]) -> bool {
        if self.topics.state.as_deref() == Some(topic) {
            return self.host_state(client, payload);
        } else if topic == self.topics.ncmd {
            let rebirth = Payload::decode(payload).is_ok_and(|p| {
                p.metrics.iter().any(|m| {
                    m.name.as_deref() == Some(REBIRTH) && m.value == Some(Value::Boolean(true))
                })
            });
            // Not while a primary host is offline: its birth waits for the host's STATE.
            let epoch = {
                let f = self.flags();
                self.may_birth(&f).then_some(f.epoch)
            };
            if let (true, Some(epoch)) = (rebirth, epoch) {
                tracing::info!(node = %self.cfg.edge_node_id, "sparkplug: rebirth asked");
                self.birth(client, epoch, false);
            }
        }
        false
    }

    /// The primary host's STATE (3.0: `{"online": bool, "timestamp": ms}`): online births the
    /// node; offline ends its session (`true`; data then waits in the stream).
    fn host_state(self: &Arc<Self>, client: &Client, payload: &[u8]) -> bool {
        #[derive(serde::Deserialize)]
        struct State {
            online: bool,
            #[serde(default)]
            timestamp: u64,
        }
        let host = self.cfg.primary_host_id.as_deref().unwrap_or_default();
        let Ok(state) = serde_json::from_slice::<State>(payload) else {
            tracing::warn!(
                host,
                "sparkplug: the primary host's STATE is not 3.0 JSON; ignored"
            );
            return false;
        };
        let (began, epoch, again) = {
            let mut f = self.flags();
            // Older than one read before: a stale copy (an old connection's will), ignored.
            if state.timestamp < f.host_time {
                return false;
            }
            f.host_time = state.timestamp;
            // The retained STATE read again after a reconnect: nothing new to log.
            let again = f.last_state == Some((state.online, state.timestamp));
            f.last_state = Some((state.online, state.timestamp));
            if f.host == Some(state.online) {
                return false;
            }
            // A birth was begun in this connection (born, or under way) when the host was online.
            let began = f.born || f.host == Some(true);
            f.host = Some(state.online);
            f.born = false;
            f.epoch += 1;
            (began, f.epoch, again)
        };
        if state.online {
            if !again {
                tracing::info!(host, "sparkplug: primary host online: birth");
            }
            self.birth(client, epoch, true);
            false
        } else {
            if !again {
                tracing::info!(host, "sparkplug: primary host offline: data waits");
            }
            // The spec's end of a session: NDEATH and the connection closed. Dropped, not
            // closed with a DISCONNECT, so the broker publishes the NDEATH will itself, after
            // everything sent before it; the next connection's NBIRTH carries the next bdSeq.
            began
        }
    }

    /// Whether births may go now: connected, and the primary host (if any) online.
    fn may_birth(&self, f: &Flags) -> bool {
        f.connected && (self.topics.state.is_none() || f.host == Some(true))
    }

    /// The epoch data is sent in, or why data cannot go now.
    pub(super) fn sending(&self) -> Result<u64, String> {
        let f = self.flags();
        match self.why_waiting(&f) {
            None => Ok(f.epoch),
            Some(why) => Err(why),
        }
    }

    /// After a job's acknowledgements: refused when the connection or the host changed while it
    /// was sent (what was queued then may have gone out before the next NBIRTH, which a host
    /// ignores), so the job goes again after the next birth.
    pub fn confirmed(&self, epoch: u64) -> Result<(), DeliveryError> {
        if self.flags().epoch == epoch {
            Ok(())
        } else {
            Err(DeliveryError::Unavailable(
                "sparkplug: the session changed while the job was sent; sent again after the next birth"
                    .into(),
            ))
        }
    }

    /// The session's seq or births are no longer what a host counts (a job's messages were
    /// only partly queued): born again before anything else goes. The epoch stays: jobs queued
    /// before went out in order under the current NBIRTH.
    pub(super) fn reborn(self: &Arc<Self>, client: &Client) {
        let epoch = {
            let mut f = self.flags();
            f.born = false;
            self.may_birth(&f).then_some(f.epoch)
        };
        if let Some(epoch) = epoch {
            self.birth(client, epoch, false);
        }
    }

    /// Why data cannot go now, or `None` when it can.
    pub fn waiting(&self) -> Option<String> {
        self.why_waiting(&self.flags())
    }

    fn why_waiting(&self, f: &Flags) -> Option<String> {
        let host = self.cfg.primary_host_id.as_deref().unwrap_or_default();
        match (f.born, f.host) {
            (true, _) => None,
            (false, Some(false)) => Some(format!("primary host {host:?} is offline")),
            (false, None) if self.topics.state.is_some() => {
                Some(format!("no STATE from primary host {host:?} yet"))
            }
            (false, _) => Some("the edge node's births are not sent yet".into()),
        }
    }

    /// Queues NBIRTH and every known device's DBIRTH (a task of its own: the queue may be full
    /// while the driver, which empties it, goes on). `renew`: the node was dead, so samples taken
    /// until now are historical.
    fn birth(self: &Arc<Self>, client: &Client, epoch: u64, renew: bool) {
        let (node, client) = (self.clone(), client.clone());
        tokio::spawn(async move { node.births(&client, epoch, renew).await });
    }

    async fn births(&self, client: &Client, epoch: u64, renew: bool) {
        let mut s = self.session.lock().await;
        let Some((bd_seq, max_packet)) = self.in_epoch(epoch, |f| (f.bd_seq, f.max_packet)) else {
            return;
        };
        let now = now_ms();
        s.seq = 0;
        let nbirth = node_birth(bd_seq);
        let mut messages = vec![self.message(
            &mut s,
            self.topics.nbirth.clone(),
            now,
            nbirth,
            String::new(),
        )];
        for d in 0..s.registry.len() {
            let m = self.device_birth(&mut s, d, now);
            let size = client.publish_size(&m);
            if max_packet.is_some_and(|max| size > max as usize) {
                // Sent, it would end the connection, and again after each reconnect: the device
                // stays unborn, and its records go to the dead letters with the size.
                s.seq = s.seq.wrapping_sub(1);
                let device = s.registry.device(d);
                device.born = false;
                tracing::warn!(device = %device.id, size, "sparkplug: a DBIRTH over the broker's packet limit is not sent");
                continue;
            }
            messages.push(m);
        }
        let mut notices = Vec::with_capacity(messages.len());
        for m in messages {
            // A connection lost meanwhile: the next one births under its own bdSeq.
            if self.in_epoch(epoch, |_| ()).is_none() {
                return;
            }
            match client.publish(m, self.qos).await {
                Ok(n) => notices.push(n),
                Err(e) => return tracing::warn!("sparkplug: births not queued: {e}"),
            }
        }
        let born = self.in_epoch(epoch, |f| {
            f.born = true;
        });
        if born.is_none() {
            return;
        }
        if renew {
            s.born_at_ms = now;
        }
        drop(s);
        for n in notices {
            if let Err(e) = n.completed().await {
                return tracing::warn!("sparkplug: a birth was not acknowledged: {e:?}");
            }
        }
    }

    /// `then` on the flags if they are still in `epoch`.
    fn in_epoch<T>(&self, epoch: u64, then: impl FnOnce(&mut Flags) -> T) -> Option<T> {
        let mut f = self.flags();
        (f.epoch == epoch).then(|| then(&mut f))
    }

    /// The DBIRTH of device `d` (its set then born).
    pub(super) fn device_birth(&self, s: &mut Session, d: usize, now: u64) -> Message {
        let device = s.registry.device(d);
        device.born = true;
        let (topic, metrics) = (
            self.device_topic("DBIRTH", &device.id),
            device.birth_metrics(),
        );
        self.message(s, topic, now, metrics, String::new())
    }

    pub(super) fn device_topic(&self, kind: &str, device: &str) -> String {
        format!("{}{kind}{}{device}", self.topics.group, self.topics.node)
    }

    /// A payload with the next seq.
    pub(super) fn message(
        &self,
        s: &mut Session,
        to: String,
        now: u64,
        metrics: Vec<Metric>,
        key: String,
    ) -> Message {
        let payload = Payload {
            timestamp: Some(now),
            metrics,
            seq: Some(u64::from(s.seq)),
            uuid: (!key.is_empty()).then(|| key.clone()),
        };
        s.seq = s.seq.wrapping_add(1);
        Message {
            to,
            payload: Bytes::from(payload.encode_to_vec()),
            key,
            replayed: false,
            index: 0,
        }
    }
}

/// NBIRTH's metrics: bdSeq and the rebirth control.
fn node_birth(bd_seq: u8) -> Vec<Metric> {
    vec![
        Metric::named("bdSeq", datatype::INT64, Value::Long(u64::from(bd_seq))),
        Metric::named(REBIRTH, datatype::BOOLEAN, Value::Boolean(false)),
    ]
}

/// NDEATH's payload: the bdSeq of the connection it ends (no seq, by the spec).
fn death(bd_seq: u8) -> Vec<u8> {
    Payload {
        timestamp: Some(now_ms()),
        metrics: vec![Metric::named(
            "bdSeq",
            datatype::INT64,
            Value::Long(u64::from(bd_seq)),
        )],
        seq: None,
        uuid: None,
    }
    .encode_to_vec()
}
