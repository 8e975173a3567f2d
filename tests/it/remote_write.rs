//! The `prometheus_remote_write` sink end to end against real receivers, started on loopback ports:
//! Debian's `prometheus` (`--web.enable-remote-write-receiver`, with an out-of-order window) and
//! `victoria-metrics` (`/api/v1/write`), both installed by `scripts/test.sh`. The real binary
//! scrapes an endpoint every second (each scrape serves a value that counts the GETs); the
//! receiver is stopped for 30 s and started again on the same data; afterwards every
//! scrape must be queryable once, at the time it was scraped, with the record's labels, `job` and
//! the sink's external labels. A Prometheus without the window refuses a sample older than its
//! newest: the job is dead-lettered with a reason that says which receivers take a backlog.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

use crate::tsdb::{Vm, check_series, free_port, now_ms};
use crate::util::serve::Endpoint;
use crate::util::{Proc, Sandbox, assert_code, colibri, field, poll, quote, secs};

/// A Prometheus server on a loopback port with its own data directory, taking remote writes.
struct Prom {
    child: Option<Child>,
    port: u16,
    data: PathBuf,
    config: PathBuf,
}

impl Prom {
    /// `ooo_window`: the out-of-order window (`None`: samples older than the newest are refused).
    fn start(dir: &Path, port: u16, ooo_window: Option<&str>) -> Prom {
        std::fs::create_dir_all(dir).unwrap();
        let config = dir.join("prometheus.yml");
        let storage = ooo_window.map_or(String::new(), |w| {
            format!("storage:\n  tsdb:\n    out_of_order_time_window: {w}\n")
        });
        std::fs::write(&config, format!("global: {{}}\n{storage}")).unwrap();
        Prom::spawn(dir.join("data"), config, port)
    }

    fn spawn(data: PathBuf, config: PathBuf, port: u16) -> Prom {
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", data.display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--web.enable-remote-write-receiver")
            .arg("--storage.tsdb.retention.time=100y")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start prometheus ({e}): install Debian's prometheus package (scripts/test.sh does)")
            });
        let p = Prom {
            child: Some(child),
            port,
            data,
            config,
        };
        poll(secs(60), || p.get("/-/ready").map(|_| ())).expect("prometheus answers /-/ready");
        p
    }

    fn get(&self, path: &str) -> Option<String> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(secs(10))).ok()?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        let (head, body) = out.split_once("\r\n\r\n")?;
        (head.split_whitespace().nth(1) == Some("200")).then(|| body.trim().to_string())
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            crate::util::send_signal(c.id() as i32, libc::SIGTERM);
            if poll(secs(30), || c.try_wait().ok().flatten()).is_none() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }

    fn restart(&mut self) {
        self.stop();
        *self = Prom::spawn(self.data.clone(), self.config.clone(), self.port);
    }

    /// Every raw sample of the series matching `selector` in the last hour: labels -> (ms, value).
    fn samples(&self, selector: &str) -> BTreeMap<String, Vec<(u64, f64)>> {
        let q: String = format!("{selector}[1h]")
            .bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'.' | b'-' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        let at = now_ms() as f64 / 1000.0 + 1.0;
        let text = self
            .get(&format!("/api/v1/query?query={q}&time={at:.3}"))
            .expect("the query API answers");
        let v: Value = serde_json::from_str(&text).expect("a JSON answer");
        let mut out = BTreeMap::new();
        for s in v["data"]["result"].as_array().expect("a result") {
            let samples = s["values"]
                .as_array()
                .expect("values")
                .iter()
                .map(|p| {
                    let t = (p[0].as_f64().expect("seconds") * 1000.0).round() as u64;
                    let x: f64 = p[1].as_str().expect("a value").parse().expect("a number");
                    (t, x)
                })
                .collect();
            out.insert(s["metric"].to_string(), samples);
        }
        out
    }
}

impl Drop for Prom {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A receiver as the test drives it: stop, start on the same data, read a series back.
trait Receiver {
    fn write_url(&self) -> String;
    fn stop(&mut self);
    fn restart(&mut self);
    fn series(&self, selector: &str) -> BTreeMap<String, Vec<(u64, f64)>>;
}

impl Receiver for Prom {
    fn write_url(&self) -> String {
        format!("http://127.0.0.1:{}/api/v1/write", self.port)
    }
    fn stop(&mut self) {
        Prom::stop(self)
    }
    fn restart(&mut self) {
        Prom::restart(self)
    }
    fn series(&self, selector: &str) -> BTreeMap<String, Vec<(u64, f64)>> {
        self.samples(selector)
    }
}

impl Receiver for Vm {
    fn write_url(&self) -> String {
        format!("http://127.0.0.1:{}/api/v1/write", self.port())
    }
    fn stop(&mut self) {
        Vm::stop(self)
    }
    fn restart(&mut self) {
        Vm::restart(self)
    }
    fn series(&self, selector: &str) -> BTreeMap<String, Vec<(u64, f64)>> {
        self.export(selector)
    }
}

/// Scrapes every second into a remote write sink, through an outage of the receiver; then every
/// scrape must be stored once, at its scrape time, with its labels. `stream` is added to the
/// stream's settings.
fn scrapes_survive_an_outage(sb: &Sandbox, rx: &mut dyn Receiver, stream: &str) {
    let endpoint = Endpoint::start(Box::new(|path, n| match path {
        "/metrics" => (
            200,
            "text/plain; version=0.0.4",
            format!(
                "# TYPE scrapes_total counter\nscrapes_total {n}\n\
                 # TYPE temperature_celsius gauge\n\
                 temperature_celsius{{line=\"hall a\",sensor=\"t1\"}} {}\n",
                20 + n
            ),
        ),
        _ => (404, "text/plain", "no\n".into()),
    }));
    let config = sb.write_config(&format!(
        r#"data_dir: data
log: {{format: json}}
sinks:
  tsdb:
    type: prometheus_remote_write
    url: {url}
    external_labels: {{ gateway: gw-17 }}
    link: {{ down_after: 1, backoff_base: 100ms, backoff_cap: 500ms }}
streams:
  prom: {{ sink: tsdb{stream} }}
tasks:
  - name: plc
    type: http_scrape
    every: 1s
    url: {metrics}
    format: prometheus
    stream: prom
    measurement: factory
    tags: {{ site: plant-1 }}
    timeout: 5s
"#,
        url = quote(rx.write_url()),
        metrics = quote(endpoint.url("/metrics")),
    ));
    let scrapes = r#"{__name__="scrapes_total"}"#;
    let mut agent = Proc::run(&config);
    agent.wait_until(secs(30), "a few scrapes stored", || {
        rx.series(scrapes).values().any(|s| s.len() >= 3)
    });
    rx.stop();
    let outage_start = now_ms();
    agent.wait_for_event(secs(20), "the link going down", |e| {
        field(e, "message").starts_with("link down")
    });
    // A 30 s outage, a scrape a second into it.
    let before = endpoint.served("/metrics").len();
    agent.wait_until(secs(60), "thirty scrapes during the outage", || {
        endpoint.served("/metrics").len() >= before + 30
    });
    let outage_end = now_ms();
    rx.restart();
    agent.wait_until(secs(30), "more scrapes after the outage", || {
        endpoint.served("/metrics").len() >= before + 33
    });
    endpoint.freeze();
    let served = endpoint.served("/metrics");
    let last = served.len() as f64;
    agent.wait_until(secs(60), "every scrape stored", || {
        rx.series(scrapes)
            .values()
            .next()
            .is_some_and(|s| s.last().map(|x| x.1) == Some(last))
    });
    agent.signal(libc::SIGTERM);
    assert_code(agent.wait_exit(secs(20)), 0, &agent.stderr());

    let got = rx.series(scrapes);
    assert_eq!(got.len(), 1, "one series: {got:?}");
    let (labels, samples) = got.iter().next().unwrap();
    for label in [
        r#""job":"factory""#,
        r#""site":"plant-1""#,
        r#""gateway":"gw-17""#,
    ] {
        assert!(labels.contains(label), "{label} in {labels}");
    }
    check_series("scrapes_total", samples, &served, 1.0);
    let during = samples
        .iter()
        .filter(|(ts, _)| (outage_start..outage_end).contains(ts))
        .count();
    assert!(
        during >= 29,
        "samples scraped during the outage keep their scrape time: {during}"
    );
    let temp = rx.series(r#"{__name__="temperature_celsius",sensor="t1"}"#);
    let (labels, t) = temp.iter().next().expect("the temperature series");
    assert!(labels.contains(r#""line":"hall a""#), "{labels}");
    let shifted: Vec<(u64, f64)> = t.iter().map(|(ts, v)| (*ts, v - 20.0)).collect();
    check_series("temperature_celsius", &shifted, &served, 1.0);
}

#[test]
fn scrapes_reach_prometheus_through_an_outage_at_their_scrape_time() {
    let sb = Sandbox::new();
    let mut p = Prom::start(&sb.file("prom"), free_port(), Some("1h"));
    scrapes_survive_an_outage(&sb, &mut p, "");
}

/// With `replay: live_first` (a live window well inside the 30 s outage): the scrapes after the
/// outage go ahead of the backlog, and VictoriaMetrics, which takes samples in any order, stores
/// every one at its scrape time all the same.
#[test]
fn scrapes_reach_victoriametrics_through_an_outage_at_their_scrape_time_live_first() {
    let sb = Sandbox::new();
    let mut vm = Vm::start(&sb.file("vm"), free_port());
    scrapes_survive_an_outage(&sb, &mut vm, ", replay: live_first, live_window: 5s");
}

/// `colibri queue <args>` with `input` on stdin: (exit code, stdout, stderr).
pub(crate) fn queue(config: &Path, args: &[&str], input: &str) -> (i32, String, String) {
    use std::io::Write as _;
    let mut child = colibri()
        .arg("queue")
        .args(args)
        .arg("--config")
        .arg(config)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn colibri queue");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `colibri queue dead list STREAM --json`: one JSON value per dead letter (it must succeed).
pub(crate) fn dead_letters(config: &Path, stream: &str) -> Vec<Value> {
    let (code, out, err) = queue(config, &["dead", "list", stream, "--json"], "");
    assert_eq!(code, 0, "{err}");
    out.lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

/// A Prometheus without an out-of-order window refuses a sample older than the series' newest
/// (400): the job is dead-lettered, and its reason says what would take it. A record that cannot
/// be a sample (a string field) is dead-lettered naming the field; the queue goes on.
#[test]
fn refusals_dead_letter_with_the_reason() {
    let sb = Sandbox::new();
    let p = Prom::start(&sb.file("prom"), free_port(), None);
    let config = sb.write_config(&format!(
        r#"data_dir: data
log: {{format: json}}
sinks:
  tsdb: {{ type: prometheus_remote_write, url: {url}, retry: {{ max_attempts: 1 }} }}
streams:
  m: {{ sink: tsdb, batch: {{ max_records: 1 }} }}
  n: {{ sink: tsdb }}
"#,
        url = quote(Receiver::write_url(&p)),
    ));
    let now = now_ms();
    // One job of three: the string sample is dead-lettered alone, the two around it are stored.
    let job = format!(
        "tank level=1 {}\ntank state=\"x\" {}\ntank level=3 {now}\n",
        now - 2000,
        now - 1000
    );
    let (code, _, err) = queue(&config, &["push", "n"], &job);
    assert_eq!(code, 0, "{err}");
    let lines = format!(
        "reactor,unit=1 pressure=3.5 {now}\nreactor,unit=1 pressure=2 {}\nreactor,unit=1 state=\"open\" {now}\nreactor,unit=1 pressure=4 {}\n",
        now - 600_000,
        now + 1000,
    );
    let (code, _, err) = queue(&config, &["push", "m"], &lines);
    assert_eq!(code, 0, "{err}");
    let mut agent = Proc::run(&config);
    agent.wait_until(secs(30), "the last sample stored", || {
        p.samples(r#"{__name__="pressure"}"#)
            .values()
            .next()
            .is_some_and(|s| s.last().map(|x| x.1) == Some(4.0))
    });
    agent.signal(libc::SIGTERM);
    assert_code(agent.wait_exit(secs(20)), 0, &agent.stderr());
    let stored = p.samples(r#"{__name__="pressure"}"#);
    let values: Vec<f64> = stored
        .values()
        .next()
        .unwrap()
        .iter()
        .map(|x| x.1)
        .collect();
    assert_eq!(values, [3.5, 4.0], "the old sample is not stored");
    let level: Vec<f64> = p
        .samples(r#"{__name__="level"}"#)
        .values()
        .flatten()
        .map(|x| x.1)
        .collect();
    assert_eq!(level, [1.0, 3.0], "the records around the string one");
    let dead = dead_letters(&config, "n");
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(
        dead[0]["records"][0],
        format!("tank state=\"x\" {}", now - 1000),
        "{dead:?}"
    );
    assert_eq!(
        dead[0]["last_error"],
        "record 1 of the job has field \"state\" as a string, and remote write carries numbers only",
        "{dead:?}"
    );
    let (code, out, err) = queue(&config, &["dead", "list", "m", "--json"], "");
    assert_eq!(code, 0, "{err}");
    let dead: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(dead.len(), 2, "{dead:?}");
    let reasons: Vec<&str> = dead
        .iter()
        .map(|d| d["last_error"].as_str().unwrap_or_default())
        .collect();
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("400") && r.contains("out_of_order_time_window")),
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("has field \"state\" as a string") && r.contains("record 0")),
        "{reasons:?}"
    );
}

/// A Prometheus without an out-of-order window behind `max_age`, with the present first: after
/// an outage the scrapes older than `max_age` (the live window too) go to an archive stream,
/// here remote-written to VictoriaMetrics, which takes any order. Prometheus never sees a sample
/// older than its newest (no dead letters), the archive has the outage, and between them every
/// scrape is stored (once, but for a job in flight when Prometheus stopped).
#[test]
fn prometheus_without_a_window_behind_max_age_and_the_past_archived() {
    let sb = Sandbox::new();
    let mut p = Prom::start(&sb.file("prom"), free_port(), None);
    let vm = Vm::start(&sb.file("vm"), free_port());
    let endpoint = Endpoint::start(Box::new(|path, n| match path {
        "/metrics" => (
            200,
            "text/plain; version=0.0.4",
            format!("# TYPE scrapes_total counter\nscrapes_total {n}\n"),
        ),
        _ => (404, "text/plain", "no\n".into()),
    }));
    let config = sb.write_config(&format!(
        r#"data_dir: data
log: {{format: json}}
sinks:
  tsdb:
    type: prometheus_remote_write
    url: {url}
    link: {{ down_after: 1, backoff_base: 100ms, backoff_cap: 500ms }}
  archive: {{ type: prometheus_remote_write, url: {archive} }}
streams:
  prom: {{ sink: tsdb, replay: live_first, live_window: 3s, max_age: 3s, on_max_age: "stream:past" }}
  past: {{ sink: archive }}
tasks:
  - name: plc
    type: http_scrape
    every: 1s
    url: {metrics}
    format: prometheus
    stream: prom
    measurement: factory
    timeout: 5s
"#,
        url = quote(Receiver::write_url(&p)),
        archive = quote(Receiver::write_url(&vm)),
        metrics = quote(endpoint.url("/metrics")),
    ));
    let scrapes = r#"{__name__="scrapes_total"}"#;
    let values = |s: BTreeMap<String, Vec<(u64, f64)>>| -> Vec<(u64, f64)> {
        s.into_values().flatten().collect()
    };
    let mut agent = Proc::run(&config);
    agent.wait_until(secs(30), "a few scrapes stored", || {
        values(p.samples(scrapes)).len() >= 3
    });
    p.stop();
    let outage_start = now_ms();
    agent.wait_for_event(secs(20), "the link going down", |e| {
        field(e, "message").starts_with("link down")
    });
    let before = endpoint.served("/metrics").len();
    agent.wait_until(secs(60), "fifteen scrapes during the outage", || {
        endpoint.served("/metrics").len() >= before + 15
    });
    let outage_end = now_ms();
    p.restart();
    // Prometheus answers again: what was older than max_age then is not for it.
    let back = now_ms();
    agent.wait_until(secs(30), "more scrapes after the outage", || {
        endpoint.served("/metrics").len() >= before + 20
    });
    endpoint.freeze();
    let last = endpoint.served("/metrics").len();
    let stored = || {
        let mut all: Vec<u64> = values(p.samples(scrapes))
            .into_iter()
            .chain(values(vm.export(scrapes)))
            .map(|(_, v)| v as u64)
            .collect();
        all.sort_unstable();
        all.dedup();
        all
    };
    agent.wait_until(secs(60), "every scrape stored in one or the other", || {
        stored().len() == last
    });
    agent.signal(libc::SIGTERM);
    assert_code(agent.wait_exit(secs(20)), 0, &agent.stderr());

    assert_eq!(stored(), (1..=last as u64).collect::<Vec<_>>());
    let (prom, past) = (values(p.samples(scrapes)), values(vm.export(scrapes)));
    // The job in flight when Prometheus stopped may have been stored; a second of slack.
    let too_old = |ts: &u64| (outage_start + 2_000..back - 4_000).contains(ts);
    let sent_too_old: Vec<_> = prom.iter().filter(|(ts, _)| too_old(ts)).collect();
    assert!(
        sent_too_old.is_empty(),
        "Prometheus got no backlog: {prom:?}"
    );
    let archived = past
        .iter()
        .filter(|(ts, _)| (outage_start..outage_end).contains(ts));
    assert!(
        archived.count() >= 8,
        "the archive has the outage: {past:?}"
    );
    let both: Vec<f64> = prom
        .iter()
        .filter(|(_, v)| past.iter().any(|(_, w)| w == v))
        .map(|(_, v)| *v)
        .collect();
    assert!(both.len() <= 1, "at most the job in flight twice: {both:?}");
    for stream in ["prom", "past"] {
        let dead = dead_letters(&config, stream);
        assert!(dead.is_empty(), "{stream}: no dead letters: {dead:?}");
    }
}
