//! `exec` tasks with `stream:`: what a command prints becomes records after a successful run.
//! Proven here: a script printing line protocol every second reaches a real VictoriaMetrics
//! (Debian's victoria-metrics) through an outage of it, each point once, stamped with the time its
//! run started when it carries none; a run that fails, times out, prints more than `max_output` or
//! a line that is not what `format` says appends nothing, and the log says why; with
//! `append_failed` a failed run leaves one record marked with the reason; `format: whole` makes the
//! output one JSON record.

use serde_json::Value;

use crate::store::peek_all;
use crate::tsdb::{Vm, free_port};
use crate::util::{Proc, Sandbox, assert_code, field, quote, secs};

#[test]
fn a_script_printing_line_protocol_every_second_reaches_victoriametrics_through_an_outage() {
    let sb = Sandbox::new();
    let mut vm = Vm::start(&sb.file("vm"), free_port());
    // Each run numbers itself, notes when it ran (ms) and prints two points without a time; once
    // `stop` exists it prints nothing (a run with no output appends nothing).
    let script = r#"[ -e stop ] && exit 0
n=$(( $(cat n 2>/dev/null || echo 0) + 1 )); echo $n > n
echo "$n $(date +%s%3N)" >> runs
echo "meter,site=a seq=$n"
echo "meter,site=b seq=$n""#;
    let config = sb.write_config(&format!(
        r#"data_dir: data
log: {{format: json}}
sinks:
  vm:
    type: http
    url: "http://127.0.0.1:{port}/write?db=plant"
    encoding: influx_line
    precision: ms
    link: {{ down_after: 1, backoff_base: 100ms, backoff_cap: 500ms }}
streams:
  meters: {{ sink: vm }}
tasks:
  - name: meter
    type: exec
    every: 1s
    timeout: 5s
    cwd: {dir}
    command: ["/bin/sh", "-c", {script}]
    stream: meters
"#,
        port = vm.port(),
        dir = quote(sb.file("").display().to_string()),
        script = quote(script),
    ));
    let runs = || -> Vec<(u64, u64)> {
        sb.read("runs")
            .lines()
            .filter_map(|l| {
                let (n, at) = l.split_once(' ')?;
                Some((n.parse().ok()?, at.parse().ok()?))
            })
            .collect()
    };
    let mut agent = Proc::start(&config);
    agent.wait_until(secs(20), "a few runs stored", || {
        vm.export(r#"{__name__="meter_seq",site="a"}"#)
            .values()
            .any(|s| s.len() >= 3)
    });
    vm.stop();
    agent.wait_for_event(secs(20), "the link going down", |e| {
        field(e, "message").starts_with("link down")
    });
    let before = runs().len();
    agent.wait_until(secs(30), "five runs during the outage", || {
        runs().len() >= before + 5
    });
    vm.restart();
    agent.wait_until(secs(30), "more runs after the outage", || {
        runs().len() >= before + 8
    });
    let finished =
        |e: &Value| field(e, "task") == "meter" && field(e, "message").starts_with("task run ");
    let so_far = agent.events_where(finished).len();
    std::fs::write(sb.file("stop"), "").unwrap();
    // A run under way when `stop` appeared may still add its points; one that began after it
    // stores nothing (no `records` in its event), and a task's runs never overlap.
    agent.wait_until(secs(20), "a run that saw the stop", || {
        agent.events_where(finished)[so_far..]
            .iter()
            .any(|e| e.get("records").is_none_or(Value::is_null))
    });
    let done = runs();
    let last = done.len() as f64;
    agent.wait_until(secs(30), "every run's points stored", || {
        ["a", "b"].iter().all(|site| {
            vm.export(&format!(r#"{{__name__="meter_seq",site="{site}"}}"#))
                .values()
                .next()
                .is_some_and(|s| s.last().map(|x| x.1) == Some(last))
        })
    });
    agent.signal(libc::SIGTERM);
    assert_code(agent.wait_exit(secs(20)), 0, &agent.stderr());
    for site in ["a", "b"] {
        let series = vm.export(&format!(r#"{{__name__="meter_seq",site="{site}"}}"#));
        assert_eq!(series.len(), 1, "{series:?}");
        let samples = series.values().next().unwrap();
        let values: Vec<u64> = samples.iter().map(|(_, v)| *v as u64).collect();
        let want: Vec<u64> = done.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            values, want,
            "site {site}: every run's point once, in order"
        );
        for ((ts, v), (n, at)) in samples.iter().zip(&done) {
            // Stamped when its run started, before the script noted the time.
            assert!(
                ts <= at && at - ts < 2000,
                "site {site}: point {v} of run {n} stamped {ts}, the run noted {at}"
            );
        }
    }
}

/// One run of each kind (`@reboot`), each into its own stream without a sink, read back with
/// `queue peek`.
#[test]
fn failed_timed_out_and_oversized_runs_append_nothing_unless_marked() {
    let sb = Sandbox::new();
    let task = |name: &str, script: &str, extra: &str| {
        format!(
            "  - {{ name: {name}, type: exec, schedule: \"@reboot\", timeout: 1s, command: [\"/bin/sh\", \"-c\", {}], stream: {name}{extra} }}\n",
            quote(script)
        )
    };
    let cases = [
        ("json", r#"printf '{"a":1}\n\n{"b":2}\n'"#, ", format: json"),
        (
            "bad_json",
            r#"printf '{"a":1}\nnot json\n'"#,
            ", format: json",
        ),
        (
            "big",
            "head -c 2000 /dev/zero | tr '\\0' x",
            ", max_output: 1KiB",
        ),
        ("slow", "echo half; sleep 5", ""),
        ("slow_marked", "echo half; sleep 5", ", append_failed: true"),
        (
            "exit_marked",
            "echo partial; exit 3",
            ", append_failed: true",
        ),
        (
            "bad_marked",
            r#"printf '{"a":1}\nnot json\n'"#,
            ", format: json, append_failed: true",
        ),
        ("failed", "echo partial; exit 3", ""),
        ("whole", r#"printf 'a\nb\n'"#, ", format: whole"),
    ];
    let mut yaml = String::from("data_dir: data\nlog: {format: json}\nstreams:\n");
    for (name, _, _) in &cases {
        yaml.push_str(&format!("  {name}: {{}}\n"));
    }
    yaml.push_str("tasks:\n");
    for (name, script, extra) in &cases {
        yaml.push_str(&task(name, script, extra));
    }
    let config = sb.write_config(&yaml);
    let mut agent = Proc::start(&config);
    let ended = |name: &str| -> Value {
        agent.wait_for_event(secs(20), &format!("task {name}'s run"), |e| {
            field(e, "task") == name && field(e, "message").starts_with("task run ")
        })
    };
    let json = ended("json");
    assert_eq!(json["records"], 2, "{json}");
    let reason_of = |name: &str| field(&ended(name), "reason").to_string();
    let r = reason_of("bad_json");
    assert!(r.starts_with("stdout line 2 is not JSON"), "{r}");
    let r = reason_of("big");
    assert!(r.contains("stdout passed max_output (1KiB)"), "{r}");
    assert!(reason_of("slow").starts_with("timed out"));
    assert!(reason_of("slow_marked").starts_with("timed out"));
    assert_eq!(reason_of("exit_marked"), "exited with code 3");
    assert_eq!(reason_of("failed"), "exited with code 3");
    assert!(reason_of("bad_marked").starts_with("stdout line 2 is not JSON"));
    ended("whole");
    agent.signal(libc::SIGTERM);
    assert_code(agent.wait_exit(secs(20)), 0, &agent.stderr());

    assert_eq!(peek_all(&config, "json"), [r#"{"a":1}"#, r#"{"b":2}"#]);
    for empty in ["bad_json", "big", "slow", "failed"] {
        assert_eq!(peek_all(&config, empty), Vec::<String>::new(), "{empty}");
    }
    let marked = |name: &str| -> Value {
        let records = peek_all(&config, name);
        assert_eq!(records.len(), 1, "{name}: {records:?}");
        serde_json::from_str(&records[0]).unwrap()
    };
    let m = marked("slow_marked");
    assert_eq!(
        (m["task"].as_str(), m["output"].as_str()),
        (Some("slow_marked"), Some("half\n"))
    );
    assert_eq!(m["failed"], "timed out after 1s", "{m}");
    let m = marked("exit_marked");
    assert_eq!(
        (m["output"].as_str(), m["failed"].as_str()),
        (Some("partial\n"), Some("exited with code 3"))
    );
    // A run that exited 0 but printed a line that is not JSON failed too: marked, not lost.
    let m = marked("bad_marked");
    assert!(
        m["failed"]
            .as_str()
            .is_some_and(|f| f.starts_with("stdout line 2 is not JSON")),
        "{m}"
    );
    assert_eq!(m["output"], "{\"a\":1}\nnot json\n", "{m}");
    let w = marked("whole");
    assert_eq!(w["output"], "a\nb\n", "{w}");
    assert!(
        w["time_ms"].as_u64().is_some_and(|t| t > 1_600_000_000_000),
        "{w}"
    );
}
