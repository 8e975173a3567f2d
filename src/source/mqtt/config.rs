//! A `type: mqtt` source entry: its file shape ([`MqttSourceSpec`]) and its compilation into
//! `source::mqtt::MqttSourceConfig` (the broker URL, TLS and credentials as the mqtt sink reads
//! them, the topic filters and routes checked, the session and the window). It connects to
//! nothing: `source::mqtt` does. Called through the sources' list (`source::compile_kind`).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::{DEFAULT_MAX_IN_FLIGHT, DEFAULT_MAX_MESSAGE_BYTES, MqttSourceConfig, topic};
use crate::shape::Problems;
use crate::shape::tls::TlsSpec;
#[cfg(feature = "schema")]
use crate::shape::units::u32_schema;
use crate::shape::units::{Dur, Size, de_opt_u32};
use crate::source::config::check_stream;
use crate::source::kind::{Compile, KindSpec};

/// `type: mqtt` source settings.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct MqttSourceSpec {
    /// The broker: `mqtt://host:1883` or, with TLS, `mqtts://host:8883` (MQTT 5).
    pub url: String,
    /// Topic filters to subscribe to, e.g. `plant/+/temperature` or `sensors/#` (`+` one level,
    /// `#` the rest; `$share/<group>/<filter>` for a shared subscription).
    pub topics: Vec<String>,
    /// The stream a message goes to when no route takes it. Its records are JSON objects:
    /// `topic`, `payload` (the JSON value itself when the payload is JSON, else a string; a
    /// payload that is not UTF-8 as base64 with `"encoding": "base64"`), `qos`, `retain`,
    /// `received` (when colibri read it, RFC 3339) and `labels` when set.
    pub stream: String,
    /// Messages whose topic matches `topic` (a filter) go to `stream` instead; the first route
    /// that matches wins.
    #[serde(default)]
    pub routes: Vec<MqttRouteSpec>,
    /// 0, 1 (default) or 2: the QoS subscribed with (the broker sends each message at the lower
    /// of this and its own). A QoS 1 message is acknowledged only once the stream has committed
    /// it, a QoS 2 one PUBRECed then; QoS 0 messages are never acknowledged, and are dropped
    /// (counted) when colibri cannot keep up.
    #[serde(default, deserialize_with = "de_opt_u32")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "u32_schema"))]
    pub qos: Option<u32>,
    /// The client identifier, which names the broker's session for colibri. Default
    /// `colibri-<host name>-source-<source name>-<8 hex digits>`, the digits a hash of the
    /// `data_dir`'s full path: stable across restarts (and a salvaged store), and different for
    /// each agent on one host, so none resumes another's session and takes its messages. Two
    /// agents must not share a client_id written here.
    #[serde(default)]
    pub client_id: Option<String>,
    /// User name for the broker, e.g. `${MQTT_USER}`.
    #[serde(default)]
    pub username: Option<String>,
    /// Password for the broker, e.g. `${MQTT_PASSWORD}`; never logged.
    #[serde(default)]
    pub password: Option<String>,
    /// How long the broker keeps colibri's session, and queues its messages, while colibri is
    /// not connected. Default 1d. The broker's own limits apply too: mosquitto keeps at most
    /// `max_queued_messages` (default 1000) for a client that is away; raise it.
    #[serde(default)]
    pub session_expiry: Option<Dur>,
    /// MQTT keep-alive, 1s to 18h. Default 30s.
    #[serde(default)]
    pub keep_alive: Option<Dur>,
    /// Longest wait for a connection's CONNACK. Default 10s.
    #[serde(default)]
    pub timeout: Option<Dur>,
    /// QoS 1 and 2 messages the broker may send before colibri acknowledges them (MQTT 5's
    /// Receive Maximum), 1-65535. Default 1000. With acknowledgement after commit, throughput is
    /// about this window divided by a commit's time; the broker may set a lower one of its own.
    #[serde(default, deserialize_with = "de_opt_u32")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "u32_schema"))]
    pub max_in_flight: Option<u32>,
    /// The largest message colibri takes (the Maximum Packet Size it announces), e.g. `256KiB`.
    /// Default 1MiB, at most 16MiB. An MQTT 5 broker does not send a larger message to colibri:
    /// it drops it (mosquitto logs it).
    #[serde(default)]
    pub max_message_bytes: Option<Size>,
    /// TLS for `mqtts://` (rustls; the system's roots unless `ca_file` is set; a client
    /// certificate with `client_cert` and `client_key`).
    #[serde(default)]
    pub tls: TlsSpec,
    /// Fields added to every record under `labels`.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// One of an mqtt source's `routes`.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct MqttRouteSpec {
    /// A topic filter (`+`, `#`), matched against each message's topic.
    pub topic: String,
    /// The stream its messages go to.
    pub stream: String,
}

/// Longest `max_message_bytes` accepted.
const MAX_MESSAGE_LIMIT: u64 = 16 << 20;

impl KindSpec for MqttSourceSpec {
    type Config = MqttSourceConfig;

    fn compile(self, cx: &mut Compile<'_, '_>) -> Option<MqttSourceConfig> {
        compile(cx.name, self, cx.base, cx.data_dir, cx.streams, cx.err)
    }
}

/// Compiles one mqtt source; problems go to `err` with paths relative to the source.
fn compile(
    name: &str,
    spec: MqttSourceSpec,
    base: &Path,
    data_dir: &Path,
    streams: &[&str],
    err: &mut Problems<'_>,
) -> Option<MqttSourceConfig> {
    check_stream(&spec.stream, streams, err);
    let broker = crate::shape::url::broker(&spec.url, ("mqtt", 1883), ("mqtts", 8883))
        .map_err(|m| err.add("url", m))
        .ok();
    let tls = broker
        .as_ref()
        .and_then(|(_, _, tls)| crate::shape::tls::client(spec.tls, *tls, "mqtts", base, err));
    check_topics(&spec.topics, &spec.routes, streams, err);
    let qos = spec.qos.unwrap_or(1);
    if qos > 2 {
        err.add("qos", format!("must be 0, 1 or 2, not {qos}"));
    }
    let client_id = spec.client_id.unwrap_or_else(|| {
        crate::shape::client_name::default_mqtt_client_id(&format!("source-{name}"), data_dir)
    });
    if client_id.is_empty() || client_id.len() > 65_535 {
        err.add("client_id", "must be 1 to 65535 bytes".into());
    }
    let keep_alive = spec.keep_alive.map_or(Duration::from_secs(30), |d| d.0);
    if !(Duration::from_secs(1)..=Duration::from_secs(65_535)).contains(&keep_alive) {
        err.add("keep_alive", "must be between 1s and 18h12m15s".into());
    }
    let timeout = spec.timeout.map_or(Duration::from_secs(10), |d| d.0);
    if timeout.is_zero() {
        err.add("timeout", "must be positive".into());
    }
    let session_expiry = spec
        .session_expiry
        .map_or(Duration::from_secs(86_400), |d| d.0);
    if session_expiry.is_zero() {
        err.add(
            "session_expiry",
            "must be positive: a session that ends with the connection loses what is published while colibri is away".into(),
        );
    }
    let max_in_flight = spec
        .max_in_flight
        .unwrap_or(u32::from(DEFAULT_MAX_IN_FLIGHT));
    if !(1..=65_535).contains(&max_in_flight) {
        err.add(
            "max_in_flight",
            format!("must be between 1 and 65535, not {max_in_flight}"),
        );
    }
    let max_message_bytes = spec
        .max_message_bytes
        .map_or(u64::from(DEFAULT_MAX_MESSAGE_BYTES), |s| s.0);
    if !(128..=MAX_MESSAGE_LIMIT).contains(&max_message_bytes) {
        err.add(
            "max_message_bytes",
            format!("must be between 128 bytes and 16MiB, not {max_message_bytes} bytes"),
        );
    }
    let (host, port, _) = broker?;
    let config = MqttSourceConfig {
        name: name.to_string(),
        stream: spec.stream,
        routes: spec
            .routes
            .into_iter()
            .map(|r| (r.topic, r.stream))
            .collect(),
        topics: spec.topics,
        qos: qos.min(2) as u8,
        host,
        port,
        tls,
        client_id,
        username: spec.username,
        password: spec.password.map(crate::setting::Secret),
        keep_alive,
        session_expiry,
        timeout,
        max_in_flight: u16::try_from(max_in_flight.clamp(1, 65_535)).unwrap_or(u16::MAX),
        max_message_bytes: u32::try_from(max_message_bytes).unwrap_or(u32::MAX),
        labels: spec.labels.into_iter().collect(),
    };
    // Reads the TLS files: a bad CA is reported now, not at the first connection.
    if let Err(e) = crate::source::mqtt::session::build(&config) {
        err.add(&e.field, e.message);
    }
    Some(config)
}

/// The topic filters (at least one) and the routes' filters and streams.
fn check_topics(
    topics: &[String],
    routes: &[MqttRouteSpec],
    streams: &[&str],
    err: &mut Problems<'_>,
) {
    if topics.is_empty() {
        err.add("topics", "at least one topic filter is needed".into());
    }
    for (i, t) in topics.iter().enumerate() {
        if let Some(why) = topic::check(t) {
            err.add(&format!("topics[{i}]"), why);
        }
    }
    for (i, r) in routes.iter().enumerate() {
        if let Some(why) = topic::check(&r.topic) {
            err.add(&format!("routes[{i}].topic"), why);
        }
        if !streams.contains(&r.stream.as_str()) {
            err.add(
                &format!("routes[{i}].stream"),
                format!("stream {:?} is not defined under streams:", r.stream),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{ConfigError, load_str};
    use crate::source::Source;
    use std::path::Path;

    fn load(source: &str) -> Result<crate::source::mqtt::MqttSourceConfig, Vec<String>> {
        let text = format!(
            "data_dir: /tmp/x\nstreams:\n  logs: {{}}\n  temps: {{}}\nsources:\n  plant: {source}\n"
        );
        match load_str(&text, Path::new("/etc/colibri/colibri.yaml"), &|_| None) {
            Ok(c) => match &c.sources[0] {
                Source::Mqtt(s) => Ok((**s).clone()),
                other => panic!("not an mqtt source: {other:?}"),
            },
            Err(ConfigError::Invalid { problems, .. }) => {
                Err(problems.iter().map(|p| p.to_string()).collect())
            }
            Err(other) => Err(vec![other.to_string()]),
        }
    }

    #[test]
    fn a_full_mqtt_source_compiles_and_routes() {
        let s = load(
            "{ type: mqtt, url: 'mqtt://127.0.0.1:1884', topics: ['plant/#', 'meters/+/kwh'], stream: logs, routes: [{ topic: 'plant/+/temp', stream: temps }], qos: 2, client_id: gw1, username: u, password: p, session_expiry: 2h, keep_alive: 10s, max_in_flight: 50, max_message_bytes: 64KiB, labels: { site: a } }",
        )
        .unwrap();
        assert_eq!((s.host.as_str(), s.port, s.qos), ("127.0.0.1", 1884, 2));
        assert_eq!(s.streams(), ["logs", "temps"]);
        let streams = s.streams();
        assert_eq!(s.route("plant/l1/temp", &streams), 1);
        assert_eq!(s.route("plant/l1/pressure", &streams), 0);
        assert_eq!((s.max_in_flight, s.max_message_bytes), (50, 65536));
        assert_eq!(s.session_expiry, std::time::Duration::from_secs(7200));
        assert_eq!(s.client_id, "gw1");
        let d = load("{ type: mqtt, url: 'mqtt://broker', topics: [a], stream: logs }").unwrap();
        assert_eq!((d.port, d.qos, d.max_in_flight), (1883, 1, 1000));
        let host = crate::net::hostname().unwrap_or_else(|| "unknown".into());
        let key = d
            .client_id
            .strip_prefix(&format!("colibri-{host}-source-plant-"))
            .unwrap_or_else(|| panic!("{}", d.client_id));
        assert!(
            key.len() == 8 && key.bytes().all(|b| b.is_ascii_hexdigit()),
            "{}",
            d.client_id
        );
        assert_eq!(d.session_expiry, std::time::Duration::from_secs(86_400));
    }

    /// The default client id of source `plant` in a config at `dir`/colibri.yaml with this
    /// `data_dir` (and the written `client_id`, when given).
    fn client_id(dir: &Path, data_dir: &str, written: Option<&str>) -> String {
        let id = written.map_or(String::new(), |w| format!(", client_id: {w}"));
        let text = format!(
            "data_dir: {data_dir:?}\nstreams:\n  logs: {{}}\nsources:\n  plant: {{ type: mqtt, url: 'mqtt://b', topics: [a], stream: logs{id} }}\n"
        );
        match load_str(&text, &dir.join("colibri.yaml"), &|_| None) {
            Ok(c) => match &c.sources[0] {
                Source::Mqtt(s) => s.client_id.clone(),
                other => panic!("not an mqtt source: {other:?}"),
            },
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn the_default_client_id_is_one_per_data_dir_and_stable() {
        let tmp = tempfile::tempdir().unwrap();
        let (etc, other) = (tmp.path().join("etc"), tmp.path().join("other"));
        std::fs::create_dir_all(&etc).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        // Before the data_dir exists, as after: its first run makes it.
        let first = client_id(&etc, "data", None);
        std::fs::create_dir(etc.join("data")).unwrap();
        assert_eq!(client_id(&etc, "data", None), first);
        // Every spelling of one directory: absolute, with `..`, through a symlink.
        let abs = etc.join("data");
        assert_eq!(client_id(&other, abs.to_str().unwrap(), None), first);
        assert_eq!(client_id(&other, "../etc/data", None), first);
        std::os::unix::fs::symlink(&abs, tmp.path().join("link")).unwrap();
        assert_eq!(client_id(&other, "../link", None), first);
        // Another agent's store on this host, a source of the same name: another session.
        assert_ne!(client_id(&other, "data", None), first);
        assert_ne!(client_id(&etc, "data2", None), first);
        // A written one is kept as written.
        assert_eq!(client_id(&etc, "data", Some("gw1")), "gw1");
        assert_eq!(client_id(&other, "data", Some("gw1")), "gw1");
    }

    #[test]
    fn bad_settings_are_named() {
        let p = load(
            "{ type: mqtt, url: 'http://x', topics: ['a/#/b', ''], stream: nope, routes: [{ topic: 'x+', stream: gone }], qos: 3, max_in_flight: 0, max_message_bytes: 32MiB, session_expiry: 0s, keep_alive: 0s }",
        )
        .unwrap_err();
        let want = [
            "sources.plant.stream: stream \"nope\" is not defined",
            "sources.plant.url: \"http://x\": the scheme must be mqtt or mqtts",
            "sources.plant.topics[0]: \"a/#/b\": `#` must be",
            "sources.plant.topics[1]: an empty topic filter",
            "sources.plant.routes[0].topic: \"x+\": `+` must be",
            "sources.plant.routes[0].stream: stream \"gone\" is not defined",
            "sources.plant.qos: must be 0, 1 or 2, not 3",
            "sources.plant.keep_alive: must be between 1s",
            "sources.plant.session_expiry: must be positive",
            "sources.plant.max_in_flight: must be between 1 and 65535, not 0",
            "sources.plant.max_message_bytes: must be between 128 bytes and 16MiB",
        ];
        for w in want {
            assert!(p.iter().any(|x| x.starts_with(w)), "no {w:?} in {p:#?}");
        }
        assert_eq!(p.len(), want.len(), "{p:#?}");
        let p = load(
            "{ type: mqtt, url: 'mqtt://b', topics: [], stream: logs, tls: { ca_file: ca.pem } }",
        )
        .unwrap_err();
        assert!(
            p.iter()
                .any(|x| x.starts_with("sources.plant.topics: at least one")),
            "{p:?}"
        );
        assert!(
            p.iter()
                .any(|x| x.starts_with("sources.plant.tls: applies to mqtts:// URLs only")),
            "{p:?}"
        );
        let p = load(
            "{ type: mqtt, url: 'mqtts://b', topics: [a], stream: logs, tls: { ca_file: no.pem } }",
        )
        .unwrap_err();
        assert!(
            p[0].starts_with("sources.plant.tls.ca_file: /etc/colibri/no.pem: cannot read"),
            "{p:?}"
        );
    }
}
