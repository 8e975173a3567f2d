//! Delivery benchmark: the real binary forwarding a stream to a local HTTP receiver that acknowledges
//! at once (tests/it/util/http in counting mode). Prints, for each scenario, records/s delivered,
//! colibri's peak resident memory, and its CPU seconds per million records. Figures, not assertions:
//! see BENCHMARKS.md.
//!
//!   cargo bench --bench delivery
//!   BENCH_RECORDS=200000 cargo bench --bench delivery                  # quicker
//!   COLIBRI_BIN=path/to/static/colibri cargo bench --bench delivery    # measure another build
//!
//! Scenarios, each on a fresh store pre-filled in-process with BENCH_RECORDS (1,000,000) records of
//! 200 bytes in jobs of 1,000:
//! - link up: colibri starts with the receiver accepting and delivers the backlog (the online rate:
//!   there is no ingest API yet to feed it while it delivers);
//! - after an outage: the receiver refuses, colibri starts, the link goes down; then the receiver
//!   accepts, and the figure is the drain from that moment (probe delay included) to the last record;
//! - the same outage with `concurrency: 4`;
//! - the same outage with `replay_rate: 8MiB` (the pacing must hold the rate).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod common;
#[path = "../tests/it/util/http/mod.rs"]
mod http;

use colibri::clock::now_ms;
use colibri::config;
use colibri::store::{OpenOptions, RecordBuf, Store};
use common::{bin, cores, cpu_secs, env_u64, log_lines, rss_kib, spawn_run, stop, wait_log};
use http::{Mode, Receiver};

const STREAM: &str = "metrics";
const RECORD_BYTES: usize = 200;
const JOB_RECORDS: u64 = 1000;

fn main() {
    let records = env_u64("BENCH_RECORDS", 1_000_000);
    let base = PathBuf::from(
        std::env::var("BENCH_DIR").unwrap_or_else(|_| env!("CARGO_TARGET_TMPDIR").into()),
    )
    .join("delivery-bench");
    println!(
        "colibri delivery benchmark ({} cores; {records} records of {RECORD_BYTES} bytes in jobs of {JOB_RECORDS}; files under {})",
        cores(),
        base.display()
    );
    println!("binary: {}", bin());
    println!();
    let scenarios: [(&str, bool, &str); 4] = [
        ("link up from the start, concurrency 1", false, ""),
        ("after an outage, concurrency 1", true, ""),
        ("after an outage, concurrency 4", true, "concurrency: 4, "),
        (
            "after an outage, replay_rate 8MiB/s",
            true,
            "replay_rate: 8MiB, ",
        ),
    ];
    for (name, outage, extra) in scenarios {
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).expect("create the bench directory");
        let receiver = Receiver::start_counting();
        let cfg = write_config(&base, &receiver.url("/ingest"), extra);
        fill(&cfg, records);
        run(name, &cfg, &receiver, records, outage);
    }
}

fn write_config(dir: &Path, url: &str, extra: &str) -> PathBuf {
    let path = dir.join("colibri.yaml");
    let text = format!(
        "data_dir: {}\n\
         storage: {{ min_free: 512MiB, max_bytes: 8GiB }}\n\
         log: {{ level: info, format: json }}\n\
         sinks:\n  \
           up: {{ type: http, url: \"{url}\", {extra}link: {{ backoff_base: 200ms, backoff_cap: 1s }} }}\n\
         streams:\n  \
           {STREAM}: {{ sink: up, batch: {{ max_records: {JOB_RECORDS}, max_bytes: 1MiB }}, max_jobs: 10000000, max_bytes: 4GiB }}\n",
        dir.join("data").display()
    );
    std::fs::write(&path, text).expect("write config");
    path
}

fn record(seq: u64) -> Vec<u8> {
    let mut r = format!("{{\"seq\":{seq:012},\"pad\":\"").into_bytes();
    r.resize(RECORD_BYTES - 2, b'x');
    r.extend_from_slice(b"\"}");
    r
}

/// Appends `records` in-process, one job per commit.
fn fill(cfg: &Path, records: u64) {
    let c = config::load(cfg).unwrap_or_else(|e| panic!("{}: {e}", cfg.display()));
    std::fs::create_dir_all(&c.data_dir).expect("create data_dir");
    let mut s = Store::open(&c.data_dir, c.storage, &c.streams, OpenOptions::default())
        .expect("open the store");
    let mut seq = 0;
    while seq < records {
        let n = (records - seq).min(JOB_RECORDS * 10);
        let recs: RecordBuf = (seq..seq + n).map(record).collect();
        let mut tx = s.transaction().expect("transaction");
        tx.append(STREAM, &recs, None, now_ms()).expect("append");
        tx.commit().expect("commit");
        seq += n;
    }
    drop(s);
}

fn run(name: &str, cfg: &Path, receiver: &Receiver, records: u64, outage: bool) {
    println!("== {name}");
    if outage {
        receiver.set_mode(Mode::Refuse);
    }
    // Without an outage the backlog starts draining as soon as colibri runs: timed from the spawn.
    let spawned = Instant::now();
    let mut child = spawn_run(cfg);
    let pid = child.id();
    let logs = log_lines(&mut child);
    wait_log(&logs, "colibri started", Duration::from_secs(60));
    if outage {
        wait_log(&logs, "link down", Duration::from_secs(60));
        // A few probe periods of outage before the receiver comes back.
        std::thread::sleep(Duration::from_secs(2));
    }
    let (cpu0, t0) = if outage {
        (cpu_secs(pid), Instant::now())
    } else {
        (0.0, spawned)
    };
    if outage {
        receiver.set_mode(Mode::Accept);
    }
    // Peak memory is sampled while the backlog drains (VmHWM covers the whole life).
    let limit = Duration::from_secs(600);
    let deadline = t0 + limit;
    let mut got = receiver.counts();
    let mut link_up_ms = None;
    while got.1 < records && Instant::now() < deadline {
        if link_up_ms.is_none() && logs.try_iter().any(|l| l.contains("link up")) {
            link_up_ms = Some(t0.elapsed().as_millis());
        }
        got = receiver
            .wait_count(records, Duration::from_millis(100))
            .unwrap_or_else(|_| receiver.counts());
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu = cpu_secs(pid) - cpu0;
    let (_, hwm) = rss_kib(pid);
    stop(child);
    let (requests, delivered, bytes) = got;
    assert!(
        delivered >= records,
        "only {delivered} of {records} records arrived within {limit:?}"
    );
    if let Some(ms) = link_up_ms {
        println!("  link seen up {ms} ms after the receiver came back");
    }
    println!(
        "  {delivered} records in {requests} requests ({:.1} MB) in {secs:.2} s: {:.0} records/s, {:.1} MB/s",
        bytes as f64 / 1e6,
        delivered as f64 / secs,
        bytes as f64 / 1e6 / secs
    );
    println!(
        "  colibri: peak RSS {:.1} MB, {cpu:.2} CPU-s ({:.2} CPU-s per million records)",
        hwm as f64 / 1024.0,
        cpu / delivered as f64 * 1e6
    );
    println!();
}
