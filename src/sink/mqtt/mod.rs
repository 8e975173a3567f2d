//! The `mqtt` sink (feature `mqtt`): a job's records published to an MQTT broker (5, or 3.1.1 with
//! `protocol`), one message per
//! record (or the job as one ndjson message with `batch`), at QoS 1 or 2, on a topic made from a
//! template. It owns the settings, the topic template and the outcome of a job: delivered only when
//! every message of it is PUBACKed (QoS 1) or PUBCOMPed (QoS 2), unreachable (no attempt spent)
//! while the connection is down or the broker refuses colibri's credentials or the topic, too large
//! when a message would pass the broker's maximum packet size (the delivery worker then sends the
//! job in halves, down to the one record, which goes to the dead letters alone). The connection
//! itself (connect, reconnect, the status messages) is [`conn`]'s (the two protocol versions behind
//! [`client`], in `v5` and `v311`; what both share in [`common`]; the
//! settings in [`settings`], their file shape in [`config`]). Built by
//! `sink::Sink::new` from the compiled config.
//!
//! With `encoding: sparkplug_b` the sink is a Sparkplug B edge node instead: a job is DBIRTHs and
//! DDATAs made by the node ([`sparkplug`]), the same outcome rules applied to their
//! acknowledgements.
//!
//! Under MQTT 5 every message carries the user property `idempotency-key`: for a message per record
//! the job's key and the record's position in the job (`<store>:<stream>:<job>#<index>`, the same
//! after a split or a crash), for a batch the job's (or part's) key as the `http` sink sends it.
//! MQTT 3.1.1 has no place for it (`v311` lists what else it cannot say).

use std::sync::Arc;
use std::time::Duration;

use crate::setting::SettingError;
use crate::sink::SinkConfig;
use crate::sink::deliver::{Batch, Deliver, DeliveryError, Probe};
use crate::sink::kind::KindConfig;
use crate::sink::template::Message;
use crate::store::FileJob;
use common::Refusal;
pub use config::MqttSinkSpec as Spec;
use conn::{Connection, Link};
pub use settings::{MqttConfig, Protocol, Qos, Status};
use sparkplug::node::Node;

mod client;
mod common;
mod config;
mod conn;
mod settings;
pub mod sparkplug;
mod v311;
mod v5;

/// The built sink: the settings and the connection (its driver starts when the sink is started).
pub struct MqttSink {
    spec: MqttConfig,
    /// The longest a connect, or a job's publishes and their acknowledgements, may take (the
    /// sink's `timeout`).
    timeout: Duration,
    conn: Connection,
    /// `encoding: sparkplug_b`: the edge node that makes each job's messages.
    node: Option<Arc<Node>>,
}

impl MqttSink {
    /// Reads the TLS files and prepares the connection; nothing is dialled yet. Errors name the
    /// setting.
    pub fn new(spec: &MqttConfig, timeout: Duration) -> Result<MqttSink, SettingError> {
        let node = spec
            .sparkplug
            .clone()
            .and_then(|sp| Node::new(sp, spec.qos));
        Ok(MqttSink {
            conn: Connection::new(spec, timeout, node.clone())?,
            spec: spec.clone(),
            timeout,
            node,
        })
    }

    /// Refuses the job when a message would pass the broker's maximum packet size.
    fn check_sizes(
        &self,
        max_packet: Option<u32>,
        messages: &[Message],
    ) -> Result<(), DeliveryError> {
        let Some(max) = max_packet else {
            return Ok(());
        };
        for m in messages {
            let size = self.conn.client().publish_size(m);
            if size > max as usize {
                let what = if self.node.is_some() {
                    format!("the job's message to {}", m.to)
                } else if self.spec.batch {
                    "the job as one message".to_string()
                } else {
                    format!("record {} of the job", m.index)
                };
                return Err(DeliveryError::TooLarge(format!(
                    "{what} makes a {size}-byte PUBLISH; the broker takes at most {max} bytes"
                )));
            }
        }
        Ok(())
    }

    /// Publishes each message and waits for all their acknowledgements, in order.
    async fn publish(
        &self,
        max_packet: Option<u32>,
        messages: Vec<Message>,
    ) -> Result<(), DeliveryError> {
        self.check_sizes(max_packet, &messages)?;
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut notices = Vec::with_capacity(messages.len());
        for m in messages {
            let topic = m.to.clone();
            let queued =
                tokio::time::timeout_at(deadline, self.conn.client().publish(m, self.spec.qos))
                    .await
                    .map_err(|_| self.no_answer())?;
            let notice = queued.map_err(|e| {
                DeliveryError::Permanent(format!("cannot publish to {topic:?}: {e}"))
            })?;
            notices.push((topic, notice));
        }
        self.confirm(deadline, notices).await
    }

    /// Waits for each queued message's acknowledgement, until `deadline`.
    async fn confirm(
        &self,
        deadline: tokio::time::Instant,
        notices: Vec<(String, client::Notice)>,
    ) -> Result<(), DeliveryError> {
        for (topic, notice) in notices {
            let done = tokio::time::timeout_at(deadline, notice.completed())
                .await
                .map_err(|_| self.no_answer())?;
            done.map_err(|e| classify(&topic, e, &self.conn))?;
        }
        Ok(())
    }

    /// A job as the edge node's messages (births first where needed), queued in seq order and
    /// then acknowledged.
    #[cfg(feature = "sparkplug")]
    async fn sparkplug(
        &self,
        node: &Arc<Node>,
        max_packet: Option<u32>,
        batch: &Batch<'_>,
        body: &[u8],
    ) -> Result<(), DeliveryError> {
        // The job waits its turn for the session's lock (another job queueing) unbounded, as it
        // would for a request slot; from then on its queueing and its acknowledgements each
        // have the sink's timeout.
        let check = |m: &[Message]| self.check_sizes(max_packet, m);
        let client = self.conn.client();
        let queued = node.data(client, batch, body, self.timeout, check).await?;
        let deadline = tokio::time::Instant::now() + self.timeout;
        self.confirm(deadline, queued.notices).await?;
        node.confirmed(queued.epoch)
    }

    #[cfg(not(feature = "sparkplug"))]
    async fn sparkplug(
        &self,
        node: &Arc<Node>,
        _: Option<u32>,
        _: &Batch<'_>,
        _: &[u8],
    ) -> Result<(), DeliveryError> {
        match **node {}
    }

    fn no_answer(&self) -> DeliveryError {
        DeliveryError::Unavailable(format!(
            "{}: no acknowledgement within {:?}",
            self.conn.shown(),
            self.timeout
        ))
    }
}

/// What a refused or lost message means for the job.
fn classify(topic: &str, e: Refusal, conn: &Connection) -> DeliveryError {
    let refused = |why: &str| {
        format!(
            "{}: the broker refused a message to {topic:?}: {why}",
            conn.shown()
        )
    };
    match e {
        // The broker's access list does not let colibri publish there: the sink's setting, not the
        // job's fault; like a 403, deliveries wait (no attempt spent) until it is allowed.
        Refusal::NotAuthorized(why) => DeliveryError::Unavailable(refused(&format!(
            "{why} (deliveries wait until the broker allows this topic)"
        ))),
        Refusal::Invalid(why) => DeliveryError::Permanent(refused(&why)),
        Refusal::Other(why) => DeliveryError::transient(refused(&why)),
        // The connection or its session ended before the answer: an outage.
        Refusal::Lost(why) => DeliveryError::Unavailable(format!("{}: {why}", conn.shown())),
    }
}

impl KindConfig for MqttConfig {
    type Built = MqttSink;

    fn build(&self, sink: &SinkConfig) -> Result<MqttSink, SettingError> {
        MqttSink::new(self, sink.timeout)
    }
}

impl Deliver for MqttSink {
    fn start(&self) {
        self.conn.start();
    }

    async fn send(&self, batch: &Batch<'_>, body: Vec<u8>) -> Result<(), DeliveryError> {
        let max_packet = match self.conn.up(self.timeout).await {
            // The smaller of the broker's limit and the one the settings give (the driver's).
            Link::Up { max_packet } => max_packet,
            Link::Down(reason) => return Err(DeliveryError::Unavailable(reason)),
        };
        if let Some(node) = &self.node {
            return self.sparkplug(node, max_packet, batch, &body).await;
        }
        let messages = self.spec.topic.messages(batch, body, self.spec.batch)?;
        self.publish(max_packet, messages).await
    }

    async fn send_file(&self, _batch: &Batch<'_>, file: &FileJob) -> Result<(), DeliveryError> {
        Err(DeliveryError::Permanent(format!(
            "{} is a file, and an mqtt sink publishes records",
            file.name.to_string_lossy()
        )))
    }

    /// Connects (or waits for the connection being made) whatever `link.probe` says: only a
    /// CONNACK proves the broker takes colibri's messages.
    async fn probe(&self, _how: &Probe) -> Result<(), String> {
        match self.conn.connect_now(self.timeout).await {
            Link::Up { .. } => match self.node.as_deref().and_then(Node::waiting) {
                None => Ok(()),
                Some(why) => Err(format!("{}: sparkplug: {why}", self.conn.shown())),
            },
            Link::Down(reason) => Err(reason),
        }
    }
}
