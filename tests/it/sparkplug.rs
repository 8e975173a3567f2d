//! The `mqtt` sink's `encoding: sparkplug_b` against Debian's mosquitto and a Sparkplug B host
//! application on PyPI's pysparkplug (`tests/fixtures/sparkplug_host.py`, installed by
//! `scripts/test.sh`): the library's decoder, with the births it has seen, reads what colibri
//! sends; nothing here decodes protobuf.
//!
//! Proven here: NBIRTH with bdSeq, a DBIRTH per device, DDATA by alias that the host resolves to
//! the birth's names at the records' own timestamps, seq without a gap from each NBIRTH; a new
//! metric of a device produces a new DBIRTH; a rebirth NCMD is answered with NBIRTH and every
//! DBIRTH; kill -9 of colibri makes the broker publish the NDEATH with the NBIRTH's bdSeq, and the
//! next start births with the next one. With a primary host: while its STATE is offline a modbus
//! task keeps polling and nothing is sent; when it is online again colibri births, every stored
//! sample arrives once with `is_historical` and its poll time, then live samples without it.

use std::io::{BufRead, BufReader, Write as _};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use crate::modbus::Device;
use crate::mqtt::Broker;
use crate::tsdb::{free_port, now_ms};
use crate::util::client::Client;
use crate::util::{Proc, Sandbox, assert_code, field, poll, python, secs};

/// The host application: what it printed, and its stdin for commands.
struct Host {
    child: Child,
    stdin: ChildStdin,
    lines: Arc<Mutex<Vec<Value>>>,
}

impl Host {
    fn start(port: u16, group: &str, host_id: &str) -> Host {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sparkplug_host.py");
        let mut child = Command::new(python())
            .arg(&script)
            .args([&port.to_string(), group, host_id])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 (scripts/test.sh makes a venv with pysparkplug)");
        let stdin = child.stdin.take().expect("piped");
        let out = BufReader::new(child.stdout.take().expect("piped"));
        let lines = Arc::new(Mutex::new(Vec::new()));
        let into = lines.clone();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                let v: Value = serde_json::from_str(&line).expect("the host prints JSON");
                into.lock().unwrap().push(v);
            }
        });
        let h = Host {
            child,
            stdin,
            lines,
        };
        h.wait(
            secs(20),
            "the host subscribed (is PyPI's pysparkplug installed?)",
            |l| l.iter().any(|v| v["ready"] == true),
        );
        h
    }

    fn lines(&self) -> Vec<Value> {
        self.lines.lock().unwrap().clone()
    }

    /// The Sparkplug messages an edge node sent.
    fn messages(&self) -> Vec<Value> {
        let mut m = self.lines();
        m.retain(is_from_node);
        m
    }

    /// Waits for `cond` over the Sparkplug messages received.
    fn wait_messages(&self, limit: Duration, what: &str, cond: impl Fn(&[Value]) -> bool) {
        self.wait(limit, what, |l| {
            let m: Vec<Value> = l.iter().filter(|v| is_from_node(v)).cloned().collect();
            cond(&m)
        });
    }

    fn wait(&self, limit: Duration, what: &str, cond: impl Fn(&[Value]) -> bool) {
        if poll(limit, || cond(&self.lines()).then_some(())).is_none() {
            panic!(
                "{what}: not within {limit:?}; the host saw:\n{:#?}",
                self.lines()
            );
        }
    }

    /// Sends a command and waits for the host to say it was published.
    fn command(&mut self, cmd: &str, done: &str) {
        let before = self.lines().len();
        writeln!(self.stdin, "{cmd}").unwrap();
        self.wait(secs(10), cmd, |l| {
            l[before..]
                .iter()
                .any(|v| v["state"] == done || v["sent"] == done)
        });
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A Sparkplug message from an edge node (not the host's notes, nor its own NCMD).
fn is_from_node(v: &Value) -> bool {
    v["type"].is_string() && v["type"] != "NCMD"
}

fn of_type<'a>(messages: &'a [Value], kind: &str) -> Vec<&'a Value> {
    messages.iter().filter(|m| m["type"] == kind).collect()
}

/// Every message's metrics named `name` (resolved by the host) with the device's.
fn metrics<'a>(messages: &'a [Value], kind: &str, device: &str, name: &str) -> Vec<&'a Value> {
    of_type(messages, kind)
        .into_iter()
        .filter(|m| m["device"] == device)
        .flat_map(|m| m["metrics"].as_array().unwrap())
        .filter(|x| x["name"] == name)
        .collect()
}

/// The seq of every message after each NBIRTH, checked to run 0, 1, 2... without a gap.
fn check_seq(messages: &[Value]) {
    let mut next: Option<u64> = None;
    for m in messages {
        match m["type"].as_str().unwrap() {
            "NBIRTH" => {
                assert_eq!(m["seq"], 0, "NBIRTH with seq {}", m["seq"]);
                next = Some(1);
            }
            "NDEATH" => {}
            _ => {
                let want = next.expect("a message before any NBIRTH");
                assert_eq!(m["seq"].as_u64(), Some(want), "seq gap at {m}");
                next = Some((want + 1) % 256);
            }
        }
    }
}

fn post_lines(port: u16, stream: &str, body: &str) {
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let a = Client::new(addr)
        .post(
            &format!("/v1/streams/{stream}/records"),
            "text/plain",
            &[],
            body.as_bytes(),
        )
        .unwrap();
    assert_eq!(a.status, 200, "{}", a.text());
}

#[test]
fn an_edge_node_births_sends_by_alias_answers_rebirth_and_dies_with_its_bd_seq() {
    let sb = Sandbox::new();
    let b = Broker::start(&sb.file("broker"), "allow_anonymous true");
    let mut host = Host::start(b.port, "plant1", "scada");
    let ingest = free_port();
    let config = sb.write_config(&format!(
        r#"data_dir: data
log: {{format: json}}
ingest: {{ listen: "127.0.0.1:{ingest}" }}
sinks:
  scada:
    type: mqtt
    url: mqtt://127.0.0.1:{port}
    encoding: sparkplug_b
    sparkplug: {{ group_id: plant1, edge_node_id: gw17, device: "tag:unit" }}
    keep_alive: 2s
    link: {{ backoff_cap: 1s }}
streams:
  temps: {{ sink: scada }}
"#,
        port = b.port
    ));
    let agent = Proc::start(&config);
    host.wait(secs(20), "NBIRTH", |l| !of_type(l, "NBIRTH").is_empty());
    let nbirth = of_type(&host.messages(), "NBIRTH")[0].clone();
    let bd_seq = nbirth["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "bdSeq")
        .expect("NBIRTH carries bdSeq")["value"]
        .as_u64()
        .unwrap();
    assert!(
        nbirth["metrics"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["name"] == "Node Control/Rebirth" && m["value"] == false),
        "{nbirth}"
    );

    // 20 records of two devices, at their own times (after the birth: live, not historical).
    let t0 = now_ms();
    let body: String = (0..10u64)
        .map(|i| {
            format!(
                "m,unit=pump1 temp={i}.5,on=true {t}\nm,unit=pump2 rpm={i}i {t}\n",
                t = t0 + i
            )
        })
        .collect();
    post_lines(ingest, "temps", &body);
    host.wait(secs(20), "every record at the host", |l| {
        metrics(l, "DDATA", "pump2", "rpm").len() == 10
    });
    let m = host.messages();
    let temps = metrics(&m, "DDATA", "pump1", "temp");
    assert_eq!(temps.len(), 10, "{m:#?}");
    for (i, t) in temps.iter().enumerate() {
        assert_eq!(t["value"], i as f64 + 0.5);
        assert_eq!(t["timestamp"], t0 + i as u64, "the record's own time");
        assert!(t["alias"].is_u64(), "sent by alias: {t}");
        assert_eq!(t["historical"], false);
    }
    for (i, r) in metrics(&m, "DDATA", "pump2", "rpm").iter().enumerate() {
        assert_eq!(r["value"], i as u64);
        assert_eq!(r["datatype"], 4, "Int64");
    }
    for d in ["pump1", "pump2"] {
        let births: Vec<_> = of_type(&m, "DBIRTH")
            .into_iter()
            .filter(|x| x["device"] == d)
            .collect();
        assert_eq!(births.len(), 1, "one DBIRTH of {d}: {m:#?}");
    }
    let first_data = m.iter().position(|x| x["type"] == "DDATA").unwrap();
    let last_birth = m.iter().rposition(|x| x["type"] == "DBIRTH").unwrap();
    assert!(last_birth < first_data, "births before data: {m:#?}");
    let data = of_type(&m, "DDATA");
    assert!(
        data.iter()
            .all(|x| x["uuid"].as_str().is_some_and(|u| u.contains(":temps:"))),
        "each DDATA carries its job's idempotency key: {data:#?}"
    );

    // A new metric of pump1: a DBIRTH with the old and the new before its data.
    post_lines(
        ingest,
        "temps",
        &format!("m,unit=pump1 temp=99.5,pressure=2.5 {}\n", t0 + 100),
    );
    host.wait(secs(20), "the new metric", |l| {
        !metrics(l, "DDATA", "pump1", "pressure").is_empty()
    });
    let m = host.messages();
    let births = metrics(&m, "DBIRTH", "pump1", "pressure");
    assert_eq!(births.len(), 1, "{m:#?}");
    assert_eq!(metrics(&m, "DBIRTH", "pump1", "temp").len(), 2);
    assert_eq!(metrics(&m, "DBIRTH", "pump1", "on").len(), 2);

    // A metric whose type changes within a job: each value under the birth of its type.
    post_lines(
        ingest,
        "temps",
        &format!(
            "m,unit=pump3 v=1i {t}\nm,unit=pump3 v=2.5 {t}\n",
            t = t0 + 200
        ),
    );
    host.wait_messages(secs(20), "both types", |m| {
        metrics(m, "DDATA", "pump3", "v").len() == 2
    });
    let m = host.messages();
    let v: Vec<_> = metrics(&m, "DDATA", "pump3", "v")
        .iter()
        .map(|x| (x["value"].clone(), x["datatype"].clone()))
        .collect();
    assert_eq!(
        v,
        [
            (serde_json::json!(1), serde_json::json!(4)),
            (serde_json::json!(2.5), serde_json::json!(10))
        ]
    );

    // Rebirth: NBIRTH again (seq 0, the same bdSeq) and a DBIRTH per device.
    host.command("rebirth gw17", "rebirth");
    host.wait_messages(secs(20), "births again", |m| {
        of_type(m, "NBIRTH").len() == 2 && of_type(m, "DBIRTH").len() == 8
    });
    let m = host.messages();
    check_seq(&m);
    let again = m.iter().rposition(|x| x["type"] == "NBIRTH").unwrap();
    let devices: Vec<_> = m[again..]
        .iter()
        .filter(|x| x["type"] == "DBIRTH")
        .map(|x| x["device"].as_str().unwrap())
        .collect();
    assert_eq!(devices, ["pump1", "pump2", "pump3"]);

    // kill -9: the broker publishes the will, NDEATH with this connection's bdSeq.
    agent.signal(libc::SIGKILL);
    host.wait(secs(20), "NDEATH", |l| {
        l.iter().any(|v| v["type"] == "NDEATH")
    });
    let death = of_type(&host.messages(), "NDEATH")[0].clone();
    assert_eq!(death["bdSeq"], bd_seq, "{death}");

    // The next start: the next bdSeq, and data flows again.
    let mut agent = Proc::start(&config);
    host.wait(secs(20), "NBIRTH after the restart", |l| {
        l.iter().filter(|v| v["type"] == "NBIRTH").count() == 3
    });
    let m = host.messages();
    let last = of_type(&m, "NBIRTH")[2];
    assert_eq!(last["metrics"][0]["value"], (bd_seq + 1) % 256, "{last}");
    post_lines(
        ingest,
        "temps",
        &format!("m,unit=pump2 rpm=77i {}\n", now_ms()),
    );
    host.wait_messages(secs(20), "data after the restart", |m| {
        metrics(m, "DDATA", "pump2", "rpm")
            .iter()
            .any(|r| r["value"] == 77)
    });
    check_seq(&host.messages());
    assert!(
        !host.lines().iter().any(|v| v.get("error").is_some()),
        "the host could not decode a message: {:#?}",
        host.lines()
    );
    agent.signal(libc::SIGTERM);
    assert_code(agent.wait_exit(secs(20)), 0, &agent.stderr());
}

#[test]
fn while_the_primary_host_is_offline_samples_wait_and_then_arrive_once_as_historical() {
    let sb = Sandbox::new();
    let b = Broker::start(&sb.file("broker"), "allow_anonymous true");
    let mut host = Host::start(b.port, "plant1", "scada");
    host.command("online", "online");
    let device = Device::start(free_port());
    let config = sb.write_config(&format!(
        r#"data_dir: data
log: {{format: json}}
sinks:
  scada:
    type: mqtt
    url: mqtt://127.0.0.1:{port}
    encoding: sparkplug_b
    sparkplug: {{ group_id: plant1, edge_node_id: gw17, device: measurement, primary_host_id: scada }}
    keep_alive: 2s
    link: {{ backoff_cap: 1s }}
streams:
  plc: {{ sink: scada }}
tasks:
  - name: drive
    type: modbus
    every: 1s
    timeout: 2s
    address: "127.0.0.1:{dev}"
    stream: plc
    points:
      - {{ name: speed, register: holding, address: 0, scale: 0.1 }}
      - {{ name: temp, register: holding, address: 2, type: f32 }}
"#,
        port = b.port,
        dev = device.port,
    ));
    let mut agent = Proc::start(&config);
    host.wait_messages(secs(30), "live samples", |m| {
        metrics(m, "DDATA", "drive", "speed").len() >= 3
    });
    let polls = |agent: &Proc| {
        agent
            .events_where(|e| field(e, "task") == "drive" && field(e, "outcome") == "ok")
            .len()
    };

    // Offline: NDEATH, then nothing while the task polls on.
    host.command("offline", "offline");
    host.wait(secs(10), "NDEATH", |l| {
        l.iter().any(|v| v["type"] == "NDEATH")
    });
    let at_death = host.messages().len();
    let death = &host.messages()[at_death - 1];
    let bd_seq = death["bdSeq"].as_u64().expect("NDEATH carries bdSeq");
    assert_eq!(
        of_type(&host.messages(), "NBIRTH")[0]["metrics"][0]["value"],
        bd_seq,
        "the NDEATH ends the session the NBIRTH began"
    );
    let before = polls(&agent);
    // A rebirth asked while the host is offline is not answered: births wait for the host.
    host.command("rebirth gw17", "rebirth");
    agent.wait_until(secs(30), "six polls while the host is offline", || {
        polls(&agent) >= before + 6
    });
    let quiet = host.messages();
    assert_eq!(
        quiet.len(),
        at_death,
        "sent while the host was offline: {:#?}",
        &quiet[at_death..]
    );

    // Online: births, the stored samples as historical, then live ones.
    let online_at = now_ms();
    host.command("online", "online");
    host.wait_messages(secs(30), "live samples after the backlog", |m| {
        metrics(&m[at_death..], "DDATA", "drive", "speed")
            .iter()
            .filter(|x| x["historical"] == false)
            .count()
            >= 2
    });
    let m = host.messages();
    let after = &m[at_death..];
    assert_eq!(after[0]["type"], "NBIRTH", "{after:#?}");
    assert_eq!(
        after[0]["metrics"][0]["value"],
        bd_seq + 1,
        "a new session after the NDEATH: {after:#?}"
    );
    assert_eq!(after[1]["type"], "DBIRTH", "{after:#?}");
    check_seq(&m);
    let speeds = metrics(&m, "DDATA", "drive", "speed");
    let historical: Vec<u64> = metrics(after, "DDATA", "drive", "speed")
        .iter()
        .filter(|x| x["historical"] == true)
        .map(|x| x["timestamp"].as_u64().unwrap())
        .collect();
    assert!(
        historical.len() >= 6,
        "{} historical samples: {after:#?}",
        historical.len()
    );
    assert!(historical.iter().all(|&t| t < online_at + 1_000));
    // Every sample once, at its poll time: as many as the task's polls, none twice, in order.
    agent.wait_until(secs(30), "a sample per poll at the host", || {
        let m = host.messages();
        metrics(&m, "DDATA", "drive", "speed").len() == polls(&agent)
    });
    let m = host.messages();
    let times: Vec<u64> = metrics(&m, "DDATA", "drive", "speed")
        .iter()
        .map(|x| x["timestamp"].as_u64().unwrap())
        .collect();
    for w in times.windows(2) {
        assert!(
            w[1] > w[0],
            "samples at {} and {}: a repeat or out of order in {times:?}",
            w[0],
            w[1]
        );
    }
    let first_live = after
        .iter()
        .position(|x| {
            x["type"] == "DDATA"
                && x["metrics"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|v| v["historical"] == false)
        })
        .unwrap();
    let last_historical = after
        .iter()
        .rposition(|x| {
            x["type"] == "DDATA"
                && x["metrics"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|v| v["historical"] == true)
        })
        .unwrap();
    assert!(
        last_historical <= first_live,
        "live values before the end of the backlog: {after:#?}"
    );
    assert!(
        speeds
            .iter()
            .all(|x| (x["value"].as_f64().unwrap() - 123.4).abs() < 1e-9),
        "{speeds:?}"
    );
    agent.signal(libc::SIGTERM);
    assert_code(agent.wait_exit(secs(20)), 0, &agent.stderr());
}
