//! Expiry: deleting queued jobs older than their stream's `ttl`, in bounded chunks. Called by the
//! writer's sweep.

use redb::ReadableTable;

use super::Tx;
use crate::store::error::StoreError;
use crate::store::files::file_value;
use crate::store::format::{self};
use crate::store::layout::Table;

/// Jobs one `expire` call deletes per table at most, so a sweep after a long outage is a series of
/// bounded transactions rather than one that holds every victim in memory.
pub const EXPIRE_CHUNK: usize = 10_000;

impl Tx<'_> {
    /// Deletes queued jobs older than their stream's TTL (never one in flight); returns records.
    pub fn expire(&mut self, now_ms: u64) -> Result<u64, StoreError> {
        let txn = &self.txn;
        let mut total = 0;
        let mut files = Vec::new();
        for st in self.rollback.store.streams.values_mut() {
            let Some(ttl) = st.cfg.ttl else { continue };
            let cutoff = now_ms.saturating_sub(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX));
            let mut expired = 0u64;
            {
                let mut ready = txn.open_table(st.ready_def())?;
                let mut victims = Vec::new();
                for e in ready.iter()? {
                    let (k, v) = e?;
                    let Ok(h) = format::header(v.value()) else {
                        continue;
                    };
                    if h.created_ms > cutoff {
                        break; // ids follow creation order
                    }
                    if !st.in_flight.contains(&k.value()) {
                        victims.push((
                            k.value(),
                            u64::from(h.records),
                            format::stored_len(v.value()),
                        ));
                        files.extend(file_value(v.value()));
                    }
                    if victims.len() >= EXPIRE_CHUNK {
                        break;
                    }
                }
                for (id, recs, len) in victims {
                    ready.remove(id)?;
                    expired += st.counters.remove_job(Table::Ready, recs, len);
                }
            }
            {
                let mut retry = txn.open_table(st.retry_def())?;
                let mut victims = Vec::new();
                for e in retry.iter()? {
                    let (k, v) = e?;
                    let Ok(h) = format::header(v.value()) else {
                        continue;
                    };
                    if h.created_ms <= cutoff && !st.in_flight.contains(&k.value().1) {
                        victims.push((
                            k.value(),
                            u64::from(h.records),
                            format::stored_len(v.value()),
                        ));
                        files.extend(file_value(v.value()));
                    }
                    if victims.len() >= EXPIRE_CHUNK {
                        break;
                    }
                }
                for (key, recs, len) in victims {
                    retry.remove(key)?;
                    expired += st.counters.remove_job(Table::Retry, recs, len);
                }
            }
            if expired > 0 {
                st.counters.expired_records += expired;
                tracing::warn!(stream = %st.cfg.name, records = expired, "jobs older than the stream's ttl expired");
                self.dirty.insert(st.cfg.name.clone());
                total += expired;
            }
        }
        for raw in files {
            self.job_left(&raw, false)?;
        }
        Ok(total)
    }
}
