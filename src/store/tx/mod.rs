//! One write transaction, [`Tx`]: every change to the store happens inside one, and becomes
//! durable at [`Tx::commit`] (counters included, in the same commit); dropping it aborts, and the
//! in-memory state it changed is undone or reloaded. This file holds the transaction itself and the
//! bounds checks; the operations are split by concept: [`append`], [`deliver`] (take, ack, fail,
//! settle), [`dead`] (dead letters), [`expire`], [`quarantine`], and file jobs in
//! [`super::files`]. Used by the store writer and `colibri queue`.

mod append;
pub(in crate::store) use append::Need;
mod dead;
mod deliver;
mod expire;
mod quarantine;

pub use expire::EXPIRE_CHUNK;
#[cfg(test)]
pub(super) use quarantine::QuarantineEntry;

use std::collections::HashSet;
use std::path::Path;

use redb::{ReadableTable, WriteTransaction};

use super::counters::Counters;
use super::error::{FullReason, StoreError};
use super::files::Disposal;
use super::layout::{
    CHECKPOINTS, COUNTERS, DISPOSE, LAYOUT_VERSION, META, QUARANTINE, SPOOL, STORE_ID, new_store_id,
};
use super::open::Store;
use super::stream::StreamState;

/// One write transaction. Changes become durable at [`Tx::commit`]; dropping it aborts them.
pub struct Tx<'s> {
    pub(in crate::store) txn: WriteTransaction,
    /// The store, and what to undo in it if this transaction does not commit.
    pub(in crate::store) rollback: Rollback<'s>,
    pub(in crate::store) dirty: HashSet<String>,
    /// Streams that received jobs in this transaction.
    pub(in crate::store) fed: HashSet<String>,
    pub(in crate::store) free_disk: Option<u64>,
    /// The file's free pages as this transaction counts them down ([`Tx::below_min_free`]).
    pub(in crate::store) free_pages: Option<u64>,
    /// Spooled files whose jobs this transaction removes: handed to the store once it commits.
    pub(in crate::store) disposals: Vec<Disposal>,
    /// Something besides a stream changed (the SPOOL table): the transaction must commit.
    pub(in crate::store) touched: bool,
}

/// What a transaction changed in the store's memory, undone unless it commits (or closes with
/// nothing to write): the leases it handed out are released, and the counters, which any
/// operation may have changed, are re-read before the next transaction. A guard of its own, so
/// that [`Tx`] holds a plain redb transaction that `commit` and `abort` consume.
pub(in crate::store) struct Rollback<'s> {
    pub(in crate::store) store: &'s mut Store,
    /// Leases handed out in this transaction, as (stream, job id).
    pub(in crate::store) taken: Vec<(String, u64)>,
    /// Nothing to undo: the transaction committed, or closed keeping its leases.
    kept: bool,
}

impl<'s> Rollback<'s> {
    pub(in crate::store) fn new(store: &'s mut Store) -> Self {
        Rollback {
            store,
            taken: Vec::new(),
            kept: false,
        }
    }

    /// The transaction's changes stand: nothing is undone.
    fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for Rollback<'_> {
    fn drop(&mut self) {
        if self.kept {
            return;
        }
        // Not committed: counters changed in memory must be re-read, leases undone.
        self.store.stale = true;
        for (stream, id) in self.taken.drain(..) {
            if let Some(st) = self.store.streams.get_mut(&stream) {
                st.in_flight.remove(&id);
            }
        }
    }
}

pub(in crate::store) fn free_disk_bytes(path: &Path) -> Option<u64> {
    crate::files::free_bytes(path.parent()?)
}

/// The database file's free pages that occupy disk: space redb fills before it grows the file,
/// so it counts as free for `storage.min_free`. It is the file's allocated blocks (a sparse
/// file's holes are not free space: writing them takes disk) less redb's allocated pages.
///
/// Counting asks redb for its statistics, which walk every table's tree and so read the whole
/// backlog (measured: `store/tests/free_pages.rs`); an append must not pay that. So the count is
/// made only when the disk alone would refuse an append, kept, counted down by what later
/// transactions append, and made again only after a commit (which may have freed pages) and
/// once 20 times as long as it is expected to take has passed: counting takes at most about 5 %
/// of the writer's time however large the backlog. What a count takes is expected from the last
/// one, in proportion to the bytes queued then and now: so when the backlog has drained (the
/// moment the count matters, producers having been refused while it waited) the next count is
/// made at once, however long the last one took over the full backlog. Between counts the figure
/// errs low: pages freed since are not in it.
#[derive(Debug)]
pub(in crate::store) struct FreePages {
    /// Bytes, as last counted and counted down since.
    bytes: u64,
    /// A commit since the last count may have freed pages.
    stale: bool,
    /// The last count: when it ended, what it took, and the bytes queued then (the throttle).
    last: Option<(std::time::Instant, std::time::Duration, u64)>,
    /// Counts made, and what the last one took (tests check that appends do not each make one,
    /// and measure).
    pub(in crate::store) counts: u64,
    pub(in crate::store) last_took: std::time::Duration,
}

/// What a commit writes besides its jobs, at most in practice (about 50 KB, see `page_fit`): free
/// pages count towards `min_free` only beyond it.
const COMMIT_PAGES: u64 = 64 << 10;

/// The throttle of [`FreePages`]: the wait after a count, in multiples of what it took.
const COUNT_DUTY: u32 = 20;

impl FreePages {
    pub(in crate::store) fn new() -> Self {
        FreePages {
            bytes: 0,
            stale: true,
            last: None,
            counts: 0,
            last_took: std::time::Duration::ZERO,
        }
    }

    /// The free pages' bytes: counted now in `txn` when the last count is stale and the
    /// throttle allows, otherwise the last figure. `queued`: the bytes of jobs in the store.
    fn get(&mut self, txn: &WriteTransaction, path: &Path, queued: u64) -> u64 {
        let now = std::time::Instant::now();
        if !self.stale {
            return self.bytes;
        }
        if let Some((ended, took, then)) = self.last {
            // The tree walked is the backlog; a megabyte stands for what does not shrink with it.
            const FLOOR: u64 = 1 << 20;
            let ratio = (queued + FLOOR) as f64 / (then + FLOOR) as f64;
            let expected = took.mul_f64(ratio.min(1e6));
            if now < ended + expected * COUNT_DUTY {
                return self.bytes;
            }
        }
        let counted = count_free_pages(txn, path);
        let took = now.elapsed();
        self.counts += 1;
        self.last_took = took;
        self.last = Some((std::time::Instant::now(), took, queued));
        match counted {
            Ok(n) => {
                self.bytes = n;
                self.stale = false;
            }
            // Not counted: none are assumed (the disk alone decides, as before).
            Err(e) => {
                tracing::debug!(error = %e, "cannot count the store file's free pages");
                self.bytes = 0;
            }
        }
        self.bytes
    }

    /// A transaction committed: what it appended was taken from `left` (when it counted), and
    /// what it removed may have freed pages.
    fn committed(&mut self, left: Option<u64>) {
        if let Some(left) = left {
            self.bytes = left;
        }
        self.stale = true;
    }
}

/// The file's allocated blocks less redb's allocated pages (see [`FreePages`]).
fn count_free_pages(txn: &WriteTransaction, path: &Path) -> Result<u64, StoreError> {
    use std::os::unix::fs::MetadataExt;
    let stats = txn.stats()?;
    let used = stats.allocated_pages() * stats.page_size() as u64;
    let on_disk = std::fs::metadata(path)?.blocks() * 512;
    Ok(on_disk.saturating_sub(used))
}

impl<'s> Tx<'s> {
    pub(in crate::store) fn stream(&self, name: &str) -> Result<&StreamState, StoreError> {
        self.rollback
            .store
            .streams
            .get(name)
            .ok_or_else(|| StoreError::UnknownStream(name.into()))
    }

    /// The transaction and one stream's state, borrowed together: a stream's tables are opened
    /// through the one and counted in the other.
    pub(in crate::store) fn txn_and_stream(
        &mut self,
        name: &str,
    ) -> Result<(&WriteTransaction, &mut StreamState), StoreError> {
        let st = self
            .rollback
            .store
            .streams
            .get_mut(name)
            .ok_or_else(|| StoreError::UnknownStream(name.into()))?;
        Ok((&self.txn, st))
    }

    /// One stream's state, to count in.
    pub(in crate::store) fn stream_mut(
        &mut self,
        name: &str,
    ) -> Result<&mut StreamState, StoreError> {
        Ok(self.txn_and_stream(name)?.1)
    }

    pub(in crate::store) fn ensure_layout(&mut self) -> Result<(), StoreError> {
        let txn = &self.txn;
        let mut meta = txn.open_table(META)?;
        let found = meta.get("layout")?.map(|v| v.value());
        match found {
            Some(v) if v > LAYOUT_VERSION => {
                return Err(StoreError::NewerLayout {
                    path: self.rollback.store.path.clone(),
                    found: v,
                });
            }
            Some(_) => {}
            None => {
                meta.insert("layout", LAYOUT_VERSION)?;
            }
        }
        // Files created before store ids get theirs on the first writable open.
        if meta.get(STORE_ID)?.is_none() {
            meta.insert(STORE_ID, new_store_id())?;
        }
        drop(meta);
        txn.open_table(COUNTERS)?;
        txn.open_table(CHECKPOINTS)?;
        txn.open_table(QUARANTINE)?;
        txn.open_table(SPOOL)?;
        txn.open_table(DISPOSE)?;
        for st in self.rollback.store.streams.values() {
            txn.open_table(st.ready_def())?;
            txn.open_table(st.retry_def())?;
            txn.open_table(st.dead_def())?;
        }
        Ok(())
    }

    /// Whether writing `bytes` more would take the filesystem below `storage.min_free`. Free space is
    /// read once per transaction (statvfs), then counted down by what the transaction appends.
    /// redb reuses the file's free pages before it grows the file, so when the disk alone would
    /// refuse, those count too ([`FreePages`]): after a backlog drained, the file it left behind
    /// holds the next appends, and refusing them until compaction gave the space back would
    /// refuse producers for nothing (issue 17). Only what the file must grow by is taken from
    /// the disk; an append that fits in free pages does not eat into it at all.
    pub(in crate::store) fn below_min_free(&mut self, bytes: u64) -> bool {
        let min_free = self.rollback.store.storage.min_free;
        let path = &self.rollback.store.path;
        let disk = *self
            .free_disk
            .get_or_insert_with(|| free_disk_bytes(path).unwrap_or(u64::MAX));
        if disk.saturating_sub(bytes) >= min_free {
            return false;
        }
        // The commit writes pages of its own (the trees' copied branches, the counters): free
        // pages are relied on only beyond that much.
        let usable = self.free_pages().saturating_sub(COMMIT_PAGES);
        let growth = bytes.saturating_sub(usable);
        growth > 0 && disk.saturating_sub(growth) < min_free
    }

    /// The file's free pages that hold disk space, as this transaction sees them: counted (or
    /// taken from the store's last count) at the first need, then counted down by its appends.
    fn free_pages(&mut self) -> u64 {
        if let Some(n) = self.free_pages {
            return n;
        }
        let store = &mut *self.rollback.store;
        let queued = store.stored_bytes();
        let n = store.free_pages.get(&self.txn, &store.path, queued);
        self.free_pages = Some(n);
        n
    }

    /// Accounts for `bytes` appended in this transaction: taken from the file's free pages first
    /// (when they were counted), the rest from the disk.
    pub(in crate::store) fn consume(&mut self, bytes: u64) {
        let mut rest = bytes;
        if let Some(pages) = self.free_pages.as_mut() {
            let used = rest.min(*pages);
            *pages -= used;
            rest -= used;
        }
        if let Some(free) = self.free_disk.as_mut() {
            *free = free.saturating_sub(rest);
        }
    }

    /// Checks the bounds for adding `jobs`/`bytes` to `stream`, of which `disk` bytes are still to
    /// be written (a spooled file is on the disk already; only its job's value is not).
    pub(in crate::store) fn full(
        &mut self,
        stream: &str,
        jobs: u64,
        bytes: u64,
        disk: u64,
    ) -> Option<FullReason> {
        // The disk first: when it is what is exhausted, that is what a producer must be told
        // (and no amount of dropping old jobs helps).
        if self.below_min_free(disk) {
            return Some(FullReason::MinFree);
        }
        if self.rollback.store.budget_used() + bytes > self.rollback.store.storage.max_bytes {
            return Some(FullReason::Budget);
        }
        let st = &self.rollback.store.streams[stream];
        if st.counters.ready_jobs + st.counters.retry_jobs + jobs > st.cfg.max_jobs {
            return Some(FullReason::Jobs);
        }
        if st.counters.queued_bytes() + bytes > st.cfg.max_bytes {
            return Some(FullReason::Bytes);
        }
        None
    }

    /// Whether anything in this transaction changes the disk (so closing it commits).
    pub fn is_dirty(&self) -> bool {
        !self.dirty.is_empty() || self.touched
    }

    /// Streams this transaction appended to (or replayed into): what a delivery worker waits for.
    pub fn fed_streams(&self) -> Vec<String> {
        self.fed.iter().cloned().collect()
    }

    /// Commits when anything changed; otherwise ends the transaction without a commit (no fsync),
    /// keeping the leases it handed out: a `take` changes nothing on disk.
    pub fn close(self) -> Result<(), StoreError> {
        if self.is_dirty() {
            return self.commit();
        }
        let Tx { txn, rollback, .. } = self;
        rollback.keep();
        Ok(txn.abort()?)
    }

    /// Abandons the transaction; counters are reloaded before the next one.
    pub fn abort(self) -> Result<(), StoreError> {
        let Tx { txn, rollback, .. } = self;
        // Any operation may have changed counters in memory, even one that found nothing to do.
        drop(rollback);
        Ok(txn.abort()?)
    }

    /// Makes everything in this transaction durable (fsync) before returning Ok. When it fails,
    /// the rollback undoes what the transaction changed in memory.
    pub fn commit(self) -> Result<(), StoreError> {
        let Tx {
            txn,
            rollback,
            dirty,
            mut disposals,
            free_pages,
            ..
        } = self;
        {
            let mut t = txn.open_table(COUNTERS)?;
            for name in &dirty {
                let st = &rollback.store.streams[name];
                for (field, value) in Counters::NAMES.iter().zip(st.counters.values()) {
                    t.insert((name.as_str(), *field), value)?;
                }
            }
        }
        txn.commit()?;
        // What it appended filled free pages; what it removed (or rewrote) freed others, which
        // only a new count sees.
        rollback.store.free_pages.committed(free_pages);
        // Durable now: the files of the jobs it removed may go.
        rollback.store.disposals.append(&mut disposals);
        rollback.keep();
        Ok(())
    }
}
