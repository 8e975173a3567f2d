//! The `type: kafka` sink entry: its file shape ([`KafkaSinkSpec`]) and its compilation into
//! [`KafkaConfig`] (the bootstrap brokers, the topic and key templates, compression, the message
//! limit, SASL, TLS), each problem under its field. It connects to nothing: the sink does. Called
//! through the sinks' list (`sink::compile_kind`) for `type: kafka`.

use serde::Deserialize;

use super::{Compression, KafkaConfig, Sasl, SaslMechanism};
use crate::setting::Secret;
use crate::shape::Problems;
use crate::shape::tls::TlsSpec;
#[cfg(feature = "schema")]
use crate::shape::units::u32_schema;
use crate::shape::units::{self, Dur, Size};
use crate::sink::config::{LinkSpec, RetrySpec, broker_link, template};
use crate::sink::kind::{Compile, KindSpec};
use crate::sink::template::{KAFKA_KEY, KAFKA_TOPIC};

/// Kafka's own default `max.message.bytes` (1 MiB and the batch header).
const DEFAULT_MAX_MESSAGE: u64 = 1_048_588;

/// `type: kafka` settings.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct KafkaSinkSpec {
    /// The bootstrap brokers, `host:port` (the port defaults to 9092), one or a list: the client
    /// learns the rest of the cluster from the first that answers.
    pub brokers: Brokers,
    /// Where each message goes: fixed text with `{stream}` (the colibri stream's name) and
    /// `{field.<name>}` (a JSON record's field), e.g. `plant.{stream}`. Kafka topic names hold
    /// ASCII letters, digits, `.`, `_` and `-`; a record whose field makes another name goes to the
    /// dead letters with the reason.
    pub topic: String,
    /// The message key, a template like `topic` (any text), e.g. `{field.device}`: Kafka puts the
    /// messages of one key in one partition, in order. Unset: no key (the client spreads a job's
    /// messages over the partitions, so order holds only within each).
    #[serde(default)]
    pub key: Option<String>,
    /// `true`: one message per job, its records as ndjson, instead of one message per record.
    /// Default false. A topic or key with `{field...}` needs a message per record.
    #[serde(default)]
    pub batch: bool,
    /// `none` (default), `gzip`, `snappy`, `lz4` or `zstd`: how the producer compresses its
    /// record batches.
    #[serde(default)]
    pub compression: Option<CompressionSpec>,
    /// The largest message the topic takes (the broker's `max.message.bytes`, default 1 MiB): a
    /// record over it goes to the dead letters alone with the reason before anything of its job is
    /// sent. Kafka does not tell a producer this limit; set it to the topic's.
    #[serde(default)]
    pub max_message_bytes: Option<Size>,
    /// `true`: a topic that does not exist is created (with the broker's default partitions and
    /// replication) before the first message to it. Default false: a missing topic is an error
    /// naming it, and deliveries wait for an operator to create it.
    #[serde(default)]
    pub create_topic: bool,
    /// SASL authentication (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512); with `tls`, over TLS.
    #[serde(default)]
    pub sasl: Option<SaslSpec>,
    /// TLS to every broker (rustls; the system's roots unless `ca_file` is set; `client_cert` and
    /// `client_key` for mutual TLS). `tls: {}` turns it on with the defaults.
    #[serde(default)]
    pub tls: Option<TlsSpec>,
    /// The producer's `client.id`, as the brokers' logs and quotas see it. Default
    /// `colibri-<host name>-<sink name>`.
    #[serde(default)]
    pub client_id: Option<String>,
    /// Longest wait for a connection, a metadata answer and a job's acknowledgements. Default 10s.
    #[serde(default)]
    pub timeout: Option<Dur>,
    /// Jobs in flight at once, 1-64. Default 1, which keeps strict order.
    #[serde(default, deserialize_with = "units::de_opt_u32")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "u32_schema"))]
    pub concurrency: Option<u32>,
    #[serde(default)]
    pub retry: RetrySpec,
    /// When the brokers count as unreachable. The link is probed with a metadata request:
    /// `probe` and `probe_url` do not apply.
    #[serde(default)]
    pub link: LinkSpec,
    /// Bytes per second of payload while a backlog is replayed. Unset: unlimited.
    #[serde(default)]
    pub replay_rate: Option<Size>,
}

/// One broker or a list of them.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(untagged)]
pub enum Brokers {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum CompressionSpec {
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

/// `sasl:` settings.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct SaslSpec {
    /// `plain`, `scram-sha-256` or `scram-sha-512`.
    pub mechanism: MechanismSpec,
    pub username: String,
    /// Never logged; e.g. `${KAFKA_PASSWORD}`.
    pub password: String,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum MechanismSpec {
    #[serde(rename = "plain")]
    Plain,
    #[serde(rename = "scram-sha-256")]
    ScramSha256,
    #[serde(rename = "scram-sha-512")]
    ScramSha512,
}

impl KindSpec for KafkaSinkSpec {
    type Config = KafkaConfig;

    /// A `kafka` entry compiled; `None` when a problem stops it (each one reported).
    fn compile(mut self, cx: &mut Compile<'_, '_>) -> Option<KafkaConfig> {
        cx.link = broker_link(std::mem::take(&mut self.link), "a kafka", cx.err);
        cx.retry = std::mem::take(&mut self.retry);
        let err = &mut *cx.err;
        let brokers = brokers(self.brokers, err);
        let topic = template("topic", &self.topic, KAFKA_TOPIC, self.batch, err);
        let key = self
            .key
            .map(|k| template("key", &k, KAFKA_KEY, self.batch, err));
        let tls = self.tls.map(|spec| crate::shape::tls::files(spec, cx.base));
        if let Some(tls) = &tls
            && let Err(e) = crate::net::tls_client::client_config(tls)
        {
            err.add(&e.field, e.message);
        }
        let sasl = self.sasl.and_then(|s| sasl(s, err));
        let max_message = self.max_message_bytes.map_or(DEFAULT_MAX_MESSAGE, |s| s.0);
        if max_message == 0 {
            err.add("max_message_bytes", "must be positive".into());
        }
        cx.limits(self.timeout, self.concurrency, self.replay_rate);
        let key = match key {
            Some(Some(k)) => Some(k),
            Some(None) => return None,
            None => None,
        };
        Some(KafkaConfig {
            brokers: brokers?,
            topic: topic?,
            key,
            batch: self.batch,
            compression: match self.compression.unwrap_or(CompressionSpec::None) {
                CompressionSpec::None => Compression::None,
                CompressionSpec::Gzip => Compression::Gzip,
                CompressionSpec::Snappy => Compression::Snappy,
                CompressionSpec::Lz4 => Compression::Lz4,
                CompressionSpec::Zstd => Compression::Zstd,
            },
            max_message: usize::try_from(max_message).unwrap_or(usize::MAX),
            create_topic: self.create_topic,
            sasl,
            tls,
            client_id: self
                .client_id
                .unwrap_or_else(|| crate::shape::client_name::default_client_name(cx.name)),
        })
    }
}

/// The bootstrap list as `host:port` (9092 when no port is given); `None` when it names none.
fn brokers(brokers: Brokers, err: &mut Problems<'_>) -> Option<Vec<String>> {
    let list = match brokers {
        Brokers::One(b) => vec![b],
        Brokers::Many(b) => b,
    };
    if list.is_empty() {
        err.add("brokers", "names no broker".into());
        return None;
    }
    let named = list.len() > 1;
    let mut out = Vec::with_capacity(list.len());
    for (i, b) in list.iter().enumerate() {
        let field = if named {
            format!("brokers[{i}]")
        } else {
            "brokers".to_string()
        };
        match broker(b) {
            Ok(b) => out.push(b),
            Err(m) => err.add(&field, m),
        }
    }
    Some(out)
}

/// One broker as `host:port` (IPv6 in brackets), or why it is not one.
fn broker(b: &str) -> Result<String, String> {
    if b.contains("://") {
        return Err(format!(
            "{b:?}: a Kafka broker is host:port, without a scheme (TLS is the tls setting)"
        ));
    }
    if b.contains([',', '/', ' ']) {
        return Err(format!("{b:?} is not host:port (one broker per list item)"));
    }
    let (host, port) = if let Some(rest) = b.strip_prefix('[') {
        let (addr, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("{b:?}: a [ without its ]"))?;
        if addr.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!("{b:?}: {addr:?} is not an IPv6 address"));
        }
        match after {
            "" => (&b[..addr.len() + 2], None),
            p => match p.strip_prefix(':') {
                Some(p) => (&b[..addr.len() + 2], Some(p)),
                None => return Err(format!("{b:?} is not [address]:port")),
            },
        }
    } else {
        match b.split_once(':') {
            Some((_, p)) if p.contains(':') => {
                return Err(format!("{b:?}: write an IPv6 address as [address]:port"));
            }
            Some((h, p)) => (h, Some(p)),
            None => (b, None),
        }
    };
    let port = match port {
        None => 9092,
        Some(p) => match p.parse::<u16>() {
            Ok(0) => return Err(format!("{b:?}: the port must not be 0")),
            Ok(p) => p,
            Err(_) => {
                return Err(format!(
                    "{b:?}: the port {p:?} is not a number from 1 to 65535"
                ));
            }
        },
    };
    if host.is_empty() {
        return Err(format!("{b:?} is not host:port"));
    }
    Ok(format!("{host}:{port}"))
}

/// The `sasl` block compiled; `None` (reported) when a credential is empty.
fn sasl(spec: SaslSpec, err: &mut Problems<'_>) -> Option<Sasl> {
    for (field, value) in [("username", &spec.username), ("password", &spec.password)] {
        if value.is_empty() {
            err.add(&format!("sasl.{field}"), "must not be empty".into());
        }
    }
    if spec.username.is_empty() || spec.password.is_empty() {
        return None;
    }
    Some(Sasl {
        mechanism: match spec.mechanism {
            MechanismSpec::Plain => SaslMechanism::Plain,
            MechanismSpec::ScramSha256 => SaslMechanism::ScramSha256,
            MechanismSpec::ScramSha512 => SaslMechanism::ScramSha512,
        },
        username: spec.username,
        password: Secret(spec.password),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brokers_are_host_and_port() {
        assert_eq!(broker("k1:9093").unwrap(), "k1:9093");
        assert_eq!(broker("k1").unwrap(), "k1:9092");
        assert_eq!(broker("[::1]:9094").unwrap(), "[::1]:9094");
        assert_eq!(broker("[::1]").unwrap(), "[::1]:9092");
        for (b, m) in [
            ("kafka://k1:9092", "without a scheme"),
            ("k1:x", "not a number"),
            ("k1:0", "must not be 0"),
            (":9092", "not host:port"),
            ("2001:db8::1:9093", "as [address]:port"),
            ("[zz]:1", "not an IPv6 address"),
            ("a:1,b:2", "one broker per list item"),
        ] {
            let e = broker(b).unwrap_err();
            assert!(e.contains(m), "{b}: {e}");
        }
    }
}
