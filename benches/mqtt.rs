//! The `mqtt` sink against a real broker (Debian's `mosquitto`, on a loopback port, persistence
//! off, no subscriber): a backlog of `BENCH_RECORDS` (default 1,000,000) JSON records queued with
//! `colibri queue push` while no agent runs (the state after an outage), then drained by `colibri
//! run`, once publishing a message per record and once a message per job (`batch: true`), both at
//! QoS 1 (every message PUBACKed before a job counts as delivered); then the online path: the agent
//! running while `BENCH_ONLINE` (default 200,000) records arrive through the ingest API in bodies
//! of 1,000. Printed per run: records per second, colibri's CPU seconds per million records and its
//! peak resident memory (VmHWM). The http sink's figures for the same backlog are the `backlog` and
//! `delivery` benchmarks'.
//!
//! Run: `cargo bench --bench mqtt` (`COLIBRI_BIN=<static build>` to measure the release binary,
//! `BENCH_RECORDS=...`, `BENCH_ONLINE=...`, `BENCH_DIR=...` for where the files go).

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
    .join("mqtt-bench");
    println!(
        "colibri mqtt benchmark ({} cores; {records} records backlog, {online} online; files under {})",
        cores(),
        base.display()
    );
    println!("binary: {}", bin());
    let body = lines(records);
    for (name, batch) in [("a message per record", false), ("batch: true", true)] {
        let dir = base.join(if batch { "batch" } else { "record" });
        let run = Run::new(&dir, batch);
        run.push(&body);
        run.measure(&format!("drain, {name}"), records, |_| {});
    }
    let dir = base.join("online");
    let run = Run::new(&dir, false);
    run.measure("online via ingest, a message per record", online, |addr| {
        let bodies = lines(online);
        let all: Vec<&str> = bodies.lines().collect();
        for chunk in all.chunks(1000) {
            post(addr, &(chunk.join("\n") + "\n"));
        }
    });
}

/// `n` JSON records of about 60 bytes.
fn lines(n: u64) -> String {
    let mut out = String::with_capacity(n as usize * 64);
    for i in 0..n {
        out.push_str(&format!(
            "{{\"seq\":{i},\"host\":\"h{}\",\"temperature\":{}}}\n",
            i % 100,
            i % 1000
        ));
    }
    out
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
    fn new(dir: &Path, batch: bool) -> Run {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).expect("bench dir");
        let port = free_port();
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
        let mut broker = Command::new(bin)
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("mosquitto (Debian's package; scripts/test.sh installs it)");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                let _ = broker.kill();
                panic!("mosquitto did not listen within 10 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let config = dir.join("colibri.yaml");
        std::fs::write(
            &config,
            format!(
                "data_dir: {}\nlog: {{ format: json }}\ningest: {{ listen: \"127.0.0.1:0\" }}\nsinks:\n  broker: {{ type: mqtt, url: \"mqtt://127.0.0.1:{port}\", topic: \"bench/{{stream}}\", batch: {batch} }}\nstreams:\n  m: {{ sink: broker }}\n",
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

/// POSTs an ndjson body to stream `m`; the answer must be 200.
fn post(addr: SocketAddr, body: &str) {
    let mut s = std::net::TcpStream::connect(addr).expect("connect to ingest");
    write!(
        s,
        "POST /v1/streams/m/records HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-ndjson\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut answer = String::new();
    s.read_to_string(&mut answer).expect("answer");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}
