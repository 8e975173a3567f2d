//! Opening the database: [`Store`] itself, creating a fresh file so that a power cut cannot leave
//! a half-made one, reading the counters (never the backlog) at start-up, and beginning a
//! transaction. Queries are in [`super::read`], changes in [`super::tx`]. Called by the agent, the
//! store writer and `colibri queue`.

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};

use redb::{
    ConcurrencyMode, Database, DatabaseError, Durability, ReadableDatabase, StorageBackend,
};

use super::counters::Counters;
use super::error::{StoreError, db_error};
use super::files::Disposal;
use super::layout::{
    CHECKPOINTS, COUNTERS, DB_FILE, DISPOSE, LAYOUT_VERSION, META, QUARANTINE, SPOOL, STORE_ID,
    new_store_id,
};
use super::stream::{StorageConfig, StreamConfig, StreamState};
use super::tx::{FreePages, Rollback, Tx};

/// redb's page cache. Its default is 1 GiB; colibri reads each job once (a take), in bounded
/// windows, and writes in group commits, so the cache serves the trees' branch pages and a small
/// one keeps memory flat however large the backlog (4 MiB held 16 large jobs' pages for nothing:
/// 1.6-1.9 MB more peak RSS online, BENCHMARKS.md).
pub(super) const CACHE_BYTES: usize = 1 << 20;
/// The file size from which redb's allocator state is written at every commit (quick repair). A
/// smaller file is walked after a crash in less than ~50 ms (about 0.2 s per GB here), while
/// writing that state costs every commit ~16 KB and ~0.1-0.3 CPU-s per million lines online.
pub const QUICK_REPAIR_FROM: u64 = 256 << 20;
/// Below this much free disk the allocator state is written at every commit too: without it a
/// clean close must write it, which a full disk refuses, leaving a file that every read-only
/// open (`queue stats`, `peek`) refuses until the agent repairs it.
pub const QUICK_REPAIR_BELOW_FREE: u64 = 64 << 20;
/// Options that are not in the config file.
#[derive(Debug, Clone, Copy)]
pub struct OpenOptions {
    /// Write redb's allocator state on every commit once the file is at least this large (or the
    /// disk nearly full, [`QUICK_REPAIR_BELOW_FREE`]), so that opening after a crash does not walk
    /// the whole file (see [`QUICK_REPAIR_FROM`] and BENCHMARKS.md for the cost on each side); 0:
    /// always.
    pub quick_repair_from: u64,
    /// Refuse to write (operator inspection beside a running agent).
    pub read_only: bool,
    /// Verify every page's checksum while opening (about 0.2 s per GB), so damage shows up as
    /// `Corrupted` now rather than as a failed read later. Used when reopening after a failure.
    pub verify: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            quick_repair_from: QUICK_REPAIR_FROM,
            read_only: false,
            verify: false,
        }
    }
}

/// The database, writable or (beside a running agent) read-only.
pub(super) enum Db {
    Rw(Database),
    Ro(redb::ReadOnlyDatabase),
}

impl Db {
    pub(super) fn begin_read(&self) -> Result<redb::ReadTransaction, StoreError> {
        match self {
            Db::Rw(d) => d.begin_read().map_err(StoreError::from),
            Db::Ro(d) => d.begin_read().map_err(StoreError::from),
        }
    }

    pub(super) fn rw(&mut self) -> Result<&mut Database, StoreError> {
        match self {
            Db::Rw(d) => Ok(d),
            Db::Ro(_) => Err(StoreError::ReadOnly),
        }
    }
}

pub struct Store {
    pub(super) db: Db,
    pub(super) path: PathBuf,
    /// By name: ordered, so listing them needs no sort.
    pub(super) streams: BTreeMap<String, StreamState>,
    pub(super) storage: StorageConfig,
    pub(super) opts: OpenOptions,
    /// A transaction was dropped or failed: in-memory counters may be ahead of the disk.
    pub(super) stale: bool,
    /// See [`Store::id`].
    pub(super) id: u64,
    /// The data directory: spooled files are relative to it.
    pub(super) data_dir: PathBuf,
    /// Spooled files whose jobs left the store in committed transactions (or before the last
    /// crash), not yet disposed of: the owner takes them with [`Store::take_disposals`].
    pub(super) disposals: Vec<Disposal>,
    /// Bytes of the damaged store files moved aside in `data_dir` when this store was opened.
    pub(super) aside_bytes: u64,
    /// The file's free pages, as counted for `storage.min_free` (see [`FreePages`]).
    pub(super) free_pages: FreePages,
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
pub(super) fn builder() -> redb::Builder {
    let mut b = Database::builder();
    b.set_cache_size(CACHE_BYTES);
    // One writer (the agent or an operator's command); read-only inspection may run beside it.
    b.set_concurrency_mode(ConcurrencyMode::SingleWriter);
    b
}

/// Creates the database file so that a power cut during creation never leaves a half-made file
/// under the real name: build it under a temporary name, sync, rename, sync the directory.
pub(super) fn create_fresh(path: &Path) -> Result<(), StoreError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = path.with_extension("redb.creating");
    let _ = std::fs::remove_file(&tmp);
    {
        let db = builder().create(&tmp).map_err(|e| db_error(&tmp, e))?;
        let txn = db.begin_write()?;
        {
            let mut meta = txn.open_table(META)?;
            meta.insert("layout", LAYOUT_VERSION)?;
            meta.insert(STORE_ID, new_store_id())?;
            txn.open_table(COUNTERS)?;
            txn.open_table(CHECKPOINTS)?;
            txn.open_table(QUARANTINE)?;
            txn.open_table(SPOOL)?;
            txn.open_table(DISPOSE)?;
        }
        txn.commit()?;
    }
    File::open(&tmp).and_then(|f| f.sync_all())?;
    std::fs::rename(&tmp, path)?;
    File::open(dir).and_then(|d| d.sync_all())?;
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
                return Err(StoreError::Missing { path });
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
                Err(DatabaseError::Storage(redb::StorageError::Corrupted(
                    format!("redb gave up reading the file: {}", panic_message(&*panic)),
                )))
            });
            Db::Rw(opened.map_err(|e| db_error(&path, e))?)
        };
        Self::with_db(db, path, storage, streams, opts)
    }

    /// Opens the store as [`Store::open`] does, for the agent, and always comes back with a store
    /// unless the data directory itself fails: a file redb reports as corrupted is opened again
    /// with every page verified (which rebuilds redb's allocator state and may well succeed); one
    /// that fails that too, or that redb does not recognise (damaged magic number or header, cut
    /// shorter than its header), or whose opening panicked, is moved aside (kept for inspection and
    /// salvage as `colibri.redb.corrupt-<ms>`, see [`super::aside`]) and a fresh one created. An
    /// empty file (a power cut before the first create's rename, on a filesystem that does not
    /// order it) holds nothing and is simply replaced. Logged at ERROR: data in the old file is no
    /// longer served. `verify`: check every page at once (a reopen after a failure). The store owns
    /// this recovery: nothing else renames its file.
    pub fn open_or_replace(
        dir: &Path,
        storage: StorageConfig,
        streams: &[StreamConfig],
        verify: bool,
    ) -> Result<Store, StoreError> {
        let path = dir.join(DB_FILE);
        if std::fs::metadata(&path).is_ok_and(|m| m.is_file() && m.len() == 0) {
            tracing::warn!(
                path = %path.display(),
                "the store file is empty (a power cut while it was first created); a new one is created"
            );
            std::fs::remove_file(&path)?;
        }
        // A plain open trusts redb's recorded allocator state; a verifying one checks every page
        // and rebuilds it, and may well succeed. Only a file that fails that too is given up on.
        let opened = match open_guarded(dir, storage, streams, verify) {
            Err(StoreError::Corrupted(reason)) if !verify => {
                tracing::warn!(
                    reason,
                    "the store looks damaged; opening it again with full verification"
                );
                open_guarded(dir, storage, streams, true)
            }
            other => other,
        };
        match opened {
            Err(StoreError::Corrupted(reason)) => {
                let aside = super::aside::move_aside(dir, crate::clock::now_ms())?;
                tracing::error!(
                    reason,
                    moved_to = %aside.display(),
                    "the store is corrupted; it was moved aside and a new one created"
                );
                Store::open(dir, storage, streams, OpenOptions::default())
            }
            other => other,
        }
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

    pub(super) fn with_db(
        db: Db,
        path: PathBuf,
        storage: StorageConfig,
        streams: &[StreamConfig],
        opts: OpenOptions,
    ) -> Result<Store, StoreError> {
        let data_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let aside_bytes = super::aside::list(&data_dir).iter().map(|f| f.bytes).sum();
        let mut store = Store {
            aside_bytes,
            db,
            data_dir,
            disposals: Vec::new(),
            free_pages: FreePages::new(),
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

    /// The data directory (spooled files are relative to it).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The store id from META; 0 when there is none (a read-only open of a file written before ids,
    /// or before its first writable open).
    pub(super) fn read_id(&self) -> Result<u64, StoreError> {
        let rtx = self.db.begin_read()?;
        match rtx.open_table(META) {
            Ok(t) => Ok(t.get(STORE_ID)?.map_or(0, |v| v.value())),
            Err(redb::TableError::TableDoesNotExist(_)) => Ok(0),
            Err(e) => Err(e.into()),
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

    pub(super) fn load_counters(&mut self) -> Result<(), StoreError> {
        let rtx = self.db.begin_read()?;
        let table = match rtx.open_table(COUNTERS) {
            Ok(t) => Some(t),
            Err(redb::TableError::TableDoesNotExist(_)) => None,
            Err(e) => return Err(e.into()),
        };
        for st in self.streams.values_mut() {
            st.counters = Counters::default();
            if let Some(t) = &table {
                for name in Counters::NAMES {
                    if let Some(v) = t.get((st.cfg.name.as_str(), *name))? {
                        st.counters.set(name, v.value());
                    }
                }
                // Written before compression at rest: every job is stored as it is.
                if t.get((st.cfg.name.as_str(), "ready_raw_bytes"))?.is_none() {
                    st.counters.raw_from_bytes();
                }
            }
            if st.counters.next_id == 0 {
                st.counters.next_id = 1;
            }
        }
        self.stale = false;
        Ok(())
    }

    /// A redb write transaction as every commit of this store must be made: durable, and with
    /// redb's allocator state written (quick repair) when the file is large or the disk nearly
    /// full (see [`QUICK_REPAIR_FROM`]: a commit without it also deletes the state an earlier one
    /// wrote). With the free disk, when it was read for that.
    pub(super) fn begin_write(
        &mut self,
    ) -> Result<(redb::WriteTransaction, Option<u64>), StoreError> {
        let mut txn = self.db.rw()?.begin_write()?;
        let mut free_disk = None;
        let quick = self.opts.quick_repair_from == 0
            || self.file_bytes() >= self.opts.quick_repair_from
            || {
                free_disk = super::tx::free_disk_bytes(&self.path);
                free_disk.is_some_and(|f| f < QUICK_REPAIR_BELOW_FREE)
            };
        txn.set_quick_repair(quick);
        #[cfg(test)]
        if self.unsafe_no_fsync {
            txn.set_durability(Durability::None)?;
        }
        #[cfg(not(test))]
        txn.set_durability(Durability::Immediate)?;
        Ok((txn, free_disk))
    }

    /// Begins a write transaction. After a failed or abandoned one, counters are reloaded first.
    pub fn transaction(&mut self) -> Result<Tx<'_>, StoreError> {
        if self.stale {
            self.load_counters()?;
        }
        let (txn, free_disk) = self.begin_write()?;
        Ok(Tx {
            txn,
            rollback: Rollback::new(self),
            dirty: HashSet::new(),
            fed: HashSet::new(),
            free_disk,
            free_pages: None,
            disposals: Vec::new(),
            touched: false,
        })
    }
}

/// [`Store::open`] (writable), with a panic anywhere in it (redb reading a damaged page while the
/// layout is checked or the counters loaded) reported as corruption.
fn open_guarded(
    dir: &Path,
    storage: StorageConfig,
    streams: &[StreamConfig],
    verify: bool,
) -> Result<Store, StoreError> {
    let opts = OpenOptions {
        verify,
        ..OpenOptions::default()
    };
    std::panic::catch_unwind(|| Store::open(dir, storage, streams, opts)).unwrap_or_else(|panic| {
        Err(StoreError::Corrupted(format!(
            "redb gave up reading the file: {}",
            panic_message(&*panic)
        )))
    })
}

/// The text of a caught panic, if it has one.
pub(super) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}
