//! The `syslog` source against real senders: util-linux `logger` (UDP and TCP, RFC 3164 and RFC
//! 5424, octet counting and newline framing) and Debian's `rsyslog` forwarding over TCP; a TCP
//! sender paused (not dropped) by a full `block` stream, where UDP messages are dropped and
//! counted instead; a kill -9 of colibri during a TCP flood, which loses only what was read and not
//! committed plus what the kernel held, never a committed record, and repeats nothing. Records are checked where they arrive: the test receiver, each job
//! counted once by its idempotency key.

use std::collections::HashSet;
use std::io::Write;
use std::net::TcpStream;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use serde_json::Value;

use crate::tsdb::free_port;
use crate::util::http::{Mode, Receiver};
use crate::util::{Proc, Sandbox, field, finish, poll, quote, secs, stop};

/// A `logs` stream (`stream` adds settings to it) delivered to a receiver, fed by a syslog
/// source `plant` on `port` (TCP and UDP) with `source` settings (`, key: value` pairs).
fn config(
    sb: &Sandbox,
    rx: &Receiver,
    port: u16,
    stream: &str,
    source: &str,
) -> std::path::PathBuf {
    sb.write_config(&format!(
        r#"data_dir: data
shutdown_grace: 2s
log: {{ format: json }}
sinks:
  up:
    type: http
    url: {url}
    retry: {{ base: 100ms, cap: 200ms }}
    link: {{ down_after: 2, backoff_base: 50ms, backoff_cap: 200ms }}
streams:
  logs: {{ sink: up, batch: {{ max_records: 1000, linger: 20ms }}{stream} }}
sources:
  plant: {{ type: syslog, stream: logs, udp: "127.0.0.1:{port}", tcp: "127.0.0.1:{port}"{source} }}
"#,
        url = quote(rx.url("/logs")),
    ))
}

/// Starts colibri and waits until both listeners are bound.
fn start(config: &std::path::Path) -> Proc {
    let agent = Proc::start(config);
    agent.wait_until(secs(30), "both syslog listeners bound", || {
        agent
            .events_where(|e| field(e, "message") == "syslog listening")
            .len()
            >= 2
    });
    agent
}

/// Every record delivered, each job once (a job sent again after a crash has the same key).
pub(crate) fn delivered(rx: &Receiver) -> Vec<Value> {
    let mut keys = HashSet::new();
    let mut out = Vec::new();
    for r in rx.requests() {
        if !r.status.is_some_and(|s| (200..300).contains(&s)) {
            continue;
        }
        if !keys.insert(r.idempotency_key.clone().expect("an Idempotency-Key")) {
            continue;
        }
        for t in r.records() {
            out.push(serde_json::from_str(&t).unwrap_or_else(|e| panic!("{e}: {t}")));
        }
    }
    out
}

pub(crate) fn wait_delivered(rx: &Receiver, agent: &Proc, n: usize, limit: Duration) -> Vec<Value> {
    let mut last = Vec::new();
    if poll(limit, || {
        last = delivered(rx);
        (last.len() >= n).then_some(())
    })
    .is_none()
    {
        panic!(
            "{} of {n} records arrived within {limit:?}: {:?}\nstderr:\n{}",
            last.len(),
            last.iter().take(3).collect::<Vec<_>>(),
            agent.stderr()
        );
    }
    last
}

fn logger(port: u16, args: &[&str], message: &str) {
    let mut cmd = Command::new("logger");
    cmd.args(["-n", "127.0.0.1", "-P", &port.to_string()])
        .args(args)
        .arg(message);
    let f = finish(cmd, secs(10));
    assert!(f.status.success(), "logger {args:?}: {}", f.stderr);
}

/// The one record whose message is `m`.
fn by_message<'a>(records: &'a [Value], m: &str) -> &'a Value {
    let found: Vec<&Value> = records.iter().filter(|r| r["message"] == m).collect();
    assert_eq!(found.len(), 1, "records with message {m:?}: {found:?}");
    found[0]
}

/// The `syslog summary` event of the stop.
fn summary(agent: &Proc) -> Value {
    agent
        .events_where(|e| field(e, "message") == "syslog summary")
        .pop()
        .unwrap_or_else(|| panic!("no syslog summary:\n{}", agent.stderr()))
}

#[test]
fn logger_over_udp_and_tcp_in_both_formats_is_parsed_into_fields() {
    let sb = Sandbox::new();
    let rx = Receiver::start();
    let port = free_port();
    let cfg = config(
        &sb,
        &rx,
        port,
        "",
        r#", min_severity: info, exclude_lines: ["secret"], labels: { site: north }"#,
    );
    let agent = start(&cfg);
    let host = crate::util::hostname();
    logger(
        port,
        &[
            "--udp",
            "--rfc5424",
            "-t",
            "plc",
            "--id=4242",
            "-p",
            "local3.warning",
            "--msgid",
            "M7",
            "--sd-id",
            "line@32473",
            "--sd-param",
            "speed=\"12\"",
        ],
        "udp rfc5424",
    );
    logger(
        port,
        &["--udp", "--rfc3164", "-t", "valve", "-p", "daemon.notice"],
        "udp rfc3164",
    );
    logger(
        port,
        &[
            "--tcp",
            "--rfc5424",
            "--octet-count",
            "-t",
            "drive",
            "-p",
            "user.err",
        ],
        "tcp octet-counted rfc5424",
    );
    logger(
        port,
        &["--tcp", "--rfc3164", "-t", "pump", "-p", "local7.info"],
        "tcp newline rfc3164",
    );
    // Filtered: below min_severity, and matching exclude_lines.
    logger(
        port,
        &["--tcp", "-t", "chatty", "-p", "user.debug"],
        "tcp debug",
    );
    logger(
        port,
        &["--tcp", "-t", "vault", "-p", "user.err"],
        "a secret line",
    );
    // Not syslog at all: kept whole, marked.
    let mut raw = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    raw.write_all(b"plain text from a script\n").expect("write");
    drop(raw);
    let records = wait_delivered(&rx, &agent, 5, secs(30));

    let r = by_message(&records, "udp rfc5424");
    assert_eq!(r["app"], "plc");
    assert_eq!(r["procid"], "4242");
    assert_eq!(r["msgid"], "M7");
    assert_eq!(r["facility"], "local3");
    assert_eq!(r["severity"], "warning");
    assert_eq!(r["protocol"], "rfc5424");
    assert_eq!(r["host"], host.as_str());
    assert_eq!(r["structured_data"]["line@32473"]["speed"], "12");
    assert_eq!(r["labels"]["site"], "north");
    assert!(r["peer"].as_str().unwrap().starts_with("127.0.0.1:"), "{r}");
    let t = chrono::DateTime::parse_from_rfc3339(r["time"].as_str().unwrap()).unwrap();
    assert!(
        (chrono::Utc::now() - t.to_utc()).num_seconds().abs() < 120,
        "{r}"
    );

    let r = by_message(&records, "udp rfc3164");
    assert_eq!(
        (
            r["app"].as_str(),
            r["facility"].as_str(),
            r["severity"].as_str()
        ),
        (Some("valve"), Some("daemon"), Some("notice"))
    );
    assert_eq!(r["protocol"], "rfc3164");
    let t = chrono::DateTime::parse_from_rfc3339(r["time"].as_str().unwrap()).unwrap();
    assert!(
        (chrono::Utc::now() - t.to_utc()).num_seconds().abs() < 120,
        "local time read as such: {r}"
    );

    let r = by_message(&records, "tcp octet-counted rfc5424");
    assert_eq!(
        (
            r["app"].as_str(),
            r["facility"].as_str(),
            r["severity"].as_str()
        ),
        (Some("drive"), Some("user"), Some("err"))
    );
    let r = by_message(&records, "tcp newline rfc3164");
    assert_eq!(
        (
            r["app"].as_str(),
            r["facility"].as_str(),
            r["severity"].as_str()
        ),
        (Some("pump"), Some("local7"), Some("info"))
    );
    let r = by_message(&records, "plain text from a script");
    assert_eq!(r["unparsed"], true);

    let agent = stop(agent);
    let records = delivered(&rx);
    assert_eq!(
        records.len(),
        5,
        "the filtered two never arrive: {records:?}"
    );
    let s = summary(&agent);
    assert_eq!(
        (
            s["messages"].as_u64(),
            s["filtered"].as_u64(),
            s["unparsed"].as_u64()
        ),
        (Some(7), Some(2), Some(1)),
        "{s}"
    );
    assert_eq!(
        (s["records_appended"].as_u64(), s["records_lost"].as_u64()),
        (Some(5), Some(0)),
        "{s}"
    );
}

#[test]
fn rsyslog_forwards_over_tcp_with_octet_counting_and_every_line_arrives_parsed() {
    let sb = Sandbox::new();
    let rx = Receiver::start();
    let port = free_port();
    let cfg = config(&sb, &rx, port, "", "");
    let agent = start(&cfg);
    // rsyslog: a TCP input the test's logger writes to, forwarded to colibri as RFC 5424 with
    // octet counting (how a plant's central rsyslog relays), with a disk-assisted queue as
    // operators configure it.
    let rs_port = free_port();
    let work = sb.file("rsyslog");
    std::fs::create_dir_all(&work).unwrap();
    let conf = sb.file("rsyslog.conf");
    std::fs::write(
        &conf,
        format!(
            r#"global(workDirectory="{work}")
module(load="imtcp")
input(type="imtcp" address="127.0.0.1" port="{rs_port}")
action(type="omfwd" target="127.0.0.1" port="{port}" protocol="tcp" TCP_Framing="octet-counted"
       template="RSYSLOG_SyslogProtocol23Format" action.resumeRetryCount="-1")
"#,
            work = work.display()
        ),
    )
    .unwrap();
    let mut cmd = Command::new("rsyslogd");
    cmd.arg("-n")
        .arg("-f")
        .arg(&conf)
        .arg("-i")
        .arg(sb.file("rsyslog.pid"));
    let rsyslog = Proc::spawn(cmd);
    let up = poll(secs(20), || TcpStream::connect(("127.0.0.1", rs_port)).ok());
    assert!(
        up.is_some(),
        "rsyslogd did not listen:\n{}",
        rsyslog.stderr()
    );
    let lines: String = (1..=2000).map(|i| format!("reading {i}\n")).collect();
    let mut cmd = Command::new("logger");
    cmd.args([
        "-n",
        "127.0.0.1",
        "-P",
        &rs_port.to_string(),
        "--tcp",
        "-t",
        "meter",
        "-p",
        "local0.notice",
    ]);
    let f = crate::util::finish_with_stdin(&sb, cmd, &lines, secs(30));
    assert!(f.status.success(), "logger: {}", f.stderr);
    let mut ours = Vec::new();
    poll(secs(60), || {
        ours = delivered(&rx)
            .into_iter()
            .filter(|r| r["app"] == "meter")
            .collect();
        (ours.len() >= 2000).then_some(())
    });
    assert_eq!(
        ours.len(),
        2000,
        "stderr:\n{}\nrsyslog:\n{}",
        agent.stderr(),
        rsyslog.stderr()
    );
    let host = crate::util::hostname();
    for (i, r) in ours.iter().enumerate() {
        assert_eq!(r["message"], format!("reading {}", i + 1), "in order: {r}");
        assert_eq!(
            (r["facility"].as_str(), r["severity"].as_str()),
            (Some("local0"), Some("notice")),
            "{r}"
        );
        assert_eq!(r["protocol"], "rfc5424", "{r}");
        assert_eq!(r["host"], host.as_str(), "{r}");
    }
    drop(rsyslog);
    let agent = stop(agent);
    assert_eq!(summary(&agent)["framing_errors"], 0);
}

/// Writes numbered lines (`<14>1 - gw feeder - - - <tag> <n>`) from `from` to `to` on one
/// connection as fast as the socket takes them; `written` is the last line fully written.
fn feeder(
    port: u16,
    tag: &'static str,
    from: u64,
    to: u64,
    written: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Result<(), String>> {
    std::thread::spawn(move || {
        let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
        let mut block = Vec::new();
        let mut n = from;
        while n <= to {
            block.clear();
            let last = (n + 99).min(to);
            for i in n..=last {
                writeln!(block, "<14>1 - gw feeder - - - {tag} {i}").unwrap();
            }
            s.write_all(&block)
                .map_err(|e| format!("after line {}: {e}", written.load(Ordering::SeqCst)))?;
            written.store(last, Ordering::SeqCst);
            n = last + 1;
        }
        done.store(true, Ordering::SeqCst);
        Ok(())
    })
}

fn seqs(records: &[Value], tag: &str) -> Vec<u64> {
    records
        .iter()
        .filter_map(|r| {
            let (t, n) = r["message"].as_str()?.split_once(' ')?;
            (t == tag).then(|| n.parse().expect("a number"))
        })
        .collect()
}

#[test]
fn a_full_block_stream_pauses_a_tcp_sender_and_loses_nothing() {
    let sb = Sandbox::new();
    let rx = Receiver::start();
    rx.set_mode(Mode::Refuse);
    let port = free_port();
    let cfg = config(&sb, &rx, port, ", max_jobs: 20, when_full: block", "");
    let agent = start(&cfg);
    // 600,000 lines (~20 MB): more than the stream (20 jobs of 1,000), the kernel's socket
    // buffers (up to 6 MB and 4 MB here) and colibri's channel hold.
    const N: u64 = 600_000;
    let (written, done) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let sender = feeder(port, "p", 1, N, Arc::clone(&written), Arc::clone(&done));
    agent.wait_for_event(secs(60), "the stream full and reading paused", |e| {
        field(e, "message").starts_with("stream full")
    });
    // The sender is held: its count stops short of the end and stays there.
    let held = poll(secs(30), || {
        let a = written.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(500));
        let b = written.load(Ordering::SeqCst);
        (a == b && !done.load(Ordering::SeqCst)).then_some(b)
    })
    .expect("the sender was paused");
    assert!(held < N, "held at {held}");
    rx.set_mode(Mode::Accept);
    let records = wait_delivered(&rx, &agent, N as usize, secs(180));
    assert!(sender.join().unwrap().is_ok());
    assert_eq!(
        seqs(&records, "p"),
        (1..=N).collect::<Vec<_>>(),
        "each once, in order"
    );
    let agent = stop(agent);
    let s = summary(&agent);
    assert_eq!(
        (
            s["records_dropped"].as_u64(),
            s["records_lost"].as_u64(),
            s["udp_dropped"].as_u64()
        ),
        (Some(0), Some(0), Some(0)),
        "{s}"
    );
}

/// The most a TCP connection may hold that the sender wrote and the receiver never committed:
/// the sender's send buffer, the receiver's receive buffer (their kernel maximums) and what
/// colibri read and had not yet committed (its 8 MiB budget of records, which are larger than
/// the lines they come from, and one read beyond it).
fn in_flight_bound() -> u64 {
    let max = |f: &str| -> u64 {
        std::fs::read_to_string(f)
            .ok()
            .and_then(|t| t.split_whitespace().last()?.parse().ok())
            .unwrap_or(6 << 20)
    };
    max("/proc/sys/net/ipv4/tcp_wmem") + max("/proc/sys/net/ipv4/tcp_rmem") + (8 << 20) + (1 << 20)
}

#[test]
fn kill_9_during_a_tcp_flood_loses_only_what_was_in_flight_and_repeats_nothing() {
    let sb = Sandbox::new();
    let rx = Receiver::start();
    let port = free_port();
    let cfg = config(&sb, &rx, port, "", "");
    let mut agent = start(&cfg);
    const N: u64 = 2_000_000;
    let (written, done) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let sender = feeder(port, "a", 1, N, Arc::clone(&written), Arc::clone(&done));
    poll(secs(60), || {
        (seqs(&delivered(&rx), "a").len() >= 20_000).then_some(())
    })
    .expect("records flowing");
    agent.signal(libc::SIGKILL);
    agent.wait_exit(secs(10));
    let err = sender.join().unwrap().expect_err("the connection broke");
    assert!(
        !done.load(Ordering::SeqCst),
        "the flood outlasted colibri: {err}"
    );
    let sent = written.load(Ordering::SeqCst);

    // Restarted: what was committed is delivered (again, under the same keys, where its
    // delivery was cut), and a new connection's lines all arrive.
    let agent = start(&cfg);
    let (w2, d2) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    feeder(port, "b", 1, 10_000, w2, Arc::clone(&d2))
        .join()
        .unwrap()
        .expect("second sender");
    let mut records = Vec::new();
    poll(secs(60), || {
        records = delivered(&rx);
        (seqs(&records, "b").len() >= 10_000).then_some(())
    });
    assert_eq!(
        seqs(&records, "b"),
        (1..=10_000).collect::<Vec<_>>(),
        "each once, in order"
    );
    let a = seqs(&records, "a");
    let kept = a.len() as u64;
    assert_eq!(
        a,
        (1..=kept).collect::<Vec<_>>(),
        "what survived is a prefix, each once"
    );
    // Line bytes: "<14>1 - gw feeder - - - a " plus the number and a newline.
    let lost_bytes = (sent.saturating_sub(kept)) * 34;
    assert!(
        lost_bytes <= in_flight_bound(),
        "{} lines ({lost_bytes} bytes) written and not kept, more than could be in flight ({} bytes)",
        sent - kept,
        in_flight_bound()
    );
    eprintln!(
        "kill -9 in a flood: {sent} lines written, {kept} kept, {} lost in flight",
        sent.saturating_sub(kept)
    );
    let agent = stop(agent);
    assert_eq!(summary(&agent)["records_lost"], 0);
}

#[test]
fn udp_messages_a_full_block_stream_cannot_take_are_dropped_and_counted() {
    let sb = Sandbox::new();
    let rx = Receiver::start();
    rx.set_mode(Mode::Refuse);
    let port = free_port();
    let cfg = config(&sb, &rx, port, ", max_jobs: 5, when_full: block", "");
    let agent = start(&cfg);
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
    // 5 jobs of 1,000 fill the stream; then the appender waits and the channel fills.
    let mut sent = 0u64;
    let paused = poll(secs(60), || {
        for _ in 0..2000 {
            sent += 1;
            let m = format!("<14>1 - gw probe - - - u {sent}");
            udp.send_to(m.as_bytes(), ("127.0.0.1", port))
                .expect("send");
        }
        std::thread::sleep(Duration::from_millis(20));
        (!agent
            .events_where(|e| field(e, "message").starts_with("stream full"))
            .is_empty())
        .then_some(())
    });
    assert!(
        paused.is_some(),
        "the stream never filled:\n{}",
        agent.stderr()
    );
    // More, until what was read and waits for room passes the source's budget (8 MiB) and the
    // rest is dropped: how much that takes depends on how fast the stream filled.
    let listening = agent.wait_for_event(secs(10), "the admin endpoint", |e| {
        field(e, "message") == "admin endpoint listening"
    });
    let admin: std::net::SocketAddr = field(&listening, "listen").parse().unwrap();
    let mut metrics = crate::util::client::Client::new(admin);
    let dropping = poll(secs(60), || {
        for _ in 0..5000 {
            sent += 1;
            let m = format!("<14>1 - gw probe - - - u {sent}");
            udp.send_to(m.as_bytes(), ("127.0.0.1", port))
                .expect("send");
        }
        let page = metrics.request("GET", "/metrics", &[], None).ok()?.text();
        page.lines()
            .find_map(|l| l.strip_prefix("colibri_syslog_udp_dropped_total{source=\"plant\"} "))
            .is_some_and(|v| v != "0")
            .then_some(())
    });
    assert!(
        dropping.is_some(),
        "no UDP message dropped after {sent} sent"
    );
    rx.set_mode(Mode::Accept);
    let agent = stop(agent);
    let s = summary(&agent);
    let n = |k: &str| s[k].as_u64().unwrap_or_else(|| panic!("{k} in {s}"));
    assert!(n("udp_dropped") > 0, "{s}");
    // Every message read was stored, dropped for want of room, or lost at the stop, and counted.
    assert_eq!(
        n("messages"),
        n("records_appended") + n("udp_dropped") + n("records_lost"),
        "{s}"
    );
    assert!(n("messages") <= sent, "{s}");
    assert!(
        agent
            .events_where(|e| field(e, "message").contains("can never be stored"))
            .is_empty(),
        "appends cut to what the stream takes: {}",
        agent.stderr()
    );
}

/// A TLS client of the test PKI: trusts `ca`, presents `client` (certificate and key files) when
/// given; sends `lines` and closes. The result of the write and close (a server that refuses
/// the client shows up here or only as silence, depending on the TLS version).
fn tls_send(
    port: u16,
    ca: &std::path::Path,
    client: Option<(&std::path::Path, &std::path::Path)>,
    lines: &str,
) -> std::io::Result<()> {
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::ServerName;
    let config = crate::util::http::client_config(ca, client);
    let name = ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(config, name).unwrap();
    let sock = TcpStream::connect(("127.0.0.1", port))?;
    sock.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut tls = rustls::StreamOwned::new(conn, sock);
    tls.write_all(lines.as_bytes())?;
    tls.flush()?;
    tls.conn.send_close_notify();
    tls.flush()?;
    // Wait for the server's answer to the close (or its refusal).
    let mut rest = Vec::new();
    std::io::Read::read_to_end(&mut tls, &mut rest).map(|_| ())
}

#[test]
fn tls_on_the_tcp_listener_with_and_without_client_certificates() {
    let sb = Sandbox::new();
    std::fs::create_dir_all(sb.file("pki")).unwrap();
    let pki = crate::util::http::TestPki::generate(&sb.file("pki"));
    let rx = Receiver::start();
    let (port, mport) = (free_port(), free_port());
    let config = sb.write_config(&format!(
        r#"data_dir: data
log: {{ format: json }}
sinks:
  up: {{ type: http, url: {url} }}
streams:
  logs: {{ sink: up, batch: {{ linger: 20ms }} }}
sources:
  secure: {{ type: syslog, stream: logs, tcp: "127.0.0.1:{port}", tls: {{ cert_file: {cert}, key_file: {key} }} }}
  mutual: {{ type: syslog, stream: logs, tcp: "127.0.0.1:{mport}", tls: {{ cert_file: {cert}, key_file: {key}, client_ca_file: {ca} }} }}
"#,
        url = quote(rx.url("/logs")),
        cert = quote(pki.server_cert.display().to_string()),
        key = quote(pki.server_key.display().to_string()),
        ca = quote(pki.ca.display().to_string()),
    ));
    let agent = start(&config);
    let check = finish(
        {
            let mut c = crate::util::colibri();
            c.arg("check").arg("--config").arg(&config);
            c
        },
        secs(30),
    );
    assert!(
        check.stdout.contains("TLS, at most 256 connections"),
        "{}",
        check.stdout
    );

    tls_send(port, &pki.ca, None, "<13>1 - h app - - - over tls\n").expect("a TLS client");
    let client = Some((pki.client_cert.as_path(), pki.client_key.as_path()));
    tls_send(mport, &pki.ca, client, "26 <13>1 - h app - - - mutual")
        .expect("a client with a certificate");
    // Refused: plain text on a TLS port, no client certificate, one from another CA.
    let mut plain = TcpStream::connect(("127.0.0.1", port)).unwrap();
    plain
        .write_all(b"<13>1 - h app - - - plain on tls\n")
        .unwrap();
    drop(plain);
    let _ = tls_send(mport, &pki.ca, None, "<13>1 - h app - - - no certificate\n");
    let other = Some((
        pki.other_client_cert.as_path(),
        pki.other_client_key.as_path(),
    ));
    let _ = tls_send(mport, &pki.ca, other, "<13>1 - h app - - - other ca\n");
    wait_delivered(&rx, &agent, 2, secs(30));
    let agent = stop(agent);
    let messages: Vec<String> = delivered(&rx)
        .iter()
        .map(|r| r["message"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(messages, ["over tls", "mutual"]);
    let failures: u64 = agent
        .events_where(|e| field(e, "message") == "syslog summary")
        .iter()
        .map(|s| s["tls_failures"].as_u64().unwrap())
        .sum();
    assert_eq!(failures, 3, "{}", agent.stderr());
}

#[test]
fn a_reload_while_the_block_stream_is_full_rebinds_at_once_and_loses_nothing_read() {
    let sb = Sandbox::new();
    let rx = Receiver::start();
    rx.set_mode(Mode::Refuse);
    let port = free_port();
    let stream = ", max_jobs: 20, when_full: block";
    let cfg = config(&sb, &rx, port, stream, "");
    let agent = start(&cfg);
    let (written, done) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let sender = feeder(
        port,
        "a",
        1,
        600_000,
        Arc::clone(&written),
        Arc::clone(&done),
    );
    agent.wait_for_event(secs(60), "the stream full and reading paused", |e| {
        field(e, "message").starts_with("stream full")
    });
    // The source changes (a label): it is restarted while its appender waits for room.
    let cfg = config(&sb, &rx, port, stream, ", labels: { v: \"2\" }");
    agent.signal(libc::SIGHUP);
    agent.wait_until(secs(30), "the new listener bound", || {
        agent
            .events_where(|e| field(e, "message") == "syslog listening")
            .len()
            >= 3
    });
    let Err(err) = sender.join().unwrap() else {
        panic!(
            "the old connection was not closed ({} written):\n{}",
            written.load(Ordering::SeqCst),
            agent.stderr()
        );
    };
    let sent = written.load(Ordering::SeqCst);
    let (w2, d2) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let second = feeder(port, "b", 1, 1_000, w2, d2);
    rx.set_mode(Mode::Accept);
    assert!(second.join().unwrap().is_ok());
    // What the old source read (its summary, logged as it ended) is all stored in the end, by
    // its appender, which outlived it.
    let read = summary(&agent)["messages"].as_u64().expect("messages");
    let mut records = Vec::new();
    poll(secs(120), || {
        records = delivered(&rx);
        (seqs(&records, "b").len() >= 1_000 && seqs(&records, "a").len() as u64 >= read)
            .then_some(())
    });
    let a = seqs(&records, "a");
    let kept = a.len() as u64;
    assert_eq!(kept, read, "every line the old source read");
    assert_eq!(
        a,
        (1..=kept).collect::<Vec<_>>(),
        "what was read is kept, in order, each once ({err})"
    );
    assert_eq!(seqs(&records, "b"), (1..=1_000).collect::<Vec<_>>());
    assert!(
        sent.saturating_sub(kept) * 34 <= in_flight_bound(),
        "{sent} written, {kept} kept"
    );
    let agent = stop(agent);
    let lost: u64 = agent
        .events_where(|e| field(e, "message") == "syslog summary")
        .iter()
        .map(|s| s["records_lost"].as_u64().unwrap())
        .sum();
    assert_eq!(lost, 0, "{}", agent.stderr());
    assert!(
        records
            .iter()
            .filter(|r| seqs(std::slice::from_ref(r), "b").len() == 1)
            .all(|r| r["labels"]["v"] == "2")
    );
    drop(cfg);
}

/// Reads until the peer closes (`Ok(0)`), within `limit`: whether it closed.
fn closed_within(s: &mut TcpStream, limit: Duration) -> bool {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 64];
    loop {
        match std::io::Read::read(s, &mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            // A reset is a close too; a timeout is not.
            Err(e) => return e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }
}

#[test]
fn listener_limits_connections_idle_senders_and_broken_frames() {
    let sb = Sandbox::new();
    let rx = Receiver::start();
    let port = free_port();
    let cfg = config(
        &sb,
        &rx,
        port,
        "",
        ", max_connections: 1, idle_timeout: 1s, max_message_bytes: 16",
    );
    let agent = start(&cfg);
    // One connection is served; a newcomer over max_connections closes the one idle longest
    // (the first) and is served in its place.
    let mut first = TcpStream::connect(("127.0.0.1", port)).unwrap();
    first.write_all(b"<13>1 - h a - - - x\n").unwrap();
    wait_delivered(&rx, &agent, 1, secs(30));
    let mut second = TcpStream::connect(("127.0.0.1", port)).unwrap();
    assert!(
        closed_within(&mut first, secs(10)),
        "idle longest: closed for a newcomer"
    );
    second.write_all(b"<13>1 - h a - - - y\n").unwrap();
    wait_delivered(&rx, &agent, 2, secs(30));
    // The second, silent past idle_timeout, is closed; its slot serves the next sender.
    assert!(closed_within(&mut second, secs(10)), "idle: closed");
    // A message past max_message_bytes is cut and marked; a broken length prefix ends the
    // connection after what came before it.
    let mut third = TcpStream::connect(("127.0.0.1", port)).unwrap();
    third
        .write_all(b"<13>1 - h a - - - a long message\n5 <13>y12345678901 z")
        .unwrap();
    assert!(
        closed_within(&mut third, secs(10)),
        "a broken frame: closed"
    );
    let records = wait_delivered(&rx, &agent, 4, secs(30));
    assert_eq!(records[2]["truncated"], true, "{records:?}");
    assert_eq!(records[2]["message"], "<13>1 - h a - - ", "{records:?}");
    assert_eq!(records[3]["message"], "<13>y", "{records:?}");
    let agent = stop(agent);
    let s = summary(&agent);
    let n = |k: &str| s[k].as_u64().unwrap_or_else(|| panic!("{k} in {s}"));
    assert_eq!(
        (n("connections"), n("connections_closed_idle")),
        (3, 1),
        "{s}"
    );
    // The first two messages (19 bytes) were over the 16 too.
    assert_eq!((n("framing_errors"), n("truncated")), (1, 3), "{s}");
}

/// Opens `n` TCP connections to `port` that send nothing, and keeps them.
fn idle_sockets(port: u16, n: usize) -> Vec<TcpStream> {
    (0..n)
        .map(|i| {
            TcpStream::connect(("127.0.0.1", port))
                .unwrap_or_else(|e| panic!("idle socket {i} of {n}: {e}"))
        })
        .collect()
}

#[test]
fn idle_syslog_connections_do_not_lock_out_a_sender() {
    // Four times the default max_connections (256) of idle sockets on a plain and a TLS listener
    // (2,000 descriptors here, 2,000 in colibri: within the 20,000 the test machines allow).
    const IDLE: usize = 1000;
    let sb = Sandbox::new();
    std::fs::create_dir_all(sb.file("pki")).unwrap();
    let pki = crate::util::http::TestPki::generate(&sb.file("pki"));
    let rx = Receiver::start();
    let (port, tport) = (free_port(), free_port());
    let config = sb.write_config(&format!(
        r#"data_dir: data
log: {{ format: json }}
sinks:
  up: {{ type: http, url: {url} }}
streams:
  logs: {{ sink: up, batch: {{ linger: 20ms }} }}
sources:
  plain: {{ type: syslog, stream: logs, tcp: "127.0.0.1:{port}" }}
  secure: {{ type: syslog, stream: logs, tcp: "127.0.0.1:{tport}", tls: {{ cert_file: {cert}, key_file: {key} }} }}
"#,
        url = quote(rx.url("/logs")),
        cert = quote(pki.server_cert.display().to_string()),
        key = quote(pki.server_key.display().to_string()),
    ));
    let agent = start(&config);
    let held = idle_sockets(port, IDLE);
    let held_tls = idle_sockets(tport, IDLE);
    // A real sender, octet-counted, while every idle socket is still open: the connection idle
    // longest is closed for it.
    logger(
        port,
        &["--tcp", "--octet-count", "--rfc5424", "-t", "app"],
        "through the idle flood",
    );
    tls_send(
        tport,
        &pki.ca,
        None,
        "<13>1 - h app - - - tls through the flood\n",
    )
    .expect("a TLS sender served while idle sockets are open");
    let records = wait_delivered(&rx, &agent, 2, secs(30));
    by_message(&records, "through the idle flood");
    by_message(&records, "tls through the flood");
    drop((held, held_tls));
    let agent = stop(agent);
    let closed: Vec<u64> = agent
        .events_where(|e| field(e, "message") == "syslog summary")
        .iter()
        .map(|s| s["connections_closed_idle"].as_u64().unwrap())
        .collect();
    // Each newcomer past the 256th closed one idle connection: 744 of the flood, and one for
    // each sender.
    assert_eq!(closed, [745, 745], "{}", agent.stderr());
}

/// A counter of the source `source`, read from the admin endpoint (`None` before it is there).
fn metric(agent: &Proc, name: &str, source: &str) -> Option<u64> {
    let e = agent.wait_for_event(secs(20), "admin endpoint listening", |e| {
        field(e, "message") == "admin endpoint listening"
    });
    let addr = field(&e, "listen").parse().expect("an address");
    let page = crate::util::client::Client::new(addr)
        .request("GET", "/metrics", &[], None)
        .ok()?
        .text();
    let prefix = format!("{name}{{source=\"{source}\"}} ");
    page.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.parse::<f64>().expect("a number") as u64)
}

#[test]
fn udp_datagrams_a_full_receive_buffer_drops_are_counted() {
    let sb = Sandbox::new();
    let rx = Receiver::start();
    let (port, big) = (free_port(), free_port());
    // `plant` asks for a 4KiB receive buffer (a few datagrams); `big` for more than the kernel's
    // cap (net.core.rmem_max, 4MiB on the test machines), which is logged.
    let cfg = config(
        &sb,
        &rx,
        port,
        "",
        &format!(
            ", receive_buffer: 4KiB }}\n  big: {{ type: syslog, stream: logs, udp: \"127.0.0.1:{big}\", receive_buffer: 1GiB"
        ),
    );
    let agent = Proc::start(&cfg);
    agent.wait_until(secs(30), "three syslog listeners bound", || {
        agent
            .events_where(|e| field(e, "message") == "syslog listening")
            .len()
            >= 3
    });
    let capped = agent.wait_for_event(secs(10), "the receive buffer capped", |e| {
        field(e, "message").starts_with("syslog udp receive buffer smaller than asked")
    });
    assert_eq!(field(&capped, "source"), "big", "{capped}");
    // A burst as fast as the test can send, far more than 4KiB holds.
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
    let sent: u64 = 5000;
    for i in 0..sent {
        let m = format!("<14>1 - gw probe - - - burst {i} {}", "x".repeat(400));
        udp.send_to(m.as_bytes(), ("127.0.0.1", port))
            .expect("send");
    }
    // Every datagram was read or counted as dropped by the kernel.
    let mut last = (0, 0);
    let accounted = poll(secs(30), || {
        let read = metric(&agent, "colibri_syslog_messages_total", "plant")?;
        let dropped = metric(
            &agent,
            "colibri_syslog_udp_receive_buffer_dropped_total",
            "plant",
        )?;
        last = (read, dropped);
        (read + dropped == sent).then_some(())
    });
    assert!(
        accounted.is_some(),
        "(read, dropped by the kernel) {last:?} of {sent} sent\n{}",
        agent.stderr()
    );
    let (read, dropped) = last;
    assert!(dropped > 0, "nothing dropped by a 4KiB buffer: {last:?}");
    // What was read was stored (the stream had room).
    let records = wait_delivered(&rx, &agent, read as usize, secs(60));
    assert_eq!(records.len() as u64 + dropped, sent);
    let agent = stop(agent);
    let s = agent
        .events_where(|e| field(e, "message") == "syslog summary" && field(e, "source") == "plant")
        .pop()
        .unwrap_or_else(|| panic!("no syslog summary:\n{}", agent.stderr()));
    assert_eq!(
        s["udp_receive_buffer_dropped"].as_u64(),
        Some(dropped),
        "{s}"
    );
}
