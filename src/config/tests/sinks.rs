//! Tests of the `sinks:` section: each kind compiles with its defaults and every setting, streams
//! must name a sink that exists, and mistakes are reported at their field.

use super::*;

#[test]
fn sinks_compile_and_streams_must_name_one() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.yaml");
    std::fs::create_dir(dir.path().join("outbox")).unwrap();
    let text = r#"
sinks:
  out: { type: file, path: outbox, retry: { base: 200ms, cap: 10s, max_attempts: 3 } }
  console: { type: stdout }
streams:
  logs: { sink: out }
  plain: {}
"#;
    let c = load_str(text, &cfg, &env).unwrap();
    assert_eq!(c.sinks.len(), 2);
    let out = c.sinks.iter().find(|s| s.name == "out").unwrap();
    assert_eq!(
        out.kind,
        SinkKind::File(Box::new(crate::sink::file::FileConfig {
            dir: dir.path().join("outbox")
        }))
    );
    assert_eq!(
        out.retry,
        SinkRetry {
            base: Duration::from_millis(200),
            cap: Duration::from_secs(10),
            max_attempts: 3
        }
    );
    let console = c.sinks.iter().find(|s| s.name == "console").unwrap();
    assert_eq!(console.retry.max_attempts, 8);
    assert_eq!(c.streams[0].sink.as_deref(), Some("out"));
    assert_eq!(c.streams[1].sink, None);

    let p = problems(
        r#"
sinks:
  a: { type: ftp }
  b: { type: stdout, colour: blue }
  c: { type: file }
  d: { type: file, path: /etc/passwd }
  e: { type: stdout, retry: { base: 0s, cap: 0s, max_attempts: 0 } }
streams:
  s: { sink: nowhere }
"#,
    );
    let expect = [
        "sinks.a.type: unknown variant `ftp`, expected one of `file`, `stdout`, `http`",
        "sinks.b.colour: unknown field `colour`",
        "sinks.c: missing field `path`",
        "sinks.d.path: /etc/passwd exists and is not a directory",
        "sinks.e.retry.base: must be positive",
        "sinks.e.retry.max_attempts: must be at least 1",
        "streams.s.sink: sink \"nowhere\" is not defined under sinks: (defined: a, b, c, d, e)",
    ];
    assert_has(&p, &expect);
}

#[test]
fn http_sinks_compile_with_defaults_and_every_setting() {
    use crate::sink::http::{Compression, Encoding, HttpMethod};
    use crate::sink::{LinkConfig, Probe};
    let dir = tempfile::tempdir().unwrap();
    let ca = rcgen::generate_simple_self_signed(vec!["test-ca".to_string()]).unwrap();
    std::fs::write(dir.path().join("ca.pem"), ca.cert.pem()).unwrap();
    let cfg = dir.path().join("colibri.yaml");
    let env = |k: &str| (k == "TOKEN").then(|| "s3cret".to_string());
    let text = r#"
sinks:
  up:
    type: http
    url: http://127.0.0.1:8428/write
  full:
    type: http
    url: https://10.0.0.5:8443/ingest
    method: put
    encoding: influx_line
    compression: zstd
    headers: { Authorization: "Bearer ${TOKEN}" }
    timeout: 3s
    concurrency: 4
    tls: { ca_file: ca.pem, server_name: collector.example }
    retry: { base: 2s, cap: 1m, max_attempts: 5 }
    link: { probe: http, probe_url: "https://10.0.0.5:8443/health", down_after: 2, backoff_base: 500ms, backoff_cap: 30s }
    replay_rate: 256KiB
"#;
    let c = load_str(text, &cfg, &env).unwrap();
    let up = c.sinks.iter().find(|s| s.name == "up").unwrap();
    let SinkKind::Http(h) = &up.kind else {
        panic!("{:?}", up.kind)
    };
    assert_eq!(h.method, HttpMethod::Post);
    assert_eq!(h.encoding, Encoding::Ndjson);
    assert_eq!(h.compression, Compression::None);
    assert_eq!(up.timeout, Duration::from_secs(10));
    assert_eq!(up.concurrency, 1);
    assert_eq!(up.replay_rate, None);
    assert_eq!(up.link, LinkConfig::default());
    let full = c.sinks.iter().find(|s| s.name == "full").unwrap();
    let SinkKind::Http(h) = &full.kind else {
        panic!("{:?}", full.kind)
    };
    assert_eq!(h.method, HttpMethod::Put);
    assert_eq!(h.encoding, Encoding::InfluxLine);
    assert_eq!(h.compression, Compression::Zstd);
    assert_eq!(
        h.headers,
        vec![("Authorization".into(), "Bearer s3cret".into())]
    );
    assert_eq!(full.concurrency, 4);
    assert_eq!(h.tls.ca_file, Some(dir.path().join("ca.pem")));
    assert_eq!(h.tls.server_name.as_deref(), Some("collector.example"));
    assert_eq!(full.replay_rate, Some(256 * 1024));
    assert_eq!(full.retry.max_attempts, 5);
    assert_eq!(full.link.down_after, 2);
    assert_eq!(
        full.link.probe,
        Probe::Http("https://10.0.0.5:8443/health".parse().unwrap())
    );
    // Header values may be credentials: never in Debug output.
    let debug = format!("{full:?}");
    assert!(!debug.contains("s3cret"), "{debug}");
}

/// The probe backoff's defaults follow the probe's cost: a TCP connect is repeated within 2 s
/// however long the outage, a GET backs off to 60 s, and failed trials back off to 60 s either
/// way. A cap that is set is honoured for both; an unset one never falls below a base that is set
/// (a file that set only a long base stays valid); a cap set below the base is refused.
#[test]
fn link_backoff_defaults_follow_the_probe_and_set_values_are_honoured() {
    use crate::sink::{CHEAP_PROBE_CAP, EXPENSIVE_PROBE_CAP};
    let c = load(
        r#"
sinks:
  tcp: { type: http, url: "http://h/" }
  http: { type: http, url: "http://h/", link: { probe: http } }
  capped: { type: http, url: "http://h/", link: { backoff_cap: 30s } }
  http_capped: { type: http, url: "http://h/", link: { probe: http, backoff_base: 2s, backoff_cap: 10s } }
  long_base: { type: http, url: "http://h/", link: { backoff_base: 5s } }
  longer_base: { type: http, url: "http://h/", link: { backoff_base: 90s } }
"#,
    )
    .unwrap();
    let link = |name: &str| {
        let l = &c.sinks.iter().find(|s| s.name == name).unwrap().link;
        (l.backoff_base, l.backoff_cap, l.trial_cap)
    };
    let s = Duration::from_secs;
    assert_eq!(link("tcp"), (s(1), CHEAP_PROBE_CAP, EXPENSIVE_PROBE_CAP));
    assert_eq!(
        link("http"),
        (s(1), EXPENSIVE_PROBE_CAP, EXPENSIVE_PROBE_CAP)
    );
    assert_eq!(link("capped"), (s(1), s(30), s(30)));
    assert_eq!(link("http_capped"), (s(2), s(10), s(10)));
    assert_eq!(link("long_base"), (s(5), s(5), EXPENSIVE_PROBE_CAP));
    assert_eq!(link("longer_base"), (s(90), s(90), s(90)));
    let p = problems(
        r#"
sinks:
  a: { type: http, url: "http://h/", link: { backoff_base: 5s, backoff_cap: 2s } }
  b: { type: http, url: "http://h/", link: { backoff_cap: 500ms } }
  c: { type: http, url: "http://h/", link: { backoff_base: 0s } }
"#,
    );
    for e in [
        "sinks.a.link.backoff_cap: must not be shorter than link.backoff_base",
        "sinks.b.link.backoff_cap: must not be shorter than link.backoff_base",
        "sinks.c.link.backoff_base: must be positive",
    ] {
        assert!(
            p.iter().any(|l| l.starts_with(e)),
            "missing {e:?} in\n{}",
            p.join("\n")
        );
    }
}

#[test]
fn http_sink_mistakes_are_reported_by_field() {
    let p = problems(
        r#"
sinks:
  a: { type: http, url: "ftp://x/y" }
  b: { type: http, url: "not a url" }
  c: { type: http, url: "http://h/", concurrency: 0, timeout: 0s, replay_rate: 0 }
  d: { type: http, url: "http://h/", headers: { Content-Type: text/csv, "bad name": x, X-Tag: a, x-tag: b } }
  e: { type: http, url: "https://h/", tls: { ca_file: /nonexistent/ca.pem } }
  f: { type: http, url: "https://h/", tls: { client_cert: /nonexistent/c.pem } }
  g: { type: http, url: "http://h/", link: { down_after: 0, probe_url: "http://h/health" } }
  h: { type: http, url: "http://h/", encoding: csv }
"#,
    );
    let expect = [
        "sinks.a.url: \"ftp://x/y\": the scheme must be http or https, not ftp",
        "sinks.b.url: \"not a url\" is not a valid URL",
        "sinks.c.timeout: must be positive",
        "sinks.c.concurrency: must be between 1 and 64, not 0",
        "sinks.c.replay_rate: must be positive",
        "sinks.d.headers.Content-Type: is set by colibri itself",
        "sinks.d.headers.bad name: is not a valid header name",
        "sinks.d.headers.x-tag: is set twice (header names are case-insensitive)",
        "sinks.e.tls.ca_file: /nonexistent/ca.pem: cannot read",
        "sinks.f.tls.client_key: missing: tls.client_cert needs it",
        "sinks.g.link.down_after: must be at least 1",
        "sinks.g.link.probe_url: is only used with probe: http",
        "sinks.h.encoding: unknown variant `csv`, expected one of `ndjson`, `json_array`, `influx_line`",
    ];
    assert_has(&p, &expect);
}

/// A `prometheus_remote_write` sink compiles over the http transport, its streams carry samples in
/// ms (so a scrape into them stamps ms), and bad external labels are reported at their field.
#[cfg(feature = "remote-write")]
#[test]
fn a_remote_write_sink_compiles_and_checks_its_labels() {
    let c = load(
        r#"
sinks:
  tsdb:
    type: prometheus_remote_write
    url: http://127.0.0.1:9090/api/v1/write
    external_labels: { gateway: gw-1, region: eu }
    headers: { Authorization: Bearer x }
    concurrency: 2
streams:
  m: { sink: tsdb }
tasks:
  - { name: plc, type: http_scrape, every: 1s, url: "http://127.0.0.1:9100/metrics", format: prometheus, stream: m }
"#,
    )
    .unwrap();
    let SinkKind::PrometheusRemoteWrite(r) = &c.sinks[0].kind else {
        panic!("{:?}", c.sinks[0].kind)
    };
    assert_eq!(
        r.external_labels,
        [
            ("gateway".to_string(), "gw-1".to_string()),
            ("region".to_string(), "eu".to_string())
        ]
    );
    assert_eq!((c.sinks[0].concurrency, r.http.headers.len()), (2, 1));
    assert_eq!(
        c.record_format("m"),
        crate::record::RecordFormat::LineProtocol(crate::scrape::lineproto::Precision::Ms)
    );
    let p = problems(
        r#"
sinks:
  tsdb:
    type: prometheus_remote_write
    url: http://127.0.0.1:9090/api/v1/write
    external_labels: { "bad-name": x, __reserved: y, empty: "" }
    headers: { Content-Type: x }
"#,
    );
    for want in [
        "sinks.tsdb.external_labels.bad-name: is not a Prometheus label name",
        "sinks.tsdb.external_labels.__reserved: names starting with __",
        "sinks.tsdb.external_labels.empty: an empty value",
        "sinks.tsdb.headers.Content-Type: is set by colibri itself",
    ] {
        assert!(p.iter().any(|x| x.contains(want)), "{want} in {p:?}");
    }
}

/// An `mqtt` sink compiles with its defaults (MQTT 5, port 1883, QoS 1, resumed sessions, a client
/// id per machine and sink), and a topic from fields makes its streams JSON.
#[cfg(feature = "mqtt")]
#[test]
fn an_mqtt_sink_compiles_with_its_defaults() {
    use crate::sink::mqtt::{Protocol, Qos};
    let c = load(
        r#"
sinks:
  broker:
    type: mqtt
    url: mqtt://127.0.0.1
    topic: "plant/{stream}/{field.line}"
    status: { topic: gw/status }
streams:
  m: { sink: broker }
"#,
    )
    .unwrap();
    let SinkKind::Mqtt(m) = &c.sinks[0].kind else {
        panic!("{:?}", c.sinks[0].kind)
    };
    assert_eq!(
        (m.host.as_str(), m.port, m.tls.is_none()),
        ("127.0.0.1", 1883, true)
    );
    assert_eq!(
        (m.qos, m.batch, m.persistent),
        (Qos::AtLeastOnce, false, true)
    );
    // colibri-<host>-broker-<8 hex digits of the data_dir>: one per agent on a host.
    let (named, key) = m.client_id.rsplit_once('-').unwrap();
    assert!(
        named.starts_with("colibri-") && named.ends_with("-broker") && key.len() == 8,
        "{}",
        m.client_id
    );
    let s = m.status.as_ref().unwrap();
    assert_eq!(
        (s.online.as_str(), s.offline.as_str()),
        ("online", "offline")
    );
    // A topic made from fields needs JSON records.
    assert_eq!(c.record_format("m"), crate::record::RecordFormat::Json);
    assert_eq!((m.protocol, m.max_packet), (Protocol::V5, None));
}

/// Each mistake in an `mqtt` sink is named at its field.
#[cfg(feature = "mqtt")]
#[test]
fn every_mistake_in_an_mqtt_sink_is_named() {
    let p = problems(
        r#"
sinks:
  a: { type: mqtt, url: "http://h", topic: "x/+" , qos: 0 }
  b: { type: mqtt, url: "mqtt://u:p@h", topic: "x/{field.a}", batch: true, qos: 3 }
  c: { type: mqtt, url: "mqtt://h/path", topic: "x/{host}", tls: { ca_file: ca.pem }, link: { probe: http } }
  d: { type: mqtt, url: "mqtts://h", topic: x, tls: { ca_file: missing.pem }, status: { topic: "s/#" } }
"#,
    );
    for want in [
        "sinks.a.url: \"http://h\": the scheme must be mqtt or mqtts",
        "sinks.b.url: \"mqtt://u:p@h\" holds credentials",
        "sinks.c.url: \"mqtt://h/path\": a broker URL is a host and a port",
        "sinks.d.tls.ca_file: ",
        "sinks.d.status.topic: \"s/#\" is not a topic name",
    ] {
        assert!(p.iter().any(|x| x.contains(want)), "{want} in {p:?}");
    }
    let p = problems(
        r#"
sinks:
  a: { type: mqtt, url: "mqtt://h", topic: "x/+" , qos: 0 }
  b: { type: mqtt, url: "mqtt://h", topic: "x/{field.a}", batch: true, qos: 3 }
  c: { type: mqtt, url: "mqtt://h", topic: "x/{host}", tls: { ca_file: ca.pem }, link: { probe: http } }
"#,
    );
    for want in [
        "sinks.a.topic: \"x/+\": a topic cannot hold + or #",
        "sinks.a.qos: 0 is never acknowledged",
        "sinks.b.topic: names a record's field, and batch: true",
        "sinks.b.qos: must be 1 or 2, not 3",
        "sinks.c.topic: \"x/{host}\": {host} is neither",
        "sinks.c.tls: applies to mqtts:// URLs only",
        "sinks.c.link.probe: does not apply",
    ] {
        assert!(p.iter().any(|x| x.contains(want)), "{want} in {p:?}");
    }
}

/// `encoding: sparkplug_b`: the edge node's settings, line protocol in ms for its streams, and
/// each setting that cannot apply to it named.
#[cfg(feature = "sparkplug")]
#[test]
fn a_sparkplug_sink_compiles_and_refuses_what_does_not_apply() {
    use crate::sink::mqtt::sparkplug::DeviceFrom;
    let c = load(
        r#"
sinks:
  scada:
    type: mqtt
    url: mqtt://127.0.0.1
    encoding: sparkplug_b
    sparkplug: { group_id: plant1, edge_node_id: gw17, device: "tag:unit", metric_tags: [node], primary_host_id: scada }
streams:
  m: { sink: scada }
"#,
    )
    .unwrap();
    let SinkKind::Mqtt(m) = &c.sinks[0].kind else {
        panic!("{:?}", c.sinks[0].kind)
    };
    let sp = m.sparkplug.as_ref().unwrap();
    assert_eq!(
        (sp.group_id.as_str(), sp.edge_node_id.as_str(), &sp.device),
        ("plant1", "gw17", &DeviceFrom::Tag("unit".into()))
    );
    assert_eq!(sp.metric_tags, ["node"]);
    assert_eq!(sp.primary_host_id.as_deref(), Some("scada"));
    assert!(sp.bd_seq_file.ends_with("sparkplug-scada.bdseq"));
    assert!(!m.persistent, "a Sparkplug node starts every session clean");
    assert_eq!(
        c.record_format("m"),
        crate::record::RecordFormat::LineProtocol(crate::scrape::lineproto::Precision::Ms)
    );
    let p = problems(
        r#"
sinks:
  a: { type: mqtt, url: "mqtt://h", encoding: sparkplug_b, topic: x, batch: true, clean_session: false, session_expiry: 1h, status: { topic: s }, sparkplug: { group_id: "a/b", edge_node_id: "", device: "field:x", primary_host_id: "h#" } }
  b: { type: mqtt, url: "mqtt://h", encoding: sparkplug_b }
  c: { type: mqtt, url: "mqtt://h", topic: x, sparkplug: { group_id: g, edge_node_id: n } }
  d: { type: mqtt, url: "mqtt://h" }
"#,
    );
    for want in [
        "sinks.a.topic: does not apply with encoding: sparkplug_b",
        "sinks.a.batch: does not apply with encoding: sparkplug_b",
        "sinks.a.clean_session: does not apply with encoding: sparkplug_b",
        "sinks.a.status: does not apply with encoding: sparkplug_b",
        "sinks.a.session_expiry: does not apply with encoding: sparkplug_b",
        "sinks.a.sparkplug.group_id: \"a/b\" contains `/`",
        "sinks.a.sparkplug.edge_node_id: \"\" is empty",
        "sinks.a.sparkplug.primary_host_id: \"h#\" contains",
        "sinks.a.sparkplug.device: must be stream, measurement or tag:<name>, not \"field:x\"",
        "sinks.b.sparkplug: is required with encoding: sparkplug_b",
        "sinks.c.sparkplug: applies with encoding: sparkplug_b only",
        "sinks.d.topic: is required",
    ] {
        assert!(p.iter().any(|x| x.contains(want)), "{want} in {p:?}");
    }
    assert!(
        !p.iter().any(|x| x.contains("sinks.b.topic")),
        "a Sparkplug sink needs no topic: {p:?}"
    );
}

/// `protocol: 3.1.1` is read as YAML writes it (a number or text), with its packet limits.
#[cfg(feature = "mqtt")]
#[test]
fn mqtt_3_1_1_is_read_as_yaml_writes_it_with_its_limits() {
    use crate::sink::mqtt::Protocol;
    // MQTT 3.1.1, YAML's number or text; its limits.
    let c = load(
        r#"
sinks:
  old: { type: mqtt, protocol: 3.1.1, url: mqtt://h, topic: t, username: u, password: p, max_packet_size: 64KiB }
  new: { type: mqtt, protocol: 5, url: mqtt://h, topic: t }
streams:
  m: { sink: old }
  n: { sink: new }
"#,
    )
    .unwrap();
    let versions: Vec<_> = c
        .sinks
        .iter()
        .map(|s| match &s.kind {
            SinkKind::Mqtt(m) => (m.protocol, m.max_packet),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        versions,
        // Sinks in name order: `new`, `old`.
        [(Protocol::V5, None), (Protocol::V311, Some(65_536))]
    );
    // 3.1.1 without a limit takes 256 KiB (its broker cannot say one); 5.0 unquoted is MQTT 5.
    let c = load(
        r#"
sinks:
  a: { type: mqtt, protocol: 3.1.1, url: mqtt://h, topic: t }
  b: { type: mqtt, protocol: 5.0, url: mqtt://h, topic: t }
streams: { m: { sink: a }, n: { sink: b } }
"#,
    )
    .unwrap();
    let limits: Vec<_> = c
        .sinks
        .iter()
        .map(|s| match &s.kind {
            SinkKind::Mqtt(m) => (m.protocol, m.max_packet),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        limits,
        [(Protocol::V311, Some(262_144)), (Protocol::V5, None)]
    );
    let p = problems(
        r#"
sinks:
  a: { type: mqtt, protocol: 4, url: "mqtt://h", topic: t, max_packet_size: 10 }
  b: { type: mqtt, protocol: "3.1", url: "mqtt://h", topic: t }
  c: { type: mqtt, protocol: 3.1.1, url: "mqtt://h", topic: t, password: p, session_expiry: 1h }
  d: { type: mqtt, protocol: 3.1, url: "mqtt://h", topic: t }
"#,
    );
    for want in [
        "sinks.a.protocol: must be 5 or 3.1.1, not 4",
        "sinks.a.max_packet_size: must be between 128 and 268435455 bytes",
        "sinks.b.protocol: must be 5 or 3.1.1, not \"3.1\"",
        "sinks.c.password: MQTT 3.1.1 sends a password only with a user name",
        "sinks.c.session_expiry: applies to MQTT 5 only",
        "sinks.d.protocol: must be 5 or 3.1.1, not 3.1",
    ] {
        assert!(p.iter().any(|x| x.contains(want)), "{want} in {p:?}");
    }
}

/// A `nats` sink compiles with its defaults (port 4222, a list of servers, a name per machine and
/// sink), a subject from fields makes its streams JSON, and each mistake names its field.
#[cfg(feature = "nats")]
#[test]
fn a_nats_sink_compiles_with_its_defaults_and_every_mistake_is_named() {
    use crate::sink::nats::Auth;
    let c = load(
        r#"
sinks:
  js:
    type: nats
    url: [nats://10.0.0.1, "nats://10.0.0.2:4223"]
    subject: "plant.{stream}.{field.line}"
    stream: PLANT
    token: t0k
streams:
  m: { sink: js }
"#,
    )
    .unwrap();
    let SinkKind::Nats(n) = &c.sinks[0].kind else {
        panic!("{:?}", c.sinks[0].kind)
    };
    assert_eq!(n.servers, ["nats://10.0.0.1:4222", "nats://10.0.0.2:4223"]);
    assert!(n.tls.is_none() && !n.batch && n.stream.as_deref() == Some("PLANT"));
    assert!(matches!(&n.auth, Auth::Token(_)));
    assert!(n.name.starts_with("colibri-") && n.name.ends_with("-js"));
    assert_eq!(c.record_format("m"), crate::record::RecordFormat::Json);
    let p = problems(
        r#"
sinks:
  a: { type: nats, url: "http://h", subject: "a.*" }
  b: { type: nats, url: [nats://h, tls://g], subject: "a.{field.x}", batch: true, token: t, username: u, password: p }
  c: { type: nats, url: nats://h, subject: "a b", stream: "A.B", tls: { ca_file: ca.pem }, link: { probe: tcp } }
  d: { type: nats, url: [], subject: a, credentials_file: missing.creds }
  e: { type: nats, url: nats://h, subject: a, username: u }
"#,
    );
    for want in [
        "sinks.a.url: \"http://h\": the scheme must be nats or tls",
        "sinks.a.subject: \"a.*\": a subject cannot hold * or >",
        "sinks.b.url: mixes nats:// and tls://",
        "sinks.b.subject: names a record's field, and batch: true",
        "sinks.b.token: set with username/password: give one way",
        "sinks.c.subject: \"a b\": a subject cannot hold",
        "sinks.c.stream: \"A.B\" is not a JetStream stream name",
        "sinks.c.tls: applies to tls:// URLs only",
        "sinks.c.link.probe: does not apply: a nats sink is probed by connecting",
        "sinks.d.url: names no server",
        "sinks.e.password: missing: username needs it",
    ] {
        assert!(p.iter().any(|x| x.contains(want)), "{want} in {p:?}");
    }
    let p = problems(
        r#"
sinks:
  d: { type: nats, url: nats://h, subject: a, credentials_file: missing.creds }
"#,
    );
    assert!(
        p.iter()
            .any(|x| x.starts_with("sinks.d.credentials_file: ") && x.contains("missing.creds")),
        "{p:?}"
    );
}

/// A `kafka` sink compiles with its defaults (port 9092, a client id per machine and sink, no
/// key, no compression, Kafka's 1 MiB message limit), a key from fields makes its streams JSON,
/// and each mistake names its field.
#[cfg(feature = "kafka")]
#[test]
fn a_kafka_sink_compiles_with_its_defaults_and_every_mistake_is_named() {
    use crate::sink::kafka::{Compression, SaslMechanism};
    let c = load(
        r#"
sinks:
  k:
    type: kafka
    brokers: [10.0.0.1, "10.0.0.2:9093"]
    topic: "plant.{stream}"
    key: "{field.device}"
    compression: zstd
    sasl: { mechanism: scram-sha-512, username: u, password: p }
  plain: { type: kafka, brokers: "k1:9092", topic: t }
streams:
  m: { sink: k }
  n: { sink: plain }
"#,
    )
    .unwrap();
    let SinkKind::Kafka(k) = &c.sinks[0].kind else {
        panic!("{:?}", c.sinks[0].kind)
    };
    assert_eq!(k.brokers, ["10.0.0.1:9092", "10.0.0.2:9093"]);
    assert_eq!(k.compression, Compression::Zstd);
    assert_eq!(k.max_message, 1_048_588);
    assert!(k.tls.is_none() && !k.batch && !k.create_topic);
    assert_eq!(
        k.sasl.as_ref().map(|s| s.mechanism),
        Some(SaslMechanism::ScramSha512)
    );
    assert!(k.client_id.starts_with("colibri-") && k.client_id.ends_with("-k"));
    assert_eq!(c.record_format("m"), crate::record::RecordFormat::Json);
    assert_eq!(c.record_format("n"), crate::record::RecordFormat::Lines);
    let p = problems(
        r#"
sinks:
  a: { type: kafka, brokers: "kafka://h:9092", topic: "a/b" }
  b: { type: kafka, brokers: [h, "g:x"], topic: t, key: "{field.d}", batch: true }
  c: { type: kafka, brokers: [], topic: "{field.t}", batch: true, link: { probe: tcp } }
  d: { type: kafka, brokers: h, topic: t, sasl: { mechanism: plain, username: "", password: "" }, max_message_bytes: 0 }
  e: { type: kafka, brokers: h, topic: t, compression: brotli, tls: { ca_file: missing.pem } }
"#,
    );
    for want in [
        "sinks.a.brokers: \"kafka://h:9092\": a Kafka broker is host:port, without a scheme",
        "sinks.a.topic: \"a/b\": a topic cannot hold anything but ASCII letters",
        "sinks.b.brokers[1]: \"g:x\": the port \"x\" is not a number",
        "sinks.b.key: names a record's field, and batch: true",
        "sinks.c.brokers: names no broker",
        "sinks.c.topic: names a record's field, and batch: true",
        "sinks.c.link.probe: does not apply: a kafka sink is probed by connecting",
        "sinks.d.sasl.username: must not be empty",
        "sinks.d.sasl.password: must not be empty",
        "sinks.d.max_message_bytes: must be positive",
        "sinks.e.compression: unknown variant `brotli`",
        "sinks.e.tls.ca_file: ",
    ] {
        assert!(p.iter().any(|x| x.contains(want)), "{want} in {p:?}");
    }
}

#[test]
fn every_problem_of_a_sink_is_reported_not_only_the_first() {
    let p = problems(
        r#"
sinks:
  m: { type: mqtt, url: "mqtt://127.0.0.1", topic: t, colour: red, qos: 5, keep_alive: 30 }
  n: { type: mqtt, url: "mqtt://127.0.0.1", topic: t, qos: "1" }
"#,
    );
    let expect = [
        "sinks.m.colour: unknown field `colour`",
        "sinks.m.keep_alive: duration 30 has no unit",
        "sinks.m.qos: must be 1 or 2, not 5",
        "sinks.n.qos: expected a whole number, found the string \"1\" (write 1 without quotes)",
    ];
    assert_has(&p, &expect);
    assert_eq!(p.len(), expect.len(), "{p:#?}");
}

#[test]
fn a_number_from_a_variable_is_read_as_a_number_but_a_quoted_one_is_not() {
    let env = |k: &str| (k == "QOS").then(|| "2".to_string());
    let text = "sinks:\n  m: { type: mqtt, url: \"mqtt://127.0.0.1\", topic: t, qos: \"${QOS}\" }\nworkers: \"${W:-3}\"\n";
    let c = load_str(text, Path::new("/etc/colibri/test.yaml"), &env).unwrap();
    assert_eq!(c.workers, 3);
    let p = problems("workers: \"3\"\n");
    assert_eq!(
        p,
        ["workers: expected a whole number, found the string \"3\" (write 3 without quotes)"]
    );
}
