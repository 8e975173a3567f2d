//! Self-tests of the test HTTP receiver (`tests/util/http.rs`), driven by a tiny HTTP/1.1 client
//! written here over `std::net::TcpStream` (and rustls for the TLS cases).

use std::io::{self, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::util::Sandbox;
use crate::util::http::{CUT_AFTER, Mode, Receiver, TestPki};

const LIMIT: Duration = Duration::from_secs(10);

/// An answer: status, head (status line and headers) and body.
#[derive(Debug)]
struct Answer {
    status: u16,
    head: String,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

fn connect(port: u16) -> io::Result<TcpStream> {
    let s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(LIMIT))?;
    s.set_write_timeout(Some(LIMIT))?;
    Ok(s)
}

/// Writes one POST with a Content-Length.
fn send(s: &mut impl Write, path: &str, headers: &[(&str, &str)], body: &[u8]) -> io::Result<()> {
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (n, v) in headers {
        req.push_str(&format!("{n}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes())?;
    s.write_all(body)?;
    s.flush()
}

/// Reads one answer with a Content-Length body (every answer of the receiver has one).
fn read_answer(s: &mut impl Read) -> io::Result<Answer> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte)? == 0 {
            return Err(io::Error::new(
                ErrorKind::UnexpectedEof,
                format!("closed after {:?}", String::from_utf8_lossy(&buf)),
            ));
        }
        buf.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&buf).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::new(ErrorKind::InvalidData, head.clone()))?;
    let mut answer = Answer {
        status,
        head,
        body: Vec::new(),
    };
    let len: usize = answer
        .header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    answer.body = vec![0; len];
    s.read_exact(&mut answer.body)?;
    Ok(answer)
}

fn post(port: u16, path: &str, headers: &[(&str, &str)], body: &[u8]) -> io::Result<Answer> {
    let mut s = connect(port)?;
    send(&mut s, path, headers, body)?;
    read_answer(&mut s)
}

fn text(port: u16, body: &str) -> Answer {
    post(
        port,
        "/ingest",
        &[("Content-Type", "text/plain")],
        body.as_bytes(),
    )
    .expect("a POST")
}

#[test]
fn accept_records_lines_json_and_compressed_bodies() {
    let rx = Receiver::start();
    assert!(rx.url("/x").starts_with("http://127.0.0.1:"));
    let a = post(
        rx.port(),
        "/ingest?a=1",
        &[
            ("Content-Type", "text/plain"),
            ("Idempotency-Key", "k-1"),
            ("User-Agent", "colibri-test"),
        ],
        b"one\ntwo\n",
    )
    .unwrap();
    assert_eq!(a.status, 200);
    post(
        rx.port(),
        "/json",
        &[("Content-Type", "application/json")],
        br#"[{"a": 1}, "x" ,3]"#,
    )
    .unwrap();

    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(b"g1\ng2").unwrap();
    let gz = gz.finish().unwrap();
    let a = post(
        rx.port(),
        "/gz",
        &[("Content-Type", "text/plain"), ("Content-Encoding", "gzip")],
        &gz,
    )
    .unwrap();
    assert_eq!(a.status, 200);
    let zst = ruzstd::encoding::compress_to_vec(
        &b"z1\nz2\n"[..],
        ruzstd::encoding::CompressionLevel::Fastest,
    );
    let a = post(
        rx.port(),
        "/zst",
        &[("Content-Type", "text/plain"), ("Content-Encoding", "zstd")],
        &zst,
    )
    .unwrap();
    assert_eq!(a.status, 200);
    let a = post(
        rx.port(),
        "/bad",
        &[("Content-Encoding", "gzip")],
        b"not gzip",
    )
    .unwrap();
    assert_eq!(a.status, 400, "an undecodable body is refused");

    let records = rx.wait_records(9, LIMIT).unwrap();
    assert_eq!(
        records,
        [
            "one",
            "two",
            r#"{"a":1}"#,
            r#""x""#,
            "3",
            "g1",
            "g2",
            "z1",
            "z2"
        ]
    );
    let reqs = rx.requests();
    assert_eq!(reqs.len(), 5);
    let first = &reqs[0];
    assert_eq!(first.method, "POST");
    assert_eq!(first.path, "/ingest");
    assert_eq!(first.query.as_deref(), Some("a=1"));
    assert_eq!(first.status, Some(200));
    assert_eq!(first.idempotency_key.as_deref(), Some("k-1"));
    assert_eq!(first.user_agent.as_deref(), Some("colibri-test"));
    assert_eq!(first.content_type.as_deref(), Some("text/plain"));
    assert_eq!(first.header("IDEMPOTENCY-KEY"), Some("k-1"));
    assert_eq!(reqs[2].content_encoding.as_deref(), Some("gzip"));
    assert_eq!(reqs[2].body, b"g1\ng2");
    assert_eq!(reqs[2].wire_len, gz.len());
    assert_eq!(reqs[3].body, b"z1\nz2\n");
    assert_eq!(reqs[4].status, Some(400));
    assert!(reqs[4].decode_error.is_some());
    assert_eq!(rx.counts(), (4, 9, 8 + 18 + 5 + 6));

    let e = rx.wait_records(10, Duration::from_millis(50)).unwrap_err();
    assert!(e.contains("9 of 10"), "{e}");
}

#[test]
fn refuse_closes_the_port_and_connections_then_rebinds_the_same_port() {
    let rx = Receiver::start();
    let port = rx.port();
    // A keep-alive connection, open across the switch.
    let mut kept = connect(port).unwrap();
    send(&mut kept, "/a", &[], b"a\n").unwrap();
    assert_eq!(read_answer(&mut kept).unwrap().status, 200);

    rx.set_mode(Mode::Refuse);
    let err = TcpStream::connect(("127.0.0.1", port)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused, "{err}");
    let mut byte = [0u8; 1];
    match kept.read(&mut byte) {
        Ok(0) => {}
        Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
        other => panic!("the kept connection should be closed: {other:?}"),
    }

    rx.set_mode(Mode::Accept);
    assert_eq!(rx.port(), port);
    assert_eq!(text(port, "b\n").status, 200);
    assert_eq!(rx.wait_records(2, LIMIT).unwrap(), ["a", "b"]);
}

#[test]
fn status_retry_after_and_max_body() {
    let rx = Receiver::start();
    rx.set_mode(Mode::Status(503));
    let a = text(rx.port(), "x\n");
    assert_eq!(a.status, 503);
    assert!(String::from_utf8_lossy(&a.body).starts_with("503 Service Unavailable"));

    rx.set_mode(Mode::StatusWith(400, "bad request: field x"));
    let a = text(rx.port(), "x\n");
    assert_eq!((a.status, &a.body[..]), (400, &b"bad request: field x"[..]));

    rx.set_mode(Mode::RetryAfter {
        status: 429,
        secs: 7,
    });
    let a = text(rx.port(), "x\n");
    assert_eq!(a.status, 429);
    assert_eq!(a.header("retry-after"), Some("7"));

    rx.set_mode(Mode::MaxBody(4));
    assert_eq!(text(rx.port(), "12345\n").status, 413);
    assert_eq!(text(rx.port(), "ok\n").status, 200);

    rx.set_mode(Mode::Status(204));
    assert_eq!(text(rx.port(), "2xx\n").status, 204);

    let statuses: Vec<_> = rx.requests().iter().map(|r| r.status).collect();
    let expect = [503, 400, 429, 413, 200, 204];
    assert_eq!(statuses, expect.map(Some));
    assert_eq!(
        rx.records(),
        ["ok", "2xx"],
        "only 2xx answers accept records"
    );
}

#[test]
fn hang_answers_nothing_until_the_mode_changes() {
    let rx = Receiver::start();
    rx.set_mode(Mode::Hang);
    let mut s = connect(rx.port()).unwrap();
    send(&mut s, "/h", &[], b"h\n").unwrap();
    rx.wait_requests(1, LIMIT).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut byte = [0u8; 1];
    let e = s.read(&mut byte).expect_err("no answer while hanging");
    assert!(
        matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        "{e}"
    );

    s.set_read_timeout(Some(LIMIT)).unwrap();
    let started = Instant::now();
    rx.set_mode(Mode::Accept);
    let mut rest = Vec::new();
    match s.read_to_end(&mut rest) {
        Ok(_) => assert!(rest.is_empty(), "answered {rest:?}"),
        Err(e) => assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}"),
    }
    assert!(started.elapsed() < LIMIT);
    assert_eq!(rx.requests()[0].status, None);
    assert!(rx.records().is_empty());
}

#[test]
fn close_mid_response_sends_part_of_the_head() {
    let rx = Receiver::start();
    rx.set_mode(Mode::CloseMidResponse);
    let mut s = connect(rx.port()).unwrap();
    send(&mut s, "/c", &[], b"c\n").unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    assert_eq!(got.len(), CUT_AFTER, "{:?}", String::from_utf8_lossy(&got));
    assert!(got.starts_with(b"HTTP/1.1 200 OK\r\n"));
    assert!(rx.records().is_empty());
}

#[test]
fn counting_receiver_counts_lines_and_json_elements() {
    let rx = Receiver::start_counting();
    let line = "x".repeat(199) + "\n";
    let body = line.repeat(1000);
    for _ in 0..5 {
        assert_eq!(text(rx.port(), &body).status, 200);
    }
    text(rx.port(), "no newline at the end");
    post(
        rx.port(),
        "/j",
        &[("Content-Type", "application/json")],
        b"[1,[2,3],{\"a\":[4]}]",
    )
    .unwrap();
    let (requests, records, bytes) = rx.wait_count(5003, LIMIT).unwrap();
    assert_eq!((requests, records), (7, 5000 + 1 + 3));
    assert_eq!(bytes, 5 * 200_000 + 21 + 19);
    assert!(rx.requests().is_empty() && rx.records().is_empty());
}

fn tls_client(
    pki: &TestPki,
    identity: Option<(&std::path::Path, &std::path::Path)>,
) -> Arc<rustls::ClientConfig> {
    crate::util::http::client_config(&pki.ca, identity)
}

fn tls_post(rx: &Receiver, config: Arc<rustls::ClientConfig>) -> io::Result<Answer> {
    let name = "localhost".try_into().unwrap();
    let conn = rustls::ClientConnection::new(config, name).map_err(io::Error::other)?;
    let mut s = rustls::StreamOwned::new(conn, connect(rx.port())?);
    send(
        &mut s,
        "/tls",
        &[("Content-Type", "text/plain")],
        b"secure\n",
    )?;
    read_answer(&mut s)
}

#[test]
fn tls_with_and_without_client_certificates() {
    let sb = Sandbox::new();
    let pki = TestPki::generate(&sb.file(""));
    for name in [
        "ca.pem",
        "server.pem",
        "server.key",
        "client.pem",
        "client.key",
        "other-ca.pem",
    ] {
        assert!(sb.read(name).starts_with("-----BEGIN "), "{name}");
    }

    let open = Receiver::start_tls(&pki, false);
    assert!(open.url("/x").starts_with("https://localhost:"));
    assert_eq!(tls_post(&open, tls_client(&pki, None)).unwrap().status, 200);

    let strict = Receiver::start_tls(&pki, true);
    let own = Some((pki.client_cert.as_path(), pki.client_key.as_path()));
    assert_eq!(
        tls_post(&strict, tls_client(&pki, own)).unwrap().status,
        200
    );
    assert!(tls_post(&strict, tls_client(&pki, None)).is_err());
    let other = Some((
        pki.other_client_cert.as_path(),
        pki.other_client_key.as_path(),
    ));
    assert!(tls_post(&strict, tls_client(&pki, other)).is_err());
    let errors = strict.wait_tls_errors(2, LIMIT).unwrap();
    assert_eq!(strict.records(), ["secure"], "TLS errors: {errors:?}");
}
