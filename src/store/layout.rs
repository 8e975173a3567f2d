//! The table layout of the database file: its name, the layout version, the shared tables and
//! which of a stream's three tables a job is in. A change here is a change of the file format: a
//! table or key is only ever added. Used by the rest of the store; nothing outside it.

use redb::TableDefinition;

/// The file in `data_dir`.
pub const DB_FILE: &str = "colibri.redb";
/// The version of the table layout; refuse to open a newer one.
pub(super) const LAYOUT_VERSION: u64 = 1;
/// The key in META of the store's random id (see [`Store::id`]).
pub(super) const STORE_ID: &str = "store_id";
pub(super) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
pub(super) const COUNTERS: TableDefinition<(&str, &str), u64> = TableDefinition::new("counters");
pub(super) const CHECKPOINTS: TableDefinition<&str, &[u8]> = TableDefinition::new("checkpoints");
/// How far the salvage of each damaged file went, by [`super::salvage::progress_key`]: a
/// postcard [`super::salvage::Progress`].
pub(super) const SALVAGE: TableDefinition<&str, &[u8]> = TableDefinition::new("salvage");
pub(super) const QUARANTINE: TableDefinition<u64, &[u8]> = TableDefinition::new("quarantine");
/// Spooled files a job ships, by their path relative to the data directory: a postcard
/// [`SpoolEntry::Queued`].
pub(super) const SPOOL: TableDefinition<&[u8], &[u8]> = TableDefinition::new("spool");
/// Spooled files whose jobs left the store, not yet deleted or archived: [`SpoolEntry::Dispose`].
pub(super) const DISPOSE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("spool_dispose");
#[derive(Debug, Clone, Copy)]
pub(super) enum Table {
    Ready,
    Retry,
    Dead,
}

impl Table {
    pub(super) fn name(self) -> &'static str {
        match self {
            Table::Ready => "ready",
            Table::Retry => "retry",
            Table::Dead => "dead",
        }
    }
}
/// A new store's id: random, so two files (on one box or many) practically never share one; never
/// 0, which stands for "no id".
pub(super) fn new_store_id() -> u64 {
    fastrand::u64(1..)
}
