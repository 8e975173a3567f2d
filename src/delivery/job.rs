//! One job through its sink: the requests that carry it (the whole job, or parts of it after a
//! 413 or around a record the sink refuses for what it is), each request's outcome turned into what
//! becomes of the job (acknowledged with the take, a part settled and the next sent, released for
//! an outage, a failed attempt, a record dead-lettered alone), and the job's records read from the
//! store at most once and only when a request needs them. It does not choose jobs, pace a drain
//! or know when the link is up: the workers in `delivery` do. Called by `delivery::run`.

use std::cell::OnceCell;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::{Next, RETRY_AFTER_MAX, SinkRuntime, StreamLanes, gate, pacer};
use crate::clock::now_ms;
use crate::sink::{Batch, DeliveryError, Payload};
use crate::store::writer::StoreHandle;
use crate::store::{Failed, Failure, Job, JobRecords, Lease, Settle};

/// Where a job's delivery stands.
struct Progress {
    /// The job's records (as taken).
    n: usize,
    /// Records before it are settled in the store: the stored job begins here.
    start: usize,
    /// Records per request at most: the whole job, halved after each 413.
    chunk: usize,
    /// A record the sink refused for what it is: the part before it goes first, alone.
    refused: Option<usize>,
}

impl Progress {
    /// The end of the next request's records.
    fn end(&self) -> usize {
        let before_refused = self.refused.filter(|&r| r > self.start).unwrap_or(self.n);
        (self.start + self.chunk).min(self.n).min(before_refused)
    }
}

/// What every step of one job's delivery works with: the stream, its sink's runtime, the store.
#[derive(Clone, Copy)]
struct Ctx<'a> {
    stream: &'a str,
    rt: &'a SinkRuntime,
    store: &'a StoreHandle,
}

/// What becomes of the job after one request.
enum Step {
    /// On to the next part.
    Go,
    /// Delivered (its last part): acknowledged with the take's other jobs.
    Ack,
    /// Back to the queue as it stands, and the worker goes on as said.
    Release(Next),
    /// A failed attempt for what is left of the job (`records`).
    Fail { records: usize, failure: Failure },
}

/// Delivers one job, in parts after a 413 or around a record the sink refuses.
pub(super) async fn deliver_job(
    stream: &str,
    rt: &SinkRuntime,
    store: &StoreHandle,
    job: Job,
    stopping: &CancellationToken,
    acks: &mut Vec<Lease>,
) -> Next {
    let cx = Ctx { stream, rt, store };
    let n = job.record_count();
    // A sink that sends zstd bodies takes a whole job stored as a zstd frame of lines as it is,
    // never decompressed; the records are read (decompressed) only when it cannot (or after a
    // 413, to send the job in parts).
    let stored = job.zstd_lines().filter(|_| rt.sink.sends_zstd_lines());
    let opened: OnceCell<JobRecords<'_>> = OnceCell::new();
    let listed: OnceCell<Vec<&[u8]>> = OnceCell::new();
    let mut at = Progress {
        n,
        start: 0,
        chunk: n.max(1),
        refused: None,
    };
    loop {
        if stopping.is_cancelled() {
            // Between parts of a split job: what is left stays queued.
            store.release(job.lease);
            return Next::Go;
        }
        let (start, end) = (at.start, at.end());
        let whole_job = start == 0 && end == n;
        let payload = match stored {
            Some(frame) if whole_job => Payload::ZstdLines(frame),
            _ => match records(&job, &opened, &listed, start, end) {
                Ok(p) => p,
                Err(e) => return quarantine(stream, store, job, e).await,
            },
        };
        let lanes = rt.lanes(stream);
        // A job moved here for being too old for another stream's sink is the past whatever its
        // age says against this stream's window.
        let moved = job.origin.as_ref().is_some_and(|o| o.stream.is_some());
        let replayed = moved || lanes.replay.is_backlog(job.created_ms, now_ms());
        let batch = batch(stream, &job, start, end, payload, replayed);
        let result = tokio::select! {
            r = send_paced(rt, &batch, lanes) => Some(r),
            _ = rt.give_up(stopping) => None,
        };
        let step = match result {
            None => {
                tracing::warn!(
                    stream,
                    sink = rt.sink.name(),
                    job = job.lease.id,
                    "stopping: request abandoned after the grace period; the job stays queued"
                );
                Step::Release(Next::Go)
            }
            Some(Ok(body_bytes)) => {
                tap_delivered(&batch, store, &job, &opened, &listed);
                delivered(cx, &job, &mut at, end, body_bytes).await
            }
            Some(Err(e)) => failed(cx, &job, &mut at, end, e).await,
        };
        match step {
            Step::Go => {}
            Step::Ack => {
                lanes.delivered(job.created_ms, replayed);
                tracing::debug!(
                    stream,
                    job = job.lease.id,
                    records = end - start,
                    "delivered"
                );
                acks.push(job.lease);
                return Next::Go;
            }
            Step::Release(next) => {
                store.release(job.lease);
                return next;
            }
            Step::Fail { records, failure } => {
                return record_failure(stream, rt, store, job, records, failure).await;
            }
        }
    }
}

/// Records `[start, end)` of the job as a payload: its lines as they are when that is the whole
/// job, else a slice each. Reads (decompresses) the records once; an error means the stored
/// frame is damaged.
fn records<'a>(
    job: &'a Job,
    opened: &'a OnceCell<JobRecords<'a>>,
    listed: &'a OnceCell<Vec<&'a [u8]>>,
    start: usize,
    end: usize,
) -> Result<Payload<'a>, String> {
    if opened.get().is_none() {
        let _ = opened.set(job.records().map_err(|e| e.to_string())?);
    }
    let records = opened.get().expect("set above");
    Ok(match records.lines() {
        Some(lines) if start == 0 && end == job.record_count() => Payload::Lines(lines),
        _ => Payload::Records(&listed.get_or_init(|| records.list())[start..end]),
    })
}

/// The request for records `[start, end)` of the job (positions as taken).
fn batch<'a>(
    stream: &'a str,
    job: &'a Job,
    start: usize,
    end: usize,
    payload: Payload<'a>,
    replayed: bool,
) -> Batch<'a> {
    // The store that handed the job out (the writer may have replaced its file since: the new
    // one reuses ids); a salvaged job keeps the key it had before the damage, a moved one the key
    // it had in the stream it was moved from.
    let (store_id, key_job, key_stream) = job
        .origin
        .as_ref()
        .map_or((job.lease.store, job.lease.id, stream), |o| {
            (o.store, o.job, o.stream.as_deref().unwrap_or(stream))
        });
    Batch {
        stream,
        key_stream,
        job: key_job,
        first: job.offset + start as u32,
        end: job.offset + end as u32,
        whole: job.offset == 0 && start == 0 && end == job.record_count(),
        payload,
        file: job.file(),
        store_id,
        replayed,
        group: None,
    }
}

/// The records of `batch`, just delivered, to whoever taps the stream's deliveries. For a job
/// sent as stored (a zstd frame) they are read only while someone does.
fn tap_delivered<'a>(
    batch: &Batch<'_>,
    store: &StoreHandle,
    job: &'a Job,
    opened: &'a OnceCell<JobRecords<'a>>,
    listed: &'a OnceCell<Vec<&'a [u8]>>,
) {
    let stream = batch.stream;
    // Positions as taken: the batch counts from the job as first appended.
    let (start, end) = (
        (batch.first - job.offset) as usize,
        (batch.end - job.offset) as usize,
    );
    let replayed = batch.replayed;
    let taps = store.delivered_taps();
    if job.file().is_some() || !taps.watches(stream) {
        return;
    }
    if opened.get().is_none()
        && let Ok(r) = job.records()
    {
        let _ = opened.set(r);
    }
    if let Some(records) = opened.get() {
        let list = listed.get_or_init(|| records.list());
        let part = list.get(start..end).unwrap_or_default();
        taps.delivered(stream, part.iter().copied(), replayed);
    }
}

/// Records `[at.start, end)` were delivered: the job is done, or the part is settled now (so
/// neither a crash nor a later failure sends it again) and the next follows.
async fn delivered(cx: Ctx<'_>, job: &Job, at: &mut Progress, end: usize, body_bytes: u64) -> Step {
    let Ctx { stream, rt, store } = cx;
    rt.link.answered();
    let stats = &rt.stats;
    stats.requests_ok.fetch_add(1, Relaxed);
    stats
        .records_delivered
        .fetch_add((end - at.start) as u64, Relaxed);
    stats.bytes_delivered.fetch_add(body_bytes, Relaxed);
    if end == at.n {
        return Step::Ack;
    }
    let settled = u32::try_from(end - at.start).expect("a job holds at most u32::MAX records");
    if let Err(e) = store
        .settle_prefix(job.lease.clone(), settled, Settle::Delivered)
        .await
    {
        tracing::warn!(stream, job = job.lease.id, error = %e, "part delivered, but recording it failed; the job stays queued");
        return Step::Release(Next::Go);
    }
    at.start = end;
    Step::Go
}

/// The request for records `[at.start, end)` failed: what that means for the job.
async fn failed(cx: Ctx<'_>, job: &Job, at: &mut Progress, end: usize, e: DeliveryError) -> Step {
    let Ctx { stream, rt, .. } = cx;
    let stats = &rt.stats;
    let left = at.n - at.start;
    match e {
        DeliveryError::Unavailable(reason) => {
            tracing::debug!(
                stream,
                job = job.lease.id,
                reason,
                "no answer; no attempt spent"
            );
            Step::Release(no_answer(rt, &reason))
        }
        DeliveryError::TooLarge(reason) => {
            rt.link.answered();
            stats.requests_too_large.fetch_add(1, Relaxed);
            stats.failed(&reason);
            too_large(cx, job, at, end, reason).await
        }
        DeliveryError::Record { index, reason } => {
            // Refused before anything was sent: no request to count, nothing of the link.
            let reason = format!("record {index} of the job {reason}");
            stats.failed(&reason);
            refused_record(cx, job, at, end, index, reason).await
        }
        DeliveryError::Transient {
            reason,
            retry_after,
        } => {
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
            Step::Fail {
                records: left,
                failure,
            }
        }
        DeliveryError::Permanent(reason) => {
            rt.link.answered();
            stats.requests_rejected.fetch_add(1, Relaxed);
            stats.failed(&reason);
            Step::Fail {
                records: left,
                failure: Failure::Permanent { reason },
            }
        }
    }
}

/// A request got no answer (`reason`): counted against the link, no attempt spent. While the link
/// is still up, a short pause before the next try; once down, the worker waits for the monitor.
pub(super) fn no_answer(rt: &SinkRuntime, reason: &str) -> Next {
    rt.stats.requests_transport.fetch_add(1, Relaxed);
    rt.stats.failed(reason);
    let failures = rt.link.transport_failed(reason);
    Next::Pause(if rt.link.is_up() {
        rt.link.pause_after(failures)
    } else {
        Duration::ZERO
    })
}

/// A 413 for records `[at.start, end)`: send half as many at a time, down to the one record,
/// which the receiver refuses for its size alone: it goes to the dead letters.
async fn too_large(cx: Ctx<'_>, job: &Job, at: &mut Progress, end: usize, reason: String) -> Step {
    let stream = cx.stream;
    if end - at.start > 1 {
        at.chunk = (end - at.start).div_ceil(2);
        tracing::warn!(
            stream,
            job = job.lease.id,
            records_per_request = at.chunk,
            reason,
            "the receiver refused the body as too large; sending the job in smaller parts"
        );
        return Step::Go;
    }
    let why = "a single record is too large for the receiver; moved to the dead letters";
    dead_letter_first(cx, job, at, reason, why).await
}

/// The sink cannot send record `index` (its position in the job as first appended) for what it
/// is: the records before it go first, then it is dead-lettered alone.
async fn refused_record(
    cx: Ctx<'_>,
    job: &Job,
    at: &mut Progress,
    end: usize,
    index: u32,
    reason: String,
) -> Step {
    let pos = index
        .checked_sub(job.offset)
        .map(|i| i as usize)
        .filter(|i| (at.start..end).contains(i));
    match pos {
        // Not a record of this request (the sink's mistake): the rest of the job dies.
        None => Step::Fail {
            records: at.n - at.start,
            failure: Failure::Permanent { reason },
        },
        Some(i) if i > at.start => {
            at.refused = Some(i);
            Step::Go
        }
        Some(_) => {
            let why = "a record cannot be sent for what it is; moved to the dead letters alone, the rest of its job is delivered";
            dead_letter_first(cx, job, at, reason, why).await
        }
    }
}

/// Moves the job's first stored record (`at.start`) to the dead letters as a job of its own with
/// `reason`, the rest staying the job; the job's last record is the job itself, dead-lettered as
/// a job.
async fn dead_letter_first(
    cx: Ctx<'_>,
    job: &Job,
    at: &mut Progress,
    reason: String,
    why: &'static str,
) -> Step {
    let Ctx { stream, rt, store } = cx;
    if at.start + 1 == at.n {
        return Step::Fail {
            records: 1,
            failure: Failure::Permanent { reason },
        };
    }
    let id = job.lease.id;
    let record = job.offset + at.start as u32;
    tracing::error!(stream, job = id, record, reason, "{why}");
    if let Err(e) = store
        .settle_prefix(job.lease.clone(), 1, Settle::Dead { reason })
        .await
    {
        tracing::warn!(stream, job = id, error = %e, "cannot dead-letter the record; the job stays queued");
        return Step::Release(Next::Go);
    }
    rt.stats.dead_lettered_jobs.fetch_add(1, Relaxed);
    rt.stats.dead_lettered_records.fetch_add(1, Relaxed);
    at.start += 1;
    Step::Go
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

/// Builds the body, waits for the pacer (while the stream replays) and a request slot, and sends
/// it; returns the body's size.
pub(super) async fn send_paced(
    rt: &SinkRuntime,
    batch: &Batch<'_>,
    lanes: &StreamLanes,
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
    // With priorities the slot comes first, in their order, and the pacer is waited for while
    // holding it, so the pacer's turns follow the priorities too; without, the pacer first, so a
    // request waiting for it holds no slot.
    let rank = gate::Rank {
        priority: lanes.replay.priority,
        min_share: lanes.replay.min_share,
    };
    let slot = match &rt.gate {
        Some(g) => Some(g.slot(rank, len, |p| rt.busy(p)).await),
        None => None,
    };
    if let Some(p) = &rt.pacer
        && lanes.replaying.load(Relaxed)
    {
        if lanes.replay.live_first && !batch.replayed {
            // The live lane goes first: it takes its bytes from the bucket without waiting, and
            // the backlog waits for what the link has left.
            pacer::charge(p, len);
        } else {
            pacer::pace(p, len).await;
        }
    }
    // Held, like the slot, until the answer.
    let _permit = match &slot {
        Some(_) => None,
        None => Some(rt.in_flight.acquire().await),
    };
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
