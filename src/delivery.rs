//! Upload workers. For every stream that has a sink, `concurrency` workers take the oldest due jobs
//! from the store (retry jobs whose time has come, then ready ones), hand them to the sink, and settle
//! each by the sink's classification of the outcome:
//!
//! - delivered: acknowledged (deleted), together with the other jobs of the same take in one commit;
//! - no answer (transport): the job goes back untouched, no attempt spent; the failure is reported
//!   to the sink's [`Link`], which after `down_after` in a row turns the link down, and every worker
//!   of the sink waits until the monitor sees it answer again;
//! - may pass (5xx, 408, 429): an attempt spent, retry after `base * 2^n * (0.5 + rand)` capped, or
//!   the peer's `Retry-After`; dead letters after `max_attempts`;
//! - too large (413): the job is sent in halves, recursively; delivered parts are settled in the
//!   store as they go so a crash never re-sends them, and a single record refused as too large is
//!   dead-lettered on its own;
//! - never (other 4xx): straight to the dead letters with the status and the body's first bytes;
//! - one record never (the sink cannot send it for what it is, before anything went out): the
//!   records before it go as a part of their own, then it alone is dead-lettered, and the rest
//!   follows, through the same settled parts as a 413 split.
//!
//! With `concurrency: 1` a stream keeps strict order: jobs go one after the other, and a job waiting
//! for its retry holds the jobs behind it (an outage creates no retry, so it never holds anything
//! beyond the outage itself). With more, requests overlap and a retry does not hold later jobs.
//! After a link comes back (and at start-up) requests are paced by `replay_rate` until the queue is
//! drained. With nothing to do a worker sleeps until the store signals new jobs, the earliest retry
//! falls due, or colibri stops: an idle worker does not poll. It does not decide what a failure means
//! (the sink does), whether the link is up (the link monitor does) nor where jobs live (the store).
//! Started and stopped by `agent`.

use std::cell::OnceCell;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::clock::now_ms;
use crate::link::Link;
use crate::paused::Paused;
use crate::sink::{Batch, DeliveryError, Payload, Sink};
use crate::store::writer::{Snapshot, StoreHandle};
use crate::store::{Failed, Failure, Job, JobRecords, Lease, Settle};

/// Pause after the store itself failed (it reopens with its own backoff).
const STORE_ERROR_PAUSE: Duration = Duration::from_secs(1);
/// Jobs taken at once by a worker of a sink with concurrency 1, delivered one after the other in
/// order and acknowledged together (one commit, whose writes are most of a drain's); fewer when
/// they hold [`TAKE_BYTES`] (memory: 16 compressed jobs, two uncompressed ones of 256 KiB). After
/// a crash at most these are sent again.
const TAKE_SEQUENTIAL: usize = 16;
const TAKE_BYTES: u64 = 512 << 10;
/// A peer's `Retry-After` is honoured up to this.
const RETRY_AFTER_MAX: Duration = Duration::from_secs(24 * 3600);

/// Delivery counters of one sink, for the metrics endpoint; a sink restarted by a reload keeps them.
#[derive(Debug)]
pub struct SinkStats {
    /// Requests answered with 2xx.
    pub requests_ok: AtomicU64,
    /// Requests that got no answer (refused, reset, timed out, TLS): no attempt spent.
    pub requests_transport: AtomicU64,
    /// Requests answered 5xx, 408 or 429: an attempt spent.
    pub requests_retryable: AtomicU64,
    /// Requests answered 413: split.
    pub requests_too_large: AtomicU64,
    /// Requests answered with another 4xx: dead-lettered.
    pub requests_rejected: AtomicU64,
    /// Failed attempts that count against `max_attempts`.
    pub attempts_failed: AtomicU64,
    pub dead_lettered_jobs: AtomicU64,
    pub dead_lettered_records: AtomicU64,
    pub records_delivered: AtomicU64,
    /// Request body bytes delivered (as sent: after compression).
    pub bytes_delivered: AtomicU64,
    /// Requests from the first byte sent to the answer (or the failure), whatever the outcome.
    pub request_duration: crate::metrics::Histogram,
    /// Link up/down transitions of earlier runtimes of this sink (before a reload restarted it).
    pub transitions_before: AtomicU64,
    /// The last request that failed: when (Unix ms) and why (no answer, or what the receiver
    /// said). Taken only on a failure, so a sink that delivers never locks it.
    pub last_error: std::sync::Mutex<Option<(u64, String)>>,
}

impl SinkStats {
    fn failed(&self, reason: &str) {
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((now_ms(), reason.to_string()));
    }

    /// The last failure: when (Unix ms) and why.
    pub fn last_error(&self) -> Option<(u64, String)> {
        self.last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Default for SinkStats {
    fn default() -> Self {
        let zero = || AtomicU64::new(0);
        SinkStats {
            requests_ok: zero(),
            requests_transport: zero(),
            requests_retryable: zero(),
            requests_too_large: zero(),
            requests_rejected: zero(),
            attempts_failed: zero(),
            dead_lettered_jobs: zero(),
            dead_lettered_records: zero(),
            records_delivered: zero(),
            bytes_delivered: zero(),
            request_duration: crate::metrics::Histogram::new(crate::metrics::REQUEST_BUCKETS),
            transitions_before: zero(),
            last_error: std::sync::Mutex::new(None),
        }
    }
}

/// A sink at run time: shared by its workers and its link monitor.
pub struct SinkRuntime {
    pub sink: Arc<Sink>,
    pub link: Arc<Link>,
    pub stats: Arc<SinkStats>,
    /// The streams delivered to this sink.
    pub streams: Vec<String>,
    /// Per stream (same order): set after a link comes back (and at start) until a worker finds
    /// that stream's queue empty: its backlog is being replayed, under `replay_rate`.
    replaying: Vec<AtomicBool>,
    pacer: Option<Mutex<Pacer>>,
    /// Requests in flight, all streams of the sink together.
    in_flight: Semaphore,
    /// How long requests in progress may go on once colibri is stopping.
    grace: Duration,
    /// Set at the first look after the stop: when every request still going is abandoned.
    give_up_at: std::sync::OnceLock<tokio::time::Instant>,
    /// Streams an operator paused: their workers take nothing.
    paused: Arc<Paused>,
}

impl SinkRuntime {
    /// `stats` carries the counters of the sink's previous runtime across a reload (or starts
    /// fresh).
    pub fn new(
        sink: Arc<Sink>,
        streams: Vec<String>,
        grace: Duration,
        stats: Arc<SinkStats>,
        paused: Arc<Paused>,
    ) -> SinkRuntime {
        // A trial must outlast a request that is slow to fail, or the link would be declared up
        // while the trial's request is still on its way to a timeout.
        let trial_quiet = sink
            .timeout()
            .saturating_mul(2)
            .max(Duration::from_secs(30));
        let link = Arc::new(Link::new(
            sink.name(),
            sink.config.link.clone(),
            trial_quiet,
        ));
        SinkRuntime {
            pacer: sink.replay_rate().map(|r| Mutex::new(Pacer::new(r))),
            in_flight: Semaphore::new(sink.concurrency()),
            link,
            sink,
            stats,
            replaying: streams.iter().map(|_| AtomicBool::new(true)).collect(),
            streams,
            grace,
            give_up_at: std::sync::OnceLock::new(),
            paused,
        }
    }

    /// Link transitions over the sink's life in this process, restarts included.
    pub fn transitions(&self) -> u64 {
        self.stats.transitions_before.load(Relaxed) + self.link.transitions.load(Relaxed)
    }

    /// The replay backlog: records waiting in this sink's streams whose backlog is being replayed
    /// (after an outage or at start), 0 once they have been drained.
    pub fn replay_backlog(&self, snap: &Snapshot) -> u64 {
        snap.streams
            .iter()
            .filter(|(cfg, _)| {
                self.streams
                    .iter()
                    .position(|s| *s == cfg.name)
                    .is_some_and(|i| self.replaying[i].load(Relaxed))
            })
            .map(|(_, c)| c.pending_records())
            .sum()
    }

    fn replaying(&self, stream: &str) -> &AtomicBool {
        let i = self
            .streams
            .iter()
            .position(|s| s == stream)
            .expect("workers run only for the sink's own streams");
        &self.replaying[i]
    }

    /// Resolves when requests still going must be abandoned: `grace` after the stop, the same
    /// moment for every worker and every part of a job.
    async fn give_up(&self, stopping: &CancellationToken) {
        stopping.cancelled().await;
        let at = *self
            .give_up_at
            .get_or_init(|| tokio::time::Instant::now() + self.grace);
        tokio::time::sleep_until(at).await;
    }
}

/// A token bucket over request bytes: a request may start when the bucket is not in debt, and then
/// takes its size (so one large request never waits forever, and the average rate holds).
struct Pacer {
    rate: f64,
    tokens: f64,
    refilled_at: Instant,
}

impl Pacer {
    fn new(bytes_per_sec: u64) -> Pacer {
        Pacer {
            rate: bytes_per_sec as f64,
            tokens: bytes_per_sec as f64,
            refilled_at: Instant::now(),
        }
    }

    /// How long to wait before a request may start; `None`: start now (and `bytes` are taken).
    fn admit(&mut self, bytes: u64, now: Instant) -> Option<Duration> {
        let elapsed = now
            .saturating_duration_since(self.refilled_at)
            .as_secs_f64();
        self.refilled_at = now;
        self.tokens = (self.tokens + elapsed * self.rate).min(self.rate);
        if self.tokens < 0.0 {
            return Some(Duration::from_secs_f64(-self.tokens / self.rate));
        }
        self.tokens -= bytes as f64;
        None
    }
}

/// Runs one worker for `stream` until `stopping` is cancelled; a request in progress at that moment
/// gets the grace period, then its job goes back to the queue.
pub async fn run(
    stream: String,
    rt: Arc<SinkRuntime>,
    store: StoreHandle,
    stopping: CancellationToken,
) {
    let Some(fed) = store.fed(&stream) else {
        tracing::error!(stream, "no such stream in the store; delivery not started");
        return;
    };
    // With one request at a time the stream keeps strict order: a job waiting for its retry holds
    // the jobs behind it (an outage never does: it creates no retry).
    let strict = rt.sink.concurrency() == 1;
    let take = if strict { TAKE_SEQUENTIAL } else { 1 };
    let replaying = rt.replaying(&stream);
    let mut hold = if strict {
        store.next_retry_due(&stream).await.ok().flatten()
    } else {
        None
    };
    tracing::debug!(stream, sink = %rt.sink.describe(), "delivery worker started");
    while !stopping.is_cancelled() {
        if rt.paused.is(&stream) {
            tracing::info!(stream, "delivery paused by the operator");
            tokio::select! {
                _ = rt.paused.resumed(&stream) => tracing::info!(stream, "delivery resumed"),
                _ = stopping.cancelled() => break,
            }
            continue;
        }
        if !rt.link.is_up() {
            tokio::select! {
                _ = rt.link.wait_up() => replaying.store(true, Relaxed),
                _ = stopping.cancelled() => break,
            }
            continue;
        }
        if let Some(due) = hold.take() {
            let now = now_ms();
            if due > now {
                pause(Duration::from_millis(due - now), &stopping).await;
                continue;
            }
        }
        let jobs = match store.take(&stream, take, TAKE_BYTES).await {
            Ok(jobs) => jobs,
            Err(e) => {
                tracing::warn!(stream, error = %e, "cannot take jobs; trying again");
                pause(STORE_ERROR_PAUSE, &stopping).await;
                continue;
            }
        };
        if jobs.is_empty() {
            replaying.store(false, Relaxed);
            // Nothing due: wait for new jobs, the next retry, or the stop.
            let wait = match store.next_retry_due(&stream).await {
                Ok(due) => due.map(|d| Duration::from_millis(d.saturating_sub(now_ms()))),
                Err(_) => Some(STORE_ERROR_PAUSE),
            };
            tokio::select! {
                _ = fed.notified() => {}
                _ = sleep_or_forever(wait) => {}
                _ = stopping.cancelled() => {}
            }
            continue;
        }
        if !strict {
            // One signal wakes one idle worker: pass it on, so a burst gets every worker.
            fed.notify_one();
        }
        let mut acks = Vec::new();
        let mut pause_for = None;
        let mut jobs = jobs.into_iter();
        while let Some(job) = jobs.next() {
            if stopping.is_cancelled() || !rt.link.is_up() || rt.paused.is(&stream) {
                store.release(job.lease);
                continue;
            }
            match deliver_job(&stream, &rt, &store, job, &stopping, &mut acks).await {
                Next::Go | Next::Retry { .. } if !strict => continue,
                Next::Go => continue,
                Next::Retry { due_ms } => hold = Some(due_ms),
                Next::Pause(p) => pause_for = Some(p),
            }
            // The rest keep their place at the head of the queue.
            for j in jobs.by_ref() {
                store.release(j.lease);
            }
        }
        // Everything delivered from this take, deleted in one commit (before any pause).
        if !acks.is_empty()
            && let Err(e) = store.ack_many(acks.clone()).await
        {
            // Delivered but not deleted: delivered again (at-least-once).
            tracing::warn!(stream, sink = rt.sink.name(), jobs = acks.len(), error = %e, "delivered, but the acknowledgement failed; what is still queued will be sent again");
            for lease in acks {
                store.release(lease);
            }
        }
        if let Some(p) = pause_for {
            pause(p, &stopping).await;
        }
    }
    tracing::debug!(stream, "delivery worker stopped");
}

async fn pause(d: Duration, stopping: &CancellationToken) {
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = stopping.cancelled() => {}
    }
}

async fn sleep_or_forever(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// What a worker does after one job.
enum Next {
    /// On to the next job.
    Go,
    /// The job went to retry, due then (in strict order, nothing behind it goes first).
    Retry { due_ms: u64 },
    /// The sink did not answer: the jobs taken with this one go back, and the worker pauses.
    Pause(Duration),
}

/// Delivers one job, in parts after a 413.
async fn deliver_job(
    stream: &str,
    rt: &SinkRuntime,
    store: &StoreHandle,
    job: Job,
    stopping: &CancellationToken,
    acks: &mut Vec<Lease>,
) -> Next {
    let n = job.record_count();
    let id = job.lease.id;
    // A sink that sends zstd bodies takes a whole job stored as a zstd frame of lines as it is,
    // never decompressed; the records are read (decompressed) only when it cannot (or after a
    // 413, to send the job in parts).
    let stored = job.zstd_lines().filter(|_| rt.sink.sends_zstd_lines());
    let opened: OnceCell<JobRecords<'_>> = OnceCell::new();
    let listed: OnceCell<Vec<&[u8]>> = OnceCell::new();
    // Records before `start` are settled in the store (the stored job begins at `start`).
    let mut start = 0usize;
    let mut chunk = n.max(1);
    // A record the sink refused for what it is: the part before it goes first, alone.
    let mut refused: Option<usize> = None;
    loop {
        if stopping.is_cancelled() {
            // Between parts of a split job: what is left stays queued.
            store.release(job.lease);
            return Next::Go;
        }
        let end = (start + chunk)
            .min(n)
            .min(refused.filter(|&r| r > start).unwrap_or(n));
        let whole_job = start == 0 && end == n;
        let payload = match stored {
            Some(frame) if whole_job => Payload::ZstdLines(frame),
            _ => {
                if opened.get().is_none() {
                    match job.records() {
                        Ok(r) => {
                            let _ = opened.set(r);
                        }
                        Err(e) => return quarantine(stream, store, job, e.to_string()).await,
                    }
                }
                let records = opened.get().expect("set above");
                match records.lines() {
                    Some(lines) if whole_job => Payload::Lines(lines),
                    _ => Payload::Records(&listed.get_or_init(|| records.list())[start..end]),
                }
            }
        };
        // The store that handed the job out (the writer may have replaced its file since: the
        // new one reuses ids); a salvaged job keeps the key it had before the damage.
        let (store_id, key_job) = job
            .origin
            .map_or((job.lease.store, id), |o| (o.store, o.job));
        let batch = Batch {
            stream,
            job: key_job,
            first: job.offset + start as u32,
            end: job.offset + end as u32,
            whole: job.offset == 0 && whole_job,
            payload,
            file: job.file(),
            store_id,
        };
        let result = tokio::select! {
            r = send_paced(rt, &batch, rt.replaying(stream)) => Some(r),
            _ = rt.give_up(stopping) => None,
        };
        let Some(result) = result else {
            tracing::warn!(
                stream,
                sink = rt.sink.name(),
                job = id,
                "stopping: request abandoned after the grace period; the job stays queued"
            );
            store.release(job.lease);
            return Next::Go;
        };
        let stats = &rt.stats;
        match result {
            Ok(body_bytes) => {
                rt.link.answered();
                stats.requests_ok.fetch_add(1, Relaxed);
                stats
                    .records_delivered
                    .fetch_add((end - start) as u64, Relaxed);
                stats.bytes_delivered.fetch_add(body_bytes, Relaxed);
                let taps = store.delivered_taps();
                if job.file().is_none() && taps.watches(stream) {
                    // The records, for a job sent as stored (a zstd frame), are read only while
                    // someone taps this stream's deliveries.
                    if opened.get().is_none()
                        && let Ok(r) = job.records()
                    {
                        let _ = opened.set(r);
                    }
                    if let Some(records) = opened.get() {
                        let list = listed.get_or_init(|| records.list());
                        let part = list.get(start..end).unwrap_or_default();
                        taps.appended(stream, part.iter().copied());
                    }
                }
                if end == n {
                    tracing::debug!(stream, job = id, records = end - start, "delivered");
                    acks.push(job.lease);
                    return Next::Go;
                }
                // A part: settled now, so neither a crash nor a later failure sends it again.
                let settled =
                    u32::try_from(end - start).expect("a job holds at most u32::MAX records");
                if let Err(e) = store
                    .settle_prefix(job.lease.clone(), settled, Settle::Delivered)
                    .await
                {
                    tracing::warn!(stream, job = id, error = %e, "part delivered, but recording it failed; the job stays queued");
                    store.release(job.lease);
                    return Next::Go;
                }
                start = end;
            }
            Err(DeliveryError::Unavailable(reason)) => {
                stats.requests_transport.fetch_add(1, Relaxed);
                stats.failed(&reason);
                store.release(job.lease);
                let failures = rt.link.transport_failed(&reason);
                tracing::debug!(
                    stream,
                    job = id,
                    failures,
                    reason,
                    "no answer; no attempt spent"
                );
                // While the link is still up, a short pause before the next try; once down, the
                // worker waits for the monitor instead.
                return Next::Pause(if rt.link.is_up() {
                    rt.link.pause_after(failures)
                } else {
                    Duration::ZERO
                });
            }
            Err(DeliveryError::TooLarge(reason)) => {
                rt.link.answered();
                stats.requests_too_large.fetch_add(1, Relaxed);
                stats.failed(&reason);
                if end - start > 1 {
                    chunk = (end - start).div_ceil(2);
                    tracing::warn!(
                        stream,
                        job = id,
                        records_per_request = chunk,
                        reason,
                        "the receiver refused the body as too large; sending the job in smaller parts"
                    );
                    continue;
                }
                if end == n {
                    // The last record of the job: the job itself goes to the dead letters.
                    let failure = Failure::Permanent { reason };
                    return record_failure(stream, rt, store, job, 1, failure).await;
                }
                let why =
                    "a single record is too large for the receiver; moved to the dead letters";
                if !dead_letter_alone(stream, rt, store, &job, start, reason, why).await {
                    store.release(job.lease);
                    return Next::Go;
                }
                start += 1;
            }
            Err(DeliveryError::Record { index, reason }) => {
                // Refused before anything was sent: no request to count, nothing of the link.
                let reason = format!("record {index} of the job {reason}");
                stats.failed(&reason);
                let at = index
                    .checked_sub(job.offset)
                    .map(|i| i as usize)
                    .filter(|i| (start..end).contains(i));
                match at {
                    // Not a record of this part (the sink's mistake): the rest of the job dies.
                    None => {
                        let failure = Failure::Permanent { reason };
                        return record_failure(stream, rt, store, job, n - start, failure).await;
                    }
                    // The records before it go first, as a part of their own.
                    Some(i) if i > start => refused = Some(i),
                    Some(_) if start + 1 == n => {
                        let failure = Failure::Permanent { reason };
                        return record_failure(stream, rt, store, job, 1, failure).await;
                    }
                    Some(_) => {
                        let why = "a record cannot be sent for what it is; moved to the dead letters alone, the rest of its job is delivered";
                        if !dead_letter_alone(stream, rt, store, &job, start, reason, why).await {
                            store.release(job.lease);
                            return Next::Go;
                        }
                        start += 1;
                    }
                }
            }
            Err(DeliveryError::Transient {
                reason,
                retry_after,
            }) => {
                rt.link.answered();
                stats.requests_retryable.fetch_add(1, Relaxed);
                stats.failed(&reason);
                let retry = rt.sink.config.retry;
                let delay = match retry_after {
                    Some(d) => d.min(RETRY_AFTER_MAX),
                    None => crate::backoff::jittered(job.attempts, retry.base, retry.cap),
                };
                let failure = Failure::Transient {
                    reason,
                    retry_at_ms: now_ms() + u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                    max_attempts: retry.max_attempts,
                };
                return record_failure(stream, rt, store, job, n - start, failure).await;
            }
            Err(DeliveryError::Permanent(reason)) => {
                rt.link.answered();
                stats.requests_rejected.fetch_add(1, Relaxed);
                stats.failed(&reason);
                let failure = Failure::Permanent { reason };
                return record_failure(stream, rt, store, job, n - start, failure).await;
            }
        }
    }
}

/// Moves the job's first stored record (`start`, its position in the job as taken) to the dead
/// letters as a job of its own with `reason`; the rest stays the job. `false`: that could not be
/// recorded (the caller releases the job, which stays queued whole).
async fn dead_letter_alone(
    stream: &str,
    rt: &SinkRuntime,
    store: &StoreHandle,
    job: &Job,
    start: usize,
    reason: String,
    why: &'static str,
) -> bool {
    let id = job.lease.id;
    tracing::error!(
        stream,
        job = id,
        record = job.offset + start as u32,
        reason,
        "{why}"
    );
    if let Err(e) = store
        .settle_prefix(job.lease.clone(), 1, Settle::Dead { reason })
        .await
    {
        tracing::warn!(stream, job = id, error = %e, "cannot dead-letter the record; the job stays queued");
        return false;
    }
    rt.stats.dead_lettered_jobs.fetch_add(1, Relaxed);
    rt.stats.dead_lettered_records.fetch_add(1, Relaxed);
    true
}

/// A job whose records cannot be read (its compressed area is damaged though its checksum held):
/// quarantined, counted, never sent.
async fn quarantine(stream: &str, store: &StoreHandle, job: Job, reason: String) -> Next {
    if let Err(e) = store.quarantine(job.lease.clone(), reason).await {
        tracing::warn!(stream, job = job.lease.id, error = %e, "cannot quarantine a damaged job; it stays queued");
        store.release(job.lease);
    }
    Next::Go
}

/// Builds the body, waits for the pacer (while `replaying`) and a request slot, and sends it;
/// returns the body's size.
async fn send_paced(
    rt: &SinkRuntime,
    batch: &Batch<'_>,
    replaying: &AtomicBool,
) -> Result<u64, DeliveryError> {
    // A file job is streamed from the spool (its size is what goes over the wire); records are
    // encoded (and compressed) into a body first.
    let body = match batch.file {
        Some(_) => None,
        None => Some(rt.sink.body(batch).await?),
    };
    let len = match (&body, batch.file) {
        (Some(b), _) => b.len() as u64,
        (None, Some(f)) => f.len,
        (None, None) => 0,
    };
    if let Some(p) = &rt.pacer
        && replaying.load(Relaxed)
    {
        pace(p, len).await;
    }
    let _permit = rt.in_flight.acquire().await;
    let started = Instant::now();
    let sent = match (body, batch.file) {
        (Some(body), _) => rt.sink.send(batch, body).await,
        (None, Some(file)) => rt.sink.send_file(batch, file).await,
        (None, None) => Ok(()),
    };
    rt.stats.request_duration.observe(started.elapsed());
    sent?;
    Ok(len)
}

/// Waits until the pacer admits a request of `bytes`.
async fn pace(p: &Mutex<Pacer>, bytes: u64) {
    loop {
        let wait = p
            .lock()
            .expect("never poisoned: no panics while held")
            .admit(bytes, Instant::now());
        match wait {
            None => return,
            Some(d) => tokio::time::sleep(d).await,
        }
    }
}

/// Records a failed attempt (`records` are what is left of the job) and logs where it went.
async fn record_failure(
    stream: &str,
    rt: &SinkRuntime,
    store: &StoreHandle,
    job: Job,
    records: usize,
    failure: Failure,
) -> Next {
    let id = job.lease.id;
    let reason = match &failure {
        Failure::Transient { reason, .. } | Failure::Permanent { reason } => reason.clone(),
    };
    let stats = &rt.stats;
    let lease = job.lease.clone();
    match store.fail(job.lease, failure).await {
        Ok(Failed::Retry { attempts, due_ms }) => {
            stats.attempts_failed.fetch_add(1, Relaxed);
            tracing::warn!(
                stream,
                sink = rt.sink.name(),
                job = id,
                attempts,
                retry_in_ms = due_ms.saturating_sub(now_ms()),
                error = %reason,
                "delivery failed; will retry"
            );
            return Next::Retry { due_ms };
        }
        Ok(Failed::Dead { attempts }) => {
            stats.attempts_failed.fetch_add(1, Relaxed);
            stats.dead_lettered_jobs.fetch_add(1, Relaxed);
            stats
                .dead_lettered_records
                .fetch_add(records as u64, Relaxed);
            tracing::error!(
                stream,
                sink = rt.sink.name(),
                job = id,
                attempts,
                records,
                error = %reason,
                "delivery failed for good; job moved to the dead letters"
            )
        }
        Err(e) => {
            tracing::warn!(stream, sink = rt.sink.name(), job = id, error = %e, "cannot record the failed delivery; the job stays queued");
            store.release(lease);
        }
    }
    Next::Go
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pacer_holds_the_average_rate_and_never_starves_a_large_request() {
        let t0 = Instant::now();
        let mut p = Pacer::new(1000);
        // A full bucket lets the first request through, even one larger than a second's worth.
        assert_eq!(p.admit(3000, t0), None);
        // Now 2000 bytes in debt: two seconds until the next may start.
        let wait = p.admit(10, t0).unwrap();
        assert!((wait.as_secs_f64() - 2.0).abs() < 1e-6, "{wait:?}");
        assert!(p.admit(10, t0 + Duration::from_millis(1999)).is_some());
        assert_eq!(p.admit(500, t0 + Duration::from_millis(2000)), None);
        // Over a long run the bytes admitted track the rate.
        let mut admitted = 0u64;
        let mut now = t0 + Duration::from_secs(3);
        let end = now + Duration::from_secs(100);
        while now < end {
            match p.admit(250, now) {
                None => admitted += 250,
                Some(d) => now += d,
            }
        }
        assert!((99_000..=101_500).contains(&admitted), "{admitted}");
    }
}
