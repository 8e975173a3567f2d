//! The operator's commands against a running agent, through its admin endpoint: `colibri task
//! list` and `colibri task run` (a run now, its outcome as the exit code, a run refused while one
//! goes on, an unknown task, a refused token, no agent). Real binary, real child processes.

use std::net::SocketAddr;
use std::path::Path;

use serde_json::Value;

use crate::tsdb::free_port;
use crate::util::client::Client;
use crate::util::{Finished, Proc, Sandbox, assert_code, colibri, finish, quote, secs};

/// `colibri task ARGS --config CONFIG`, finished within 60 s.
fn task(config: &Path, args: &[&str]) -> Finished {
    let mut cmd = colibri();
    cmd.arg("task").args(args).arg("--config").arg(config);
    finish(cmd, secs(60))
}

fn listed(config: &Path) -> Vec<Value> {
    let f = task(config, &["list", "--json"]);
    assert_code(f.status, 0, &f.stderr);
    f.stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

fn entry<'a>(list: &'a [Value], name: &str) -> &'a Value {
    list.iter()
        .find(|t| t["name"] == name)
        .unwrap_or_else(|| panic!("{name} not listed: {list:?}"))
}

#[test]
fn task_run_starts_a_chore_now_and_its_outcome_is_the_exit_code() {
    let sb = Sandbox::new();
    let port = free_port();
    let marks = sb.file("marks");
    let config = sb.write_config(&format!(
        r#"data_dir: data
log: {{format: json}}
admin: {{ listen: "127.0.0.1:{port}", token: admin-secret }}
tasks:
  - {{ name: hello, type: exec, schedule: "0 0 1 1 *", command: ["/bin/sh", "-c", {hello}] }}
  - {{ name: broken, type: exec, schedule: "0 0 1 1 *", command: ["/bin/sh", "-c", "exit 3"] }}
  - {{ name: slow, type: exec, schedule: "0 0 1 1 *", command: ["/bin/sleep", "3"] }}
"#,
        hello = quote(format!("echo ran >> {}", marks.display())),
    ));
    let mut agent = Proc::start(&config);

    let list = listed(&config);
    assert_eq!(list.len(), 3, "{list:?}");
    for t in &list {
        assert_eq!(t["running"], false, "{t}");
        assert_eq!(t["last"], Value::Null, "no run yet: {t}");
        assert!(t["next"].is_string(), "planned: {t}");
    }
    let table = task(&config, &["list"]);
    assert_code(table.status, 0, &table.stderr);
    assert!(
        table.stdout.lines().any(|l| l.starts_with("hello")
            && l.contains("0 0 1 1 *")
            && l.contains("idle")
            && l.contains("in ")),
        "{}",
        table.stdout
    );

    let ran = task(&config, &["run", "hello"]);
    assert_code(ran.status, 0, &ran.stderr);
    assert!(ran.stdout.contains("task hello: ok in "), "{}", ran.stdout);
    assert_eq!(std::fs::read_to_string(&marks).unwrap(), "ran\n");
    let hello = entry(&listed(&config), "hello").clone();
    assert_eq!(hello["runs"], 1, "{hello}");
    assert_eq!(hello["last"]["outcome"], "ok", "{hello}");
    assert!(hello["last_success"].is_string(), "{hello}");

    let failed = task(&config, &["run", "broken"]);
    assert_code(failed.status, 1, &failed.stderr);
    assert!(
        failed.stdout.contains("task broken: failed"),
        "{}",
        failed.stdout
    );
    assert_eq!(
        entry(&listed(&config), "broken")["last_success"],
        Value::Null
    );

    // A run while one goes on is refused (runs of one task never overlap).
    let started = task(&config, &["run", "slow", "--no-wait"]);
    assert_code(started.status, 0, &started.stderr);
    let again = task(&config, &["run", "slow"]);
    assert_code(again.status, 1, &again.stderr);
    assert!(again.stderr.contains("is running now"), "{}", again.stderr);
    assert_eq!(entry(&listed(&config), "slow")["running"], true);
    let unknown = task(&config, &["run", "nope"]);
    assert_code(unknown.status, 1, &unknown.stderr);
    assert!(
        unknown.stderr.contains("no task named \"nope\""),
        "{}",
        unknown.stderr
    );

    // Without the token the endpoint refuses both routes.
    let mut c = Client::new(SocketAddr::from(([127, 0, 0, 1], port)));
    assert_eq!(c.request("GET", "/-/tasks", &[], None).unwrap().status, 401);
    assert_eq!(
        c.request("POST", "/-/tasks/hello/run", &[], Some(b""))
            .unwrap()
            .status,
        401
    );
    assert_eq!(
        std::fs::read_to_string(&marks).unwrap(),
        "ran\n",
        "a refused run did not run"
    );

    agent.signal(libc::SIGTERM);
    assert_code(agent.wait_exit(secs(30)), 0, &agent.stderr());
    let gone = task(&config, &["list"]);
    assert_code(gone.status, 1, &gone.stderr);
    assert!(
        gone.stderr
            .contains("no agent answers at http://127.0.0.1:"),
        "{}",
        gone.stderr
    );
}

/// A reload that changes a setting only a restart applies raises `restart_pending` until a
/// reload puts the setting back.
#[test]
fn restart_pending_says_a_reload_left_settings_for_a_restart() {
    let sb = Sandbox::new();
    let port = free_port();
    let text = |workers: u32| {
        format!(
            "data_dir: data\nlog: {{format: json}}\nworkers: {workers}\nadmin: {{ listen: \"127.0.0.1:{port}\" }}\n"
        )
    };
    let config = sb.write_config(&text(4));
    let mut agent = Proc::start(&config);
    let mut c = Client::new(SocketAddr::from(([127, 0, 0, 1], port)));
    let mut pending = || {
        let page = c.request("GET", "/metrics", &[], None).unwrap().text();
        page.lines()
            .find_map(|l| l.strip_prefix("colibri_config_restart_pending "))
            .unwrap_or_else(|| panic!("no restart_pending in:\n{page}"))
            .to_string()
    };
    assert_eq!(pending(), "0");
    for (workers, want, reloads) in [(5, "1", 1), (4, "0", 2)] {
        sb.write_config(&text(workers));
        agent.signal(libc::SIGHUP);
        agent.wait_until(secs(10), "the reload applied", || {
            agent
                .events_where(|e| crate::util::field(e, "message").starts_with("config reloaded"))
                .len()
                >= reloads
        });
        assert_eq!(pending(), want, "workers: {workers}");
    }
    agent.signal(libc::SIGTERM);
    assert_code(agent.wait_exit(secs(30)), 0, &agent.stderr());
}

/// `colibri queue ...` with the agent running goes through its admin endpoint: a push during an
/// outage is acked and delivered once the receiver is back; dead letters replayed and purged at
/// the same time while records keep arriving: each dead job is delivered once or purged, never
/// both; a paused stream queues and delivers nothing until resumed. The accounting identity holds
/// after each; every operation needs the token.
#[test]
fn queue_operations_on_a_running_agent() {
    use crate::util::http::{Mode, Receiver};
    use crate::util::{finish_with_stdin, poll, queue, queue_stats, stream_stats};
    let sb = Sandbox::new();
    let rx = Receiver::start();
    rx.set_mode(Mode::Status(400));
    let port = free_port();
    let config = sb.write_config(&format!(
        r#"data_dir: data
log: {{format: json}}
admin: {{ listen: "127.0.0.1:{port}", token: admin-secret }}
sinks:
  up: {{ type: http, url: {url}, retry: {{ max_attempts: 1 }}, link: {{ backoff_cap: 1s }} }}
streams:
  logs: {{ sink: up, batch: {{ max_records: 1 }}, dead_letter: {{ max_jobs: 100000 }} }}
"#,
        url = quote(rx.url("/in")),
    ));
    let mut agent = Proc::start(&config);
    let stats = || stream_stats(&queue_stats(&config, &[]), "logs");
    let balanced = |when: &str| {
        let s = stats();
        assert_eq!(s["balanced"], true, "{when}: {s}");
    };
    let push = |from: u64, n: u64| {
        let body: String = (from..from + n)
            .map(|i| format!("{{\"seq\":{i}}}\n"))
            .collect();
        let f = finish_with_stdin(&sb, queue(&config, &["push", "logs"]), &body, secs(120));
        assert_code(f.status, 0, &f.stderr);
        assert!(f.stdout.ends_with(&format!("acked {n}\n")), "{}", f.stdout);
    };

    // 2,000 records refused (400): 2,000 dead jobs, pushed through the running agent.
    push(0, 2000);
    agent.wait_until(secs(120), "every record dead-lettered", || {
        stats()["dead"]["jobs"] == 2000
    });
    balanced("after the dead letters");

    // The dead letters listed through the agent, page by page, as the store lists them (an
    // --admin where nothing answers: the command reads the store beside the agent). The agent
    // is asked with a config whose data_dir holds no store: only the agent can answer it.
    let elsewhere = sb.file("elsewhere.yaml");
    std::fs::write(
        &elsewhere,
        std::fs::read_to_string(&config)
            .unwrap()
            .replace("data_dir: data", "data_dir: no-store-here"),
    )
    .unwrap();
    let nobody = format!("http://127.0.0.1:{}", free_port());
    for args in [&["--all", "--json"][..], &["-n", "3"][..]] {
        let list = |config: &std::path::Path, extra: &[&str]| {
            let mut cmd = queue(config, &["dead", "list", "logs"]);
            cmd.args(args).args(extra);
            let f = finish(cmd, secs(60));
            assert_code(f.status, 0, &f.stderr);
            f.stdout
        };
        let via_agent = list(&elsewhere, &[]);
        let from_store = list(&config, &["--admin", &nobody]);
        assert_eq!(via_agent, from_store, "dead list {args:?}");
        let want = if args[0] == "--all" { 2000 } else { 3 * 2 };
        assert_eq!(via_agent.lines().count(), want, "{via_agent}");
    }
    let mut c = Client::new(SocketAddr::from(([127, 0, 0, 1], port)));
    assert_eq!(
        c.request("GET", "/-/queues/logs/dead", &[], None)
            .unwrap()
            .status,
        401,
        "the dead letters without the token"
    );

    // Every operation needs the token.
    for path in [
        "/-/queues/logs/dead/replay",
        "/-/queues/logs/dead/purge",
        "/-/queues/logs/records",
        "/-/queues/logs/pause",
    ] {
        assert_eq!(
            c.request("POST", path, &[], Some(b"{}\n")).unwrap().status,
            401,
            "{path}"
        );
    }

    // Replay and purge at once, while more records arrive (now accepted).
    rx.set_mode(Mode::Accept);
    let replay = std::thread::spawn({
        let config = config.clone();
        move || {
            finish(
                queue(&config, &["dead", "replay", "logs", "--json"]),
                secs(120),
            )
        }
    });
    let purge = finish(
        queue(&config, &["dead", "purge", "logs", "--yes", "--json"]),
        secs(120),
    );
    push(10_000, 300);
    let replay = replay.join().unwrap();
    assert_code(replay.status, 0, &replay.stderr);
    assert_code(purge.status, 0, &purge.stderr);
    let replayed: Value = serde_json::from_str(replay.stdout.trim()).unwrap();
    let purged: Value = serde_json::from_str(purge.stdout.trim()).unwrap();
    let (r, p) = (
        replayed["replayed_records"].as_u64().unwrap(),
        purged["purged_records"].as_u64().unwrap(),
    );
    assert_eq!(
        r + p,
        2000,
        "each dead job replayed or purged: {replayed} {purged}"
    );
    let want = (r + 300) as usize;
    rx.wait_records(want, secs(120))
        .expect("the replayed and the new records delivered");
    agent.wait_until(secs(30), "nothing left to deliver", || {
        stats()["ready"]["jobs"] == 0
    });
    let mut seqs: Vec<u64> = rx
        .records()
        .iter()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["seq"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(seqs.len(), want, "each delivered once");
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(seqs.len(), want, "no record twice");
    assert_eq!(seqs.iter().filter(|&&s| s >= 10_000).count(), 300);
    let s = stats();
    assert_eq!(s["dead"]["jobs"], 0, "{s}");
    assert_eq!(s["counters"]["dropped_purged_records"], p, "{s}");
    balanced("after replay and purge");

    // A push during an outage is acked now and delivered once the receiver is back.
    rx.set_mode(Mode::Refuse);
    push(20_000, 50);
    rx.set_mode(Mode::Accept);
    rx.wait_records(want + 50, secs(60))
        .expect("the pushed records delivered after the outage");
    balanced("after the push in the outage");

    // Paused: appends queue, nothing is delivered; resumed: all of it is.
    let pause = finish(queue(&config, &["pause", "logs"]), secs(30));
    assert_code(pause.status, 0, &pause.stderr);
    assert!(pause.stdout.contains("paused"), "{}", pause.stdout);
    push(30_000, 20);
    let delivered = rx.records().len();
    let page = c
        .request(
            "GET",
            "/metrics",
            &[("Authorization", "Bearer admin-secret")],
            None,
        )
        .unwrap()
        .text();
    assert!(
        page.contains("colibri_stream_paused{stream=\"logs\"} 1"),
        "{page}"
    );
    assert!(
        poll(secs(2), || (rx.records().len() > delivered).then_some(())).is_none(),
        "a paused stream delivered"
    );
    assert_eq!(stats()["ready"]["jobs"], 20);
    let resume = finish(queue(&config, &["resume", "logs"]), secs(30));
    assert_code(resume.status, 0, &resume.stderr);
    rx.wait_records(want + 70, secs(60))
        .expect("delivered after the resume");
    balanced("after pause and resume");

    // A replay while the receiver still refuses ends: what dies again meanwhile is not replayed
    // again and again.
    rx.set_mode(Mode::Status(400));
    push(40_000, 5);
    agent.wait_until(secs(60), "five dead letters", || {
        stats()["dead"]["jobs"] == 5
    });
    let again = finish(
        queue(&config, &["dead", "replay", "logs", "--json"]),
        secs(60),
    );
    assert_code(again.status, 0, &again.stderr);
    let again: Value = serde_json::from_str(again.stdout.trim()).unwrap();
    assert_eq!(again["replayed_jobs"], 5, "{again}");
    agent.wait_until(secs(60), "dead again", || stats()["dead"]["jobs"] == 5);
    balanced("after a replay into a refusing receiver");

    agent.signal(libc::SIGTERM);
    assert_code(agent.wait_exit(secs(30)), 0, &agent.stderr());
    // With the agent stopped the commands open the store, as before.
    let offline = finish(queue(&config, &["dead", "replay", "logs"]), secs(30));
    assert_code(offline.status, 0, &offline.stderr);
    let paused = finish(queue(&config, &["pause", "logs"]), secs(30));
    assert_code(paused.status, 1, &paused.stderr);
    assert!(
        paused.stderr.contains("no agent answers"),
        "{}",
        paused.stderr
    );
}

/// `queue stats` reads the store, but a pause lives in the running agent: the PAUSED column (and
/// `paused` in JSON) is asked of the agent, and says `-` (null) when no agent answers.
#[test]
fn queue_stats_shows_which_streams_the_running_agent_has_paused() {
    use crate::util::http::Receiver;
    use crate::util::{queue, queue_stats, stream_stats};
    let sb = Sandbox::new();
    let rx = Receiver::start();
    let port = free_port();
    let config = sb.write_config(&format!(
        r#"data_dir: data
log: {{format: json}}
admin: {{ listen: "127.0.0.1:{port}", token: admin-secret }}
sinks:
  up: {{ type: http, url: {url} }}
streams:
  logs: {{ sink: up }}
  metrics: {{ sink: up }}
"#,
        url = quote(rx.url("/in")),
    ));
    let mut agent = Proc::start(&config);
    let paused = |stream: &str| stream_stats(&queue_stats(&config, &[]), stream)["paused"].clone();
    let table = || {
        let f = finish(queue(&config, &["stats"]), secs(30));
        assert_code(f.status, 0, &f.stderr);
        let header = f.stdout.lines().nth(1).unwrap_or("").to_string();
        assert!(header.ends_with(" PAUSED"), "{}", f.stdout);
        let cell = |stream: &str| {
            let row = f
                .stdout
                .lines()
                .find(|l| l.starts_with(&format!("{stream} ")));
            let row = row.unwrap_or_else(|| panic!("no row for {stream}:\n{}", f.stdout));
            row.split_whitespace().last().unwrap_or("").to_string()
        };
        (cell("logs"), cell("metrics"), f.stdout.clone())
    };
    assert_eq!(
        (paused("logs"), paused("metrics")),
        (Value::Bool(false), Value::Bool(false))
    );

    let f = finish(queue(&config, &["pause", "logs"]), secs(30));
    assert_code(f.status, 0, &f.stderr);
    assert_eq!(
        (paused("logs"), paused("metrics")),
        (Value::Bool(true), Value::Bool(false))
    );
    let (logs, metrics, out) = table();
    assert_eq!((logs.as_str(), metrics.as_str()), ("yes", "no"), "{out}");

    let f = finish(queue(&config, &["resume", "logs"]), secs(30));
    assert_code(f.status, 0, &f.stderr);
    assert_eq!(paused("logs"), Value::Bool(false));

    agent.signal(libc::SIGTERM);
    assert_code(agent.wait_exit(secs(30)), 0, &agent.stderr());
    // Nobody to ask: `-`, said, rather than a guess.
    assert_eq!(paused("logs"), Value::Null);
    let (logs, metrics, out) = table();
    assert_eq!((logs.as_str(), metrics.as_str()), ("-", "-"), "{out}");
    assert!(out.contains("PAUSED -: no agent answered"), "{out}");
}

/// `colibri tap` prints what is appended to a stream from when it starts, in order, and ends at
/// `--limit`; `--delivered` prints what the sink acknowledged, nothing while its link is down;
/// `--json` embeds each record as it is stored (its keys in their order).
#[test]
fn tap_prints_records_as_they_are_appended_and_as_they_are_delivered() {
    use crate::util::http::{Mode, Receiver};
    use crate::util::{poll, queue};
    let sb = Sandbox::new();
    let central = Receiver::start();
    central.set_mode(Mode::Refuse);
    let port = free_port();
    let config = sb.write_config(&format!(
        r#"data_dir: data
log: {{format: json}}
admin: {{ listen: "127.0.0.1:{port}" }}
sinks:
  central: {{ type: http, url: {c}, link: {{ backoff_cap: 1s }} }}
streams:
  logs: {{ sink: central, batch: {{ max_records: 1 }} }}
"#,
        c = quote(central.url("/in")),
    ));
    let mut agent = Proc::start(&config);
    let tap = |extra: &[&str]| {
        let mut cmd = colibri();
        cmd.args(["tap", "logs", "--limit", "5", "--json", "--config"])
            .arg(&config)
            .args(extra);
        Proc::spawn(cmd)
    };
    let (mut appended, mut delivered) = (tap(&[]), tap(&["--delivered"]));
    let mut seq = 0u64;
    let mut push = || {
        seq += 1;
        let f = crate::util::finish_with_stdin(
            &sb,
            queue(&config, &["push", "logs"]),
            &format!("{{\"seq\":{seq},\"about\":\"tap\"}}\n"),
            secs(30),
        );
        assert_code(f.status, 0, &f.stderr);
    };
    let ended = poll(secs(60), || {
        push();
        appended.exited().then_some(())
    });
    assert!(ended.is_some(), "tap did not end: {}", appended.stderr());
    assert_eq!(delivered.stdout(), "", "delivered while the link is down");
    // The link back: what is delivered from now on (the backlog first) is tapped.
    central.set_mode(Mode::Accept);
    let ended = poll(secs(60), || {
        push();
        delivered.exited().then_some(())
    });
    assert!(
        ended.is_some(),
        "tap --delivered did not end: {}",
        delivered.stderr()
    );
    let received: Vec<Value> = central
        .records()
        .iter()
        .map(|r| serde_json::from_str(r).unwrap())
        .collect();
    // A delivery also says its lane: live here (sent as soon as appended).
    for (tap, lane) in [
        (&appended, ""),
        (&delivered, r#""lane":"live","replayed":false,"#),
    ] {
        let lines: Vec<Value> = tap
            .stdout()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect();
        assert_eq!(lines.len(), 5, "{}", tap.stdout());
        let first = lines[0]["record"]["seq"].as_u64().unwrap();
        // Each record as it is stored, its keys in their order (not sorted).
        for (i, l) in tap.stdout().lines().enumerate() {
            let n = first + i as u64;
            assert_eq!(
                l,
                format!(r#"{{"stream":"logs",{lane}"record":{{"seq":{n},"about":"tap"}}}}"#)
            );
        }
        for (i, l) in lines.iter().enumerate() {
            assert_eq!(l["stream"], "logs");
            assert_eq!(
                l["record"]["seq"].as_u64(),
                Some(first + i as u64),
                "in order: {l}"
            );
        }
    }
    for l in delivered.stdout().lines() {
        let l: Value = serde_json::from_str(l).unwrap();
        assert!(
            received.contains(&l["record"]),
            "{l} tapped as delivered, not received"
        );
    }
    agent.signal(libc::SIGTERM);
    assert_code(agent.wait_exit(secs(30)), 0, &agent.stderr());
}

/// A tmux session of its own (its socket in the sandbox), 80x24.
struct Tmux {
    socket: std::path::PathBuf,
}

impl Tmux {
    fn start(sb: &Sandbox, command: &str) -> Tmux {
        let t = Tmux {
            socket: sb.file("tmux.sock"),
        };
        let f = t.run(&["new-session", "-d", "-x", "80", "-y", "24", command]);
        assert_code(f.status, 0, &f.stderr);
        t
    }

    fn run(&self, args: &[&str]) -> Finished {
        let mut cmd = std::process::Command::new("tmux");
        cmd.arg("-S").arg(&self.socket).args(args);
        finish(cmd, secs(10))
    }

    fn screen(&self) -> String {
        self.run(&["capture-pane", "-p"]).stdout
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys"];
        args.extend_from_slice(keys);
        let f = self.run(&args);
        assert_code(f.status, 0, &f.stderr);
    }

    /// Waits until the screen shows what `cond` looks for; the last screen otherwise.
    #[track_caller]
    fn wait(&self, what: &str, cond: impl Fn(&str) -> bool) -> String {
        let mut last = String::new();
        let seen = crate::util::poll(secs(20), || {
            last = self.screen();
            cond(&last).then_some(())
        });
        assert!(seen.is_some(), "the screen never showed {what}:\n{last}");
        last
    }

    fn alive(&self) -> bool {
        self.run(&["has-session"]).status.success()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

/// Asserts that the row of `name` in a screen holds `text`.
#[track_caller]
fn row_has(screen: &str, name: &str, text: &str) {
    let r = row(screen, name).unwrap_or_else(|| panic!("no {name} row in:\n{screen}"));
    assert!(r.contains(text), "{name} row without {text:?}:\n{screen}");
}

/// The row of `name` in a screen.
fn row<'a>(screen: &'a str, name: &str) -> Option<&'a str> {
    screen
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
}

/// `colibri top` against a real agent with traffic, an outage and dead letters: `--once` says
/// what `/metrics` says; in tmux the screen shows the streams, sinks and tasks, changes as the
/// link comes back, and answers the keys (sort, filter, quit).
#[test]
fn top_shows_the_agent_and_answers_keys() {
    use crate::util::http::{Mode, Receiver};
    use crate::util::{finish_with_stdin, queue};
    let sb = Sandbox::new();
    let (central, refuser) = (Receiver::start(), Receiver::start());
    central.set_mode(Mode::Refuse);
    refuser.set_mode(Mode::Status(400));
    let port = free_port();
    // A file the tail source cannot keep up with while its stream is full (one job at most,
    // `block`): what it has not read is its lag.
    let app_log = sb.file("app.log");
    let line = format!("{}\n", "x".repeat(199));
    std::fs::write(&app_log, line.repeat(20_000)).unwrap();
    let config = sb.write_config(&format!(
        r#"data_dir: data
log: {{format: json}}
admin: {{ listen: "127.0.0.1:{port}", token: admin-secret }}
sinks:
  central: {{ type: http, url: {c}, link: {{ backoff_cap: 1s }} }}
  picky: {{ type: http, url: {r}, retry: {{ max_attempts: 1 }} }}
streams:
  logs: {{ sink: central, batch: {{ max_records: 1 }} }}
  bad: {{ sink: picky, batch: {{ max_records: 1 }} }}
  files: {{ sink: central, max_jobs: 1, when_full: block }}
sources:
  reader: {{ type: tail, stream: files, paths: [{app_log}] }}
tasks:
  - {{ name: tick, type: exec, schedule: "0 0 1 1 *", command: ["/bin/true"] }}
"#,
        c = quote(central.url("/in")),
        r = quote(refuser.url("/in")),
        app_log = quote(app_log.to_str().unwrap()),
    ));
    let mut agent = Proc::start(&config);
    for (stream, n) in [("logs", 7), ("bad", 3)] {
        let body: String = (0..n).map(|i| format!("{{\"i\":{i}}}\n")).collect();
        let f = finish_with_stdin(&sb, queue(&config, &["push", stream]), &body, secs(30));
        assert_code(f.status, 0, &f.stderr);
    }
    let mut c = Client::new(SocketAddr::from(([127, 0, 0, 1], port)));
    let auth = [("Authorization", "Bearer admin-secret")];
    agent.wait_until(
        secs(30),
        "the dead letters, the link down, the tail behind",
        || {
            let page = c.request("GET", "/metrics", &auth, None).unwrap().text();
            page.contains("colibri_stream_records{stream=\"bad\",queue=\"dead\"} 3")
                && page.contains("colibri_sink_link_up{sink=\"central\"} 0")
                && page.contains("colibri_stream_jobs{stream=\"files\",queue=\"ready\"} 1")
                && !page.contains("colibri_source_lag_bytes{source=\"reader\"} 0\n")
        },
    );

    // What a metric cannot say: why each sink fails.
    let sinks: serde_json::Value =
        serde_json::from_str(&c.request("GET", "/-/sinks", &auth, None).unwrap().text()).unwrap();
    let sink = |name: &str| {
        sinks
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .unwrap_or_else(|| panic!("{name} not in /-/sinks: {sinks}"))
            .clone()
    };
    let (down, picky) = (sink("central"), sink("picky"));
    assert_eq!(down["link"], "down", "{sinks}");
    assert!(
        down["down_since"].is_string() && down["down_reason"].is_string(),
        "{sinks}"
    );
    assert!(down["last_error"]["message"].is_string(), "{sinks}");
    assert_eq!(picky["link"], "up", "{sinks}");
    assert!(
        picky["last_error"]["message"]
            .as_str()
            .unwrap()
            .contains("400"),
        "{sinks}"
    );
    assert_eq!(
        c.request("GET", "/-/sinks", &[], None).unwrap().status,
        401,
        "/-/sinks without the token"
    );

    // --once: plain text, the figures of /metrics.
    let unix_now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    };
    let mut cmd = colibri();
    cmd.args(["top", "--once", "--config"]).arg(&config);
    let before_once = unix_now();
    let once = finish(cmd, secs(30));
    let after_once = unix_now();
    assert_code(once.status, 0, &once.stderr);
    let page = c.request("GET", "/metrics", &auth, None).unwrap().text();
    let metric = |line: &str| -> String {
        page.lines()
            .find_map(|l| l.strip_prefix(line))
            .unwrap_or_else(|| panic!("{line} not in /metrics"))
            .trim()
            .to_string()
    };
    let logs: Vec<&str> = row(&once.stdout, "logs")
        .expect("a logs row")
        .split_whitespace()
        .collect();
    // STREAM QUEUED JOBS DISK RAW AGE IN/s OUT/s DEAD DROP
    assert_eq!(
        logs[1],
        metric("colibri_stream_records{stream=\"logs\",queue=\"ready\"}"),
        "{}",
        once.stdout
    );
    assert_eq!(
        logs[2],
        metric("colibri_stream_jobs{stream=\"logs\",queue=\"ready\"}")
    );
    // The oldest ready job's age: its creation time in /metrics against the clock while
    // `--once` ran, in the screen's one unit (no `+`: nothing waits to be retried).
    let head: f64 = metric("colibri_stream_oldest_ready_timestamp_seconds{stream=\"logs\"}")
        .parse()
        .unwrap();
    let (number, unit) = logs[5].split_at(logs[5].len() - 1);
    let per = match unit {
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => panic!("an age: {}", once.stdout),
    };
    let shown = number.parse::<f64>().unwrap() * per;
    assert!(
        head > 0.0 && shown >= (before_once - head - per).floor() && shown <= after_once - head,
        "age {} shown; {:.1}-{:.1}s by /metrics:\n{}",
        logs[5],
        before_once - head,
        after_once - head,
        once.stdout
    );
    let bad: Vec<&str> = row(&once.stdout, "bad")
        .expect("a bad row")
        .split_whitespace()
        .collect();
    assert_eq!(
        bad[8],
        metric("colibri_stream_records{stream=\"bad\",queue=\"dead\"}")
    );
    row_has(&once.stdout, "central", "DOWN");
    row_has(&once.stdout, "picky", " up ");
    row_has(&once.stdout, "tick", "idle");
    // Each sink's last error under its row.
    let after = |name: &str| {
        let mut lines = once.stdout.lines();
        lines.find(|l| l.split_whitespace().next() == Some(name));
        lines.next().unwrap_or("").to_string()
    };
    assert!(
        after("picky").starts_with("  last error"),
        "{}",
        once.stdout
    );
    assert!(after("picky").contains("400"), "{}", once.stdout);
    assert!(
        after("central").starts_with("  last error"),
        "{}",
        once.stdout
    );
    // The tail source behind its full stream: the bytes it has not read, as /metrics says.
    let reader: Vec<&str> = row(&once.stdout, "reader")
        .expect("a reader row")
        .split_whitespace()
        .collect();
    let lag: u64 = metric("colibri_source_lag_bytes{source=\"reader\"}")
        .parse()
        .unwrap();
    assert!(lag > 0 && lag < 20_000 * 200, "lag {lag}");
    let (n, unit) = reader[4].split_at(reader[4].find(|c: char| c.is_alphabetic()).unwrap());
    let per = match unit {
        "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        other => panic!("a size unit: {other}"),
    };
    // Shown to one decimal.
    let shown = n.parse::<f64>().unwrap() * per;
    assert!(
        (shown - lag as f64).abs() <= 0.05 * per,
        "lag {} shown, {lag} by /metrics:\n{}",
        reader[4],
        once.stdout
    );

    // Live, in tmux.
    let top = format!(
        "{} top --config {}",
        env!("CARGO_BIN_EXE_colibri"),
        config.display()
    );
    let tmux = Tmux::start(&sb, &top);
    let s = tmux.wait("the streams, the link down and the task", |s| {
        row(s, "logs").is_some()
            && row(s, "central").is_some_and(|r| r.contains("DOWN"))
            && row(s, "tick").is_some()
    });
    assert!(
        s.lines().count() <= 24 && s.lines().all(|l| l.chars().count() <= 80),
        "{s}"
    );
    tmux.keys(&["s"]);
    tmux.wait("the sort by backlog", |s| s.contains("sort: backlog"));
    tmux.keys(&["/", "b", "a", "d", "Enter"]);
    tmux.wait("only bad", |s| {
        row(s, "bad").is_some() && row(s, "logs").is_none() && s.contains("filter: bad")
    });
    tmux.keys(&["/", "Escape"]);
    // The receiver back: the link comes up and the backlog drains, on screen.
    central.set_mode(Mode::Accept);
    tmux.wait("the link up, logs drained, the file read", |s| {
        row(s, "central").is_some_and(|r| r.contains(" up "))
            && row(s, "logs").is_some_and(|r| r.split_whitespace().nth(1) == Some("0"))
            && row(s, "reader").is_some_and(|r| r.split_whitespace().nth(4) == Some("0B"))
    });
    tmux.keys(&["q"]);
    assert!(
        crate::util::poll(secs(10), || (!tmux.alive()).then_some(())).is_some(),
        "top did not quit on q"
    );
    agent.signal(libc::SIGTERM);
    assert_code(agent.wait_exit(secs(30)), 0, &agent.stderr());
}

/// The admin endpoint over HTTPS with a certificate signed by a CA: the default `--ca` (the leaf
/// in `admin.tls.cert_file`) and a wrong `--ca` fail as "the agent's certificate is not trusted",
/// naming the CA file and where it came from, not as "no agent answers"; the right CA is served.
#[test]
fn an_untrusted_agent_certificate_is_reported_as_such_not_as_no_agent() {
    use crate::util::http::TestPki;
    let sb = Sandbox::new();
    std::fs::create_dir_all(sb.file("pki")).unwrap();
    let pki = TestPki::generate(&sb.file("pki"));
    let port = free_port();
    let config = sb.write_config(&format!(
        "data_dir: data\n\
         log: {{ format: json }}\n\
         admin: {{ listen: \"127.0.0.1:{port}\", tls: {{ cert_file: {cert}, key_file: {key} }} }}\n\
         streams: {{ logs: {{}} }}\n",
        cert = quote(pki.server_cert.display().to_string()),
        key = quote(pki.server_key.display().to_string()),
    ));
    let agent = Proc::start(&config);
    agent.wait_for_event(secs(30), "colibri started", |e| {
        e["message"] == "colibri started"
    });
    let by_default = task(&config, &["list"]);
    assert_code(by_default.status, 1, &by_default.stderr);
    let err = &by_default.stderr;
    assert!(!err.contains("no agent answers"), "{err}");
    assert!(
        err.contains("the agent's certificate is not trusted")
            && err.contains(&pki.server_cert.display().to_string())
            && err.contains("admin.tls.cert_file"),
        "{err}"
    );
    let other = pki.other_ca.display().to_string();
    let wrong = task(&config, &["list", "--ca", &other]);
    assert_code(wrong.status, 1, &wrong.stderr);
    let err = &wrong.stderr;
    assert!(!err.contains("no agent answers"), "{err}");
    assert!(
        err.contains("the agent's certificate is not trusted")
            && err.contains(&other)
            && err.contains("--ca"),
        "{err}"
    );
    let ca = pki.ca.display().to_string();
    let right = task(&config, &["list", "--ca", &ca]);
    assert_code(right.status, 0, &right.stderr);
}

/// `colibri top` while the agent restarts: the screen stays, says the agent is away (since when,
/// and why), and comes back with the agent; top itself never exits. A sink's last error shows
/// its innermost cause first, so what happened fits in 80 columns (`--once` and live).
#[test]
fn top_keeps_its_screen_while_the_agent_restarts_and_shows_the_cause_first() {
    let sb = Sandbox::new();
    let (port, nowhere) = (free_port(), free_port());
    let config = sb.write_config(&format!(
        r#"data_dir: data
log: {{format: json}}
admin: {{ listen: "127.0.0.1:{port}" }}
sinks:
  gone: {{ type: http, url: "http://127.0.0.1:{nowhere}/in", link: {{ backoff_cap: 1s }} }}
streams:
  logs: {{ sink: gone }}
"#
    ));
    let agent = Proc::start(&config);
    let body = "{\"i\":1}\n";
    let f = crate::util::finish_with_stdin(
        &sb,
        crate::util::queue(&config, &["push", "logs"]),
        body,
        secs(30),
    );
    assert_code(f.status, 0, &f.stderr);
    let cause_first = |screen: &str| {
        let mut lines = screen.lines();
        lines.find(|l| l.split_whitespace().next() == Some("gone"));
        let error = lines.next().unwrap_or("").to_string();
        let cut: String = error.chars().take(80).collect();
        error.starts_with("  last error") && cut.to_lowercase().contains(": connection refused")
    };
    let once = crate::util::poll(secs(30), || {
        let mut cmd = colibri();
        cmd.args(["top", "--once", "--config"]).arg(&config);
        let once = finish(cmd, secs(30));
        (once.status.success() && cause_first(&once.stdout)).then_some(once.stdout)
    });
    assert!(once.is_some(), "no last error with its cause first");

    let top = format!(
        "{} top --config {}",
        env!("CARGO_BIN_EXE_colibri"),
        config.display()
    );
    let tmux = Tmux::start(&sb, &top);
    let s = tmux.wait("the stream and the sink", |s| {
        row(s, "logs").is_some() && row(s, "gone").is_some()
    });
    assert!(cause_first(&s), "{s}");
    let agent = crate::util::stop(agent);
    drop(agent);
    // Its last answers may break off as it stops; then nothing answers.
    let s = tmux.wait("the agent away", |s| {
        s.contains("AGENT AWAY since") && s.contains("no agent answers at http://127.0.0.1:")
    });
    assert!(
        row(&s, "logs").is_some() && row(&s, "gone").is_some(),
        "the last screen kept under the line: {s}"
    );
    assert!(tmux.alive(), "top exited");
    let agent = Proc::start(&config);
    tmux.wait("the agent back", |s| {
        !s.contains("AGENT AWAY") && row(s, "logs").is_some() && row(s, "gone").is_some()
    });
    tmux.keys(&["q"]);
    assert!(
        crate::util::poll(secs(10), || (!tmux.alive()).then_some(())).is_some(),
        "top did not quit on q"
    );
    drop(crate::util::stop(agent));
}
