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

    // JSON, into a store that has them already: salvaged again (a salvage is not idempotent).
    let f = finish(
        queue(&cfg, &["salvage", aside.to_str().unwrap(), "--json"]),
        secs(60),
    );
    assert_code(f.status, 0, &f.stderr);
    let doc: serde_json::Value = serde_json::from_str(&f.stdout).unwrap();
    assert_eq!(doc["jobs"], 80, "{doc}");

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
/// done): the next start salvages whatever is not marked done, and every intact record reaches the
/// receiver at least once; none is lost. Records sent twice are the price of a cut salvage.
#[test]
fn a_salvage_cut_short_by_kill_9_is_done_again_and_loses_nothing() {
    use crate::util::http::Receiver;
    use crate::util::{Proc, poll, stop};
    use std::collections::BTreeSet;

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
    let seen = || -> BTreeSet<u64> {
        rx.records()
            .iter()
            .map(|r| {
                serde_json::from_str::<serde_json::Value>(r).unwrap()["seq"]
                    .as_u64()
                    .unwrap()
            })
            .collect()
    };
    if poll(secs(120), || (seen() == all).then_some(())).is_none() {
        let missing = all.difference(&seen()).count();
        panic!(
            "{missing} of {N} records never delivered:\n{}",
            agent.stderr()
        );
    }
    let agent = stop(agent);
    // The second life salvaged again exactly when the first did not finish.
    assert_eq!(
        agent.stderr().contains("salvage done"),
        cut_short,
        "{}",
        agent.stderr()
    );
    let stats = queue_stats(&cfg, &[]);
    assert_eq!(stats["damaged_files"][0]["salvaged"], true, "{stats}");
    assert_eq!(stream_stats(&stats, "logs")["balanced"], true, "{stats}");
}
