//! The syslog source's appender: chunks of records from the listeners, gathered into one append
//! (one commit) at a time within what the stream takes in one append, and the memory budget that
//! bounds what is read and not yet committed. Owns the outcome of each append (stored, refused by
//! a full `drop_newest` stream, waiting for room, too large, failed) and its counters; does not
//! read sockets. Called by [`super::run`]; the listeners make the chunks.

use std::collections::VecDeque;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use super::{SyslogConfig, SyslogStats};
use crate::store::writer::StoreHandle;
use crate::store::{AppendError, RecordBuf, StreamConfig};

/// Bytes of records read and not yet committed, all listeners of a source together: a reader
/// waits for its share before handing a chunk over (UDP drops it), so a flood into a full `block`
/// stream holds this much at most, however many connections feed it.
pub const BUDGET_BYTES: usize = 8 << 20;
/// How long one append may wait for room in a full `block` stream before it is asked again.
const APPEND_WAIT: Duration = Duration::from_secs(3600);
/// An append waiting this long is reported (once) as "reading paused".
const SLOW_APPEND: Duration = Duration::from_secs(5);
/// Waits between tries of an append that failed in the store.
const RETRY_BASE: Duration = Duration::from_millis(100);
const RETRY_CAP: Duration = Duration::from_secs(5);

/// Records read by a listener, with their share of the budget (released when they are stored or
/// given up).
pub struct Chunk {
    pub records: RecordBuf,
    permit: Option<OwnedSemaphorePermit>,
}

impl Chunk {
    /// `records` holding `permit` (their bytes of the budget, or as much of it as there is).
    pub fn new(records: RecordBuf, permit: Option<OwnedSemaphorePermit>) -> Chunk {
        Chunk { records, permit }
    }

    fn absorb(&mut self, other: Chunk) {
        self.records.extend_from(&other.records);
        match (&mut self.permit, other.permit) {
            (Some(p), Some(o)) => p.merge(o),
            (None, o) => self.permit = o,
            (Some(_), None) => {}
        }
    }

    /// The first `n` records split off (`n` < len), each part with its share of the permit.
    fn split_front(mut self, n: usize) -> (Chunk, Chunk) {
        let head = RecordBuf::from_iter(self.records.iter().take(n));
        let tail = RecordBuf::from_iter(self.records.iter().skip(n));
        let head_permit = self.permit.as_mut().and_then(|p| {
            let share = head.record_bytes().min(p.num_permits().saturating_sub(1));
            p.split(share)
        });
        (Chunk::new(head, head_permit), Chunk::new(tail, self.permit))
    }
}

/// The permits a chunk of `bytes` needs (a chunk larger than the budget takes all of it).
pub fn permits_for(bytes: usize) -> u32 {
    u32::try_from(bytes.clamp(1, BUDGET_BYTES)).expect("the budget fits u32")
}

/// The budget, shared by a source's listeners.
pub fn budget() -> Arc<Semaphore> {
    Arc::new(Semaphore::new(BUDGET_BYTES))
}

/// What one append may carry: the stream cuts an append into jobs of its `batch` size and refuses
/// one with more jobs than it holds (`crate::store::AppendLimits`, as a tail source).
#[derive(Debug, Clone, Copy)]
struct Limits {
    records: usize,
    bytes: usize,
}

impl Limits {
    fn of(stream: &StreamConfig) -> Limits {
        let (records, bytes) = crate::store::AppendLimits::for_stream(stream).per_append();
        Limits { records, bytes }
    }

    /// How many of `c`'s first records fit (at least one).
    fn fitting(&self, c: &RecordBuf) -> usize {
        let mut bytes = 0;
        for (i, r) in c.iter().enumerate() {
            bytes += r.len();
            if i >= self.records || (i > 0 && bytes > self.bytes) {
                return i;
            }
        }
        c.len()
    }
}

/// How one append ended.
enum Outcome {
    /// Stored, refused by a `drop_newest` stream, or given up (counted).
    Done,
    /// More than the stream can ever take in one append: try it in halves.
    Split(Chunk),
    /// colibri stops and the stream has no room: what is left is not appended.
    GiveUp,
}

/// Appends what the listeners send until every listener has ended and all they sent is stored.
/// It runs as a task of its own: a source stopped by a reload while its `block` stream is full
/// ends its listeners at once (so the new one can bind), and this task goes on appending what was
/// read when the stream has room. At colibri's stop the store's writer answers waiting appends at
/// once, and what could not be stored is counted lost.
pub async fn run(
    cfg: Arc<SyslogConfig>,
    stats: Arc<SyslogStats>,
    store: StoreHandle,
    stream: StreamConfig,
    mut rx: mpsc::UnboundedReceiver<Chunk>,
    stopping: CancellationToken,
) {
    let (cfg, stats, stopping) = (&*cfg, &*stats, &stopping);
    let limits = Limits::of(&stream);
    let mut pending: VecDeque<Chunk> = VecDeque::new();
    let mut paused = false;
    let mut give_up = false;
    let lost_before = stats.records_lost.load(Relaxed);
    loop {
        let Some(first) = (match pending.pop_front() {
            Some(c) => Some(c),
            None => rx.recv().await,
        }) else {
            break;
        };
        if give_up {
            lose(stats, first.records.len() as u64);
            continue;
        }
        let n = limits.fitting(&first.records);
        let mut batch = if n < first.records.len() {
            let (head, tail) = first.split_front(n);
            pending.push_front(tail);
            head
        } else {
            first
        };
        // Gather what else is waiting, while it fits.
        while pending.is_empty() {
            let Ok(more) = rx.try_recv() else {
                break;
            };
            if batch.records.len() + more.records.len() <= limits.records
                && batch.records.record_bytes() + more.records.record_bytes() <= limits.bytes
            {
                batch.absorb(more);
            } else {
                pending.push_back(more);
            }
        }
        match append(cfg, stats, &store, batch, &mut paused, stopping).await {
            Outcome::Done => {}
            Outcome::Split(c) => {
                let half = c.records.len() / 2;
                let (head, tail) = c.split_front(half);
                pending.push_front(tail);
                pending.push_front(head);
            }
            Outcome::GiveUp => {
                give_up = true;
                for c in pending.drain(..) {
                    lose(stats, c.records.len() as u64);
                }
            }
        }
    }
    let lost = stats.records_lost.load(Relaxed) - lost_before;
    if lost > 0 {
        tracing::warn!(source = %cfg.name, stream = %cfg.stream, records = lost, "colibri stopped while the stream had no room: syslog records read and not stored are lost");
    }
}

/// Records read and never to be stored (colibri stops while the stream has no room): counted
/// here, logged once when the appender ends.
fn lose(stats: &SyslogStats, n: u64) {
    stats.records_lost.fetch_add(n, Relaxed);
}

/// Appends one batch, trying again while the stream is full (under `block`) or the store fails.
async fn append(
    cfg: &SyslogConfig,
    stats: &SyslogStats,
    store: &StoreHandle,
    batch: Chunk,
    paused: &mut bool,
    stopping: &CancellationToken,
) -> Outcome {
    let records = Arc::new(batch.records);
    let n = records.len() as u64;
    let mut attempt = 0u32;
    loop {
        let mut pending =
            pin!(store.append_shared(&cfg.stream, Arc::clone(&records), None, Some(APPEND_WAIT)));
        let outcome = tokio::select! {
            o = &mut pending => o,
            _ = tokio::time::sleep(SLOW_APPEND), if !*paused => {
                *paused = true;
                tracing::warn!(source = %cfg.name, stream = %cfg.stream, "stream full (or the store slow): reading paused (TCP senders wait, UDP messages are dropped and counted)");
                pending.await
            }
        };
        match outcome {
            Ok(_) => {
                stats.records_appended.fetch_add(n, Relaxed);
                if *paused {
                    tracing::info!(source = %cfg.name, stream = %cfg.stream, "stream has room again: reading resumed");
                    *paused = false;
                }
                return Outcome::Done;
            }
            Err(AppendError::Refused { records, .. }) => {
                stats.records_dropped.fetch_add(records, Relaxed);
                return Outcome::Done;
            }
            Err(e @ AppendError::TooLarge { .. }) => {
                if n > 1 {
                    return Outcome::Split(Chunk::new(
                        Arc::try_unwrap(records).unwrap_or_else(|r| (*r).clone()),
                        batch.permit,
                    ));
                }
                tracing::error!(source = %cfg.name, stream = %cfg.stream, error = %e, "a syslog record can never be stored in this stream: dropped");
                stats.records_lost.fetch_add(1, Relaxed);
                return Outcome::Done;
            }
            Err(AppendError::Full { reason, .. }) if !stopping.is_cancelled() => {
                if !*paused {
                    tracing::warn!(source = %cfg.name, stream = %cfg.stream, %reason, "stream full: reading paused (TCP senders wait, UDP messages are dropped and counted)");
                    *paused = true;
                }
            }
            Err(AppendError::Full { .. } | AppendError::Stopping) => {
                lose(stats, n);
                return Outcome::GiveUp;
            }
            Err(e) if stopping.is_cancelled() => {
                tracing::error!(source = %cfg.name, stream = %cfg.stream, error = %e, "append failed while colibri stops");
                lose(stats, n);
                return Outcome::GiveUp;
            }
            Err(e) => {
                // The commit's outcome is unknown: the same records are appended again, so a
                // store error can repeat them (at least once, never lost).
                if attempt == 0 {
                    tracing::warn!(source = %cfg.name, stream = %cfg.stream, error = %e, "append failed; retrying");
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

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(records: &[&str], permits: Option<&Arc<Semaphore>>) -> Chunk {
        let r = RecordBuf::from(records.to_vec());
        let p = permits.map(|s| {
            Arc::clone(s)
                .try_acquire_many_owned(permits_for(r.record_bytes()))
                .unwrap()
        });
        Chunk::new(r, p)
    }

    #[test]
    fn limits_count_records_and_bytes_and_always_let_one_through() {
        let l = Limits {
            records: 3,
            bytes: 10,
        };
        assert_eq!(l.fitting(&RecordBuf::from(vec!["a", "b", "c", "d"])), 3);
        assert_eq!(l.fitting(&RecordBuf::from(vec!["aaaaaa", "bbbbbb"])), 1);
        assert_eq!(l.fitting(&RecordBuf::from(vec!["a very long record"])), 1);
        assert_eq!(l.fitting(&RecordBuf::from(vec!["a", "b"])), 2);
    }

    #[test]
    fn the_budget_follows_the_records_through_splits_and_merges() {
        let sem = budget();
        let a = chunk(&["0123456789", "abcdefghij", "ABCDEFGHIJ"], Some(&sem));
        assert_eq!(sem.available_permits(), BUDGET_BYTES - 30);
        let (head, tail) = a.split_front(1);
        assert_eq!(head.records.len(), 1);
        assert_eq!(tail.records.len(), 2);
        assert_eq!(head.permit.as_ref().map(|p| p.num_permits()), Some(10));
        assert_eq!(tail.permit.as_ref().map(|p| p.num_permits()), Some(20));
        drop(head);
        assert_eq!(sem.available_permits(), BUDGET_BYTES - 20);
        let mut t = tail;
        t.absorb(chunk(&["xy"], Some(&sem)));
        assert_eq!(t.records.len(), 3);
        assert_eq!(t.permit.as_ref().map(|p| p.num_permits()), Some(22));
        drop(t);
        assert_eq!(sem.available_permits(), BUDGET_BYTES);
    }
}
