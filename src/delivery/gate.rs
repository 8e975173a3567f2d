//! Priorities between the streams of one sink (`priority`, 0-9, higher first; `min_share`): the
//! [`Gate`] that hands out the sink's request slots (`concurrency`) when its streams do not all
//! have the same priority. A slot goes to the highest priority asking, oldest request first,
//! unless a lower one has had less than its `min_share` of the bytes sent while a higher one was
//! busy; and a lower stream does not take a slot that a higher one, busy with a backlog and back in
//! a moment (it asked within [`BUSY_FOR`]), would take, so a paced drain serves the higher stream
//! first although its worker is between two requests when the slot frees. It knows nothing of
//! jobs or sinks. Built by `SinkRuntime::new`; awaited before a request by `job`.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// A higher-priority stream that asked this recently and still has a backlog is coming back for
/// the next slot: a lower one leaves it that long (a worker takes its next job and builds the body
/// within it; a stream that does not come back is not waited for longer).
pub(super) const BUSY_FOR: Duration = Duration::from_millis(200);

/// One stream's place at the gate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Rank {
    pub priority: u8,
    /// The least share of the bytes sent while a higher-priority stream was busy.
    pub min_share: f64,
}

#[derive(Debug, Default)]
struct Level {
    /// Requests waiting, by ticket (oldest first).
    waiting: Vec<u64>,
    /// When a request of this level last asked.
    asked: Option<Instant>,
    /// Bytes sent while a higher level was busy (the share is kept from them).
    bytes: u64,
    /// Its streams' least share (as the last request asked).
    min_share: f64,
}

#[derive(Debug)]
struct State {
    free: usize,
    next_ticket: u64,
    levels: BTreeMap<u8, Level>,
}

pub(super) struct Gate {
    state: Mutex<State>,
    changed: Notify,
}

/// A request slot: given back when dropped.
pub(super) struct Slot<'a>(&'a Gate);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.lock().free += 1;
        self.0.changed.notify_waiters();
    }
}

/// A request waiting at the gate; one dropped before its grant takes its ticket back.
struct Asking<'a> {
    gate: &'a Gate,
    ticket: u64,
    priority: u8,
    granted: bool,
}

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        if self.granted {
            return;
        }
        if let Some(l) = self.gate.lock().levels.get_mut(&self.priority) {
            l.waiting.retain(|t| *t != self.ticket);
        }
        self.gate.changed.notify_waiters();
    }
}

impl Gate {
    pub(super) fn new(slots: usize) -> Gate {
        Gate {
            state: Mutex::new(State {
                free: slots,
                next_ticket: 0,
                levels: BTreeMap::new(),
            }),
            changed: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .expect("never poisoned: no panics while held")
    }

    /// Waits for a slot for a request of `bytes` of a stream of `rank`; `busy(p)` says whether the
    /// streams of priority `p` still have a backlog.
    pub(super) async fn slot(&self, rank: Rank, bytes: u64, busy: impl Fn(u8) -> bool) -> Slot<'_> {
        let ticket = {
            let mut s = self.lock();
            let t = s.next_ticket;
            s.next_ticket += 1;
            let level = s.levels.entry(rank.priority).or_default();
            level.waiting.push(t);
            level.asked = Some(Instant::now());
            level.min_share = rank.min_share;
            t
        };
        self.changed.notify_waiters();
        // A request abandoned while it waits (colibri stopping) leaves the queue.
        let mut asking = Asking {
            gate: self,
            ticket,
            priority: rank.priority,
            granted: false,
        };
        loop {
            let changed = self.changed.notified();
            let mut changed = std::pin::pin!(changed);
            changed.as_mut().enable();
            let wait = {
                let mut s = self.lock();
                match s.grant(ticket, rank, bytes, &busy, Instant::now()) {
                    None => {
                        asking.granted = true;
                        return Slot(self);
                    }
                    Some(wait) => wait,
                }
            };
            // Woken by a slot given back or a new request, or when a busy higher stream that
            // did not come back is no longer waited for.
            tokio::select! {
                () = changed => {}
                () = tokio::time::sleep(wait) => {}
            }
        }
    }
}

impl State {
    /// Gives `ticket` the slot now (`None`), or says how long at most to wait before looking again.
    fn grant(
        &mut self,
        ticket: u64,
        rank: Rank,
        bytes: u64,
        busy: &impl Fn(u8) -> bool,
        now: Instant,
    ) -> Option<Duration> {
        let first = self.levels[&rank.priority].waiting.first() == Some(&ticket);
        // Higher levels that are waiting, or busy and back in a moment.
        let mut ahead = None;
        for (&p, l) in self.levels.range(rank.priority + 1..) {
            let back_in = l
                .asked
                .filter(|_| busy(p))
                .and_then(|a| BUSY_FOR.checked_sub(now.duration_since(a)))
                .filter(|d| !d.is_zero());
            if !l.waiting.is_empty() {
                ahead = Some(Duration::ZERO);
            } else if let Some(d) = back_in {
                ahead = Some(ahead.map_or(d, |a: Duration| a.max(d)));
            }
        }
        let owed = ahead.is_some() && self.below_share(rank.priority);
        // A lower level waiting and owed its share takes the next slot, whichever asks first.
        let owing = self
            .levels
            .range(..rank.priority)
            .any(|(&p, l)| !l.waiting.is_empty() && self.below_share(p));
        if self.free == 0 || !first || (ahead.is_some() && !owed) || owing {
            return Some(ahead.filter(|d| !d.is_zero()).unwrap_or(BUSY_FOR));
        }
        self.free -= 1;
        let contended = ahead.is_some()
            || self
                .levels
                .range(..rank.priority)
                .any(|(_, l)| !l.waiting.is_empty());
        let level = self.levels.get_mut(&rank.priority).expect("registered");
        level.waiting.remove(0);
        if contended {
            level.bytes += bytes;
        } else {
            // Alone: the shares start again.
            self.levels.values_mut().for_each(|l| l.bytes = 0);
        }
        None
    }

    /// Whether level `priority` has had less than its `min_share` of the bytes sent while levels
    /// contended.
    fn below_share(&self, priority: u8) -> bool {
        let total: u64 = self.levels.values().map(|l| l.bytes).sum();
        let level = &self.levels[&priority];
        (level.bytes as f64) < level.min_share * total as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HIGH: Rank = Rank {
        priority: 9,
        min_share: 0.1,
    };
    const LOW: Rank = Rank {
        priority: 1,
        min_share: 0.1,
    };

    fn state() -> State {
        State {
            free: 1,
            next_ticket: 0,
            levels: BTreeMap::new(),
        }
    }

    fn ask(s: &mut State, rank: Rank, now: Instant) -> u64 {
        let t = s.next_ticket;
        s.next_ticket += 1;
        let l = s.levels.entry(rank.priority).or_default();
        l.waiting.push(t);
        l.asked = Some(now);
        l.min_share = rank.min_share;
        t
    }

    /// Both always asking, 1000 slots one after the other, `asks_first` asking first each time:
    /// the low stream's share of the bytes.
    fn low_share(asks_first: Rank) -> f64 {
        let now = Instant::now();
        let mut s = state();
        let busy = |_: u8| true;
        let mut bytes = [0u64; 2];
        let mut tickets = [ask(&mut s, LOW, now), ask(&mut s, HIGH, now)];
        let ranks = [LOW, HIGH];
        let order = if asks_first == LOW { [0, 1] } else { [1, 0] };
        for _ in 0..1000 {
            let i = if s
                .grant(tickets[order[0]], ranks[order[0]], 100, &busy, now)
                .is_none()
            {
                order[0]
            } else {
                let i = order[1];
                assert_eq!(s.grant(tickets[i], ranks[i], 100, &busy, now), None);
                i
            };
            bytes[i] += 100;
            tickets[i] = ask(&mut s, ranks[i], now);
            s.free += 1;
        }
        bytes[0] as f64 / (bytes[0] + bytes[1]) as f64
    }

    #[test]
    fn the_higher_priority_goes_first_and_the_lower_keeps_its_share() {
        let share = low_share(LOW);
        assert!((0.09..=0.11).contains(&share), "{share}");
    }

    /// When a slot frees, the higher level may ask for it before the lower one that is owed its
    /// share: the slot still goes to the lower one.
    #[test]
    fn an_owed_lower_stream_gets_the_slot_whoever_asks_first() {
        let share = low_share(HIGH);
        assert!((0.09..=0.11).contains(&share), "{share}");
    }

    #[test]
    fn a_lower_stream_leaves_the_slot_to_a_busy_higher_one_for_a_moment_only() {
        let now = Instant::now();
        let mut s = state();
        let t = ask(&mut s, HIGH, now);
        assert_eq!(s.grant(t, HIGH, 100, &|_| true, now), None);
        s.free += 1;
        // The high stream is between two requests: the low one has had its share (nothing was
        // contended yet) and waits, but not longer than BUSY_FOR after the high one last asked.
        let low = ask(&mut s, LOW, now);
        let wait = s.grant(low, LOW, 100, &|_| true, now + Duration::from_millis(50));
        assert_eq!(wait, Some(Duration::from_millis(150)));
        assert_eq!(s.grant(low, LOW, 100, &|_| true, now + BUSY_FOR), None);
        s.free += 1;
        // A higher stream whose backlog is drained is not waited for.
        let low = ask(&mut s, LOW, now);
        assert_eq!(s.grant(low, LOW, 100, &|_| false, now), None);
    }
}
