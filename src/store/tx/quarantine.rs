//! Quarantine: a value that no longer decodes leaves its table for the QUARANTINE table, counted
//! (its table recounted from the values that still verify, so the accounting identity stays exact)
//! and logged; its spooled file, if any, is forgotten so its task queues it again. Called by take,
//! fail, settle and replay.

use redb::ReadableTable;
use serde::Serialize;

use super::Tx;
use crate::store::error::StoreError;
use crate::store::files::{SpoolEntry, spool_entry};
use crate::store::format::{self};
use crate::store::job::Lease;
use crate::store::layout::{QUARANTINE, SPOOL, Table};

/// Undecodable values one `take` moves to quarantine at most (each costs a scan of its table).
pub(in crate::store) const QUARANTINE_PER_TAKE: usize = 16;

impl Tx<'_> {
    /// Moves an undecodable value to quarantine: counted, logged, out of the way.
    pub(in crate::store) fn quarantine(
        &mut self,
        stream: &str,
        table: Table,
        id: u64,
        due: Option<u64>,
        raw: &[u8],
        reason: &str,
    ) -> Result<(), StoreError> {
        let (txn, st) = self.txn_and_stream(stream)?;
        match table {
            Table::Ready => {
                txn.open_table(st.ready_def())?.remove(id)?;
            }
            Table::Retry => {
                txn.open_table(st.retry_def())?
                    .remove((due.unwrap_or(0), id))?;
            }
            Table::Dead => {
                txn.open_table(st.dead_def())?.remove(id)?;
            }
        }
        // A corrupt value's header is only a claim (a flipped bit can claim a thousand records), so
        // the table is counted again from the values that pass their checksum; what the counters
        // held beyond that was this job's. Rare, so a full scan is fine, and the identity stays exact.
        let [jobs, records, bytes, raw_bytes] = match table {
            Table::Ready => recount(&txn.open_table(st.ready_def())?)?,
            Table::Retry => recount(&txn.open_table(st.retry_def())?)?,
            Table::Dead => recount(&txn.open_table(st.dead_def())?)?,
        };
        let [c_jobs, c_records, c_bytes, c_raw] = st.counters.table_mut(table);
        let recs = c_records.saturating_sub(records);
        // Never expected; if the counters were short, the identity is kept by counting the excess
        // as appended.
        let excess = records.saturating_sub(*c_records);
        *c_jobs = jobs;
        *c_records = records;
        *c_bytes = bytes;
        *c_raw = raw_bytes;
        if excess > 0 {
            tracing::error!(
                stream,
                table = table.name(),
                excess,
                "counters were below the table's contents; corrected"
            );
            st.counters.appended_records += excess;
        }
        st.counters.quarantined_records += recs;
        let entry = QuarantineEntry {
            stream: stream.to_string(),
            table: table.name().to_string(),
            id,
            reason: reason.to_string(),
            raw: raw.to_vec(),
        };
        let bytes =
            postcard::to_stdvec(&entry).expect("postcard encodes a plain struct into a Vec");
        let mut q = txn.open_table(QUARANTINE)?;
        let key = q.last()?.map_or(1, |(k, _)| k.value() + 1);
        q.insert(key, bytes.as_slice())?;
        drop(q);
        // A file job's file is intact even when its job is not: forget that this job ships it, so
        // its task's recovery queues the file again instead of leaving it in the spool for good.
        // Rare (a damaged value), so a scan of the spool table is fine.
        if matches!(raw.first(), Some(&format::VERSION_FILE)) {
            let mut spool = txn.open_table(SPOOL)?;
            let mut mine = Vec::new();
            for e in spool.iter()? {
                let (k, v) = e?;
                if let Some(SpoolEntry::Queued { stream: s, job }) = spool_entry(v.value())
                    && s == stream
                    && job == id
                {
                    mine.push(k.value().to_vec());
                }
            }
            for k in mine {
                spool.remove(k.as_slice())?;
            }
        }
        tracing::error!(
            stream,
            table = table.name(),
            id,
            reason,
            records = recs,
            "job cannot be decoded; moved to quarantine"
        );
        self.dirty.insert(stream.into());
        Ok(())
    }

    /// A taken job whose records cannot be read (its compressed area is damaged, though its
    /// checksum held): moved to quarantine like a value that fails its checksum.
    pub fn quarantine_taken(&mut self, lease: &Lease, reason: &str) -> Result<(), StoreError> {
        let (raw, table) = self.read_leased(lease)?;
        match self.quarantine_leased(lease, table, &raw, reason) {
            StoreError::Corrupted(_) => Ok(()),
            e => Err(e),
        }
    }

    /// A leased value that no longer decodes: moved to quarantine (counted, out of the queue, its
    /// lease void). Returns the error to hand the caller.
    pub(in crate::store) fn quarantine_leased(
        &mut self,
        lease: &Lease,
        table: Table,
        raw: &[u8],
        reason: impl std::fmt::Display,
    ) -> StoreError {
        if let Some(st) = self.rollback.store.streams.get_mut(&lease.stream) {
            st.in_flight.remove(&lease.id);
        }
        let reason = reason.to_string();
        match self.quarantine(
            &lease.stream,
            table,
            lease.id,
            lease.retry_due,
            raw,
            &reason,
        ) {
            Ok(()) => StoreError::Corrupted(reason),
            Err(e) => e,
        }
    }
}

/// Jobs, verified records, bytes and raw bytes of one table: values that fail their checksum count
/// as jobs and bytes but no records (they are about to be quarantined too).
pub(in crate::store) fn recount<K: redb::Key + 'static>(
    t: &redb::Table<'_, K, &'static [u8]>,
) -> Result<[u64; 4], StoreError> {
    let (mut jobs, mut records, mut bytes, mut raw) = (0u64, 0u64, 0u64, 0u64);
    for e in t.iter()? {
        let (_, v) = e?;
        let size = format::size(v.value());
        jobs += 1;
        bytes += size.bytes;
        raw += size.raw;
        if format::decode(v.value()).is_ok() {
            records += size.records;
        }
    }
    Ok([jobs, records, bytes, raw])
}

/// A value `take` could not decode: (table, id, retry due, raw bytes, reason).
pub(in crate::store) type Undecodable = (Table, u64, Option<u64>, Vec<u8>, String);

#[derive(Debug, Serialize, serde::Deserialize)]
pub(in crate::store) struct QuarantineEntry {
    pub(in crate::store) stream: String,
    pub(in crate::store) table: String,
    pub(in crate::store) id: u64,
    pub(in crate::store) reason: String,
    pub(in crate::store) raw: Vec<u8>,
}
