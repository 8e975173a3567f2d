//! Where a broker sink sends each message: a template of fixed text, `{stream}` (the stream's name)
//! and `{field.<name>}` (a JSON record's field, dots reaching into objects), checked against the
//! broker's rules for a name (an MQTT topic, a NATS subject, a Kafka topic or key) when parsed and
//! when rendered; and a job's records made into the [`Message`]s a broker sink publishes (a
//! message per record, or the job as one), each with its idempotency key. It knows no broker:
//! `mqtt`, `nats` and `kafka` give it their [`Rules`]; `config` parses the templates.

use bytes::Bytes;

use super::deliver::{Batch, DeliveryError};

/// A broker's rules for a name: what it is called, and the characters it cannot hold.
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    /// `topic`, `subject`: for messages.
    pub what: &'static str,
    pub forbidden: fn(char) -> bool,
    /// Why those characters are forbidden, for messages.
    pub why: &'static str,
}

/// Rules are told apart by the name they check (function pointers have no meaningful equality).
impl PartialEq for Rules {
    fn eq(&self, other: &Self) -> bool {
        self.what == other.what
    }
}

impl Eq for Rules {}

/// MQTT topic names: no wildcards, no NUL.
#[cfg(feature = "mqtt")]
pub const MQTT_TOPIC: Rules = Rules {
    what: "topic",
    forbidden: |c| matches!(c, '+' | '#' | '\0'),
    why: "+ or # (wildcards are for subscriptions)",
};

/// NATS subjects: no wildcards, no whitespace.
#[cfg(feature = "nats")]
pub const NATS_SUBJECT: Rules = Rules {
    what: "subject",
    forbidden: |c| matches!(c, '*' | '>') || c.is_whitespace(),
    why: "* or > (wildcards are for subscriptions) or whitespace",
};

/// Kafka topic names: ASCII letters, digits, `.`, `_` and `-` only.
#[cfg(feature = "kafka")]
pub const KAFKA_TOPIC: Rules = Rules {
    what: "topic",
    forbidden: |c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')),
    why: "anything but ASCII letters, digits, . _ and -",
};

/// Kafka message keys: any text.
#[cfg(feature = "kafka")]
pub const KAFKA_KEY: Rules = Rules {
    what: "key",
    forbidden: |_| false,
    why: "",
};

/// A parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Part>,
    rules: Rules,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Stream,
    Field(Vec<String>),
}

impl Template {
    /// Parses a template; the error says what is wrong with it.
    pub fn parse(s: &str, rules: Rules) -> Result<Template, String> {
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
                    Some(path) if path.split('.').all(|p| !p.is_empty()) => {
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
            .any(|p| matches!(p, Part::Text(t) if t.contains(rules.forbidden) || t.contains('}')))
        {
            return Err(format!(
                "{s:?}: a {} cannot hold {}, or a stray }}",
                rules.what, rules.why
            ));
        }
        Ok(Template { parts, rules })
    }

    pub fn uses_fields(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::Field(_)))
    }

    /// The name when it is the same for every record of every stream (no `{stream}`, no field).
    pub fn fixed(&self) -> Option<String> {
        let mut name = String::new();
        for part in &self.parts {
            match part {
                Part::Text(t) => name.push_str(t),
                Part::Stream | Part::Field(_) => return None,
            }
        }
        Some(name)
    }

    /// The name for one record (`record` is parsed only when a field is named). The error says
    /// what the record lacks, to follow "record N of the job".
    pub fn render(&self, stream: &str, record: &[u8]) -> Result<String, String> {
        let what = self.rules.what;
        let json = if self.uses_fields() {
            Some(
                serde_json::from_slice::<serde_json::Value>(record)
                    .map_err(|e| format!("is not JSON ({e}), and the {what} names its fields"))?,
            )
        } else {
            None
        };
        let mut name = String::new();
        for part in &self.parts {
            match part {
                Part::Text(t) => name.push_str(t),
                Part::Stream => name.push_str(stream),
                Part::Field(path) => {
                    let mut v = json.as_ref().expect("parsed above when a field is named");
                    for key in path {
                        v = v.get(key).unwrap_or(&serde_json::Value::Null);
                    }
                    let field = path.join(".");
                    let text = match v {
                        serde_json::Value::String(s) => s.clone(),
                        serde_json::Value::Number(n) => n.to_string(),
                        serde_json::Value::Bool(b) => b.to_string(),
                        serde_json::Value::Null => {
                            return Err(format!("has no field {field} for the {what}"));
                        }
                        _ => return Err(format!("field {field} is not a string or a number")),
                    };
                    if text.is_empty() || text.contains(self.rules.forbidden) {
                        return Err(format!(
                            "field {field} is {text:?}, which cannot be part of a {what}"
                        ));
                    }
                    name.push_str(&text);
                }
            }
        }
        Ok(name)
    }
}

/// One message of a job: where it goes, what it carries, and its key (`Batch::record_key` for a
/// record, the job's `idempotency_key` for the job as one message).
#[derive(Debug)]
pub struct Message {
    pub to: String,
    pub payload: Bytes,
    pub key: String,
    /// Sent from a backlog: the message carries the replayed marker where it can.
    pub replayed: bool,
    /// The (first) record's position in the job as first appended, for messages.
    pub index: usize,
}

impl Template {
    /// The messages of `batch`, whose records are `body`'s lines: one per record, or (`whole`)
    /// the body as one. A record the template cannot name (a field missing) is refused on its own
    /// ([`DeliveryError::Record`]): delivery dead-letters it alone and sends the rest.
    pub fn messages(
        &self,
        batch: &Batch<'_>,
        body: Vec<u8>,
        whole: bool,
    ) -> Result<Vec<Message>, DeliveryError> {
        let body = Bytes::from(body);
        if whole {
            let to = self
                .render(batch.stream, b"")
                .map_err(DeliveryError::Permanent)?;
            return Ok(vec![Message {
                to,
                payload: body,
                key: batch.idempotency_key(),
                replayed: batch.replayed,
                index: batch.first as usize,
            }]);
        }
        let mut messages = Vec::with_capacity((batch.end - batch.first) as usize);
        // A template without fields names every record alike: rendered once for the job.
        let fixed = if self.uses_fields() {
            None
        } else {
            Some(
                self.render(batch.stream, b"")
                    .map_err(DeliveryError::Permanent)?,
            )
        };
        let mut start = 0;
        for (i, line) in body.split(|&b| b == b'\n').enumerate() {
            let end = start + line.len();
            if end == body.len() {
                break; // after the last record's newline
            }
            let index = batch.first as usize + i;
            let to = match &fixed {
                Some(to) => to.clone(),
                None => {
                    self.render(batch.stream, line)
                        .map_err(|reason| DeliveryError::Record {
                            index: index as u32,
                            reason,
                        })?
                }
            };
            messages.push(Message {
                to,
                payload: body.slice(start..end),
                key: batch.record_key(index),
                replayed: batch.replayed,
                index,
            });
            start = end + 1;
        }
        Ok(messages)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_made_from_text_the_stream_and_fields() {
        let t = Template::parse("plant/{stream}/{field.site.line}/x", MQTT_TOPIC).unwrap();
        assert!(t.uses_fields());
        assert_eq!(
            t.render("temps", br#"{"site":{"line":7}}"#).unwrap(),
            "plant/temps/7/x"
        );
        let e = t.render("temps", br#"{"site":{}}"#).unwrap_err();
        assert!(e.contains("no field site.line for the topic"), "{e}");
        let e = t
            .render("temps", br#"{"site":{"line":"a+b"}}"#)
            .unwrap_err();
        assert!(e.contains("cannot be part of a topic"), "{e}");
        let e = t.render("temps", b"not json").unwrap_err();
        assert!(e.contains("not JSON"), "{e}");
        let fixed = Template::parse("a/b", MQTT_TOPIC).unwrap();
        assert!(!fixed.uses_fields());
        assert_eq!(fixed.render("s", b"anything").unwrap(), "a/b");
        let s = Template::parse("plant.{field.line}", NATS_SUBJECT).unwrap();
        let e = s.render("m", br#"{"line":"a b"}"#).unwrap_err();
        assert!(e.contains("cannot be part of a subject"), "{e}");
    }

    #[test]
    fn bad_templates_say_why() {
        for (t, rules, m) in [
            ("", MQTT_TOPIC, "empty"),
            ("a/{stream", MQTT_TOPIC, "without"),
            ("a/{host}", MQTT_TOPIC, "neither"),
            ("a/{field.}", MQTT_TOPIC, "neither"),
            ("a/+/b", MQTT_TOPIC, "wildcards"),
            ("a/#", MQTT_TOPIC, "wildcards"),
            ("a.*", NATS_SUBJECT, "wildcards"),
            ("a.>", NATS_SUBJECT, "wildcards"),
            ("a b", NATS_SUBJECT, "whitespace"),
        ] {
            let e = Template::parse(t, rules).unwrap_err();
            assert!(e.contains(m), "{t}: {e}");
        }
    }
}
