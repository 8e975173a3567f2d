//! Per-stream counters: the accounting identity the store keeps after every commit, and the
//! arithmetic of moving a job in and out of a table. Persisted by the transaction (COUNTERS) and
//! read at open; shown by `/metrics` and `colibri queue stats`. It does not touch the database.

use serde::Serialize;

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

    /// `appended = delivered + dropped + expired + quarantined + dead + pending`.
    pub fn balanced(&self) -> bool {
        self.appended_records
            == self.delivered_records
                + self.dropped_records()
                + self.expired_records
                + self.quarantined_records
                + self.dead_records
                + self.pending_records()
    }

    pub(super) fn table_mut(&mut self, table: Table) -> (&mut u64, &mut u64, &mut u64) {
        match table {
            Table::Ready => (
                &mut self.ready_jobs,
                &mut self.ready_records,
                &mut self.ready_bytes,
            ),
            Table::Retry => (
                &mut self.retry_jobs,
                &mut self.retry_records,
                &mut self.retry_bytes,
            ),
            Table::Dead => (
                &mut self.dead_jobs,
                &mut self.dead_records,
                &mut self.dead_bytes,
            ),
        }
    }

    /// Counts one job out of `table`; returns the records counted out. Clamped, so a header that
    /// claims more than the table holds cannot underflow the counters.
    pub(super) fn remove_job(&mut self, table: Table, records: u64, bytes: u64) -> u64 {
        let (j, r, b) = self.table_mut(table);
        let records = records.min(*r);
        *j = j.saturating_sub(1);
        *r -= records;
        *b = b.saturating_sub(bytes);
        records
    }

    /// Counts one job into `table`.
    pub(super) fn add_job(&mut self, table: Table, records: u64, bytes: u64) {
        let (j, r, b) = self.table_mut(table);
        *j += 1;
        *r += records;
        *b += bytes;
    }

    pub(super) fn queued_bytes(&self) -> u64 {
        self.ready_bytes + self.retry_bytes
    }

    pub(super) fn stored_bytes(&self) -> u64 {
        self.ready_bytes + self.retry_bytes + self.dead_bytes
    }
}
