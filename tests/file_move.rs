//! End-to-end test of a `file_move` task: the real binary runs it every second against two scratch
//! directories, and the test waits (bounded polls) for settled files to arrive in `to` while a file
//! that keeps being written stays in `from` until it settles.

#[allow(dead_code)] // shared with the other test binaries; each uses its own part of it
mod util;

use std::fs::File;
use std::path::Path;
use std::time::{Duration, SystemTime};

use serde_json::Value;

use util::{Proc, Sandbox, assert_code, field, quote_path};

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn age(path: &Path, by: Duration) {
    File::options()
        .write(true)
        .open(path)
        .expect("open")
        .set_modified(SystemTime::now() - by)
        .expect("set mtime");
}

#[test]
fn settled_files_move_and_a_growing_file_waits() {
    let sb = Sandbox::new();
    let (from, to) = (sb.file("in"), sb.file("out"));
    std::fs::create_dir(&from).unwrap();
    std::fs::create_dir(&to).unwrap();
    for name in ["a.csv", "b.csv", "skip-me.csv", "note.txt"] {
        std::fs::write(from.join(name), name).unwrap();
        age(&from.join(name), secs(3600));
    }
    // Already in `to`: the incoming a.csv gets a number.
    std::fs::write(to.join("a.csv"), "older a").unwrap();
    let growing = from.join("growing.csv");
    std::fs::write(&growing, "start\n").unwrap();

    let config = sb.write_config(&format!(
        r#"data_dir: data
log: {{format: json}}
tasks:
  - name: mover
    type: file_move
    every: 1s
    from: {from}
    pattern: ["*.csv"]
    exclude: ["skip-*"]
    to: {to}
    settle: 2s
"#,
        from = quote_path(&from),
        to = quote_path(&to),
    ));
    let mut agent = Proc::run(&config);
    agent.wait_until(secs(20), "the settled files in to", || {
        names(&to) == ["a.1.csv", "a.csv", "b.csv"]
    });
    // Keep writing for a few more runs: it must stay put.
    for i in 0..6 {
        use std::io::Write;
        let mut f = File::options().append(true).open(&growing).unwrap();
        writeln!(f, "line {i}").unwrap();
        std::thread::sleep(Duration::from_millis(500));
        assert!(
            !to.join("growing.csv").exists(),
            "a file still being written was taken"
        );
    }
    // Once writes stop, it settles and moves.
    agent.wait_until(secs(20), "growing.csv moved after it settled", || {
        to.join("growing.csv").exists()
    });
    assert_eq!(
        std::fs::read_to_string(to.join("a.1.csv")).unwrap(),
        "a.csv"
    );
    assert_eq!(
        std::fs::read_to_string(to.join("a.csv")).unwrap(),
        "older a"
    );
    assert!(
        std::fs::read_to_string(to.join("growing.csv"))
            .unwrap()
            .ends_with("line 5\n")
    );
    assert_eq!(names(&from), ["note.txt", "skip-me.csv"]);

    agent.signal(libc::SIGTERM);
    assert_code(agent.wait_exit(secs(15)), 0, &agent.stderr());
    // One event per run with the counts; the moves add up.
    let runs: Vec<Value> =
        agent.events_where(|e| field(e, "task") == "mover" && field(e, "outcome") == "ok");
    let moved: u64 = runs
        .iter()
        .map(|e| e["files_moved"].as_u64().expect("files_moved on every run"))
        .sum();
    assert_eq!(moved, 3, "{runs:#?}");
    assert!(
        runs.iter()
            .any(|e| e["files_waiting"].as_u64().unwrap_or(0) >= 1),
        "growing.csv was reported as waiting: {runs:#?}"
    );
}
