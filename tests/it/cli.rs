//! End-to-end tests of the `colibri` binary: it is started as a child process with a config written
//! to a scratch directory, driven with signals, and judged by its exit status, its JSON log on stderr
//! and the files its tasks write. Every wait is a bounded poll (see `util`).
//!
//! Task scripts are config strings, so colibri's `${VAR}` expansion applies to them: a shell `$$` is
//! written `$$$$`, and shell variables are written `$NAME`, never `${NAME}`. Paths reach the scripts
//! through the task's `env`, so no path is ever quoted for the shell.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::time::Duration;

use serde_json::Value;

use crate::util::secs;
use crate::util::{
    Proc, Sandbox, assert_code, assert_gone, colibri, field, finish, head, is_gone,
    live_group_members, parse_pids, quote, quote_path,
};

/// `event` is the one-line outcome of a run of `task`.
fn is_run_of(event: &Value, task: &str) -> bool {
    field(event, "task") == task && !field(event, "outcome").is_empty()
}

fn message_starts(event: &Value, prefix: &str) -> bool {
    field(event, "message").starts_with(prefix)
}

const SKIPPED: &str = "run skipped: the previous run is still going";

/// Milliseconds since the Unix epoch of a log event's `timestamp`.
fn timestamp_ms(event: &Value) -> i64 {
    chrono::DateTime::parse_from_rfc3339(field(event, "timestamp"))
        .unwrap_or_else(|e| panic!("bad timestamp in {event}: {e}"))
        .timestamp_millis()
}

/// One line of the 200-task test's output file: `<task> <due ms> <start ms>`.
#[derive(Debug)]
struct Run {
    task: String,
    due: i64,
    start: i64,
}

fn parse_runs(lines: &[String]) -> Vec<Run> {
    lines
        .iter()
        .map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let [task, due, start] = f[..] else {
                panic!("malformed line {line:?}")
            };
            let ms = |s: &str| {
                s.parse::<i64>()
                    .unwrap_or_else(|_| panic!("bad number in {line:?}"))
            };
            Run {
                task: task.to_string(),
                due: ms(due),
                start: ms(start),
            }
        })
        .collect()
}

#[test]
fn two_hundred_tasks_run_on_time() {
    const TASKS: usize = 200;
    let sb = Sandbox::new();
    let out = sb.file("runs.txt");
    let script = r#"echo "$COLIBRI_TASK $COLIBRI_DUE_MS $(date +%s%3N)" >> "$OUT""#;
    let mut yaml = String::from(
        "data_dir: data\nworkers: 64\nshutdown_grace: 15s\nlog: {level: info, format: json}\ntasks:\n",
    );
    for i in 0..TASKS {
        writeln!(
            yaml,
            "  - {{name: t{i:03}, type: exec, every: 1s, offset: random, timeout: 5s, \
             command: [\"/bin/sh\", \"-c\", {}], env: {{OUT: {}}}}}",
            quote(script),
            quote_path(&out)
        )
        .unwrap();
    }
    let names: Vec<String> = (0..TASKS).map(|i| format!("t{i:03}")).collect();
    let mut agent = Proc::run(&sb.write_config(&yaml));

    // About ten seconds: every task has runs due in at least nine distinct seconds.
    let distinct_dues = |runs: &[Run]| {
        let mut dues: BTreeMap<&str, HashSet<i64>> =
            names.iter().map(|n| (n.as_str(), HashSet::new())).collect();
        for r in runs {
            dues.entry(r.task.as_str()).or_default().insert(r.due);
        }
        dues.into_iter()
            .map(|(t, d)| (t.to_string(), d.len()))
            .collect::<Vec<_>>()
    };
    agent.wait_until(
        secs(30),
        "every task has runs due in 9 distinct seconds",
        || {
            let runs = parse_runs(&sb.complete_lines("runs.txt"));
            distinct_dues(&runs).iter().all(|(_, n)| *n >= 9)
        },
    );
    agent.signal(libc::SIGTERM);
    let status = agent.wait_exit(secs(20));
    assert_code(status, 0, &agent.stderr());

    let runs = parse_runs(&sb.complete_lines("runs.txt"));
    let unknown: Vec<&Run> = runs.iter().filter(|r| !names.contains(&r.task)).collect();
    assert!(
        unknown.is_empty(),
        "runs of tasks not in the config: {}",
        head(&unknown, 5)
    );
    let few: Vec<(String, usize)> = distinct_dues(&runs)
        .into_iter()
        .filter(|(_, n)| *n < 8)
        .collect();
    assert!(
        few.is_empty(),
        "tasks that ran fewer than 8 times: {}",
        head(&few, 10)
    );

    // Each run starts within one second of its due time, and not before it (a little slack for
    // the millisecond truncation of both clocks).
    let late: Vec<&Run> = runs.iter().filter(|r| r.start - r.due >= 1000).collect();
    assert!(
        late.is_empty(),
        "runs started a second or more after they were due: {}",
        head(&late, 10)
    );
    let early: Vec<&Run> = runs.iter().filter(|r| r.start < r.due - 20).collect();
    assert!(
        early.is_empty(),
        "runs started before they were due: {}",
        head(&early, 10)
    );

    // Never twice for one due time, and due times one period apart.
    let mut by_task: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for r in &runs {
        by_task.entry(r.task.as_str()).or_default().push(r.due);
    }
    for (task, dues) in &mut by_task {
        let n = dues.len();
        dues.sort_unstable();
        dues.dedup();
        assert_eq!(dues.len(), n, "{task} ran twice for one due time: {dues:?}");
        let gaps: Vec<i64> = dues.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(
            gaps.iter().all(|g| (g - 1000).abs() <= 50),
            "{task}: due times are not one second apart: {gaps:?}"
        );
    }

    // The log: one ok event per line written, nothing skipped, nothing failed.
    let events = agent.events();
    let errors: Vec<&Value> = events
        .iter()
        .filter(|e| field(e, "level") == "ERROR")
        .collect();
    assert!(errors.is_empty(), "ERROR events: {}", head(&errors, 5));
    let skipped: Vec<&Value> = events
        .iter()
        .filter(|e| field(e, "message") == SKIPPED)
        .collect();
    assert!(skipped.is_empty(), "runs skipped: {}", head(&skipped, 5));
    let ok = events
        .iter()
        .filter(|e| field(e, "outcome") == "ok")
        .count();
    assert_eq!(ok, runs.len(), "one ok event per run that wrote its line");
    assert!(events.iter().any(|e| message_starts(e, "colibri stopped")));
}

#[test]
fn timeout_leaves_no_process_behind() {
    let sb = Sandbox::new();
    let pids = sb.file("pids");
    let config = sb.write_config(&format!(
        r#"data_dir: data
shutdown_grace: 15s
log: {{format: json}}
tasks:
  - name: stuck
    type: exec
    schedule: "@reboot"
    timeout: 1s
    command: ["/bin/sh", "-c", {script}]
    env: {{PIDS: {pids}}}
"#,
        script = quote(r#"sleep 300 & echo $! >> "$PIDS"; echo $$$$ >> "$PIDS"; wait"#),
        pids = quote_path(&pids),
    ));
    let mut agent = Proc::run(&config);
    let event = agent.wait_for_event(secs(15), "timeout of task stuck", |e| {
        is_run_of(e, "stuck") && field(e, "outcome") == "timeout"
    });
    assert_eq!(field(&event, "level"), "ERROR", "{event}");
    assert_eq!(field(&event, "message"), "task run failed", "{event}");

    let pids = parse_pids(&sb.read("pids"));
    assert_eq!(
        pids.len(),
        2,
        "the background sleep and the shell wrote their pids: {pids:?}"
    );
    assert_gone(&pids, secs(5), "the task's processes after its timeout");
    let shell = pids[1];
    let members = live_group_members(shell);
    let what = format!("processes left in the task's group {shell}");
    assert_gone(&members, Duration::ZERO, &what);

    agent.signal(libc::SIGTERM);
    let status = agent.wait_exit(secs(20));
    assert_code(status, 0, &agent.stderr());
}

#[test]
fn sigterm_waits_for_a_running_task_then_exits_zero() {
    let sb = Sandbox::new();
    let config = sb.write_config(&format!(
        r#"data_dir: data
shutdown_grace: 5s
log: {{format: json}}
tasks:
  - name: finisher
    type: exec
    schedule: "@reboot"
    timeout: 4s
    command: ["/bin/sh", "-c", {script}]
    env: {{STARTED: {started}, DONE: {done}}}
"#,
        script = quote(r#"touch "$STARTED"; sleep 2; echo done > "$DONE""#),
        started = quote_path(&sb.file("started")),
        done = quote_path(&sb.file("done")),
    ));
    let mut agent = Proc::run(&config);
    agent.wait_until(secs(15), "the task has started", || {
        sb.file("started").exists()
    });
    agent.signal(libc::SIGTERM);
    let status = agent.wait_exit(secs(10));
    assert_code(status, 0, &agent.stderr());

    assert_eq!(sb.read("done"), "done\n", "the run was allowed to finish");
    let runs = agent.events_where(|e| is_run_of(e, "finisher"));
    assert_eq!(runs.len(), 1, "one run, one event: {runs:?}");
    assert_eq!(field(&runs[0], "outcome"), "ok", "{}", runs[0]);
    let events = agent.events();
    let stopping = events
        .iter()
        .position(|e| message_starts(e, "stopping"))
        .expect("a stopping event");
    let finished = events
        .iter()
        .position(|e| is_run_of(e, "finisher"))
        .expect("a run event");
    assert!(
        stopping < finished,
        "the run ended after the stop began, not before it"
    );
    let stopped = events.last().expect("events");
    assert_eq!(field(stopped, "message"), "colibri stopped", "{stopped}");
    assert_eq!(stopped["killed"], 0, "{stopped}");
}

#[test]
fn sigterm_kills_a_task_that_outlives_the_grace() {
    // The task ignores SIGTERM, so once its 1.5 s timeout sends SIGTERM it lives on until the
    // SIGKILL 2 s later: past the 2 s grace that begins right after it started.
    let sb = Sandbox::new();
    let config = sb.write_config(&format!(
        r#"data_dir: data
shutdown_grace: 2s
log: {{format: json}}
tasks:
  - name: stubborn
    type: exec
    schedule: "@reboot"
    timeout: 1500ms
    command: ["/bin/sh", "-c", {script}]
    env: {{PID: {pid}}}
"#,
        script =
            quote(r#"trap '' TERM; echo $$$$ > "$PID.tmp"; mv "$PID.tmp" "$PID"; exec sleep 30"#),
        pid = quote_path(&sb.file("pid")),
    ));
    let mut agent = Proc::run(&config);
    agent.wait_until(secs(15), "the task has started", || sb.file("pid").exists());
    let pid = parse_pids(&sb.read("pid"));
    agent.signal(libc::SIGTERM);
    let status = agent.wait_exit(secs(12));
    assert_code(status, 0, &agent.stderr());

    assert_gone(&pid, secs(5), "the task after colibri exited");
    let over = agent.events_where(|e| message_starts(e, "shutdown grace is over"));
    assert_eq!(over.len(), 1, "the grace ran out once: {}", agent.stderr());
    assert_eq!(over[0]["killed"], 1, "{}", over[0]);
    let run = agent.events_where(|e| is_run_of(e, "stubborn"));
    assert_eq!(run.len(), 1, "one event for the run: {}", agent.stderr());
    assert_eq!(
        field(&run[0], "exit"),
        "signal 9",
        "SIGTERM was ignored, SIGKILL was not: {}",
        run[0]
    );
    let stopped = agent.events().pop().expect("events");
    assert_eq!(field(&stopped, "message"), "colibri stopped", "{stopped}");
    assert_eq!(stopped["killed"], 1, "{stopped}");
}

#[test]
fn second_signal_exits_at_once() {
    let sb = Sandbox::new();
    let config = sb.write_config(&format!(
        r#"data_dir: data
shutdown_grace: 30s
log: {{format: json}}
tasks:
  - name: sleeper
    type: exec
    schedule: "@reboot"
    timeout: 20s
    command: ["/bin/sh", "-c", {script}]
    env: {{PID: {pid}}}
"#,
        script = quote(r#"echo $$$$ > "$PID.tmp"; mv "$PID.tmp" "$PID"; exec sleep 25"#),
        pid = quote_path(&sb.file("pid")),
    ));
    let mut agent = Proc::run(&config);
    agent.wait_until(secs(15), "the task has started", || sb.file("pid").exists());
    let pid = parse_pids(&sb.read("pid"));
    agent.signal(libc::SIGTERM);
    agent.wait_for_event(secs(10), "the stopping event", |e| {
        message_starts(e, "stopping")
    });
    assert!(!is_gone(pid[0]), "the first signal lets the task run on");
    agent.signal(libc::SIGTERM);
    // "At once": far sooner than the 25 s the task would take or the 30 s grace.
    let status = agent.wait_exit(secs(5));
    assert_code(status, 1, &agent.stderr());

    assert_gone(&pid, secs(5), "the task after colibri exited");
    let forced = agent.events_where(|e| message_starts(e, "second signal"));
    assert_eq!(forced.len(), 1, "{}", agent.stderr());
    assert_eq!(forced[0]["killed_groups"], 1, "{}", forced[0]);
}

#[test]
fn bad_config_lists_every_error() {
    let sb = Sandbox::new();
    let marker = quote_path(&sb.file("ran"));
    let config = sb.write_config(&format!(
        r#"data_dir: data
shutdown_grace: 15s
tasks:
  - {{name: rotate, type: exec, schedule: "61 * * * *", command: ["/bin/true"]}}
  - {{name: rotate, type: exec, every: 1s, command: ["/bin/true"]}}
  - {{name: beam, type: teleport, every: 1s, command: ["/bin/true"]}}
  - {{name: zero, type: exec, every: 1s, timeout: 0s, command: ["/bin/true"]}}
  - {{name: ghost, type: exec, every: 1s, command: ["/nonexistent/bin"]}}
  - {{name: slow, type: exec, every: 1s, timeout: 15s, command: ["/bin/true"]}}
  - {{name: typo, type: exec, every: 1s, scheduel: "* * * * *", command: ["/bin/true"]}}
  - {{name: feb30, type: exec, schedule: "0 0 30 2 *", command: ["/bin/true"]}}
  - {{name: wrap, type: exec, schedule: "0 8 * * FRI-MON", command: ["/bin/true"]}}
  - {{name: fine, type: exec, schedule: "@reboot", command: ["/bin/sh", "-c", "touch \"$MARK\""], env: {{MARK: {marker}}}}}
"#
    ));
    // (the line that names the task, what it must say)
    let expected = [
        (
            r#"tasks[0] "rotate""#,
            r#"schedule "61 * * * *": minute 61 out of range 0-59"#,
        ),
        (r#"tasks[1] "rotate""#, "duplicate name"),
        (r#"tasks[2] "beam""#, r#"unknown type "teleport""#),
        (r#"tasks[3] "zero""#, "timeout: must be positive"),
        (r#"tasks[4] "ghost""#, "/nonexistent/bin: no such file"),
        (r#"tasks[5] "slow""#, "must be shorter than shutdown_grace"),
        (r#"tasks[6] "typo""#, "unknown field `scheduel`"),
        (
            r#"tasks[7] "feb30""#,
            "never fires: no date has day of month 30 in month 2",
        ),
        (
            r#"tasks[8] "wrap""#,
            "day of week range FRI-MON runs backwards (ranges do not wrap around: write FRI-SAT,SUN-MON)",
        ),
    ];
    let check_lists_all = |what: &str, stderr: &str| {
        for (at, says) in expected {
            assert!(
                stderr
                    .lines()
                    .any(|l| l.starts_with(&format!("  {at}")) && l.contains(says)),
                "{what}: no line for {at} saying {says:?}; stderr:\n{stderr}"
            );
        }
        assert!(
            !stderr.contains(r#""fine""#),
            "{what}: the valid task was reported as a problem: {stderr}"
        );
    };

    let mut cmd = colibri();
    cmd.arg("check").arg("--config").arg(&config);
    let out = finish(cmd, secs(10));
    assert_code(out.status, 1, &out.stderr);
    check_lists_all("check", &out.stderr);
    assert_eq!(out.stdout, "", "no summary for a bad file");

    let mut cmd = colibri();
    cmd.arg("run").arg("--config").arg(&config);
    let out = finish(cmd, secs(10));
    assert_code(out.status, 1, &out.stderr);
    check_lists_all("run", &out.stderr);
    assert!(
        !sb.file("ran").exists(),
        "run started a task of a bad config"
    );
    assert!(
        !sb.file("data").exists(),
        "run created data_dir for a bad config"
    );
}

#[test]
fn check_reports_every_problem_of_a_sink_and_refuses_a_quoted_number() {
    let sb = Sandbox::new();
    let config = sb.write_config(
        r#"data_dir: data
sinks:
  up: { type: mqtt, url: "mqtt://127.0.0.1:1", topic: t, colour: red, qos: 5, keep_alive: 30 }
  quoted: { type: mqtt, url: "mqtt://127.0.0.1:1", topic: t, qos: "1" }
"#,
    );
    let mut cmd = colibri();
    cmd.arg("check").arg("--config").arg(&config);
    let out = finish(cmd, secs(10));
    assert_code(out.status, 1, &out.stderr);
    for line in [
        "  sinks.up.colour: unknown field `colour`",
        "  sinks.up.qos: must be 1 or 2, not 5",
        "  sinks.up.keep_alive: duration 30 has no unit",
        "  sinks.quoted.qos: expected a whole number, found the string \"1\"",
    ] {
        assert!(
            out.stderr.lines().any(|l| l.starts_with(line)),
            "no line {line:?}; stderr:\n{}",
            out.stderr
        );
    }
    assert!(out.stderr.contains("4 problems"), "{}", out.stderr);
}

#[test]
fn check_summary_shows_a_tls_admin_listener_as_https() {
    let sb = Sandbox::new();
    let pki = crate::util::http::TestPki::generate(&sb.file(""));
    let config = sb.write_config(&format!(
        "data_dir: data\nadmin: {{ listen: \"127.0.0.1:9464\", tls: {{ cert_file: {cert}, key_file: {key} }} }}\nstreams:\n  logs: {{}}\n",
        cert = crate::util::quote(pki.server_cert.display().to_string()),
        key = crate::util::quote(pki.server_key.display().to_string()),
    ));
    let mut cmd = colibri();
    cmd.arg("check").arg("--config").arg(&config);
    let out = finish(cmd, secs(10));
    assert_code(out.status, 0, &out.stderr);
    assert!(
        out.stdout
            .contains("admin           https://127.0.0.1:9464/metrics"),
        "{}",
        out.stdout
    );
}

#[test]
fn check_warns_when_a_secret_is_the_placeholder_written_in_the_file() {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/edge-chores.yaml");
    let mut cmd = colibri();
    cmd.arg("check").arg("--config").arg(&file);
    for var in [
        "UPSTREAM_TOKEN",
        "INGEST_TOKEN",
        "MQTT_PASSWORD",
        "OPCUA_PASSWORD",
    ] {
        cmd.env_remove(var);
    }
    let out = finish(cmd, secs(10));
    // Still accepted (an example must check), but each stand-in is named, and only those.
    assert_code(out.status, 0, &out.stderr);
    let warned: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("is a placeholder"))
        .collect();
    assert_eq!(warned.len(), 4, "{}", out.stderr);
    assert!(
        warned
            .iter()
            .any(|l| l.contains("sources.line1-plc.password") && l.contains("${OPCUA_PASSWORD}")),
        "{}",
        out.stderr
    );
    assert!(
        warned
            .iter()
            .any(|l| l.contains(".password") && l.contains("${MQTT_PASSWORD}")),
        "{}",
        out.stderr
    );
    assert!(
        warned
            .iter()
            .any(|l| l.contains("ingest.token") && l.contains("${INGEST_TOKEN}")),
        "{}",
        out.stderr
    );
    assert!(
        warned
            .iter()
            .any(|l| l.contains(".headers.Authorization") && l.contains("${UPSTREAM_TOKEN}")),
        "{}",
        out.stderr
    );
    assert!(
        !out.stderr.contains("change-me"),
        "the placeholder itself is not echoed: {}",
        out.stderr
    );
    // Set, the secret is the operator's: no warning.
    let mut cmd = colibri();
    cmd.arg("check").arg("--config").arg(&file);
    for var in [
        "UPSTREAM_TOKEN",
        "INGEST_TOKEN",
        "MQTT_PASSWORD",
        "OPCUA_PASSWORD",
    ] {
        cmd.env(var, "s3t-by-the-operator");
    }
    let out = finish(cmd, secs(10));
    assert_code(out.status, 0, &out.stderr);
    assert!(!out.stderr.contains("is a placeholder"), "{}", out.stderr);
}

#[test]
fn every_example_config_is_accepted() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("configs");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("read configs/")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no configs/*.yaml");
    for file in files {
        let mut cmd = colibri();
        cmd.arg("check").arg("--config").arg(&file);
        let out = finish(cmd, secs(10));
        assert_code(out.status, 0, &out.stderr);
        assert!(
            out.stdout.starts_with(&format!("{}: ok\n", file.display())),
            "{}: {}",
            file.display(),
            out.stdout
        );
    }
}

#[test]
fn env_expansion_reaches_the_task() {
    const GREETING: &str = "hello from the unit file's environment";
    let sb = Sandbox::new();
    let config = sb.write_config(&format!(
        r#"data_dir: data
workers: ${{COLIBRI_TEST_WORKERS:-3}}
shutdown_grace: 5s
log: {{format: json}}
tasks:
  - name: greet
    type: exec
    schedule: "@reboot"
    timeout: 2s
    command: ["/bin/sh", "-c", {script}]
    env: {{GREETING: "${{COLIBRI_TEST_GREETING}}", OUT: {out}}}
"#,
        script = quote(r#"printf '%s' "$GREETING" > "$OUT""#),
        out = quote_path(&sb.file("greeting")),
    ));

    let mut cmd = colibri();
    cmd.arg("run")
        .arg("--config")
        .arg(&config)
        .env("COLIBRI_TEST_GREETING", GREETING)
        .env_remove("COLIBRI_TEST_WORKERS");
    let mut agent = Proc::spawn(cmd);
    let run = agent.wait_for_event(secs(15), "a run of greet", |e| is_run_of(e, "greet"));
    assert_eq!(field(&run, "outcome"), "ok", "{run}");
    assert_eq!(sb.read("greeting"), GREETING);
    let started = agent.events_where(|e| message_starts(e, "colibri started"));
    assert_eq!(
        started[0]["workers"], 3,
        "the default of ${{COLIBRI_TEST_WORKERS:-3}}: {}",
        started[0]
    );
    agent.signal(libc::SIGTERM);
    let status = agent.wait_exit(secs(10));
    assert_code(status, 0, &agent.stderr());

    // The variable, when set, wins over the default; COLIBRI_CONFIG names the file.
    let mut cmd = colibri();
    cmd.arg("check")
        .env("COLIBRI_CONFIG", &config)
        .env("COLIBRI_TEST_GREETING", GREETING)
        .env("COLIBRI_TEST_WORKERS", "5");
    let out = finish(cmd, secs(10));
    assert_code(out.status, 0, &out.stderr);
    assert!(
        out.stdout
            .lines()
            .any(|l| l.split_whitespace().eq(["workers", "5"])),
        "{}",
        out.stdout
    );

    // Unset, with no default: `run` refuses, naming the variable and where it is used (`check`
    // warns and goes on: see read_only_commands_go_on_without_an_unset_variable_and_run_refuses).
    let mut cmd = colibri();
    cmd.arg("run")
        .arg("--config")
        .arg(&config)
        .env_remove("COLIBRI_TEST_GREETING")
        .env_remove("COLIBRI_TEST_WORKERS");
    let out = finish(cmd, secs(10));
    assert_code(out.status, 1, &out.stderr);
    assert!(
        out.stderr
            .lines()
            .any(|l| l.contains("tasks[0].env.GREETING")
                && l.contains("environment variable COLIBRI_TEST_GREETING is not set")),
        "{}",
        out.stderr
    );
}

#[test]
fn version_and_help() {
    let mut cmd = colibri();
    cmd.arg("version");
    let out = finish(cmd, secs(10));
    assert_code(out.status, 0, &out.stderr);
    assert_eq!(
        out.stdout,
        format!("colibri {}\n", env!("CARGO_PKG_VERSION"))
    );

    let mut cmd = colibri();
    cmd.arg("--help");
    let out = finish(cmd, secs(10));
    assert_code(out.status, 0, &out.stderr);
    for sub in ["run", "check", "schema", "version"] {
        assert!(
            out.stdout
                .lines()
                .any(|l| l.split_whitespace().next() == Some(sub)),
            "--help does not list {sub}:\n{}",
            out.stdout
        );
    }
}

#[test]
fn skipped_when_still_running() {
    let sb = Sandbox::new();
    let config = sb.write_config(&format!(
        r#"data_dir: data
shutdown_grace: 10s
log: {{format: json}}
tasks:
  - name: slowpoke
    type: exec
    every: 1s
    timeout: 5s
    command: ["/bin/sh", "-c", {script}]
    env: {{OUT: {out}}}
"#,
        script = quote(r#"echo "start $(date +%s%3N)" >> "$OUT"; sleep 2.5; echo "end $(date +%s%3N)" >> "$OUT""#),
        out = quote_path(&sb.file("spans")),
    ));
    let mut agent = Proc::run(&config);
    // Runs at 0 s and 3 s; the occurrences at 1 s and 2 s find the first still going.
    agent.wait_until(secs(20), "a skip, then a second run", || {
        let starts = sb
            .complete_lines("spans")
            .iter()
            .filter(|l| l.starts_with("start"))
            .count();
        starts >= 2
            && !agent
                .events_where(|e| field(e, "message") == SKIPPED)
                .is_empty()
    });
    agent.signal(libc::SIGTERM);
    let status = agent.wait_exit(secs(15));
    assert_code(status, 0, &agent.stderr());

    // start/end strictly alternate (the shutdown let the last run finish), in time order.
    let lines = sb.complete_lines("spans");
    let mut spans: Vec<(i64, i64)> = Vec::new();
    let mut open: Option<i64> = None;
    for line in &lines {
        let (kind, ms) = line
            .split_once(' ')
            .unwrap_or_else(|| panic!("malformed {line:?}"));
        let ms: i64 = ms.parse().unwrap_or_else(|_| panic!("malformed {line:?}"));
        match (kind, open) {
            ("start", None) => {
                if let Some((_, end)) = spans.last() {
                    assert!(
                        ms >= *end,
                        "a run started before the previous one ended: {lines:?}"
                    );
                }
                open = Some(ms);
            }
            ("end", Some(start)) => {
                assert!(ms >= start, "{lines:?}");
                spans.push((start, ms));
                open = None;
            }
            _ => panic!("runs overlapped or a line is malformed at {line:?}: {lines:?}"),
        }
    }
    assert!(open.is_none(), "the last run did not finish: {lines:?}");
    assert!(spans.len() >= 2, "{lines:?}");

    let events = agent.events();
    let ok: Vec<&Value> = events.iter().filter(|e| is_run_of(e, "slowpoke")).collect();
    assert_eq!(ok.len(), spans.len(), "one event per run: {ok:?}");
    assert!(ok.iter().all(|e| field(e, "outcome") == "ok"), "{ok:?}");
    let skips: Vec<&Value> = events
        .iter()
        .filter(|e| field(e, "message") == SKIPPED)
        .collect();
    assert!(!skips.is_empty());
    for (i, skip) in skips.iter().enumerate() {
        assert_eq!(field(skip, "task"), "slowpoke", "{skip}");
        assert_eq!(skip["skipped_total"], i + 1, "{skip}");
        assert_eq!(field(skip, "level"), "WARN", "{skip}");
        // Skipped only while a run was going.
        let at = timestamp_ms(skip);
        assert!(
            spans.iter().any(|(s, e)| (*s..=*e).contains(&at)),
            "skipped at {at} with no run going: {spans:?}"
        );
    }
}

#[test]
fn check_names_the_variable_and_never_prints_its_value() {
    let sb = Sandbox::new();
    let config = sb.write_config(
        "data_dir: data\n\
         workers: ${IT}\n\
         shutdown_grace: ${GRACE}\n\
         log: { level: \"${LEVEL}\" }\n\
         storage: { max_bytes: \"${SIZE}\" }\n",
    );
    let mut cmd = colibri();
    cmd.arg("check")
        .arg("--config")
        .arg(&config)
        .env("IT", "ITSECRET4")
        .env("GRACE", "GRACESECRET5")
        .env("LEVEL", "LEVELSECRET6")
        .env("SIZE", "SIZESECRET7");
    let out = finish(cmd, secs(10));
    assert_code(out.status, 1, &out.stderr);
    assert!(
        !out.stderr.contains("SECRET") && !out.stdout.contains("SECRET"),
        "a value from the environment was printed:\n{}",
        out.stderr
    );
    for says in [
        "  workers: expected a whole number, found the value of ${IT}",
        "  shutdown_grace: duration the value of ${GRACE}: ",
        "  log.level: expected one of `error`, `warn`, `info`, `debug`, `trace`, found the value of ${LEVEL}",
        "  storage.max_bytes: size the value of ${SIZE}: ",
    ] {
        assert!(
            out.stderr.lines().any(|l| l.starts_with(says)),
            "no line starting {says:?}:\n{}",
            out.stderr
        );
    }
}

#[test]
fn read_only_commands_go_on_without_an_unset_variable_and_run_refuses() {
    let sb = Sandbox::new();
    let config = sb.write_config(
        "data_dir: data\n\
         sinks:\n  up: { type: http, url: \"http://127.0.0.1:9/in\", headers: { Authorization: \"Bearer ${COLIBRI_TEST_UNSET_TOKEN}\" } }\n\
         streams:\n  logs: { sink: up }\n",
    );
    let warning = format!(
        "warning: ${{COLIBRI_TEST_UNSET_TOKEN}} is not set ({}: sinks.up.headers.Authorization); this command goes on without it, `colibri run` refuses the file until it is set",
        config.display()
    );
    let warned_once = |what: &str, stderr: &str| {
        assert_eq!(
            stderr
                .lines()
                .filter(|l| l.starts_with("warning:"))
                .collect::<Vec<_>>(),
            [warning.as_str()],
            "{what}: stderr:\n{stderr}"
        );
    };
    let command = |args: &[&str]| {
        let mut cmd = colibri();
        cmd.args(args).arg("--config").arg(&config);
        cmd.env_remove("COLIBRI_TEST_UNSET_TOKEN");
        cmd
    };

    let out = finish(command(&["check"]), secs(10));
    assert_code(out.status, 0, &out.stderr);
    warned_once("check", &out.stderr);
    assert!(out.stdout.contains(": ok\n"), "{}", out.stdout);

    // The queue commands work too: they never connect upstream.
    let mut push = command(&["queue", "push", "logs"]);
    push.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = push.spawn().expect("spawn colibri");
    // A JSON record: the stream's sink sends NDJSON, so push checks each line is JSON.
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"{\"r\":1}\n").unwrap();
    let pushed = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&pushed.stderr);
    assert_code(pushed.status, 0, &stderr);
    warned_once("push", &stderr);
    assert_eq!(String::from_utf8_lossy(&pushed.stdout), "acked 1\n");
    for args in [&["queue", "stats"][..], &["queue", "peek", "logs"]] {
        let out = finish(command(args), secs(10));
        assert_code(out.status, 0, &out.stderr);
        warned_once(&args.join(" "), &out.stderr);
    }

    // run does not start without it.
    let out = finish(command(&["run"]), secs(10));
    assert_code(out.status, 1, &out.stderr);
    assert!(
        out.stderr.contains(
            "sinks.up.headers.Authorization: environment variable COLIBRI_TEST_UNSET_TOKEN is not set"
        ),
        "{}",
        out.stderr
    );

    // Where the store is stays an error for the queue commands: they must not guess it.
    let config =
        sb.write_config("data_dir: \"${COLIBRI_TEST_UNSET_DIR}/data\"\nstreams:\n  logs: {}\n");
    let mut cmd = colibri();
    cmd.args(["queue", "stats", "--config"]).arg(&config);
    let out = finish(cmd, secs(10));
    assert_code(out.status, 1, &out.stderr);
    assert!(
        out.stderr
            .contains("data_dir: environment variable COLIBRI_TEST_UNSET_DIR is not set"),
        "{}",
        out.stderr
    );
}

#[test]
fn a_start_up_error_is_printed_once() {
    let sb = Sandbox::new();
    std::fs::write(sb.file("taken"), "a file, not a directory").unwrap();
    let run = |config: &std::path::Path| {
        let mut cmd = colibri();
        cmd.arg("run").arg("--config").arg(config);
        finish(cmd, secs(10))
    };
    // Logging to stderr: the ERROR event is the report (under systemd stderr is the journal).
    let config = sb.write_config("data_dir: taken/data\nstreams:\n  logs: {}\n");
    let out = run(&config);
    assert_code(out.status, 1, &out.stderr);
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{}", out.stderr);
    assert!(
        lines[0].contains("ERROR") && lines[0].contains("cannot create data_dir"),
        "{}",
        out.stderr
    );
    // In JSON, the same one event and nothing that is not JSON.
    let config =
        sb.write_config("data_dir: taken/data\nlog: { format: json }\nstreams:\n  logs: {}\n");
    let out = run(&config);
    assert_code(out.status, 1, &out.stderr);
    let events: Vec<Value> = out
        .stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert_eq!(events.len(), 1, "{}", out.stderr);
    assert_eq!(events[0]["level"], "ERROR", "{}", events[0]);
    // Logging to a file: the event goes there, and stderr (the supervisor's log) gets the one
    // `error:` line.
    let config = sb.write_config(&format!(
        "data_dir: taken/data\nlog: {{ file: {} }}\nstreams:\n  logs: {{}}\n",
        quote_path(&sb.file("colibri.log"))
    ));
    let out = run(&config);
    assert_code(out.status, 1, &out.stderr);
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{}", out.stderr);
    assert!(
        lines[0].starts_with("error: cannot create data_dir"),
        "{}",
        out.stderr
    );
    let log = sb.read("colibri.log");
    assert_eq!(
        log.matches("cannot create data_dir").count(),
        1,
        "the log file:\n{log}"
    );
}

#[test]
fn a_missing_config_file_is_reported_once() {
    for args in [
        &["check"][..],
        &["run"],
        &["queue", "stats"],
        &["queue", "peek", "logs"],
    ] {
        let mut cmd = colibri();
        cmd.args(args)
            .args(["--config", "/nonexistent/colibri.yaml"]);
        let out = finish(cmd, secs(10));
        assert_code(out.status, 1, &out.stderr);
        assert_eq!(
            out.stderr,
            "error: cannot read config file /nonexistent/colibri.yaml: No such file or directory (os error 2)\n",
            "{args:?}"
        );
    }
}
