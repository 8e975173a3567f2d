//! The two MQTT protocol versions behind one face, so the connection's driver and the deliveries
//! are written once: the client a delivery publishes through ([`Client`]), the event loop the
//! driver polls ([`Events`], reporting [`Polled`]), a message's wait for its acknowledgement
//! ([`Notice`], failing with a [`Refusal`]). What each version sends and how its packets map to
//! these words is in `v5` and `v311` (the words themselves in `common`). Built by
//! `conn::Connection::new` from the sink's `protocol`; used by `conn` and the sink.

use std::time::Duration;

use super::common::{Polled, Refusal};
use super::settings::{MqttConfig, Protocol, Qos, Status};
use super::{v5, v311};
use crate::setting::SettingError;
use crate::sink::template::Message;

/// The client: clones share one request queue to the event loop.
#[derive(Clone)]
pub enum Client {
    V5(rumqttc::AsyncClient),
    V311(rumqttc_v4::AsyncClient),
}

/// The event loop: owns the network connection and the session's in-flight messages.
pub enum Events {
    V5(Box<rumqttc::EventLoop>),
    V311(Box<rumqttc_v4::EventLoop>),
}

/// A published message's acknowledgement to come.
pub enum Notice {
    V5(rumqttc::PublishNotice),
    V311(rumqttc_v4::PublishNotice),
}

/// The client and its event loop for the sink's protocol; nothing is dialled. `timeout`: the
/// longest a connect may take; `dial`: the `host:port` to connect to when the TLS server name
/// differs from the URL's host.
pub fn build(
    spec: &MqttConfig,
    timeout: Duration,
    dial: Option<String>,
) -> Result<(Client, Events), SettingError> {
    Ok(match spec.protocol {
        Protocol::V5 => {
            let (c, e) = v5::build(spec, timeout, dial)?;
            (Client::V5(c), Events::V5(Box::new(e)))
        }
        Protocol::V311 => {
            let (c, e) = v311::build(spec, timeout, dial)?;
            (Client::V311(c), Events::V311(Box::new(e)))
        }
    })
}

impl Client {
    /// Queues `m` (waiting while the request queue is full); the notice resolves with its
    /// acknowledgement. An error says why the client would not take it.
    pub async fn publish(&self, m: Message, qos: Qos) -> Result<Notice, String> {
        match self {
            Client::V5(c) => v5::publish(c, m, qos).await.map(Notice::V5),
            Client::V311(c) => v311::publish(c, m, qos).await.map(Notice::V311),
        }
    }

    /// Queues the retained `online` status without waiting (the driver, which calls this, is
    /// what empties the queue).
    pub fn announce(&self, status: &Status) -> Result<(), String> {
        match self {
            Client::V5(c) => v5::announce(c, status),
            Client::V311(c) => v311::announce(c, status),
        }
    }

    /// Subscribes to `topic` at QoS 1 without waiting (the driver empties the queue).
    #[cfg(feature = "sparkplug")]
    pub fn subscribe(&self, topic: &str) -> Result<(), String> {
        match self {
            Client::V5(c) => c
                .try_subscribe(topic, rumqttc::QoS::AtLeastOnce)
                .map_err(|e| e.to_string()),
            Client::V311(c) => c
                .try_subscribe(topic, rumqttc_v4::QoS::AtLeastOnce)
                .map_err(|e| e.to_string()),
        }
    }

    /// The bytes of the PUBLISH `m` makes, packet id included: what a broker's maximum packet
    /// size is compared with.
    pub fn publish_size(&self, m: &Message) -> usize {
        match self {
            Client::V5(_) => v5::publish_size(&m.to, m.payload.len(), &m.key, m.replayed),
            Client::V311(_) => v311::publish_size(&m.to, m.payload.len()),
        }
    }
}

impl Events {
    pub async fn poll(&mut self, shown: &str) -> Polled {
        match self {
            Events::V5(e) => v5::poll(e, shown).await,
            Events::V311(e) => v311::poll(e, shown).await,
        }
    }

    /// The will of every connect from now on (QoS 1, not retained).
    pub fn set_will(&mut self, topic: String, payload: Vec<u8>) {
        match self {
            Events::V5(e) => {
                e.options.set_last_will(rumqttc::LastWill::new(
                    topic,
                    payload,
                    rumqttc::QoS::AtLeastOnce,
                    false,
                    None,
                ));
            }
            Events::V311(e) => {
                e.mqtt_options.set_last_will(rumqttc_v4::LastWill::new(
                    topic,
                    payload,
                    rumqttc_v4::QoS::AtLeastOnce,
                    false,
                ));
            }
        }
    }

    /// Drops the network connection without a DISCONNECT (the broker publishes the will); the
    /// next poll connects again.
    pub fn drop_connection(&mut self) {
        match self {
            Events::V5(e) => e.clean(),
            Events::V311(e) => e.clean(),
        }
    }

    /// Every connect from now on resumes the session instead of starting a clean one.
    pub fn resume_sessions(&mut self) {
        match self {
            Events::V5(e) => v5::resume_sessions(e),
            Events::V311(e) => v311::resume_sessions(e),
        }
    }
}

impl Notice {
    /// Waits for the PUBACK (QoS 1) or PUBCOMP (QoS 2).
    pub async fn completed(self) -> Result<(), Refusal> {
        match self {
            Notice::V5(n) => v5::completed(n).await,
            Notice::V311(n) => v311::completed(n).await,
        }
    }
}
