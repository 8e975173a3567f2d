//! Backlog benchmark: the workload colibri was compared on with Fluent Bit (issue 16). A file of
//! BENCH_LINES JSON lines of 200 bytes is tailed from its beginning and POSTed to a local HTTP
//! receiver (tests/it/util/http in counting mode), with the stream and sink at their defaults (only
//! the stream's bounds are raised, so that a build that does not compress can hold the backlog too).
//! Figures, not assertions: see BENCHMARKS.md.
//!
//!   cargo bench --bench backlog
//!   BENCH_LINES=1000000,5000000 cargo bench --bench backlog   # also 5M: cost linear, memory flat
//!   BENCH_OUTAGE_SECS=50 cargo bench --bench backlog          # the outage's length (default 50)
//!   BENCH_CONFIG_EXTRA='compression: none' cargo bench ...    # added to the stream's settings
//!   BENCH_SOURCE_EXTRA='fields: [], format: json' cargo bench ... # added to the tail source's
//!   BENCH_ONLINE_ONLY=1 cargo bench --bench backlog           # the online run alone
//!   COLIBRI_BIN=path/to/static/colibri cargo bench --bench backlog
//!
//! For each line count, two runs on a fresh data directory:
//! - online: the receiver accepts from the start; timed from the spawn to the last record at the
//!   receiver: colibri's CPU seconds (per million lines), its peak resident memory (VmHWM), and the
//!   decompressed bytes per record the receiver got;
//! - outage: the receiver refuses connections (nothing listens on its port) from the start; once
//!   every line is in the stream and BENCH_OUTAGE_SECS have passed, the disk the data directory
//!   takes (allocated blocks), the bytes colibri wrote to storage since it started
//!   (`/proc/PID/io` `write_bytes`), the stream's raw and stored bytes (`/metrics`) and the peak
//!   memory so far; then the receiver accepts again, and the drain is timed from that moment to the
//!   last record (the link monitor's detection delay included), with its CPU and peak memory; last,
//!   the store file's size once the writer's idle compaction has run.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod common;
#[path = "../tests/it/util/http/mod.rs"]
mod http;

use common::{admin_addr, bin, cores, log_lines, metric, metric_sum, rss_kib, spawn_run, stop};
use http::{Mode, Receiver};

const LINE_BYTES: usize = 200;
const STREAM: &str = "logs";

fn main() {
    let counts: Vec<u64> = std::env::var("BENCH_LINES")
        .unwrap_or_else(|_| "1000000".into())
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .expect("BENCH_LINES: comma-separated line counts")
        })
        .collect();
    let outage = Duration::from_secs(common::env_u64("BENCH_OUTAGE_SECS", 50));
    let extra = Extra {
        stream: std::env::var("BENCH_CONFIG_EXTRA").unwrap_or_default(),
        source: std::env::var("BENCH_SOURCE_EXTRA").unwrap_or_default(),
    };
    let online_only = std::env::var_os("BENCH_ONLINE_ONLY").is_some();
    let base = PathBuf::from(
        std::env::var("BENCH_DIR").unwrap_or_else(|_| env!("CARGO_TARGET_TMPDIR").into()),
    )
    .join("backlog-bench");
    println!(
        "colibri backlog benchmark ({} cores; files under {}; outage {} s)",
        cores(),
        base.display(),
        outage.as_secs()
    );
    println!("binary: {}", bin());
    if !extra.stream.is_empty() {
        println!("stream settings added: {}", extra.stream);
    }
    if !extra.source.is_empty() {
        println!("source settings added: {}", extra.source);
    }
    println!();
    for lines in counts {
        let file = base.join(format!("app-{lines}.log"));
        let line_bytes = write_lines(&file, lines);
        online(&base.join("online"), &file, lines, &extra);
        if !online_only {
            with_outage(
                &base.join("outage"),
                &file,
                (lines, line_bytes),
                outage,
                &extra,
            );
        }
        let _ = std::fs::remove_file(&file);
    }
}

/// A JSON line of exactly LINE_BYTES bytes with its newline (the tail benchmark's line).
fn line(seq: u64) -> Vec<u8> {
    let mut l = format!(
        "{{\"ts\":\"2026-11-30T12:00:00.000Z\",\"level\":\"info\",\"seq\":{seq},\"msg\":\""
    )
    .into_bytes();
    l.resize(LINE_BYTES - 3, b'x');
    l.extend_from_slice(b"\"}\n");
    l
}

/// Writes the workload's `lines` lines into `file`; returns their bytes. The bench's own JSON
/// lines, or with BENCH_LOG_FILE the lines of that file in turn (real log text compresses less).
fn write_lines(file: &Path, lines: u64) -> u64 {
    std::fs::create_dir_all(file.parent().expect("a parent")).expect("create the bench directory");
    let started = Instant::now();
    let sample: Option<Vec<Vec<u8>>> = std::env::var_os("BENCH_LOG_FILE").map(|p| {
        let text = std::fs::read(&p).expect("read BENCH_LOG_FILE");
        text.split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| [l, b"\n"].concat())
            .collect()
    });
    let mut w = BufWriter::with_capacity(1 << 20, std::fs::File::create(file).expect("create"));
    let mut bytes = 0u64;
    for seq in 0..lines {
        let l = match &sample {
            Some(s) => s[seq as usize % s.len()].clone(),
            None => line(seq),
        };
        bytes += l.len() as u64;
        w.write_all(&l).expect("write");
    }
    w.flush().expect("flush");
    println!(
        "== {lines} lines ({:.0} MB{}) written in {:.1} s",
        bytes as f64 / 1e6,
        if sample.is_some() {
            ", from BENCH_LOG_FILE"
        } else {
            ""
        },
        started.elapsed().as_secs_f64()
    );
    bytes
}

/// Settings added to the config's stream and source.
struct Extra {
    stream: String,
    source: String,
}

/// `, settings` to add to a flow mapping, or nothing.
fn more(settings: &str) -> String {
    if settings.is_empty() {
        String::new()
    } else {
        format!(", {settings}")
    }
}

/// A fresh directory with the log file linked in and the config: defaults but for the bounds.
fn setup(dir: &Path, file: &Path, url: &str, extra: &Extra) -> PathBuf {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir.join("logs")).expect("create the run directory");
    std::fs::hard_link(file, dir.join("logs/app.log"))
        .or_else(|_| std::fs::copy(file, dir.join("logs/app.log")).map(|_| ()))
        .expect("put the log file in place");
    let path = dir.join("colibri.yaml");
    let text = format!(
        "data_dir: {data}\n\
         storage: {{ max_bytes: 16GiB }}\n\
         log: {{ level: info, format: json }}\n\
         admin: {{ listen: \"127.0.0.1:0\" }}\n\
         sinks:\n  \
           up: {{ type: http, url: \"{url}\" }}\n\
         streams:\n  \
           {STREAM}: {{ sink: up, max_jobs: 10000000, max_bytes: 8GiB{stream} }}\n\
         sources:\n  \
           files: {{ type: tail, stream: {STREAM}, paths: [\"{logs}/*.log\"]{source} }}\n",
        data = dir.join("data").display(),
        logs = dir.join("logs").display(),
        stream = more(&extra.stream),
        source = more(&extra.source),
    );
    std::fs::write(&path, text).expect("write config");
    path
}

/// Nanoseconds on a CPU, summed over the process's threads: finer than clock ticks.
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

/// Bytes the process caused to be written to storage (`write_bytes` of `/proc/PID/io`).
fn write_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/io"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("write_bytes:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Bytes of disk allocated to the files under `dir` (what `du` counts).
fn disk_used(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    for e in entries.flatten() {
        let Ok(m) = e.metadata() else { continue };
        if m.is_dir() {
            total += disk_used(&e.path());
        } else {
            total += m.blocks() * 512;
        }
    }
    total
}

fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

fn online(dir: &Path, file: &Path, lines: u64, extra: &Extra) {
    let receiver = Receiver::start_counting();
    let cfg = setup(dir, file, &receiver.url("/ingest"), extra);
    let t0 = Instant::now();
    let mut child = spawn_run(&cfg);
    let pid = child.id();
    let _logs = log_lines(&mut child);
    let limit = Duration::from_secs(600);
    let mut peak_kib = 0;
    let mut got = receiver.counts();
    while got.1 < lines && t0.elapsed() < limit {
        got = receiver
            .wait_count(lines, Duration::from_millis(100))
            .unwrap_or_else(|_| receiver.counts());
        peak_kib = peak_kib.max(rss_kib(pid).1);
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu = cpu_ns(pid) as f64 / 1e9;
    let written = write_bytes(pid);
    peak_kib = peak_kib.max(rss_kib(pid).1);
    stop(child);
    let (requests, delivered, bytes) = got;
    assert!(
        delivered >= lines,
        "only {delivered} of {lines} lines arrived within {limit:?}"
    );
    println!("  online: {delivered} records in {requests} requests, {secs:.2} s");
    println!(
        "    CPU {cpu:.2} s = {:.2} CPU-s per million lines; peak RSS {:.1} MB; {:.0} B per record at the receiver; {} written to storage",
        cpu / delivered as f64 * 1e6,
        peak_kib as f64 / 1024.0,
        bytes as f64 / delivered as f64,
        mb(written),
    );
}

#[expect(
    clippy::too_many_lines,
    reason = "one run of the benchmark, read top to bottom"
)]
fn with_outage(
    dir: &Path,
    file: &Path,
    (lines, line_bytes): (u64, u64),
    outage: Duration,
    extra: &Extra,
) {
    let receiver = Receiver::start_counting();
    let cfg = setup(dir, file, &receiver.url("/ingest"), extra);
    receiver.set_mode(Mode::Refuse);
    let t0 = Instant::now();
    let mut child = spawn_run(&cfg);
    let pid = child.id();
    let logs = log_lines(&mut child);
    let admin = admin_addr(&logs);
    let appended = format!("colibri_stream_appended_records_total{{stream=\"{STREAM}\"}}");
    let limit = Duration::from_secs(900);
    let mut queued_at = None;
    let mut peak_kib = 0;
    while t0.elapsed() < limit {
        peak_kib = peak_kib.max(rss_kib(pid).1);
        if queued_at.is_none() && metric(admin, &appended).unwrap_or(0.0) as u64 >= lines {
            queued_at = Some(t0.elapsed());
        }
        if queued_at.is_some() && t0.elapsed() >= outage {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let queued_at = queued_at.expect("every line reached the stream within the limit");
    let disk = disk_used(&dir.join("data"));
    let written = write_bytes(pid);
    let cpu_outage = cpu_ns(pid) as f64 / 1e9;
    let label = format!("stream=\"{STREAM}\"");
    let stored = metric_sum(admin, "colibri_stream_bytes{", &label).unwrap_or(0.0) as u64;
    let raw = metric_sum(admin, "colibri_stream_raw_bytes{", &label);
    let file_bytes = metric(admin, "colibri_store_file_bytes").unwrap_or(0.0) as u64;
    let commits = metric(admin, "colibri_store_commits_total").unwrap_or(0.0) as u64;
    peak_kib = peak_kib.max(rss_kib(pid).1);
    println!(
        "  outage: every line queued {:.1} s after the start; at {:.0} s:",
        queued_at.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
    println!(
        "    disk used {} ({:.2}x the lines' {}); store file {}; {} written to storage; stream holds {} stored{}",
        mb(disk),
        disk as f64 / line_bytes as f64,
        mb(line_bytes),
        mb(file_bytes),
        mb(written),
        mb(stored),
        raw.map_or(String::new(), |r| format!(
            " of {} raw (ratio raw/stored {:.1})",
            mb(r as u64),
            r / stored.max(1) as f64
        )),
    );
    println!(
        "    CPU {cpu_outage:.2} s while queueing ({:.2} per million lines); peak RSS {:.1} MB; {commits} commits",
        cpu_outage / lines as f64 * 1e6,
        peak_kib as f64 / 1024.0
    );
    // The upstream returns.
    receiver.set_mode(Mode::Accept);
    let back = Instant::now();
    let mut got = receiver.counts();
    let mut drain_peak = 0;
    while got.1 < lines && back.elapsed() < limit {
        got = receiver
            .wait_count(lines, Duration::from_millis(50))
            .unwrap_or_else(|_| receiver.counts());
        drain_peak = drain_peak.max(rss_kib(pid).0);
    }
    let drain = back.elapsed().as_secs_f64();
    let cpu_drain = cpu_ns(pid) as f64 / 1e9 - cpu_outage;
    let written_drain = write_bytes(pid) - written;
    let commits_drain =
        metric(admin, "colibri_store_commits_total").unwrap_or(0.0) as u64 - commits;
    assert!(
        got.1 >= lines,
        "only {} of {lines} lines delivered after the outage",
        got.1
    );
    println!(
        "    drain: {} records in {drain:.2} s after the receiver came back ({:.0} records/s); CPU {cpu_drain:.2} s; RSS during the drain up to {:.1} MB; {commits_drain} commits, {} written",
        got.1,
        got.1 as f64 / drain,
        drain_peak as f64 / 1024.0,
        mb(written_drain),
    );
    // The idle compaction after a drain.
    let compacted = Instant::now();
    let mut compacted_log = None;
    while compacted.elapsed() < Duration::from_secs(40) {
        match logs.recv_timeout(Duration::from_millis(500)) {
            Ok(l) if l.contains("store compacted") => {
                compacted_log = Some(compacted.elapsed());
                break;
            }
            _ => {}
        }
    }
    let after = metric(admin, "colibri_store_file_bytes").unwrap_or(0.0) as u64;
    println!(
        "    after the drain: store file {}{}; {} written to storage in all; peak RSS over the whole run {:.1} MB",
        mb(after),
        compacted_log.map_or(" (not compacted within 40 s)".to_string(), |t| format!(
            " (compacted {:.1} s after the drain)",
            t.as_secs_f64()
        )),
        mb(write_bytes(pid)),
        rss_kib(pid).1 as f64 / 1024.0
    );
    stop(child);
    println!();
}
