//! Expiry: deleting queued jobs older than their stream's `ttl`, in bounded chunks (called by
//! the writer's sweep), or older than its `max_age` when a take comes (through `too_old`).

use std::collections::HashSet;

use redb::ReadableTable;

use super::Tx;
use crate::store::error::StoreError;
use crate::store::files::file_value;
use crate::store::format::{self};
use crate::store::layout::Table;

/// Jobs one `expire` call deletes of a stream at most (ready and retry together), so a sweep after a long outage is a series of
/// bounded transactions rather than one that holds every victim in memory.
pub const EXPIRE_CHUNK: usize = 10_000;

impl Tx<'_> {
    /// Deletes queued jobs older than their stream's TTL (never one in flight); returns records.
    pub fn expire(&mut self, now_ms: u64) -> Result<u64, StoreError> {
        let mut total = 0;
        let names: Vec<(String, u64)> = self
            .rollback
            .store
            .streams
            .values()
            .filter_map(|st| Some((st.cfg.name.clone(), cutoff(now_ms, st.cfg.ttl?))))
            .collect();
        for (name, cutoff) in names {
            let expired = self.expire_stream(&name, cutoff)?;
            if expired > 0 {
                tracing::warn!(stream = %name, records = expired, "jobs older than the stream's ttl expired");
                total += expired;
            }
        }
        Ok(total)
    }

    /// Deletes `stream`'s queued jobs created at or before `cutoff` (at most [`EXPIRE_CHUNK`] a
    /// table, none in flight) and counts them expired; returns records.
    pub(super) fn expire_stream(&mut self, stream: &str, cutoff: u64) -> Result<u64, StoreError> {
        let mut files = Vec::new();
        let mut left = EXPIRE_CHUNK;
        let expired = self.remove_old(stream, cutoff, &mut |_, value| {
            if left == 0 {
                return false;
            }
            left -= 1;
            files.extend(file_value(value));
            true
        })?;
        if expired > 0 {
            let st = self.stream_mut(stream)?;
            st.counters.expired_records += expired;
            self.dirty.insert(stream.to_string());
        }
        for raw in files {
            self.job_left(&raw, false)?;
        }
        Ok(expired)
    }

    /// Removes `stream`'s queued jobs created at or before `cutoff` (ready, then retry; none in
    /// flight) and counts them out of their tables; `each` is shown every such job (its id and
    /// value) and says whether it goes (false: it stays, and so do the rest). Returns the records removed: the caller counts where
    /// they went (expired, moved). Used by expiry and by `too_old`'s moves.
    pub(super) fn remove_old(
        &mut self,
        stream: &str,
        cutoff: u64,
        each: &mut dyn FnMut(u64, &[u8]) -> bool,
    ) -> Result<u64, StoreError> {
        let (txn, st) = self.txn_and_stream(stream)?;
        let ready = remove_old_in(
            &mut txn.open_table(st.ready_def())?,
            |id| id,
            true,
            cutoff,
            &st.in_flight,
            each,
        )?;
        let retry = remove_old_in(
            &mut txn.open_table(st.retry_def())?,
            |(_, id)| id,
            false,
            cutoff,
            &st.in_flight,
            each,
        )?;
        let mut records = 0u64;
        for (table, jobs) in [(Table::Ready, ready), (Table::Retry, retry)] {
            for size in jobs {
                records += st.counters.remove_job(table, size);
            }
        }
        Ok(records)
    }
}

/// The creation time at or before which a job is older than `age` at `now_ms`.
pub(super) fn cutoff(now_ms: u64, age: std::time::Duration) -> u64 {
    now_ms.saturating_sub(u64::try_from(age.as_millis()).unwrap_or(u64::MAX))
}

/// Deletes the jobs of one table created at or before `cutoff` and not in flight, as long as
/// `each`, shown each one, says it goes; returns the size of each deleted. `by_creation`:
/// the table's keys follow creation (ready), so the walk ends at the first newer job; a retry
/// table is ordered by due time and is walked until `each` says to stop.
fn remove_old_in<K>(
    table: &mut redb::Table<'_, K, &'static [u8]>,
    id_of: impl Fn(K) -> u64,
    by_creation: bool,
    cutoff: u64,
    in_flight: &HashSet<u64>,
    each: &mut dyn FnMut(u64, &[u8]) -> bool,
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
        let id = id_of(k.value());
        if in_flight.contains(&id) {
            continue;
        }
        if !each(id, v.value()) {
            break;
        }
        victims.push((k.value(), format::size(v.value())));
    }
    let mut removed = Vec::with_capacity(victims.len());
    for (key, size) in victims {
        table.remove(key)?;
        removed.push(size);
    }
    Ok(removed)
}
