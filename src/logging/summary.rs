//! Summaries of events that repeat: a refused request, a dead letter dropped from a full table, a
//! file that can never fit its stream. Under abuse or a standing fault these come by the thousand,
//! and one line each would bury everything else (and fill the disk through journald). The first
//! occurrence of a kind is logged in full by its caller; the ones after it, within the key's
//! interval, are only counted, and when the interval ends one line says how many there were
//! ("N more like it in the last Ns"). An interval without any repeat ends the summary: the next
//! occurrence is logged in full again.
//!
//! Callers decide what a kind is (the key) and how its summary line reads (a closure given with the
//! first occurrence); this module only counts and says when. It works from any thread (the store
//! writer's, the blocking pool, the event loop). Summaries are written by [`run`] (a task the agent
//! starts; it sleeps while nothing is counted) and by [`flush`] (every pending count, at the stop
//! and before any exit of `colibri run`, so a count is never lost).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// Writes a summary: `(occurrences, their total amount, the window they were counted in)`.
pub type Report = Box<dyn Fn(u64, u64, Duration) + Send + Sync>;

struct Entry {
    /// When the current window began.
    since: Instant,
    interval: Duration,
    /// Occurrences counted in this window (not logged), and the sum of their amounts.
    count: u64,
    amount: u64,
    report: Report,
}

#[derive(Default)]
struct Registry {
    entries: HashMap<String, Entry>,
}

static REGISTRY: OnceLock<Mutex<Registry>> = OnceLock::new();

fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// Woken when a window gets its first count, so [`run`] knows when to write it.
fn wake() -> &'static tokio::sync::Notify {
    static WAKE: OnceLock<tokio::sync::Notify> = OnceLock::new();
    WAKE.get_or_init(tokio::sync::Notify::new)
}

/// One occurrence of `key` (with an `amount`, e.g. records, summed into its summary). `true`: the
/// caller logs it in full now (the first one, or the first after an interval without any);
/// `false`: it is counted, and `report` (made once, with the first occurrence) writes the count
/// when `interval` has passed.
pub fn first<F>(key: &str, amount: u64, interval: Duration, report: impl FnOnce() -> F) -> bool
where
    F: Fn(u64, u64, Duration) + Send + Sync + 'static,
{
    let now = Instant::now();
    let mut reg = registry();
    if let Some(e) = reg.entries.get_mut(key) {
        if now.duration_since(e.since) < e.interval {
            e.count += 1;
            e.amount += amount;
            if e.count == 1 {
                wake().notify_one();
            }
            return false;
        }
        // The window ended before `run` got to it (or no task runs it): settle it here.
        if e.count > 0 {
            (e.report)(e.count, e.amount, now.duration_since(e.since));
            e.since = now;
            e.count = 1;
            e.amount = amount;
            wake().notify_one();
            return false;
        }
        e.since = now;
        return true;
    }
    reg.entries.insert(
        key.to_string(),
        Entry {
            since: now,
            interval,
            count: 0,
            amount: 0,
            report: Box::new(report()),
        },
    );
    true
}

/// Writes the summaries whose window has ended (all of them when `all`), forgets keys whose window
/// ended without a repeat; returns when the next window with counts ends.
fn settle(all: bool) -> Option<Instant> {
    settle_in(&mut registry(), all)
}

fn settle_in(reg: &mut Registry, all: bool) -> Option<Instant> {
    let now = Instant::now();
    let mut next: Option<Instant> = None;
    reg.entries.retain(|_, e| {
        let end = e.since + e.interval;
        if now < end && !all {
            if e.count > 0 {
                next = Some(next.map_or(end, |n| n.min(end)));
            }
            return true;
        }
        if e.count == 0 {
            return false;
        }
        (e.report)(e.count, e.amount, now.duration_since(e.since));
        e.since = now;
        e.count = 0;
        e.amount = 0;
        true
    });
    next
}

/// Writes every pending summary now (the stop, an exit). Gives up after ~50 ms if the registry
/// stays in use (a panic inside a summary must not deadlock the panic hook's flush).
pub fn flush() {
    let Some(lock) = REGISTRY.get() else {
        return;
    };
    for _ in 0..50 {
        match lock.try_lock() {
            Ok(mut reg) => {
                settle_in(&mut reg, true);
                return;
            }
            Err(std::sync::TryLockError::Poisoned(p)) => {
                settle_in(&mut p.into_inner(), true);
                return;
            }
            Err(std::sync::TryLockError::WouldBlock) => {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

/// Writes each summary when its window ends; runs for the life of the process. Sleeps without a
/// timer while nothing is counted.
pub async fn run() {
    loop {
        let woken = wake().notified();
        match settle(false) {
            Some(at) => {
                tokio::select! {
                    _ = woken => {}
                    _ = tokio::time::sleep_until(at.into()) => {}
                }
            }
            None => woken.await,
        }
    }
}

/// Seconds for a summary line: whole seconds, at least 1.
pub fn secs(d: Duration) -> u64 {
    d.as_secs().max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn the_first_is_logged_the_rest_counted_and_reported_once() {
        let seen = Arc::new(AtomicU64::new(0));
        let amounts = Arc::new(AtomicU64::new(0));
        let key = "summary test: counted";
        let report = || {
            let (seen, amounts) = (Arc::clone(&seen), Arc::clone(&amounts));
            move |n: u64, amount: u64, _: Duration| {
                seen.fetch_add(n, Ordering::Relaxed);
                amounts.fetch_add(amount, Ordering::Relaxed);
            }
        };
        let hour = Duration::from_secs(3600);
        assert!(first(key, 5, hour, report));
        for _ in 0..99 {
            assert!(!first(key, 2, hour, report));
        }
        assert_eq!(
            seen.load(Ordering::Relaxed),
            0,
            "reported only when settled"
        );
        flush();
        assert_eq!(seen.load(Ordering::Relaxed), 99);
        assert_eq!(amounts.load(Ordering::Relaxed), 198);
        // The window goes on after a summary: more repeats are counted, not logged.
        assert!(!first(key, 1, hour, report));
        flush();
        assert_eq!(seen.load(Ordering::Relaxed), 100);
        // A window without repeats ends the summary: the next one is logged in full.
        flush();
        assert!(first(key, 1, hour, report));
    }

    #[test]
    fn a_quiet_interval_logs_the_next_one_in_full() {
        // With a zero interval every window has ended by the next occurrence.
        let key = "summary test: quiet";
        assert!(first(key, 1, Duration::ZERO, || |_, _, _| {}));
        assert!(first(key, 1, Duration::ZERO, || |_, _, _| {}));
    }
}
