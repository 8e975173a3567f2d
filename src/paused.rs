//! Streams an operator paused (`colibri queue pause STREAM`, through the admin endpoint): their
//! delivery workers take nothing until `resume` (a request in flight at the pause finishes);
//! appends go on, so the backlog grows on disk as in an outage. In memory only: a restart resumes
//! every stream, and a reload keeps what is paused. Owned by the agent, read by `delivery`'s
//! workers and changed by `admin`.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use tokio::sync::Notify;

#[derive(Debug, Default)]
pub struct Paused {
    streams: Mutex<BTreeSet<String>>,
    /// Some stream is paused: the delivery workers, which ask per job, take no lock otherwise.
    any: AtomicBool,
    changed: Notify,
}

impl Paused {
    /// Pauses or resumes `stream`; whether that changed anything.
    pub fn set(&self, stream: &str, paused: bool) -> bool {
        let changed = {
            let mut set = self.lock();
            let changed = if paused {
                set.insert(stream.to_string())
            } else {
                set.remove(stream)
            };
            self.any.store(!set.is_empty(), Relaxed);
            changed
        };
        if changed {
            self.changed.notify_waiters();
        }
        changed
    }

    pub fn is(&self, stream: &str) -> bool {
        self.any.load(Relaxed) && self.lock().contains(stream)
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

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.streams
            .lock()
            .expect("never poisoned: no panics while held")
    }
}
