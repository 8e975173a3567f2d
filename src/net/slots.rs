//! Connection slots of a TCP listener, shared by the HTTP server ([`super::server`], under ingest
//! and admin) and the syslog source's TCP listener, so that idle connections cannot starve real
//! ones on any of them. A listener has `max` slots; an accepted connection takes one. A connection
//! is idle (waiting for its first bytes, its next request, or its next message) or busy (a request
//! or a read in progress). When every slot is taken, the connection idle longest is closed to make
//! room for the newcomer; only when every slot is busy does the newcomer wait for one to end or go
//! idle (with the listen backlog behind it). A slot is given back when its [`Taken`] is dropped.
//! What idle and busy mean, and the deadlines of an idle connection, are the listener's.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::logging::summary;

/// Repeated room-making is summarised this often.
const SUMMARY_EVERY: Duration = Duration::from_secs(60);

const IDLE: u8 = 0;
const BUSY: u8 = 1;
/// Closed by the listener (to make room, or past its deadline): no work may begin on it.
const CLOSED: u8 = 2;

/// One connection's place.
pub struct Slot {
    pub peer: SocketAddr,
    state: AtomicU8,
    /// When it last became idle (accept, or the end of some work), in ms since the slots were made.
    idle_since: AtomicU64,
    /// Work begun on it (requests, reads).
    begun: AtomicU64,
    /// Cancelled to close the connection at once.
    pub evict: CancellationToken,
}

impl Slot {
    /// Work begins: the connection is busy (false when it was just closed).
    pub fn begin(&self) -> bool {
        let ok = self
            .state
            .compare_exchange(IDLE, BUSY, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if ok {
            self.begun.fetch_add(1, Ordering::AcqRel);
        }
        ok
    }

    /// Closes it if it is idle; false when work is in progress.
    pub fn close_if_idle(&self) -> bool {
        let closed = self
            .state
            .compare_exchange(IDLE, CLOSED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if closed {
            self.evict.cancel();
        }
        closed
    }

    pub fn is_idle(&self) -> bool {
        self.state.load(Ordering::Acquire) == IDLE
    }

    /// Work begun on it so far.
    pub fn begun(&self) -> u64 {
        self.begun.load(Ordering::Acquire)
    }

    /// When it last became idle, in the ms of [`Slots::now_ms`].
    pub fn idle_since_ms(&self) -> u64 {
        self.idle_since.load(Ordering::Acquire)
    }
}

/// The slots of one listener.
pub struct Slots {
    /// Names the listener in log events (`ingest`, `admin`, `syslog source plant`).
    name: String,
    max: usize,
    epoch: Instant,
    open: Mutex<HashMap<u64, Arc<Slot>>>,
    next_id: AtomicU64,
    /// Signalled when a connection ends or becomes idle: room may be made for a waiting newcomer.
    changed: tokio::sync::Notify,
}

/// A connection's hold on its slot, given back when dropped.
pub struct Taken {
    id: u64,
    pub slot: Arc<Slot>,
    slots: Arc<Slots>,
    /// An idle connection was closed to make room for this one (the syslog source counts these;
    /// the HTTP listeners only log them).
    #[cfg_attr(
        not(feature = "syslog"),
        expect(dead_code, reason = "only the syslog source reads it")
    )]
    pub made_room: bool,
}

impl Taken {
    /// The work begun by [`Slot::begin`] is done: the connection is idle from now.
    pub fn end(&self) {
        self.slot
            .idle_since
            .store(self.slots.now_ms(), Ordering::Release);
        let _ = self
            .slot
            .state
            .compare_exchange(BUSY, IDLE, Ordering::AcqRel, Ordering::Acquire);
        self.slots.changed.notify_one();
    }

    pub fn slots(&self) -> &Slots {
        &self.slots
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        self.slots.lock().remove(&self.id);
        self.slots.changed.notify_one();
    }
}

impl Slots {
    pub fn new(name: impl Into<String>, max: usize) -> Arc<Slots> {
        Arc::new(Slots {
            name: name.into(),
            max,
            epoch: Instant::now(),
            open: Mutex::default(),
            next_id: AtomicU64::new(0),
            changed: tokio::sync::Notify::new(),
        })
    }

    pub fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// The instant `ms` of [`Slots::now_ms`] stands for.
    pub fn at(&self, ms: u64) -> Instant {
        self.epoch + Duration::from_millis(ms)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Slot>>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot for the connection just accepted from `peer`, idle from now: at once while one is
    /// free or one is idle (the one idle longest is closed for it), else once a connection ends
    /// or goes idle. `None` when `close` comes first. The accept loop calls this before it
    /// accepts again, so newcomers behind this one wait in the listen backlog.
    pub async fn take(
        self: &Arc<Self>,
        peer: SocketAddr,
        close: &CancellationToken,
    ) -> Option<Taken> {
        let mut made_room = false;
        loop {
            let changed = self.changed.notified();
            if self.lock().len() < self.max {
                break;
            }
            if let Some(idle) = self.close_oldest_idle() {
                self.made_room(idle, peer);
                made_room = true;
                break;
            }
            // Every slot is busy (each bounded by its listener's own timeouts).
            tokio::select! {
                _ = changed => {}
                _ = close.cancelled() => return None,
            }
        }
        let slot = Arc::new(Slot {
            peer,
            state: AtomicU8::new(IDLE),
            idle_since: AtomicU64::new(self.now_ms()),
            begun: AtomicU64::new(0),
            evict: CancellationToken::new(),
        });
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(id, Arc::clone(&slot));
        Some(Taken {
            id,
            slot,
            slots: Arc::clone(self),
            made_room,
        })
    }

    /// Closes the connection idle longest, if any is idle; returns its peer.
    fn close_oldest_idle(&self) -> Option<SocketAddr> {
        let mut open = self.lock();
        let mut idle: Vec<(u64, u64)> = open
            .iter()
            .filter(|(_, s)| s.is_idle())
            .map(|(id, s)| (s.idle_since_ms(), *id))
            .collect();
        idle.sort_unstable();
        for (_, id) in idle {
            let slot = Arc::clone(&open[&id]);
            if slot.close_if_idle() {
                open.remove(&id);
                return Some(slot.peer);
            }
        }
        None
    }

    /// One WARN, then a count per minute: an idle-socket flood must not flood the log.
    fn made_room(&self, idle: SocketAddr, newcomer: SocketAddr) {
        let (name, max) = (self.name.clone(), self.max);
        let first = summary::first(&format!("{name} made room"), 1, SUMMARY_EVERY, || {
            move |n, _, window| {
                tracing::warn!(
                    listener = %name,
                    max_connections = max,
                    repeated = n,
                    "{name}: all connections taken, the one idle longest closed for a newcomer: {n} more like it in the last {}s",
                    summary::secs(window)
                )
            }
        });
        if first {
            let name = &self.name;
            tracing::warn!(
                listener = %name,
                max_connections = max,
                closed = %idle,
                peer = %newcomer,
                "{name}: all connections taken, the one idle longest closed for a newcomer"
            );
        }
    }
}
