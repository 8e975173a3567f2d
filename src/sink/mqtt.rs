//! The `mqtt` sink (feature `mqtt`): a job's records published to an MQTT 5 broker, one message per
//! record (or the job as one ndjson message with `batch`), at QoS 1 or 2, on a topic made from a
//! template. It owns the settings, the topic template and the outcome of a job: delivered only when
//! every message of it is PUBACKed (QoS 1) or PUBCOMPed (QoS 2), unreachable (no attempt spent)
//! while the connection is down or the broker refuses colibri's credentials or the topic, too large
//! when a message would pass the broker's maximum packet size (the delivery worker then sends the
//! job in halves, down to the one record, which goes to the dead letters alone). The connection
//! itself (connect, reconnect, the status messages) is [`super::mqtt_conn`]'s. Built by
//! `sink::Sink::new` from the compiled config.
//!
//! Every message carries the user property `idempotency-key`: for a message per record the job's
//! key and the record's position in the job (`<store>:<stream>:<job>#<index>`, the same after a
//! split or a crash), for a batch the job's (or part's) key as the `http` sink sends it.

use std::time::Duration;

use bytes::Bytes;
use rumqttc::{PubAckReason, PubRecReason, PublishNoticeError, PublishOptions, PublishProperties};

use super::deliver::{Batch, Deliver, DeliveryError, Probe, RecordFormat, SettingError};
use super::http::TlsConfig;
use super::mqtt_conn::{Connection, Link};
use crate::store::FileJob;

/// The compiled `type: mqtt` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MqttConfig {
    pub host: String,
    pub port: u16,
    /// `mqtts://`: TLS with these settings.
    pub tls: Option<TlsConfig>,
    pub topic: Topic,
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
    pub timeout: Duration,
    pub concurrency: usize,
    pub replay_rate: Option<u64>,
    pub status: Option<Status>,
}

impl MqttConfig {
    /// A topic made from records' fields needs JSON records; otherwise any line is a payload.
    pub fn record_format(&self) -> RecordFormat {
        if self.topic.uses_fields() {
            RecordFormat::Json
        } else {
            RecordFormat::Lines
        }
    }

    /// For logs: the sink's type, name and broker (no credentials).
    pub fn describe(&self, name: &str) -> String {
        let scheme = if self.tls.is_some() { "mqtts" } else { "mqtt" };
        format!("mqtt sink {name} ({scheme}://{}:{})", self.host, self.port)
    }
}

/// A password, never shown by `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<secret>")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Qos {
    AtLeastOnce,
    ExactlyOnce,
}

impl Qos {
    pub(super) fn rumqttc(self) -> rumqttc::QoS {
        match self {
            Qos::AtLeastOnce => rumqttc::QoS::AtLeastOnce,
            Qos::ExactlyOnce => rumqttc::QoS::ExactlyOnce,
        }
    }
}

/// The retained status messages: `online` published at each connect, `offline` as the will the
/// broker publishes when colibri's connection ends without a goodbye (killed, cut off, stopped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub topic: String,
    pub online: String,
    pub offline: String,
}

/// A topic template: fixed text, `{stream}` and `{field.<name>}` (a JSON record's field; dots
/// reach into objects).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topic(Vec<Part>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Stream,
    Field(Vec<String>),
}

/// Characters a topic name cannot hold (wildcards are for subscriptions; NUL is forbidden).
fn bad_topic_char(c: char) -> bool {
    matches!(c, '+' | '#' | '\0')
}

impl Topic {
    /// Parses a template; the error says what is wrong with it.
    pub fn parse(s: &str) -> Result<Topic, String> {
        if s.is_empty() {
            return Err("must not be empty".into());
        }
        let mut parts = Vec::new();
        let mut rest = s;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                parts.push(Part::Text(rest[..open].to_string()));
            }
            let Some(len) = rest[open..].find('}') else {
                return Err(format!("{s:?}: a {{ without its }}"));
            };
            let name = &rest[open + 1..open + len];
            parts.push(match name {
                "stream" => Part::Stream,
                _ => match name.strip_prefix("field.") {
                    Some(path) if !path.is_empty() && path.split('.').all(|p| !p.is_empty()) => {
                        Part::Field(path.split('.').map(str::to_string).collect())
                    }
                    _ => {
                        return Err(format!(
                            "{s:?}: {{{name}}} is neither {{stream}} nor {{field.<name>}}"
                        ));
                    }
                },
            });
            rest = &rest[open + len + 1..];
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_string()));
        }
        if parts
            .iter()
            .any(|p| matches!(p, Part::Text(t) if t.contains(bad_topic_char) || t.contains('}')))
        {
            return Err(format!(
                "{s:?}: a topic name cannot hold + or # (wildcards are for subscriptions) or a stray }}"
            ));
        }
        Ok(Topic(parts))
    }

    pub fn uses_fields(&self) -> bool {
        self.0.iter().any(|p| matches!(p, Part::Field(_)))
    }

    /// The topic of one record (`record` is parsed only when a field is named). The error names
    /// what is missing.
    fn render(&self, stream: &str, record: &[u8]) -> Result<String, String> {
        let json = if self.uses_fields() {
            Some(
                serde_json::from_slice::<serde_json::Value>(record)
                    .map_err(|e| format!("is not JSON ({e}), and the topic names its fields"))?,
            )
        } else {
            None
        };
        let mut topic = String::new();
        for part in &self.0 {
            match part {
                Part::Text(t) => topic.push_str(t),
                Part::Stream => topic.push_str(stream),
                Part::Field(path) => {
                    let mut v = json.as_ref().expect("parsed above when a field is named");
                    for key in path {
                        v = v.get(key).unwrap_or(&serde_json::Value::Null);
                    }
                    let name = path.join(".");
                    let text = match v {
                        serde_json::Value::String(s) => s.clone(),
                        serde_json::Value::Number(n) => n.to_string(),
                        serde_json::Value::Bool(b) => b.to_string(),
                        serde_json::Value::Null => {
                            return Err(format!("has no field {name} for the topic"));
                        }
                        _ => return Err(format!("field {name} is not a string or a number")),
                    };
                    if text.is_empty() || text.contains(bad_topic_char) {
                        return Err(format!(
                            "field {name} is {text:?}, which cannot be part of a topic name"
                        ));
                    }
                    topic.push_str(&text);
                }
            }
        }
        Ok(topic)
    }
}

/// The built sink: the settings and the connection (its driver starts at the first use).
pub struct MqttSink {
    spec: MqttConfig,
    conn: Connection,
}

impl MqttSink {
    /// Reads the TLS files and prepares the connection; nothing is dialled yet. Errors name the
    /// setting.
    pub fn new(spec: &MqttConfig) -> Result<MqttSink, SettingError> {
        Ok(MqttSink {
            conn: Connection::new(spec)?,
            spec: spec.clone(),
        })
    }

    /// Publishes each message and waits for all their acknowledgements, in order.
    async fn publish(
        &self,
        max_packet: Option<u32>,
        messages: Vec<(String, Bytes, String)>,
    ) -> Result<(), DeliveryError> {
        if let Some(max) = max_packet {
            for (i, (topic, payload, key)) in messages.iter().enumerate() {
                let size = publish_size(topic, payload.len(), key);
                if size > max as usize {
                    let what = if self.spec.batch {
                        "the job as one message".to_string()
                    } else {
                        format!("record {i}")
                    };
                    return Err(DeliveryError::TooLarge(format!(
                        "{what} makes a {size}-byte PUBLISH; the broker takes at most {max} bytes"
                    )));
                }
            }
        }
        let qos = self.spec.qos.rumqttc();
        let deadline = tokio::time::Instant::now() + self.spec.timeout;
        let mut notices = Vec::with_capacity(messages.len());
        for (topic, payload, key) in messages {
            let props = PublishProperties {
                user_properties: vec![("idempotency-key".into(), key)],
                ..PublishProperties::default()
            };
            let opts = PublishOptions::new(qos).properties(props);
            let queued = tokio::time::timeout_at(
                deadline,
                self.conn
                    .client()
                    .publish_tracked(topic.clone(), payload, opts),
            )
            .await
            .map_err(|_| self.no_answer())?;
            let notice = queued.map_err(|e| {
                DeliveryError::Permanent(format!("cannot publish to {topic:?}: {e}"))
            })?;
            notices.push((topic, notice));
        }
        for (topic, notice) in notices {
            let done = tokio::time::timeout_at(deadline, notice.wait_completion_async())
                .await
                .map_err(|_| self.no_answer())?;
            done.map_err(|e| classify(&topic, e, &self.conn))?;
        }
        Ok(())
    }

    fn no_answer(&self) -> DeliveryError {
        DeliveryError::Unavailable(format!(
            "{}: no acknowledgement within {:?}",
            self.conn.shown(),
            self.spec.timeout
        ))
    }
}

/// The bytes of a PUBLISH with this topic, payload and idempotency key (the one user property),
/// packet id included: what the broker's maximum packet size is compared with.
fn publish_size(topic: &str, payload: usize, key: &str) -> usize {
    let props = 1 + 2 + "idempotency-key".len() + 2 + key.len();
    let rest = 2 + topic.len() + 2 + varint_len(props) + props + payload;
    1 + varint_len(rest) + rest
}

fn varint_len(n: usize) -> usize {
    match n {
        0..=127 => 1,
        128..=16_383 => 2,
        16_384..=2_097_151 => 3,
        _ => 4,
    }
}

/// What a refused or lost message means for the job.
fn classify(topic: &str, e: PublishNoticeError, conn: &Connection) -> DeliveryError {
    use PublishNoticeError as E;
    let refused = |why: &str| {
        format!(
            "{}: the broker refused a message to {topic:?}: {why}",
            conn.shown()
        )
    };
    match e {
        // The broker's access list does not let colibri publish there: the sink's setting, not the
        // job's fault; like a 403, deliveries wait (no attempt spent) until it is allowed.
        E::V5PubAck(PubAckReason::NotAuthorized) | E::V5PubRec(PubRecReason::NotAuthorized) => {
            DeliveryError::Unavailable(refused(
                "not authorized (deliveries wait until the broker allows this topic)",
            ))
        }
        E::V5PubAck(PubAckReason::TopicNameInvalid)
        | E::V5PubRec(PubRecReason::TopicNameInvalid)
        | E::V5PubAck(PubAckReason::PayloadFormatInvalid)
        | E::V5PubRec(PubRecReason::PayloadFormatInvalid) => {
            DeliveryError::Permanent(refused(&format!("{e}")))
        }
        E::V5PubAck(_) | E::V5PubRec(_) | E::V5PubComp(_) => {
            DeliveryError::transient(refused(&format!("{e}")))
        }
        // The connection or its session ended before the answer: an outage.
        other => DeliveryError::Unavailable(format!("{}: {other}", conn.shown())),
    }
}

impl Deliver for MqttSink {
    fn start(&self) {
        self.conn.start();
    }

    fn concurrency(&self) -> usize {
        self.spec.concurrency
    }

    fn timeout(&self) -> Duration {
        self.spec.timeout
    }

    fn replay_rate(&self) -> Option<u64> {
        self.spec.replay_rate
    }

    async fn send(&self, batch: &Batch<'_>, body: Vec<u8>) -> Result<(), DeliveryError> {
        let max_packet = match self.conn.up(self.spec.timeout).await {
            Link::Up { max_packet } => max_packet,
            Link::Down(reason) => return Err(DeliveryError::Unavailable(reason)),
        };
        let body = Bytes::from(body);
        let messages = if self.spec.batch {
            let topic = self
                .spec
                .topic
                .render(batch.stream, b"")
                .map_err(DeliveryError::Permanent)?;
            vec![(topic, body, batch.idempotency_key())]
        } else {
            let mut messages = Vec::with_capacity((batch.end - batch.first) as usize);
            let mut start = 0;
            for (i, line) in body.split(|&b| b == b'\n').enumerate() {
                let end = start + line.len();
                if end == body.len() {
                    break; // after the last record's newline
                }
                let index = batch.first as usize + i;
                let topic = self.spec.topic.render(batch.stream, line).map_err(|why| {
                    DeliveryError::Permanent(format!("record {index} of the job {why}"))
                })?;
                messages.push((topic, body.slice(start..end), batch.record_key(index)));
                start = end + 1;
            }
            messages
        };
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
        match self.conn.connect_now(self.spec.timeout).await {
            Link::Up { .. } => Ok(()),
            Link::Down(reason) => Err(reason),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_are_made_from_text_the_stream_and_fields() {
        let t = Topic::parse("plant/{stream}/{field.site.line}/x").unwrap();
        assert!(t.uses_fields());
        assert_eq!(
            t.render("temps", br#"{"site":{"line":7}}"#).unwrap(),
            "plant/temps/7/x"
        );
        let e = t.render("temps", br#"{"site":{}}"#).unwrap_err();
        assert!(e.contains("no field site.line"), "{e}");
        let e = t
            .render("temps", br#"{"site":{"line":"a+b"}}"#)
            .unwrap_err();
        assert!(e.contains("cannot be part of a topic"), "{e}");
        let e = t.render("temps", b"not json").unwrap_err();
        assert!(e.contains("not JSON"), "{e}");
        let fixed = Topic::parse("a/b").unwrap();
        assert!(!fixed.uses_fields());
        assert_eq!(fixed.render("s", b"anything").unwrap(), "a/b");
    }

    #[test]
    fn bad_templates_say_why() {
        for (t, m) in [
            ("", "empty"),
            ("a/{stream", "without"),
            ("a/{host}", "neither"),
            ("a/{field.}", "neither"),
            ("a/+/b", "wildcards"),
            ("a/#", "wildcards"),
        ] {
            let e = Topic::parse(t).unwrap_err();
            assert!(e.contains(m), "{t}: {e}");
        }
    }

    #[test]
    fn the_packet_size_counts_every_byte_of_a_publish() {
        // 2+5 topic, 2 packet id, 1 props length, 1+2+15+2+3 property, 10 payload = 43; header 2.
        assert_eq!(publish_size("a/b/c", 10, "k:1"), 45);
        assert_eq!(varint_len(127), 1);
        assert_eq!(varint_len(128), 2);
    }
}
