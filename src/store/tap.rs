//! What was appended to a stream lately, or delivered from it, kept while someone watches it
//! (`colibri tap`, `--delivered`): one `Taps` for each of the two, and in it per watched stream a
//! ring of the last records (at most [`RING_RECORDS`] and [`RING_BYTES`]), each
//! with a sequence number, read by viewers from where they left off. A viewer that falls further
//! behind than the ring holds is told how many records it missed (counted in
//! [`Taps::skipped`]); producers never wait for a viewer. Nobody watching costs one atomic load
//! per append or delivery. A stream is watched for [`WATCH_FOR`] after its last read. Fed by
//! `StoreHandle`'s appends after they are durable and by `delivery` once a sink acknowledged a
//! request; read by the admin endpoint.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// Records a ring holds at most.
pub const RING_RECORDS: usize = 4096;
/// Bytes of records a ring holds at most.
pub const RING_BYTES: usize = 8 << 20;
/// How long a stream stays watched after a viewer's last read.
pub const WATCH_FOR: Duration = Duration::from_secs(30);

#[derive(Debug, Default)]
pub struct Taps {
    rings: Mutex<HashMap<String, Ring>>,
    /// Any stream watched: appends look no further when not.
    watching: AtomicBool,
    appended: Notify,
    /// Records viewers missed because they read too slowly.
    pub skipped: AtomicU64,
}

/// One record a viewer reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tapped {
    pub record: Vec<u8>,
    /// In the delivered taps: sent from the backlog, with the replayed marker.
    pub replayed: bool,
}

#[derive(Debug)]
struct Ring {
    records: VecDeque<Tapped>,
    bytes: usize,
    /// The sequence number the next record gets; the oldest held is `next - records.len()`.
    next: u64,
    watched_until: Instant,
}

/// What a viewer read.
#[derive(Debug, Default)]
pub struct TapRead {
    pub records: Vec<Tapped>,
    /// Where to read from next time.
    pub next: u64,
    /// Records appended since `after` that the ring no longer held.
    pub skipped: u64,
}

impl Taps {
    /// Whether any stream is watched now (then appends are handed to [`Taps::appended`]).
    pub fn watching(&self) -> bool {
        self.watching.load(Relaxed)
    }

    /// Whether `stream` is watched now: for a feeder that must do work to have the records (the
    /// delivery reads a job's records again). One atomic load while nobody taps anything.
    pub fn watches(&self, stream: &str) -> bool {
        self.watching.load(Relaxed)
            && self
                .lock()
                .get(stream)
                .is_some_and(|r| r.watched_until > Instant::now())
    }

    /// Records durably appended to `stream`.
    pub fn appended<'r>(&self, stream: &str, records: impl IntoIterator<Item = &'r [u8]>) {
        self.tapped(stream, records, false);
    }

    /// Records delivered from `stream`, from its backlog (`replayed`) or its live lane.
    pub fn delivered<'r>(
        &self,
        stream: &str,
        records: impl IntoIterator<Item = &'r [u8]>,
        replayed: bool,
    ) {
        self.tapped(stream, records, replayed);
    }

    fn tapped<'r>(
        &self,
        stream: &str,
        records: impl IntoIterator<Item = &'r [u8]>,
        replayed: bool,
    ) {
        if !self.watching.load(Relaxed) {
            return;
        }
        let mut rings = self.lock();
        let now = Instant::now();
        rings.retain(|_, r| r.watched_until > now);
        self.watching.store(!rings.is_empty(), Relaxed);
        let Some(ring) = rings.get_mut(stream) else {
            return;
        };
        for r in records {
            ring.records.push_back(Tapped {
                record: r.to_vec(),
                replayed,
            });
            ring.bytes += r.len();
            ring.next += 1;
            while ring.records.len() > RING_RECORDS || ring.bytes > RING_BYTES {
                let old = ring.records.pop_front().expect("over a bound: not empty");
                ring.bytes -= old.record.len();
            }
        }
        drop(rings);
        self.appended.notify_waiters();
    }

    /// Up to `limit` records of `stream` after sequence number `after` (`None`: from now on),
    /// waiting up to `wait` for the first one. Watches the stream for [`WATCH_FOR`] more.
    pub async fn read(
        &self,
        stream: &str,
        after: Option<u64>,
        limit: usize,
        wait: Duration,
    ) -> TapRead {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Registered before the look, so an append between the two wakes this read.
            let appended = self.appended.notified();
            let read = self.take(stream, after, limit);
            if !read.records.is_empty() || read.skipped > 0 {
                return read;
            }
            if tokio::time::timeout_at(deadline, appended).await.is_err() {
                return read;
            }
        }
    }

    fn take(&self, stream: &str, after: Option<u64>, limit: usize) -> TapRead {
        let mut rings = self.lock();
        let ring = rings.entry(stream.to_string()).or_insert_with(|| Ring {
            records: VecDeque::new(),
            bytes: 0,
            next: 0,
            watched_until: Instant::now(),
        });
        ring.watched_until = Instant::now() + WATCH_FOR;
        self.watching.store(true, Relaxed);
        let oldest = ring.next - ring.records.len() as u64;
        let from = after.map_or(ring.next, |a| a.min(ring.next));
        let skipped = oldest.saturating_sub(from);
        let start = from.max(oldest);
        let records: Vec<Tapped> = ring
            .records
            .iter()
            .skip((start - oldest) as usize)
            .take(limit)
            .cloned()
            .collect();
        if skipped > 0 {
            self.skipped.fetch_add(skipped, Relaxed);
        }
        TapRead {
            next: start + records.len() as u64,
            records,
            skipped,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Ring>> {
        self.rings
            .lock()
            .expect("never poisoned: no panics while held")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buf<'a>(items: &'a [&'a str]) -> impl Iterator<Item = &'a [u8]> {
        items.iter().map(|i| i.as_bytes())
    }

    fn texts(r: &TapRead) -> Vec<&[u8]> {
        r.records.iter().map(|t| t.record.as_slice()).collect()
    }

    #[tokio::test]
    async fn nobody_watching_keeps_nothing_and_a_slow_viewer_is_told_what_it_missed() {
        let taps = Taps::default();
        taps.appended("s", buf(&["before"]));
        let first = taps.read("s", None, 10, Duration::ZERO).await;
        assert!(first.records.is_empty() && first.skipped == 0, "{first:?}");
        taps.appended("s", buf(&["a", "b"]));
        taps.appended("other", buf(&["x"]));
        let r = taps.read("s", Some(first.next), 10, Duration::ZERO).await;
        assert_eq!(texts(&r), [b"a", b"b"]);
        let many: Vec<String> = (0..RING_RECORDS + 5).map(|i| i.to_string()).collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        taps.appended("s", buf(&refs));
        let slow = taps.read("s", Some(r.next), 3, Duration::ZERO).await;
        assert_eq!(slow.skipped, 5);
        assert_eq!(texts(&slow), [b"5", b"6", b"7"]);
        assert_eq!(taps.skipped.load(Relaxed), 5);
    }

    #[tokio::test]
    async fn a_read_waits_for_the_next_append() {
        let taps = std::sync::Arc::new(Taps::default());
        let start = taps.read("s", None, 10, Duration::ZERO).await.next;
        let t = std::sync::Arc::clone(&taps);
        let reader =
            tokio::spawn(
                async move { t.read("s", Some(start), 10, Duration::from_secs(10)).await },
            );
        tokio::task::yield_now().await;
        taps.appended("s", buf(&["late"]));
        let r = reader.await.unwrap();
        assert_eq!(texts(&r), [b"late"]);
    }

    #[tokio::test]
    async fn a_delivery_says_whether_it_was_replayed() {
        let taps = Taps::default();
        let start = taps.read("s", None, 10, Duration::ZERO).await.next;
        taps.delivered("s", buf(&["old"]), true);
        taps.delivered("s", buf(&["new"]), false);
        let r = taps.read("s", Some(start), 10, Duration::ZERO).await;
        let got: Vec<bool> = r.records.iter().map(|t| t.replayed).collect();
        assert_eq!(got, [true, false]);
    }
}
