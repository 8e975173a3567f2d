//! Dead letters: keeping the table within `dead_letter.max_jobs` (oldest out, logged once and then
//! summarised), and the operator's replay and purge. Called by fail and settle (trim) and by
//! `colibri queue dead ...`.

use redb::ReadableTable;

use super::Tx;
use crate::store::error::StoreError;
use crate::store::files::file_value;
use crate::store::format::{self};
use crate::store::job::fresh_meta;
use crate::store::layout::Table;

/// Dead letters dropped from a full dead-letter table are logged once, then counted this often.
pub(in crate::store) const DEAD_DROPS_EVERY: std::time::Duration =
    std::time::Duration::from_secs(60);

impl Tx<'_> {
    /// Keeps the dead-letter table within `dead_letter.max_jobs`, oldest out first.
    pub(in crate::store) fn trim_dead(&mut self, stream: &str) -> Result<(), StoreError> {
        let (txn, st) = self.txn_and_stream(stream)?;
        if st.counters.dead_jobs <= st.cfg.dead_max_jobs {
            return Ok(());
        }
        let mut dead = txn.open_table(st.dead_def())?;
        let mut files = Vec::new();
        while st.counters.dead_jobs > st.cfg.dead_max_jobs {
            let Some((_, v)) = dead.pop_first()? else {
                break;
            };
            let recs = st.counters.remove_job(Table::Dead, format::size(v.value()));
            st.counters.dropped_dead_full_records += recs;
            files.extend(file_value(v.value()));
            // A sink refusing everything drops one per new dead letter: the first is logged,
            // the rest counted per minute (the counter has them all).
            let first = crate::logging::summary::first(
                &format!("dead full {stream}"),
                recs,
                DEAD_DROPS_EVERY,
                || {
                    let stream = stream.to_string();
                    move |n, records, window| {
                        tracing::warn!(
                            stream,
                            repeated = n,
                            records,
                            "dead-letter table full: {n} more oldest dead jobs dropped in the last {}s",
                            crate::logging::summary::secs(window)
                        )
                    }
                },
            );
            if first {
                tracing::warn!(
                    stream,
                    records = recs,
                    "dead-letter table full: oldest dead job dropped"
                );
            }
        }
        drop(dead);
        self.dirty.insert(stream.into());
        for raw in files {
            self.job_left(&raw, false)?;
        }
        Ok(())
    }

    /// Moves dead letters back to ready with attempts reset: up to `limit` of them (those that
    /// failed before `failed_before_ms`, or any), or the one with `id`.
    /// Returns (jobs, records) moved. They keep their ids, so they are delivered in their old order
    /// relative to each other.
    ///
    /// An unknown stream or a missing `id` is refused before anything is changed (the writer
    /// commits the rest of a shared transaction on that refusal); any other error may come part
    /// way, and then nothing of the transaction may be kept.
    pub fn replay_dead(
        &mut self,
        stream: &str,
        id: Option<u64>,
        failed_before_ms: Option<u64>,
        limit: usize,
    ) -> Result<(u64, u64), StoreError> {
        let (txn, st) = self.txn_and_stream(stream)?;
        let mut dead = txn.open_table(st.dead_def())?;
        let mut ready = txn.open_table(st.ready_def())?;
        let keys: Vec<u64> = match id {
            Some(id) => {
                if dead.get(id)?.is_none() {
                    return Err(StoreError::NoSuchJob {
                        stream: stream.into(),
                        table: "dead",
                        id,
                    });
                }
                vec![id]
            }
            None => {
                let mut keys = Vec::new();
                for e in dead.iter()? {
                    if keys.len() >= limit {
                        break;
                    }
                    let (k, v) = e?;
                    let failed_ms = format::decode(v.value()).map_or(0, |d| d.last_failed_ms);
                    if failed_before_ms.is_none_or(|t| failed_ms < t) {
                        keys.push(k.value());
                    }
                }
                keys
            }
        };
        let (mut jobs, mut records) = (0, 0);
        let mut corrupt = Vec::new();
        for k in keys {
            let Some(v) = dead.get(k)? else {
                continue;
            };
            let raw = v.value().to_vec();
            drop(v);
            let old = format::size(&raw);
            // Attempts start over; the offset stays, as the records before it are still settled.
            let value = match format::with_meta(&raw, |d| {
                fresh_meta(d.offset, d.origin.clone()).with_extras(d.clock, d.window_ms)
            }) {
                Ok(v) => v,
                Err(e) => {
                    corrupt.push((k, raw, e.to_string()));
                    continue;
                }
            };
            dead.remove(k)?;
            ready.insert(k, value.as_slice())?;
            let recs = st.counters.remove_job(Table::Dead, old);
            st.counters.add_job(
                Table::Ready,
                format::Size {
                    records: recs,
                    ..format::size(&value)
                },
            );
            st.counters.replayed_records += recs;
            jobs += 1;
            records += recs;
        }
        drop((dead, ready));
        if jobs > 0 {
            self.fed.insert(stream.into());
        }
        for (id, raw, reason) in corrupt {
            self.quarantine(stream, Table::Dead, id, None, &raw, &reason)?;
        }
        self.dirty.insert(stream.into());
        Ok((jobs, records))
    }

    /// Deletes up to `limit` dead letters (those that failed before `failed_before_ms`, or any);
    /// counted as dropped. An unknown stream is refused before anything is changed (as in
    /// [`Self::replay_dead`]).
    pub fn purge_dead(
        &mut self,
        stream: &str,
        failed_before_ms: Option<u64>,
        limit: usize,
    ) -> Result<(u64, u64), StoreError> {
        let (txn, st) = self.txn_and_stream(stream)?;
        let mut dead = txn.open_table(st.dead_def())?;
        let mut victims = Vec::new();
        for e in dead.iter()? {
            let (k, v) = e?;
            let failed_ms = format::decode(v.value()).map_or(0, |d| d.last_failed_ms);
            if victims.len() >= limit {
                break;
            }
            if failed_before_ms.is_none_or(|t| failed_ms < t) {
                victims.push((k.value(), format::size(v.value()), file_value(v.value())));
            }
        }
        let (mut jobs, mut records) = (0, 0);
        let mut files = Vec::new();
        for (id, size, file) in victims {
            dead.remove(id)?;
            let recs = st.counters.remove_job(Table::Dead, size);
            st.counters.dropped_purged_records += recs;
            jobs += 1;
            records += recs;
            files.extend(file);
        }
        drop(dead);
        self.dirty.insert(stream.into());
        for raw in files {
            self.job_left(&raw, false)?;
        }
        Ok((jobs, records))
    }
}
