//! End-to-end tests of shipping files upstream (`file_move` with `to_stream`): the real binary
//! spools settled files into its data directory, queues one file job each, and uploads them to the
//! test receiver (`tests/util/http.rs`, digesting bodies with SHA-256 so no upload is held in
//! memory). The receiver refuses connections for a while, then answers 503, then accepts: every
//! file must arrive whole, once, with its name, and end in the archive with identical content.
//! Every wait is bounded and waits for a condition.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;
use std::time::{Duration, SystemTime};

use crate::util::http::{Mode, Receiver, hex};
use crate::util::{Proc, Sandbox, assert_code, field, quote_path};
use crate::util::{queue_stats, secs};

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn sha256(path: &Path) -> String {
    let mut h = ring::digest::Context::new(&ring::digest::SHA256);
    let mut f = File::open(path).expect("open");
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = std::io::Read::read(&mut f, &mut buf).expect("read");
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    hex(h.finish().as_ref())
}

/// Writes `n` files of pseudo-random content and sizes in `lo..hi`, aged past any settle time;
/// returns name -> SHA-256.
fn make_files(dir: &Path, n: usize, lo: usize, hi: usize, seed: u64) -> BTreeMap<String, String> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut out = BTreeMap::new();
    for i in 0..n {
        let name = format!("scan-{i:03}.bin");
        let len = rng.usize(lo..hi);
        let mut data = vec![0u8; len];
        rng.fill(&mut data);
        let path = dir.join(&name);
        std::fs::write(&path, &data).expect("write");
        File::options()
            .write(true)
            .open(&path)
            .expect("open")
            .set_modified(SystemTime::now() - secs(3600))
            .expect("age");
        out.insert(name, sha256(&path));
    }
    out
}

/// The file name a receiver got, from `Content-Disposition: ...; filename="..."`.
fn disposition_name(v: &str) -> String {
    let start = v.find("filename=\"").expect("a filename") + "filename=\"".len();
    let end = v[start..].find('"').expect("closing quote") + start;
    v[start..end].to_string()
}

fn config(sb: &Sandbox, url: &str, extra_task: &str) -> std::path::PathBuf {
    let (from, archive) = (sb.file("in"), sb.file("archive"));
    std::fs::create_dir_all(&from).unwrap();
    std::fs::create_dir_all(&archive).unwrap();
    sb.write_config(&format!(
        r#"data_dir: data
log: {{format: json}}
storage: {{ max_bytes: 2GiB, min_free: 0 }}
sinks:
  upstream:
    type: http
    url: {url}
    timeout: 20s
    retry: {{ base: 100ms, cap: 300ms, max_attempts: 1000 }}
    link: {{ down_after: 1, backoff_base: 50ms, backoff_cap: 200ms }}
streams:
  files: {{ sink: upstream, max_bytes: 1GiB }}
tasks:
  - name: ship-scans
    type: file_move
    every: 1s
    from: {from}
    pattern: ["*.bin"]
    to_stream: files
    archive: {archive}
    settle: 1s
{extra_task}"#,
        from = quote_path(&from),
        archive = quote_path(&archive),
    ))
}

fn stats(config: &Path) -> serde_json::Value {
    queue_stats(config, &[])
}

#[test]
fn shipped_files_arrive_whole_once_after_an_outage_and_503s_and_are_archived() {
    let sb = Sandbox::new();
    let rx = Receiver::start_digesting();
    rx.set_mode(Mode::Refuse);
    let config = config(&sb, &rx.url("/upload"), "");
    let files = make_files(&sb.file("in"), 24, 1, 3 << 20, 7);
    let mut agent = Proc::run(&config);
    // While the receiver is down every file is spooled and queued; nothing is attempted.
    agent.wait_until(secs(30), "every file spooled", || {
        names(&sb.file("in")).is_empty()
    });
    let spool = sb.file("data/spool/ship-scans");
    agent.wait_until(secs(10), "24 files in the spool", || {
        names(&spool).len() == 24
    });
    // Now it answers, but with 503 for a while: attempts are spent, nothing is lost.
    rx.set_mode(Mode::Status(503));
    rx.wait_requests(5, secs(30)).expect("503s were answered");
    rx.set_mode(Mode::Accept);
    agent.wait_until(secs(60), "every file archived", || {
        names(&sb.file("archive")).len() == files.len()
    });
    agent.wait_until(secs(10), "the spool emptied", || names(&spool).is_empty());

    let accepted: Vec<_> = rx
        .requests()
        .into_iter()
        .filter(|r| r.status == Some(200))
        .collect();
    let mut got = BTreeMap::new();
    for r in &accepted {
        let name = disposition_name(r.header("content-disposition").expect("a name header"));
        assert_eq!(r.content_type.as_deref(), Some("application/octet-stream"));
        assert!(r.idempotency_key.is_some());
        assert_eq!(
            r.header("content-length").and_then(|l| l.parse().ok()),
            Some(r.wire_len),
            "{name}: the declared length is what came"
        );
        let sha = r.sha256.clone().expect("digested");
        assert!(
            got.insert(name.clone(), sha).is_none(),
            "{name} arrived twice"
        );
    }
    assert_eq!(got, files, "every file arrived once, intact");
    for (name, sha) in &files {
        assert_eq!(
            &sha256(&sb.file("archive").join(name)),
            sha,
            "{name} in the archive"
        );
    }
    agent.signal(libc::SIGTERM);
    assert_code(agent.wait_exit(secs(20)), 0, &agent.stderr());
    let s = stats(&config);
    let st = &s["streams"][0];
    assert_eq!(st["counters"]["delivered_records"], 24, "{s:#}");
    // Attempts were spent only on the 503s, none during the outage before them.
    let answered_503 = rx
        .requests()
        .iter()
        .filter(|r| r.status == Some(503))
        .count();
    assert_eq!(st["counters"]["retried_attempts"], answered_503, "{s:#}");
    assert_eq!(st["balanced"], true, "{s:#}");
    assert!(
        agent
            .events_where(|e| field(e, "message") == "delivery failed; will retry")
            .len()
            >= 5,
        "the 503s spent attempts"
    );
}

#[test]
fn a_file_too_large_for_its_stream_stays_and_a_full_stream_makes_files_wait() {
    let sb = Sandbox::new();
    let rx = Receiver::start_digesting();
    rx.set_mode(Mode::Refuse);
    let (from, archive) = (sb.file("in"), sb.file("archive"));
    std::fs::create_dir_all(&from).unwrap();
    std::fs::create_dir_all(&archive).unwrap();
    let config = sb.write_config(&format!(
        r#"data_dir: data
log: {{format: json}}
storage: {{ max_bytes: 1GiB, min_free: 0 }}
sinks:
  upstream: {{ type: http, url: {url}, link: {{ down_after: 1, backoff_base: 50ms, backoff_cap: 100ms }} }}
streams:
  files: {{ sink: upstream, max_bytes: 3MiB, batch: {{ max_bytes: 64KiB }}, when_full: block }}
tasks:
  - {{ name: ship, type: file_move, every: 1s, from: {from}, pattern: ["*.bin"], to_stream: files, settle: 1s }}
"#,
        url = rx.url("/up"),
        from = quote_path(&from),
    ));
    let mut sizes = BTreeMap::new();
    // The huge one is the oldest, so it comes first: refused for good, it holds nothing up.
    for (name, len, age) in [
        ("a.bin", 1usize << 20, 60),
        ("b.bin", 1 << 20, 60),
        ("c.bin", 1 << 20, 60),
        ("huge.bin", 4 << 20, 120),
    ] {
        std::fs::write(from.join(name), vec![7u8; len]).unwrap();
        File::options()
            .write(true)
            .open(from.join(name))
            .unwrap()
            .set_modified(SystemTime::now() - secs(age))
            .unwrap();
        sizes.insert(name, len);
    }
    let mut agent = Proc::run(&config);
    // Two 1 MiB files fit in 3 MiB with their job values; the third waits; the 4 MiB one never fits.
    agent.wait_for_event(secs(20), "the report of the file that never fits", |e| {
        field(e, "message").starts_with("a file too large for its stream")
            && field(e, "file").ends_with("huge.bin")
            && field(e, "reason").contains("can never fit in stream")
    });
    agent.wait_for_event(secs(20), "a run that waits for room", |e| {
        field(e, "task") == "ship"
            && e["files_waiting"].as_u64().unwrap_or(0) >= 1
            && e["files_moved"].as_u64() == Some(0)
    });
    let left = names(&from);
    assert!(left.contains(&"huge.bin".to_string()), "{left:?}");
    assert_eq!(
        left.len(),
        2,
        "one 1 MiB file waits with the huge one: {left:?}"
    );
    assert_eq!(names(&sb.file("data/spool/ship")).len(), 2);
    // Room appears once the link is back: the waiting file follows; the huge one stays.
    rx.set_mode(Mode::Accept);
    agent.wait_until(secs(30), "three files delivered", || {
        rx.requests()
            .iter()
            .filter(|r| r.status == Some(200))
            .count()
            == 3
    });
    agent.wait_until(secs(20), "only the huge file left", || {
        names(&from) == ["huge.bin"]
    });
    agent.signal(libc::SIGTERM);
    assert_code(agent.wait_exit(secs(20)), 0, &agent.stderr());
    assert!(
        archive.read_dir().unwrap().next().is_none(),
        "no archive: delivered files are deleted"
    );
    agent.wait_until(secs(5), "the spool emptied", || {
        names(&sb.file("data/spool/ship")).is_empty()
    });
}

/// Where each original name is now: `from`, the spool (its names carry the original), the archive.
fn places(from: &Path, spool: &Path, archive: &Path) -> BTreeMap<String, Vec<&'static str>> {
    let mut out: BTreeMap<String, Vec<&'static str>> = BTreeMap::new();
    for n in names(from) {
        out.entry(n).or_default().push("from");
    }
    for n in names(spool) {
        assert!(
            !n.ends_with(".part"),
            "a copy in progress on one filesystem: {n}"
        );
        // `<13 digits>-<8 hex>-<original>`
        let original = n
            .get(23..)
            .unwrap_or_else(|| panic!("not a spooled name: {n}"));
        out.entry(original.to_string()).or_default().push("spool");
    }
    for n in names(archive) {
        out.entry(n).or_default().push("archive");
    }
    out
}

#[test]
fn kill_9_while_spooling_and_uploading_loses_no_file_and_archives_each_once() {
    let sb = Sandbox::new();
    let rx = Receiver::start_digesting();
    let config = config(&sb, &rx.url("/upload"), "    max_files: 20\n");
    let files = make_files(&sb.file("in"), 150, 1, 200 << 10, 11);
    let (from, spool, archive) = (
        sb.file("in"),
        sb.file("data/spool/ship-scans"),
        sb.file("archive"),
    );
    let mut rng = fastrand::Rng::with_seed(5);
    let mut mid = 0;
    for _ in 0..40 {
        let mut agent = Proc::run(&config);
        std::thread::sleep(Duration::from_millis(rng.u64(50..1200)));
        agent.signal(libc::SIGKILL);
        agent.wait_exit(secs(10));
        let p = places(&from, &spool, &archive);
        for name in files.keys() {
            let at = p.get(name).cloned().unwrap_or_default();
            assert_eq!(at.len(), 1, "{name} is in {at:?} after a kill -9");
        }
        let done = p.values().filter(|v| v[..] == ["archive"]).count();
        if done == files.len() {
            break;
        }
        if done > 0 {
            mid += 1;
        }
    }
    let mut agent = Proc::run(&config);
    agent.wait_for_event(secs(10), "the start", |e| {
        field(e, "message") == "colibri started"
    });
    agent.wait_until(secs(60), "every file archived", || {
        names(&archive).len() == files.len()
    });
    agent.wait_until(secs(10), "the spool emptied", || names(&spool).is_empty());
    agent.signal(libc::SIGTERM);
    assert_code(agent.wait_exit(secs(20)), 0, &agent.stderr());
    assert!(
        mid >= 3,
        "kills landed in the middle of the work only {mid} times"
    );
    for (name, sha) in &files {
        assert_eq!(&sha256(&archive.join(name)), sha, "{name} in the archive");
    }
    // Every file reached the receiver intact at least once; a re-send (a kill between the
    // upload and its acknowledgement) carries the same idempotency key.
    let mut by_name: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for r in rx.requests().into_iter().filter(|r| r.status == Some(200)) {
        let name = disposition_name(r.header("content-disposition").expect("name"));
        by_name.entry(name).or_default().push((
            r.sha256.clone().expect("digest"),
            r.idempotency_key.clone().expect("key"),
        ));
    }
    for (name, sha) in &files {
        let got = by_name
            .get(name)
            .unwrap_or_else(|| panic!("{name} never arrived"));
        assert!(got.iter().all(|(s, _)| s == sha), "{name} arrived damaged");
        let keys: std::collections::BTreeSet<_> = got.iter().map(|(_, k)| k).collect();
        assert_eq!(keys.len(), 1, "{name} was sent as different jobs: {got:?}");
    }
    let s = stats(&config);
    assert_eq!(s["streams"][0]["balanced"], true, "{s:#}");
}

#[test]
fn a_spooled_file_that_shrank_is_dead_lettered_not_retried_forever() {
    let sb = Sandbox::new();
    let rx = Receiver::start_digesting();
    rx.set_mode(Mode::Refuse);
    let config = config(&sb, &rx.url("/upload"), "");
    make_files(&sb.file("in"), 1, 100_000, 100_001, 3);
    let mut agent = Proc::run(&config);
    let spool = sb.file("data/spool/ship-scans");
    agent.wait_until(secs(20), "the file spooled", || names(&spool).len() == 1);
    agent.signal(libc::SIGTERM);
    assert_code(agent.wait_exit(secs(20)), 0, &agent.stderr());
    // Damage the spooled copy: it now holds fewer bytes than its job recorded.
    let spooled = spool.join(&names(&spool)[0]);
    File::options()
        .write(true)
        .open(&spooled)
        .unwrap()
        .set_len(10)
        .unwrap();
    rx.set_mode(Mode::Accept);
    let mut agent = Proc::run(&config);
    let dead = agent.wait_for_event(secs(30), "the job dead-lettered", |e| {
        field(e, "message") == "delivery failed for good; job moved to the dead letters"
    });
    assert!(
        field(&dead, "error").contains("no longer holds its 100000 bytes"),
        "{dead}"
    );
    agent.signal(libc::SIGTERM);
    assert_code(agent.wait_exit(secs(20)), 0, &agent.stderr());
    let s = stats(&config);
    assert_eq!(s["streams"][0]["counters"]["dead_records"], 1, "{s:#}");
    assert!(
        rx.requests().iter().all(|r| r.status != Some(200)),
        "nothing half-delivered"
    );
}
