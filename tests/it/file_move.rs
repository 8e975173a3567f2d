//! End-to-end test of a `file_move` task: the real binary runs it every second against two scratch
//! directories, and the test waits (bounded polls) for settled files to arrive in `to` while a file
//! that keeps being written stays in `from` until it settles.

use std::fs::File;
use std::path::Path;
use std::time::{Duration, SystemTime};

use serde_json::Value;

use crate::util::secs;
use crate::util::{Proc, Sandbox, assert_code, field, quote_path};

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

/// `n` files `f0000.dat` ... each holding its own name, aged past any settle time.
fn make_many(dir: &Path, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let name = format!("f{i:04}.dat");
            let path = dir.join(&name);
            // Some bulk, so a cross-filesystem copy takes a moment.
            let content = format!("{name}\n").repeat(1 + (i % 7) * 500);
            std::fs::write(&path, content).unwrap();
            age(&path, secs(3600));
            name
        })
        .collect()
}

fn content_of(name: &str, i: usize) -> String {
    format!("{name}\n").repeat(1 + (i % 7) * 500)
}

/// After a kill -9: each file is in exactly one of `from` and `to`, or (across filesystems only)
/// in both with identical content; never in neither, never changed. Returns how many are in `to`.
#[track_caller]
fn check_places(from: &Path, to: &Path, files: &[String], both_allowed: bool) -> usize {
    let (f, t) = (names(from), names(to));
    let in_from: std::collections::HashSet<&String> = f.iter().collect();
    let in_to: std::collections::HashSet<&String> = t.iter().collect();
    for (i, name) in files.iter().enumerate() {
        let (a, b) = (in_from.contains(name), in_to.contains(name));
        assert!(a || b, "{name} is in neither place");
        if a && b {
            assert!(both_allowed, "{name} is in both places on one filesystem");
        }
        let want = content_of(name, i);
        if a {
            assert_eq!(
                std::fs::read_to_string(from.join(name)).unwrap(),
                want,
                "{name} in from"
            );
        }
        if b {
            assert_eq!(
                std::fs::read_to_string(to.join(name)).unwrap(),
                want,
                "{name} in to"
            );
        }
    }
    // Nothing else but left-over temporary copies (overwritten by the next attempt).
    for extra in t.iter().filter(|n| !files.contains(n)) {
        assert!(
            extra.ends_with(".colibri-tmp"),
            "unexpected file {extra} in to"
        );
    }
    files.iter().filter(|n| in_to.contains(n)).count()
}

fn kill_loop(sb: &Sandbox, from: &Path, to: &Path, both_allowed: bool) {
    let files = make_many(from, 1000);
    let config = sb.write_config(&format!(
        r#"data_dir: data
log: {{format: json}}
tasks:
  - {{ name: mover, type: file_move, every: 100ms, from: {from}, pattern: ["*.dat"], to: {to}, settle: 1s, max_files: 40, timeout: 8s }}
"#,
        from = quote_path(from),
        to = quote_path(to),
    ));
    let mut rng = fastrand::Rng::with_seed(42);
    let mut kills = 0;
    // Kills that left some files moved and some not (inside the work, not before or after it).
    let mut mid_run = 0;
    for life in 0..60 {
        let mut agent = Proc::run(&config);
        // Die at a random moment of the run (which starts at once), or let it finish.
        std::thread::sleep(Duration::from_millis(rng.u64(10..400)));
        agent.signal(libc::SIGKILL);
        agent.wait_exit(secs(10));
        kills += 1;
        let moved = check_places(from, to, &files, both_allowed);
        if moved == files.len() && names(from).is_empty() {
            eprintln!("all 1000 files moved after {life} restarts and {kills} kills");
            break;
        }
        if moved > 0 && moved < files.len() {
            mid_run += 1;
        }
    }
    // Whatever the kills left: one clean life finishes the job.
    let mut agent = Proc::run(&config);
    agent.wait_for_event(secs(10), "the start", |e| {
        field(e, "message") == "colibri started"
    });
    agent.wait_until(secs(60), "every file moved", || names(from).is_empty());
    agent.signal(libc::SIGTERM);
    assert_code(agent.wait_exit(secs(15)), 0, &agent.stderr());
    assert_eq!(check_places(from, to, &files, both_allowed), files.len());
    assert!(
        mid_run >= 3,
        "the loop killed colibri in the middle of the work several times ({mid_run} of {kills})"
    );
}

#[test]
fn kill_9_at_random_moments_leaves_every_file_in_exactly_one_place() {
    let sb = Sandbox::new();
    let (from, to) = (sb.file("in"), sb.file("out"));
    std::fs::create_dir(&from).unwrap();
    std::fs::create_dir(&to).unwrap();
    kill_loop(&sb, &from, &to, false);
}

/// A tmpfs mounted for the test (needs root); unmounted on drop.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(at: &Path) -> Result<Tmpfs, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root: mounting a tmpfs needs CAP_SYS_ADMIN".into());
        }
        std::fs::create_dir_all(at).map_err(|e| e.to_string())?;
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64m", "colibri-test"])
            .arg(at)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs(at.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn across_filesystems_kill_9_never_leaves_a_file_in_neither_place() {
    let sb = Sandbox::new();
    let from = sb.file("in");
    std::fs::create_dir(&from).unwrap();
    let mnt = match Tmpfs::mount(&sb.file("mnt")) {
        Ok(m) => m,
        Err(why) => {
            eprintln!(
                "SKIPPED across_filesystems_kill_9_never_leaves_a_file_in_neither_place: {why}"
            );
            return;
        }
    };
    let to = mnt.0.join("out");
    std::fs::create_dir(&to).unwrap();
    kill_loop(&sb, &from, &to, true);
}
