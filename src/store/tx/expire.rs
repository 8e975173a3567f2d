//! Expiry: deleting queued jobs older than their stream's `ttl`, in bounded chunks (called by
//! the writer's sweep), or older than its `max_age` when a take comes (through `too_old`).

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
        let (txn, st) = self.txn_and_stream(stream)?;
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
            self.dirty.insert(stream.to_string());
        }
        for raw in files {
            self.job_left(&raw, false)?;
        }
        Ok(expired)
    }
}

/// The creation time at or before which a job is older than `age` at `now_ms`.
pub(super) fn cutoff(now_ms: u64, age: std::time::Duration) -> u64 {
    now_ms.saturating_sub(u64::try_from(age.as_millis()).unwrap_or(u64::MAX))
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
