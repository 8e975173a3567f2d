//! Lanes benchmark (issue 33): what `replay: live_first` buys and costs, against `oldest_first`,
//! with the real binary, its ingest API as the live producer and the test HTTP receiver as the
//! sink. Figures, not assertions: see BENCHMARKS.md.
//!
//!   cargo bench --bench lanes
//!   BENCH_BACKLOG=200000 BENCH_DRAIN_SECS=60 BENCH_BIG=1000000 cargo bench --bench lanes
//!   COLIBRI_BIN=path/to/static/colibri cargo bench --bench lanes
//!
//! For each order, two runs on a fresh data directory:
//! - paced: a backlog of BENCH_BACKLOG records (66 bytes each, 1000 a job, pushed while the agent
//!   is stopped and older than the live window when it starts) drained under a `replay_rate` that
//!   takes about BENCH_DRAIN_SECS, while a producer posts 50 records a second: each live record's
//!   latency from its acknowledgement by ingest to its arrival at the receiver (p50, p99, max) and
//!   the drain's length;
//! - unpaced: a backlog of BENCH_BIG records drained as fast as the receiver takes it, with the same
//!   producer: the drain's length, colibri's CPU seconds per million records and its peak resident
//!   memory (VmHWM), which must not grow with the lanes on.

use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[path = "../tests/it/util/client.rs"]
mod client;
mod common;
#[path = "../tests/it/util/http/mod.rs"]
mod http;

use common::{bin, cores, cpu_secs, env_u64, log_lines, rss_kib, spawn_run, stop, wait_log};
use http::Receiver;

/// Jobs younger than this are live.
const WINDOW: Duration = Duration::from_secs(5);
const LIVE_FROM: u64 = 1_000_000_000;

fn main() {
    let backlog = env_u64("BENCH_BACKLOG", 200_000);
    let drain = env_u64("BENCH_DRAIN_SECS", 60);
    let big = env_u64("BENCH_BIG", 1_000_000);
    let base = PathBuf::from(
        std::env::var("BENCH_DIR").unwrap_or_else(|_| env!("CARGO_TARGET_TMPDIR").into()),
    )
    .join("lanes-bench");
    println!(
        "colibri lanes benchmark ({} cores; files under {})",
        cores(),
        base.display()
    );
    println!("binary: {}\n", bin());
    let record_bytes = rec(0).len() as u64 + 1;
    let rate = backlog * record_bytes / drain.max(1);
    for order in ["oldest_first", "live_first"] {
        let r = run(&base.join(order), order, backlog, Some(rate));
        r.print(&format!(
            "{order}, paced: {backlog} records at {rate} B/s, 50 live/s"
        ));
    }
    for order in ["oldest_first", "live_first"] {
        let r = run(&base.join(order), order, big, None);
        r.print(&format!("{order}, unpaced: {big} records, 50 live/s"));
    }
}

fn rec(seq: u64) -> String {
    format!(r#"{{"seq":{seq},"msg":"reading {seq} of the test sensor","unit":"celsius"}}"#)
}

/// What one run measured.
struct Run {
    backlog: u64,
    drain: Duration,
    live: Vec<Duration>,
    cpu: f64,
    peak_kib: u64,
}

impl Run {
    fn print(&self, what: &str) {
        let mut l = self.live.clone();
        l.sort_unstable();
        let q = |q: f64| l[((l.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e3;
        println!("== {what}");
        if l.is_empty() {
            println!("   drain {:.1} s", self.drain.as_secs_f64());
        } else {
            println!(
                "   drain {:.1} s; live latency over {} records: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
                self.drain.as_secs_f64(),
                l.len(),
                q(0.5),
                q(0.99),
                q(1.0)
            );
        }
        println!(
            "   colibri: {:.2} CPU-s ({:.2} per 1M backlog records), peak RSS {:.1} MB\n",
            self.cpu,
            self.cpu * 1e6 / self.backlog as f64,
            self.peak_kib as f64 / 1024.0
        );
    }
}

fn config(dir: &Path, port: u16, url: &str, order: &str, rate: Option<u64>) -> PathBuf {
    let rate = rate.map_or(String::new(), |r| format!(", replay_rate: {r}"));
    let yaml = format!(
        "data_dir: {data}\n\
         log: {{ format: json, level: info }}\n\
         ingest: {{ listen: \"127.0.0.1:{port}\" }}\n\
         sinks:\n  up: {{ type: http, url: \"{url}\"{rate} }}\n\
         streams:\n  logs: {{ sink: up, replay: {order}, live_window: {w}s, \
         max_jobs: 10000000, max_bytes: 4GiB }}\n",
        data = dir.join("data").display(),
        w = WINDOW.as_secs(),
    );
    let path = dir.join("colibri.yaml");
    std::fs::write(&path, yaml).expect("write the config");
    path
}

/// One drain of `backlog` records in `order`, paced at `rate` bytes a second or not at all.
fn run(dir: &Path, order: &str, backlog: u64, rate: Option<u64>) -> Run {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).expect("create the run's directory");
    // The paced runs keep every request (the latencies); the big ones only count.
    let rx = if rate.is_some() {
        Receiver::start()
    } else {
        Receiver::start_counting()
    };
    let port = free_port();
    let config = config(dir, port, &rx.url("/ingest"), order, rate);
    push(&config, backlog);
    let pushed = Instant::now();
    while pushed.elapsed() <= WINDOW {
        std::thread::sleep(WINDOW.saturating_sub(pushed.elapsed()) + Duration::from_millis(10));
    }
    // Delivery starts before the start-up is logged: timed from the spawn.
    let started = Instant::now();
    let mut child = spawn_run(&config);
    let logs = log_lines(&mut child);
    wait_log(&logs, "colibri started", Duration::from_secs(60));
    let done = Arc::new(AtomicBool::new(false));
    let producer = {
        let done = Arc::clone(&done);
        std::thread::spawn(move || produce(port, &done))
    };
    // The backlog drained: every record of it, and what was produced so far, arrived.
    let drained = loop {
        let (_, records, _) = rx.counts();
        if records >= backlog && rx_backlog_done(&rx, backlog, rate.is_some()) {
            break started.elapsed();
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    done.store(true, Ordering::Relaxed);
    let acked = producer.join().expect("the producer");
    let want = backlog + acked.len() as u64;
    rx.wait_count(want, Duration::from_secs(120))
        .expect("every live record arrives");
    let cpu = cpu_secs(child.id());
    let (_, peak_kib) = rss_kib(child.id());
    stop(child);
    let live = if rate.is_some() {
        latencies(&rx, &acked)
    } else {
        Vec::new()
    };
    Run {
        backlog,
        drain: drained,
        live,
        cpu,
        peak_kib,
    }
}

/// Whether the whole backlog arrived (with a storing receiver, by the records' numbers; a
/// counting one only counts, and the live records are few beside a big backlog).
fn rx_backlog_done(rx: &Receiver, backlog: u64, storing: bool) -> bool {
    if !storing {
        return true;
    }
    let backlog_seen = rx
        .records()
        .iter()
        .filter(|r| seq_of(r) < LIVE_FROM)
        .count() as u64;
    backlog_seen >= backlog
}

fn seq_of(record: &str) -> u64 {
    serde_json::from_str::<serde_json::Value>(record)
        .ok()
        .and_then(|v| v["seq"].as_u64())
        .expect("a record of the bench")
}

/// Each live record's time from its acknowledgement to its arrival.
fn latencies(rx: &Receiver, acked: &HashMap<u64, Instant>) -> Vec<Duration> {
    let mut out = Vec::new();
    for r in rx.requests().iter().filter(|r| r.status == Some(200)) {
        for l in r.records() {
            if let Some(at) = acked.get(&seq_of(&l)) {
                out.push(r.at.saturating_duration_since(*at));
            }
        }
    }
    out
}

/// `colibri queue push` of `n` records into `logs`, 1000 a job.
fn push(config: &Path, n: u64) {
    let started = Instant::now();
    let mut child = Command::new(bin())
        .args(["queue", "push", "logs", "--batch", "1000", "--config"])
        .arg(config)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("colibri queue push");
    {
        let mut stdin = std::io::BufWriter::new(child.stdin.take().expect("piped"));
        for seq in 0..n {
            writeln!(stdin, "{}", rec(seq)).expect("write a record");
        }
    }
    assert!(child.wait().expect("queue push").success(), "queue push");
    println!(
        "   (pushed {n} records in {:.1} s)",
        started.elapsed().as_secs_f64()
    );
}

/// Posts a record every 20 ms until `done`; returns when each was acknowledged.
fn produce(port: u16, done: &AtomicBool) -> HashMap<u64, Instant> {
    let mut c = client::Client::new(SocketAddr::from(([127, 0, 0, 1], port)));
    let start = Instant::now();
    let mut acked = HashMap::new();
    let mut i = 0u64;
    // Bounded: at most an hour of records.
    while !done.load(Ordering::Relaxed) && i < 180_000 {
        let next = start + Duration::from_millis(20 * i);
        if let Some(d) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
        let seq = LIVE_FROM + i;
        let body = format!("{}\n", rec(seq));
        let a = c
            .post(
                "/v1/streams/logs/records",
                "application/x-ndjson",
                &[],
                body.as_bytes(),
            )
            .expect("ingest answers");
        assert_eq!(a.status, 200, "ingest: {}", a.text());
        acked.insert(seq, Instant::now());
        i += 1;
    }
    acked
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}
