//! The opcua source's appender: the session's batches (a notification message's records, or a
//! poll's), gathered into one append (one commit) at a time, and the acknowledgements of the
//! messages it committed handed back to the session, which sends them with its next Publish.
//! Owns the outcome of an append (stored, refused by a full `drop_newest` stream, waiting for
//! room, too large, failed) and its counters; does not touch the connection. Runs until the
//! session drops its sender, so what was read before a stop is still stored; an append that
//! cannot be made at the stop (the stream full) is not acknowledged, so the server sends it
//! again to colibri's next start (a polled value, never acknowledged, is counted lost). Called by
//! [`super::run`].

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use opcua_types::SubscriptionAcknowledgement;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{OpcuaSourceConfig, OpcuaSourceStats};
use crate::store::writer::StoreHandle;
use crate::store::{AppendError, RecordBuf};

/// How long one append may wait for room in a full `block` stream before it is asked again.
const APPEND_WAIT: Duration = Duration::from_secs(3600);
const RETRY_BASE: Duration = Duration::from_millis(100);
const RETRY_CAP: Duration = Duration::from_secs(5);
/// What the session hands over: a message's records and the acknowledgement owed once they
/// are committed (`None` for polled values).
pub struct Batch {
    pub records: Vec<Vec<u8>>,
    pub ack: Option<SubscriptionAcknowledgement>,
}

/// Appends what the session sends until it stops sending, and hands back the acknowledgements
/// of what each append committed. `(most_records, most_bytes)`: what the stream takes in one
/// append (a message larger is appended in parts).
pub async fn run(
    cfg: Arc<OpcuaSourceConfig>,
    stats: Arc<OpcuaSourceStats>,
    store: StoreHandle,
    (most_records, most_bytes): (usize, usize),
    mut rx: mpsc::Receiver<Batch>,
    acks: mpsc::UnboundedSender<SubscriptionAcknowledgement>,
    stopping: CancellationToken,
) {
    let mut warned = false;
    let mut held = None;
    loop {
        let next = match held.take() {
            Some(b) => Some(b),
            None => rx.recv().await,
        };
        let Some(first) = next else { break };
        let mut records = RecordBuf::new();
        let mut bytes = 0;
        let mut owed = Vec::new();
        let mut unacked = 0u64;
        let mut next = Some(first);
        while let Some(b) = next.take() {
            bytes += b.records.iter().map(Vec::len).sum::<usize>();
            for r in &b.records {
                records.push(r);
            }
            match b.ack {
                Some(a) => owed.push(a),
                None => unacked += b.records.len() as u64,
            }
            if let Ok(b) = rx.try_recv() {
                let more: usize = b.records.iter().map(Vec::len).sum();
                if records.len() + b.records.len() > most_records || bytes + more > most_bytes {
                    held = Some(b);
                } else {
                    next = Some(b);
                }
            }
        }
        if !records.is_empty() {
            match append(&cfg, &stats, &store, records, &mut warned, &stopping).await {
                Done::Stored => {}
                Done::Left => {
                    // Not acknowledged: the server sends them again to the next session
                    // (polled values are gone).
                    stats.records_lost.fetch_add(unacked, Relaxed);
                    continue;
                }
            }
        }
        for a in owed {
            // When the session has ended, the next one takes the subscription over and is
            // sent these again (stored twice, never lost).
            let _ = acks.send(a);
        }
    }
}

/// What became of an append.
enum Done {
    /// Committed, or settled by the stream's policy (refused by a full `drop_newest` stream, or
    /// a record larger than a job may be, counted): acknowledged.
    Stored,
    /// Not stored because colibri stops: left unacknowledged.
    Left,
}

/// Appends one batch, trying again while the stream is full (under `block`) or the store fails;
/// a batch too large for one append is split, down to the one record no stream can hold.
async fn append(
    cfg: &OpcuaSourceConfig,
    stats: &OpcuaSourceStats,
    store: &StoreHandle,
    records: RecordBuf,
    warned: &mut bool,
    stopping: &CancellationToken,
) -> Done {
    let mut parts = vec![Arc::new(records)];
    while let Some(records) = parts.pop() {
        let n = records.len() as u64;
        let mut attempt = 0u32;
        loop {
            let outcome = store
                .append_shared(&cfg.stream, Arc::clone(&records), None, Some(APPEND_WAIT))
                .await;
            match outcome {
                Ok(_) => {
                    stats.records_appended.fetch_add(n, Relaxed);
                    if *warned {
                        tracing::info!(source = %cfg.name, stream = %cfg.stream, "stream takes records again");
                        *warned = false;
                    }
                    break;
                }
                Err(AppendError::Refused { records, .. }) => {
                    stats.records_dropped.fetch_add(records, Relaxed);
                    break;
                }
                Err(e @ AppendError::TooLarge { .. }) => {
                    if n > 1 {
                        let half = records.len() / 2;
                        // Pushed tail first: the head is appended first.
                        parts.push(Arc::new(records.iter().skip(half).collect()));
                        parts.push(Arc::new(records.iter().take(half).collect()));
                    } else {
                        tracing::error!(source = %cfg.name, stream = %cfg.stream, error = %e, "an opcua record can never be stored in this stream: dropped");
                        stats.records_lost.fetch_add(1, Relaxed);
                    }
                    break;
                }
                Err(AppendError::Full { .. } | AppendError::Stopping)
                    if stopping.is_cancelled() =>
                {
                    return Done::Left;
                }
                Err(AppendError::Stopping) => return Done::Left,
                Err(e) if stopping.is_cancelled() => {
                    tracing::warn!(source = %cfg.name, stream = %cfg.stream, error = %e, "append failed while colibri stops: left unacknowledged with the server");
                    return Done::Left;
                }
                Err(e) => {
                    // Full (under `block`, after the wait) or a store error: the same records
                    // are asked for again; nothing more is read meanwhile (the server holds it).
                    if !*warned {
                        tracing::warn!(source = %cfg.name, stream = %cfg.stream, error = %e, "append failed; retrying, the server holds what changes meanwhile");
                        *warned = true;
                    }
                    let pause = crate::backoff::jittered(attempt, RETRY_BASE, RETRY_CAP);
                    attempt = attempt.saturating_add(1);
                    tokio::select! {
                        _ = stopping.cancelled() => {}
                        _ = tokio::time::sleep(pause) => {}
                    }
                }
            }
        }
    }
    Done::Stored
}
