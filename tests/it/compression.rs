//! Jobs compressed at rest, end to end: a backlog that builds while the upstream is gone is stored
//! compressed and delivered intact, in order; a sink that sends zstd bodies gets the stored frames;
//! a damaged compressed job is quarantined while the rest is delivered; and a store written by the
//! release before compression (format version 1 jobs, committed as a fixture) opens and delivers.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::util::http::{Mode, Receiver};
use crate::util::{Proc, Sandbox, assert_code, finish, finish_with_stdin, quote_path, secs, stop};
use crate::util::{queue, queue_stats, stream_stats};

const STREAM: &str = "logs";

/// A config with one stream delivered to `url` (10 records a job), short link timings.
fn config(sb: &Sandbox, data: &Path, url: &str, stream_extra: &str, sink_extra: &str) -> PathBuf {
    sb.write_config(&format!(
        "data_dir: {data}\n\
         log: {{ format: json }}\n\
         sinks:\n  \
           up: {{ type: http, url: \"{url}\", retry: {{ base: 1s, cap: 1s, max_attempts: 8 }}, link: {{ down_after: 1, backoff_base: 50ms, backoff_cap: 200ms }}{sink_extra} }}\n\
         streams:\n  \
           {STREAM}: {{ sink: up, batch: {{ max_records: 10 }}{stream_extra} }}\n",
        data = quote_path(data),
    ))
}

/// `n` JSON records from `first` on, compressible like log lines are.
fn records(first: u64, n: u64) -> String {
    (first..first + n)
        .map(|i| format!("{{\"seq\":{i},\"level\":\"info\",\"msg\":\"request served in 3 ms for /api/v1/items\"}}\n"))
        .collect()
}

fn push(sb: &Sandbox, config: &Path, lines: &str) {
    let f = finish_with_stdin(sb, queue(config, &["push", STREAM]), lines, secs(60));
    assert_code(f.status, 0, &f.stderr);
}

fn seqs(receiver: &Receiver) -> Vec<u64> {
    receiver
        .records()
        .iter()
        .map(|r| {
            serde_json::from_str::<Value>(r).expect("a JSON record")["seq"]
                .as_u64()
                .expect("a seq")
        })
        .collect()
}

fn counter(stats: &Value, name: &str) -> u64 {
    stats["counters"][name].as_u64().unwrap_or(0)
}

/// The receiver is gone while 2,000 records arrive: `compression: auto` stores all but the first
/// few jobs compressed (the stream's raw bytes are several times its bytes on disk), and every
/// record reaches the receiver once, in order, byte for byte, when it comes back.
#[test]
fn a_backlog_is_stored_compressed_and_delivered_intact() {
    let sb = Sandbox::new();
    let receiver = Receiver::start();
    receiver.set_mode(Mode::Refuse);
    let cfg = config(&sb, &sb.file("data"), &receiver.url("/in"), "", "");
    push(&sb, &cfg, &records(0, 2000));
    let st = stream_stats(&queue_stats(&cfg, &[]), STREAM);
    let (bytes, raw) = (counter(&st, "ready_bytes"), counter(&st, "ready_raw_bytes"));
    assert!(
        raw > 4 * bytes,
        "200 waiting jobs take {bytes} bytes for {raw} raw: {st}"
    );
    let agent = Proc::run(&cfg);
    agent.wait_until(secs(30), "the link down", || {
        !agent
            .events_where(|e| crate::util::field(e, "message").starts_with("link down"))
            .is_empty()
    });
    receiver.set_mode(Mode::Accept);
    receiver
        .wait_records(2000, secs(60))
        .unwrap_or_else(|e| panic!("{e}; stderr:\n{}", agent.stderr()));
    stop(agent);
    assert_eq!(seqs(&receiver), (0..2000).collect::<Vec<u64>>());
    let expected: Vec<String> = records(0, 2000).lines().map(str::to_string).collect();
    assert_eq!(receiver.records(), expected, "byte for byte");
    let st = stream_stats(&queue_stats(&cfg, &[]), STREAM);
    assert_eq!(st["balanced"], true, "{st}");
    assert_eq!(counter(&st, "delivered_records"), 2000);
    assert_eq!(counter(&st, "ready_raw_bytes"), 0);
}

/// A sink with `compression: zstd` (NDJSON): every job is stored compressed (`auto`), and its
/// stored frame is the request body, which any zstd decoder reads back into the records.
#[test]
fn a_zstd_sink_sends_the_stored_frames() {
    let sb = Sandbox::new();
    let receiver = Receiver::start();
    receiver.set_mode(Mode::Refuse);
    let cfg = config(
        &sb,
        &sb.file("data"),
        &receiver.url("/in"),
        "",
        ", compression: zstd",
    );
    push(&sb, &cfg, &records(0, 30));
    let st = stream_stats(&queue_stats(&cfg, &[]), STREAM);
    assert!(
        counter(&st, "ready_raw_bytes") > counter(&st, "ready_bytes"),
        "every job compressed, the first ones too: {st}"
    );
    receiver.set_mode(Mode::Accept);
    let agent = Proc::run(&cfg);
    receiver.wait_records(30, secs(30)).expect("30 records");
    stop(agent);
    assert_eq!(seqs(&receiver), (0..30).collect::<Vec<u64>>());
    for r in receiver.requests() {
        assert_eq!(r.content_encoding.as_deref(), Some("zstd"));
        assert_eq!(r.decode_error, None);
        assert!(
            r.wire_len < r.body.len(),
            "{} on the wire for {}",
            r.wire_len,
            r.body.len()
        );
    }
}

/// Two compressed jobs go bad on disk: one fails its job checksum (bit rot), the other keeps a
/// valid checksum but its zstd frame no longer decodes (what only the frame's own checksum and
/// length catch). Both are quarantined and counted; every other record is delivered, in order,
/// and the accounting balances.
#[test]
fn damaged_compressed_jobs_are_quarantined_and_the_rest_delivered() {
    let sb = Sandbox::new();
    let receiver = Receiver::start();
    let data = sb.file("data");
    let cfg = config(&sb, &data, &receiver.url("/in"), ", compression: zstd", "");
    push(&sb, &cfg, &records(0, 50));
    damage(&data.join("colibri.redb"), 2, false);
    damage(&data.join("colibri.redb"), 4, true);
    let agent = Proc::run(&cfg);
    receiver.wait_records(30, secs(30)).expect("30 records");
    agent.wait_until(secs(30), "both quarantined", || {
        agent
            .events_where(|e| {
                crate::util::field(e, "message") == "job cannot be decoded; moved to quarantine"
            })
            .len()
            == 2
    });
    let mut reasons: Vec<String> = agent
        .events_where(|e| {
            crate::util::field(e, "message") == "job cannot be decoded; moved to quarantine"
        })
        .iter()
        .map(|e| crate::util::field(e, "reason").to_string())
        .collect();
    reasons.sort();
    assert!(
        reasons[0].contains("checksum mismatch")
            && reasons[1].starts_with("compressed record area"),
        "one caught by the job's checksum, one by the frame's own checks: {reasons:?}"
    );
    stop(agent);
    let expected: Vec<u64> = (0..10).chain(20..30).chain(40..50).collect();
    assert_eq!(seqs(&receiver), expected);
    let doc = queue_stats(&cfg, &[]);
    let st = stream_stats(&doc, STREAM);
    assert_eq!(st["balanced"], true, "{st}");
    assert_eq!(counter(&st, "quarantined_records"), 20, "{st}");
    assert_eq!(counter(&st, "delivered_records"), 30, "{st}");
    assert_eq!(doc["quarantined_entries"], 2, "{doc}");
}

/// Damages job `id` of the stream's ready table in a stopped agent's store: a byte inside its
/// compressed area flipped, and with `reseal` its CRC-32 computed again so that only the frame's
/// own checks can tell (format version 3: the CRC at bytes 13..17 covers every other byte).
fn damage(db: &Path, id: u64, reseal: bool) {
    use redb::ReadableTable;
    let table: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("ready/logs");
    let db = redb::Database::open(db).expect("open the store file");
    let txn = db.begin_write().expect("a write transaction");
    {
        let mut t = txn.open_table(table).expect("the ready table");
        let mut v = t.get(id).expect("read").expect("the job").value().to_vec();
        assert_eq!((v[0], v[29]), (3, 1), "a compressed version 3 job");
        let meta_len = u32::from_le_bytes(v[17..21].try_into().expect("4 bytes")) as usize;
        let frame = 31 + meta_len;
        // Past the frame's header: a byte of its compressed content.
        let at = frame + (v.len() - frame) / 2;
        v[at] ^= 0x5a;
        if reseal {
            let mut h = crc32fast::Hasher::new();
            h.update(&v[..13]);
            h.update(&v[17..]);
            let crc = h.finalize();
            v[13..17].copy_from_slice(&crc.to_le_bytes());
        }
        t.insert(id, v.as_slice()).expect("write");
    }
    txn.commit().expect("commit");
}

/// Where the fixture lives.
fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/store-v1/colibri.redb")
}

/// A store written by the release before compression at rest (every job in format version 1):
/// 2 dead jobs (records 0..20, refused with 400), 1 job in retry (20..30, answered 503), 3 ready
/// jobs (30..60). This release opens it, delivers the retry and ready jobs in order, replays the
/// dead letters, delivers them too, and counts it all (raw bytes equal to bytes for those jobs).
///
/// The fixture is built by [`build_fixture`] with that release's binary:
/// `COLIBRI_FIXTURE_OLD_BIN=/path/to/old/colibri cargo test --test it compression::an_old`.
#[test]
fn an_old_format_store_opens_and_delivers() {
    if let Some(old) = std::env::var_os("COLIBRI_FIXTURE_OLD_BIN") {
        build_fixture(Path::new(&old));
    }
    let sb = Sandbox::new();
    let data = sb.file("data");
    std::fs::create_dir_all(&data).expect("mkdir");
    std::fs::copy(fixture(), data.join("colibri.redb")).expect("copy the fixture");
    let receiver = Receiver::start();
    let cfg = config(&sb, &data, &receiver.url("/in"), "", "");
    let st = stream_stats(&queue_stats(&cfg, &[]), STREAM);
    assert_eq!(
        (
            counter(&st, "dead_jobs"),
            counter(&st, "retry_jobs"),
            counter(&st, "ready_jobs")
        ),
        (2, 1, 3),
        "{st}"
    );
    assert_eq!(
        counter(&st, "ready_raw_bytes"),
        counter(&st, "ready_bytes"),
        "old jobs are stored as they are: {st}"
    );
    let agent = Proc::run(&cfg);
    receiver.wait_records(40, secs(30)).expect("40 records");
    stop(agent);
    assert_eq!(seqs(&receiver), (20..60).collect::<Vec<u64>>());
    let f = finish(
        {
            let mut c = queue(&cfg, &["dead", "replay", STREAM]);
            c.arg("--json");
            c
        },
        secs(60),
    );
    assert_code(f.status, 0, &f.stderr);
    let agent = Proc::run(&cfg);
    receiver.wait_records(60, secs(30)).expect("60 records");
    stop(agent);
    let mut all = seqs(&receiver);
    all.sort_unstable();
    assert_eq!(all, (0..60).collect::<Vec<u64>>());
    let st = stream_stats(&queue_stats(&cfg, &[]), STREAM);
    assert_eq!(st["balanced"], true, "{st}");
    assert_eq!(counter(&st, "appended_records"), 60, "{st}");
    assert_eq!(counter(&st, "delivered_records"), 60, "{st}");
    assert_eq!(
        counter(&st, "ready_raw_bytes") + counter(&st, "dead_raw_bytes"),
        0
    );
}

/// Writes the fixture with `old`, a colibri binary of the release before compression at rest.
fn build_fixture(old: &Path) {
    let sb = Sandbox::new();
    let data = sb.file("data");
    let receiver = Receiver::start();
    let cfg = config(&sb, &data, &receiver.url("/in"), "", "");
    let run_until = |mode: Mode, what: &str, done: &dyn Fn(&Value) -> bool| {
        receiver.set_mode(mode);
        let mut cmd = Command::new(old);
        cmd.arg("run").arg("--config").arg(&cfg);
        let agent = Proc::spawn(cmd);
        agent.wait_until(secs(30), what, || {
            let mut c = Command::new(old);
            c.args(["queue", "stats", "--json", "--config"]).arg(&cfg);
            let f = finish(c, secs(30));
            serde_json::from_str::<Value>(&f.stdout)
                .map(|d| done(&stream_stats(&d, STREAM)))
                .unwrap_or(false)
        });
        stop(agent);
    };
    let old_push = |lines: &str| {
        let mut cmd = Command::new(old);
        cmd.args(["queue", "push", "--config"])
            .arg(&cfg)
            .arg(STREAM);
        let f = finish_with_stdin(&sb, cmd, lines, secs(60));
        assert_code(f.status, 0, &f.stderr);
    };
    old_push(&records(0, 20));
    run_until(Mode::Status(400), "two dead jobs", &|s| {
        counter(s, "dead_jobs") == 2
    });
    old_push(&records(20, 10));
    run_until(Mode::Status(503), "a job in retry", &|s| {
        counter(s, "retry_jobs") == 1
    });
    old_push(&records(30, 30));
    std::fs::create_dir_all(fixture().parent().expect("a dir")).expect("mkdir");
    std::fs::copy(data.join("colibri.redb"), fixture()).expect("write the fixture");
    // Nothing was delivered while it was built: the receiver only refused.
    assert!(receiver.records().is_empty());
}
