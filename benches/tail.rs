//! Tail benchmark: the real binary following log files into a stream delivered to a local HTTP
//! receiver that acknowledges at once (tests/it/util/http in counting mode). Figures, not
//! assertions: see BENCHMARKS.md.
//!
//!   cargo bench --bench tail
//!   BENCH_LINES=200000 cargo bench --bench tail                 # quicker
//!   BENCH_IDLE_SECS=30 cargo bench --bench tail                 # a longer idle window
//!   COLIBRI_BIN=path/to/static/colibri cargo bench --bench tail # measure another build
//!   BENCH_ONLY=throughput cargo bench --bench tail              # one scenario (or idle, memory)
//!
//! Scenarios:
//! - throughput: a pre-written file of BENCH_LINES (1,000,000) JSON lines of 200 bytes, tailed from
//!   the beginning; timed from the spawn to the last record at the receiver: lines/s end to end,
//!   colibri's peak resident memory (VmHWM) and its CPU seconds per million lines;
//! - idle: 100 files in one directory, each with a line (delivered first), then BENCH_IDLE_SECS
//!   (15) of nothing: colibri's CPU time and context switches over that window;
//! - idle memory: one file of 3 lines, one source, one HTTP sink (the issue 16 figure): resident
//!   memory once the lines are delivered, after BENCH_IDLE_SECS + 10 s of nothing and a minute
//!   later, and where it is (the binary's pages, the heap, the rest of anonymous memory); the
//!   throughput scenario prints the same after its 1M lines, once it has been idle as long.

use std::collections::HashMap;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod common;
#[path = "../tests/it/util/http/mod.rs"]
mod http;

use common::{
    bin, cores, cpu_secs, env_u64, log_lines, resident, rss_kib, spawn_run, stop, wait_log,
};
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
    let only = std::env::var("BENCH_ONLY").ok();
    let run = |name: &str| only.as_deref().is_none_or(|o| o == name);
    if run("throughput") {
        throughput(&base.join("throughput"), lines, idle_secs);
    }
    if run("idle") {
        idle(&base.join("idle"), 100, idle_secs);
    }
    if run("memory") {
        idle_memory(&base.join("idle-memory"), idle_secs);
    }
}

/// How long a scenario waits, after its last record arrived, before its idle memory is read: the
/// idle window plus a rescan interval (10 s), so a source has seen a quiet round and the
/// blocking pool's threads have ended (10 s after their last task).
fn settle(idle_secs: u64) -> Duration {
    Duration::from_secs(idle_secs + 10)
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
         admin: {{ listen: \"127.0.0.1:0\" }}\n\
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

/// Per thread (by id): nanoseconds on a CPU (`/proc/PID/task/*/schedstat`, finer than clock
/// ticks) and context switches, voluntary + involuntary (each is a wake-up).
fn per_thread(pid: u32) -> HashMap<String, (u64, u64)> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return HashMap::new();
    };
    tasks
        .flatten()
        .filter_map(|t| {
            let ns = std::fs::read_to_string(t.path().join("schedstat")).ok()?;
            let ns = ns.split_whitespace().next()?.parse::<u64>().ok()?;
            let status = std::fs::read_to_string(t.path().join("status")).ok()?;
            let switches = status
                .lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum::<u64>();
            Some((t.file_name().to_string_lossy().into_owned(), (ns, switches)))
        })
        .collect()
}

/// CPU nanoseconds and context switches between two samples of [`per_thread`]: a thread that
/// started in between counts whole; one that ended in between (a blocking-pool thread ends 10 s
/// after its last task) drops out, with what it did since the first sample.
fn delta(before: &HashMap<String, (u64, u64)>, after: &HashMap<String, (u64, u64)>) -> (u64, u64) {
    after.iter().fold((0, 0), |(ns, sw), (tid, (n, s))| {
        let (n0, s0) = before.get(tid).copied().unwrap_or((0, 0));
        (ns + n.saturating_sub(n0), sw + s.saturating_sub(s0))
    })
}

fn throughput(dir: &Path, lines: u64, idle_secs: u64) {
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
    std::thread::sleep(settle(idle_secs));
    let after = resident(pid);
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
    println!(
        "  {} s after the last record: {}",
        settle(idle_secs).as_secs(),
        after.line()
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
    let (before, t0) = (per_thread(pid), Instant::now());
    std::thread::sleep(Duration::from_secs(idle_secs));
    let (after, secs) = (per_thread(pid), t0.elapsed().as_secs_f64());
    let (ns, sw) = delta(&before, &after);
    let (rss, _) = rss_kib(pid);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    stop(child);
    let cpu = ns as f64 / 1e9;
    println!(
        "  CPU {:.2} ms over {secs:.1} s ({:.4} %), {} context switches ({:.2}/s); RSS {:.1} MB, {fds} open descriptors",
        cpu * 1e3,
        cpu / secs * 100.0,
        sw,
        sw as f64 / secs,
        rss as f64 / 1024.0,
    );
    println!();
}

fn idle_memory(dir: &Path, idle_secs: u64) {
    println!("== idle memory: one source (a file of 3 lines), one HTTP sink");
    fresh(dir);
    let file = dir.join("logs/app.log");
    std::fs::write(&file, [line(0), line(1), line(2)].concat()).expect("write");
    let receiver = Receiver::start_counting();
    let cfg = write_config(dir, &receiver.url("/ingest"), &file.display().to_string());
    let mut child = spawn_run(&cfg);
    let pid = child.id();
    let logs = log_lines(&mut child);
    wait_log(&logs, "colibri started", Duration::from_secs(60));
    receiver
        .wait_count(3, Duration::from_secs(60))
        .expect("the 3 lines delivered");
    // The commit that acknowledges the delivery comes just after the answer.
    std::thread::sleep(Duration::from_millis(200));
    let delivered = resident(pid);
    std::thread::sleep(settle(idle_secs));
    let idle = resident(pid);
    // What runs now and then while idle (the connection pool's expiry, the blocking pool's
    // threads ending and starting) has run at least once.
    std::thread::sleep(Duration::from_secs(60));
    let later = resident(pid);
    stop(child);
    let secs = settle(idle_secs).as_secs();
    println!("  once delivered: {}", delivered.line());
    println!("  {secs:>3} s later:   {}", idle.line());
    println!("  {:>3} s later:   {}", secs + 60, later.line());
    println!();
}
