//! One write transaction, [`Tx`]: every change to the store happens inside one, and becomes
//! durable at [`Tx::commit`] (counters included, in the same commit); dropping it aborts, and the
//! in-memory state it changed is undone or reloaded. This file holds the transaction itself and the
//! bounds checks; the operations are split by concept: [`append`], [`deliver`] (take, ack, fail,
//! settle), [`dead`] (dead letters), [`expire`], [`quarantine`], and file jobs in
//! [`super::files`]. Used by the store writer and `colibri queue`.

mod append;
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
    pub(in crate::store) store: &'s mut Store,
    pub(in crate::store) txn: Option<WriteTransaction>,
    pub(in crate::store) dirty: HashSet<String>,
    /// Streams that received jobs in this transaction.
    pub(in crate::store) fed: HashSet<String>,
    /// Leases handed out in this transaction: released again if it does not commit.
    pub(in crate::store) taken: Vec<(String, u64)>,
    pub(in crate::store) free_disk: Option<u64>,
    /// Spooled files whose jobs this transaction removes: handed to the store once it commits.
    pub(in crate::store) disposals: Vec<Disposal>,
    /// Something besides a stream changed (the SPOOL table): the transaction must commit.
    pub(in crate::store) touched: bool,
}

impl Drop for Tx<'_> {
    fn drop(&mut self) {
        if self.txn.is_some() {
            // Not committed: counters changed in memory must be re-read, leases undone.
            self.store.stale = true;
            for (stream, id) in self.taken.drain(..) {
                if let Some(st) = self.store.streams.get_mut(&stream) {
                    st.in_flight.remove(&id);
                }
            }
        }
    }
}

pub(in crate::store) fn free_disk_bytes(path: &Path) -> Option<u64> {
    crate::files::free_bytes(path.parent()?)
}

impl<'s> Tx<'s> {
    pub(in crate::store) fn txn(&self) -> &WriteTransaction {
        self.txn
            .as_ref()
            .expect("present until commit consumes the Tx")
    }

    pub(in crate::store) fn stream(&self, name: &str) -> Result<&StreamState, StoreError> {
        self.store
            .streams
            .get(name)
            .ok_or_else(|| StoreError::UnknownStream(name.into()))
    }

    pub(in crate::store) fn ensure_layout(&mut self) -> Result<(), StoreError> {
        let txn = self.txn();
        let mut meta = txn.open_table(META)?;
        let found = meta.get("layout")?.map(|v| v.value());
        match found {
            Some(v) if v > LAYOUT_VERSION => {
                return Err(StoreError::NewerLayout {
                    path: self.store.path.clone(),
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
        for st in self.store.streams.values() {
            txn.open_table(st.ready_def())?;
            txn.open_table(st.retry_def())?;
            txn.open_table(st.dead_def())?;
        }
        Ok(())
    }

    /// Whether writing `bytes` more would take the filesystem below `storage.min_free`. Free space is
    /// read once per transaction (statvfs), then counted down by what the transaction appends.
    pub(in crate::store) fn below_min_free(&mut self, bytes: u64) -> bool {
        let path = &self.store.path;
        let free = *self
            .free_disk
            .get_or_insert_with(|| free_disk_bytes(path).unwrap_or(u64::MAX));
        free.saturating_sub(bytes) < self.store.storage.min_free
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
        if self.store.stored_bytes() + bytes > self.store.storage.max_bytes {
            return Some(FullReason::Budget);
        }
        let st = &self.store.streams[stream];
        if st.c.ready_jobs + st.c.retry_jobs + jobs > st.cfg.max_jobs {
            return Some(FullReason::Jobs);
        }
        if st.c.queued_bytes() + bytes > st.cfg.max_bytes {
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
    pub fn close(mut self) -> Result<(), StoreError> {
        if self.is_dirty() {
            return self.commit();
        }
        let txn = self.txn.take().expect("present until commit or close");
        self.taken.clear();
        txn.abort().map_err(StoreError::from)
    }

    /// Abandons the transaction; counters are reloaded before the next one.
    pub fn abort(mut self) -> Result<(), StoreError> {
        let txn = self.txn.take().expect("present until commit or abort");
        // Any operation may have changed counters in memory, even one that found nothing to do.
        self.store.stale = true;
        for (stream, id) in self.taken.drain(..) {
            if let Some(st) = self.store.streams.get_mut(&stream) {
                st.in_flight.remove(&id);
            }
        }
        txn.abort().map_err(StoreError::from)
    }

    /// Makes everything in this transaction durable (fsync) before returning Ok.
    pub fn commit(mut self) -> Result<(), StoreError> {
        let txn = self.txn.take().expect("present until commit");
        let result = (|| {
            {
                let mut t = txn.open_table(COUNTERS)?;
                for name in &self.dirty {
                    let st = &self.store.streams[name];
                    for (field, value) in Counters::NAMES.iter().zip(st.c.values()) {
                        t.insert((name.as_str(), *field), value)?;
                    }
                }
            }
            txn.commit().map_err(StoreError::from)
        })();
        if result.is_err() {
            self.store.stale = true;
            for (stream, id) in self.taken.drain(..) {
                if let Some(st) = self.store.streams.get_mut(&stream) {
                    st.in_flight.remove(&id);
                }
            }
        } else {
            // Durable now: the files of the jobs it removed may go.
            self.store.disposals.append(&mut self.disposals);
        }
        result
    }
}
