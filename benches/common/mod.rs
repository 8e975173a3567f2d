//! Helpers the benchmarks share to drive the real binary: which binary, how many cores, starting
//! `colibri run`, signalling and stopping it, and reading its memory from /proc.

#![allow(dead_code, reason = "each bench uses its own subset")]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
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
    let field = status_fields(pid);
    (field("VmRSS:"), field("VmHWM:"))
}

/// A reader of `/proc/PID/status`: the number after a field's name (`VmRSS:`), 0 if absent.
fn status_fields(pid: u32) -> impl Fn(&str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    move |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }
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

/// Where a process's resident memory is, in KiB, from `/proc/PID/status` and `/proc/PID/smaps`.
#[derive(Debug, Default, Clone, Copy)]
pub struct Resident {
    pub rss: u64,
    /// Anonymous: heaps, stacks, allocator arenas, large allocations.
    pub anon: u64,
    /// File-backed: the pages of the binary (and of shared libraries, for a dynamic build).
    pub file: u64,
    /// Of `anon`: the main heap (`[heap]`, what the main thread's allocations grow).
    pub heap: u64,
    /// Of `anon`: the main thread's stack.
    pub stack: u64,
    /// Of `file`: the executable's own mappings.
    pub binary: u64,
    pub threads: u64,
}

impl Resident {
    /// One line: `RSS 7.3 MB = binary 6.0 + heap 0.7 + other anonymous 0.6 (3 threads)`.
    pub fn line(&self) -> String {
        let mb = |k: u64| k as f64 / 1024.0;
        format!(
            "RSS {:.2} MB (anonymous {:.2}, file {:.2}) = binary {:.2} + main heap {:.2} + main stack {:.2} + other anonymous (thread stacks, arenas, large buffers) {:.2}; {} threads",
            mb(self.rss),
            mb(self.anon),
            mb(self.file),
            mb(self.binary),
            mb(self.heap),
            mb(self.stack),
            mb(self.anon.saturating_sub(self.heap + self.stack)),
            self.threads,
        )
    }
}

pub fn resident(pid: u32) -> Resident {
    let field = status_fields(pid);
    let mut r = Resident {
        rss: field("VmRSS:"),
        anon: field("RssAnon:"),
        file: field("RssFile:"),
        threads: field("Threads:"),
        ..Resident::default()
    };
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let mut path = String::new();
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let first = fields.next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            path = fields.nth(4).unwrap_or("").to_string();
        } else if first == "Rss:" {
            let kib: u64 = fields.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            match path.as_str() {
                "[heap]" => r.heap += kib,
                "[stack]" => r.stack += kib,
                p if !p.is_empty() && std::path::Path::new(p) == exe => r.binary += kib,
                _ => {}
            }
        }
    }
    r
}

/// Waits for the admin endpoint's "listening" line and returns its address.
pub fn admin_addr(logs: &mpsc::Receiver<String>) -> SocketAddr {
    let deadline = Instant::now() + Duration::from_secs(60);
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        let Ok(l) = logs.recv_timeout(left) else {
            break;
        };
        if l.contains("admin endpoint listening") {
            let v: serde_json::Value = serde_json::from_str(&l).expect("a JSON log line");
            let listen = v["fields"]["listen"]
                .as_str()
                .or(v["listen"].as_str())
                .expect("the listening line names its address");
            return listen.parse().expect("an address");
        }
    }
    panic!("colibri did not log its admin address within 60 s");
}

/// The sum of the series of `/metrics` whose lines start with `prefix` (a name, or a name and the
/// start of its labels) and contain `having`.
pub fn metric_sum(admin: SocketAddr, prefix: &str, having: &str) -> Option<f64> {
    let mut s = TcpStream::connect_timeout(&admin, Duration::from_secs(5)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: colibri\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let values: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with(prefix) && l.contains(having))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// The value of the series whose line starts with `prefix`.
pub fn metric(admin: SocketAddr, prefix: &str) -> Option<f64> {
    metric_sum(admin, prefix, "")
}
