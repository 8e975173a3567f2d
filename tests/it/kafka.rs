//! The `kafka` sink end to end against a real Kafka-protocol broker: tansu 0.6 from crates.io with
//! its SQLite storage engine (persistent: a broker killed with kill -9 comes back with what it
//! acknowledged), built once by `scripts/test.sh` into a cache directory it reuses
//! (`COLIBRI_TEST_TANSU` names the binary). What arrived is read by PyPI's kafka-python
//! (`tests/fixtures/kafka_client.py`), a client nobody here wrote.
//!
//! Proven here: a backlog delivered while colibri is killed with kill -9 again and again and the
//! broker is killed and restarted in the middle of the drain ends in the topic with every record
//! accepted, in order in each partition, by key, duplicates only of records in flight and under
//! their own `idempotency-key`; a missing topic is an outage naming it until it is created (or is
//! created with `create_topic`); a record over `max_message_bytes` goes to the dead letters alone
//! with the reason; refused SCRAM credentials are an outage said once, ended by a reload with the
//! right ones; TLS and mutual TLS (through socat in front of the broker: tansu 0.6's own TLS
//! switches cannot be used together, see `Broker::start`).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

use crate::remote_write::{dead_letters, queue};
use crate::tsdb::free_port;
use crate::util::{Proc, Sandbox, field, poll, python, queue_stats, secs, stop, stream_stats};

/// The tansu binary: `COLIBRI_TEST_TANSU`, else where `scripts/test.sh` builds it.
fn tansu() -> String {
    if let Ok(t) = std::env::var("COLIBRI_TEST_TANSU") {
        return t;
    }
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    format!("{home}/.cache/colibri-test/tansu-0.6.0/bin/tansu")
}

/// One tansu broker on loopback with its SQLite store in `dir`.
struct Broker {
    child: Option<Child>,
    dir: PathBuf,
    /// Where it listens.
    port: u16,
    args: Vec<String>,
}

impl Broker {
    /// A broker listening on a free port and telling clients to come back at `advertised` (its
    /// own port unless a TLS front stands before it), its data in SQLite in `dir` (kept across a
    /// restart, but slow to read back: a partition of some thousand messages takes seconds) or,
    /// `memory`, in its memory; `extra`: more arguments.
    fn start(dir: &Path, advertised: Option<u16>, memory: bool, extra: &[&str]) -> Broker {
        std::fs::create_dir_all(dir).unwrap();
        let port = free_port();
        let mut args = vec![
            "broker".to_string(),
            "--listener-url".into(),
            format!("tcp://127.0.0.1:{port}"),
            "--advertised-listener-url".into(),
            format!("tcp://127.0.0.1:{}", advertised.unwrap_or(port)),
            "--storage-engine".into(),
            // Relative to the working directory (tansu joins an absolute path to it).
            if memory {
                "memory://tansu/"
            } else {
                "sqlite://tansu.db"
            }
            .into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut b = Broker {
            child: None,
            dir: dir.to_path_buf(),
            port,
            args,
        };
        b.spawn();
        b
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("broker.log"))
            .unwrap();
        let bin = tansu();
        self.child = Some(
            Command::new(&bin)
                .args(&self.args)
                .current_dir(&self.dir)
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap_or_else(|e| {
                    panic!("cannot start {bin} ({e}): scripts/test.sh builds tansu 0.6 there, or set COLIBRI_TEST_TANSU")
                }),
        );
        let port = self.port;
        poll(secs(30), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).ok()
        })
        .unwrap_or_else(|| panic!("tansu did not listen on {port}:\n{}", self.log()));
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("broker.log")).unwrap_or_default()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `kafka_client.py VERB BOOTSTRAP ARGS...`: its stdout (it must succeed).
fn client(verb: &str, port: u16, args: &[&str]) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kafka_client.py");
    let out = Command::new(python())
        .arg(script)
        .arg(verb)
        .arg(format!("127.0.0.1:{port}"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run the kafka-python fixture (scripts/test.sh installs kafka-python)");
    assert!(
        out.status.success(),
        "kafka_client.py {verb}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn create_topic(port: u16, topic: &str, partitions: u32, opts: &str) {
    client("create", port, &[topic, &partitions.to_string(), opts]);
}

/// How many messages `topic` holds (0 while the broker cannot say).
fn count(port: u16, topic: &str, opts: &str) -> u64 {
    client("count", port, &[topic, opts])
        .trim()
        .parse()
        .unwrap_or(0)
}

/// The first `n` messages of `topic` (fewer if no more come within a few seconds).
fn read(port: u16, topic: &str, n: u64, opts: &str) -> Vec<Value> {
    let opts: Value = serde_json::from_str(opts).unwrap();
    let mut opts = opts.as_object().cloned().unwrap_or_default();
    opts.insert("idle_s".into(), 5.into());
    let opts = Value::Object(opts).to_string();
    client("read", port, &[topic, &n.to_string(), &opts])
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

fn config(sb: &Sandbox, port: u16, sink: &str, streams: &str) -> PathBuf {
    sb.write_config(&format!(
        r#"data_dir: data
log: {{format: json}}
sinks:
  k:
    type: kafka
    brokers: "127.0.0.1:{port}"
    timeout: 3s
    retry: {{ max_attempts: 1 }}
    link: {{ backoff_cap: 1s }}
{sink}
streams:
{streams}
"#
    ))
}

/// Every record `0..n` there (by its `seq`), in order in each partition (a record's first copy;
/// a re-sent one may follow later), each key's records in one partition; a record more than once
/// only under its own `idempotency-key` (a job sent again after a kill -9: one whose delivery was
/// acknowledged by the broker but not yet recorded in colibri's store).
#[track_caller]
fn check_once_by_key(messages: &[Value], n: u64) {
    let mut at = std::collections::BTreeSet::new();
    for m in messages {
        assert!(
            at.insert((m["partition"].as_u64(), m["offset"].as_u64())),
            "read twice: {m}"
        );
    }
    let mut by_id: HashMap<String, Vec<u64>> = HashMap::new();
    let mut partition_of: BTreeMap<String, u64> = BTreeMap::new();
    let mut last: BTreeMap<u64, u64> = BTreeMap::new();
    for m in messages {
        let value: Value = serde_json::from_str(m["value"].as_str().unwrap()).unwrap();
        let seq = value["seq"].as_u64().expect("a seq");
        let id = m["headers"]["idempotency-key"]
            .as_str()
            .unwrap_or_else(|| panic!("a message without idempotency-key: {m}"))
            .to_string();
        let copies = by_id.entry(id.clone()).or_default();
        copies.push(seq);
        assert!(
            copies.iter().all(|s| *s == seq),
            "key {id} on different records: {copies:?}"
        );
        let key = m["key"].as_str().expect("a key").to_string();
        assert_eq!(value["dev"], key.as_str(), "{m}");
        let p = m["partition"].as_u64().unwrap();
        assert_eq!(*partition_of.entry(key.clone()).or_insert(p), p, "{key}");
        if copies.len() == 1 {
            let before = last.insert(p, seq);
            assert!(
                before.is_none_or(|b| b < seq),
                "partition {p}: record {seq} after {before:?}"
            );
        }
    }
    let seen: std::collections::BTreeSet<u64> = by_id.values().map(|c| c[0]).collect();
    let missing: Vec<u64> = (0..n).filter(|s| !seen.contains(s)).collect();
    assert!(
        missing.is_empty() && seen.len() as u64 == n,
        "{} records missing (first {:?}), {} distinct of {n}",
        missing.len(),
        &missing[..missing.len().min(10)],
        seen.len()
    );
    let extra = messages.len() - by_id.len();
    eprintln!("{} messages, {extra} of them copies", messages.len());
}

/// A backlog of `total` records (`{"dev":"d<seq % 5>","seq":<seq>}`) pushed into stream `temps`.
fn push_backlog(config: &Path, total: u64) {
    let body: String = (0..total)
        .map(|i| format!("{{\"dev\":\"d{}\",\"seq\":{i}}}\n", i % 5))
        .collect();
    let (code, _, err) = queue(config, &["push", "temps"], &body);
    assert_eq!(code, 0, "{err}");
}

/// Waits for the agent's "link down" event and returns it.
fn link_down(agent: &Proc) -> Value {
    agent.wait_for_event(secs(30), "the link down", |e| {
        field(e, "message").starts_with("link down")
    })
}

/// Runs colibri until its queue is empty (the topic holding at least `total` messages each
/// time), then reads the whole topic.
fn drain_and_read(config: &Path, port: u16, topic: &str, total: u64) -> Vec<Value> {
    for _ in 0..5 {
        let agent = Proc::start(config);
        agent.wait_until(secs(120), "every record in the topic", || {
            count(port, topic, "{}") >= total
        });
        stop(agent);
        let st = stream_stats(&queue_stats(config, &[]), "temps");
        assert_eq!(st["dead"]["records"], 0, "{st}");
        if st["ready"]["records"] == 0 && st["retry"]["records"] == 0 {
            // tansu 0.6 in memory can leave a partition's high watermark short of what it
            // acknowledged (after a producer is cut off mid-drain), so the last messages are
            // invisible to consumers until the next write (kafka-python's, below), which shows
            // that they were in the log. A marker on each partition, left out of the result.
            client("mark", port, &[topic]);
            let n = count(port, topic, "{}");
            let messages = read(port, topic, n, "{}");
            assert_eq!(messages.len() as u64, n, "the consumer read every message");
            return messages
                .into_iter()
                .filter(|m| !m["value"].as_str().is_some_and(|v| v.contains("\"mark\"")))
                .collect();
        }
    }
    panic!("the queue did not empty")
}

#[test]
fn a_backlog_arrives_by_key_in_order_through_kill_9s() {
    let sb = Sandbox::new();
    let broker = Broker::start(&sb.file("broker"), None, true, &[]);
    let port = broker.port;
    create_topic(port, "plant", 3, "{}");
    let config = config(
        &sb,
        port,
        "    topic: plant\n    key: \"{field.dev}\"\n    compression: gzip",
        "  temps: { sink: k, batch: { max_records: 100 } }",
    );
    let total = 20_000u64;
    push_backlog(&config, total);
    // Each round kills colibri once more records are in.
    let mut last = 0;
    let mut kills = 0;
    for _ in 0..6 {
        if last >= total {
            break;
        }
        let agent = Proc::run(&config);
        agent.wait_until(secs(90), "deliveries under way", || {
            let n = count(port, "plant", "{}");
            n > last + 2_000 || n >= total
        });
        agent.signal(libc::SIGKILL);
        drop(agent);
        kills += 1;
        last = count(port, "plant", "{}");
    }
    assert!(
        kills >= 3,
        "the backlog drained before colibri was killed 3 times"
    );
    let messages = drain_and_read(&config, port, "plant", total);
    check_once_by_key(&messages, total);
}

#[test]
fn a_broker_killed_and_restarted_mid_drain_keeps_what_it_acknowledged() {
    let sb = Sandbox::new();
    let mut broker = Broker::start(&sb.file("broker"), None, false, &[]);
    let port = broker.port;
    create_topic(port, "plant.temps", 3, "{}");
    // Paced, so that the broker goes down in the middle of the drain; the topic named by the
    // stream, which the link's probe cannot check (it is up once a broker answers).
    let config = config(
        &sb,
        port,
        "    topic: \"plant.{stream}\"\n    key: \"{field.dev}\"\n    replay_rate: 16KiB",
        "  temps: { sink: k, batch: { max_records: 50 } }",
    );
    let total = 3_000u64;
    push_backlog(&config, total);
    let agent = Proc::run(&config);
    agent.wait_until(secs(60), "deliveries under way", || {
        count(port, "plant.temps", "{}") > 500
    });
    broker.kill();
    let down = link_down(&agent);
    assert!(
        field(&down, "reason").contains(&format!("127.0.0.1:{port}")),
        "{down}"
    );
    broker.spawn();
    agent.wait_for_event(secs(30), "the link up", |e| {
        field(e, "message").starts_with("link up")
    });
    stop(agent);
    let messages = drain_and_read(&config, port, "plant.temps", total);
    check_once_by_key(&messages, total);
    assert!(!broker.log().contains("panicked"), "{}", broker.log());
}

#[test]
fn a_missing_topic_waits_and_a_message_over_the_limit_is_dead_lettered_alone() {
    let sb = Sandbox::new();
    let broker = Broker::start(&sb.file("broker"), None, false, &[]);
    let port = broker.port;
    let config = sb.write_config(&format!(
        r#"data_dir: data
log: {{format: json}}
sinks:
  k:
    type: kafka
    brokers: "127.0.0.1:{port}"
    topic: late
    max_message_bytes: 400
    timeout: 3s
    retry: {{ max_attempts: 1 }}
    link: {{ backoff_cap: 1s }}
  auto:
    type: kafka
    brokers: "127.0.0.1:{port}"
    topic: "made.{{stream}}"
    create_topic: true
    timeout: 3s
streams:
  temps: {{ sink: k }}
  made: {{ sink: auto }}
"#
    ));
    let body: String = (0..10)
        .map(|i| {
            let pad = if i == 4 {
                "x".repeat(1000)
            } else {
                String::new()
            };
            format!("{{\"seq\":{i},\"pad\":\"{pad}\"}}\n")
        })
        .collect();
    for stream in ["temps", "made"] {
        let (code, _, err) = queue(&config, &["push", stream], &body);
        assert_eq!(code, 0, "{err}");
    }
    let agent = Proc::run(&config);
    let down = agent.wait_for_event(secs(30), "the link down", |e| {
        field(e, "message").starts_with("link down") && field(e, "sink") == "k"
    });
    assert!(
        field(&down, "reason").contains("topic late does not exist")
            && field(&down, "reason").contains("create_topic"),
        "{down}"
    );
    // The other sink created its topic and delivered everything, the large record too.
    agent.wait_until(secs(30), "the created topic filled", || {
        count(port, "made.made", "{}") >= 10
    });
    create_topic(port, "late", 1, "{}");
    agent.wait_until(secs(30), "the topic filled once it exists", || {
        count(port, "late", "{}") >= 9
    });
    stop(agent);
    let dead = dead_letters(&config, "temps");
    assert_eq!(dead.len(), 1, "{dead:?}");
    let reason = dead[0]["last_error"].as_str().unwrap_or_default();
    assert!(
        reason.contains("record 4 of the job") && reason.contains("over max_message_bytes (400)"),
        "{}",
        dead[0]
    );
    let seqs: Vec<u64> = read(port, "late", 10, "{}")
        .iter()
        .map(|m| {
            let v: Value = serde_json::from_str(m["value"].as_str().unwrap()).unwrap();
            v["seq"].as_u64().unwrap()
        })
        .collect();
    assert_eq!(seqs, [0, 1, 2, 3, 5, 6, 7, 8, 9]);
}

#[test]
fn refused_credentials_are_an_outage_said_once_until_a_reload_brings_the_right_ones() {
    let sb = Sandbox::new();
    // The user is made while the broker asks no credentials (its store keeps it), then the broker
    // starts again asking them.
    let mut open = Broker::start(&sb.file("broker"), None, false, &[]);
    let made = Command::new(tansu())
        .args(["user", "create", "--mechanism", "scram512", "--broker"])
        .arg(format!("tcp://127.0.0.1:{}", open.port))
        .args(["gw", "right"])
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    open.kill();
    let broker = Broker::start(&sb.file("broker"), None, false, &["--authentication"]);
    let port = broker.port;
    let sasl = |password: &str| {
        format!(
            "    topic: plant\n    key: \"{{field.dev}}\"\n    sasl: {{ mechanism: scram-sha-512, username: gw, password: {password} }}"
        )
    };
    let opts = r#"{"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "gw", "sasl_plain_password": "right"}"#;
    create_topic(port, "plant", 1, opts);
    let config = config(&sb, port, &sasl("wrong"), "  temps: { sink: k }");
    push_backlog(&config, 20);
    let agent = Proc::start(&config);
    let down = link_down(&agent);
    assert!(
        field(&down, "reason").contains("authentication refused"),
        "{down}"
    );
    // The probes go on failing (every second, `backoff_cap`); the log says it once.
    std::thread::sleep(secs(4));
    let loud = agent.events_where(|e| matches!(field(e, "level"), "WARN" | "ERROR"));
    assert_eq!(loud.len(), 1, "{loud:#?}");
    // The right password, by a reload: everything arrives.
    std::fs::write(
        &config,
        std::fs::read_to_string(&config)
            .unwrap()
            .replace("password: wrong", "password: right"),
    )
    .unwrap();
    agent.signal(libc::SIGHUP);
    agent.wait_until(secs(30), "every record in the topic", || {
        count(port, "plant", opts) >= 20
    });
    stop(agent);
    let st = stream_stats(&queue_stats(&config, &[]), "temps");
    assert_eq!(st["dead"]["records"], 0, "no attempt was spent: {st}");
    let messages = read(port, "plant", 20, opts);
    check_once_by_key(&messages, 20);
    assert_eq!(messages.len(), 20, "no kill, no copy");
}

/// A socat process, killed when dropped (a failed test leaves none behind).
struct Front(Child);

impl Drop for Front {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// socat on `port` in front of the broker's plain port `to`: TLS with the test PKI's server
/// certificate, a client certificate of its CA required.
fn tls_front(sb: &Sandbox, pki: &crate::util::http::TestPki, port: u16, to: u16) -> Front {
    let listen = format!(
        "openssl-listen:{port},bind=127.0.0.1,reuseaddr,fork,cert={},key={},verify=1,cafile={}",
        pki.server_cert.display(),
        pki.server_key.display(),
        pki.ca.display()
    );
    let child = Command::new("socat")
        .arg(listen)
        .arg(format!("tcp:127.0.0.1:{to}"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(sb.file("socat.log")).unwrap())
        .spawn()
        .expect("socat (scripts/test.sh installs Debian's socat)");
    let front = Front(child);
    poll(secs(10), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).ok()
    })
    .expect("socat listens");
    front
}

#[test]
fn tls_and_mutual_tls_reach_the_broker() {
    let sb = Sandbox::new();
    std::fs::create_dir_all(sb.file("pki")).unwrap();
    let pki = crate::util::http::TestPki::generate(&sb.file("pki"));
    // The broker tells clients to come back through the front: its port is chosen first.
    let front_port = free_port();
    let broker = Broker::start(&sb.file("broker"), Some(front_port), false, &[]);
    let _front = tls_front(&sb, &pki, front_port, broker.port);
    let opts = serde_json::json!({
        "security_protocol": "SSL",
        "ssl_cafile": pki.ca,
        "ssl_certfile": pki.client_cert,
        "ssl_keyfile": pki.client_key,
    })
    .to_string();
    create_topic(front_port, "plant", 1, &opts);
    let tls = |cert: bool| {
        let mut t = format!(
            "    topic: plant\n    tls:\n      ca_file: {}\n",
            pki.ca.display()
        );
        if cert {
            t.push_str(&format!(
                "      client_cert: {}\n      client_key: {}\n",
                pki.client_cert.display(),
                pki.client_key.display()
            ));
        }
        t
    };
    // Without a client certificate the front refuses the handshake: an outage.
    let config_no_cert = config(&sb, front_port, &tls(false), "  temps: { sink: k }");
    push_backlog(&config_no_cert, 10);
    let agent = Proc::start(&config_no_cert);
    let down = link_down(&agent);
    // The server's alert, as the client read it.
    assert!(
        field(&down, "reason").contains("CertificateRequired"),
        "{down}"
    );
    stop(agent);
    assert_eq!(count(front_port, "plant", &opts), 0, "nothing went through");
    let st = stream_stats(&queue_stats(&config_no_cert, &[]), "temps");
    assert_eq!(st["ready"]["records"], 10, "{st}");
    let config = config(&sb, front_port, &tls(true), "  temps: { sink: k }");
    let agent = Proc::start(&config);
    agent.wait_until(secs(30), "every record in the topic", || {
        count(front_port, "plant", &opts) >= 10
    });
    stop(agent);
}
