//! Delivery workers: one per stream that has a sink. A worker takes the oldest due job from the store,
//! hands it to the sink, and acknowledges it (deleted) or fails it (retry at a backoff time from the
//! job's attempts, or dead letters when the failure is permanent or attempts run out). When the sink
//! is unavailable (its link is down) the job goes back untouched and the worker pauses with jittered
//! exponential backoff, trying the oldest job again each time: outages never spend attempts, however
//! long they last, and each transition is logged once. With nothing to do it sleeps until the store
//! signals new jobs, the earliest retry falls due, or colibri stops: an idle worker does not poll. It
//! does not decide what a failure means (the sink does) nor where jobs live (the store). Started and
//! stopped by `agent`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::sink::{DeliveryError, SinkConfig};
use crate::store::{Failed, Failure, Job, now_ms, writer::StoreHandle};

/// Pause after the store itself failed (it reopens with its own backoff).
const STORE_ERROR_PAUSE: Duration = Duration::from_secs(1);
/// Pauses while a sink is unavailable: from `LINK_BASE`, doubling with jitter, at most `LINK_CAP`.
const LINK_BASE: Duration = Duration::from_secs(1);
const LINK_CAP: Duration = Duration::from_secs(60);

/// Set while the sink is unavailable: since when, and how many tries failed.
type Down = Option<(Instant, u32)>;

/// Runs until `stopping` is cancelled; a job being delivered at that moment is finished first.
pub async fn run(
    stream: String,
    sink: Arc<SinkConfig>,
    store: StoreHandle,
    stopping: CancellationToken,
) {
    let Some(fed) = store.fed(&stream) else {
        tracing::error!(stream, "no such stream in the store; delivery not started");
        return;
    };
    tracing::info!(stream, sink = %sink.describe(), "delivery started");
    let mut down: Down = None;
    while !stopping.is_cancelled() {
        let jobs = match store.take(&stream, 1).await {
            Ok(jobs) => jobs,
            Err(e) => {
                tracing::warn!(stream, error = %e, "cannot take jobs; trying again");
                pause(STORE_ERROR_PAUSE, &stopping).await;
                continue;
            }
        };
        if jobs.is_empty() {
            // Nothing due: wait for new jobs, the next retry, or the stop.
            let due = store.next_retry_due(&stream).await.ok().flatten();
            let wait = due.map(|d| Duration::from_millis(d.saturating_sub(now_ms())));
            tokio::select! {
                _ = fed.notified() => {}
                _ = sleep_or_forever(wait) => {}
                _ = stopping.cancelled() => {}
            }
            continue;
        }
        for job in jobs {
            if let Some(p) = deliver_one(&stream, &sink, &store, job, &mut down).await {
                pause(p, &stopping).await;
            }
        }
    }
    tracing::info!(stream, "delivery stopped");
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

/// Delivers one job; returns how long to pause when the sink is unavailable.
async fn deliver_one(
    stream: &str,
    sink: &SinkConfig,
    store: &StoreHandle,
    job: Job,
    down: &mut Down,
) -> Option<Duration> {
    let records = job.record_count();
    let id = job.lease.id;
    let result = sink.deliver(stream, &job).await;
    let err = match result {
        Err(DeliveryError::Unavailable(reason)) => {
            // The job goes back as it was: no attempt spent, still the oldest.
            store.release(job.lease);
            let (_, failures) = down.get_or_insert_with(|| {
                tracing::warn!(stream, sink = %sink.describe(), reason, "sink unavailable: deliveries paused, no attempts spent");
                (Instant::now(), 0)
            });
            *failures += 1;
            return Some(crate::backoff::jittered(*failures - 1, LINK_BASE, LINK_CAP));
        }
        other => other,
    };
    if let Some((since, _)) = down.take() {
        let down_for_ms = u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX);
        tracing::info!(stream, sink = %sink.describe(), down_for_ms, "sink available again: deliveries resumed");
    }
    let failure = match err {
        Ok(()) => {
            match store.ack(job.lease).await {
                // Delivered but not deleted: it will be delivered again (at-least-once).
                Err(e) => {
                    tracing::warn!(stream, job = id, error = %e, "delivered, but the acknowledgement failed")
                }
                Ok(()) => tracing::debug!(stream, job = id, records, "delivered"),
            }
            return None;
        }
        Err(DeliveryError::Unavailable(_)) => unreachable!("returned above"),
        Err(DeliveryError::Transient(reason)) => {
            let delay = crate::backoff::jittered(job.attempts, sink.retry.base, sink.retry.cap);
            Failure::Transient {
                reason,
                retry_at_ms: now_ms() + u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                max_attempts: sink.retry.max_attempts,
            }
        }
        Err(DeliveryError::Permanent(reason)) => Failure::Permanent { reason },
    };
    let reason = match &failure {
        Failure::Transient { reason, .. } | Failure::Permanent { reason } => reason.clone(),
    };
    match store.fail(job.lease, failure).await {
        Ok(Failed::Retry { attempts, due_ms }) => tracing::warn!(
            stream,
            job = id,
            attempts,
            retry_in_ms = due_ms.saturating_sub(now_ms()),
            error = %reason,
            "delivery failed; will retry"
        ),
        Ok(Failed::Dead { attempts }) => tracing::error!(
            stream,
            job = id,
            attempts,
            records,
            error = %reason,
            "delivery failed for good; job moved to the dead letters"
        ),
        Err(e) => tracing::warn!(stream, job = id, error = %e, "cannot record the failed delivery"),
    }
    None
}
