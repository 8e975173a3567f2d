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
