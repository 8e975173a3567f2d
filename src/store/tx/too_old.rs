//! Jobs older than their stream's `max_age` when a take comes: never handed out. `drop` deletes
//! them, counted as expired (see `expire`); `stream:NAME` moves them, each with its idempotency
//! key (its store, id and stream written into it as its origin, see `format`), to the end of
//! another stream's ready queue in the take's own transaction, counted as moved out of the one
//! and moved into the other, so both identities hold at every commit. Called by `take`.

use super::Tx;
use super::expire::cutoff;
use crate::store::error::StoreError;
use crate::store::format::{self, Origin};
use crate::store::job::fresh_meta;
use crate::store::layout::Table;
use crate::store::stream::{OnMaxAge, WhenFull};

/// Bytes of jobs one take moves at most (a job is moved whatever its size when none has been):
/// they are held in memory between the two streams. The rest waits for the next take, which
/// skips them meanwhile (see [`Tx::take`]).
const MOVE_CHUNK_BYTES: u64 = 8 << 20;

impl Tx<'_> {
    /// Settles `stream`'s jobs older than its `max_age` (none in flight) before a take hands any
    /// out, as its `on_max_age` says. The creation time at or before which a job is too old, when
    /// the stream has a `max_age`: the take skips any such job it still finds.
    pub(in crate::store) fn settle_too_old(
        &mut self,
        stream: &str,
        now_ms: u64,
    ) -> Result<Option<u64>, StoreError> {
        let Some(max_age) = self.stream(stream)?.cfg.max_age.clone() else {
            return Ok(None);
        };
        let before = cutoff(now_ms, max_age.age);
        match &max_age.then {
            OnMaxAge::Drop => {
                let expired = self.expire_stream(stream, before)?;
                if expired > 0 {
                    tracing::debug!(
                        stream,
                        records = expired,
                        "jobs older than the stream's max_age expired unsent"
                    );
                }
            }
            OnMaxAge::Move(to) => {
                let moved = self.move_too_old(stream, to, before)?;
                if moved > 0 {
                    tracing::debug!(
                        stream,
                        to,
                        records = moved,
                        "jobs older than the stream's max_age moved"
                    );
                }
            }
        }
        Ok(Some(before))
    }

    /// Moves `from`'s jobs created at or before `before` (ready and retry, none in flight, up to
    /// [`MOVE_CHUNK_BYTES`]) to the end of `to`'s ready queue; returns records.
    fn move_too_old(&mut self, from: &str, to: &str, before: u64) -> Result<u64, StoreError> {
        let store_id = self.rollback.store.id;
        let (mut moving, mut bytes) = (Vec::new(), 0u64);
        let records = self.remove_old(from, before, &mut |id, value| {
            if bytes >= MOVE_CHUNK_BYTES {
                return false;
            }
            bytes += value.len() as u64;
            moving.push((id, value.to_vec()));
            true
        })?;
        if moving.is_empty() {
            return Ok(0);
        }
        self.stream_mut(from)?.counters.moved_out_records += records;
        self.dirty.insert(from.to_string());
        for (id, raw) in moving {
            let value = with_origin(&raw, store_id, from, id);
            self.move_in(to, &value)?;
        }
        if self.stream(to)?.cfg.when_full == WhenFull::DropOldest {
            // Back within its bounds, as an append there would be.
            self.drop_oldest_until_fits(to, 0, 0, 0)?;
        }
        Ok(records)
    }

    /// Puts one moved job at the end of `to`'s ready queue, counted in.
    fn move_in(&mut self, to: &str, value: &[u8]) -> Result<(), StoreError> {
        let (txn, st) = self.txn_and_stream(to)?;
        let id = st.counters.next_id;
        txn.open_table(st.ready_def())?.insert(id, value)?;
        st.counters.next_id += 1;
        let size = format::size(value);
        st.counters.add_job(Table::Ready, size);
        st.counters.moved_in_records += size.records;
        self.dirty.insert(to.to_string());
        self.fed.insert(to.to_string());
        self.file_job_moved(value, to, id)
    }
}

/// A moved job's value: attempts start over (its new stream's sink has not tried it), and its
/// key stays the one it had (a salvaged job's store and id, and the stream it was moved from). A
/// value that cannot be decoded moves as it is, to be quarantined when its turn comes there.
fn with_origin(raw: &[u8], store: u64, stream: &str, id: u64) -> Vec<u8> {
    format::with_meta(raw, |d| {
        let o = d.origin.clone();
        let origin = Origin {
            store: o.as_ref().map_or(store, |o| o.store),
            job: o.as_ref().map_or(id, |o| o.job),
            stream: Some(
                o.and_then(|o| o.stream)
                    .unwrap_or_else(|| stream.to_string()),
            ),
        };
        fresh_meta(d.offset, Some(origin)).with_extras(d.clock, d.window_ms)
    })
    .unwrap_or_else(|_| raw.to_vec())
}
