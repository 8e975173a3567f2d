//! Ingest benchmark: clients POST NDJSON batches to the real binary's ingest API as fast as it
//! answers; a record counts once its request was answered 200 (durable: fsync'd). Prints, per
//! scenario, records/s acknowledged, request latency, colibri's peak resident memory and its CPU
//! seconds per million records. Figures, not assertions: see BENCHMARKS.md.
//!
//!   cargo bench --bench ingest
//!   BENCH_SECS=5 cargo bench --bench ingest                           # quicker
//!   COLIBRI_BIN=path/to/static/colibri cargo bench --bench ingest     # measure another build
//!
//! Records are 200 bytes, batches of 100 (a 20 KB body), default `ingest:` settings. Scenarios,
//! each on a fresh store for BENCH_SECS (10) seconds after a one-second warm-up:
//! - 1 client, the stream only queues;
//! - 64 clients, the stream only queues (the budget: >= 100,000 records/s);
//! - 64 clients, the stream delivered to a local HTTP receiver at the same time;
//! - 64 clients posting line protocol (`text/plain`, each point checked and stamped) to a stream
//!   whose sink has `encoding: influx_line` (unreachable, so it only queues).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[path = "../tests/it/util/client.rs"]
mod client;
mod common;
#[path = "../tests/it/util/http/mod.rs"]
mod http;

use client::Client;
use common::{bin, cores, cpu_secs, env_u64, log_lines, rss_kib, spawn_run, stop, wait_log};
use http::Receiver;

const STREAM: &str = "bench";
const RECORD_BYTES: usize = 200;
const BATCH: usize = 100;

fn main() {
    let secs = env_u64("BENCH_SECS", 10);
    let base = PathBuf::from(
        std::env::var("BENCH_DIR").unwrap_or_else(|_| env!("CARGO_TARGET_TMPDIR").into()),
    )
    .join("ingest-bench");
    println!(
        "colibri ingest benchmark ({} cores; records of {RECORD_BYTES} bytes in batches of {BATCH}; {secs} s per scenario; files under {})",
        cores(),
        base.display()
    );
    println!("binary: {}", bin());
    println!();
    for (name, clients, deliver, lp) in [
        ("1 client, queue only", 1, false, false),
        ("64 clients, queue only", 64, false, false),
        (
            "64 clients, delivered to a local receiver meanwhile",
            64,
            true,
            false,
        ),
        (
            "64 clients, line protocol into an influx_line stream, queue only",
            64,
            false,
            true,
        ),
    ] {
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).expect("create the bench directory");
        let receiver = deliver.then(Receiver::start_counting);
        let port = free_port();
        let sink = match (&receiver, lp) {
            (Some(r), _) => Some(format!("{{ type: http, url: \"{}\" }}", r.url("/in"))),
            // Nothing listens on port 9: the link is down and the stream only queues.
            (None, true) => Some(
                "{ type: http, url: \"http://127.0.0.1:9/write\", encoding: influx_line, precision: ms }"
                    .into(),
            ),
            (None, false) => None,
        };
        let cfg = write_config(&base, port, sink);
        run(
            name,
            &cfg,
            port,
            clients,
            Duration::from_secs(secs),
            receiver.as_ref(),
            lp,
        );
    }
    // A scenario leaves a gigabyte or more of queued records behind.
    let _ = std::fs::remove_dir_all(&base);
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("an address").port()
}

fn write_config(dir: &Path, port: u16, sink: Option<String>) -> PathBuf {
    let path = dir.join("colibri.yaml");
    let (sinks, sink) = match sink {
        Some(spec) => (format!("sinks:\n  up: {spec}\n"), "sink: up, "),
        None => (String::new(), ""),
    };
    let text = format!(
        "data_dir: {}\n\
         storage: {{ min_free: 512MiB, max_bytes: 8GiB }}\n\
         log: {{ level: info, format: json }}\n\
         ingest: {{ listen: \"127.0.0.1:{port}\" }}\n\
         {sinks}\
         streams:\n  \
           {STREAM}: {{ {sink}batch: {{ max_records: 1000, max_bytes: 1MiB }}, max_jobs: 10000000, max_bytes: 4GiB }}\n",
        dir.join("data").display()
    );
    std::fs::write(&path, text).expect("write config");
    path
}

/// One client's batch: 100 records of 200 bytes (with the client's number and a sequence), NDJSON;
/// or 100 line-protocol points of 200 bytes without a timestamp (colibri adds one, 14 bytes).
fn body(client: usize, lp: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(BATCH * (RECORD_BYTES + 1));
    for seq in 0..BATCH {
        let (head, tail) = if lp {
            (
                format!("bench,client={client} seq={seq}i,value=0.5,pad=\""),
                &b"\""[..],
            )
        } else {
            (
                format!("{{\"client\":{client},\"seq\":{seq},\"pad\":\""),
                &b"\"}"[..],
            )
        };
        let mut r = head.into_bytes();
        r.resize(RECORD_BYTES - tail.len(), b'x');
        r.extend_from_slice(tail);
        out.extend_from_slice(&r);
        out.push(b'\n');
    }
    out
}

/// What one client saw in the measured window.
#[derive(Default)]
struct Seen {
    acked: u64,
    refused: u64,
    failed: u64,
    /// The first refusal, to show.
    first_refusal: Option<String>,
    latencies_us: Vec<u32>,
}

fn client(
    i: usize,
    addr: SocketAddr,
    lp: bool,
    measuring: Arc<AtomicBool>,
    done: Arc<AtomicBool>,
) -> Seen {
    let body = body(i, lp);
    let ctype = if lp {
        "text/plain"
    } else {
        "application/x-ndjson"
    };
    let mut c = Client::new(addr);
    let mut seen = Seen::default();
    while !done.load(Ordering::Relaxed) {
        let t = Instant::now();
        let answer = c.post(&format!("/v1/streams/{STREAM}/records"), ctype, &[], &body);
        if !measuring.load(Ordering::Relaxed) {
            continue;
        }
        match answer {
            Ok(a) if a.status == 200 => {
                seen.acked += BATCH as u64;
                seen.latencies_us
                    .push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
            }
            Ok(a) => {
                seen.refused += 1;
                if seen.first_refusal.is_none() {
                    seen.first_refusal = Some(format!("{} {}", a.status, a.text()));
                }
            }
            Err(_) => seen.failed += 1,
        }
    }
    seen
}

fn run(
    name: &str,
    cfg: &Path,
    port: u16,
    clients: usize,
    window: Duration,
    receiver: Option<&Receiver>,
    lp: bool,
) {
    println!("== {name}");
    let mut child = spawn_run(cfg);
    let pid = child.id();
    let _logs = log_lines(&mut child);
    wait_log(&_logs, "colibri started", Duration::from_secs(60));
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let measuring = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..clients)
        .map(|i| {
            let (m, d) = (Arc::clone(&measuring), Arc::clone(&done));
            std::thread::spawn(move || client(i, addr, lp, m, d))
        })
        .collect();
    // Warm-up: connections opened, the first commits done.
    std::thread::sleep(Duration::from_secs(1));
    let (cpu0, t0) = (cpu_secs(pid), Instant::now());
    let delivered0 = receiver.map_or(0, |r| r.counts().1);
    measuring.store(true, Ordering::Relaxed);
    std::thread::sleep(window);
    measuring.store(false, Ordering::Relaxed);
    let secs = t0.elapsed().as_secs_f64();
    let cpu = cpu_secs(pid) - cpu0;
    let delivered = receiver.map_or(0, |r| r.counts().1) - delivered0;
    done.store(true, Ordering::Relaxed);
    let mut all = Seen::default();
    for t in threads {
        let s = t.join().expect("a client thread");
        all.acked += s.acked;
        all.refused += s.refused;
        all.failed += s.failed;
        all.first_refusal = all.first_refusal.or(s.first_refusal);
        all.latencies_us.extend(s.latencies_us);
    }
    let (_, hwm) = rss_kib(pid);
    stop(child);
    all.latencies_us.sort_unstable();
    let pct = |p: f64| -> f64 {
        let v = &all.latencies_us;
        if v.is_empty() {
            return 0.0;
        }
        v[((v.len() - 1) as f64 * p) as usize] as f64 / 1000.0
    };
    println!(
        "  {} records acknowledged in {secs:.2} s: {:.0} records/s ({:.0} requests/s, {:.1} MB/s); {} refused, {} failed requests",
        all.acked,
        all.acked as f64 / secs,
        all.latencies_us.len() as f64 / secs,
        all.acked as f64 * RECORD_BYTES as f64 / 1e6 / secs,
        all.refused,
        all.failed,
    );
    if let Some(r) = &all.first_refusal {
        println!("  first refusal: {r}");
    }
    println!(
        "  latency per request: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        pct(0.5),
        pct(0.99),
        pct(1.0)
    );
    if receiver.is_some() {
        println!(
            "  delivered meanwhile: {delivered} records ({:.0} records/s)",
            delivered as f64 / secs
        );
    }
    println!(
        "  colibri: peak RSS {:.1} MB, {cpu:.2} CPU-s ({:.2} CPU-s per million records acknowledged)",
        hwm as f64 / 1024.0,
        cpu / all.acked.max(1) as f64 * 1e6
    );
    println!();
}
