//! The `opcua` source against a real OPC UA server: PyPI's asyncua (`tests/fixtures/
//! opcua_server.py`, installed by `scripts/test.sh`) on a loopback port, whose variables count
//! 1, 2, 3, ... on a schedule the test knows. Records are read where they arrive: the test
//! receiver (JSON), each job once by its idempotency key.
//!
//! Proven here: every change of a few hundred subscribed nodes arrives once, in order per node,
//! with its source timestamp, a bad status carried by name, strings and arrays typed, an unknown
//! node counted while the others go on; polling reads; the server killed (kill -9) and started
//! again with its namespace table renumbered and a node removed: data flows again from the same
//! nodes with one log line, the removed node counted unknown; colibri killed (kill -9) during a
//! burst and started again: it takes its subscription over and every change arrives (what it had
//! not acknowledged sent again by the server), none lost.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

use crate::syslog::delivered;
use crate::tsdb::free_port;
use crate::util::http::Receiver;
use crate::util::{
    Proc, Sandbox, assert_code, colibri, field, finish, poll, python, quote, secs, stop,
};

/// The test server on `port`, started again with other arguments by [`Server::restart`].
pub(crate) struct Server {
    child: Option<Child>,
    pub port: u16,
}

impl Server {
    pub(crate) fn start(port: u16, args: &[&str]) -> Server {
        let mut s = Server { child: None, port };
        s.restart(args);
        s
    }

    /// Started (again) with `COUNT PERIOD_MS [options]` (see the fixture).
    pub(crate) fn restart(&mut self, args: &[&str]) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/opcua_server.py");
        let child = Command::new(python())
            .arg(&script)
            .arg(self.port.to_string())
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 (scripts/test.sh makes a venv with asyncua)");
        self.child = Some(child);
        let port = self.port;
        poll(secs(30), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).ok()
        })
        .unwrap_or_else(|| {
            panic!("the OPC UA test server did not listen on {port}: is PyPI's asyncua installed (scripts/test.sh installs it)?")
        });
    }

    /// kill -9.
    pub(crate) fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub(crate) fn url(&self) -> String {
        format!("opc.tcp://127.0.0.1:{}/", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A config: stream `plant` delivered as NDJSON to `rx`, fed by the opcua source `plc`
/// (`source`: its settings after `type`, `url` and `stream`).
fn config(sb: &Sandbox, rx: &Receiver, source: &str) -> PathBuf {
    sb.write_config(&format!(
        r#"data_dir: data
shutdown_grace: 2s
log: {{ format: json }}
admin: {{ listen: "127.0.0.1:0" }}
sinks:
  up:
    type: http
    url: {rx_url}
    retry: {{ base: 100ms, cap: 200ms }}
streams:
  plant: {{ sink: up, batch: {{ max_records: 1000, linger: 20ms }} }}
sources:
  plc:
    type: opcua
    stream: plant
{source}
"#,
        rx_url = quote(rx.url("/in")),
    ))
}

/// `nodes:` entries for `v0` .. `v{count-1}` by namespace URI.
fn nodes(count: usize, extra: &[&str]) -> String {
    let mut out = String::from("    nodes:\n");
    for i in 0..count {
        out.push_str(&format!(
            "      - {{ id: \"nsu=urn:colibri:test;s=v{i}\" }}\n"
        ));
    }
    for e in extra {
        out.push_str(&format!("      - {e}\n"));
    }
    out
}

/// The values delivered per node, in arrival order.
fn values(records: &[Value]) -> BTreeMap<String, Vec<i64>> {
    let mut out: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for r in records {
        if let Some(v) = r["value"].as_i64() {
            out.entry(field(r, "node").to_string()).or_default().push(v);
        }
    }
    out
}

/// A gauge or counter of the source `plc` from the admin endpoint (`labels` after the source's).
fn metric(agent: &Proc, name: &str, labels: &str) -> f64 {
    let e = agent.wait_for_event(secs(20), "admin endpoint listening", |e| {
        field(e, "message") == "admin endpoint listening"
    });
    let addr = field(&e, "listen").parse().expect("an address");
    let text = crate::util::client::Client::new(addr)
        .request("GET", "/metrics", &[], None)
        .expect("GET /metrics")
        .text();
    let key = format!("{name}{{source=\"plc\"{labels}}}");
    let line = text
        .lines()
        .find(|l| l.starts_with(&key))
        .unwrap_or_else(|| panic!("no {key} in\n{text}"));
    line.rsplit(' ')
        .next()
        .expect("a value")
        .parse()
        .expect("a number")
}

fn session_event(agent: &Proc, verb: &str) -> Value {
    agent.wait_for_event(secs(60), &format!("opcua session {verb}"), |e| {
        field(e, "message").starts_with(&format!("opcua session {verb}"))
    })
}

#[test]
fn every_change_of_hundreds_of_subscribed_nodes_arrives_once_in_order_with_its_source_time() {
    const COUNT: usize = 300;
    const LAST: i64 = 20;
    let sb = Sandbox::new();
    let go = sb.file("go");
    let server = Server::start(
        free_port(),
        &[
            &COUNT.to_string(),
            "150",
            "--stop-after",
            &LAST.to_string(),
            "--start-after",
            go.to_str().expect("utf-8"),
        ],
    );
    let rx = Receiver::start();
    let extra = [
        r#"{ id: "nsu=urn:colibri:test;s=status", name: status }"#,
        r#"{ id: "nsu=urn:colibri:test;s=label", name: label, tags: { unit: none } }"#,
        r#"{ id: "nsu=urn:colibri:test;s=levels", name: levels }"#,
        r#"{ id: "nsu=urn:colibri:test;s=gone", name: gone }"#,
    ];
    let cfg = config(
        &sb,
        &rx,
        &format!(
            "    url: {}\n    publishing_interval: 100ms\n    sampling_interval: 50ms\n{}",
            server.url(),
            nodes(COUNT, &extra)
        ),
    );
    let agent = Proc::start(&cfg);
    let started = session_event(&agent, "started");
    assert!(
        field(&started, "message").contains(&format!(
            "{} of {} nodes monitored",
            COUNT + 3,
            COUNT + 4
        )),
        "{started}"
    );
    std::fs::write(&go, b"").expect("write the flag");
    agent.wait_until(secs(90), "every node's last value", || {
        let v = values(&delivered(&rx));
        v.len() == COUNT && v.values().all(|s| s.last() == Some(&LAST))
    });
    let records = delivered(&rx);
    for (node, seq) in values(&records) {
        // The initial report (0), then every change once, in order.
        let want: Vec<i64> = (0..=LAST).collect();
        assert_eq!(seq, want, "node {node}");
    }
    let mut last_time: BTreeMap<String, i64> = BTreeMap::new();
    for r in records.iter().filter(|r| r["value"].is_i64()) {
        let t = r["source_time_ms"].as_i64().expect("a source time");
        let prev = last_time
            .insert(field(r, "node").to_string(), t)
            .unwrap_or(0);
        assert!(t >= prev, "source times in order per node: {r}");
        assert_eq!(r["quality"], "good", "{r}");
        assert!(r["server_time_ms"].is_i64(), "{r}");
    }
    let one = |name: &str| {
        records
            .iter()
            .find(|r| r["node"] == name)
            .unwrap_or_else(|| panic!("no {name} record"))
            .clone()
    };
    let status = one("status");
    assert_eq!(status["status"], "BadSensorFailure", "{status}");
    assert_eq!(status["quality"], "bad", "{status}");
    assert_eq!(one("label")["value"], "hello");
    assert_eq!(one("label")["tags"]["unit"], "none");
    assert_eq!(one("levels")["value"], serde_json::json!([1.5, 2.5]));
    assert_eq!(
        metric(&agent, "colibri_opcua_source_items", ",state=\"unknown\""),
        1.0
    );
    assert_eq!(metric(&agent, "colibri_opcua_source_connected", ""), 1.0);
    let unknown = agent.events_where(|e| field(e, "message").starts_with("opcua node not read"));
    assert_eq!(unknown.len(), 1, "{unknown:?}");
    assert_eq!(field(&unknown[0], "node"), "gone");
    let agent = stop(agent);
    let summary = agent
        .events_where(|e| field(e, "message") == "opcua source summary")
        .pop()
        .expect("a summary");
    assert_eq!(summary["records_lost"], 0, "{summary}");
    drop(server);
}

#[test]
fn polled_nodes_are_read_every_interval() {
    let sb = Sandbox::new();
    let server = Server::start(free_port(), &["3", "100"]);
    let rx = Receiver::start();
    let cfg = config(
        &sb,
        &rx,
        &format!(
            "    url: {}\n    mode: poll\n    poll_interval: 200ms\n{}",
            server.url(),
            nodes(
                3,
                &[
                    r#"{ id: "nsu=urn:colibri:test;s=status", name: status }"#,
                    r#"{ id: "nsu=urn:colibri:test;s=gone", name: gone }"#,
                ]
            )
        ),
    );
    let agent = Proc::start(&cfg);
    let started = session_event(&agent, "started");
    assert!(
        field(&started, "message").contains("5 of 5 nodes polled"),
        "{started}"
    );
    agent.wait_until(secs(60), "ten polls", || {
        values(&delivered(&rx))
            .get("v2")
            .is_some_and(|s| s.len() >= 10)
    });
    let records = delivered(&rx);
    let v = values(&records);
    for (node, seq) in &v {
        assert!(seq.windows(2).all(|w| w[0] <= w[1]), "{node}: {seq:?}");
        assert!(seq.last() > seq.first(), "{node} moved on: {seq:?}");
    }
    assert!(
        records
            .iter()
            .any(|r| r["node"] == "status" && r["status"] == "BadSensorFailure"),
        "the bad status is polled too"
    );
    // The node the server does not have: one WARN, counted, no records.
    assert!(
        !records.iter().any(|r| r["node"] == "gone"),
        "no record of a node not there"
    );
    assert_eq!(
        metric(&agent, "colibri_opcua_source_items", ",state=\"unknown\""),
        1.0
    );
    let unknown = agent.events_where(|e| field(e, "message").starts_with("opcua node not read"));
    assert_eq!(unknown.len(), 1, "{unknown:?}");
    drop(stop(agent));
}

#[test]
fn a_server_killed_and_started_with_renumbered_namespaces_is_read_again_from_the_same_nodes() {
    let sb = Sandbox::new();
    let state = sb.file("counter");
    let state = state.to_str().expect("utf-8");
    let mut server = Server::start(free_port(), &["10", "100", "--state", state]);
    let rx = Receiver::start();
    let cfg = config(
        &sb,
        &rx,
        &format!("    url: {}\n{}", server.url(), nodes(10, &[])),
    );
    let agent = Proc::start(&cfg);
    session_event(&agent, "started");
    agent.wait_until(secs(30), "data from the first server", || {
        values(&delivered(&rx))
            .get("v9")
            .is_some_and(|s| s.len() >= 5)
    });
    server.kill();
    agent.wait_for_event(secs(30), "the session lost", |e| {
        field(e, "message").starts_with("opcua session lost")
    });
    let before = delivered(&rx).len();
    let highest_before = values(&delivered(&rx))["v0"]
        .iter()
        .copied()
        .max()
        .expect("values");
    // Two namespaces registered first: urn:colibri:test moves from index 2 to 4; v3 is gone.
    server.restart(&["10", "100", "--state", state, "--reorder", "--omit", "v3"]);
    let restored = session_event(&agent, "restored");
    assert!(
        field(&restored, "message").contains("9 of 10 nodes monitored"),
        "{restored}"
    );
    assert_eq!(restored["namespaces"], 5, "{restored}");
    agent.wait_until(secs(30), "data from the new server", || {
        let v = values(&delivered(&rx)[before..]);
        (0..10).filter(|i| *i != 3).all(|i| {
            v.get(&format!("v{i}"))
                .is_some_and(|s| s.iter().any(|x| *x > highest_before + 3))
        })
    });
    assert_eq!(
        metric(&agent, "colibri_opcua_source_items", ",state=\"unknown\""),
        1.0
    );
    let lost = agent.events_where(|e| field(e, "message").starts_with("opcua session lost"));
    assert_eq!(lost.len(), 1, "one line for the loss: {lost:?}");
    let unknown = agent.events_where(|e| field(e, "message").starts_with("opcua node not read"));
    assert_eq!(unknown.len(), 1, "{unknown:?}");
    assert_eq!(field(&unknown[0], "node"), "v3");
    assert!(metric(&agent, "colibri_opcua_source_sessions_total", "") >= 2.0);
    drop(stop(agent));
}

#[test]
fn colibri_killed_during_a_burst_takes_its_subscription_over_and_loses_no_change() {
    const LAST: i64 = 400;
    let sb = Sandbox::new();
    let go = sb.file("go");
    let server = Server::start(
        free_port(),
        &[
            "20",
            "10",
            "--stop-after",
            &LAST.to_string(),
            "--start-after",
            go.to_str().expect("utf-8"),
        ],
    );
    let rx = Receiver::start();
    let cfg = config(
        &sb,
        &rx,
        &format!(
            "    url: {}\n    publishing_interval: 50ms\n    sampling_interval: 5ms\n    queue_size: 1000\n{}",
            server.url(),
            nodes(20, &[])
        ),
    );
    let agent = Proc::start(&cfg);
    session_event(&agent, "started");
    std::fs::write(&go, b"").expect("write the flag");
    agent.wait_until(secs(60), "a part of the burst", || {
        values(&delivered(&rx))
            .get("v19")
            .is_some_and(|s| s.len() >= 60)
    });
    agent.signal(libc::SIGKILL);
    let mut agent = agent;
    agent.wait_exit(secs(10));
    let agent = Proc::start(&cfg);
    let again = session_event(&agent, "started");
    assert!(
        field(&again, "message").contains("taken over"),
        "the subscription is taken over: {again}"
    );
    agent.wait_until(secs(90), "every node's last value", || {
        let v = values(&delivered(&rx));
        v.len() == 20 && v.values().all(|s| s.contains(&LAST))
    });
    for (node, seq) in values(&delivered(&rx)) {
        let missing: Vec<i64> = (1..=LAST).filter(|x| !seq.contains(x)).collect();
        assert!(missing.is_empty(), "{node} lost {missing:?}");
        let twice = seq.len() as i64 - (LAST + 1);
        assert!(twice <= 50, "{node}: {twice} stored twice");
    }
    drop(stop(agent));
    drop(server);
}

#[test]
fn signed_and_encrypted_with_a_password_once_the_operator_trusts_the_server() {
    let sb = Sandbox::new();
    let secure = sb.file("server-pki");
    std::fs::create_dir_all(&secure).expect("mkdir");
    let server = Server::start(
        free_port(),
        &[
            "3",
            "100",
            "--secure",
            secure.to_str().expect("utf-8"),
            "--user",
            "alice:secret",
        ],
    );
    let rx = Receiver::start();
    let source = |password: &str, pki: &str, tofu: bool| {
        format!(
            "    url: {}\n    security_policy: Basic256Sha256\n    username: alice\n    password: {password}\n    pki_dir: {pki}\n    trust_on_first_use: {tofu}\n{}",
            server.url(),
            nodes(3, &[])
        )
    };
    // A wrong password: one clear error however often it is tried, nothing appended.
    let cfg = config(&sb, &rx, &source("wrong", "pki-a", true));
    let agent = Proc::start(&cfg);
    agent.wait_until(secs(60), "three refusals", || {
        metric(&agent, "colibri_opcua_source_session_failures_total", "") >= 3.0
    });
    let refused =
        agent.events_where(|e| field(e, "message").contains("opcua server not reachable"));
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(
        field(&refused[0], "message")
            .contains("the server refused the user (its name and password"),
        "{refused:?}"
    );
    let trusted = agent.events_where(|e| {
        field(e, "message").starts_with("opcua server certificate trusted on first use")
    });
    assert_eq!(trusted.len(), 1, "{trusted:?}");
    let agent = stop(agent);
    let summary = agent
        .events_where(|e| field(e, "message") == "opcua source summary")
        .pop()
        .expect("a summary");
    assert_eq!(summary["records_appended"], 0, "{summary}");
    assert!(delivered(&rx).is_empty());

    // The right password and a new pki directory without trust on first use: the server's
    // certificate is refused and written to rejected/, until the operator moves it to trusted/.
    let cfg = config(&sb, &rx, &source("secret", "pki-b", false));
    let agent = Proc::start(&cfg);
    let refused = agent.wait_for_event(secs(60), "the untrusted certificate", |e| {
        field(e, "message").contains("opcua server not reachable")
    });
    assert!(
        field(&refused, "message").contains("the server's certificate is not trusted"),
        "{refused}"
    );
    let rejected = sb.file("pki-b/rejected");
    let cert = poll(secs(10), || {
        std::fs::read_dir(&rejected)
            .ok()?
            .filter_map(Result::ok)
            .find(|e| e.file_name().to_string_lossy().ends_with(".der"))
    })
    .expect("the server's certificate in rejected/");
    std::fs::rename(cert.path(), sb.file("pki-b/trusted").join(cert.file_name()))
        .expect("move it to trusted/");
    session_event(&agent, "started");
    agent.wait_until(secs(60), "data over the encrypted channel", || {
        values(&delivered(&rx))
            .get("v2")
            .is_some_and(|s| s.len() >= 5)
    });
    let refusals =
        agent.events_where(|e| field(e, "message").contains("opcua server not reachable"));
    assert_eq!(refusals.len(), 1, "{refusals:?}");
    drop(stop(agent));
}

#[test]
fn browse_prints_the_servers_tree_with_nsu_ids_types_and_values() {
    let sb = Sandbox::new();
    let server = Server::start(free_port(), &["2", "100000"]);
    let mut cmd = colibri();
    cmd.args(["opcua", "browse", &server.url(), "--pki-dir"])
        .arg(sb.file("pki"));
    let out = finish(cmd, secs(60));
    assert_code(out.status, 0, &out.stderr);
    let lines: Vec<&str> = out.stdout.lines().collect();
    let plant = lines
        .iter()
        .position(|l| l.starts_with("Plant  nsu=urn:colibri:test;s=Plant  Object"))
        .unwrap_or_else(|| panic!("no Plant folder in\n{}", out.stdout));
    let under: Vec<&str> = lines[plant + 1..]
        .iter()
        .take_while(|l| l.starts_with("  "))
        .copied()
        .collect();
    assert_eq!(
        under,
        [
            "  v0  nsu=urn:colibri:test;s=v0  Variable  Int32 = 0",
            "  v1  nsu=urn:colibri:test;s=v1  Variable  Int32 = 0",
            "  status  nsu=urn:colibri:test;s=status  Variable  Double = (BadSensorFailure)",
            "  label  nsu=urn:colibri:test;s=label  Variable  String = \"hello\"",
            "  levels  nsu=urn:colibri:test;s=levels  Variable  Double = [1.5,2.5]",
        ],
        "{}",
        out.stdout
    );
    // The standard nodes are listed, not followed.
    assert!(lines.contains(&"Server  i=2253  Object"), "{}", out.stdout);
    assert!(
        !lines.iter().any(|l| l.contains("NamespaceArray")),
        "{}",
        out.stdout
    );
    // Browsed from a node of its own, with its id as the source takes it.
    let mut cmd = colibri();
    cmd.args([
        "opcua",
        "browse",
        &server.url(),
        "nsu=urn:colibri:test;s=Plant",
        "--depth",
        "1",
        "--pki-dir",
    ])
    .arg(sb.file("pki"));
    let out = finish(cmd, secs(60));
    assert_code(out.status, 0, &out.stderr);
    assert_eq!(out.stdout.lines().count(), 5, "{}", out.stdout);
    // A namespace the server does not have, and a server that is not there: one clear error each.
    let mut cmd = colibri();
    cmd.args([
        "opcua",
        "browse",
        &server.url(),
        "nsu=urn:nowhere;s=x",
        "--pki-dir",
    ])
    .arg(sb.file("pki"));
    let out = finish(cmd, secs(60));
    assert_code(out.status, 1, &out.stderr);
    assert!(
        out.stderr
            .contains("the server has no namespace \"urn:nowhere\""),
        "{}",
        out.stderr
    );
    let mut cmd = colibri();
    cmd.args([
        "opcua",
        "browse",
        &format!("opc.tcp://127.0.0.1:{}/", free_port()),
        "--pki-dir",
    ])
    .arg(sb.file("pki"));
    let out = finish(cmd, secs(60));
    assert_code(out.status, 1, &out.stderr);
    assert!(
        out.stderr.contains("the server cannot be reached"),
        "{}",
        out.stderr
    );
}

#[test]
fn the_variables_of_a_browsed_folder_are_read_as_nodes() {
    let sb = Sandbox::new();
    let server = Server::start(free_port(), &["5", "100"]);
    let rx = Receiver::start();
    let cfg = config(
        &sb,
        &rx,
        &format!(
            "    url: {}\n    nodes: [{{ id: \"nsu=urn:colibri:test;s=v0\", name: first }}]\n    browse:\n      - {{ folder: \"nsu=urn:colibri:test;s=Plant\", pattern: \"^v[0-2]$\", tags: {{ from: plant }} }}\n",
            server.url()
        ),
    );
    let agent = Proc::start(&cfg);
    let started = session_event(&agent, "started");
    // v0 is listed already (as "first"); v1 and v2 match; v3, v4, status, label, levels do not.
    assert!(
        field(&started, "message").contains("3 of 3 nodes monitored"),
        "{started}"
    );
    agent.wait_until(secs(30), "changes of the three nodes", || {
        let v = values(&delivered(&rx));
        ["first", "v1", "v2"]
            .iter()
            .all(|n| v.get(*n).is_some_and(|s| s.len() >= 3))
    });
    let records = delivered(&rx);
    let names: std::collections::BTreeSet<String> = records
        .iter()
        .map(|r| field(r, "node").to_string())
        .collect();
    assert_eq!(
        names,
        ["first", "v1", "v2"].map(String::from).into(),
        "only the listed node and the folder's matching variables"
    );
    let v1 = records
        .iter()
        .find(|r| r["node"] == "v1")
        .expect("a v1 record");
    assert_eq!(v1["tags"]["from"], "plant", "{v1}");
    assert_eq!(v1["id"], "nsu=urn:colibri:test;s=v1", "{v1}");
    drop(stop(agent));
}

#[test]
fn a_user_certificate_is_an_identity_and_a_certificate_the_server_does_not_know_is_refused() {
    let sb = Sandbox::new();
    let secure = sb.file("server-pki");
    let users = sb.file("users");
    std::fs::create_dir_all(&secure).expect("mkdir");
    std::fs::create_dir_all(&users).expect("mkdir");
    let server = Server::start(
        free_port(),
        &[
            "3",
            "100",
            "--secure",
            secure.to_str().expect("utf-8"),
            "--cert-user",
            users.to_str().expect("utf-8"),
        ],
    );
    let rx = Receiver::start();
    let source = |cert: &Path, key: &Path| {
        format!(
            "    url: {}\n    security_policy: Basic256Sha256\n    trust_on_first_use: true\n    user_certificate: {}\n    user_private_key: {}\n{}",
            server.url(),
            crate::util::quote_path(cert),
            crate::util::quote_path(key),
            nodes(3, &[])
        )
    };
    let cfg = config(
        &sb,
        &rx,
        &source(&users.join("user_cert.der"), &users.join("user_key.pem")),
    );
    let agent = Proc::start(&cfg);
    session_event(&agent, "started");
    agent.wait_until(secs(60), "data as the certificate's user", || {
        values(&delivered(&rx))
            .get("v2")
            .is_some_and(|s| s.len() >= 3)
    });
    drop(stop(agent));

    // colibri's own application certificate is no user of the server's: one clear error.
    let pki = sb.file("data/opcua-pki/plc");
    let cfg = config(
        &sb,
        &rx,
        &source(&pki.join("own/cert.der"), &pki.join("private/private.pem")),
    );
    let agent = Proc::start(&cfg);
    agent.wait_until(secs(60), "three refusals", || {
        metric(&agent, "colibri_opcua_source_session_failures_total", "") >= 3.0
    });
    let refused =
        agent.events_where(|e| field(e, "message").contains("opcua server not reachable"));
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(
        field(&refused[0], "message").contains("the server refused the user"),
        "{refused:?}"
    );
    drop(stop(agent));
}
