//! Operating colibri from the real binary: the admin endpoint's metrics after a scenario (parsed by
//! the reference Prometheus text parser, Debian's python3-prometheus-client) with the accounting
//! identity checked from one scrape; all-or-nothing reloads applied by difference (SIGHUP and
//! `POST /-/reload`); a SIGTERM under load that exits 0 within the grace with nothing acknowledged
//! lost; and a supervisor loop restarting colibri like systemd's `Restart=always` + `RestartSec=2`,
//! with the sd_notify messages (READY, WATCHDOG, RELOADING, STOPPING) read from a notify socket the
//! test owns. Every wait is bounded and waits for a condition.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::util::client::{Answer, Client};
use crate::util::http::{Mode, Receiver};
use crate::util::secs;
use crate::util::{Proc, Sandbox, assert_code, colibri, field, poll, quote, quote_path};

/// The address a component logged it listens on (`"<message>"` with a `listen` field).
fn listening(agent: &Proc, message: &str) -> SocketAddr {
    let e = agent.wait_for_event(secs(20), message, |e| field(e, "message") == message);
    field(&e, "listen").parse().expect("an address")
}

fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Answer {
    Client::new(addr)
        .request("GET", path, headers, None)
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

fn post(addr: SocketAddr, path: &str) -> Answer {
    Client::new(addr)
        .request("POST", path, &[], Some(b""))
        .unwrap_or_else(|e| panic!("POST {path}: {e}"))
}

/// A sample as the reference parser saw it.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parses a scrape with prometheus_client's text parser (it refuses malformed exposition text).
fn parse(text: &str) -> Vec<Sample> {
    let script = "import sys, json\n\
        from prometheus_client.parser import text_string_to_metric_families\n\
        for f in text_string_to_metric_families(sys.stdin.read()):\n\
        \x20   for s in f.samples:\n\
        \x20       print(json.dumps({'family': f.name, 'type': f.type, 'name': s.name, 'labels': s.labels, 'value': s.value}))\n";
    let mut child = Command::new("/usr/bin/python3")
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("/usr/bin/python3 (Debian's python3 with python3-prometheus-client; scripts/test.sh installs it)");
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the Prometheus parser refused the scrape: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            Sample {
                name: v["name"].as_str().unwrap().to_string(),
                labels: v["labels"]
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                    .collect(),
                value: v["value"].as_f64().unwrap(),
            }
        })
        .collect()
}

fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .find(|s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
        .unwrap_or_else(|| panic!("no sample {name} {labels:?}"))
}

fn scrape(admin: SocketAddr) -> Vec<Sample> {
    let a = get(admin, "/metrics", &[]);
    assert_eq!(a.status, 200, "{}", a.text());
    parse(&a.text())
}

/// The families `deploy/prometheus/metrics.txt` documents (the only names alerts and the dashboard
/// may use), as (name, type).
fn documented_families() -> BTreeSet<(String, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/prometheus/metrics.txt");
    std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (name, kind) = l.split_once(' ').expect("a name and a type");
            (name.to_string(), kind.trim().to_string())
        })
        .collect()
}

/// The families a scrape declares (`# TYPE name type`).
fn declared_families(text: &str) -> BTreeSet<(String, String)> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(name, kind)| (name.to_string(), kind.to_string()))
        .collect()
}

#[test]
fn one_scrape_after_a_scenario_parses_and_balances_for_every_stream() {
    let sb = Sandbox::new();
    let good = Receiver::start();
    let bad = Receiver::start();
    bad.set_mode(Mode::Status(400));
    let config = sb.write_config(&format!(
        r#"data_dir: data
log: {{format: json}}
admin: {{ listen: "127.0.0.1:{admin_port}", token: "s3cret" }}
ingest: {{ listen: "127.0.0.1:0" }}
sinks:
  good: {{ type: http, url: {good} }}
  bad: {{ type: http, url: {bad} }}
streams:
  ok: {{ sink: good }}
  rejected: {{ sink: bad }}
  small: {{ batch: {{ max_records: 1 }}, max_jobs: 2, when_full: drop_oldest }}
  logs: {{}}
  tiny: {{ batch: {{ max_records: 1 }}, max_jobs: 1, when_full: drop_newest }}
  scraped: {{}}
  clocked: {{ hold_until_clock_synced: true }}
sources:
  app: {{ type: tail, stream: logs, paths: [{app_log}] }}
  plant: {{ type: syslog, stream: logs, udp: "127.0.0.1:{syslog_port}" }}
  floor: {{ type: mqtt, url: "mqtt://127.0.0.1:{mqtt_port}", topics: ["plant/#"], stream: logs }}
  plc: {{ type: opcua, url: "opc.tcp://127.0.0.1:{opcua_port}/", stream: logs, nodes: [{{ id: "ns=2;s=Temp" }}] }}
tasks:
  - {{ name: hello, type: exec, every: 200ms, command: ["/bin/true"] }}
  - {{ name: nope, type: exec, every: 200ms, command: ["/bin/false"] }}
  - {{ name: self, type: http_scrape, every: 200ms, url: "http://127.0.0.1:{admin_port}/metrics",
       headers: {{ Authorization: "Bearer s3cret" }}, format: prometheus, stream: scraped }}
  - {{ name: changes, type: http_scrape, every: 200ms, url: "http://127.0.0.1:{admin_port}/metrics",
       headers: {{ Authorization: "Bearer s3cret" }}, format: prometheus, stream: scraped, deadband: 0 }}
"#,
        admin_port = crate::tsdb::free_port(),
        good = quote(good.url("/in")),
        bad = quote(bad.url("/in")),
        app_log = quote_path(&sb.file("app.log")),
        syslog_port = crate::tsdb::free_port(),
        // No broker there: the source's counters are exported all the same.
        mqtt_port = crate::tsdb::free_port(),
        opcua_port = crate::tsdb::free_port(),
    ));
    let agent = Proc::run(&config);
    let admin = listening(&agent, "admin endpoint listening");
    let ingest = listening(&agent, "ingest listening");
    let mut c = Client::new(ingest);
    let mut push = |stream: &str, n: usize| {
        let body: String = (0..n).map(|i| format!("{{\"i\":{i}}}\n")).collect();
        let a = c
            .post(
                &format!("/v1/streams/{stream}/records"),
                "application/x-ndjson",
                &[],
                body.as_bytes(),
            )
            .unwrap();
        assert_eq!(a.status, 200, "{}", a.text());
    };
    push("ok", 10);
    push("rejected", 5);
    for _ in 0..6 {
        push("small", 1);
    }
    push("tiny", 1);
    // The stream is full: drop_newest refuses (429) and counts the refusal.
    let refused = c
        .post(
            "/v1/streams/tiny/records",
            "application/x-ndjson",
            &[],
            b"{\"i\":1}\n",
        )
        .unwrap();
    assert_eq!(refused.status, 429, "{}", refused.text());
    good.wait_records(10, secs(20)).expect("ok delivered");
    let auth = [("Authorization", "Bearer s3cret")];
    let samples = poll(secs(20), || {
        let a = get(admin, "/metrics", &auth);
        let s = parse(&a.text());
        (value(
            &s,
            "colibri_stream_records",
            &[("stream", "rejected"), ("queue", "dead")],
        ) == 5.0
            && value(
                &s,
                "colibri_task_runs_total",
                &[("task", "nope"), ("outcome", "failed")],
            ) >= 1.0
            && value(
                &s,
                "colibri_task_runs_total",
                &[("task", "self"), ("outcome", "ok")],
            ) >= 1.0)
            .then_some(s)
    })
    .expect("the rejected records dead-lettered and a failed run counted");

    // The scrape declares exactly the documented families, and each has samples.
    let text = get(admin, "/metrics", &auth).text();
    let declared = declared_families(&text);
    let documented = documented_families();
    assert_eq!(
        declared.difference(&documented).collect::<Vec<_>>(),
        Vec::<&(String, String)>::new(),
        "exported but not in deploy/prometheus/metrics.txt"
    );
    assert_eq!(
        documented.difference(&declared).collect::<Vec<_>>(),
        Vec::<&(String, String)>::new(),
        "in deploy/prometheus/metrics.txt but not exported"
    );
    for (family, _) in &documented {
        assert!(
            samples
                .iter()
                .any(|s| s.name == *family
                    || s.name.strip_prefix(family.as_str()) == Some("_bucket")),
            "{family} has no sample in the scrape"
        );
    }
    // The accounting identity, from this one scrape, for every stream.
    for stream in ["ok", "rejected", "small", "logs", "tiny", "scraped"] {
        let l = [("stream", stream)];
        let appended = value(&samples, "colibri_stream_appended_records_total", &l);
        let delivered = value(&samples, "colibri_stream_delivered_records_total", &l);
        let dropped: f64 = samples
            .iter()
            .filter(|s| {
                s.name == "colibri_stream_dropped_records_total" && s.labels["stream"] == stream
            })
            .map(|s| s.value)
            .sum();
        let expired = value(&samples, "colibri_stream_expired_records_total", &l);
        let quarantined = value(&samples, "colibri_stream_quarantined_records_total", &l)
            + value(&samples, "colibri_stream_lost_to_damage_records_total", &l)
            + value(&samples, "colibri_stream_salvaging_records", &l);
        let queue = |q: &str| {
            value(
                &samples,
                "colibri_stream_records",
                &[("stream", stream), ("queue", q)],
            )
        };
        let (ready, retry, dead) = (queue("ready"), queue("retry"), queue("dead"));
        let moved = |d: &str| {
            value(
                &samples,
                "colibri_stream_moved_records_total",
                &[("stream", stream), ("direction", d)],
            )
        };
        let (moved_in, moved_out) = (moved("in"), moved("out"));
        let downsampled = |d: &str| {
            value(
                &samples,
                "colibri_stream_downsampled_records_total",
                &[("stream", stream), ("direction", d)],
            )
        };
        let (made, merged) = (downsampled("out"), downsampled("in"));
        assert_eq!(
            appended + moved_in + made,
            delivered + dropped + expired + quarantined + moved_out + merged + dead + ready + retry,
            "{stream}: appended {appended} + moved in {moved_in} + aggregates {made} = delivered {delivered} + dropped {dropped} + expired {expired} + quarantined, lost to damage and salvaging {quarantined} + moved out {moved_out} + aggregated {merged} + dead {dead} + ready {ready} + retry {retry}"
        );
    }
    assert_eq!(
        value(
            &samples,
            "colibri_stream_delivered_records_total",
            &[("stream", "ok")]
        ),
        10.0
    );
    assert_eq!(
        value(
            &samples,
            "colibri_stream_dropped_records_total",
            &[("stream", "small"), ("reason", "oldest")]
        ),
        4.0
    );
    assert_eq!(
        value(
            &samples,
            "colibri_sink_requests_total",
            &[("sink", "bad"), ("result", "rejected")]
        ),
        1.0
    );
    assert_eq!(
        value(&samples, "colibri_sink_link_up", &[("sink", "good")]),
        1.0
    );
    assert!(value(&samples, "colibri_store_commits_total", &[]) >= 3.0);
    assert!(value(&samples, "colibri_process_resident_memory_bytes", &[]) > 1e6);
    assert_eq!(value(&samples, "colibri_config_generation", &[]), 1.0);
    // The file's hash is the file's.
    let sha = ring::digest::digest(&ring::digest::SHA256, &std::fs::read(&config).unwrap());
    let hex: String = sha.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        value(&samples, "colibri_config_info", &[("sha256", &hex)]),
        1.0
    );
    // What an operator misses elsewhere: refusals by reason, ingest answers by code, the
    // scrape's target up with its samples, the worker pool, a last success.
    assert_eq!(
        value(
            &samples,
            "colibri_stream_appends_refused_total",
            &[("stream", "tiny"), ("reason", "max_jobs")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &samples,
            "colibri_ingest_requests_total",
            &[("stream", "small"), ("code", "200")]
        ),
        6.0
    );
    assert_eq!(
        value(
            &samples,
            "colibri_ingest_requests_total",
            &[("stream", "tiny"), ("code", "429")]
        ),
        1.0
    );
    assert_eq!(
        value(&samples, "colibri_scrape_up", &[("task", "self")]),
        1.0
    );
    assert!(
        value(
            &samples,
            "colibri_scrape_samples_scraped",
            &[("task", "self")]
        ) > 10.0
    );
    assert_eq!(value(&samples, "colibri_workers", &[]), 8.0);
    assert!(value(&samples, "colibri_workers_busy", &[]) <= 3.0);
    assert!(
        value(
            &samples,
            "colibri_task_last_success_timestamp_seconds",
            &[("task", "hello")]
        ) > 1.7e9
    );
    assert_eq!(
        value(
            &samples,
            "colibri_task_last_success_timestamp_seconds",
            &[("task", "nope")]
        ),
        0.0
    );
    assert_eq!(value(&samples, "colibri_config_restart_pending", &[]), 0.0);
    // Label cardinality: bounded by the config (four tasks, six streams, two sinks).
    let tasks: BTreeSet<&str> = samples
        .iter()
        .filter_map(|s| s.labels.get("task").map(String::as_str))
        .collect();
    assert_eq!(tasks, BTreeSet::from(["changes", "hello", "nope", "self"]));

    // The token guards metrics and reload; health needs none.
    assert_eq!(get(admin, "/metrics", &[]).status, 401);
    assert_eq!(
        get(admin, "/metrics", &[("Authorization", "Bearer wrong")]).status,
        401
    );
    assert_eq!(post(admin, "/-/reload").status, 401);
    assert_eq!(get(admin, "/healthz", &[]).status, 200);
    let ready = get(admin, "/readyz", &[]);
    // Ready whatever the clock; a line says when the kernel calls it unsynchronised.
    assert_eq!(ready.status, 200);
    assert!(ready.text().starts_with("ready\n"), "{}", ready.text());
    assert_eq!(get(admin, "/nope", &[]).status, 404);
    assert_eq!(post(admin, "/metrics").status, 405);
}

#[test]
fn a_non_loopback_admin_address_needs_allow_remote_and_a_token() {
    let sb = Sandbox::new();
    let config = sb.write_config("admin: { listen: \"0.0.0.0:9464\" }\n");
    let mut cmd = colibri();
    cmd.args(["check", "--config"]).arg(&config);
    let out = crate::util::finish(cmd, secs(10));
    assert_code(out.status, 1, &out.stderr);
    assert!(
        out.stderr
            .contains("admin.listen: 0.0.0.0:9464 is not a loopback address"),
        "{}",
        out.stderr
    );
    let config = sb.write_config("admin: { listen: \"0.0.0.0:9464\", allow_remote: true }\n");
    let mut cmd = colibri();
    cmd.args(["check", "--config"]).arg(&config);
    let out = crate::util::finish(cmd, secs(10));
    assert_code(out.status, 1, &out.stderr);
    assert!(
        out.stderr
            .contains("admin.token: is required with allow_remote"),
        "{}",
        out.stderr
    );
}

/// Reload: only the changed task is re-planned while another task is mid-run and a sink drains a
/// backlog; an invalid file keeps everything running and reports every problem; a changed timeout
/// applies to the next run.
#[test]
fn a_reload_changes_only_what_changed_and_an_invalid_file_changes_nothing() {
    let sb = Sandbox::new();
    let rx = Receiver::start_counting();
    let marker = sb.file("slow-done");
    let template = |tick: &str, slow_timeout: &str, extra: &str| {
        format!(
            r#"data_dir: data
log: {{format: json}}
shutdown_grace: 30s
sinks:
  up: {{ type: http, url: {url}, replay_rate: 2MiB }}
streams:
  logs: {{ sink: up, max_bytes: 1GiB }}
tasks:
  - {{ name: tick, type: exec, every: {tick}, command: ["/bin/true"] }}
  - {{ name: slow, type: exec, every: 1h, timeout: {slow_timeout}, command: ["/bin/sh", "-c", "sleep 3; touch {marker}"] }}
{extra}"#,
            url = quote(rx.url("/in")),
            marker = marker.display(),
        )
    };
    let config = sb.write_config(&template("1h", "20s", ""));
    // A backlog that takes a while to drain at 2 MiB/s. The records are JSON (`queue push` checks
    // them for a JSON sink): a zero-padded seq is a string, JSON numbers have no leading zeros.
    std::fs::create_dir_all(sb.file("data")).unwrap();
    let lines: String = (0..40_000)
        .map(|i| format!("{{\"seq\":\"{i:08}\",\"pad\":\"{}\"}}\n", "x".repeat(160)))
        .collect();
    let mut push = colibri();
    push.args(["queue", "push", "--config"])
        .arg(&config)
        .arg("logs");
    // The store is created by the first run: a short life (stopped cleanly) creates it.
    let mut first = Proc::run(&config);
    first.wait_for_event(secs(20), "the start", |e| {
        field(e, "message") == "colibri started"
    });
    first.signal(libc::SIGTERM);
    assert_code(first.wait_exit(secs(20)), 0, &first.stderr());
    let pushed = {
        use std::io::Write;
        let mut child = push
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(lines.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    };
    assert!(
        pushed.status.success(),
        "{}",
        String::from_utf8_lossy(&pushed.stderr)
    );

    let mut agent = Proc::run(&config);
    let admin = listening(&agent, "admin endpoint listening");
    agent.wait_for_event(secs(10), "slow running", |e| {
        field(e, "message") == "colibri started"
    });
    // Mid-run of slow, mid-drain of the backlog:
    agent.wait_until(secs(20), "the drain under way", || {
        let (_, records, _) = rx.counts();
        records > 1000
    });
    let before = rx.counts().1;
    assert!(
        before < 40_000,
        "the drain must still be going for this test"
    );
    sb.write_config(&template("300ms", "20s", ""));
    agent.signal(libc::SIGHUP);
    let reloaded = agent.wait_for_event(secs(20), "the reload", |e| {
        field(e, "message") == "config reloaded"
    });
    assert_eq!(reloaded["generation"], 2, "{reloaded}");
    let changes: Vec<String> = agent
        .events_where(|e| field(e, "message") == "reload")
        .iter()
        .map(|e| field(e, "change").to_string())
        .collect();
    assert_eq!(changes, ["task tick: changed"], "only the changed task");
    // tick now runs every 300ms; slow's run goes on and finishes ok; the drain did not stop.
    agent.wait_until(secs(10), "tick runs at its new interval", || {
        agent
            .events_where(|e| field(e, "task") == "tick" && field(e, "outcome") == "ok")
            .len()
            >= 3
    });
    agent.wait_until(secs(20), "slow's run finished", || marker.exists());
    let slow = agent.wait_for_event(secs(10), "slow's run event", |e| field(e, "task") == "slow");
    assert_eq!(field(&slow, "outcome"), "ok", "{slow}");
    assert_eq!(
        agent
            .events_where(|e| field(e, "message") == "delivery started")
            .len(),
        1,
        "the sink was not restarted"
    );
    rx.wait_count(40_000, secs(60))
        .expect("the drain went on through the reload");

    // An invalid file: refused with every problem, nothing changes, metrics say so.
    sb.write_config(&template(
        "0s",
        "20s",
        "  - { name: tick, type: exec, every: 1s, command: [\"/bin/true\"] }\n",
    ));
    let refused = post(admin, "/-/reload");
    assert_eq!(refused.status, 422, "{}", refused.text());
    let text = refused.text();
    assert!(
        text.contains("every: must be positive") && text.contains("duplicate name"),
        "{text}"
    );
    agent.signal(libc::SIGHUP);
    let e = agent.wait_for_event(secs(10), "the refusal log", |e| {
        field(e, "message") == "reload refused: the running config stays"
    });
    assert!(field(&e, "problems").contains("duplicate name"), "{e}");
    let s = scrape(admin);
    assert_eq!(value(&s, "colibri_config_last_reload_successful", &[]), 0.0);
    assert_eq!(value(&s, "colibri_config_generation", &[]), 2.0);
    assert!(
        value(
            &s,
            "colibri_config_last_reload_failure_timestamp_seconds",
            &[]
        ) > 0.0
    );
    let ticks = agent.events_where(|e| field(e, "task") == "tick").len();
    agent.wait_until(secs(10), "tick still runs on the old config", || {
        agent.events_where(|e| field(e, "task") == "tick").len() > ticks + 2
    });

    // A changed timeout applies to the next run.
    sb.write_config(&template("300ms", "1s", ""));
    let ok = post(admin, "/-/reload");
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert!(
        ok.text().contains("generation 3") && ok.text().contains("task slow: changed"),
        "{}",
        ok.text()
    );
    let s = scrape(admin);
    assert_eq!(value(&s, "colibri_config_last_reload_successful", &[]), 1.0);
    assert_eq!(value(&s, "colibri_config_generation", &[]), 3.0);
    // slow runs every hour; a schedule change makes it run now, with the new timeout.
    std::fs::remove_file(&marker).unwrap();
    sb.write_config(&template("300ms", "1s", "").replace("every: 1h", "every: 30m"));
    assert_eq!(post(admin, "/-/reload").status, 200);
    let timed_out = agent.wait_for_event(secs(20), "slow timing out", |e| {
        field(e, "task") == "slow" && field(e, "outcome") == "timeout"
    });
    // With the old 20s timeout this run (3 s of sleep) would have ended ok.
    assert_eq!(
        field(&timed_out, "reason"),
        "timed out; process group terminated"
    );
    agent.signal(libc::SIGTERM);
    assert_code(agent.wait_exit(secs(30)), 0, &agent.stderr());
}

/// A notify socket like systemd's, owned by the test.
struct NotifySocket {
    sock: UnixDatagram,
    path: std::path::PathBuf,
}

impl NotifySocket {
    fn bind(dir: &Path) -> NotifySocket {
        let path = dir.join("notify.sock");
        let sock = UnixDatagram::bind(&path).unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        NotifySocket { sock, path }
    }

    /// Waits for a message containing `what`; returns when it came.
    fn wait(&self, what: &str, limit: Duration) -> Instant {
        let deadline = Instant::now() + limit;
        let mut buf = [0u8; 4096];
        let mut seen = Vec::new();
        while Instant::now() < deadline {
            if let Ok(n) = self.sock.recv(&mut buf) {
                let m = String::from_utf8_lossy(&buf[..n]).into_owned();
                if m.lines()
                    .any(|l| l == what || l.starts_with(&format!("{what}\n")))
                    || m.contains(what)
                {
                    return Instant::now();
                }
                seen.push(m);
            }
        }
        panic!("no {what:?} within {limit:?}; got {seen:?}");
    }
}

#[test]
fn a_supervisor_restarts_colibri_after_kill_9_and_it_resumes_its_schedule_and_backlog() {
    let sb = Sandbox::new();
    let rx = Receiver::start();
    let notify = NotifySocket::bind(&sb.file(""));
    let ran = sb.file("runs");
    let config = sb.write_config(&format!(
        r#"data_dir: data
log: {{format: json}}
ingest: {{ listen: "127.0.0.1:0" }}
sinks:
  up: {{ type: http, url: {url}, link: {{ down_after: 1, backoff_base: 100ms, backoff_cap: 200ms }} }}
streams:
  logs: {{ sink: up }}
tasks:
  - {{ name: beat, type: exec, every: 500ms, command: ["/bin/sh", "-c", "echo x >> {ran}"] }}
"#,
        url = quote(rx.url("/in")),
        ran = ran.display(),
    ));
    let spawn = || {
        let mut cmd = colibri();
        cmd.args(["run", "--config"])
            .arg(&config)
            .env("NOTIFY_SOCKET", &notify.path)
            .env("WATCHDOG_USEC", "400000");
        Proc::spawn(cmd)
    };
    let agent = spawn();
    notify.wait("READY=1", secs(20));
    notify.wait("WATCHDOG=1", secs(5));
    // Records queued while the receiver is down: the backlog the next life must deliver.
    rx.set_mode(Mode::Refuse);
    let ingest = listening(&agent, "ingest listening");
    let body: String = (0..100).map(|i| format!("{{\"seq\":{i}}}\n")).collect();
    let a = Client::new(ingest)
        .post(
            "/v1/streams/logs/records",
            "application/x-ndjson",
            &[],
            body.as_bytes(),
        )
        .unwrap();
    assert_eq!(a.status, 200);
    // SIGHUP: RELOADING=1 then READY=1 again.
    agent.signal(libc::SIGHUP);
    notify.wait("RELOADING=1", secs(10));
    notify.wait("READY=1", secs(10));

    let mut restart_times = Vec::new();
    let mut agent = agent;
    for _ in 0..2 {
        let runs_before = std::fs::read_to_string(&ran)
            .unwrap_or_default()
            .lines()
            .count();
        agent.signal(libc::SIGKILL);
        let killed = Instant::now();
        agent.wait_exit(secs(10));
        // systemd's RestartSec=2.
        std::thread::sleep(secs(2));
        agent = spawn();
        let ready = notify.wait("READY=1", secs(20));
        restart_times.push(ready - killed);
        // The schedule resumes.
        agent.wait_until(secs(10), "beat runs again", || {
            std::fs::read_to_string(&ran)
                .unwrap_or_default()
                .lines()
                .count()
                > runs_before + 1
        });
    }
    rx.set_mode(Mode::Accept);
    rx.wait_records(100, secs(30))
        .expect("the backlog is delivered after the restarts");
    eprintln!(
        "kill -9 to READY=1 (2 s restart delay included): {:?}",
        restart_times
    );
    for t in &restart_times {
        assert!(*t < secs(30), "{t:?}");
    }
    agent.signal(libc::SIGTERM);
    notify.wait("STOPPING=1", secs(10));
    assert_code(agent.wait_exit(secs(20)), 0, &agent.stderr());
}

#[test]
fn sigterm_under_load_exits_0_within_the_grace_and_loses_nothing_acknowledged() {
    let sb = Sandbox::new();
    let rx = Receiver::start();
    let log = sb.file("app.log");
    std::fs::write(&log, "").unwrap();
    let config = sb.write_config(&format!(
        r#"data_dir: data
log: {{format: json}}
shutdown_grace: 5s
ingest: {{ listen: "127.0.0.1:0" }}
sinks:
  up: {{ type: http, url: {url} }}
streams:
  logs: {{ sink: up, batch: {{ max_records: 50 }} }}
sources:
  app: {{ type: tail, stream: logs, paths: [{log}], start_at: beginning, host: false }}
tasks:
  - {{ name: busy, type: exec, every: 200ms, timeout: 3s, command: ["/bin/sh", "-c", "sleep 1"] }}
"#,
        url = quote(rx.url("/in")),
        log = quote_path(&log),
    ));
    let mut agent = Proc::run(&config);
    let ingest = listening(&agent, "ingest listening");
    // Ingest clients and a writer to the tailed file, until colibri stops taking them.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut clients = Vec::new();
    for c in 0..4u32 {
        let stop = std::sync::Arc::clone(&stop);
        clients.push(std::thread::spawn(move || {
            let mut acked = Vec::new();
            let mut client = Client::new(ingest);
            for batch in 0..10_000u32 {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let body: String = (0..20)
                    .map(|i| format!("{{\"c\":{c},\"b\":{batch},\"i\":{i}}}\n"))
                    .collect();
                match client.post(
                    "/v1/streams/logs/records",
                    "application/x-ndjson",
                    &[],
                    body.as_bytes(),
                ) {
                    Ok(a) if a.status == 200 => acked.push(batch),
                    Ok(_) => break, // 503: stopping
                    Err(_) => break,
                }
            }
            acked
        }));
    }
    let writer = {
        let (stop, log) = (std::sync::Arc::clone(&stop), log.clone());
        std::thread::spawn(move || {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
            let mut n = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && n < 200_000 {
                writeln!(f, "line {n}").unwrap();
                n += 1;
                if n.is_multiple_of(500) {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            n
        })
    };
    agent.wait_until(secs(20), "load under way", || rx.records().len() > 2000);
    let t = Instant::now();
    agent.signal(libc::SIGTERM);
    let status = agent.wait_exit(secs(20));
    let took = t.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert_code(status, 0, &agent.stderr());
    assert!(
        took < secs(5) + secs(3),
        "the stop took {took:?} (grace 5s)"
    );
    let acked: Vec<(u32, Vec<u32>)> = clients
        .into_iter()
        .enumerate()
        .map(|(c, h)| (c as u32, h.join().unwrap()))
        .collect();
    let lines_written = writer.join().unwrap();

    // A second life delivers what the first left queued; then every acknowledged ingest batch
    // must have arrived, and every tailed line up to the committed checkpoint (the rest is read by
    // this second life, as the file is the buffer).
    let mut agent = Proc::run(&config);
    let want_lines = lines_written as usize;
    agent.wait_until(secs(180), "everything delivered", || {
        let recs = rx.records();
        let lines: BTreeSet<String> = recs
            .iter()
            .filter_map(|r| serde_json::from_str::<Value>(r).ok())
            .filter_map(|v| v["line"].as_str().map(str::to_string))
            .collect();
        lines.len() >= want_lines
    });
    let got: BTreeSet<(u64, u64, u64)> = rx
        .records()
        .iter()
        .filter_map(|r| serde_json::from_str::<Value>(r).ok())
        .filter_map(|v| Some((v["c"].as_u64()?, v["b"].as_u64()?, v["i"].as_u64()?)))
        .collect();
    for (c, batches) in &acked {
        for b in batches {
            for i in 0..20 {
                assert!(
                    got.contains(&(u64::from(*c), u64::from(*b), i)),
                    "acknowledged ingest record c{c} b{b} i{i} lost"
                );
            }
        }
    }
    assert!(
        acked.iter().map(|(_, b)| b.len()).sum::<usize>() > 10,
        "ingest was busy"
    );
    agent.signal(libc::SIGTERM);
    assert_code(agent.wait_exit(secs(20)), 0, &agent.stderr());
}

/// A refused reload in the text log: one line with every problem, and a value from the
/// environment named by its variable there and in the admin endpoint's answer, never shown.
#[test]
fn a_refused_reload_is_one_log_line_that_never_shows_a_secret() {
    let sb = Sandbox::new();
    let config = sb.write_config(
        "data_dir: data\nworkers: 2\ntasks:\n  - { name: tick, type: exec, every: 1h, command: [\"/bin/true\"] }\n",
    );
    let mut cmd = colibri();
    cmd.arg("run")
        .arg("--config")
        .arg(&config)
        .env("COLIBRI_TEST_IT", "ITSECRET4");
    let mut agent = Proc::spawn(cmd);
    let line_with = |agent: &Proc, what: &str| {
        poll(secs(20), || {
            agent
                .stderr()
                .lines()
                .find(|l| l.contains(what))
                .map(str::to_string)
        })
        .unwrap_or_else(|| panic!("no line with {what:?}; stderr:\n{}", agent.stderr()))
    };
    let listening = line_with(&agent, "admin endpoint listening");
    let admin: SocketAddr = listening
        .split_whitespace()
        .find_map(|w| w.strip_prefix("listen="))
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no listen= in {listening:?}"));
    line_with(&agent, "colibri started");

    sb.write_config(
        "data_dir: data\nworkers: ${COLIBRI_TEST_IT}\ntasks:\n  - { name: tick, type: exec, every: 0s, command: [\"/bin/true\"] }\n",
    );
    agent.signal(libc::SIGHUP);
    let refused = line_with(&agent, "reload refused");
    for says in [
        "workers: expected a whole number, found the value of ${COLIBRI_TEST_IT}",
        "tasks[0] \"tick\": every: must be positive",
    ] {
        assert!(refused.contains(says), "{says:?} not in {refused:?}");
    }
    // Every line is an event of its own: none continues the one before.
    for l in agent.stderr().lines() {
        assert!(
            l.len() > 20 && l.as_bytes()[..4].iter().all(u8::is_ascii_digit) && &l[10..11] == "T",
            "not an event line: {l:?}; stderr:\n{}",
            agent.stderr()
        );
    }
    let answer = post(admin, "/-/reload");
    assert_eq!(answer.status, 422, "{}", answer.text());
    assert!(
        answer
            .text()
            .contains("workers: expected a whole number, found the value of ${COLIBRI_TEST_IT}"),
        "{}",
        answer.text()
    );
    assert!(!answer.text().contains("SECRET"), "{}", answer.text());
    assert!(!agent.stderr().contains("SECRET"), "{}", agent.stderr());
    agent.signal(libc::SIGTERM);
    assert_code(agent.wait_exit(secs(20)), 0, &agent.stderr());
}
