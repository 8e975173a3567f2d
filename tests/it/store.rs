//! End-to-end tests of the durable store through the real binary: `colibri queue push` killed with
//! SIGKILL at random moments, a disk that fills up (a small tmpfs, when running as root), a damaged
//! database file, and the operator's `colibri queue` commands. Every process is a real child on real
//! files; every wait is a bounded poll; a child still running when a test ends is killed by its guard.
//!
//! Records are lines `r<seq>` (sometimes padded: `r<seq>-xxx...`), with `seq` never reused within a
//! test, so what is found in the store can be matched against what was fed and what was acknowledged.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::util::{Proc, Sandbox, assert_code, field, finish, head, poll, quote_path};
use crate::util::{queue, queue_stats, secs, stop, stream_stats};

/// A config with two streams, `logs` (the one the tests fill) and `metrics`, logging JSON.
fn write_config(sb: &Sandbox, data_dir: &str, storage: &str) -> PathBuf {
    sb.write_config(&format!(
        "data_dir: {data_dir}\n\
         storage: {storage}\n\
         streams:\n  \
           logs: {{ batch: {{ max_records: 100 }}, max_jobs: 1000000, max_bytes: 1GiB, when_full: block }}\n  \
           metrics: {{}}\n\
         log: {{ format: json }}\n"
    ))
}

/// The JSON log events among `stderr`'s complete lines. Unlike `Proc::events`, a line that is not
/// JSON (a panic message) is skipped rather than fatal: these tests look for exactly such lines.
fn json_events(stderr: &str) -> Vec<Value> {
    crate::util::complete_lines(stderr)
        .iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn has_message(events: &[Value], message: &str) -> bool {
    events.iter().any(|e| field(e, "message") == message)
}

/// A panic message, an abort or the panic exit code: what must never come out of colibri.
fn panicked(status: Option<ExitStatus>, stderr: &str) -> bool {
    stderr.contains("panicked") || status.is_some_and(died_of_panic)
}

/// Ended by a panic: the panic exit code, or SIGABRT (`panic = "abort"`).
fn died_of_panic(status: ExitStatus) -> bool {
    status.code() == Some(101) || status.signal() == Some(libc::SIGABRT)
}

/// Starts `colibri run` and waits until it logs "colibri started".
fn start_agent(config: &Path) -> Proc {
    let agent = Proc::run(config);
    agent.wait_for_event(secs(30), "colibri started", |e| {
        field(e, "message") == "colibri started"
    });
    agent
}

/// The store file exists only once colibri has run: run it once.
fn create_store(config: &Path) {
    let agent = stop(start_agent(config));
    assert!(
        has_message(&agent.events(), "store opened"),
        "{}",
        agent.stderr()
    );
}

/// What a `colibri queue push` is fed on stdin.
#[derive(Clone, Copy)]
struct Feed {
    /// The first `seq`.
    start: u64,
    /// Lines to write before closing stdin; `None`: until the pipe breaks.
    count: Option<u64>,
    /// Bytes of padding per record (`-xxx...`).
    pad: usize,
    /// The padding is noise (letters drawn from `seq`) that compression at rest cannot shrink,
    /// rather than `x`s: a full disk is then a few thousand records, not half a million.
    noise: bool,
}

fn record(seq: u64, pad: usize) -> String {
    if pad == 0 {
        format!("r{seq}\n")
    } else {
        format!("r{seq}-{}\n", "x".repeat(pad))
    }
}

/// A record padded with `pad` bytes of noise drawn from `seq` (xorshift, 64 letters and digits).
fn noisy_record(seq: u64, pad: usize) -> String {
    const ALPHABET: &[u8; 64] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.";
    let mut x = seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let noise: String = (0..pad)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(ALPHABET[(x >> 58) as usize])
        })
        .collect();
    format!("r{seq}-{noise}\n")
}

/// The `seq` of a record, or a panic naming it.
fn seq_of(record: &str) -> u64 {
    record
        .strip_prefix('r')
        .and_then(|r| r.split('-').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a record that no test wrote: {record:?}"))
}

/// A running `colibri queue push`: stdin fed by a thread, `acked N` receipts parsed as they come.
/// Killed (SIGKILL) and reaped on drop if still running.
struct Push {
    child: Child,
    status: Option<ExitStatus>,
    /// Every receipt, in order.
    receipts: Arc<Mutex<Vec<u64>>>,
    /// The same receipts, as they arrive.
    receipt_rx: mpsc::Receiver<u64>,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<Vec<u8>>>,
    /// Returns the `seq` after the last line it wrote (or tried to write).
    feeder: Option<JoinHandle<u64>>,
    readers: Vec<JoinHandle<()>>,
}

impl Push {
    fn spawn(config: &Path, stream: &str, batch: u64, feed: Feed) -> Push {
        let batch = batch.to_string();
        let mut child = queue(config, &["push", stream, "--batch", &batch])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn colibri queue push");
        let stdin = child.stdin.take().expect("piped");
        let feeder = std::thread::spawn(move || {
            let mut w = std::io::BufWriter::with_capacity(4096, stdin);
            let end = feed.count.map_or(u64::MAX, |n| feed.start + n);
            let mut seq = feed.start;
            while seq < end {
                // A line counts as fed once handed over, even if the pipe then breaks: the next
                // `seq` is never one the child might have read.
                let line = if feed.noise {
                    noisy_record(seq, feed.pad)
                } else {
                    record(seq, feed.pad)
                };
                seq += 1;
                if w.write_all(line.as_bytes()).is_err() {
                    return seq;
                }
            }
            let _ = w.flush();
            seq
        });
        let (tx, receipt_rx) = mpsc::channel();
        let receipts = Arc::new(Mutex::new(Vec::new()));
        let stdout = Arc::new(Mutex::new(String::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let out = BufReader::new(child.stdout.take().expect("piped"));
        let (r, o) = (Arc::clone(&receipts), Arc::clone(&stdout));
        let out_reader = std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                if let Some(n) = line.strip_prefix("acked ").and_then(|n| n.parse().ok()) {
                    r.lock().unwrap().push(n);
                    let _ = tx.send(n);
                }
                let mut o = o.lock().unwrap();
                o.push_str(&line);
                o.push('\n');
            }
        });
        let mut err = child.stderr.take().expect("piped");
        let e = Arc::clone(&stderr);
        let err_reader = std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = err.read_to_end(&mut buf);
            e.lock().unwrap().extend_from_slice(&buf);
        });
        Push {
            child,
            status: None,
            receipts,
            receipt_rx,
            stdout,
            stderr,
            feeder: Some(feeder),
            readers: vec![out_reader, err_reader],
        }
    }

    fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).expect("pids fit i32")
    }

    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).into_owned()
    }

    fn stdout(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    fn receipts(&self) -> Vec<u64> {
        self.receipts.lock().unwrap().clone()
    }

    /// Waits for the `n`th receipt; `false` if the process ended or `limit` passed first.
    fn wait_receipts(&mut self, n: usize, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut seen = 0;
        while seen < n {
            let left = deadline.saturating_duration_since(Instant::now());
            match self
                .receipt_rx
                .recv_timeout(left.min(Duration::from_millis(100)))
            {
                Ok(_) => seen += 1,
                Err(mpsc::RecvTimeoutError::Disconnected) => return false,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if Instant::now() >= deadline || matches!(self.child.try_wait(), Ok(Some(_))) {
                        return false;
                    }
                }
            }
        }
        true
    }

    fn kill9(&self) {
        assert!(self.status.is_none(), "already reaped");
        crate::util::send_signal(self.pid(), libc::SIGKILL);
    }

    /// Waits for the exit, then for stdout/stderr to be complete and the feeder to stop; returns
    /// the status and the `seq` after the last line fed.
    fn wait_exit(&mut self, limit: Duration) -> (ExitStatus, u64) {
        let child = &mut self.child;
        let status = poll(limit, || child.try_wait().expect("try_wait"))
            .unwrap_or_else(|| panic!("push still running after {limit:?}"));
        self.status = Some(status);
        // The pipes close with the process (it starts no children): the threads end promptly.
        poll(secs(10), || {
            self.readers.iter().all(|r| r.is_finished()).then_some(())
        })
        .expect("stdout/stderr readers end once the process is gone");
        for r in std::mem::take(&mut self.readers) {
            r.join().expect("reader thread");
        }
        let feeder = self.feeder.take().expect("waited once");
        poll(secs(10), || feeder.is_finished().then_some(()))
            .expect("the feeder stops once the pipe is closed");
        (status, feeder.join().expect("feeder thread"))
    }
}

impl Drop for Push {
    fn drop(&mut self) {
        if self.status.is_none() && matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Pushes `count` records from `start` and waits for a clean exit; returns the receipts.
fn push_ok(config: &Path, batch: u64, start: u64, count: u64) -> Vec<u64> {
    let feed = Feed {
        start,
        count: Some(count),
        pad: 0,
        noise: false,
    };
    let mut p = Push::spawn(config, "logs", batch, feed);
    let (status, _) = p.wait_exit(secs(60));
    assert_code(status, 0, &p.stderr());
    let receipts = p.receipts();
    assert_eq!(
        receipts.last().copied().unwrap_or(0),
        count,
        "{}",
        p.stdout()
    );
    receipts
}

/// Opens the store for writing and closes it again (`push` with nothing to push): redb repairs a
/// file a killed writer left unclean. The read-only `peek` cannot do that itself: see
/// `stats_and_peek_work_after_a_crash_without_a_writer`.
fn repair(config: &Path) {
    let f = finish(queue(config, &["push", "logs"]), secs(60));
    assert_code(f.status, 0, &f.stderr);
    assert_eq!(f.stdout, "", "nothing to push, nothing acknowledged");
}

/// Every record of a stream, oldest first, through `colibri queue peek --all --json`.
pub(crate) fn peek_all(config: &Path, stream: &str) -> Vec<String> {
    let f = finish(
        queue(config, &["peek", stream, "--all", "--json"]),
        secs(60),
    );
    assert_code(f.status, 0, &f.stderr);
    let mut out = Vec::new();
    for line in f.stdout.lines() {
        let job: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("peek line is not JSON ({e}): {line}"));
        let records = job["records"]
            .as_array()
            .unwrap_or_else(|| panic!("a job that cannot be decoded: {job}"));
        out.extend(
            records
                .iter()
                .map(|r| r.as_str().expect("string").to_string()),
        );
    }
    out
}

/// `colibri queue stats --json`, and the entry of `stream` in it.
fn stats(config: &Path, stream: &str) -> (Value, Value) {
    let doc = queue_stats(config, &[]);
    let entry = stream_stats(&doc, stream);
    (doc, entry)
}

/// One `push` process of the crash test: it was fed `start..end`, committed `batch` records at a
/// time, and printed receipts up to `acked` (counted from its own start) before it was killed.
#[derive(Debug, Clone, Copy)]
struct Life {
    start: u64,
    end: u64,
    batch: u64,
    acked: u64,
}

/// Checks the store's records against the lives of the killed pushes: strictly increasing `seq`
/// (in order, never twice), and per life a contiguous prefix of what it was fed, holding every
/// acknowledged record and at most the one commit whose receipt the kill cut off.
fn check_lives(records: &[String], lives: &[Life]) {
    let seqs: Vec<u64> = records.iter().map(|r| seq_of(r)).collect();
    for w in seqs.windows(2) {
        assert!(
            w[0] < w[1],
            "r{} followed by r{}: {}",
            w[0],
            w[1],
            if w[0] == w[1] {
                "a record stored twice"
            } else {
                "out of order"
            }
        );
    }
    let mut rest = &seqs[..];
    for (i, life) in lives.iter().enumerate() {
        let k = rest.iter().take_while(|s| **s < life.end).count();
        let (mine, after) = rest.split_at(k);
        let expected: Vec<u64> = (life.start..life.start + k as u64).collect();
        assert_eq!(
            mine,
            &expected[..],
            "life {i} {life:?}: not a contiguous prefix of what it was fed"
        );
        let k = k as u64;
        assert!(
            k >= life.acked,
            "life {i} {life:?}: acknowledged records lost: {} of {} present",
            k,
            life.acked
        );
        assert!(
            k == life.acked || k == life.acked + life.batch,
            "life {i} {life:?}: {k} present; only the acknowledged ones and at most the one commit \
             whose receipt the kill cut off may be"
        );
        rest = after;
    }
    assert!(
        rest.is_empty(),
        "records no push was fed: {}",
        head(rest, 10)
    );
}

#[test]
fn kill_9_never_loses_an_acknowledged_record() {
    const LIVES: usize = 12;
    let seed = std::env::var("COLIBRI_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    eprintln!("seed {seed} (COLIBRI_TEST_SEED={seed} repeats the choices, not the timing)");
    let mut rng = fastrand::Rng::with_seed(seed);
    let sb = Sandbox::new();
    let config = write_config(&sb, "data", "{ min_free: 1MiB, max_bytes: 2GiB }");
    create_store(&config);

    let mut lives: Vec<Life> = Vec::new();
    let mut next = 1;
    for i in 0..LIVES {
        let batch = rng.u64(1..=200);
        let feed = Feed {
            start: next,
            count: None,
            pad: 0,
            noise: false,
        };
        let mut p = Push::spawn(&config, "logs", batch, feed);
        let how = if rng.bool() {
            let ms = rng.u64(5..=300);
            std::thread::sleep(Duration::from_millis(ms));
            format!("{ms} ms after start")
        } else {
            let n = rng.usize(1..=30);
            assert!(
                p.wait_receipts(n, secs(30)),
                "life {i}: no {n} receipts within 30 s; stderr:\n{}",
                p.stderr()
            );
            format!("right after receipt {n}")
        };
        p.kill9();
        let (status, end) = p.wait_exit(secs(10));
        assert_eq!(
            status.signal(),
            Some(libc::SIGKILL),
            "life {i}: push ended before the kill ({status}); stderr:\n{}",
            p.stderr()
        );
        let receipts = p.receipts();
        let expected: Vec<u64> = (1..=receipts.len() as u64).map(|n| n * batch).collect();
        assert_eq!(
            receipts, expected,
            "life {i}: a receipt per commit of {batch}"
        );
        let life = Life {
            start: next,
            end,
            batch,
            acked: receipts.last().copied().unwrap_or(0),
        };
        eprintln!(
            "life {i}: batch {batch}, killed {how}, fed {}, acked {}",
            end - next,
            life.acked
        );
        lives.push(life);
        next = end;
        if i % 4 == 3 {
            repair(&config);
            check_lives(&peek_all(&config, "logs"), &lives);
        }
    }

    repair(&config);
    let records = peek_all(&config, "logs");
    check_lives(&records, &lives);
    let acked: u64 = lives.iter().map(|l| l.acked).sum();
    eprintln!(
        "{} records stored, {acked} acknowledged, over {LIVES} kills",
        records.len()
    );
    let (_, logs) = stats(&config, "logs");
    assert_eq!(logs["ready"]["records"], records.len() as u64, "{logs}");
    assert_eq!(
        logs["counters"]["appended_records"],
        records.len() as u64,
        "{logs}"
    );
    assert_eq!(logs["balanced"], true, "{logs}");
    // All but the first few jobs of this backlog were stored compressed (`compression: auto`):
    // the kills hit compressed jobs too.
    assert!(
        logs["ready"]["raw_bytes"].as_u64() > logs["ready"]["bytes"].as_u64(),
        "{logs}"
    );

    // The agent starts on the file the kills left behind.
    let agent = stop(start_agent(&config));
    let events = agent.events();
    let opened = events
        .iter()
        .find(|e| field(e, "message") == "store opened")
        .unwrap_or_else(|| panic!("no store opened event: {}", agent.stderr()));
    assert!(
        opened["queued_bytes"].as_u64() > Some(0) || records.is_empty(),
        "{opened}"
    );
    let errors: Vec<&Value> = events
        .iter()
        .filter(|e| field(e, "level") == "ERROR")
        .collect();
    assert!(errors.is_empty(), "ERROR events: {}", head(&errors, 5));
}

/// Inspection after a crash, with no agent running, is exactly when an operator needs it.
#[test]
fn an_empty_dead_list_says_there_are_none() {
    let sb = Sandbox::new();
    let config = write_config(&sb, "data", "{ min_free: 1MiB, max_bytes: 2GiB }");
    create_store(&config);
    let f = finish(queue(&config, &["dead", "list", "logs"]), secs(60));
    assert_code(f.status, 0, &f.stderr);
    assert_eq!(f.stdout, "", "standard output stays empty for scripts");
    assert!(
        f.stderr.contains("no dead letters in stream logs"),
        "{}",
        f.stderr
    );
    let f = finish(queue(&config, &["peek", "logs"]), secs(60));
    assert_code(f.status, 0, &f.stderr);
    assert!(
        f.stderr.contains("no jobs waiting in stream logs"),
        "{}",
        f.stderr
    );
}

#[test]
fn stats_and_peek_work_after_a_crash_without_a_writer() {
    let sb = Sandbox::new();
    let config = write_config(&sb, "data", "{ min_free: 1MiB, max_bytes: 2GiB }");
    create_store(&config);
    let feed = Feed {
        start: 1,
        count: None,
        pad: 0,
        noise: false,
    };
    let mut p = Push::spawn(&config, "logs", 10, feed);
    assert!(p.wait_receipts(3, secs(30)), "{}", p.stderr());
    p.kill9();
    let (_, _) = p.wait_exit(secs(10));
    let acked = p.receipts().last().copied().unwrap_or(0);

    let f = finish(queue(&config, &["stats", "--json"]), secs(60));
    assert_code(f.status, 0, &f.stderr);
    let f = finish(
        queue(&config, &["peek", "logs", "--all", "--json"]),
        secs(60),
    );
    assert_code(f.status, 0, &f.stderr);
    let records = peek_all(&config, "logs");
    assert!(
        records.len() as u64 >= acked,
        "{acked} acked, {} found",
        records.len()
    );
}

/// A tmpfs mounted for the life of the value.
pub(crate) struct Tmpfs {
    pub(crate) dir: PathBuf,
}

impl Tmpfs {
    /// `None` (with the reason on stderr) where mounting is not possible.
    pub(crate) fn mount(dir: PathBuf, size: &str) -> Option<Tmpfs> {
        // SAFETY: geteuid(2) has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("SKIPPED: mounting a tmpfs needs root");
            return None;
        }
        std::fs::create_dir_all(&dir).expect("create the mount point");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Tmpfs { dir }),
            Ok(o) => {
                eprintln!(
                    "SKIPPED: cannot mount a tmpfs ({}): {}",
                    o.status,
                    String::from_utf8_lossy(&o.stderr).trim()
                );
                None
            }
            Err(e) => {
                eprintln!("SKIPPED: cannot run mount: {e}");
                None
            }
        }
    }

    /// Free bytes, as colibri sees them (statvfs f_bavail).
    pub(crate) fn free(&self) -> u64 {
        let c = std::ffi::CString::new(self.dir.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: all-zero bytes are a valid statvfs (integers only).
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: `c` is NUL-terminated and outlives the call; `s` is a writable statvfs.
        let rc = unsafe { libc::statvfs(c.as_ptr(), &mut s) };
        assert_eq!(rc, 0, "statvfs {}", self.dir.display());
        #[expect(
            clippy::useless_conversion,
            reason = "the field types differ between platforms"
        )]
        let free = u64::from(s.f_bavail) * u64::from(s.f_frsize);
        free
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.dir)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
    }
}

/// Pushes records padded with 1 KiB of noise (`batch` per commit) until `push` exits by itself; returns
/// (exit status, stderr, receipts, seq after the last line fed).
fn push_until_it_fails(
    config: &Path,
    start: u64,
    batch: u64,
) -> (ExitStatus, String, Vec<u64>, u64) {
    let feed = Feed {
        start,
        count: Some(1_000_000),
        pad: 1000,
        noise: true,
    };
    let mut p = Push::spawn(config, "logs", batch, feed);
    let (status, end) = p.wait_exit(secs(120));
    (status, p.stderr(), p.receipts(), end)
}

#[test]
fn disk_full_on_a_tmpfs_is_an_error_not_a_loss() {
    let sb = Sandbox::new();

    // 1. redb itself meets ENOSPC: min_free 0, a budget far above the disk.
    {
        let Some(fs) = Tmpfs::mount(sb.file("full"), "8m") else {
            return;
        };
        let data = fs.dir.join("data");
        let config = write_config(&sb, &quote_path(&data), "{ min_free: 0B, max_bytes: 1GiB }");
        create_store(&config);
        // A filler takes most of the space, so it can be given back later.
        let filler = fs.dir.join("filler");
        std::fs::write(&filler, vec![0x5a_u8; 5 << 20]).expect("write the filler");
        let batch = 50;
        let (status, stderr, receipts, _) = push_until_it_fails(&config, 1, batch);
        eprintln!(
            "ENOSPC: push exited {status} after {} receipts; free {} bytes; stderr: {}",
            receipts.len(),
            fs.free(),
            stderr.trim()
        );
        assert!(
            !panicked(Some(status), &stderr),
            "push panicked: {status}\n{stderr}"
        );
        assert_code(status, 1, &stderr);
        assert!(
            stderr.contains("No space left on device"),
            "the error names the cause: {stderr}"
        );
        let acked = receipts.last().copied().unwrap_or(0);
        assert!(acked > 0, "some records fit before the disk filled up");

        // The agent still starts on the full disk (it must, to drain the backlog), and stops.
        let agent = stop(start_agent(&config));
        assert!(!panicked(None, &agent.stderr()), "{}", agent.stderr());

        // Re-opened: every acknowledged record is there, in order; at most the failed commit more.
        let records = peek_all(&config, "logs");
        let life = Life {
            start: 1,
            end: 1_000_001,
            batch,
            acked,
        };
        check_lives(&records, &[life]);

        // Space given back: pushing works again, and nothing was lost or doubled.
        std::fs::remove_file(&filler).expect("remove the filler");
        let next = 1 + records.len() as u64;
        push_ok(&config, 20, next, 200);
        let records = peek_all(&config, "logs");
        let seqs: Vec<u64> = records.iter().map(|r| seq_of(r)).collect();
        let expected: Vec<u64> = (1..next + 200).collect();
        assert_eq!(seqs, expected, "all records, once each, in order");
        let (_, logs) = stats(&config, "logs");
        assert_eq!(logs["balanced"], true, "{logs}");
        assert_eq!(logs["ready"]["records"], expected.len() as u64, "{logs}");
    }

    // 2. storage.min_free 6MiB on an 8 MiB disk: the stream is full long before the disk is.
    {
        let Some(fs) = Tmpfs::mount(sb.file("min-free"), "8m") else {
            return;
        };
        let data = fs.dir.join("data");
        let config = write_config(
            &sb,
            &quote_path(&data),
            "{ min_free: 6MiB, max_bytes: 1GiB }",
        );
        create_store(&config);
        let (status, stderr, receipts, _) = push_until_it_fails(&config, 1, 50);
        let free = fs.free();
        eprintln!(
            "min_free: push exited {status} after {} receipts; free {free} bytes; stderr: {}",
            receipts.len(),
            stderr.trim()
        );
        assert!(
            !panicked(Some(status), &stderr),
            "push panicked: {status}\n{stderr}"
        );
        assert_code(status, 1, &stderr);
        assert!(
            stderr.contains("min_free"),
            "the error names min_free: {stderr}"
        );
        assert!(
            !stderr.contains("No space left"),
            "min_free stops writing before the disk is full: {stderr}"
        );
        // The check is made before each commit against the job's bytes, while redb also writes
        // pages and grows the file: most of min_free must be left, if not every byte of it.
        assert!(free > 4 << 20, "min_free (6 MiB) kept: {free} bytes free");
        let acked = receipts.last().copied().unwrap_or(0);
        assert!(acked > 0, "some records fit above min_free");
        // A full stream refuses before writing: exactly the acknowledged records are there.
        let seqs: Vec<u64> = peek_all(&config, "logs")
            .iter()
            .map(|r| seq_of(r))
            .collect();
        assert_eq!(seqs, (1..=acked).collect::<Vec<u64>>());
        let (_, logs) = stats(&config, "logs");
        assert_eq!(logs["balanced"], true, "{logs}");
    }
}

/// `storage.min_free` within one transaction: the writer's group commit applies up to 4096 appends
/// in one, so each must count what the ones before it in the same transaction take. In-process
/// (the real `Store` on a real tmpfs), one transaction of 160 appends of ~250 KB against 24 MB of
/// room above min_free.
#[test]
fn min_free_holds_within_one_transaction() {
    use colibri::clock::now_ms;
    use colibri::store::{AppendError, FullReason, OpenOptions, Store};
    let sb = Sandbox::new();
    let Some(fs) = Tmpfs::mount(sb.file("disk"), "64m") else {
        return;
    };
    let data = fs.dir.join("data");
    let config = write_config(
        &sb,
        &quote_path(&data),
        "{ min_free: 40MiB, max_bytes: 1GiB }",
    );
    let c = colibri::config::load(&config).expect("config");
    let mut store = Store::open(&c.data_dir, c.storage, &c.streams, OpenOptions::default())
        .expect("open the store");
    let before = fs.free();
    // Just under a 256 KiB redb page, so the file grows by about what colibri counts; random,
    // so that compression (the stream's `auto` once a backlog waits) leaves it its size.
    let mut rng = fastrand::Rng::with_seed(5);
    let record: Vec<u8> = (0..250_000).map(|_| rng.u8(..)).collect();
    let record = colibri::store::RecordBuf::from(vec![record]);
    let (mut accepted, mut refused) = (0, 0);
    let mut tx = store.transaction().expect("transaction");
    for _ in 0..160 {
        match tx.append("logs", &record, None, now_ms()) {
            Ok(_) => accepted += 1,
            Err(AppendError::Full {
                reason: FullReason::MinFree,
                ..
            }) => refused += 1,
            Err(e) => panic!("append: {e}"),
        }
    }
    tx.commit().expect("commit");
    drop(store);
    let after = fs.free();
    eprintln!(
        "free before {before}, after {after}; min_free {}; {accepted} accepted, {refused} refused",
        40 << 20
    );
    assert!(
        accepted > 0 && refused > 0,
        "the bound was reached within the transaction"
    );
    // Slack for redb's own pages (tree, allocator state): 2 MiB.
    assert!(
        after + (2 << 20) >= 40 << 20,
        "{accepted} appends accepted in one transaction left {after} bytes free, below min_free \
         (40 MiB) by {} bytes",
        (40u64 << 20).saturating_sub(after)
    );
}

/// How `colibri run` dealt with a damaged store (the fields are shown through `Debug`).
#[derive(Debug)]
#[expect(dead_code, reason = "the fields are read through Debug only")]
enum Outcome {
    /// redb opened (repaired) the file; `queued_bytes` from the "store opened" event.
    Opened { queued_bytes: u64 },
    /// Moved aside to this file, which exists.
    MovedAside(PathBuf),
    /// Panicked, aborted, or never started.
    Failed(String),
}

/// A store with 20,000 records in 40 jobs, damaged by `damage`; the sandbox keeps it alive.
fn damaged_store(damage: impl FnOnce(&Path)) -> (Sandbox, PathBuf) {
    let sb = Sandbox::new();
    let config = write_config(&sb, "data", "{ min_free: 1MiB, max_bytes: 2GiB }");
    create_store(&config);
    let feed = Feed {
        start: 1,
        count: Some(20_000),
        pad: 20,
        noise: false,
    };
    let mut p = Push::spawn(&config, "logs", 500, feed);
    let (status, _) = p.wait_exit(secs(60));
    assert_code(status, 0, &p.stderr());
    damage(&sb.file("data").join("colibri.redb"));
    (sb, config)
}

/// Damages a fresh store with `damage`, starts the agent on it, and says what happened.
fn run_on_damaged_store(name: &str, damage: impl FnOnce(&Path)) -> Outcome {
    let (_sb, config) = damaged_store(damage);
    let mut agent = Proc::run(&config);
    let started = poll(secs(30), || {
        let events = json_events(&agent.stderr());
        if has_message(&events, "colibri started") {
            return Some(true);
        }
        crate::util::is_gone(agent.pid()).then_some(false)
    });
    if started != Some(true) {
        let status = agent.wait_exit(secs(10));
        eprintln!("{name}: FAILED, did not start ({status})");
        return Outcome::Failed(format!(
            "{name}: did not start ({status}); stderr:\n{}",
            agent.stderr()
        ));
    }
    let agent = stop(agent);
    // A panic that colibri caught and turned into an error still prints its message (not JSON).
    if agent.stderr().contains("panicked") {
        eprintln!("{name}: note: colibri caught a panic (its message is on stderr)");
    }
    let events = json_events(&agent.stderr());
    let aside = events
        .iter()
        .find(|e| field(e, "level") == "ERROR" && field(e, "message").contains("moved aside"));
    let outcome = match aside {
        Some(e) => {
            let path = PathBuf::from(field(e, "moved_to"));
            // Absolute: data_dir is resolved against the config file's (absolute) directory.
            // Kept, under that name or, once the agent salvaged it, with `.salvaged` added.
            let salvaged = PathBuf::from(format!("{}.salvaged", path.display()));
            assert!(
                path.exists() || salvaged.exists(),
                "{name}: moved to {} which does not exist",
                path.display()
            );
            let file_name = path.file_name().unwrap().to_string_lossy().into_owned();
            assert!(
                file_name.starts_with("colibri.redb.corrupt-"),
                "{file_name}"
            );
            Outcome::MovedAside(path)
        }
        None => {
            let opened = events
                .iter()
                .find(|e| field(e, "message") == "store opened")
                .unwrap_or_else(|| panic!("{name}: no store opened event: {}", agent.stderr()));
            Outcome::Opened {
                queued_bytes: opened["queued_bytes"].as_u64().unwrap_or(0),
            }
        }
    };
    eprintln!("{name}: {outcome:?}");
    outcome
}

fn truncate_to_half(db: &Path) {
    let len = std::fs::metadata(db).expect("store file").len();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(db)
        .expect("open");
    f.set_len(len / 2).expect("truncate");
    f.sync_all().expect("sync");
}

/// Overwrites up to `len` bytes from `at` (a fraction of the length, page-aligned, never the first
/// page: redb's header) with seeded garbage.
fn garbage_at(at: f64, len: u64) -> impl FnOnce(&Path) {
    move |db: &Path| {
        let size = std::fs::metadata(db).expect("store file").len();
        let offset = (((size as f64 * at) as u64) / 4096 * 4096).max(4096);
        let len = len.min(size - offset) as usize;
        let mut rng = fastrand::Rng::with_seed(offset);
        let junk: Vec<u8> = std::iter::repeat_with(|| rng.u8(..)).take(len).collect();
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(db)
            .expect("open");
        std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(offset)).expect("seek");
        f.write_all(&junk).expect("write garbage");
        f.sync_all().expect("sync");
    }
}

#[test]
fn corrupt_file_is_moved_aside_and_the_agent_starts() {
    // The middle of the file, as asked; also 5 % in and everything after the first page, where
    // the release build's open reads (the debug build's open walks every page, and panics on any).
    type Damage = Box<dyn FnOnce(&Path)>;
    let cases: Vec<(&str, Damage)> = vec![
        ("garbage in the middle", Box::new(garbage_at(0.5, 64 << 10))),
        ("garbage 5 % in", Box::new(garbage_at(0.05, 64 << 10))),
        (
            "garbage after the first page",
            Box::new(garbage_at(0.0, u64::MAX)),
        ),
        ("truncated to half", Box::new(truncate_to_half)),
    ];
    let mut failed = Vec::new();
    for (name, damage) in cases {
        match run_on_damaged_store(name, damage) {
            Outcome::Failed(why) => failed.push(why),
            Outcome::Opened { .. } | Outcome::MovedAside(_) => {}
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}

/// Writes `f` over the store file's bytes.
fn rewrite(db: &Path, f: impl FnOnce(&mut Vec<u8>)) {
    let mut bytes = std::fs::read(db).expect("store file");
    f(&mut bytes);
    std::fs::write(db, &bytes).expect("write the damaged file");
}

/// The damage that made `colibri run` exit 1 before (issue 17: a restart loop under systemd):
/// redb refused the file before colibri's recovery saw a "corrupted" answer. Each now starts, with
/// the file moved aside (or, empty, replaced), and the moved file is listed by `queue stats` and
/// counted in `/metrics`.
#[test]
fn damage_that_stopped_start_up_moves_the_file_aside() {
    type Damage = Box<dyn FnOnce(&Path)>;
    let cases: Vec<(&str, Damage, bool)> = vec![
        (
            "a flipped byte in the magic number",
            Box::new(|db: &Path| rewrite(db, |b| b[0] ^= 0x01)),
            true,
        ),
        (
            "an empty file",
            Box::new(|db: &Path| rewrite(db, |b| b.clear())),
            false,
        ),
        (
            "cut to 100 bytes",
            Box::new(|db: &Path| rewrite(db, |b| b.truncate(100))),
            true,
        ),
        (
            "two bytes of the header's version",
            Box::new(|db: &Path| rewrite(db, |b| b[64..66].iter_mut().for_each(|x| *x ^= 0xff))),
            true,
        ),
    ];
    let mut failed = Vec::new();
    for (name, damage, kept) in cases {
        match run_on_damaged_store(name, damage) {
            Outcome::MovedAside(_) if kept => {}
            Outcome::Opened { queued_bytes: 0 } if !kept => {}
            other => failed.push(format!("{name}: {other:?}")),
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));

    // What an operator sees afterwards, with the agent stopped and running.
    let (sb, config) = damaged_store(|db| rewrite(db, |b| b[0] ^= 0x01));
    let damaged_len = std::fs::metadata(sb.file("data").join("colibri.redb"))
        .unwrap()
        .len();
    let agent = Proc::run(&config);
    agent.wait_until(secs(30), "colibri started", || {
        has_message(&json_events(&agent.stderr()), "colibri started")
    });
    // `stop` checks the exit status.
    stop(agent);
    let doc = queue_stats(&config, &[]);
    let files = doc["damaged_files"].as_array().expect("damaged_files");
    assert_eq!(files.len(), 1, "{doc}");
    assert_eq!(files[0]["bytes"].as_u64(), Some(damaged_len), "{doc}");
    let text = finish(queue(&config, &["stats"]), secs(30));
    assert!(
        text.stdout.contains("damaged store moved aside"),
        "{}",
        text.stdout
    );
    // The fresh store works: a push is acknowledged.
    assert_eq!(push_ok(&config, 1, 1, 2), vec![1, 2]);
}

/// `peek` and `stats` on a damaged file, with the agent stopped (an operator looking into why it
/// would not start): an error, or what can be read, but never a panic.
#[test]
fn peek_and_stats_on_a_damaged_file_are_errors_not_panics() {
    let cases = [
        ("garbage in the middle", 0.5, 64 << 10),
        ("garbage 5 % in", 0.05, 64 << 10),
        ("garbage after the first page", 0.0, u64::MAX),
    ];
    let mut failed = Vec::new();
    for (name, at, len) in cases {
        let (_sb, config) = damaged_store(garbage_at(at, len));
        for args in [
            &["peek", "logs", "--all", "--json"][..],
            &["stats", "--json"],
        ] {
            let f = finish(queue(&config, args), secs(60));
            let ok = matches!(f.status.code(), Some(0 | 1));
            eprintln!("{name}: {args:?}: {}", f.status);
            if !ok || died_of_panic(f.status) {
                failed.push(format!(
                    "{name}: {args:?} died ({}):\n{}",
                    f.status, f.stderr
                ));
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}

#[test]
fn queue_commands_work_end_to_end() {
    let sb = Sandbox::new();
    let config = write_config(&sb, "data", "{ min_free: 1MiB, max_bytes: 2GiB }");

    // Before the agent ever ran there is no store, and the commands say so.
    let f = finish(queue(&config, &["stats"]), secs(30));
    assert_code(f.status, 1, &f.stderr);
    assert!(f.stderr.contains("no store"), "{}", f.stderr);
    create_store(&config);

    // push: one job per record with --batch 1.
    assert_eq!(push_ok(&config, 1, 1, 5), vec![1, 2, 3, 4, 5]);
    let (doc, logs) = stats(&config, "logs");
    assert_eq!(logs["ready"]["jobs"], 5, "{logs}");
    assert_eq!(logs["ready"]["records"], 5, "{logs}");
    assert_eq!(logs["counters"]["appended_records"], 5, "{logs}");
    assert_eq!(logs["balanced"], true, "{logs}");
    assert!(logs["oldest_age_ms"].as_u64().is_some(), "{logs}");
    let (_, metrics) = stats(&config, "metrics");
    assert_eq!(metrics["ready"]["records"], 0, "{metrics}");
    assert_eq!(metrics["balanced"], true, "{metrics}");
    assert!(doc["file_bytes"].as_u64() > Some(0), "{doc}");

    // peek -n 2: the two oldest, in order, and no more.
    let f = finish(
        queue(&config, &["peek", "logs", "-n", "2", "--json"]),
        secs(30),
    );
    assert_code(f.status, 0, &f.stderr);
    let jobs: Vec<Value> = f
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON job"))
        .collect();
    let records: Vec<&Value> = jobs.iter().map(|j| &j["records"]).collect();
    assert_eq!(
        records,
        [&serde_json::json!(["r1"]), &serde_json::json!(["r2"])],
        "{}",
        f.stdout
    );
    let f = finish(queue(&config, &["peek", "logs", "-n", "2"]), secs(30));
    assert_code(f.status, 0, &f.stderr);
    let (r1, r2) = (f.stdout.find("  r1\n"), f.stdout.find("  r2\n"));
    assert!(
        r1.is_some() && r1 < r2 && !f.stdout.contains("r3"),
        "{}",
        f.stdout
    );

    // Dead letters: none; purge with --yes succeeds, without it (no terminal) refuses.
    let f = finish(
        queue(&config, &["peek", "logs", "--dead", "--all"]),
        secs(30),
    );
    assert_code(f.status, 0, &f.stderr);
    assert_eq!(f.stdout, "");
    let f = finish(
        queue(&config, &["dead", "purge", "logs", "--yes"]),
        secs(30),
    );
    assert_code(f.status, 0, &f.stderr);
    assert!(f.stdout.contains("purged 0 dead jobs"), "{}", f.stdout);
    let f = finish(queue(&config, &["dead", "purge", "logs"]), secs(30));
    assert_code(f.status, 2, &f.stderr);
    assert!(f.stderr.contains("--yes"), "{}", f.stderr);
    assert!(!f.stdout.contains("purged"), "{}", f.stdout);
    let f = finish(queue(&config, &["dead", "replay", "logs"]), secs(30));
    assert_code(f.status, 0, &f.stderr);
    assert!(f.stdout.contains("replayed 0 dead jobs"), "{}", f.stdout);

    // An unknown stream: a clear error listing the streams, for every command.
    for args in [
        &["peek", "nope"][..],
        &["push", "nope"],
        &["dead", "purge", "nope", "--yes"],
        &["dead", "replay", "nope"],
    ] {
        let f = finish(queue(&config, args), secs(30));
        assert_code(f.status, 1, &f.stderr);
        assert!(
            f.stderr.contains("unknown stream \"nope\"")
                && f.stderr.contains("logs")
                && f.stderr.contains("metrics"),
            "{args:?}: {}",
            f.stderr
        );
    }

    // Beside a running agent: push refuses (one writer), stats and peek work.
    let agent = start_agent(&config);
    let f = finish(queue(&config, &["push", "logs"]), secs(30));
    assert_code(f.status, 1, &f.stderr);
    assert!(f.stderr.contains("colibri running"), "{}", f.stderr);
    let f = finish(
        queue(&config, &["dead", "purge", "logs", "--yes"]),
        secs(30),
    );
    assert_code(f.status, 1, &f.stderr);
    assert!(f.stderr.contains("colibri running"), "{}", f.stderr);
    let (doc, logs) = stats(&config, "logs");
    assert_eq!(logs["ready"]["records"], 5, "{logs}");
    assert_eq!(logs["balanced"], true, "{logs}");
    assert!(
        doc["reclaimable_bytes_at_most"].as_u64().is_some(),
        "an upper bound even beside the agent: {doc}"
    );
    assert_eq!(peek_all(&config, "logs"), ["r1", "r2", "r3", "r4", "r5"]);
    stop(agent);

    // Stopped again: push appends after what is there.
    push_ok(&config, 2, 6, 3);
    assert_eq!(
        peek_all(&config, "logs"),
        ["r1", "r2", "r3", "r4", "r5", "r6", "r7", "r8"]
    );
    let (_, logs) = stats(&config, "logs");
    assert_eq!(logs["ready"]["jobs"], 7, "{logs}");
    assert_eq!(logs["counters"]["appended_records"], 8, "{logs}");
}

/// Store-and-forward with no network: records pushed while the agent is stopped wait on disk;
/// while the file sink's directory is missing (an unmounted disk) deliveries pause without spending
/// attempts (`max_attempts: 1` would dead-letter a job at its first failure), nothing is written
/// elsewhere; once it appears every record arrives, in order, exactly once.
#[test]
fn file_sink_delivers_the_backlog_once_its_directory_appears() {
    let sb = Sandbox::new();
    let outbox = sb.file("outbox");
    let config = sb.write_config(&format!(
        "data_dir: data\n\
         storage: {{ min_free: 1MiB }}\n\
         sinks:\n  \
           out: {{ type: file, path: {}, retry: {{ base: 100ms, cap: 300ms, max_attempts: 1 }} }}\n\
         streams:\n  \
           logs: {{ sink: out, batch: {{ max_records: 100 }} }}\n\
         log: {{ format: json }}\n",
        outbox.display()
    ));
    create_store(&config);
    push_ok(&config, 50, 1, 1000);
    let agent = start_agent(&config);
    agent.wait_for_event(secs(30), "the outage noticed", |e| {
        field(e, "message").starts_with("link down: deliveries paused, no attempts spent")
    });
    assert!(
        !outbox.exists(),
        "colibri must not create the sink's directory"
    );
    std::fs::create_dir(&outbox).expect("create the outbox");
    let delivered = || -> Vec<String> {
        let mut names: Vec<_> = std::fs::read_dir(&outbox)
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
            .unwrap_or_default();
        // Plain lines (`r1`): a file named for what it holds, neither JSON nor line protocol.
        names.retain(|p: &PathBuf| p.extension().is_some_and(|x| x == "txt"));
        names.sort();
        names
            .iter()
            .flat_map(|p| {
                std::fs::read_to_string(p)
                    .unwrap_or_default()
                    .lines()
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let deadline = std::time::Instant::now() + secs(60);
    while delivered().len() < 1000 {
        assert!(
            std::time::Instant::now() < deadline,
            "only {} records delivered",
            delivered().len()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let agent = stop(agent);
    // Graceful stop closes the store cleanly: it opens read-only with no repair needed (a read-only
    // open refuses a file that was not closed cleanly).
    let c = colibri::config::load(&config).expect("the config loads");
    let opts = colibri::store::OpenOptions {
        read_only: true,
        ..Default::default()
    };
    if let Err(e) = colibri::store::Store::open(&c.data_dir, c.storage, &c.streams, opts) {
        panic!("the store was not closed cleanly by SIGTERM: {e}");
    }
    let records = delivered();
    let expected: Vec<String> = (1..=1000)
        .map(|i| record(i, 0).trim_end().to_string())
        .collect();
    assert_eq!(records, expected, "every record, in order, exactly once");
    let (_, logs) = stats(&config, "logs");
    assert_eq!(logs["counters"]["delivered_records"], 1000, "{logs}");
    assert_eq!(logs["ready"]["records"], 0, "{logs}");
    assert_eq!(logs["retry"]["records"], 0, "{logs}");
    assert_eq!(logs["dead"]["records"], 0, "{logs}");
    assert_eq!(logs["balanced"], true, "{logs}");
    assert_eq!(logs["counters"]["retried_attempts"], 0, "{logs}");
    assert!(
        has_message(
            &agent.events(),
            "link up: deliveries resumed, the backlog replayed in its streams' replay order"
        ),
        "{}",
        agent.stderr()
    );
    assert!(
        has_message(&agent.events(), "delivery started"),
        "{}",
        agent.stderr()
    );
}

/// The mode bits of a directory.
fn mode_of(dir: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .permissions()
        .mode()
        & 0o7777
}

#[test]
fn push_creates_the_store_as_run_would() {
    let sb = Sandbox::new();
    // Before colibri ever ran, and with the data directory's parent missing too.
    let pushed = sb.file("pushed/data");
    let config = write_config(&sb, &quote_path(&pushed), "{ min_free: 1MiB }");
    assert_eq!(push_ok(&config, 10, 1, 3), [3]);
    let (_, logs) = stats(&config, "logs");
    assert_eq!(logs["ready"]["records"], 3, "{logs}");
    assert_eq!(logs["balanced"], true, "{logs}");

    // The directory is made as `run` makes it.
    let other = Sandbox::new();
    let ran = other.file("ran/data");
    let run_config = write_config(&other, &quote_path(&ran), "{ min_free: 1MiB }");
    create_store(&run_config);
    assert_eq!(mode_of(&pushed), mode_of(&ran));
    assert_eq!(
        mode_of(&pushed) & 0o007,
        0,
        "others have no access to the queues"
    );

    // The agent starts on the store push made and finds the records there.
    stop(start_agent(&config));
    assert_eq!(peek_all(&config, "logs"), ["r1", "r2", "r3"]);
}

/// Jobs in every state, made through the store's API: `dead` of them dead-lettered, `expired`
/// expired, and `ready` left ready.
fn jobs_in_every_state(config: &Path, dead: usize, expired: usize, ready: u64) {
    use colibri::clock::now_ms;
    use colibri::store::{Failure, OpenOptions, Store};
    let total = (dead + expired) as u64;
    push_ok(config, 1, 1, total);
    let c = colibri::config::load(config).expect("config");
    let mut store = Store::open(&c.data_dir, c.storage, &c.streams, OpenOptions::default())
        .expect("open the store");
    let mut tx = store.transaction().expect("transaction");
    for job in tx.take("logs", dead, u64::MAX, now_ms()).expect("take") {
        let refused = Failure::Permanent {
            reason: "HTTP 400: refused".into(),
        };
        tx.fail(&job.lease, &refused, now_ms()).expect("fail");
    }
    // Everything else is older than the stream's ttl an hour from now.
    let gone = tx.expire(now_ms() + 2 * 3_600_000).expect("expire");
    assert_eq!(gone, expired as u64);
    tx.commit().expect("commit");
    drop(store);
    push_ok(config, 1, total + 1, ready);
}

/// The value of a right-aligned column in a table row: the cell that ends where its header does.
fn column<'a>(header: &str, row: &'a str, name: &str) -> &'a str {
    let end = header
        .find(name)
        .unwrap_or_else(|| panic!("no {name} in {header:?}"))
        + name.len();
    row[..end].split_whitespace().last().unwrap_or("")
}

#[test]
fn queue_output_for_scripts_is_plain_data_and_purge_asks_for_yes() {
    let sb = Sandbox::new();
    let config = sb.write_config(
        "data_dir: data\n\
         streams:\n  logs: { batch: { max_records: 1 }, ttl: 1h }\n  metrics: {}\n\
         log: { format: json }\n",
    );
    jobs_in_every_state(&config, 1, 2, 1);

    // peek --json: records are a list of strings, nothing else.
    let f = finish(queue(&config, &["peek", "logs", "--json"]), secs(30));
    assert_code(f.status, 0, &f.stderr);
    let jobs: Vec<Value> = f
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(jobs.len(), 1, "{}", f.stdout);
    assert_eq!(jobs[0]["records"], serde_json::json!(["r4"]), "{}", jobs[0]);
    assert_eq!(jobs[0]["decode_error"], Value::Null, "{}", jobs[0]);

    // dead list, in text and in JSON.
    let f = finish(
        queue(&config, &["dead", "list", "logs", "--json"]),
        secs(30),
    );
    assert_code(f.status, 0, &f.stderr);
    let dead: Vec<Value> = f
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(dead.len(), 1, "{}", f.stdout);
    assert_eq!(dead[0]["table"], "dead", "{}", dead[0]);
    assert_eq!(dead[0]["records"], serde_json::json!(["r1"]), "{}", dead[0]);
    assert_eq!(dead[0]["last_error"], "HTTP 400: refused", "{}", dead[0]);
    let f = finish(queue(&config, &["dead", "list", "logs"]), secs(30));
    assert_code(f.status, 0, &f.stderr);
    assert!(
        f.stdout.starts_with("dead #1 ")
            && f.stdout.contains("last error: HTTP 400: refused\n  r1\n"),
        "{}",
        f.stdout
    );

    // The table has what the counters know: expired and dead-lettered too.
    let f = finish(queue(&config, &["stats"]), secs(30));
    assert_code(f.status, 0, &f.stderr);
    let lines: Vec<&str> = f.stdout.lines().collect();
    let header = lines[1];
    let row = lines
        .iter()
        .find(|l| l.starts_with("logs "))
        .unwrap_or_else(|| panic!("no row for logs:\n{}", f.stdout));
    for (name, value) in [
        ("APPENDED", "4"),
        ("DEAD-LETTERED", "1"),
        ("EXPIRED", "2"),
        ("DROPPED", "0"),
    ] {
        assert_eq!(column(header, row, name), value, "{name}:\n{}", f.stdout);
    }

    // purge without a terminal and without --yes: a usage error that says what to do.
    let f = finish(queue(&config, &["dead", "purge", "logs"]), secs(30));
    assert_code(f.status, 2, &f.stderr);
    assert_eq!(
        f.stderr,
        "error: not purging 1 dead job (1 record) of stream \"logs\": stdin is not a terminal, so nobody can confirm; add --yes to purge without asking\n"
    );
    assert_eq!(f.stdout, "");
    let (_, logs) = stats(&config, "logs");
    assert_eq!(logs["dead"]["jobs"], 1, "nothing was purged: {logs}");

    // replay and purge report in JSON too.
    let f = finish(
        queue(&config, &["dead", "replay", "logs", "--json"]),
        secs(30),
    );
    assert_code(f.status, 0, &f.stderr);
    let v: Value = serde_json::from_str(&f.stdout).unwrap_or_else(|e| panic!("{e}: {}", f.stdout));
    assert_eq!(
        v,
        serde_json::json!({"stream": "logs", "replayed_jobs": 1, "replayed_records": 1})
    );
    let f = finish(
        queue(&config, &["dead", "purge", "logs", "--yes", "--json"]),
        secs(30),
    );
    assert_code(f.status, 0, &f.stderr);
    let v: Value = serde_json::from_str(&f.stdout).unwrap_or_else(|e| panic!("{e}: {}", f.stdout));
    assert_eq!(
        v,
        serde_json::json!({"stream": "logs", "purged_jobs": 0, "purged_records": 0})
    );
}

/// A dead-letter replay of an id that does not exist, sent to a running agent, is refused on its
/// own ("no job 99999 in dead of stream ...", as with the agent stopped): the producers whose
/// records share its group commit are acknowledged (issue 31 B: the whole commit failed, and
/// concurrent ingest requests were answered 503).
#[test]
fn a_replay_of_a_missing_dead_letter_fails_no_producer_beside_it() {
    use crate::tsdb::free_port;
    use crate::util::client::Client;
    use std::net::SocketAddr;
    const PRODUCERS: usize = 3;
    const POSTS: usize = 150;
    const REPLAYS: usize = 150;
    let sb = Sandbox::new();
    let (ingest, admin) = (free_port(), free_port());
    let config = sb.write_config(&format!(
        "data_dir: data\n\
         log: {{ format: json }}\n\
         admin: {{ listen: \"127.0.0.1:{admin}\", token: admin-secret }}\n\
         ingest: {{ listen: \"127.0.0.1:{ingest}\" }}\n\
         streams:\n  s: {{}}\n"
    ));
    let _agent = start_agent(&config);
    let missing = "no job 99999 in dead of stream \"s\"";

    // The operator's command says what is wrong, as it does with the agent stopped.
    let f = finish(
        queue(&config, &["dead", "replay", "s", "--id", "99999"]),
        secs(60),
    );
    assert_eq!(f.status.code(), Some(1), "{}", f.stderr);
    assert!(f.stderr.contains(missing), "{}", f.stderr);
    assert!(!f.stderr.contains("commit failed"), "{}", f.stderr);

    // Replays of the missing id through the admin endpoint while producers post: every post
    // is acknowledged, every replay answered "no such job".
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            std::thread::spawn(move || {
                let mut c = Client::new(SocketAddr::from(([127, 0, 0, 1], ingest)));
                c.timeout = secs(30);
                let mut refused = Vec::new();
                for i in 0..POSTS {
                    let body = format!("{{\"p\":{p},\"i\":{i}}}\n");
                    let a = c
                        .post(
                            "/v1/streams/s/records",
                            "application/x-ndjson",
                            &[],
                            body.as_bytes(),
                        )
                        .expect("ingest answers");
                    if a.status != 200 {
                        refused.push(format!("{}: {}", a.status, a.text()));
                    }
                }
                refused
            })
        })
        .collect();
    let mut c = Client::new(SocketAddr::from(([127, 0, 0, 1], admin)));
    c.timeout = secs(30);
    let auth = [("Authorization", "Bearer admin-secret")];
    for _ in 0..REPLAYS {
        let a = c
            .request("POST", "/-/queues/s/dead/replay?id=99999", &auth, None)
            .expect("admin answers");
        assert_eq!(a.status, 404, "{}", a.text());
        assert_eq!(a.json()["error"], missing, "{}", a.text());
    }
    let refused: Vec<String> = producers
        .into_iter()
        .flat_map(|p| p.join().expect("producer"))
        .collect();
    assert!(
        refused.is_empty(),
        "{} of {} posts refused beside the replays: {}",
        refused.len(),
        PRODUCERS * POSTS,
        head(&refused, 3)
    );
    let (_, s) = stats(&config, "s");
    assert_eq!(s["ready"]["records"], (PRODUCERS * POSTS) as u64, "{s}");
}

/// `peek --all` of a backlog far larger decoded than on disk (records that compress 1000:1)
/// writes one job at a time: under a 100 MiB data limit it lists all 200 MB of it. (It decoded
/// the whole backlog first: 537 MB resident for the 4 MB store a full disk left, issue 31 F.)
#[test]
fn peek_all_of_a_large_backlog_holds_one_job_at_a_time() {
    use std::os::unix::process::CommandExt;
    const RECORDS: u64 = 2000;
    const PAD: usize = 100_000;
    let sb = Sandbox::new();
    let config = write_config(&sb, "data", "{ min_free: 1MiB }");
    let feed = Feed {
        start: 1,
        count: Some(RECORDS),
        pad: PAD,
        noise: false,
    };
    let mut p = Push::spawn(&config, "logs", 100, feed);
    let (status, _) = p.wait_exit(secs(120));
    assert_code(status, 0, &p.stderr());
    let file = std::fs::metadata(sb.file("data/colibri.redb"))
        .expect("the store")
        .len();
    assert!(
        file < 64 << 20,
        "the backlog is small on disk: {file} bytes"
    );

    let mut cmd = queue(&config, &["peek", "logs", "--all"]);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    // SAFETY: setrlimit(2) is async-signal-safe and touches nothing of the parent.
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 100 << 20,
                rlim_max: 100 << 20,
            };
            if libc::setrlimit(libc::RLIMIT_DATA, &limit) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    let mut child = cmd.spawn().expect("spawn colibri queue peek");
    let out = child.stdout.take().expect("piped");
    let err = child.stderr.take().expect("piped");
    let stderr = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = BufReader::new(err).read_to_string(&mut text);
        text
    });
    // Killed if it has not finished in time, so the reads below end.
    let (done, watch) = mpsc::channel::<()>();
    let pid = i32::try_from(child.id()).expect("pids fit i32");
    let watchdog = std::thread::spawn(move || {
        if watch.recv_timeout(secs(120)).is_err() {
            crate::util::send_signal(pid, libc::SIGKILL);
        }
    });
    // Counted as it streams: the test does not hold the 200 MB either.
    let (mut records, mut bytes) = (0u64, 0u64);
    for line in BufReader::new(out).split(b'\n') {
        let line = line.expect("read peek's output");
        bytes += line.len() as u64 + 1;
        if line.starts_with(b"  r") {
            records += 1;
        }
    }
    let status = child.wait().expect("wait for peek");
    let _ = done.send(());
    watchdog.join().expect("watchdog");
    assert_code(status, 0, &stderr.join().expect("stderr reader"));
    assert_eq!(records, RECORDS, "every record listed ({bytes} bytes)");
    assert!(bytes > RECORDS * PAD as u64, "{bytes} bytes");
}
