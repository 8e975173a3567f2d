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
//! Started and stopped by `agent`. This file holds the workers and the sink's runtime; one job's
//! requests and outcomes are `job`'s, the replay pacing `pacer`'s.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::clock::now_ms;
use crate::link::Link;
use crate::paused::{Paused, Why};
use crate::sink::Sink;
use crate::store::writer::{Snapshot, StoreHandle};
use crate::store::{BatchConfig, Replay};
use job::deliver_job;
use pacer::Pacer;

mod gate;
mod group;
mod job;
mod pacer;

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

crate::counters::counters! {
    /// Delivery counters of one sink, for the metrics endpoint and the summary at stop; a sink
    /// restarted by a reload keeps them.
    pub struct SinkStats, logged as "delivery summary" by sink
        with { link_up: bool, link_transitions: u64, replay_backlog: u64 }
    {
        /// Requests answered with 2xx.
        requests_ok => ("colibri_sink_requests_total" [result = "ok"], "Requests by result: ok (2xx), transport (no answer; no attempt spent), retryable (5xx/408/429), too_large (413), rejected (other 4xx)."),
        /// Requests that got no answer (refused, reset, timed out, TLS): no attempt spent.
        requests_transport => ("colibri_sink_requests_total" [result = "transport"]),
        /// Requests answered 5xx, 408 or 429: an attempt spent.
        requests_retryable => ("colibri_sink_requests_total" [result = "retryable"]),
        /// Requests answered 413: split.
        requests_too_large => ("colibri_sink_requests_total" [result = "too_large"]),
        /// Requests answered with another 4xx: dead-lettered.
        requests_rejected => ("colibri_sink_requests_total" [result = "rejected"]),
        /// Failed attempts that count against `max_attempts`.
        attempts_failed => ("colibri_sink_failed_attempts_total", "Failed attempts that count against retry.max_attempts."),
        dead_lettered_jobs,
        dead_lettered_records => ("colibri_sink_dead_lettered_records_total", "Records the sink's failures sent to the dead letters."),
        records_delivered => ("colibri_sink_delivered_records_total", "Records delivered."),
        /// Request body bytes delivered (as sent: after compression).
        bytes_delivered => ("colibri_sink_delivered_bytes_total", "Request body bytes delivered (after compression)."),
    }
    extra {
        /// Requests from the first byte sent to the answer (or the failure), whatever the outcome.
        pub request_duration: crate::metrics::Histogram =
            crate::metrics::Histogram::new(crate::metrics::REQUEST_BUCKETS),
        /// Link up/down transitions of earlier runtimes of this sink (before a reload restarted it).
        pub transitions_before: AtomicU64,
        /// The last request that failed: when (Unix ms) and why (no answer, or what the receiver
        /// said). Taken only on a failure, so a sink that delivers never locks it.
        pub last_error: std::sync::Mutex<Option<(u64, String)>>,
    }
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

/// What the workers of one stream of a sink share.
struct StreamLanes {
    /// The stream's order and live window.
    replay: Replay,
    /// What one of its jobs may hold: what a request of several of its jobs may hold too.
    batch: BatchConfig,
    /// Set after a link comes back (and at start) until a worker finds the stream's queue
    /// empty: its backlog is being replayed, under `replay_rate`.
    replaying: AtomicBool,
    /// From append to delivery, in ms, of the last job delivered from each lane: live (younger
    /// than the live window when sent), backlog. 0 before the first.
    latency_ms: [AtomicU64; 2],
}

/// A sink at run time: shared by its workers and its link monitor.
pub struct SinkRuntime {
    pub sink: Arc<Sink>,
    pub link: Arc<Link>,
    pub stats: Arc<SinkStats>,
    /// The streams delivered to this sink.
    pub streams: Vec<String>,
    /// Per stream (same order): what its workers share.
    lanes: Vec<StreamLanes>,
    pacer: Option<Mutex<Pacer>>,
    /// Requests in flight, all streams of the sink together.
    in_flight: Semaphore,
    /// Instead of `in_flight` when the sink's streams have different priorities.
    gate: Option<gate::Gate>,
    /// How long requests in progress may go on once colibri is stopping.
    grace: Duration,
    /// Set at the first look after the stop: when every request still going is abandoned.
    give_up_at: std::sync::OnceLock<tokio::time::Instant>,
    /// Streams an operator paused: their workers take nothing.
    paused: Arc<Paused>,
}

impl SinkRuntime {
    /// `streams` are the sink's streams with their replay order; `stats` carries the counters of
    /// the sink's previous runtime across a reload (or starts fresh).
    pub fn new(
        sink: Arc<Sink>,
        streams: Vec<(String, Replay, BatchConfig)>,
        grace: Duration,
        stats: Arc<SinkStats>,
        paused: Arc<Paused>,
    ) -> SinkRuntime {
        // A trial must outlast a request that is slow to fail, or the link would be declared up
        // while the trial's request is still on its way to a timeout.
        let trial_quiet = sink
            .config
            .timeout
            .saturating_mul(2)
            .max(Duration::from_secs(30));
        let link = Arc::new(Link::new(
            sink.name(),
            sink.config.link.clone(),
            trial_quiet,
        ));
        let first = streams.first().map(|(_, r, _)| r.priority);
        let ranked = streams.iter().any(|(_, r, _)| Some(r.priority) != first);
        SinkRuntime {
            pacer: sink.config.replay_rate.map(|r| Mutex::new(Pacer::new(r))),
            in_flight: Semaphore::new(sink.config.concurrency),
            gate: ranked.then(|| gate::Gate::new(sink.config.concurrency)),
            link,
            sink,
            stats,
            lanes: streams
                .iter()
                .map(|(_, replay, batch)| StreamLanes {
                    replay: *replay,
                    batch: *batch,
                    replaying: AtomicBool::new(true),
                    latency_ms: Default::default(),
                })
                .collect(),
            streams: streams.into_iter().map(|(name, _, _)| name).collect(),
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
                    .is_some_and(|i| self.lanes[i].replaying.load(Relaxed))
            })
            .map(|(_, c)| c.pending_records())
            .sum()
    }

    /// Per stream: the latency of the last job delivered from the live lane and from the
    /// backlog, in ms (0: none yet).
    pub fn latencies(&self) -> impl Iterator<Item = (&str, [u64; 2])> {
        self.streams.iter().zip(&self.lanes).map(|(s, l)| {
            let [live, backlog] = &l.latency_ms;
            (s.as_str(), [live.load(Relaxed), backlog.load(Relaxed)])
        })
    }

    /// Whether a stream of priority `p` still has a backlog to replay.
    fn busy(&self, p: u8) -> bool {
        self.lanes
            .iter()
            .any(|l| l.replay.priority == p && l.replaying.load(Relaxed))
    }

    fn lanes(&self, stream: &str) -> &StreamLanes {
        let i = self
            .streams
            .iter()
            .position(|s| s == stream)
            .expect("workers run only for the sink's own streams");
        &self.lanes[i]
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
    let strict = rt.sink.config.concurrency == 1;
    let take = match (strict, rt.sink.sends_groups()) {
        (true, true) => group::TAKE_GROUPABLE,
        (true, false) => TAKE_SEQUENTIAL,
        (false, _) => 1,
    };
    let replaying = &rt.lanes(&stream).replaying;
    let mut hold = if strict {
        store.next_retry_due(&stream).await.ok().flatten()
    } else {
        None
    };
    tracing::debug!(stream, sink = %rt.sink.describe(), "delivery worker started");
    while !stopping.is_cancelled() {
        if let Some(why) = rt.paused.why(&stream) {
            match why {
                Why::Operator => tracing::info!(stream, "delivery paused by the operator"),
                Why::Clock => tracing::info!(
                    stream,
                    "delivery held until the system clock is synchronised"
                ),
            }
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
        let w = Worker {
            stream: &stream,
            rt: &rt,
            store: &store,
            stopping: &stopping,
            fed: &fed,
            strict,
        };
        let (pause_for, retry) = w.deliver_take(jobs).await;
        hold = retry;
        if let Some(p) = pause_for {
            pause(p, &stopping).await;
        }
    }
    tracing::debug!(stream, "delivery worker stopped");
}

/// What a worker works with while it delivers one take.
struct Worker<'a> {
    stream: &'a str,
    rt: &'a SinkRuntime,
    store: &'a StoreHandle,
    stopping: &'a CancellationToken,
    fed: &'a tokio::sync::Notify,
    strict: bool,
}

impl Worker<'_> {
    /// Delivers the jobs of one take in order and acknowledges what was delivered in one commit;
    /// returns how long to pause after it, and (in strict order) the retry that holds the rest.
    async fn deliver_take(&self, jobs: Vec<crate::store::Job>) -> (Option<Duration>, Option<u64>) {
        let Worker {
            stream,
            rt,
            store,
            stopping,
            fed,
            strict,
        } = *self;
        let lanes = rt.lanes(stream);
        let (mut pause_for, mut hold) = (None, None);
        let mut acks = Vec::new();
        let mut jobs = jobs.into_iter().peekable();
        let mut first = true;
        while let Some(job) = jobs.next() {
            if stopping.is_cancelled() || !rt.link.is_up() || rt.paused.is(stream) {
                store.release(job.lease);
                continue;
            }
            // The take itself chose its lane (and hands out a single backlog job while live ones
            // wait): its first job always goes, so the backlog keeps its share.
            let yields = !std::mem::take(&mut first) && lanes.yields_to_live(&job, fed);
            let next = if yields {
                // New jobs came while this take's backlog was being sent: the rest of the take
                // goes back (keeping its place) and the live lane is taken next.
                store.release(job.lease);
                Next::Pause(Duration::ZERO)
            } else if rt.sink.sends_groups() {
                let mut group = group::gather(job, &mut jobs, lanes);
                if group.len() == 1 {
                    let job = group.pop().expect("one job");
                    deliver_job(stream, rt, store, job, stopping, &mut acks).await
                } else {
                    group::deliver_group(stream, rt, store, group, stopping, &mut acks).await
                }
            } else {
                deliver_job(stream, rt, store, job, stopping, &mut acks).await
            };
            match next {
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
        (pause_for, hold)
    }
}

impl StreamLanes {
    /// A job created at `created_ms` was delivered (`replayed`: from the backlog).
    fn delivered(&self, created_ms: u64, replayed: bool) {
        let latency = now_ms().saturating_sub(created_ms);
        self.latency_ms[usize::from(replayed)].store(latency, Relaxed);
    }

    /// A `live_first` stream's job of the backlog, about to be sent, gives way when jobs were
    /// appended since the take (they are live): taking the signal here means the worker takes
    /// again at once, which finds them.
    fn yields_to_live(&self, job: &crate::store::Job, fed: &tokio::sync::Notify) -> bool {
        self.replay.live_first && self.replay.is_backlog(job.created_ms, now_ms()) && appended(fed)
    }
}

/// Whether `fed` was signalled (new jobs committed) since it was last waited on; takes the signal.
fn appended(fed: &tokio::sync::Notify) -> bool {
    let signal = std::pin::pin!(fed.notified());
    signal.enable()
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
    /// The sink did not answer, or a backlog job gave way to live ones: the jobs taken with this
    /// one go back, and the worker pauses (or takes again at once).
    Pause(Duration),
}
