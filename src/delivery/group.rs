//! Several small jobs of a stream in one request: after an outage a backlog of single-record
//! appends (ingest posts, a slow source) would go out a request each, and on a metered or
//! high-latency link each request costs headers, a round trip and TLS records. A sink whose key
//! is a header ([`crate::sink::Sink::sends_groups`]: `http`, `prometheus_remote_write`) gets the
//! take's consecutive whole jobs of lines, all live or all backlog, as one body up to the
//! stream's `batch` limits (what one of its jobs may hold), acknowledged together with the take.
//! The request's key names the group exactly: `<store>:<stream>:<first job>+<jobs>:<digest of
//! the job ids>`, so the same jobs sent again (after a crash, before their acknowledgement was
//! committed) carry the same key, and any other set another. When the group's request fails
//! for anything but an outage, its jobs go again one by one, each with its own key, so that a
//! 413, a refused record or a dead letter is found and settled job by job as without groups.
//! Called by the workers in `delivery`; one job alone goes through `job`.

use std::iter::Peekable;
use std::sync::atomic::Ordering::Relaxed;

use super::job::{deliver_job, no_answer, send_paced};
use super::{Next, SinkRuntime, StreamLanes};
use crate::clock::now_ms;
use crate::sink::{Batch, DeliveryError, Payload};
use crate::store::writer::StoreHandle;
use crate::store::{Job, Lease};

/// Jobs one take hands a worker of a sink that sends groups (with one request at a time):
/// small jobs fill a request; the take's byte bound keeps large ones few.
pub(super) const TAKE_GROUPABLE: usize = 256;

/// Whether `job` may share a request: lines, whole (nothing of it settled before: its key is
/// the job's), and its own (not salvaged or moved: its key names another store or stream).
fn groupable(job: &Job) -> bool {
    job.is_lines() && job.offset == 0 && job.origin.is_none()
}

/// The jobs that go with `first`: the take's next jobs while they may share its request (same
/// lane, within the stream's `batch` limits). `first` alone when none may.
pub(super) fn gather(
    first: Job,
    rest: &mut Peekable<impl Iterator<Item = Job>>,
    lanes: &StreamLanes,
) -> Vec<Job> {
    let mut group = vec![first];
    if !groupable(&group[0]) {
        return group;
    }
    let now = now_ms();
    let lane = lanes.replay.is_backlog(group[0].created_ms, now);
    let (mut records, mut bytes) = (group[0].record_count(), group[0].plain_len());
    while let Some(next) = rest.peek() {
        let fits = records + next.record_count() <= lanes.batch.max_records as usize
            && bytes + next.plain_len() <= lanes.batch.max_bytes;
        if !(groupable(next) && fits && lanes.replay.is_backlog(next.created_ms, now) == lane) {
            break;
        }
        records += next.record_count();
        bytes += next.plain_len();
        group.push(rest.next().expect("peeked"));
    }
    group
}

/// The key of a group: its store, stream, first job and size, and a digest of its job ids
/// (FNV-1a), so that two sets never share one.
fn group_key(stream: &str, jobs: &[Job]) -> String {
    let ids: Vec<u8> = jobs.iter().flat_map(|j| j.lease.id.to_le_bytes()).collect();
    let digest = crate::files::fnv1a(&ids);
    format!(
        "{:016x}:{stream}:{}+{}:{digest:016x}",
        jobs[0].lease.store,
        jobs[0].lease.id,
        jobs.len()
    )
}

/// Delivers `jobs` (two or more, from [`gather`]) in one request; their leases join `acks`.
pub(super) async fn deliver_group(
    stream: &str,
    rt: &SinkRuntime,
    store: &StoreHandle,
    jobs: Vec<Job>,
    stopping: &tokio_util::sync::CancellationToken,
    acks: &mut Vec<Lease>,
) -> Next {
    let Some(body) = lines_of(&jobs) else {
        // A stored frame that does not read: found and quarantined job by job.
        return one_by_one(stream, rt, store, jobs, stopping, acks).await;
    };
    let lanes = rt.lanes(stream);
    let replayed = lanes.replay.is_backlog(jobs[0].created_ms, now_ms());
    let key = group_key(stream, &jobs);
    let records = jobs.iter().map(Job::record_count).sum::<usize>();
    let batch = Batch {
        stream,
        key_stream: stream,
        job: jobs[0].lease.id,
        first: 0,
        end: u32::try_from(records).unwrap_or(u32::MAX),
        whole: true,
        payload: Payload::Lines(&body),
        file: None,
        store_id: jobs[0].lease.store,
        replayed,
        group: Some(&key),
    };
    let result = tokio::select! {
        r = send_paced(rt, &batch, lanes) => Some(r),
        _ = rt.give_up(stopping) => None,
    };
    match result {
        Some(Ok(body_bytes)) => {
            rt.link.answered();
            let stats = &rt.stats;
            stats.requests_ok.fetch_add(1, Relaxed);
            stats.records_delivered.fetch_add(records as u64, Relaxed);
            stats.bytes_delivered.fetch_add(body_bytes, Relaxed);
            let taps = store.delivered_taps();
            if taps.watches(stream) {
                taps.delivered(
                    stream,
                    body.split_inclusive(|b| *b == b'\n').map(trim_nl),
                    replayed,
                );
            }
            for j in &jobs {
                lanes.delivered(j.created_ms, replayed);
            }
            tracing::debug!(
                stream,
                jobs = jobs.len(),
                records,
                key,
                "delivered as one request"
            );
            acks.extend(jobs.into_iter().map(|j| j.lease));
            Next::Go
        }
        // The stop: the jobs keep their place.
        None => {
            tracing::warn!(
                stream,
                sink = rt.sink.name(),
                jobs = jobs.len(),
                "stopping: request abandoned after the grace period; its jobs stay queued"
            );
            release(store, jobs);
            Next::Go
        }
        // No answer: the jobs keep their place, no attempt spent, as for one job.
        Some(Err(DeliveryError::Unavailable(reason))) => {
            tracing::debug!(
                stream,
                jobs = jobs.len(),
                reason,
                "no answer; no attempt spent"
            );
            release(store, jobs);
            no_answer(rt, &reason)
        }
        Some(Err(e)) => {
            // An answer (or a record refused before sending): what it refused is found job by
            // job, each request counted as it goes.
            let counted = match &e {
                DeliveryError::TooLarge(_) => Some(&rt.stats.requests_too_large),
                DeliveryError::Transient { .. } => Some(&rt.stats.requests_retryable),
                DeliveryError::Permanent(_) => Some(&rt.stats.requests_rejected),
                DeliveryError::Record { .. } | DeliveryError::Unavailable(_) => None,
            };
            if let Some(c) = counted {
                rt.link.answered();
                c.fetch_add(1, Relaxed);
            }
            tracing::debug!(stream, jobs = jobs.len(), error = %e, "a request of several jobs failed; sending them one by one");
            one_by_one(stream, rt, store, jobs, stopping, acks).await
        }
    }
}

/// The jobs' records, concatenated lines; `None` when one does not read.
fn lines_of(jobs: &[Job]) -> Option<Vec<u8>> {
    let mut body = Vec::with_capacity(jobs.iter().map(|j| j.plain_len() as usize).sum());
    for j in jobs {
        body.extend_from_slice(j.records().ok()?.lines()?);
    }
    Some(body)
}

fn trim_nl(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\n").unwrap_or(line)
}

/// Each job through `job` as without groups, until one says to stop; the rest are released.
async fn one_by_one(
    stream: &str,
    rt: &SinkRuntime,
    store: &StoreHandle,
    jobs: Vec<Job>,
    stopping: &tokio_util::sync::CancellationToken,
    acks: &mut Vec<Lease>,
) -> Next {
    let mut jobs = jobs.into_iter();
    while let Some(job) = jobs.next() {
        let next = deliver_job(stream, rt, store, job, stopping, acks).await;
        if !matches!(next, Next::Go) {
            release(store, jobs);
            return next;
        }
    }
    Next::Go
}

/// The jobs go back to the queue, keeping their place.
fn release(store: &StoreHandle, jobs: impl IntoIterator<Item = Job>) {
    for j in jobs {
        store.release(j.lease);
    }
}
