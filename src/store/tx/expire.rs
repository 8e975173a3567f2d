//! Expiry: deleting queued jobs older than their stream's `ttl`, in bounded chunks. Called by the
//! writer's sweep.

use std::collections::HashSet;

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
            let ready = expire_in(
                &mut txn.open_table(st.ready_def())?,
                |id| id,
                true,
                cutoff,
                &st.in_flight,
                &mut files,
            )?;
            let retry = expire_in(
                &mut txn.open_table(st.retry_def())?,
                |(_, id)| id,
                false,
                cutoff,
                &st.in_flight,
                &mut files,
            )?;
            let mut expired = 0u64;
            for (table, jobs) in [(Table::Ready, ready), (Table::Retry, retry)] {
                for size in jobs {
                    expired += st.counters.remove_job(table, size);
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

/// Deletes the jobs of one table created at or before `cutoff` and not in flight, at most
/// [`EXPIRE_CHUNK`]; returns the size of each, and adds the values of file jobs
/// to `files`. `by_creation`: the table's keys follow creation (ready), so the walk ends at the
/// first newer job; a retry table is ordered by due time and is walked to the end of the chunk.
fn expire_in<K>(
    table: &mut redb::Table<'_, K, &'static [u8]>,
    id_of: impl Fn(K) -> u64,
    by_creation: bool,
    cutoff: u64,
    in_flight: &HashSet<u64>,
    files: &mut Vec<Vec<u8>>,
) -> Result<Vec<format::Size>, StoreError>
where
    K: redb::Key + Copy + 'static,
    for<'a> K: redb::Value<SelfType<'a> = K>,
{
    let mut victims = Vec::new();
    for e in table.iter()? {
        let (k, v) = e?;
        let Ok(h) = format::header(v.value()) else {
            continue;
        };
        if h.created_ms > cutoff {
            if by_creation {
                break;
            }
            continue;
        }
        if !in_flight.contains(&id_of(k.value())) {
            victims.push((k.value(), format::size(v.value())));
            files.extend(file_value(v.value()));
        }
        if victims.len() >= EXPIRE_CHUNK {
            break;
        }
    }
    let mut removed = Vec::with_capacity(victims.len());
    for (key, size) in victims {
        table.remove(key)?;
        removed.push(size);
    }
    Ok(removed)
}
