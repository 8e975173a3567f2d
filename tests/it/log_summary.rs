//! Events that repeat by the thousand are logged once in full, then counted: refused requests on
//! both listeners, dead letters dropped from a full dead-letter table, a file too large for its
//! stream found again by every run, a scrape failing every run the same way. Each test floods the real binary, stops it (a stop writes the
//! pending counts) and reads its JSON log: one full line per kind, the summaries' `repeated`
//! counts adding up to the rest.

use crate::tsdb::free_port;
use std::fs::File;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use serde_json::Value;

use crate::util::client::Client;
use crate::util::http::{Mode, Receiver};
use crate::util::serve::Endpoint;
use crate::util::{Proc, Sandbox, field, quote, quote_path};
use crate::util::{queue_stats, secs, stop};

fn is(e: &Value, prefix: &str) -> bool {
    field(e, "message").starts_with(prefix)
}

/// (lines logged in full, the occurrences their summaries count) among `events`.
fn full_and_repeated(events: &[Value]) -> (usize, u64) {
    let full = events
        .iter()
        .filter(|e| e.get("repeated").is_none())
        .count();
    let repeated = events.iter().filter_map(|e| e["repeated"].as_u64()).sum();
    (full, repeated)
}

/// 300 requests without the token and 200 to a stream that does not exist, on ingest, and 300
/// admin scrapes without the admin token: per kind, one WARN in full, then summaries that count
/// the rest exactly.
#[test]
fn repeated_refusals_are_logged_once_then_counted() {
    let sb = Sandbox::new();
    let port = free_port();
    let config = sb.write_config(&format!(
        "data_dir: data\n\
         log: {{ format: json, level: info }}\n\
         storage: {{ min_free: 1MiB }}\n\
         admin: {{ listen: \"127.0.0.1:0\", token: admin-secret }}\n\
         ingest: {{ listen: \"127.0.0.1:{port}\", token: ingest-secret }}\n\
         streams: {{ logs: {{}} }}\n"
    ));
    let agent = Proc::run(&config);
    let listening = agent.wait_for_event(secs(30), "admin endpoint listening", |e| {
        is(e, "admin endpoint listening")
    });
    agent.wait_for_event(secs(30), "colibri started", |e| is(e, "colibri started"));
    let admin: SocketAddr = field(&listening, "listen").parse().expect("an address");
    let mut c = Client::new(SocketAddr::from(([127, 0, 0, 1], port)));
    c.timeout = secs(10);
    for _ in 0..300 {
        let a = c
            .post(
                "/v1/streams/logs/records",
                "application/x-ndjson",
                &[],
                b"{}\n",
            )
            .expect("an answer");
        assert_eq!(a.status, 401);
    }
    let auth = [("Authorization", "Bearer ingest-secret")];
    for _ in 0..200 {
        let a = c
            .post(
                "/v1/streams/nope/records",
                "application/x-ndjson",
                &auth,
                b"{}\n",
            )
            .expect("an answer");
        assert_eq!(a.status, 404);
    }
    let mut m = Client::new(admin);
    m.timeout = secs(10);
    for _ in 0..300 {
        let a = m.request("GET", "/metrics", &[], None).expect("an answer");
        assert_eq!(a.status, 401);
    }
    let agent = stop(agent);
    for (what, status, n) in [
        ("ingest request refused", 401, 300),
        ("ingest request refused", 404, 200),
        ("admin request refused", 401, 300),
    ] {
        let lines = agent.events_where(|e| is(e, what) && e["status"] == status);
        assert!(
            lines.iter().all(|e| field(e, "level") == "WARN"),
            "{lines:#?}"
        );
        let (full, repeated) = full_and_repeated(&lines);
        assert_eq!(full, 1, "{what} {status}: one in full: {lines:#?}");
        assert_eq!(
            repeated,
            n - 1,
            "{what} {status}: the rest counted: {lines:#?}"
        );
        assert!(lines.len() <= 3, "{what} {status}: {} lines", lines.len());
    }
}

/// A sink that refuses every job (400) with `dead_letter: { max_jobs: 1 }`: each new dead letter
/// drops the oldest. One WARN in full, then a summary counting the other drops and their records.
#[test]
fn dead_letters_dropped_from_a_full_table_are_logged_once_then_counted() {
    let rx = Receiver::start();
    rx.set_mode(Mode::Status(400));
    let sb = Sandbox::new();
    let port = free_port();
    let config = sb.write_config(&format!(
        "data_dir: data\n\
         log: {{ format: json, level: info }}\n\
         storage: {{ min_free: 1MiB }}\n\
         ingest: {{ listen: \"127.0.0.1:{port}\" }}\n\
         sinks:\n  up: {{ type: http, url: {} }}\n\
         streams:\n  logs: {{ sink: up, dead_letter: {{ max_jobs: 1 }} }}\n",
        quote(rx.url("/in"))
    ));
    let agent = Proc::run(&config);
    agent.wait_for_event(secs(30), "colibri started", |e| is(e, "colibri started"));
    let mut c = Client::new(SocketAddr::from(([127, 0, 0, 1], port)));
    c.timeout = secs(10);
    for i in 0..40 {
        let a = c
            .post(
                "/v1/streams/logs/records",
                "application/x-ndjson",
                &[],
                format!("{{\"n\":{i}}}\n{{\"m\":{i}}}\n").as_bytes(),
            )
            .expect("an answer");
        assert_eq!(a.status, 200, "{}", a.text());
        // One job at a time, so each is dead-lettered on its own.
        rx.wait_requests(i + 1, secs(20))
            .unwrap_or_else(|e| panic!("{e}; stderr:\n{}", agent.stderr()));
    }
    let dropped = || {
        queue_stats(&config, &[])["streams"][0]["counters"]["dropped_dead_full_records"]
            .as_u64()
            .unwrap_or(0)
    };
    agent.wait_until(secs(30), "39 dead letters dropped", || dropped() == 78);
    let agent = stop(agent);
    let lines = agent.events_where(|e| is(e, "dead-letter table full"));
    let (full, repeated) = full_and_repeated(&lines);
    assert_eq!(full, 1, "{lines:#?}");
    assert_eq!(repeated, 38, "{lines:#?}");
    let records: u64 = lines.iter().filter_map(|e| e["records"].as_u64()).sum();
    assert_eq!(records, 78, "{lines:#?}");
}

/// A `file_move` to a stream whose `max_bytes` the file can never fit: every run finds it again,
/// but only the first says so in full (an ERROR); the runs themselves succeed (counting it as
/// failed) and the file stays untouched.
#[test]
fn a_file_too_large_for_its_stream_is_logged_once_not_every_run() {
    let sb = Sandbox::new();
    let from = sb.file("in");
    std::fs::create_dir_all(&from).unwrap();
    std::fs::write(from.join("huge.bin"), vec![7u8; 2 << 20]).unwrap();
    File::options()
        .write(true)
        .open(from.join("huge.bin"))
        .unwrap()
        .set_modified(SystemTime::now() - secs(60))
        .unwrap();
    let config = sb.write_config(&format!(
        "data_dir: data\n\
         log: {{ format: json, level: info }}\n\
         storage: {{ min_free: 1MiB }}\n\
         streams:\n  files: {{ max_bytes: 1MiB, batch: {{ max_bytes: 64KiB }} }}\n\
         tasks:\n  - {{ name: ship, type: file_move, every: 200ms, from: {}, pattern: ['*.bin'], to_stream: files, settle: 1s }}\n",
        quote_path(&from)
    ));
    let agent = Proc::run(&config);
    agent.wait_until(secs(30), "10 runs", || {
        agent
            .events_where(|e| field(e, "task") == "ship" && is(e, "task run"))
            .len()
            >= 10
    });
    let agent = stop(agent);
    let runs = agent.events_where(|e| field(e, "task") == "ship" && is(e, "task run"));
    for r in &runs {
        assert_eq!(field(r, "message"), "task run finished", "{r}");
        assert_eq!(r["files_failed"], 1, "{r}");
    }
    let lines = agent.events_where(|e| is(e, "a file too large for its stream"));
    assert!(
        lines.iter().all(|e| field(e, "level") == "ERROR"),
        "{lines:#?}"
    );
    let (full, repeated) = full_and_repeated(&lines);
    assert_eq!(full, 1, "{lines:#?}");
    assert!(
        field(&lines[0], "reason").contains("can never fit in stream"),
        "{lines:#?}"
    );
    assert!(repeated as usize + 1 >= runs.len(), "{lines:#?}");
    assert!(lines.len() <= 2, "{lines:#?}");
    assert_eq!(
        std::fs::read_dir(&from).unwrap().count(),
        1,
        "the file stays where it is"
    );
}

/// Two `http_scrape` tasks that fail every run (one endpoint answers 500, the other port refuses
/// connections): per task, the first failure is one ERROR in full and the runs after it are
/// counted in a summary, instead of one ERROR per run; the two tasks are not merged.
#[test]
fn a_scrape_failing_every_run_is_logged_once_then_counted() {
    let sb = Sandbox::new();
    let gets = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&gets);
    let endpoint = Endpoint::start(Box::new(move |_, _| {
        counted.fetch_add(1, Ordering::SeqCst);
        (500, "text/plain", "broken\n".into())
    }));
    let dead = free_port();
    let config = sb.write_config(&format!(
        "data_dir: data\n\
         log: {{ format: json, level: info }}\n\
         storage: {{ min_free: 1MiB }}\n\
         streams: {{ m: {{}} }}\n\
         tasks:\n  - {{ name: broken, type: http_scrape, every: 100ms, url: {}, format: raw, stream: m }}\n  \
         - {{ name: dead, type: http_scrape, every: 100ms, url: \"http://127.0.0.1:{dead}/metrics\", format: raw, stream: m }}\n",
        quote(endpoint.url("/metrics"))
    ));
    let agent = Proc::run(&config);
    agent.wait_until(secs(30), "12 failed scrapes", || {
        gets.load(Ordering::SeqCst) >= 12
    });
    let agent = stop(agent);
    let served = gets.load(Ordering::SeqCst);
    let failed = |task: &str| {
        agent.events_where(|e| field(e, "task") == task && field(e, "outcome") == "failed")
    };
    let broken = failed("broken");
    assert!(
        broken
            .iter()
            .all(|e| field(e, "level") == "ERROR" && field(e, "reason").contains("answered 500")),
        "{broken:#?}"
    );
    let (full, repeated) = full_and_repeated(&broken);
    assert_eq!(full, 1, "one in full: {broken:#?}");
    // Every GET served was a failed run, logged or counted (one may still have been going).
    assert!(repeated + 1 >= served - 1, "{served} served: {broken:#?}");
    assert!(broken.len() <= 3, "{broken:#?}");
    let dead = failed("dead");
    let (full, repeated) = full_and_repeated(&dead);
    assert_eq!(full, 1, "the other task in full too: {dead:#?}");
    assert!(repeated >= 1, "{dead:#?}");
    assert!(
        dead.iter()
            .all(|e| field(e, "reason").contains("127.0.0.1")),
        "{dead:#?}"
    );
}
