//! The broker sinks against real brokers on loopback ports: `mqtt` to Debian's `mosquitto`
//! (persistence off, no subscriber) at QoS 1, in MQTT 5 and in 3.1.1 (`protocol: 3.1.1`), and
//! `nats` to Debian's `nats-server` with JetStream (a file-backed stream, one replica), `kafka` to
//! tansu 0.6 (a Kafka-protocol broker from crates.io, in memory, that `scripts/test.sh` builds
//! into its cache; `COLIBRI_TEST_TANSU` names it), one partition, the idempotent producer with
//! `acks=all`, and the mqtt
//! sink as a Sparkplug B edge node (`encoding: sparkplug_b`, MQTT 5, QoS 1; line-protocol records
//! of 10 devices with 2 metrics each, a DDATA per device per job). For each:
//! a backlog of `BENCH_RECORDS` (default 1,000,000) JSON records queued with `colibri queue push`
//! while no agent runs (the state after an outage), then drained by `colibri run`, once
//! publishing a message per record and once a message per job (`batch: true`); then the online
//! path, both ways: the agent running while `BENCH_ONLINE` (default 200,000) records arrive
//! through the ingest API in bodies of 1,000. A job counts as delivered only when every message of
//! it is acknowledged (PUBACK, PubAck, a Produce answer). Printed per run: records per second, colibri's CPU seconds
//! per million records and its peak resident memory (VmHWM). The http sink's figures for a
//! backlog are the `backlog` and `delivery` benchmarks'.
//!
//! Run: `cargo bench --bench brokers` (`COLIBRI_BIN=<static build>` to measure the release binary,
//! `BENCH_RECORDS=...`, `BENCH_ONLINE=...`, `BENCH_ONLY=mqtt|mqtt-3.1.1|nats|kafka|sparkplug`,
//! `BENCH_DIR=...`).

use std::io::{Read as _, Write as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

mod common;

use common::{bin, cores, cpu_secs, log_lines, metric, rss_kib, spawn_run, stop};

fn main() {
    let records = common::env_u64("BENCH_RECORDS", 1_000_000);
    let online = common::env_u64("BENCH_ONLINE", 200_000);
    let base = PathBuf::from(
        std::env::var("BENCH_DIR").unwrap_or_else(|_| env!("CARGO_TARGET_TMPDIR").into()),
    )
    .join("brokers-bench");
    println!(
        "colibri broker sinks benchmark ({} cores; {records} records backlog, {online} online; files under {})",
        cores(),
        base.display()
    );
    println!("binary: {}", bin());
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    for kind in [
        Kind::Mqtt,
        Kind::Mqtt311,
        Kind::Nats,
        Kind::Kafka,
        Kind::Sparkplug,
    ] {
        if !only.is_empty() && only != kind.name() {
            continue;
        }
        let body = lines(kind, records);
        for &(name, batch) in kind.ways() {
            let dir = base.join(format!(
                "{}-{}",
                kind.name(),
                if batch { "batch" } else { "record" }
            ));
            let run = Run::new(&dir, kind, batch);
            run.push(&body);
            run.measure(&format!("{} drain, {name}", kind.name()), records, |_| {});
        }
        for &(name, batch) in kind.ways() {
            let dir = base.join(format!(
                "{}-online-{}",
                kind.name(),
                if batch { "batch" } else { "record" }
            ));
            let run = Run::new(&dir, kind, batch);
            run.measure(
                &format!("{} online via ingest, {name}", kind.name()),
                online,
                |addr| {
                    let bodies = lines(kind, online);
                    let all: Vec<&str> = bodies.lines().collect();
                    for chunk in all.chunks(1000) {
                        post(addr, kind, &(chunk.join("\n") + "\n"));
                    }
                },
            );
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Mqtt,
    Mqtt311,
    Nats,
    Kafka,
    Sparkplug,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Mqtt => "mqtt",
            Kind::Mqtt311 => "mqtt-3.1.1",
            Kind::Nats => "nats",
            Kind::Kafka => "kafka",
            Kind::Sparkplug => "sparkplug",
        }
    }

    /// The ways a job is published: a message per record and per job, or Sparkplug's only way.
    fn ways(self) -> &'static [(&'static str, bool)] {
        match self {
            Kind::Sparkplug => &[("a DDATA per device per job", false)],
            _ => &[("a message per record", false), ("batch: true", true)],
        }
    }
}

/// `n` records of about 60 bytes: JSON, or for Sparkplug line protocol (10 devices, 2 metrics).
fn lines(kind: Kind, n: u64) -> String {
    let mut out = String::with_capacity(n as usize * 64);
    if matches!(kind, Kind::Sparkplug) {
        let t0 = 1_800_000_000_000u64;
        for i in 0..n {
            out.push_str(&format!(
                "m,unit=pump{} temperature={}.5,seq={i}i {}\n",
                i % 10,
                i % 1000,
                t0 + i
            ));
        }
        return out;
    }
    for i in 0..n {
        out.push_str(&format!(
            "{{\"seq\":{i},\"host\":\"h{}\",\"temperature\":{}}}\n",
            i % 100,
            i % 1000
        ));
    }
    out
}

/// A mosquitto without persistence, listening on `port`.
fn mosquitto(dir: &Path, port: u16) -> Child {
    let conf = dir.join("mosquitto.conf");
    std::fs::write(
        &conf,
        format!("listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"),
    )
    .expect("mosquitto.conf");
    let bin = ["/usr/sbin/mosquitto", "mosquitto"]
        .into_iter()
        .find(|b| Path::new(b).exists())
        .unwrap_or("mosquitto");
    let broker = Command::new(bin)
        .arg("-c")
        .arg(&conf)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("mosquitto (Debian's package; scripts/test.sh installs it)");
    wait_listening(port, broker)
}

/// A nats-server with JetStream in `dir`, listening on `port`, with the stream BENCH (bench.>,
/// file storage, one replica) created.
fn nats(dir: &Path, port: u16) -> Child {
    let bin = ["/usr/sbin/nats-server", "nats-server"]
        .into_iter()
        .find(|b| Path::new(b).exists())
        .unwrap_or("nats-server");
    let server = Command::new(bin)
        .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
        .arg(dir.join("js"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nats-server (Debian's package; scripts/test.sh installs it)");
    let server = wait_listening(port, server);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(async {
            let client = async_nats::connect(format!("nats://127.0.0.1:{port}"))
                .await
                .expect("connect to nats-server");
            async_nats::jetstream::new(client)
                .create_stream(async_nats::jetstream::stream::Config {
                    name: "BENCH".into(),
                    subjects: vec!["bench.>".into()],
                    ..Default::default()
                })
                .await
                .expect("create the stream");
        });
    server
}

/// tansu (a Kafka-protocol broker) keeping its log in memory, listening on `port`.
fn tansu(dir: &Path, port: u16) -> Child {
    let bin = std::env::var("COLIBRI_TEST_TANSU").unwrap_or_else(|_| {
        let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
        format!("{home}/.cache/colibri-test/tansu-0.6.0/bin/tansu")
    });
    let url = format!("tcp://127.0.0.1:{port}");
    let broker = Command::new(&bin)
        .args([
            "broker",
            "--listener-url",
            &url,
            "--advertised-listener-url",
            &url,
        ])
        .args(["--storage-engine", "memory://tansu/"])
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{bin} ({e}): scripts/test.sh builds tansu there"));
    wait_listening(port, broker)
}

fn wait_listening(port: u16, mut child: Child) -> Child {
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the broker did not listen on {port} within 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("an address")
        .port()
}

struct Run {
    dir: PathBuf,
    config: PathBuf,
    broker: Child,
}

impl Run {
    fn new(dir: &Path, kind: Kind, batch: bool) -> Run {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).expect("bench dir");
        let port = free_port();
        let (broker, sink) = match kind {
            Kind::Mqtt | Kind::Mqtt311 => (
                mosquitto(dir, port),
                format!(
                    "{{ type: mqtt, url: \"mqtt://127.0.0.1:{port}\", topic: \"bench/{{stream}}\", batch: {batch}, protocol: {} }}",
                    if matches!(kind, Kind::Mqtt) {
                        "5"
                    } else {
                        "3.1.1"
                    }
                ),
            ),
            Kind::Sparkplug => (
                mosquitto(dir, port),
                format!(
                    "{{ type: mqtt, url: \"mqtt://127.0.0.1:{port}\", encoding: sparkplug_b, sparkplug: {{ group_id: bench, edge_node_id: gw, device: \"tag:unit\" }} }}"
                ),
            ),
            Kind::Kafka => (
                tansu(dir, port),
                format!(
                    "{{ type: kafka, brokers: \"127.0.0.1:{port}\", topic: \"bench.{{stream}}\", create_topic: true, batch: {batch} }}"
                ),
            ),
            Kind::Nats => (
                nats(dir, port),
                format!(
                    "{{ type: nats, url: \"nats://127.0.0.1:{port}\", subject: \"bench.{{stream}}\", stream: BENCH, batch: {batch} }}"
                ),
            ),
        };
        let config = dir.join("colibri.yaml");
        std::fs::write(
            &config,
            format!(
                "data_dir: {}\nlog: {{ format: json }}\ningest: {{ listen: \"127.0.0.1:0\" }}\nsinks:\n  broker: {sink}\nstreams:\n  m: {{ sink: broker }}\n",
                dir.join("data").display(),
            ),
        )
        .expect("config");
        Run {
            dir: dir.to_path_buf(),
            config,
            broker,
        }
    }

    fn push(&self, body: &str) {
        let mut push = Command::new(bin())
            .args(["queue", "push", "m", "--config"])
            .arg(&self.config)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("colibri queue push");
        push.stdin
            .take()
            .expect("stdin")
            .write_all(body.as_bytes())
            .expect("push the backlog");
        assert!(push.wait().expect("push").success(), "queue push failed");
    }

    /// Runs the agent until `n` records are delivered (after `feed`, given its log lines) and
    /// prints the figures.
    fn measure(mut self, name: &str, n: u64, feed: impl FnOnce(SocketAddr)) {
        let t0 = Instant::now();
        let mut child = spawn_run(&self.config);
        let pid = child.id();
        let logs = log_lines(&mut child);
        let (ingest, admin) = addrs(&logs);
        feed(ingest);
        let delivered = || {
            metric(
                admin,
                "colibri_stream_delivered_records_total{stream=\"m\"}",
            )
            .unwrap_or(0.0) as u64
        };
        let limit = Duration::from_secs(900);
        let mut peak_kib = 0;
        while delivered() < n && t0.elapsed() < limit {
            peak_kib = peak_kib.max(rss_kib(pid).1);
            std::thread::sleep(Duration::from_millis(100));
        }
        let secs = t0.elapsed().as_secs_f64();
        let got = delivered();
        let cpu = cpu_secs(pid);
        peak_kib = peak_kib.max(rss_kib(pid).1);
        stop(child);
        let _ = self.broker.kill();
        let _ = self.broker.wait();
        assert!(
            got >= n,
            "{name}: only {got} of {n} delivered within {limit:?}"
        );
        println!(
            "{name}: {got} records in {secs:.2} s = {:.0} records/s; CPU {cpu:.2} s = {:.2} CPU-s per million; peak RSS {:.1} MB",
            got as f64 / secs,
            cpu / got as f64 * 1e6,
            peak_kib as f64 / 1024.0,
        );
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The ingest listener's and the admin endpoint's addresses, from their start-up log lines.
fn addrs(logs: &Receiver<String>) -> (SocketAddr, SocketAddr) {
    let (mut ingest, mut admin) = (None, None);
    let deadline = Instant::now() + Duration::from_secs(60);
    while ingest.is_none() || admin.is_none() {
        let left = deadline
            .checked_duration_since(Instant::now())
            .expect("colibri logged its listeners within 60 s");
        let line = logs.recv_timeout(left).expect("a log line");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        let listen = || -> SocketAddr {
            v["fields"]["listen"]
                .as_str()
                .or(v["listen"].as_str())
                .expect("the line names its address")
                .parse()
                .expect("an address")
        };
        if line.contains("ingest listening") {
            ingest = Some(listen());
        } else if line.contains("admin endpoint listening") {
            admin = Some(listen());
        }
    }
    (ingest.expect("seen"), admin.expect("seen"))
}

/// POSTs a body of records (ndjson, or line protocol for Sparkplug) to stream `m`; the answer must
/// be 200.
fn post(addr: SocketAddr, kind: Kind, body: &str) {
    let mut s = std::net::TcpStream::connect(addr).expect("connect to ingest");
    let content_type = match kind {
        Kind::Sparkplug => "text/plain",
        _ => "application/x-ndjson",
    };
    write!(
        s,
        "POST /v1/streams/m/records HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut answer = String::new();
    s.read_to_string(&mut answer).expect("answer");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}
