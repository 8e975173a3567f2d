//! Log tailing: a `type: tail` source follows the files its globs match and appends their lines to
//! a stream, each line (or multiline group) one JSON record (shape in [`record`]).
//!
//! One source is one task on the event loop (this file, the driver) and a synchronous core
//! ([`tailer::Tailer`]) that reads files on the blocking pool. The driver:
//! - waits on inotify (an `AsyncFd`: no wake-ups while nothing changes), a timer (rescans every
//!   `scan_interval`, polling when inotify is off or unavailable, multiline and rotation timers,
//!   the stream's `batch.linger`) and `stopping`;
//! - hands the tailer what happened and a batch to fill: whole jobs of the stream's `batch` size,
//!   about 1 MiB (at most 2 MiB or 8192 records, and half the stream's bounds) per append;
//! - appends each batch with the checkpoint that covers it, in one store transaction, so a crash
//!   can neither lose nor repeat a line. One append is in flight at a time; the next batch is read
//!   while it commits. Under `when_full: block` the append waits in the writer for room and the
//!   tailer stops reading once its next batch is full: the files are the buffer.
//! - after an append whose outcome is unknown (a store error), rebuilds the tailer from the stored
//!   checkpoint, which is exactly what the store holds.
//!
//! Counters are kept per source ([`stats`]) and logged in a summary at stop.

pub mod batch;
pub mod checkpoint;
pub mod emit;
pub mod identity;
pub mod lines;
pub mod record;
pub mod tailer;
pub mod watch;

pub use config::TailSpec as Spec;

mod config;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::store::writer::StoreHandle;
use crate::store::{AppendError, Appended, RecordBuf};
use crate::units::fmt_duration;
use batch::{Batch, Limits};
use emit::Settings;
use tailer::{StepInput, Tailer};
use watch::{Inotify, Watcher};

/// `max_line_bytes` when the config does not say.
pub const DEFAULT_MAX_LINE_BYTES: u64 = 64 << 10;

/// A compiled `type: tail` source.
#[derive(Debug, Clone)]
pub struct TailConfig {
    pub name: String,
    pub stream: String,
    /// The `paths` patterns as written.
    pub paths: Vec<String>,
    /// The same, absolute.
    pub patterns: Vec<String>,
    pub exclude: Vec<Exclude>,
    pub start_at: StartAt,
    pub filter: crate::record::filter::Filter,
    pub max_line_bytes: usize,
    pub multiline: Option<lines::MultilineConfig>,
    /// What records carry beyond `line` (`host` only when the host name is known).
    pub fields: record::Fields,
    pub labels: Vec<(String, String)>,
    pub format: Format,
    pub watch: WatchMode,
    pub poll_interval: Duration,
    pub scan_interval: Duration,
    pub rotate_wait: Duration,
}

#[derive(Debug, Clone)]
pub struct Exclude {
    pub pattern: glob::Pattern,
    /// Matched against the file name only (the pattern has no `/`).
    pub name_only: bool,
    /// As written.
    pub text: String,
}

/// Where to start in files that are there when the source first runs. This enum, `Format` and
/// `WatchMode` are also the file's words (`start_at:`, `format:`, `watch:`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum StartAt {
    /// The file's first line (the default).
    #[default]
    Beginning,
    /// Only what is written after colibri first saw the file.
    End,
}

/// What a source's lines are.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// Any text: each line is the `line` of a record (the default).
    #[default]
    Text,
    /// JSON objects: a line that is one is the record itself (the fields added); any other line
    /// is wrapped as text, and counted.
    Json,
}

/// How the files are watched for new data.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum WatchMode {
    /// inotify, polling where it is unavailable (the default).
    #[default]
    Auto,
    /// Checked every `poll_interval`.
    Poll,
}

impl crate::source::kind::Settings for TailConfig {
    fn name(&self) -> &str {
        &self.name
    }

    fn streams(&self) -> Vec<&str> {
        vec![&self.stream]
    }

    /// For `colibri check`.
    fn describe(&self) -> String {
        let mut out = format!("tail {}", self.paths.join(", "));
        if !self.exclude.is_empty() {
            let ex: Vec<&str> = self.exclude.iter().map(|e| e.text.as_str()).collect();
            out.push_str(&format!(" (exclude {})", ex.join(", ")));
        }
        out.push_str(&format!(" -> {}", self.stream));
        let mut notes = Vec::new();
        if self.start_at == StartAt::End {
            notes.push("start_at end".to_string());
        }
        if let Some(m) = &self.multiline {
            notes.push(format!("multiline {:?}", m.start.as_str()));
        }
        let f = &self.filter;
        if !f.include.is_empty() || !f.exclude.is_empty() {
            notes.push(format!(
                "{} include / {} exclude patterns",
                f.include.len(),
                f.exclude.len()
            ));
        }
        if let Some(l) = f.min_level {
            notes.push(format!("min_level {}", l.name()));
        }
        if self.format == Format::Json {
            notes.push("format json".to_string());
        }
        if self.fields != record::Fields::ALL {
            let names = self.fields.names();
            notes.push(if names.is_empty() {
                "fields: line only".to_string()
            } else {
                format!("fields: line, {}", names.join(", "))
            });
        }
        if self.max_line_bytes as u64 != DEFAULT_MAX_LINE_BYTES {
            notes.push(format!(
                "max_line_bytes {}",
                crate::units::fmt_size(self.max_line_bytes as u64)
            ));
        }
        if !self.labels.is_empty() {
            let l: Vec<String> = self
                .labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            notes.push(format!("labels {}", l.join(",")));
        }
        if self.watch == WatchMode::Poll {
            notes.push(format!("polled every {}", fmt_duration(self.poll_interval)));
        }
        if !notes.is_empty() {
            out.push_str(&format!(" ({})", notes.join(", ")));
        }
        out
    }
}

crate::counters::counters! {
    /// What a source did, since the process started (kept by name in the agent's `Registry`, so
    /// they outlive a reload and a source's rebuilds; read by the metrics endpoint; logged at
    /// stop).
    pub struct TailStats, logged as "tail summary" by source with { stream: &str } {
        /// Lines read from files (each line of a multiline group counts).
        lines_read => ("colibri_source_lines_total", "Lines a tail source read."),
        bytes_read,
        /// Records the stream acknowledged as durable.
        records_appended => ("colibri_source_records_total", "Records a tail source appended (durable)."),
        /// Records the stream refused while full (`when_full: drop_newest`), counted there as
        /// dropped.
        records_dropped,
        /// Lines cut at `max_line_bytes`.
        truncated_lines => ("colibri_source_truncated_lines_total", "Lines cut at max_line_bytes."),
        /// Lines dropped by `include_lines`, `exclude_lines` or `min_level`.
        filtered_lines => ("colibri_source_filtered_lines_total", "Lines dropped by include_lines, exclude_lines or min_level."),
        /// Under `format: json`, lines stored wrapped as text (`{"line": ...}`) because they were
        /// not a JSON object (or were cut).
        wrapped_lines => ("colibri_source_wrapped_lines_total", "Lines a format: json source stored wrapped as text (not a JSON object, or cut)."),
        /// Followed files that were renamed away or deleted.
        rotations => ("colibri_source_rotations_total", "Followed files renamed away or deleted."),
        /// Followed files that got shorter (or were rewritten) and were read again from their
        /// start.
        truncations,
        files_opened,
        files_released,
        /// Appends (store transactions) made.
        appends,
        /// Times the source was rebuilt from its stored checkpoint after a store error.
        restarts,
    }
    extra {
        /// Where each followed file is read to, as of the source's last batch: what
        /// [`TailStats::lag_bytes`] measures the files against.
        pub read_to: std::sync::Mutex<Vec<ReadTo>>,
    }
}

/// A followed file and the next byte the source reads of it.
#[derive(Debug, Clone)]
pub struct ReadTo {
    /// The source's descriptor of it: the file it reads, renamed or deleted as it may be.
    pub fd: std::os::fd::RawFd,
    pub id: identity::Identity,
    pub pos: u64,
}

impl TailStats {
    /// Bytes the followed files hold beyond what the source has read: how far it is behind
    /// (records of a stream that refuses appends, `when_full: block`, stay in the files). Each
    /// file is looked at through the source's own descriptor (`/proc/self/fd`), so a file
    /// rotated away still counts until it is read; a descriptor closed meanwhile (or taken by
    /// another file) no longer matches the file's identity and counts nothing. Called by the
    /// metrics page, not by the source: a stat per followed file per scrape.
    pub fn lag_bytes(&self) -> u64 {
        let read_to = self
            .read_to
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        read_to
            .iter()
            .filter_map(|f| {
                let m = std::fs::metadata(format!("/proc/self/fd/{}", f.fd)).ok()?;
                (identity::Identity::of(&m) == f.id).then(|| m.len().saturating_sub(f.pos))
            })
            .sum()
    }
}

/// How long an append may wait in the writer for room in a full `block` stream before the source
/// rebuilds itself from its checkpoint and tries again.
const APPEND_WAIT: Duration = Duration::from_secs(3600);
/// An append waiting this long is reported (once) as "stream full, reading paused".
const SLOW_APPEND: Duration = Duration::from_secs(5);
/// A step triggered by a timer of the tailer alone is not repeated sooner than this after the
/// last one.
const TIMER_STEP_GAP: Duration = Duration::from_millis(5);
/// How long the final append at stop may take.
const STOP_WAIT: Duration = Duration::from_secs(2);
/// Retries of store reads and restarts of the source: `crate::backoff::jittered` from this to that.
const RETRY_BASE: Duration = Duration::from_millis(100);
const RETRY_CAP: Duration = Duration::from_secs(5);
const RESTART_CAP: Duration = Duration::from_secs(10);

impl crate::source::kind::KindConfig for TailConfig {
    type Stats = TailStats;

    fn run(
        self: Arc<Self>,
        stats: Arc<TailStats>,
        store: StoreHandle,
        stopping: CancellationToken,
        _sockets: crate::source::Sockets,
    ) -> impl Future<Output = ()> + Send {
        run(self, stats, store, stopping)
    }
}

/// Follows the files of one source until `stopping`.
pub async fn run(
    config: Arc<TailConfig>,
    stats: Arc<TailStats>,
    store: StoreHandle,
    stopping: CancellationToken,
) {
    let Some(stream) = store
        .stream_settings(&config.name, &config.stream, &stopping)
        .await
    else {
        return;
    };
    let host = if config.fields.contains(record::Fields::HOST) {
        crate::net::hostname()
    } else {
        None
    };
    let settings = Settings::new(Arc::clone(&config), host.as_deref(), stream.max_bytes);
    let (inotify, watcher) = match config.watch {
        WatchMode::Poll => (None, None),
        WatchMode::Auto => match Inotify::new() {
            Ok((i, w)) => (Some(i), Some(w)),
            Err(e) => {
                tracing::warn!(source = %config.name, error = %e, "inotify is not available: polling the files instead");
                (None, None)
            }
        },
    };
    let stopped = stopping.clone();
    let mut d = Driver {
        polling: inotify.is_none(),
        cfg: Arc::clone(&config),
        settings,
        store,
        stats: Arc::clone(&stats),
        stopping,
        inotify,
        watcher,
        limits: Limits::for_stream(&stream),
        job_records: stream.batch.max_records as usize,
        job_bytes: stream.batch.max_bytes as usize,
        linger: stream.batch.linger,
        paused_logged: false,
        full_logged: false,
        restarts: 0,
        retired: None,
    };
    d.run().await;
    if !stopped.is_cancelled() {
        tracing::error!(source = %config.name, stream = %config.stream, "tail source ended before colibri stops: its files are not followed until colibri is restarted");
    }
    stats.log_summary(&config.name, &config.stream);
}

type AppendFuture = Pin<Box<dyn Future<Output = Result<Appended, AppendError>> + Send>>;

struct InFlight {
    fut: AppendFuture,
    records: u64,
    started: Instant,
    /// What is sent again when the stream stayed full past the wait (nothing was stored).
    again: Option<Resend>,
}

struct Resend {
    records: Arc<RecordBuf>,
    checkpoint: Option<(String, Vec<u8>)>,
    wait: Duration,
}

struct Driver {
    cfg: Arc<TailConfig>,
    settings: Settings,
    store: StoreHandle,
    stats: Arc<TailStats>,
    stopping: CancellationToken,
    inotify: Option<Inotify>,
    watcher: Option<Watcher>,
    polling: bool,
    limits: Limits,
    job_records: usize,
    job_bytes: usize,
    linger: Duration,
    paused_logged: bool,
    /// "Still full" was logged for the current pause.
    full_logged: bool,
    /// Restarts since the last successful append.
    restarts: u32,
    /// Inotify after reading it failed: kept open until the tailer dropped its watches.
    retired: Option<Inotify>,
}

/// Why the main loop ended.
enum Exit {
    Stopping,
    /// An append's outcome is unknown, the store writer failed, or a step panicked: rebuild from
    /// the stored checkpoint.
    Restart,
}

impl Driver {
    async fn run(&mut self) {
        let mut started = false;
        loop {
            let Some(stored) = self.load_checkpoint().await else {
                return;
            };
            // No checkpoint while a damaged store file is kept: it may have held this source's
            // (the salvage restores it only where nothing was lost). Reading the files again from
            // the beginning sends some lines twice; `start_at: end` would lose them.
            let lost = stored.is_none() && !self.store.damaged_files().is_empty();
            let first_life = stored.is_none() && !lost;
            let start = {
                let (s, w, st) = (self.settings.clone(), self.watcher, Arc::clone(&self.stats));
                tokio::task::spawn_blocking(move || {
                    Box::new(Tailer::start(
                        s,
                        stored.as_deref(),
                        lost,
                        w,
                        st,
                        std::time::Instant::now(),
                    ))
                })
            };
            let exit = match start.await {
                Ok(tailer) => {
                    if !started {
                        started = true;
                        tracing::info!(
                            source = %self.cfg.name,
                            stream = %self.cfg.stream,
                            files = tailer.files(),
                            watch = if self.polling { "poll" } else { "inotify" },
                            "tail started"
                        );
                    }
                    self.follow(tailer, first_life).await
                }
                Err(e) => {
                    tracing::error!(source = %self.cfg.name, error = %e, "tail source failed to start: starting again");
                    Exit::Restart
                }
            };
            match exit {
                Exit::Stopping => return,
                Exit::Restart => {
                    let backoff = crate::backoff::jittered(self.restarts, RETRY_BASE, RESTART_CAP);
                    self.restarts = self.restarts.saturating_add(1);
                    self.stats.restarts.fetch_add(1, Relaxed);
                    tokio::select! {
                        _ = self.stopping.cancelled() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                }
            }
        }
    }

    /// The stored checkpoint (`Some(None)`: there is none); `None` when stopping or the store is
    /// gone.
    async fn load_checkpoint(&self) -> Option<Option<Vec<u8>>> {
        let mut attempt = 0u32;
        loop {
            match self.store.checkpoint(&self.cfg.name).await {
                Ok(cp) => return Some(cp),
                Err(_) if self.stopping.is_cancelled() => return None,
                Err(e) => {
                    tracing::warn!(source = %self.cfg.name, error = %e, "cannot read the tail checkpoint; retrying");
                }
            }
            tokio::select! {
                _ = self.stopping.cancelled() => return None,
                _ = tokio::time::sleep(crate::backoff::jittered(attempt, RETRY_BASE, RETRY_CAP)) => {}
            }
            attempt = attempt.saturating_add(1);
        }
    }

    /// Sends `batch` to the store; `wait`: how long it may wait for room in a full `block` stream
    /// (the records are kept, shared with the request, to send again if it stays full that long).
    fn start_append(&self, batch: Batch, wait: Option<Duration>) -> InFlight {
        let checkpoint = batch.checkpoint.map(|c| (self.cfg.name.clone(), c));
        let records = Arc::new(batch.records);
        let again = wait.map(|wait| Resend {
            records: Arc::clone(&records),
            checkpoint: checkpoint.clone(),
            wait,
        });
        let mut f = self.send(records, checkpoint, wait, Duration::ZERO);
        f.again = again;
        f
    }

    /// Sends again what stayed refused as full (nothing was stored), after `delay`.
    fn resend(&self, r: Resend, delay: Duration) -> InFlight {
        let mut f = self.send(
            Arc::clone(&r.records),
            r.checkpoint.clone(),
            Some(r.wait),
            delay,
        );
        f.again = Some(r);
        f
    }

    fn send(
        &self,
        recs: Arc<RecordBuf>,
        checkpoint: Option<(String, Vec<u8>)>,
        wait: Option<Duration>,
        delay: Duration,
    ) -> InFlight {
        let store = self.store.clone();
        let stream = self.cfg.stream.clone();
        let records = recs.len() as u64;
        InFlight {
            fut: Box::pin(async move {
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                store.append_shared(&stream, recs, checkpoint, wait).await
            }),
            records,
            started: Instant::now(),
            again: None,
        }
    }

    /// Whether the batch should be appended now.
    fn due(&self, b: &Batch, now: Instant, more: bool, urgent: bool) -> bool {
        if b.is_empty() {
            return false;
        }
        if urgent || b.is_full() {
            return true;
        }
        if !more
            && !b.records.is_empty()
            && (b.records.len() >= self.job_records || b.bytes() >= self.job_bytes)
        {
            return true;
        }
        b.since
            .is_some_and(|t| now >= Instant::from_std(t) + self.linger)
    }

    /// Handles an append's result; `Err` ends the loop.
    fn appended(&mut self, r: Result<Appended, AppendError>, records: u64) -> Result<(), Exit> {
        match r {
            Ok(_) => {
                self.restarts = 0;
                self.full_logged = false;
                self.stats.appends.fetch_add(1, Relaxed);
                self.stats.records_appended.fetch_add(records, Relaxed);
                if self.paused_logged {
                    self.paused_logged = false;
                    tracing::info!(source = %self.cfg.name, stream = %self.cfg.stream, "the stream takes records again: reading resumed");
                }
                Ok(())
            }
            Err(AppendError::Refused { records, .. }) => {
                // drop_newest: counted by the stream; the checkpoint moves on with the next append.
                let before = self.stats.records_dropped.fetch_add(records, Relaxed);
                if before == 0 || (before + records) / 100_000 > before / 100_000 {
                    tracing::warn!(source = %self.cfg.name, stream = %self.cfg.stream, dropped = before + records, "stream full (when_full: drop_newest): tailed records dropped");
                }
                Ok(())
            }
            // The writer is gone because colibri stops; otherwise it failed and reopens: the
            // outcome is unknown, start again from what it committed.
            Err(AppendError::Store(_)) if self.stopping.is_cancelled() => Err(Exit::Stopping),
            Err(e) => {
                tracing::warn!(source = %self.cfg.name, stream = %self.cfg.stream, error = %e, "append failed: starting again from the stored checkpoint");
                Err(Exit::Restart)
            }
        }
    }

    async fn follow(&mut self, tailer: Box<Tailer>, first_life: bool) -> Exit {
        let mut f = Follow::new(tailer, self.limits, first_life, &self.cfg);
        let exit = loop {
            if self.retired.is_some()
                && let Some(t) = &mut f.tailer
            {
                t.forget_watcher();
                self.retired = None;
            }
            let now = Instant::now();
            f.note_timers(now, &self.cfg, self.polling);
            self.append_if_due(&mut f, now);
            f.step_if_asked(now);
            let wake = self.wake_at(&f);
            let (inflight, stepping) = (&mut f.inflight, &mut f.stepping);
            tokio::select! {
                biased;
                _ = self.stopping.cancelled() => break Exit::Stopping,
                r = async { inflight.as_mut().expect("guarded").fut.as_mut().await }, if inflight.is_some() => {
                    if let Err(exit) = self.append_done(&mut f, r) {
                        break exit;
                    }
                }
                r = async { stepping.as_mut().expect("guarded").await }, if stepping.is_some() => {
                    if let Err(exit) = self.step_done(&mut f, r) {
                        break exit;
                    }
                }
                r = read_events(&mut self.inotify, &mut f.input.events), if self.inotify.is_some() => {
                    if let Err(e) = r {
                        self.inotify_failed(&e);
                    }
                }
                _ = tokio::time::sleep_until(wake) => self.note_slow_append(&f),
            }
        };
        match exit {
            Exit::Stopping => self.end_for_stop(f).await,
            Exit::Restart => self.end_for_restart(f).await,
        }
        exit
    }

    /// Appends the batch when it is due and no append is in flight (the tailer and the batch
    /// home).
    fn append_if_due(&self, f: &mut Follow, now: Instant) {
        if let (Some(t), Some(b)) = (&f.tailer, &mut f.next)
            && f.inflight.is_none()
            && self.due(b, now, t.has_work(), f.urgent)
        {
            f.urgent = false;
            f.inflight = Some(self.start_append(b.take(), Some(APPEND_WAIT)));
        }
    }

    /// When to wake without an event: the next scan or poll, the end of the batch's linger, a
    /// timer of the tailer, an append becoming slow.
    fn wake_at(&self, f: &Follow) -> Instant {
        let mut wake = f.next_scan;
        if self.polling {
            wake = wake.min(f.next_poll);
        }
        if let (Some(t), Some(b)) = (&f.tailer, &f.next) {
            if f.inflight.is_none()
                && let Some(since) = b.since
                && !b.is_empty()
            {
                wake = wake.min(Instant::from_std(since) + self.linger);
            }
            // A timer of the tailer needs a step, which waits while the batch is full.
            if let Some(d) = t.deadline()
                && !b.is_full()
            {
                wake = wake.min(Instant::from_std(d).max(f.last_step + TIMER_STEP_GAP));
            }
        }
        if let Some(inflight) = &f.inflight
            && !self.paused_logged
        {
            wake = wake.min(inflight.started + SLOW_APPEND);
        }
        wake
    }

    /// The append in flight ended: one refused as full is sent again (nothing was stored), any
    /// other outcome is [`Driver::appended`]'s; `Err` ends the loop.
    fn append_done(
        &mut self,
        f: &mut Follow,
        r: Result<Appended, AppendError>,
    ) -> Result<(), Exit> {
        let done = f.inflight.take().expect("guarded");
        match (r, done.again) {
            // Nothing was stored: keep waiting for room.
            (Err(AppendError::Full { reason, .. }), Some(again)) => {
                if !self.full_logged {
                    self.full_logged = true;
                    tracing::warn!(source = %self.cfg.name, stream = %self.cfg.stream, %reason, "the stream is still full: reading stays paused until it has room (the files keep the lines)");
                }
                // A refusal that came at once is not sent again at once.
                let delay = if done.started.elapsed() < SLOW_APPEND {
                    SLOW_APPEND
                } else {
                    Duration::ZERO
                };
                f.inflight = Some(self.resend(again, delay));
                Ok(())
            }
            (r, _) => self.appended(r, done.records),
        }
    }

    /// A step ended: the tailer and the batch are home again; a failed step ends the loop.
    fn step_done(
        &mut self,
        f: &mut Follow,
        r: Result<(Box<Tailer>, Batch), tokio::task::JoinError>,
    ) -> Result<(), Exit> {
        f.stepping = None;
        match r {
            Ok((t, b)) => {
                if t.watch_failed && !self.polling {
                    self.polling = true;
                    tracing::warn!(source = %self.cfg.name, "inotify limit reached (fs.inotify.max_user_watches): polling the files instead");
                }
                f.tailer = Some(t);
                f.next = Some(b);
                Ok(())
            }
            Err(e) => {
                tracing::warn!(source = %self.cfg.name, error = %e, "a tail step failed: starting again from the stored checkpoint");
                Err(Exit::Restart)
            }
        }
    }

    /// Reading inotify failed: the source polls from now on.
    fn inotify_failed(&mut self, e: &std::io::Error) {
        tracing::warn!(source = %self.cfg.name, error = %e, "inotify failed: polling the files instead");
        // Kept open until the tailer has removed its watches (it holds the raw
        // descriptor); restarted tailers get none.
        self.retired = self.inotify.take();
        self.watcher = None;
        self.polling = true;
    }

    /// Woken by the timer: an append waiting long is reported once as a pause.
    fn note_slow_append(&mut self, f: &Follow) {
        if let Some(inflight) = &f.inflight
            && !self.paused_logged
            && inflight.started.elapsed() >= SLOW_APPEND
        {
            self.paused_logged = true;
            tracing::warn!(source = %self.cfg.name, stream = %self.cfg.stream, "the stream is full: reading paused until it has room (the files keep the lines)");
        }
    }

    /// The loop ended for a restart: the step and the append under way end first.
    async fn end_for_restart(&mut self, f: Follow) {
        if let Some(s) = f.stepping {
            let _ = s.await;
        }
        drop(f.tailer);
        self.retired = None;
        // The checkpoint read at the restart must include an append still under way.
        if let Some(mut inflight) = f.inflight {
            tokio::select! {
                _ = self.stopping.cancelled() => {}
                r = inflight.fut.as_mut() => {
                    let _ = self.appended(r, inflight.records);
                }
            }
        }
    }

    /// Stopping: what was read is committed when that is quick; the rest is read again at the
    /// next start (the checkpoint says where).
    async fn end_for_stop(&mut self, mut f: Follow) {
        if let Some(s) = f.stepping.take()
            && let Ok((t, b)) = s.await
        {
            f.tailer = Some(t);
            f.next = Some(b);
        }
        let mut ok = true;
        if let Some(mut inflight) = f.inflight.take() {
            ok = match tokio::time::timeout(STOP_WAIT, inflight.fut.as_mut()).await {
                Ok(r) => self.appended(r, inflight.records).is_ok(),
                Err(_) => false,
            };
        }
        if ok
            && let Some(b) = f.next.take()
            && !b.is_empty()
        {
            // Without waiting for room: a full stream keeps these lines in the file.
            let mut last = self.start_append(b, None);
            if let Ok(r) = tokio::time::timeout(STOP_WAIT, last.fut.as_mut()).await {
                let _ = self.appended(r, last.records);
            }
        }
        drop(f.tailer);
        self.retired = None;
    }
}

/// One [`Driver::follow`]: the tailer and the batch it fills (home, or on the blocking pool while
/// `stepping`), the append in flight, what the next step is told, and the timers.
struct Follow {
    tailer: Option<Box<Tailer>>,
    next: Option<Batch>,
    stepping: Option<tokio::task::JoinHandle<(Box<Tailer>, Batch)>>,
    inflight: Option<InFlight>,
    input: StepInput,
    /// Append the first batch as soon as it has records (a source's first life).
    urgent: bool,
    next_scan: Instant,
    next_poll: Instant,
    /// When the last step began (see [`TIMER_STEP_GAP`]).
    last_step: Instant,
}

impl Follow {
    fn new(tailer: Box<Tailer>, limits: Limits, first_life: bool, cfg: &TailConfig) -> Self {
        let start = Instant::now();
        Self {
            tailer: Some(tailer),
            next: Some(Batch::new(limits)),
            stepping: None,
            inflight: None,
            input: StepInput::default(),
            urgent: first_life,
            next_scan: start + cfg.scan_interval,
            next_poll: start + cfg.poll_interval,
            last_step: start,
        }
    }

    /// A rescan (every `scan_interval`) and, when polling, a look at every file are due.
    fn note_timers(&mut self, now: Instant, cfg: &TailConfig, polling: bool) {
        if now >= self.next_scan {
            self.input.rescan = true;
            self.input.check_all = true;
            self.next_scan = now + cfg.scan_interval;
        }
        if polling && now >= self.next_poll {
            self.input.check_all = true;
            self.next_poll = now + cfg.poll_interval;
        }
    }

    /// Hands the tailer and the batch to the blocking pool for a step when there is something to
    /// do and room in the batch for it.
    fn step_if_asked(&mut self, now: Instant) {
        let (Some(t), Some(b)) = (&self.tailer, &self.next) else {
            return;
        };
        let timer_due = t
            .deadline()
            .is_some_and(|d| Instant::from_std(d) <= now && now >= self.last_step + TIMER_STEP_GAP);
        let asked = !self.input.events.is_empty() || self.input.rescan || self.input.check_all;
        if !b.is_full() && (asked || t.has_work() || timer_due) {
            let mut t = self.tailer.take().expect("home");
            let mut b = self.next.take().expect("home");
            let inp = std::mem::take(&mut self.input);
            self.last_step = now;
            self.stepping = Some(tokio::task::spawn_blocking(move || {
                t.step(&inp, &mut b, std::time::Instant::now());
                (t, b)
            }));
        }
    }
}

/// Waits for inotify events and adds them to `out`, one per watch (while the tailer is busy or the
/// stream is full they pile up: what matters is which watches fired).
async fn read_events(
    inotify: &mut Option<Inotify>,
    out: &mut Vec<watch::Event>,
) -> std::io::Result<()> {
    match inotify {
        Some(i) => {
            i.read(out).await?;
            if out.len() > 64 {
                out.sort_by_key(|e| e.wd);
                out.dedup_by(|later, kept| {
                    let same = later.wd == kept.wd;
                    if same {
                        kept.mask |= later.mask;
                    }
                    same
                });
            }
            Ok(())
        }
        None => std::future::pending().await,
    }
}
