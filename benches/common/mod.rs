//! Helpers the benchmarks share to drive the real binary: which binary, how many cores, starting
//! `colibri run`, signalling and stopping it, and reading its memory from /proc.

#![allow(dead_code, reason = "each bench uses its own subset")]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The binary under test: `COLIBRI_BIN` (e.g. the static release build), else the one cargo built.
pub fn bin() -> String {
    std::env::var("COLIBRI_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_colibri").to_string())
}

pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `colibri run --config <config>` with stderr piped (the benches read its JSON log).
pub fn spawn_run(config: &Path) -> Child {
    Command::new(bin())
        .args(["run", "--config"])
        .arg(config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn colibri run")
}

pub fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) with the pid of a child we spawned and have not reaped.
    unsafe { libc::kill(child.id() as i32, sig) };
}

/// SIGTERM, then reap.
pub fn stop(mut child: Child) {
    signal(&child, libc::SIGTERM);
    let _ = child.wait();
}

/// (resident KiB, peak resident KiB) of a process.
pub fn rss_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// A numeric setting from the environment, or its default.
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// CPU seconds (user + system) a process has used, from `/proc/PID/stat` (clock ticks).
pub fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at ") ".
    let rest = stat.rsplit_once(") ").map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks: f64 = f.get(11..13).map_or(0.0, |v| {
        v.iter().filter_map(|x| x.parse::<f64>().ok()).sum()
    });
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks / hz
}

/// Forwards a child's stderr (its log) to a channel, a line at a time.
pub fn log_lines(child: &mut Child) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().expect("stderr is piped");
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits for a log line containing `needle`; returns the lines before it. Panics at `limit`.
pub fn wait_log(rx: &mpsc::Receiver<String>, needle: &str, limit: Duration) -> Vec<String> {
    let deadline = Instant::now() + limit;
    let mut seen = Vec::new();
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(l) if l.contains(needle) => return seen,
            Ok(l) => seen.push(l),
            Err(_) => break,
        }
    }
    panic!(
        "colibri did not log {needle:?} within {limit:?}; log:\n{}",
        seen.join("\n")
    );
}
