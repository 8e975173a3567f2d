//! Handing jobs out and settling them: [`Tx::take`] (due retries first, then ready), [`Tx::ack`],
//! [`Tx::fail`] (to retry or dead letters) and [`Tx::settle_prefix`] (part of a job, for a sink
//! that splits it). A value that went bad is quarantined, never dropped silently. Called by the
//! writer for delivery workers.

use std::ops::Bound;

use redb::ReadableTable;

use super::Tx;
use super::quarantine::{QUARANTINE_PER_TAKE, Undecodable};
use crate::store::error::StoreError;
use crate::store::files::file_value;
use crate::store::format::{self, Meta};
use crate::store::job::{Failed, Failure, Job, Lease, Settle, job_from, job_from_value};
use crate::store::lanes::Lane;
use crate::store::layout::Table;
use crate::store::stream::StreamState;

impl Tx<'_> {
    /// Takes up to `max_jobs` due jobs, oldest first: retry jobs whose time has come, then ready
    /// ones; no more once those taken hold `max_bytes` (the first is taken whatever its size), so
    /// a taker's memory is bounded in bytes too. Jobs already in flight are skipped. A job that
    /// cannot be decoded moves to quarantine. Of a `live_first` stream's ready jobs, one take
    /// hands out one lane's, oldest first within it: the live lane's unless the backlog is alone
    /// or below its share (see `lanes`). Jobs older than the stream's `max_age` are never handed
    /// out: dropped or moved first (see `too_old`), and any such job left (beyond what one take
    /// settles) skipped.
    pub fn take(
        &mut self,
        stream: &str,
        max_jobs: usize,
        max_bytes: u64,
        now_ms: u64,
    ) -> Result<Vec<Job>, StoreError> {
        let old_at = self.settle_too_old(stream, now_ms)?;
        let store_id = self.rollback.store.id;
        let data_dir = self.rollback.store.data_dir.as_path();
        let txn = &self.txn;
        let st = self
            .rollback
            .store
            .streams
            .get_mut(stream)
            .expect("checked above");
        let mut out: Vec<Job> = Vec::new();
        let mut bytes = 0u64;
        let full = |out: &Vec<Job>, bytes: u64| out.len() >= max_jobs || bytes >= max_bytes;
        let mut bad: Vec<Undecodable> = Vec::new();
        // A sound table yields strictly increasing keys. A damaged leaf can yield a key twice or
        // out of order (redb does not check a page on an ordinary read): handing both out would
        // settle one entry for the other (acks remove by key), so the file is given up as damaged
        // instead, and salvaged.
        let disorder = |table: &str, key: String, after: String| {
            StoreError::Corrupted(format!(
                "{table}/{stream}: key {key} read after {after}: a damaged page"
            ))
        };
        {
            let retry = txn.open_table(st.retry_def())?;
            let mut last: Option<(u64, u64)> = None;
            for e in retry.range(..=(now_ms, u64::MAX))? {
                let (k, v) = e?;
                let (due, id) = k.value();
                if last.is_some_and(|l| l >= (due, id)) {
                    return Err(disorder(
                        "retry",
                        format!("{due}/{id}"),
                        format!("{last:?}"),
                    ));
                }
                last = Some((due, id));
                // The entry after the last one taken is read too, for its order: a damaged key
                // repeats the one before it or the one after it.
                if full(&out, bytes) || bad.len() >= QUARANTINE_PER_TAKE {
                    break;
                }
                if st.in_flight.contains(&id) || too_old(v.value(), old_at) {
                    continue;
                }
                match job_from(store_id, data_dir, stream, id, Some(due), v.value()) {
                    Ok(job) => {
                        bytes += v.value().len() as u64;
                        out.push(job);
                    }
                    Err(e) => bad.push((Table::Retry, id, Some(due), v.value().to_vec(), e)),
                }
            }
        }
        if !full(&out, bytes) {
            let ready = txn.open_table(st.ready_def())?;
            let lane = if st.cfg.replay.live_first {
                choose_lane(&ready, st, now_ms)?
            } else {
                None
            };
            let range = match lane {
                Some((Lane::Live, b, _)) => (Bound::Included(b), Bound::Unbounded),
                Some((Lane::Backlog, b, _)) => (Bound::Unbounded, Bound::Excluded(b)),
                None => (Bound::Unbounded, Bound::Unbounded),
            };
            // While live jobs wait, the backlog is given one job at a time: each take chooses
            // again, so the present waits for one job of the past at most.
            let max_jobs = match lane {
                Some((Lane::Backlog, _, true)) => max_jobs.min(out.len() + 1),
                _ => max_jobs,
            };
            let full = |out: &Vec<Job>, bytes: u64| out.len() >= max_jobs || bytes >= max_bytes;
            let before = bytes;
            let mut last: Option<u64> = None;
            for e in ready.range(range)? {
                let (k, v) = e?;
                let id = k.value();
                if let Some(l) = last.filter(|l| *l >= id) {
                    return Err(disorder("ready", id.to_string(), l.to_string()));
                }
                last = Some(id);
                if full(&out, bytes) || bad.len() >= QUARANTINE_PER_TAKE {
                    break;
                }
                if st.in_flight.contains(&id) || too_old(v.value(), old_at) {
                    continue;
                }
                match job_from(store_id, data_dir, stream, id, None, v.value()) {
                    Ok(job) => {
                        bytes += v.value().len() as u64;
                        out.push(job);
                    }
                    Err(e) => bad.push((Table::Ready, id, None, v.value().to_vec(), e)),
                }
            }
            if let Some((lane, _, contended)) = lane {
                st.lanes.taken(lane, bytes - before, contended);
            }
        }
        for j in &out {
            st.in_flight.insert(j.lease.id);
            self.rollback.taken.push((stream.to_string(), j.lease.id));
        }
        for (table, id, due, raw, reason) in bad {
            self.quarantine(stream, table, id, due, &raw, &reason)?;
        }
        Ok(out)
    }

    /// The bytes of a leased job, without removing it.
    pub(in crate::store) fn read_leased(
        &self,
        lease: &Lease,
    ) -> Result<(Vec<u8>, Table), StoreError> {
        self.check_lease(lease)?;
        let txn = &self.txn;
        let st = self.stream(&lease.stream)?;
        let (raw, table) = match lease.retry_due {
            None => {
                let t = txn.open_table(st.ready_def())?;
                let v = t.get(lease.id)?.map(|g| g.value().to_vec());
                (v, Table::Ready)
            }
            Some(due) => {
                let t = txn.open_table(st.retry_def())?;
                let v = t.get((due, lease.id))?.map(|g| g.value().to_vec());
                (v, Table::Retry)
            }
        };
        let raw = raw.ok_or(StoreError::NoSuchJob {
            stream: lease.stream.clone(),
            table: table.name(),
            id: lease.id,
        })?;
        Ok((raw, table))
    }

    /// A lease of another store file (replaced since it was handed out) names no job here.
    pub(in crate::store) fn check_lease(&self, lease: &Lease) -> Result<(), StoreError> {
        if lease.store == self.rollback.store.id {
            return Ok(());
        }
        Err(StoreError::NoSuchJob {
            stream: lease.stream.clone(),
            table: if lease.retry_due.is_some() {
                "retry"
            } else {
                "ready"
            },
            id: lease.id,
        })
    }

    /// Deletes a leased job from its table and counts it out; returns its size and, for a file
    /// job, its value (what disposing of its file needs). A job of records is not copied out.
    pub(in crate::store) fn remove_leased(
        &mut self,
        lease: &Lease,
    ) -> Result<(format::Size, Option<Vec<u8>>), StoreError> {
        self.check_lease(lease)?;
        let (txn, st) = self.txn_and_stream(&lease.stream)?;
        let seen = |g: redb::AccessGuard<'_, &'static [u8]>| {
            let v = g.value();
            (format::size(v), file_value(v))
        };
        let (removed, table) = match lease.retry_due {
            None => {
                let mut t = txn.open_table(st.ready_def())?;
                let v = t.remove(lease.id)?.map(seen);
                (v, Table::Ready)
            }
            Some(due) => {
                let mut t = txn.open_table(st.retry_def())?;
                let v = t.remove((due, lease.id))?.map(seen);
                (v, Table::Retry)
            }
        };
        st.in_flight.remove(&lease.id);
        let (size, file) = removed.ok_or(StoreError::NoSuchJob {
            stream: lease.stream.clone(),
            table: table.name(),
            id: lease.id,
        })?;
        st.counters.remove_job(table, size);
        self.dirty.insert(lease.stream.clone());
        Ok((size, file))
    }

    /// The job was delivered: delete it.
    pub fn ack(&mut self, lease: &Lease) -> Result<(), StoreError> {
        let (size, file) = self.remove_leased(lease)?;
        let st = self.stream_mut(&lease.stream)?;
        st.counters.delivered_jobs += 1;
        st.counters.delivered_records += size.records;
        st.counters.delivered_bytes += size.bytes;
        match file {
            Some(raw) => self.job_left(&raw, true),
            None => Ok(()),
        }
    }

    /// An attempt failed: the job goes to retry (same transaction) or, when the failure is
    /// permanent or attempts are used up, to dead letters with the reason.
    pub fn fail(
        &mut self,
        lease: &Lease,
        failure: &Failure,
        now_ms: u64,
    ) -> Result<Failed, StoreError> {
        // Decode before anything is removed: a value that went bad while in flight is quarantined
        // (and counted), never silently dropped.
        let (raw, table) = self.read_leased(lease)?;
        let d = match format::decode(&raw) {
            Ok(d) => d,
            Err(e) => return Err(self.quarantine_leased(lease, table, &raw, &e)),
        };
        self.remove_leased(lease)?;
        let attempts = d.attempts + 1;
        let (reason, to_dead, due) = match failure {
            Failure::Permanent { reason } => (reason.clone(), true, 0),
            Failure::Transient {
                reason,
                retry_at_ms,
                max_attempts,
            } => (reason.clone(), attempts >= *max_attempts, *retry_at_ms),
        };
        let meta = Meta::new(attempts, Some(reason), now_ms, d.offset, d.origin.clone())
            .with_extras(d.clock, d.window_ms);
        let value = format::reencode(&d, &meta);
        let size = format::size(&value);
        let (txn, st) = self.txn_and_stream(&lease.stream)?;
        if to_dead {
            txn.open_table(st.dead_def())?
                .insert(lease.id, value.as_slice())?;
            st.counters.add_job(Table::Dead, size);
            st.counters.dead_lettered_records += size.records;
            let stream = lease.stream.clone();
            self.trim_dead(&stream)?;
            Ok(Failed::Dead { attempts })
        } else {
            txn.open_table(st.retry_def())?
                .insert((due, lease.id), value.as_slice())?;
            st.counters.add_job(Table::Retry, size);
            st.counters.retried_attempts += 1;
            Ok(Failed::Retry {
                attempts,
                due_ms: due,
            })
        }
    }

    /// Settles the first `n` records of a leased job, for a sink that split it and finished this
    /// part: they count as delivered, or become a dead letter of their own (a new id, the job's age,
    /// attempts and offset, `reason` as its error). The job is rewritten in place without them (same
    /// table and key, still in flight), its `offset` grown by `n`, its attempts and last error kept,
    /// so a crash after the commit re-sends only what is left. Returns the job as `take` would now
    /// hand it out. `n` must leave at least one record: a whole job is acked or failed instead.
    pub fn settle_prefix(
        &mut self,
        lease: &Lease,
        n: u32,
        outcome: &Settle,
        now_ms: u64,
    ) -> Result<Job, StoreError> {
        // Decode before anything changes: a value that went bad while in flight is quarantined
        // (and counted), as `fail` does.
        let (raw, table) = self.read_leased(lease)?;
        let d = match format::decode(&raw) {
            Ok(d) => d,
            Err(e) => return Err(self.quarantine_leased(lease, table, &raw, &e)),
        };
        let records = d.header.records;
        if n == 0 || n >= records {
            return Err(StoreError::InvalidSettle {
                stream: lease.stream.clone(),
                id: lease.id,
                n,
                records,
            });
        }
        // The parts are stored as the job was: compressed again when it was compressed.
        let recs = match d.area.to_records() {
            Ok(r) => r,
            Err(e) => return Err(self.quarantine_leased(lease, table, &raw, &e)),
        };
        let codec = d.area.codec;
        let (head, tail) = recs.split_at(n as usize);
        let encode = |meta: &Meta, part: &[Vec<u8>]| {
            let (plain, framing) = format::frame(part);
            let count = u32::try_from(part.len()).expect("a part of a job");
            format::encode_area(d.header.created_ms, meta, &plain, framing, count, codec)
        };
        // Cannot overflow: decode guarantees offset + records fits in a u32, and n < records.
        let offset = d.offset + n;
        let rest = encode(
            &Meta::new(
                d.attempts,
                d.last_error.clone(),
                d.last_failed_ms,
                offset,
                d.origin.clone(),
            )
            .with_extras(d.clock, d.window_ms),
            tail,
        );
        let (old, new) = (format::size(&raw), format::size(&rest));
        let (txn, st) = self.txn_and_stream(&lease.stream)?;
        // Same key: the job keeps its place in the queue (and in the retry schedule).
        match lease.retry_due {
            None => {
                txn.open_table(st.ready_def())?
                    .insert(lease.id, rest.as_slice())?;
            }
            Some(due) => {
                txn.open_table(st.retry_def())?
                    .insert((due, lease.id), rest.as_slice())?;
            }
        }
        // Out with the old value, in with the shorter one. Clamped like every removal, so counters
        // that were short cannot underflow; `cut` is what left the table and is counted on.
        let all = st.counters.remove_job(table, old);
        let cut = u64::from(n).min(all);
        st.counters.add_job(
            table,
            format::Size {
                records: all - cut,
                ..new
            },
        );
        let trim = match outcome {
            Settle::Delivered => {
                st.counters.delivered_records += cut;
                // What the stored value shrank by: over a job's life the parts add up to the
                // value's size, as one ack of the whole job would have counted.
                st.counters.delivered_bytes += old.bytes.saturating_sub(new.bytes);
                false
            }
            Settle::Dead { reason } => {
                let dead_id = st.counters.next_id;
                st.counters.next_id += 1;
                let meta = Meta::new(
                    d.attempts,
                    Some(reason.clone()),
                    now_ms,
                    d.offset,
                    d.origin.clone(),
                )
                .with_extras(d.clock, d.window_ms);
                let value = encode(&meta, head);
                txn.open_table(st.dead_def())?
                    .insert(dead_id, value.as_slice())?;
                st.counters.add_job(
                    Table::Dead,
                    format::Size {
                        records: cut,
                        ..format::size(&value)
                    },
                );
                st.counters.dead_lettered_records += cut;
                true
            }
        };
        self.dirty.insert(lease.stream.clone());
        if trim {
            self.trim_dead(&lease.stream)?;
        }
        job_from_value(lease.clone(), rest).map_err(|e| StoreError::Corrupted(e.to_string()))
    }
}

/// For a `live_first` stream: the lane this take serves, the live lane's first id, and whether
/// the other lane had jobs waiting too; `None` when neither has any to hand out.
fn choose_lane(
    ready: &impl ReadableTable<u64, &'static [u8]>,
    st: &mut StreamState,
    now_ms: u64,
) -> Result<Option<(Lane, u64, bool)>, StoreError> {
    let cutoff = now_ms.saturating_sub(st.cfg.replay.window_ms());
    let b = st.lanes.boundary(ready, cutoff)?;
    // Jobs in flight are few (a take's worth per worker): skipping them is short.
    let waiting = |range: (Bound<u64>, Bound<u64>)| -> Result<bool, StoreError> {
        for e in ready.range(range)? {
            if !st.in_flight.contains(&e?.0.value()) {
                return Ok(true);
            }
        }
        Ok(false)
    };
    let backlog = waiting((Bound::Unbounded, Bound::Excluded(b)))?;
    let live = waiting((Bound::Included(b), Bound::Unbounded))?;
    let share = st.cfg.replay.backfill_share;
    Ok(st
        .lanes
        .choose(share, backlog, live)
        .map(|lane| (lane, b, backlog && live)))
}

/// Whether a job is older than its stream's `max_age` (created at or before `before`): one that
/// a take left for the next (see `too_old`). A value whose header cannot be read is not: it is
/// quarantined by the take.
fn too_old(value: &[u8], before: Option<u64>) -> bool {
    before.is_some_and(|t| format::header(value).is_ok_and(|h| h.created_ms <= t))
}
