//! Store benchmark: durable appends per second through the group-commit writer, start-up time of the
//! real binary with about 1 GB queued (after a clean stop and after a crash, and `Store::open`
//! in-process after a crash with and without quick repair), and resident memory of `colibri run`
//! with a backlog. Figures, not assertions: see BENCHMARKS.md.
//!
//!   cargo bench --bench store
//!   BENCH_APPEND_SECS=2 BENCH_BIG_MB=256 cargo bench --bench store      # quicker, smaller
//!   COLIBRI_BIN=path/to/static/colibri cargo bench --bench store        # measure another build
//!
//! Settings (environment): BENCH_APPEND_SECS (5) per run and BENCH_APPEND_ROUNDS (3) runs per
//! producer count, each on a fresh store; BENCH_BIG_MB (1024) queued for the start-up figures;
//! BENCH_STARTS (7) starts per median; BENCH_MEM_RECORDS (1000000); BENCH_DIR (cargo's target/tmp;
//! a real disk, not a tmpfs, for the fsync figures). About 4 minutes on 2 cores with the defaults.
//!
//! The bench re-runs itself as the writer that is killed for the in-process crash figures
//! (`store --writer-child CONFIG QUICK_REPAIR`).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

mod common;

use colibri::clock::now_ms;
use colibri::config::{self, Config};
use colibri::store::{OpenOptions, RecordBuf, Store, writer};
use common::{bin, cores, env_u64, rss_kib, signal, spawn_run, stop};

const STREAM: &str = "logs";
const RECORD_BYTES: usize = 200;
const RECORDS_PER_APPEND: usize = 100;

/// `BENCH_WINDOW_US`: the writer's extra batching window (default 0, the agent's setting).
fn window() -> Duration {
    Duration::from_micros(env_u64("BENCH_WINDOW_US", 0))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--writer-child") {
        writer_child(Path::new(&args[2]), args[3] == "1");
        return;
    }
    let append_secs = env_u64("BENCH_APPEND_SECS", 5);
    let rounds = env_u64("BENCH_APPEND_ROUNDS", 3).max(1) as usize;
    let big_mb = env_u64("BENCH_BIG_MB", 1024);
    let starts = env_u64("BENCH_STARTS", 7) as usize;
    let mem_records = env_u64("BENCH_MEM_RECORDS", 1_000_000);
    let base = std::env::var("BENCH_DIR").unwrap_or_else(|_| env!("CARGO_TARGET_TMPDIR").into());
    std::fs::create_dir_all(&base).expect("create BENCH_DIR");
    println!(
        "colibri store benchmark ({} cores; {append_secs} s per append run; {big_mb} MB backlog; \
         {starts} starts per median; files under {base})",
        cores()
    );
    println!("binary: {}", bin());
    println!("writer batching window: {} us", window().as_micros());
    println!();

    fsync_probe(Path::new(&base));
    println!("== durable appends: {RECORDS_PER_APPEND} records of {RECORD_BYTES} bytes per append");
    for (producers, quick_repair) in [(1, true), (8, true), (64, true), (64, false)] {
        let mut rates: Vec<f64> = (0..rounds)
            .map(|_| appends(Path::new(&base), producers, append_secs, quick_repair))
            .collect();
        println!(
            "  => {producers} producers{}: median {:.0} records/s over {rounds} rounds (min {:.0}, max {:.0})",
            if quick_repair {
                ""
            } else {
                " (quick_repair off)"
            },
            median(&mut rates),
            rates[0],
            rates[rates.len() - 1],
        );
    }
    println!();
    if std::env::var_os("BENCH_ONLY_APPENDS").is_some() {
        return;
    }

    let big = tempfile::Builder::new()
        .prefix("colibri-bench-big-")
        .tempdir_in(&base)
        .expect("temp dir");
    let cfg = write_config(big.path());
    let c = load(&cfg);
    fill(&c, big_mb << 20, 0);
    println!("== start-up with {}", describe(&c));
    startup_clean(&cfg, starts);
    startup_after_push_crash(&cfg, starts);
    for quick in [false, true] {
        open_after_child_crash(&cfg, quick, starts);
    }
    integrity_check_open(&c);
    println!();

    println!("== resident memory of `colibri run`, after \"colibri started\"");
    let mem_big = memory(&cfg);
    for records in [0, mem_records] {
        let dir = tempfile::Builder::new()
            .prefix("colibri-bench-mem-")
            .tempdir_in(&base)
            .expect("temp dir");
        let cfg = write_config(dir.path());
        let c = load(&cfg);
        if records == 0 {
            Store::open(&c.data_dir, c.storage, &c.streams, OpenOptions::default())
                .expect("create the store");
        } else {
            fill(&c, u64::MAX, records);
        }
        let (rss, hwm) = memory(&cfg);
        println!(
            "  {:>9} records queued ({}): VmRSS {:.2} MB, VmHWM {:.2} MB",
            records,
            describe(&c),
            rss as f64 / 1024.0,
            hwm as f64 / 1024.0
        );
    }
    println!(
        "  {:>9} ({}): VmRSS {:.2} MB, VmHWM {:.2} MB",
        "the big",
        describe(&c),
        mem_big.0 as f64 / 1024.0,
        mem_big.1 as f64 / 1024.0
    );
}

/// The disk's fsync latency for one 4 KiB write, for a second: what one producer's appends wait for.
fn fsync_probe(base: &Path) {
    let dir = tempfile::tempdir_in(base).expect("temp dir");
    let mut f = std::fs::File::create(dir.path().join("probe")).expect("probe file");
    let block = vec![0x5a_u8; 4096];
    let mut lat = Vec::new();
    let end = Instant::now() + Duration::from_secs(1);
    while Instant::now() < end {
        let t = Instant::now();
        f.write_all(&block).expect("write");
        f.sync_data().expect("fdatasync");
        lat.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let n = lat.len();
    lat.sort_by(|a, b| a.total_cmp(b));
    println!(
        "== disk: 4 KiB write + fdatasync: {n} in 1 s, median {:.2} ms, p90 {:.2} ms, max {:.2} ms",
        lat[n / 2],
        lat[n * 9 / 10],
        lat[n - 1]
    );
}

/// A config whose data_dir is `dir/data`; INFO logs in JSON so the bench can read readiness.
fn write_config(dir: &Path) -> PathBuf {
    let path = dir.join("colibri.yaml");
    let text = format!(
        "data_dir: {}\n\
         storage: {{ min_free: 1GiB, max_bytes: 64GiB }}\n\
         streams:\n  \
           {STREAM}: {{ batch: {{ max_records: {RECORDS_PER_APPEND} }}, max_jobs: 100000000, max_bytes: 32GiB, when_full: block }}\n\
         log: {{ level: info, format: json }}\n",
        dir.join("data").display()
    );
    std::fs::write(&path, text).expect("write config");
    path
}

fn load(cfg: &Path) -> Config {
    let c = config::load(cfg).unwrap_or_else(|e| panic!("{}: {e}", cfg.display()));
    std::fs::create_dir_all(&c.data_dir).expect("create data_dir");
    c
}

/// Options with quick repair always on, or never.
fn opts(quick_repair: bool) -> OpenOptions {
    OpenOptions {
        quick_repair_from: if quick_repair { 0 } else { u64::MAX },
        ..OpenOptions::default()
    }
}

fn open(c: &Config, quick_repair: bool) -> Store {
    Store::open(&c.data_dir, c.storage, &c.streams, opts(quick_repair)).expect("open the store")
}

fn record(seq: u64) -> Vec<u8> {
    let mut r = format!("{seq:012} ").into_bytes();
    r.resize(RECORD_BYTES, b'x');
    r
}

fn describe(c: &Config) -> String {
    let s = Store::open(
        &c.data_dir,
        c.storage,
        &c.streams,
        OpenOptions {
            read_only: true,
            ..OpenOptions::default()
        },
    )
    .expect("open read-only");
    let records = s.counters(STREAM).map_or(0, |n| n.ready_records);
    format!(
        "{records} records, {:.0} MB in jobs, {:.0} MB file",
        s.stored_bytes() as f64 / 1e6,
        s.file_bytes() as f64 / 1e6
    )
}

/// Appends 200-byte records in-process, 10,000 per commit, until `bytes` are stored or `records`
/// (when not 0) appended.
fn fill(c: &Config, bytes: u64, records: u64) {
    let started = Instant::now();
    let mut s = open(c, true);
    let mut seq = s.counters(STREAM).map_or(0, |n| n.appended_records);
    let target = if records == 0 {
        u64::MAX
    } else {
        seq + records
    };
    while s.stored_bytes() < bytes && seq < target {
        let n = (target - seq).min(10_000);
        let recs: RecordBuf = (seq..seq + n).map(record).collect();
        let mut tx = s.transaction().expect("transaction");
        tx.append(STREAM, &recs, None, now_ms()).expect("append");
        tx.commit().expect("commit");
        seq += n;
    }
    println!(
        "  (filled {seq} records, {:.0} MB, in {:.1} s)",
        s.stored_bytes() as f64 / 1e6,
        started.elapsed().as_secs_f64()
    );
}

/// `producers` tasks append for `secs` through one writer, on a fresh store; prints records/s,
/// appends/s, commits/s and the per-second trend; returns records/s.
fn appends(base: &Path, producers: usize, secs: u64, quick_repair: bool) -> f64 {
    let dir = tempfile::Builder::new()
        .prefix("colibri-bench-append-")
        .tempdir_in(base)
        .expect("temp dir");
    let c = load(&write_config(dir.path()));
    let store = open(&c, quick_repair);
    let (d, storage, streams) = (c.data_dir.clone(), c.storage, c.streams.clone());
    let reopen = Box::new(move || Store::open(&d, storage, &streams, opts(quick_repair)));
    let handle = writer::spawn(store, reopen, writer::WriterOptions { window: window() })
        .expect("spawn the writer");
    // A multi-thread runtime with a worker per core; each producer is a task.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores())
        .build()
        .expect("runtime");
    let deadline = Instant::now() + Duration::from_secs(secs);
    let (c0, r0) = (
        handle.stats().commits.load(Ordering::Relaxed),
        handle.stats().requests.load(Ordering::Relaxed),
    );
    let started = Instant::now();
    let tasks: Vec<_> = (0..producers)
        .map(|_| {
            let handle = handle.clone();
            rt.spawn(async move {
                let rec = record(0);
                let (mut appends, mut lat_max) = (0u64, Duration::ZERO);
                while Instant::now() < deadline {
                    let recs = vec![rec.clone(); RECORDS_PER_APPEND];
                    let t = Instant::now();
                    handle
                        .append(STREAM, recs, None, Some(Duration::from_secs(30)))
                        .await
                        .expect("append");
                    lat_max = lat_max.max(t.elapsed());
                    appends += 1;
                }
                (appends, lat_max)
            })
        })
        .collect();
    // Appends acknowledged per second, from the writer's own counter, to show a trend.
    let mut per_sec = Vec::new();
    let mut last = r0;
    while Instant::now() + Duration::from_millis(500) < deadline {
        std::thread::sleep(Duration::from_secs(1));
        let now = handle.stats().requests.load(Ordering::Relaxed);
        per_sec.push((now - last) * RECORDS_PER_APPEND as u64);
        last = now;
    }
    let (appends, lat_max) = rt.block_on(async {
        let (mut appends, mut lat_max) = (0u64, Duration::ZERO);
        for t in tasks {
            let (a, l) = t.await.expect("producer");
            appends += a;
            lat_max = lat_max.max(l);
        }
        (appends, lat_max)
    });
    let elapsed = started.elapsed().as_secs_f64();
    let commits = handle.stats().commits.load(Ordering::Relaxed) - c0;
    let requests = handle.stats().requests.load(Ordering::Relaxed) - r0;
    rt.block_on(handle.shutdown());
    let records = appends * RECORDS_PER_APPEND as u64;
    let file_mb = std::fs::metadata(c.data_dir.join(colibri::store::DB_FILE))
        .map_or(0.0, |m| m.len() as f64 / 1e6);
    let trend: Vec<String> = per_sec
        .iter()
        .map(|n| format!("{:.0}k", *n as f64 / 1e3))
        .collect();
    println!(
        "  {producers:>2} producers{}: {:>9.0} records/s, {:>6.0} appends/s, {:>5.0} commits/s, \
         {:>5.1} appends/commit, max append latency {:.1} ms; file {file_mb:.0} MB at the end; \
         records/s each second: {}",
        if quick_repair {
            String::new()
        } else {
            " (quick_repair off)".into()
        },
        records as f64 / elapsed,
        appends as f64 / elapsed,
        commits as f64 / elapsed,
        requests as f64 / commits.max(1) as f64,
        lat_max.as_secs_f64() * 1e3,
        trend.join(" "),
    );
    records as f64 / elapsed
}

/// Spawns `colibri run` and returns (ms to "store opened", its duration_ms, ms to "colibri
/// started", the child).
fn timed_start(cfg: &Path) -> (f64, u64, f64, Child) {
    let t0 = Instant::now();
    let mut child = spawn_run(cfg);
    let stderr = child.stderr.take().expect("piped");
    let mut lines = BufReader::new(stderr).lines();
    let (mut opened, mut open_ms) = (f64::NAN, 0);
    for line in lines.by_ref() {
        let line = line.expect("stderr");
        let at = t0.elapsed().as_secs_f64() * 1e3;
        if line.contains("\"store opened\"") {
            opened = at;
            let v: serde_json::Value = serde_json::from_str(&line).expect("JSON log line");
            open_ms = v["duration_ms"].as_u64().unwrap_or(0);
        }
        if line.contains("\"colibri started\"") {
            // Keep draining stderr so the agent never blocks on a full pipe.
            std::thread::spawn(move || lines.for_each(drop));
            return (opened, open_ms, at, child);
        }
    }
    let status = child.wait();
    panic!("colibri exited before it started: {status:?}");
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn startup_clean(cfg: &Path, starts: usize) {
    let (mut ready, mut opened) = (Vec::new(), Vec::new());
    let mut open_ms = Vec::new();
    for _ in 0..starts {
        let (o, d, r, child) = timed_start(cfg);
        stop(child);
        opened.push(o);
        open_ms.push(d as f64);
        ready.push(r);
    }
    println!(
        "  after a clean stop: spawn to \"store opened\" median {:.1} ms, to \"colibri started\" \
         median {:.1} ms (max {:.1}); Store::open {:.0} ms ({starts} starts, warm page cache)",
        median(&mut opened),
        median(&mut ready.clone()),
        ready.iter().copied().fold(0.0, f64::max),
        median(&mut open_ms),
    );
}

/// Kills a `colibri queue push` (SIGKILL) after it acknowledged `receipts` commits.
fn crash_a_push(cfg: &Path, receipts: usize) {
    let mut child = Command::new(bin())
        .args(["queue", "push", STREAM, "--batch", "100", "--config"])
        .arg(cfg)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn colibri queue push");
    let mut stdin = child.stdin.take().expect("piped");
    std::thread::spawn(move || {
        let mut w = std::io::BufWriter::new(&mut stdin);
        for seq in 0.. {
            let mut r = record(seq);
            r.push(b'\n');
            if w.write_all(&r).is_err() {
                return;
            }
        }
    });
    let out = BufReader::new(child.stdout.take().expect("piped"));
    let mut seen = 0;
    for line in out.lines() {
        if line.expect("stdout").starts_with("acked ") {
            seen += 1;
            if seen == receipts {
                break;
            }
        }
    }
    assert_eq!(seen, receipts, "push ended early");
    signal(&child, libc::SIGKILL);
    let _ = child.wait();
}

fn startup_after_push_crash(cfg: &Path, starts: usize) {
    let (mut ready, mut open_ms) = (Vec::new(), Vec::new());
    for _ in 0..starts {
        crash_a_push(cfg, 20);
        let (_, d, r, child) = timed_start(cfg);
        stop(child);
        open_ms.push(d as f64);
        ready.push(r);
    }
    println!(
        "  after kill -9 of `queue push` (quick repair from 256 MiB of file, the default): spawn to \"colibri started\" \
         median {:.1} ms (max {:.1}); Store::open {:.0} ms ({starts} crashes)",
        median(&mut ready.clone()),
        ready.iter().copied().fold(0.0, f64::max),
        median(&mut open_ms),
    );
}

/// The child side: opens the store with the given quick_repair and appends until killed, printing
/// a line after each commit.
fn writer_child(cfg: &Path, quick_repair: bool) {
    let c = config::load(cfg).expect("config");
    let mut s = open(&c, quick_repair);
    let recs: RecordBuf = (0..RECORDS_PER_APPEND as u64).map(record).collect();
    let mut out = std::io::stdout().lock();
    loop {
        let mut tx = s.transaction().expect("transaction");
        tx.append(STREAM, &recs, None, now_ms()).expect("append");
        tx.commit().expect("commit");
        writeln!(out, "committed").expect("stdout");
        out.flush().expect("stdout");
    }
}

/// A child writing with `quick_repair` is killed (SIGKILL) after 20 commits; then `Store::open`
/// with the same setting is timed in-process. The store is closed cleanly after each round.
fn open_after_child_crash(cfg: &Path, quick_repair: bool, starts: usize) {
    let c = config::load(cfg).expect("config");
    let mut times = Vec::new();
    for _ in 0..starts {
        let mut child = Command::new(std::env::current_exe().expect("current_exe"))
            .arg("--writer-child")
            .arg(cfg)
            .arg(if quick_repair { "1" } else { "0" })
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the writer child");
        let out = BufReader::new(child.stdout.take().expect("piped"));
        let commits = out.lines().take(20).count();
        assert_eq!(commits, 20, "the writer child ended early");
        signal(&child, libc::SIGKILL);
        let _ = child.wait();
        let t = Instant::now();
        let s = open(&c, quick_repair);
        times.push(t.elapsed().as_secs_f64() * 1e3);
        drop(s);
    }
    println!(
        "  in-process Store::open after kill -9 of a writer, quick_repair {}: median {:.1} ms \
         (max {:.1}; {starts} crashes)",
        if quick_repair { "on " } else { "off" },
        median(&mut times.clone()),
        times.iter().copied().fold(0.0, f64::max),
    );
}

/// For reference: redb's own open with `set_check_integrity_on_open(true)` (every page's checksum
/// verified), the price of refusing a damaged file instead of possibly panicking on it.
fn integrity_check_open(c: &Config) {
    let path = c.data_dir.join(colibri::store::DB_FILE);
    let t = Instant::now();
    let mut b = redb::Database::builder();
    b.set_cache_size(4 << 20);
    b.set_check_integrity_on_open(true);
    let db = b.open(&path).expect("integrity-checked open");
    let ms = t.elapsed().as_secs_f64() * 1e3;
    drop(db);
    println!("  (reference) redb open with check_integrity_on_open, clean file: {ms:.0} ms");
}

/// (VmRSS KiB, VmHWM KiB) of `colibri run` a second after it logged "colibri started".
fn memory(cfg: &Path) -> (u64, u64) {
    let (_, _, _, child) = timed_start(cfg);
    std::thread::sleep(Duration::from_secs(1));
    let r = rss_kib(child.id());
    stop(child);
    r
}
