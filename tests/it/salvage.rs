//! `colibri queue salvage FILE` on the real binary: a store file damaged where redb refuses it
//! (its magic) is salvaged whole into the configured store, the report says so, and `queue
//! stats` shows the jobs back under their streams; a missing file fails naming it, and the live
//! store itself is refused as a usage error.

use std::path::Path;

use crate::util::{
    Sandbox, assert_code, finish, finish_with_stdin, queue, queue_stats, quote_path, secs,
    stream_stats,
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
    sb.write_config(&format!(
        "data_dir: {data}\n\
         log: {{ format: json }}\n\
         sinks:\n  \
           up: {{ type: http, url: \"{url}\", link: {{ down_after: 1, backoff_base: 50ms, backoff_cap: 200ms }} }}\n\
         streams:\n  \
           logs: {{ sink: up, batch: {{ max_records: 7 }} }}\n",
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
        assert_eq!(done[0]["lost_jobs"], 0, "{name}: {}", done[0]);

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
