//! Helpers for driving the `colibri` binary from the integration tests: a scratch directory, the
//! binary as a child process whose stdout and stderr are collected by reader threads, bounded polling
//! instead of sleeps, signals, and `/proc` look-ups. A [`Proc`] that is dropped while still running
//! kills the task process groups it started and then itself, so a failing test leaks no processes.

use std::fmt::Debug;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

pub mod client;
pub mod http;
pub mod mqtt_publish;
pub mod serve;

/// `n` seconds: every deadline in the tests is written in these.
/// The python with the tests' PyPI packages (pymodbus, asyncua, pysparkplug):
/// `COLIBRI_TEST_PYTHON`, else scripts/test.sh's venv, else `python3`.
pub fn python() -> String {
    if let Ok(p) = std::env::var("COLIBRI_TEST_PYTHON") {
        return p;
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-venv/bin/python3");
    if venv.exists() {
        return venv.display().to_string();
    }
    "python3".into()
}

pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// How often a condition is polled.
pub const POLL: Duration = Duration::from_millis(25);

/// Calls `probe` every [`POLL`] until it returns `Some`, for at most `limit` (always at least once).
pub fn poll<T>(limit: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = probe() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(POLL);
    }
}

/// A scratch directory, removed on drop.
pub struct Sandbox {
    dir: tempfile::TempDir,
}

impl Sandbox {
    pub fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("colibri-test-")
            .tempdir()
            .expect("create a temp dir");
        Sandbox { dir }
    }

    /// A path inside the sandbox (the file need not exist).
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes `colibri.yaml` and returns its path. A config without an `admin:` section gets one
    /// on a free port (`127.0.0.1:0`; the log's "admin endpoint listening" names it), so tests
    /// running side by side do not fight over the default 9464.
    pub fn write_config(&self, yaml: &str) -> PathBuf {
        let path = self.file("colibri.yaml");
        let has_admin = yaml.lines().any(|l| l.starts_with("admin:"));
        let text = if has_admin {
            yaml.to_string()
        } else {
            format!("{yaml}\nadmin: {{ listen: \"127.0.0.1:0\" }}\n")
        };
        std::fs::write(&path, text).expect("write the config");
        path
    }

    /// The file's text, or an empty string while it does not exist.
    pub fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.file(name)).unwrap_or_default()
    }

    /// The complete (newline-terminated) lines of a file that may still be growing.
    pub fn complete_lines(&self, name: &str) -> Vec<String> {
        complete_lines(&self.read(name))
    }
}

/// The newline-terminated lines of `text`; a trailing partial line is left out.
pub fn complete_lines(text: &str) -> Vec<String> {
    match text.rfind('\n') {
        Some(end) => text[..end].lines().map(str::to_string).collect(),
        None => Vec::new(),
    }
}

/// A string as a YAML (JSON) double-quoted scalar.
pub fn quote(s: impl AsRef<str>) -> String {
    serde_json::to_string(s.as_ref()).expect("a string serializes")
}

/// A path as a YAML double-quoted scalar.
pub fn quote_path(p: &Path) -> String {
    quote(p.to_str().expect("temp paths are UTF-8"))
}

/// The binary under test, with no config or log settings inherited from the caller's environment.
pub fn colibri() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_colibri"));
    cmd.env_remove("COLIBRI_CONFIG").env_remove("RUST_LOG");
    cmd
}

/// `colibri queue ARGS --config CONFIG`.
pub fn queue(config: &Path, args: &[&str]) -> Command {
    let mut cmd = colibri();
    cmd.arg("queue").args(args).arg("--config").arg(config);
    cmd
}

/// `colibri queue stats --json` with `env` set: the whole document (it must succeed).
pub fn queue_stats(config: &Path, env: &[(&str, &str)]) -> Value {
    let mut cmd = queue(config, &["stats", "--json"]);
    cmd.envs(env.iter().copied());
    let f = finish(cmd, secs(60));
    assert_code(f.status, 0, &f.stderr);
    serde_json::from_str(&f.stdout)
        .unwrap_or_else(|e| panic!("stats --json is not JSON ({e}): {}", f.stdout))
}

/// The entry of `stream` in a `queue stats --json` document.
pub fn stream_stats(doc: &Value, stream: &str) -> Value {
    doc["streams"]
        .as_array()
        .expect("a streams array")
        .iter()
        .find(|s| s["stream"] == stream)
        .unwrap_or_else(|| panic!("no stream {stream} in {doc}"))
        .clone()
}

/// SIGTERM, then exit 0 (within a minute).
pub fn stop(mut agent: Proc) -> Proc {
    agent.signal(libc::SIGTERM);
    let status = agent.wait_exit(secs(60));
    assert_code(status, 0, &agent.stderr());
    agent
}

/// Sends `signal` to `pid`.
pub fn send_signal(pid: i32, signal: i32) {
    assert!(pid > 1, "refusing to signal pid {pid}");
    // SAFETY: kill(2) takes plain integers; a positive pid addresses exactly one process.
    let rc = unsafe { libc::kill(pid, signal) };
    assert_eq!(
        rc,
        0,
        "kill({pid}, {signal}): {}",
        std::io::Error::last_os_error()
    );
}

/// A process spawned with piped stdout and stderr, both collected in the background.
pub struct Proc {
    child: Child,
    status: Option<ExitStatus>,
    stdout: Arc<Mutex<Vec<u8>>>,
    stderr: Arc<Mutex<Vec<u8>>>,
    readers: Vec<JoinHandle<()>>,
}

fn collect(mut from: impl Read + Send + 'static, into: Arc<Mutex<Vec<u8>>>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        loop {
            match from.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => into.lock().unwrap().extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    })
}

impl Proc {
    pub fn spawn(cmd: Command) -> Self {
        Proc::spawn_with_stdin(cmd, Stdio::null())
    }

    pub fn spawn_with_stdin(mut cmd: Command, stdin: impl Into<Stdio>) -> Self {
        let mut child = cmd
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn colibri");
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let readers = vec![
            collect(child.stdout.take().expect("piped"), Arc::clone(&stdout)),
            collect(child.stderr.take().expect("piped"), Arc::clone(&stderr)),
        ];
        Proc {
            child,
            status: None,
            stdout,
            stderr,
            readers,
        }
    }

    /// `colibri run --config <config>`.
    pub fn run(config: &Path) -> Self {
        let mut cmd = colibri();
        cmd.arg("run").arg("--config").arg(config);
        Proc::spawn(cmd)
    }

    /// [`Proc::run`], returning once the agent logged "colibri started" (its signal handlers are
    /// installed before): a test whose next condition may already hold cannot stop it too early.
    /// The config must log JSON.
    pub fn start(config: &Path) -> Self {
        let agent = Proc::run(config);
        agent.wait_for_event(secs(30), "colibri started", |e| {
            field(e, "message") == "colibri started"
        });
        agent
    }

    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).expect("pids fit i32")
    }

    pub fn signal(&self, signal: i32) {
        assert!(self.status.is_none(), "the process has already exited");
        send_signal(self.pid(), signal);
    }

    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.stdout.lock().unwrap()).into_owned()
    }

    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).into_owned()
    }

    /// Every complete stderr line so far, each parsed as one JSON log event. Panics on a line that is
    /// not JSON: with `format: json` nothing else may appear on stderr.
    pub fn events(&self) -> Vec<Value> {
        complete_lines(&self.stderr())
            .iter()
            .map(|line| {
                serde_json::from_str(line)
                    .unwrap_or_else(|e| panic!("stderr line is not JSON ({e}): {line}"))
            })
            .collect()
    }

    /// The events matching `pred`.
    pub fn events_where(&self, pred: impl Fn(&Value) -> bool) -> Vec<Value> {
        self.events().into_iter().filter(|e| pred(e)).collect()
    }

    /// Waits up to `limit` for an event matching `pred`; panics (showing stderr) otherwise.
    pub fn wait_for_event(
        &self,
        limit: Duration,
        what: &str,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        poll(limit, || self.events().into_iter().find(|e| pred(e)))
            .unwrap_or_else(|| panic!("no {what} within {limit:?}; stderr:\n{}", self.stderr()))
    }

    /// Waits up to `limit` for `cond`; panics (showing `what` and stderr) otherwise.
    pub fn wait_until(&self, limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
        if poll(limit, || cond().then_some(())).is_none() {
            panic!("{what}: not within {limit:?}; stderr:\n{}", self.stderr());
        }
    }

    /// Waits up to `limit` for the process to exit; panics (showing stderr) otherwise. Once it has
    /// exited, waits briefly for the readers so stdout and stderr are complete.
    /// Whether it has exited (without waiting).
    pub fn exited(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_some()
    }

    pub fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        if let Some(s) = self.status {
            return s;
        }
        let child = &mut self.child;
        let status = poll(limit, || child.try_wait().expect("try_wait"));
        let Some(status) = status else {
            panic!("still running after {limit:?}; stderr:\n{}", self.stderr());
        };
        self.status = Some(status);
        // The pipes close when the process exits, unless a leaked descendant holds them: bounded.
        poll(Duration::from_secs(5), || {
            self.readers.iter().all(|r| r.is_finished()).then_some(())
        });
        for r in std::mem::take(&mut self.readers) {
            if r.is_finished() {
                r.join().expect("reader thread");
            }
        }
        status
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.status.is_some() || matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        // colibri puts each task in its own process group: kill those first, as killing colibri
        // itself would leave them behind.
        let pid = self.pid();
        let own_group = proc_stat(pid).map(|s| s.pgrp);
        for child in all_pids()
            .into_iter()
            .filter_map(proc_stat)
            .filter(|s| s.ppid == pid)
        {
            if Some(child.pgrp) != own_group && child.pgrp > 1 {
                // SAFETY: kill(2) with a negative pid signals that process group; pgrp > 1 here.
                unsafe { libc::kill(-child.pgrp, libc::SIGKILL) };
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How a finished command ended.
#[derive(Debug)]
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `cmd` to completion with `input` on its stdin (through a file in `sb`), for at most
/// `limit`.
pub fn finish_with_stdin(sb: &Sandbox, cmd: Command, input: &str, limit: Duration) -> Finished {
    let path = sb.file(&format!("stdin-{:016x}", fastrand::u64(..)));
    std::fs::write(&path, input).expect("write the input");
    let file = std::fs::File::open(&path).expect("open the input");
    finished(Proc::spawn_with_stdin(cmd, file), limit)
}

/// Runs `cmd` to completion, for at most `limit`.
pub fn finish(cmd: Command, limit: Duration) -> Finished {
    finished(Proc::spawn(cmd), limit)
}

fn finished(mut p: Proc, limit: Duration) -> Finished {
    let status = p.wait_exit(limit);
    Finished {
        status,
        stdout: p.stdout(),
        stderr: p.stderr(),
    }
}

/// The fields of `/proc/PID/stat` the tests need.
#[derive(Debug, Clone, Copy)]
pub struct Stat {
    pub pid: i32,
    pub state: char,
    pub ppid: i32,
    pub pgrp: i32,
}

/// Reads `/proc/PID/stat`; `None` when the process does not exist.
pub fn proc_stat(pid: i32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid pgrp ...": comm may contain anything, so split after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some(Stat {
        pid,
        state,
        ppid,
        pgrp,
    })
}

/// Every pid in `/proc`.
pub fn all_pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .expect("read /proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// Gone means absent, or a zombie (it has ended; only its parent has not reaped it yet).
pub fn is_gone(pid: i32) -> bool {
    proc_stat(pid).is_none_or(|s| matches!(s.state, 'Z' | 'X'))
}

/// The pids of the processes in group `pgid` that have not ended.
pub fn live_group_members(pgid: i32) -> Vec<i32> {
    all_pids()
        .into_iter()
        .filter_map(proc_stat)
        .filter(|s| s.pgrp == pgid && !matches!(s.state, 'Z' | 'X'))
        .map(|s| s.pid)
        .collect()
}

/// Waits up to `limit` for every pid to be gone. Survivors are killed (so a failing test leaks
/// nothing) and reported in the panic message.
pub fn assert_gone(pids: &[i32], limit: Duration, what: &str) {
    let mut alive = Vec::new();
    let gone = poll(limit, || {
        alive = pids.iter().copied().filter(|p| !is_gone(*p)).collect();
        alive.is_empty().then_some(())
    });
    if gone.is_none() {
        for pid in alive.iter().filter(|p| **p > 1) {
            // SAFETY: kill(2) takes plain integers; a pid > 1 addresses exactly one process. One
            // that has just ended makes this fail harmlessly.
            unsafe { libc::kill(*pid, libc::SIGKILL) };
        }
        panic!("{what}: still alive after {limit:?}: {alive:?}");
    }
}

/// Parses whitespace-separated pids written by a task.
pub fn parse_pids(text: &str) -> Vec<i32> {
    text.split_whitespace()
        .map(|p| match p.parse() {
            Ok(pid) if pid > 1 => pid,
            _ => panic!("not a pid: {p:?} in {text:?}"),
        })
        .collect()
}

/// `event[key]` as a string, or "" when absent.
pub fn field<'a>(event: &'a Value, key: &str) -> &'a str {
    event.get(key).and_then(Value::as_str).unwrap_or("")
}

/// Asserts the process exited normally with `code`, showing stderr otherwise.
pub fn assert_code(status: ExitStatus, code: i32, stderr: &str) {
    assert_eq!(
        status.code(),
        Some(code),
        "exit status {status}; stderr:\n{stderr}"
    );
}

/// Formats a list for an assertion message, at most `n` items.
pub fn head<T: Debug>(items: &[T], n: usize) -> String {
    let shown: Vec<&T> = items.iter().take(n).collect();
    if items.len() > n {
        format!("{shown:?} ... ({} in all)", items.len())
    } else {
        format!("{shown:?}")
    }
}

/// This machine's host name, as senders put it in their messages.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .expect("read /proc/sys/kernel/hostname")
        .trim()
        .to_string()
}
