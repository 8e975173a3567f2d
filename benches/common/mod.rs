//! Helpers both benchmarks use to drive the real binary: which binary, how many cores, starting
//! `colibri run`, signalling and stopping it, and reading its memory from /proc.

#![allow(dead_code)] // each bench uses its own subset

use std::path::Path;
use std::process::{Child, Command, Stdio};

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
