//! The `type: mqtt` sink entry: its file shape ([`MqttSinkSpec`]) and its compilation into
//! [`MqttConfig`] (the broker URL, the topic template, QoS, the session, credentials, TLS and the
//! status messages checked, each problem under its field). It connects to nothing: the sink does.
//! Called through the sinks' list (`sink::compile_kind`) for `type: mqtt`.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::sparkplug::{SparkplugConfig, SparkplugSpec};
use super::{MqttConfig, MqttSink, Protocol, Qos, Status};
use crate::setting::Secret;
use crate::shape::Problems;
use crate::shape::tls::TlsSpec;
#[cfg(feature = "schema")]
use crate::shape::units::u32_schema;
use crate::shape::units::{self, Dur, Size};
use crate::sink::config::{LinkSpec, RetrySpec, broker_link, template};
use crate::sink::kind::{Compile, KindSpec};
use crate::sink::template::{MQTT_TOPIC, Template};

/// `type: mqtt` settings.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct MqttSinkSpec {
    /// The broker: `mqtt://host:1883` or, with TLS, `mqtts://host:8883` (the port defaults to
    /// those).
    pub url: String,
    /// `5` (default) or `3.1.1`, for brokers without MQTT 5 (Azure IoT Hub, older mosquitto).
    /// 3.1.1 cannot carry the idempotency key (a consumer recognises a re-send by its content),
    /// its broker does not say its maximum packet size (`max_packet_size`, 256KiB by default)
    /// and it acknowledges a message it refuses (an ACL denial is a silent drop, not a WARN).
    #[serde(default)]
    pub protocol: Option<MqttVersion>,
    /// Where each message goes: fixed text with `{stream}` (the stream's name) and
    /// `{field.<name>}` (a JSON record's field, dots reaching into objects), e.g.
    /// `plant/{stream}/{field.line}`. A record without the field goes to the dead letters with
    /// the reason. No wildcards (`+`, `#`). Required, except with `encoding: sparkplug_b`, whose
    /// topics are Sparkplug's.
    #[serde(default)]
    pub topic: Option<String>,
    /// `records` (default): each record (or job, with `batch`) as it is stored. `sparkplug_b`:
    /// colibri is a Sparkplug B edge node (settings under `sparkplug`); the stream's records are
    /// line protocol, each field a metric of a device.
    #[serde(default)]
    pub encoding: Option<MqttEncoding>,
    /// The edge node, with `encoding: sparkplug_b`.
    #[serde(default)]
    pub sparkplug: Option<SparkplugSpec>,
    /// 1 (default): delivered once every message is PUBACKed; 2: once every message is PUBCOMPed
    /// (the broker forwards each exactly once). 0 is refused: nothing would confirm delivery.
    #[serde(default, deserialize_with = "units::de_opt_u32")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "u32_schema"))]
    pub qos: Option<u32>,
    /// `true`: one message per job, its records as ndjson (a record per line), instead of one
    /// message per record. Default false. A topic with `{field...}` needs a message per record.
    #[serde(default)]
    pub batch: bool,
    /// The client identifier. Default `colibri-<host name>-<sink name>-<8 hex digits>`, the digits
    /// a hash of the data_dir's path: stable across restarts, different for each sink, machine
    /// and agent.
    #[serde(default)]
    pub client_id: Option<String>,
    /// User name for the broker, e.g. `${MQTT_USER}`.
    #[serde(default)]
    pub username: Option<String>,
    /// Password for the broker, e.g. `${MQTT_PASSWORD}`; never logged.
    #[serde(default)]
    pub password: Option<String>,
    /// `false` (default): reconnects resume the broker's session, so messages in flight when a
    /// connection drops are completed rather than published anew (the session lives
    /// `session_expiry` after a disconnect). At start colibri always begins a clean session: what
    /// was in flight when it stopped is re-sent from its own store. `true`: every connect starts
    /// clean.
    #[serde(default)]
    pub clean_session: Option<bool>,
    /// How long the broker keeps the session after a disconnect (with `clean_session: false`).
    /// Default 1h.
    #[serde(default)]
    pub session_expiry: Option<Dur>,
    /// MQTT keep-alive: the broker drops a connection silent for 1.5 times this, and colibri pings
    /// when idle. 1s to 18h, default 30s.
    #[serde(default)]
    pub keep_alive: Option<Dur>,
    /// Longest wait for a connection's CONNACK and for a job's acknowledgements. Default 10s.
    #[serde(default)]
    pub timeout: Option<Dur>,
    /// Jobs in flight at once, 1-64. Default 1, which keeps strict order.
    #[serde(default, deserialize_with = "units::de_opt_u32")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "u32_schema"))]
    pub concurrency: Option<u32>,
    /// TLS for `mqtts://` (rustls; the system's roots unless `ca_file` is set).
    #[serde(default)]
    pub tls: TlsSpec,
    /// Retained status messages, so the back office sees which gateways are cut off: `online`
    /// at each connect, `offline` as the will the broker publishes when the connection ends
    /// without a goodbye (colibri killed, stopped, or the network gone).
    #[serde(default)]
    pub status: Option<MqttStatusSpec>,
    #[serde(default)]
    pub retry: RetrySpec,
    /// When the broker counts as unreachable. The link is probed by connecting (a CONNACK is the
    /// only proof): `probe` and `probe_url` do not apply.
    #[serde(default)]
    pub link: LinkSpec,
    /// Bytes per second of payload while a backlog is replayed. Unset: unlimited.
    #[serde(default)]
    pub replay_rate: Option<Size>,
    /// The largest PUBLISH the broker takes, e.g. `1MiB`: a record over it goes to the dead
    /// letters alone, before it is sent. An MQTT 5 broker states its own limit (the smaller one
    /// applies; default: the broker's alone); a 3.1.1 broker cannot, and drops the connection at
    /// a packet over its limit (default 256KiB, Azure IoT Hub's; set the broker's own).
    #[serde(default)]
    pub max_packet_size: Option<Size>,
}

/// `encoding:` of an `mqtt` sink.
#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum MqttEncoding {
    Records,
    SparkplugB,
}

/// `protocol:` of an `mqtt` sink, a number (`5`) or text (`3.1.1`) as YAML reads it.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(untagged)]
pub enum MqttVersion {
    Number(u32),
    /// `5.0` or `3.1` unquoted: YAML reads a float.
    Float(f64),
    Text(String),
}

/// `status:` of an `mqtt` sink.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct MqttStatusSpec {
    /// The topic, e.g. `gateways/gw-17/status` (no wildcards, no placeholders).
    pub topic: String,
    /// Published (retained, QoS 1) at each connect. Default `online`.
    #[serde(default)]
    pub online: Option<String>,
    /// The will (retained, QoS 1). Default `offline`.
    #[serde(default)]
    pub offline: Option<String>,
}

impl KindSpec for MqttSinkSpec {
    type Config = MqttConfig;

    /// An `mqtt` entry compiled; `None` when a problem stops it (each one reported).
    fn compile(mut self, cx: &mut Compile<'_, '_>) -> Option<MqttConfig> {
        cx.link = broker_link(std::mem::take(&mut self.link), "an mqtt", cx.err);
        cx.retry = std::mem::take(&mut self.retry);
        let mut spec = self;
        let err = &mut *cx.err;
        let (host, port, tls) =
            match crate::shape::url::broker(&spec.url, ("mqtt", 1883), ("mqtts", 8883)) {
                Ok(b) => b,
                Err(m) => {
                    err.add("url", m);
                    return None;
                }
            };
        let tls =
            crate::shape::tls::client(std::mem::take(&mut spec.tls), tls, "mqtts", cx.base, err);
        let bd_seq_file = cx.data_dir.join(format!("sparkplug-{}.bdseq", cx.name));
        let sparkplug = sparkplug(&mut spec, bd_seq_file, err);
        let topic = match &spec.topic {
            // Sparkplug's topics are made per message: this fixed one only stands for them.
            _ if spec.encoding == Some(MqttEncoding::SparkplugB) => {
                Template::parse("spBv1.0", MQTT_TOPIC).ok()
            }
            Some(t) => template("topic", t, MQTT_TOPIC, spec.batch, err),
            None => {
                err.add("topic", "is required (where each message goes)".into());
                None
            }
        };
        let qos = qos(spec.qos, err);
        let protocol = protocol(spec.protocol.as_ref(), err);
        v311_checks(&spec, protocol, err);
        let max_packet = max_packet(spec.max_packet_size, protocol, err);
        let client_id = spec.client_id.take().unwrap_or_else(|| {
            crate::shape::client_name::default_mqtt_client_id(cx.name, cx.data_dir)
        });
        if client_id.is_empty() || client_id.len() > 65_535 {
            err.add("client_id", "must be 1 to 65535 bytes".into());
        }
        let keep_alive = spec.keep_alive.map_or(Duration::from_secs(30), |d| d.0);
        if !(Duration::from_secs(1)..=Duration::from_secs(65_535)).contains(&keep_alive) {
            err.add("keep_alive", "must be between 1s and 18h12m15s".into());
        }
        cx.limits(spec.timeout, spec.concurrency, spec.replay_rate);
        let status = status(spec.status, cx.err);
        let config = MqttConfig {
            protocol,
            host,
            port,
            tls,
            topic: topic?,
            qos,
            batch: spec.batch,
            client_id,
            username: spec.username,
            password: spec.password.map(Secret),
            // Sparkplug: every connect starts clean (the spec's rule: a resumed session would
            // complete messages whose seq belongs to the session before).
            persistent: sparkplug.is_none() && !spec.clean_session.unwrap_or(false),
            session_expiry: spec
                .session_expiry
                .map_or(Duration::from_secs(3600), |d| d.0),
            keep_alive,
            status,
            max_packet,
            sparkplug,
        };
        // Reads the TLS files: a bad CA is reported now, not at the first delivery.
        if let Err(e) = MqttSink::new(&config, cx.timeout) {
            cx.err.add(&e.field, e.message);
        }
        Some(config)
    }
}

/// The `sparkplug` settings when `encoding: sparkplug_b`, and what that encoding refuses.
fn sparkplug(
    spec: &mut MqttSinkSpec,
    bd_seq_file: PathBuf,
    err: &mut Problems<'_>,
) -> Option<SparkplugConfig> {
    let on = spec.encoding == Some(MqttEncoding::SparkplugB);
    let block = spec.sparkplug.take();
    if !on {
        if block.is_some() {
            err.add(
                "sparkplug",
                "applies with encoding: sparkplug_b only".into(),
            );
        }
        return None;
    }
    if !cfg!(feature = "sparkplug") {
        err.add(
            "encoding",
            "sparkplug_b: this colibri was built without the sparkplug feature".into(),
        );
    }
    let refused = [
        (
            "topic",
            spec.topic.is_some(),
            "Sparkplug names its own topics",
        ),
        ("batch", spec.batch, "Sparkplug sends a message per device"),
        (
            "status",
            spec.status.is_some(),
            "the will is the edge node's NDEATH",
        ),
        (
            "clean_session",
            spec.clean_session == Some(false),
            "a Sparkplug edge node starts every session clean",
        ),
        (
            "session_expiry",
            spec.session_expiry.is_some(),
            "a Sparkplug edge node's session ends with its connection",
        ),
    ];
    for (field, set, why) in refused {
        if set {
            err.add(
                field,
                format!("does not apply with encoding: sparkplug_b ({why})"),
            );
        }
    }
    let Some(block) = block else {
        err.add(
            "sparkplug",
            "is required with encoding: sparkplug_b (group_id, edge_node_id)".into(),
        );
        return None;
    };
    Some(block.compile(bd_seq_file, err))
}

/// `qos` (default 1): 0 is refused, as nothing would acknowledge it.
fn qos(qos: Option<u32>, err: &mut Problems<'_>) -> Qos {
    match qos.unwrap_or(1) {
        1 => Qos::AtLeastOnce,
        2 => Qos::ExactlyOnce,
        0 => {
            err.add(
                "qos",
                "0 is never acknowledged, so nothing would prove a record delivered: use 1 or 2"
                    .into(),
            );
            Qos::AtLeastOnce
        }
        n => {
            err.add("qos", format!("must be 1 or 2, not {n}"));
            Qos::AtLeastOnce
        }
    }
}

/// `protocol`: 5 (default) or 3.1.1, however YAML typed it.
fn protocol(protocol: Option<&MqttVersion>, err: &mut Problems<'_>) -> Protocol {
    match protocol {
        None | Some(MqttVersion::Number(5)) => Protocol::V5,
        Some(MqttVersion::Float(f)) if *f == 5.0 => Protocol::V5,
        Some(MqttVersion::Float(f)) => {
            err.add("protocol", format!("must be 5 or 3.1.1, not {f}"));
            Protocol::V5
        }
        Some(MqttVersion::Text(t)) if t == "5" || t == "5.0" => Protocol::V5,
        Some(MqttVersion::Text(t)) if t == "3.1.1" => Protocol::V311,
        Some(MqttVersion::Number(n)) => {
            err.add("protocol", format!("must be 5 or 3.1.1, not {n}"));
            Protocol::V5
        }
        Some(MqttVersion::Text(t)) => {
            err.add("protocol", format!("must be 5 or 3.1.1, not {t:?}"));
            Protocol::V5
        }
    }
}

/// What MQTT 3.1.1 cannot do: a password without a user name, a session expiry.
fn v311_checks(spec: &MqttSinkSpec, protocol: Protocol, err: &mut Problems<'_>) {
    if protocol == Protocol::V311 && spec.password.is_some() && spec.username.is_none() {
        err.add(
            "password",
            "MQTT 3.1.1 sends a password only with a user name: set username".into(),
        );
    }
    if protocol == Protocol::V311 && spec.session_expiry.is_some() {
        err.add(
            "session_expiry",
            "applies to MQTT 5 only (a 3.1.1 broker keeps a session as long as it decides)".into(),
        );
    }
}

/// The largest packet the broker takes as the settings give it (for 3.1.1, 256 KiB unless set).
fn max_packet(set: Option<Size>, protocol: Protocol, err: &mut Problems<'_>) -> Option<u32> {
    const MAX_PACKET: u64 = 268_435_455;
    // A 3.1.1 broker does not say its limit and drops the connection at a packet over it: without
    // a stated limit, Azure IoT Hub's and many brokers' 256 KiB, so a larger record is
    // dead-lettered instead of dropping the connection again and again.
    let default_packet = (protocol == Protocol::V311).then_some(256 << 10);
    set.map(|s| s.0).or(default_packet).and_then(|s| {
        if (128..=MAX_PACKET).contains(&s) {
            u32::try_from(s).ok()
        } else {
            err.add(
                "max_packet_size",
                format!("must be between 128 and {MAX_PACKET} bytes (MQTT's limit)"),
            );
            None
        }
    })
}

/// The `status` messages, their topic checked.
fn status(status: Option<MqttStatusSpec>, err: &mut Problems<'_>) -> Option<Status> {
    status.map(|s| {
        if s.topic.is_empty() || s.topic.contains(['+', '#', '\0', '{', '}']) {
            err.add(
                "status.topic",
                format!(
                    "{:?} is not a topic name (no wildcards or placeholders)",
                    s.topic
                ),
            );
        }
        Status {
            topic: s.topic,
            online: s.online.unwrap_or_else(|| "online".into()),
            offline: s.offline.unwrap_or_else(|| "offline".into()),
        }
    })
}
