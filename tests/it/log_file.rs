//! End-to-end tests of `log.file`: the real binary logs into a file in a scratch directory, rotated
//! by size, and every stop (the normal one and the second signal's "exit at once") leaves its last
//! events in the file. With `log.file` stderr stays empty, so the file is read instead of the
//! `Proc` helper's stderr events; every wait is a bounded poll (see `util`).
//!
//! Task scripts are config strings, so colibri's `${VAR}` expansion applies to them: a shell `$$` is
//! written `$$$$`, and shell variables are written `$NAME`, never `${NAME}`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::util::secs;
use crate::util::{
    Proc, Sandbox, assert_code, assert_gone, colibri, complete_lines, field, finish, is_gone,
    parse_pids, poll, quote, quote_path,
};

/// `<path>.<n>`, a rotated file.
fn rotated(path: &Path, n: u32) -> PathBuf {
    PathBuf::from(format!("{}.{n}", path.display()))
}

/// Every complete line of the file parsed as a JSON event; panics on a line that is not JSON.
fn file_events(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    complete_lines(&text)
        .iter()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| {
                panic!("a line of {} is not JSON ({e}): {line}", path.display())
            })
        })
        .collect()
}

/// Waits up to `limit` for an event of the file matching `pred`; panics showing the file's tail.
fn wait_for_file_event(
    path: &Path,
    limit: Duration,
    what: &str,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    poll(limit, || file_events(path).into_iter().find(|e| pred(e))).unwrap_or_else(|| {
        let events = file_events(path);
        let tail: Vec<String> = events
            .iter()
            .rev()
            .take(5)
            .map(|e| field(e, "message").to_string())
            .collect();
        panic!(
            "no {what} in {} within {limit:?}; last messages: {tail:?}",
            path.display()
        )
    })
}

fn message_is(event: &Value, message: &str) -> bool {
    field(event, "message") == message
}

/// A task that prints 50 lines of ~420 bytes and fails, so each run logs an ERROR carrying a
/// ~4 KB output tail.
fn chatty(name: &str) -> String {
    let script = "x=xxxxxxxxxx; x=$x$x$x$x$x$x$x$x$x$x; x=$x$x$x$x; i=0; \
                  while [ $i -lt 50 ]; do echo line-$i-$x; i=$((i+1)); done; exit 3";
    format!(
        "  - {{name: {name}, type: exec, every: 100ms, timeout: 2s, command: [\"/bin/sh\", \"-c\", {}]}}\n",
        quote(script)
    )
}

#[test]
fn the_log_file_rotates_by_size_and_ends_with_the_stop_events() {
    let sb = Sandbox::new();
    std::fs::create_dir(sb.file("logs")).unwrap();
    let log = sb.file("logs/colibri.log");
    let mut yaml = format!(
        "data_dir: data\nshutdown_grace: 5s\n\
         log: {{format: json, file: {}, max_size: 64KiB, max_files: 3}}\ntasks:\n",
        quote_path(&log)
    );
    for i in 0..4 {
        yaml.push_str(&chatty(&format!("chatty-{i}")));
    }
    let config = sb.write_config(&yaml);

    let mut check = colibri();
    check.arg("check").arg("--config").arg(&config);
    let checked = finish(check, secs(20));
    assert_code(checked.status, 0, &checked.stderr);
    let expected = format!(
        "  log             info, json, to {} (rotated at 64KiB, 3 kept)",
        log.display()
    );
    assert!(
        checked.stdout.lines().any(|l| l == expected),
        "{}",
        checked.stdout
    );

    let mut agent = Proc::run(&config);
    // The first file (it starts with "colibri started") has been rotated out of `.3`: at least
    // four rotations, so the oldest was dropped.
    let dropped_oldest = poll(secs(60), || {
        let oldest = file_events(&rotated(&log, 3));
        (!oldest.is_empty() && !oldest.iter().any(|e| message_is(e, "colibri started")))
            .then_some(())
    });
    assert!(
        dropped_oldest.is_some(),
        "no fourth rotation within 60 s; files: {:?}",
        std::fs::read_dir(sb.file("logs"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect::<Vec<_>>()
    );
    agent.signal(libc::SIGTERM);
    let status = agent.wait_exit(secs(20));
    assert_code(status, 0, &agent.stderr());
    assert_eq!(agent.stderr(), "", "with log.file nothing goes to stderr");

    for n in 1..=3 {
        let f = rotated(&log, n);
        assert!(f.exists(), "{} is missing", f.display());
        let size = std::fs::metadata(&f).unwrap().len();
        assert!(size <= 64 << 10, "{} is {size} bytes", f.display());
        let events = file_events(&f);
        assert!(!events.is_empty(), "{} is empty", f.display());
        assert!(
            events.iter().any(|e| field(e, "level") == "ERROR"
                && message_is(e, "task run failed")
                && field(e, "stdout").contains("line-49-xxxx")),
            "{} holds the failing runs with their output",
            f.display()
        );
    }
    assert!(!rotated(&log, 4).exists(), "only 3 rotated files are kept");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.ends_with('\n'), "the last line is complete");
    let events = file_events(&log);
    let tail: Vec<&str> = events
        .iter()
        .rev()
        .take(10)
        .map(|e| field(e, "message"))
        .collect();
    assert_eq!(tail.first(), Some(&"colibri stopped"), "{tail:?}");
    assert!(
        events
            .iter()
            .any(|e| field(e, "message").starts_with("stopping")),
        "{tail:?}"
    );
}

#[test]
fn the_second_signal_error_is_in_the_file_before_the_forced_exit() {
    let sb = Sandbox::new();
    std::fs::create_dir(sb.file("logs")).unwrap();
    let log = sb.file("logs/colibri.log");
    let config = sb.write_config(&format!(
        r#"data_dir: data
shutdown_grace: 30s
log: {{format: json, file: {log}, max_size: 64KiB, max_files: 3}}
tasks:
  - name: sleeper
    type: exec
    schedule: "@reboot"
    timeout: 20s
    command: ["/bin/sh", "-c", {script}]
    env: {{PID: {pid}}}
{chatty}"#,
        log = quote_path(&log),
        script = quote(r#"echo $$$$ > "$PID.tmp"; mv "$PID.tmp" "$PID"; exec sleep 25"#),
        pid = quote_path(&sb.file("pid")),
        chatty = chatty("chatty"),
    ));
    let mut agent = Proc::run(&config);
    agent.wait_until(secs(15), "the task has started", || sb.file("pid").exists());
    let pid = parse_pids(&sb.read("pid"));
    agent.signal(libc::SIGTERM);
    wait_for_file_event(&log, secs(10), "the stopping event", |e| {
        field(e, "message").starts_with("stopping")
    });
    assert!(!is_gone(pid[0]), "the first signal lets the task run on");
    agent.signal(libc::SIGTERM);
    let status = agent.wait_exit(secs(5));
    assert_code(status, 1, &agent.stderr());
    assert_gone(&pid, secs(5), "the task after colibri exited");
    assert_eq!(agent.stderr(), "", "with log.file nothing goes to stderr");

    // Read once, right after the exit: the writer thread is gone, so what is there was flushed.
    let events = file_events(&log);
    let forced: Vec<&Value> = events
        .iter()
        .rev()
        .take(3)
        .filter(|e| message_is(e, "second signal: exiting now"))
        .collect();
    assert_eq!(
        forced.len(),
        1,
        "among the last events: {:?}",
        events.last()
    );
    assert_eq!(field(forced[0], "level"), "ERROR", "{}", forced[0]);
    assert_eq!(forced[0]["killed_groups"], 1, "{}", forced[0]);
}
