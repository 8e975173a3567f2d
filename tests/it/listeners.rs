//! Both listeners, the ingest API and the admin endpoint, against careless and hostile clients,
//! from the real binary: clients that half-close their socket after the request, a thousand idle
//! sockets, the stop (503 until it ends; appends waiting for room answered at once), request
//! bodies beyond the memory budget, floods of refused requests (the log summarises them), and a
//! listener beyond loopback without a token. Every wait is bounded and waits for a condition.

use crate::tsdb::free_port;
use std::io::{Read as _, Write as _};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio_rustls::rustls;

use crate::util::client::{Answer, Client};
use crate::util::http::{Mode, Receiver};
use crate::util::{Proc, Sandbox, assert_code, colibri, field, finish, poll, quote};
use crate::util::{queue_stats, secs, stream_stats};

const NDJSON: &str = "application/x-ndjson";

fn path(stream: &str) -> String {
    format!("/v1/streams/{stream}/records")
}

fn is(e: &Value, prefix: &str) -> bool {
    field(e, "message").starts_with(prefix)
}

/// A running colibri with ingest on a free port and admin on another.
struct Agent {
    sb: Sandbox,
    config: PathBuf,
    proc: Proc,
    ingest: SocketAddr,
    admin: SocketAddr,
}

/// `ingest: { listen: <free port>, <ingest> }` and the given top-level lines (streams, sinks,
/// ...); logs in JSON at `level`.
fn start(level: &str, ingest: &str, rest: &str) -> Agent {
    let sb = Sandbox::new();
    let port = free_port();
    let config = sb.write_config(&format!(
        "data_dir: data\n\
         shutdown_grace: 20s\n\
         log: {{ format: json, level: {level} }}\n\
         storage: {{ min_free: 1MiB }}\n\
         ingest: {{ listen: \"127.0.0.1:{port}\", {ingest} }}\n\
         {rest}"
    ));
    let proc = Proc::run(&config);
    let listening = proc.wait_for_event(secs(30), "admin endpoint listening", |e| {
        is(e, "admin endpoint listening")
    });
    proc.wait_for_event(secs(30), "colibri started", |e| is(e, "colibri started"));
    let admin = field(&listening, "listen").parse().expect("an address");
    Agent {
        sb,
        config,
        proc,
        ingest: SocketAddr::from(([127, 0, 0, 1], port)),
        admin,
    }
}

impl Agent {
    fn client(&self) -> Client {
        let mut c = Client::new(self.ingest);
        c.timeout = secs(10);
        c
    }

    /// SIGTERM, then exit 0.
    fn stop(&mut self) {
        self.proc.signal(libc::SIGTERM);
        let status = self.proc.wait_exit(secs(60));
        assert_code(status, 0, &self.proc.stderr());
    }

    /// `colibri queue stats --json`: appended records of `stream` (after the stop).
    fn appended(&self, stream: &str) -> u64 {
        stream_stats(&queue_stats(&self.config, &[]), stream)["counters"]["appended_records"]
            .as_u64()
            .expect("a count")
    }
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

/// Sends `request`, shuts down the write side, and reads until the server closes: everything it
/// answered.
fn half_closed(addr: SocketAddr, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(secs(20))).expect("timeout");
    s.write_all(request).expect("send");
    s.shutdown(Shutdown::Write).expect("shutdown(SHUT_WR)");
    let mut out = Vec::new();
    // A reset after (part of) the answer still shows what arrived.
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// A client that shuts down its write side after its request (`nc -N`, `shutdown(SHUT_WR)`) gets
/// the answer, on ingest (after the records are stored) and on every admin path; what was
/// answered 200 is exactly what was stored.
#[test]
fn half_closed_clients_get_their_answer_on_ingest_and_admin() {
    let mut a = start("info", "", "streams:\n  logs: {}\n");
    let body = "{\"n\":1}\n{\"n\":2}\n";
    let request = format!(
        "POST {} HTTP/1.1\r\nHost: x\r\nContent-Type: {NDJSON}\r\nContent-Length: {}\r\n\r\n{body}",
        path("logs"),
        body.len()
    );
    for i in 0..5 {
        let answer = half_closed(a.ingest, request.as_bytes());
        assert!(
            answer.starts_with("HTTP/1.1 200") && answer.contains("{\"accepted\":2}"),
            "POST {i}, half-closed: {answer:?}"
        );
    }
    for p in ["/healthz", "/readyz", "/metrics"] {
        let answer = half_closed(
            a.admin,
            format!("GET {p} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
        );
        assert!(
            answer.starts_with("HTTP/1.1 200"),
            "GET {p}, half-closed: {answer:?}"
        );
    }
    let answer = half_closed(a.ingest, b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "ingest health: {answer:?}"
    );
    a.stop();
    assert_eq!(a.appended("logs"), 10);
}

/// Raises this process's soft limit of open files (inherited by the colibri it spawns, as the unit's
/// LimitNOFILE=65536 would) so that `need` sockets fit.
fn allow_open_files(need: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    if lim.rlim_cur >= need {
        return;
    }
    assert!(
        lim.rlim_max >= need,
        "this test opens {need} files; the hard limit is {}",
        lim.rlim_max
    );
    lim.rlim_cur = need;
    // SAFETY: setrlimit reads the struct we own; raising the soft limit up to the hard one is allowed.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
}

/// `n` connections that send nothing.
fn idle_sockets(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    (0..n)
        .map(|i| {
            TcpStream::connect_timeout(&addr, secs(10))
                .unwrap_or_else(|e| panic!("idle connection {i} to {addr}: {e}"))
        })
        .collect()
}

/// Whether the server closed `s` (EOF or reset) within `limit`, having sent nothing.
fn closed_by_server(s: &mut TcpStream, limit: Duration) -> bool {
    s.set_read_timeout(Some(limit)).expect("timeout");
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Ok(0) => true,
        Ok(n) => panic!("unexpected bytes: {:?}", String::from_utf8_lossy(&buf[..n])),
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

/// A thousand idle sockets on the admin endpoint do not keep `/healthz` from answering within a
/// second (nor `/readyz` and `/metrics`): each newcomer closes the connection idle longest once
/// the slots are taken. The same on ingest: a POST still succeeds. A connection that sends
/// nothing is closed a few seconds after accept, though `read_timeout` is 30 s. The log says
/// "all connections taken" once per listener, then counts.
#[test]
fn a_thousand_idle_sockets_starve_neither_health_checks_nor_ingest() {
    allow_open_files(4096);
    let mut a = start("info", "read_timeout: 30s", "streams:\n  logs: {}\n");

    let mut idle = idle_sockets(a.admin, 1000);
    let mut health = Client::new(a.admin);
    health.timeout = secs(1);
    let h = expect(health.request("GET", "/healthz", &[], None), 200);
    assert_eq!(h.text(), "ok\n");
    for p in ["/readyz", "/metrics"] {
        let mut c = Client::new(a.admin);
        c.timeout = secs(5);
        expect(c.request("GET", p, &[], None), 200);
    }
    assert!(
        closed_by_server(&mut idle[0], secs(5)),
        "the connection idle longest is closed for newcomers"
    );

    let mut idle_ingest = idle_sockets(a.ingest, 1000);
    let mut c = a.client();
    c.timeout = secs(5);
    let ok = expect(c.post(&path("logs"), NDJSON, &[], b"{\"real\":1}\n"), 200);
    assert_eq!(ok.text(), "{\"accepted\":1}");
    assert!(closed_by_server(&mut idle_ingest[0], secs(5)));

    // Measured from accept, a few seconds; read_timeout (30 s) is for bodies and keep-alive.
    drop(idle);
    drop(idle_ingest);
    let mut lone = TcpStream::connect(a.ingest).expect("connect");
    assert!(
        closed_by_server(&mut lone, secs(15)),
        "an idle connection is closed within seconds of accept"
    );
    a.stop();
    for listener in ["ingest", "admin"] {
        let lines = a.proc.events_where(|e| {
            field(e, "listener") == listener
                && field(e, "message").contains("all connections taken")
        });
        assert!(
            !lines.is_empty() && lines.len() <= 3,
            "{listener}: one line, then summaries: {lines:#?}"
        );
    }
    assert_eq!(a.appended("logs"), 1);
}

/// SIGTERM while the stop is held up (a delivery in progress to a receiver that does not
/// answer): new requests, on new and on kept-alive connections, get 503 with Retry-After, health
/// too, for as long as the stop lasts, not a refused connection; once the delivery ends colibri
/// exits 0.
#[test]
fn a_stop_answers_503_until_it_ends() {
    let rx = Receiver::start();
    rx.set_mode(Mode::Hang);
    let mut a = start(
        "info",
        "",
        &format!(
            "sinks:\n  up: {{ type: http, url: {}, timeout: 60s }}\nstreams:\n  sent: {{ sink: up }}\n",
            quote(rx.url("/in"))
        ),
    );
    let mut kept = a.client();
    expect(kept.post(&path("sent"), NDJSON, &[], b"{\"n\":1}\n"), 200);
    rx.wait_requests(1, secs(20))
        .unwrap_or_else(|e| panic!("{e}; stderr:\n{}", a.proc.stderr()));
    let signalled = Instant::now();
    a.proc.signal(libc::SIGTERM);
    a.proc
        .wait_for_event(secs(10), "ingest stopping", |e| is(e, "ingest stopping"));
    // Well past the moment the old drain closed the listener (0.5 s), and all the while.
    let mut answers = 0;
    let held = poll(secs(20), || {
        let mut c = a.client();
        let r = expect(c.post(&path("sent"), NDJSON, &[], b"{\"late\":1}\n"), 503);
        assert_eq!(r.header("retry-after"), Some("5"));
        assert!(r.error().contains("shutting down"), "{}", r.text());
        answers += 1;
        (signalled.elapsed() >= secs(3)).then_some(())
    });
    assert!(held.is_some());
    assert!(answers >= 2);
    expect(
        kept.post(&path("sent"), NDJSON, &[], b"{\"late\":2}\n"),
        503,
    );
    let h = expect(a.client().request("GET", "/v1/health", &[], None), 503);
    assert_eq!(h.header("retry-after"), Some("5"));
    assert!(
        a.proc.events_where(|e| is(e, "ingest stopped")).is_empty(),
        "the listener is still open"
    );
    // The delivery ends (closed without an answer: the job stays queued); so does the stop.
    rx.set_mode(Mode::Accept);
    let status = a.proc.wait_exit(secs(60));
    assert_code(status, 0, &a.proc.stderr());
    assert!(!a.proc.events_where(|e| is(e, "ingest stopped")).is_empty());
    assert_eq!(a.appended("sent"), 1);
}

/// A request waiting for room in a full `block` stream (wait: 30s) is answered 503 as soon as the
/// stop begins, with nothing of it stored, and does not hold the stop.
#[test]
fn a_stop_answers_a_waiting_append_at_once() {
    let mut a = start(
        "info",
        "wait: 30s",
        "streams:\n  held: { max_jobs: 1 }\n  other: {}\n",
    );
    expect(
        a.client().post(&path("held"), NDJSON, &[], b"{\"n\":1}\n"),
        200,
    );
    let mut waiting = a.client();
    waiting.timeout = secs(15);
    let body = b"{\"n\":2}\n";
    waiting
        .send_raw(
            format!(
                "POST {} HTTP/1.1\r\nHost: x\r\nContent-Type: {NDJSON}\r\nContent-Length: {}\r\n\r\n",
                path("held"),
                body.len()
            )
            .as_bytes(),
        )
        .expect("send");
    waiting.send_raw(body).expect("send");
    // Sent after the waiting one was complete: once this is stored, that one waits in the writer.
    expect(
        a.client().post(&path("other"), NDJSON, &[], b"{\"n\":3}\n"),
        200,
    );
    a.proc.signal(libc::SIGTERM);
    let r = expect(waiting.read_answer(), 503);
    assert_eq!(r.header("retry-after"), Some("5"));
    assert!(r.error().contains("shutting down"), "{}", r.text());
    let status = a.proc.wait_exit(secs(20));
    assert_code(status, 0, &a.proc.stderr());
    assert_eq!(a.appended("held"), 1, "the refused request stored nothing");
}

/// `colibri check` refuses an ingest listener beyond loopback without a token unless
/// `allow_remote: true` says so; with a token it is fine.
#[test]
fn ingest_beyond_loopback_without_a_token_needs_allow_remote() {
    let sb = Sandbox::new();
    let check = |ingest: &str| {
        let config = sb.write_config(&format!(
            "data_dir: data\ningest: {{ {ingest} }}\nstreams: {{ logs: {{}} }}\n"
        ));
        let mut cmd = colibri();
        cmd.args(["check", "--config"]).arg(&config);
        finish(cmd, secs(30))
    };
    let f = check("listen: '0.0.0.0:9465'");
    assert_code(f.status, 1, &f.stderr);
    assert!(
        f.stderr
            .contains("ingest.listen: 0.0.0.0:9465 is not a loopback address")
            && f.stderr.contains("allow_remote: true"),
        "{}",
        f.stderr
    );
    let f = check("listen: '[::]:9465'");
    assert_code(f.status, 1, &f.stderr);
    let f = check("listen: '0.0.0.0:9465', token: 's3cret'");
    assert_code(f.status, 0, &f.stderr);
    let f = check("listen: '0.0.0.0:9465', allow_remote: true");
    assert_code(f.status, 0, &f.stderr);
    assert!(f.stdout.contains("no token"), "{}", f.stdout);
    let f = check("listen: '127.0.0.1:9465'");
    assert_code(f.status, 0, &f.stderr);
}

/// With `max_memory: 9MiB` and `max_body: 1MiB`, a request of 1 MiB reserves most of the budget
/// (twice its body, plus room for its records) before its body is read: while it is in progress
/// another 1 MiB request waits `wait`, then gets 503 with Retry-After, nothing stored; a small one
/// still fits. Once the first is answered, the second goes through. `check` refuses a `max_body`
/// the budget cannot hold, and a budget over its ceiling.
#[test]
fn request_bodies_share_one_memory_budget() {
    let mut a = start(
        "info",
        "max_body: 1MiB, max_memory: 9MiB, wait: 1s, read_timeout: 20s",
        "streams:\n  logs: { max_bytes: 64MiB, batch: { max_bytes: 1MiB } }\n",
    );
    let record = format!("{{\"pad\":\"{}\"}}\n", "x".repeat(1000));
    let big: String = record.repeat((1 << 20) / record.len());
    let mut first = a.client();
    first
        .send_raw(
            format!(
                "POST {} HTTP/1.1\r\nHost: x\r\nContent-Type: {NDJSON}\r\nContent-Length: {}\r\n\r\n",
                path("logs"),
                big.len()
            )
            .as_bytes(),
        )
        .expect("send");
    first.send_raw(&big.as_bytes()[..1000]).expect("send");
    // Its headers arrived before this request's: it holds its share once this one is answered.
    expect(a.client().post(&path("logs"), NDJSON, &[], b""), 200);
    let refused = expect(
        a.client().post(&path("logs"), NDJSON, &[], big.as_bytes()),
        503,
    );
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert!(
        refused.error().contains("ingest.max_memory"),
        "{}",
        refused.text()
    );
    expect(
        a.client()
            .post(&path("logs"), NDJSON, &[], b"{\"small\":1}\n"),
        200,
    );
    first
        .send_raw(&big.as_bytes()[1000..])
        .expect("send the rest");
    let n = (big.len() / record.len()) as u64;
    assert_eq!(expect(first.read_answer(), 200).json()["accepted"], n);
    expect(
        a.client().post(&path("logs"), NDJSON, &[], big.as_bytes()),
        200,
    );
    a.stop();
    assert_eq!(a.appended("logs"), 2 * n + 1);

    let check = |ingest: &str| {
        let config = a.sb.write_config(&format!(
            "data_dir: data\ningest: {{ listen: '127.0.0.1:9465', {ingest} }}\nstreams: {{ logs: {{}} }}\n"
        ));
        let mut cmd = colibri();
        cmd.args(["check", "--config"]).arg(&config);
        finish(cmd, secs(30))
    };
    let f = check("max_body: 64MiB");
    assert_code(f.status, 1, &f.stderr);
    assert!(
        f.stderr
            .contains("ingest.max_body: a request of max_body (64MiB) may hold up to")
            && f.stderr.contains("more than ingest.max_memory (64MiB)"),
        "{}",
        f.stderr
    );
    let f = check("max_body: 64MiB, max_memory: 140MiB");
    assert_code(f.status, 0, &f.stderr);
    let f = check("max_memory: 256MiB");
    assert_code(f.status, 1, &f.stderr);
    assert!(
        f.stderr
            .contains("ingest.max_memory: 256MiB is out of range"),
        "{}",
        f.stderr
    );
}

/// One HTTPS connection, kept alive across requests.
struct Https(std::io::BufReader<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>);

impl Https {
    /// Connects and completes the handshake (a server certificate the client does not trust
    /// fails here; a client certificate the server refuses, with TLS 1.3, at the first answer).
    fn connect(addr: SocketAddr, config: Arc<rustls::ClientConfig>) -> std::io::Result<Https> {
        let name = "localhost".try_into().expect("a DNS name");
        let conn = rustls::ClientConnection::new(config, name).map_err(std::io::Error::other)?;
        let sock = TcpStream::connect(addr)?;
        sock.set_read_timeout(Some(secs(10)))?;
        let mut s = rustls::StreamOwned::new(conn, sock);
        while s.conn.is_handshaking() {
            s.conn.complete_io(&mut s.sock)?;
        }
        Ok(Https(std::io::BufReader::new(s)))
    }

    fn request(&mut self, head: &str, body: &str) -> std::io::Result<Answer> {
        let s = self.0.get_mut();
        write!(
            s,
            "{head}\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )?;
        s.flush()?;
        crate::util::client::read_answer(&mut self.0)
    }

    /// A new connection and one request on it.
    fn once(
        addr: SocketAddr,
        config: &Arc<rustls::ClientConfig>,
        head: &str,
        body: &str,
    ) -> std::io::Result<Answer> {
        Https::connect(addr, Arc::clone(config))?.request(head, body)
    }
}

/// Both listeners with TLS, ingest with client certificates required: clients that trust the CA
/// (and present a certificate it signed) are served, others refused, and counted in one WARN
/// each. The certificate is replaced on disk and SIGHUP sent: new connections get the new one,
/// a connection opened before goes on with the old; nothing stored is lost.
#[test]
fn tls_on_ingest_and_admin_and_a_certificate_replaced_by_sighup() {
    use crate::util::http::{TestPki, client_config};
    let sb = Sandbox::new();
    let (one, two) = (sb.file("one"), sb.file("two"));
    std::fs::create_dir_all(&one).unwrap();
    std::fs::create_dir_all(&two).unwrap();
    let (pki, next) = (TestPki::generate(&one), TestPki::generate(&two));
    std::fs::copy(&pki.server_cert, sb.file("server.pem")).unwrap();
    std::fs::copy(&pki.server_key, sb.file("server.key")).unwrap();
    let port = free_port();
    let config = sb.write_config(&format!(
        "data_dir: data\n\
         log: {{ format: json }}\n\
         admin: {{ listen: \"127.0.0.1:0\", token: admin-secret, tls: {{ cert_file: server.pem, key_file: server.key }} }}\n\
         ingest: {{ listen: \"127.0.0.1:{port}\", tls: {{ cert_file: server.pem, key_file: server.key, client_ca_file: {ca} }} }}\n\
         streams:\n  logs: {{}}\n",
        ca = quote(pki.ca.display().to_string())
    ));
    let mut agent = Proc::start(&config);
    let listening = agent.wait_for_event(secs(10), "admin endpoint listening", |e| {
        is(e, "admin endpoint listening")
    });
    let admin: SocketAddr = field(&listening, "listen").parse().expect("an address");
    let ingest = SocketAddr::from(([127, 0, 0, 1], port));
    let metrics = "GET /metrics HTTP/1.1\r\nAuthorization: Bearer admin-secret";
    let healthz = "GET /healthz HTTP/1.1";
    let post = format!("POST {} HTTP/1.1\r\nContent-Type: {NDJSON}", path("logs"));

    let trust_one = client_config(&pki.ca, None);
    let trust_two = client_config(&next.ca, None);
    let mut kept = Https::connect(admin, Arc::clone(&trust_one)).expect("admin over TLS");
    let page = expect(kept.request(metrics, ""), 200).text();
    assert!(page.contains("colibri_"), "{page}");
    assert!(
        Https::connect(admin, Arc::clone(&trust_two)).is_err(),
        "a client of another CA"
    );
    let plain = half_closed(admin, format!("{healthz}\r\nHost: x\r\n\r\n").as_bytes());
    assert!(
        plain.starts_with("HTTP/1.1 400"),
        "plain HTTP refused: {plain:?}"
    );

    let with_cert = client_config(&pki.ca, Some((&pki.client_cert, &pki.client_key)));
    let a = expect(
        Https::once(ingest, &with_cert, &post, "{\"n\":1}\n{\"n\":2}\n"),
        200,
    );
    assert!(a.text().contains("\"accepted\":2"), "{}", a.text());
    for (who, config) in [
        ("no client certificate", Arc::clone(&trust_one)),
        (
            "another CA's client certificate",
            client_config(
                &pki.ca,
                Some((&pki.other_client_cert, &pki.other_client_key)),
            ),
        ),
    ] {
        let r = Https::once(ingest, &config, &post, "{\"n\":0}\n");
        assert!(r.is_err(), "{who}: {:?}", r.map(|a| a.status));
    }
    for listener in ["admin", "ingest"] {
        agent.wait_for_event(secs(10), "a handshake failure logged", |e| {
            field(e, "listener") == listener && is(e, &format!("{listener}: TLS handshake failed"))
        });
    }

    // The certificate replaced (another CA's), then SIGHUP.
    std::fs::copy(&next.server_cert, sb.file("server.pem")).unwrap();
    std::fs::copy(&next.server_key, sb.file("server.key")).unwrap();
    agent.signal(libc::SIGHUP);
    for listener in ["admin", "ingest"] {
        agent.wait_for_event(secs(10), "the certificate read again", |e| {
            field(e, "listener") == listener && is(e, "certificate read again")
        });
    }
    assert!(
        Https::connect(admin, Arc::clone(&trust_one)).is_err(),
        "the old certificate is still served"
    );
    expect(Https::once(admin, &trust_two, healthz, ""), 200);
    expect(kept.request(healthz, ""), 200);
    // The operator's commands reach it over HTTPS with the CA (and the token) too, and never
    // read the key: an operator who may not read it (gone here; root reads any mode) uses them.
    std::fs::rename(sb.file("server.key"), sb.file("server.key.away")).unwrap();
    let mut cmd = colibri();
    cmd.args(["check", "--config"]).arg(&config);
    let checked = finish(cmd, secs(30));
    assert_code(checked.status, 1, &checked.stderr);
    assert!(
        checked.stderr.contains("admin.tls.key_file") && checked.stderr.contains("server.key"),
        "check reads the key: {}",
        checked.stderr
    );
    let mut cmd = colibri();
    cmd.args([
        "task",
        "list",
        "--admin",
        &format!("https://{admin}"),
        "--ca",
    ])
    .arg(&next.ca)
    .arg("--config")
    .arg(&config);
    let listed = finish(cmd, secs(30));
    assert_code(listed.status, 0, &listed.stderr);
    assert!(listed.stdout.contains("(no tasks)"), "{}", listed.stdout);
    std::fs::rename(sb.file("server.key.away"), sb.file("server.key")).unwrap();
    let renewed = client_config(&next.ca, Some((&pki.client_cert, &pki.client_key)));
    expect(Https::once(ingest, &renewed, &post, "{\"n\":3}\n"), 200);

    agent.signal(libc::SIGTERM);
    assert_code(agent.wait_exit(secs(30)), 0, &agent.stderr());
    let appended =
        stream_stats(&queue_stats(&config, &[]), "logs")["counters"]["appended_records"].as_u64();
    assert_eq!(appended, Some(3), "what was answered 200 is stored");
}

#[test]
fn a_taken_listener_port_stops_the_start_and_check_bind_names_each() {
    let sb = Sandbox::new();
    // Held by "another program": a TCP port and a UDP port.
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").expect("bind tcp");
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind udp");
    let (tcp_port, udp_port) = (
        tcp.local_addr().expect("addr").port(),
        udp.local_addr().expect("addr").port(),
    );
    let (admin, free_udp) = (free_port(), free_port());
    let write = |ingest: u16, syslog_udp: u16| {
        sb.write_config(&format!(
            "data_dir: data\nlog: {{ format: json }}\n\
             admin: {{ listen: '127.0.0.1:{admin}' }}\n\
             ingest: {{ listen: '127.0.0.1:{ingest}' }}\n\
             streams: {{ logs: {{}} }}\n\
             sources: {{ plant: {{ type: syslog, stream: logs, udp: '127.0.0.1:{syslog_udp}', tcp: '127.0.0.1:{tcp_port}' }} }}\n"
        ))
    };

    // At run, a taken syslog TCP port stops the start like a taken ingest port: exit 1, the
    // listener and its address named, never "colibri started".
    let config = write(free_port(), free_udp);
    let mut agent = Proc::run(&config);
    let status = agent.wait_exit(secs(30));
    assert_code(status, 1, &agent.stderr());
    let stderr = agent.stderr();
    assert!(
        stderr.contains(&format!("cannot listen on tcp 127.0.0.1:{tcp_port}"))
            && stderr.contains("sources.plant.tcp")
            && !stderr.contains("colibri started"),
        "{stderr}"
    );

    // `check` looks at the file only; `check --bind` tries every listener and names each that
    // cannot be bound.
    let config = write(tcp_port, udp_port);
    let check = |bind: bool| {
        let mut cmd = colibri();
        cmd.args(["check", "--config"]).arg(&config);
        if bind {
            cmd.arg("--bind");
        }
        finish(cmd, secs(30))
    };
    let f = check(false);
    assert_code(f.status, 0, &f.stderr);
    let f = check(true);
    assert_code(f.status, 1, &f.stderr);
    for want in [
        format!("cannot listen on tcp 127.0.0.1:{tcp_port} (ingest.listen)"),
        format!("cannot listen on udp 127.0.0.1:{udp_port} (sources.plant.udp)"),
        format!("cannot listen on tcp 127.0.0.1:{tcp_port} (sources.plant.tcp)"),
        "3 of 4 listeners cannot be bound".to_string(),
    ] {
        assert!(f.stderr.contains(&want), "{want} in\n{}", f.stderr);
    }
    assert!(!f.stderr.contains("admin.listen"), "{}", f.stderr);

    // With the ports let go, every listener binds.
    drop((tcp, udp));
    let f = check(true);
    assert_code(f.status, 0, &f.stderr);
    assert!(
        f.stdout.contains("4 listeners bound and closed again"),
        "{}",
        f.stdout
    );
}

#[test]
fn plain_http_on_a_tls_port_gets_a_clear_refusal() {
    let sb = Sandbox::new();
    std::fs::create_dir_all(sb.file("pki")).unwrap();
    let pki = crate::util::http::TestPki::generate(&sb.file("pki"));
    let port = free_port();
    let config = sb.write_config(&format!(
        "data_dir: data\n\
         log: {{ format: json }}\n\
         admin: {{ listen: \"127.0.0.1:0\", tls: {{ cert_file: {cert}, key_file: {key} }} }}\n\
         ingest: {{ listen: \"127.0.0.1:{port}\", tls: {{ cert_file: {cert}, key_file: {key} }} }}\n\
         streams:\n  logs: {{}}\n",
        cert = quote(pki.server_cert.display().to_string()),
        key = quote(pki.server_key.display().to_string()),
    ));
    let agent = Proc::start(&config);
    let listening = agent.wait_for_event(secs(10), "admin endpoint listening", |e| {
        is(e, "admin endpoint listening")
    });
    let admin: SocketAddr = field(&listening, "listen").parse().expect("an address");
    let ingest = SocketAddr::from(([127, 0, 0, 1], port));
    for (addr, request) in [
        (
            admin,
            "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n".to_string(),
        ),
        (
            ingest,
            format!(
                "POST {} HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{{}}",
                path("logs")
            ),
        ),
    ] {
        let answer = half_closed(addr, request.as_bytes());
        assert!(
            answer.starts_with("HTTP/1.1 400 Bad Request\r\n")
                && answer.contains("this port speaks https"),
            "{addr}: {answer:?}"
        );
    }
    for name in ["admin", "ingest"] {
        agent.wait_for_event(secs(10), "the refusal logged", |e| {
            field(e, "message")
                == format!(
                    "{name}: plain HTTP request on the TLS port refused (this port speaks https)"
                )
        });
    }
    assert!(
        !agent.stderr().contains("InvalidContentType"),
        "{}",
        agent.stderr()
    );
}

/// Whether `s` has bytes to read now (an answer arrived), without waiting.
fn answered(s: &TcpStream) -> bool {
    s.set_nonblocking(true).expect("nonblocking");
    let there = matches!(s.peek(&mut [0u8; 1]), Ok(n) if n > 0);
    s.set_nonblocking(false).expect("blocking");
    there
}

#[test]
fn tap_viewers_keep_to_their_own_share_and_health_checks_are_answered_at_once() {
    // More viewers than the admin endpoint's 64 connections, each one long poll waiting 5 s for
    // records of a stream nothing is appended to.
    const VIEWERS: usize = 70;
    const TAPS: usize = 32;
    let mut a = start("info", "", "streams: { logs: {} }\n");
    let open = |n: usize| -> Vec<TcpStream> {
        (0..n)
            .map(|_| {
                let mut s = TcpStream::connect(a.admin).expect("connect");
                s.write_all(b"GET /-/tap/logs?after=0&wait_ms=5000 HTTP/1.1\r\nHost: x\r\n\r\n")
                    .expect("send");
                s
            })
            .collect()
    };
    let answered_now = |viewers: &[TcpStream], want: usize| {
        poll(secs(30), || {
            let n = viewers.iter().filter(|s| answered(s)).count();
            (n >= want).then_some(n)
        })
    };
    // As many as there are connections: the viewers past the taps' share are answered at once.
    let mut viewers = open(64);
    let refused = answered_now(&viewers, 64 - TAPS);
    assert_eq!(refused, Some(64 - TAPS), "{}", a.proc.stderr());
    // More: each closes a refused one (idle) for itself, and is refused in turn.
    viewers.extend(open(VIEWERS - 64));
    let refused = answered_now(&viewers, VIEWERS - TAPS);
    assert_eq!(refused, Some(VIEWERS - TAPS), "{}", a.proc.stderr());
    // A health check is answered while every admitted viewer still waits (it waits behind none
    // of them: before, it waited for a viewer's poll to end, 5 s).
    let mut health = Client::new(a.admin);
    health.timeout = secs(20);
    expect(health.request("GET", "/healthz", &[], None), 200);
    let waiting = viewers.iter().filter(|s| !answered(s)).count();
    assert_eq!(
        waiting, TAPS,
        "viewers still waiting when /healthz answered"
    );
    // Then each admitted viewer gets its (empty) answer, the others a clear refusal.
    let (mut ok, mut busy) = (0, 0);
    for mut s in viewers {
        s.set_read_timeout(Some(secs(20))).expect("timeout");
        let mut head = [0u8; 12];
        s.read_exact(&mut head).expect("an answer");
        match &head {
            b"HTTP/1.1 200" => ok += 1,
            b"HTTP/1.1 503" => busy += 1,
            other => panic!("{:?}", String::from_utf8_lossy(other)),
        }
    }
    assert_eq!((ok, busy), (TAPS, VIEWERS - TAPS));
    a.stop();
}
