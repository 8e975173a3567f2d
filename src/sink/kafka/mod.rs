//! The `kafka` sink (feature `kafka`): a job's records produced to Kafka (or a Kafka-protocol
//! service), one message per record (or the job as one ndjson message with `batch`), to a topic and
//! with a key made from templates. The producer is idempotent with `acks=all`: within one producer
//! session the broker drops a retried batch it already wrote, and a job is delivered only when
//! every message of it is acknowledged by all in-sync replicas. Each message carries the header
//! `idempotency-key` (a record's key: the job's key and the record's position, the same after a
//! split or a crash), and `colibri-replayed: true` when sent from a backlog, so a consumer can drop
//! a job written again after a colibri restart. It owns the settings, the connection (made at the
//! first delivery or probe, ended by any failure but a message too large and made again at the
//! next: see [`client`]) and a job's outcome: unreachable (no attempt spent) while no broker
//! answers, the credentials are refused, or the topic does not exist; a record over
//! `max_message_bytes` refused alone before anything of its job is sent. Its file shape is [`config`]'s. Built by
//! `sink::Sink::new`.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use krafka::error::{ErrorCode, KrafkaError};
use krafka::producer::{DeliveryHandle, Record};

use super::SinkConfig;
use super::deliver::{Batch, Deliver, DeliveryError, Probe};
use super::kind::{KindConfig, Settings};
use super::template::{Message, Template};
use crate::net::tls_client::TlsConfig;
use crate::record::RecordFormat;
use crate::setting::{Secret, SettingError};
use crate::store::FileJob;
use client::Client;
pub use config::KafkaSinkSpec as Spec;
pub use krafka::Compression;

mod client;
mod config;

/// The compiled `type: kafka` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaConfig {
    /// The bootstrap brokers, `host:port`.
    pub brokers: Vec<String>,
    pub topic: Template,
    /// The message key; `None`: no key.
    pub key: Option<Template>,
    /// One message per job (the records as ndjson) instead of one per record.
    pub batch: bool,
    pub compression: Compression,
    /// The largest message the topic takes, in bytes (value, key and headers).
    pub max_message: usize,
    /// Create a missing topic instead of waiting for it.
    pub create_topic: bool,
    pub sasl: Option<Sasl>,
    /// TLS to every broker with these settings.
    pub tls: Option<TlsConfig>,
    pub client_id: String,
}

/// SASL credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sasl {
    pub mechanism: SaslMechanism,
    pub username: String,
    pub password: Secret,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaslMechanism {
    Plain,
    ScramSha256,
    ScramSha512,
}

impl Settings for KafkaConfig {
    /// A topic or key made from records' fields needs JSON records; otherwise any line is a value.
    fn record_format(&self) -> RecordFormat {
        if self.topic.uses_fields() || self.key.as_ref().is_some_and(Template::uses_fields) {
            RecordFormat::Json
        } else {
            RecordFormat::Lines
        }
    }

    /// For logs: the sink's type, name and brokers (no credentials).
    fn describe(&self, name: &str) -> String {
        format!("kafka sink {name} ({})", self.brokers.join(", "))
    }
}

impl KindConfig for KafkaConfig {
    type Built = KafkaSink;

    fn build(&self, sink: &SinkConfig) -> Result<KafkaSink, SettingError> {
        Ok(KafkaSink::new(self, sink.timeout))
    }
}

/// The header every message carries its idempotency key in.
pub const KEY_HEADER: &str = "idempotency-key";

/// The built sink.
pub struct KafkaSink {
    inner: Arc<Inner>,
}

struct Inner {
    spec: KafkaConfig,
    /// The longest wait for a connection, a metadata answer and a job's acknowledgements (the
    /// sink's `timeout`).
    timeout: Duration,
    /// The connection, made at the first use and again after a failure ended it.
    client: tokio::sync::Mutex<Option<Arc<Client>>>,
    /// Topics known to exist.
    topics: Mutex<HashSet<String>>,
    shown: String,
}

impl KafkaSink {
    /// Nothing is dialled yet (the TLS files were checked when the file was read).
    pub fn new(spec: &KafkaConfig, timeout: Duration) -> KafkaSink {
        KafkaSink {
            inner: Arc::new(Inner {
                spec: spec.clone(),
                timeout,
                client: tokio::sync::Mutex::default(),
                topics: Mutex::default(),
                shown: spec.brokers.join(", "),
            }),
        }
    }
}

/// A sink dropped (a reload that changed it, the stop) closes its producer at once: what it still
/// holds is not sent later, behind the next sink's back (the jobs stay queued).
impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(c) = self.client.get_mut().take()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            rt.spawn(async move { c.close().await });
        }
    }
}

impl Inner {
    /// The connection, made now if there is none (within `timeout`).
    async fn client(&self) -> Result<Arc<Client>, DeliveryError> {
        let mut slot = self.client.lock().await;
        if let Some(c) = &*slot {
            return Ok(Arc::clone(c));
        }
        let made = tokio::time::timeout(self.timeout, Client::connect(&self.spec, self.timeout))
            .await
            .map_err(|_| format!("no broker answered within {:?}", self.timeout))
            .and_then(|c| c.map_err(|e| client::describe(&e)));
        match made {
            Ok(c) => {
                let c = Arc::new(c);
                *slot = Some(Arc::clone(&c));
                Ok(c)
            }
            Err(why) => Err(DeliveryError::Unavailable(format!("{}: {why}", self.shown))),
        }
    }

    /// Ends a connection that failed (no broker answers, credentials refused, a fenced producer):
    /// its producer is closed at once, what it still holds failing, so what it holds of an
    /// abandoned job is not sent later (a request already on the wire may still land: a copy
    /// under its key); the next delivery or probe makes a new connection, and the cluster gives
    /// its producer a new id: krafka would bump the old id's epoch only after its own delivery
    /// timeout, which ends later than the job's wait (tansu 0.6 answers such a bump with an
    /// error, and its SQLite engine then stops).
    async fn drop_client(&self, failed: &Arc<Client>) {
        let mut slot = self.client.lock().await;
        if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, failed)) {
            *slot = None;
            self.topics
                .lock()
                .expect("never poisoned: no panics while held")
                .clear();
            let failed = Arc::clone(failed);
            tokio::spawn(async move { failed.close().await });
        }
    }

    /// Checks that `topic` exists (once per topic), creating it when the file says so.
    async fn check_topic(&self, client: &Client, topic: &str) -> Result<(), DeliveryError> {
        let known = |t: &str| {
            self.topics
                .lock()
                .expect("never poisoned: no panics while held")
                .contains(t)
        };
        if known(topic) {
            return Ok(());
        }
        client
            .ensure_topic(topic, self.spec.create_topic, self.timeout)
            .await
            .map_err(|why| DeliveryError::Unavailable(format!("{}: {why}", self.shown)))?;
        self.topics
            .lock()
            .expect("never poisoned: no panics while held")
            .insert(topic.to_string());
        Ok(())
    }

    /// The Kafka records of `messages`; a message over `max_message_bytes` refuses its record (or,
    /// for a job sent as one message, the job as too large, so the worker halves it).
    fn records(
        &self,
        stream: &str,
        messages: Vec<Message>,
    ) -> Result<Vec<(usize, Record)>, DeliveryError> {
        let fixed_key = match &self.spec.key {
            Some(k) if !k.uses_fields() => Some(Bytes::from(
                k.render(stream, b"").map_err(DeliveryError::Permanent)?,
            )),
            _ => None,
        };
        let mut out = Vec::with_capacity(messages.len());
        for m in messages {
            let key = match (&self.spec.key, &fixed_key) {
                (_, Some(k)) => Some(k.clone()),
                (Some(t), None) => Some(Bytes::from(t.render(stream, &m.payload).map_err(
                    |reason| DeliveryError::Record {
                        index: m.index as u32,
                        reason,
                    },
                )?)),
                (None, None) => None,
            };
            let size = client::message_size(&m, key.as_ref().map_or(0, Bytes::len));
            if size > self.spec.max_message {
                let why = format!(
                    "is a message of {size} bytes, over max_message_bytes ({})",
                    self.spec.max_message
                );
                return Err(if self.spec.batch {
                    DeliveryError::TooLarge(format!("{}: the job {why}", self.shown))
                } else {
                    DeliveryError::Record {
                        index: m.index as u32,
                        reason: why,
                    }
                });
            }
            let mut record = Record::new(m.to, m.payload).header(KEY_HEADER, m.key.into_bytes());
            if let Some(k) = key {
                record = record.key(k);
            }
            if m.replayed {
                record = record.header(crate::sink::REPLAYED, &b"true"[..]);
            }
            out.push((m.index, record));
        }
        Ok(out)
    }

    /// Produces the job's records and waits for every acknowledgement.
    async fn produce(
        &self,
        client: &Arc<Client>,
        records: Vec<(usize, Record)>,
    ) -> Result<(), DeliveryError> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let no_answer = || {
            DeliveryError::Unavailable(format!(
                "{}: no acknowledgement within {:?}",
                self.shown, self.timeout
            ))
        };
        let mut handles: Vec<(usize, DeliveryHandle)> = Vec::with_capacity(records.len());
        for (i, record) in records {
            let Ok(queued) =
                tokio::time::timeout_at(deadline, client.producer.enqueue(record)).await
            else {
                self.drop_client(client).await;
                return Err(no_answer());
            };
            match queued {
                Ok(h) => handles.push((i, h)),
                Err(e) => return Err(self.failed(client, i, e).await),
            }
        }
        // Sends what waits for the linger at once: a job's records are all queued.
        let _ = tokio::time::timeout_at(deadline, client.producer.flush()).await;
        for (i, h) in handles {
            let Ok(acked) = tokio::time::timeout_at(deadline, h).await else {
                self.drop_client(client).await;
                return Err(no_answer());
            };
            if let Err(e) = acked {
                return Err(self.failed(client, i, e).await);
            }
        }
        Ok(())
    }

    /// What a failed produce of the message of record `i` means for the job. Anything but a
    /// message too large also ends the connection (see [`Inner::drop_client`]): krafka stops a
    /// producer for good on some errors it does not call fatal, and a new one costs a round trip.
    async fn failed(&self, client: &Arc<Client>, i: usize, e: KrafkaError) -> DeliveryError {
        let outcome = classify(&self.shown, self.spec.batch, i, &e);
        if !matches!(outcome, DeliveryError::TooLarge(_)) {
            self.drop_client(client).await;
        }
        outcome
    }
}

/// What a produce error means for the job whose record `i` (its position in the job) it is of.
fn classify(shown: &str, batch: bool, i: usize, e: &KrafkaError) -> DeliveryError {
    let why = client::describe(e);
    match e {
        KrafkaError::Broker {
            code: ErrorCode::MessageTooLarge | ErrorCode::RecordListTooLarge,
            ..
        } => {
            // Other messages of the job may be written already: the worker sends it in halves,
            // down to the record the broker refuses, which is dead-lettered alone.
            let what = if batch {
                "the job as one message".to_string()
            } else {
                format!("record {i} of the job (or its batch)")
            };
            DeliveryError::TooLarge(format!("{shown}: {what}: {why}"))
        }
        // The broker cannot take it now, or colibri cannot reach or may not use it: the data
        // waits, no attempt spent.
        KrafkaError::Network(_)
        | KrafkaError::Timeout { .. }
        | KrafkaError::DeliveryTimeout { .. }
        | KrafkaError::UnknownTopic { .. }
        | KrafkaError::Closed { .. }
        | KrafkaError::Fenced { .. }
        | KrafkaError::Auth { .. } => DeliveryError::Unavailable(format!("{shown}: {why}")),
        // A broker that fails in a way it cannot name is not taking data: the data waits (an
        // attempt spent on each would dead-letter it while the broker is broken).
        KrafkaError::Broker {
            code:
                ErrorCode::UnknownServerError
                | ErrorCode::UnsupportedCompressionType
                | ErrorCode::UnknownTopicOrPartition
                | ErrorCode::TopicAuthorizationFailed
                | ErrorCode::ClusterAuthorizationFailed
                | ErrorCode::SaslAuthenticationFailed,
            ..
        } => DeliveryError::Unavailable(format!("{shown}: {why}")),
        e if e.is_retriable() => DeliveryError::Unavailable(format!("{shown}: {why}")),
        _ => DeliveryError::Transient {
            reason: format!("{shown}: {why}"),
            retry_after: None,
        },
    }
}

impl Deliver for KafkaSink {
    fn start(&self) {
        let inner = Arc::clone(&self.inner);
        tokio::spawn(async move {
            let _ = inner.client().await;
        });
    }

    async fn send(&self, batch: &Batch<'_>, body: Vec<u8>) -> Result<(), DeliveryError> {
        let inner = &self.inner;
        let client = inner.client().await?;
        let messages = inner.spec.topic.messages(batch, body, inner.spec.batch)?;
        let mut checked: Option<&str> = None;
        for m in &messages {
            if let Some(why) = client::bad_topic(&m.to) {
                return Err(DeliveryError::Record {
                    index: m.index as u32,
                    reason: why,
                });
            }
            // A job's messages mostly share one topic: checked when it changes.
            if checked != Some(m.to.as_str()) {
                inner.check_topic(&client, &m.to).await?;
                checked = Some(m.to.as_str());
            }
        }
        let records = inner.records(batch.stream, messages)?;
        inner.produce(&client, records).await
    }

    async fn send_file(&self, _batch: &Batch<'_>, file: &FileJob) -> Result<(), DeliveryError> {
        Err(DeliveryError::Permanent(format!(
            "{} is a file, and a kafka sink produces records",
            file.name.to_string_lossy()
        )))
    }

    /// A broker answers a metadata request, and a fixed topic is there (or was created).
    async fn probe(&self, _how: &Probe) -> Result<(), String> {
        let inner = &self.inner;
        let client = inner.client().await.map_err(|e| e.to_string())?;
        let answered = match tokio::time::timeout(inner.timeout, client.metadata()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(format!("{}: {}", inner.shown, client::describe(&e))),
            Err(_) => Err(format!(
                "{}: no metadata within {:?}",
                inner.shown, inner.timeout
            )),
        };
        if answered.is_err() {
            inner.drop_client(&client).await;
            return answered;
        }
        // A topic the same for every stream and record is checked too (a missing one keeps the
        // link down); one made from the stream or a record is checked at its first delivery.
        match inner.spec.topic.fixed() {
            Some(t) => inner
                .check_topic(&client, &t)
                .await
                .map_err(|e| e.to_string()),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_mean_what_the_worker_does_with_the_job() {
        let broker = |code| KrafkaError::Broker {
            code,
            message: String::new(),
        };
        let too_large = broker(ErrorCode::MessageTooLarge);
        assert!(matches!(
            classify("k", false, 3, &too_large),
            DeliveryError::TooLarge(_)
        ));
        assert!(matches!(
            classify("k", true, 0, &too_large),
            DeliveryError::TooLarge(_)
        ));
        for e in [
            broker(ErrorCode::UnknownTopicOrPartition),
            broker(ErrorCode::SaslAuthenticationFailed),
            broker(ErrorCode::NotLeaderForPartition),
            broker(ErrorCode::UnknownServerError),
            broker(ErrorCode::UnsupportedCompressionType),
            KrafkaError::Fenced {
                message: String::new(),
            },
            KrafkaError::Timeout {
                operation: "produce".into(),
            },
        ] {
            assert!(
                matches!(classify("k", false, 0, &e), DeliveryError::Unavailable(_)),
                "{e}"
            );
        }
        assert!(matches!(
            classify("k", false, 0, &broker(ErrorCode::InvalidRequiredAcks)),
            DeliveryError::Transient { .. }
        ));
    }
}
