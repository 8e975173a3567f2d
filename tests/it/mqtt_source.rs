//! The `mqtt` source against Debian's `mosquitto` (installed by `scripts/test.sh`), started by
//! each test on a loopback port with persistence and `max_queued_messages 0` (mosquitto keeps
//! only 1,000 messages for a client that is away unless told otherwise). Messages are published
//! by rumqttc (`util::mqtt_publish`), which counts what the broker acknowledged; records are
//! checked where they arrive: the test receiver, each job counted once by its idempotency key.
//!
//! Proven here: 100,000 QoS 1 messages published while colibri is kill -9'd and restarted ten
//! times all end in the stream, first arrivals in order (but where a restart's redelivery
//! interleaves, within the window), and what arrives twice is bounded by
//! what could be committed and not yet acknowledged at each kill; a full `block` stream stops the
//! acknowledgements and the broker holds the rest, nothing lost; QoS 0 messages a full stream
//! cannot take are dropped and counted, the identity `received = stored + dropped` holding, and
//! those still unstored at a stop are counted lost (`received = stored + dropped + lost`); the
//! records' shape (JSON payloads kept as JSON, text as a string, binary as base64), routes to a
//! second stream, messages published while colibri was stopped waiting in its session, a filter
//! added by a reload subscribed in the kept session, a reload while more than the memory budget
//! waits for room (prompt, nothing lost), and QoS 2 over TLS with a test CA after a wrong
//! password (one WARN, nothing stored) fixed by a reload; two agents on one host with a source of
//! one name and no `client_id`, each with its own session and every message; and a session
//! holding another agent's subscription named in the WARN.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rumqttc::QoS;
use serde_json::Value;

use crate::mqtt::{Broker, password_file};
use crate::syslog::{delivered, wait_delivered};
use crate::tsdb::free_port;
use crate::util::http::{Mode, Receiver, TestPki};
use crate::util::mqtt_publish::{Publish, publish};
use crate::util::{Proc, Sandbox, field, poll, quote, secs, stop};

/// A stream `logs` (`stream`: more settings) delivered to `rx`, fed by an mqtt source `floor`
/// subscribed to `plant/#` on `url` (`source`: more settings).
fn config(sb: &Sandbox, rx: &Receiver, url: &str, stream: &str, source: &str) -> PathBuf {
    sb.write_config(&format!(
        r#"data_dir: data
shutdown_grace: 2s
log: {{ format: json }}
admin: {{ listen: "127.0.0.1:0" }}
sinks:
  up:
    type: http
    url: {rx_url}
    retry: {{ base: 100ms, cap: 200ms }}
    link: {{ down_after: 2, backoff_base: 50ms, backoff_cap: 200ms }}
  up2: {{ type: http, url: {temps_url} }}
streams:
  logs: {{ sink: up, batch: {{ max_records: 100, linger: 20ms }}{stream} }}
  temps: {{ sink: up2 }}
sources:
  floor: {{ type: mqtt, url: "{url}", topics: ["plant/#"], stream: logs, client_id: colibri-test-floor{source} }}
"#,
        rx_url = quote(rx.url("/in")),
        temps_url = quote(rx.url("/temps")),
    ))
}

fn broker(sb: &Sandbox, extra: &str) -> Broker {
    Broker::start(
        &sb.file("broker"),
        &format!("allow_anonymous true\n{extra}"),
    )
}

/// Starts colibri and waits until its source has subscribed (`n`-th time in this log).
fn start(config: &Path) -> Proc {
    let agent = Proc::start(config);
    subscribed(&agent, 1);
    agent
}

fn subscribed(agent: &Proc, n: usize) {
    agent.wait_until(secs(30), "the mqtt source subscribed", || {
        agent
            .events_where(|e| field(e, "message") == "mqtt source subscribed")
            .len()
            >= n
    });
}

/// Publishes `count` messages `{"seq":i}` from `first` to `topic`; returns how many the broker
/// acknowledged.
fn send(b: &Broker, topic: &str, first: u64, count: u64) -> u64 {
    let p = Publish {
        client_id: format!("test-pub-{first}"),
        first,
        ..Publish::new(b.port, topic, count)
    };
    send_padded(&p, "", secs(120))
}

/// Publishes `p`'s messages `{"seq":i}`, with `"pad":pad` when `pad` is not empty; returns how
/// many the broker acknowledged.
fn send_padded(p: &Publish, pad: &str, limit: Duration) -> u64 {
    let accepted = Arc::new(AtomicU64::new(0));
    let payload = |i| {
        if pad.is_empty() {
            format!("{{\"seq\":{i}}}").into_bytes()
        } else {
            format!("{{\"seq\":{i},\"pad\":\"{pad}\"}}").into_bytes()
        }
    };
    publish(p, payload, &accepted, limit).unwrap_or_else(|e| panic!("publishing: {e}"));
    accepted.load(Ordering::SeqCst)
}

/// The `seq` of each record from `topic`, in arrival order.
fn seqs(records: &[Value], topic: &str) -> Vec<u64> {
    records
        .iter()
        .filter(|r| r["topic"] == topic)
        .map(|r| r["payload"]["seq"].as_u64().expect("a seq"))
        .collect()
}

/// Per life of the agent (the lives `killed_at` ended, then the last), how many of the records
/// from `topic` it stored were stored again by a later copy: a copy is the life's whose `received`
/// is after the kills before it and not after the one that ended it.
fn repeated_per_life(records: &[Value], topic: &str, killed_at: &[String]) -> Vec<u64> {
    let mut lives: std::collections::BTreeMap<u64, Vec<usize>> = Default::default();
    for r in records.iter().filter(|r| r["topic"] == topic) {
        let received = r["received"].as_str().expect("a received time");
        let life = killed_at.iter().filter(|k| k.as_str() < received).count();
        let seq = r["payload"]["seq"].as_u64().expect("a seq");
        lives.entry(seq).or_default().push(life);
    }
    let mut repeated = vec![0; killed_at.len() + 1];
    for copies in lives.values_mut() {
        copies.sort_unstable();
        for &life in &copies[..copies.len() - 1] {
            repeated[life] += 1;
        }
    }
    repeated
}

/// The `mqtt source summary` event of the stop.
fn summary(agent: &Proc) -> Value {
    agent
        .events_where(|e| field(e, "message") == "mqtt source summary")
        .pop()
        .unwrap_or_else(|| panic!("no mqtt source summary:\n{}", agent.stderr()))
}

/// A counter of the source, read from the admin endpoint.
fn metric(agent: &Proc, name: &str) -> u64 {
    let e = agent.wait_for_event(secs(20), "admin endpoint listening", |e| {
        field(e, "message") == "admin endpoint listening"
    });
    let addr = field(&e, "listen").parse().expect("an address");
    let a = crate::util::client::Client::new(addr)
        .request("GET", "/metrics", &[], None)
        .expect("GET /metrics");
    let text = a.text();
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{name}{{source=\"floor\"}}")))
        .unwrap_or_else(|| panic!("no {name} in\n{text}"));
    let v: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    v as u64
}

fn n(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("no {key} in {v}"))
}

#[test]
fn records_keep_their_payloads_shape_route_by_topic_and_wait_in_the_session_while_colibri_is_stopped()
 {
    let sb = Sandbox::new();
    let rx = Receiver::start();
    let b = broker(&sb, "");
    let url = format!("mqtt://127.0.0.1:{}", b.port);
    let cfg = config(
        &sb,
        &rx,
        &url,
        "",
        ", routes: [{ topic: 'plant/+/temp', stream: temps }], labels: { site: north }",
    );
    let agent = start(&cfg);
    let pubs: &[(&str, &[u8])] = &[
        ("plant/l1/temp", b"{\"t\": 21.5,\n \"unit\": \"C\"}"),
        ("plant/l1/state", b"pump on"),
        ("plant/l1/raw", &[0xff, 0x00, 0x7f]),
        ("plant/l1/count", b"42"),
    ];
    for (topic, payload) in pubs {
        // Through a file: a payload may hold any byte.
        let file = sb.file("payload");
        std::fs::write(&file, payload).unwrap();
        let mut c = std::process::Command::new("mosquitto_pub");
        c.args([
            "-h",
            "127.0.0.1",
            "-p",
            &b.port.to_string(),
            "-q",
            "1",
            "-t",
            topic,
            "-f",
        ])
        .arg(&file);
        let f = crate::util::finish(c, secs(10));
        assert!(f.status.success(), "mosquitto_pub: {}", f.stderr);
    }
    let records = wait_delivered(&rx, &agent, 4, secs(30));
    let by_topic = |t: &str| -> Value {
        records
            .iter()
            .find(|r| r["topic"] == t)
            .cloned()
            .unwrap_or_else(|| panic!("no record of {t}: {records:?}"))
    };
    let t = by_topic("plant/l1/temp");
    assert_eq!(t["payload"], serde_json::json!({"t": 21.5, "unit": "C"}));
    assert_eq!(
        (t["qos"].as_u64(), t["retain"].as_bool()),
        (Some(1), Some(false))
    );
    assert_eq!(t["labels"]["site"], "north");
    assert!(t["received"].as_str().unwrap().ends_with('Z'), "{t}");
    assert_eq!(by_topic("plant/l1/state")["payload"], "pump on");
    let raw = by_topic("plant/l1/raw");
    assert_eq!(
        (raw["payload"].as_str(), raw["encoding"].as_str()),
        (Some("/wB/"), Some("base64"))
    );
    assert_eq!(by_topic("plant/l1/count")["payload"], 42);
    // The route: the temperature went to `temps` (its sink posts to /temps), the rest to `logs`.
    let topics_at = |path: &str| -> Vec<String> {
        rx.requests()
            .iter()
            .filter(|r| r.status == Some(200) && r.path == path)
            .flat_map(|r| r.records())
            .map(|t| {
                serde_json::from_str::<Value>(&t).unwrap()["topic"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect()
    };
    assert_eq!(topics_at("/temps"), ["plant/l1/temp"]);
    assert_eq!(topics_at("/in").len(), 3, "{:?}", topics_at("/in"));
    // Stopped: what is published meanwhile waits in colibri's session.
    let agent = stop(agent);
    assert_eq!(n(&summary(&agent), "records_appended"), 4);
    assert_eq!(send(&b, "plant/away", 0, 2_000), 2_000);
    let agent = start(&cfg);
    let records = wait_delivered(&rx, &agent, 2_004, secs(60));
    assert_eq!(
        seqs(&records, "plant/away"),
        (0..2_000).collect::<Vec<_>>(),
        "each once, in order"
    );
    // A topic filter added by a reload is subscribed, though the broker kept the session.
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(
        &cfg,
        text.replace(
            r#"topics: ["plant/#"]"#,
            r#"topics: ["plant/#", "meters/#"]"#,
        ),
    )
    .unwrap();
    agent.signal(libc::SIGHUP);
    subscribed(&agent, 2);
    assert_eq!(send(&b, "meters/m1", 0, 10), 10);
    let records = wait_delivered(&rx, &agent, 2_014, secs(30));
    assert_eq!(seqs(&records, "meters/m1"), (0..10).collect::<Vec<_>>());
    let s = summary(&stop(agent));
    assert_eq!(n(&s, "acks_lost"), 0, "{s}");
}

#[test]
fn kill_9_in_a_loop_while_publishing_loses_no_acknowledged_message() {
    let sb = Sandbox::new();
    let rx = Receiver::start();
    let b = broker(&sb, "");
    let url = format!("mqtt://127.0.0.1:{}", b.port);
    const MAX_IN_FLIGHT: u64 = 200;
    let cfg = config(
        &sb,
        &rx,
        &url,
        "",
        &format!(", max_in_flight: {MAX_IN_FLIGHT}"),
    );
    let mut agent = start(&cfg);
    const N: u64 = 100_000;
    let publisher = {
        let port = b.port;
        std::thread::spawn(move || {
            let p = Publish {
                rate: Some(4_000),
                ..Publish::new(port, "plant/flood", N)
            };
            send_padded(&p, "", secs(300))
        })
    };
    // Ten kills at moments spread over the flood (pseudo-random, from the clock), each after
    // the restarted source has subscribed again.
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64;
    let mut kills = 0;
    // When each kill was sent, in the records' `received` format: a record received before it was
    // stored by the life it ended, one received after by a later life.
    let mut killed_at = Vec::new();
    while kills < 10 {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        std::thread::sleep(Duration::from_millis(300 + (seed >> 33) % 1_200));
        killed_at.push(chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true));
        agent.signal(libc::SIGKILL);
        agent.wait_exit(secs(10));
        kills += 1;
        agent = start(&cfg);
    }
    let accepted = publisher.join().expect("the publisher finished");
    assert_eq!(accepted, N, "the broker acknowledged every message");
    // Every message once (repeats count towards no total), then what the stop leaves delivered.
    let mut unique = 0;
    poll(secs(180), || {
        let got = seqs(&delivered(&rx), "plant/flood");
        unique = got
            .into_iter()
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        (unique as u64 == N).then_some(())
    })
    .unwrap_or_else(|| panic!("{unique} of {N} messages arrived:\n{}", agent.stderr()));
    // The last life had no connection break: every ack it owed went out.
    let agent = stop(agent);
    let s = summary(&agent);
    let warnings = agent.events_where(|e| field(e, "level") != "INFO");
    assert_eq!(
        (n(&s, "records_lost"), n(&s, "acks_lost")),
        (0, 0),
        "{s}\n{warnings:#?}"
    );
    let records = delivered(&rx);
    let got = seqs(&records, "plant/flood");
    let mut seen = std::collections::BTreeSet::new();
    let firsts: Vec<u64> = got.iter().copied().filter(|s| seen.insert(*s)).collect();
    let missing: Vec<u64> = (0..N).filter(|s| !seen.contains(s)).collect();
    assert!(
        missing.is_empty(),
        "{} acknowledged messages missing: {:?}",
        missing.len(),
        &missing[..missing.len().min(20)]
    );
    let disorder: Vec<(usize, u64, u64)> = firsts
        .windows(2)
        .enumerate()
        .filter(|(_, w)| w[0] > w[1])
        .map(|(i, w)| (i, w[0], w[1]))
        .collect();
    // In order but where a restart's redelivery interleaves (mosquitto 2.0 sends some new
    // messages before the in-flight ones it sends again): within the window, once per kill.
    assert!(
        disorder.len() as u64 <= kills && disorder.iter().all(|(_, a, b)| a - b <= MAX_IN_FLIGHT),
        "first arrivals out of order beyond a restart's window: {disorder:?}"
    );
    // What a life stored and a later copy repeats was committed and not yet acknowledged when
    // that life was killed: colibri never has more than `max_in_flight` of those, whatever the
    // broker sends (mosquitto 2.0 sends far more than the Receive Maximum once acks flow).
    let repeated = repeated_per_life(&records, "plant/flood", &killed_at);
    let twice = got.len() as u64 - N;
    assert_eq!(repeated.iter().sum::<u64>(), twice, "{repeated:?}");
    assert!(
        repeated.iter().all(|&r| r <= MAX_IN_FLIGHT),
        "a life left more than max_in_flight ({MAX_IN_FLIGHT}) messages stored and not acknowledged at its kill: stored again, per life: {repeated:?}"
    );
    eprintln!(
        "kill -9 x{kills} in a flood of {N}: {twice} stored twice (per life {repeated:?}), first arrivals out of order at {disorder:?}"
    );
}

#[test]
fn a_full_block_stream_stops_the_acknowledgements_and_the_broker_holds_the_rest() {
    let sb = Sandbox::new();
    let rx = Receiver::start();
    rx.set_mode(Mode::Refuse);
    let b = broker(&sb, "");
    let url = format!("mqtt://127.0.0.1:{}", b.port);
    // Jobs of at most 100 records, 5 of them: the stream is full at 500.
    let cfg = config(
        &sb,
        &rx,
        &url,
        ", max_jobs: 5, when_full: block",
        ", max_in_flight: 50",
    );
    let agent = start(&cfg);
    const N: u64 = 5_000;
    assert_eq!(send(&b, "plant/full", 0, N), N);
    agent.wait_until(secs(30), "acknowledgements paused", || {
        agent.stderr().contains("acknowledgements paused")
    });
    // Paused: the broker holds what colibri has not acknowledged. colibri received what the
    // stream took (500), what waits for room (one append) and the broker's window (50).
    std::thread::sleep(Duration::from_secs(1));
    let received = metric(&agent, "colibri_mqtt_source_messages_total");
    assert!(
        received < 1_000,
        "{received} of {N} received while the stream was full"
    );
    rx.set_mode(Mode::Accept);
    let records = wait_delivered(&rx, &agent, N as usize, secs(120));
    assert_eq!(
        seqs(&records, "plant/full"),
        (0..N).collect::<Vec<_>>(),
        "each once, in order"
    );
    let s = summary(&stop(agent));
    assert_eq!(
        (
            n(&s, "messages"),
            n(&s, "records_appended"),
            n(&s, "records_dropped"),
            n(&s, "acks_lost"),
        ),
        (N, N, 0, 0),
        "every message received once: none was dropped while the stream was full ({s})"
    );
}

/// colibri with a QoS 0 source into a full `block` stream (`rx` refusing), flooded until it drops:
/// 100,000 messages of ~200 bytes, more than the 8 MiB it holds while the stream is full.
fn qos_0_flood_into_a_full_stream(sb: &Sandbox, rx: &Receiver) -> (Broker, Proc) {
    rx.set_mode(Mode::Refuse);
    let b = broker(sb, "");
    let url = format!("mqtt://127.0.0.1:{}", b.port);
    let cfg = config(sb, rx, &url, ", max_jobs: 5, when_full: block", ", qos: 0");
    let agent = start(&cfg);
    let p = Publish {
        qos: QoS::AtMostOnce,
        ..Publish::new(b.port, "plant/q0", 100_000)
    };
    send_padded(&p, &"x".repeat(180), secs(120));
    agent.wait_until(secs(60), "QoS 0 drops", || {
        agent
            .stderr()
            .contains("QoS 0 messages are dropped and counted")
    });
    (b, agent)
}

#[test]
fn qos_0_messages_a_full_stream_cannot_take_are_dropped_and_counted() {
    let sb = Sandbox::new();
    let rx = Receiver::start();
    let (_broker, agent) = qos_0_flood_into_a_full_stream(&sb, &rx);
    // Every message read is stored or counted dropped, once the stream has room again.
    rx.set_mode(Mode::Accept);
    let mut last = 0;
    poll(secs(120), || {
        std::thread::sleep(Duration::from_millis(500));
        let now = delivered(&rx).len();
        let settled = now == last && now > 0;
        last = now;
        settled.then_some(())
    })
    .expect("deliveries settle");
    let s = summary(&stop(agent));
    let (messages, stored, dropped) = (
        n(&s, "messages"),
        n(&s, "records_appended"),
        n(&s, "qos0_dropped"),
    );
    assert!(dropped > 0, "{s}");
    assert_eq!(messages, stored + dropped, "{s}");
    assert_eq!(delivered(&rx).len() as u64, stored);
    eprintln!("QoS 0 into a full stream: {messages} received, {stored} stored, {dropped} dropped");
}

#[test]
fn qos_0_messages_still_unstored_at_a_stop_are_counted_lost() {
    let sb = Sandbox::new();
    let rx = Receiver::start();
    let (_broker, agent) = qos_0_flood_into_a_full_stream(&sb, &rx);
    // Stopped while the stream is still full: what was read and waits for room is lost with the
    // process, and must be counted so.
    let s = summary(&stop(agent));
    let (messages, stored, dropped, lost) = (
        n(&s, "messages"),
        n(&s, "records_appended"),
        n(&s, "qos0_dropped"),
        n(&s, "records_lost"),
    );
    assert!(lost > 0, "messages were waiting for room at the stop: {s}");
    assert_eq!(messages, stored + dropped + lost, "{s}");
    eprintln!(
        "QoS 0 at a stop with a full stream: {messages} received, {stored} stored, {dropped} dropped, {lost} lost"
    );
}

#[test]
fn qos_2_over_tls_with_a_test_ca_and_a_wrong_password_fixed_by_a_reload() {
    let sb = Sandbox::new();
    let rx = Receiver::start();
    std::fs::create_dir(sb.file("pki")).unwrap();
    let pki = TestPki::generate(&sb.file("pki"));
    let pw = password_file(&sb, "gateway", "s3cret");
    let tls_port = free_port();
    let b = Broker::start(
        &sb.file("broker"),
        &format!(
            "allow_anonymous false\npassword_file {pw}\nlistener {tls_port} 127.0.0.1\ncafile {}\ncertfile {}\nkeyfile {}",
            pki.ca.display(),
            pki.server_cert.display(),
            pki.server_key.display(),
            pw = pw.display(),
        ),
    );
    let url = format!("mqtts://localhost:{tls_port}");
    let source = |password: &str| {
        format!(
            ", qos: 2, username: gateway, password: {password}, tls: {{ ca_file: {} }}",
            quote(pki.ca.display().to_string())
        )
    };
    let cfg = config(&sb, &rx, &url, "", &source("wrong"));
    let agent = Proc::start(&cfg);
    agent.wait_until(secs(30), "the refusal", || {
        agent.stderr().contains("refused colibri's credentials")
    });
    std::thread::sleep(Duration::from_secs(3));
    let warns = agent
        .events_where(|e| field(e, "level") == "WARN" && field(e, "source") == "floor")
        .len();
    assert_eq!(warns, 1, "one WARN for the outage:\n{}", agent.stderr());
    // The right password, by reload.
    let fixed = config(&sb, &rx, &url, "", &source("s3cret"));
    assert_eq!(fixed, cfg);
    agent.signal(libc::SIGHUP);
    subscribed(&agent, 1);
    // The publisher uses the plain listener, with the same password file.
    let p = Publish {
        qos: QoS::ExactlyOnce,
        credentials: Some(("gateway", "s3cret")),
        ..Publish::new(b.port, "plant/secure", 100)
    };
    assert_eq!(send_padded(&p, "", secs(60)), 100);
    let records = wait_delivered(&rx, &agent, 100, secs(30));
    // QoS 2 end to end: PUBRECed after the commit, each once.
    assert_eq!(seqs(&records, "plant/secure"), (0..100).collect::<Vec<_>>());
    assert!(
        records.iter().all(|r| r["qos"] == 2),
        "{:?}",
        records.first()
    );
    let s = summary(&stop(agent));
    assert!(n(&s, "connection_failures") >= 1, "{s}");
    assert_eq!(n(&s, "records_appended"), 100, "{s}");
}

#[test]
fn a_reload_while_more_than_the_budget_waits_for_room_is_prompt_and_loses_nothing() {
    let sb = Sandbox::new();
    let rx = Receiver::start();
    rx.set_mode(Mode::Refuse);
    let b = broker(&sb, "");
    let url = format!("mqtt://127.0.0.1:{}", b.port);
    // 2,000 messages of 10 KiB in flight: more than the 8 MiB colibri holds unacknowledged, so
    // its reading waits for room in a full stream.
    let cfg = config(
        &sb,
        &rx,
        &url,
        ", max_jobs: 5, when_full: block",
        ", max_in_flight: 2000",
    );
    let agent = start(&cfg);
    const N: u64 = 2_000;
    let pad = "x".repeat(10 << 10);
    assert_eq!(
        send_padded(&Publish::new(b.port, "plant/big", N), &pad, secs(120)),
        N
    );
    agent.wait_until(secs(30), "acknowledgements paused", || {
        agent.stderr().contains("acknowledgements paused")
    });
    // A reload that changes the source stops it and starts it again: promptly, though its
    // reading waits for room and its appender for the stream.
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(
        &cfg,
        text.replace("max_in_flight: 2000", "max_in_flight: 1999"),
    )
    .unwrap();
    agent.signal(libc::SIGHUP);
    subscribed(&agent, 2);
    // Nothing was lost: what was not acknowledged comes again to the new session.
    rx.set_mode(Mode::Accept);
    // Counted by sequence number: the reload repeats what was committed and not acknowledged,
    // so the records reach N before the last messages do.
    let mut unique = std::collections::BTreeSet::new();
    poll(secs(120), || {
        unique = seqs(&delivered(&rx), "plant/big").into_iter().collect();
        (unique.len() as u64 >= N).then_some(())
    });
    assert_eq!(unique, (0..N).collect(), "every message arrives");
    stop(agent);
}

/// An agent of its own (`data_dir` in `sb`) posting to `rx`, with a source `floor` of `plant/#` on
/// `url` and no `client_id` unless `source` (more settings) gives one.
fn agent_config(sb: &Sandbox, rx: &Receiver, url: &str, source: &str) -> PathBuf {
    sb.write_config(&format!(
        r#"data_dir: data
shutdown_grace: 2s
log: {{ format: json }}
sinks:
  up: {{ type: http, url: {rx_url}, retry: {{ base: 100ms, cap: 200ms }} }}
streams:
  logs: {{ sink: up, batch: {{ max_records: 100, linger: 20ms }} }}
sources:
  floor: {{ type: mqtt, url: "{url}", topics: ["plant/#"], stream: logs{source} }}
"#,
        rx_url = quote(rx.url("/in")),
    ))
}

/// Two agents on one host, each with its own `data_dir` and a source of one name and no
/// `client_id`, subscribed to one topic with the broker keeping their sessions: each has its own
/// session, so each stores every message, those published while it was stopped included, and
/// neither takes the other's. (With one default client id for both, the second agent resumed the
/// first's session, and a message published while both were away went to whichever came back
/// first: the other never had it.)
#[test]
fn two_agents_on_one_host_each_keep_their_own_session_and_messages() {
    let (sa, sb) = (Sandbox::new(), Sandbox::new());
    let (rxa, rxb) = (Receiver::start(), Receiver::start());
    let b = broker(&sa, "");
    let url = format!("mqtt://127.0.0.1:{}", b.port);
    let (ca, cb) = (
        agent_config(&sa, &rxa, &url, ""),
        agent_config(&sb, &rxb, &url, ""),
    );
    // Each makes its session, one after the other.
    stop(start(&ca));
    let first_b = stop(start(&cb));
    // Published while both are stopped: each session keeps a copy.
    assert_eq!(send(&b, "plant/away", 0, 10), 10);
    let a_now = start(&ca);
    let records = wait_delivered(&rxa, &a_now, 10, secs(30));
    assert_eq!(seqs(&records, "plant/away"), (0..10).collect::<Vec<_>>());
    // A has taken its copy: B's is still in B's session.
    let b_now = start(&cb);
    let records = wait_delivered(&rxb, &b_now, 10, secs(30));
    assert_eq!(seqs(&records, "plant/away"), (0..10).collect::<Vec<_>>());
    // Both running: each has every message, neither throws the other off.
    assert_eq!(send(&b, "plant/both", 0, 10), 10);
    for (rx, agent) in [(&rxa, &a_now), (&rxb, &b_now)] {
        let records = wait_delivered(rx, agent, 20, secs(30));
        assert_eq!(seqs(&records, "plant/both"), (0..10).collect::<Vec<_>>());
    }
    let (a_now, b_now) = (stop(a_now), stop(b_now));
    for agent in [&a_now, &b_now] {
        let taken = agent.events_where(|e| field(e, "message").contains("took over"));
        assert!(taken.is_empty(), "{taken:#?}");
        let s = summary(agent);
        assert_eq!((n(&s, "connects"), n(&s, "unsubscribed")), (1, 0), "{s}");
        assert_eq!(n(&s, "records_appended"), 20, "{s}");
    }
    // B's first connect made a new session; A's was not there to resume.
    let made = first_b
        .events_where(|e| field(e, "message") == "mqtt source subscribed")
        .pop()
        .expect("subscribed");
    assert_eq!(made["session_present"], false, "{made}");
}

/// An agent given the `client_id` another agent used (a copied config) resumes that agent's
/// session, with the other's subscription in it: a message of that subscription is acknowledged
/// and dropped, and the WARN says that the session holds a subscription this config did not make,
/// perhaps another agent's, and names the client id (kept as written), so the operator can tell.
/// (MQTT does not list a session's subscriptions, and mosquitto 2.0.11 closes the connection a
/// newcomer takes over without a DISCONNECT saying so: such a message is the broker's sign.)
#[test]
fn a_session_with_another_agents_subscription_is_named_in_the_warning() {
    let (sa, sb) = (Sandbox::new(), Sandbox::new());
    let rx = Receiver::start();
    let b = broker(&sa, "");
    let url = format!("mqtt://127.0.0.1:{}", b.port);
    let first = agent_config(&sa, &rx, &url, ", client_id: copied-gw");
    let text = std::fs::read_to_string(&first).unwrap();
    std::fs::write(&first, text.replace(r#"["plant/#"]"#, r#"["meters/#"]"#)).unwrap();
    stop(start(&first));
    let copied = start(&agent_config(&sb, &rx, &url, ", client_id: copied-gw"));
    assert_eq!(send(&b, "meters/m1", 0, 1), 1);
    let warned = copied.wait_for_event(secs(30), "the foreign subscription reported", |e| {
        field(e, "message").starts_with("a message of no configured topic filter")
    });
    assert_eq!(field(&warned, "client_id"), "copied-gw", "{warned}");
    assert!(
        field(&warned, "message").contains("another agent's"),
        "{warned}"
    );
    let s = summary(&stop(copied));
    assert_eq!(
        (n(&s, "unsubscribed"), n(&s, "records_appended")),
        (1, 0),
        "{s}"
    );
}
