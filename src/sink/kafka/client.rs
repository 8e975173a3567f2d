//! The kafka sink's connection: a krafka client (the bootstrap brokers, SASL, TLS) with one
//! idempotent `acks=all` producer and an admin client for metadata and topic creation, made from
//! the compiled settings; what a failed call says, in colibri's words; and the size of a message as
//! the broker counts it against `max.message.bytes`. It decides nothing about a job: the sink
//! (`mod.rs`) does.

use std::time::Duration;

use krafka::Kafka;
use krafka::admin::{AdminClient, CreateTopicsOptions, DescribeTopicsOptions, NewTopic};
use krafka::auth::{AuthConfig, TlsConfig as KafkaTls};
use krafka::error::{ErrorCode, KrafkaError};
use krafka::producer::{Acks, Producer};

use super::{KafkaConfig, SaslMechanism};
use crate::net::tls_client::TlsConfig;
use crate::sink::template::Message;

/// How long a batch waits for more records before it is sent. A job's records are queued at
/// once and then flushed, so this only gathers the records of jobs in flight together.
const LINGER: Duration = Duration::from_millis(5);

/// One connection to the cluster and its producer.
pub(super) struct Client {
    pub producer: Producer,
    admin: AdminClient,
}

impl Client {
    /// Connects (a metadata request to the bootstrap brokers) and starts the producer (which asks
    /// the cluster for its producer id).
    pub async fn connect(spec: &KafkaConfig, timeout: Duration) -> Result<Client, KrafkaError> {
        crate::net::client::install_crypto_provider();
        let kafka = Kafka::builder(spec.brokers.join(","))
            .client_id(&spec.client_id)
            .security(security(spec))
            .connect_timeout(timeout)
            .request_timeout(timeout)
            // A missing topic is the operator's to create (or `create_topic`'s), never a
            // metadata request's side effect.
            .allow_auto_create_topics(false)
            .connect()
            .await?;
        let producer = kafka
            .producer()
            .acks(Acks::All)
            .idempotent(true)
            .compression(spec.compression)
            .linger(LINGER)
            .max_block(timeout)
            // The producer's own retries end a little after the job's wait does: a job that got
            // no answer in time goes back to the queue, and its messages still in the producer
            // are not sent after the job is sent again much later.
            .delivery_timeout(timeout + timeout / 2 + LINGER)
            // A message goes out as the broker may take it (the sink checks each against
            // `max_message_bytes` first), plus room for the request's framing.
            .max_request_size(spec.max_message.saturating_mul(2).max(1 << 20))
            // A batch is what the broker checks against its limit: never more than a message may
            // be (krafka splits a refused batch only twice).
            .batch_size(spec.max_message.min(16 * 1024))
            // Room for the largest message, whatever the limit.
            .buffer_memory(spec.max_message.saturating_mul(2).max(32 << 20))
            .metrics_push(false)
            .build()
            .await?;
        let admin = kafka.admin().metrics_push(false);
        Ok(Client { producer, admin })
    }

    /// Closes the producer at once: what it still holds fails instead of being sent.
    pub async fn close(&self) {
        let now = krafka::CloseOptions::new().timeout(Duration::ZERO);
        let _ = self.producer.close_with(now).await;
        let _ = self.admin.close().await;
    }

    /// A metadata request: a broker answers.
    pub async fn metadata(&self) -> Result<(), KrafkaError> {
        self.admin
            .list_topics(krafka::admin::ListTopicsOptions::default())
            .await
            .map(drop)
    }

    /// `topic` exists, or was created (`create`); else why not, in words.
    pub async fn ensure_topic(
        &self,
        topic: &str,
        create: bool,
        timeout: Duration,
    ) -> Result<(), String> {
        let missing = match describe_topic(&self.admin, topic).await {
            Ok(()) => return Ok(()),
            Err(KrafkaError::Broker {
                code: ErrorCode::UnknownTopicOrPartition,
                ..
            }) => !create,
            Err(e) => return Err(describe(&e)),
        };
        if missing {
            return Err(format!(
                "topic {topic} does not exist: create it (or set create_topic: true); deliveries wait"
            ));
        }
        let new = NewTopic::new(topic, -1, -1).map_err(|e| describe(&e))?;
        let answers = self
            .admin
            .create_topics([new], CreateTopicsOptions::default().timeout(timeout))
            .await
            .map_err(|e| describe(&e))?;
        match answers.into_values().next() {
            Some(Ok(()))
            | Some(Err(KrafkaError::Broker {
                code: ErrorCode::TopicAlreadyExists,
                ..
            })) => {
                tracing::info!(topic, "kafka: topic created");
                Ok(())
            }
            Some(Err(e)) => Err(format!("creating topic {topic}: {}", describe(&e))),
            None => Err(format!("creating topic {topic}: no answer")),
        }
    }
}

/// The topic's description; an error when the broker does not know it.
async fn describe_topic(admin: &AdminClient, topic: &str) -> Result<(), KrafkaError> {
    let mut answers = admin
        .describe_topics([topic], DescribeTopicsOptions::default())
        .await?;
    match answers.remove(topic) {
        Some(answer) => answer.map(drop),
        None => Err(KrafkaError::Broker {
            code: ErrorCode::UnknownTopicOrPartition,
            message: format!("topic {topic} is not in the cluster metadata"),
        }),
    }
}

/// The client's security settings from the file's `sasl` and `tls`.
fn security(spec: &KafkaConfig) -> AuthConfig {
    let auth = match &spec.sasl {
        None => AuthConfig::plaintext(),
        Some(s) => {
            let (user, password) = (s.username.clone(), s.password.0.clone());
            match s.mechanism {
                SaslMechanism::Plain => AuthConfig::sasl_plain(user, password),
                SaslMechanism::ScramSha256 => AuthConfig::sasl_scram_sha256(user, password),
                SaslMechanism::ScramSha512 => AuthConfig::sasl_scram_sha512(user, password),
            }
        }
    };
    match &spec.tls {
        None => auth,
        Some(tls) if spec.sasl.is_none() => AuthConfig::ssl(tls_config(tls)),
        Some(tls) => auth.with_tls(tls_config(tls)),
    }
}

/// krafka's TLS settings from a `tls` block: the CA file (else the system's roots), the client
/// certificate and the server name.
fn tls_config(tls: &TlsConfig) -> KafkaTls {
    let mut t = KafkaTls::new();
    t = match &tls.ca_file {
        Some(ca) => t.with_ca_cert(ca.to_string_lossy()),
        None => t.with_native_roots(),
    };
    if let (Some(cert), Some(key)) = (&tls.client_cert, &tls.client_key) {
        t = t.with_client_cert(cert.to_string_lossy(), key.to_string_lossy());
    }
    if let Some(name) = &tls.server_name {
        t = t.with_sni_hostname(name);
    }
    t
}

/// What a failed call says, for logs and the link's reason: the client's words, with what to do
/// where colibri knows it.
pub(super) fn describe(e: &KrafkaError) -> String {
    match e {
        KrafkaError::Auth { message, .. } => {
            format!("authentication refused: {message} (check sasl and tls)")
        }
        KrafkaError::UnknownTopic { topic } => format!(
            "topic {topic} does not exist: create it (or set create_topic: true); deliveries wait"
        ),
        KrafkaError::Broker {
            code: ErrorCode::UnknownTopicOrPartition,
            message,
        } => format!("unknown topic or partition: {message}"),
        other => other.to_string(),
    }
}

/// Why `topic` cannot be a Kafka topic's name, past the characters the template checks: its
/// length (at most 249) and the names `.` and `..`.
pub(super) fn bad_topic(topic: &str) -> Option<String> {
    if topic.len() > 249 {
        Some(format!(
            "makes a topic name of {} characters, and Kafka takes at most 249",
            topic.len()
        ))
    } else if topic == "." || topic == ".." {
        Some(format!(
            "makes the topic name {topic:?}, which Kafka refuses"
        ))
    } else {
        None
    }
}

/// A message's size as the broker counts it against `max.message.bytes`: a record batch of one
/// record (61 bytes of batch header, about 20 of record framing) with its value, key and headers.
pub(super) fn message_size(m: &Message, key: usize) -> usize {
    const BATCH_HEADER: usize = 61;
    const RECORD_FRAMING: usize = 21;
    let headers = super::KEY_HEADER.len()
        + m.key.len()
        + if m.replayed {
            crate::sink::REPLAYED.len() + 4
        } else {
            0
        }
        + 4;
    BATCH_HEADER + RECORD_FRAMING + m.payload.len() + key + headers
}
