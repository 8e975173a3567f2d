//! End-to-end tests of HTTP delivery: the real binary delivers what `colibri queue push` stored to
//! the test receiver (`tests/util/http.rs`) on 127.0.0.1, which refuses, hangs, answers errors,
//! cuts answers short or limits body sizes on demand. Every wait is bounded and waits for a
//! condition (a log event, a count at the receiver), never for a fixed time; retry and link timings
//! are short (retry base 100ms, probes 50ms..200ms, down after 2) so outages of many periods take
//! seconds.
//!
//! Records are JSON objects carrying a `seq` never reused within a test, so what arrives can be
//! matched against what was pushed: in order, exactly once, or at least once with every duplicate
//! explained by its `Idempotency-Key`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::util::http::{Mode, Received, Receiver, TestPki};
use crate::util::{
    Proc, Sandbox, assert_code, colibri, field, finish, finish_with_stdin, head, quote, quote_path,
};
use crate::util::{queue, queue_stats, secs, stop, stream_stats};

/// `link.down_after` in every config here.
const DOWN_AFTER: u64 = 2;

// ---------------------------------------------------------------------------------------------
// Configs.

/// One `type: http` sink, with short retry and link timings.
struct Sink<'a> {
    name: &'a str,
    url: String,
    concurrency: u32,
    timeout: &'a str,
    max_attempts: u32,
    /// `link.probe`.
    probe: &'a str,
    /// More settings, each a line indented by four spaces.
    extra: String,
}

impl<'a> Sink<'a> {
    fn new(name: &'a str, url: String) -> Self {
        Sink {
            name,
            url,
            concurrency: 1,
            timeout: "10s",
            max_attempts: 1,
            probe: "tcp",
            extra: String::new(),
        }
    }

    fn concurrency(mut self, n: u32) -> Self {
        self.concurrency = n;
        self
    }

    fn timeout(mut self, t: &'a str) -> Self {
        self.timeout = t;
        self
    }

    fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }

    fn probe(mut self, p: &'a str) -> Self {
        self.probe = p;
        self
    }

    fn with(mut self, line: &str) -> Self {
        self.extra.push_str("    ");
        self.extra.push_str(line);
        self.extra.push('\n');
        self
    }

    fn yaml(&self) -> String {
        format!(
            "  {name}:\n    type: http\n    url: {url}\n    concurrency: {c}\n    timeout: {t}\n    \
             retry: {{ base: 100ms, cap: 200ms, max_attempts: {m} }}\n    \
             link: {{ probe: {p}, down_after: {DOWN_AFTER}, backoff_base: 50ms, backoff_cap: 200ms }}\n{extra}",
            name = self.name,
            url = quote(&self.url),
            c = self.concurrency,
            t = self.timeout,
            m = self.max_attempts,
            p = self.probe,
            extra = self.extra,
        )
    }
}

/// A config with these sinks and `(stream, sink, batch.max_records)` streams; JSON logs at debug
/// level (probe failures are debug events the outage tests count).
fn write_config(sb: &Sandbox, sinks: &[Sink], streams: &[(&str, &str, u32)]) -> PathBuf {
    let sinks: String = sinks.iter().map(Sink::yaml).collect();
    let streams: String = streams
        .iter()
        .map(|(name, sink, max_records)| {
            format!(
                "  {name}: {{ sink: {sink}, batch: {{ max_records: {max_records} }}, max_jobs: 1000000, max_bytes: 1GiB }}\n"
            )
        })
        .collect();
    sb.write_config(&format!(
        "data_dir: data\n\
         shutdown_grace: 2s\n\
         storage: {{ min_free: 1MiB }}\n\
         log: {{ format: json, level: debug }}\n\
         sinks:\n{sinks}\
         streams:\n{streams}"
    ))
}

// ---------------------------------------------------------------------------------------------
// Records.

/// The record with this `seq`.
fn rec(seq: u64) -> String {
    format!(r#"{{"seq":{seq},"msg":"reading {seq} of the test sensor","unit":"celsius"}}"#)
}

fn recs(seqs: Range<u64>) -> Vec<String> {
    seqs.map(rec).collect()
}

/// The `seq` of a record, or a panic naming it.
fn seq_of(record: &str) -> u64 {
    serde_json::from_str::<Value>(record)
        .ok()
        .and_then(|v| v["seq"].as_u64())
        .unwrap_or_else(|| panic!("a record that no test wrote: {record:?}"))
}

/// Asserts `got` is exactly `want` (in order), showing where they first differ.
fn assert_same_records(got: &[String], want: &[String], what: &str) {
    if got == want {
        return;
    }
    let at = got
        .iter()
        .zip(want)
        .position(|(g, w)| g != w)
        .unwrap_or(got.len().min(want.len()));
    let from = at.saturating_sub(2);
    panic!(
        "{what}: {} records, {} expected; first difference at {at}: got {} want {}",
        got.len(),
        want.len(),
        head(&got[from.min(got.len())..], 5),
        head(&want[from.min(want.len())..], 5),
    );
}

// ---------------------------------------------------------------------------------------------
// The binary.

/// Log events whose message starts with `prefix`.
fn is(e: &Value, prefix: &str) -> bool {
    field(e, "message").starts_with(prefix)
}

const LINK_DOWN: &str = "link down";
const TRIAL_FAILED: &str = "the probe passed but requests still get no answer";
const LINK_UP: &str = "link up";
const PROBE_FAILED: &str = "probe failed";
const SUMMARY: &str = "delivery summary";
const WILL_RETRY: &str = "delivery failed; will retry";
const DEAD: &str = "delivery failed for good";

/// Events of `sink` (or of any sink for "") whose message starts with `prefix`.
fn sink_events(agent: &Proc, prefix: &str, sink: &str) -> Vec<Value> {
    agent.events_where(|e| is(e, prefix) && (sink.is_empty() || field(e, "sink") == sink))
}

fn count(agent: &Proc, prefix: &str, sink: &str) -> usize {
    sink_events(agent, prefix, sink).len()
}

/// `e[key]` as a number; panics naming the event otherwise.
fn num(e: &Value, key: &str) -> u64 {
    e[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no number {key} in {e}"))
}

/// `colibri run` with extra environment variables; waits until it logs "colibri started".
fn start_with(config: &Path, env: &[(&str, &str)]) -> Proc {
    let mut cmd = colibri();
    cmd.arg("run").arg("--config").arg(config);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let agent = Proc::spawn(cmd);
    agent.wait_for_event(secs(30), "colibri started", |e| is(e, "colibri started"));
    agent
}

fn start(config: &Path) -> Proc {
    start_with(config, &[])
}

/// The "delivery summary" event of `sink`, logged at a clean stop.
fn summary(agent: &Proc, sink: &str) -> Value {
    sink_events(agent, SUMMARY, sink)
        .pop()
        .unwrap_or_else(|| panic!("no delivery summary of {sink}; stderr:\n{}", agent.stderr()))
}

/// The store file exists only once colibri has run: run it once.
fn create_store(config: &Path, env: &[(&str, &str)]) {
    let agent = stop(start_with(config, env));
    assert!(
        !agent.events_where(|e| is(e, "store opened")).is_empty(),
        "{}",
        agent.stderr()
    );
}

/// `colibri queue push` of `records` into `stream`, `batch` per commit (the agent must be stopped);
/// checks every record was acknowledged.
fn push(
    sb: &Sandbox,
    config: &Path,
    stream: &str,
    records: &[String],
    batch: usize,
    env: &[(&str, &str)],
) {
    let mut text = records.join("\n");
    text.push('\n');
    let mut cmd = queue(config, &["push", stream, "--batch", &batch.to_string()]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let f = finish_with_stdin(sb, cmd, &text, secs(120));
    assert_code(f.status, 0, &f.stderr);
    assert_eq!(
        f.stdout.lines().last(),
        Some(format!("acked {}", records.len()).as_str()),
        "every record acknowledged; stderr: {}",
        f.stderr
    );
}

/// `colibri queue stats --json`: the entry of `stream`.
fn stats(config: &Path, stream: &str, env: &[(&str, &str)]) -> Value {
    stream_stats(&queue_stats(config, env), stream)
}

/// Asserts a stream's queue is empty (ready, retry and dead) with `delivered` records delivered
/// and no attempt ever spent.
fn assert_drained(s: &Value, delivered: u64) {
    for table in ["ready", "retry", "dead"] {
        assert_eq!(s[table]["records"], 0, "{table} not empty: {s}");
    }
    assert_eq!(s["counters"]["delivered_records"], delivered, "{s}");
    assert_eq!(s["counters"]["retried_attempts"], 0, "{s}");
    assert_eq!(s["counters"]["dead_lettered_records"], 0, "{s}");
    assert_eq!(s["balanced"], true, "{s}");
}

/// `colibri queue peek <stream> --dead --all --json`: the dead jobs.
fn dead_jobs(config: &Path, stream: &str) -> Vec<Value> {
    let f = finish(
        queue(config, &["peek", stream, "--dead", "--all", "--json"]),
        secs(60),
    );
    assert_code(f.status, 0, &f.stderr);
    f.stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// The requests a receiver got at `path`.
fn at_path(rx: &Receiver, path: &str) -> Vec<Received> {
    rx.requests()
        .into_iter()
        .filter(|r| r.path == path)
        .collect()
}

fn key(r: &Received) -> &str {
    r.idempotency_key.as_deref().unwrap_or_else(|| {
        panic!(
            "a request without an Idempotency-Key: {:?}",
            (&r.path, r.status)
        )
    })
}

fn accepted(r: &Received) -> bool {
    r.status.is_some_and(|s| (200..300).contains(&s))
}

/// The distinct `seq`s the receiver accepted.
fn distinct_seqs(rx: &Receiver) -> HashSet<u64> {
    rx.records().iter().map(|r| seq_of(r)).collect()
}

// ---------------------------------------------------------------------------------------------
// Outages.

/// A receiver that refuses connections through four lives of the agent, while 100,000 records are
/// pushed between them: with `max_attempts: 1`, a single spent attempt would dead-letter a job, yet
/// none is spent and nothing is dead; each life makes `down_after` requests, logs the link down
/// once, then only probes. When the receiver accepts again (during the last life) the link comes
/// up, the INFO line says for how long it was down, and every record arrives in order, exactly once.
#[test]
fn an_outage_spends_no_attempts_and_the_backlog_arrives_in_order_exactly_once() {
    const TOTAL: u64 = 100_000;
    const LIVES: u64 = 4;
    /// Probes (50ms..200ms apart) each life waits for: together tens of retry periods (100ms).
    const PROBES: usize = 10;
    let sb = Sandbox::new();
    let rx = Receiver::start();
    rx.set_mode(Mode::Refuse);
    let config = write_config(
        &sb,
        &[Sink::new("up", rx.url("/ingest"))],
        &[("logs", "up", 1000)],
    );
    create_store(&config, &[]);
    let per_life = TOTAL / LIVES;
    let mut refused_for = Duration::ZERO;
    for life in 0..LIVES {
        let pushed = (life + 1) * per_life;
        push(
            &sb,
            &config,
            "logs",
            &recs(life * per_life..pushed),
            1000,
            &[],
        );
        let started = Instant::now();
        let agent = start(&config);
        agent.wait_for_event(secs(30), "the link going down", |e| is(e, LINK_DOWN));
        let down_seen = Instant::now();
        agent.wait_until(secs(30), "the outage lasting many probes", || {
            count(&agent, PROBE_FAILED, "up") >= PROBES
        });
        let down = sink_events(&agent, LINK_DOWN, "up");
        assert_eq!(
            down.len(),
            1,
            "one WARN per outage, not per request: {down:?}"
        );
        assert_eq!(down[0]["level"], "WARN", "{}", down[0]);
        assert!(
            field(&down[0], "reason").contains("127.0.0.1")
                && field(&down[0], "reason").to_lowercase().contains("refused"),
            "the reason names the target and the refusal: {}",
            down[0]
        );
        assert_eq!(
            num(&down[0], "queued_records"),
            pushed,
            "the WARN says what is queued: {}",
            down[0]
        );
        if life + 1 < LIVES {
            refused_for += started.elapsed();
            let agent = stop(agent);
            assert_eq!(count(&agent, LINK_DOWN, "up"), 1, "{}", agent.stderr());
            let s = summary(&agent, "up");
            assert_eq!(num(&s, "attempts_failed"), 0, "{s}");
            assert_eq!(
                num(&s, "requests_transport"),
                DOWN_AFTER,
                "down after {DOWN_AFTER} requests, then only probes: {s}"
            );
            assert_eq!(num(&s, "requests_ok"), 0, "{s}");
            assert_eq!(num(&s, "dead_lettered_records"), 0, "{s}");
            let st = stats(&config, "logs", &[]);
            assert_eq!(st["ready"]["records"], pushed, "{st}");
            assert_eq!(st["retry"]["records"], 0, "{st}");
            assert_eq!(st["dead"]["records"], 0, "{st}");
            assert_eq!(st["counters"]["retried_attempts"], 0, "{st}");
            assert_eq!(st["counters"]["dead_lettered_records"], 0, "{st}");
            assert!(
                rx.requests().is_empty(),
                "a refusing receiver saw a request"
            );
            continue;
        }
        // Last life: the receiver comes back while the agent waits.
        let accept_at = Instant::now();
        refused_for += accept_at - started;
        rx.set_mode(Mode::Accept);
        let up = agent.wait_for_event(secs(30), "the link coming up", |e| is(e, LINK_UP));
        assert_eq!(up["level"], "INFO", "{up}");
        let down_ms = num(&up, "down_for_ms");
        let least = (accept_at - down_seen).as_millis() as u64;
        assert!(
            down_ms >= least && down_ms < 60_000,
            "down_for_ms {down_ms}, but it was down for at least {least} ms: {up}"
        );
        assert!(!field(&up, "down_for").is_empty(), "{up}");
        if let Err(e) = rx.wait_records(TOTAL as usize, secs(60)) {
            panic!("{e}; stderr:\n{}", agent.stderr());
        }
        let agent = stop(agent);
        assert!(
            refused_for > secs(2),
            "the outage lasted tens of retry periods: {refused_for:?}"
        );
        assert_same_records(
            &rx.records(),
            &recs(0..TOTAL),
            "every record, in order, exactly once",
        );
        let requests = rx.requests();
        let mut seen = HashSet::new();
        for r in &requests {
            assert_eq!(r.status, Some(200), "{:?}", (key(r), r.status));
            assert!(seen.insert(key(r).to_string()), "{} sent twice", key(r));
        }
        // Jobs hold up to 1000 records (fewer where one fills its page on disk).
        let jobs = stats(&config, "logs", &[])["counters"]["appended_jobs"]
            .as_u64()
            .expect("a count");
        assert!(jobs >= TOTAL / 1000, "{jobs} jobs");
        // Nothing sent twice: a request per job, or fewer where small jobs went together.
        assert!(
            requests.len() as u64 <= jobs,
            "{} requests for {jobs} jobs",
            requests.len()
        );
        assert_eq!(count(&agent, LINK_DOWN, "up"), 1, "{}", agent.stderr());
        assert_eq!(count(&agent, LINK_UP, "up"), 1, "{}", agent.stderr());
        let s = summary(&agent, "up");
        assert_eq!(num(&s, "attempts_failed"), 0, "{s}");
        assert_eq!(num(&s, "requests_transport"), DOWN_AFTER, "{s}");
        assert_eq!(num(&s, "records_delivered"), TOTAL, "{s}");
        assert_eq!(num(&s, "dead_lettered_records"), 0, "{s}");
        assert_eq!(s["link_up"], true, "{s}");
        assert_drained(&stats(&config, "logs", &[]), TOTAL);
    }
}

/// Four requests in flight while the receiver flips between accepting and refusing (three
/// outages): every record arrives; a record arrives twice only when the request carrying it was
/// accepted while the receiver went away (its answer lost), and then under the same
/// `Idempotency-Key` with the same records. No attempt is spent, nothing is dead.
#[test]
fn concurrent_requests_through_flapping_receiver_lose_nothing() {
    const TOTAL: u64 = 20_000;
    let sb = Sandbox::new();
    let rx = Receiver::start();
    let config = write_config(
        &sb,
        // A replay rate (~4 s for the whole backlog) keeps records queued while the receiver flips.
        &[Sink::new("up", rx.url("/ingest"))
            .concurrency(4)
            .with("replay_rate: 400KiB")],
        &[("logs", "up", 100)],
    );
    create_store(&config, &[]);
    push(&sb, &config, "logs", &recs(0..TOTAL), 1000, &[]);
    let agent = start(&config);
    let mut flips = Vec::new();
    for (i, threshold) in [2_000usize, 7_000, 12_000].into_iter().enumerate() {
        if let Err(e) = rx.wait_records(threshold, secs(60)) {
            panic!("{e}; stderr:\n{}", agent.stderr());
        }
        let before = Instant::now();
        rx.set_mode(Mode::Refuse);
        flips.push((before, Instant::now()));
        agent.wait_until(secs(30), "the link going down", || {
            count(&agent, LINK_DOWN, "up") > i
        });
        let probes = count(&agent, PROBE_FAILED, "up");
        agent.wait_until(secs(30), "a few probes failing", || {
            count(&agent, PROBE_FAILED, "up") >= probes + 2
        });
        rx.set_mode(Mode::Accept);
        agent.wait_until(secs(30), "the link coming up", || {
            count(&agent, LINK_UP, "up") > i
        });
    }
    agent.wait_until(secs(60), "every record delivered", || {
        distinct_seqs(&rx).len() == TOTAL as usize
    });
    let agent = stop(agent);

    // Per key: the same records every time it was accepted.
    let mut by_key: BTreeMap<String, Vec<&Received>> = BTreeMap::new();
    let requests = rx.requests();
    for r in requests.iter().filter(|r| accepted(r)) {
        by_key.entry(key(r).to_string()).or_default().push(r);
    }
    let mut union: Vec<u64> = Vec::new();
    let mut duplicated_keys = 0;
    for (k, rs) in &by_key {
        let first = rs[0].records();
        for again in &rs[1..] {
            assert_eq!(
                again.records(),
                first,
                "{k}: different records under one key"
            );
            // Accepted before (or while) the receiver went away; sent again after it came back.
            assert!(
                flips
                    .iter()
                    .any(|(before, after)| rs[0].at <= *after && again.at >= *before),
                "{k} was accepted twice but was not in flight at a flip"
            );
        }
        duplicated_keys += usize::from(rs.len() > 1);
        union.extend(first.iter().map(|r| seq_of(r)));
    }
    union.sort_unstable();
    let want: Vec<u64> = (0..TOTAL).collect();
    assert!(
        union == want,
        "over distinct keys, every record exactly once: {} records, {} distinct",
        union.len(),
        union.iter().collect::<HashSet<_>>().len()
    );
    // Every duplicated record belongs to a key accepted more than once.
    let mut times: HashMap<u64, usize> = HashMap::new();
    for r in rx.records() {
        *times.entry(seq_of(&r)).or_default() += 1;
    }
    let dup_records = times.values().filter(|n| **n > 1).count();
    let dup_by_keys: usize = by_key
        .values()
        .filter(|rs| rs.len() > 1)
        .map(|rs| rs[0].records().len())
        .sum();
    assert_eq!(
        dup_records, dup_by_keys,
        "duplicates outside a repeated key"
    );
    eprintln!(
        "{} requests, {} keys, {duplicated_keys} accepted twice ({dup_records} records)",
        requests.len(),
        by_key.len()
    );

    assert_eq!(count(&agent, LINK_DOWN, "up"), 3, "{}", agent.stderr());
    let s = summary(&agent, "up");
    assert_eq!(num(&s, "attempts_failed"), 0, "{s}");
    assert!(num(&s, "requests_transport") >= 3 * DOWN_AFTER, "{s}");
    assert_eq!(num(&s, "link_transitions"), 6, "{s}");
    assert_drained(&stats(&config, "logs", &[]), TOTAL);
}

/// Four requests hang at the receiver. A stop (SIGTERM) gives them the grace period, then gives
/// up on them and keeps their jobs queued; the next life sends the same jobs again, and this time
/// the agent is killed (-9) with them in flight. After a restart every record arrives, and every
/// record received twice came in a request whose `Idempotency-Key` the receiver had already seen
/// (with the same records), so the receiver could have dropped it.
#[test]
fn a_crash_with_requests_in_flight_redelivers_under_the_same_keys() {
    const TOTAL: u64 = 2_000;
    let sb = Sandbox::new();
    let rx = Receiver::start();
    rx.set_mode(Mode::Hang);
    let config = write_config(
        &sb,
        &[Sink::new("up", rx.url("/ingest"))
            .concurrency(4)
            .timeout("60s")],
        &[("logs", "up", 100)],
    );
    create_store(&config, &[]);
    push(&sb, &config, "logs", &recs(0..TOTAL), 1000, &[]);

    // A stop with requests hanging: the grace period (2s), then the jobs stay queued.
    let agent = start(&config);
    if let Err(e) = rx.wait_requests(4, secs(30)) {
        panic!("{e}; stderr:\n{}", agent.stderr());
    }
    let stopping = Instant::now();
    let agent = stop(agent);
    let took = stopping.elapsed();
    assert!(
        took >= Duration::from_millis(1900) && took < secs(10),
        "stopped after {took:?} with a 2s grace"
    );
    let abandoned = agent.events_where(|e| is(e, "stopping: request abandoned"));
    assert_eq!(abandoned.len(), 4, "{}", agent.stderr());
    let st = stats(&config, "logs", &[]);
    assert_eq!(st["ready"]["records"], TOTAL, "nothing acknowledged: {st}");
    assert_eq!(st["counters"]["retried_attempts"], 0, "{st}");

    // kill -9 with requests hanging.
    let mut agent = start(&config);
    if let Err(e) = rx.wait_requests(8, secs(30)) {
        panic!("{e}; stderr:\n{}", agent.stderr());
    }
    agent.signal(libc::SIGKILL);
    agent.wait_exit(secs(10));
    let hung = rx.requests();
    assert_eq!(hung.len(), 8, "four requests in flight per life, no more");
    assert!(hung.iter().all(|r| r.status.is_none()), "nothing answered");
    let first_life: HashSet<&str> = hung[..4].iter().map(key).collect();
    let second_life: HashSet<&str> = hung[4..].iter().map(key).collect();
    assert_eq!(
        first_life, second_life,
        "the same (oldest) jobs, under the same keys"
    );
    rx.set_mode(Mode::Accept);

    let agent = start(&config);
    agent.wait_until(secs(60), "every record delivered", || {
        distinct_seqs(&rx).len() == TOTAL as usize
    });
    let agent = stop(agent);

    // Walk every request in arrival order: a record seen before must come under a key seen
    // before, the one it first came with.
    let requests = rx.requests();
    let mut first_key: HashMap<u64, String> = HashMap::new();
    let mut keys: HashMap<String, Vec<String>> = HashMap::new();
    let mut redelivered = 0;
    for r in &requests {
        let k = key(r).to_string();
        let records = r.records();
        if let Some(before) = keys.get(&k) {
            assert_eq!(&records, before, "{k}: different records under one key");
            redelivered += 1;
        }
        for rec in &records {
            let seq = seq_of(rec);
            match first_key.get(&seq) {
                Some(was) => assert_eq!(
                    was, &k,
                    "record {seq} came again under a key the receiver had not seen for it"
                ),
                None => {
                    first_key.insert(seq, k.clone());
                }
            }
        }
        keys.insert(k, records);
    }
    assert_eq!(
        redelivered, 8,
        "the same four jobs in each life, then accepted"
    );
    for h in &hung {
        assert!(
            requests
                .iter()
                .any(|r| accepted(r) && r.idempotency_key == h.idempotency_key),
            "{} was not redelivered under its key",
            key(h)
        );
    }
    // Only the hung requests were ever answered nothing: accepted records are exactly once.
    let mut seqs: Vec<u64> = rx.records().iter().map(|r| seq_of(r)).collect();
    seqs.sort_unstable();
    assert_eq!(seqs, (0..TOTAL).collect::<Vec<_>>());
    let s = summary(&agent, "up");
    assert_eq!(num(&s, "attempts_failed"), 0, "{s}");
    assert_drained(&stats(&config, "logs", &[]), TOTAL);
}

// ---------------------------------------------------------------------------------------------
// Answers.

/// 503 spends attempts: the job is retried and dead-lettered after `max_attempts` (3) requests,
/// never before. 400 never passes: dead-lettered after one request although 3 attempts are
/// allowed, with the status and the receiver's explanation in the dead letter's reason.
#[test]
fn errors_spend_attempts_and_dead_letter_with_the_reason() {
    let sb = Sandbox::new();
    let storm = Receiver::start();
    storm.set_mode(Mode::Status(503));
    let strict = Receiver::start();
    strict.set_mode(Mode::StatusWith(400, "bad field x"));
    let config = write_config(
        &sb,
        &[
            Sink::new("storm", storm.url("/ingest")).max_attempts(3),
            Sink::new("strict", strict.url("/ingest")).max_attempts(3),
        ],
        &[("storm", "storm", 100), ("strict", "strict", 100)],
    );
    create_store(&config, &[]);
    push(&sb, &config, "storm", &recs(0..10), 100, &[]);
    push(&sb, &config, "strict", &recs(100..110), 100, &[]);
    let agent = start(&config);
    for stream in ["storm", "strict"] {
        agent.wait_for_event(secs(30), &format!("{stream} dead-lettered"), |e| {
            is(e, DEAD) && field(e, "stream") == stream
        });
    }
    // Both are dead while the agent still runs: `stats` works beside it.
    assert_eq!(stats(&config, "storm", &[])["dead"]["jobs"], 1);
    let agent = stop(agent);

    let storm_requests = storm.requests();
    assert_eq!(storm_requests.len(), 3, "exactly max_attempts requests");
    let k = key(&storm_requests[0]);
    for r in &storm_requests {
        assert_eq!(key(r), k, "one job, one key");
        assert_eq!(r.status, Some(503));
    }
    let retries = agent.events_where(|e| is(e, WILL_RETRY) && field(e, "stream") == "storm");
    let attempts: Vec<u64> = retries.iter().map(|e| num(e, "attempts")).collect();
    assert_eq!(attempts, [1, 2], "{retries:?}");
    let dead = agent.events_where(|e| is(e, DEAD) && field(e, "stream") == "storm");
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(num(&dead[0], "attempts"), 3, "{}", dead[0]);
    assert_eq!(dead[0]["level"], "ERROR", "{}", dead[0]);
    let s = stats(&config, "storm", &[]);
    assert_eq!(s["dead"]["jobs"], 1, "{s}");
    assert_eq!(s["dead"]["records"], 10, "{s}");
    assert_eq!(s["ready"]["records"], 0, "{s}");
    assert_eq!(s["retry"]["records"], 0, "{s}");
    assert_eq!(s["counters"]["retried_attempts"], 2, "{s}");
    let sum = summary(&agent, "storm");
    assert_eq!(num(&sum, "attempts_failed"), 3, "{sum}");
    assert_eq!(num(&sum, "requests_retryable"), 3, "{sum}");
    assert_eq!(num(&sum, "requests_transport"), 0, "{sum}");
    let jobs = dead_jobs(&config, "storm");
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[0]["attempts"], 3, "{}", jobs[0]);
    assert!(
        jobs[0]["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("503")),
        "{}",
        jobs[0]
    );

    let strict_requests = strict.requests();
    assert_eq!(strict_requests.len(), 1, "a 400 is never retried");
    assert_eq!(strict_requests[0].status, Some(400));
    let s = stats(&config, "strict", &[]);
    assert_eq!(s["dead"]["jobs"], 1, "{s}");
    assert_eq!(s["dead"]["records"], 10, "{s}");
    assert_eq!(s["counters"]["retried_attempts"], 0, "{s}");
    let sum = summary(&agent, "strict");
    assert_eq!(num(&sum, "requests_rejected"), 1, "{sum}");
    // The operator's view: the reason carries the status and the receiver's words.
    let f = finish(queue(&config, &["peek", "strict", "--dead"]), secs(30));
    assert_code(f.status, 0, &f.stderr);
    assert!(
        f.stdout.contains("400") && f.stdout.contains("bad field x"),
        "{}",
        f.stdout
    );
    assert!(f.stdout.contains(&rec(100)), "{}", f.stdout);
}

/// 413 splits: a 100-record job over the receiver's body limit is sent in halves until the parts
/// fit, under part keys `<job key>:<first>-<end>`; every record arrives exactly once, in order. A
/// record larger than the limit on its own goes to the dead letters alone; the rest of its job is
/// delivered.
#[test]
fn too_large_bodies_are_split_and_an_oversized_record_is_dead_lettered_alone() {
    const LIMIT: usize = 2_000;
    const BIG: u64 = 360;
    let sb = Sandbox::new();
    let rx = Receiver::start();
    rx.set_mode(Mode::MaxBody(LIMIT));
    let config = write_config(
        &sb,
        &[Sink::new("up", rx.url("/ingest"))],
        &[("logs", "up", 100)],
    );
    create_store(&config, &[]);
    let big = format!(r#"{{"seq":{BIG},"blob":"{}"}}"#, "x".repeat(LIMIT));
    let mut records = recs(0..400);
    records[BIG as usize] = big.clone();
    let one_job = recs(0..100).join("\n").len() + 1;
    assert!(one_job > 2 * LIMIT && one_job / 4 < LIMIT, "{one_job}");
    push(&sb, &config, "logs", &records, 100, &[]);
    let agent = start(&config);
    agent.wait_for_event(secs(30), "the big record dead-lettered", |e| {
        is(e, "a single record is too large")
    });
    let want: Vec<String> = records.iter().filter(|r| **r != big).cloned().collect();
    if let Err(e) = rx.wait_records(want.len(), secs(30)) {
        panic!("{e}; stderr:\n{}", agent.stderr());
    }
    let agent = stop(agent);
    assert_same_records(&rx.records(), &want, "every small record, in order, once");

    let requests = rx.requests();
    let too_large: Vec<&Received> = requests.iter().filter(|r| r.status == Some(413)).collect();
    assert!(too_large.len() >= 8, "{} answers 413", too_large.len());
    // Whole-job keys are the ones first refused; every accepted request is a part of one of them,
    // named by its record range, carrying exactly those records.
    let whole: Vec<&str> = requests
        .iter()
        .filter(|r| r.records().len() == 100)
        .map(key)
        .collect();
    assert_eq!(whole.len(), 4, "each job first sent whole: {whole:?}");
    for r in requests.iter().filter(|r| accepted(r)) {
        let k = key(r);
        let job = whole
            .iter()
            .find(|w| k.starts_with(&format!("{w}:")))
            .unwrap_or_else(|| panic!("{k} is not a part of any job key {whole:?}"));
        let range: Vec<u32> = k[job.len() + 1..]
            .split('-')
            .map(|n| {
                n.parse()
                    .unwrap_or_else(|_| panic!("{k}: not <key>:<first>-<end>"))
            })
            .collect();
        let [first, end] = range[..] else {
            panic!("{k}: not <key>:<first>-<end>");
        };
        let seqs: Vec<u64> = r.records().iter().map(|x| seq_of(x)).collect();
        assert_eq!(seqs.len() as u32, end - first, "{k}: {seqs:?}");
        assert_eq!(seqs[0] % 100, u64::from(first), "{k}: {seqs:?}");
        assert!(r.body.len() <= LIMIT, "{k}: {} bytes", r.body.len());
    }
    // The record alone was refused, under its own one-record key.
    assert!(
        too_large
            .iter()
            .any(|r| r.records() == [big.clone()] && key(r).ends_with(":60-61")),
        "no 413 for the big record alone"
    );
    let dead = dead_jobs(&config, "logs");
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0]["records"], serde_json::json!([big]));
    assert!(
        dead[0]["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("413")),
        "{}",
        dead[0]
    );
    let s = stats(&config, "logs", &[]);
    assert_eq!(s["dead"]["records"], 1, "{s}");
    assert_eq!(s["ready"]["records"], 0, "{s}");
    assert_eq!(s["retry"]["records"], 0, "{s}");
    assert_eq!(s["counters"]["delivered_records"], 399, "{s}");
    assert_eq!(s["balanced"], true, "{s}");
    let sum = summary(&agent, "up");
    assert_eq!(num(&sum, "records_delivered"), 399, "{sum}");
    assert_eq!(
        num(&sum, "requests_too_large"),
        too_large.len() as u64,
        "{sum}"
    );
    assert_eq!(num(&sum, "dead_lettered_records"), 1, "{sum}");
}

/// An `Idempotency-Key` is "the same for every re-send of the same records, different for any
/// other content" across the streams of a store: a receiver that drops a repeated key must never
/// drop other data. Stream names may hold `-`, and so may keys: here the first part of job 1 of
/// stream `x` (records 0-25, after a 413) and the whole job 25 of stream `x-1-0`, both sent to the
/// same receiver, must not share a key.
#[test]
fn idempotency_keys_of_different_streams_never_collide() {
    let sb = Sandbox::new();
    let rx = Receiver::start();
    // 100 records of stream x do not fit, 25 do.
    rx.set_mode(Mode::MaxBody(2_500));
    let config = write_config(
        &sb,
        &[Sink::new("up", rx.url("/ingest"))],
        &[("x", "up", 100), ("x-1-0", "up", 1)],
    );
    create_store(&config, &[]);
    push(&sb, &config, "x", &recs(0..100), 100, &[]);
    push(&sb, &config, "x-1-0", &recs(1000..1025), 1, &[]);
    let agent = start(&config);
    if let Err(e) = rx.wait_records(125, secs(30)) {
        panic!("{e}; stderr:\n{}", agent.stderr());
    }
    stop(agent);
    let mut by_key: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut collisions = Vec::new();
    for r in rx.requests().iter().filter(|r| accepted(r)) {
        let records = r.records();
        match by_key.get(key(r)) {
            Some(before) if *before != records => collisions.push(format!(
                "{}: {} then {}",
                key(r),
                head(before, 2),
                head(&records, 2)
            )),
            _ => {
                by_key.insert(key(r).to_string(), records);
            }
        }
    }
    assert!(
        collisions.is_empty(),
        "one key for different records, a deduplicating receiver would drop data:\n{}",
        collisions.join("\n")
    );
}

/// A 429 with `Retry-After: 2` spends an attempt and holds the job back for those 2 s, although
/// the retry base is 100ms; with concurrency 1 the jobs behind it wait too (strict order).
#[test]
fn retry_after_is_honoured() {
    let sb = Sandbox::new();
    let rx = Receiver::start();
    rx.set_mode(Mode::RetryAfter {
        status: 429,
        secs: 2,
    });
    let config = write_config(
        &sb,
        &[Sink::new("up", rx.url("/ingest")).max_attempts(3)],
        &[("logs", "up", 10)],
    );
    create_store(&config, &[]);
    push(&sb, &config, "logs", &recs(0..30), 100, &[]);
    let agent = start(&config);
    if let Err(e) = rx.wait_requests(1, secs(30)) {
        panic!("{e}; stderr:\n{}", agent.stderr());
    }
    rx.set_mode(Mode::Accept);
    if let Err(e) = rx.wait_records(30, secs(30)) {
        panic!("{e}; stderr:\n{}", agent.stderr());
    }
    let agent = stop(agent);
    assert_same_records(
        &rx.records(),
        &recs(0..30),
        "in order: the retried job first",
    );
    let requests = rx.requests();
    assert_eq!(requests.len(), 4, "one refused, then three jobs accepted");
    assert_eq!(requests[0].status, Some(429));
    assert_eq!(requests[1].status, Some(200));
    assert_eq!(key(&requests[0]), key(&requests[1]));
    let gap = requests[1].at - requests[0].at;
    assert!(
        gap >= Duration::from_millis(1900) && gap < secs(10),
        "the retry came {gap:?} after the 429 with Retry-After: 2"
    );
    let retry = agent.wait_for_event(secs(1), "the retry", |e| is(e, WILL_RETRY));
    assert!(num(&retry, "retry_in_ms") >= 1900, "{retry}");
    assert!(field(&retry, "error").contains("429"), "{retry}");
    let s = summary(&agent, "up");
    assert_eq!(num(&s, "attempts_failed"), 1, "{s}");
    assert_eq!(num(&s, "requests_retryable"), 1, "{s}");
    let st = stats(&config, "logs", &[]);
    assert_eq!(st["counters"]["retried_attempts"], 1, "{st}");
    assert_eq!(st["counters"]["delivered_records"], 30, "{st}");
    assert_eq!(st["dead"]["records"], 0, "{st}");
}

/// Refused credentials (401, 403) are the sink's problem, not the jobs': an expired token must not
/// send the backlog to the dead letters. They turn the link down like an outage (no attempt spent,
/// one WARN naming the status) until the receiver accepts again.
#[test]
fn refused_credentials_pause_the_sink_instead_of_dead_lettering() {
    let sb = Sandbox::new();
    let rx = Receiver::start();
    rx.set_mode(Mode::StatusWith(401, "token expired"));
    let config = write_config(
        &sb,
        &[Sink::new("up", rx.url("/ingest")).max_attempts(1)],
        &[("logs", "up", 10)],
    );
    create_store(&config, &[]);
    push(&sb, &config, "logs", &recs(0..30), 100, &[]);
    let agent = start(&config);
    let down = agent.wait_for_event(secs(30), "the link down on 401", |e| is(e, LINK_DOWN));
    assert!(field(&down, "reason").contains("401"), "{down}");
    assert!(field(&down, "reason").contains("token expired"), "{down}");
    rx.set_mode(Mode::Accept);
    if let Err(e) = rx.wait_records(30, secs(30)) {
        panic!("{e}; stderr:\n{}", agent.stderr());
    }
    let agent = stop(agent);
    assert_same_records(
        &rx.records(),
        &recs(0..30),
        "in order, once the token is accepted",
    );
    assert_eq!(count(&agent, LINK_DOWN, "up"), 1, "{}", agent.stderr());
    let s = summary(&agent, "up");
    assert_eq!(num(&s, "attempts_failed"), 0, "{s}");
    let st = stats(&config, "logs", &[]);
    assert_eq!(st["dead"]["records"], 0, "{st}");
    assert_eq!(st["counters"]["retried_attempts"], 0, "{st}");
}

/// No answer is a transport failure whatever its form: a request that hangs past the sink's
/// `timeout` and an answer cut off mid-way both count towards `down_after`, turn the link down
/// and spend no attempt (with `max_attempts: 1`); the data arrives once the receivers accept.
#[test]
fn timeouts_and_cut_answers_are_outages_not_attempts() {
    let sb = Sandbox::new();
    let slow = Receiver::start();
    slow.set_mode(Mode::Hang);
    let cut = Receiver::start();
    cut.set_mode(Mode::CloseMidResponse);
    let config = write_config(
        &sb,
        &[
            Sink::new("slow", slow.url("/ingest")).timeout("500ms"),
            Sink::new("cut", cut.url("/ingest")),
        ],
        &[("slow", "slow", 100), ("cut", "cut", 100)],
    );
    create_store(&config, &[]);
    push(&sb, &config, "slow", &recs(0..50), 100, &[]);
    push(&sb, &config, "cut", &recs(1000..1050), 100, &[]);
    let agent = start(&config);
    let down = agent.wait_for_event(secs(30), "slow link down", |e| {
        is(e, LINK_DOWN) && field(e, "sink") == "slow"
    });
    assert!(
        field(&down, "reason").contains("timed out"),
        "the reason says it timed out: {down}"
    );
    let down = agent.wait_for_event(secs(30), "cut link down", |e| {
        is(e, LINK_DOWN) && field(e, "sink") == "cut"
    });
    assert!(!field(&down, "reason").is_empty(), "{down}");
    // Each receiver saw requests and answered none of them completely.
    assert!(slow.requests().len() as u64 >= DOWN_AFTER);
    assert!(cut.requests().len() as u64 >= DOWN_AFTER);
    assert!(slow.records().is_empty() && cut.records().is_empty());
    slow.set_mode(Mode::Accept);
    cut.set_mode(Mode::Accept);
    for rx in [&slow, &cut] {
        if let Err(e) = rx.wait_records(50, secs(30)) {
            panic!("{e}; stderr:\n{}", agent.stderr());
        }
    }
    let agent = stop(agent);
    assert_same_records(&slow.records(), &recs(0..50), "slow: once, in order");
    assert_same_records(&cut.records(), &recs(1000..1050), "cut: once, in order");
    for sink in ["slow", "cut"] {
        let s = summary(&agent, sink);
        assert_eq!(num(&s, "attempts_failed"), 0, "{s}");
        assert!(num(&s, "requests_transport") >= DOWN_AFTER, "{s}");
        assert!(num(&s, "link_transitions") >= 1, "{s}");
        assert_eq!(num(&s, "records_delivered"), 50, "{s}");
        assert_drained(&stats(&config, sink, &[]), 50);
    }
}

// ---------------------------------------------------------------------------------------------
// TLS, encodings, headers.

/// HTTPS with mutual TLS: with the right CA and a client certificate the records arrive. A sink
/// that trusts another CA cannot get through: its link-down WARN says why (the certificate), the
/// records stay queued and no attempt is spent. With `probe: http` the probe fails the same way, so
/// the link stays down: one WARN for the whole outage. `tls.server_name` is what the certificate is
/// checked against when the URL names an address: the right name gets through, another does not.
#[test]
fn tls_client_certificates_wrong_ca_and_server_name() {
    let sb = Sandbox::new();
    let pki_dir = sb.file("pki");
    std::fs::create_dir(&pki_dir).expect("create the pki dir");
    let pki = TestPki::generate(&pki_dir);
    let rx = Receiver::start_tls(&pki, true);
    let tls_named = |ca: &Path, server_name: &str| {
        format!(
            "tls: {{ ca_file: {}, client_cert: {}, client_key: {}{server_name} }}",
            quote_path(ca),
            quote_path(&pki.client_cert),
            quote_path(&pki.client_key)
        )
    };
    let tls = |ca: &Path| tls_named(ca, "");
    // By address, checked against (and SNI for) a name.
    let by_ip = |path: &str| format!("https://127.0.0.1:{}{path}", rx.port());
    let config = write_config(
        &sb,
        &[
            Sink::new("good", rx.url("/ingest")).with(&tls(&pki.ca)),
            Sink::new("wrongca", rx.url("/ingest")).with(&tls(&pki.other_ca)),
            Sink::new("wrongca_http", rx.url("/ingest"))
                .with(&tls(&pki.other_ca))
                .probe("http"),
            Sink::new("byname", by_ip("/byname"))
                .with(&tls_named(&pki.ca, ", server_name: localhost")),
            Sink::new("wrongname", by_ip("/wrongname"))
                .with(&tls_named(&pki.ca, ", server_name: elsewhere.test")),
        ],
        &[
            ("good", "good", 100),
            ("bad", "wrongca", 100),
            ("bad2", "wrongca_http", 100),
            ("byname", "byname", 100),
            ("wrongname", "wrongname", 100),
        ],
    );
    create_store(&config, &[]);
    push(&sb, &config, "good", &recs(0..50), 100, &[]);
    push(&sb, &config, "bad", &recs(1000..1050), 100, &[]);
    push(&sb, &config, "bad2", &recs(2000..2050), 100, &[]);
    push(&sb, &config, "byname", &recs(3000..3050), 100, &[]);
    push(&sb, &config, "wrongname", &recs(4000..4050), 100, &[]);
    let agent = start(&config);
    if let Err(e) = rx.wait_records(100, secs(30)) {
        panic!("{e}; stderr:\n{}", agent.stderr());
    }
    let down = agent.wait_for_event(secs(30), "the wrong-CA link down", |e| {
        is(e, LINK_DOWN) && field(e, "sink") == "wrongca"
    });
    let reason = field(&down, "reason");
    assert!(
        reason.contains("invalid peer certificate") || reason.contains("UnknownIssuer"),
        "the WARN names the TLS problem: {down}"
    );
    assert_eq!(down["level"], "WARN", "{down}");
    // With `probe: http` the probe meets the same certificate problem: one outage, one WARN, while
    // the probes go on failing. The TCP probe of `wrongca` passes, but each trial's request fails
    // the handshake: still one outage, one WARN, not a flapping link.
    agent.wait_until(secs(30), "wrongca_http probes failing", || {
        count(&agent, PROBE_FAILED, "wrongca_http") >= 5
    });
    agent.wait_until(secs(30), "wrongca trials failing", || {
        count(&agent, TRIAL_FAILED, "wrongca") >= 3
    });
    agent.wait_until(secs(30), "the wrong-name link down", || {
        count(&agent, LINK_DOWN, "wrongname") >= 1
    });
    let agent = stop(agent);
    let down = sink_events(&agent, LINK_DOWN, "wrongca_http");
    assert_eq!(down.len(), 1, "{down:?}");
    let down = sink_events(&agent, LINK_DOWN, "wrongca");
    assert_eq!(
        down.len(),
        1,
        "one outage, however often the TCP probe passes: {down:?}"
    );
    assert_eq!(count(&agent, LINK_UP, "wrongca"), 0, "never confirmed up");
    assert!(
        field(&down[0], "reason").contains("invalid peer certificate"),
        "{}",
        down[0]
    );
    let down = sink_events(&agent, LINK_DOWN, "wrongname");
    assert!(
        down.first()
            .is_some_and(|d| field(d, "reason").contains("invalid peer certificate")),
        "server_name is what the certificate is checked against: {down:?}"
    );
    let at = |path: &str| -> Vec<String> {
        at_path(&rx, path)
            .iter()
            .flat_map(Received::records)
            .collect()
    };
    assert_same_records(&at("/ingest"), &recs(0..50), "the good sink's records");
    assert_same_records(
        &at("/byname"),
        &recs(3000..3050),
        "by address, checked by name",
    );
    assert!(at_path(&rx, "/wrongname").is_empty());
    assert_drained(&stats(&config, "byname", &[]), 50);
    assert_eq!(count(&agent, LINK_DOWN, "good"), 0, "{}", agent.stderr());
    assert_drained(&stats(&config, "good", &[]), 50);
    let s = summary(&agent, "good");
    assert_eq!(num(&s, "replay_backlog"), 0, "drained: {s}");
    let s = summary(&agent, "wrongca");
    assert_eq!(num(&s, "replay_backlog"), 50, "still to replay: {s}");
    assert_eq!(num(&s, "attempts_failed"), 0, "{s}");
    assert!(num(&s, "requests_transport") >= DOWN_AFTER, "{s}");
    assert_eq!(num(&s, "requests_ok"), 0, "{s}");
    let s = summary(&agent, "wrongca_http");
    assert_eq!(num(&s, "attempts_failed"), 0, "{s}");
    assert_eq!(num(&s, "requests_transport"), DOWN_AFTER, "{s}");
    for stream in ["bad", "bad2", "wrongname"] {
        let st = stats(&config, stream, &[]);
        assert_eq!(st["ready"]["records"], 50, "still queued: {st}");
        assert_eq!(st["dead"]["records"], 0, "{st}");
        assert_eq!(st["counters"]["retried_attempts"], 0, "{st}");
    }
}

/// Bodies as configured: `json_array` (one JSON array), `influx_line` (text/plain lines, sent with
/// PUT), gzip and zstd (smaller on the wire, the same records once decoded); every request says
/// `User-Agent: colibri/...` and carries a header whose value comes from `${ENV}`, which never
/// shows in colibri's output.
#[test]
fn encodings_compression_and_headers() {
    const TOKEN: &str = "Bearer s3cr3t-7d1f-never-logged";
    let env = [("COLIBRI_TEST_TOKEN", TOKEN)];
    let sb = Sandbox::new();
    let rx = Receiver::start();
    let auth = "headers: { Authorization: \"${COLIBRI_TEST_TOKEN}\", X-Site: edge-7 }";
    let config = write_config(
        &sb,
        &[
            Sink::new("arr", rx.url("/arr")).with("encoding: json_array"),
            Sink::new("influx", rx.url("/influx"))
                .with("encoding: influx_line")
                .with("method: put"),
            Sink::new("gz", rx.url("/gz"))
                .with("compression: gzip")
                .with(auth),
            Sink::new("zs", rx.url("/zs")).with("compression: zstd"),
        ],
        &[
            ("arr", "arr", 100),
            ("influx", "influx", 100),
            ("gz", "gz", 100),
            ("zs", "zs", 100),
        ],
    );
    let lines: Vec<String> = (0..100)
        .map(|i| {
            format!(
                "cpu,host=edge-7,core={} usage={}.5 17000000000{i:08}",
                i % 4,
                i
            )
        })
        .collect();
    create_store(&config, &env);
    push(&sb, &config, "arr", &recs(0..100), 100, &env);
    push(&sb, &config, "influx", &lines, 100, &env);
    push(&sb, &config, "gz", &recs(1000..1100), 100, &env);
    push(&sb, &config, "zs", &recs(2000..2100), 100, &env);
    let agent = start_with(&config, &env);
    if let Err(e) = rx.wait_records(400, secs(30)) {
        panic!("{e}; stderr:\n{}", agent.stderr());
    }
    let agent = stop(agent);

    for r in rx.requests() {
        assert!(
            r.user_agent
                .as_deref()
                .is_some_and(|u| u.starts_with("colibri/")),
            "{:?}",
            r.user_agent
        );
        assert!(r.idempotency_key.is_some(), "{}", r.path);
        assert_eq!(r.status, Some(200), "{}: {:?}", r.path, r.decode_error);
    }
    let one = |path: &str| {
        let rs = at_path(&rx, path);
        assert_eq!(rs.len(), 1, "{path}: one job, one request");
        rs.into_iter().next().expect("one")
    };

    let arr = one("/arr");
    assert_eq!(arr.method, "POST");
    assert_eq!(arr.content_type.as_deref(), Some("application/json"));
    let body: Value = serde_json::from_slice(&arr.body).expect("the body is JSON");
    let want: Vec<Value> = recs(0..100)
        .iter()
        .map(|r| serde_json::from_str(r).expect("JSON"))
        .collect();
    assert_eq!(body, Value::Array(want), "one array of the records");
    assert_eq!(arr.header("authorization"), None, "headers are per sink");

    let influx = one("/influx");
    assert_eq!(influx.method, "PUT");
    assert!(
        influx
            .content_type
            .as_deref()
            .is_some_and(|c| c.starts_with("text/plain")),
        "{:?}",
        influx.content_type
    );
    assert_eq!(influx.content_encoding, None);
    assert_eq!(influx.records(), lines);

    for (path, encoding, seqs) in [("/gz", "gzip", 1000..1100), ("/zs", "zstd", 2000..2100)] {
        let r = one(path);
        assert_eq!(r.content_encoding.as_deref(), Some(encoding), "{path}");
        assert_eq!(r.decode_error, None, "{path}");
        assert!(
            r.wire_len < r.body.len() / 2,
            "{path}: {} bytes on the wire for {}",
            r.wire_len,
            r.body.len()
        );
        assert_eq!(
            r.content_type.as_deref(),
            Some("application/x-ndjson"),
            "{path}"
        );
        assert_eq!(r.records(), recs(seqs), "{path}");
    }
    let gz = one("/gz");
    assert_eq!(gz.header("authorization"), Some(TOKEN));
    assert_eq!(gz.header("x-site"), Some("edge-7"));

    // The secret never shows: not in the agent's logs (debug level), nor in `check`.
    assert!(!agent.stderr().contains("s3cr3t"), "{}", agent.stderr());
    assert!(!agent.stdout().contains("s3cr3t"), "{}", agent.stdout());
    let mut cmd = colibri();
    cmd.arg("check").arg("--config").arg(&config);
    cmd.env("COLIBRI_TEST_TOKEN", TOKEN);
    let f = finish(cmd, secs(30));
    assert_code(f.status, 0, &f.stderr);
    assert!(
        !f.stdout.contains("s3cr3t") && !f.stderr.contains("s3cr3t"),
        "{}{}",
        f.stdout,
        f.stderr
    );
}

/// `colibri check` reads the TLS files: a CA file that is missing, a directory, or holds no
/// certificate is refused, naming `sinks.<name>.tls.ca_file`.
#[test]
fn check_refuses_an_unreadable_ca_file() {
    let sb = Sandbox::new();
    let dir = sb.file("a-directory");
    std::fs::create_dir(&dir).expect("create a dir");
    let junk = sb.file("junk.pem");
    std::fs::write(&junk, "not a certificate\n").expect("write junk");
    let sink = |name: &'static str, ca: &Path| {
        Sink::new(name, "https://localhost:8443/ingest".into())
            .with(&format!("tls: {{ ca_file: {} }}", quote_path(ca)))
    };
    let config = write_config(
        &sb,
        &[
            sink("missing", &sb.file("nope.pem")),
            sink("isdir", &dir),
            sink("junk", &junk),
        ],
        &[
            ("a", "missing", 100),
            ("b", "isdir", 100),
            ("c", "junk", 100),
        ],
    );
    let mut cmd = colibri();
    cmd.arg("check").arg("--config").arg(&config);
    let f = finish(cmd, secs(30));
    assert_code(f.status, 1, &f.stderr);
    for (name, says) in [
        ("missing", "nope.pem"),
        ("isdir", "a-directory"),
        ("junk", "junk.pem"),
    ] {
        assert!(
            f.stderr
                .lines()
                .any(|l| l.contains(&format!("sinks.{name}.tls.ca_file")) && l.contains(says)),
            "no problem for sinks.{name}.tls.ca_file naming {says}; stderr:\n{}",
            f.stderr
        );
    }
    assert!(!sb.file("data").exists(), "check created data_dir");
}

/// An agent whose stream `logs` goes to `rx` (a TCP probe, down after one failure), started
/// while `rx` refuses connections, and `posts` single-record posts accepted meanwhile (records
/// 0..posts): the queue a link that comes back finds.
fn posted_through_an_outage(sb: &Sandbox, rx: &Receiver, posts: u64) -> (PathBuf, Proc) {
    rx.set_mode(Mode::Refuse);
    let port = crate::tsdb::free_port();
    let config = sb.write_config(&format!(
        "data_dir: data\n\
         log: {{ format: json }}\n\
         ingest: {{ listen: \"127.0.0.1:{port}\" }}\n\
         sinks:\n  up: {{ type: http, url: {url}, timeout: 60s, \
           link: {{ probe: tcp, down_after: 1, backoff_base: 50ms, backoff_cap: 200ms }} }}\n\
         streams:\n  logs: {{ sink: up }}\n",
        url = quote(rx.url("/in")),
    ));
    let agent = start(&config);
    let mut c =
        crate::util::client::Client::new(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    for seq in 0..posts {
        let body = format!("{}\n", rec(seq));
        let a = c
            .post(
                "/v1/streams/logs/records",
                "application/x-ndjson",
                &[],
                body.as_bytes(),
            )
            .unwrap_or_else(|e| panic!("post {seq}: {e}"));
        assert_eq!(a.status, 200, "post {seq}: {}", a.text());
    }
    (config, agent)
}

/// Fewer, fuller requests (issue 34): 200 single-record posts accepted while the receiver is
/// down go out as a handful of requests once it is back, each record once. The group's request
/// hangs unanswered and the agent is killed (kill -9) before it could acknowledge: after a restart
/// the same jobs go again under the same key, which names the group exactly.
#[test]
fn single_record_posts_queued_through_an_outage_go_out_in_a_few_requests_under_stable_keys() {
    const POSTS: u64 = 200;
    let sb = Sandbox::new();
    let rx = Receiver::start();
    let (config, agent) = posted_through_an_outage(&sb, &rx, POSTS);
    // Back, but the first request is never answered: killed while it hangs.
    rx.set_mode(Mode::Hang);
    let hung = rx
        .wait_requests(1, secs(30))
        .unwrap_or_else(|e| panic!("{e}; stderr:\n{}", agent.stderr()))[0]
        .clone();
    agent.signal(libc::SIGKILL);
    let mut agent = agent;
    agent.wait_exit(secs(10));
    rx.set_mode(Mode::Accept);
    let agent = start(&config);
    let got = rx
        .wait_records(POSTS as usize, secs(60))
        .unwrap_or_else(|e| panic!("{e}; stderr:\n{}", agent.stderr()));
    drop(stop(agent));
    let seqs: Vec<u64> = got.iter().map(|r| seq_of(r)).collect();
    assert!(
        seqs.iter().copied().eq(0..POSTS),
        "each record once, in order: {seqs:?}"
    );
    let requests = rx.requests();
    let answered: Vec<&Received> = requests.iter().filter(|r| r.status.is_some()).collect();
    eprintln!(
        "{POSTS} single-record posts queued through an outage: {} request(s) after it",
        answered.len()
    );
    assert!(
        answered.len() <= 5,
        "a handful of requests: {}",
        answered.len()
    );
    // The hung request's jobs went again together, under its key and with its records.
    let again = answered
        .iter()
        .find(|r| r.idempotency_key == hung.idempotency_key)
        .unwrap_or_else(|| panic!("no request again under {:?}", hung.idempotency_key));
    assert_eq!(again.records(), hung.records());
    assert!(
        hung.records().len() > 1,
        "the hung request held several jobs"
    );
    let key = hung.idempotency_key.clone().unwrap_or_default();
    let parts: Vec<&str> = key.split(':').collect();
    assert_eq!(
        (parts.len(), parts[1]),
        (4, "logs"),
        "<store>:<stream>:<first>+<n>:<digest>: {key}"
    );
}

/// A request of several jobs that the receiver refuses (here a 413: too large together) is sent
/// again job by job, each under its own key, and every record arrives once.
#[test]
fn a_refused_group_is_sent_again_job_by_job_under_the_jobs_own_keys() {
    const POSTS: u64 = 20;
    let sb = Sandbox::new();
    let rx = Receiver::start();
    let (_, agent) = posted_through_an_outage(&sb, &rx, POSTS);
    // One record fits, two do not.
    rx.set_mode(Mode::MaxBody(rec(0).len() + 10));
    let got = rx
        .wait_records(POSTS as usize, secs(60))
        .unwrap_or_else(|e| panic!("{e}; stderr:\n{}", agent.stderr()));
    drop(stop(agent));
    let seqs: Vec<u64> = got.iter().map(|r| seq_of(r)).collect();
    assert!(
        seqs.iter().copied().eq(0..POSTS),
        "each record once, in order: {seqs:?}"
    );
    let requests = rx.requests();
    assert_eq!(requests[0].status, Some(413), "the group first");
    assert!(requests[0].records().len() > 1);
    let accepted: Vec<&Received> = requests.iter().filter(|r| r.status == Some(200)).collect();
    assert_eq!(accepted.len() as u64, POSTS, "then a request per job");
    let keys: HashSet<&str> = accepted.iter().map(|r| key(r)).collect();
    assert_eq!(keys.len() as u64, POSTS);
    assert!(
        keys.iter().all(|k| k.split(':').count() == 3),
        "the jobs' own keys: {keys:?}"
    );
}
