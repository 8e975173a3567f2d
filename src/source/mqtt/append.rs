//! The mqtt source's appender: messages from the session driver, gathered into one append per
//! stream (one commit each) at a time, and the acknowledgements of what each append settled
//! handed back to the driver in the order the messages came. Owns the outcome of an append
//! (stored, refused by a full `drop_newest` stream, waiting for room, too large, failed) and its
//! counters; does not touch the connection. Called by [`super::run`]; the driver makes the
//! messages.

use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use super::{MqttSourceConfig, MqttSourceStats};
use crate::store::writer::StoreHandle;
use crate::store::{AppendError, RecordBuf, StreamConfig};

/// How long one append may wait for room in a full `block` stream before it is asked again.
const APPEND_WAIT: Duration = Duration::from_secs(3600);
/// An append waiting this long is reported (once) as "acknowledgements paused".
const SLOW_APPEND: Duration = Duration::from_secs(5);
/// Waits between tries of an append that failed in the store.
const RETRY_BASE: Duration = Duration::from_millis(100);
const RETRY_CAP: Duration = Duration::from_secs(5);

/// The acknowledgement a message is owed: its packet id on the connection it came on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack {
    /// The driver's number for that connection: an ack for an older one is not sent.
    pub connection: u64,
    pub pkid: u16,
    /// 1: PUBACK; 2: PUBREC.
    pub qos: u8,
}

/// One message as the driver hands it over.
pub struct Msg {
    /// Index into the source's streams; `None`: nothing to store, only the ack (a message of no
    /// configured filter, acknowledged in its turn).
    pub stream: Option<usize>,
    pub record: Vec<u8>,
    /// `None` for QoS 0.
    pub ack: Option<Ack>,
    /// Its share of the budget, released when it is settled.
    pub _permit: Option<OwnedSemaphorePermit>,
}

/// colibri stops and the stream has no room: what is left is not acknowledged (the broker keeps
/// it for the next session).
struct GiveUp;

/// Appends what the driver sends until it stops sending, and hands back the acknowledgements.
/// Each message owed an acknowledgement takes a slot of `window` before its commit; the driver
/// gives the slot back once the acknowledgement is written (or its connection has ended), so no
/// more than the window is ever committed and not yet acknowledged, whatever the broker sends.
#[allow(
    clippy::too_many_arguments,
    reason = "the source's parts, each handed over once by `super::run`"
)]
pub async fn run(
    cfg: Arc<MqttSourceConfig>,
    stats: Arc<MqttSourceStats>,
    store: StoreHandle,
    streams: Vec<StreamConfig>,
    mut rx: mpsc::UnboundedReceiver<Msg>,
    acks: mpsc::UnboundedSender<Vec<Ack>>,
    window: Arc<Semaphore>,
    stopping: CancellationToken,
) {
    let (cfg, stats) = (&*cfg, &*stats);
    // One batch is what every stream would take in one append.
    let (most_records, most_bytes) = streams
        .iter()
        .map(|s| crate::store::AppendLimits::for_stream(s).per_append())
        .fold((usize::MAX, usize::MAX), |(r, b), (sr, sb)| {
            (r.min(sr), b.min(sb))
        });
    let mut paused = false;
    let mut held: Option<Msg> = None;
    loop {
        let Some(first) = (match held.take() {
            Some(m) => Some(m),
            None => rx.recv().await,
        }) else {
            break;
        };
        if first.ack.is_some() {
            // Waits for the acknowledgements the driver has yet to write.
            let Ok(slot) = window.acquire().await else {
                break;
            };
            slot.forget();
        }
        let mut bytes = first.record.len();
        let mut batch = vec![first];
        while batch.len() < most_records {
            let Ok(m) = rx.try_recv() else { break };
            if bytes + m.record.len() > most_bytes || (m.ack.is_some() && !take_slot(&window)) {
                held = Some(m);
                break;
            }
            bytes += m.record.len();
            batch.push(m);
        }
        let mut per_stream: Vec<RecordBuf> = vec![RecordBuf::new(); streams.len()];
        for m in &batch {
            if let Some(s) = m.stream {
                per_stream[s].push(&m.record);
            }
        }
        let mut give_up = false;
        for (i, records) in per_stream.into_iter().enumerate() {
            if records.is_empty() {
                continue;
            }
            let name = &streams[i].name;
            if append(cfg, stats, &store, name, records, &mut paused, &stopping)
                .await
                .is_err()
            {
                give_up = true;
                break;
            }
        }
        if give_up {
            // Nothing of this batch is acknowledged (a stream of it may have stored its part:
            // the broker sends those again, stored twice, never lost); its QoS 0 messages are
            // gone with this session.
            count_unstored(stats, batch);
            break;
        }
        let owed: Vec<Ack> = batch.iter().filter_map(|m| m.ack).collect();
        drop(batch);
        if !owed.is_empty() && acks.send(owed).is_err() {
            break;
        }
    }
    // What the driver handed over and no append took: QoS 1 and 2 messages are not
    // acknowledged (the broker sends them again); QoS 0 ones are lost, and counted.
    rx.close();
    count_unstored(
        stats,
        held.into_iter()
            .chain(std::iter::from_fn(|| rx.try_recv().ok())),
    );
}

/// Counts as lost the QoS 0 messages of `msgs` that were read and will never be stored: nobody
/// will send them again (QoS 1 and 2 ones the broker does, being unacknowledged).
pub fn count_unstored(stats: &MqttSourceStats, msgs: impl IntoIterator<Item = Msg>) {
    let lost = msgs
        .into_iter()
        .filter(|m| m.ack.is_none() && m.stream.is_some())
        .count();
    stats.records_lost.fetch_add(lost as u64, Relaxed);
}

/// A slot of the window for a message owed an acknowledgement, if one is free now.
fn take_slot(window: &Semaphore) -> bool {
    window.try_acquire().map(|slot| slot.forget()).is_ok()
}

/// Appends one batch to one stream, trying again while the stream is full (under `block`) or the
/// store fails; a batch too large for one append is split, down to the one record no stream can
/// hold (counted lost, and acknowledged: the broker would send it again and again).
async fn append(
    cfg: &MqttSourceConfig,
    stats: &MqttSourceStats,
    store: &StoreHandle,
    stream: &str,
    records: RecordBuf,
    paused: &mut bool,
    stopping: &CancellationToken,
) -> Result<(), GiveUp> {
    let mut parts = vec![Arc::new(records)];
    while let Some(records) = parts.pop() {
        let n = records.len() as u64;
        let mut attempt = 0u32;
        loop {
            let mut pending =
                pin!(store.append_shared(stream, Arc::clone(&records), None, Some(APPEND_WAIT)));
            let outcome = tokio::select! {
                o = &mut pending => o,
                _ = tokio::time::sleep(SLOW_APPEND), if !*paused => {
                    *paused = true;
                    tracing::warn!(source = %cfg.name, stream, "stream full (or the store slow): acknowledgements paused, the broker holds the rest (QoS 0 messages are dropped and counted)");
                    pending.await
                }
            };
            match outcome {
                Ok(_) => {
                    stats.records_appended.fetch_add(n, Relaxed);
                    if *paused {
                        tracing::info!(source = %cfg.name, stream, "stream has room again: acknowledgements resumed");
                        *paused = false;
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
                        tracing::error!(source = %cfg.name, stream, error = %e, "an mqtt message can never be stored in this stream: acknowledged and dropped");
                        stats.records_lost.fetch_add(1, Relaxed);
                    }
                    break;
                }
                Err(AppendError::Full { reason, .. }) if !stopping.is_cancelled() => {
                    if !*paused {
                        tracing::warn!(source = %cfg.name, stream, %reason, "stream full: acknowledgements paused, the broker holds the rest (QoS 0 messages are dropped and counted)");
                        *paused = true;
                    }
                }
                Err(AppendError::Full { .. } | AppendError::Stopping) => {
                    return Err(GiveUp);
                }
                Err(e) if stopping.is_cancelled() => {
                    tracing::warn!(source = %cfg.name, stream, error = %e, "append failed while colibri stops: left unacknowledged with the broker");
                    return Err(GiveUp);
                }
                Err(e) => {
                    // The commit's outcome is unknown: the same records are appended again, so a
                    // store error can repeat them (at least once, never lost).
                    if attempt == 0 {
                        tracing::warn!(source = %cfg.name, stream, error = %e, "append failed; retrying");
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
    Ok(())
}
