//! Dead-letter replay benchmark: 1M dead records (in 1M jobs by default, the most chunks)
//! replayed by `colibri queue dead replay` with the agent stopped (in the store) and through the
//! running agent's admin endpoint, and a replay through the agent killed (-9) halfway and run
//! again: how long each takes, the command's and the agent's peak memory, and that every dead
//! letter ends up in the queue once. Figures, not assertions: see BENCHMARKS.md.
//!
//!   cargo bench --bench dead_replay
//!   BENCH_DEAD_RECORDS=100000 cargo bench --bench dead_replay          # quicker
//!   COLIBRI_BIN=path/to/static/colibri cargo bench --bench dead_replay  # measure another build
//!
//! Settings (environment): BENCH_DEAD_RECORDS (1000000), BENCH_RECORDS_PER_JOB (1),
//! BENCH_DIR (cargo's target/tmp). The dead letters are made in-process through the store's
//! transactions (append, take, fail), then the store file is copied so each run starts from
//! the same backlog. About 3 minutes on 2 cores with the defaults.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use colibri::clock::now_ms;
use colibri::config::{self, Config};
use colibri::store::{Failure, OpenOptions, RecordBuf, Store};
use common::{admin_addr, bin, env_u64, log_lines, metric, rss_kib, signal, spawn_run, stop};

const STREAM: &str = "logs";
const RECORD_BYTES: usize = 200;

fn main() {
    let records = env_u64("BENCH_DEAD_RECORDS", 1_000_000);
    let per_job = env_u64("BENCH_RECORDS_PER_JOB", 1).max(1);
    let base = std::env::var("BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_TARGET_TMPDIR")));
    let dir = base.join(format!("dead-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("bench dir");
    let config = write_config(&dir, per_job, records);
    let c = config::load(&config).unwrap_or_else(|e| panic!("{}: {e}", config.display()));
    std::fs::create_dir_all(&c.data_dir).expect("data_dir");

    let started = Instant::now();
    let jobs = make_dead_letters(&c, records);
    let store_file = c.data_dir.join(colibri::store::DB_FILE);
    let size = std::fs::metadata(&store_file).map_or(0, |m| m.len());
    println!(
        "dead_replay: {records} dead records in {jobs} jobs ({per_job} per job, {RECORD_BYTES} B each), made in {:.1} s; store file {:.1} MB; colibri {}",
        started.elapsed().as_secs_f64(),
        size as f64 / 1e6,
        bin()
    );
    let saved = dir.join("saved.redb");
    std::fs::copy(&store_file, &saved).expect("keep a copy of the store");
    let restore = || {
        std::fs::copy(&saved, &store_file).expect("restore the store");
    };

    // 1. The agent stopped: the command opens the store.
    let (secs, peak, out) = timed(replay_cmd(&config, None));
    println!(
        "  in the store (agent stopped): {secs:.1} s ({:.0} k records/s), the command's peak RSS {:.1} MB; {}",
        records as f64 / secs / 1e3,
        peak as f64 / 1024.0,
        out.trim()
    );
    check_all_replayed(&c, jobs);

    // 2. Through the running agent.
    restore();
    let (mut agent, admin) = start(&config);
    let before = rss_kib(agent.id()).0;
    let (secs, peak, out) = timed(replay_cmd(&config, Some(admin)));
    let (rss, hwm) = rss_kib(agent.id());
    println!(
        "  through the agent: {secs:.1} s ({:.0} k records/s), the command's peak RSS {:.1} MB; the agent {:.1} MB before, {:.1} MB after, peak {:.1} MB; {}",
        records as f64 / secs / 1e3,
        peak as f64 / 1024.0,
        before as f64 / 1024.0,
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0,
        out.trim()
    );
    let dead = metric(admin, "colibri_stream_jobs{stream=\"logs\",queue=\"dead\"}");
    let ready = metric(
        admin,
        "colibri_stream_jobs{stream=\"logs\",queue=\"ready\"}",
    );
    println!("    after: {dead:?} dead jobs, {ready:?} ready (of {jobs})");
    let _ = agent.try_wait();
    stop(agent);

    // 3. Interrupted (kill -9 of the command halfway) and run again.
    restore();
    let (agent, admin) = start(&config);
    let dead_now = || metric(admin, "colibri_stream_jobs{stream=\"logs\",queue=\"dead\"}");
    let t0 = Instant::now();
    let mut first = replay_cmd(&config, Some(admin))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the replay");
    let deadline = Instant::now() + Duration::from_secs(600);
    while dead_now().is_some_and(|d| d > (jobs / 2) as f64) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    signal(&first, libc::SIGKILL);
    let _ = first.wait();
    let killed_at = t0.elapsed().as_secs_f64();
    let left = dead_now();
    let (secs, _, out) = timed(replay_cmd(&config, Some(admin)));
    let dead = dead_now();
    let ready = metric(
        admin,
        "colibri_stream_jobs{stream=\"logs\",queue=\"ready\"}",
    );
    println!(
        "  killed (-9) after {killed_at:.1} s with {left:?} dead jobs left; run again: {secs:.1} s, {}; after: {dead:?} dead, {ready:?} ready (of {jobs})",
        out.trim()
    );
    stop(agent);
    let _ = std::fs::remove_dir_all(&dir);
}

fn write_config(dir: &Path, per_job: u64, records: u64) -> PathBuf {
    let path = dir.join("colibri.yaml");
    let text = format!(
        "data_dir: {}\n\
         storage: {{ min_free: 1GiB, max_bytes: 64GiB }}\n\
         admin: {{ listen: \"127.0.0.1:0\" }}\n\
         streams:\n  \
           {STREAM}: {{ batch: {{ max_records: {per_job} }}, max_jobs: 100000000, max_bytes: 32GiB, dead_letter: {{ max_jobs: {} }} }}\n\
         log: {{ level: info, format: json }}\n",
        dir.join("data").display(),
        records + 1
    );
    std::fs::write(&path, text).expect("write config");
    path
}

/// Appends `records` and fails every job for good, in transactions of 10,000 records; returns
/// the dead jobs.
fn make_dead_letters(c: &Config, records: u64) -> u64 {
    let mut store = Store::open(&c.data_dir, c.storage, &c.streams, OpenOptions::default())
        .expect("open the store");
    let pad = "x".repeat(RECORD_BYTES - 40);
    let mut n = 0u64;
    while n < records {
        let mut buf = RecordBuf::new();
        for _ in 0..10_000.min(records - n) {
            buf.push(format!("{{\"seq\":{n:>12},\"pad\":\"{pad}\"}}").as_bytes());
            n += 1;
        }
        let mut tx = store.transaction().expect("transaction");
        tx.append(STREAM, &buf, None, now_ms()).expect("append");
        tx.commit().expect("commit");
    }
    let failure = Failure::Permanent {
        reason: "400 from the bench".into(),
    };
    let mut dead = 0u64;
    loop {
        let mut tx = store.transaction().expect("transaction");
        let jobs = tx.take(STREAM, 10_000, u64::MAX, now_ms()).expect("take");
        if jobs.is_empty() {
            tx.abort().expect("abort");
            break;
        }
        for j in &jobs {
            tx.fail(&j.lease, &failure, now_ms()).expect("fail");
        }
        dead += jobs.len() as u64;
        tx.commit().expect("commit");
    }
    dead
}

fn replay_cmd(config: &Path, admin: Option<std::net::SocketAddr>) -> Command {
    let mut cmd = Command::new(bin());
    cmd.args(["queue", "dead", "replay", STREAM, "--json", "--config"])
        .arg(config);
    if let Some(a) = admin {
        cmd.arg("--admin").arg(format!("http://{a}"));
    }
    cmd
}

/// Runs `cmd` to its end: seconds, its peak RSS (KiB, from wait4) and its stdout.
fn timed(mut cmd: Command) -> (f64, u64, String) {
    let out = dir_file("replay.out");
    let t = Instant::now();
    let child = cmd
        .stdout(std::fs::File::create(&out).expect("stdout file"))
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn");
    let (code, peak) = wait4(child);
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(code, 0, "the replay failed");
    (
        secs,
        peak,
        std::fs::read_to_string(&out).unwrap_or_default(),
    )
}

fn dir_file(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{}-{name}", std::process::id()))
}

/// Reaps `child`: its exit code and peak RSS in KiB.
fn wait4(child: Child) -> (i32, u64) {
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value of this plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: the pid of a child we spawned and have not reaped; both pointers are to live
    // locals of the right types.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert!(pid > 0, "wait4 failed");
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        -1
    };
    (code, usage.ru_maxrss as u64)
}

fn start(config: &Path) -> (Child, std::net::SocketAddr) {
    let mut agent = spawn_run(config);
    let logs = log_lines(&mut agent);
    let admin = admin_addr(&logs);
    // The log is drained for the agent's whole life, or a full pipe would stop it.
    std::thread::spawn(move || while logs.recv().is_ok() {});
    (agent, admin)
}

fn check_all_replayed(c: &Config, jobs: u64) {
    let store = Store::open(
        &c.data_dir,
        c.storage,
        &c.streams,
        OpenOptions {
            read_only: true,
            ..OpenOptions::default()
        },
    )
    .expect("open the store read-only");
    let n = store.counters(STREAM).expect("the stream");
    println!(
        "    after: {} dead jobs, {} ready (of {jobs})",
        n.dead_jobs, n.ready_jobs
    );
}
