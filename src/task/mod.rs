//! Task runs: the runtime definition of a task (`TaskDef`, built by `config::compile`), the closed set
//! of handlers listed once below (`task_kinds!`: a folder each with its file shape in `config.rs`,
//! from which `TaskKind` and `Action` are made), and `run`, which executes one scheduled run with its
//! timeout and retries and logs exactly one event for it. It does not decide when a task runs (that
//! is the scheduler) and does not parse the file. Called by `scheduler`.
//!
//! A new handler is a folder here (its `Spec` implementing `kind::KindSpec`, its handler
//! `kind::Settings` and `kind::Handler`) and one entry in the list below.

#[macro_use]
mod kind;

pub mod exec;
pub mod file_move;
#[cfg(feature = "modbus")]
pub mod modbus;
pub mod scrape;

pub use kind::Compile;

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use crate::logging::{output, summary};
use crate::schedule::Schedule;
use crate::scrape::exception::{Decided, Exceptions};

/// A task as the runtime sees it: everything checked and parsed.
#[derive(Debug)]
pub struct TaskDef {
    pub name: String,
    pub schedule: Schedule,
    /// Per attempt.
    pub timeout: Duration,
    pub retry: RetryPolicy,
    pub action: Action,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Extra attempts after the first failure.
    pub max_retry: u32,
    pub base: Duration,
    pub cap: Duration,
}

task_kinds! {
    /// Run a program. No shell is involved unless the command names one (`["sh", "-c", "..."]`).
    Exec(exec) = "exec";
    /// Move settled files from one directory to another: rename(2) on one filesystem; across
    /// filesystems copy, fsync, rename into place, then remove the source. Or, with `to_stream`,
    /// ship them upstream.
    FileMove(file_move) = "file_move";
    /// GET a (local) endpoint and turn the answer into records of a stream, each carrying the
    /// scrape's time: Prometheus text (a line-protocol record per sample, labels as tags), JSON
    /// (line-protocol records through a mapping), or the raw body.
    HttpScrape(scrape) = "http_scrape";
    /// Poll a Modbus TCP device: its registers, coils and inputs as one sample per run, stamped
    /// with the poll's time (built with the `modbus` cargo feature; release builds have it).
    #[feature = "modbus"]
    Modbus(modbus) = "modbus";
}

impl Action {
    /// Whether it samples an endpoint into a stream.
    pub fn is_scrape(&self) -> bool {
        self.settings().is_scrape()
    }

    /// Whether it samples values by exception (a `deadband` or `heartbeat`).
    pub fn by_exception(&self) -> bool {
        self.settings().by_exception()
    }

    /// What a run that took longer than `timeout` says.
    pub fn timed_out(&self, timeout: Duration) -> String {
        self.settings().timed_out(timeout)
    }

    /// What a run needs from its surroundings.
    pub fn needs(&self) -> Needs<'_> {
        self.settings().needs()
    }
}

/// What a task relies on outside its own entry in the file: a reload holds it while one of these
/// waits for a restart, and re-makes it when its stream's sink changes under it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Needs<'a> {
    /// The stream it appends to: it must be running.
    pub stream: Option<&'a str>,
    /// The directory under `data_dir` it spools files in: its storage settings must be running.
    pub spool: Option<&'a std::path::Path>,
    /// It was compiled with settings of its stream's sink (a scrape's `precision`).
    pub sink_settings: bool,
}

/// Counters of one task, kept across its runs and across reloads that change it (the agent's
/// `Registry`, by name; a reload that removes the task drops them), and exposed as metrics.
#[derive(Debug)]
pub struct TaskStats {
    pub ok: AtomicU64,
    /// Runs whose last attempt failed (not by timing out).
    pub failed: AtomicU64,
    /// Runs whose last attempt timed out.
    pub timeouts: AtomicU64,
    pub cancelled: AtomicU64,
    /// Due while the previous run was still going: skipped, never stacked.
    pub skipped: AtomicU64,
    /// Attempts after the first.
    pub retries: AtomicU64,
    /// Whole runs, retries included.
    pub duration: crate::metrics::Histogram,
    /// Runs holding a worker now (0 or 1: runs of one task never overlap).
    pub running: AtomicU64,
    /// The last run that ended: when it began (Unix ms, 0 when none), how long it took and how it
    /// ended ([`Outcome::code`]); written before the outcome's counter, so whoever sees the count
    /// grow sees this run here.
    pub last_start_ms: AtomicU64,
    pub last_duration_ms: AtomicU64,
    pub last_outcome: AtomicU8,
    /// When the last successful run ended (Unix ms, 0 when none).
    pub last_success_ms: AtomicU64,
    /// When the task is due next (Unix ms, 0 when it is not planned again): the scheduler's.
    pub next_ms: AtomicU64,
    /// Records the last run stored (a scrape's samples), for handlers that produce records.
    pub last_records: AtomicU64,
    /// Of a task that reports by exception: values sampled and sent (stored), and values sampled
    /// and not sent (inside their deadband), since it was made.
    pub values_sent: AtomicU64,
    pub values_suppressed: AtomicU64,
}

impl TaskStats {
    /// Runs that ended, whatever their outcome.
    pub fn ended(&self) -> u64 {
        [&self.ok, &self.failed, &self.timeouts, &self.cancelled]
            .iter()
            .map(|c| c.load(Ordering::Acquire))
            .sum()
    }
}

impl Default for TaskStats {
    fn default() -> Self {
        TaskStats {
            ok: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            duration: crate::metrics::Histogram::new(crate::metrics::TASK_BUCKETS),
            running: AtomicU64::new(0),
            last_start_ms: AtomicU64::new(0),
            last_duration_ms: AtomicU64::new(0),
            last_outcome: AtomicU8::new(0),
            last_success_ms: AtomicU64::new(0),
            next_ms: AtomicU64::new(0),
            last_records: AtomicU64::new(0),
            values_sent: AtomicU64::new(0),
            values_suppressed: AtomicU64::new(0),
        }
    }
}

/// How one attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    /// Ran and failed: non-zero exit, killed by a signal, or could not start.
    Failed(String),
    TimedOut,
    /// Stopped because colibri is shutting down.
    Cancelled,
}

impl Outcome {
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Failed(_) => "failed",
            Outcome::TimedOut => "timeout",
            Outcome::Cancelled => "cancelled",
        }
    }

    /// Its number in [`TaskStats::last_outcome`] (0 is "no run yet").
    pub fn code(&self) -> u8 {
        match self {
            Outcome::Ok => 1,
            Outcome::Failed(_) => 2,
            Outcome::TimedOut => 3,
            Outcome::Cancelled => 4,
        }
    }

    /// The label of a [`TaskStats::last_outcome`] number; `None` for 0.
    pub fn label_of(code: u8) -> Option<&'static str> {
        Some(match code {
            1 => "ok",
            2 => "failed",
            3 => "timeout",
            4 => "cancelled",
            _ => return None,
        })
    }
}

/// Unix milliseconds of a wall time (0 before 1970).
pub fn unix_ms(t: DateTime<Utc>) -> u64 {
    u64::try_from(t.timestamp_millis()).unwrap_or(0)
}

/// What the handler reports about one attempt.
#[derive(Debug)]
pub struct Attempt {
    pub outcome: Outcome,
    /// Exit code or `signal N`, when the process ran.
    pub exit: Option<String>,
    pub pid: Option<u32>,
    pub stdout: String,
    pub stderr: String,
    /// File counts, for handlers that move files.
    pub files: Option<file_move::Counts>,
    /// Records stored, for handlers that produce them.
    pub records: Option<u64>,
    /// Of a handler that reports by exception: values (sent, suppressed) by the records stored.
    pub values: Option<(u64, u64)>,
}

impl Attempt {
    /// The attempt of a handler that stores records and runs no process (a scrape, a poll):
    /// `work` makes the records within `timeout` (given its deadline), until colibri aborts runs;
    /// then they are appended to `stream`. The append is not cut by the timeout: handed to the
    /// store's writer it may commit whoever waits, so cutting it could report as timed out (and
    /// retry) what was stored. It waits for room under `block` for what is left of the attempt.
    pub async fn of_records<F>(
        timeout: Duration,
        ctx: &RunContext,
        stream: &str,
        work: impl FnOnce(tokio::time::Instant) -> F,
    ) -> Attempt
    where
        F: std::future::Future<Output = Result<Vec<Vec<u8>>, String>>,
    {
        let deadline = tokio::time::Instant::now() + timeout;
        let made = tokio::select! {
            r = tokio::time::timeout_at(deadline, work(deadline)) => match r {
                Ok(Ok(records)) => Ok(records),
                Ok(Err(reason)) => Err(Outcome::Failed(reason)),
                Err(_) => Err(Outcome::TimedOut),
            },
            _ = ctx.abort.cancelled() => Err(Outcome::Cancelled),
        };
        let (outcome, records) = match made {
            Ok(r) if r.is_empty() => (Outcome::Ok, Some(0)),
            Ok(r) => {
                let wait = deadline.saturating_duration_since(tokio::time::Instant::now());
                match append_records(ctx, stream, r, wait).await {
                    Ok(n) => (Outcome::Ok, Some(n)),
                    Err(e) => (Outcome::Failed(e), None),
                }
            }
            Err(outcome) => (outcome, None),
        };
        Attempt {
            outcome,
            exit: None,
            pid: None,
            stdout: String::new(),
            stderr: String::new(),
            files: None,
            records,
            values: None,
        }
    }

    /// [`Attempt::of_records`] for a sampling handler that may report by exception: `work` also
    /// gives what it decided, which stands only once its records are stored (`exceptions`: the
    /// task's state); after a failure, or records not stored, every value's next sample is sent.
    pub async fn of_samples<F>(
        timeout: Duration,
        ctx: &RunContext,
        stream: &str,
        exceptions: Option<&Exceptions>,
        work: impl FnOnce() -> F,
    ) -> Attempt
    where
        F: std::future::Future<Output = Result<(Vec<Vec<u8>>, Option<Decided>), String>>,
    {
        let decided = std::sync::Mutex::new(None);
        let mut attempt = Attempt::of_records(timeout, ctx, stream, |_| async {
            let (records, d) = work().await?;
            *decided.lock().unwrap_or_else(PoisonError::into_inner) = d;
            Ok(records)
        })
        .await;
        if let Some(x) = exceptions {
            let d = decided.into_inner().unwrap_or_else(PoisonError::into_inner);
            attempt.settle_exceptions(x, d);
        }
        attempt
    }

    fn settle_exceptions(&mut self, exceptions: &Exceptions, decided: Option<Decided>) {
        match (&self.outcome, decided) {
            (Outcome::Ok, Some(d)) => {
                self.values = Some((d.sent, d.suppressed));
                exceptions.stored(d);
            }
            (Outcome::Cancelled, _) => {}
            _ => exceptions.failed(),
        }
    }
}

/// Appends a run's records to `stream` in one append (a run is stored whole or not at all),
/// waiting up to `wait` for room under `when_full: block`; how many, or why not.
pub async fn append_records(
    ctx: &RunContext,
    stream: &str,
    records: Vec<Vec<u8>>,
    wait: Duration,
) -> Result<u64, String> {
    let n = records.len() as u64;
    let store = ctx.store.as_ref().ok_or("the store is not open")?;
    store
        .append(
            stream,
            crate::store::RecordBuf::from(records),
            None,
            Some(wait),
        )
        .await
        .map_err(|e| format!("{n} records not stored: {e}"))?;
    Ok(n)
}

/// What a run needs from its surroundings.
#[derive(Clone)]
pub struct RunContext {
    /// Set when colibri starts to stop: no new attempt begins, retry waits end.
    pub stopping: CancellationToken,
    /// Set when the shutdown grace is over: running attempts are killed.
    pub abort: CancellationToken,
    /// Every live process group, so a second signal can kill them all at once.
    pub groups: Arc<exec::ProcessGroups>,
    /// The store, when streams are configured: where scrapes and shipped files are queued.
    pub store: Option<crate::store::writer::StoreHandle>,
}

/// Runs one scheduled occurrence of `def`: attempts with retries, then one log event. `due` is the
/// scheduled wall time; the run is `late` by how long it waited for its timer and a free worker.
pub async fn run(
    def: &TaskDef,
    stats: &TaskStats,
    ctx: &RunContext,
    due: DateTime<Utc>,
    late: Duration,
) {
    let started = Instant::now();
    let started_wall = Utc::now();
    let running = Running::new(stats);
    let mut attempt_no: u32 = 0;
    let last = loop {
        let attempt = def.action.attempt(&def.name, due, def.timeout, ctx).await;
        let retryable = matches!(attempt.outcome, Outcome::Failed(_) | Outcome::TimedOut);
        if !retryable || attempt_no >= def.retry.max_retry || ctx.stopping.is_cancelled() {
            break attempt;
        }
        let wait = crate::backoff::jittered(attempt_no, def.retry.base, def.retry.cap);
        let reason = failure_reason(def, &attempt);
        if first_of_its_kind(def, "attempt", attempt.outcome.label(), &reason) {
            tracing::warn!(
                task = %def.name,
                outcome = attempt.outcome.label(),
                reason,
                attempt = attempt_no + 1,
                retry_in_ms = wait.as_millis() as u64,
                stderr = output(&attempt.stderr),
                "task attempt failed, will retry"
            );
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = ctx.stopping.cancelled() => break Attempt { outcome: Outcome::Cancelled, ..attempt },
        }
        attempt_no += 1;
        stats.retries.fetch_add(1, Ordering::Relaxed);
    };
    stats.duration.observe(started.elapsed());
    let duration_ms = started.elapsed().as_millis() as u64;
    drop(running);
    stats
        .last_start_ms
        .store(unix_ms(started_wall), Ordering::Relaxed);
    stats.last_duration_ms.store(duration_ms, Ordering::Relaxed);
    stats
        .last_records
        .store(last.records.unwrap_or(0), Ordering::Relaxed);
    if let Some((sent, suppressed)) = last.values {
        stats.values_sent.fetch_add(sent, Ordering::Relaxed);
        stats
            .values_suppressed
            .fetch_add(suppressed, Ordering::Relaxed);
    }
    stats
        .last_outcome
        .store(last.outcome.code(), Ordering::Relaxed);
    if last.outcome == Outcome::Ok {
        stats
            .last_success_ms
            .store(unix_ms(Utc::now()), Ordering::Relaxed);
    }
    let late_ms = late.as_millis() as u64;
    let attempts = attempt_no + 1;
    let exit = last.exit.as_deref();
    // Absent (not logged) for handlers that do not move files.
    let files_moved = last.files.map(|c| c.moved);
    let files_skipped = last.files.map(|c| c.skipped);
    let files_failed = last.files.map(|c| c.failed);
    let files_waiting = last.files.map(|c| c.waiting);
    let records = last.records;
    match &last.outcome {
        Outcome::Ok => {
            stats.ok.fetch_add(1, Ordering::Release);
            tracing::info!(
                task = %def.name, outcome = "ok", duration_ms, late_ms, attempts, exit, files_moved, files_skipped, files_failed, files_waiting, records,
                stdout = output(&last.stdout), stderr = output(&last.stderr), "task run finished"
            );
        }
        Outcome::Cancelled => {
            stats.cancelled.fetch_add(1, Ordering::Release);
            tracing::warn!(
                task = %def.name, outcome = "cancelled", duration_ms, late_ms, attempts, exit, files_moved, files_skipped, files_failed, files_waiting, records,
                stdout = output(&last.stdout), stderr = output(&last.stderr), "task run cancelled by shutdown"
            );
        }
        Outcome::Failed(_) | Outcome::TimedOut => {
            if last.outcome == Outcome::TimedOut {
                stats.timeouts.fetch_add(1, Ordering::Release);
            } else {
                stats.failed.fetch_add(1, Ordering::Release);
            }
            let reason = failure_reason(def, &last);
            if first_of_its_kind(def, "run", last.outcome.label(), &reason) {
                tracing::error!(
                    task = %def.name, outcome = last.outcome.label(), reason,
                    duration_ms, late_ms, attempts, exit, files_moved, files_skipped, files_failed, files_waiting, records, stdout = output(&last.stdout), stderr = output(&last.stderr),
                    "task run failed"
                );
            }
        }
    }
}

/// A run holding a worker, counted in [`TaskStats::running`] until it ends however it ends (a
/// panic or an abort included).
struct Running<'a>(&'a TaskStats);

impl<'a> Running<'a> {
    fn new(stats: &'a TaskStats) -> Running<'a> {
        stats.running.fetch_add(1, Ordering::Relaxed);
        Running(stats)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How often a scrape that keeps failing the same way says so: the first failure in full, then
/// one line per this interval with how many more there were (as the listeners' refusals).
const SCRAPE_FAILURES_EVERY: Duration = Duration::from_secs(60);

/// Whether this failure of `def` (a failed run, or an `attempt` about to be retried) is logged in
/// full. A scrape against a dead device fails every run the same way: one line each would bury
/// everything else, so after the first only a count is logged, per task, outcome and reason (a new
/// reason, or another task, is logged in full). Other tasks log every failure: an exec's output
/// differs from run to run and a file move's failures are summarised where they arise.
fn first_of_its_kind(
    def: &TaskDef,
    what: &'static str,
    outcome: &'static str,
    reason: &str,
) -> bool {
    if !def.action.is_scrape() {
        return true;
    }
    let key = format!("task {what} failed\0{}\0{outcome}\0{reason}", def.name);
    summary::first(&key, 1, SCRAPE_FAILURES_EVERY, || {
        let (task, reason) = (def.name.clone(), reason.to_string());
        move |n, _, window| {
            let secs = summary::secs(window);
            if what == "run" {
                tracing::error!(
                    task,
                    outcome,
                    reason,
                    repeated = n,
                    "task run failed: {n} more like it in the last {secs}s"
                );
            } else {
                tracing::warn!(
                    task,
                    outcome,
                    reason,
                    repeated = n,
                    "task attempt failed, will retry: {n} more like it in the last {secs}s"
                );
            }
        }
    })
}

fn failure_reason(def: &TaskDef, a: &Attempt) -> String {
    match &a.outcome {
        Outcome::Failed(r) => r.clone(),
        Outcome::TimedOut => def.action.timed_out(def.timeout),
        Outcome::Ok => String::new(),
        Outcome::Cancelled => "shutdown".into(),
    }
}
