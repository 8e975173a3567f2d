//! The link monitor: one per sink, it decides whether the sink's destination is reachable. The link is
//! `up` until `down_after` consecutive transport failures (no answer at all) are reported by the
//! delivery workers; then it is `down`, every worker of the sink waits (no request, no attempt
//! spent), and the monitor probes with jittered exponential backoff from `backoff_base` to
//! `backoff_cap`. A successful probe only opens a *trial*: workers send again, and the first answer
//! confirms the link `up`; a request without an answer during the trial closes it at once and the
//! probing goes on where its backoff was. So a fault above the probe's reach (a TCP probe cannot see
//! a TLS or a timeout problem) is one long outage with a growing probe interval, not a flapping link.
//! Each outage is logged once: WARN when down (with the reason and what is queued), INFO when
//! confirmed up (with how long it was down). It does not deliver, retry or pace anything: `delivery`
//! reports to it and waits on it; `agent` starts one monitor task per sink.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::sink::{LinkConfig, Sink};
use crate::store::writer::StoreHandle;
use crate::units::fmt_duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Up,
    /// A probe succeeded; requests go out, and the first answer confirms the link.
    Trial,
    Down,
}

/// The state of one sink's link, shared by its workers and its monitor.
pub struct Link {
    sink: String,
    config: LinkConfig,
    state: watch::Sender<State>,
    /// Consecutive transport failures since the last answer.
    failures: AtomicU32,
    /// Since when and why the link is down.
    down: Mutex<Option<(Instant, String)>>,
    /// Up/down transitions so far (for the metrics endpoint).
    pub transitions: AtomicU64,
    /// How long a trial may pass without an answer or a failure before the probe alone is trusted
    /// (the queue may have emptied meanwhile, e.g. by TTL, and nothing would ever confirm it).
    trial_quiet: Duration,
}

impl Link {
    pub fn new(sink: &str, config: LinkConfig, trial_quiet: Duration) -> Link {
        Link {
            sink: sink.to_string(),
            config,
            state: watch::Sender::new(State::Up),
            failures: AtomicU32::new(0),
            down: Mutex::new(None),
            transitions: AtomicU64::new(0),
            trial_quiet,
        }
    }

    /// Whether workers may send (up, or on trial).
    pub fn is_up(&self) -> bool {
        *self.state.borrow() != State::Down
    }

    /// Returns once workers may send (at once when they may).
    pub async fn wait_up(&self) {
        self.wait_for(|s| s != State::Down).await;
    }

    async fn wait_for(&self, f: impl Fn(State) -> bool) {
        let mut rx = self.state.subscribe();
        // The sender lives as long as `self`, so the wait cannot end with an error while borrowed.
        let _ = rx.wait_for(|s| f(*s)).await;
    }

    /// The destination answered (whatever it said): the failure streak ends, a trial succeeds.
    pub fn answered(&self) {
        self.failures.store(0, Ordering::Relaxed);
        if *self.state.borrow() == State::Trial {
            self.state.send_if_modified(|s| {
                let trial = *s == State::Trial;
                if trial {
                    *s = State::Up;
                }
                trial
            });
        }
    }

    /// A request got no answer. Returns the length of the failure streak; at `down_after` the link
    /// goes down, and on trial at once.
    pub fn transport_failed(&self, reason: &str) -> u32 {
        let n = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        let changed = self.state.send_if_modified(|s| match *s {
            State::Trial => {
                *s = State::Down;
                true
            }
            State::Up if n >= self.config.down_after => {
                *s = State::Down;
                true
            }
            _ => false,
        });
        if changed {
            let mut down = self
                .down
                .lock()
                .expect("never poisoned: no panics while held");
            match down.as_mut() {
                // A failed trial: the same outage goes on.
                Some((_, r)) => *r = reason.to_string(),
                None => {
                    *down = Some((Instant::now(), reason.to_string()));
                    self.transitions.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        n
    }

    /// A probe succeeded: workers may try again.
    fn open_trial(&self) {
        self.failures.store(0, Ordering::Relaxed);
        self.state.send_replace(State::Trial);
    }

    /// The outage is over; returns since when and why the link was down.
    fn confirm_up(&self) -> Option<(Instant, String)> {
        self.state.send_replace(State::Up);
        let was = self
            .down
            .lock()
            .expect("never poisoned: no panics while held")
            .take();
        if was.is_some() {
            self.transitions.fetch_add(1, Ordering::Relaxed);
        }
        was
    }

    /// The pause before trying again after `failures` consecutive transport failures while the link
    /// is still up (fewer than `down_after`).
    pub fn pause_after(&self, failures: u32) -> Duration {
        crate::backoff::jittered(
            failures.saturating_sub(1),
            self.config.backoff_base,
            self.config.backoff_cap,
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
            _ = link.wait_for(|s| s == State::Down) => {}
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
                crate::backoff::jittered(tries, link.config.backoff_base, link.config.backoff_cap);
            tries = tries.saturating_add(1);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stopping.cancelled() => return,
            }
            let probed = tokio::select! {
                r = sink.probe() => r,
                _ = stopping.cancelled() => return,
            };
            if let Err(e) = probed {
                tracing::debug!(sink = link.sink, tries, error = %e, "probe failed");
                continue;
            }
            link.open_trial();
            tokio::select! {
                // A failure that lands with the quiet timer still means down.
                biased;
                _ = link.wait_for(|s| s == State::Up) => break,
                _ = link.wait_for(|s| s == State::Down) => {
                    tracing::debug!(sink = link.sink, tries, "the probe passed but requests still get no answer");
                }
                _ = stopping.cancelled() => return,
                _ = tokio::time::sleep(link.trial_quiet) => break,
            }
        }
        let down_for = link
            .confirm_up()
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
            LinkConfig {
                down_after,
                ..LinkConfig::default()
            },
            Duration::from_secs(30),
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
        // A probe passes; the trial's first request fails: down again at once, same outage.
        l.open_trial();
        assert!(l.is_up());
        l.transport_failed("certificate unknown");
        assert!(!l.is_up());
        assert_eq!(l.transitions.load(Ordering::Relaxed), 1);
        // The next trial gets an answer: up for good.
        l.open_trial();
        l.answered();
        assert_eq!(*l.state.borrow(), State::Up);
        let (_, reason) = l.confirm_up().unwrap();
        assert_eq!(reason, "certificate unknown");
        assert!(l.is_up());
        assert_eq!(l.transitions.load(Ordering::Relaxed), 2);
        assert_eq!(l.transport_failed("x"), 1, "the streak starts over");
        assert!(l.is_up(), "up again: down_after applies");
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
        l.open_trial();
        tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .unwrap()
            .unwrap();
    }
}
