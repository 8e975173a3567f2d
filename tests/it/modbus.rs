//! The `modbus` task against a real Modbus TCP device: PyPI's pymodbus serving known values
//! (`tests/fixtures/modbus_device.py`, installed by `scripts/test.sh`), on a loopback port.
//! Proven here: every type in both word orders, scaling, coils and discrete inputs, text, point
//! tags, reads grouped into as few requests as the limits allow; a poll every second delivered to
//! a real VictoriaMetrics at its poll time through an outage of VictoriaMetrics; the device
//! stopped mid-run is a failed run with the reason, retried, and polling resumes when it is back; an
//! exception answer names the point and the exception; samples as JSON for a JSON sink; an f32
//! written in its own digits, into a `file` sink's file named for line protocol; a device that
//! accepts and never answers is a timeout of the device, not of a process.

use std::path::Path;
use std::process::{Child, Command, Stdio};

use serde_json::Value;

use crate::store::peek_all;
use crate::tsdb::{Vm, free_port, now_ms};
use crate::util::{Proc, Sandbox, assert_code, field, poll, python, secs};

/// The test device on `port`.
pub(crate) struct Device {
    child: Option<Child>,
    pub(crate) port: u16,
    /// After the port (`ramp FLAG`: see the fixture).
    args: Vec<String>,
}

impl Device {
    pub(crate) fn start(port: u16) -> Device {
        Device::start_with(port, &[])
    }

    fn start_with(port: u16, args: &[&str]) -> Device {
        let args = args.iter().map(ToString::to_string).collect();
        let mut d = Device {
            child: None,
            port,
            args,
        };
        d.restart();
        d
    }

    fn restart(&mut self) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/modbus_device.py");
        let child = Command::new(python())
            .arg(&script)
            .arg(self.port.to_string())
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 (scripts/test.sh makes a venv with pymodbus)");
        self.child = Some(child);
        let port = self.port;
        poll(secs(20), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).ok()
        })
        .unwrap_or_else(|| {
            panic!("the Modbus test device did not listen on {port}: is PyPI's pymodbus installed (scripts/test.sh installs it)?")
        });
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        self.stop();
    }
}

const POINTS: &str = r#"
      - { name: speed, register: holding, address: 0, scale: 0.1 }
      - { name: delta, register: holding, address: 1, type: i16 }
      - { name: temp, register: holding, address: 2, type: f32 }
      - { name: flow, register: holding, address: 4, type: f32, word_order: little }
      - { name: count, register: holding, address: 6, type: u32 }
      - { name: label, register: holding, address: 8, type: string, length: 4 }
      - { name: pressure, register: input, address: 0, offset: -100 }
      - { name: energy, register: input, address: 1, type: f64 }
      - { name: pump, register: coil, address: 0 }
      - { name: valve, register: coil, address: 1 }
      - { name: door, register: discrete, address: 1 }
      - { name: fan, register: coil, address: 2, tags: { line: b } }"#;

#[test]
fn a_device_polled_every_second_reaches_victoriametrics_at_its_poll_times_through_outages() {
    let sb = Sandbox::new();
    let mut device = Device::start(free_port());
    let mut vm = Vm::start(&sb.file("vm"), free_port());
    let config = sb.write_config(&format!(
        r#"data_dir: data
log: {{format: json}}
sinks:
  vm:
    type: http
    url: "http://127.0.0.1:{vm}/write?db=plant"
    encoding: influx_line
    precision: ms
    link: {{ down_after: 1, backoff_base: 100ms, backoff_cap: 500ms }}
  nowhere: {{ type: http, url: "http://127.0.0.1:9/x" }}
streams:
  plc: {{ sink: vm }}
  json: {{ sink: nowhere }}
tasks:
  - name: drive
    type: modbus
    every: 1s
    timeout: 2s
    address: "127.0.0.1:{dev}"
    stream: plc
    tags: {{ site: plant-1 }}
    points:{POINTS}
  - name: drive_json
    type: modbus
    schedule: "@reboot"
    timeout: 2s
    address: "127.0.0.1:{dev}"
    stream: json
    points:{POINTS}
  - name: missing
    type: modbus
    schedule: "@reboot"
    timeout: 2s
    address: "127.0.0.1:{dev}"
    stream: json
    points:
      - {{ name: speed, register: holding, address: 0 }}
      - {{ name: ghost, register: holding, address: 40 }}
"#,
        vm = vm.port(),
        dev = device.port,
    ));
    let mut agent = Proc::start(&config);
    let runs = |agent: &Proc, outcome: &str| {
        agent
            .events_where(|e| field(e, "task") == "drive" && field(e, "outcome") == outcome)
            .len()
    };
    agent.wait_until(secs(20), "three polls stored", || runs(&agent, "ok") >= 3);

    // The exception names the points and the exception; nothing of that poll is stored.
    let missing = agent.wait_for_event(secs(10), "the missing point's run", |e| {
        field(e, "task") == "missing" && field(e, "message") == "task run failed"
    });
    let reason = field(&missing, "reason");
    assert!(
        reason.contains("points speed, ghost") || reason.contains("point ghost"),
        "{reason}"
    );
    assert!(
        reason.contains("the device answered the Modbus exception 0x02 (Illegal data address)"),
        "{reason}"
    );

    // The device stops: runs fail with the reason, and polling resumes when it is back.
    device.stop();
    let failed = agent.wait_for_event(secs(20), "a failed poll", |e| {
        field(e, "task") == "drive" && field(e, "message") == "task run failed"
    });
    assert!(
        field(&failed, "reason").contains("cannot connect to 127.0.0.1:"),
        "{failed}"
    );
    device.restart();
    let ok_before = runs(&agent, "ok");
    agent.wait_until(secs(20), "polls again", || {
        runs(&agent, "ok") >= ok_before + 2
    });

    // VictoriaMetrics stops: polls go on into the queue and land at their own times.
    vm.stop();
    let outage_start = now_ms();
    agent.wait_for_event(secs(20), "the link going down", |e| {
        field(e, "message").starts_with("link down")
    });
    let ok_before = runs(&agent, "ok");
    agent.wait_until(secs(30), "five polls during the outage", || {
        runs(&agent, "ok") >= ok_before + 5
    });
    let outage_end = now_ms();
    vm.restart();
    let ok_before = runs(&agent, "ok");
    agent.wait_until(secs(20), "polls after the outage", || {
        runs(&agent, "ok") >= ok_before + 2
    });
    agent.signal(libc::SIGTERM);
    assert_code(agent.wait_exit(secs(20)), 0, &agent.stderr());
    let polls = runs(&agent, "ok");
    let restart = now_ms();
    let mut agent = Proc::start(&config);
    agent.wait_until(secs(30), "every poll in VictoriaMetrics", || {
        vm.export(r#"{__name__="drive_speed"}"#)
            .values()
            .next()
            .is_some_and(|s| s.len() >= polls)
    });
    agent.signal(libc::SIGTERM);
    assert_code(agent.wait_exit(secs(20)), 0, &agent.stderr());

    let one = |name: &str| -> Vec<(u64, f64)> {
        let series = vm.export(&format!(r#"{{__name__="{name}"}}"#));
        assert_eq!(series.len(), 1, "{name}: {series:?}");
        let (labels, samples) = series.into_iter().next().unwrap();
        assert!(labels.contains(r#""site":"plant-1""#), "{labels}");
        samples
    };
    let speed = one("drive_speed");
    // The restarted agent's first polls may land too: each poll once, at its own time.
    assert!(
        speed.len() >= polls,
        "{} samples, {polls} polls",
        speed.len()
    );
    // One poll a second (an interval task's first run is at the agent's start, so the restarted
    // agent's first may follow the last one closely).
    let first_life: Vec<u64> = speed
        .iter()
        .map(|s| s.0)
        .filter(|ts| *ts < restart)
        .collect();
    assert_eq!(first_life.len(), polls, "{speed:?}");
    assert!(
        first_life.windows(2).all(|w| w[1] >= w[0] + 500),
        "{speed:?}"
    );
    let during = speed
        .iter()
        .filter(|(ts, _)| (outage_start..outage_end).contains(ts))
        .count();
    assert!(
        during >= 4,
        "polls during the outage keep their time: {during}"
    );
    for (name, want) in [
        ("drive_speed", 123.4),
        ("drive_delta", -5.0),
        ("drive_temp", 21.5),
        ("drive_flow", -3.25),
        ("drive_count", 100_000.0),
        ("drive_pressure", 600.0),
        ("drive_energy", 2.5),
        ("drive_pump", 1.0),
        ("drive_valve", 0.0),
        ("drive_door", 1.0),
    ] {
        let s = one(name);
        assert!(
            s.iter().all(|(_, v)| (v - want).abs() < 1e-9),
            "{name}: {:?}",
            &s[..s.len().min(3)]
        );
    }
    // A point with its own tags makes its own sample.
    let fan = vm.export(r#"{__name__="drive_fan"}"#);
    assert!(
        fan.keys().all(|l| l.contains(r#""line":"b""#)) && fan.len() == 1,
        "{fan:?}"
    );

    // The JSON sink's samples: one record per tag set, every value, the text too (`@reboot`: a
    // poll per start of the agent, two).
    let records: Vec<Value> = peek_all(&config, "json")
        .iter()
        .map(|r| serde_json::from_str(r).unwrap())
        .collect();
    assert_eq!(records.len(), 4, "{records:?}");
    let main = &records[0];
    assert_eq!(main["task"], "drive_json");
    assert_eq!(main["unit"], 1);
    assert_eq!(main["tags"], serde_json::json!({}));
    assert_eq!(main["values"]["label"], "colibri!");
    assert_eq!(main["values"]["pump"], true);
    assert_eq!(main["values"]["speed"], 123.4);
    assert_eq!(records[1]["tags"], serde_json::json!({"line": "b"}));
    assert_eq!(records[1]["values"], serde_json::json!({"fan": true}));
    assert_eq!(records[0]["time_ms"], records[1]["time_ms"]);
}

/// An f32 of 3.14159 is written as `3.14159` (not the f64 digits of its widening,
/// `3.141590118408203`), and a `file` sink names the file of these line-protocol samples `.lp`.
#[test]
fn an_f32_is_written_in_its_own_digits_into_a_file_named_for_line_protocol() {
    let sb = Sandbox::new();
    let device = Device::start(free_port());
    let out = sb.file("out");
    std::fs::create_dir(&out).unwrap();
    let config = sb.write_config(&format!(
        r#"data_dir: data
log: {{format: json}}
sinks:
  out: {{ type: file, path: {out} }}
streams:
  plc: {{ sink: out }}
tasks:
  - name: drive
    type: modbus
    schedule: "@reboot"
    address: "127.0.0.1:{dev}"
    stream: plc
    points:
      - {{ name: pi, register: holding, address: 12, type: f32 }}
      - {{ name: temp, register: holding, address: 2, type: f32 }}
"#,
        out = crate::util::quote_path(&out),
        dev = device.port,
    ));
    let agent = Proc::start(&config);
    let files = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(&out)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.path())
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
            .into_iter()
            .filter(|p: &std::path::PathBuf| {
                !p.file_name().unwrap().to_string_lossy().starts_with('.')
            })
            .collect()
    };
    let written = poll(secs(20), || {
        let f = files();
        (!f.is_empty()).then_some(f)
    })
    .unwrap_or_else(|| panic!("no file written; stderr:\n{}", agent.stderr()));
    assert_eq!(written.len(), 1, "{written:?}");
    let name = written[0]
        .file_name()
        .unwrap()
        .to_string_lossy()
        .to_string();
    assert!(name.starts_with("plc-") && name.ends_with(".lp"), "{name}");
    let text = std::fs::read_to_string(&written[0]).unwrap();
    assert!(text.starts_with("drive pi=3.14159,temp=21.5 "), "{text}");
}

/// A device that accepts the connection and never answers: the run fails as a timeout that names
/// the device and the timeout, not as a process group terminated (there is no process).
#[test]
fn a_device_that_never_answers_times_out_as_a_device_not_a_process() {
    let sb = Sandbox::new();
    // Bound and listening, never accepting: the kernel completes the connection, nothing answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap();
    let config = sb.write_config(&format!(
        r#"data_dir: data
log: {{format: json}}
streams: {{ plc: {{}} }}
tasks:
  - name: drive
    type: modbus
    schedule: "@reboot"
    timeout: 500ms
    address: "{addr}"
    stream: plc
    points:
      - {{ name: speed, register: holding, address: 0 }}
"#
    ));
    let agent = Proc::start(&config);
    let failed = agent.wait_for_event(secs(20), "the run timing out", |e| {
        field(e, "task") == "drive" && field(e, "message") == "task run failed"
    });
    assert_eq!(field(&failed, "outcome"), "timeout", "{failed}");
    assert_eq!(
        field(&failed, "reason"),
        format!("{addr} unit 1: no answer within the timeout (500ms)"),
        "{failed}"
    );
    drop(silent);
}

/// Report by exception against a register that follows a slow ramp with noise, then a step (the
/// fixture's `ramp` mode), polled every 100 ms with `deadband: 0.5` and `heartbeat: 3s`, and a
/// constant point with a deadband and heartbeat of its own that never let it through again: the
/// ramp's drift and noise stay inside the deadband, so what reaches VictoriaMetrics is the first
/// value, a heartbeat every 3 s and the step, within a poll of it (at least ten times fewer
/// values than polls); after a failed poll (the device stopped) every value's next sample is
/// sent again. The counts in `/metrics` are exact: sent + suppressed = two values per poll.
#[test]
fn a_deadband_sends_a_noisy_ramp_by_exception_with_its_step_and_heartbeats() {
    let sb = Sandbox::new();
    let flag = sb.file("step");
    let flag_s = flag.display().to_string();
    let mut device = Device::start_with(free_port(), &["ramp", &flag_s]);
    let vm = Vm::start(&sb.file("vm"), free_port());
    let admin = free_port();
    let config = sb.write_config(&format!(
        r#"data_dir: data
log: {{format: json}}
admin: {{ listen: "127.0.0.1:{admin}" }}
sinks:
  vm: {{ type: http, url: "http://127.0.0.1:{vm}/write?db=plant", encoding: influx_line, precision: ms }}
streams:
  plc: {{ sink: vm }}
tasks:
  - name: tank
    type: modbus
    every: 100ms
    timeout: 2s
    address: "127.0.0.1:{dev}"
    stream: plc
    deadband: 0.5
    heartbeat: 3s
    points:
      - {{ name: level, register: holding, address: 20, type: f32 }}
      - {{ name: speed, register: holding, address: 0, scale: 0.1, deadband: 1000, heartbeat: 1h }}
"#,
        vm = vm.port(),
        dev = device.port,
    ));
    let mut agent = Proc::start(&config);
    let runs = |agent: &Proc, outcome: &str| {
        agent
            .events_where(|e| field(e, "task") == "tank" && field(e, "outcome") == outcome)
            .len()
    };
    agent.wait_until(secs(30), "seven seconds of polls", || {
        runs(&agent, "ok") >= 70
    });
    std::fs::write(&flag, b"").unwrap();
    let at = flag.with_extension("at");
    let step_at: u64 = poll(secs(10), || std::fs::read_to_string(&at).ok())
        .expect("the device took the step")
        .parse()
        .expect("Unix ms");
    let ok = runs(&agent, "ok");
    agent.wait_until(secs(30), "polls after the step", || {
        runs(&agent, "ok") >= ok + 40
    });
    // A failed poll, then the device back: the constant point is sent again.
    let of = |text: &str, series: &str| crate::lanes::sample(text, series);
    // Counted in /metrics: the log says a failure that repeats only once.
    let failed = || {
        let text = crate::lanes::scrape(admin);
        of(
            &text,
            r#"colibri_task_runs_total{task="tank",outcome="failed"}"#,
        )
    };
    let stopped_at = now_ms();
    device.stop();
    agent.wait_until(secs(20), "a failed poll", || failed() >= 1.0);
    device.restart();
    let ok = runs(&agent, "ok");
    agent.wait_until(secs(30), "polls again", || runs(&agent, "ok") >= ok + 10);
    // Stopped again, so that no poll adds values while the counts are read.
    device.stop();
    let failed_before = failed();
    agent.wait_until(secs(20), "the next failed poll", || {
        failed() > failed_before
    });
    let text = poll(secs(30), || {
        let text = crate::lanes::scrape(admin);
        let appended = of(
            &text,
            r#"colibri_stream_appended_records_total{stream="plc"}"#,
        );
        let delivered = of(
            &text,
            r#"colibri_stream_delivered_records_total{stream="plc"}"#,
        );
        (appended == delivered).then_some(text)
    })
    .expect("every sample delivered");
    let polls = of(
        &text,
        r#"colibri_task_runs_total{task="tank",outcome="ok"}"#,
    );
    agent.signal(libc::SIGTERM);
    assert_code(agent.wait_exit(secs(20)), 0, &agent.stderr());

    let level = crate::tsdb::check_by_exception(&vm, &text, polls, stopped_at);
    let step = level
        .iter()
        .find(|(_, v)| *v > 24.0)
        .expect("the step was sent");
    assert!(
        step.0 <= step_at + 1_000,
        "the step at {step_at} sent by the poll after it: {step:?}"
    );
}
