//! End-to-end tests of the local ingest API (`POST /v1/streams/{stream}/records`): the real binary
//! listens on a free port of 127.0.0.1, a small raw HTTP/1.1 client (`tests/util/client.rs`) sends
//! exactly the bytes each case needs, and what was stored is read back through `colibri queue
//! stats` or received by the test HTTP receiver (`tests/util/http.rs`) acting as the stream's
//! sink. Every status code of the contract has a test here, and one test checks that the server
//! and `schemas/openapi.yaml` agree on paths, methods and status codes. Every wait is bounded and
//! waits for a condition (a log event, an answer, a count), never for a fixed time.

use crate::tsdb::free_port;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::store::Tmpfs;
use crate::util::client::{Answer, Client};
use crate::util::http::{Mode, Receiver};
use crate::util::{Proc, Sandbox, assert_code, colibri, field, finish, poll, quote};
use crate::util::{queue_stats, secs, stop, stream_stats};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

const TOKEN: &str = "t0ken-of-the-tests";
const NDJSON: &str = "application/x-ndjson";
const JSON: &str = "application/json";

// ---------------------------------------------------------------------------------------------
// Configs and the binary.

struct Setup {
    _sb: Sandbox,
    port: u16,
    config: PathBuf,
}

impl Setup {
    /// `ingest: { listen: 127.0.0.1:<free port>, <ingest> }`, the given `storage:` settings (a
    /// flow mapping's inside, may be empty), sinks (whole lines) and streams (whole lines).
    fn new(ingest: &str, storage: &str, sinks: &str, streams: &str) -> Setup {
        let sb = Sandbox::new();
        let port = free_port();
        let sinks = if sinks.is_empty() {
            String::new()
        } else {
            format!("sinks:\n{sinks}")
        };
        let storage = if storage.is_empty() {
            "min_free: 1MiB".to_string()
        } else {
            storage.to_string()
        };
        let config = sb.write_config(&format!(
            "data_dir: data\n\
             shutdown_grace: 5s\n\
             log: {{ format: json, level: debug }}\n\
             storage: {{ {storage} }}\n\
             ingest: {{ listen: \"127.0.0.1:{port}\", {ingest} }}\n\
             {sinks}\
             streams:\n{streams}"
        ));
        Setup {
            _sb: sb,
            port,
            config,
        }
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    fn client(&self) -> Client {
        let mut c = Client::new(self.addr());
        c.timeout = secs(30);
        c
    }

    /// `colibri run`; returns once it logged "colibri started" (the listener is bound before).
    fn start(&self) -> Proc {
        let agent = Proc::run(&self.config);
        agent.wait_for_event(secs(30), "colibri started", |e| is(e, "colibri started"));
        agent
    }

    /// `colibri queue stats --json`: the entry of `stream`.
    fn stats(&self, stream: &str) -> Value {
        stream_stats(&queue_stats(&self.config, &[]), stream)
    }
}

/// An http sink to `url` with short retry and link timings.
fn sink(name: &str, url: &str) -> String {
    format!(
        "  {name}: {{ type: http, url: {}, timeout: 10s, retry: {{ base: 100ms, cap: 200ms, max_attempts: 3 }}, \
         link: {{ probe: tcp, down_after: 2, backoff_base: 50ms, backoff_cap: 200ms }} }}\n",
        quote(url)
    )
}

fn is(e: &Value, prefix: &str) -> bool {
    field(e, "message").starts_with(prefix)
}

fn path(stream: &str) -> String {
    format!("/v1/streams/{stream}/records")
}

fn bearer() -> String {
    format!("Bearer {TOKEN}")
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).expect("compress");
    e.finish().expect("compress")
}

/// Asserts the status, showing the answer otherwise.
#[track_caller]
fn expect(a: std::io::Result<Answer>, status: u16) -> Answer {
    let a = a.unwrap_or_else(|e| panic!("no answer ({e}); expected {status}"));
    assert_eq!(
        a.status,
        status,
        "answer {} {:?}: {}",
        a.status,
        a.headers,
        a.text()
    );
    a
}

/// The "ingest request refused" events with this status that were logged in full (repeats of a
/// WARN refusal are counted in summaries: see [`refused`]).
fn refusals(agent: &Proc, status: u64) -> Vec<Value> {
    agent.events_where(|e| {
        is(e, "ingest request refused") && e["status"] == status && e.get("repeated").is_none()
    })
}

/// How many requests were refused with this status: the events in full, and the repeats that
/// their summaries count.
fn refused(agent: &Proc, status: u64) -> u64 {
    agent
        .events_where(|e| is(e, "ingest request refused") && e["status"] == status)
        .iter()
        .map(|e| e["repeated"].as_u64().unwrap_or(1))
        .sum()
}

/// Peak resident memory of a process (VmHWM), in KiB.
fn peak_rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmHWM")
}

/// 100 NDJSON records of about 160 bytes: a body of some 16 KiB.
fn padded() -> String {
    (0..100)
        .map(|i| format!("{{\"n\":{i},\"pad\":\"{}\"}}\n", "x".repeat(140)))
        .collect()
}

fn appended(st: &Value) -> u64 {
    st["counters"]["appended_records"]
        .as_u64()
        .expect("a count")
}

/// `n` NDJSON records `{"n":first..}` and their texts.
fn ndjson(first: u64, n: u64) -> (Vec<u8>, Vec<String>) {
    let recs: Vec<String> = (first..first + n)
        .map(|i| format!(r#"{{"n":{i},"msg":"reading {i}"}}"#))
        .collect();
    let mut body = recs.join("\n");
    body.push('\n');
    (body.into_bytes(), recs)
}

// ---------------------------------------------------------------------------------------------
// 200: what is accepted is delivered, in order.

/// NDJSON (with CRLF, blank lines and padding), a pretty-printed JSON array (stored compact), both
/// gzip-encoded, an empty body, and 50 batches on one kept-alive connection: each answered 200
/// with its count, and the records reach the sink exactly in the order posted.
#[test]
fn records_arrive_at_the_sink_in_order_in_every_format() {
    let rx = Receiver::start();
    let s = Setup::new(
        &format!("token: {TOKEN}"),
        "",
        &sink("up", &rx.url("/in")),
        "  logs: { sink: up, batch: { max_records: 1000 } }\n",
    );
    let agent = s.start();
    let mut c = s.client();
    let auth = bearer();
    let h = [("Authorization", auth.as_str())];
    let mut want: Vec<String> = Vec::new();

    let a = expect(
        c.post(
            &path("logs"),
            NDJSON,
            &h,
            b"{\"n\":0}\r\n\r\n{\"n\":1}\n  {\"n\": 2}  \n\n",
        ),
        200,
    );
    assert_eq!(a.json(), json!({ "accepted": 3 }));
    assert_eq!(a.header("content-type"), Some("application/json"));
    want.extend(["{\"n\":0}", "{\"n\":1}", "{\"n\": 2}"].map(String::from));

    let pretty =
        b"[\n  {\"n\": 3, \"s\": \"a , b ] \\\" c\"},\n  {\"n\" : 4, \"v\": [1.50, 2e3]}\n]\n";
    let a = expect(c.post(&path("logs"), JSON, &h, pretty), 200);
    assert_eq!(a.json(), json!({ "accepted": 2 }));
    want.push(r#"{"n":3,"s":"a , b ] \" c"}"#.into());
    want.push(r#"{"n":4,"v":[1.50,2e3]}"#.into());

    let gz = [h[0], ("Content-Encoding", "gzip")];
    let a = expect(
        c.post(
            &path("logs"),
            "application/x-ndjson; charset=utf-8",
            &gz,
            &gzip(b"{\"n\":5}\n{\"n\":6}\n"),
        ),
        200,
    );
    assert_eq!(a.json(), json!({ "accepted": 2 }));
    want.extend(["{\"n\":5}", "{\"n\":6}"].map(String::from));
    let a = expect(
        c.post(&path("logs"), JSON, &gz, &gzip(b"[{\"n\":7}, \"eight\"]")),
        200,
    );
    assert_eq!(a.json(), json!({ "accepted": 2 }));
    want.extend(["{\"n\":7}", "\"eight\""].map(String::from));

    let a = expect(c.post(&path("logs"), NDJSON, &h, b""), 200);
    assert_eq!(a.json(), json!({ "accepted": 0 }));
    let a = expect(c.post(&path("logs"), JSON, &h, b"[]"), 200);
    assert_eq!(a.json(), json!({ "accepted": 0 }));

    for batch in 0..50 {
        let (body, recs) = ndjson(100 + batch * 20, 20);
        let a = expect(c.post(&path("logs"), NDJSON, &h, &body), 200);
        assert_eq!(a.json(), json!({ "accepted": 20 }));
        want.extend(recs);
    }
    assert!(c.connected(), "the connection was kept alive throughout");

    let got = rx
        .wait_records(want.len(), secs(30))
        .unwrap_or_else(|e| panic!("{e}; stderr:\n{}", agent.stderr()));
    assert_eq!(got, want, "delivered in the order posted");
    let agent = stop(agent);
    assert!(refusals(&agent, 400).is_empty() && !agent.stderr().contains(TOKEN));
    let st = s.stats("logs");
    assert_eq!(appended(&st), want.len() as u64, "{st}");
    assert_eq!(st["balanced"], true, "{st}");
}

// ---------------------------------------------------------------------------------------------
// 400.

/// A body with one bad record is refused whole: the NDJSON line (1-based) or the array index
/// (0-based) is named, in the message and as a field, and nothing of it is stored. The connection
/// stays usable; the refusal is logged without the body.
#[test]
fn a_bad_record_refuses_the_whole_body_naming_its_line_or_index() {
    let s = Setup::new("", "", "", "  logs: {}\n");
    let agent = s.start();
    let mut c = s.client();
    let p = path("logs");
    let secret = "BODY-TEXT-NEVER-LOGGED";

    let body = format!("{{\"a\":\"{secret}\"}}\n\n{{\"a\":}}\n{{}}\n");
    let a = expect(c.post(&p, NDJSON, &[], body.as_bytes()), 400);
    assert_eq!(a.json()["line"], 3, "{}", a.text());
    assert!(a.error().starts_with("line 3 is not JSON"), "{}", a.text());

    let a = expect(
        c.post(&p, JSON, &[], b"[{\"a\":1}, {\"b\":2}, {\"c\" 3}, 4]"),
        400,
    );
    assert_eq!(a.json()["index"], 2, "{}", a.text());
    assert!(a.error().starts_with("record [2] "), "{}", a.text());

    let a = expect(c.post(&p, JSON, &[], b"[1, 2,]"), 400);
    assert_eq!(a.json()["index"], 2, "{}", a.text());

    let a = expect(c.post(&p, NDJSON, &[], b"1\n\"\xff\xfe\"\n"), 400);
    assert_eq!(a.json()["line"], 2, "{}", a.text());

    let a = expect(c.post(&p, JSON, &[], b"{\"not\": \"an array\"}"), 400);
    assert!(a.error().contains("must be an array"), "{}", a.text());

    let gz = [("Content-Encoding", "gzip")];
    let a = expect(c.post(&p, NDJSON, &gz, b"{\"plain\":\"text\"}\n"), 400);
    assert!(a.error().contains("gzip"), "{}", a.text());
    let mut cut = gzip(b"{\"a\":1}\n{\"a\":2}\n");
    cut.truncate(cut.len() - 6);
    expect(c.post(&p, NDJSON, &gz, &cut), 400);

    // The same connection still works.
    expect(c.post(&p, NDJSON, &[], b"{\"ok\":1}\n"), 200);
    assert!(c.connected());

    let agent = stop(agent);
    assert_eq!(refused(&agent, 400), 7, "{}", agent.stderr());
    for e in refusals(&agent, 400) {
        assert_eq!(field(&e, "stream"), "logs", "{e}");
        assert_eq!(field(&e, "level"), "WARN", "{e}");
        assert!(!field(&e, "reason").is_empty(), "{e}");
    }
    assert!(!agent.stderr().contains(secret), "a body reached the log");
    let st = s.stats("logs");
    assert_eq!(appended(&st), 1, "only the good record was stored: {st}");
}

// ---------------------------------------------------------------------------------------------
// 401, 404, 405, 411, 415.

/// The token is required and compared (the refusal never shows it); unknown streams and paths are
/// 404, other methods 405 with `Allow`, a missing length (or a chunked body) 411, an unknown
/// content type or encoding 415. None of them stores anything.
#[test]
fn tokens_paths_methods_lengths_and_types_are_checked() {
    let s = Setup::new(&format!("token: {TOKEN}"), "", "", "  logs: {}\n");
    let agent = s.start();
    let mut c = s.client();
    let p = path("logs");
    let auth = bearer();
    let ok = [("Authorization", auth.as_str())];
    let body = b"{\"a\":1}\n";

    // 401
    for h in [
        vec![],
        vec![("Authorization", "Bearer wrong-token")],
        vec![("Authorization", "Bearer t0ken-of-the-test")],
        vec![("Authorization", "Basic dXNlcjpwYXNz")],
    ] {
        let a = expect(c.post(&p, NDJSON, &h, body), 401);
        assert_eq!(
            a.header("www-authenticate"),
            Some("Bearer realm=\"colibri\"")
        );
        assert!(!a.text().contains(TOKEN));
    }
    // An unknown stream without the token says 401, not whether the stream exists.
    expect(c.post(&path("nope"), NDJSON, &[], body), 401);
    expect(c.post(&p, NDJSON, &ok, body), 200);

    // 404
    let a = expect(c.post(&path("nope"), NDJSON, &ok, body), 404);
    assert!(a.error().contains("\"nope\""), "{}", a.text());
    for other in [
        "/",
        "/v1/streams/logs",
        "/v1/streams/logs/records/x",
        "/v2/x",
    ] {
        let a = expect(c.post(other, NDJSON, &ok, body), 404);
        assert!(a.error().contains("no such path"), "{}", a.text());
    }

    // 405
    for method in ["GET", "PUT", "DELETE"] {
        let a = expect(c.request(method, &p, &ok, None), 405);
        assert_eq!(a.header("allow"), Some("POST"));
    }

    // 415
    let a = expect(c.post(&p, "text/plain", &ok, body), 415);
    assert!(a.error().contains("application/x-ndjson"), "{}", a.text());
    let a = expect(c.request("POST", &p, &ok, Some(body)), 415);
    assert!(a.error().contains("no Content-Type"), "{}", a.text());
    let br = [ok[0], ("Content-Encoding", "br")];
    let a = expect(c.post(&p, NDJSON, &br, body), 415);
    assert!(a.error().contains("br"), "{}", a.text());

    // 411: no length, and a chunked body; the connection is closed after each.
    let head = format!(
        "POST {p} HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\nContent-Type: {NDJSON}\r\n"
    );
    c.send_raw(format!("{head}\r\n").as_bytes()).expect("send");
    let a = expect(c.read_answer(), 411);
    assert_eq!(a.header("connection"), Some("close"));
    assert!(!c.connected());
    c.send_raw(
        format!("{head}Transfer-Encoding: chunked\r\n\r\n8\r\n{{\"a\":1}}\n\r\n0\r\n\r\n")
            .as_bytes(),
    )
    .expect("send");
    let a = expect(c.read_answer(), 411);
    assert!(a.error().contains("chunked"), "{}", a.text());

    expect(c.post(&p, NDJSON, &ok, body), 200);
    let agent = stop(agent);
    for (status, n) in [(401, 5), (404, 5), (405, 3), (411, 2), (415, 3)] {
        assert_eq!(refused(&agent, status), n, "{status}: {}", agent.stderr());
    }
    assert!(!agent.stderr().contains(TOKEN), "the token reached the log");
    assert_eq!(appended(&s.stats("logs")), 2);
}

// ---------------------------------------------------------------------------------------------
// 413.

/// A declared length over `max_body` is refused before the body is read (and the connection
/// closed); a gzip body that inflates past `max_body` is refused after at most that much; so are
/// more than 100,000 records in one request, and a record larger than its stream can hold.
/// Nothing is stored.
#[test]
fn oversized_bodies_gzip_bombs_and_records_too_large_for_the_stream_get_413() {
    let s = Setup::new(
        "max_body: 512KiB",
        "",
        "",
        "  logs: {}\n  narrow: { batch: { max_records: 10, max_bytes: 1KiB }, max_bytes: 2KiB }\n",
    );
    let agent = s.start();
    let mut c = s.client();

    // Only the headers: the answer comes without the body being sent.
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: x\r\nContent-Type: {NDJSON}\r\nContent-Length: {}\r\n\r\n",
        path("logs"),
        512 * 1024 + 1
    );
    c.send_raw(head.as_bytes()).expect("send");
    let a = expect(c.read_answer(), 413);
    assert!(a.error().contains("max_body"), "{}", a.text());
    assert_eq!(a.header("connection"), Some("close"));

    // 256 MiB of empty lines in ~256 KiB of gzip: 256 members of 1 MiB each.
    let member = gzip(&vec![b'\n'; 1 << 20]);
    let bomb = member.repeat(256);
    assert!(bomb.len() < 512 << 10, "{} bytes", bomb.len());
    let a = expect(
        c.post(
            &path("logs"),
            NDJSON,
            &[("Content-Encoding", "gzip")],
            &bomb,
        ),
        413,
    );
    assert!(a.error().contains("decompresses"), "{}", a.text());
    // It cost at most max_body of memory, not its inflated size.
    let peak_kib = peak_rss_kib(agent.pid());
    assert!(peak_kib < 64 << 10, "peak resident memory {peak_kib} KiB");

    let big = format!("{{\"pad\":\"{}\"}}\n", "x".repeat(4000));
    let a = expect(c.post(&path("narrow"), NDJSON, &[], big.as_bytes()), 413);
    assert!(a.error().contains("can never fit"), "{}", a.text());

    // Records that each fit, in a batch that never can (3 jobs of ~900 bytes > max_bytes 2KiB,
    // even with the stream empty): 413 at once, not 429 for a retry that would fail forever.
    let rec = format!("{{\"pad\":\"{}\"}}\n", "y".repeat(888));
    let a = expect(
        c.post(&path("narrow"), NDJSON, &[], rec.repeat(3).as_bytes()),
        413,
    );
    assert!(
        a.error().contains("can never fit") && a.error().contains("smaller batches"),
        "{}",
        a.text()
    );
    expect(c.post(&path("narrow"), NDJSON, &[], rec.as_bytes()), 200);

    let tiny = "1\n".repeat(100_001);
    let a = expect(c.post(&path("logs"), NDJSON, &[], tiny.as_bytes()), 413);
    assert!(a.error().contains("100000 records"), "{}", a.text());

    expect(c.post(&path("logs"), NDJSON, &[], b"1\n"), 200);
    let agent = stop(agent);
    assert_eq!(refused(&agent, 413), 5, "{}", agent.stderr());
    assert_eq!(appended(&s.stats("logs")), 1);
    assert_eq!(appended(&s.stats("narrow")), 1);
}

// ---------------------------------------------------------------------------------------------
// 408: a slow client holds neither a turn nor a connection for long.

/// With one request at a time (`max_requests: 1`), a client that sends half a body holds the turn
/// only until `read_timeout`, then gets 408 (connection closed); the request queued behind it is
/// then served. A connection that sends nothing, or half its headers, is closed after
/// `read_timeout` too.
#[test]
fn a_slow_client_gets_408_and_holds_no_turn_beyond_the_read_timeout() {
    let s = Setup::new(
        "max_requests: 1, read_timeout: 600ms",
        "",
        "",
        "  logs: {}\n",
    );
    let agent = s.start();

    let mut slow = s.client();
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: x\r\nContent-Type: {NDJSON}\r\nContent-Length: 100\r\n\r\n{{\"a\":",
        path("logs")
    );
    let started = Instant::now();
    slow.send_raw(head.as_bytes()).expect("send");
    // Sent after the slow request's headers (which the server reads first), from another
    // thread: it waits for the only turn.
    let addr = s.addr();
    let queued = std::thread::spawn(move || {
        let mut c = Client::new(addr);
        c.timeout = secs(30);
        let t = Instant::now();
        let a = c.post(&path("logs"), NDJSON, &[], b"{\"queued\":1}\n");
        (a, t.elapsed())
    });
    let mut idle = s.client();
    idle.send_raw(b"").expect("connect");
    let mut half_headers = s.client();
    half_headers
        .send_raw(format!("POST {} HTTP/1.1\r\nHost: x\r\n", path("logs")).as_bytes())
        .expect("send");

    let a = expect(slow.read_answer(), 408);
    let took = started.elapsed();
    assert!(
        took >= ms(550) && took < secs(5),
        "408 after {took:?} with read_timeout 600ms"
    );
    assert_eq!(a.header("connection"), Some("close"));
    assert!(a.error().contains("read_timeout"), "{}", a.text());

    let (a, waited) = queued.join().expect("the queued client");
    expect(a, 200);
    assert!(
        waited >= ms(300) && waited < secs(5),
        "the queued request waited {waited:?} for the slow one's turn"
    );

    assert!(
        idle.wait_closed(secs(5)).expect("no bytes"),
        "an idle connection stays open"
    );
    assert!(
        half_headers.wait_closed(secs(5)).expect("no bytes"),
        "a connection with half its headers stays open"
    );
    let agent = stop(agent);
    assert_eq!(refused(&agent, 408), 1, "{}", agent.stderr());
    assert_eq!(appended(&s.stats("logs")), 1);
}

// ---------------------------------------------------------------------------------------------
// 429.

/// A `block` stream at `max_jobs` (its sink refuses connections, so nothing drains): a request
/// waits `wait`, then gets 429 with `Retry-After`, and nothing of it is stored. A request waiting
/// while the sink comes back is stored once room appears, and answered 200. A `drop_newest`
/// stream answers 429 at once, its records counted as dropped.
#[test]
fn a_full_stream_answers_429_after_the_wait_and_200_once_room_appears() {
    let rx = Receiver::start();
    rx.set_mode(Mode::Refuse);
    let s = Setup::new(
        "wait: 2s",
        "",
        &sink("up", &rx.url("/in")),
        "  held: { sink: up, max_jobs: 2 }\n  lossy: { max_jobs: 1, when_full: drop_newest }\n",
    );
    let agent = s.start();
    let mut c = s.client();
    let (b1, r1) = ndjson(0, 3);
    let (b2, r2) = ndjson(3, 3);
    let (b3, _) = ndjson(6, 3);
    let (b4, r4) = ndjson(9, 3);
    expect(c.post(&path("held"), NDJSON, &[], &b1), 200);
    expect(c.post(&path("held"), NDJSON, &[], &b2), 200);
    let t = Instant::now();
    let a = expect(c.post(&path("held"), NDJSON, &[], &b3), 429);
    let waited = t.elapsed();
    assert!(
        waited >= ms(1900) && waited < secs(10),
        "429 after {waited:?} with wait 2s"
    );
    assert_eq!(a.header("retry-after"), Some("1"));
    assert!(a.error().contains("max_jobs"), "{}", a.text());

    // The next one waits; the sink comes back meanwhile and delivery makes room.
    let addr = s.addr();
    let waiting = std::thread::spawn(move || {
        let mut c = Client::new(addr);
        c.post(&path("held"), NDJSON, &[], &b4)
    });
    rx.set_mode(Mode::Accept);
    expect(waiting.join().expect("the waiting client"), 200);
    let want: Vec<String> = [r1, r2, r4].concat();
    let got = rx
        .wait_records(want.len(), secs(30))
        .unwrap_or_else(|e| panic!("{e}; stderr:\n{}", agent.stderr()));
    assert_eq!(got, want, "the refused batch never arrives");

    let (l1, _) = ndjson(100, 2);
    let (l2, _) = ndjson(102, 5);
    expect(c.post(&path("lossy"), NDJSON, &[], &l1), 200);
    let t = Instant::now();
    let a = expect(c.post(&path("lossy"), NDJSON, &[], &l2), 429);
    assert!(t.elapsed() < secs(1), "drop_newest does not wait");
    assert!(a.error().contains("drop_newest"), "{}", a.text());
    assert!(a.header("retry-after").is_some());

    let agent = stop(agent);
    assert_eq!(refusals(&agent, 429).len(), 2, "{}", agent.stderr());
    for e in refusals(&agent, 429) {
        assert_eq!(field(&e, "level"), "DEBUG", "back-pressure is routine: {e}");
    }
    assert_eq!(rx.records().len(), want.len(), "nothing more arrived");
    let held = s.stats("held");
    assert_eq!(appended(&held), 9, "{held}");
    let lossy = s.stats("lossy");
    assert_eq!(lossy["counters"]["dropped_newest_records"], 5, "{lossy}");
    assert_eq!(lossy["ready"]["records"], 2, "{lossy}");
}

// ---------------------------------------------------------------------------------------------
// 507.

/// When `storage.max_bytes` is used up, a request waits `wait` for room, then gets 507 with
/// `Retry-After`; what was answered 200 before is exactly what is stored.
#[test]
fn an_exhausted_disk_budget_answers_507() {
    let s = Setup::new(
        "wait: 300ms",
        "max_bytes: 64KiB, min_free: 1MiB",
        "",
        "  logs: { batch: { max_bytes: 16KiB }, max_bytes: 1MiB }\n",
    );
    let agent = s.start();
    let mut c = s.client();
    let mut accepted = 0;
    let mut answer = None;
    for _ in 0..40 {
        let a = c
            .post(&path("logs"), NDJSON, &[], padded().as_bytes())
            .expect("an answer");
        match a.status {
            200 => accepted += 100,
            _ => {
                answer = Some(a);
                break;
            }
        }
    }
    let a = answer.expect("the 64 KiB budget runs out within 40 posts of 16 KiB");
    assert_eq!(a.status, 507, "{}", a.text());
    assert!(accepted > 0);
    assert_eq!(a.header("retry-after"), Some("10"));
    assert!(a.error().contains("storage.max_bytes"), "{}", a.text());
    let t = Instant::now();
    expect(c.post(&path("logs"), NDJSON, &[], padded().as_bytes()), 507);
    assert!(t.elapsed() >= ms(250), "block waits before 507");
    let agent = stop(agent);
    assert_eq!(refused(&agent, 507), 2, "{}", agent.stderr());
    for e in agent.events_where(|e| is(e, "ingest request refused") && e["status"] == 507) {
        assert_eq!(field(&e, "level"), "WARN", "{e}");
    }
    assert_eq!(appended(&s.stats("logs")), accepted);
}

/// A config on a tmpfs: the store in `<fs>/data`, ingest with a short `wait`, one stream `logs`
/// stored as it comes (a full disk must take real bytes), delivered to `sink` when given.
fn disk_config(sb: &Sandbox, fs: &Tmpfs, port: u16, storage: &str, sink: Option<&str>) -> PathBuf {
    let (sinks, to) = match sink {
        Some(url) => (format!("sinks:\n{}", sink_to("up", url)), "sink: up, "),
        None => (String::new(), ""),
    };
    sb.write_config(&format!(
        "data_dir: {}\n\
         shutdown_grace: 5s\n\
         log: {{ format: json, level: debug }}\n\
         storage: {{ {storage} }}\n\
         ingest: {{ listen: \"127.0.0.1:{port}\", wait: 100ms }}\n\
         {sinks}\
         streams:\n  logs: {{ {to}batch: {{ max_bytes: 16KiB }}, compression: none }}\n",
        quote(fs.dir.join("data").to_string_lossy())
    ))
}

/// An http sink whose returning link is noticed within a second.
fn sink_to(name: &str, url: &str) -> String {
    sink(name, url)
}

/// ~16 KiB of records that do not compress, numbered from `first` (100 records).
fn incompressible(first: u64, rng: &mut fastrand::Rng) -> Vec<u8> {
    (first..first + 100)
        .map(|n| {
            let pad: String = (0..150).map(|_| rng.alphanumeric()).collect();
            format!("{{\"n\":{n},\"pad\":\"{pad}\"}}\n")
        })
        .collect::<String>()
        .into_bytes()
}

/// Posts batches until one is not accepted; returns (records accepted, that answer).
fn post_until_refused(c: &mut Client, rng: &mut fastrand::Rng, next: &mut u64) -> Answer {
    for _ in 0..10_000 {
        let a = c
            .post(&path("logs"), NDJSON, &[], &incompressible(*next, rng))
            .expect("an answer");
        if a.status != 200 {
            return a;
        }
        *next += 100;
    }
    panic!("the disk never filled up ({next} records accepted)");
}

/// Posts one batch a second (as a producer honouring a short retry would) until it is accepted;
/// returns how long that took. Panics after `limit`.
fn retry_every_second(
    c: &mut Client,
    rng: &mut fastrand::Rng,
    next: &mut u64,
    limit: Duration,
    agent: &Proc,
) -> Duration {
    let start = Instant::now();
    let mut last = None;
    while start.elapsed() < limit {
        let tried = Instant::now();
        let a = c
            .post(&path("logs"), NDJSON, &[], &incompressible(*next, rng))
            .expect("an answer");
        if a.status == 200 {
            *next += 100;
            return start.elapsed();
        }
        assert_eq!(a.status, 507, "{}", a.text());
        last = Some(a.text());
        // The producer's own pace, not a wait for colibri.
        std::thread::sleep(secs(1).saturating_sub(tried.elapsed()));
    }
    panic!(
        "not accepted within {limit:?} of retries every second; last answer {last:?}; stderr:\n{}",
        agent.stderr()
    );
}

/// Issue 17. `min_free` set, an outage long enough to fill the disk down to it (507s), then the
/// upstream returns and the backlog drains: a producer that retries every second is accepted
/// again within seconds of the drain's end. (It once got 507 until 10 s passed with no request
/// at all: every refused request put off the compaction that the free-space check waited for.)
#[test]
fn after_a_full_disk_drains_a_producer_retrying_every_second_is_accepted_again() {
    let sb = Sandbox::new();
    let Some(fs) = Tmpfs::mount(sb.file("disk"), "48m") else {
        return;
    };
    let rx = Receiver::start_counting();
    rx.set_mode(Mode::Refuse);
    let port = free_port();
    let config = disk_config(
        &sb,
        &fs,
        port,
        "min_free: 16MiB, max_bytes: 1GiB",
        Some(&rx.url("/in")),
    );
    let agent = Proc::run(&config);
    agent.wait_for_event(secs(30), "colibri started", |e| is(e, "colibri started"));
    let mut c = Client::new(SocketAddr::from(([127, 0, 0, 1], port)));
    c.timeout = secs(30);
    let mut rng = fastrand::Rng::with_seed(17);
    let mut next = 0;
    let a = post_until_refused(&mut c, &mut rng, &mut next);
    assert_eq!(a.status, 507, "{}", a.text());
    assert!(a.error().contains("min_free"), "{}", a.text());
    assert!(a.header("retry-after").is_some());
    let accepted = next;
    eprintln!(
        "{accepted} records accepted before 507; {} bytes free",
        fs.free()
    );
    assert!(accepted >= 1000, "the outage queued a backlog first");

    rx.set_mode(Mode::Accept);
    rx.wait_count(accepted, secs(120)).unwrap_or_else(|e| {
        panic!(
            "the backlog did not drain: {e}; stderr:\n{}",
            agent.stderr()
        )
    });
    let took = retry_every_second(&mut c, &mut rng, &mut next, secs(30), &agent);
    eprintln!(
        "accepted again {took:?} after the drain; {} bytes free",
        fs.free()
    );
    assert!(
        took < secs(5),
        "accepted again {took:?} after the backlog drained: within two retries"
    );
    // And it goes on being accepted, delivered as it comes.
    for _ in 0..20 {
        expect(
            c.post(&path("logs"), NDJSON, &[], &incompressible(next, &mut rng)),
            200,
        );
        next += 100;
    }
    rx.wait_count(next, secs(60))
        .unwrap_or_else(|e| panic!("{e}; stderr:\n{}", agent.stderr()));
    let agent = stop(agent);
    assert!(
        agent
            .events_where(|e| field(e, "level") == "ERROR")
            .is_empty(),
        "{}",
        agent.stderr()
    );
}

/// A disk truly full (`min_free: 0`, so redb itself meets ENOSPC) answers 507 with `Retry-After`,
/// not 503; what was acknowledged stays; once space is freed the next append is accepted, with
/// no restart.
#[test]
fn a_truly_full_disk_answers_507_and_accepts_again_once_space_is_freed() {
    let sb = Sandbox::new();
    let Some(fs) = Tmpfs::mount(sb.file("disk"), "16m") else {
        return;
    };
    let port = free_port();
    let config = disk_config(&sb, &fs, port, "min_free: 0B, max_bytes: 1GiB", None);
    let agent = Proc::run(&config);
    agent.wait_for_event(secs(30), "colibri started", |e| is(e, "colibri started"));
    // A filler takes most of the space, so that it can be given back.
    let filler = fs.dir.join("filler");
    std::fs::write(&filler, vec![0x5a_u8; 8 << 20]).expect("write the filler");
    let mut c = Client::new(SocketAddr::from(([127, 0, 0, 1], port)));
    c.timeout = secs(30);
    let mut rng = fastrand::Rng::with_seed(18);
    let mut next = 0;
    let a = post_until_refused(&mut c, &mut rng, &mut next);
    let acked = next;
    eprintln!(
        "{acked} records acknowledged; then {} {}",
        a.status,
        a.text()
    );
    assert_eq!(a.status, 507, "{}", a.text());
    assert!(a.error().contains("no space left"), "{}", a.text());
    assert_eq!(a.header("retry-after"), Some("10"));
    assert!(acked > 0, "some records fit before the disk filled up");
    // Still full: still 507, never 503.
    for _ in 0..3 {
        let a = c
            .post(&path("logs"), NDJSON, &[], &incompressible(next, &mut rng))
            .expect("an answer");
        assert_eq!(a.status, 507, "{}", a.text());
    }

    std::fs::remove_file(&filler).expect("remove the filler");
    let took = retry_every_second(&mut c, &mut rng, &mut next, secs(30), &agent);
    eprintln!("accepted {took:?} after the space was freed");
    let agent = stop(agent);
    assert!(!agent.stderr().contains("panicked"), "{}", agent.stderr());
    // Every acknowledged record is there (at most the ones whose commit failed more: no record
    // of a 507 was acknowledged, and the failed commits did not take effect).
    let st = stream_stats(&queue_stats(&config, &[]), "logs");
    assert_eq!(st["balanced"], true, "{st}");
    let stored = st["ready"]["records"].as_u64().expect("a count");
    assert_eq!(stored, next, "{st}");
}

// ---------------------------------------------------------------------------------------------
// 503.

/// SIGTERM while a request is in progress (half its body sent): new requests, on new and on
/// kept-alive connections, get 503 with `Retry-After` (health too) while that request finishes;
/// once its body arrives it is stored and answered 200; then the listener closes and colibri
/// exits 0.
#[test]
fn a_stop_answers_503_while_requests_in_progress_finish() {
    let s = Setup::new("read_timeout: 20s", "", "", "  logs: {}\n");
    let mut agent = s.start();
    let mut kept = s.client();
    expect(
        kept.post(&path("logs"), NDJSON, &[], b"{\"before\":1}\n"),
        200,
    );

    let mut slow = s.client();
    let body = b"{\"slow\":1}\n{\"slow\":2}\n";
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: x\r\nContent-Type: {NDJSON}\r\nContent-Length: {}\r\n\r\n",
        path("logs"),
        body.len()
    );
    slow.send_raw(head.as_bytes()).expect("send");
    slow.send_raw(&body[..5]).expect("send");
    // The slow request's headers arrived first: it is in progress once this one is answered.
    expect(s.client().post(&path("logs"), NDJSON, &[], b""), 200);
    agent.signal(libc::SIGTERM);
    agent.wait_for_event(secs(10), "ingest stopping", |e| is(e, "ingest stopping"));

    let mut fresh = s.client();
    let a = expect(
        fresh.post(&path("logs"), NDJSON, &[], b"{\"late\":1}\n"),
        503,
    );
    assert_eq!(a.header("retry-after"), Some("5"));
    assert_eq!(a.header("connection"), Some("close"));
    assert!(a.error().contains("shutting down"), "{}", a.text());
    expect(
        kept.post(&path("logs"), NDJSON, &[], b"{\"late\":2}\n"),
        503,
    );
    let h = expect(s.client().request("GET", "/v1/health", &[], None), 503);
    assert_eq!(h.header("retry-after"), Some("5"));

    slow.send_raw(&body[5..]).expect("send the rest");
    let a = expect(slow.read_answer(), 200);
    assert_eq!(a.json(), json!({ "accepted": 2 }));
    let status = agent.wait_exit(secs(30));
    assert_code(status, 0, &agent.stderr());
    assert!(!agent.events_where(|e| is(e, "ingest stopped")).is_empty());
    assert!(
        std::net::TcpStream::connect(s.addr()).is_err(),
        "the port is closed"
    );
    assert_eq!(appended(&s.stats("logs")), 3);
    assert!(
        refusals(&agent, 503)
            .iter()
            .all(|e| field(e, "level") == "DEBUG")
    );
}

// ---------------------------------------------------------------------------------------------
// The contract.

/// (path template, method) -> status codes.
type Codes = BTreeMap<(String, String), BTreeSet<u16>>;

/// The status codes schemas/openapi.yaml documents.
fn documented() -> Codes {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/openapi.yaml");
    let text = std::fs::read_to_string(&file).expect("read schemas/openapi.yaml");
    let doc: Value = serde_saphyr::from_str(&text).expect("openapi.yaml is YAML");
    assert!(
        doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")),
        "an OpenAPI 3 document"
    );
    let mut out = BTreeMap::new();
    for (p, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("a path item") {
            if !["get", "put", "post", "delete", "patch", "head", "options"]
                .contains(&method.as_str())
            {
                continue;
            }
            let codes = op["responses"]
                .as_object()
                .expect("responses")
                .keys()
                .map(|k| k.parse().unwrap_or_else(|_| panic!("status {k:?}")))
                .collect();
            out.insert((p.clone(), method.to_uppercase()), codes);
        }
    }
    out
}

/// Drives every documented status code against one server and checks that the set of codes the
/// server produced for each operation equals the documented set (an answer for a path that is not
/// part of the API counts for the records operation, whose 404 documents it).
#[test]
fn the_openapi_document_and_the_server_agree() {
    let doc = documented();
    let records_op = (
        "/v1/streams/{stream}/records".to_string(),
        "POST".to_string(),
    );
    let health_op = ("/v1/health".to_string(), "GET".to_string());
    assert_eq!(
        doc.keys().cloned().collect::<Vec<_>>(),
        vec![health_op.clone(), records_op.clone()],
        "the API has these two operations"
    );

    let s = Setup::new(
        &format!("token: {TOKEN}, max_body: 64KiB, read_timeout: 3s, wait: 200ms"),
        "max_bytes: 256KiB, min_free: 1MiB",
        "",
        // Stored as they are, so the padded bodies below use up the budget (compressed, they
        // would fit a hundred times over).
        "  main: { batch: { max_bytes: 16KiB }, max_bytes: 1MiB, compression: none }\n  small: { max_jobs: 1 }\n",
    );
    let mut agent = s.start();
    let produced: RefCell<Codes> = RefCell::default();
    let answers: RefCell<Vec<(String, String, Answer)>> = RefCell::default();
    let note = |op: &(String, String), a: &std::io::Result<Answer>| {
        let a = a.as_ref().unwrap_or_else(|e| panic!("no answer: {e}"));
        produced
            .borrow_mut()
            .entry(op.clone())
            .or_default()
            .insert(a.status);
        answers
            .borrow_mut()
            .push((op.0.clone(), op.1.clone(), a.clone()));
    };
    let auth = bearer();
    let ok = [("Authorization", auth.as_str())];
    let mut c = s.client();
    let records = |c: &mut Client, stream: &str, h: &[(&str, &str)], body: &[u8]| {
        let a = c.post(&path(stream), NDJSON, h, body);
        note(&records_op, &a);
        a
    };
    let good = b"{\"a\":1}\n";
    expect(records(&mut c, "main", &ok, good), 200);
    expect(records(&mut c, "main", &ok, b"{\"a\":1}\nnot json\n"), 400);
    expect(records(&mut c, "main", &[], good), 401);
    expect(records(&mut c, "nope", &ok, good), 404);
    let a = c.post("/nope", NDJSON, &ok, good);
    note(&records_op, &a);
    expect(a, 404);
    let a = c.request("GET", &path("main"), &ok, None);
    note(&records_op, &a);
    expect(a, 405);
    c.send_raw(
        format!(
            "POST {} HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\nContent-Type: {NDJSON}\r\n\r\n",
            path("main")
        )
        .as_bytes(),
    )
    .expect("send");
    let a = c.read_answer();
    note(&records_op, &a);
    expect(a, 411);
    let a = c.post(&path("main"), "text/csv", &ok, good);
    note(&records_op, &a);
    expect(a, 415);
    c.send_raw(
        format!(
            "POST {} HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\nContent-Type: {NDJSON}\r\nContent-Length: 70000\r\n\r\n",
            path("main")
        )
        .as_bytes(),
    )
    .expect("send");
    let a = c.read_answer();
    note(&records_op, &a);
    expect(a, 413);
    expect(records(&mut c, "small", &ok, good), 200);
    expect(records(&mut c, "small", &ok, good), 429);
    // The 256 KiB budget runs out after some 16 of these.
    let body = padded();
    let body = body.as_bytes();
    let mut last = 200;
    for _ in 0..100 {
        let a = records(&mut c, "main", &ok, body);
        last = a.as_ref().map_or(0, |a| a.status);
        if last != 200 {
            break;
        }
    }
    assert_eq!(last, 507, "the budget runs out");

    let health = |c: &mut Client, method: &str| {
        let a = c.request(method, "/v1/health", &[], None);
        note(&health_op, &a);
        a
    };
    assert_eq!(
        expect(health(&mut c, "GET"), 200).json(),
        json!({"status": "ok"})
    );
    expect(health(&mut c, "POST"), 405);

    // A slow request keeps the stop's 503 window open, and ends in 408.
    let mut slow = s.client();
    slow.send_raw(
        format!(
            "POST {} HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\nContent-Type: {NDJSON}\r\nContent-Length: 100\r\n\r\n{{",
            path("small")
        )
        .as_bytes(),
    )
    .expect("send");
    // Its headers arrived before this request's: it is in progress once this one is answered.
    expect(records(&mut c, "main", &ok, b""), 200);
    agent.signal(libc::SIGTERM);
    agent.wait_for_event(secs(10), "ingest stopping", |e| is(e, "ingest stopping"));
    let mut late = s.client();
    expect(records(&mut late, "main", &ok, good), 503);
    expect(health(&mut s.client(), "GET"), 503);
    let a = slow.read_answer();
    note(&records_op, &a);
    expect(a, 408);
    assert_code(agent.wait_exit(secs(30)), 0, &agent.stderr());

    // Each answer carries the headers documented for its status.
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/openapi.yaml");
    let text = std::fs::read_to_string(&file).expect("read schemas/openapi.yaml");
    let spec: Value = serde_saphyr::from_str(&text).expect("openapi.yaml is YAML");
    for (p, method, a) in answers.into_inner() {
        let response = &spec["paths"][&p][method.to_lowercase()]["responses"][a.status.to_string()];
        for name in response["headers"]
            .as_object()
            .into_iter()
            .flat_map(|h| h.keys())
        {
            assert!(
                a.header(name).is_some(),
                "{method} {p} answered {} without {name}: {:?}",
                a.status,
                a.headers
            );
        }
    }
    let produced = produced.into_inner();
    assert_eq!(
        produced, doc,
        "status codes the server produced (left) and the ones schemas/openapi.yaml documents (right)"
    );
}

/// The request body types schemas/openapi.yaml documents are exactly the ones the server takes,
/// each for the streams it names (`x-colibri-streams`: `json` for a stream without a line-protocol
/// sink, `influx_line` for one whose sink has `encoding: influx_line`): each documented example is
/// stored by its kind of stream and refused with 415 by the other, undocumented types by both,
/// and every answer is `application/json`.
#[test]
fn the_server_takes_exactly_the_documented_request_types_per_stream() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/openapi.yaml");
    let text = std::fs::read_to_string(&file).expect("read schemas/openapi.yaml");
    let spec: Value = serde_saphyr::from_str(&text).expect("openapi.yaml is YAML");
    let content = spec["paths"]["/v1/streams/{stream}/records"]["post"]["requestBody"]["content"]
        .as_object()
        .expect("request body types")
        .clone();
    let s = Setup::new(
        "",
        "",
        "  tsdb: { type: http, url: \"http://127.0.0.1:9/write\", encoding: influx_line, precision: ms }\n",
        "  json: {}\n  influx_line: { sink: tsdb }\n",
    );
    let agent = s.start();
    let mut c = s.client();
    let mut stored = BTreeMap::from([("json", 0u64), ("influx_line", 0u64)]);
    for (ctype, media) in &content {
        let kind = media["x-colibri-streams"]
            .as_str()
            .unwrap_or_else(|| panic!("{ctype}: no x-colibri-streams"));
        let body = match &media["example"] {
            Value::String(t) => t.clone(),
            other => other.to_string(),
        };
        for stream in ["json", "influx_line"] {
            let a = expect_any(c.post(&path(stream), ctype, &[], body.as_bytes()));
            assert_eq!(a.header("content-type"), Some(JSON), "{ctype} to {stream}");
            if stream == kind {
                assert_eq!(a.status, 200, "{ctype} to {stream}: {}", a.text());
                *stored.get_mut(stream).expect("a stream") +=
                    a.json()["accepted"].as_u64().expect("accepted");
            } else {
                assert_eq!(a.status, 415, "{ctype} to {stream}: {}", a.text());
            }
        }
    }
    assert!(stored.values().all(|&n| n > 0), "{stored:?}");
    for ctype in ["text/csv", "application/octet-stream", "application/xml"] {
        for stream in ["json", "influx_line"] {
            let a = expect_any(c.post(&path(stream), ctype, &[], b"x v=1\n"));
            assert_eq!(a.status, 415, "{ctype} to {stream}: {}", a.text());
        }
    }
    let agent = stop(agent);
    drop(agent);
    for (stream, n) in stored {
        assert_eq!(appended(&s.stats(stream)), n, "{stream}");
    }
}

fn expect_any(a: std::io::Result<Answer>) -> Answer {
    a.unwrap_or_else(|e| panic!("no answer: {e}"))
}

// ---------------------------------------------------------------------------------------------
// kill -9 under load.

/// A unique id per record: client * 10^7 + sequence.
fn record(id: u64) -> String {
    format!(
        r#"{{"id":{id},"pad":"{}"}}"#,
        "p".repeat((id % 50) as usize)
    )
}

fn id_of(record: &str) -> u64 {
    serde_json::from_str::<Value>(record)
        .ok()
        .and_then(|v| v["id"].as_u64())
        .unwrap_or_else(|| panic!("a record no client sent: {record:?}"))
}

#[derive(Default)]
struct Outcomes {
    acked: Vec<u64>,
    refused: Vec<u64>,
    unknown: Vec<u64>,
    statuses: BTreeMap<u16, u64>,
}

/// One client: batches of 1-40 new records (NDJSON or a JSON array; one in ten has a bad record
/// in the middle, which must refuse all of it) until `done`. Records are never sent twice.
fn run_client(
    i: u64,
    addr: SocketAddr,
    done: Arc<AtomicBool>,
    acked_total: Arc<AtomicU64>,
) -> Outcomes {
    let mut out = Outcomes::default();
    let mut c = Client::new(addr);
    c.timeout = secs(20);
    let mut rng = fastrand::Rng::with_seed(i);
    let mut next = i * 10_000_000;
    let mut batch = 0u64;
    while !done.load(Ordering::Relaxed) {
        let n = rng.u64(1..=40);
        let ids: Vec<u64> = (next..next + n).collect();
        next += n;
        batch += 1;
        let mut recs: Vec<String> = ids.iter().map(|&id| record(id)).collect();
        // Each client's second answered request, and every fifth after it, carries a broken
        // record. Counted in answers, not in attempts: attempts while colibri is down come fast,
        // so a count of attempts can put every broken batch into the downtimes on a slow machine
        // and no 400 is ever seen. (Every tenth, it once saw none: on a loaded machine 64 clients
        // got 359 answers in all, and few reached ten.)
        let answered: u64 = out.statuses.values().sum();
        if answered % 5 == 1 {
            recs.insert(recs.len() / 2, "{\"id\": broken".into());
        }
        let answer = if batch.is_multiple_of(2) {
            c.post(
                &path("logs"),
                JSON,
                &[],
                format!("[{}]", recs.join(",")).as_bytes(),
            )
        } else {
            c.post(&path("logs"), NDJSON, &[], recs.join("\n").as_bytes())
        };
        match answer {
            Ok(a) => {
                *out.statuses.entry(a.status).or_default() += 1;
                if a.status == 200 {
                    assert_eq!(a.json()["accepted"], n, "{}", a.text());
                    acked_total.fetch_add(n, Ordering::Relaxed);
                    out.acked.extend(ids);
                } else {
                    out.refused.extend(ids);
                }
            }
            Err(_) => {
                out.unknown.extend(ids);
                // colibri is down (killed, restarting): do not spin on connection refused.
                std::thread::sleep(ms(20));
            }
        }
    }
    out
}

/// 64 clients post batches while colibri is killed with -9 at random moments (after a random
/// number of further acknowledged records) and restarted, four times. Afterwards every record
/// that was answered 200 reaches the sink, none that was answered an error does, and nothing
/// arrives that no client sent.
#[test]
fn kill_9_under_64_concurrent_clients_loses_no_acknowledged_record() {
    const CLIENTS: u64 = 64;
    const CRASHES: usize = 4;
    let rx = Receiver::start();
    let s = Setup::new(
        "max_requests: 32, wait: 200ms",
        "",
        &sink("up", &rx.url("/in")),
        "  logs: { sink: up, batch: { max_records: 100 }, max_jobs: 300 }\n",
    );
    let done = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let mut agent = s.start();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let (addr, done, acked) = (s.addr(), Arc::clone(&done), Arc::clone(&acked));
            std::thread::spawn(move || run_client(i, addr, done, acked))
        })
        .collect();
    let seed = fastrand::u64(..);
    let mut rng = fastrand::Rng::with_seed(seed);
    for crash in 0..CRASHES {
        let target = acked.load(Ordering::Relaxed) + rng.u64(200..5000);
        agent.wait_until(secs(60), "records acknowledged", || {
            acked.load(Ordering::Relaxed) >= target
        });
        agent.signal(libc::SIGKILL);
        agent.wait_exit(secs(10));
        eprintln!(
            "crash {crash} (seed {seed}): killed after {} acknowledged records",
            acked.load(Ordering::Relaxed)
        );
        agent = s.start();
    }
    let target = acked.load(Ordering::Relaxed) + 1000;
    agent.wait_until(
        secs(60),
        "records acknowledged after the last restart",
        || acked.load(Ordering::Relaxed) >= target,
    );
    done.store(true, Ordering::Relaxed);
    let mut all = Outcomes::default();
    for c in clients {
        let o = c.join().expect("a client thread");
        all.acked.extend(o.acked);
        all.refused.extend(o.refused);
        all.unknown.extend(o.unknown);
        for (k, v) in o.statuses {
            *all.statuses.entry(k).or_default() += v;
        }
    }
    eprintln!(
        "{} acknowledged, {} refused, {} unknown records; answers {:?}",
        all.acked.len(),
        all.refused.len(),
        all.unknown.len(),
        all.statuses
    );
    assert!(all.statuses.get(&400).is_some_and(|n| *n > 0));
    let acked_set: HashSet<u64> = all.acked.iter().copied().collect();
    let delivered =
        |rx: &Receiver| -> HashSet<u64> { rx.records().iter().map(|r| id_of(r)).collect() };
    if poll(secs(60), || {
        delivered(&rx).is_superset(&acked_set).then_some(())
    })
    .is_none()
    {
        let got = delivered(&rx);
        let missing: Vec<u64> = acked_set.difference(&got).copied().take(10).collect();
        panic!(
            "acknowledged records never delivered (e.g. {missing:?}, seed {seed}); stderr:\n{}",
            agent.stderr()
        );
    }
    let agent = stop(agent);
    let got = delivered(&rx);
    let refused_delivered: Vec<u64> = all
        .refused
        .iter()
        .copied()
        .filter(|id| got.contains(id))
        .take(10)
        .collect();
    assert!(
        refused_delivered.is_empty(),
        "records answered with an error were delivered: {refused_delivered:?} (seed {seed})"
    );
    let unknown: HashSet<u64> = all.unknown.iter().copied().collect();
    assert!(
        got.iter()
            .all(|id| acked_set.contains(id) || unknown.contains(id)),
        "every delivered record was sent and not refused"
    );
    let st = s.stats("logs");
    assert_eq!(st["balanced"], true, "{st}");
    assert_eq!(st["ready"]["records"], 0, "{st}");
    drop(agent);
}

// ---------------------------------------------------------------------------------------------
// Start-up.

/// `colibri check` names every bad `ingest.` field (never the token) and summarises a good
/// section; a port already taken stops `colibri run` with exit 1; listening beyond loopback
/// without a token, allowed by `allow_remote: true`, is warned about.
#[test]
fn config_problems_a_taken_port_and_an_open_listener_without_a_token() {
    let sb = Sandbox::new();
    let config = sb.write_config(
        "data_dir: data\n\
         ingest: { listen: 'localhost:80', max_body: 10, token: '', max_connections: 0, max_requests: 0, read_timeout: 0s, wait: 1h, bogus: 1 }\n\
         streams: { logs: {} }\n",
    );
    let mut cmd = colibri();
    cmd.args(["check", "--config"]).arg(&config);
    let f = finish(cmd, secs(30));
    assert_code(f.status, 1, &f.stderr);
    assert!(f.stderr.contains("ingest.bogus"), "{}", f.stderr);
    let config = sb.write_config(
        "data_dir: data\n\
         ingest: { listen: 'localhost:80', max_body: 10, token: '', max_connections: 0, max_requests: 0, read_timeout: 0s, wait: 1h }\n\
         streams: { logs: {} }\n",
    );
    let mut cmd = colibri();
    cmd.args(["check", "--config"]).arg(&config);
    let f = finish(cmd, secs(30));
    assert_code(f.status, 1, &f.stderr);
    for fld in [
        "listen",
        "max_body",
        "token",
        "max_connections",
        "max_requests",
        "read_timeout",
        "wait",
    ] {
        assert!(
            f.stderr.contains(&format!("ingest.{fld}: ")),
            "{fld}: {}",
            f.stderr
        );
    }
    let config = sb.write_config("data_dir: data\ningest: { listen: '127.0.0.1:9' }\n");
    let mut cmd = colibri();
    cmd.args(["check", "--config"]).arg(&config);
    let f = finish(cmd, secs(30));
    assert_code(f.status, 1, &f.stderr);
    assert!(
        f.stderr.contains("ingest needs at least one stream"),
        "{}",
        f.stderr
    );

    // A good section, summarised without its token.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    let config = sb.write_config(&format!(
        "data_dir: data\nlog: {{ format: json }}\n\
         ingest: {{ listen: '127.0.0.1:{port}', token: '{TOKEN}' }}\nstreams: {{ logs: {{}} }}\n"
    ));
    let mut cmd = colibri();
    cmd.args(["check", "--config"]).arg(&config);
    let f = finish(cmd, secs(30));
    assert_code(f.status, 0, &f.stderr);
    assert!(
        f.stdout
            .contains(&format!("ingest          http://127.0.0.1:{port}/v1/streams/{{stream}}/records, bearer token required")),
        "{}",
        f.stdout
    );
    assert!(!f.stdout.contains(TOKEN));

    // The port is taken: the start fails, naming it.
    let mut agent = Proc::run(&config);
    let status = agent.wait_exit(secs(30));
    assert_code(status, 1, &agent.stderr());
    assert!(
        agent
            .stderr()
            .contains(&format!("cannot start the ingest API on 127.0.0.1:{port}")),
        "{}",
        agent.stderr()
    );
    drop(taken);

    // Every address, no token, allowed in so many words: served, with a warning.
    let port = free_port();
    let config = sb.write_config(&format!(
        "data_dir: data\nlog: {{ format: json }}\n\
         ingest: {{ listen: '0.0.0.0:{port}', allow_remote: true }}\nstreams: {{ logs: {{}} }}\n"
    ));
    let agent = Proc::run(&config);
    let warn = agent.wait_for_event(secs(30), "the open-listener warning", |e| {
        is(e, "ingest listens beyond this machine without a token")
    });
    assert_eq!(field(&warn, "level"), "WARN");
    let mut c = Client::new(SocketAddr::from(([127, 0, 0, 1], port)));
    expect(c.post(&path("logs"), NDJSON, &[], b"1\n"), 200);
    stop(agent);
}

#[test]
fn admin_push_refuses_what_ingest_refuses() {
    let sb = Sandbox::new();
    let config = sb.write_config(
        "data_dir: data\nlog: { format: json }\n\
         sinks:\n  up: { type: http, url: \"http://127.0.0.1:1/\" }\n\
         streams:\n  logs: { sink: up }\n",
    );
    let agent = Proc::start(&config);
    let listening = agent.wait_for_event(secs(10), "admin endpoint listening", |e| {
        is(e, "admin endpoint listening")
    });
    let admin: SocketAddr = field(&listening, "listen").parse().expect("an address");
    let mut c = Client::new(admin);
    let mut push = |body: &[u8]| {
        let a = c
            .request("POST", "/-/queues/logs/records", &[], Some(body))
            .expect("an answer");
        (a.status, String::from_utf8_lossy(&a.body).into_owned())
    };
    let joined = "{\"a\":1}".repeat(10_000);
    let huge = format!("{{\"a\":\"{}\"}}", "x".repeat(5 << 20));
    for (what, body, status) in [
        ("not UTF-8", b"{\"a\":1}\n\xff\xfe\n".to_vec(), 400),
        (
            "concatenated objects",
            format!("{joined}\n").into_bytes(),
            400,
        ),
        ("over max_body", format!("{huge}\n").into_bytes(), 413),
    ] {
        let (got, text) = push(&body);
        assert_eq!(got, status, "{what}: {text}");
        assert!(text.contains("line "), "{what}: {text}");
    }
    let (got, text) = push(b"{\"a\":1}\n");
    assert_eq!(got, 200, "{text}");
    assert!(text.contains("\"stored\":1"), "{text}");
}
