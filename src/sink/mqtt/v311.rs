//! MQTT 3.1.1 for the `mqtt` sink (`protocol: 3.1.1`; rumqttc-v4-next), for brokers without MQTT 5:
//! the client options from the settings, the event loop's packets and errors in
//! [`common`](super::common)'s words, and a record's PUBLISH. What 3.1.1 cannot say, the
//! sink does without: there are no user properties (a message carries no idempotency key: a
//! consumer recognises a re-send by its content), a CONNACK names no maximum packet size (the
//! sink's `max_packet_size`, 256 KiB by default, stands for the broker's), and a PUBACK carries
//! no reason (a broker that drops a message it refuses still acknowledges it, as mosquitto does
//! for a topic its ACL denies).
//! Called only through `client`.

use std::sync::Arc;
use std::time::Duration;

use rumqttc_v4::{
    AsyncClient, ConnectReturnCode, ConnectionError, Event, EventLoop, Incoming, LastWill,
    MqttOptions, PublishNotice, PublishOptions, QoS, TlsConfiguration, Transport,
};

use super::common::{MAX_IN_FLIGHT, Polled, REQUEST_CAPACITY, Refusal, varint_len};
use super::settings::{MqttConfig, Qos, Status};
use crate::net::client::chain;
use crate::net::mqtt::socket;
use crate::setting::SettingError;
use crate::sink::template::Message;

/// The largest packet MQTT can frame (a 4-byte remaining length): the client's own bound for what
/// it sends.
pub const PROTOCOL_MAX_PACKET: u32 = 268_435_455;
/// What the broker sends colibri is acknowledgements only: a small bound is plenty.
const MAX_INCOMING: usize = 64 * 1024;

pub fn build(
    spec: &MqttConfig,
    timeout: Duration,
    dial: Option<String>,
) -> Result<(AsyncClient, EventLoop), SettingError> {
    let mut opts = MqttOptions::new(
        spec.client_id.clone(),
        rumqttc_v4::Broker::tcp(spec.server_name(), spec.port),
    );
    if let Some(tls) = &spec.tls {
        let config = crate::net::tls_client::client_config(tls)?;
        opts.set_transport(Transport::tls_with_config(TlsConfiguration::Rustls(
            Arc::new(config),
        )));
    }
    opts.set_socket_connector(move |addr, net| socket::connect(dial.clone(), addr, net));
    // The sink checks each PUBLISH against `max_packet_size` itself; the client's own bound stays
    // MQTT's, so a long CONNECT (a token as password, a will) is never held to it.
    opts.set_max_packet_size(MAX_INCOMING, PROTOCOL_MAX_PACKET as usize)
        .set_inflight(MAX_IN_FLIGHT)
        .set_keep_alive(spec.keep_alive_secs())
        // At start a clean session, whatever the setting (`mqtt_conn` says why); in 3.1.1 it
        // lasts as long as that connection, so only connections after the first resume one.
        .set_clean_session(true);
    match (&spec.username, &spec.password) {
        (Some(u), Some(p)) => {
            opts.set_credentials(u.clone(), p.0.clone().into_bytes());
        }
        (Some(u), None) => {
            opts.set_username(u.clone());
        }
        // 3.1.1 has no password without a user name; the config refuses it.
        (None, _) => {}
    }
    if let Some(s) = &spec.status {
        opts.set_last_will(LastWill::new(
            s.topic.clone(),
            s.offline.clone().into_bytes(),
            QoS::AtLeastOnce,
            true,
        ));
    }
    let (client, mut events) = AsyncClient::builder(opts)
        .capacity(REQUEST_CAPACITY)
        .build();
    let mut net = rumqttc_v4::NetworkOptions::new();
    net.set_tcp_nodelay(true);
    net.set_connection_timeout(timeout.as_secs().max(1));
    events.set_network_options(net);
    Ok((client, events))
}

pub async fn poll(events: &mut EventLoop, shown: &str) -> Polled {
    match events.poll().await {
        Ok(Event::Incoming(Incoming::ConnAck(ack))) => Polled::Connected {
            max_packet: None,
            session_present: ack.session_present,
        },
        Ok(Event::Incoming(Incoming::Publish(p))) => Polled::Message {
            topic: String::from_utf8_lossy(&p.topic).into_owned(),
            payload: p.payload,
        },
        Ok(_) => Polled::Other,
        Err(e) => Polled::Failed(reason(shown, &e)),
    }
}

pub fn resume_sessions(events: &mut EventLoop) {
    events.mqtt_options.set_clean_session(false);
}

pub fn announce(client: &AsyncClient, s: &Status) -> Result<(), String> {
    let opts = PublishOptions::new(QoS::AtLeastOnce).retained();
    client
        .try_publish(s.topic.clone(), s.online.clone().into_bytes(), opts)
        .map_err(|e| e.to_string())
}

pub async fn publish(client: &AsyncClient, m: Message, qos: Qos) -> Result<PublishNotice, String> {
    let qos = match qos {
        Qos::AtLeastOnce => QoS::AtLeastOnce,
        Qos::ExactlyOnce => QoS::ExactlyOnce,
    };
    client
        .publish_tracked(m.to, m.payload, PublishOptions::new(qos))
        .await
        .map_err(|e| e.to_string())
}

pub async fn completed(notice: PublishNotice) -> Result<(), Refusal> {
    // 3.1.1 acknowledgements carry no reason: every failure is the connection's or session's.
    match notice.wait_completion_async().await {
        Ok(_) => Ok(()),
        Err(e) => Err(Refusal::Lost(e.to_string())),
    }
}

/// A PUBLISH with this topic and payload, packet id included.
pub fn publish_size(topic: &str, payload: usize) -> usize {
    let rest = 2 + topic.len() + 2 + payload;
    1 + varint_len(rest) + rest
}

/// Why the connection is down, for the link's log line and the deliveries it refuses.
fn reason(shown: &str, e: &ConnectionError) -> String {
    use ConnectReturnCode as C;
    match e {
        ConnectionError::ConnectionRefused(code @ (C::BadUserNamePassword | C::NotAuthorized)) => {
            crate::net::mqtt::refused_credentials(shown, code)
        }
        ConnectionError::ConnectionRefused(code) => {
            format!("{shown}: the broker refused the connection ({code:?})")
        }
        other => format!("{shown}: {}", chain(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_packet_size_counts_every_byte_of_a_publish() {
        // 2+5 topic, 2 packet id, 10 payload = 19; header 2.
        assert_eq!(publish_size("a/b/c", 10), 21);
    }
}
