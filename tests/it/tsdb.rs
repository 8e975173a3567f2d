//! End to end against a real VictoriaMetrics (Debian's `victoria-metrics`, which `scripts/test.sh`
//! installs): the real binary scrapes a local endpoint serving Prometheus text and another serving
//! JSON every second into two streams, delivered with `encoding: influx_line` to VictoriaMetrics'
//! InfluxDB 1.x endpoint (`/write?db=`, precision ms) and its 2.x endpoint (`/api/v2/write`, a token
//! header, precision us). VictoriaMetrics is stopped for a while and started again on the same data;
//! the export API must then return every sample once, at the time it was scraped, not delivered.
//!
//! Every scrape serves a value that counts the GETs, so a missing, doubled or re-timed sample shows.
//!
//! A second test feeds one such stream every way there is (ingest `text/plain`, `queue push`, a
//! scrape) and reads each back from VictoriaMetrics, while JSON bodies and bad lines are refused
//! before anything is stored: VictoriaMetrics answers 204 to a line it cannot parse and drops it,
//! so only colibri can catch them. Its `vm_rows_invalid_total` must stay 0.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::SystemTime;

use serde_json::Value;

use crate::util::secs;
use crate::util::serve::Endpoint;
use crate::util::{Proc, Sandbox, assert_code, colibri, field, poll, quote};

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A VictoriaMetrics process on a loopback port with its own data directory.
pub(crate) struct Vm {
    child: Option<Child>,
    port: u16,
    data: PathBuf,
}

impl Vm {
    pub(crate) fn start(data: &Path, port: u16) -> Vm {
        let child = Command::new("victoria-metrics")
            .arg(format!("-storageDataPath={}", data.display()))
            .arg(format!("-httpListenAddr=127.0.0.1:{port}"))
            .arg("-retentionPeriod=100y")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start victoria-metrics ({e}): install Debian's victoria-metrics package (scripts/test.sh does)")
            });
        let vm = Vm {
            child: Some(child),
            port,
            data: data.to_path_buf(),
        };
        poll(secs(20), || {
            (vm.get("/health").as_deref() == Some("OK")).then_some(())
        })
        .expect("victoria-metrics answers /health");
        vm
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    pub(crate) fn get(&self, path: &str) -> Option<String> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(secs(10))).ok()?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        let (head, body) = out.split_once("\r\n\r\n")?;
        let ok = head.split_whitespace().nth(1) == Some("200");
        ok.then(|| body.trim().to_string())
    }

    /// Stops it the way its unit does (SIGTERM: it flushes what it acknowledged).
    pub(crate) fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            crate::util::send_signal(c.id() as i32, libc::SIGTERM);
            let exited = poll(secs(30), || c.try_wait().ok().flatten());
            if exited.is_none() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }

    pub(crate) fn restart(&mut self) {
        self.stop();
        let again = Vm::start(&self.data, self.port);
        *self = again;
    }

    /// Every sample of the series matching `selector`, merged per series (the export API may
    /// split one series over several lines): labels -> (timestamp ms, value), sorted by time.
    pub(crate) fn export(&self, selector: &str) -> BTreeMap<String, Vec<(u64, f64)>> {
        let q: String = selector
            .bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'.' | b'-' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        let text = self
            .get(&format!("/api/v1/export?match[]={q}"))
            .expect("the export API answers");
        let mut out: BTreeMap<String, Vec<(u64, f64)>> = BTreeMap::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let v: Value = serde_json::from_str(line).expect("an export line is JSON");
            let labels = v["metric"].to_string();
            let ts = v["timestamps"].as_array().expect("timestamps");
            let vals = v["values"].as_array().expect("values");
            let series = out.entry(labels).or_default();
            for (t, x) in ts.iter().zip(vals) {
                series.push((t.as_u64().expect("ms"), x.as_f64().expect("a number")));
            }
        }
        for s in out.values_mut() {
            s.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
        }
        out
    }
}

impl Vm {
    /// A counter of VictoriaMetrics' own `/metrics`, by its exact name and labels.
    fn metric(&self, series: &str) -> f64 {
        let text = self
            .get("/metrics")
            .expect("victoria-metrics answers /metrics");
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in victoria-metrics' /metrics"))
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A port nothing listens on, for a server a test starts (a broker, colibri's listeners). Taken
/// below the kernel's ephemeral range (32768-60999 by default), where no outgoing connection is
/// given a port: a port the kernel handed out from `:0` can be taken as the source port of any
/// connection before the server binds it (a nats-server restarted in a kill loop once found its
/// port so taken). Each process walks its own sequence, so parallel tests never share one.
pub(crate) fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 10_000;
    const SPAN: u32 = 22_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(7_919);
    for _ in 0..SPAN {
        let port = LOW + start.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed)) % SPAN;
        let port = u16::try_from(port).expect("below 32,000");
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
            && std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok()
        {
            return port;
        }
    }
    panic!("no free port in 10000-31999")
}

/// The samples of one series must be exactly the scrapes served: value n at the time of GET n.
#[track_caller]
pub(crate) fn check_series(what: &str, samples: &[(u64, f64)], served: &[(u64, u64)], scale: f64) {
    let values: Vec<f64> = samples.iter().map(|(_, v)| *v).collect();
    let want: Vec<f64> = served.iter().map(|(n, _)| *n as f64 * scale).collect();
    assert_eq!(values, want, "{what}: every scrape stored once, in order");
    for ((ts, v), (n, at)) in samples.iter().zip(served) {
        // The record's time is taken just before the GET; the endpoint notes when it answered.
        assert!(
            *ts <= *at && at - ts < 2000,
            "{what}: sample {v} (GET {n}) is stamped {ts}, answered at {at}: not its scrape time"
        );
    }
}

#[test]
fn scrapes_survive_a_victoriametrics_outage_and_land_at_their_scrape_time() {
    let sb = Sandbox::new();
    let mut vm = Vm::start(&sb.file("vm"), free_port());
    let endpoint = Endpoint::start(Box::new(|path, n| match path {
        "/metrics" => (
            200,
            "text/plain; version=0.0.4",
            format!(
                "# HELP scrapes_total GETs of this endpoint.\n# TYPE scrapes_total counter\n\
                 scrapes_total {n}\n\
                 # TYPE temperature_celsius gauge\n\
                 temperature_celsius{{line=\"hall a\",sensor=\"t1\"}} {}\n\
                 temperature_celsius{{line=\"hall a\",sensor=\"broken\"}} NaN\n",
                20 + n
            ),
        ),
        "/status.json" => (
            200,
            "application/json",
            format!(
                r#"{{"data": {{"items": [{{"id": "m1", "rpm": {n}, "running": true}}, {{"id": "m2", "rpm": {}, "running": false}}]}}}}"#,
                n * 2
            ),
        ),
        _ => (404, "text/plain", "no\n".into()),
    }));
    let vm_url = |path: &str| format!("http://127.0.0.1:{}{path}", vm.port);
    let config = sb.write_config(&format!(
        r#"data_dir: data
log: {{format: json}}
sinks:
  influx1:
    type: http
    url: {v1}
    encoding: influx_line
    precision: ms
    link: {{ down_after: 1, backoff_base: 100ms, backoff_cap: 500ms }}
  influx2:
    type: http
    url: {v2}
    encoding: influx_line
    precision: us
    headers: {{ Authorization: "Token not-checked-by-vm" }}
    link: {{ down_after: 1, backoff_base: 100ms, backoff_cap: 500ms }}
streams:
  prom: {{ sink: influx1 }}
  json: {{ sink: influx2 }}
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
  - name: mills
    type: http_scrape
    every: 1s
    url: {status}
    format: json
    stream: json
    measurement: mill
    json: {{ records: /data/items, tags: {{ id: /id }} }}
    timeout: 5s
"#,
        v1 = quote(vm_url("/write?db=plant")),
        v2 = quote(vm_url("/api/v2/write?org=colibri&bucket=plant")),
        metrics = quote(endpoint.url("/metrics")),
        status = quote(endpoint.url("/status.json")),
    ));
    let mut agent = Proc::run(&config);
    agent.wait_until(secs(20), "a few scrapes stored", || {
        vm.export(r#"{__name__="factory_scrapes_total"}"#)
            .values()
            .any(|s| s.len() >= 3)
    });
    // The outage: scrapes go on and are buffered.
    vm.stop();
    let outage_start = now_ms();
    agent.wait_for_event(secs(20), "the link going down", |e| {
        field(e, "message").starts_with("link down")
    });
    let served_before = endpoint.served("/metrics").len();
    agent.wait_until(secs(30), "five scrapes during the outage", || {
        endpoint.served("/metrics").len() >= served_before + 5
    });
    let outage_end = now_ms();
    vm.restart();
    agent.wait_until(secs(30), "more scrapes after the outage", || {
        endpoint.served("/metrics").len() >= served_before + 8
    });
    // No more scrapes from here on; wait until everything served is stored, then compare.
    endpoint.freeze();
    let (prom, json) = (endpoint.served("/metrics"), endpoint.served("/status.json"));
    let last = prom.len() as f64;
    agent.wait_until(secs(30), "every scrape stored", || {
        let e = vm.export(r#"{__name__="factory_scrapes_total"}"#);
        e.values()
            .next()
            .is_some_and(|s| s.last().map(|x| x.1) == Some(last))
            && vm
                .export(r#"{__name__="mill_rpm",id="m1"}"#)
                .values()
                .next()
                .is_some_and(|s| s.len() == json.len())
    });
    agent.signal(libc::SIGTERM);
    assert_code(agent.wait_exit(secs(20)), 0, &agent.stderr());

    let scrapes = vm.export(r#"{__name__="factory_scrapes_total"}"#);
    assert_eq!(scrapes.len(), 1, "one series: {scrapes:?}");
    let (labels, samples) = scrapes.iter().next().unwrap();
    assert!(
        labels.contains(r#""db":"plant""#) && labels.contains(r#""site":"plant-1""#),
        "{labels}"
    );
    check_series("factory_scrapes_total", samples, &prom, 1.0);
    let during: Vec<_> = samples
        .iter()
        .filter(|(ts, _)| (outage_start..outage_end).contains(ts))
        .collect();
    assert!(
        during.len() >= 4,
        "samples scraped during the outage keep their scrape time: {during:?}"
    );
    let temp = vm.export(r#"{__name__="factory_temperature_celsius"}"#);
    assert_eq!(
        temp.len(),
        1,
        "the NaN sample is skipped, the other kept: {temp:?}"
    );
    let (labels, t) = temp.iter().next().unwrap();
    assert!(
        labels.contains(r#""line":"hall a""#),
        "labels with a space: {labels}"
    );
    let shifted: Vec<(u64, f64)> = t.iter().map(|(ts, v)| (*ts, v - 20.0)).collect();
    check_series("factory_temperature_celsius", &shifted, &prom, 1.0);

    for (id, scale) in [("m1", 1.0), ("m2", 2.0)] {
        let rpm = vm.export(&format!(r#"{{__name__="mill_rpm",id="{id}"}}"#));
        let samples = rpm.values().next().expect("the rpm series");
        check_series(&format!("mill_rpm {id}"), samples, &json, scale);
        let running = vm.export(&format!(r#"{{__name__="mill_running",id="{id}"}}"#));
        assert_eq!(
            running.values().next().map(Vec::len),
            Some(json.len()),
            "booleans too"
        );
    }
}

/// `colibri queue push <stream>` with `input` on stdin: (exit code, stdout, stderr).
fn queue_push(config: &Path, stream: &str, input: &str) -> (i32, String, String) {
    let mut child = colibri()
        .args(["queue", "push", stream, "--config"])
        .arg(config)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn colibri queue push");
    let mut stdin = child.stdin.take().expect("piped");
    stdin.write_all(input.as_bytes()).expect("feed queue push");
    drop(stdin);
    let out = child.wait_with_output().expect("queue push ends");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The values of the one series matching `selector`, with their times.
fn one_series(vm: &Vm, selector: &str) -> Vec<(u64, f64)> {
    let e = vm.export(selector);
    assert!(e.len() <= 1, "{selector}: one series at most: {e:?}");
    e.into_values().next().unwrap_or_default()
}

/// A stream whose sink has `encoding: influx_line` carries line protocol from every producer:
/// `text/plain` ingest, `queue push` and a Prometheus scrape all land in a real VictoriaMetrics, a
/// line without a timestamp at the time colibri accepted it. JSON bodies get 415, a bad line gets
/// 400 naming it (`queue push`: exit 1 naming it, what came before it kept), and nothing of those
/// reaches VictoriaMetrics: it counts no invalid row.
#[test]
fn line_protocol_from_ingest_push_and_scrape_reaches_victoriametrics() {
    let sb = Sandbox::new();
    let vm = Vm::start(&sb.file("vm"), free_port());
    let endpoint = Endpoint::start(Box::new(|path, n| match path {
        "/metrics" => (
            200,
            "text/plain; version=0.0.4",
            format!("# TYPE scrapes_total counter\nscrapes_total {n}\n"),
        ),
        _ => (404, "text/plain", "no\n".into()),
    }));
    let ingest_port = free_port();
    let config = sb.write_config(&format!(
        r#"data_dir: data
log: {{format: json}}
ingest: {{ listen: "127.0.0.1:{ingest_port}" }}
sinks:
  vm:
    type: http
    url: {url}
    encoding: influx_line
    precision: ms
    link: {{ down_after: 1, backoff_base: 100ms, backoff_cap: 500ms }}
  collector: {{ type: http, url: "http://127.0.0.1:9/", link: {{ probe: tcp }} }}
streams:
  metrics: {{ sink: vm, batch: {{ linger: 100ms }} }}
  events: {{ sink: collector }}
  logs: {{}}
tasks:
  - {{ name: plc, type: http_scrape, every: 1s, url: {scrape}, format: prometheus, stream: metrics, timeout: 5s }}
"#,
        url = quote(format!("http://127.0.0.1:{}/write?db=edge", vm.port)),
        scrape = quote(endpoint.url("/metrics")),
    ));
    // The store exists once the agent ran.
    let mut agent = Proc::run(&config);
    agent.wait_for_event(secs(30), "colibri started", |e| {
        field(e, "message").starts_with("colibri started")
    });
    agent.signal(libc::SIGTERM);
    assert_code(agent.wait_exit(secs(30)), 0, &agent.stderr());

    // queue push: lines of line protocol, one without a timestamp.
    let t_given = now_ms() - 60_000;
    let before_push = now_ms();
    let (code, out, err) = queue_push(
        &config,
        "metrics",
        &format!("pushed,via=cli value=1 {t_given}\n\npushed,via=cli value=2\n"),
    );
    let after_push = now_ms();
    assert_eq!((code, out.as_str()), (0, "acked 2\n"), "{err}");
    // A JSON line stops the push at that line; the line before it is stored, the one after is not.
    let (code, out, err) = queue_push(
        &config,
        "metrics",
        &format!(
            "pushed,via=cli value=3 {t_given}\n{{\"measurement\":\"pushed\",\"value\":4}}\npushed,via=cli value=5 {t_given}\n"
        ),
    );
    assert_eq!((code, out.as_str()), (1, "acked 1\n"), "{err}");
    assert!(
        err.contains("line 2") && err.contains("line protocol"),
        "names the line and what it should be: {err}"
    );
    // A stream with a JSON sink takes JSON lines only; one without a sink takes any line.
    let (code, out, err) = queue_push(&config, "events", "{\"a\":1}\nm v=1\n");
    assert_eq!((code, out.as_str()), (1, "acked 1\n"), "{err}");
    assert!(err.contains("line 2 is not JSON"), "{err}");
    let (code, out, err) = queue_push(&config, "logs", "{\"a\":1}\nm v=1\n");
    assert_eq!((code, out.as_str()), (0, "acked 2\n"), "{err}");

    let mut agent = Proc::run(&config);
    agent.wait_for_event(secs(30), "colibri started", |e| {
        field(e, "message").starts_with("colibri started")
    });
    let mut c =
        crate::util::client::Client::new(std::net::SocketAddr::from(([127, 0, 0, 1], ingest_port)));
    let path = "/v1/streams/metrics/records";
    let before_post = now_ms();
    let a = c
        .post(
            path,
            "text/plain; charset=utf-8",
            &[],
            format!("ingested,via=api value=10 {t_given}\r\ningested,via=api value=11\n")
                .as_bytes(),
        )
        .expect("an answer");
    let after_post = now_ms();
    assert_eq!(
        (a.status, a.json()),
        (200, serde_json::json!({"accepted": 2})),
        "{}",
        a.text()
    );
    for (ctype, body) in [
        (
            "application/x-ndjson",
            "{\"measurement\":\"json_body\",\"value\":1}\n",
        ),
        (
            "application/json",
            "[{\"measurement\":\"json_body\",\"value\":1}]",
        ),
    ] {
        let a = c
            .post(path, ctype, &[], body.as_bytes())
            .expect("an answer");
        assert_eq!(a.status, 415, "{ctype}: {}", a.text());
        assert!(
            a.error().contains("influx line protocol") && a.error().contains("text/plain"),
            "{ctype}: the reason and what to send: {}",
            a.text()
        );
    }
    let a = c
        .post(
            path,
            "text/plain",
            &[],
            format!("ingested,via=api value=12 {t_given}\n\"ingested,via=api value=13\"\n")
                .as_bytes(),
        )
        .expect("an answer");
    assert_eq!(a.status, 400, "{}", a.text());
    assert_eq!(a.json()["line"], 2, "{}", a.text());
    assert!(a.error().contains("line 2"), "{}", a.text());
    // A JSON stream still refuses text/plain.
    let a = c
        .post("/v1/streams/logs/records", "text/plain", &[], b"m v=1\n")
        .expect("an answer");
    assert_eq!(a.status, 415, "{}", a.text());

    agent.wait_until(
        secs(30),
        "pushed, ingested and scraped samples in VictoriaMetrics",
        || {
            one_series(&vm, r#"{__name__="pushed_value"}"#).len() == 3
                && one_series(&vm, r#"{__name__="ingested_value"}"#).len() == 2
                && one_series(&vm, r#"{__name__="plc_scrapes_total"}"#).len() >= 2
        },
    );
    agent.signal(libc::SIGTERM);
    assert_code(agent.wait_exit(secs(30)), 0, &agent.stderr());

    let pushed = one_series(&vm, r#"{__name__="pushed_value",via="cli",db="edge"}"#);
    let values: Vec<f64> = pushed.iter().map(|s| s.1).collect();
    assert_eq!(values, [1.0, 3.0, 2.0], "by time: {pushed:?}");
    assert_eq!((pushed[0].0, pushed[1].0), (t_given, t_given), "{pushed:?}");
    assert!(
        (before_push..=after_push).contains(&pushed[2].0),
        "a pushed line without a timestamp is stamped when pushed: {pushed:?} not in {before_push}..{after_push}"
    );
    let ingested = one_series(&vm, r#"{__name__="ingested_value",via="api",db="edge"}"#);
    assert_eq!(
        ingested.iter().map(|s| s.1).collect::<Vec<_>>(),
        [10.0, 11.0],
        "{ingested:?}"
    );
    assert_eq!(ingested[0].0, t_given);
    assert!(
        (before_post..=after_post).contains(&ingested[1].0),
        "an ingested line without a timestamp is stamped when accepted: {ingested:?} not in {before_post}..{after_post}"
    );
    assert!(
        vm.export(r#"{__name__=~"json_body.*"}"#).is_empty(),
        "no JSON body was stored"
    );
    assert_eq!(
        vm.metric(r#"vm_rows_invalid_total{type="influx"}"#),
        0.0,
        "colibri sent no line VictoriaMetrics could not read"
    );
}

/// The scraped value of GET `n` in the report-by-exception test: a slow ramp (0.002 a GET) with
/// noise (a fixed pattern within ±0.05), 5 higher from GET [`STEP_AT`] on.
fn ramp(n: u64) -> f64 {
    let noise = ((n * 7919) % 101) as f64 / 1000.0 - 0.05;
    20.0 + 0.002 * n as f64 + noise + if n >= STEP_AT { 5.0 } else { 0.0 }
}

const STEP_AT: u64 = 60;
/// GETs answered 500: a failed scrape.
const FAIL: std::ops::Range<u64> = 90..93;

/// Report by exception through `http_scrape` (Prometheus text into VictoriaMetrics by line
/// protocol): a gauge on a noisy ramp with a step, `deadband: 0.5`, `heartbeat: 3s`, and a constant
/// with a deadband and heartbeat of its own (`fields:`) that never let it through again. Sent: the
/// first value, heartbeats, the step at exactly the GET it appeared in, and after a failed scrape
/// every value again; at least ten times fewer values than scrapes. `/metrics` counts them.
#[test]
fn a_deadband_sends_a_scraped_ramp_by_exception() {
    let sb = Sandbox::new();
    let vm = Vm::start(&sb.file("vm"), free_port());
    let endpoint = Endpoint::start(Box::new(|path, n| match path {
        "/metrics" if FAIL.contains(&n) => (500, "text/plain", "busy\n".into()),
        "/metrics" => (
            200,
            "text/plain; version=0.0.4",
            format!(
                "# TYPE level gauge\nlevel{{tank=\"t1\"}} {}\n# TYPE speed gauge\nspeed 12.5\n",
                ramp(n)
            ),
        ),
        _ => (404, "text/plain", "no\n".into()),
    }));
    let admin = free_port();
    let config = sb.write_config(&format!(
        r#"data_dir: data
log: {{format: json}}
admin: {{ listen: "127.0.0.1:{admin}" }}
sinks:
  vm: {{ type: http, url: "http://127.0.0.1:{vm}/write?db=plant", encoding: influx_line, precision: ms }}
streams:
  m: {{ sink: vm }}
tasks:
  - name: tank
    type: http_scrape
    every: 100ms
    url: {url}
    format: prometheus
    stream: m
    deadband: 0.5
    heartbeat: 3s
    fields: {{ speed: {{ deadband: 1000, heartbeat: 1h }} }}
"#,
        vm = vm.port,
        url = quote(endpoint.url("/metrics")),
    ));
    let mut agent = Proc::start(&config);
    agent.wait_until(secs(60), "140 scrapes", || {
        endpoint.served("/metrics").len() >= 140
    });
    let served = endpoint.freeze();
    let of = |text: &str, series: &str| crate::lanes::sample(text, series);
    let text = poll(secs(30), || {
        let text = crate::lanes::scrape(admin);
        let failed = of(
            &text,
            r#"colibri_task_runs_total{task="tank",outcome="failed"}"#,
        );
        let appended = of(
            &text,
            r#"colibri_stream_appended_records_total{stream="m"}"#,
        );
        let delivered = of(
            &text,
            r#"colibri_stream_delivered_records_total{stream="m"}"#,
        );
        // A failed run after the freeze: no scrape adds values any more.
        (failed >= 2.0 && appended == delivered).then_some(text)
    })
    .expect("every sample delivered");
    agent.signal(libc::SIGTERM);
    assert_code(agent.wait_exit(secs(20)), 0, &agent.stderr());

    let scrapes = served.iter().filter(|(p, _, _)| p == "/metrics").count() as f64;
    let level = check_by_exception(&vm, &text, scrapes, u64::MAX);
    let step = level
        .iter()
        .find(|(_, v)| *v > 24.0)
        .expect("the step was sent");
    assert_eq!(
        step.1,
        ramp(STEP_AT),
        "the step, by the scrape it appeared in"
    );
    let after_failure = level.iter().find(|(_, v)| *v == ramp(FAIL.end));
    assert!(
        after_failure.is_some(),
        "the first value after the failed scrape: {level:?}"
    );
}

/// What both report-by-exception tests check of task `tank` (a `level` on the ramp, a constant
/// `speed` sent only first and after the failure, `deadband: 0.5`, `heartbeat: 3s`, two values a
/// run) once its samples are in `vm` and `text` is a scrape of `/metrics` taken after the last
/// run: at least ten times fewer values than `runs`, a heartbeat at least every 3 s (a run of
/// slack) before `failed_at`, and the counts exact. The `level` values, for the test's own checks.
pub(crate) fn check_by_exception(
    vm: &Vm,
    text: &str,
    runs: f64,
    failed_at: u64,
) -> Vec<(u64, f64)> {
    let series = |name: &str| -> Vec<(u64, f64)> {
        let s = vm.export(&format!(r#"{{__name__="tank_{name}"}}"#));
        assert_eq!(s.len(), 1, "{name}: {s:?}");
        s.into_values().next().unwrap()
    };
    let (level, speed) = (series("level"), series("speed"));
    assert_eq!(
        speed.len(),
        2,
        "the first, and the first after the failure: {speed:?}"
    );
    assert!(
        level.len() as f64 * 10.0 <= runs,
        "{} values sent of {runs} runs: {level:?}",
        level.len()
    );
    let before: Vec<u64> = level
        .iter()
        .map(|s| s.0)
        .filter(|t| *t < failed_at)
        .collect();
    for w in before.windows(2) {
        assert!(
            w[1] - w[0] <= 4_000,
            "a heartbeat at least every 3 s: {level:?}"
        );
    }
    let values = |outcome: &str| {
        let series = format!(r#"colibri_scrape_values_total{{task="tank",outcome="{outcome}"}}"#);
        crate::lanes::sample(text, &series)
    };
    let (sent, suppressed) = (values("sent"), values("suppressed"));
    eprintln!("report by exception: {runs} runs, {sent} values sent, {suppressed} suppressed");
    assert_eq!(sent, (level.len() + speed.len()) as f64, "{text}");
    assert_eq!(sent + suppressed, 2.0 * runs, "{text}");
    level
}
