//! Per-stream counters: the accounting identity the store keeps after every commit, and the
//! arithmetic of moving a job in and out of a table. Persisted by the transaction (COUNTERS) and
//! read at open; shown by `/metrics` and `colibri queue stats`. It does not touch the database.

use serde::Serialize;

use super::format::Size;
use super::layout::Table;

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// Per-stream counters, persisted in the same transaction as the change they count.
        #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
        pub struct Counters { $($(#[$doc])* pub $name: u64,)* }

        impl Counters {
            pub(super) const NAMES: &'static [&'static str] = &[$(stringify!($name)),*];

            pub(super) fn values(&self) -> Vec<u64> {
                vec![$(self.$name),*]
            }

            pub(super) fn set(&mut self, name: &str, value: u64) {
                match name {
                    $(stringify!($name) => self.$name = value,)*
                    _ => {}
                }
            }
        }
    };
}

counters! {
    /// The next job id.
    next_id,
    ready_jobs, ready_records, ready_bytes,
    retry_jobs, retry_records, retry_bytes,
    dead_jobs, dead_records, dead_bytes,
    appended_jobs, appended_records,
    delivered_jobs, delivered_records, delivered_bytes,
    /// Failed attempts that went to retry.
    retried_attempts,
    /// Jobs moved to dead letters (a flow; `dead_*` is what is there now).
    dead_lettered_records,
    /// Dead letters moved back to ready by an operator.
    replayed_records,
    dropped_oldest_records, dropped_newest_records, dropped_purged_records, dropped_dead_full_records,
    expired_records,
    quarantined_records,
    /// What the queued and dead jobs would take uncompressed (`*_bytes` is what they take on
    /// disk). Stores written before compression have no such counters: see [`Counters::set`].
    ready_raw_bytes, retry_raw_bytes, dead_raw_bytes,
    /// Records that were queued or dead in a damaged store file and are being salvaged: they
    /// leave this term as they are put back, and what is left when the salvage ends is lost.
    salvaging_records,
    /// Records lost to a damaged store file: not intact, or of a file whose counters were read
    /// and whose salvage has ended.
    lost_to_damage_records,
    /// Records of old copies a salvage put back "in doubt" (copies that were not live at the
    /// damaged file's last commit, taken where its live tree was incomplete): most were delivered
    /// before, so they are counted as a re-send, appended again, never as filling what was lost.
    salvage_resent_records,
    /// Records of jobs moved here from another stream (`on_max_age: stream:NAME` there): they
    /// come in as appended records do.
    moved_in_records,
    /// Records of jobs older than `max_age` moved to another stream: they left this one for good.
    moved_out_records,
    /// `when_full: downsample`: records (raw, or aggregates of a finer window) replaced by
    /// aggregates, and the aggregates written in their place.
    downsampled_in_records,
    downsampled_out_records,
}

impl Counters {
    /// Records waiting for delivery.
    pub fn pending_records(&self) -> u64 {
        self.ready_records + self.retry_records
    }

    pub fn dropped_records(&self) -> u64 {
        self.dropped_oldest_records
            + self.dropped_newest_records
            + self.dropped_purged_records
            + self.dropped_dead_full_records
    }

    /// `appended + moved in + aggregates written = delivered + dropped + expired + quarantined +
    /// lost to damage + moved out + records aggregated + dead + pending + salvaging`.
    pub fn balanced(&self) -> bool {
        self.appended_records + self.moved_in_records + self.downsampled_out_records
            == self.settled_records() + self.held_records()
    }

    /// Records that left the queue for good, one way or another.
    fn settled_records(&self) -> u64 {
        self.delivered_records
            + self.dropped_records()
            + self.expired_records
            + self.quarantined_records
            + self.lost_to_damage_records
            + self.moved_out_records
            + self.downsampled_in_records
    }

    /// Records still held: queued, dead, or being salvaged.
    fn held_records(&self) -> u64 {
        self.dead_records + self.pending_records() + self.salvaging_records
    }

    /// A damaged store file's counters (`old`, as its last commit left them) carried on here, in
    /// the store that replaced it: its flows are added, and what it held (queued, dead, still
    /// being salvaged itself) is being salvaged now, until [`Counters::salvaged`] or
    /// [`Counters::salvage_ended`]. An `old` that does not balance (counters from an older copy)
    /// is counted as if it did, appended covering what it says it holds. What moved in there is
    /// carried on as appended.
    pub(super) fn carry_on(&mut self, old: &Counters) {
        let settled = old.settled_records();
        let made = old.downsampled_out_records;
        let appended = (old.appended_records + old.moved_in_records)
            .max((settled + old.held_records()).saturating_sub(made));
        self.appended_jobs += old.appended_jobs;
        self.appended_records += appended;
        self.delivered_jobs += old.delivered_jobs;
        self.delivered_records += old.delivered_records;
        self.delivered_bytes += old.delivered_bytes;
        self.retried_attempts += old.retried_attempts;
        self.dead_lettered_records += old.dead_lettered_records;
        self.replayed_records += old.replayed_records;
        self.dropped_oldest_records += old.dropped_oldest_records;
        self.dropped_newest_records += old.dropped_newest_records;
        self.dropped_purged_records += old.dropped_purged_records;
        self.dropped_dead_full_records += old.dropped_dead_full_records;
        self.expired_records += old.expired_records;
        self.quarantined_records += old.quarantined_records;
        self.lost_to_damage_records += old.lost_to_damage_records;
        self.salvage_resent_records += old.salvage_resent_records;
        self.moved_out_records += old.moved_out_records;
        self.downsampled_in_records += old.downsampled_in_records;
        self.downsampled_out_records += made;
        self.salvaging_records += (appended + made).saturating_sub(settled);
    }

    /// A salvaged job of `records` is back (its table counts it). A job live at the old file's
    /// last commit comes out of what its file's salvage still holds (`file`, that file's share of
    /// `salvaging_records`), or, beyond that (no counters were carried on, or they were older than
    /// the jobs), is appended. An old copy (`live` false) is a re-send, appended again: it must
    /// not fill the share a lost job left, or a loss would be netted against a re-send. A held
    /// job whose only intact copy was an old one is so counted lost and re-sent (the loss is an
    /// upper bound, never hidden).
    pub(super) fn salvaged(&mut self, records: u64, live: bool, file: &mut u64) {
        if !live {
            self.appended_jobs += 1;
            self.appended_records += records;
            self.salvage_resent_records += records;
            return;
        }
        let from = records.min(*file).min(self.salvaging_records);
        *file -= from;
        self.salvaging_records -= from;
        if from < records {
            self.appended_jobs += 1;
            self.appended_records += records - from;
        }
    }

    /// A file's salvage ended: what it did not put back (`file`, its share) is lost; returns the
    /// records so booked.
    pub(super) fn salvage_ended(&mut self, file: u64) -> u64 {
        let n = file.min(self.salvaging_records);
        self.salvaging_records -= n;
        self.lost_to_damage_records += n;
        n
    }

    /// A table's (jobs, records, bytes, raw bytes).
    pub(super) fn table_mut(&mut self, table: Table) -> [&mut u64; 4] {
        match table {
            Table::Ready => [
                &mut self.ready_jobs,
                &mut self.ready_records,
                &mut self.ready_bytes,
                &mut self.ready_raw_bytes,
            ],
            Table::Retry => [
                &mut self.retry_jobs,
                &mut self.retry_records,
                &mut self.retry_bytes,
                &mut self.retry_raw_bytes,
            ],
            Table::Dead => [
                &mut self.dead_jobs,
                &mut self.dead_records,
                &mut self.dead_bytes,
                &mut self.dead_raw_bytes,
            ],
        }
    }

    /// Counts one job out of `table`; returns the records counted out. Clamped, so a header that
    /// claims more than the table holds cannot underflow the counters.
    pub(super) fn remove_job(&mut self, table: Table, size: Size) -> u64 {
        let [j, r, b, raw] = self.table_mut(table);
        let records = size.records.min(*r);
        *j = j.saturating_sub(1);
        *r -= records;
        *b = b.saturating_sub(size.bytes);
        *raw = raw.saturating_sub(size.raw);
        records
    }

    /// Counts one job into `table`.
    pub(super) fn add_job(&mut self, table: Table, size: Size) {
        let [j, r, b, raw] = self.table_mut(table);
        *j += 1;
        *r += size.records;
        *b += size.bytes;
        *raw += size.raw;
    }

    /// Raw bytes queued and dead (what `stored_bytes` would be uncompressed).
    pub fn raw_bytes(&self) -> u64 {
        self.ready_raw_bytes + self.retry_raw_bytes + self.dead_raw_bytes
    }

    /// A store written before raw byte counters existed held only uncompressed jobs: their raw
    /// bytes are their bytes.
    pub(super) fn raw_from_bytes(&mut self) {
        self.ready_raw_bytes = self.ready_bytes;
        self.retry_raw_bytes = self.retry_bytes;
        self.dead_raw_bytes = self.dead_bytes;
    }

    pub(super) fn queued_bytes(&self) -> u64 {
        self.ready_bytes + self.retry_bytes
    }

    pub(super) fn stored_bytes(&self) -> u64 {
        self.ready_bytes + self.retry_bytes + self.dead_bytes
    }
}
