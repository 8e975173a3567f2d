//! End to end against a real VictoriaMetrics (Debian's `victoria-metrics`, which `scripts/test.sh`
//! installs): the real binary scrapes a local endpoint serving Prometheus text and another serving
//! JSON every second into two streams, delivered with `encoding: influx_line` to VictoriaMetrics'
//! InfluxDB 1.x endpoint (`/write?db=`, precision ms) and its 2.x endpoint (`/api/v2/write`, a token
//! header, precision us). VictoriaMetrics is stopped for a while and started again on the same data;
//! the export API must then return every sample once, at the time it was scraped, not delivered.
//!
//! Every scrape serves a value that counts the GETs, so a missing, doubled or re-timed sample shows.

#[path = "util/serve.rs"]
mod serve;
#[allow(dead_code)] // shared with the other test binaries; each uses its own part of it
mod util;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime};

use serde_json::Value;

use serve::Endpoint;
use util::{Proc, Sandbox, assert_code, field, poll, quote};

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A VictoriaMetrics process on a loopback port with its own data directory.
struct Vm {
    child: Option<Child>,
    port: u16,
    data: PathBuf,
}

impl Vm {
    fn start(data: &Path, port: u16) -> Vm {
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

    fn get(&self, path: &str) -> Option<String> {
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
    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            util::send_signal(c.id() as i32, libc::SIGTERM);
            let exited = poll(secs(30), || c.try_wait().ok().flatten());
            if exited.is_none() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }

    fn restart(&mut self) {
        self.stop();
        let again = Vm::start(&self.data, self.port);
        *self = again;
    }

    /// Every sample of the series matching `selector`, merged per series (the export API may
    /// split one series over several lines): labels -> (timestamp ms, value), sorted by time.
    fn export(&self, selector: &str) -> BTreeMap<String, Vec<(u64, f64)>> {
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

impl Drop for Vm {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The samples of one series must be exactly the scrapes served: value n at the time of GET n.
#[track_caller]
fn check_series(what: &str, samples: &[(u64, f64)], served: &[(u64, u64)], scale: f64) {
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
