//! One write transaction, [`Tx`]: every change to the store happens inside one, and becomes
//! durable at [`Tx::commit`] (counters included, in the same commit); dropping it aborts, and the
//! in-memory state it changed is undone or reloaded. This file holds the transaction itself and the
//! bounds checks; the operations are split by concept: [`append`], [`deliver`] (take, ack, fail,
//! settle), [`dead`] (dead letters), [`clock`] (jobs held for the clock), [`downsample`] (`when_full: downsample`), [`expire`], [`too_old`] (`max_age`), [`quarantine`], [`free_pages`] (the file's free
//! pages counted for `min_free`), and file jobs in
//! [`super::files`]. Used by the store writer and `colibri queue`.

mod append;
pub(in crate::store) use append::Need;
mod clock;
pub use clock::{ClockFixed, FixRecord};
mod dead;
mod deliver;
mod downsample;
mod expire;
mod free_pages;
mod quarantine;
mod too_old;

pub use expire::EXPIRE_CHUNK;
pub(in crate::store) use free_pages::{COMMIT_PAGES, FreePages};
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
