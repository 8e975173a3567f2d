//! The compiled settings of a `type: mqtt` sink ([`MqttConfig`]: the broker, the session, the
//! topic, the QoS, the status messages), and what they tell the rest of the sink (the server name,
//! the keep-alive in seconds, the records' format). Compiled by `config`; read by every file of
//! the sink. It does nothing itself.

use std::time::Duration;

use super::sparkplug::SparkplugConfig;
use crate::net::tls_client::TlsConfig;
use crate::record::RecordFormat;
use crate::scrape::lineproto::Precision;
use crate::setting::Secret;
use crate::sink::kind::Settings;
use crate::sink::template::Template;

/// The compiled `type: mqtt` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MqttConfig {
    pub protocol: Protocol,
    pub host: String,
    pub port: u16,
    /// `mqtts://`: TLS with these settings.
    pub tls: Option<TlsConfig>,
    pub topic: Template,
    pub qos: Qos,
    /// One message per job (the records as ndjson) instead of one per record.
    pub batch: bool,
    pub client_id: String,
    pub username: Option<String>,
    pub password: Option<Secret>,
    /// Reconnects resume the broker's session (in-flight messages are completed, not sent anew).
    pub persistent: bool,
    pub session_expiry: Duration,
    pub keep_alive: Duration,
    pub status: Option<Status>,
    /// The broker's largest packet as the settings give it (3.1.1 brokers do not say theirs).
    pub max_packet: Option<u32>,
    /// `encoding: sparkplug_b`: the edge node (`topic` then only describes the sink).
    pub sparkplug: Option<SparkplugConfig>,
}

impl MqttConfig {
    /// The name the broker's certificate is checked for (and SNI sent to).
    pub fn server_name(&self) -> String {
        self.tls
            .as_ref()
            .and_then(|t| t.server_name.clone())
            .unwrap_or_else(|| self.host.clone())
    }

    /// The keep-alive in the protocol's unit (the config keeps it within 1..=65,535 s).
    pub fn keep_alive_secs(&self) -> u16 {
        u16::try_from(self.keep_alive.as_secs()).unwrap_or(u16::MAX)
    }
}

impl Settings for MqttConfig {
    /// A topic made from records' fields needs JSON records; otherwise any line is a payload.
    /// Sparkplug metrics are line-protocol points, timestamped in ms as Sparkplug carries them.
    fn record_format(&self) -> RecordFormat {
        if self.sparkplug.is_some() {
            RecordFormat::LineProtocol(Precision::Ms)
        } else if self.topic.uses_fields() {
            RecordFormat::Json
        } else {
            RecordFormat::Lines
        }
    }

    /// For logs: the sink's type, name and broker (no credentials).
    fn describe(&self, name: &str) -> String {
        let scheme = if self.tls.is_some() { "mqtts" } else { "mqtt" };
        format!("mqtt sink {name} ({scheme}://{}:{})", self.host, self.port)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Qos {
    AtLeastOnce,
    ExactlyOnce,
}

/// The MQTT version spoken to the broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    V5,
    V311,
}

/// The retained status messages: `online` published at each connect, `offline` as the will the
/// broker publishes when colibri's connection ends without a goodbye (killed, cut off, stopped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub topic: String,
    pub online: String,
    pub offline: String,
}
