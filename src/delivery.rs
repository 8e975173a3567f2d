//! Delivery workers: one per stream that has a sink. A worker takes the oldest due job from the store,
//! hands it to the sink, and acknowledges it (deleted) or fails it (retry at a backoff time from the
//! job's attempts, or dead letters when the failure is permanent or attempts run out). With nothing to
//! do it sleeps until the store signals new jobs, the earliest retry falls due, or colibri stops: an
//! idle worker does not poll. It does not decide what a failure means (the sink does) nor where jobs
//! live (the store). Started and stopped by `agent`.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::sink::{DeliveryError, SinkConfig};
use crate::store::{Failed, Failure, Job, now_ms, writer::StoreHandle};

/// Pause after the store itself failed (it reopens with its own backoff).
const STORE_ERROR_PAUSE: Duration = Duration::from_secs(1);

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
    while !stopping.is_cancelled() {
        let jobs = match store.take(&stream, 1).await {
            Ok(jobs) => jobs,
            Err(e) => {
                tracing::warn!(stream, error = %e, "cannot take jobs; trying again");
                tokio::select! {
                    _ = tokio::time::sleep(STORE_ERROR_PAUSE) => {}
                    _ = stopping.cancelled() => {}
                }
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
            deliver_one(&stream, &sink, &store, job).await;
        }
    }
    tracing::info!(stream, "delivery stopped");
}

async fn sleep_or_forever(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

async fn deliver_one(stream: &str, sink: &SinkConfig, store: &StoreHandle, job: Job) {
    let records = job.records.len();
    let lease = job.lease.clone();
    match sink.deliver(stream, &job).await {
        Ok(()) => {
            if let Err(e) = store.ack(lease).await {
                // Delivered but not deleted: it will be delivered again (at-least-once).
                tracing::warn!(stream, job = job.lease.id, error = %e, "delivered, but the acknowledgement failed");
            } else {
                tracing::debug!(stream, job = job.lease.id, records, "delivered");
            }
        }
        Err(err) => {
            let failure = match &err {
                DeliveryError::Transient(reason) => {
                    let delay =
                        crate::backoff::jittered(job.attempts, sink.retry.base, sink.retry.cap);
                    Failure::Transient {
                        reason: reason.clone(),
                        retry_at_ms: now_ms()
                            + u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                        max_attempts: sink.retry.max_attempts,
                    }
                }
                DeliveryError::Permanent(reason) => Failure::Permanent {
                    reason: reason.clone(),
                },
            };
            match store.fail(lease, failure).await {
                Ok(Failed::Retry { attempts, due_ms }) => tracing::warn!(
                    stream,
                    job = job.lease.id,
                    attempts,
                    retry_in_ms = due_ms.saturating_sub(now_ms()),
                    error = %err,
                    "delivery failed; will retry"
                ),
                Ok(Failed::Dead { attempts }) => tracing::error!(
                    stream,
                    job = job.lease.id,
                    attempts,
                    records,
                    error = %err,
                    "delivery failed for good; job moved to the dead letters"
                ),
                Err(e) => {
                    tracing::warn!(stream, job = job.lease.id, error = %e, "cannot record the failed delivery")
                }
            }
        }
    }
}
