//! Streams whose delivery waits: those an operator paused (`colibri queue pause STREAM`, through
//! the admin endpoint) until `resume`, and those held until the wall clock is synchronised
//! (`hold_until_clock_synced`, by `clock_hold`). Their delivery workers take nothing (a request in
//! flight at the pause finishes); appends go on, so the backlog grows on disk as in an outage. In
//! memory only: a restart resumes every stream an operator paused, and a reload keeps what is
//! paused. Owned by the agent, read by `delivery`'s workers and changed by `admin` and
//! `clock_hold`.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use tokio::sync::Notify;

#[derive(Debug, Default)]
pub struct Paused {
    streams: Mutex<Sets>,
    /// Some stream is paused: the delivery workers, which ask per job, take no lock otherwise.
    any: AtomicBool,
    changed: Notify,
}

/// Why a stream waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    Operator,
    Clock,
}

#[derive(Debug, Default)]
struct Sets {
    operator: BTreeSet<String>,
    clock: BTreeSet<String>,
}

impl Sets {
    fn of(&mut self, why: Why) -> &mut BTreeSet<String> {
        match why {
            Why::Operator => &mut self.operator,
            Why::Clock => &mut self.clock,
        }
    }
}

impl Paused {
    /// Pauses or resumes `stream` for the operator; whether that changed anything.
    pub fn set(&self, stream: &str, paused: bool) -> bool {
        self.set_for(Why::Operator, stream, paused)
    }

    /// Pauses or resumes `stream` for `why`; whether that changed anything.
    pub fn set_for(&self, why: Why, stream: &str, paused: bool) -> bool {
        let changed = {
            let mut sets = self.lock();
            let set = sets.of(why);
            let changed = if paused {
                set.insert(stream.to_string())
            } else {
                set.remove(stream)
            };
            self.any
                .store(!sets.operator.is_empty() || !sets.clock.is_empty(), Relaxed);
            changed
        };
        if changed {
            self.changed.notify_waiters();
        }
        changed
    }

    /// Whether `stream` waits, for any reason.
    pub fn is(&self, stream: &str) -> bool {
        self.why(stream).is_some()
    }

    /// Whether `stream` waits for `why` (whatever else it waits for).
    pub fn is_for(&self, why: Why, stream: &str) -> bool {
        self.any.load(Relaxed) && self.lock().of(why).contains(stream)
    }

    /// Why `stream` waits (the operator's pause first), if it does.
    pub fn why(&self, stream: &str) -> Option<Why> {
        if !self.any.load(Relaxed) {
            return None;
        }
        let mut sets = self.lock();
        [Why::Operator, Why::Clock]
            .into_iter()
            .find(|w| sets.of(*w).contains(stream))
    }

    /// Returns once `stream` is not paused.
    pub async fn resumed(&self, stream: &str) {
        loop {
            // Registered before the look, so a resume between the two is not missed.
            let changed = self.changed.notified();
            if !self.is(stream) {
                return;
            }
            changed.await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Sets> {
        self.streams
            .lock()
            .expect("never poisoned: no panics while held")
    }
}
