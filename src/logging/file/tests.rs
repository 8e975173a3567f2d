use std::os::unix::fs::PermissionsExt;
use std::sync::mpsc;

use serde_json::Value;

use super::*;

const WAIT: Duration = Duration::from_secs(10);

fn spec(dir: &Path, max_size: u64, max_files: u32) -> LogFile {
    LogFile {
        path: dir.join("colibri.log"),
        max_size,
        max_files,
    }
}

/// A subscriber writing through `w`, as `logging::init` builds it, for use with `with_default`.
fn subscriber(w: &FileWriter, format: LogFormat) -> Dispatch {
    super::super::dispatch(LevelFilter::INFO, format, false, w.clone())
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
        .lines()
        .map(str::to_string)
        .collect()
}

fn json_lines(path: &Path) -> Vec<Value> {
    lines(path)
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

#[test]
fn rotation_keeps_max_files_with_the_newest_first_and_every_line_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(dir.path(), 2000, 3);
    let w = start(spec.clone(), LogFormat::Json, CAPACITY).unwrap();
    let d = subscriber(&w, LogFormat::Json);
    // WARN: never dropped, so every line must be somewhere (or rotated out, oldest first).
    tracing::dispatcher::with_default(&d, || {
        for seq in 0..300u64 {
            tracing::warn!(seq, "line {seq:04} with some padding to fill the file");
        }
    });
    assert!(w.flush(WAIT), "flush timed out");

    for n in 1..=3 {
        assert!(numbered(&spec.path, n).exists(), ".{n} is missing");
    }
    assert!(!numbered(&spec.path, 4).exists(), ".4 must not be kept");
    // Oldest to newest: .3, .2, .1, the current file.
    let files = [
        numbered(&spec.path, 3),
        numbered(&spec.path, 2),
        numbered(&spec.path, 1),
        spec.path.clone(),
    ];
    let mut seqs = Vec::new();
    for f in &files {
        let size = std::fs::metadata(f).unwrap().len();
        assert!(size <= spec.max_size, "{} is {size} bytes", f.display());
        let events = json_lines(f);
        assert!(!events.is_empty(), "{} is empty", f.display());
        seqs.extend(events.iter().map(|e| e["seq"].as_u64().unwrap()));
    }
    let first = seqs[0];
    assert!(
        first > 0,
        "the oldest lines were dropped with the oldest file"
    );
    let expected: Vec<u64> = (first..300).collect();
    assert_eq!(seqs, expected, "lines are consecutive across the files");
}

#[test]
fn a_full_queue_drops_info_and_counts_it_while_warn_waits() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(dir.path(), 1 << 20, 3);
    let (open_gate, gate) = mpsc::channel();
    let w = start_gated(spec.clone(), LogFormat::Json, 4, Some(gate)).unwrap();
    let d = subscriber(&w, LogFormat::Json);
    tracing::dispatcher::with_default(&d, || {
        // 4 fill the queue (the writer is held at its gate), the next 10 are dropped.
        for seq in 0..14u64 {
            tracing::info!(seq, "info");
        }
    });
    let (done_tx, done) = mpsc::channel();
    let d2 = d.clone();
    let warner = std::thread::spawn(move || {
        tracing::dispatcher::with_default(&d2, || tracing::warn!(seq = 99u64, "urgent"));
        let _ = done_tx.send(());
    });
    assert_eq!(
        done.recv_timeout(Duration::from_millis(300)),
        Err(mpsc::RecvTimeoutError::Timeout),
        "a WARN must wait for room, not be dropped"
    );
    open_gate.send(()).unwrap();
    done.recv_timeout(WAIT)
        .expect("the WARN went in once there was room");
    warner.join().unwrap();
    tracing::dispatcher::with_default(&d, || tracing::info!(seq = 100u64, "after"));
    assert!(w.flush(WAIT), "flush timed out");

    let events = json_lines(&spec.path);
    let summary: Vec<(String, String)> = events
        .iter()
        .map(|e| {
            let what = match (&e["seq"], &e["dropped"]) {
                (Value::Number(n), _) => format!("seq {n}"),
                (_, Value::Number(n)) => format!("dropped {n}"),
                _ => format!("{e}"),
            };
            (e["level"].as_str().unwrap_or("").to_string(), what)
        })
        .collect();
    let expected: Vec<(String, String)> = [
        ("INFO", "seq 0"),
        ("INFO", "seq 1"),
        ("INFO", "seq 2"),
        ("INFO", "seq 3"),
        ("WARN", "dropped 10"),
        ("WARN", "seq 99"),
        ("INFO", "seq 100"),
    ]
    .iter()
    .map(|(l, w)| (l.to_string(), w.to_string()))
    .collect();
    assert_eq!(summary, expected);
    assert_eq!(
        events[4]["message"],
        "log queue full: events below WARN were dropped"
    );
}

#[test]
fn flush_makes_everything_written_visible_and_returns() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(dir.path(), 64 << 20, 10);
    let w = start(spec.clone(), LogFormat::Text, CAPACITY).unwrap();
    assert!(w.flush(WAIT), "a flush with nothing queued returns");
    let d = subscriber(&w, LogFormat::Text);
    tracing::dispatcher::with_default(&d, || {
        for seq in 0..2000u64 {
            tracing::info!(seq, "text line");
        }
    });
    let started = Instant::now();
    assert!(w.flush(WAIT), "flush timed out");
    assert!(started.elapsed() < WAIT);
    let text = lines(&spec.path);
    assert_eq!(text.len(), 2000);
    assert!(text[1999].ends_with("text line seq=1999"), "{}", text[1999]);
    assert!(
        text.iter().all(|l| !l.contains('\x1b')),
        "no colour in a file"
    );
    let mode = std::fs::metadata(&spec.path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode & !0o640, 0, "mode {mode:o} grants more than 0640");
}

#[test]
fn a_vanished_directory_loses_lines_counted_and_logging_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let spec = spec(&logs, 1000, 2);
    let w = start(spec.clone(), LogFormat::Json, CAPACITY).unwrap();
    let d = subscriber(&w, LogFormat::Json);
    let burst = |from: u64, n: u64| {
        tracing::dispatcher::with_default(&d, || {
            for seq in from..from + n {
                tracing::warn!(seq, "some line that takes room in the file");
            }
        })
    };
    burst(0, 5);
    assert!(w.flush(WAIT));
    std::fs::remove_dir_all(&logs).unwrap();
    // Enough to need a rotation: the rename finds nothing and the new file cannot be created.
    burst(5, 30);
    assert!(w.flush(WAIT), "a failing file does not stall the writer");
    std::fs::create_dir(&logs).unwrap();
    burst(1000, 1);
    assert!(w.flush(WAIT));

    let events = json_lines(&spec.path);
    assert_eq!(events.len(), 2, "{events:?}");
    assert!(
        events[0]["lost"].as_u64().is_some_and(|n| n > 0),
        "{}",
        events[0]
    );
    assert_eq!(events[1]["seq"], 1000);
}
