//! Damaged store files on the real binary. `colibri queue salvage FILE`: a file damaged where redb
//! refuses it (its magic) is salvaged whole into the configured store, the report says so, and
//! `queue stats` shows the jobs back under their streams; a missing file fails naming it, and the
//! live store itself is refused as a usage error. `colibri run` (issue 17), with a real receiver:
//! for each kind of damage (the magic, the header, a flipped bit in each page of a small store file
//! in turn and in each leaf's entry table, zeroed pages, the file cut short at several offsets)
//! the agent starts within a bound and delivers every job whose bytes the damage left intact, under
//! one idempotency key (a re-send of a job in flight when the file was given up comes under the key
//! it had), and nothing else; the intact set is computed from the damage applied, on the salvager's
//! own map of the undamaged file (which job's value lies where). A kill -9 during a salvage loses
//! nothing and the next start goes on where it stopped; a job tried before the damage is sent again
//! under the key it had; a second `queue salvage` of the same file does nothing. Each life's
//! salvage log line says the loss the counter books; a zeroed live leaf beside freed copies of
//! delivered jobs is counted lost, and those copies, sent again, as a re-send.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::util::client::Client;
use crate::util::http::Receiver;
use crate::util::{
    Proc, Sandbox, assert_code, field, finish, finish_with_stdin, poll, queue, queue_stats,
    quote_path, secs, stream_stats,
};

fn config(sb: &Sandbox, data: &Path) -> std::path::PathBuf {
    sb.write_config(&format!(
        "data_dir: {data}\n\
         streams:\n  \
           logs: {{ batch: {{ max_records: 5 }} }}\n  \
           metrics: {{ batch: {{ max_records: 5 }} }}\n",
        data = quote_path(data),
    ))
}

/// A config for the agent: stream `logs` (7 records a job) delivered to `url`, short link timings.
fn agent_config(sb: &Sandbox, data: &Path, url: &str) -> std::path::PathBuf {
    logs_config(sb, data, url, "batch: { max_records: 7 }")
}

/// Stream `logs`, with these settings, delivered to `url` with short link timings.
fn logs_config(sb: &Sandbox, data: &Path, url: &str, stream: &str) -> std::path::PathBuf {
    sb.write_config(&format!(
        "data_dir: {data}\n\
         log: {{ format: json }}\n\
         sinks:\n  \
           up: {{ type: http, url: \"{url}\", link: {{ down_after: 1, backoff_base: 50ms, backoff_cap: 200ms }} }}\n\
         streams:\n  \
           logs: {{ sink: up, {stream} }}\n",
        data = quote_path(data),
    ))
}

fn push(sb: &Sandbox, config: &Path, stream: &str, n: usize) {
    let lines: String = (0..n).map(|i| format!("{stream} line {i}\n")).collect();
    let f = finish_with_stdin(
        sb,
        queue(config, &["push", stream, "--batch", "5"]),
        &lines,
        secs(60),
    );
    assert_code(f.status, 0, &f.stderr);
}

#[test]
fn a_damaged_store_is_salvaged_into_the_configured_one() {
    let sb = Sandbox::new();
    let data = sb.file("data");
    let cfg = config(&sb, &data);
    push(&sb, &cfg, "logs", 300);
    push(&sb, &cfg, "metrics", 100);
    // Damage the magic (redb refuses the file) and move it aside, as start-up does.
    let live = data.join("colibri.redb");
    let aside = data.join("colibri.redb.corrupt-1");
    let mut bytes = std::fs::read(&live).unwrap();
    bytes[2] ^= 0xff;
    std::fs::write(&aside, &bytes).unwrap();
    std::fs::remove_file(&live).unwrap();

    let f = finish(queue(&cfg, &["salvage", aside.to_str().unwrap()]), secs(60));
    assert_code(f.status, 0, &f.stderr);
    assert!(
        f.stdout.contains("jobs restored      80 (400 records)"),
        "{}",
        f.stdout
    );
    assert!(f.stdout.contains("lost to damage     0"), "{}", f.stdout);
    let stats = queue_stats(&cfg, &[]);
    assert_eq!(
        stream_stats(&stats, "logs")["ready"]["records"],
        300,
        "{stats}"
    );
    assert_eq!(
        stream_stats(&stats, "metrics")["ready"]["records"],
        100,
        "{stats}"
    );

    assert!(
        f.stdout.contains("counters           carried on"),
        "{}",
        f.stdout
    );
    // The old file's counters carried on: what it had appended is still counted, once.
    assert_eq!(
        stream_stats(&stats, "logs")["counters"]["appended_records"],
        300,
        "{stats}"
    );
    assert_eq!(stream_stats(&stats, "logs")["balanced"], true, "{stats}");
    // The jobs say where they came from.
    let f = finish(queue(&cfg, &["peek", "logs", "--json"]), secs(60));
    assert_code(f.status, 0, &f.stderr);
    let first = f.stdout.lines().next().unwrap_or_default();
    assert!(first.contains("\"salvaged_from\":{"), "{first}");

    // JSON, a second time: this file was salvaged into this store already, nothing is done.
    let f = finish(
        queue(&cfg, &["salvage", aside.to_str().unwrap(), "--json"]),
        secs(60),
    );
    assert_code(f.status, 0, &f.stderr);
    let doc: serde_json::Value = serde_json::from_str(&f.stdout).unwrap();
    assert_eq!(
        (&doc["jobs"], &doc["ended_before"]),
        (&0.into(), &true.into()),
        "{doc}"
    );
    let stats = queue_stats(&cfg, &[]);
    assert_eq!(
        stream_stats(&stats, "logs")["ready"]["records"],
        300,
        "{stats}"
    );

    let missing = data.join("nope.redb");
    let f = finish(
        queue(&cfg, &["salvage", missing.to_str().unwrap()]),
        secs(60),
    );
    assert_code(f.status, 1, &f.stderr);
    assert!(f.stderr.contains("nope.redb"), "{}", f.stderr);

    let f = finish(queue(&cfg, &["salvage", live.to_str().unwrap()]), secs(60));
    assert_code(f.status, 2, &f.stderr);
    assert!(f.stderr.contains("configured store itself"), "{}", f.stderr);

    // Random bytes: an empty report, exit 0.
    let junk = data.join("junk");
    std::fs::write(&junk, vec![7u8; 10_000]).unwrap();
    let f = finish(queue(&cfg, &["salvage", junk.to_str().unwrap()]), secs(60));
    assert_code(f.status, 0, &f.stderr);
    assert!(
        f.stdout.contains("jobs restored      0 (0 records)"),
        "{}",
        f.stdout
    );
}

/// Start-up after damage, on the real binary with a real receiver: the agent moves a file redb
/// refuses aside, comes up on a fresh store, salvages the damaged file in the background and
/// delivers every job whose bytes were intact exactly once; the file is then marked salvaged, and
/// a restart salvages nothing twice. Damage only in the header page leaves every job intact, so
/// the intact set is every record pushed.
#[test]
fn the_agent_salvages_a_damaged_store_at_start_up_and_delivers_each_intact_job_once() {
    use crate::util::http::Receiver;
    use crate::util::{Proc, field, poll, stop};

    type Damage = fn(&mut Vec<u8>);
    let cases: [(&str, Damage); 3] = [
        ("a flipped byte in the magic number", |b| b[0] ^= 0x01),
        ("the header's version bytes", |b| {
            b[64] ^= 0xff;
            b[65] ^= 0xff
        }),
        ("the first page zeroed", |b| b[..4096].fill(0)),
    ];
    for (name, damage) in cases {
        let sb = Sandbox::new();
        let data = sb.file("data");
        let rx = Receiver::start();
        let cfg = agent_config(&sb, &data, &rx.url("/in"));
        // Queued while no agent runs (nothing delivered yet), then damaged.
        let lines: String = (0..500).map(|i| format!("{{\"seq\":{i}}}\n")).collect();
        let f = finish_with_stdin(&sb, queue(&cfg, &["push", "logs"]), &lines, secs(60));
        assert_code(f.status, 0, &f.stderr);
        let live = data.join("colibri.redb");
        let mut bytes = std::fs::read(&live).unwrap();
        damage(&mut bytes);
        std::fs::write(&live, &bytes).unwrap();

        let agent = Proc::run(&cfg);
        agent.wait_until(secs(60), "the salvage to end", || {
            agent.stderr().contains("salvage done")
        });
        let got = poll(secs(60), || {
            let got = rx.records();
            (got.len() >= 500).then_some(got)
        })
        .unwrap_or_else(|| panic!("{name}: {} of 500 delivered", rx.records().len()));
        let mut seqs: Vec<u64> = got
            .iter()
            .map(|r| {
                serde_json::from_str::<serde_json::Value>(r).unwrap()["seq"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        seqs.sort_unstable();
        assert_eq!(
            seqs,
            (0..500).collect::<Vec<_>>(),
            "{name}: each record once"
        );
        let agent = stop(agent);
        let events = crate::util::complete_lines(&agent.stderr());
        let done: Vec<serde_json::Value> = events
            .iter()
            .filter_map(|l| serde_json::from_str(l).ok())
            .filter(|e: &serde_json::Value| field(e, "message").starts_with("salvage done"))
            .collect();
        assert_eq!(done.len(), 1, "{name}: {}", agent.stderr());
        assert_eq!(done[0]["records"], 500, "{name}: {}", done[0]);
        assert_eq!(done[0]["lost_records"], 0, "{name}: {}", done[0]);
        assert_eq!(done[0]["unrestored_jobs"], 0, "{name}: {}", done[0]);

        // Marked salvaged, still listed; a restart salvages nothing and sends nothing again.
        let stats = queue_stats(&cfg, &[]);
        let files = stats["damaged_files"].as_array().expect("damaged_files");
        assert_eq!(files.len(), 1, "{stats}");
        assert_eq!(files[0]["salvaged"], true, "{stats}");
        let agent = Proc::run(&cfg);
        agent.wait_until(secs(30), "colibri started", || {
            agent.stderr().contains("colibri started")
        });
        let agent = stop(agent);
        assert!(
            !agent.stderr().contains("salvaging"),
            "{name}: {}",
            agent.stderr()
        );
        assert_eq!(rx.records().len(), 500, "{name}: nothing sent twice");
    }
}

/// kill -9 of the agent while it salvages (right as the salvage begins, so it is cut short or just
/// done): the next start goes on where the salvage stopped (the store keeps its progress) and puts
/// no job back twice; every intact record reaches the receiver, and a record that reaches it twice
/// (killed between a delivery and its acknowledgement: at-least-once) carries the same idempotency
/// key both times.
#[test]
fn a_salvage_cut_short_by_kill_9_goes_on_where_it_stopped_and_loses_nothing() {
    use crate::util::http::Receiver;
    use crate::util::{Proc, poll, stop};
    use std::collections::{BTreeMap, BTreeSet};

    const N: u64 = 5000;
    let sb = Sandbox::new();
    let data = sb.file("data");
    let rx = Receiver::start();
    let cfg = agent_config(&sb, &data, &rx.url("/in"));
    let lines: String = (0..N).map(|i| format!("{{\"seq\":{i}}}\n")).collect();
    let f = finish_with_stdin(&sb, queue(&cfg, &["push", "logs"]), &lines, secs(60));
    assert_code(f.status, 0, &f.stderr);
    let live = data.join("colibri.redb");
    let mut bytes = std::fs::read(&live).unwrap();
    bytes[0] ^= 0x01;
    std::fs::write(&live, &bytes).unwrap();

    let mut agent = Proc::run(&cfg);
    agent.wait_until(secs(60), "the salvage to begin", || {
        agent.stderr().contains("salvaging the intact jobs")
    });
    agent.signal(libc::SIGKILL);
    agent.wait_exit(secs(10));
    let cut_short = !agent.stderr().contains("salvage done");
    eprintln!(
        "killed; the salvage was {}",
        if cut_short { "cut short" } else { "done" }
    );

    let agent = Proc::run(&cfg);
    let all: BTreeSet<u64> = (0..N).collect();
    let seq = |r: &str| -> u64 {
        serde_json::from_str::<serde_json::Value>(r).unwrap()["seq"]
            .as_u64()
            .unwrap()
    };
    let seen = || -> BTreeSet<u64> { rx.records().iter().map(|r| seq(r)).collect() };
    if poll(secs(120), || (seen() == all).then_some(())).is_none() {
        let missing = all.difference(&seen()).count();
        panic!(
            "{missing} of {N} records never delivered:\n{}",
            agent.stderr()
        );
    }
    let agent = stop(agent);
    // Each record under one key only, however often it was sent.
    let mut keys: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
    for r in rx.requests().iter().filter(|r| r.status == Some(200)) {
        let key = r.idempotency_key.clone().expect("an idempotency key");
        for rec in r.records() {
            keys.entry(seq(&rec)).or_default().insert(key.clone());
        }
    }
    let twice: Vec<_> = keys.iter().filter(|(_, k)| k.len() > 1).collect();
    assert!(twice.is_empty(), "records sent under two keys: {twice:?}");
    // Sent more than once only what was in flight at the kill: never a salvaged chunk again.
    let sent = rx.records().len() as u64;
    assert!(sent - N <= 7 * 16, "{} records sent twice", sent - N);
    // The second life salvaged what the first did not finish, from where it stopped.
    assert_eq!(
        agent.stderr().contains("salvage done"),
        cut_short,
        "{}",
        agent.stderr()
    );
    let stats = queue_stats(&cfg, &[]);
    assert_eq!(stats["damaged_files"][0]["salvaged"], true, "{stats}");
    let logs = stream_stats(&stats, "logs");
    assert_eq!(logs["balanced"], true, "{stats}");
    assert_eq!(logs["counters"]["appended_records"], N, "{stats}");
    assert_eq!(logs["counters"]["lost_to_damage_records"], 0, "{stats}");
}

/// A job the receiver saw before the damage (its answer was a 503, so it stayed queued) is sent
/// after the salvage with the same idempotency key and the same records: a receiver that
/// deduplicates by key drops it if it had kept the first.
#[test]
fn a_salvaged_job_is_sent_with_the_idempotency_key_it_had_before_the_damage() {
    use crate::util::http::{Mode, Receiver};
    use crate::util::{Proc, poll, stop};
    use std::collections::BTreeMap;

    let sb = Sandbox::new();
    let data = sb.file("data");
    let rx = Receiver::start();
    rx.set_mode(Mode::Status(503));
    let cfg = sb.write_config(&format!(
        "data_dir: {data}\n\
         log: {{ format: json }}\n\
         sinks:\n  \
           up: {{ type: http, url: \"{url}\", retry: {{ base: 100ms, cap: 200ms, max_attempts: 1000 }}, link: {{ down_after: 1, backoff_base: 50ms, backoff_cap: 200ms }} }}\n\
         streams:\n  \
           logs: {{ sink: up, batch: {{ max_records: 7 }} }}\n",
        data = quote_path(&data),
        url = rx.url("/in"),
    ));
    let lines: String = (0..70).map(|i| format!("{{\"seq\":{i}}}\n")).collect();
    let f = finish_with_stdin(&sb, queue(&cfg, &["push", "logs"]), &lines, secs(60));
    assert_code(f.status, 0, &f.stderr);
    let agent = Proc::run(&cfg);
    // The head of the queue tried (a stream delivers in order: the jobs behind it wait), twice
    // so that it went through the retry table: its key and records, as the receiver saw them.
    let tried = poll(secs(60), || {
        let got = rx.requests();
        (got.len() >= 2).then(|| {
            got.iter()
                .filter_map(|r| Some((r.idempotency_key.clone()?, r.records())))
                .collect::<BTreeMap<_, _>>()
        })
    })
    .expect("the first job tried twice");
    assert_eq!(tried.len(), 1, "one job tried, under one key: {tried:?}");
    let (old_key, _) = tried.iter().next().expect("one key");
    let old_store = old_key.split(':').next().expect("a store id").to_string();
    let _ = stop(agent);
    let live = data.join("colibri.redb");
    let mut bytes = std::fs::read(&live).unwrap();
    bytes[0] ^= 0x01;
    std::fs::write(&live, &bytes).unwrap();

    rx.clear();
    rx.set_mode(Mode::Accept);
    let agent = Proc::run(&cfg);
    let got = poll(secs(60), || {
        let got = rx.requests();
        (got.iter().map(|r| r.records().len()).sum::<usize>() >= 70).then_some(got)
    })
    .unwrap_or_else(|| panic!("not delivered after the salvage:\n{}", agent.stderr()));
    let _ = stop(agent);
    // Every job under its old store's id (the key it would have had without the damage), and
    // the one tried before under its key then, with the same records.
    for r in &got {
        let key = r.idempotency_key.as_deref().expect("an idempotency key");
        assert!(key.starts_with(&format!("{old_store}:logs:")), "{key}");
        if let Some(records) = tried.get(key) {
            assert_eq!(records, &r.records(), "key {key}");
        }
    }
    assert!(
        got.iter()
            .any(|r| r.idempotency_key.as_ref() == Some(old_key)),
        "the job tried before was not sent again under its key {old_key}"
    );
    let seqs: std::collections::BTreeSet<String> = got.iter().flat_map(|r| r.records()).collect();
    assert_eq!(seqs.len(), 70);
}

// Damage page by page on the real binary (issue 17): the store file, what each job in it holds
// and where, one life of the agent on a damaged copy, and the verdict.

/// Records in the store file the page tests damage: 80 jobs of 5, a few dozen pages.
const RECORDS: u64 = 400;
/// redb's page size (fixed in 4.6).
const PAGE: usize = 4096;
/// From the agent's spawn to "colibri started", whatever the damage.
const START_BOUND: Duration = Duration::from_secs(30);
/// From "colibri started" to an empty queue with every moved-aside file salvaged.
const SETTLE_BOUND: Duration = Duration::from_secs(30);

/// Stream `logs` in jobs of 5 records stored as they are (`compression: none`: a job compressed
/// would hide its records from the page layout the tests reason about), delivered to `url`.
fn pages_config(sb: &Sandbox, data: &Path, url: &str) -> PathBuf {
    logs_config(
        sb,
        data,
        url,
        "compression: none, batch: { max_records: 5 }",
    )
}

/// Record `seq`: JSON with a pad of 0 to 199 letters, so jobs and leaves differ in length.
fn page_record(seq: u64) -> String {
    let mut rng = fastrand::Rng::with_seed(seq);
    let pad: String = (0..rng.usize(0..200))
        .map(|_| char::from(b'a' + rng.u8(0..26)))
        .collect();
    format!("{{\"seq\":{seq},\"pad\":\"{pad}\"}}")
}

/// One job of the undamaged file.
struct StoredJob {
    id: u64,
    /// Its value's live copy.
    value: Range<usize>,
    /// Its leaf's page.
    leaf: usize,
    /// The bytes of its leaf that find it and name it: the leaf's type and entry count, the end
    /// offsets of its value and of the one before (where its value starts), and its key.
    entry: Vec<Range<usize>>,
    /// Every place its value's bytes occur: the live copy, and old ones in freed pages (each
    /// commit of `queue push` wrote a leaf anew).
    copies: Vec<Range<usize>>,
    seqs: Vec<u64>,
}

/// A store file of [`RECORDS`] records queued while no agent ran, and what it holds.
struct StoreFile {
    bytes: Vec<u8>,
    jobs: Vec<StoredJob>,
    /// The live table tree's page (one leaf: a dozen tables).
    table_tree: usize,
    /// The live root page of `ready/logs`.
    ready_root: usize,
}

/// Where a redb page number lies in a file colibri creates (4 KiB pages, one region without a
/// header): index in the low bits, order (size 4 KiB << order) in the top 5.
fn page_range(raw: u64) -> Range<usize> {
    let order = (raw >> 59) as u32;
    let index = (raw & (0x000F_FFFF >> order)) as usize;
    assert_eq!((raw >> 20) & 0x000F_FFFF, 0, "one region");
    let size = PAGE << order;
    PAGE + index * size..PAGE + (index + 1) * size
}

fn u16_at(b: &[u8], at: usize) -> usize {
    usize::from(u16::from_le_bytes(b[at..at + 2].try_into().unwrap()))
}

fn u32_at(b: &[u8], at: usize) -> usize {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// The newest commit's table tree root (redb's header: commit slots at 64 and 192, each with
/// its data tree root at +8 and transaction id at +104), and `table`'s root page in it.
fn live_roots(b: &[u8], table: &str) -> (usize, usize) {
    let slot = [64, 192]
        .into_iter()
        .max_by_key(|s| u64_at(b, s + 104))
        .unwrap();
    let tree = page_range(u64_at(b, slot + 8)).start;
    let leaf = &b[tree..tree + PAGE];
    assert_eq!(leaf[0], 1, "the table tree is one leaf");
    // Variable keys and values: n, key ends, value ends, keys, values.
    let n = u16_at(leaf, 2);
    let (mut key_at, mut value_at) = (4 + 8 * n, u32_at(leaf, 4 + 4 * (n - 1)));
    for i in 0..n {
        let (key_end, value_end) = (u32_at(leaf, 4 + 4 * i), u32_at(leaf, 4 + 4 * n + 4 * i));
        if &leaf[key_at..key_end] == table.as_bytes() {
            let def = &leaf[value_at..value_end];
            assert_eq!(def[9], 1, "{table} has a root");
            return (tree, page_range(u64_at(def, 10)).start);
        }
        (key_at, value_at) = (key_end, value_end);
    }
    panic!("no {table} in the table tree");
}

/// The bytes of the ready table's leaf at `leaf` that find the value starting at `value` and name
/// it (see [`StoredJob::entry`]). Layout (u64 keys, variable values): type, padding, entry count
/// (u16); a value end offset (u32) per entry; the keys; the values.
fn entry_bytes(b: &[u8], leaf: usize, value: usize) -> Vec<Range<usize>> {
    let n = u16_at(b, leaf + 2);
    let end = |i: usize| leaf + 4 + 4 * i;
    let i = (0..n)
        .find(|&i| {
            let start = match i {
                0 => 4 + 12 * n,
                _ => u32_at(b, end(i - 1)),
            };
            leaf + start == value
        })
        .expect("the value is an entry of its leaf");
    let key = leaf + 4 + 4 * n + 8 * i;
    let mut out = vec![leaf..leaf + 4, end(i)..end(i) + 4, key..key + 8];
    if i > 0 {
        out.push(end(i - 1)..end(i - 1) + 4);
    }
    out
}

/// Queues [`RECORDS`] records (in commits of 40) with no agent running and reads the file:
/// every job's live value from the salvager's walk of the undamaged file (which must find them
/// all, live), its records, and every copy of its bytes.
fn store_file() -> StoreFile {
    let sb = Sandbox::new();
    let data = sb.file("data");
    let cfg = pages_config(&sb, &data, "http://127.0.0.1:9/in");
    let lines: String = (0..RECORDS).map(|s| page_record(s) + "\n").collect();
    let f = finish_with_stdin(
        &sb,
        queue(&cfg, &["push", "logs", "--batch", "40"]),
        &lines,
        secs(60),
    );
    assert_code(f.status, 0, &f.stderr);
    let bytes = std::fs::read(data.join("colibri.redb")).unwrap();
    let found = colibri::store::salvage::scan(&bytes[..], &["logs"]).expect("scan");
    assert!(
        !found.in_doubt && found.damaged == 0 && found.jobs.iter().all(|j| j.live),
        "the undamaged file reads whole: {found:?}"
    );
    let jobs: Vec<StoredJob> = found
        .jobs
        .iter()
        .map(|j| {
            let value = j.at as usize..j.at as usize + j.len;
            let v = &bytes[value.clone()];
            let d = colibri::store::format::decode(v).expect("an intact job decodes");
            let seqs = d
                .area
                .to_records()
                .expect("its records")
                .iter()
                .map(|r| seq_of(std::str::from_utf8(r).expect("UTF-8")))
                .collect();
            let copies = memchr::memmem::find_iter(&bytes, v)
                .map(|at| at..at + v.len())
                .collect();
            StoredJob {
                id: j.id,
                leaf: j.leaf as usize,
                entry: entry_bytes(&bytes, j.leaf as usize, value.start),
                value,
                copies,
                seqs,
            }
        })
        .collect();
    let mut all: Vec<u64> = jobs.iter().flat_map(|j| j.seqs.clone()).collect();
    all.sort_unstable();
    assert_eq!(
        all,
        (0..RECORDS).collect::<Vec<_>>(),
        "each record in one job"
    );
    let (table_tree, ready_root) = live_roots(&bytes, "ready/logs");
    StoreFile {
        bytes,
        jobs,
        table_tree,
        ready_root,
    }
}

/// The `seq` of a record the tests pushed.
fn seq_of(record: &str) -> u64 {
    serde_json::from_str::<Value>(record)
        .ok()
        .and_then(|v| v["seq"].as_u64())
        .unwrap_or_else(|| panic!("not a record of the test: {record}"))
}

/// Damage applied to a copy of the file, and the bytes it touched (for a cut: the rest of the
/// file).
struct Damage {
    what: String,
    bytes: Vec<u8>,
    touched: Range<usize>,
}

fn overlaps(a: &Range<usize>, b: &Range<usize>) -> bool {
    a.start < b.end && b.start < a.end
}

impl StoreFile {
    /// The lowest bit of the byte at `at` flipped.
    fn flip(&self, at: usize, what: String) -> Damage {
        let mut bytes = self.bytes.clone();
        bytes[at] ^= 0x01;
        Damage {
            what: format!(
                "{what}: bit 0 of byte {at} (page {}, +{})",
                at / PAGE,
                at % PAGE
            ),
            bytes,
            touched: at..at + 1,
        }
    }

    /// `pages` zeroed.
    fn zero(&self, pages: Range<usize>, what: &str) -> Damage {
        let mut bytes = self.bytes.clone();
        let r = pages.start * PAGE..pages.end * PAGE;
        bytes[r.clone()].fill(0);
        Damage {
            what: format!("{what}: pages {pages:?} zeroed"),
            bytes,
            touched: r,
        }
    }

    /// The file cut to `len` bytes.
    fn cut(&self, len: usize) -> Damage {
        Damage {
            what: format!("cut to {len} bytes (page {}, +{})", len / PAGE, len % PAGE),
            bytes: self.bytes[..len].to_vec(),
            touched: len..self.bytes.len(),
        }
    }

    /// Jobs the damage left intact, which must each arrive once: no damaged byte in the live
    /// copy of the value nor in the leaf bytes that find and name it ([`StoredJob::entry`]). Those
    /// count because a job is what its key and end offsets say: with them damaged its value's
    /// bytes may be intact yet not be found where they are (no reader can tell a shifted end
    /// offset from a damaged value), or be found under another id. Other damage in a leaf or in
    /// the tree above it (branches, the table tree) leaves a job intact: the salvager finds
    /// leaves by reading every page. Every job not intact may be lost, or come back once from an
    /// old copy (a salvage takes freed pages' copies when the live tree is damaged), with its
    /// records as they were.
    fn intact(&self, d: &Damage) -> Vec<bool> {
        self.jobs
            .iter()
            .map(|j| {
                let t = &d.touched;
                !overlaps(t, &j.value) && !j.entry.iter().any(|e| overlaps(t, e))
            })
            .collect()
    }
}

/// One life of the agent on a damaged file.
struct Life {
    /// "colibri started" came within [`START_BOUND`], or why not.
    started: Result<(), String>,
    /// The queue emptied and every moved-aside file was salvaged within [`SETTLE_BOUND`].
    settled: bool,
    /// Exit status after SIGTERM: 0 expected.
    exit: Option<i32>,
    records: Vec<String>,
    /// Each accepted request's idempotency key and records.
    requests: Vec<(String, Vec<String>)>,
    stderr: String,
    took: Duration,
    /// `queue stats --json` after it stopped, when it could be read.
    stats: Option<Value>,
}

/// The JSON events of a stderr (lines that are not JSON, such as a caught panic's message, are
/// left to [`notable`]).
fn json_events(stderr: &str) -> Vec<Value> {
    crate::util::complete_lines(stderr)
        .iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// What the agent said about the damage: its warnings and errors with their fields (no timestamp,
/// no backtrace), and any line that is not JSON; at most 20, one a line.
fn notable(stderr: &str) -> String {
    let lines: Vec<String> = crate::util::complete_lines(stderr)
        .into_iter()
        .filter_map(|l| match serde_json::from_str::<Value>(&l) {
            Ok(Value::Object(mut e)) => {
                if !matches!(
                    e.get("level").and_then(Value::as_str),
                    Some("WARN" | "ERROR")
                ) {
                    return None;
                }
                e.remove("timestamp");
                e.remove("backtrace");
                Some(Value::Object(e).to_string())
            }
            _ => Some(l),
        })
        .collect();
    let shown: Vec<&str> = lines.iter().take(20).map(String::as_str).collect();
    format!("    {}", shown.join("\n    "))
}

/// The queue's ready and retry jobs, from a scrape of the admin endpoint's `/metrics` (the
/// agent holds the store, so `queue stats` would read it beside the writer).
fn queued_jobs(admin: SocketAddr) -> Option<u64> {
    let a = Client::new(admin)
        .request("GET", "/metrics", &[], None)
        .ok()?;
    let text = a.text();
    let mut n = 0;
    for q in ["ready", "retry"] {
        let prefix = format!("colibri_stream_jobs{{stream=\"logs\",queue=\"{q}\"}} ");
        n += text
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))?
            .parse::<u64>()
            .ok()?;
    }
    Some(n)
}

/// Starts the agent on `bytes` as its store file, with a receiver, waits until it has delivered
/// all it will (nothing queued, every moved-aside file salvaged), and stops it.
fn life_on(bytes: &[u8]) -> Life {
    let started_at = Instant::now();
    let sb = Sandbox::new();
    let data = sb.file("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("colibri.redb"), bytes).unwrap();
    let rx = Receiver::start();
    let cfg = pages_config(&sb, &data, &rx.url("/in"));
    let mut agent = Proc::run(&cfg);
    let is_started = |e: &Value| field(e, "message") == "colibri started";
    let up = poll(START_BOUND, || {
        if json_events(&agent.stderr()).iter().any(is_started) {
            return Some(Ok(()));
        }
        crate::util::is_gone(agent.pid()).then(|| Err("it exited".to_string()))
    })
    .unwrap_or_else(|| Err(format!("not within {START_BOUND:?}")));
    if let Err(why) = up {
        let status = agent.wait_exit(secs(10));
        return Life {
            started: Err(format!("{why} ({status})")),
            settled: false,
            exit: status.code(),
            records: rx.records(),
            requests: accepted(&rx),
            stderr: agent.stderr(),
            took: started_at.elapsed(),
            stats: None,
        };
    }
    let admin: SocketAddr = json_events(&agent.stderr())
        .iter()
        .find(|e| field(e, "message") == "admin endpoint listening")
        .map(|e| field(e, "listen").parse().expect("an address"))
        .expect("the admin endpoint listens before colibri has started");
    // Empty, then nothing left to salvage, then still empty: a salvage appends its jobs before it
    // renames its file, so jobs it added after the first look are seen by the second. A file moved
    // aside while the agent runs is salvaged in the same life.
    let settled = poll(SETTLE_BOUND, || {
        let empty = || queued_jobs(admin) == Some(0);
        let to_salvage = || {
            colibri::store::aside::list(&data)
                .iter()
                .any(|f| !f.salvaged)
        };
        (empty() && !to_salvage() && empty()).then_some(())
    })
    .is_some();
    agent.signal(libc::SIGTERM);
    let status = agent.wait_exit(secs(60));
    let stats = finish(queue(&cfg, &["stats", "--json"]), secs(60));
    Life {
        started: Ok(()),
        settled,
        exit: status.code(),
        records: rx.records(),
        requests: accepted(&rx),
        stderr: agent.stderr(),
        took: started_at.elapsed(),
        stats: serde_json::from_str(&stats.stdout).ok(),
    }
}

/// The records the "salvage done" log lines of a life say were lost, summed.
fn logged_lost_records(stderr: &str) -> u64 {
    json_events(stderr)
        .iter()
        .filter(|e| field(e, "message").starts_with("salvage done"))
        .map(|e| {
            e["lost_records"]
                .as_u64()
                .expect("lost_records in the salvage log line")
        })
        .sum()
}

/// The requests the receiver accepted: (idempotency key, records).
fn accepted(rx: &Receiver) -> Vec<(String, Vec<String>)> {
    rx.requests()
        .iter()
        .filter(|r| r.status == Some(200))
        .map(|r| (r.idempotency_key.clone().unwrap_or_default(), r.records()))
        .collect()
}

fn file_name(p: &Path) -> String {
    p.file_name().unwrap().to_string_lossy().into_owned()
}

/// The names of the files the agent moved aside after "colibri started" (its writer gave up on
/// the store while running).
fn moved_while_running(stderr: &str) -> Vec<String> {
    json_events(stderr)
        .iter()
        .skip_while(|e| field(e, "message") != "colibri started")
        .filter(|e| {
            let m = field(e, "message");
            m.starts_with("the store is corrupted; it was moved aside")
                || m.starts_with("the store is damaged; it was moved aside")
        })
        .map(|e| file_name(Path::new(field(e, "moved_to"))))
        .collect()
}

/// How the agent dealt with the damage, in a few words (for the test's output).
fn path_taken(stderr: &str) -> String {
    let events = json_events(stderr);
    let count = |m: &str| {
        events
            .iter()
            .filter(|e| field(e, "message").starts_with(m))
            .count()
    };
    let mut out = Vec::new();
    let moved = count("the store is corrupted; it was moved aside")
        + count("the store is damaged; it was moved aside");
    let mid_run = moved_while_running(stderr).len();
    if moved > mid_run {
        out.push("moved aside at start-up".to_string());
    }
    if mid_run > 0 {
        out.push("moved aside while running".to_string());
    }
    for e in events
        .iter()
        .filter(|e| field(e, "message").starts_with("salvage done"))
    {
        out.push(format!(
            "salvaged {} records, {} lost, {} re-sent",
            e["records"], e["lost_records"], e["resent_records"]
        ));
    }
    let quarantined = count("job cannot be decoded");
    if quarantined > 0 {
        out.push(format!("{quarantined} quarantined"));
    }
    let failed_reads = count("the store failed reading a damaged page");
    if failed_reads > 0 {
        out.push(format!("{failed_reads} failed reads"));
    }
    if out.is_empty() {
        out.push("opened as it was".to_string());
    }
    out.join(", ")
}

/// Runs the agent on the damaged file and compares what the receiver got with what the damage
/// left: each record of an intact job, under one idempotency key (once, or again under the same
/// key: at-least-once with a key a receiver deduplicates by); of any other job, all its records or
/// none; nothing else, and every record as it was pushed. `Err` says how it differed.
fn check_damage(fx: &StoreFile, d: &Damage) -> Result<(), String> {
    let life = life_on(&d.bytes);
    eprintln!(
        "{}: {} ({} ms)",
        d.what,
        path_taken(&life.stderr),
        life.took.as_millis()
    );
    let intact = fx.intact(d);
    let mut got: BTreeMap<u64, usize> = BTreeMap::new();
    let mut wrong = Vec::new();
    for r in &life.records {
        match serde_json::from_str::<Value>(r)
            .ok()
            .and_then(|v| v["seq"].as_u64())
        {
            Some(s) if s < RECORDS && *r == page_record(s) => *got.entry(s).or_default() += 1,
            _ => wrong.push(r.clone()),
        }
    }
    let mut problems = Vec::new();
    if let Err(why) = &life.started {
        problems.push(format!("did not start: {why}"));
    } else if !life.settled {
        problems.push(format!(
            "not settled within {SETTLE_BOUND:?} (jobs still queued or a file not salvaged)"
        ));
    }
    if life.started.is_ok() && life.exit != Some(0) {
        problems.push(format!("exit status {:?} after SIGTERM", life.exit));
    }
    // The log line and the counter say the same loss, and the identity holds.
    if life.started.is_ok() && life.stats.is_none() {
        problems.push("queue stats --json could not be read after the stop".to_string());
    }
    if let Some(stats) = &life.stats {
        let logs = stream_stats(stats, "logs");
        let counted = logs["counters"]["lost_to_damage_records"].as_u64();
        let logged = logged_lost_records(&life.stderr);
        if counted != Some(logged) {
            problems.push(format!(
                "the salvage log says {logged} records lost, the counter {counted:?}"
            ));
        }
        if logs["balanced"] != true {
            problems.push(format!("counters not balanced: {logs}"));
        }
    }
    // A record sent again (its job was in flight when the file was given up on, or came back
    // from an old page of a damaged tree) must come under the key it had: a receiver that
    // deduplicates by key then keeps it once. A key must never carry two different sets of records.
    let mut keys_of: BTreeMap<u64, std::collections::BTreeSet<&str>> = BTreeMap::new();
    let mut records_of: BTreeMap<&str, &Vec<String>> = BTreeMap::new();
    for (key, recs) in &life.requests {
        if let Some(before) = records_of.insert(key.as_str(), recs)
            && before != recs
        {
            problems.push(format!(
                "key {key} carried two sets of records: {:?} and {:?}",
                crate::util::head(before, 3),
                crate::util::head(recs, 3)
            ));
        }
        for r in recs {
            if let Some(s) = serde_json::from_str::<Value>(r)
                .ok()
                .and_then(|v| v["seq"].as_u64())
            {
                keys_of.entry(s).or_default().insert(key.as_str());
            }
        }
    }
    let twice: Vec<_> = keys_of.iter().filter(|(_, k)| k.len() > 1).collect();
    if !twice.is_empty() {
        problems.push(format!(
            "records delivered under more than one key (seq, keys): {twice:?}"
        ));
    }
    if !wrong.is_empty() {
        problems.push(format!(
            "records never pushed: {}",
            crate::util::head(&wrong, 5)
        ));
    }
    let n = |j: &StoredJob| j.seqs.iter().filter(|s| got.contains_key(s)).count();
    let lost: Vec<String> = fx
        .jobs
        .iter()
        .zip(&intact)
        .filter(|(j, ok)| **ok && n(j) < j.seqs.len())
        .map(|(j, _)| format!("job {} at {:?} seqs {:?}", j.id, j.value, j.seqs))
        .collect();
    if !lost.is_empty() {
        problems.push(format!(
            "intact jobs not (wholly) delivered: {}",
            crate::util::head(&lost, 10)
        ));
    }
    let torn: Vec<String> = fx
        .jobs
        .iter()
        .zip(&intact)
        .filter(|(j, ok)| !**ok && n(j) != 0 && n(j) != j.seqs.len())
        .map(|(j, _)| format!("job {} seqs {:?}: {} delivered", j.id, j.seqs, n(j)))
        .collect();
    if !torn.is_empty() {
        problems.push(format!("damaged jobs delivered in part: {torn:?}"));
    }
    if problems.is_empty() {
        return Ok(());
    }
    let damaged: Vec<u64> = fx
        .jobs
        .iter()
        .zip(&intact)
        .filter(|(_, ok)| !**ok)
        .map(|(j, _)| j.id)
        .collect();
    Err(format!(
        "{}: {}\n  jobs allowed to be lost: {damaged:?}; {} records received\n  agent: {}\n  log:\n{}",
        d.what,
        problems.join("; "),
        life.records.len(),
        path_taken(&life.stderr),
        notable(&life.stderr)
    ))
}

/// Checks each damage in turn; fails listing every case that differed.
fn check_all(fx: &StoreFile, damages: impl IntoIterator<Item = Damage>) {
    let failed: Vec<String> = damages
        .into_iter()
        .filter_map(|d| check_damage(fx, &d).err())
        .collect();
    assert!(
        failed.is_empty(),
        "{} case(s) differ:\n\n{}",
        failed.len(),
        failed.join("\n\n")
    );
}

/// A flipped bit in each page of a small store file in turn, one life of the agent each: in a
/// page where a job's value starts, in the middle of the first such value (its records); in a
/// branch page, in its first child's page number (redb then reads a neighbouring page as that
/// child); anywhere else, in the middle of the page. Each life starts within the bound, and
/// every job the flip left intact is delivered once, the one it hit at most once, nothing else.
#[test]
fn a_flipped_bit_in_each_page_costs_at_most_the_job_it_hit() {
    let fx = store_file();
    let pages = fx.bytes.len() / PAGE;
    eprintln!("{} pages, {} jobs", pages, fx.jobs.len());
    let damages = (0..pages).map(|p| {
        let page = p * PAGE..(p + 1) * PAGE;
        let first_value = fx
            .jobs
            .iter()
            .flat_map(|j| &j.copies)
            .filter(|c| page.contains(&c.start))
            .min_by_key(|c| c.start);
        match first_value {
            Some(v) => fx.flip(v.start + v.len() / 2, "a job value".into()),
            None if fx.bytes[page.start] == 2 => {
                let keys = u16_at(&fx.bytes, page.start + 2);
                let child = page.start + 8 + 16 * (keys + 1);
                fx.flip(child, "a branch's first child".into())
            }
            None => fx.flip(page.start + PAGE / 2, "the middle of the page".into()),
        }
    });
    check_all(&fx, damages);
}

/// A flipped bit in the head of each live leaf of jobs, one life each: its entry count (part of
/// every entry of the leaf), its first value's end offset (the first two values then end and
/// start a byte off), its last key (the job's id: then that of a neighbour). Jobs whose entry was
/// hit may be lost (their bytes cannot be told from damaged ones, or they have another id), or
/// arrive once; every other job arrives once.
#[test]
fn a_flipped_bit_in_a_leaf_head_costs_at_most_the_jobs_it_names() {
    let fx = store_file();
    let mut leaves: Vec<usize> = fx.jobs.iter().map(|j| j.leaf).collect();
    leaves.sort_unstable();
    leaves.dedup();
    eprintln!("{} live leaves", leaves.len());
    let damages = leaves.iter().flat_map(|&leaf| {
        let n = u16_at(&fx.bytes, leaf + 2);
        [
            fx.flip(leaf + 2, "a leaf's entry count".into()),
            fx.flip(leaf + 4, "a leaf's first value end".into()),
            fx.flip(leaf + 4 + 4 * n + 8 * (n - 1), "a leaf's last key".into()),
        ]
    });
    check_all(&fx, damages);
}

/// Zeroed pages, one life each: a leaf of jobs, the ready table's branch (its root), the table
/// tree, and four consecutive pages a third into the file. Jobs in a zeroed page may be lost;
/// every other job arrives once.
#[test]
fn zeroed_pages_cost_at_most_the_jobs_in_them() {
    let fx = store_file();
    assert_eq!(
        fx.bytes[fx.ready_root], 2,
        "{RECORDS} records make a ready table with a branch above its leaves"
    );
    let page = |at: usize| at / PAGE;
    let middle_leaf = page(fx.jobs[fx.jobs.len() / 2].leaf);
    let third = fx.bytes.len() / PAGE / 3;
    check_all(
        &fx,
        [
            fx.zero(middle_leaf..middle_leaf + 1, "a leaf of jobs"),
            fx.zero(
                page(fx.ready_root)..page(fx.ready_root) + 1,
                "the ready table's branch",
            ),
            fx.zero(
                page(fx.table_tree)..page(fx.table_tree) + 1,
                "the table tree",
            ),
            fx.zero(third..third + 4, "four pages"),
        ],
    );
}

/// The file cut short at five offsets spread through it, on a page boundary and not, one life
/// each: jobs wholly before the cut arrive once; the rest may be lost.
#[test]
fn a_store_file_cut_short_costs_at_most_the_jobs_past_the_cut() {
    let fx = store_file();
    let len = fx.bytes.len();
    let aligned = |at: usize| at / PAGE * PAGE;
    check_all(
        &fx,
        [
            aligned(len / 8),
            len / 3 + 123,
            aligned(len / 2),
            2 * len / 3 + 777,
            len - PAGE,
            len - 1,
        ]
        .map(|at| fx.cut(at)),
    );
}

/// Issue 31 A: a zeroed live leaf in a store whose freed pages still hold jobs delivered before.
/// The salvage finds the ready tree incomplete and takes old copies "in doubt"; those of the
/// delivered jobs are sent again. They are counted as a re-send, not in place of the zeroed
/// leaf's jobs: the counter books that leaf's records as lost, the report says the same, the
/// identity holds, and what the receiver really gets is what was held, less the loss, plus the
/// re-send.
#[test]
fn a_zeroed_leaf_is_counted_lost_and_old_copies_sent_again_as_a_resend() {
    let sb = Sandbox::new();
    let data = sb.file("data");
    let rx = Receiver::start();
    let cfg = pages_config(&sb, &data, &rx.url("/in"));
    let push_seqs = |seqs: Range<u64>| {
        let lines: String = seqs.map(|s| page_record(s) + "\n").collect();
        let f = finish_with_stdin(
            &sb,
            queue(&cfg, &["push", "logs", "--batch", "40"]),
            &lines,
            secs(60),
        );
        assert_code(f.status, 0, &f.stderr);
    };
    // Twice as many delivered (their leaves freed, more than the next push takes again, so old
    // copies stay in the file) as then held.
    let delivered = 2 * RECORDS;
    push_seqs(0..delivered);
    let agent = Proc::run(&cfg);
    poll(secs(60), || {
        (rx.records().len() as u64 >= delivered).then_some(())
    })
    .unwrap_or_else(|| panic!("{} of {delivered} delivered", rx.records().len()));
    crate::util::stop(agent);
    push_seqs(delivered..delivered + RECORDS);
    let held = stream_stats(&queue_stats(&cfg, &[]), "logs")["ready"]["records"]
        .as_u64()
        .expect("ready records");

    // Zero a live leaf of one page, in the middle of the ready table.
    let bytes = std::fs::read(data.join("colibri.redb")).unwrap();
    let found = colibri::store::salvage::scan(&bytes[..], &["logs"]).expect("scan");
    let mut leaves: BTreeMap<usize, (u64, usize)> = BTreeMap::new();
    for j in found.jobs.iter().filter(|j| j.live) {
        let l = leaves.entry(j.leaf as usize).or_default();
        l.0 += j.records;
        l.1 = l.1.max(j.at as usize + j.len - j.leaf as usize);
    }
    let one_page: Vec<(usize, u64)> = leaves
        .iter()
        .filter(|(_, (_, end))| *end <= PAGE)
        .map(|(&leaf, &(records, _))| (leaf, records))
        .collect();
    assert!(one_page.len() >= 3, "several live leaves: {leaves:?}");
    let (leaf, want_lost) = one_page[one_page.len() / 2];
    let mut damaged = bytes.clone();
    damaged[leaf..leaf + PAGE].fill(0);
    let old = sb.file("colibri.redb.corrupt-1");
    std::fs::write(&old, &damaged).unwrap();

    // Salvaged into a new store, then delivered.
    let rx2 = Receiver::start();
    let data2 = sb.file("data2");
    let cfg2 = pages_config(&sb, &data2, &rx2.url("/in"));
    let f = finish(
        queue(&cfg2, &["salvage", "--json", old.to_str().unwrap()]),
        secs(60),
    );
    assert_code(f.status, 0, &f.stderr);
    let report: Value = serde_json::from_str(&f.stdout).expect("a JSON report");
    let resent = report["resent_records"].as_u64().expect("resent_records");
    assert!(resent > 0, "old copies came back in doubt: {report}");
    assert_eq!(report["lost_records"], want_lost, "{report}");
    let stats = queue_stats(&cfg2, &[]);
    let logs = stream_stats(&stats, "logs");
    assert_eq!(logs["balanced"], true, "{stats}");
    assert_eq!(
        logs["counters"]["lost_to_damage_records"], want_lost,
        "the zeroed leaf's records are lost, whatever came back in doubt: {stats}"
    );
    assert_eq!(
        logs["counters"]["salvage_resent_records"], resent,
        "{stats}"
    );

    let want = held - want_lost + resent;
    let agent = Proc::run(&cfg2);
    poll(secs(60), || {
        (rx2.records().len() as u64 >= want).then_some(())
    })
    .unwrap_or_else(|| panic!("{} of {want} delivered", rx2.records().len()));
    crate::util::stop(agent);
    assert_eq!(rx2.records().len() as u64, want, "held - lost + re-sent");
    let stats = queue_stats(&cfg2, &[]);
    let logs = stream_stats(&stats, "logs");
    assert_eq!(logs["balanced"], true, "{stats}");
    assert_eq!(logs["ready"]["records"], 0, "{stats}");
}
