//! The `exec` handler: runs a program (no shell unless the command names one) in its own process group,
//! keeps a bounded tail of its stdout and stderr, and enforces the timeout and shutdown by signalling the
//! whole group (SIGTERM, then SIGKILL after [`KILL_GRACE`]) so no grandchild outlives its run (one that
//! left the group with `setsid` is out of reach: its hold on the output pipe is not waited for). It also
//! owns [`ProcessGroups`], the registry of live groups that a second stop signal kills at once. With
//! `stream:` it captures stdout (up to `max_output`) and appends the records `output` makes of
//! it once the run succeeded, in one append: a run is stored whole or not at all. Called by
//! `task::run`; it does not retry or log the run's outcome (that is `task::run`).

use std::collections::{HashSet, VecDeque};
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;
use tokio_util::sync::CancellationToken;

use super::{Attempt, Outcome, RunContext};
use output::{Captured, Output};

pub mod output;
pub use config::ExecSpec as Spec;

mod config;

/// How long a group has between SIGTERM and SIGKILL.
pub const KILL_GRACE: Duration = Duration::from_secs(2);
/// Output kept per stream: the last lines only, each cut to a bounded length, so a chatty child
/// cannot grow colibri's memory.
const TAIL_LINES: usize = 10;
const TAIL_LINE_BYTES: usize = 512;
/// Once the group is gone, how long its output may take to reach end of file; longer means a
/// process outside the group holds the pipe.
const HELD_PIPE_WAIT: Duration = Duration::from_millis(200);
/// Each read of what is left in a pipe after that.
const DRAIN_READ: Duration = Duration::from_millis(10);

#[derive(Debug, Clone)]
pub struct Exec {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: Option<PathBuf>,
    /// `stream:`: stdout appended as records after a successful run.
    pub output: Option<Output>,
}

/// The process groups of every running attempt.
#[derive(Debug, Default)]
pub struct ProcessGroups {
    live: Mutex<HashSet<i32>>,
}

impl ProcessGroups {
    fn register(self: &Arc<Self>, pgid: i32) -> GroupGuard {
        self.lock().insert(pgid);
        GroupGuard {
            groups: Arc::clone(self),
            pgid,
        }
    }

    /// Sends `signal` to every live group; returns how many were signalled.
    pub fn signal_all(&self, signal: i32) -> usize {
        self.lock()
            .iter()
            .filter(|pgid| signal_group(**pgid, signal))
            .count()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<i32>> {
        // A panic while holding this lock cannot leave the set inconsistent (single insert/remove).
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }
}

struct GroupGuard {
    groups: Arc<ProcessGroups>,
    pgid: i32,
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.groups.lock().remove(&self.pgid);
    }
}

/// Sends `signal` to process group `pgid`; true when at least one process received it.
fn signal_group(pgid: i32, signal: i32) -> bool {
    if pgid <= 1 {
        return false; // never signal "every process" (-1) or our own group (0)
    }
    // SAFETY: kill(2) takes plain integers and touches no memory of ours; a negative pid addresses
    // the group. The guard above rules out the special values 0 and -1.
    unsafe { libc::kill(-pgid, signal) == 0 }
}

impl crate::task::kind::Settings for Exec {
    fn timed_out(&self, _timeout: Duration) -> String {
        "timed out; process group terminated".into()
    }

    /// With `stream:`, its stream and its sink's settings (the records' format).
    fn needs(&self) -> super::Needs<'_> {
        super::Needs {
            stream: self.output.as_ref().map(|o| o.stream.as_str()),
            spool: None,
            sink_settings: self.output.is_some(),
        }
    }
}

impl crate::task::kind::Handler for Exec {
    fn run(
        &self,
        task: &str,
        due: chrono::DateTime<chrono::Utc>,
        timeout: Duration,
        ctx: &RunContext,
    ) -> impl std::future::Future<Output = Attempt> + Send {
        Exec::run(self, task, due, timeout, ctx)
    }
}

impl Exec {
    /// Runs one attempt.
    pub async fn run(
        &self,
        task: &str,
        due: DateTime<Utc>,
        timeout: Duration,
        ctx: &RunContext,
    ) -> Attempt {
        let started = tokio::time::Instant::now();
        let started_ns = crate::clock::unix_ns();
        let mut cmd = self.command(task, due);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                return Attempt {
                    outcome: Outcome::Failed(format!("cannot start {}: {e}", self.argv[0])),
                    exit: None,
                    pid: None,
                    stdout: String::new(),
                    stderr: String::new(),
                    files: None,
                    records: None,
                    values: None,
                };
            }
        };
        let pid = child.id();
        let pgid = pid.and_then(|p| i32::try_from(p).ok()).unwrap_or(0);
        let _guard = ctx.groups.register(pgid);
        let stop_reading = CancellationToken::new();
        let capture = self.output.as_ref().map(|o| o.max_output);
        let stdout = (child.stdout.take())
            .map(|s| tokio::spawn(read_tail(s, stop_reading.clone(), capture)));
        let stderr =
            (child.stderr.take()).map(|s| tokio::spawn(read_tail(s, stop_reading.clone(), None)));
        let (kind, status) = wait_for_end(&mut child, pgid, timeout, ctx).await;
        // The main process is gone; anything left in its group (a backgrounded grandchild) ends with
        // the run, so it cannot hold our pipes open or linger unsupervised.
        end_group(pgid, task).await;
        let ((stdout, captured), (stderr, _)) =
            collect_tails(stdout, stderr, &stop_reading, task).await;
        let (mut outcome, exit) = outcome_of(kind, status);
        let mut records = None;
        if let Some(out) = &self.output {
            let captured = captured.unwrap_or_default();
            let to_store = to_store(out, task, started_ns, &captured, &mut outcome, timeout);
            // What the append may wait for room (under `when_full: block`): what is left of
            // the attempt's time, and at least a moment for a run that used it all.
            let wait = (started + timeout)
                .saturating_duration_since(tokio::time::Instant::now())
                .max(Duration::from_secs(1));
            if let Some(r) = to_store.filter(|r| !r.is_empty()) {
                records = append_output(ctx, &out.stream, r, wait, &mut outcome).await;
            }
        }
        Attempt {
            outcome,
            exit,
            pid,
            stdout,
            stderr,
            files: None,
            records,
            values: None,
        }
    }

    /// The program with its arguments, environment and directory, in a process group of its own,
    /// its output piped to us.
    fn command(&self, task: &str, due: DateTime<Utc>) -> Command {
        let mut cmd = Command::new(&self.argv[0]);
        cmd.args(&self.argv[1..])
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("COLIBRI_TASK", task)
            .env("COLIBRI_DUE_MS", due.timestamp_millis().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        if let Some(dir) = &self.cwd {
            cmd.current_dir(dir);
        }
        cmd
    }
}

/// Waits for the main process to exit, the timeout or the stop's abort (the last two terminate
/// the group). The outcome that decided (`None`: the exit status decides) and the exit status.
async fn wait_for_end(
    child: &mut tokio::process::Child,
    pgid: i32,
    timeout: Duration,
    ctx: &RunContext,
) -> (Option<Outcome>, std::io::Result<ExitStatus>) {
    enum End {
        Exited(std::io::Result<ExitStatus>),
        TimedOut,
        Aborted,
    }
    let end = tokio::select! {
        s = child.wait() => End::Exited(s),
        _ = tokio::time::sleep(timeout) => End::TimedOut,
        _ = ctx.abort.cancelled() => End::Aborted,
    };
    match end {
        End::Exited(s) => (None, s),
        End::TimedOut => (Some(Outcome::TimedOut), terminate(child, pgid).await),
        End::Aborted => (Some(Outcome::Cancelled), terminate(child, pgid).await),
    }
}

/// The attempt's outcome (`kind`, or else what the exit status says) and its exit, described.
fn outcome_of(
    kind: Option<Outcome>,
    status: std::io::Result<ExitStatus>,
) -> (Outcome, Option<String>) {
    match (kind, status) {
        (Some(outcome), s) => (outcome, s.ok().map(describe_status)),
        (None, Ok(s)) if s.success() => (Outcome::Ok, Some(describe_status(s))),
        (None, Ok(s)) => {
            let d = describe_status(s);
            (Outcome::Failed(format!("exited with {d}")), Some(d))
        }
        (None, Err(e)) => (
            Outcome::Failed(format!("cannot wait for the process: {e}")),
            None,
        ),
    }
}

/// What a run with `stream:` appends: a successful run's records; with `append_failed`, a failed
/// or timed-out run's output as one record marked with why; otherwise nothing.
fn to_store(
    out: &Output,
    task: &str,
    started_ns: i64,
    captured: &Captured,
    outcome: &mut Outcome,
    timeout: Duration,
) -> Option<Vec<Vec<u8>>> {
    // A successful run whose output cannot be stored (over `max_output`, a line that is
    // not what the stream carries) fails here, like a run that failed by itself.
    let mut made = None;
    if *outcome == Outcome::Ok {
        match out.records(task, started_ns, captured) {
            Ok(r) => made = Some(r),
            Err(why) => *outcome = Outcome::Failed(why),
        }
    }
    let marked = |why: &str| vec![out.failed(task, started_ns, captured, why)];
    match (&*outcome, made) {
        (Outcome::Ok, r) => r,
        (Outcome::Failed(why), _) if out.append_failed => Some(marked(why)),
        (Outcome::TimedOut, _) if out.append_failed => Some(marked(&format!(
            "timed out after {}",
            crate::units::fmt_duration(timeout)
        ))),
        // Cancelled by the stop, or failed without `append_failed`: nothing.
        _ => None,
    }
}

/// Appends the run's records, waiting at most `wait` for room; a failure to store them fails the
/// attempt (after any reason it had). The records stored by a successful run.
async fn append_output(
    ctx: &RunContext,
    stream: &str,
    records: Vec<Vec<u8>>,
    wait: Duration,
    outcome: &mut Outcome,
) -> Option<u64> {
    match super::append_records(ctx, stream, records, wait).await {
        Ok(n) if *outcome == Outcome::Ok => Some(n),
        Ok(_) => None,
        Err(e) => {
            *outcome = match &*outcome {
                Outcome::Failed(why) => Outcome::Failed(format!("{why}; {e}")),
                Outcome::TimedOut => Outcome::Failed(format!("timed out; {e}")),
                _ => Outcome::Failed(e),
            };
            None
        }
    }
}

/// SIGTERM to the group, SIGKILL after [`KILL_GRACE`], then reap the main process.
async fn terminate(child: &mut tokio::process::Child, pgid: i32) -> std::io::Result<ExitStatus> {
    signal_group(pgid, libc::SIGTERM);
    match tokio::time::timeout(KILL_GRACE, child.wait()).await {
        Ok(s) => s,
        Err(_) => {
            signal_group(pgid, libc::SIGKILL);
            child.wait().await
        }
    }
}

/// Ends whatever is left in the group after its leader exited: SIGTERM, then SIGKILL for anything
/// still there after [`KILL_GRACE`] (a process may ignore SIGTERM).
async fn end_group(pgid: i32, task: &str) {
    if !signal_group(pgid, libc::SIGTERM) {
        return; // the group is empty: the usual case
    }
    tracing::debug!(
        task,
        pgid,
        "terminating processes left behind in the task's group"
    );
    let deadline = tokio::time::Instant::now() + KILL_GRACE;
    // Signal 0 only asks whether any member is left. Bounded by the deadline.
    while signal_group(pgid, 0) {
        if tokio::time::Instant::now() >= deadline {
            signal_group(pgid, libc::SIGKILL);
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits for the output readers once the whole group is gone. A pipe still open then is held by a
/// process that left the group (`setsid`, a daemon): waiting for it would delay the run's report for
/// as long as it lives, so after [`HELD_PIPE_WAIT`] the readers stop and keep what they have read,
/// plus what is already in the pipe.
async fn collect_tails(
    stdout: Option<tokio::task::JoinHandle<Read>>,
    stderr: Option<tokio::task::JoinHandle<Read>>,
    stop: &CancellationToken,
    task: &str,
) -> (Read, Read) {
    async fn join(h: Option<tokio::task::JoinHandle<Read>>) -> Read {
        match h {
            Some(h) => h.await.unwrap_or_default(),
            None => Read::default(),
        }
    }
    let both = async { (join(stdout).await, join(stderr).await) };
    tokio::pin!(both);
    if let Ok(tails) = tokio::time::timeout(HELD_PIPE_WAIT, &mut both).await {
        return tails;
    }
    tracing::warn!(
        task,
        "a process that left the task's process group still holds its output: the run is reported without waiting for it, and what it writes later is not captured"
    );
    stop.cancel();
    both.await
}

fn describe_status(s: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("code {c}"),
        (None, Some(sig)) => format!("signal {sig}"),
        (None, None) => "unknown status".into(),
    }
}

/// The last lines of a stream, bounded in count and length.
#[derive(Debug, Default)]
pub struct Tail {
    lines: VecDeque<String>,
    current: Vec<u8>,
    /// The current line was longer than kept.
    cut: bool,
}

impl Tail {
    pub fn push(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let (chunk, newline) = match bytes.iter().position(|b| *b == b'\n') {
                Some(i) => (&bytes[..i], true),
                None => (bytes, false),
            };
            let room = TAIL_LINE_BYTES.saturating_sub(self.current.len());
            self.current
                .extend_from_slice(&chunk[..chunk.len().min(room)]);
            self.cut |= chunk.len() > room;
            bytes = &bytes[chunk.len() + usize::from(newline)..];
            if newline {
                self.end_line();
            }
        }
    }

    fn end_line(&mut self) {
        let mut line = String::from_utf8_lossy(&self.current).into_owned();
        if self.cut {
            line.push('…');
        }
        self.current.clear();
        self.cut = false;
        if self.lines.len() == TAIL_LINES {
            self.lines.pop_front();
        }
        self.lines.push_back(line);
    }

    pub fn finish(mut self) -> String {
        if !self.current.is_empty() {
            self.end_line();
        }
        Vec::from(self.lines).join("\n")
    }
}

/// What was read of one stream: its tail for the log, and with a capture limit, the bytes.
type Read = (String, Option<Captured>);

/// Reads one stream into its [`Tail`] (and, with `capture`, up to that many bytes of it) until end
/// of file, or until `stop`: then only what the pipe already holds is read (a bounded number of
/// reads, each given [`DRAIN_READ`]).
async fn read_tail(
    mut r: impl AsyncRead + Unpin,
    stop: CancellationToken,
    capture: Option<u64>,
) -> Read {
    let mut tail = Tail::default();
    let mut captured = capture.map(|_| Captured::default());
    let mut keep = |bytes: &[u8], tail: &mut Tail| {
        tail.push(bytes);
        if let (Some(c), Some(max)) = (captured.as_mut(), capture) {
            c.push(bytes, max);
        }
    };
    let mut buf = [0u8; 4096];
    loop {
        tokio::select! {
            read = r.read(&mut buf) => match read {
                Ok(0) | Err(_) => return (tail.finish(), captured),
                Ok(n) => keep(&buf[..n], &mut tail),
            },
            _ = stop.cancelled() => break,
        }
    }
    // A pipe holds 64 KiB by default: 16 reads of 4 KiB empty it.
    for _ in 0..16 {
        match tokio::time::timeout(DRAIN_READ, r.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => keep(&buf[..n], &mut tail),
            _ => break,
        }
    }
    (tail.finish(), captured)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_last_lines_only() {
        let mut t = Tail::default();
        for i in 0..100 {
            t.push(format!("line {i}\n").as_bytes());
        }
        let out = t.finish();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), TAIL_LINES);
        assert_eq!(lines[0], "line 90");
        assert_eq!(lines[9], "line 99");
    }

    #[test]
    fn tail_cuts_long_lines_and_keeps_partial_last_line() {
        let mut t = Tail::default();
        t.push(&vec![b'x'; 10 * TAIL_LINE_BYTES]);
        t.push(b"\nshort\npartial");
        let out = t.finish();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0].len(), TAIL_LINE_BYTES + '…'.len_utf8());
        assert_eq!(lines[1], "short");
        assert_eq!(lines[2], "partial");
    }

    #[test]
    fn tail_handles_lines_split_across_reads() {
        let mut t = Tail::default();
        t.push(b"hel");
        t.push(b"lo\nwor");
        t.push(b"ld\n");
        assert_eq!(t.finish(), "hello\nworld");
    }

    #[test]
    fn never_signals_special_groups() {
        assert!(!signal_group(0, 0));
        assert!(!signal_group(1, 0));
        assert!(!signal_group(-1, 0));
    }

    fn ctx() -> RunContext {
        RunContext {
            stopping: Default::default(),
            abort: Default::default(),
            groups: Default::default(),
            store: None,
        }
    }

    fn sh(script: &str) -> Exec {
        Exec {
            argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
            env: vec![("GREETING".into(), "hi".into())],
            cwd: None,
            output: None,
        }
    }

    #[tokio::test]
    async fn reports_exit_code_and_output() {
        let a = sh("echo $GREETING $COLIBRI_TASK; echo oops >&2; exit 3")
            .run("t1", Utc::now(), Duration::from_secs(5), &ctx())
            .await;
        assert_eq!(a.outcome, Outcome::Failed("exited with code 3".into()));
        assert_eq!(a.stdout, "hi t1");
        assert_eq!(a.stderr, "oops");
        let a = sh("true")
            .run("t", Utc::now(), Duration::from_secs(5), &ctx())
            .await;
        assert_eq!(a.outcome, Outcome::Ok);
    }

    #[tokio::test]
    async fn missing_program_fails_cleanly() {
        let e = Exec {
            argv: vec!["/nonexistent/prog".into()],
            env: vec![],
            cwd: None,
            output: None,
        };
        let a = e.run("t", Utc::now(), Duration::from_secs(5), &ctx()).await;
        match a.outcome {
            Outcome::Failed(r) => assert!(r.contains("cannot start /nonexistent/prog"), "{r}"),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[tokio::test]
    async fn timeout_kills_the_whole_group() {
        let dir = tempfile::tempdir().unwrap();
        let pids = dir.path().join("pids");
        let script = format!(
            "sleep 300 & echo $! > {0}; echo $$ >> {0}; wait",
            pids.display()
        );
        let c = ctx();
        let a = sh(&script)
            .run("t", Utc::now(), Duration::from_millis(500), &c)
            .await;
        assert_eq!(a.outcome, Outcome::TimedOut);
        let text = std::fs::read_to_string(&pids).unwrap();
        for pid in text.split_whitespace() {
            let pid: i32 = pid.parse().unwrap();
            assert!(
                wait_dead(pid, Duration::from_secs(5)),
                "pid {pid} survived the timeout"
            );
        }
        assert!(c.groups.lock().is_empty(), "the group is deregistered");
    }

    #[tokio::test]
    async fn abort_cancels_a_running_attempt() {
        let c = ctx();
        let abort = c.abort.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            abort.cancel();
        });
        let a = sh("sleep 30")
            .run("t", Utc::now(), Duration::from_secs(60), &c)
            .await;
        assert_eq!(a.outcome, Outcome::Cancelled);
    }

    /// Runs a task whose main process starts `background` (which must write its pid to `$PIDS`) and
    /// exits at once; asserts the run succeeds and the background process does not outlive it.
    async fn assert_leftover_ends(background: &str) {
        let dir = tempfile::tempdir().unwrap();
        let pids = dir.path().join("pids");
        let mut e = sh(&format!("{background}; exit 0"));
        e.env.push(("PIDS".into(), pids.display().to_string()));
        let a = e
            .run("t", Utc::now(), Duration::from_secs(10), &ctx())
            .await;
        assert_eq!(a.outcome, Outcome::Ok);
        let pid: i32 = std::fs::read_to_string(&pids)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(
            wait_dead(pid, Duration::from_secs(5)),
            "leftover {pid} survived"
        );
    }

    #[tokio::test]
    async fn leftover_background_children_end_with_the_run() {
        // Would otherwise live for 300 s and hold stdout open.
        assert_leftover_ends("sleep 300 & echo $! > \"$PIDS\"").await;
    }

    #[tokio::test]
    async fn leftovers_that_ignore_sigterm_are_killed() {
        // Detached from our pipes and deaf to SIGTERM: only SIGKILL ends it.
        assert_leftover_ends(
            "(trap '' TERM; exec sleep 300) >/dev/null 2>&1 & echo $! > \"$PIDS\"",
        )
        .await;
    }

    /// Runs `sh -c script` with `$PIDS` set; returns the attempt and the pid the script wrote there.
    async fn run_with_pids(script: &str) -> (Attempt, i32) {
        let dir = tempfile::tempdir().unwrap();
        let pids = dir.path().join("pids");
        let mut e = sh(script);
        e.env.push(("PIDS".into(), pids.display().to_string()));
        let a = e
            .run("t", Utc::now(), Duration::from_secs(10), &ctx())
            .await;
        let pid = std::fs::read_to_string(&pids)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        (a, pid)
    }

    /// Shell text that starts `sleep secs` in a session of its own (out of the task's group, keeping
    /// stdout and stderr) and waits until it is there, so ending the group cannot catch it first.
    fn escaped(secs: u32) -> String {
        format!(
            "setsid sh -c 'echo $$ > \"$PIDS\"; exec sleep {secs}' & \
             i=0; while [ ! -s \"$PIDS\" ] && [ $i -lt 500 ]; do sleep 0.01; i=$((i+1)); done"
        )
    }

    #[tokio::test]
    async fn output_is_kept_when_a_grandchild_outside_the_group_holds_the_pipe() {
        // setsid takes the grandchild out of the task's group, so ending the group does not close
        // its copy of stdout and stderr.
        let (a, pid) =
            run_with_pids(&format!("echo captured; echo oops >&2; {}", escaped(30))).await;
        // SAFETY: kill(2) with a pid this test started; no memory is touched.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        assert_eq!(a.outcome, Outcome::Ok);
        assert_eq!(a.stdout, "captured");
        assert_eq!(a.stderr, "oops");
    }

    #[tokio::test]
    async fn a_run_is_reported_before_a_grandchild_outside_the_group_ends() {
        let (a, pid) = run_with_pids(&format!("echo done; {}", escaped(3))).await;
        let alive = process_alive(pid);
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        assert_eq!(a.stdout, "done");
        assert!(
            alive,
            "the run waited for the grandchild holding its pipe to end"
        );
    }

    /// Polls until `pid` is gone, up to `limit`; true when it is.
    fn wait_dead(pid: i32, limit: Duration) -> bool {
        let deadline = std::time::Instant::now() + limit;
        while process_alive(pid) {
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }

    /// Alive means present and not a zombie (a zombie has ended; only its parent has not reaped it).
    pub(crate) fn process_alive(pid: i32) -> bool {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => false,
            Ok(stat) => {
                let state = stat
                    .rsplit(')')
                    .next()
                    .and_then(|s| s.split_whitespace().next());
                !matches!(state, Some("Z") | Some("X"))
            }
        }
    }
}
