//! End-to-end tests of log tailing: the real binary follows real files in a scratch directory and
//! delivers their lines to the test receiver (`tests/util/http.rs`) on 127.0.0.1, while the tests
//! write, rotate (rename + create, copy + truncate), truncate, delete and recreate the files, and kill
//! colibri with -9. Every wait is bounded and waits for a condition (records at the receiver, a log
//! event, a file descriptor gone), never for a fixed time.
//!
//! Lines carry their writer's tag, the generation of the file they were written to (a rotation
//! starts a new one) and a sequence number, so what arrives can be checked against what was
//! written: every line exactly once, and in order within each file. Deliveries repeated after a
//! kill -9 (at-least-once, the same `Idempotency-Key`) are dropped by key first, as a receiver
//! would.

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use crate::util::http::{Mode, Receiver};
use crate::util::{
    Proc, Sandbox, assert_code, colibri, field, finish, head, poll, quote, quote_path,
};
use crate::util::{queue_stats, secs, stop};

// ---------------------------------------------------------------------------------------------
// The rig: a receiver, a config, the binary.

struct Rig {
    sb: Sandbox,
    rx: Receiver,
    config: PathBuf,
}

/// Settings of the `app` source, each line indented by four spaces.
const SOURCE: &str = "    rotate_wait: 300ms\n    scan_interval: 1s\n";

impl Rig {
    /// A `logs` stream (`stream` adds settings to it) delivered to the receiver, and a source
    /// `app` following `paths` (relative to the sandbox's `logs/`) with `source` settings.
    fn new(paths: &[&str], source: &str, stream: &str) -> Rig {
        let sb = Sandbox::new();
        std::fs::create_dir_all(sb.file("logs")).expect("create logs/");
        let rx = Receiver::start();
        let stream = if stream.contains("max_jobs") {
            stream.to_string()
        } else {
            format!(", max_jobs: 100000{stream}")
        };
        let paths: Vec<String> = paths
            .iter()
            .map(|p| quote(sb.file("logs").join(p).to_str().expect("UTF-8")))
            .collect();
        let config = sb.write_config(&format!(
            "data_dir: data\n\
             shutdown_grace: 2s\n\
             storage: {{ min_free: 1MiB }}\n\
             log: {{ format: json, level: info }}\n\
             sinks:\n  \
               up:\n    \
                 type: http\n    \
                 url: {url}\n    \
                 retry: {{ base: 100ms, cap: 200ms }}\n    \
                 link: {{ down_after: 2, backoff_base: 50ms, backoff_cap: 200ms }}\n\
             streams:\n  \
               logs: {{ sink: up, batch: {{ max_records: 100, linger: 50ms }}, max_bytes: 256MiB{stream} }}\n\
             sources:\n  \
               app:\n    \
                 type: tail\n    \
                 stream: logs\n    \
                 paths: [{paths}]\n{SOURCE}{source}",
            url = quote(rx.url("/logs")),
            paths = paths.join(", "),
        ));
        Rig { sb, rx, config }
    }

    fn logs(&self) -> PathBuf {
        self.sb.file("logs")
    }

    fn log(&self, name: &str) -> PathBuf {
        self.logs().join(name)
    }

    /// `colibri run`, once the source has started.
    fn start(&self) -> Proc {
        let agent = Proc::run(&self.config);
        agent.wait_for_event(secs(30), "tail started", |e| {
            field(e, "message") == "tail started"
        });
        agent
    }

    /// Every record delivered, each job counted once (a job delivered again after a crash comes
    /// under the same key), in delivery order.
    fn records(&self) -> Vec<Rec> {
        let mut keys = HashSet::new();
        let mut out = Vec::new();
        for r in self.rx.requests() {
            if !r.status.is_some_and(|s| (200..300).contains(&s)) {
                continue;
            }
            let key = r.idempotency_key.clone().expect("an Idempotency-Key");
            if !keys.insert(key) {
                continue;
            }
            out.extend(r.records().iter().map(|t| Rec::parse(t)));
        }
        out
    }

    fn lines(&self) -> Vec<String> {
        self.records().into_iter().map(|r| r.line).collect()
    }

    /// Waits until `n` distinct lines arrived; returns every record.
    fn wait_lines(&self, agent: &Proc, n: usize, limit: Duration) -> Vec<Rec> {
        let mut last = Vec::new();
        let done = poll(limit, || {
            last = self.records();
            let distinct: HashSet<&str> = last.iter().map(|r| r.line.as_str()).collect();
            (distinct.len() >= n).then_some(())
        });
        if done.is_none() {
            let distinct: HashSet<&str> = last.iter().map(|r| r.line.as_str()).collect();
            panic!(
                "{} of {n} lines arrived within {limit:?}: {}; stderr:\n{}",
                distinct.len(),
                head(&last.iter().map(|r| &r.line).collect::<Vec<_>>(), 5),
                agent.stderr()
            );
        }
        last
    }
}

fn kill(mut agent: Proc) {
    agent.signal(libc::SIGKILL);
    agent.wait_exit(secs(10));
}

/// The source's "tail summary" event (logged at a clean stop).
fn summary(agent: &Proc) -> Value {
    agent
        .events_where(|e| field(e, "message") == "tail summary")
        .pop()
        .unwrap_or_else(|| panic!("no tail summary; stderr:\n{}", agent.stderr()))
}

fn num(e: &Value, key: &str) -> u64 {
    e[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no number {key} in {e}"))
}

/// One delivered record.
#[derive(Debug, Clone)]
struct Rec {
    line: String,
    path: String,
    offset: u64,
    v: Value,
}

impl Rec {
    fn parse(text: &str) -> Rec {
        let v: Value = serde_json::from_str(text)
            .unwrap_or_else(|e| panic!("a record that is not JSON ({e}): {text}"));
        Rec {
            line: v["line"]
                .as_str()
                .unwrap_or_else(|| panic!("no line: {text}"))
                .into(),
            path: v["path"]
                .as_str()
                .unwrap_or_else(|| panic!("no path: {text}"))
                .into(),
            offset: v["offset"]
                .as_u64()
                .unwrap_or_else(|| panic!("no offset: {text}")),
            v,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Writers.

/// A program writing a log: lines `<tag> g<generation> s<seq> <padding>`, to a file opened for
/// appending, as loggers do; it can rotate the file either way.
struct Log {
    path: PathBuf,
    file: File,
    tag: String,
    generation: u32,
    seq: u64,
    written: Vec<String>,
}

impl Log {
    fn create(path: PathBuf, tag: &str) -> Log {
        let file = open_append(&path);
        Log {
            path,
            file,
            tag: tag.into(),
            generation: 0,
            seq: 0,
            written: Vec::new(),
        }
    }

    fn next_line(&mut self) -> String {
        let l = format!(
            "{} g{:03} s{:06} the quick brown fox jumps over the lazy dog",
            self.tag, self.generation, self.seq
        );
        self.seq += 1;
        l
    }

    /// Writes `n` lines in one write.
    fn write(&mut self, n: usize) {
        let mut text = String::new();
        for _ in 0..n {
            let l = self.next_line();
            text.push_str(&l);
            text.push('\n');
            self.written.push(l);
        }
        self.file.write_all(text.as_bytes()).expect("write the log");
    }

    /// Rename to `to`, write `late` more lines to the old file (the program has not reopened
    /// yet), then reopen at the old name.
    fn rotate_rename(&mut self, to: &Path, late: usize) {
        std::fs::rename(&self.path, to).expect("rename the log");
        self.write(late);
        self.file = open_append(&self.path);
        self.generation += 1;
    }

    /// logrotate's copytruncate: copy to `to`, truncate in place; the program goes on writing
    /// (at the new end: it appends).
    fn rotate_copy_truncate(&mut self, to: &Path) {
        std::fs::copy(&self.path, to).expect("copy the log");
        self.file.set_len(0).expect("truncate the log");
        self.generation += 1;
    }
}

fn open_append(path: &Path) -> File {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
}

/// `(tag, generation, seq)` of a test line.
fn parse_line(line: &str) -> (String, u32, u64) {
    let mut it = line.split(' ');
    let (Some(tag), Some(g), Some(s)) = (it.next(), it.next(), it.next()) else {
        panic!("a line no test wrote: {line:?}");
    };
    let g = g.strip_prefix('g').and_then(|g| g.parse().ok());
    let s = s.strip_prefix('s').and_then(|s| s.parse().ok());
    match (g, s) {
        (Some(g), Some(s)) => (tag.to_string(), g, s),
        _ => panic!("a line no test wrote: {line:?}"),
    }
}

/// Every written line arrived exactly once, and the lines of each file (tag and generation) in
/// the order they were written.
fn assert_exactly_once_in_order(got: &[Rec], written: &[String]) {
    let mut count: BTreeMap<&str, i64> = BTreeMap::new();
    for w in written {
        *count.entry(w).or_default() += 1;
    }
    for g in got {
        *count.entry(&g.line).or_default() -= 1;
    }
    let missing: Vec<&str> = count
        .iter()
        .filter(|(_, c)| **c > 0)
        .map(|(l, _)| *l)
        .collect();
    let extra: Vec<(&str, i64)> = count
        .iter()
        .filter(|(_, c)| **c < 0)
        .map(|(l, c)| (*l, -c))
        .collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{} lines written, {} delivered; missing {}: {}; duplicated or unknown {}: {}",
        written.len(),
        got.len(),
        missing.len(),
        head(&missing, 5),
        extra.len(),
        head(&extra, 5)
    );
    let mut last: BTreeMap<(String, u32), u64> = BTreeMap::new();
    for g in got {
        let (tag, generation, seq) = parse_line(&g.line);
        if let Some(prev) = last.insert((tag.clone(), generation), seq) {
            assert!(
                seq > prev,
                "{tag} generation {generation}: s{seq:06} after s{prev:06}"
            );
        }
    }
}

/// Paths of the regular files the process holds open.
fn open_files(pid: i32) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .map(|p| p.to_string_lossy().into_owned())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Records and files.

/// Two files into one stream, one there before the start and one created later: every line
/// arrives once, as a JSON record with its text, path, offset, host and labels, in order per file.
#[test]
fn lines_of_several_files_arrive_as_records_with_path_offset_host_and_labels() {
    let rig = Rig::new(&["*.log"], "    labels: { app: billing, env: test }\n", "");
    let mut a = Log::create(rig.log("a.log"), "a");
    a.write(50);
    let agent = rig.start();
    let mut b = Log::create(rig.log("b.log"), "b");
    for _ in 0..10 {
        a.write(5);
        b.write(5);
    }
    let got = rig.wait_lines(&agent, 150, secs(30));
    let agent = stop(agent);
    let written: Vec<String> = a.written.iter().chain(&b.written).cloned().collect();
    assert_exactly_once_in_order(&got, &written);
    let host = {
        let mut buf = [0u8; 256];
        // SAFETY: a writable buffer of the length given.
        unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
        let end = buf.iter().position(|&c| c == 0).unwrap_or(0);
        String::from_utf8_lossy(&buf[..end]).into_owned()
    };
    for r in &got {
        let file = if r.line.starts_with("a ") {
            "a.log"
        } else {
            "b.log"
        };
        assert_eq!(r.path, rig.log(file).to_str().unwrap(), "{:?}", r.v);
        assert_eq!(r.v["host"], host.as_str(), "{:?}", r.v);
        assert_eq!(
            r.v["labels"],
            serde_json::json!({"app": "billing", "env": "test"})
        );
        assert!(r.v.get("truncated").is_none() && r.v.get("lines").is_none());
    }
    // Offsets are where each line starts in its file.
    for name in ["a.log", "b.log"] {
        let text = std::fs::read_to_string(rig.log(name)).unwrap();
        for r in got.iter().filter(|r| r.path.ends_with(name)) {
            let at = r.offset as usize;
            assert_eq!(
                &text[at..at + r.line.len()],
                r.line,
                "offset {at} in {name}"
            );
            assert!(at == 0 || text.as_bytes()[at - 1] == b'\n');
        }
    }
    let s = summary(&agent);
    assert_eq!(num(&s, "lines_read"), 150, "{s}");
    assert_eq!(num(&s, "records_appended"), 150, "{s}");
    assert_eq!(num(&s, "files_opened"), 2, "{s}");
}

/// `start_at: end`: what files held at the first start is skipped; lines written afterwards, and
/// files created afterwards (whole), arrive. In a later life nothing is skipped.
#[test]
fn start_at_end_skips_only_what_was_there_at_the_first_start() {
    let rig = Rig::new(&["*.log"], "    start_at: end\n", "");
    let mut a = Log::create(rig.log("a.log"), "a");
    a.write(20);
    let agent = rig.start();
    a.written.clear();
    // The source has settled (its first checkpoint is committed) once a write after the start
    // arrives.
    a.write(5);
    let mut b = Log::create(rig.log("b.log"), "b");
    b.write(5);
    rig.wait_lines(&agent, 10, secs(30));
    stop(agent);
    // Written while colibri was stopped: read in the next life.
    a.write(5);
    let mut c = Log::create(rig.log("c.log"), "c");
    c.write(5);
    let agent = rig.start();
    let got = rig.wait_lines(&agent, 20, secs(30));
    stop(agent);
    let written: Vec<String> = [&a.written, &b.written, &c.written]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
    assert_exactly_once_in_order(&got, &written);
}

// ---------------------------------------------------------------------------------------------
// Rotation, truncation, deletion.

/// Rename-and-create rotation, four times, with lines written to the old file after the rename
/// (the program reopens a moment later): every line arrives once, in order per file; the rotated
/// files (not matched by `app.log`) are read to their end and then released. (Each rotation comes
/// after colibri has seen the file it rotates, as with any real rotation interval: a file created
/// and rotated away under a name the patterns do not match before colibri looked is never seen.)
#[test]
fn rename_and_create_rotation_loses_and_repeats_nothing() {
    let rig = Rig::new(&["app.log"], "", "");
    let mut log = Log::create(rig.log("app.log"), "app");
    log.write(100);
    let agent = rig.start();
    for round in 1..=4 {
        log.write(50);
        rig.wait_lines(&agent, log.written.len(), secs(30));
        log.rotate_rename(&rig.log(&format!("app.log.{round}")), 3);
        log.write(20);
    }
    let got = rig.wait_lines(&agent, log.written.len(), secs(30));
    assert_exactly_once_in_order(&got, &log.written);
    // The four rotated files are released after rotate_wait.
    agent.wait_until(secs(30), "rotated files released", || {
        !open_files(agent.pid())
            .iter()
            .any(|p| p.contains("app.log."))
    });
    let agent = stop(agent);
    let s = summary(&agent);
    assert_eq!(num(&s, "rotations"), 4, "{s}");
    assert_eq!(num(&s, "files_released"), 4, "{s}");
    // Every record says app.log: the rotated files keep the name their lines were written under.
    assert!(got.iter().all(|r| r.path.ends_with("/app.log")));
}

/// copytruncate rotation, four times, with the copies both unmatched (`app.log`) and matched
/// (`app.log*`, as a glob for rotated files would): the lines written since colibri last read are
/// taken from the copy, from where colibri was, so every line arrives once; a matched copy is not
/// read again as a new file.
#[test]
fn copy_truncate_rotation_loses_and_repeats_nothing() {
    for pattern in ["app.log", "app.log*"] {
        let rig = Rig::new(&[pattern], "", "");
        let mut log = Log::create(rig.log("app.log"), "app");
        log.write(100);
        let agent = rig.start();
        for round in 1..=4 {
            rig.wait_lines(&agent, log.written.len(), secs(30));
            // Lines colibri has not read yet when the copy is made.
            log.write(40);
            log.rotate_copy_truncate(&rig.log(&format!("app.log.{round}")));
            log.write(10);
        }
        let got = rig.wait_lines(&agent, log.written.len(), secs(30));
        // Nothing more comes (a matched copy read again would, within rotate_wait).
        let agent = stop(agent);
        let got_after = rig.records();
        assert_eq!(
            got.len(),
            got_after.len(),
            "{pattern}: more records after the last line"
        );
        assert_exactly_once_in_order(&got_after, &log.written);
        let s = summary(&agent);
        assert_eq!(num(&s, "truncations"), 4, "{pattern}: {s}");
    }
}

/// Rename rotation while the rotated files stay matched (`app.log*`), each new app.log starting
/// with the same banner of more than 256 bytes (and only that, for longer than rotate_wait): the
/// new file looks like a copy of the renamed one at first, but it does not hold what that one was
/// read to, so it is read whole: every line of every file arrives, none twice.
#[test]
fn a_new_file_with_the_same_banner_as_a_renamed_one_is_read_whole() {
    let rig = Rig::new(&["app.log*"], "", "");
    let banner: Vec<String> = (0..5)
        .map(|i| format!("banner line {i}: app 1.2.3 starting, with padding to make it long"))
        .collect();
    let banner_text: String = banner.iter().map(|l| format!("{l}\n")).collect();
    let mut log = Log::create(rig.log("app.log"), "app");
    log.file.write_all(banner_text.as_bytes()).expect("write");
    log.write(100);
    let agent = rig.start();
    let files = 4;
    for round in 1..files {
        rig.wait_lines(&agent, log.written.len() + banner.len(), secs(30));
        std::fs::rename(&log.path, rig.log(&format!("app.log.{round}"))).expect("rename");
        log.file = open_append(&log.path);
        log.generation += 1;
        log.file.write_all(banner_text.as_bytes()).expect("write");
        // Only the banner for longer than rotate_wait (300ms).
        std::thread::sleep(Duration::from_millis(800));
        log.write(20);
    }
    rig.wait_lines(&agent, log.written.len() + banner.len(), secs(30));
    std::thread::sleep(Duration::from_secs(1));
    let agent = stop(agent);
    let got = rig.records();
    for l in &banner {
        let n = got.iter().filter(|r| &r.line == l).count();
        assert_eq!(n, files, "{l:?} arrived {n} times, not once per file");
    }
    let rest: Vec<Rec> = got
        .iter()
        .filter(|r| !r.line.starts_with("banner"))
        .cloned()
        .collect();
    assert_exactly_once_in_order(&rest, &log.written);
    assert!(got.iter().all(|r| r.path.ends_with("/app.log")));
    let s = summary(&agent);
    assert_eq!(num(&s, "truncations"), 0, "{s}");
}

/// A file cut to nothing, or rewritten shorter by another program, is read again from its start.
#[test]
fn a_file_that_shrinks_is_read_again_from_its_start() {
    let rig = Rig::new(&["*.log"], "", "");
    let mut log = Log::create(rig.log("app.log"), "app");
    log.write(30);
    let agent = rig.start();
    rig.wait_lines(&agent, 30, secs(30));
    log.file.set_len(0).unwrap();
    log.generation += 1;
    log.write(10);
    rig.wait_lines(&agent, 40, secs(30));
    let replacement: Vec<String> = (0..5).map(|i| format!("new g000 s{i:06} x")).collect();
    std::fs::write(rig.log("app.log"), replacement.join("\n") + "\n").unwrap();
    let got = rig.wait_lines(&agent, 45, secs(30));
    let agent = stop(agent);
    let written: Vec<String> = log.written.iter().chain(&replacement).cloned().collect();
    assert_exactly_once_in_order(&got, &written);
    assert_eq!(num(&summary(&agent), "truncations"), 2);
}

/// A deleted file's descriptor is closed once it stayed quiet for `rotate_wait`; a file created
/// under the same name is read whole.
#[test]
fn deleted_files_release_their_handles_and_recreated_files_are_read() {
    let rig = Rig::new(&["*.log"], "", "");
    let mut log = Log::create(rig.log("app.log"), "app");
    log.write(10);
    let agent = rig.start();
    rig.wait_lines(&agent, 10, secs(30));
    let path = rig.log("app.log");
    assert!(
        open_files(agent.pid())
            .iter()
            .any(|p| p == path.to_str().unwrap())
    );
    std::fs::remove_file(&path).unwrap();
    drop(log);
    agent.wait_until(secs(30), "the deleted file's descriptor closed", || {
        !open_files(agent.pid())
            .iter()
            .any(|p| p.contains("app.log"))
    });
    let mut again = Log::create(path.clone(), "again");
    again.write(10);
    let got = rig.wait_lines(&agent, 20, secs(30));
    let agent = stop(agent);
    assert_eq!(
        got.iter().filter(|r| r.line.starts_with("again ")).count(),
        10
    );
    assert_eq!(num(&summary(&agent), "files_released"), 1);
}

/// A file deleted while colibri is stopped and a new one created that gets the same inode: the
/// fingerprint tells them apart, so the new file is read from its start (not from the old
/// offset). Inode reuse is what ext4 does for a freed inode; when the filesystem does not give
/// the same inode back, the same identity with new content is made by rewriting the file in place.
#[test]
fn a_reused_inode_does_not_skip_data() {
    use std::os::unix::fs::MetadataExt;
    let rig = Rig::new(&["*.log"], "", "");
    let path = rig.log("app.log");
    let mut old = Log::create(path.clone(), "old");
    old.write(40);
    let agent = rig.start();
    rig.wait_lines(&agent, 40, secs(30));
    stop(agent);
    let ino = std::fs::metadata(&path).unwrap().ino();
    let old_written = old.written.clone();
    drop(old);
    std::fs::remove_file(&path).unwrap();
    // Bounded: create files until one has the old inode (the others are kept aside, so their
    // inodes stay taken).
    let mut reused = false;
    for i in 0..200 {
        let f = File::create(&path).unwrap();
        if f.metadata().unwrap().ino() == ino {
            reused = true;
            break;
        }
        std::fs::rename(&path, rig.sb.file(&format!("spare-{i}"))).unwrap();
    }
    if !reused {
        eprintln!(
            "the filesystem did not give inode {ino} back; the unit tests cover the same identity with new content"
        );
    }
    let mut new = Log::create(path.clone(), "new");
    // Longer than the old offset: the size alone would not tell.
    new.write(80);
    assert!(std::fs::metadata(&path).unwrap().len() > 40 * 60);
    let agent = rig.start();
    let got = rig.wait_lines(&agent, 120, secs(30));
    stop(agent);
    assert_eq!(
        got.iter().filter(|r| r.line.starts_with("new ")).count(),
        80,
        "reused inode: {reused}"
    );
    assert_exactly_once_in_order(
        &got,
        &old_written
            .iter()
            .chain(&new.written)
            .cloned()
            .collect::<Vec<_>>(),
    );
}

// ---------------------------------------------------------------------------------------------
// Crashes.

/// A program writes its log without pause, rotating it every few hundred lines (rename + create or
/// copy + truncate, at random; the glob matches the rotated files, as `app.log*` would), while
/// colibri is killed with -9 at random moments, eight times, and started again. Then the program
/// stops and colibri runs until it caught up: every line written arrived exactly once, in order
/// within each file.
#[test]
fn kill_9_at_random_moments_loses_and_repeats_no_line() {
    const KILLS: usize = 8;
    let rig = Rig::new(&["app.log*"], "", "");
    let mut rng = fastrand::Rng::with_seed(0x7a11);
    let log = Arc::new(Mutex::new(Log::create(rig.log("app.log"), "app")));
    let writing = Arc::new(AtomicBool::new(true));
    let writer = {
        let (log, writing, dir) = (Arc::clone(&log), Arc::clone(&writing), rig.logs());
        let mut rng = fastrand::Rng::with_seed(0xbeef);
        std::thread::spawn(move || {
            let mut rotations = 0;
            while writing.load(Ordering::SeqCst) {
                let mut log = log.lock().unwrap();
                log.write(rng.usize(1..40));
                if log.seq > (rotations + 1) * 400 {
                    rotations += 1;
                    let to = dir.join(format!("app.log.{rotations}"));
                    if rng.bool() {
                        log.rotate_rename(&to, rng.usize(0..3));
                    } else {
                        log.rotate_copy_truncate(&to);
                    }
                }
                drop(log);
                // Pace the writer (a few thousand lines a second): not a synchronisation.
                std::thread::sleep(Duration::from_millis(2));
            }
            rotations
        })
    };
    for _ in 0..KILLS {
        let agent = rig.start();
        let before = rig.records().len();
        // Killed while it works: after some progress, at a random moment.
        agent.wait_until(secs(30), "progress", || rig.records().len() > before);
        std::thread::sleep(Duration::from_millis(rng.u64(0..400)));
        kill(agent);
    }
    writing.store(false, Ordering::SeqCst);
    let rotations = writer.join().expect("the writer thread");
    let written = log.lock().unwrap().written.clone();
    let agent = rig.start();
    let got = rig.wait_lines(&agent, written.len(), secs(60));
    stop(agent);
    assert!(rotations >= 4, "only {rotations} rotations");
    assert_exactly_once_in_order(&rig.records(), &written);
    assert_eq!(got.len(), written.len());
}

// ---------------------------------------------------------------------------------------------
// What becomes a record.

/// `multiline.start`: a stack trace stays one record with its first line (`lines` says how many,
/// `offset` is the first line's), also when it is the last thing written (the timeout completes
/// it).
#[test]
fn a_stack_trace_stays_one_record() {
    let rig = Rig::new(
        &["*.log"],
        "    multiline: { start: '^\\d{4}-\\d{2}-\\d{2} ', timeout: 200ms }\n",
        "",
    );
    let trace = "2026-11-30 12:00:01 ERROR request failed\n\
                 java.lang.IllegalStateException: boom\n\
                 \tat com.example.Service.call(Service.java:42)\n\
                 \tat com.example.Main.main(Main.java:7)\n";
    let text = format!(
        "2026-11-30 12:00:00 INFO starting\n{trace}2026-11-30 12:00:02 INFO next\nTraceback (most recent call last):\n  File \"x.py\", line 1\n"
    );
    std::fs::write(rig.log("app.log"), &text).unwrap();
    let agent = rig.start();
    let got = rig.wait_lines(&agent, 3, secs(30));
    stop(agent);
    let lines: Vec<&str> = got.iter().map(|r| r.line.as_str()).collect();
    assert_eq!(
        lines,
        vec![
            "2026-11-30 12:00:00 INFO starting",
            trace.trim_end(),
            "2026-11-30 12:00:02 INFO next\nTraceback (most recent call last):\n  File \"x.py\", line 1",
        ]
    );
    assert_eq!(got[1].v["lines"], 4);
    assert_eq!(got[1].offset, 34);
    assert!(got[0].v.get("lines").is_none());
    assert_eq!(got[2].v["lines"], 3);
}

/// `include_lines` keeps only matching lines, `exclude_lines` then drops some of those; the
/// filtered lines are counted.
#[test]
fn include_and_exclude_lines_filter_records() {
    let rig = Rig::new(
        &["*.log"],
        "    include_lines: ['api', 'db']\n    exclude_lines: ['health']\n",
        "",
    );
    let text = "GET /api/users 200\nGET /static/a.css 200\nGET /api/health 200\ndb: slow query\nGET /api/orders 500\n";
    std::fs::write(rig.log("app.log"), text).unwrap();
    let agent = rig.start();
    rig.wait_lines(&agent, 3, secs(30));
    // Everything after the filtered lines was read, and nothing else comes.
    std::fs::OpenOptions::new()
        .append(true)
        .open(rig.log("app.log"))
        .unwrap()
        .write_all(b"api last\n")
        .unwrap();
    let got = rig.wait_lines(&agent, 4, secs(30));
    let agent = stop(agent);
    let lines: Vec<&str> = got.iter().map(|r| r.line.as_str()).collect();
    assert_eq!(
        lines,
        vec![
            "GET /api/users 200",
            "db: slow query",
            "GET /api/orders 500",
            "api last"
        ]
    );
    assert_eq!(num(&summary(&agent), "filtered_lines"), 2);
}

/// `min_level: warn` on JSON and logfmt lines; lines without a level are kept.
#[test]
fn min_level_keeps_warnings_and_worse_of_json_and_logfmt_lines() {
    let rig = Rig::new(&["*.log"], "    min_level: warn\n", "");
    let text = [
        r#"{"level":"info","msg":"j1"}"#,
        r#"{"level":"warn","msg":"j2"}"#,
        r#"{"severity":"ERROR","msg":"j3"}"#,
        r#"{"level":20,"msg":"j4"}"#,
        r#"{"level":50,"msg":"j5"}"#,
        "ts=1 level=debug msg=l1",
        "ts=2 level=error msg=l2",
        "ts=3 level=\"warning\" msg=l3",
        "plain line without a level",
    ]
    .join("\n")
        + "\n";
    std::fs::write(rig.log("app.log"), text).unwrap();
    let agent = rig.start();
    rig.wait_lines(&agent, 6, secs(30));
    let agent = stop(agent);
    let lines = rig.lines();
    assert_eq!(
        lines,
        vec![
            r#"{"level":"warn","msg":"j2"}"#,
            r#"{"severity":"ERROR","msg":"j3"}"#,
            r#"{"level":50,"msg":"j5"}"#,
            "ts=2 level=error msg=l2",
            "ts=3 level=\"warning\" msg=l3",
            "plain line without a level",
        ]
    );
    assert_eq!(num(&summary(&agent), "filtered_lines"), 3);
}

/// Lines longer than `max_line_bytes` arrive cut to it, marked `truncated`, and counted; the line
/// after a long one is intact, also when the long line arrives in pieces.
#[test]
fn long_lines_are_truncated_marked_and_counted() {
    let rig = Rig::new(&["*.log"], "    max_line_bytes: 1KiB\n", "");
    let long = "x".repeat(5000);
    std::fs::write(rig.log("app.log"), format!("short\n{long}\nafter\n")).unwrap();
    let agent = rig.start();
    rig.wait_lines(&agent, 3, secs(30));
    // A long line written in pieces, the first already longer than the limit.
    let mut f = open_append(&rig.log("app.log"));
    f.write_all("é".repeat(1000).as_bytes()).unwrap();
    agent.wait_until(secs(30), "the start of the long line", || {
        rig.records().len() >= 4
    });
    f.write_all("y".repeat(3000).as_bytes()).unwrap();
    f.write_all(b"\nend\n").unwrap();
    let got = rig.wait_lines(&agent, 5, secs(30));
    let agent = stop(agent);
    assert_eq!(
        got.len(),
        5,
        "{:?}",
        got.iter().map(|r| r.line.len()).collect::<Vec<_>>()
    );
    assert_eq!(got[0].line, "short");
    assert_eq!(got[1].line, "x".repeat(1024));
    assert_eq!(got[1].v["truncated"], true);
    assert_eq!(got[2].line, "after");
    assert!(got[2].v.get("truncated").is_none());
    // Cut at a character boundary: 512 two-byte characters.
    assert_eq!(got[3].line, "é".repeat(512));
    assert_eq!(got[3].v["truncated"], true);
    assert_eq!(got[4].line, "end");
    assert_eq!(num(&summary(&agent), "truncated_lines"), 2);
}

// ---------------------------------------------------------------------------------------------
// Back-pressure, polling, config.

/// With `when_full: block` and the receiver down, the stream fills (3 jobs) and tailing pauses:
/// the file holds the lines. When the receiver accepts again every line arrives once, and the
/// stream dropped nothing.
#[test]
fn a_full_block_stream_pauses_reading_and_drops_nothing() {
    let rig = Rig::new(&["*.log"], "", ", max_jobs: 3");
    rig.rx.set_mode(Mode::Refuse);
    let mut log = Log::create(rig.log("app.log"), "app");
    let agent = rig.start();
    log.write(3000);
    agent.wait_for_event(secs(30), "reading paused", |e| {
        field(e, "message").starts_with("the stream is full")
    });
    rig.rx.set_mode(Mode::Accept);
    let got = rig.wait_lines(&agent, 3000, secs(60));
    agent.wait_for_event(secs(30), "reading resumed", |e| {
        field(e, "message").starts_with("the stream takes records again")
    });
    let agent = stop(agent);
    assert_exactly_once_in_order(&got, &log.written);
    assert_eq!(num(&summary(&agent), "records_dropped"), 0);
    let stats = queue_stats(&rig.config, &[]);
    let logs = &stats["streams"][0];
    assert_eq!(logs["counters"]["appended_records"], 3000, "{logs}");
    assert_eq!(logs["counters"]["dropped_newest_records"], 0, "{logs}");
    assert_eq!(logs["balanced"], true, "{logs}");
}

/// `watch: poll`: writes, a rename rotation and a new file are found by looking every 50ms.
#[test]
fn polling_follows_writes_rotations_and_new_files() {
    let rig = Rig::new(&["*.log"], "    watch: poll\n    poll_interval: 50ms\n", "");
    let mut log = Log::create(rig.log("app.log"), "app");
    log.write(10);
    let agent = rig.start();
    assert!(
        !agent
            .events_where(|e| field(e, "message") == "tail started" && field(e, "watch") == "poll")
            .is_empty()
    );
    rig.wait_lines(&agent, 10, secs(30));
    log.write(10);
    log.rotate_rename(&rig.log("app.old"), 2);
    log.write(10);
    let mut other = Log::create(rig.log("other.log"), "other");
    other.write(5);
    let n = log.written.len() + 5;
    let got = rig.wait_lines(&agent, n, secs(30));
    stop(agent);
    let written: Vec<String> = log.written.iter().chain(&other.written).cloned().collect();
    assert_exactly_once_in_order(&got, &written);
}

/// `colibri check` describes a tail source, and names the field of every problem.
#[test]
fn check_describes_sources_and_names_each_problem() {
    let sb = Sandbox::new();
    let config = sb.write_config(&format!(
        "data_dir: data\nstreams:\n  logs: {{}}\nsources:\n  app:\n    type: tail\n    stream: logs\n    paths: [{p}]\n    exclude: ['*.gz']\n    min_level: warn\n    multiline: {{ start: '^\\d' }}\n",
        p = quote_path(&sb.file("logs/*.log"))
    ));
    let mut cmd = colibri();
    cmd.arg("check").arg("--config").arg(&config);
    let f = finish(cmd, secs(30));
    assert_code(f.status, 0, &f.stderr);
    let line = f
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with("source app"))
        .unwrap_or_else(|| panic!("no source line in:\n{}", f.stdout));
    assert!(
        line.contains("logs/*.log") && line.contains("(exclude *.gz)") && line.contains("-> logs"),
        "{line}"
    );
    assert!(
        line.contains("min_level warn") && line.contains("multiline"),
        "{line}"
    );

    let config = sb.write_config(
        "data_dir: data\nstreams:\n  logs: {}\nsources:\n  app:\n    type: tail\n    stream: nope\n    paths: ['logs/[']\n    include_lines: ['(']\n    multiline: { start: ')' }\n",
    );
    let mut cmd = colibri();
    cmd.arg("check").arg("--config").arg(&config);
    let f = finish(cmd, secs(30));
    assert_code(f.status, 1, &f.stderr);
    for want in [
        "sources.app.stream: stream \"nope\" is not defined",
        "sources.app.paths[0]: bad glob",
        "sources.app.include_lines[0]: bad regex",
        "sources.app.multiline.start: bad regex",
    ] {
        assert!(f.stderr.contains(want), "no {want:?} in:\n{}", f.stderr);
    }
}

/// What a receiver gets for each record shape a source can be set to: today's record (`line`,
/// `path`, `offset`, `host`), `fields: []` (the line alone), `format: json` with some fields and
/// labels (objects with what they lack added at their end, other lines wrapped and counted,
/// filters applied first), `format: json` with no field (objects exactly as written), and a
/// multiline group of a pretty-printed object into a `json_array` sink.
#[test]
fn each_record_shape_reaches_the_receiver_as_set() {
    let sb = Sandbox::new();
    std::fs::create_dir_all(sb.file("logs")).expect("create logs/");
    let rx = Receiver::start();
    let lines: [&[u8]; 7] = [
        br#"{"msg":"hello","n":1}"#,
        b"plain \"quoted\"\ttab",
        b"[1,2]",
        br#"{"msg":"cut short""#,
        "{\"host\":\"own\",\"s\":\"\\ud83d\\ude00\u{e9}\"}".as_bytes(),
        b"caf\xe9 {}",
        br#"  {"drop":true}  "#,
    ];
    let mut app = Vec::new();
    let mut offsets = Vec::new();
    for l in lines {
        offsets.push(app.len() as u64);
        app.extend_from_slice(l);
        app.extend_from_slice(b"\r\n");
    }
    std::fs::write(sb.file("logs/app.log"), &app).expect("write app.log");
    std::fs::write(
        sb.file("logs/pretty.log"),
        "{\n  \"a\": 1,\n  \"b\": [true, null]\n}\n{\"c\": \"one line\"}\n",
    )
    .expect("write pretty.log");
    let app_log = quote_path(&sb.file("logs/app.log"));
    let pretty_log = quote_path(&sb.file("logs/pretty.log"));
    let sources = [
        ("default", app_log.as_str(), ""),
        ("bare", &app_log, ", fields: []"),
        (
            "pass",
            &app_log,
            ", format: json, fields: [offset], labels: { app: x }, exclude_lines: ['\"drop\"']",
        ),
        ("raw", &app_log, ", format: json, fields: []"),
        (
            "group",
            &pretty_log,
            ", format: json, fields: [lines, path], multiline: { start: '^\\{', timeout: 200ms }",
        ),
    ];
    let mut yaml = String::from(
        "data_dir: data\nshutdown_grace: 2s\nstorage: { min_free: 1MiB }\nlog: { format: json, level: info }\nsinks:\n",
    );
    for (name, _, _) in &sources {
        let encoding = if *name == "group" {
            "json_array"
        } else {
            "ndjson"
        };
        yaml.push_str(&format!(
            "  {name}: {{ type: http, url: {}, encoding: {encoding} }}\n",
            quote(rx.url(&format!("/{name}")))
        ));
    }
    yaml.push_str("streams:\n");
    for (name, _, _) in &sources {
        yaml.push_str(&format!(
            "  {name}: {{ sink: {name}, batch: {{ linger: 50ms }} }}\n"
        ));
    }
    yaml.push_str("sources:\n");
    for (name, path, settings) in &sources {
        yaml.push_str(&format!(
            "  {name}: {{ type: tail, stream: {name}, paths: [{path}]{settings} }}\n"
        ));
    }
    let config = sb.write_config(&yaml);
    let agent = Proc::run(&config);
    let at = |path: &str| -> Vec<String> {
        let mut keys = HashSet::new();
        rx.requests()
            .into_iter()
            .filter(|r| r.path == path && r.status.is_some_and(|s| (200..300).contains(&s)))
            .filter(|r| keys.insert(r.idempotency_key.clone()))
            .flat_map(|r| r.records())
            .collect()
    };
    let want = [
        ("/default", 7),
        ("/bare", 7),
        ("/pass", 6),
        ("/raw", 7),
        ("/group", 2),
    ];
    let arrived = poll(secs(30), || {
        want.iter()
            .all(|(path, n)| at(path).len() >= *n)
            .then_some(())
    });
    if arrived.is_none() {
        let got: Vec<_> = want.iter().map(|(p, _)| (p, at(p))).collect();
        panic!(
            "not every record arrived: {got:?}; stderr:\n{}",
            agent.stderr()
        );
    }
    let agent = stop(agent);
    for (path, n) in want {
        assert_eq!(at(path).len(), n, "{path}: {:?}", at(path));
    }
    let text = |l: &[u8]| String::from_utf8_lossy(l).into_owned();
    let json = |s: &str| serde_json::to_string(s).unwrap();

    // Today's shape, unchanged by default.
    for (i, r) in at("/default").iter().enumerate() {
        let v: Value = serde_json::from_str(r).unwrap_or_else(|e| panic!("{e}: {r}"));
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys, ["host", "line", "offset", "path"], "{r}");
        let at = |k: &str| r.find(&format!("\"{k}\":")).unwrap();
        assert!(at("line") < at("path") && at("path") < at("offset") && at("offset") < at("host"));
        assert_eq!(v["line"], text(lines[i]).as_str());
        assert_eq!(v["offset"], offsets[i]);
    }
    // The line alone: exactly `{"line":...}`, escaped as serde_json escapes.
    let bare: Vec<String> = lines
        .iter()
        .map(|l| format!("{{\"line\":{}}}", json(&text(l))))
        .collect();
    assert_eq!(at("/bare"), bare);
    assert!(
        at("/bare")[5].contains('\u{fffd}'),
        "invalid UTF-8 replaced"
    );
    // Objects keep their bytes (their own `host` too) and get what they lack; the rest is wrapped.
    let extra = |i: usize| format!("\"offset\":{},\"labels\":{{\"app\":\"x\"}}", offsets[i]);
    let object = |i: usize| {
        let l = text(lines[i]);
        format!("{},{}}}", l.trim().strip_suffix('}').unwrap(), extra(i))
    };
    let wrapped = |i: usize| format!("{{\"line\":{},{}}}", json(&text(lines[i])), extra(i));
    assert_eq!(
        at("/pass"),
        [
            object(0),
            wrapped(1),
            wrapped(2),
            wrapped(3),
            object(4),
            wrapped(5)
        ]
    );
    // With no field and no label, objects go exactly as written (without the spaces around).
    let raw: Vec<String> = lines
        .iter()
        .map(|l| match l.trim_ascii() {
            t if t.starts_with(b"{\"") && t.ends_with(b"}") => text(t),
            _ => format!("{{\"line\":{}}}", json(&text(l))),
        })
        .collect();
    assert_eq!(at("/raw"), raw);
    // A pretty-printed object, one multiline record, arrives whole in a JSON array.
    let group: Vec<Value> = at("/group")
        .iter()
        .map(|r| serde_json::from_str(r).unwrap())
        .collect();
    let pretty = sb.file("logs/pretty.log");
    assert_eq!(
        group,
        [
            serde_json::json!({"a": 1, "b": [true, null], "lines": 4, "path": pretty.to_str().unwrap()}),
            serde_json::json!({"c": "one line", "path": pretty.to_str().unwrap()}),
        ]
    );
    for r in rx.requests() {
        assert!(r.decode_error.is_none(), "{:?}", r.decode_error);
    }
    // Lines wrapped under `format: json` are counted; filtered ones are not wrapped.
    let summaries = agent.events_where(|e| field(e, "message") == "tail summary");
    let of = |source: &str| {
        summaries
            .iter()
            .find(|e| field(e, "source") == source)
            .unwrap_or_else(|| panic!("no summary of {source}: {summaries:?}"))
            .clone()
    };
    assert_eq!(num(&of("pass"), "wrapped_lines"), 4);
    assert_eq!(num(&of("pass"), "filtered_lines"), 1);
    assert_eq!(num(&of("raw"), "wrapped_lines"), 4);
    assert_eq!(num(&of("bare"), "wrapped_lines"), 0);
    assert_eq!(num(&of("group"), "wrapped_lines"), 0);
}
