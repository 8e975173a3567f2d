//! The writer thread: it owns the [`Store`], takes every request waiting, applies them in one
//! transaction, commits once and only then replies; parks appends to a full `block` stream, reopens
//! the store after a failed commit, compacts when idle and hands spooled files to the disposal
//! thread. Started by [`super::spawn`]; reached only through [`super::StoreHandle`].

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::clock::now_ms;

use super::*;
use crate::store::{AppendError, Disposal, Store, StoreError};
use group::{Parked, TxResult, run_tx};

mod group;

pub(super) struct Writer {
    store: Option<Store>,
    reopen: Box<dyn FnMut() -> Result<Store, StoreError> + Send>,
    opts: WriterOptions,
    stats: Arc<WriterStats>,
    parked: VecDeque<Parked>,
    /// [`expire_interval`] of the streams' TTLs (streams change only with a restart).
    expire_every: Duration,
    /// Set by [`Request::StopWaiting`]: nothing waits for room any more.
    no_wait: bool,
    last_expire: Instant,
    /// When a transaction last changed the store: what compaction waits to be quiet. Requests that
    /// change nothing (refused appends, reads, snapshots for `/metrics`) do not count: producers
    /// retrying against a full disk must not keep a drained store from being compacted.
    last_write: Instant,
    /// Compaction already ran since the last write.
    compacted: bool,
    /// The store was lost because the disk is full (ENOSPC): until it is reopened, appends are
    /// told so (ingest: 507), not that the store failed.
    no_space: bool,
    reopen_backoff: Duration,
    /// Leases of a store that was lost, for the next one.
    carried_in_flight: Vec<(String, u64)>,
    notifiers: Arc<HashMap<String, Arc<Notify>>>,
    /// Shared with every handle: set on each reopen.
    store_id: Arc<AtomicU64>,
    /// The disposal thread, started at the first spooled file to delete or archive.
    janitor: Option<mpsc::Sender<Vec<Disposal>>>,
    /// What it reports: the spool keys it disposed of, and how many it handled (failures too).
    disposed: Option<mpsc::Receiver<(Vec<Vec<u8>>, usize)>>,
    /// Disposals handed to it and not yet reported.
    disposing: usize,
}

impl Writer {
    pub(super) fn new(
        store: Store,
        reopen: Box<dyn FnMut() -> Result<Store, StoreError> + Send>,
        opts: WriterOptions,
        stats: Arc<WriterStats>,
        notifiers: Arc<HashMap<String, Arc<Notify>>>,
        store_id: Arc<AtomicU64>,
    ) -> Self {
        let expire_every = expire_interval(store.streams().filter_map(|(cfg, _)| cfg.ttl));
        Writer {
            notifiers,
            store_id,
            expire_every,
            store: Some(store),
            reopen,
            opts,
            stats,
            parked: VecDeque::new(),
            no_wait: false,
            last_expire: Instant::now(),
            last_write: Instant::now(),
            compacted: false,
            no_space: false,
            reopen_backoff: Duration::from_millis(100),
            carried_in_flight: Vec::new(),
            janitor: None,
            disposed: None,
            disposing: 0,
        }
    }

    /// Hands the spooled files of jobs that left the store to the disposal thread.
    fn dispose(&mut self) {
        let Some(store) = self.store.as_mut() else {
            return;
        };
        let batch = store.take_disposals();
        if batch.is_empty() {
            return;
        }
        if self.janitor.is_none() {
            let (tx, rx) = mpsc::channel::<Vec<Disposal>>();
            let (done_tx, done_rx) = mpsc::channel();
            let data_dir = store.data_dir().to_path_buf();
            let started = std::thread::Builder::new()
                .name("colibri-spool".into())
                .spawn(move || {
                    // Ends when the writer drops its sender (shutdown).
                    for batch in rx {
                        let handled = batch.len();
                        let mut done = Vec::with_capacity(batch.len());
                        for d in batch {
                            match crate::store::spool::dispose(&data_dir, &d) {
                                Ok(()) => done.push(d.spool),
                                Err(e) => tracing::error!(
                                    file = %String::from_utf8_lossy(&d.spool),
                                    archive = d.archive.as_deref().map(String::from_utf8_lossy).as_deref(),
                                    error = %e,
                                    "cannot dispose of a spooled file; tried again at the next start"
                                ),
                            }
                        }
                        if done_tx.send((done, handled)).is_err() {
                            return;
                        }
                    }
                });
            match started {
                Ok(_) => {
                    self.janitor = Some(tx);
                    self.disposed = Some(done_rx);
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot start the spool disposal thread; spooled files are disposed of at the next start");
                    return;
                }
            }
        }
        if let Some(j) = &self.janitor {
            self.disposing += batch.len();
            let _ = j.send(batch);
        }
    }

    /// Spooled files the disposal thread disposed of, to forget in the next transaction (those
    /// it could not are tried again at the next start).
    fn disposed(&mut self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        if let Some(rx) = &self.disposed {
            while let Ok((mut done, handled)) = rx.try_recv() {
                out.append(&mut done);
                self.disposing = self.disposing.saturating_sub(handled);
            }
        }
        out
    }

    pub(super) fn run(mut self, rx: mpsc::Receiver<Request>) {
        // Files whose jobs left the store before the last stop.
        self.dispose();
        loop {
            let timeout = self.next_timeout();
            let first = match rx.recv_timeout(timeout) {
                Ok(r) => Some(r),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => break,
            };
            let mut batch: Vec<Request> = first.into_iter().collect();
            if !batch.is_empty() && !self.opts.window.is_zero() {
                std::thread::sleep(self.opts.window);
            }
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(r) => batch.push(r),
                    Err(_) => break,
                }
            }
            // redb can panic on a damaged page instead of returning an error. Contain it: the
            // requests in flight fail (their reply channels close), the store is dropped and
            // reopened (the agent's reopen verifies the file and replaces a corrupted one).
            let applied =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.apply(batch)));
            let applied = match applied {
                Ok(a) => a,
                Err(_) => {
                    tracing::error!(
                        "the store failed reading a damaged page; reopening it with verification"
                    );
                    self.lose_store();
                    None
                }
            };
            if let Some(done) = applied {
                // Shutdown: parked producers get a clear error, the database closes cleanly.
                for p in self.parked.drain(..) {
                    let _ = p.reply.send(Err(AppendError::Store(StoreError::io(
                        "colibri is shutting down",
                    ))));
                }
                drop(self.store.take());
                let _ = done.send(());
                return;
            }
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.housekeeping()))
                .is_err()
            {
                tracing::error!(
                    "store housekeeping failed reading a damaged page; reopening it with verification"
                );
                self.lose_store();
            }
        }
    }

    /// Whether any stream has a TTL and something queued it could apply to.
    fn needs_expiry(&self) -> bool {
        self.store.as_ref().is_some_and(|s| {
            s.streams()
                .any(|(cfg, c)| cfg.ttl.is_some() && c.ready_jobs + c.retry_jobs > 0)
        })
    }

    /// Whether the idle compaction is still to run: not since the last change, on a drained
    /// store, with no append waiting for room (the timer and the check must agree, or the thread
    /// wakes every millisecond for nothing).
    fn wants_compaction(&self) -> bool {
        !self.compacted && self.parked.is_empty() && self.drained()
    }

    /// Whether every stream is empty, nothing in flight: the moment compaction is for.
    fn drained(&self) -> bool {
        self.store.as_ref().is_some_and(|store| {
            store
                .streams()
                .all(|(cfg, c)| c.ready_jobs + c.retry_jobs == 0 && store.in_flight(&cfg.name) == 0)
        })
    }

    /// How long the thread may sleep. With nothing queued, nothing parked and compaction done, it
    /// sleeps until a request arrives: an idle store does not wake.
    fn next_timeout(&self) -> Duration {
        let now = Instant::now();
        let mut t = Duration::from_secs(24 * 3600);
        if self.needs_expiry() {
            t = t.min(self.expire_every.saturating_sub(now - self.last_expire));
        }
        if let Some(d) = self.parked.iter().map(|p| p.deadline).min() {
            t = t.min(d.saturating_duration_since(now));
        }
        // Only a drained store is compacted: while a backlog waits (an outage) the compaction
        // timer must not wake the thread (past its deadline it would, every millisecond).
        if self.wants_compaction() {
            t = t.min(COMPACT_AFTER_IDLE.saturating_sub(now - self.last_write));
        }
        if self.store.is_none() {
            t = t.min(self.reopen_backoff);
        }
        // Disposed files are forgotten soon, even when nothing else happens.
        if self.disposing > 0 {
            t = t.min(Duration::from_millis(200));
        }
        // Parked appends are retried at least this often, so room made elsewhere is noticed.
        if !self.parked.is_empty() {
            t = t.min(Duration::from_millis(50));
        }
        t.max(Duration::from_millis(1))
    }

    /// Applies a batch in one transaction. Returns the shutdown reply when asked to stop.
    fn apply(&mut self, batch: Vec<Request>) -> Option<Reply<()>> {
        let shutdown = self.apply_batch(batch);
        if self.no_wait {
            // Tried once more above (room may have appeared); what still does not fit is not
            // stored, and says why.
            for p in self.parked.drain(..) {
                let _ = p.reply.send(Err(AppendError::Stopping));
            }
        }
        shutdown
    }

    fn apply_batch(&mut self, batch: Vec<Request>) -> Option<Reply<()>> {
        let (mut work, shutdown) = self.answer_at_once(batch);
        let forget = self.disposed();
        if !forget.is_empty() {
            work.push(Request::SpoolForget { spools: forget });
        }
        if work.is_empty() && self.parked.is_empty() {
            return shutdown;
        }
        if self.store.is_none() && !self.try_reopen() {
            self.refuse_without_store(work);
        } else {
            self.write(work);
        }
        shutdown
    }

    /// Answers what needs no transaction (reads, releases, `StopWaiting`); returns the rest, to be
    /// written, and the shutdown's reply when asked to stop.
    fn answer_at_once(&mut self, batch: Vec<Request>) -> (Vec<Request>, Option<Reply<()>>) {
        let mut shutdown = None;
        let mut work = Vec::with_capacity(batch.len());
        for req in batch {
            match req {
                Request::Release { lease } => match self.store.as_mut() {
                    Some(s) => s.release(&lease),
                    // Not carried into the reopened store: the job is ready again there.
                    None => self.forget_carried(&lease),
                },
                Request::Snapshot { reply } => {
                    let snap = self.snapshot();
                    let _ = reply.send(snap);
                }
                Request::Checkpoint { source, reply } => {
                    let _ = reply.send(self.read(|s| s.checkpoint(&source)));
                }
                Request::SalvageProgress { key, reply } => {
                    let _ = reply.send(self.read(|s| s.salvage_progress(&key)));
                }
                Request::NextDue { stream, reply } => {
                    let _ = reply.send(self.read(|s| s.next_retry_due(&stream)));
                }
                Request::DeadLetters {
                    stream,
                    after,
                    n,
                    max_raw,
                    reply,
                } => {
                    let _ = reply.send(self.read(|s| s.dead_letters(&stream, after, n, max_raw)));
                }
                Request::SpoolKnown { spool, reply } => {
                    let _ = reply.send(self.read(|s| s.spool_known(&spool)));
                }
                Request::Shutdown { reply } => shutdown = Some(reply),
                Request::StopWaiting => self.no_wait = true,
                other => work.push(other),
            }
        }
        (work, shutdown)
    }

    /// No store (and it could not be reopened): every change is refused, and parked appends past
    /// their deadline are answered.
    fn refuse_without_store(&mut self, work: Vec<Request>) {
        for req in work {
            // A settlement that cannot be applied leaves its job ready again (at-least-once),
            // never in flight for good.
            match &req {
                Request::Ack { leases, .. } => {
                    for lease in leases {
                        self.forget_carried(lease);
                    }
                }
                Request::Fail { lease, .. }
                | Request::Quarantine { lease, .. }
                | Request::Settle { lease, .. } => self.forget_carried(lease),
                _ => {}
            }
            self.fail_unavailable(req);
        }
        // Producers blocked on a stream must not hang on a broken disk past their deadline.
        let now = Instant::now();
        let (expired, waiting): (VecDeque<Parked>, VecDeque<Parked>) =
            std::mem::take(&mut self.parked)
                .into_iter()
                .partition(|p| now >= p.deadline);
        self.parked = waiting;
        for p in expired {
            let e = if self.no_space {
                no_space_yet()
            } else {
                StoreError::Unavailable {
                    detail: " after an i/o error",
                }
            };
            let _ = p.reply.send(Err(AppendError::Store(e)));
        }
    }

    /// The changes and the parked appends in one transaction, and what its outcome calls for:
    /// streams fed are woken, a lost store is reopened later, a damaged one moved aside.
    fn write(&mut self, work: Vec<Request>) {
        let store = self.store.as_mut().expect("reopened by the caller");
        let parked = std::mem::take(&mut self.parked);
        let (still_parked, result) = run_tx(store, parked, work, &self.stats);
        self.parked = still_parked;
        match result {
            TxResult::Committed { fed, wrote } => {
                if wrote {
                    self.last_write = Instant::now();
                    self.compacted = false;
                }
                for stream in fed {
                    if let Some(n) = self.notifiers.get(&stream) {
                        n.notify_one();
                    }
                }
                self.dispose();
            }
            TxResult::Nothing => {}
            TxResult::StoreLost { no_space } => {
                self.no_space = no_space;
                self.lose_store();
            }
            TxResult::StoreDamaged { reason } => self.give_up_damaged(&reason),
        }
    }

    /// Closes a store found damaged, moves its file aside (the agent salvages it) and leaves the
    /// next reopen to create a new one. Leases handed out from it name nothing in the new one.
    fn give_up_damaged(&mut self, reason: &str) {
        self.stats.store_open.store(false, Ordering::Relaxed);
        let Some(store) = self.store.take() else {
            return;
        };
        let dir = store.data_dir().to_path_buf();
        let leases = store.in_flight_leases();
        drop(store);
        match super::super::aside::move_aside(&dir, crate::clock::now_ms()) {
            Ok(aside) => {
                // The new file's ids name other jobs: the old leases are refused by store id.
                self.carried_in_flight.clear();
                tracing::error!(
                    reason,
                    moved_to = %aside.display(),
                    "the store is damaged; it was moved aside (its intact jobs are salvaged) and a new one created"
                );
            }
            Err(e) => {
                // The same file is reopened (verified): its leases still stand, and the next try
                // waits, so a take that finds the same damage does not spin.
                self.carried_in_flight = leases;
                tracing::error!(reason, error = %e, retry_in_ms = self.reopen_backoff.as_millis() as u64, "the store is damaged and could not be moved aside; reopening it with verification");
                std::thread::sleep(self.reopen_backoff.min(Duration::from_secs(1)));
                self.reopen_backoff = (self.reopen_backoff * 2).min(Duration::from_secs(30));
            }
        }
    }

    /// Answers a request that cannot be applied while the store is being reopened.
    fn fail_unavailable(&self, req: Request) {
        if self.no_space {
            fail_with(req, no_space_yet);
        } else {
            fail_with(req, || StoreError::Unavailable {
                detail: " after an i/o error; retrying",
            });
        }
    }

    /// Drops the store after a failure, keeping its leases: jobs handed out before must not be
    /// handed out again (or expired, or dropped) by the reopened store while they are being sent.
    fn lose_store(&mut self) {
        self.stats.store_open.store(false, Ordering::Relaxed);
        if let Some(s) = self.store.take() {
            self.carried_in_flight = s.in_flight_leases();
        }
    }

    fn forget_carried(&mut self, lease: &crate::store::Lease) {
        self.carried_in_flight
            .retain(|(stream, id)| !(stream == &lease.stream && *id == lease.id));
    }

    fn try_reopen(&mut self) -> bool {
        match (self.reopen)() {
            Ok(mut s) => {
                tracing::info!("store reopened after an i/o error");
                // Before any reply from the new store: a key built after one names its file.
                let previous = self.store_id.swap(s.id(), Ordering::AcqRel);
                let carried = std::mem::take(&mut self.carried_in_flight);
                // A replaced (new) file has other jobs under the same ids: the old leases name
                // nothing there, and the store refuses them by their store id.
                if previous == s.id() {
                    s.restore_in_flight(carried);
                } else {
                    let (count, signal) = &self.stats.replaced;
                    *count
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) += 1;
                    signal.notify_all();
                }
                self.store = Some(s);
                self.no_space = false;
                self.stats.store_open.store(true, Ordering::Relaxed);
                self.reopen_backoff = Duration::from_millis(100);
                self.dispose();
                true
            }
            Err(e) => {
                // Opening writes (redb repairs a file closed by a failed commit): the disk may
                // still be full.
                self.no_space |= e.is_no_space();
                tracing::error!(error = %e, retry_in_ms = self.reopen_backoff.as_millis() as u64, "cannot reopen the store");
                std::thread::sleep(self.reopen_backoff.min(Duration::from_secs(1)));
                self.reopen_backoff = (self.reopen_backoff * 2).min(Duration::from_secs(30));
                false
            }
        }
    }

    /// A query of the open store; while it is being reopened after an i/o error, `Unavailable`.
    fn read<T>(
        &self,
        query: impl FnOnce(&Store) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        match &self.store {
            Some(s) => query(s),
            None => Err(StoreError::Unavailable { detail: "" }),
        }
    }

    fn snapshot(&self) -> Snapshot {
        match &self.store {
            Some(s) => Snapshot {
                streams: s.streams().map(|(c, n)| (c.clone(), n.clone())).collect(),
                // Heads that cannot be read show none: the counters still come.
                ready_head_ms: s
                    .ready_heads(s.streams().map(|(c, _)| c.name.as_str()))
                    .unwrap_or_else(|_| s.streams().map(|_| None).collect()),
                stored_bytes: s.stored_bytes(),
                file_bytes: s.file_bytes(),
                commits: self.stats.commits.load(Ordering::Relaxed),
            },
            None => Snapshot::default(),
        }
    }

    fn housekeeping(&mut self) {
        if self.store.is_none() {
            self.try_reopen();
            return;
        }
        if self.last_expire.elapsed() >= self.expire_every && self.needs_expiry() {
            self.last_expire = Instant::now();
            let store = self.store.as_mut().expect("checked above");
            // Bounded transactions (EXPIRE_CHUNK jobs per table each) until nothing more expires.
            let expired = (|| {
                for _ in 0..1000 {
                    let mut tx = store.transaction()?;
                    if tx.expire(now_ms())? == 0 {
                        // Nothing expired: no commit, no fsync.
                        return tx.abort();
                    }
                    tx.commit()?;
                }
                Ok(())
            })();
            if let Err(e) = expired {
                tracing::error!(error = %e, "ttl expiry failed; reopening the database");
                self.lose_store();
                return;
            }
            // Expired file jobs take their spooled files with them.
            self.dispose();
        }
        let idle = self.last_write.elapsed() >= COMPACT_AFTER_IDLE;
        let wanted = self.wants_compaction();
        let store = self.store.as_mut().expect("checked above");
        if idle && wanted {
            self.compacted = true;
            // redb's own count of free pages: stored_bytes counts spooled files, which are not in
            // the database file.
            let free = store.reclaimable_bytes().unwrap_or(0);
            if free > COMPACT_SLACK && free * 2 > store.file_bytes() {
                let started = Instant::now();
                match store.compact() {
                    Ok(freed) => tracing::info!(
                        freed_bytes = freed,
                        file_bytes = store.file_bytes(),
                        duration_ms = started.elapsed().as_millis() as u64,
                        "backlog drained: store compacted"
                    ),
                    Err(e) => {
                        tracing::warn!(error = %e, "store compaction failed; will try after the next drain")
                    }
                }
            }
            // Idle and drained: what the burst's commits and compression held goes back too.
            crate::store::codec::release_contexts();
            crate::memory::trim_heap();
        }
    }
}

/// Answers a request that cannot be applied with the error `err` makes (one per reply).
fn fail_with(req: Request, err: impl Fn() -> StoreError) {
    match req {
        Request::Append { reply, .. } => drop(reply.send(Err(AppendError::Store(err())))),
        Request::Take { reply, .. } => drop(reply.send(Err(err()))),
        Request::Ack { reply, .. } => drop(reply.send(Err(err()))),
        Request::Fail { reply, .. } => drop(reply.send(Err(err()))),
        Request::Quarantine { reply, .. } => drop(reply.send(Err(err()))),
        Request::Salvage { reply, .. } => drop(reply.send(Err(err()))),
        Request::Dead { reply, .. } => drop(reply.send(Err(err()))),
        Request::FixClock { reply, .. } => drop(reply.send(Err(err()))),
        Request::SalvageProgress { reply, .. } => drop(reply.send(Err(err()))),
        Request::Settle { reply, .. } => drop(reply.send(Err(err()))),
        Request::AppendFile { reply, .. } => drop(reply.send(Err(AppendError::Store(err())))),
        Request::SpoolKnown { reply, .. } => drop(reply.send(Err(err()))),
        Request::DeadLetters { reply, .. } => drop(reply.send(Err(err()))),
        Request::Release { .. }
        | Request::Snapshot { .. }
        | Request::Checkpoint { .. }
        | Request::NextDue { .. }
        | Request::SpoolForget { .. }
        | Request::StopWaiting
        | Request::Shutdown { .. } => {}
    }
}

/// What a request is told while the store that ran out of disk space is being reopened.
fn no_space_yet() -> StoreError {
    StoreError::NoSpace("the store is reopened once there is room; nothing was stored".into())
}

#[cfg(test)]
mod checkpoint_tests;
