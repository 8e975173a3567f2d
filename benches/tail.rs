//! Tail benchmark: the real binary following log files into a stream delivered to a local HTTP
//! receiver that acknowledges at once (tests/it/util/http in counting mode). Figures, not
//! assertions: see BENCHMARKS.md.
//!
//!   cargo bench --bench tail
//!   BENCH_LINES=200000 cargo bench --bench tail                 # quicker
//!   BENCH_IDLE_SECS=30 cargo bench --bench tail                 # a longer idle window
//!   COLIBRI_BIN=path/to/static/colibri cargo bench --bench tail # measure another build
//!
//! Scenarios:
//! - throughput: a pre-written file of BENCH_LINES (1,000,000) JSON lines of 200 bytes, tailed from
//!   the beginning; timed from the spawn to the last record at the receiver: lines/s end to end,
//!   colibri's peak resident memory (VmHWM) and its CPU seconds per million lines;
//! - idle: 100 files in one directory, each with a line (delivered first), then BENCH_IDLE_SECS
//!   (15) of nothing: colibri's CPU time and context switches over that window.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod common;
#[path = "../tests/it/util/http/mod.rs"]
mod http;

use common::{bin, cores, cpu_secs, env_u64, log_lines, rss_kib, spawn_run, stop, wait_log};
use http::Receiver;

const LINE_BYTES: usize = 200;

fn main() {
    let lines = env_u64("BENCH_LINES", 1_000_000);
    let idle_secs = env_u64("BENCH_IDLE_SECS", 15);
    let base = PathBuf::from(
        std::env::var("BENCH_DIR").unwrap_or_else(|_| env!("CARGO_TARGET_TMPDIR").into()),
    )
    .join("tail-bench");
    println!(
        "colibri tail benchmark ({} cores; files under {})",
        cores(),
        base.display()
    );
    println!("binary: {}", bin());
    println!();
    throughput(&base.join("throughput"), lines);
    idle(&base.join("idle"), 100, idle_secs);
}

fn fresh(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir.join("logs")).expect("create the bench directory");
}

fn write_config(dir: &Path, url: &str, paths: &str) -> PathBuf {
    let path = dir.join("colibri.yaml");
    let text = format!(
        "data_dir: {data}\n\
         storage: {{ min_free: 512MiB, max_bytes: 8GiB }}\n\
         log: {{ level: info, format: json }}\n\
         sinks:\n  \
           up: {{ type: http, url: \"{url}\" }}\n\
         streams:\n  \
           logs: {{ sink: up, batch: {{ max_records: 1000, max_bytes: 1MiB, linger: 200ms }}, max_jobs: 10000000, max_bytes: 4GiB }}\n\
         sources:\n  \
           files: {{ type: tail, stream: logs, paths: [\"{paths}\"], labels: {{ bench: tail }} }}\n",
        data = dir.join("data").display(),
    );
    std::fs::write(&path, text).expect("write config");
    path
}

/// A JSON line of exactly LINE_BYTES bytes with its newline.
fn line(seq: u64) -> Vec<u8> {
    let mut l = format!(
        "{{\"ts\":\"2026-11-30T12:00:00.000Z\",\"level\":\"info\",\"seq\":{seq},\"msg\":\""
    )
    .into_bytes();
    l.resize(LINE_BYTES - 3, b'x');
    l.extend_from_slice(b"\"}\n");
    l
}

/// Nanoseconds on a CPU, summed over the process's threads (`/proc/PID/task/*/schedstat`): finer
/// than clock ticks.
fn cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// Context switches (voluntary + involuntary) over the process's threads: each is a wake-up.
fn switches(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .map(|s| {
            s.lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum::<u64>()
        })
        .sum()
}

fn throughput(dir: &Path, lines: u64) {
    println!("== throughput: {lines} lines of {LINE_BYTES} B in one file, from the beginning");
    fresh(dir);
    let file = dir.join("logs/app.log");
    let started = Instant::now();
    {
        let mut w =
            BufWriter::with_capacity(1 << 20, std::fs::File::create(&file).expect("create"));
        for seq in 0..lines {
            w.write_all(&line(seq)).expect("write");
        }
        w.flush().expect("flush");
    }
    println!(
        "  wrote {:.0} MB in {:.2} s",
        (lines as usize * LINE_BYTES) as f64 / 1e6,
        started.elapsed().as_secs_f64()
    );
    let receiver = Receiver::start_counting();
    let cfg = write_config(
        dir,
        &receiver.url("/ingest"),
        &format!("{}/logs/*.log", dir.display()),
    );
    let t0 = Instant::now();
    let mut child = spawn_run(&cfg);
    let pid = child.id();
    let logs = log_lines(&mut child);
    wait_log(&logs, "colibri started", Duration::from_secs(60));
    let limit = Duration::from_secs(300);
    let mut got = receiver.counts();
    let mut peak_kib = 0;
    while got.1 < lines && t0.elapsed() < limit {
        got = receiver
            .wait_count(lines, Duration::from_millis(100))
            .unwrap_or_else(|_| receiver.counts());
        peak_kib = peak_kib.max(rss_kib(pid).1);
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu = cpu_secs(pid);
    let (_, hwm) = rss_kib(pid);
    stop(child);
    let (requests, delivered, bytes) = got;
    assert!(
        delivered >= lines,
        "only {delivered} of {lines} lines arrived within {limit:?}"
    );
    println!(
        "  {delivered} records in {requests} requests ({:.1} MB of records) in {secs:.2} s: {:.0} lines/s",
        bytes as f64 / 1e6,
        delivered as f64 / secs,
    );
    println!(
        "  colibri: peak RSS {:.1} MB, {cpu:.2} CPU-s ({:.2} CPU-s per million lines)",
        hwm.max(peak_kib) as f64 / 1024.0,
        cpu / delivered as f64 * 1e6
    );
    println!();
}

fn idle(dir: &Path, files: usize, idle_secs: u64) {
    println!("== idle: {files} watched files, {idle_secs} s without writes");
    fresh(dir);
    for i in 0..files {
        std::fs::write(dir.join(format!("logs/f{i:03}.log")), line(i as u64)).expect("write");
    }
    let receiver = Receiver::start_counting();
    let cfg = write_config(
        dir,
        &receiver.url("/ingest"),
        &format!("{}/logs/*.log", dir.display()),
    );
    let mut child = spawn_run(&cfg);
    let pid = child.id();
    let logs = log_lines(&mut child);
    wait_log(&logs, "colibri started", Duration::from_secs(60));
    receiver
        .wait_count(files as u64, Duration::from_secs(60))
        .expect("every file's line delivered");
    // Let the last commit, the delivery and the writer's idle compaction check settle.
    std::thread::sleep(Duration::from_secs(12));
    let (ns0, sw0, t0) = (cpu_ns(pid), switches(pid), Instant::now());
    std::thread::sleep(Duration::from_secs(idle_secs));
    let (ns1, sw1, secs) = (cpu_ns(pid), switches(pid), t0.elapsed().as_secs_f64());
    let (rss, _) = rss_kib(pid);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    stop(child);
    let cpu = (ns1 - ns0) as f64 / 1e9;
    println!(
        "  CPU {:.2} ms over {secs:.1} s ({:.4} %), {} context switches ({:.2}/s); RSS {:.1} MB, {fds} open descriptors",
        cpu * 1e3,
        cpu / secs * 100.0,
        sw1 - sw0,
        (sw1 - sw0) as f64 / secs,
        rss as f64 / 1024.0,
    );
    println!();
}
