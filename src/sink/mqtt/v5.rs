//! MQTT 5 for the `mqtt` sink (rumqttc-v5-next): the client options from the settings (on
//! `net::mqtt`'s, which the mqtt source shares), the event loop's packets and errors in
//! [`common`](super::common)'s words (a CONNACK's maximum
//! packet size; a refused CONNACK's reason), a record's PUBLISH with the `idempotency-key` user
//! property (and the replayed marker from a backlog), and the reason codes of a PUBACK, PUBREC or PUBCOMP that refuses it. Called only
//! through `client`.

use std::time::Duration;

use rumqttc::{
    AsyncClient, Event, EventLoop, Incoming, LastWill, PubAckReason, PubRecReason, PublishNotice,
    PublishNoticeError, PublishOptions, PublishProperties, QoS,
};

use super::common::{MAX_IN_FLIGHT, Polled, REQUEST_CAPACITY, Refusal, varint_len};
use super::settings::{MqttConfig, Qos, Status};
use crate::setting::SettingError;
use crate::sink::REPLAYED;
use crate::sink::template::Message;

/// The user property that carries a message's idempotency key.
const KEY: &str = "idempotency-key";

pub fn build(
    spec: &MqttConfig,
    timeout: Duration,
    dial: Option<String>,
) -> Result<(AsyncClient, EventLoop), SettingError> {
    let mut opts = crate::net::mqtt::connection_options(
        &spec.client_id,
        spec.server_name(),
        spec.port,
        dial,
        spec.tls.as_ref(),
        spec.username.as_ref(),
        spec.password.as_ref(),
    )?;
    opts
        // The client keeps a slot per packet id it may have in flight, sized by this bound
        // (65,535 slots unless the broker sets a smaller Receive Maximum: 16 MB of memory).
        .set_outgoing_inflight_upper_limit(MAX_IN_FLIGHT);
    opts.set_keep_alive(spec.keep_alive_secs())
        .set_connect_timeout(timeout)
        .set_clean_start(true);
    if spec.persistent {
        let expiry = u32::try_from(spec.session_expiry.as_secs()).unwrap_or(u32::MAX);
        opts.set_session_expiry_interval(Some(expiry));
    }
    if let Some(s) = &spec.status {
        opts.set_last_will(LastWill::new(
            s.topic.clone(),
            s.offline.clone().into_bytes(),
            QoS::AtLeastOnce,
            true,
            None,
        ));
    }
    Ok(AsyncClient::builder(opts)
        .capacity(REQUEST_CAPACITY)
        .build())
}

pub async fn poll(events: &mut EventLoop, shown: &str) -> Polled {
    match events.poll().await {
        Ok(Event::Incoming(Incoming::ConnAck(ack))) => Polled::Connected {
            max_packet: ack.properties.as_ref().and_then(|p| p.max_packet_size),
            session_present: ack.session_present,
        },
        Ok(Event::Incoming(Incoming::Publish(p))) => Polled::Message {
            topic: String::from_utf8_lossy(&p.topic).into_owned(),
            payload: p.payload,
        },
        Ok(_) => Polled::Other,
        Err(e) => Polled::Failed(crate::net::mqtt::reason(shown, &e)),
    }
}

pub fn resume_sessions(events: &mut EventLoop) {
    events.options.set_clean_start(false);
}

pub fn announce(client: &AsyncClient, s: &Status) -> Result<(), String> {
    let opts = PublishOptions::new(QoS::AtLeastOnce).retained();
    client
        .try_publish(s.topic.clone(), s.online.clone().into_bytes(), opts)
        .map_err(|e| e.to_string())
}

pub async fn publish(client: &AsyncClient, m: Message, qos: Qos) -> Result<PublishNotice, String> {
    // A message of no job (a Sparkplug birth) has no key.
    let mut user_properties = Vec::with_capacity(2);
    if !m.key.is_empty() {
        user_properties.push((KEY.into(), m.key));
    }
    if m.replayed {
        user_properties.push((REPLAYED.into(), "true".into()));
    }
    let props = PublishProperties {
        user_properties,
        ..PublishProperties::default()
    };
    let opts = PublishOptions::new(qos_of(qos)).properties(props);
    client
        .publish_tracked(m.to, m.payload, opts)
        .await
        .map_err(|e| e.to_string())
}

pub async fn completed(notice: PublishNotice) -> Result<(), Refusal> {
    use PublishNoticeError as E;
    let Err(e) = notice.wait_completion_async().await else {
        return Ok(());
    };
    Err(match e {
        E::V5PubAck(PubAckReason::NotAuthorized) | E::V5PubRec(PubRecReason::NotAuthorized) => {
            Refusal::NotAuthorized("not authorized".into())
        }
        E::V5PubAck(PubAckReason::TopicNameInvalid)
        | E::V5PubRec(PubRecReason::TopicNameInvalid)
        | E::V5PubAck(PubAckReason::PayloadFormatInvalid)
        | E::V5PubRec(PubRecReason::PayloadFormatInvalid) => Refusal::Invalid(e.to_string()),
        E::V5PubAck(_) | E::V5PubRec(_) | E::V5PubComp(_) => Refusal::Other(e.to_string()),
        other => Refusal::Lost(other.to_string()),
    })
}

/// A PUBLISH with this topic, payload, key and, when `replayed`, the marker (its user
/// properties), packet id included.
pub fn publish_size(topic: &str, payload: usize, key: &str, replayed: bool) -> usize {
    let marker = if replayed {
        1 + 2 + REPLAYED.len() + 2 + "true".len()
    } else {
        0
    };
    let key = if key.is_empty() {
        0
    } else {
        1 + 2 + KEY.len() + 2 + key.len()
    };
    let props = key + marker;
    let rest = 2 + topic.len() + 2 + varint_len(props) + props + payload;
    1 + varint_len(rest) + rest
}

fn qos_of(qos: Qos) -> QoS {
    match qos {
        Qos::AtLeastOnce => QoS::AtLeastOnce,
        Qos::ExactlyOnce => QoS::ExactlyOnce,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_packet_size_counts_every_byte_of_a_publish() {
        // 2+5 topic, 2 packet id, 1 props length, 1+2+15+2+3 property, 10 payload = 43; header 2.
        assert_eq!(publish_size("a/b/c", 10, "k:1", false), 45);
        // The marker: 1+2+16+2+4 more.
        assert_eq!(publish_size("a/b/c", 10, "k:1", true), 70);
        assert_eq!(varint_len(127), 1);
        assert_eq!(varint_len(128), 2);
    }
}
