//! The durable store: the only code that talks to redb. One database file in `data_dir`; per stream a
//! `ready` table (job id -> job, FIFO), a `retry` table ((due ms, job id) -> job) and a `dead` table
//! (job id -> job); shared tables for metadata (layout version, the store's random id), persistent
//! counters, source checkpoints and quarantine. Values are [`format`] bytes.
//!
//! [`Store`] is synchronous and single-owner: every change happens inside a [`Tx`] (one redb write
//! transaction, committed with `Durability::Immediate`), and the in-memory counters of a transaction
//! that does not commit are reloaded from disk. The async side, with group commit and producers that
//! block, is [`writer`]. Operators' commands (`colibri queue ...`) use `Store` directly on a stopped
//! agent. It does not know about HTTP, sinks or the config file.
//!
//! Accounting, per stream, in records, holds after every commit and across restarts:
//! `appended = delivered + dropped (by reason) + expired + quarantined + dead + ready + retry`.
//! A job may be settled in parts ([`Tx::settle_prefix`], for a sink that splits a job): its first
//! records are delivered or dead-lettered and cut from it, and its `offset` says how many, so a
//! record is never counted (or sent) twice.
//!
//! A *file job* ships one file that a `file_move` task spooled into `data_dir/spool/` (see
//! [`spool`]): the job refers to the file, and its bytes count towards the bounds. The SPOOL table
//! lists each spooled file while a job refers to it; the transaction that removes the job
//! (delivered, dropped, expired, purged) moves its entry to DISPOSE (delete the file, or move it to
//! the task's `archive` after delivery), and the entry is forgotten once that is done on disk, so a
//! crash at any point neither re-sends a delivered file nor loses a queued one. Start-up reads only
//! DISPOSE (normally empty), never the list of queued files.

pub mod format;
pub mod spool;
pub mod writer;

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redb::{
    ConcurrencyMode, Database, DatabaseError, Durability, ReadableDatabase, ReadableTable,
    ReadableTableMetadata, StorageBackend, TableDefinition, WriteTransaction,
};
use serde::Serialize;

use format::Meta;

/// Jobs one `expire` call deletes per table at most, so a sweep after a long outage is a series of
/// bounded transactions rather than one that holds every victim in memory.
pub const EXPIRE_CHUNK: usize = 10_000;
/// Undecodable values one `take` moves to quarantine at most (each costs a scan of its table).
const QUARANTINE_PER_TAKE: usize = 16;
/// Dead letters dropped from a full dead-letter table are logged once, then counted this often.
const DEAD_DROPS_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// The file in `data_dir`.
pub const DB_FILE: &str = "colibri.redb";
/// The version of the table layout; refuse to open a newer one.
const LAYOUT_VERSION: u64 = 1;
/// The key in META of the store's random id (see [`Store::id`]).
const STORE_ID: &str = "store_id";
/// redb's page cache. Its default is 1 GiB; colibri reads the backlog in bounded windows and writes
/// in group commits, so a small cache keeps memory flat however large the backlog.
const CACHE_BYTES: usize = 4 << 20;

const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const COUNTERS: TableDefinition<(&str, &str), u64> = TableDefinition::new("counters");
const CHECKPOINTS: TableDefinition<&str, &[u8]> = TableDefinition::new("checkpoints");
const QUARANTINE: TableDefinition<u64, &[u8]> = TableDefinition::new("quarantine");
/// Spooled files a job ships, by their path relative to the data directory: a postcard
/// [`SpoolEntry::Queued`].
const SPOOL: TableDefinition<&[u8], &[u8]> = TableDefinition::new("spool");
/// Spooled files whose jobs left the store, not yet deleted or archived: [`SpoolEntry::Dispose`].
const DISPOSE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("spool_dispose");

/// What became of a spooled file. Variants are only ever appended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
enum SpoolEntry {
    /// A job (ready, retry or dead) ships it.
    Queued { stream: String, job: u64 },
    /// Its job left the store: the file is to be deleted, or moved into `archive` (delivered).
    Dispose {
        name: Vec<u8>,
        archive: Option<Vec<u8>>,
    },
}

fn spool_entry(bytes: &[u8]) -> Option<SpoolEntry> {
    postcard::from_bytes(bytes).ok()
}

fn spool_bytes(e: &SpoolEntry) -> Vec<u8> {
    postcard::to_stdvec(e).expect("postcard encodes a plain enum into a Vec")
}

/// A spooled file whose job left the store, to delete or archive (see [`spool::dispose`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disposal {
    /// Relative to the data directory.
    pub spool: Vec<u8>,
    /// Its original name (kept when archived).
    pub name: Vec<u8>,
    /// Delivered, and to be moved into this directory; otherwise deleted.
    pub archive: Option<Vec<u8>>,
}

/// What `append_file` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileAppend {
    /// A new job ships the file.
    Queued { id: u64 },
    /// The file was known already (queued, or delivered and being disposed of): nothing added.
    Known,
}

/// What a stream may hold and how it behaves when full. Built by `config::compile`.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamConfig {
    pub name: String,
    /// The sink's name, when the stream is delivered.
    pub sink: Option<String>,
    pub batch: BatchConfig,
    pub max_jobs: u64,
    pub max_bytes: u64,
    pub when_full: WhenFull,
    pub ttl: Option<Duration>,
    pub dead_max_jobs: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchConfig {
    pub max_records: u32,
    pub max_bytes: u64,
    /// How long a source may hold records back to fill a job (used by sources, not here).
    pub linger: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StorageConfig {
    /// Bytes of job values across all streams (ready, retry and dead).
    pub max_bytes: u64,
    /// Free bytes the filesystem keeps; below it every stream is full.
    pub min_free: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenFull {
    Block,
    DropOldest,
    DropNewest,
}

impl std::fmt::Display for WhenFull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WhenFull::Block => "block",
            WhenFull::DropOldest => "drop_oldest",
            WhenFull::DropNewest => "drop_newest",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A read, write or commit failed. A failed commit may still have been durable: the outcome is
    /// unknown, so nothing is acknowledged and the job may be delivered again (at-least-once).
    #[error("storage i/o error: {0}")]
    Io(String),
    #[error("the database is corrupted: {0}")]
    Corrupted(String),
    #[error("{} is in use by another process (is colibri running?)", path.display())]
    Locked { path: PathBuf },
    #[error("{} has layout version {found}, newer than this colibri understands ({LAYOUT_VERSION}); upgrade colibri", path.display())]
    NewerLayout { path: PathBuf, found: u64 },
    #[error("{} was not closed cleanly and must be repaired by a writable open first", path.display())]
    NeedsRepair { path: PathBuf },
    #[error("unknown stream {0:?}")]
    UnknownStream(String),
    #[error("the store is open read-only (is colibri running? stop it to change the queues)")]
    ReadOnly,
    #[error("no job {id} in {table} of stream {stream:?}")]
    NoSuchJob {
        stream: String,
        table: &'static str,
        id: u64,
    },
    /// `settle_prefix` settles part of a job: at least one record and not all of them (a whole job
    /// is acked or failed). Nothing was changed.
    #[error(
        "cannot settle the first {n} of the {records} records of job {id} in stream {stream:?}: a part settles at least one record and leaves at least one (ack or fail the whole job instead)"
    )]
    InvalidSettle {
        stream: String,
        id: u64,
        n: u32,
        records: u32,
    },
}

impl StoreError {
    /// Whether the message names the database file already, so a caller adding "cannot open
    /// <file>" would say it twice.
    pub fn names_file(&self) -> bool {
        matches!(
            self,
            StoreError::Locked { .. }
                | StoreError::NewerLayout { .. }
                | StoreError::NeedsRepair { .. }
        )
    }
}

/// Why a stream cannot take more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FullReason {
    /// The stream's `max_jobs`.
    Jobs,
    /// The stream's `max_bytes`.
    Bytes,
    /// `storage.max_bytes` across all streams.
    Budget,
    /// Free disk below `storage.min_free`.
    MinFree,
}

impl FullReason {
    /// The disk itself (not the stream's own bound) is what is exhausted.
    pub fn is_disk(self) -> bool {
        matches!(self, FullReason::Budget | FullReason::MinFree)
    }
}

impl std::fmt::Display for FullReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FullReason::Jobs => "max_jobs reached",
            FullReason::Bytes => "max_bytes reached",
            FullReason::Budget => "storage.max_bytes reached",
            FullReason::MinFree => "free disk below storage.min_free",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    /// Nothing was stored. Under `block` the caller may wait and try again.
    #[error("stream {stream:?} is full: {reason}")]
    Full { stream: String, reason: FullReason },
    /// `drop_newest`: the records were refused and counted as dropped.
    #[error(
        "stream {stream:?} is full ({reason}): {records} records dropped (when_full: drop_newest)"
    )]
    Refused {
        stream: String,
        reason: FullReason,
        records: u64,
    },
    /// The append can never be stored, whatever is delivered or deleted: one record larger than the
    /// stream's `max_bytes`, or a batch with more jobs than its `max_jobs` or more bytes than its
    /// `max_bytes` or `storage.max_bytes`. Nothing was stored; `size` and `max` are in the unit of
    /// the bound exceeded (jobs or bytes), `why` says which.
    #[error("{why}")]
    TooLarge {
        stream: String,
        size: u64,
        max: u64,
        why: String,
    },
    /// colibri is stopping: an append that would wait for room is answered at once instead.
    /// Nothing was stored.
    #[error("colibri is stopping: nothing was stored")]
    Stopping,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What an accepted append did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Appended {
    pub jobs: u64,
    pub records: u64,
    /// Records of older jobs deleted to make room (`drop_oldest`).
    pub dropped_oldest: u64,
}

/// Identifies a taken job so it can be acknowledged, failed or released.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Lease {
    pub stream: String,
    pub id: u64,
    /// The id of the store file that handed it out: a lease from a file since replaced (ids
    /// start over in a new one) must never settle the new file's job of the same id.
    pub store: u64,
    /// `Some(due)` when the job was taken from the retry table.
    pub retry_due: Option<u64>,
}

/// A job handed out for delivery.
#[derive(Debug, Clone)]
pub struct Job {
    pub lease: Lease,
    pub created_ms: u64,
    pub attempts: u32,
    pub last_error: Option<String>,
    /// Records of this job as first appended that were settled and cut from it before: its first
    /// record is record `offset` of the original job (an idempotency key stays stable across
    /// splits, and differs between the parts).
    pub offset: u32,
    /// The stored value (one copy out of the database, verified); records are read from it in place.
    value: Vec<u8>,
    /// For a file job, the spooled file it ships.
    file: Option<FileJob>,
}

/// The file a file job ships.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileJob {
    /// Where it is spooled (absolute).
    pub path: PathBuf,
    /// Its name where it was taken from.
    pub name: std::ffi::OsString,
    pub len: u64,
}

impl Job {
    /// For a file job: the file to ship instead of records.
    pub fn file(&self) -> Option<&FileJob> {
        self.file.as_ref()
    }

    /// The job's records, as they were appended, without copying them.
    pub fn records(&self) -> format::Records<'_> {
        format::records(&self.value)
    }

    pub fn record_count(&self) -> usize {
        format::header(&self.value).map_or(0, |h| h.records as usize)
    }

    /// Bytes the job occupies: its value and, for a file job, the file.
    pub fn bytes(&self) -> u64 {
        format::stored_len(&self.value)
    }

    /// A job as `take` would hand it out (tests of the parts downstream of the store).
    #[cfg(test)]
    pub fn for_test<R: AsRef<[u8]>>(lease: Lease, records: &[R]) -> Job {
        Job {
            lease,
            created_ms: 0,
            attempts: 0,
            last_error: None,
            offset: 0,
            value: format::encode(0, &fresh_meta(0), records),
            file: None,
        }
    }
}

/// How a delivery attempt failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Try again at `retry_at_ms`, unless attempts reach `max_attempts`.
    Transient {
        reason: String,
        retry_at_ms: u64,
        max_attempts: u32,
    },
    /// Straight to dead letters.
    Permanent { reason: String },
}

/// What became of the records `settle_prefix` cuts from the front of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settle {
    /// The sink accepted them.
    Delivered,
    /// The sink refused them for good: they become a dead letter of their own, with this reason.
    Dead { reason: String },
}

/// Where a failed job went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failed {
    Retry { attempts: u32, due_ms: u64 },
    Dead { attempts: u32 },
}

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// Per-stream counters, persisted in the same transaction as the change they count.
        #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
        pub struct Counters { $($(#[$doc])* pub $name: u64,)* }

        impl Counters {
            const NAMES: &'static [&'static str] = &[$(stringify!($name)),*];

            fn values(&self) -> Vec<u64> {
                vec![$(self.$name),*]
            }

            fn set(&mut self, name: &str, value: u64) {
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

    fn table_mut(&mut self, table: Table) -> (&mut u64, &mut u64, &mut u64) {
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
    fn remove_job(&mut self, table: Table, records: u64, bytes: u64) -> u64 {
        let (j, r, b) = self.table_mut(table);
        let records = records.min(*r);
        *j = j.saturating_sub(1);
        *r -= records;
        *b = b.saturating_sub(bytes);
        records
    }

    /// Counts one job into `table`.
    fn add_job(&mut self, table: Table, records: u64, bytes: u64) {
        let (j, r, b) = self.table_mut(table);
        *j += 1;
        *r += records;
        *b += bytes;
    }

    fn queued_bytes(&self) -> u64 {
        self.ready_bytes + self.retry_bytes
    }

    fn stored_bytes(&self) -> u64 {
        self.ready_bytes + self.retry_bytes + self.dead_bytes
    }
}

#[derive(Debug, Clone, Copy)]
enum Table {
    Ready,
    Retry,
    Dead,
}

impl Table {
    fn name(self) -> &'static str {
        match self {
            Table::Ready => "ready",
            Table::Retry => "retry",
            Table::Dead => "dead",
        }
    }
}

struct StreamState {
    cfg: StreamConfig,
    c: Counters,
    /// Jobs handed out and not yet acknowledged, failed or released. Not persisted: after a crash
    /// they are simply ready again (at-least-once).
    in_flight: HashSet<u64>,
    ready: String,
    retry: String,
    dead: String,
}

impl StreamState {
    fn new(cfg: StreamConfig) -> Self {
        StreamState {
            ready: format!("ready/{}", cfg.name),
            retry: format!("retry/{}", cfg.name),
            dead: format!("dead/{}", cfg.name),
            cfg,
            c: Counters::default(),
            in_flight: HashSet::new(),
        }
    }

    fn ready_def(&self) -> TableDefinition<'_, u64, &'static [u8]> {
        TableDefinition::new(&self.ready)
    }
    fn retry_def(&self) -> TableDefinition<'_, (u64, u64), &'static [u8]> {
        TableDefinition::new(&self.retry)
    }
    fn dead_def(&self) -> TableDefinition<'_, u64, &'static [u8]> {
        TableDefinition::new(&self.dead)
    }
}

/// Options that are not in the config file.
#[derive(Debug, Clone, Copy)]
pub struct OpenOptions {
    /// Write redb's allocator state on every commit so that opening after a crash does not walk the
    /// whole file (see BENCHMARKS.md for the cost on each side).
    pub quick_repair: bool,
    /// Refuse to write (operator inspection beside a running agent).
    pub read_only: bool,
    /// Verify every page's checksum while opening (about 0.2 s per GB), so damage shows up as
    /// `Corrupted` now rather than as a failed read later. Used when reopening after a failure.
    pub verify: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            quick_repair: true,
            read_only: false,
            verify: false,
        }
    }
}

/// The database, writable or (beside a running agent) read-only.
enum Db {
    Rw(Database),
    Ro(redb::ReadOnlyDatabase),
}

impl Db {
    fn begin_read(&self) -> Result<redb::ReadTransaction, StoreError> {
        match self {
            Db::Rw(d) => d.begin_read().map_err(io),
            Db::Ro(d) => d.begin_read().map_err(io),
        }
    }

    fn rw(&mut self) -> Result<&mut Database, StoreError> {
        match self {
            Db::Rw(d) => Ok(d),
            Db::Ro(_) => Err(StoreError::ReadOnly),
        }
    }
}

pub struct Store {
    db: Db,
    path: PathBuf,
    /// By name: ordered, so listing them needs no sort.
    streams: BTreeMap<String, StreamState>,
    storage: StorageConfig,
    opts: OpenOptions,
    /// A transaction was dropped or failed: in-memory counters may be ahead of the disk.
    stale: bool,
    /// See [`Store::id`].
    id: u64,
    /// The data directory: spooled files are relative to it.
    data_dir: PathBuf,
    /// Spooled files whose jobs left the store in committed transactions (or before the last
    /// crash), not yet disposed of: the owner takes them with [`Store::take_disposals`].
    disposals: Vec<Disposal>,
    /// Test seam: commit without waiting for the disk (the planted bug the power-loss test must catch).
    #[cfg(test)]
    pub unsafe_no_fsync: bool,
}

/// Mode of a data directory colibri creates (before the umask): the queues may hold anything a
/// producer sent, so no access for others; the group may read (the package's `StateDirectoryMode`).
pub const DATA_DIR_MODE: u32 = 0o750;

/// Creates `data_dir` (and missing parents) with [`DATA_DIR_MODE`]; one that exists is left as it
/// is. Every command that may create the store (`colibri run`, `colibri queue push`) calls this
/// first, so the directory is the same whichever came first.
pub fn create_data_dir(data_dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(DATA_DIR_MODE)
        .create(data_dir)
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn io<E: std::fmt::Display>(e: E) -> StoreError {
    StoreError::Io(e.to_string())
}

fn db_error(path: &Path, e: DatabaseError) -> StoreError {
    match e {
        DatabaseError::DatabaseAlreadyOpen => StoreError::Locked {
            path: path.to_path_buf(),
        },
        DatabaseError::RepairAborted => StoreError::NeedsRepair {
            path: path.to_path_buf(),
        },
        DatabaseError::Storage(redb::StorageError::Corrupted(m)) => StoreError::Corrupted(m),
        other => StoreError::Io(other.to_string()),
    }
}

fn builder() -> redb::Builder {
    let mut b = Database::builder();
    b.set_cache_size(CACHE_BYTES);
    // One writer (the agent or an operator's command); read-only inspection may run beside it.
    b.set_concurrency_mode(ConcurrencyMode::SingleWriter);
    b
}

/// Creates the database file so that a power cut during creation never leaves a half-made file
/// under the real name: build it under a temporary name, sync, rename, sync the directory.
fn create_fresh(path: &Path) -> Result<(), StoreError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io)?;
    let tmp = path.with_extension("redb.creating");
    let _ = std::fs::remove_file(&tmp);
    {
        let db = builder().create(&tmp).map_err(|e| db_error(&tmp, e))?;
        let txn = db.begin_write().map_err(io)?;
        {
            let mut meta = txn.open_table(META).map_err(io)?;
            meta.insert("layout", LAYOUT_VERSION).map_err(io)?;
            meta.insert(STORE_ID, new_store_id()).map_err(io)?;
            txn.open_table(COUNTERS).map_err(io)?;
            txn.open_table(CHECKPOINTS).map_err(io)?;
            txn.open_table(QUARANTINE).map_err(io)?;
            txn.open_table(SPOOL).map_err(io)?;
            txn.open_table(DISPOSE).map_err(io)?;
        }
        txn.commit().map_err(io)?;
    }
    File::open(&tmp).and_then(|f| f.sync_all()).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)?;
    File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
    Ok(())
}

impl Store {
    /// Opens (creating when missing) `data_dir/colibri.redb`. Reads only the counters, never the
    /// backlog, so start-up time and memory do not depend on how much is queued.
    pub fn open(
        data_dir: &Path,
        storage: StorageConfig,
        streams: &[StreamConfig],
        opts: OpenOptions,
    ) -> Result<Store, StoreError> {
        let path = data_dir.join(DB_FILE);
        if !path.exists() {
            if opts.read_only {
                return Err(StoreError::Io(format!("{} does not exist", path.display())));
            }
            create_fresh(&path)?;
        }
        let db = if opts.read_only {
            Db::Ro(
                builder()
                    .open_read_only(&path)
                    .map_err(|e| db_error(&path, e))?,
            )
        } else {
            // redb 4.6 can panic (an `unreachable!`) on some damaged files instead of returning
            // Corrupted; a device with a lying SD card must still come back, so treat it as one.
            let opened = std::panic::catch_unwind(|| {
                let mut b = builder();
                b.set_check_integrity_on_open(opts.verify);
                b.open(&path)
            })
            .unwrap_or_else(|panic| {
                let what = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                Err(DatabaseError::Storage(redb::StorageError::Corrupted(
                    format!("redb gave up reading the file: {what}"),
                )))
            });
            Db::Rw(opened.map_err(|e| db_error(&path, e))?)
        };
        Self::with_db(db, path, storage, streams, opts)
    }

    /// Opens a store on any redb backend (tests inject faults and power cuts here), in exclusive
    /// mode: no other process shares a backend.
    pub fn open_backend(
        backend: impl StorageBackend,
        storage: StorageConfig,
        streams: &[StreamConfig],
        opts: OpenOptions,
    ) -> Result<Store, StoreError> {
        let path = PathBuf::from("<backend>");
        // Exclusive: a test backend has no byte-range locks, and nothing else shares it.
        let mut b = builder();
        b.set_concurrency_mode(ConcurrencyMode::ExclusiveWriter);
        let db = b
            .create_with_backend(backend)
            .map_err(|e| db_error(&path, e))?;
        Self::with_db(Db::Rw(db), path, storage, streams, opts)
    }

    fn with_db(
        db: Db,
        path: PathBuf,
        storage: StorageConfig,
        streams: &[StreamConfig],
        opts: OpenOptions,
    ) -> Result<Store, StoreError> {
        let data_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let mut store = Store {
            db,
            data_dir,
            disposals: Vec::new(),
            path,
            streams: streams
                .iter()
                .map(|s| (s.name.clone(), StreamState::new(s.clone())))
                .collect(),
            storage,
            opts,
            stale: false,
            id: 0,
            #[cfg(test)]
            unsafe_no_fsync: false,
        };
        if !opts.read_only {
            // Tables exist from the first commit on, so read-only opens never miss one.
            let mut tx = store.transaction()?;
            tx.ensure_layout()?;
            tx.commit()?;
        }
        store.id = store.read_id()?;
        store.load_counters()?;
        if !opts.read_only {
            // Files whose jobs left the store before the last stop, not yet deleted or archived.
            store.disposals = store.pending_disposals()?;
        }
        Ok(store)
    }

    fn pending_disposals(&self) -> Result<Vec<Disposal>, StoreError> {
        let rtx = self.db.begin_read()?;
        let t = match rtx.open_table(DISPOSE) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(io(e)),
        };
        let mut out = Vec::new();
        for e in t.iter().map_err(io)? {
            let (k, v) = e.map_err(io)?;
            if let Some(SpoolEntry::Dispose { name, archive }) = spool_entry(v.value()) {
                out.push(Disposal {
                    spool: k.value().to_vec(),
                    name,
                    archive,
                });
            }
        }
        Ok(out)
    }

    /// Spooled files to delete or archive now: their jobs left the store in committed
    /// transactions. Once done on disk, [`Tx::forget_spool`] removes them from the DISPOSE table.
    pub fn take_disposals(&mut self) -> Vec<Disposal> {
        std::mem::take(&mut self.disposals)
    }

    /// Disposes of spooled files now and forgets them, for an operator's command on a stopped agent
    /// (a running agent's writer does this on its own thread). Returns how many were disposed of.
    pub fn dispose_now(&mut self) -> Result<usize, StoreError> {
        let mut done = Vec::new();
        for d in self.take_disposals() {
            match spool::dispose(&self.data_dir, &d) {
                Ok(()) => done.push(d.spool),
                Err(e) => tracing::error!(
                    file = %String::from_utf8_lossy(&d.spool),
                    error = %e,
                    "cannot dispose of a spooled file; tried again at the next start"
                ),
            }
        }
        if !done.is_empty() {
            let mut tx = self.transaction()?;
            tx.forget_spool(&done)?;
            tx.commit()?;
        }
        Ok(done.len())
    }

    /// Whether the store knows this spooled file (queued, or delivered and being disposed of).
    pub fn spool_known(&self, spool: &[u8]) -> Result<bool, StoreError> {
        let rtx = self.db.begin_read()?;
        for table in [SPOOL, DISPOSE] {
            match rtx.open_table(table) {
                Ok(t) if t.get(spool).map_err(io)?.is_some() => return Ok(true),
                Ok(_) | Err(redb::TableError::TableDoesNotExist(_)) => {}
                Err(e) => return Err(io(e)),
            }
        }
        Ok(false)
    }

    /// The data directory (spooled files are relative to it).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The store id from META; 0 when there is none (a read-only open of a file written before ids,
    /// or before its first writable open).
    fn read_id(&self) -> Result<u64, StoreError> {
        let rtx = self.db.begin_read()?;
        match rtx.open_table(META) {
            Ok(t) => Ok(t.get(STORE_ID).map_err(io)?.map_or(0, |v| v.value())),
            Err(redb::TableError::TableDoesNotExist(_)) => Ok(0),
            Err(e) => Err(io(e)),
        }
    }

    /// A random id chosen when this file was created (or first opened writable by a colibri that
    /// knows ids), never 0 then. Job ids restart at 1 in a new file, so idempotency keys built from
    /// (store id, job id, offset) never repeat across two files, including a file that replaced a
    /// corrupted one. 0 only for a read-only open of a file that has none yet.
    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn storage(&self) -> StorageConfig {
        self.storage
    }

    fn load_counters(&mut self) -> Result<(), StoreError> {
        let rtx = self.db.begin_read()?;
        let table = match rtx.open_table(COUNTERS) {
            Ok(t) => Some(t),
            Err(redb::TableError::TableDoesNotExist(_)) => None,
            Err(e) => return Err(io(e)),
        };
        for st in self.streams.values_mut() {
            st.c = Counters::default();
            if let Some(t) = &table {
                for name in Counters::NAMES {
                    if let Some(v) = t.get((st.cfg.name.as_str(), *name)).map_err(io)? {
                        st.c.set(name, v.value());
                    }
                }
            }
            if st.c.next_id == 0 {
                st.c.next_id = 1;
            }
        }
        self.stale = false;
        Ok(())
    }

    /// Begins a write transaction. After a failed or abandoned one, counters are reloaded first.
    pub fn transaction(&mut self) -> Result<Tx<'_>, StoreError> {
        if self.stale {
            self.load_counters()?;
        }
        let mut txn = self.db.rw()?.begin_write().map_err(io)?;
        txn.set_quick_repair(self.opts.quick_repair);
        #[cfg(test)]
        if self.unsafe_no_fsync {
            txn.set_durability(Durability::None).map_err(io)?;
        }
        #[cfg(not(test))]
        txn.set_durability(Durability::Immediate).map_err(io)?;
        Ok(Tx {
            store: self,
            txn: Some(txn),
            dirty: HashSet::new(),
            fed: HashSet::new(),
            taken: Vec::new(),
            free_disk: None,
            disposals: Vec::new(),
            touched: false,
        })
    }

    /// Every stream, by name.
    pub fn streams(&self) -> impl Iterator<Item = (&StreamConfig, &Counters)> {
        self.streams.values().map(|s| (&s.cfg, &s.c))
    }

    pub fn counters(&self, stream: &str) -> Option<&Counters> {
        self.streams.get(stream).map(|s| &s.c)
    }

    /// Returns a taken job to the queue without an attempt (the link went down, shutdown).
    pub fn release(&mut self, lease: &Lease) {
        if lease.store != self.id {
            return;
        }
        if let Some(st) = self.streams.get_mut(&lease.stream) {
            st.in_flight.remove(&lease.id);
        }
    }

    /// Every job handed out and not yet settled, as (stream, id).
    pub fn in_flight_leases(&self) -> Vec<(String, u64)> {
        self.streams
            .iter()
            .flat_map(|(name, st)| st.in_flight.iter().map(move |id| (name.clone(), *id)))
            .collect()
    }

    /// Marks jobs as handed out (leases that outlived a previous `Store` of the same file).
    pub fn restore_in_flight(&mut self, leases: Vec<(String, u64)>) {
        for (stream, id) in leases {
            if let Some(st) = self.streams.get_mut(&stream) {
                st.in_flight.insert(id);
            }
        }
    }

    pub fn in_flight(&self, stream: &str) -> usize {
        self.streams.get(stream).map_or(0, |s| s.in_flight.len())
    }

    /// Bytes of job values in every stream.
    pub fn stored_bytes(&self) -> u64 {
        self.streams.values().map(|s| s.c.stored_bytes()).sum()
    }

    /// The database file's size on disk.
    pub fn file_bytes(&self) -> u64 {
        std::fs::metadata(&self.path).map_or(0, |m| m.len())
    }

    /// When the earliest retry of a stream falls due, if it has any.
    pub fn next_retry_due(&self, stream: &str) -> Result<Option<u64>, StoreError> {
        let st = self
            .streams
            .get(stream)
            .ok_or_else(|| StoreError::UnknownStream(stream.into()))?;
        let rtx = self.db.begin_read()?;
        let Ok(t) = rtx.open_table(st.retry_def()) else {
            return Ok(None);
        };
        // Jobs being delivered are not due for anyone else: a worker must not wake for them (it
        // would find nothing to take and spin). At most `in_flight` entries are skipped.
        for e in t.iter().map_err(io)? {
            let (k, _) = e.map_err(io)?;
            let (due, id) = k.value();
            if !st.in_flight.contains(&id) {
                return Ok(Some(due));
            }
        }
        Ok(None)
    }

    /// Oldest creation time among a stream's queued (ready or retry) jobs.
    pub fn oldest_ms(&self, stream: &str) -> Result<Option<u64>, StoreError> {
        let st = self
            .streams
            .get(stream)
            .ok_or_else(|| StoreError::UnknownStream(stream.into()))?;
        let rtx = self.db.begin_read()?;
        let mut oldest: Option<u64> = None;
        if let Ok(t) = rtx.open_table(st.ready_def())
            && let Some(first) = t.first().map_err(io)?
        {
            oldest = format::header(first.1.value()).ok().map(|h| h.created_ms);
        }
        if let Ok(t) = rtx.open_table(st.retry_def()) {
            for entry in t.iter().map_err(io)? {
                let (_, v) = entry.map_err(io)?;
                if let Ok(h) = format::header(v.value()) {
                    oldest = Some(oldest.map_or(h.created_ms, |o| o.min(h.created_ms)));
                }
            }
        }
        Ok(oldest)
    }

    /// Up to `n` jobs of a stream without taking them: ready then retry, or the dead letters.
    pub fn peek(&self, stream: &str, dead: bool, n: usize) -> Result<Vec<Peeked>, StoreError> {
        let st = self
            .streams
            .get(stream)
            .ok_or_else(|| StoreError::UnknownStream(stream.into()))?;
        let rtx = self.db.begin_read()?;
        let mut out = Vec::new();
        if dead {
            if let Ok(t) = rtx.open_table(st.dead_def()) {
                for e in t.iter().map_err(io)?.take(n) {
                    let (k, v) = e.map_err(io)?;
                    out.push(Peeked::from_bytes("dead", k.value(), None, v.value()));
                }
            }
        } else {
            if let Ok(t) = rtx.open_table(st.ready_def()) {
                for e in t.iter().map_err(io)?.take(n) {
                    let (k, v) = e.map_err(io)?;
                    out.push(Peeked::from_bytes("ready", k.value(), None, v.value()));
                }
            }
            let left = n.saturating_sub(out.len());
            if let Ok(t) = rtx.open_table(st.retry_def()) {
                for e in t.iter().map_err(io)?.take(left) {
                    let (k, v) = e.map_err(io)?;
                    let (due, id) = k.value();
                    out.push(Peeked::from_bytes("retry", id, Some(due), v.value()));
                }
            }
        }
        Ok(out)
    }

    /// Reclaims the space a drained backlog left in the file. redb needs no live transaction for
    /// this; the store's owner calls it when idle. Returns the bytes given back.
    pub fn compact(&mut self) -> Result<u64, StoreError> {
        let before = self.file_bytes();
        while self.db.rw()?.compact().map_err(io)? {}
        Ok(before.saturating_sub(self.file_bytes()))
    }

    /// Space compaction could give back, estimated from redb's own statistics.
    pub fn reclaimable_bytes(&mut self) -> Result<u64, StoreError> {
        let txn = self.db.rw()?.begin_write().map_err(io)?;
        let stats = txn.stats().map_err(io)?;
        let fragmented = stats.fragmented_bytes();
        txn.abort().map_err(io)?;
        Ok(fragmented.min(self.file_bytes()))
    }

    /// Saves a source's checkpoint outside any append (appends can carry one too).
    pub fn checkpoint(&self, source: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let rtx = self.db.begin_read()?;
        let t = match rtx.open_table(CHECKPOINTS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(io(e)),
        };
        Ok(t.get(source).map_err(io)?.map(|v| v.value().to_vec()))
    }

    /// Entries in quarantine.
    pub fn quarantined(&self) -> Result<u64, StoreError> {
        let rtx = self.db.begin_read()?;
        match rtx.open_table(QUARANTINE) {
            Ok(t) => t.len().map_err(io),
            Err(redb::TableError::TableDoesNotExist(_)) => Ok(0),
            Err(e) => Err(io(e)),
        }
    }
}

/// A job as shown to an operator.
#[derive(Debug, Clone, Serialize)]
pub struct Peeked {
    pub table: &'static str,
    pub id: u64,
    pub retry_due_ms: Option<u64>,
    pub created_ms: u64,
    pub attempts: u32,
    pub last_error: Option<String>,
    pub last_failed_ms: u64,
    /// Records of the original job settled and cut from its front before.
    pub offset: u32,
    pub bytes: u64,
    /// Records as text (lossy UTF-8), or the reason the job cannot be decoded.
    pub records: Result<Vec<String>, String>,
}

impl Peeked {
    fn from_bytes(table: &'static str, id: u64, due: Option<u64>, v: &[u8]) -> Peeked {
        match format::decode(v) {
            Ok(d) => Peeked {
                table,
                id,
                retry_due_ms: due,
                created_ms: d.header.created_ms,
                attempts: d.attempts,
                last_error: d.last_error,
                last_failed_ms: d.last_failed_ms,
                offset: d.offset,
                bytes: format::stored_len(v),
                records: Ok(match d.header.file_len {
                    // A file job: what it ships, readably.
                    Some(len) => vec![match format::file_ref(d.records[0]) {
                        Ok(format::FileRef::V1 { spool, name, .. }) => format!(
                            "file {:?} ({len} bytes), spooled as {}",
                            String::from_utf8_lossy(&name),
                            String::from_utf8_lossy(&spool)
                        ),
                        Err(e) => e.to_string(),
                    }],
                    None => d
                        .records
                        .iter()
                        .map(|r| String::from_utf8_lossy(r).into_owned())
                        .collect(),
                }),
            },
            Err(e) => Peeked {
                table,
                id,
                retry_due_ms: due,
                created_ms: 0,
                attempts: 0,
                last_error: None,
                last_failed_ms: 0,
                offset: 0,
                bytes: v.len() as u64,
                records: Err(e.to_string()),
            },
        }
    }
}

/// One write transaction. Changes become durable at [`Tx::commit`]; dropping it aborts them.
pub struct Tx<'s> {
    store: &'s mut Store,
    txn: Option<WriteTransaction>,
    dirty: HashSet<String>,
    /// Streams that received jobs in this transaction.
    fed: HashSet<String>,
    /// Leases handed out in this transaction: released again if it does not commit.
    taken: Vec<(String, u64)>,
    free_disk: Option<u64>,
    /// Spooled files whose jobs this transaction removes: handed to the store once it commits.
    disposals: Vec<Disposal>,
    /// Something besides a stream changed (the SPOOL table): the transaction must commit.
    touched: bool,
}

impl Drop for Tx<'_> {
    fn drop(&mut self) {
        if self.txn.is_some() {
            // Not committed: counters changed in memory must be re-read, leases undone.
            self.store.stale = true;
            for (stream, id) in self.taken.drain(..) {
                if let Some(st) = self.store.streams.get_mut(&stream) {
                    st.in_flight.remove(&id);
                }
            }
        }
    }
}

fn free_disk_bytes(path: &Path) -> Option<u64> {
    crate::files::free_bytes(path.parent()?)
}

impl<'s> Tx<'s> {
    fn txn(&self) -> &WriteTransaction {
        self.txn
            .as_ref()
            .expect("present until commit consumes the Tx")
    }

    fn stream(&self, name: &str) -> Result<&StreamState, StoreError> {
        self.store
            .streams
            .get(name)
            .ok_or_else(|| StoreError::UnknownStream(name.into()))
    }

    fn ensure_layout(&mut self) -> Result<(), StoreError> {
        let txn = self.txn();
        let mut meta = txn.open_table(META).map_err(io)?;
        let found = meta.get("layout").map_err(io)?.map(|v| v.value());
        match found {
            Some(v) if v > LAYOUT_VERSION => {
                return Err(StoreError::NewerLayout {
                    path: self.store.path.clone(),
                    found: v,
                });
            }
            Some(_) => {}
            None => {
                meta.insert("layout", LAYOUT_VERSION).map_err(io)?;
            }
        }
        // Files created before store ids get theirs on the first writable open.
        if meta.get(STORE_ID).map_err(io)?.is_none() {
            meta.insert(STORE_ID, new_store_id()).map_err(io)?;
        }
        drop(meta);
        txn.open_table(COUNTERS).map_err(io)?;
        txn.open_table(CHECKPOINTS).map_err(io)?;
        txn.open_table(QUARANTINE).map_err(io)?;
        txn.open_table(SPOOL).map_err(io)?;
        txn.open_table(DISPOSE).map_err(io)?;
        for st in self.store.streams.values() {
            txn.open_table(st.ready_def()).map_err(io)?;
            txn.open_table(st.retry_def()).map_err(io)?;
            txn.open_table(st.dead_def()).map_err(io)?;
        }
        Ok(())
    }

    /// Whether writing `bytes` more would take the filesystem below `storage.min_free`. Free space is
    /// read once per transaction (statvfs), then counted down by what the transaction appends.
    fn below_min_free(&mut self, bytes: u64) -> bool {
        let path = &self.store.path;
        let free = *self
            .free_disk
            .get_or_insert_with(|| free_disk_bytes(path).unwrap_or(u64::MAX));
        free.saturating_sub(bytes) < self.store.storage.min_free
    }

    /// Checks the bounds for adding `jobs`/`bytes` to `stream`, of which `disk` bytes are still to
    /// be written (a spooled file is on the disk already; only its job's value is not).
    fn full(&mut self, stream: &str, jobs: u64, bytes: u64, disk: u64) -> Option<FullReason> {
        // The disk first: when it is what is exhausted, that is what a producer must be told
        // (and no amount of dropping old jobs helps).
        if self.below_min_free(disk) {
            return Some(FullReason::MinFree);
        }
        if self.store.stored_bytes() + bytes > self.store.storage.max_bytes {
            return Some(FullReason::Budget);
        }
        let st = &self.store.streams[stream];
        if st.c.ready_jobs + st.c.retry_jobs + jobs > st.cfg.max_jobs {
            return Some(FullReason::Jobs);
        }
        if st.c.queued_bytes() + bytes > st.cfg.max_bytes {
            return Some(FullReason::Bytes);
        }
        None
    }

    /// Appends records to a stream, cut into jobs by `batch.max_records` / `batch.max_bytes`, and,
    /// when given, saves a source checkpoint in the same transaction. Bounds are checked before
    /// anything is written; the stream's `when_full` decides what happens when they are exceeded.
    pub fn append<R: AsRef<[u8]>>(
        &mut self,
        stream: &str,
        records: &[R],
        checkpoint: Option<(&str, &[u8])>,
        now_ms: u64,
    ) -> Result<Appended, AppendError> {
        let st = self.stream(stream)?;
        let batch = st.cfg.batch;
        let max_bytes = st.cfg.max_bytes;
        let max_jobs = st.cfg.max_jobs;
        let when_full = st.cfg.when_full;
        // Cut into jobs.
        let mut jobs: Vec<Vec<u8>> = Vec::new();
        let mut start = 0;
        while start < records.len() {
            let mut end = start;
            let mut size = 0u64;
            while end < records.len() && (end - start) < batch.max_records as usize {
                let r = records[end].as_ref().len() as u64;
                if end > start && size + r > batch.max_bytes {
                    break;
                }
                size += r;
                end += 1;
            }
            let job = format::encode(now_ms, &fresh_meta(0), &records[start..end]);
            if job.len() as u64 > max_bytes {
                let size = size.max(job.len() as u64);
                return Err(AppendError::TooLarge {
                    stream: stream.into(),
                    size,
                    max: max_bytes,
                    why: format!(
                        "a record of {size} bytes can never fit in stream {stream:?} (max_bytes {max_bytes})"
                    ),
                });
            }
            jobs.push(job);
            start = end;
        }
        let n_records = records.len() as u64;
        let n_jobs = jobs.len() as u64;
        let bytes: u64 = jobs.iter().map(|j| j.len() as u64).sum();
        // A batch that would not fit even in an empty stream and an empty store is refused as too
        // large, before anything changes: `Full` would have its sender wait and retry forever.
        let never = if n_jobs > max_jobs {
            Some((n_jobs, max_jobs, "jobs", "the stream's max_jobs"))
        } else if bytes > max_bytes {
            Some((bytes, max_bytes, "bytes", "the stream's max_bytes"))
        } else if bytes > self.store.storage.max_bytes {
            Some((
                bytes,
                self.store.storage.max_bytes,
                "bytes",
                "storage.max_bytes",
            ))
        } else {
            None
        };
        if let Some((size, max, unit, bound)) = never {
            return Err(AppendError::TooLarge {
                stream: stream.into(),
                size,
                max,
                why: format!(
                    "a batch of {n_records} records ({size} {unit}) can never fit in stream {stream:?} ({bound} is {max} {unit}): send smaller batches"
                ),
            });
        }
        let mut dropped_oldest = 0;
        if let Some(reason) = self.full(stream, n_jobs, bytes, bytes) {
            match when_full {
                WhenFull::Block => {
                    return Err(AppendError::Full {
                        stream: stream.into(),
                        reason,
                    });
                }
                WhenFull::DropNewest => {
                    let st = self.store.streams.get_mut(stream).expect("checked above");
                    st.c.appended_records += n_records;
                    st.c.dropped_newest_records += n_records;
                    self.dirty.insert(stream.into());
                    return Err(AppendError::Refused {
                        stream: stream.into(),
                        reason,
                        records: n_records,
                    });
                }
                WhenFull::DropOldest => {
                    dropped_oldest = self.drop_oldest_until_fits(stream, n_jobs, bytes, bytes)?;
                    if let Some(reason) = self.full(stream, n_jobs, bytes, bytes) {
                        // Not enough old jobs to delete (in flight, or other streams fill the disk).
                        return Err(AppendError::Full {
                            stream: stream.into(),
                            reason,
                        });
                    }
                }
            }
        }
        let txn = self.txn.as_ref().expect("present until commit");
        let st = self.store.streams.get_mut(stream).expect("checked above");
        {
            let mut ready = txn.open_table(st.ready_def()).map_err(io)?;
            for job in &jobs {
                ready.insert(st.c.next_id, job.as_slice()).map_err(io)?;
                st.c.next_id += 1;
            }
        }
        if let Some((source, cp)) = checkpoint {
            let mut t = txn.open_table(CHECKPOINTS).map_err(io)?;
            t.insert(source, cp).map_err(io)?;
        }
        st.c.ready_jobs += n_jobs;
        st.c.ready_records += n_records;
        st.c.ready_bytes += bytes;
        st.c.appended_jobs += n_jobs;
        st.c.appended_records += n_records;
        self.dirty.insert(stream.into());
        self.fed.insert(stream.into());
        // Later appends in this transaction see the space this one takes.
        if let Some(free) = self.free_disk.as_mut() {
            *free = free.saturating_sub(bytes);
        }
        Ok(Appended {
            jobs: n_jobs,
            records: n_records,
            dropped_oldest,
        })
    }

    /// Deletes the oldest ready jobs (never one in flight) so that `jobs`/`bytes` more fit in the
    /// stream's bounds and the storage budget; returns the records dropped. Deletes nothing when even
    /// that cannot make room (jobs in flight or in retry, other streams filling the budget, a batch
    /// larger than the stream): old data is never thrown away for an append that is refused anyway.
    fn drop_oldest_until_fits(
        &mut self,
        stream: &str,
        jobs: u64,
        bytes: u64,
        disk: u64,
    ) -> Result<u64, StoreError> {
        // Deleting jobs frees no filesystem space (redb keeps the pages), so it cannot help with
        // min_free: do not throw old data away for that.
        if self.below_min_free(disk) {
            return Ok(0);
        }
        let stored_elsewhere =
            self.store.stored_bytes() - self.store.streams[stream].c.stored_bytes();
        let budget = self.store.storage.max_bytes;
        let txn = self.txn.as_ref().expect("present until commit");
        let st = self
            .store
            .streams
            .get_mut(stream)
            .expect("checked by caller");
        let mut ready = txn.open_table(st.ready_def()).map_err(io)?;
        let (mut q_jobs, mut q_bytes, mut all_bytes) = (
            st.c.ready_jobs + st.c.retry_jobs,
            st.c.queued_bytes(),
            st.c.stored_bytes(),
        );
        let fits = |q_jobs: u64, q_bytes: u64, all_bytes: u64| {
            q_jobs + jobs <= st.cfg.max_jobs
                && q_bytes + bytes <= st.cfg.max_bytes
                && stored_elsewhere + all_bytes + bytes <= budget
        };
        let mut victims = Vec::new();
        for e in ready.iter().map_err(io)? {
            if fits(q_jobs, q_bytes, all_bytes) {
                break;
            }
            let (k, v) = e.map_err(io)?;
            let id = k.value();
            if st.in_flight.contains(&id) {
                continue;
            }
            let recs = format::header(v.value()).map_or(0, |h| u64::from(h.records));
            let len = format::stored_len(v.value());
            victims.push((id, recs, len, file_value(v.value())));
            q_jobs -= 1;
            q_bytes = q_bytes.saturating_sub(len);
            all_bytes = all_bytes.saturating_sub(len);
        }
        if !fits(q_jobs, q_bytes, all_bytes) {
            return Ok(0);
        }
        let mut dropped = 0u64;
        let mut files = Vec::new();
        for (id, recs, len, file) in victims {
            ready.remove(id).map_err(io)?;
            let recs = st.c.remove_job(Table::Ready, recs, len);
            st.c.dropped_oldest_records += recs;
            dropped += recs;
            files.extend(file);
        }
        drop(ready);
        for raw in files {
            self.job_left(&raw, false)?;
        }
        if dropped > 0 {
            tracing::warn!(
                stream,
                dropped_records = dropped,
                "stream full: oldest jobs dropped (when_full: drop_oldest)"
            );
            self.dirty.insert(stream.into());
        }
        Ok(dropped)
    }

    /// Takes up to `max_jobs` due jobs, oldest first: retry jobs whose time has come, then ready
    /// ones. Jobs already in flight are skipped. A job that cannot be decoded moves to quarantine.
    pub fn take(
        &mut self,
        stream: &str,
        max_jobs: usize,
        now_ms: u64,
    ) -> Result<Vec<Job>, StoreError> {
        self.stream(stream)?;
        let store_id = self.store.id;
        let data_dir = self.store.data_dir.as_path();
        let txn = self.txn.as_ref().expect("present until commit");
        let st = self.store.streams.get_mut(stream).expect("checked above");
        let mut out = Vec::new();
        let mut bad: Vec<Undecodable> = Vec::new();
        {
            let retry = txn.open_table(st.retry_def()).map_err(io)?;
            for e in retry.range(..=(now_ms, u64::MAX)).map_err(io)? {
                if out.len() >= max_jobs || bad.len() >= QUARANTINE_PER_TAKE {
                    break;
                }
                let (k, v) = e.map_err(io)?;
                let (due, id) = k.value();
                if st.in_flight.contains(&id) {
                    continue;
                }
                match job_from(store_id, data_dir, stream, id, Some(due), v.value()) {
                    Ok(job) => out.push(job),
                    Err(e) => bad.push((Table::Retry, id, Some(due), v.value().to_vec(), e)),
                }
            }
        }
        if out.len() < max_jobs {
            let ready = txn.open_table(st.ready_def()).map_err(io)?;
            for e in ready.iter().map_err(io)? {
                if out.len() >= max_jobs || bad.len() >= QUARANTINE_PER_TAKE {
                    break;
                }
                let (k, v) = e.map_err(io)?;
                let id = k.value();
                if st.in_flight.contains(&id) {
                    continue;
                }
                match job_from(store_id, data_dir, stream, id, None, v.value()) {
                    Ok(job) => out.push(job),
                    Err(e) => bad.push((Table::Ready, id, None, v.value().to_vec(), e)),
                }
            }
        }
        for j in &out {
            st.in_flight.insert(j.lease.id);
            self.taken.push((stream.to_string(), j.lease.id));
        }
        for (table, id, due, raw, reason) in bad {
            self.quarantine(stream, table, id, due, &raw, &reason)?;
        }
        Ok(out)
    }

    /// Moves an undecodable value to quarantine: counted, logged, out of the way.
    fn quarantine(
        &mut self,
        stream: &str,
        table: Table,
        id: u64,
        due: Option<u64>,
        raw: &[u8],
        reason: &str,
    ) -> Result<(), StoreError> {
        let txn = self.txn.as_ref().expect("present until commit");
        let st = self
            .store
            .streams
            .get_mut(stream)
            .expect("checked by caller");
        match table {
            Table::Ready => {
                txn.open_table(st.ready_def())
                    .map_err(io)?
                    .remove(id)
                    .map_err(io)?;
            }
            Table::Retry => {
                txn.open_table(st.retry_def())
                    .map_err(io)?
                    .remove((due.unwrap_or(0), id))
                    .map_err(io)?;
            }
            Table::Dead => {
                txn.open_table(st.dead_def())
                    .map_err(io)?
                    .remove(id)
                    .map_err(io)?;
            }
        }
        // A corrupt value's header is only a claim (a flipped bit can claim a thousand records), so
        // the table is counted again from the values that pass their checksum; what the counters
        // held beyond that was this job's. Rare, so a full scan is fine, and the identity stays exact.
        let (jobs, records, bytes) = match table {
            Table::Ready => recount(&txn.open_table(st.ready_def()).map_err(io)?)?,
            Table::Retry => recount(&txn.open_table(st.retry_def()).map_err(io)?)?,
            Table::Dead => recount(&txn.open_table(st.dead_def()).map_err(io)?)?,
        };
        let (c_jobs, c_records, c_bytes) = st.c.table_mut(table);
        let recs = c_records.saturating_sub(records);
        // Never expected; if the counters were short, the identity is kept by counting the excess
        // as appended.
        let excess = records.saturating_sub(*c_records);
        *c_jobs = jobs;
        *c_records = records;
        *c_bytes = bytes;
        if excess > 0 {
            tracing::error!(
                stream,
                table = table.name(),
                excess,
                "counters were below the table's contents; corrected"
            );
            st.c.appended_records += excess;
        }
        st.c.quarantined_records += recs;
        let entry = QuarantineEntry {
            stream: stream.to_string(),
            table: table.name().to_string(),
            id,
            reason: reason.to_string(),
            raw: raw.to_vec(),
        };
        let bytes =
            postcard::to_stdvec(&entry).expect("postcard encodes a plain struct into a Vec");
        let mut q = txn.open_table(QUARANTINE).map_err(io)?;
        let key = q.last().map_err(io)?.map_or(1, |(k, _)| k.value() + 1);
        q.insert(key, bytes.as_slice()).map_err(io)?;
        drop(q);
        // A file job's file is intact even when its job is not: forget that this job ships it, so
        // its task's recovery queues the file again instead of leaving it in the spool for good.
        // Rare (a damaged value), so a scan of the spool table is fine.
        if matches!(raw.first(), Some(&format::VERSION_FILE)) {
            let mut spool = txn.open_table(SPOOL).map_err(io)?;
            let mut mine = Vec::new();
            for e in spool.iter().map_err(io)? {
                let (k, v) = e.map_err(io)?;
                if let Some(SpoolEntry::Queued { stream: s, job }) = spool_entry(v.value())
                    && s == stream
                    && job == id
                {
                    mine.push(k.value().to_vec());
                }
            }
            for k in mine {
                spool.remove(k.as_slice()).map_err(io)?;
            }
        }
        tracing::error!(
            stream,
            table = table.name(),
            id,
            reason,
            records = recs,
            "job cannot be decoded; moved to quarantine"
        );
        self.dirty.insert(stream.into());
        Ok(())
    }

    /// The bytes of a leased job, without removing it.
    fn read_leased(&self, lease: &Lease) -> Result<(Vec<u8>, Table), StoreError> {
        self.check_lease(lease)?;
        let txn = self.txn();
        let st = self.stream(&lease.stream)?;
        let (raw, table) = match lease.retry_due {
            None => {
                let t = txn.open_table(st.ready_def()).map_err(io)?;
                let v = t.get(lease.id).map_err(io)?.map(|g| g.value().to_vec());
                (v, Table::Ready)
            }
            Some(due) => {
                let t = txn.open_table(st.retry_def()).map_err(io)?;
                let v = t
                    .get((due, lease.id))
                    .map_err(io)?
                    .map(|g| g.value().to_vec());
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
    fn check_lease(&self, lease: &Lease) -> Result<(), StoreError> {
        if lease.store == self.store.id {
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

    fn remove_leased(&mut self, lease: &Lease) -> Result<(Vec<u8>, Table), StoreError> {
        self.check_lease(lease)?;
        let txn = self.txn.as_ref().expect("present until commit");
        let st = self
            .store
            .streams
            .get_mut(&lease.stream)
            .ok_or_else(|| StoreError::UnknownStream(lease.stream.clone()))?;
        let (raw, table) = match lease.retry_due {
            None => {
                let mut t = txn.open_table(st.ready_def()).map_err(io)?;
                let v = t.remove(lease.id).map_err(io)?.map(|g| g.value().to_vec());
                (v, Table::Ready)
            }
            Some(due) => {
                let mut t = txn.open_table(st.retry_def()).map_err(io)?;
                let v = t
                    .remove((due, lease.id))
                    .map_err(io)?
                    .map(|g| g.value().to_vec());
                (v, Table::Retry)
            }
        };
        st.in_flight.remove(&lease.id);
        let raw = raw.ok_or(StoreError::NoSuchJob {
            stream: lease.stream.clone(),
            table: table.name(),
            id: lease.id,
        })?;
        let recs = format::header(&raw).map_or(0, |h| u64::from(h.records));
        let len = format::stored_len(&raw);
        st.c.remove_job(table, recs, len);
        self.dirty.insert(lease.stream.clone());
        Ok((raw, table))
    }

    /// The job was delivered: delete it.
    pub fn ack(&mut self, lease: &Lease) -> Result<(), StoreError> {
        let (raw, _) = self.remove_leased(lease)?;
        let st = self
            .store
            .streams
            .get_mut(&lease.stream)
            .expect("removed above");
        st.c.delivered_jobs += 1;
        st.c.delivered_records += format::header(&raw).map_or(0, |h| u64::from(h.records));
        st.c.delivered_bytes += format::stored_len(&raw);
        self.job_left(&raw, true)
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
        let meta = Meta::V2 {
            attempts,
            last_error: Some(reason),
            last_failed_ms: now_ms,
            offset: d.offset,
        };
        let value = format::reencode(&d, &meta);
        let recs = u64::from(d.header.records);
        let len = format::stored_len(&value);
        let txn = self.txn.as_ref().expect("present until commit");
        let st = self
            .store
            .streams
            .get_mut(&lease.stream)
            .expect("removed above");
        if to_dead {
            txn.open_table(st.dead_def())
                .map_err(io)?
                .insert(lease.id, value.as_slice())
                .map_err(io)?;
            st.c.add_job(Table::Dead, recs, len);
            st.c.dead_lettered_records += recs;
            let stream = lease.stream.clone();
            self.trim_dead(&stream)?;
            Ok(Failed::Dead { attempts })
        } else {
            txn.open_table(st.retry_def())
                .map_err(io)?
                .insert((due, lease.id), value.as_slice())
                .map_err(io)?;
            st.c.add_job(Table::Retry, recs, len);
            st.c.retried_attempts += 1;
            Ok(Failed::Retry {
                attempts,
                due_ms: due,
            })
        }
    }

    /// A leased value that no longer decodes: moved to quarantine (counted, out of the queue, its
    /// lease void). Returns the error to hand the caller.
    fn quarantine_leased(
        &mut self,
        lease: &Lease,
        table: Table,
        raw: &[u8],
        e: &format::FormatError,
    ) -> StoreError {
        if let Some(st) = self.store.streams.get_mut(&lease.stream) {
            st.in_flight.remove(&lease.id);
        }
        let reason = e.to_string();
        match self.quarantine(
            &lease.stream,
            table,
            lease.id,
            lease.retry_due,
            raw,
            &reason,
        ) {
            Ok(()) => StoreError::Corrupted(reason),
            Err(e) => e,
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
        let (head, tail) = d.records.split_at(n as usize);
        // Cannot overflow: decode guarantees offset + records fits in a u32, and n < records.
        let offset = d.offset + n;
        let rest = format::encode(
            d.header.created_ms,
            &Meta::V2 {
                attempts: d.attempts,
                last_error: d.last_error.clone(),
                last_failed_ms: d.last_failed_ms,
                offset,
            },
            tail,
        );
        let (old_len, new_len) = (raw.len() as u64, rest.len() as u64);
        let txn = self.txn.as_ref().expect("present until commit");
        let st = self
            .store
            .streams
            .get_mut(&lease.stream)
            .expect("checked by read_leased");
        // Same key: the job keeps its place in the queue (and in the retry schedule).
        match lease.retry_due {
            None => {
                txn.open_table(st.ready_def())
                    .map_err(io)?
                    .insert(lease.id, rest.as_slice())
                    .map_err(io)?;
            }
            Some(due) => {
                txn.open_table(st.retry_def())
                    .map_err(io)?
                    .insert((due, lease.id), rest.as_slice())
                    .map_err(io)?;
            }
        }
        // Out with the old value, in with the shorter one. Clamped like every removal, so counters
        // that were short cannot underflow; `cut` is what left the table and is counted on.
        let all = st.c.remove_job(table, u64::from(records), old_len);
        let cut = u64::from(n).min(all);
        st.c.add_job(table, all - cut, new_len);
        let trim = match outcome {
            Settle::Delivered => {
                st.c.delivered_records += cut;
                // What the stored value shrank by: over a job's life the parts add up to the
                // value's size, as one ack of the whole job would have counted.
                st.c.delivered_bytes += old_len.saturating_sub(new_len);
                false
            }
            Settle::Dead { reason } => {
                let dead_id = st.c.next_id;
                st.c.next_id += 1;
                let meta = Meta::V2 {
                    attempts: d.attempts,
                    last_error: Some(reason.clone()),
                    last_failed_ms: now_ms,
                    offset: d.offset,
                };
                let value = format::encode(d.header.created_ms, &meta, head);
                txn.open_table(st.dead_def())
                    .map_err(io)?
                    .insert(dead_id, value.as_slice())
                    .map_err(io)?;
                st.c.add_job(Table::Dead, cut, value.len() as u64);
                st.c.dead_lettered_records += cut;
                true
            }
        };
        self.dirty.insert(lease.stream.clone());
        if trim {
            self.trim_dead(&lease.stream)?;
        }
        Ok(Job {
            lease: lease.clone(),
            created_ms: d.header.created_ms,
            attempts: d.attempts,
            last_error: d.last_error,
            offset,
            value: rest,
            file: None,
        })
    }

    /// Keeps the dead-letter table within `dead_letter.max_jobs`, oldest out first.
    fn trim_dead(&mut self, stream: &str) -> Result<(), StoreError> {
        let txn = self.txn.as_ref().expect("present until commit");
        let st = self
            .store
            .streams
            .get_mut(stream)
            .expect("checked by caller");
        if st.c.dead_jobs <= st.cfg.dead_max_jobs {
            return Ok(());
        }
        let mut dead = txn.open_table(st.dead_def()).map_err(io)?;
        let mut files = Vec::new();
        while st.c.dead_jobs > st.cfg.dead_max_jobs {
            let Some((_, v)) = dead.pop_first().map_err(io)? else {
                break;
            };
            let recs = format::header(v.value()).map_or(0, |h| u64::from(h.records));
            let recs =
                st.c.remove_job(Table::Dead, recs, format::stored_len(v.value()));
            st.c.dropped_dead_full_records += recs;
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

    /// Deletes queued jobs older than their stream's TTL (never one in flight); returns records.
    pub fn expire(&mut self, now_ms: u64) -> Result<u64, StoreError> {
        let txn = self.txn.as_ref().expect("present until commit");
        let mut total = 0;
        let mut files = Vec::new();
        for st in self.store.streams.values_mut() {
            let Some(ttl) = st.cfg.ttl else { continue };
            let cutoff = now_ms.saturating_sub(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX));
            let mut expired = 0u64;
            {
                let mut ready = txn.open_table(st.ready_def()).map_err(io)?;
                let mut victims = Vec::new();
                for e in ready.iter().map_err(io)? {
                    let (k, v) = e.map_err(io)?;
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
                    ready.remove(id).map_err(io)?;
                    expired += st.c.remove_job(Table::Ready, recs, len);
                }
            }
            {
                let mut retry = txn.open_table(st.retry_def()).map_err(io)?;
                let mut victims = Vec::new();
                for e in retry.iter().map_err(io)? {
                    let (k, v) = e.map_err(io)?;
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
                    retry.remove(key).map_err(io)?;
                    expired += st.c.remove_job(Table::Retry, recs, len);
                }
            }
            if expired > 0 {
                st.c.expired_records += expired;
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

    /// Moves dead letters back to ready with attempts reset: up to `limit` of them, or the one with
    /// `id`.
    /// Returns (jobs, records) moved. They keep their ids, so they are delivered in their old order
    /// relative to each other.
    pub fn replay_dead(
        &mut self,
        stream: &str,
        id: Option<u64>,
        limit: usize,
    ) -> Result<(u64, u64), StoreError> {
        self.stream(stream)?;
        let txn = self.txn.as_ref().expect("present until commit");
        let st = self.store.streams.get_mut(stream).expect("checked above");
        let mut dead = txn.open_table(st.dead_def()).map_err(io)?;
        let mut ready = txn.open_table(st.ready_def()).map_err(io)?;
        let keys: Vec<u64> = match id {
            Some(id) => {
                if dead.get(id).map_err(io)?.is_none() {
                    return Err(StoreError::NoSuchJob {
                        stream: stream.into(),
                        table: "dead",
                        id,
                    });
                }
                vec![id]
            }
            None => dead
                .iter()
                .map_err(io)?
                .take(limit)
                .map(|e| e.map(|(k, _)| k.value()))
                .collect::<Result<_, _>>()
                .map_err(io)?,
        };
        let (mut jobs, mut records) = (0, 0);
        let mut corrupt = Vec::new();
        for k in keys {
            let Some(v) = dead.get(k).map_err(io)? else {
                continue;
            };
            let raw = v.value().to_vec();
            drop(v);
            let old_len = format::stored_len(&raw);
            // Attempts start over; the offset stays, as the records before it are still settled.
            let value = match format::with_meta(&raw, |d| fresh_meta(d.offset)) {
                Ok(v) => v,
                Err(e) => {
                    corrupt.push((k, raw, e.to_string()));
                    continue;
                }
            };
            let recs = format::header(&raw).map_or(0, |h| u64::from(h.records));
            dead.remove(k).map_err(io)?;
            ready.insert(k, value.as_slice()).map_err(io)?;
            let recs = st.c.remove_job(Table::Dead, recs, old_len);
            st.c.add_job(Table::Ready, recs, format::stored_len(&value));
            st.c.replayed_records += recs;
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
    /// counted as dropped.
    pub fn purge_dead(
        &mut self,
        stream: &str,
        failed_before_ms: Option<u64>,
        limit: usize,
    ) -> Result<(u64, u64), StoreError> {
        self.stream(stream)?;
        let txn = self.txn.as_ref().expect("present until commit");
        let st = self.store.streams.get_mut(stream).expect("checked above");
        let mut dead = txn.open_table(st.dead_def()).map_err(io)?;
        let mut victims = Vec::new();
        for e in dead.iter().map_err(io)? {
            let (k, v) = e.map_err(io)?;
            let failed_ms = format::decode(v.value()).map_or(0, |d| d.last_failed_ms);
            if victims.len() >= limit {
                break;
            }
            if failed_before_ms.is_none_or(|t| failed_ms < t) {
                let recs = format::header(v.value()).map_or(0, |h| u64::from(h.records));
                victims.push((
                    k.value(),
                    recs,
                    format::stored_len(v.value()),
                    file_value(v.value()),
                ));
            }
        }
        let (mut jobs, mut records) = (0, 0);
        let mut files = Vec::new();
        for (id, recs, len, file) in victims {
            dead.remove(id).map_err(io)?;
            let recs = st.c.remove_job(Table::Dead, recs, len);
            st.c.dropped_purged_records += recs;
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

    /// Whether anything in this transaction changes the disk (so closing it commits).
    pub fn is_dirty(&self) -> bool {
        !self.dirty.is_empty() || self.touched
    }

    /// Streams this transaction appended to (or replayed into): what a delivery worker waits for.
    pub fn fed_streams(&self) -> Vec<String> {
        self.fed.iter().cloned().collect()
    }

    /// Commits when anything changed; otherwise ends the transaction without a commit (no fsync),
    /// keeping the leases it handed out: a `take` changes nothing on disk.
    pub fn close(mut self) -> Result<(), StoreError> {
        if self.is_dirty() {
            return self.commit();
        }
        let txn = self.txn.take().expect("present until commit or close");
        self.taken.clear();
        txn.abort().map_err(io)
    }

    /// Abandons the transaction; counters are reloaded before the next one.
    pub fn abort(mut self) -> Result<(), StoreError> {
        let txn = self.txn.take().expect("present until commit or abort");
        // Any operation may have changed counters in memory, even one that found nothing to do.
        self.store.stale = true;
        for (stream, id) in self.taken.drain(..) {
            if let Some(st) = self.store.streams.get_mut(&stream) {
                st.in_flight.remove(&id);
            }
        }
        txn.abort().map_err(io)
    }

    /// Makes everything in this transaction durable (fsync) before returning Ok.
    pub fn commit(mut self) -> Result<(), StoreError> {
        let txn = self.txn.take().expect("present until commit");
        let result = (|| {
            {
                let mut t = txn.open_table(COUNTERS).map_err(io)?;
                for name in &self.dirty {
                    let st = &self.store.streams[name];
                    for (field, value) in Counters::NAMES.iter().zip(st.c.values()) {
                        t.insert((name.as_str(), *field), value).map_err(io)?;
                    }
                }
            }
            txn.commit().map_err(io)
        })();
        if result.is_err() {
            self.store.stale = true;
            for (stream, id) in self.taken.drain(..) {
                if let Some(st) = self.store.streams.get_mut(&stream) {
                    st.in_flight.remove(&id);
                }
            }
        } else {
            // Durable now: the files of the jobs it removed may go.
            self.store.disposals.append(&mut self.disposals);
        }
        result
    }

    /// A job left the store (`delivered`: acknowledged; otherwise dropped, expired or purged). For
    /// a file job, its spooled file is marked for disposal in this transaction (archived when
    /// delivered and the task asked for it, deleted otherwise) and handed out once it commits.
    fn job_left(&mut self, raw: &[u8], delivered: bool) -> Result<(), StoreError> {
        if format::header(raw).map_or(true, |h| h.file_len.is_none()) {
            return Ok(());
        }
        let file = format::decode(raw).and_then(|d| format::file_ref(d.records[0]));
        let format::FileRef::V1 {
            spool,
            name,
            archive,
            ..
        } = match file {
            Ok(f) => f,
            Err(e) => {
                // Verified when taken; only a value that went bad since gets here. Its file stays
                // (an operator finds it in the spool directory).
                tracing::error!(error = %e, "a file job's reference cannot be read; its spooled file is left in place");
                return Ok(());
            }
        };
        let archive = if delivered { archive } else { None };
        let entry = SpoolEntry::Dispose {
            name: name.clone(),
            archive: archive.clone(),
        };
        let txn = self.txn.as_ref().expect("present until commit");
        txn.open_table(SPOOL)
            .map_err(io)?
            .remove(spool.as_slice())
            .map_err(io)?;
        txn.open_table(DISPOSE)
            .map_err(io)?
            .insert(spool.as_slice(), spool_bytes(&entry).as_slice())
            .map_err(io)?;
        self.touched = true;
        self.disposals.push(Disposal {
            spool,
            name,
            archive,
        });
        Ok(())
    }

    /// Appends a file job for a file already in the spool (`spool`: its path relative to the data
    /// directory; `len`: its size). Bounds count the file; `min_free` counts only the job's value, as
    /// the file is on the disk already. A stream that is full refuses it whatever its `when_full`,
    /// except that `drop_oldest` first makes room: the caller keeps the file (nothing is counted).
    /// A file the store knows already (a retry after a lost reply, or the recovery after a crash)
    /// adds nothing.
    #[allow(clippy::too_many_arguments)]
    pub fn append_file(
        &mut self,
        stream: &str,
        spool: &[u8],
        name: &[u8],
        len: u64,
        mtime_ms: u64,
        archive: Option<&[u8]>,
        now_ms: u64,
    ) -> Result<FileAppend, AppendError> {
        let st = self.stream(stream)?;
        let (max_bytes, when_full) = (st.cfg.max_bytes, st.cfg.when_full);
        let queued = {
            let t = self.txn().open_table(SPOOL).map_err(io)?;
            t.get(spool).map_err(io)?.is_some()
        };
        if queued {
            return Ok(FileAppend::Known);
        }
        let disposing = {
            let t = self.txn().open_table(DISPOSE).map_err(io)?;
            t.get(spool).map_err(io)?.map(|v| spool_entry(v.value()))
        };
        if let Some(entry) = disposing {
            if let Some(SpoolEntry::Dispose { name, archive }) = entry {
                // Delivered already and back on disk (a disposal lost to a crash): dispose again.
                // The entry is durable already, so this needs no commit of its own.
                self.store.disposals.push(Disposal {
                    spool: spool.to_vec(),
                    name,
                    archive,
                });
            }
            return Ok(FileAppend::Known);
        }
        let file = format::FileRef::V1 {
            spool: spool.to_vec(),
            name: name.to_vec(),
            mtime_ms,
            archive: archive.map(<[u8]>::to_vec),
        };
        let value = format::encode_file(now_ms, &fresh_meta(0), &file, len);
        let bytes = format::stored_len(&value);
        let disk = value.len() as u64;
        let storage_max = self.store.storage.max_bytes;
        if bytes > max_bytes || bytes > storage_max {
            let (max, bound) = if bytes > max_bytes {
                (max_bytes, "the stream's max_bytes")
            } else {
                (storage_max, "storage.max_bytes")
            };
            return Err(AppendError::TooLarge {
                stream: stream.into(),
                size: bytes,
                max,
                why: format!(
                    "a file of {len} bytes can never fit in stream {stream:?} ({bound} is {max} bytes)"
                ),
            });
        }
        if let Some(reason) = self.full(stream, 1, bytes, disk)
            && (when_full != WhenFull::DropOldest
                || self.drop_oldest_until_fits(stream, 1, bytes, disk)? == 0
                || self.full(stream, 1, bytes, disk).is_some())
        {
            return Err(AppendError::Full {
                stream: stream.into(),
                reason,
            });
        }
        let txn = self.txn.as_ref().expect("present until commit");
        let st = self.store.streams.get_mut(stream).expect("checked above");
        let id = st.c.next_id;
        txn.open_table(st.ready_def())
            .map_err(io)?
            .insert(id, value.as_slice())
            .map_err(io)?;
        let entry = SpoolEntry::Queued {
            stream: stream.to_string(),
            job: id,
        };
        txn.open_table(SPOOL)
            .map_err(io)?
            .insert(spool, spool_bytes(&entry).as_slice())
            .map_err(io)?;
        st.c.next_id += 1;
        st.c.add_job(Table::Ready, 1, bytes);
        st.c.appended_jobs += 1;
        st.c.appended_records += 1;
        self.dirty.insert(stream.into());
        self.fed.insert(stream.into());
        if let Some(free) = self.free_disk.as_mut() {
            *free = free.saturating_sub(disk);
        }
        Ok(FileAppend::Queued { id })
    }

    /// Forgets spooled files that were disposed of on disk (see [`Store::take_disposals`]).
    pub fn forget_spool(&mut self, spools: &[Vec<u8>]) -> Result<(), StoreError> {
        let txn = self.txn.as_ref().expect("present until commit");
        let mut t = txn.open_table(DISPOSE).map_err(io)?;
        for key in spools {
            if t.remove(key.as_slice()).map_err(io)?.is_some() {
                self.touched = true;
            }
        }
        Ok(())
    }
}

/// The value itself when it is a file job (whose file must be disposed of when it leaves).
fn file_value(v: &[u8]) -> Option<Vec<u8>> {
    format::header(v)
        .is_ok_and(|h| h.file_len.is_some())
        .then(|| v.to_vec())
}

/// Jobs, verified records and bytes of one table: values that fail their checksum count as jobs and
/// bytes but no records (they are about to be quarantined too).
fn recount<K: redb::Key + 'static>(
    t: &redb::Table<'_, K, &'static [u8]>,
) -> Result<(u64, u64, u64), StoreError> {
    let (mut jobs, mut records, mut bytes) = (0u64, 0u64, 0u64);
    for e in t.iter().map_err(io)? {
        let (_, v) = e.map_err(io)?;
        jobs += 1;
        bytes += format::stored_len(v.value());
        if let Ok(d) = format::decode(v.value()) {
            records += u64::from(d.header.records);
        }
    }
    Ok((jobs, records, bytes))
}

/// A value `take` could not decode: (table, id, retry due, raw bytes, reason).
type Undecodable = (Table, u64, Option<u64>, Vec<u8>, String);

/// Metadata of a job with no attempts behind it: appended, or replayed (keeping its `offset`).
fn fresh_meta(offset: u32) -> Meta {
    Meta::V2 {
        attempts: 0,
        last_error: None,
        last_failed_ms: 0,
        offset,
    }
}

/// A new store's id: random, so two files (on one box or many) practically never share one; never
/// 0, which stands for "no id".
fn new_store_id() -> u64 {
    fastrand::u64(1..)
}

fn job_from(
    store: u64,
    data_dir: &Path,
    stream: &str,
    id: u64,
    due: Option<u64>,
    v: &[u8],
) -> Result<Job, String> {
    let d = format::decode(v).map_err(|e| e.to_string())?;
    let file = match d.header.file_len {
        None => None,
        Some(len) => {
            use std::os::unix::ffi::OsStringExt;
            let format::FileRef::V1 { spool, name, .. } =
                format::file_ref(d.records[0]).map_err(|e| e.to_string())?;
            Some(FileJob {
                path: data_dir.join(std::ffi::OsString::from_vec(spool)),
                name: std::ffi::OsString::from_vec(name),
                len,
            })
        }
    };
    Ok(Job {
        file,
        lease: Lease {
            stream: stream.to_string(),
            id,
            retry_due: due,
            store,
        },
        created_ms: d.header.created_ms,
        attempts: d.attempts,
        last_error: d.last_error,
        offset: d.offset,
        value: v.to_vec(),
    })
}

#[derive(Debug, Serialize, serde::Deserialize)]
struct QuarantineEntry {
    stream: String,
    table: String,
    id: u64,
    reason: String,
    raw: Vec<u8>,
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod compaction_tests {
    use super::*;

    /// A box that buffered a backlog gets its disk back once the backlog drained.
    #[test]
    fn a_drained_backlog_gives_its_disk_back() {
        let dir = tempfile::tempdir().unwrap();
        let stream = StreamConfig {
            name: "s".into(),
            sink: None,
            batch: BatchConfig {
                max_records: 100,
                max_bytes: 1 << 20,
                linger: Duration::from_secs(1),
            },
            max_jobs: 1_000_000,
            max_bytes: 1 << 30,
            when_full: WhenFull::Block,
            ttl: None,
            dead_max_jobs: 10,
        };
        let storage = StorageConfig {
            max_bytes: 1 << 30,
            min_free: 0,
        };
        let mut s = Store::open(
            dir.path(),
            storage,
            std::slice::from_ref(&stream),
            OpenOptions::default(),
        )
        .unwrap();
        let record = vec![b'x'; 200];
        let batch: Vec<&[u8]> = vec![record.as_slice(); 1000];
        for _ in 0..150 {
            let mut tx = s.transaction().unwrap();
            tx.append("s", &batch, None, now_ms()).unwrap();
            tx.commit().unwrap();
        }
        let full = s.file_bytes();
        assert!(full > 25 << 20, "a 30 MB backlog is on disk: {full}");
        loop {
            let mut tx = s.transaction().unwrap();
            let jobs = tx.take("s", 500, now_ms()).unwrap();
            if jobs.is_empty() {
                break;
            }
            for j in &jobs {
                tx.ack(&j.lease).unwrap();
            }
            tx.commit().unwrap();
        }
        assert!(s.reclaimable_bytes().unwrap() > 0);
        let freed = s.compact().unwrap();
        let after = s.file_bytes();
        assert!(
            after < 2 << 20,
            "after draining and compacting the file is small: {after} (was {full}, freed {freed})"
        );
        let c = s.counters("s").unwrap();
        assert_eq!(c.delivered_records, 150_000);
        assert!(c.balanced());
        // Still usable after compaction.
        let mut tx = s.transaction().unwrap();
        tx.append("s", &batch[..10], None, now_ms()).unwrap();
        tx.commit().unwrap();
    }
}
