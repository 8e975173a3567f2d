//! After an outage the present goes first: a stream with `replay: live_first` delivers what is
//! appended during a paced drain ahead of the backlog, each lane in order, every record once under
//! its idempotency key, and the backlog's requests (only they) carry the replayed marker; between
//! the streams of one sink, `priority` sends a higher stream's backlog first and `min_share` keeps
//! a lower one going. The real binary, the test HTTP receiver as the sink, the ingest API as the
//! live producer.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::tsdb::free_port;
use crate::util::client::Client;
use crate::util::http::{Received, Receiver};
use crate::util::{
    Proc, Sandbox, assert_code, field, finish_with_stdin, poll, queue, queue_stats, quote, secs,
    stop, stream_stats,
};

/// The backlog's records, pushed while the agent is stopped (the outage).
const BACKLOG: u64 = 200_000;
/// Live records, one every 20 ms (50 per second) during the drain.
const LIVE: u64 = 2_500;
/// Live records are numbered from here, the backlog's from 0.
const LIVE_FROM: u64 = 1_000_000;
/// The stream's live window: jobs older than this are the backlog.
const WINDOW: Duration = Duration::from_secs(5);
/// What the test says a record is.
const MARKER: &str = "colibri-replayed";

fn rec(seq: u64) -> String {
    format!(r#"{{"seq":{seq},"msg":"reading {seq} of the test sensor","unit":"celsius"}}"#)
}

fn seq_of(record: &str) -> u64 {
    serde_json::from_str::<Value>(record)
        .ok()
        .and_then(|v| v["seq"].as_u64())
        .unwrap_or_else(|| panic!("a record nobody sent: {record:?}"))
}

/// One stream `logs` fed by ingest on `port`, delivered to `url` at `replay_rate` with one request
/// at a time, in the order `replay`; the admin endpoint on `admin`.
fn config(
    sb: &Sandbox,
    (port, admin): (u16, u16),
    url: &str,
    replay: &str,
    replay_rate: &str,
) -> PathBuf {
    sb.write_config(&format!(
        "data_dir: data\n\
         shutdown_grace: 2s\n\
         admin: {{ listen: \"127.0.0.1:{admin}\" }}\n\
         storage: {{ min_free: 1MiB }}\n\
         log: {{ format: json, level: info }}\n\
         ingest: {{ listen: \"127.0.0.1:{port}\" }}\n\
         sinks:\n  \
           up: {{ type: http, url: {url}, concurrency: 1, replay_rate: {replay_rate}, timeout: 10s, \
                  link: {{ probe: tcp, down_after: 2, backoff_base: 50ms, backoff_cap: 200ms }} }}\n\
         streams:\n  \
           logs: {{ sink: up, replay: {replay}, live_window: {w}s, batch: {{ max_records: 1000 }}, \
                    max_jobs: 1000000, max_bytes: 1GiB }}\n",
        url = quote(url),
        w = WINDOW.as_secs(),
    ))
}

fn start(config: &Path) -> Proc {
    let agent = Proc::run(config);
    agent.wait_for_event(secs(30), "colibri started", |e| {
        field(e, "message").starts_with("colibri started")
    });
    agent
}

/// `colibri queue push` of `records` into `logs`, 1000 per job, the agent stopped.
fn push(sb: &Sandbox, config: &Path, records: &[String]) {
    push_into(sb, config, "logs", records, 1000);
}

fn push_into(sb: &Sandbox, config: &Path, stream: &str, records: &[String], per_job: usize) {
    let mut text = records.join("\n");
    text.push('\n');
    let f = finish_with_stdin(
        sb,
        queue(config, &["push", stream, "--batch", &per_job.to_string()]),
        &text,
        secs(120),
    );
    assert_code(f.status, 0, &f.stderr);
}

/// Posts live records `from..to` (numbered from [`LIVE_FROM`]) one every 20 ms; returns when
/// each was acknowledged (stored).
fn produce(port: u16, from: u64, to: u64) -> HashMap<u64, Instant> {
    let mut c = Client::new(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    c.timeout = secs(30);
    let start = Instant::now();
    let mut acked = HashMap::new();
    for i in from..to {
        let next = start + Duration::from_millis(20 * (i - from));
        if let Some(d) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
        let seq = LIVE_FROM + i;
        let body = format!("{}\n", rec(seq));
        let a = c
            .post(
                "/v1/streams/logs/records",
                "application/x-ndjson",
                &[],
                body.as_bytes(),
            )
            .unwrap_or_else(|e| panic!("live record {i}: no answer: {e}"));
        assert_eq!(a.status, 200, "live record {i}: {}", a.text());
        acked.insert(seq, Instant::now());
    }
    acked
}

/// `colibri_stream_delivery_latency_seconds` of `logs` in `lane`, from the admin endpoint.
fn latency(admin: u16, lane: &str) -> f64 {
    let text = scrape(admin);
    sample(
        &text,
        &format!("colibri_stream_delivery_latency_seconds{{stream=\"logs\",lane=\"{lane}\"}}"),
    )
}

/// One scrape of the admin endpoint's `/metrics`.
pub(crate) fn scrape(admin: u16) -> String {
    let mut c = Client::new(std::net::SocketAddr::from(([127, 0, 0, 1], admin)));
    c.request("GET", "/metrics", &[], None)
        .unwrap_or_else(|e| panic!("GET /metrics: {e}"))
        .text()
}

/// The value of the series `series` (name and labels as written) in a scrape.
pub(crate) fn sample(text: &str, series: &str) -> f64 {
    let prefix = format!("{series} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {series:?} in the scrape:\n{text}"))
}

/// The value at `q` (0..=1) of sorted `v`.
fn quantile(v: &[Duration], q: f64) -> Duration {
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// Pushes `records` as the backlog and returns once it is older than the live window.
fn outage(sb: &Sandbox, config: &Path, records: u64) {
    drop(stop(start(config)));
    let backlog: Vec<String> = (0..records).map(rec).collect();
    push(sb, config, &backlog);
    // The backlog is what is older than the window when the link is back.
    let pushed = Instant::now();
    while pushed.elapsed() <= WINDOW {
        std::thread::sleep(WINDOW.saturating_sub(pushed.elapsed()) + Duration::from_millis(10));
    }
}

/// A drain of a 200,000-record backlog paced to about a minute, with 50 live records a second
/// appended meanwhile (see the module's header).
#[test]
fn live_first_sends_the_present_ahead_of_a_paced_backlog() {
    let sb = Sandbox::new();
    let rx = Receiver::start();
    let port = free_port();
    // ~66 bytes a record: 13 MB of backlog at 220 KB/s is about a minute.
    let admin = free_port();
    let config = config(
        &sb,
        (port, admin),
        &rx.url("/ingest"),
        "live_first",
        "215KiB",
    );
    outage(&sb, &config, BACKLOG);
    let agent = start(&config);
    let acked = produce(port, 0, LIVE);
    if let Err(e) = rx.wait_count(BACKLOG + LIVE, secs(240)) {
        panic!("{e}; stderr:\n{}", agent.stderr());
    }
    let (live_latency, backlog_latency) = (latency(admin, "live"), latency(admin, "backlog"));
    assert!(
        live_latency < WINDOW.as_secs_f64() && backlog_latency > WINDOW.as_secs_f64(),
        "the last live job's latency {live_latency} s, the last backlog job's {backlog_latency} s"
    );
    let agent = stop(agent);

    let requests: Vec<Received> = rx
        .requests()
        .into_iter()
        .filter(|r| r.status == Some(200))
        .collect();
    let mut keys = HashSet::new();
    let (mut backlog_seen, mut live_seen) = (Vec::new(), Vec::new());
    let mut latencies = Vec::new();
    let mut last_backlog_at = None;
    for r in &requests {
        let key = r.idempotency_key.clone().expect("every request has a key");
        assert!(keys.insert(key.clone()), "{key} accepted twice");
        let seqs: Vec<u64> = r.records().iter().map(|l| seq_of(l)).collect();
        let live = seqs[0] >= LIVE_FROM;
        assert!(
            seqs.iter().all(|s| (*s >= LIVE_FROM) == live),
            "{key}: a request mixes the lanes"
        );
        if live {
            assert_eq!(r.header(MARKER), None, "{key}: a live job marked replayed");
            for s in &seqs {
                latencies.push(r.at.saturating_duration_since(acked[s]));
            }
            live_seen.extend(seqs);
        } else {
            assert_eq!(r.header(MARKER), Some("true"), "{key}: backlog unmarked");
            last_backlog_at = Some(r.at);
            backlog_seen.extend(seqs);
        }
    }
    assert!(
        backlog_seen.iter().copied().eq(0..BACKLOG),
        "the backlog, every record once, in order"
    );
    assert!(
        live_seen.iter().copied().eq(LIVE_FROM..LIVE_FROM + LIVE),
        "the live lane, every record once, in order"
    );
    let drained_at = last_backlog_at.expect("a backlog");
    let last_live = acked.values().max().expect("live records");
    assert!(
        drained_at > *last_live,
        "every live record was appended while the backlog drained"
    );
    latencies.sort_unstable();
    let (p50, p99, max) = (
        quantile(&latencies, 0.5),
        quantile(&latencies, 0.99),
        quantile(&latencies, 1.0),
    );
    eprintln!(
        "live_first: {} requests; live latency p50 {p50:?} p99 {p99:?} max {max:?}",
        requests.len()
    );
    // Oldest first, the last live record would wait for the whole backlog behind it.
    assert!(
        max < WINDOW,
        "a live record waited {max:?}; stderr:\n{}",
        agent.stderr()
    );
    let s = stream_stats(&queue_stats(&config, &[]), "logs");
    assert_eq!(s["counters"]["delivered_records"], BACKLOG + LIVE, "{s}");
    assert_eq!(s["balanced"], true, "{s}");
}

/// kill -9 in the middle of a live-first drain: after a restart every record arrives; a record
/// arrives twice only in a request whose key was accepted before with the same records (what was
/// in flight); each lane's first arrivals are in order; every backlog request is marked.
#[test]
fn kill_9_during_a_live_first_drain_loses_nothing_and_repeats_only_under_the_same_keys() {
    const OLD: u64 = 10_000;
    const NEW: u64 = 300;
    let sb = Sandbox::new();
    let rx = Receiver::start();
    let port = free_port();
    // About 15 s of drain: the kill lands in the middle of it.
    let config = config(
        &sb,
        (port, free_port()),
        &rx.url("/ingest"),
        "live_first",
        "40KiB",
    );
    outage(&sb, &config, OLD);
    let mut agent = start(&config);
    produce(port, 0, NEW / 2);
    agent.signal(libc::SIGKILL);
    agent.wait_exit(secs(10));
    let (_, before, _) = rx.counts();
    assert!(
        before < OLD,
        "killed during the drain ({before} records had arrived)"
    );
    let agent = start(&config);
    produce(port, NEW / 2, NEW);
    if let Err(e) = rx.wait_count(OLD + NEW, secs(120)) {
        panic!("{e}; stderr:\n{}", agent.stderr());
    }
    let agent = stop(agent);

    let mut by_key: HashMap<String, Vec<u64>> = HashMap::new();
    let (mut firsts, mut seen) = (Vec::new(), HashSet::new());
    for r in rx.requests().iter().filter(|r| r.status == Some(200)) {
        let key = r.idempotency_key.clone().expect("every request has a key");
        let seqs: Vec<u64> = r.records().iter().map(|l| seq_of(l)).collect();
        if seqs[0] < LIVE_FROM {
            assert_eq!(r.header(MARKER), Some("true"), "{key}: backlog unmarked");
        }
        match by_key.get(&key) {
            Some(before) => assert_eq!(*before, seqs, "{key}: other records under one key"),
            None => {
                firsts.extend(seqs.iter().copied().filter(|s| seen.insert(*s)));
                by_key.insert(key, seqs);
            }
        }
    }
    let mut union: Vec<u64> = by_key.values().flatten().copied().collect();
    union.sort_unstable();
    let want: Vec<u64> = (0..OLD).chain(LIVE_FROM..LIVE_FROM + NEW).collect();
    assert!(
        union == want,
        "over distinct keys, every record exactly once"
    );
    for lane in [0..OLD, LIVE_FROM..LIVE_FROM + NEW] {
        let order: Vec<u64> = firsts
            .iter()
            .copied()
            .filter(|s| lane.contains(s))
            .collect();
        assert!(
            order.windows(2).all(|w| w[0] < w[1]),
            "first arrivals of {lane:?} out of order"
        );
    }
    let s = stream_stats(&queue_stats(&config, &[]), "logs");
    assert_eq!(s["balanced"], true, "{s}");
    assert_eq!(s["ready"]["records"], 0, "{s}; stderr:\n{}", agent.stderr());
}

/// Two streams of priority 9 and 1 on one paced sink, both with a backlog: the high one's backlog
/// arrives before the low one's, except the low one's minimum share (a tenth of the bytes while
/// the high one is busy); then the low one drains. Each stream in order, every record once.
#[test]
fn a_higher_priority_backlog_goes_first_and_a_lower_one_keeps_its_share() {
    const N: u64 = 10_000;
    let sb = Sandbox::new();
    let rx = Receiver::start();
    let config = sb.write_config(&format!(
        "data_dir: data\n\
         shutdown_grace: 2s\n\
         log: {{ format: json, level: info }}\n\
         sinks:\n  \
           up: {{ type: http, url: {url}, concurrency: 1, replay_rate: 100KiB }}\n\
         streams:\n  \
           alarms: {{ sink: up, priority: 9 }}\n  \
           bulk: {{ sink: up, priority: 1, min_share: 0.1 }}\n",
        url = quote(rx.url("/ingest")),
    ));
    drop(stop(start(&config)));
    let high: Vec<String> = (0..N).map(rec).collect();
    let low: Vec<String> = (LIVE_FROM..LIVE_FROM + N).map(rec).collect();
    push_into(&sb, &config, "alarms", &high, 200);
    push_into(&sb, &config, "bulk", &low, 200);
    let agent = start(&config);
    if let Err(e) = rx.wait_count(2 * N, secs(120)) {
        panic!("{e}; stderr:\n{}", agent.stderr());
    }
    drop(stop(agent));

    // Bytes of each stream received until the high one's last request.
    let requests: Vec<Received> = rx
        .requests()
        .into_iter()
        .filter(|r| r.status == Some(200))
        .collect();
    let is_low = |r: &Received| seq_of(&r.records()[0]) >= LIVE_FROM;
    let last_high = requests
        .iter()
        .rposition(|r| !is_low(r))
        .expect("the high stream's requests");
    let (mut high_bytes, mut low_bytes) = (0usize, 0usize);
    for r in &requests[..=last_high] {
        if is_low(r) {
            low_bytes += r.body.len();
        } else {
            high_bytes += r.body.len();
        }
    }
    let share = low_bytes as f64 / (low_bytes + high_bytes) as f64;
    eprintln!(
        "priorities: the low stream had {:.1} % of the bytes while the high one drained",
        share * 100.0
    );
    assert!(
        (0.05..=0.2).contains(&share),
        "the low stream's share while the high one drained: {share}"
    );
    for lane in [0..N, LIVE_FROM..LIVE_FROM + N] {
        let got: Vec<u64> = requests
            .iter()
            .flat_map(|r| r.records())
            .map(|l| seq_of(&l))
            .filter(|s| lane.contains(s))
            .collect();
        assert!(
            got.iter().copied().eq(lane.clone()),
            "{lane:?}: every record once, in order"
        );
    }
}

/// `max_age`: a backlog older than it when the link is back never reaches the sink; it is counted
/// as expired, and the accounting identity holds in one scrape; what is younger is delivered.
#[test]
fn max_age_keeps_too_old_jobs_from_the_sink_and_counts_them_expired() {
    const OLD: u64 = 5_000;
    const NEW: u64 = 50;
    let sb = Sandbox::new();
    let rx = Receiver::start();
    let (port, admin) = (free_port(), free_port());
    let config = sb.write_config(&format!(
        "data_dir: data\n\
         shutdown_grace: 2s\n\
         log: {{ format: json, level: info }}\n\
         admin: {{ listen: \"127.0.0.1:{admin}\" }}\n\
         ingest: {{ listen: \"127.0.0.1:{port}\" }}\n\
         sinks:\n  up: {{ type: http, url: {url} }}\n\
         streams:\n  logs: {{ sink: up, max_age: {age}s, on_max_age: drop }}\n",
        url = quote(rx.url("/ingest")),
        age = WINDOW.as_secs(),
    ));
    // The outage: older than max_age when the agent starts (the helper waits out the window).
    outage(&sb, &config, OLD);
    let agent = start(&config);
    produce(port, 0, NEW);
    if let Err(e) = rx.wait_count(NEW, secs(60)) {
        panic!("{e}; stderr:\n{}", agent.stderr());
    }
    // The last delivery's acknowledgement is committed a moment after the receiver has it.
    let of = |text: &str, name: &str| sample(text, &format!("{name}{{stream=\"logs\"}}"));
    let text = poll(secs(30), || {
        let text = scrape(admin);
        (of(&text, "colibri_stream_delivered_records_total") == NEW as f64).then_some(text)
    })
    .unwrap_or_else(|| panic!("the deliveries never all counted:\n{}", scrape(admin)));
    let agent = stop(agent);
    let got: Vec<u64> = rx.records().iter().map(|r| seq_of(r)).collect();
    assert!(
        got.iter().copied().eq(LIVE_FROM..LIVE_FROM + NEW),
        "only what was younger than max_age, once, in order: {} records; stderr:\n{}",
        got.len(),
        agent.stderr()
    );
    // One scrape: appended = delivered + expired, nothing left queued.
    let appended = of(&text, "colibri_stream_appended_records_total");
    let expired = of(&text, "colibri_stream_expired_records_total");
    assert_eq!(appended, (OLD + NEW) as f64, "{text}");
    assert_eq!(expired, OLD as f64, "{text}");
    let queued = sample(
        &text,
        r#"colibri_stream_records{stream="logs",queue="ready"}"#,
    );
    assert_eq!(queued, 0.0, "{text}");
}

/// `on_max_age: stream:NAME`: a backlog older than `max_age` when the link is back goes to the
/// archive stream and its own sink instead, each job under the idempotency key it had (naming the
/// stream it was appended to) and marked replayed; the first sink gets only what is younger; one
/// scrape balances both streams (moved out of the one, moved into the other).
#[test]
fn max_age_moves_too_old_jobs_to_the_archive_stream_under_their_keys() {
    const OLD: u64 = 5_000;
    const NEW: u64 = 50;
    let sb = Sandbox::new();
    let (rx, shelf) = (Receiver::start(), Receiver::start());
    let (port, admin) = (free_port(), free_port());
    let config = sb.write_config(&format!(
        "data_dir: data\n\
         shutdown_grace: 2s\n\
         log: {{ format: json, level: info }}\n\
         admin: {{ listen: \"127.0.0.1:{admin}\" }}\n\
         ingest: {{ listen: \"127.0.0.1:{port}\" }}\n\
         sinks:\n  up: {{ type: http, url: {url} }}\n  bulk: {{ type: http, url: {bulk} }}\n\
         streams:\n  logs: {{ sink: up, max_age: {age}s, on_max_age: \"stream:archive\" }}\n  \
           archive: {{ sink: bulk }}\n",
        url = quote(rx.url("/ingest")),
        bulk = quote(shelf.url("/bulk")),
        age = WINDOW.as_secs(),
    ));
    outage(&sb, &config, OLD);
    let agent = start(&config);
    produce(port, 0, NEW);
    for (r, n) in [(&rx, NEW), (&shelf, OLD)] {
        if let Err(e) = r.wait_count(n, secs(60)) {
            panic!("{e}; stderr:\n{}", agent.stderr());
        }
    }
    let of = |text: &str, name: &str, labels: &str| sample(text, &format!("{name}{{{labels}}}"));
    let text = poll(secs(30), || {
        let text = scrape(admin);
        let delivered = |s: &str| {
            of(
                &text,
                "colibri_stream_delivered_records_total",
                &format!("stream=\"{s}\""),
            )
        };
        (delivered("logs") == NEW as f64 && delivered("archive") == OLD as f64).then_some(text)
    })
    .unwrap_or_else(|| panic!("the deliveries never all counted:\n{}", scrape(admin)));
    // `queue stats` has the running agent's lanes: the live lane's latency for the first stream,
    // the backlog's for the archive (its jobs are older than its live window).
    let stats = queue_stats(&config, &[]);
    let latency = |s: &str, lane: &str| stream_stats(&stats, s)["latency_ms"][lane].as_u64();
    assert!(latency("logs", "live").is_some_and(|ms| ms > 0), "{stats}");
    assert!(
        latency("archive", "backlog").is_some_and(|ms| ms >= WINDOW.as_millis() as u64),
        "{stats}"
    );
    let agent = stop(agent);
    let got: Vec<u64> = rx.records().iter().map(|r| seq_of(r)).collect();
    assert!(
        got.iter().copied().eq(LIVE_FROM..LIVE_FROM + NEW),
        "only what was younger than max_age: {} records; stderr:\n{}",
        got.len(),
        agent.stderr()
    );
    let archived: Vec<u64> = shelf.records().iter().map(|r| seq_of(r)).collect();
    assert!(
        archived.iter().copied().eq(0..OLD),
        "the whole backlog, once, in order: {} records",
        archived.len()
    );
    let requests = shelf.requests();
    let keys: HashSet<String> = requests
        .iter()
        .map(|r| {
            assert_eq!(r.header(MARKER), Some("true"), "moved jobs are backlog");
            r.idempotency_key.clone().expect("every request has a key")
        })
        .collect();
    assert_eq!(keys.len(), requests.len(), "a key per job: {keys:?}");
    assert!(
        keys.iter().all(|k| k.split(':').nth(1) == Some("logs")),
        "the keys they had in the stream they were appended to: {keys:?}"
    );
    for (stream, appended, moved_in, moved_out, delivered) in [
        ("logs", OLD + NEW, 0, OLD, NEW),
        ("archive", 0, OLD, 0, OLD),
    ] {
        let l = format!("stream=\"{stream}\"");
        let moved = |d: &str| {
            of(
                &text,
                "colibri_stream_moved_records_total",
                &format!("{l},direction=\"{d}\""),
            )
        };
        let got = (
            of(&text, "colibri_stream_appended_records_total", &l),
            moved("in"),
            moved("out"),
            of(&text, "colibri_stream_delivered_records_total", &l),
            of(&text, "colibri_stream_expired_records_total", &l),
        );
        let want = (
            appended as f64,
            moved_in as f64,
            moved_out as f64,
            delivered as f64,
            0.0,
        );
        assert_eq!(got, want, "{stream}: {text}");
    }
}
