//! The link monitor: one per sink, it decides whether the sink's destination is reachable. The link is
//! `up` until `down_after` consecutive transport failures (no answer at all) are reported by the
//! delivery workers; then it is `down`, every worker of the sink waits (no request, no attempt
//! spent), and the monitor probes with jittered exponential backoff from `backoff_base` to
//! `backoff_cap` until a probe succeeds and the link is `up` again. Each transition is logged once:
//! WARN when down (with the reason and what is queued), INFO when up (with how long it was down). It
//! does not deliver, retry or pace anything: `delivery` reports to it and waits on it; `agent` starts
//! one monitor task per sink.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::units::fmt_duration;
use crate::sink::{LinkSpec, Sink};
use crate::store::writer::StoreHandle;

/// The state of one sink's link, shared by its workers and its monitor.
pub struct Link {
    sink: String,
    spec: LinkSpec,
    up: watch::Sender<bool>,
    /// Consecutive transport failures since the last answer.
    failures: AtomicU32,
    /// Since when and why the link is down.
    down: Mutex<Option<(Instant, String)>>,
    /// Up/down transitions so far (for the metrics endpoint).
    pub transitions: AtomicU64,
}

impl Link {
    pub fn new(sink: &str, spec: LinkSpec) -> Link {
        Link {
            sink: sink.to_string(),
            spec,
            up: watch::Sender::new(true),
            failures: AtomicU32::new(0),
            down: Mutex::new(None),
            transitions: AtomicU64::new(0),
        }
    }

    pub fn is_up(&self) -> bool {
        *self.up.borrow()
    }

    /// Returns once the link is up (at once when it is).
    pub async fn wait_up(&self) {
        let mut rx = self.up.subscribe();
        // The sender lives as long as `self`, so the wait cannot end with an error while borrowed.
        let _ = rx.wait_for(|up| *up).await;
    }

    async fn wait_down(&self) {
        let mut rx = self.up.subscribe();
        let _ = rx.wait_for(|up| !*up).await;
    }

    /// The destination answered (whatever it said): the failure streak ends.
    pub fn answered(&self) {
        self.failures.store(0, Ordering::Relaxed);
    }

    /// A request got no answer. Returns the length of the failure streak; at `down_after` the link
    /// goes down.
    pub fn transport_failed(&self, reason: &str) -> u32 {
        let n = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= self.spec.down_after {
            self.set_down(reason);
        }
        n
    }

    fn set_down(&self, reason: &str) {
        let changed = self.up.send_if_modified(|up| std::mem::replace(up, false));
        if changed {
            *self
                .down
                .lock()
                .expect("never poisoned: no panics while held") =
                Some((Instant::now(), reason.to_string()));
            self.transitions.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn set_up(&self) -> Option<(Instant, String)> {
        self.failures.store(0, Ordering::Relaxed);
        let was = self
            .down
            .lock()
            .expect("never poisoned: no panics while held")
            .take();
        if self.up.send_if_modified(|up| !std::mem::replace(up, true)) {
            self.transitions.fetch_add(1, Ordering::Relaxed);
        }
        was
    }

    /// The pause before trying again after `failures` consecutive transport failures while the link
    /// is still up (fewer than `down_after`).
    pub fn pause_after(&self, failures: u32) -> Duration {
        crate::backoff::jittered(
            failures.saturating_sub(1),
            self.spec.backoff_base,
            self.spec.backoff_cap,
        )
    }
}

/// Watches one sink's link until `stopping`: on every turn down, logs it, probes with backoff until
/// the destination answers, and turns the link up. `streams` are the streams delivered to this sink
/// (for the queued amounts in the log).
pub async fn monitor(
    link: std::sync::Arc<Link>,
    sink: std::sync::Arc<Sink>,
    store: StoreHandle,
    streams: Vec<String>,
    stopping: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = link.wait_down() => {}
            _ = stopping.cancelled() => return,
        }
        let reason = link
            .down
            .lock()
            .expect("never poisoned: no panics while held")
            .as_ref()
            .map(|(_, r)| r.clone())
            .unwrap_or_default();
        let (records, bytes) = queued(&store, &streams).await;
        tracing::warn!(
            sink = link.sink,
            reason,
            queued_records = records,
            queued_bytes = bytes,
            "link down: deliveries paused, no attempts spent; probing until it answers"
        );
        let mut tries = 0u32;
        loop {
            let wait =
                crate::backoff::jittered(tries, link.spec.backoff_base, link.spec.backoff_cap);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stopping.cancelled() => return,
            }
            match sink.probe().await {
                Ok(()) => break,
                Err(e) => {
                    tries = tries.saturating_add(1);
                    tracing::debug!(sink = link.sink, tries, error = %e, "probe failed");
                }
            }
        }
        let down_for = link
            .set_up()
            .map_or(Duration::ZERO, |(since, _)| since.elapsed());
        let (records, bytes) = queued(&store, &streams).await;
        tracing::info!(
            sink = link.sink,
            down_for = %fmt_duration(down_for),
            down_for_ms = u64::try_from(down_for.as_millis()).unwrap_or(u64::MAX),
            queued_records = records,
            queued_bytes = bytes,
            "link up: deliveries resumed, backlog replayed oldest first"
        );
    }
}

/// Records and bytes waiting in `streams` (ready and retry).
async fn queued(store: &StoreHandle, streams: &[String]) -> (u64, u64) {
    let Ok(snap) = store.snapshot().await else {
        return (0, 0);
    };
    snap.streams
        .iter()
        .filter(|(cfg, _)| streams.contains(&cfg.name))
        .fold((0, 0), |(r, b), (_, c)| {
            (r + c.pending_records(), b + c.ready_bytes + c.retry_bytes)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(down_after: u32) -> Link {
        Link::new(
            "s",
            LinkSpec {
                down_after,
                ..LinkSpec::default()
            },
        )
    }

    #[test]
    fn down_after_consecutive_failures_only() {
        let l = link(3);
        assert_eq!(l.transport_failed("refused"), 1);
        assert_eq!(l.transport_failed("refused"), 2);
        l.answered();
        assert_eq!(l.transport_failed("refused"), 1);
        assert!(l.is_up());
        l.transport_failed("refused");
        l.transport_failed("refused");
        assert!(!l.is_up());
        assert_eq!(l.transitions.load(Ordering::Relaxed), 1);
        // More failures while down are not new transitions.
        l.transport_failed("refused");
        assert_eq!(l.transitions.load(Ordering::Relaxed), 1);
        let (_, reason) = l.set_up().unwrap();
        assert_eq!(reason, "refused");
        assert!(l.is_up());
        assert_eq!(l.transitions.load(Ordering::Relaxed), 2);
        assert_eq!(l.transport_failed("x"), 1, "the streak starts over");
    }

    #[tokio::test(start_paused = true)]
    async fn workers_wait_while_down_and_resume_when_up() {
        let l = std::sync::Arc::new(link(1));
        l.wait_up().await;
        l.transport_failed("refused");
        let waiter = tokio::spawn({
            let l = std::sync::Arc::clone(&l);
            async move { l.wait_up().await }
        });
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert!(!waiter.is_finished(), "a worker must not run while down");
        l.set_up();
        tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .unwrap()
            .unwrap();
    }
}
