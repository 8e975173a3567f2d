//! Tests of the durable store: the `Tx` API on a real file, a model-based random test, corruption,
//! power loss (crash images built from what was synced plus a torn subset of what was not), the
//! salvage of damaged files, I/O errors, and the group-commit writer.
//!
//! Every loop is bounded and every random choice comes from a seeded `fastrand::Rng`.
//!
//! The store opens redb in `ConcurrencyMode::SingleWriter`, which needs byte-range locks from the
//! backend, so every test backend here grants them (`no_op_locks!`): one `Store` at a time per
//! test disk, in one process, is exactly what a lock would enforce.

use super::*;

use std::time::Duration;

use redb::{ReadableTable, StorageBackend, TableDefinition};

use super::files::{SpoolEntry, spool_entry};
use super::job::fresh_meta;
use super::layout::{COUNTERS, DISPOSE, META, QUARANTINE, SPOOL, STORE_ID};
use super::open::Db;
use super::tx::QuarantineEntry;
use crate::clock::now_ms;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use redb::BackendError;
use redb::backends::InMemoryBackend;

// -------------------------------------------------------------------------------------------------
// Fixtures and checks

/// A fixed "now" so that tests do not depend on the clock.
const T0: u64 = 1_700_000_000_000;
const S: &str = "s";

fn stream(name: &str) -> StreamConfig {
    StreamConfig {
        name: name.into(),
        sink: None,
        batch: BatchConfig {
            max_records: 1000,
            max_bytes: 1 << 20,
            linger: Duration::ZERO,
        },
        max_jobs: 1 << 30,
        max_bytes: 1 << 40,
        when_full: WhenFull::Block,
        ttl: None,
        max_age: None,
        dead_max_jobs: 1000,
        // Exact sizes in most tests; compression has tests of its own, and the power-loss and
        // model tests run with it.
        compression: AtRest::Plain,
        replay: Replay::OLDEST_FIRST,
        hold_until_clock_synced: false,
        downsample: None,
    }
}

fn unbounded() -> StorageConfig {
    StorageConfig {
        max_bytes: u64::MAX / 4,
        min_free: 0,
    }
}

/// `n` records `tag-0`, `tag-1`, ...
fn recs(tag: &str, n: usize) -> Vec<Vec<u8>> {
    (0..n).map(|i| format!("{tag}-{i}").into_bytes()).collect()
}

/// Records of the given sizes, each filled with its own byte.
fn sized(tag: u8, sizes: &[usize]) -> Vec<Vec<u8>> {
    sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| vec![tag.wrapping_add(i as u8); n])
        .collect()
}

/// The stored size of a fresh job holding `records`.
fn job_bytes(records: &[Vec<u8>]) -> u64 {
    format::encode(T0, &fresh_meta(0, None), records).len() as u64
}

/// Same, for the rest of a job after `offset` records were settled (its metadata names the offset).
fn rest_bytes(records: &[Vec<u8>], offset: u32) -> u64 {
    format::encode(T0, &fresh_meta(offset, None), records).len() as u64
}

/// A job's records, owned, for comparisons.
fn owned(j: &Job) -> Vec<Vec<u8>> {
    let recs = j.records().expect("the job's records read");
    recs.list().into_iter().map(<[u8]>::to_vec).collect()
}

fn ids(jobs: &[Job]) -> Vec<u64> {
    jobs.iter().map(|j| j.lease.id).collect()
}

/// A data directory with a fixed configuration, opened and reopened at will.
struct Dir {
    dir: tempfile::TempDir,
    storage: StorageConfig,
    streams: Vec<StreamConfig>,
}

impl Dir {
    fn new(streams: Vec<StreamConfig>) -> Dir {
        Dir {
            dir: tempfile::tempdir().expect("a temporary directory"),
            storage: unbounded(),
            streams,
        }
    }

    fn with_storage(mut self, storage: StorageConfig) -> Dir {
        self.storage = storage;
        self
    }

    fn open(&self) -> Store {
        let store = Store::open(
            self.dir.path(),
            self.storage,
            &self.streams,
            OpenOptions::default(),
        )
        .expect("the store opens");
        check(&store);
        store
    }

    /// Closes `store`, opens the file again and checks every counter came back exactly.
    #[track_caller]
    fn reopen(&self, mut store: Store) -> Store {
        // After an abort the in-memory counters are re-read before use; do that now so `before`
        // is what the disk holds.
        if store.stale {
            store.load_counters().expect("counters reload");
        }
        let before: Vec<Counters> = store.streams().map(|(_, c)| c.clone()).collect();
        drop(store);
        let store = self.open();
        let after: Vec<Counters> = store.streams().map(|(_, c)| c.clone()).collect();
        assert_eq!(before, after, "counters changed across a reopen");
        assert!(store.streams.values().all(|s| s.in_flight.is_empty()));
        store
    }
}

/// What a table really holds.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Tally {
    jobs: u64,
    records: u64,
    bytes: u64,
    raw: u64,
}

fn tally<K: redb::Key + 'static>(
    rtx: &redb::ReadTransaction,
    def: TableDefinition<'_, K, &'static [u8]>,
) -> Tally {
    let t = rtx.open_table(def).expect("the table exists");
    let mut out = Tally::default();
    for e in t.iter().expect("iterates") {
        let (_, v) = e.expect("reads");
        let size = format::size(v.value());
        out.jobs += 1;
        out.records += size.records;
        out.bytes += size.bytes;
        out.raw += size.raw;
    }
    out
}

/// The counters of `stream` as committed (not as held in memory).
fn disk_counters(store: &Store, stream: &str) -> Counters {
    let rtx = store.db.begin_read().expect("read transaction");
    let t = rtx.open_table(COUNTERS).expect("counters table");
    let mut c = Counters::default();
    for name in Counters::NAMES {
        if let Some(v) = t.get((stream, *name)).expect("reads") {
            c.set(name, v.value());
        }
    }
    if c.next_id == 0 {
        c.next_id = 1;
    }
    c
}

/// After a commit: every stream balances, the counters in memory are the committed ones, and the
/// queue counters are what the tables really hold.
#[track_caller]
fn check(store: &Store) {
    assert!(!store.stale, "checked right after a commit");
    let rtx = store.db.begin_read().expect("read transaction");
    for (cfg, c) in store.streams() {
        let name = &cfg.name;
        assert!(c.balanced(), "{name}: unbalanced {c:?}");
        assert_eq!(
            &disk_counters(store, name),
            c,
            "{name}: counters in memory differ from the committed ones"
        );
        let st = &store.streams[name];
        let t = |jobs, records, bytes, raw| Tally {
            jobs,
            records,
            bytes,
            raw,
        };
        assert_eq!(
            tally(&rtx, st.ready_def()),
            t(
                c.ready_jobs,
                c.ready_records,
                c.ready_bytes,
                c.ready_raw_bytes
            ),
            "{name}: ready table vs counters"
        );
        assert_eq!(
            tally(&rtx, st.retry_def()),
            t(
                c.retry_jobs,
                c.retry_records,
                c.retry_bytes,
                c.retry_raw_bytes
            ),
            "{name}: retry table vs counters"
        );
        assert_eq!(
            tally(&rtx, st.dead_def()),
            t(c.dead_jobs, c.dead_records, c.dead_bytes, c.dead_raw_bytes),
            "{name}: dead table vs counters"
        );
    }
}

fn counters(store: &Store, stream: &str) -> Counters {
    store.counters(stream).expect("known stream").clone()
}

/// One append in its own committed transaction (committed even when refused: `drop_newest` counts).
#[track_caller]
fn append(
    store: &mut Store,
    stream: &str,
    records: &[Vec<u8>],
    now: u64,
) -> Result<Appended, AppendError> {
    let mut tx = store.transaction().expect("begin");
    let r = tx.append_list(stream, records, None, now);
    tx.commit().expect("commit");
    check(store);
    r
}

#[track_caller]
fn take(store: &mut Store, stream: &str, max_jobs: usize, now: u64) -> Vec<Job> {
    let mut tx = store.transaction().expect("begin");
    let jobs = tx.take(stream, max_jobs, u64::MAX, now).expect("take");
    tx.commit().expect("commit");
    check(store);
    jobs
}

#[track_caller]
fn ack(store: &mut Store, leases: &[&Lease]) {
    let mut tx = store.transaction().expect("begin");
    for l in leases {
        tx.ack(l).expect("ack");
    }
    tx.commit().expect("commit");
    check(store);
}

#[track_caller]
fn fail(store: &mut Store, lease: &Lease, failure: &Failure, now: u64) -> Failed {
    let mut tx = store.transaction().expect("begin");
    let r = tx.fail(lease, failure, now).expect("fail");
    tx.commit().expect("commit");
    check(store);
    r
}

#[track_caller]
fn settle(store: &mut Store, lease: &Lease, n: u32, outcome: &Settle, now: u64) -> Job {
    let mut tx = store.transaction().expect("begin");
    let rest = tx.settle_prefix(lease, n, outcome, now).expect("settle");
    tx.commit().expect("commit");
    check(store);
    rest
}

fn dead(reason: &str) -> Settle {
    Settle::Dead {
        reason: reason.into(),
    }
}

fn transient(retry_at_ms: u64, max_attempts: u32) -> Failure {
    Failure::Transient {
        reason: "503".into(),
        retry_at_ms,
        max_attempts,
    }
}

fn permanent() -> Failure {
    Failure::Permanent {
        reason: "400 bad request".into(),
    }
}

/// Takes every job, returning their records (the jobs stay in flight until the tx commits).
fn take_all(store: &mut Store, stream: &str, now: u64) -> Vec<Job> {
    let mut tx = store.transaction().expect("begin");
    let jobs = tx.take(stream, usize::MAX, u64::MAX, now).expect("take");
    tx.commit().expect("commit");
    jobs
}

/// Grants every lock: the tests open one store at a time on a disk, in one process.
macro_rules! no_op_locks {
    () => {
        fn try_lock_range(&self, _: Bound<u64>, _: Bound<u64>) -> Result<bool, BackendError> {
            Ok(true)
        }
        fn try_lock_shared_range(
            &self,
            _: Bound<u64>,
            _: Bound<u64>,
        ) -> Result<bool, BackendError> {
            Ok(true)
        }
        fn lock_range(&self, _: Bound<u64>, _: Bound<u64>) -> Result<(), BackendError> {
            Ok(())
        }
        fn lock_shared_range(&self, _: Bound<u64>, _: Bound<u64>) -> Result<(), BackendError> {
            Ok(())
        }
        fn unlock_range(&self, _: Bound<u64>, _: Bound<u64>) -> Result<(), BackendError> {
            Ok(())
        }
        fn query_lock_range(&self, _: Bound<u64>, _: Bound<u64>) -> Result<bool, BackendError> {
            Ok(false)
        }
    };
}

/// redb's plain in-memory backend, with the locks `SingleWriter` mode asks for.
#[derive(Debug, Default)]
struct Locked(InMemoryBackend);

impl Locked {
    fn with_bytes(bytes: &[u8]) -> Locked {
        let b = Locked::default();
        b.0.set_len(bytes.len() as u64).expect("in memory");
        b.0.write(0, bytes).expect("in memory");
        b
    }
}

impl StorageBackend for Locked {
    fn len(&self) -> std::io::Result<u64> {
        self.0.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        self.0.read(offset, out)
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.0.set_len(len)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.0.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.0.write(offset, data)
    }
    no_op_locks!();
}

/// Switches that make a [`MemDisk`] fail.
#[derive(Debug, Default)]
struct Faults {
    fail_write: AtomicBool,
    fail_sync: AtomicBool,
    /// Writes that would grow the disk fail as a full disk's do (ENOSPC).
    full: AtomicBool,
    syncs: AtomicU64,
}

/// Bytes in memory shared by every backend made from it, so that a new `Store` can be opened on
/// what an old one left (a restarted process on the same disk); fails writes or syncs on demand.
#[derive(Debug, Clone, Default)]
struct MemDisk {
    bytes: Arc<Mutex<Vec<u8>>>,
    faults: Arc<Faults>,
}

fn injected(what: &str) -> std::io::Error {
    std::io::Error::other(format!("injected {what} failure"))
}

impl StorageBackend for MemDisk {
    fn len(&self) -> std::io::Result<u64> {
        Ok(self.bytes.lock().unwrap().len() as u64)
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        let b = self.bytes.lock().unwrap();
        let at = usize::try_from(offset).expect("small");
        let src = b
            .get(at..at + out.len())
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))?;
        out.copy_from_slice(src);
        Ok(())
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        if self.faults.fail_write.load(Ordering::SeqCst) {
            return Err(injected("set_len"));
        }
        let len = usize::try_from(len).expect("small");
        if self.faults.full.load(Ordering::SeqCst) && len > self.bytes.lock().unwrap().len() {
            return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
        }
        self.bytes.lock().unwrap().resize(len, 0);
        Ok(())
    }
    fn sync_data(&self) -> std::io::Result<()> {
        if self.faults.fail_sync.load(Ordering::SeqCst) {
            return Err(injected("fsync"));
        }
        self.faults.syncs.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        if self.faults.fail_write.load(Ordering::SeqCst) {
            return Err(injected("write"));
        }
        // A full disk refuses a write to the file as redb grows it (tmpfs, or ext4 writing a
        // hole's pages): any write once it is full, here.
        if self.faults.full.load(Ordering::SeqCst) {
            return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
        }
        let mut b = self.bytes.lock().unwrap();
        let at = usize::try_from(offset).expect("small");
        if b.len() < at + data.len() {
            b.resize(at + data.len(), 0);
        }
        b[at..at + data.len()].copy_from_slice(data);
        Ok(())
    }
    no_op_locks!();
}

fn open_mem(disk: &MemDisk, storage: StorageConfig, streams: &[StreamConfig]) -> Store {
    let store = Store::open_backend(disk.clone(), storage, streams, OpenOptions::default())
        .expect("the store opens on the memory disk");
    check(&store);
    store
}

// The sections, declared after the fixtures so that their macros (`no_op_locks!`) are in scope.
mod basics;
mod clock;
mod compaction;
mod compression;
mod corruption;
mod downsample;
mod file_jobs;
mod free_pages;
mod group_commit;
mod io_errors;
mod lanes;
mod model;
mod power_loss;
mod regressions;
mod salvage;
mod settle;
mod start_always;
