//! Tests of the durable store: the `Tx` API on a real file, a model-based random test, corruption,
//! power loss (crash images built from what was synced plus a torn subset of what was not), I/O
//! errors, and the group-commit writer.
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
        dead_max_jobs: 1000,
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
    format::encode(T0, &fresh_meta(0), records).len() as u64
}

/// Same, for the rest of a job after `offset` records were settled (its metadata names the offset).
fn rest_bytes(records: &[Vec<u8>], offset: u32) -> u64 {
    format::encode(T0, &fresh_meta(offset), records).len() as u64
}

/// A job's records, owned, for comparisons.
fn owned(j: &Job) -> Vec<Vec<u8>> {
    j.records().map(<[u8]>::to_vec).collect()
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
}

fn tally<K: redb::Key + 'static>(
    rtx: &redb::ReadTransaction,
    def: TableDefinition<'_, K, &'static [u8]>,
) -> Tally {
    let t = rtx.open_table(def).expect("the table exists");
    let mut out = Tally::default();
    for e in t.iter().expect("iterates") {
        let (_, v) = e.expect("reads");
        out.jobs += 1;
        out.records += format::header(v.value()).map_or(0, |h| u64::from(h.records));
        out.bytes += format::stored_len(v.value());
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
        let t = |jobs, records, bytes| Tally {
            jobs,
            records,
            bytes,
        };
        assert_eq!(
            tally(&rtx, st.ready_def()),
            t(c.ready_jobs, c.ready_records, c.ready_bytes),
            "{name}: ready table vs counters"
        );
        assert_eq!(
            tally(&rtx, st.retry_def()),
            t(c.retry_jobs, c.retry_records, c.retry_bytes),
            "{name}: retry table vs counters"
        );
        assert_eq!(
            tally(&rtx, st.dead_def()),
            t(c.dead_jobs, c.dead_records, c.dead_bytes),
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
    let r = tx.append(stream, records, None, now);
    tx.commit().expect("commit");
    check(store);
    r
}

#[track_caller]
fn take(store: &mut Store, stream: &str, max_jobs: usize, now: u64) -> Vec<Job> {
    let mut tx = store.transaction().expect("begin");
    let jobs = tx.take(stream, max_jobs, now).expect("take");
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
    let jobs = tx.take(stream, usize::MAX, now).expect("take");
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

// -------------------------------------------------------------------------------------------------
// 1. Basics on a real file

#[test]
fn take_hands_out_jobs_fifo_and_ack_deletes_them() {
    let d = Dir::new(vec![stream(S)]);
    let mut store = d.open();
    for (tag, n) in [("a", 3), ("b", 2), ("c", 1)] {
        let a = append(&mut store, S, &recs(tag, n), T0).unwrap();
        assert_eq!(
            a,
            Appended {
                jobs: 1,
                records: n as u64,
                dropped_oldest: 0
            }
        );
    }
    let first = take(&mut store, S, 2, T0 + 1);
    assert_eq!(ids(&first), [1, 2]);
    assert_eq!(owned(&first[0]), recs("a", 3));
    assert_eq!(owned(&first[1]), recs("b", 2));
    assert_eq!(first[0].attempts, 0);
    assert_eq!(first[0].created_ms, T0);
    assert_eq!(first[0].lease.retry_due, None);
    assert_eq!(first[0].last_error, None);
    let rest = take(&mut store, S, 10, T0 + 1);
    assert_eq!(ids(&rest), [3]);
    assert!(take(&mut store, S, 10, T0 + 1).is_empty());
    assert_eq!(store.in_flight(S), 3);

    // Acknowledged out of order; each deletes exactly its job.
    ack(&mut store, &[&first[1].lease]);
    ack(&mut store, &[&first[0].lease, &rest[0].lease]);
    let c = counters(&store, S);
    assert_eq!((c.delivered_jobs, c.delivered_records), (3, 6));
    assert_eq!((c.ready_jobs, c.ready_records, c.ready_bytes), (0, 0, 0));
    assert_eq!(c.appended_records, 6);
    assert_eq!(store.in_flight(S), 0);
    // A second ack of a delivered job is an error, not a double count.
    let mut tx = store.transaction().unwrap();
    assert!(matches!(
        tx.ack(&first[0].lease),
        Err(StoreError::NoSuchJob { id: 1, .. })
    ));
    // Nothing changed: after an abort the counters read back the same.
    tx.abort().unwrap();

    // Ids keep growing across a reopen.
    let mut store = d.reopen(store);
    append(&mut store, S, &recs("d", 1), T0).unwrap();
    assert_eq!(ids(&take(&mut store, S, 10, T0)), [4]);
}

#[test]
fn append_cuts_jobs_by_max_records_and_max_bytes() {
    let mut cfg = stream(S);
    cfg.batch.max_records = 3;
    cfg.batch.max_bytes = 10;
    let d = Dir::new(vec![cfg]);
    let mut store = d.open();
    // (record sizes, expected records per job)
    let cases: [(&[usize], &[usize]); 5] = [
        (&[1, 1, 1, 1, 1, 1, 1], &[3, 3, 1]),
        (&[4, 4, 4, 4], &[2, 2]),
        // A record larger than max_bytes travels alone.
        (&[6, 15, 1], &[1, 1, 1]),
        // Exactly max_bytes fits.
        (&[5, 5, 1], &[2, 1]),
        (&[2], &[1]),
    ];
    for (i, (sizes, cut)) in cases.iter().enumerate() {
        let records = sized(i as u8 * 40, sizes);
        let a = append(&mut store, S, &records, T0).unwrap();
        assert_eq!(a.jobs, cut.len() as u64, "case {i}");
        assert_eq!(a.records, records.len() as u64, "case {i}");
        let jobs = take(&mut store, S, 100, T0);
        let got: Vec<usize> = jobs.iter().map(|j| j.record_count()).collect();
        assert_eq!(&got, cut, "case {i}: records per job");
        let flat: Vec<Vec<u8>> = jobs.iter().flat_map(owned).collect();
        assert_eq!(flat, records, "case {i}: records in order");
        let leases: Vec<&Lease> = jobs.iter().map(|j| &j.lease).collect();
        ack(&mut store, &leases);
    }
    let c = counters(&store, S);
    assert_eq!(c.appended_jobs, 3 + 2 + 3 + 2 + 1);
    assert_eq!(c.delivered_jobs, c.appended_jobs);
    d.reopen(store);
}

#[test]
fn due_retry_jobs_come_before_ready_ones_and_early_ones_wait() {
    let d = Dir::new(vec![stream(S)]);
    let mut store = d.open();
    for tag in ["a", "b", "c"] {
        append(&mut store, S, &recs(tag, 1), T0).unwrap();
    }
    let jobs = take(&mut store, S, 2, T0);
    assert_eq!(ids(&jobs), [1, 2]);
    assert_eq!(
        fail(&mut store, &jobs[0].lease, &transient(T0 + 1000, 5), T0),
        Failed::Retry {
            attempts: 1,
            due_ms: T0 + 1000
        }
    );
    assert_eq!(
        fail(&mut store, &jobs[1].lease, &transient(T0 + 500, 5), T0),
        Failed::Retry {
            attempts: 1,
            due_ms: T0 + 500
        }
    );
    let c = counters(&store, S);
    assert_eq!((c.retry_jobs, c.ready_jobs, c.retried_attempts), (2, 1, 2));

    // Nothing is due yet: only the ready job.
    let now = take(&mut store, S, 10, T0 + 499);
    assert_eq!(ids(&now), [3]);
    store.release(&now[0].lease);

    // Job 2 is due (its time has come exactly), job 1 is not.
    let now = take(&mut store, S, 10, T0 + 500);
    assert_eq!(ids(&now), [2, 3]);
    assert_eq!(now[0].lease.retry_due, Some(T0 + 500));
    assert_eq!(now[0].attempts, 1);
    assert_eq!(now[0].last_error.as_deref(), Some("503"));
    assert_eq!(owned(&now[0]), recs("b", 1));
    assert_eq!(now[1].lease.retry_due, None);
    for j in &now {
        store.release(&j.lease);
    }

    // Both due: by due time, then the ready one; max_jobs cuts the list.
    assert_eq!(ids(&take(&mut store, S, 1, T0 + 5000)), [2]);
    let all = take(&mut store, S, 10, T0 + 5000);
    assert_eq!(ids(&all), [1, 3]);
    assert_eq!(all[0].lease.retry_due, Some(T0 + 1000));
    // After a restart nothing is in flight: the same order again.
    let mut store = d.reopen(store);
    let all = take(&mut store, S, 10, T0 + 5000);
    assert_eq!(ids(&all), [2, 1, 3]);
    // Acknowledging a retry job deletes it from the retry table.
    ack(&mut store, &[&all[0].lease, &all[1].lease]);
    let c = counters(&store, S);
    assert_eq!((c.retry_jobs, c.delivered_jobs), (0, 2));
}

#[test]
fn transient_failures_go_dead_after_max_attempts() {
    let d = Dir::new(vec![stream(S)]);
    let mut store = d.open();
    append(&mut store, S, &recs("a", 4), T0).unwrap();
    let mut now = T0;
    for attempt in 1..=3u32 {
        let jobs = take(&mut store, S, 10, now);
        assert_eq!(ids(&jobs), [1], "attempt {attempt}");
        assert_eq!(jobs[0].attempts, attempt - 1);
        let r = fail(&mut store, &jobs[0].lease, &transient(now + 100, 3), now);
        if attempt < 3 {
            assert_eq!(
                r,
                Failed::Retry {
                    attempts: attempt,
                    due_ms: now + 100
                }
            );
        } else {
            assert_eq!(r, Failed::Dead { attempts: 3 });
        }
        now += 100;
    }
    assert!(take(&mut store, S, 10, now + 1_000_000).is_empty());
    let c = counters(&store, S);
    assert_eq!((c.dead_jobs, c.dead_records), (1, 4));
    assert_eq!((c.retry_jobs, c.ready_jobs), (0, 0));
    assert_eq!((c.retried_attempts, c.dead_lettered_records), (2, 4));
    let dead = store.peek(S, true, 10).unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!((dead[0].id, dead[0].attempts), (1, 3));
    assert_eq!(dead[0].last_error.as_deref(), Some("503"));
    assert_eq!(dead[0].last_failed_ms, T0 + 200);
    d.reopen(store);
}

#[test]
fn permanent_failure_goes_dead_at_once() {
    let d = Dir::new(vec![stream(S)]);
    let mut store = d.open();
    append(&mut store, S, &recs("a", 2), T0).unwrap();
    let jobs = take(&mut store, S, 10, T0);
    assert_eq!(
        fail(&mut store, &jobs[0].lease, &permanent(), T0 + 7),
        Failed::Dead { attempts: 1 }
    );
    let c = counters(&store, S);
    assert_eq!((c.dead_jobs, c.dead_records, c.retried_attempts), (1, 2, 0));
    let dead = store.peek(S, true, 10).unwrap();
    assert_eq!(dead[0].last_error.as_deref(), Some("400 bad request"));
    assert_eq!(dead[0].records, Ok(vec!["a-0".to_string(), "a-1".into()]));
    assert!(take(&mut store, S, 10, u64::MAX).is_empty());
    d.reopen(store);
}

#[test]
fn dead_letters_beyond_max_jobs_drop_the_oldest() {
    let mut cfg = stream(S);
    cfg.dead_max_jobs = 2;
    let d = Dir::new(vec![cfg]);
    let mut store = d.open();
    // Job i holds i records, so what was dropped is visible in the count.
    for i in 1..=4 {
        append(&mut store, S, &recs(&format!("j{i}"), i), T0).unwrap();
    }
    let jobs = take(&mut store, S, 10, T0);
    for j in &jobs {
        fail(&mut store, &j.lease, &permanent(), T0);
    }
    let c = counters(&store, S);
    assert_eq!((c.dead_jobs, c.dead_records), (2, 3 + 4));
    assert_eq!(c.dropped_dead_full_records, 1 + 2);
    assert_eq!(c.dead_lettered_records, 10);
    let dead: Vec<u64> = store
        .peek(S, true, 10)
        .unwrap()
        .iter()
        .map(|p| p.id)
        .collect();
    assert_eq!(dead, [3, 4]);
    d.reopen(store);
}

#[test]
fn ttl_expires_old_queued_jobs_but_never_one_in_flight() {
    let mut cfg = stream(S);
    cfg.ttl = Some(Duration::from_secs(10));
    let d = Dir::new(vec![cfg, stream("no-ttl")]);
    let mut store = d.open();
    append(&mut store, S, &recs("a", 1), T0).unwrap(); // 1
    append(&mut store, S, &recs("b", 2), T0 + 5_000).unwrap(); // 2
    append(&mut store, S, &recs("c", 3), T0 + 8_000).unwrap(); // 3
    append(&mut store, S, &recs("d", 4), T0 + 9_000).unwrap(); // 4
    append(&mut store, "no-ttl", &recs("x", 5), T0).unwrap();
    // Job 3 waits in retry, job 4 is in flight.
    let jobs = take(&mut store, S, 4, T0 + 9_000);
    fail(
        &mut store,
        &jobs[2].lease,
        &transient(T0 + 60_000, 9),
        T0 + 9_000,
    );
    store.release(&jobs[0].lease);
    store.release(&jobs[1].lease);

    let expire = |store: &mut Store, now: u64| {
        let mut tx = store.transaction().unwrap();
        let n = tx.expire(now).unwrap();
        tx.commit().unwrap();
        check(store);
        n
    };
    assert_eq!(expire(&mut store, T0 + 9_999), 0);
    // Age exactly the ttl: expired.
    assert_eq!(expire(&mut store, T0 + 10_000), 1);
    assert_eq!(expire(&mut store, T0 + 15_000), 2);
    // Job 3 (in retry) goes too; job 4 is in flight and stays.
    assert_eq!(expire(&mut store, T0 + 100_000), 3);
    let c = counters(&store, S);
    assert_eq!(c.expired_records, 6);
    assert_eq!((c.ready_jobs, c.retry_jobs), (1, 0));
    assert_eq!(counters(&store, "no-ttl").expired_records, 0);
    store.release(&jobs[3].lease);
    assert_eq!(expire(&mut store, T0 + 100_000), 4);
    assert!(take(&mut store, S, 10, u64::MAX).is_empty());
    let c = counters(&store, S);
    assert_eq!((c.expired_records, c.ready_jobs), (10, 0));
    d.reopen(store);
}

#[test]
fn replay_moves_dead_back_to_ready_and_purge_counts_as_dropped() {
    let d = Dir::new(vec![stream(S)]);
    let mut store = d.open();
    for i in 1..=4 {
        append(&mut store, S, &recs(&format!("j{i}"), i), T0).unwrap();
    }
    let jobs = take(&mut store, S, 3, T0);
    for j in &jobs {
        fail(&mut store, &j.lease, &permanent(), T0);
    }
    // Dead: 1, 2, 3; ready: 4.
    let mut tx = store.transaction().unwrap();
    assert!(matches!(
        tx.replay_dead(S, Some(99), usize::MAX),
        Err(StoreError::NoSuchJob { id: 99, .. })
    ));
    assert_eq!(tx.replay_dead(S, Some(2), usize::MAX).unwrap(), (1, 2));
    tx.commit().unwrap();
    check(&store);
    let back = take(&mut store, S, 10, T0);
    assert_eq!(ids(&back), [2, 4], "keeps its id, so its old place");
    assert_eq!((back[0].attempts, back[0].last_error.clone()), (0, None));
    assert_eq!(owned(&back[0]), recs("j2", 2));
    assert_eq!(back[0].created_ms, T0);
    for j in &back {
        store.release(&j.lease);
    }
    let mut tx = store.transaction().unwrap();
    assert_eq!(tx.replay_dead(S, None, usize::MAX).unwrap(), (2, 1 + 3));
    tx.commit().unwrap();
    check(&store);
    assert_eq!(counters(&store, S).replayed_records, 2 + 4);
    let all = take(&mut store, S, 10, T0);
    assert_eq!(ids(&all), [1, 2, 3, 4]);

    // Fail 1 and 3 at different times; purge what failed before a time, then the rest.
    fail(&mut store, &all[0].lease, &permanent(), T0 + 100);
    fail(&mut store, &all[2].lease, &permanent(), T0 + 200);
    let mut tx = store.transaction().unwrap();
    assert_eq!(
        tx.purge_dead(S, Some(T0 + 150), usize::MAX).unwrap(),
        (1, 1)
    );
    tx.commit().unwrap();
    check(&store);
    let mut tx = store.transaction().unwrap();
    assert_eq!(tx.purge_dead(S, None, usize::MAX).unwrap(), (1, 3));
    tx.commit().unwrap();
    check(&store);
    let c = counters(&store, S);
    assert_eq!(c.dropped_purged_records, 4);
    assert_eq!(c.dead_jobs, 0);
    assert_eq!(c.dropped_records(), 4);
    d.reopen(store);
}

#[test]
fn in_flight_jobs_are_not_handed_out_twice_and_are_ready_again_after_reopen() {
    let d = Dir::new(vec![stream(S)]);
    let mut store = d.open();
    for tag in ["a", "b", "c"] {
        append(&mut store, S, &recs(tag, 2), T0).unwrap();
    }
    let first = take(&mut store, S, 2, T0);
    assert_eq!(ids(&first), [1, 2]);
    assert_eq!(ids(&take(&mut store, S, 10, T0)), [3]);
    assert!(take(&mut store, S, 10, T0).is_empty());
    // A released job is served again, and only it.
    store.release(&first[1].lease);
    assert_eq!(ids(&take(&mut store, S, 10, T0)), [2]);

    // A transaction that takes and is then dropped hands nothing out.
    store.release(&first[0].lease);
    {
        let mut tx = store.transaction().unwrap();
        assert_eq!(ids(&tx.take(S, 10, T0).unwrap()), [1]);
    }
    assert_eq!(ids(&take(&mut store, S, 10, T0)), [1]);
    assert_eq!(store.in_flight(S), 3);

    // Taken but never acknowledged: after a restart they are all ready again, in order.
    let mut store = d.reopen(store);
    let again = take(&mut store, S, 10, T0);
    assert_eq!(ids(&again), [1, 2, 3]);
    assert_eq!(owned(&again[2]), recs("c", 2));
    assert_eq!(counters(&store, S).delivered_jobs, 0);
}

#[test]
fn aborted_transaction_changes_nothing_and_counters_are_reloaded() {
    let d = Dir::new(vec![stream(S)]);
    let mut store = d.open();
    append(&mut store, S, &recs("a", 2), T0).unwrap();
    let before = counters(&store, S);
    {
        let mut tx = store.transaction().unwrap();
        tx.append(S, &recs("gone", 5), Some(("src", b"never")), T0)
            .unwrap();
        let jobs = tx.take(S, 10, T0).unwrap();
        tx.ack(&jobs[0].lease).unwrap();
    }
    assert!(store.stale);
    store.transaction().unwrap().commit().unwrap();
    check(&store);
    assert_eq!(counters(&store, S), before);
    assert_eq!(store.checkpoint("src").unwrap(), None);
    let jobs = take(&mut store, S, 10, T0);
    assert_eq!(ids(&jobs), [1]);
    assert_eq!(owned(&jobs[0]), recs("a", 2));
    // The id the aborted append used is handed out again.
    append(&mut store, S, &recs("b", 1), T0).unwrap();
    assert_eq!(ids(&take(&mut store, S, 10, T0)), [2]);
    d.reopen(store);
}

#[test]
fn checkpoint_commits_with_its_records() {
    let d = Dir::new(vec![stream(S)]);
    let mut store = d.open();
    assert_eq!(store.checkpoint("tail").unwrap(), None);
    let mut tx = store.transaction().unwrap();
    tx.append(S, &recs("a", 3), Some(("tail", b"offset=30")), T0)
        .unwrap();
    tx.commit().unwrap();
    assert_eq!(
        store.checkpoint("tail").unwrap().as_deref(),
        Some(b"offset=30".as_slice())
    );
    // Not committed: neither the records nor the checkpoint.
    {
        let mut tx = store.transaction().unwrap();
        tx.append(S, &recs("b", 3), Some(("tail", b"offset=60")), T0)
            .unwrap();
    }
    assert_eq!(
        store.checkpoint("tail").unwrap().as_deref(),
        Some(b"offset=30".as_slice())
    );
    // A refused append (block, full) does not move the checkpoint either.
    store.streams.get_mut(S).unwrap().cfg.max_jobs = 1;
    let mut tx = store.transaction().unwrap();
    assert!(matches!(
        tx.append(S, &recs("c", 1), Some(("tail", b"offset=90")), T0),
        Err(AppendError::Full { .. })
    ));
    tx.append(S, &recs("c", 0), Some(("other", b"x")), T0)
        .unwrap();
    tx.commit().unwrap();
    check(&store);
    let store = d.reopen(store);
    assert_eq!(
        store.checkpoint("tail").unwrap().as_deref(),
        Some(b"offset=30".as_slice())
    );
    // An append of no records still saves its checkpoint.
    assert_eq!(
        store.checkpoint("other").unwrap().as_deref(),
        Some(b"x".as_slice())
    );
    assert_eq!(counters(&store, S).ready_records, 3);
}

#[test]
fn when_full_block_refuses_everything_and_stores_nothing() {
    let one = recs("x", 2);
    let size = job_bytes(&one);
    for (max_jobs, max_bytes, reason) in [
        (2, 1 << 40, FullReason::Jobs),
        (1 << 30, size * 5 / 2, FullReason::Bytes),
    ] {
        let mut cfg = stream(S);
        cfg.max_jobs = max_jobs;
        cfg.max_bytes = max_bytes;
        let d = Dir::new(vec![cfg]);
        let mut store = d.open();
        append(&mut store, S, &one, T0).unwrap();
        // A batch that would make two jobs when only one fits: all or nothing.
        let mut tx = store.transaction().unwrap();
        store_batch_limit(&mut tx, 1);
        let r = tx.append(S, &recs("y", 2), None, T0);
        assert!(
            matches!(&r, Err(AppendError::Full { reason: r, .. }) if *r == reason),
            "{r:?}"
        );
        tx.commit().unwrap();
        store.streams.get_mut(S).unwrap().cfg.batch.max_records = 1000;
        check(&store);
        append(&mut store, S, &one, T0).unwrap();
        let before = counters(&store, S);
        let r = append(&mut store, S, &one, T0);
        match r {
            Err(AppendError::Full { stream, reason: r }) => {
                assert_eq!((stream.as_str(), r), (S, reason));
                assert!(!r.is_disk());
            }
            other => panic!("expected Full, got {other:?}"),
        }
        assert_eq!(counters(&store, S), before, "nothing stored or counted");
        // Room appears when a job is delivered.
        let jobs = take(&mut store, S, 1, T0);
        ack(&mut store, &[&jobs[0].lease]);
        append(&mut store, S, &one, T0).unwrap();
        d.reopen(store);
    }
}

/// Sets the stream's batch size from inside a transaction (the config is the store's own copy).
fn store_batch_limit(tx: &mut Tx<'_>, max_records: u32) {
    tx.rollback
        .store
        .streams
        .get_mut(S)
        .unwrap()
        .cfg
        .batch
        .max_records = max_records;
}

#[test]
fn when_full_drop_newest_refuses_and_counts() {
    let one = recs("x", 3);
    let size = job_bytes(&one);
    for (max_jobs, max_bytes, reason) in [
        (2, 1 << 40, FullReason::Jobs),
        (1 << 30, size * 5 / 2, FullReason::Bytes),
    ] {
        let mut cfg = stream(S);
        cfg.max_jobs = max_jobs;
        cfg.max_bytes = max_bytes;
        cfg.when_full = WhenFull::DropNewest;
        let d = Dir::new(vec![cfg]);
        let mut store = d.open();
        append(&mut store, S, &one, T0).unwrap();
        append(&mut store, S, &one, T0).unwrap();
        let r = append(&mut store, S, &one, T0);
        match r {
            Err(AppendError::Refused {
                stream,
                reason: r,
                records,
            }) => assert_eq!((stream.as_str(), r, records), (S, reason, 3)),
            other => panic!("expected Refused, got {other:?}"),
        }
        let c = counters(&store, S);
        assert_eq!(c.appended_records, 9);
        assert_eq!(c.dropped_newest_records, 3);
        assert_eq!((c.ready_jobs, c.ready_records), (2, 6));
        let jobs = take(&mut store, S, 10, T0);
        assert_eq!(ids(&jobs), [1, 2], "the old ones are kept");
        d.reopen(store);
    }
}

#[test]
fn when_full_drop_oldest_deletes_old_ready_jobs_never_in_flight() {
    let one = |tag: &str| recs(tag, 2);
    let size = job_bytes(&one("a"));
    for (max_jobs, max_bytes) in [(3, 1 << 40), (1 << 30, size * 7 / 2)] {
        let mut cfg = stream(S);
        cfg.max_jobs = max_jobs;
        cfg.max_bytes = max_bytes;
        cfg.when_full = WhenFull::DropOldest;
        let d = Dir::new(vec![cfg]);
        let mut store = d.open();
        for (i, tag) in ["a", "b", "c", "d", "e"].iter().enumerate() {
            let a = append(&mut store, S, &one(tag), T0).unwrap();
            assert_eq!(a.dropped_oldest, if i < 3 { 0 } else { 2 }, "append {i}");
        }
        let c = counters(&store, S);
        assert_eq!(c.dropped_oldest_records, 4);
        assert_eq!((c.ready_jobs, c.appended_records), (3, 10));
        // Job 3 is in flight: the next append drops 4, not 3.
        let t = take(&mut store, S, 1, T0);
        assert_eq!(ids(&t), [3]);
        let a = append(&mut store, S, &one("f"), T0).unwrap();
        assert_eq!(a.dropped_oldest, 2);
        store.release(&t[0].lease);
        let left = take(&mut store, S, 10, T0);
        assert_eq!(ids(&left), [3, 5, 6]);
        assert_eq!(owned(&left[1]), one("e"));
        // Everything in flight: nothing can be dropped, so the stream is full.
        let r = append(&mut store, S, &one("g"), T0);
        assert!(matches!(r, Err(AppendError::Full { .. })), "{r:?}");
        assert_eq!(counters(&store, S).dropped_oldest_records, 6);
        d.reopen(store);
    }
}

#[test]
fn drop_oldest_deletes_nothing_when_the_batch_cannot_fit_anyway() {
    let mut cfg = stream(S);
    cfg.max_jobs = 3;
    cfg.batch.max_records = 1;
    cfg.when_full = WhenFull::DropOldest;
    let d = Dir::new(vec![cfg]);
    let mut store = d.open();
    append(&mut store, S, &recs("old", 3), T0).unwrap();
    // Jobs 1 and 2 are in flight; only job 3 could be dropped, and a batch of two needs two.
    let t = take(&mut store, S, 2, T0);
    assert_eq!(ids(&t), [1, 2]);
    let r = append(&mut store, S, &recs("new", 2), T0);
    assert!(matches!(r, Err(AppendError::Full { .. })), "{r:?}");
    let c = counters(&store, S);
    assert_eq!(
        (c.ready_jobs, c.dropped_oldest_records),
        (3, 0),
        "refused, yet job 3 was dropped: {c:?}"
    );
    // A batch of more jobs than max_jobs: never fits, so nothing may be dropped for it.
    store.release(&t[0].lease);
    store.release(&t[1].lease);
    let r = append(&mut store, S, &recs("huge", 4), T0);
    assert!(matches!(r, Err(AppendError::TooLarge { .. })), "{r:?}");
    assert_eq!(
        counters(&store, S).ready_jobs,
        3,
        "the whole backlog was dropped for a batch that was refused"
    );
}

#[test]
fn record_larger_than_the_stream_is_too_large() {
    let mut cfg = stream(S);
    cfg.max_bytes = 100;
    let d = Dir::new(vec![cfg]);
    let mut store = d.open();
    let r = append(&mut store, S, &[vec![7u8; 200]], T0);
    assert!(
        matches!(r, Err(AppendError::TooLarge { max: 100, .. })),
        "{r:?}"
    );
    assert_eq!(counters(&store, S).appended_records, 0);
    let r = append(&mut store, "nope", &recs("a", 1), T0);
    assert!(
        matches!(r, Err(AppendError::Store(StoreError::UnknownStream(_)))),
        "{r:?}"
    );
}

#[test]
fn storage_max_bytes_across_streams_is_full_with_reason_budget() {
    let one = recs("x", 2);
    let size = job_bytes(&one);
    let mut newest = stream("b");
    newest.when_full = WhenFull::DropNewest;
    let d = Dir::new(vec![stream("a"), newest]).with_storage(StorageConfig {
        max_bytes: size * 3,
        min_free: 0,
    });
    let mut store = d.open();
    append(&mut store, "a", &one, T0).unwrap();
    append(&mut store, "a", &one, T0).unwrap();
    append(&mut store, "b", &one, T0).unwrap();
    assert_eq!(store.stored_bytes(), size * 3);
    let r = append(&mut store, "a", &one, T0);
    assert!(
        matches!(
            r,
            Err(AppendError::Full {
                reason: FullReason::Budget,
                ..
            })
        ),
        "{r:?}"
    );
    let r = append(&mut store, "b", &one, T0);
    assert!(
        matches!(
            r,
            Err(AppendError::Refused {
                reason: FullReason::Budget,
                records: 2,
                ..
            })
        ),
        "{r:?}"
    );
    assert!(FullReason::Budget.is_disk());
    // Dead letters count against the budget too: failing a job frees nothing.
    let jobs = take(&mut store, "a", 1, T0);
    fail(&mut store, &jobs[0].lease, &permanent(), T0);
    assert!(append(&mut store, "a", &one, T0).is_err());
    // Purging them does.
    let mut tx = store.transaction().unwrap();
    tx.purge_dead("a", None, usize::MAX).unwrap();
    tx.commit().unwrap();
    append(&mut store, "a", &one, T0).unwrap();
    d.reopen(store);
}

#[test]
fn drop_oldest_makes_room_under_the_storage_budget() {
    let one = recs("x", 2);
    let size = job_bytes(&one);
    let mut cfg = stream(S);
    cfg.when_full = WhenFull::DropOldest;
    let d = Dir::new(vec![cfg]).with_storage(StorageConfig {
        max_bytes: size * 3,
        min_free: 0,
    });
    let mut store = d.open();
    for _ in 0..3 {
        append(&mut store, S, &one, T0).unwrap();
    }
    let r = append(&mut store, S, &one, T0);
    assert!(
        matches!(
            r,
            Ok(Appended {
                dropped_oldest: 2,
                ..
            })
        ),
        "a drop_oldest stream alone on the disk must drop its oldest job, got {r:?}"
    );
}

#[test]
fn min_free_makes_every_stream_full_with_reason_min_free() {
    let mut newest = stream("b");
    newest.when_full = WhenFull::DropNewest;
    let d = Dir::new(vec![stream("a"), newest]).with_storage(StorageConfig {
        max_bytes: u64::MAX / 4,
        min_free: u64::MAX / 2,
    });
    let mut store = d.open();
    let r = append(&mut store, "a", &recs("x", 1), T0);
    match r {
        Err(AppendError::Full { reason, .. }) => {
            assert_eq!(reason, FullReason::MinFree);
            assert!(reason.is_disk());
        }
        other => panic!("expected Full(MinFree), got {other:?}"),
    }
    let r = append(&mut store, "b", &recs("x", 1), T0);
    assert!(
        matches!(
            r,
            Err(AppendError::Refused {
                reason: FullReason::MinFree,
                ..
            })
        ),
        "{r:?}"
    );
    assert_eq!(counters(&store, "a").appended_records, 0);
    assert_eq!(counters(&store, "b").dropped_newest_records, 1);
    d.reopen(store);
}

#[test]
fn counters_survive_reopen_exactly() {
    let mut a = stream("a");
    a.dead_max_jobs = 1;
    a.ttl = Some(Duration::from_secs(1));
    let mut b = stream("b");
    b.max_jobs = 2;
    b.when_full = WhenFull::DropOldest;
    let d = Dir::new(vec![a, b]);
    let mut store = d.open();
    let mut rng = fastrand::Rng::with_seed(11);
    for round in 0..6u64 {
        let now = T0 + round * 400;
        for _ in 0..3 {
            append(&mut store, "a", &recs("a", rng.usize(1..5)), now).unwrap();
        }
        append(&mut store, "b", &recs("b", rng.usize(1..5)), now).unwrap();
        let jobs = take(&mut store, "a", 3, now);
        for (i, j) in jobs.iter().enumerate() {
            match i % 3 {
                0 => ack(&mut store, &[&j.lease]),
                1 => {
                    fail(&mut store, &j.lease, &permanent(), now);
                }
                _ => {
                    fail(&mut store, &j.lease, &transient(now + 100, 5), now);
                }
            }
        }
        let mut tx = store.transaction().unwrap();
        tx.expire(now).unwrap();
        tx.commit().unwrap();
        check(&store);
        store = d.reopen(store);
    }
    // Everything left in "a" is now older than its ttl.
    let mut tx = store.transaction().unwrap();
    assert!(tx.expire(T0 + 60_000).unwrap() > 0);
    tx.commit().unwrap();
    let store = d.reopen(store);
    let c = counters(&store, "a");
    assert!(
        c.delivered_records > 0 && c.dropped_dead_full_records > 0 && c.expired_records > 0,
        "{c:?}"
    );
    assert!(counters(&store, "b").dropped_oldest_records > 0);
}

// -------------------------------------------------------------------------------------------------
// 2. Model-based random test

/// A job as the model knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MJob {
    created: u64,
    attempts: u32,
    offset: u32,
    records: Vec<Vec<u8>>,
}

impl MJob {
    fn n(&self) -> u64 {
        self.records.len() as u64
    }
}

/// What one stream should hold: plain maps, no redb.
struct Model {
    cfg: StreamConfig,
    next_id: u64,
    ready: BTreeMap<u64, MJob>,
    retry: BTreeMap<(u64, u64), MJob>,
    dead: BTreeMap<u64, MJob>,
    in_flight: BTreeSet<u64>,
    appended: u64,
    delivered: u64,
    dropped_oldest: u64,
    dropped_newest: u64,
    dropped_dead_full: u64,
    dropped_purged: u64,
    expired: u64,
    replayed: u64,
    /// Jobs a refused `drop_oldest` append may or may not have dropped.
    undecided_drops: Option<Vec<u64>>,
}

#[derive(Debug, PartialEq, Eq)]
enum MAppend {
    Ok(Appended),
    Full,
    Refused(u64),
    /// More jobs than `max_jobs`: can never fit, nothing changes.
    TooLarge,
}

impl Model {
    fn new(cfg: StreamConfig) -> Model {
        Model {
            cfg,
            next_id: 1,
            ready: BTreeMap::new(),
            retry: BTreeMap::new(),
            dead: BTreeMap::new(),
            in_flight: BTreeSet::new(),
            appended: 0,
            delivered: 0,
            dropped_oldest: 0,
            dropped_newest: 0,
            dropped_dead_full: 0,
            dropped_purged: 0,
            expired: 0,
            replayed: 0,
            undecided_drops: None,
        }
    }

    /// Cuts records into jobs: at most `max_records`, at most `max_bytes` of records unless alone.
    fn cut(&self, records: &[Vec<u8>]) -> Vec<Vec<Vec<u8>>> {
        let mut jobs: Vec<Vec<Vec<u8>>> = Vec::new();
        let mut size = 0;
        for r in records {
            let fits = jobs.last().is_some_and(|j| {
                j.len() < self.cfg.batch.max_records as usize
                    && size + r.len() as u64 <= self.cfg.batch.max_bytes
            });
            if !fits {
                jobs.push(Vec::new());
                size = 0;
            }
            jobs.last_mut().unwrap().push(r.clone());
            size += r.len() as u64;
        }
        jobs
    }

    fn queued(&self) -> u64 {
        (self.ready.len() + self.retry.len()) as u64
    }

    fn append(&mut self, records: &[Vec<u8>], now: u64) -> MAppend {
        let jobs = self.cut(records);
        let nj = jobs.len() as u64;
        let n = records.len() as u64;
        let mut dropped = 0;
        if nj > self.cfg.max_jobs {
            return MAppend::TooLarge;
        }
        if self.queued() + nj > self.cfg.max_jobs {
            match self.cfg.when_full {
                WhenFull::Block => return MAppend::Full,
                WhenFull::DropNewest => {
                    self.appended += n;
                    self.dropped_newest += n;
                    return MAppend::Refused(n);
                }
                WhenFull::DropOldest => {
                    let mut q = self.queued();
                    let mut victims = Vec::new();
                    for &id in self.ready.keys() {
                        if q + nj <= self.cfg.max_jobs {
                            break;
                        }
                        if !self.in_flight.contains(&id) {
                            victims.push(id);
                            q -= 1;
                        }
                    }
                    if q + nj > self.cfg.max_jobs {
                        // Cannot fit even after dropping: whether the droppable jobs go anyway
                        // is left open (see `drop_oldest_deletes_nothing_when_the_batch_cannot_
                        // fit_anyway`); the caller settles it from what the store did.
                        self.undecided_drops = Some(victims);
                        return MAppend::Full;
                    }
                    for id in victims {
                        dropped += self.ready.remove(&id).unwrap().n();
                    }
                    self.dropped_oldest += dropped;
                }
            }
        }
        for records in jobs {
            self.ready.insert(
                self.next_id,
                MJob {
                    created: now,
                    attempts: 0,
                    offset: 0,
                    records,
                },
            );
            self.next_id += 1;
        }
        self.appended += n;
        MAppend::Ok(Appended {
            jobs: nj,
            records: n,
            dropped_oldest: dropped,
        })
    }

    /// (id, retry due, job) in the order `take` must hand them out.
    fn take(&mut self, max: usize, now: u64) -> Vec<(u64, Option<u64>, MJob)> {
        let mut out = Vec::new();
        for (&(due, id), j) in self.retry.range(..=(now, u64::MAX)) {
            if out.len() >= max {
                break;
            }
            if !self.in_flight.contains(&id) {
                out.push((id, Some(due), j.clone()));
            }
        }
        for (&id, j) in &self.ready {
            if out.len() >= max {
                break;
            }
            if !self.in_flight.contains(&id) {
                out.push((id, None, j.clone()));
            }
        }
        for (id, _, _) in &out {
            self.in_flight.insert(*id);
        }
        out
    }

    fn remove_leased(&mut self, lease: &Lease) -> MJob {
        self.in_flight.remove(&lease.id);
        match lease.retry_due {
            None => self.ready.remove(&lease.id),
            Some(due) => self.retry.remove(&(due, lease.id)),
        }
        .expect("the model knows the job")
    }

    fn ack(&mut self, lease: &Lease) {
        let j = self.remove_leased(lease);
        self.delivered += j.n();
    }

    fn fail(&mut self, lease: &Lease, failure: &Failure) -> Failed {
        let mut j = self.remove_leased(lease);
        j.attempts += 1;
        let attempts = j.attempts;
        match failure {
            Failure::Transient {
                retry_at_ms,
                max_attempts,
                ..
            } if attempts < *max_attempts => {
                self.retry.insert((*retry_at_ms, lease.id), j);
                Failed::Retry {
                    attempts,
                    due_ms: *retry_at_ms,
                }
            }
            _ => {
                self.dead.insert(lease.id, j);
                self.trim_dead();
                Failed::Dead { attempts }
            }
        }
    }

    fn trim_dead(&mut self) {
        while self.dead.len() as u64 > self.cfg.dead_max_jobs {
            let (_, old) = self.dead.pop_first().unwrap();
            self.dropped_dead_full += old.n();
        }
    }

    fn leased(&mut self, lease: &Lease) -> &mut MJob {
        match lease.retry_due {
            None => self.ready.get_mut(&lease.id),
            Some(due) => self.retry.get_mut(&(due, lease.id)),
        }
        .expect("the model knows the job")
    }

    /// The first `n` records of a leased job are delivered, or become a dead letter of their own.
    fn settle(&mut self, lease: &Lease, n: usize, dead: bool) -> MJob {
        let j = self.leased(lease);
        let part = MJob {
            created: j.created,
            attempts: j.attempts,
            offset: j.offset,
            records: j.records.drain(..n).collect(),
        };
        j.offset += n as u32;
        let rest = j.clone();
        if dead {
            self.dead.insert(self.next_id, part);
            self.next_id += 1;
            self.trim_dead();
        } else {
            self.delivered += part.n();
        }
        rest
    }

    fn expire(&mut self, now: u64) -> u64 {
        let Some(ttl) = self.cfg.ttl else { return 0 };
        let cutoff = now.saturating_sub(ttl.as_millis() as u64);
        let mut n = 0;
        let mut victims = Vec::new();
        for (&id, j) in &self.ready {
            if j.created > cutoff {
                break;
            }
            if !self.in_flight.contains(&id) {
                victims.push(id);
            }
        }
        for id in victims {
            n += self.ready.remove(&id).unwrap().n();
        }
        let victims: Vec<(u64, u64)> = self
            .retry
            .iter()
            .filter(|(k, j)| j.created <= cutoff && !self.in_flight.contains(&k.1))
            .map(|(k, _)| *k)
            .collect();
        for k in victims {
            n += self.retry.remove(&k).unwrap().n();
        }
        self.expired += n;
        n
    }

    fn replay_all(&mut self) -> (u64, u64) {
        let (mut jobs, mut records) = (0, 0);
        for (id, mut j) in std::mem::take(&mut self.dead) {
            j.attempts = 0;
            jobs += 1;
            records += j.n();
            self.ready.insert(id, j);
        }
        self.replayed += records;
        (jobs, records)
    }

    fn purge_all(&mut self) -> (u64, u64) {
        let jobs = self.dead.len() as u64;
        let records: u64 = self.dead.values().map(MJob::n).sum();
        self.dead.clear();
        self.dropped_purged += records;
        (jobs, records)
    }

    #[track_caller]
    fn compare(&self, store: &Store, ctx: &str) {
        let c = counters(store, &self.cfg.name);
        let want = [
            ("next_id", self.next_id),
            ("ready_jobs", self.ready.len() as u64),
            ("ready_records", total(self.ready.values())),
            ("retry_jobs", self.retry.len() as u64),
            ("retry_records", total(self.retry.values())),
            ("dead_jobs", self.dead.len() as u64),
            ("dead_records", total(self.dead.values())),
            ("appended_records", self.appended),
            ("delivered_records", self.delivered),
            ("dropped_oldest_records", self.dropped_oldest),
            ("dropped_newest_records", self.dropped_newest),
            ("dropped_dead_full_records", self.dropped_dead_full),
            ("dropped_purged_records", self.dropped_purged),
            ("expired_records", self.expired),
            ("replayed_records", self.replayed),
            ("quarantined_records", 0),
        ];
        let got: BTreeMap<&str, u64> = Counters::NAMES.iter().copied().zip(c.values()).collect();
        for (name, v) in want {
            assert_eq!(got[name], v, "{ctx}: counter {name}");
        }
        assert_eq!(
            store.in_flight(&self.cfg.name),
            self.in_flight.len(),
            "{ctx}: jobs in flight"
        );
    }
}

fn total<'a>(jobs: impl Iterator<Item = &'a MJob>) -> u64 {
    jobs.map(MJob::n).sum()
}

/// Random records: unique content, lengths that make `batch.max_bytes` cut.
fn random_records(rng: &mut fastrand::Rng, tag: &mut u64, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|_| {
            *tag += 1;
            let mut r = format!("{tag}:").into_bytes();
            r.resize(r.len() + rng.usize(0..20), b'.');
            r
        })
        .collect()
}

/// How often the random runs reached each interesting case (a vacuous run would pass too).
#[derive(Debug, Default)]
struct Coverage {
    full: u64,
    refused: u64,
    dropped_oldest: u64,
    refused_after_dropping: u64,
    retry_taken: u64,
    dead_trimmed: u64,
    expired: u64,
    replayed: u64,
    purged: u64,
    reopens: u64,
    aborts: u64,
    settled_delivered: u64,
    settled_dead: u64,
}

fn run_model(seed: u64, ops: usize, cov: &mut Coverage) {
    const M: &str = "m";
    let mut rng = fastrand::Rng::with_seed(seed);
    let cfg = StreamConfig {
        name: M.into(),
        sink: None,
        batch: BatchConfig {
            max_records: rng.u32(1..6),
            max_bytes: rng.u64(8..64),
            linger: Duration::ZERO,
        },
        max_jobs: rng.u64(4..24),
        max_bytes: 1 << 40,
        when_full: [WhenFull::Block, WhenFull::DropNewest, WhenFull::DropOldest]
            [(seed % 3) as usize],
        ttl: rng
            .bool()
            .then(|| Duration::from_millis(rng.u64(2_000..8_000))),
        dead_max_jobs: rng.u64(1..6),
    };
    let disk = MemDisk::default();
    let streams = [cfg.clone()];
    let mut store = open_mem(&disk, unbounded(), &streams);
    let mut model = Model::new(cfg);
    let mut held: Vec<Lease> = Vec::new();
    let mut now = T0;
    let mut tag = 0u64;
    for step in 0..ops {
        now += rng.u64(0..300);
        let op = rng.u32(0..100);
        let ctx = format!("seed {seed} step {step} op {op}");
        match op {
            0..30 => {
                let n = rng.usize(1..=12);
                let records = random_records(&mut rng, &mut tag, n);
                let want = model.append(&records, now);
                let got = append(&mut store, M, &records, now);
                let got = match got {
                    Ok(a) => MAppend::Ok(a),
                    Err(AppendError::Full { .. }) => MAppend::Full,
                    Err(AppendError::Refused { records, .. }) => MAppend::Refused(records),
                    Err(AppendError::TooLarge { .. }) => MAppend::TooLarge,
                    Err(e) => panic!("{ctx}: {e}"),
                };
                assert_eq!(got, want, "{ctx}: append");
                match &got {
                    MAppend::Full | MAppend::TooLarge => cov.full += 1,
                    MAppend::Refused(_) => cov.refused += 1,
                    MAppend::Ok(a) if a.dropped_oldest > 0 => cov.dropped_oldest += 1,
                    MAppend::Ok(_) => {}
                }
                if let Some(victims) = model.undecided_drops.take()
                    && counters(&store, M).dropped_oldest_records != model.dropped_oldest
                {
                    // The store dropped what it could before refusing: follow it (the counters
                    // and every later take check that it dropped exactly these).
                    for id in victims {
                        model.dropped_oldest += model.ready.remove(&id).unwrap().n();
                    }
                    cov.refused_after_dropping += 1;
                }
            }
            30..50 | 97..100 => {
                let max = rng.usize(1..6);
                let want = model.take(max, now);
                let mut tx = store.transaction().unwrap();
                let jobs = tx.take(M, max, now).unwrap();
                let got: Vec<(u64, Option<u64>, MJob)> = jobs
                    .iter()
                    .map(|j| {
                        (
                            j.lease.id,
                            j.lease.retry_due,
                            MJob {
                                created: j.created_ms,
                                attempts: j.attempts,
                                offset: j.offset,
                                records: owned(j),
                            },
                        )
                    })
                    .collect();
                assert_eq!(got, want, "{ctx}: take");
                cov.retry_taken += got.iter().filter(|g| g.1.is_some()).count() as u64;
                if op >= 97 {
                    // Deliver in the same transaction.
                    for j in &jobs {
                        tx.ack(&j.lease).unwrap();
                        model.ack(&j.lease);
                    }
                    tx.commit().unwrap();
                } else {
                    tx.commit().unwrap();
                    held.extend(jobs.into_iter().map(|j| j.lease));
                }
            }
            50..74 if !held.is_empty() => {
                let lease = held.swap_remove(rng.usize(..held.len()));
                let count = model.leased(&lease).records.len();
                match op {
                    50..56 if count >= 2 => {
                        let n = rng.usize(1..count);
                        let to_dead = rng.bool();
                        let want = model.settle(&lease, n, to_dead);
                        let outcome = if to_dead {
                            cov.settled_dead += 1;
                            Settle::Dead {
                                reason: format!("{ctx}: refused"),
                            }
                        } else {
                            cov.settled_delivered += 1;
                            Settle::Delivered
                        };
                        let rest = settle(&mut store, &lease, n as u32, &outcome, now);
                        let got = MJob {
                            created: rest.created_ms,
                            attempts: rest.attempts,
                            offset: rest.offset,
                            records: owned(&rest),
                        };
                        assert_eq!(got, want, "{ctx}: settle");
                        assert_eq!(rest.lease, lease, "{ctx}: settle keeps the lease");
                        held.push(lease);
                    }
                    50..63 => {
                        model.ack(&lease);
                        ack(&mut store, &[&lease]);
                    }
                    63..71 => {
                        let f = transient(now + rng.u64(0..3_000), 3);
                        let want = model.fail(&lease, &f);
                        assert_eq!(fail(&mut store, &lease, &f, now), want, "{ctx}: fail");
                    }
                    _ => {
                        let want = model.fail(&lease, &permanent());
                        let got = fail(&mut store, &lease, &permanent(), now);
                        assert_eq!(got, want, "{ctx}: permanent fail");
                    }
                }
            }
            74..79 if !held.is_empty() => {
                let lease = held.swap_remove(rng.usize(..held.len()));
                model.in_flight.remove(&lease.id);
                store.release(&lease);
            }
            79..85 => {
                now += rng.u64(0..4_000);
                let want = model.expire(now);
                let mut tx = store.transaction().unwrap();
                assert_eq!(tx.expire(now).unwrap(), want, "{ctx}: expire");
                tx.commit().unwrap();
            }
            85..88 => {
                drop(store);
                store = open_mem(&disk, unbounded(), &streams);
                cov.reopens += 1;
                held.clear();
                model.in_flight.clear();
            }
            88..92 => {
                // Work that is never committed.
                cov.aborts += 1;
                let n = rng.usize(1..5);
                let records = random_records(&mut rng, &mut tag, n);
                {
                    let mut tx = store.transaction().unwrap();
                    let _ = tx.append(M, &records, Some(("src", b"aborted")), now);
                    let _ = tx.take(M, 3, now).unwrap();
                    if let Some(l) = held.first() {
                        tx.ack(l).unwrap();
                    }
                    tx.expire(now + 1_000_000).unwrap();
                }
                // The next transaction reloads the counters.
                store.transaction().unwrap().commit().unwrap();
                assert_eq!(store.checkpoint("src").unwrap(), None);
                // The aborted ack released its lease; take it back so `held` stays true.
                if let Some(l) = held.first() {
                    assert!(!store.streams[M].in_flight.contains(&l.id), "{ctx}");
                    store.streams.get_mut(M).unwrap().in_flight.insert(l.id);
                }
            }
            92..95 => {
                let want = model.replay_all();
                let mut tx = store.transaction().unwrap();
                assert_eq!(
                    tx.replay_dead(M, None, usize::MAX).unwrap(),
                    want,
                    "{ctx}: replay"
                );
                tx.commit().unwrap();
            }
            95..97 => {
                let want = model.purge_all();
                let mut tx = store.transaction().unwrap();
                assert_eq!(
                    tx.purge_dead(M, None, usize::MAX).unwrap(),
                    want,
                    "{ctx}: purge"
                );
                tx.commit().unwrap();
            }
            _ => continue,
        }
        check(&store);
        model.compare(&store, &ctx);
    }
    // The end state survives a restart, and everything left is delivered in model order.
    drop(store);
    cov.dead_trimmed += model.dropped_dead_full;
    cov.expired += model.expired;
    cov.replayed += model.replayed;
    cov.purged += model.dropped_purged;
    let mut store = open_mem(&disk, unbounded(), &streams);
    model.in_flight.clear();
    model.compare(&store, &format!("seed {seed} after the final reopen"));
    let want = model.take(usize::MAX, u64::MAX);
    let got = take_all(&mut store, M, u64::MAX);
    assert_eq!(
        ids(&got),
        want.iter().map(|w| w.0).collect::<Vec<_>>(),
        "seed {seed}: final drain"
    );
}

#[test]
fn model_based_random_operations() {
    let started = Instant::now();
    let mut cov = Coverage::default();
    for seed in 0..40 {
        run_model(seed, 300, &mut cov);
    }
    eprintln!(
        "model-based: 40 seeds x 300 ops in {:?}; {cov:?}",
        started.elapsed()
    );
    let c = &cov;
    for (what, n) in [
        ("full", c.full),
        ("refused", c.refused),
        ("dropped oldest", c.dropped_oldest),
        ("retry jobs taken", c.retry_taken),
        ("dead letters trimmed", c.dead_trimmed),
        ("expired", c.expired),
        ("replayed", c.replayed),
        ("purged", c.purged),
        ("reopens", c.reopens),
        ("aborted transactions", c.aborts),
        ("settled as delivered", c.settled_delivered),
        ("settled as dead", c.settled_dead),
    ] {
        assert!(n > 0, "the random runs never reached: {what}");
    }
}

// -------------------------------------------------------------------------------------------------
// 3. Corruption

/// Overwrites the value of job `id` in the ready table of `stream`, bypassing the store.
fn overwrite_ready(store: &mut Store, stream: &str, id: u64, f: impl FnOnce(&mut Vec<u8>)) {
    let tx = store.transaction().unwrap();
    {
        let st = &tx.rollback.store.streams[stream];
        let mut t = tx.txn.open_table(st.ready_def()).unwrap();
        let mut v = t.get(id).unwrap().expect("the job exists").value().to_vec();
        f(&mut v);
        t.insert(id, v.as_slice()).unwrap();
    }
    tx.commit().unwrap();
}

fn quarantine_entries(store: &Store) -> Vec<QuarantineEntry> {
    let rtx = store.db.begin_read().unwrap();
    let t = rtx.open_table(QUARANTINE).unwrap();
    t.iter()
        .unwrap()
        .map(|e| postcard::from_bytes(e.unwrap().1.value()).expect("a quarantine entry"))
        .collect()
}

#[test]
fn undecodable_job_is_quarantined_and_the_good_ones_delivered() {
    let d = Dir::new(vec![stream(S)]);
    let mut store = d.open();
    for tag in ["a", "b", "c"] {
        append(&mut store, S, &recs(tag, 2), T0).unwrap();
    }
    // Bit rot in the last byte of job 2's records: the header is intact, the checksum is not.
    let mut rotten = Vec::new();
    overwrite_ready(&mut store, S, 2, |v| {
        *v.last_mut().unwrap() ^= 0x40;
        rotten = v.clone();
    });
    check(&store);
    let jobs = take(&mut store, S, 10, T0);
    assert_eq!(ids(&jobs), [1, 3]);
    assert_eq!(owned(&jobs[1]), recs("c", 2));
    assert_eq!(store.quarantined().unwrap(), 1);
    let c = counters(&store, S);
    assert_eq!(c.quarantined_records, 2);
    assert!(c.balanced());
    let q = quarantine_entries(&store);
    assert_eq!(
        (q[0].stream.as_str(), q[0].table.as_str(), q[0].id),
        (S, "ready", 2)
    );
    assert_eq!(q[0].raw, rotten);
    assert!(q[0].reason.contains("checksum"), "{}", q[0].reason);
    let leases: Vec<&Lease> = jobs.iter().map(|j| &j.lease).collect();
    ack(&mut store, &leases);
    let c = counters(&store, S);
    assert_eq!((c.ready_jobs, c.ready_records, c.ready_bytes), (0, 0, 0));
    assert_eq!(c.delivered_records, 4);
    // The store still opens and works.
    let mut store = d.reopen(store);
    assert_eq!(store.quarantined().unwrap(), 1);
    append(&mut store, S, &recs("d", 1), T0).unwrap();
    assert_eq!(ids(&take(&mut store, S, 10, T0)), [4]);
}

#[test]
fn garbage_value_between_good_jobs_is_quarantined() {
    let d = Dir::new(vec![stream(S)]);
    let mut store = d.open();
    for tag in ["a", "b", "c"] {
        append(&mut store, S, &recs(tag, 2), T0).unwrap();
    }
    overwrite_ready(&mut store, S, 2, |v| {
        *v = b"\xffnot a job at all, just some bytes".to_vec()
    });
    // (No table check here: see `garbage_value_leaves_no_phantom_backlog`.)
    let jobs = take_all(&mut store, S, T0);
    assert_eq!(ids(&jobs), [1, 3]);
    assert_eq!(owned(&jobs[1]), recs("c", 2));
    assert_eq!(store.quarantined().unwrap(), 1);
    assert!(counters(&store, S).balanced());
    let q = quarantine_entries(&store);
    assert_eq!((q[0].table.as_str(), q[0].id), ("ready", 2));
    assert!(q[0].reason.contains("version"), "{}", q[0].reason);
    ack_unchecked(&mut store, &jobs);
    assert!(counters(&store, S).balanced());
    assert_eq!(counters(&store, S).delivered_records, 4);
    // Quarantined values are not taken again, also after a restart, and the store works.
    drop(store);
    let mut store =
        Store::open(d.dir.path(), d.storage, &d.streams, OpenOptions::default()).unwrap();
    assert!(take_all(&mut store, S, T0).is_empty());
    assert_eq!(store.quarantined().unwrap(), 1);
    let mut tx = store.transaction().unwrap();
    tx.append(S, &recs("d", 1), None, T0).unwrap();
    tx.commit().unwrap();
    assert_eq!(ids(&take_all(&mut store, S, T0)), [4]);
    assert!(counters(&store, S).balanced());
}

/// Acknowledges jobs without checking the tables against the counters.
fn ack_unchecked(store: &mut Store, jobs: &[Job]) {
    let mut tx = store.transaction().unwrap();
    for j in jobs {
        tx.ack(&j.lease).unwrap();
    }
    tx.commit().unwrap();
}

#[test]
fn garbage_value_leaves_no_phantom_backlog() {
    let d = Dir::new(vec![stream(S)]);
    let mut store = d.open();
    for tag in ["a", "b", "c"] {
        append(&mut store, S, &recs(tag, 2), T0).unwrap();
    }
    overwrite_ready(&mut store, S, 2, |v| {
        *v = b"\xffnot a job at all, just some bytes".to_vec()
    });
    let jobs = take_all(&mut store, S, T0);
    ack_unchecked(&mut store, &jobs);
    let c = counters(&store, S);
    assert_eq!(c.ready_jobs, 0);
    assert_eq!(
        (c.ready_records, c.ready_bytes),
        (0, 0),
        "an empty queue reports a backlog: {c:?}"
    );
    assert_eq!(c.quarantined_records, 2);
    check(&store);
}

#[test]
fn bit_flip_in_the_record_count_keeps_the_accounting_balanced() {
    let d = Dir::new(vec![stream(S)]);
    let mut store = d.open();
    for tag in ["a", "b", "c", "d"] {
        append(&mut store, S, &recs(tag, 2), T0).unwrap();
    }
    // Bit 10 of the record count: job 2 now claims 1026 records.
    overwrite_ready(&mut store, S, 2, |v| v[2] ^= 0x04);
    let jobs = take_all(&mut store, S, T0);
    assert_eq!(ids(&jobs), [1, 3, 4]);
    ack_unchecked(&mut store, &jobs);
    let c = counters(&store, S);
    assert!(c.balanced(), "unbalanced after a bit flip: {c:?}");
    assert_eq!(c.quarantined_records, 2, "{c:?}");
    check(&store);
}

// -------------------------------------------------------------------------------------------------
// 4. Power loss
//
// One run of the workload on a `PowerBackend` records every write, length change and sync with its
// call number, and the call count at which each commit returned Ok. The disk at a power cut before
// call `c` is then: everything up to the last sync before `c` (durable) plus the changes after it
// (unsynced); what was acknowledged is every commit that returned before `c`. A sample of cut
// points is also run for real (the backend fails call `c` and every later one) and must give the
// same disk and the same acknowledgements, which checks the shortcut and the store's error path.

/// A write or length change that reached the OS but not (yet) the disk.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Unsynced {
    Write(u64, Vec<u8>),
    SetLen(u64),
}

fn apply(buf: &mut Vec<u8>, op: &Unsynced) {
    match op {
        Unsynced::Write(off, data) => {
            let at = *off as usize;
            if buf.len() < at + data.len() {
                buf.resize(at + data.len(), 0);
            }
            buf[at..at + data.len()].copy_from_slice(data);
        }
        Unsynced::SetLen(len) => buf.resize(*len as usize, 0),
    }
}

/// A change to the disk, as recorded for replay.
#[derive(Debug, Clone)]
enum Logged {
    Change(Unsynced),
    Sync,
}

/// What the disk holds when the power goes: the synced bytes and the changes since.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct DiskAtCut {
    durable: Vec<u8>,
    unsynced: Vec<Unsynced>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Image {
    /// Only what was synced.
    Durable,
    /// Every unsynced change reached the disk whole.
    Everything,
    /// A random subset of the unsynced writes, each torn to a random prefix of its 512-byte
    /// sectors, and any length the file had since the last sync.
    Random,
}

const SECTOR: u64 = 512;

impl DiskAtCut {
    fn sync(&mut self) {
        for op in std::mem::take(&mut self.unsynced) {
            apply(&mut self.durable, &op);
        }
    }

    fn crash_image(&self, kind: Image, rng: &mut fastrand::Rng) -> Vec<u8> {
        let mut img = self.durable.clone();
        let mut lens = vec![self.durable.len()];
        let mut len = self.durable.len();
        for op in &self.unsynced {
            match op {
                Unsynced::SetLen(l) => len = *l as usize,
                Unsynced::Write(off, d) => len = len.max(*off as usize + d.len()),
            }
            lens.push(len);
        }
        for op in &self.unsynced {
            let Unsynced::Write(off, data) = op else {
                continue;
            };
            let keep = match kind {
                Image::Durable => 0,
                Image::Everything => data.len(),
                Image::Random if rng.bool() => 0,
                Image::Random if rng.bool() => data.len(),
                Image::Random => {
                    // Sectors are aligned on the disk: keep the first k sectors the write touches.
                    let end = off + data.len() as u64;
                    let mut cuts = Vec::new();
                    let mut b = (off / SECTOR + 1) * SECTOR;
                    while b < end {
                        cuts.push((b - off) as usize);
                        b += SECTOR;
                    }
                    cuts.push(data.len());
                    cuts[rng.usize(..cuts.len())]
                }
            };
            if keep > 0 {
                apply(&mut img, &Unsynced::Write(*off, data[..keep].to_vec()));
            }
        }
        let len = match kind {
            Image::Durable => lens[0],
            Image::Everything => *lens.last().unwrap(),
            Image::Random => lens[rng.usize(..lens.len())],
        };
        img.resize(len, 0);
        img
    }
}

#[derive(Debug, Default)]
struct PowerState {
    /// What reads see (the OS page cache).
    live: Vec<u8>,
    disk: DiskAtCut,
    log: Vec<(u64, Logged)>,
    calls: u64,
    /// The call (1-based) at which power goes: it and every later call fail.
    cut_at: Option<u64>,
    /// A lying disk: `sync_data` reports success and makes nothing durable.
    lying_sync: bool,
}

/// A disk that loses power at a chosen call, and records what reached it.
#[derive(Debug, Clone, Default)]
struct PowerBackend(Arc<Mutex<PowerState>>);

impl PowerBackend {
    fn cutting_at(call: u64) -> PowerBackend {
        let b = PowerBackend::default();
        b.0.lock().unwrap().cut_at = Some(call);
        b
    }

    fn call(&self) -> std::io::Result<MutexGuard<'_, PowerState>> {
        let mut s = self.0.lock().unwrap();
        s.calls += 1;
        if s.cut_at.is_some_and(|c| s.calls >= c) {
            return Err(std::io::Error::other("power cut"));
        }
        Ok(s)
    }

    fn calls(&self) -> u64 {
        self.0.lock().unwrap().calls
    }

    fn change(&self, op: Unsynced) -> std::io::Result<()> {
        let mut s = self.call()?;
        apply(&mut s.live, &op);
        let n = s.calls;
        s.log.push((n, Logged::Change(op.clone())));
        s.disk.unsynced.push(op);
        Ok(())
    }
}

impl StorageBackend for PowerBackend {
    fn len(&self) -> std::io::Result<u64> {
        Ok(self.call()?.live.len() as u64)
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        let s = self.call()?;
        let at = offset as usize;
        let src = s
            .live
            .get(at..at + out.len())
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))?;
        out.copy_from_slice(src);
        Ok(())
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.change(Unsynced::SetLen(len))
    }
    fn sync_data(&self) -> std::io::Result<()> {
        let mut s = self.call()?;
        if !s.lying_sync {
            s.disk.sync();
            let n = s.calls;
            s.log.push((n, Logged::Sync));
        }
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.change(Unsynced::Write(offset, data.to_vec()))
    }
    fn close(&self) -> std::io::Result<()> {
        self.call().map(drop)
    }
    no_op_locks!();
}

const P: &str = "p";

fn power_stream() -> StreamConfig {
    stream(P)
}

/// One committed transaction of the power-loss workload.
#[derive(Debug, Clone)]
enum Step {
    /// One job (the batch limit is above 20 records), with the source checkpoint `step <i>`.
    Append(Vec<Vec<u8>>),
    /// Take the oldest jobs and acknowledge them in the same transaction.
    Deliver(usize),
}

/// 60 appends of 1-20 small records, and a delivery after every fourth (so pages get freed and
/// reused).
fn power_steps(seed: u64) -> Vec<Step> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut steps = Vec::new();
    for a in 0..60 {
        let n = rng.usize(1..=20);
        let records = (0..n)
            .map(|r| {
                let mut v = format!("a{a:02}r{r:02}:").into_bytes();
                v.resize(v.len() + rng.usize(0..60), b'~');
                v
            })
            .collect();
        steps.push(Step::Append(records));
        if a % 4 == 3 {
            steps.push(Step::Deliver(rng.usize(1..4)));
        }
    }
    steps
}

fn step_checkpoint(i: usize) -> Vec<u8> {
    format!("step {i}").into_bytes()
}

/// The flaw a control run plants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flaw {
    None,
    /// `Store::unsafe_no_fsync`: commits with `Durability::None`.
    NoFsync,
    /// The disk acknowledges `sync_data` without making anything durable.
    LyingDisk,
}

/// What a run acknowledged before the power went.
#[derive(Debug, Default, PartialEq, Eq)]
struct RunOutcome {
    opened: bool,
    /// Steps whose commit returned Ok.
    acked: Vec<usize>,
    /// The step under way when the power went: its commit may or may not have reached the disk.
    in_doubt: Option<usize>,
}

/// Call counts when the store had opened and when each step's commit had returned.
#[derive(Debug, Default)]
struct Timeline {
    opened_at: Option<u64>,
    done_at: Vec<u64>,
}

fn power_run(backend: &PowerBackend, steps: &[Step], flaw: Flaw) -> (RunOutcome, Timeline) {
    // The store id is random (fastrand's thread-local generator); every run must write the same
    // bytes for the replay to be compared with a real run.
    fastrand::seed(0x1d);
    let mut out = RunOutcome::default();
    let mut timeline = Timeline::default();
    let opened = Store::open_backend(
        backend.clone(),
        unbounded(),
        &[power_stream()],
        OpenOptions::default(),
    );
    let Ok(mut store) = opened else {
        return (out, timeline);
    };
    out.opened = true;
    timeline.opened_at = Some(backend.calls());
    match flaw {
        Flaw::None => {}
        Flaw::NoFsync => store.unsafe_no_fsync = true,
        Flaw::LyingDisk => backend.0.lock().unwrap().lying_sync = true,
    }
    for (i, step) in steps.iter().enumerate() {
        let r = (|| -> Result<(), StoreError> {
            let mut tx = store.transaction()?;
            match step {
                Step::Append(records) => {
                    let cp = step_checkpoint(i);
                    tx.append(P, records, Some(("src", &cp)), T0)
                        .map_err(|e| match e {
                            AppendError::Store(e) => e,
                            other => panic!("unexpected {other}"),
                        })?;
                }
                Step::Deliver(n) => {
                    for j in tx.take(P, *n, T0)? {
                        tx.ack(&j.lease)?;
                    }
                }
            }
            tx.commit()
        })();
        match r {
            Ok(()) => {
                out.acked.push(i);
                timeline.done_at.push(backend.calls());
            }
            Err(_) => {
                out.in_doubt = Some(i);
                break;
            }
        }
    }
    // After a cut every call fails: closing must still not panic.
    drop(store);
    (out, timeline)
}

/// What a run that lost power at call `cut` acknowledged, from the uncut run's timeline.
fn outcome_at(timeline: &Timeline, steps: usize, cut: u64) -> RunOutcome {
    let opened = timeline.opened_at.is_some_and(|c| c < cut);
    if !opened {
        return RunOutcome::default();
    }
    let acked: Vec<usize> = (0..timeline.done_at.len())
        .filter(|&i| timeline.done_at[i] < cut)
        .collect();
    let in_doubt = (acked.len() < steps).then_some(acked.len());
    RunOutcome {
        opened,
        acked,
        in_doubt,
    }
}

/// The queue (jobs of records), checkpoint, appended and delivered records after `applied`.
type Expected = (Vec<Vec<Vec<u8>>>, Option<Vec<u8>>, u64, u64);

fn simulate(steps: &[Step], applied: impl Iterator<Item = usize>) -> Expected {
    let mut q: VecDeque<Vec<Vec<u8>>> = VecDeque::new();
    let (mut cp, mut appended, mut delivered) = (None, 0, 0);
    for i in applied {
        match &steps[i] {
            Step::Append(records) => {
                q.push_back(records.clone());
                cp = Some(step_checkpoint(i));
                appended += records.len() as u64;
            }
            Step::Deliver(n) => {
                for _ in 0..*n {
                    if let Some(j) = q.pop_front() {
                        delivered += j.len() as u64;
                    }
                }
            }
        }
    }
    (q.into(), cp, appended, delivered)
}

/// Opens a crash image on a plain in-memory backend and checks that it holds exactly the
/// acknowledged state, or that plus the in-doubt step whole: every acknowledged record, in order,
/// once, with its checkpoint and counters; nothing quarantined.
fn check_image(img: &[u8], steps: &[Step], run: &RunOutcome) -> Result<(), String> {
    let mut store = Store::open_backend(
        Locked::with_bytes(img),
        unbounded(),
        &[power_stream()],
        OpenOptions::default(),
    )
    .map_err(|e| format!("the crash image does not open: {e}"))?;
    let c = counters(&store, P);
    if !c.balanced() {
        return Err(format!("unbalanced after the crash: {c:?}"));
    }
    let jobs = take_all(&mut store, P, T0);
    if c.ready_jobs != jobs.len() as u64 {
        return Err(format!(
            "ready_jobs {} but {} jobs",
            c.ready_jobs,
            jobs.len()
        ));
    }
    if store.quarantined().map_err(|e| e.to_string())? != 0 {
        return Err("a job was quarantined after the crash".into());
    }
    let got = (
        jobs.into_iter().map(|j| owned(&j)).collect::<Vec<_>>(),
        store.checkpoint("src").map_err(|e| e.to_string())?,
        c.appended_records,
        c.delivered_records,
    );
    let without = simulate(steps, run.acked.iter().copied());
    if got == without {
        return Ok(());
    }
    if let Some(d) = run.in_doubt
        && got == simulate(steps, run.acked.iter().copied().chain([d]))
    {
        return Ok(());
    }
    let want: Vec<&Vec<u8>> = without.0.iter().flatten().collect();
    let have: BTreeSet<&Vec<u8>> = got.0.iter().flatten().collect();
    let missing = want.iter().filter(|r| !have.contains(*r)).count();
    let text = |c: &Option<Vec<u8>>| c.as_ref().map(|c| String::from_utf8_lossy(c).into_owned());
    Err(format!(
        "acknowledged steps {}, in doubt {:?}: {} records expected, {} found, {missing} \
         acknowledged records missing; checkpoint {:?} (expected {:?}); appended {} delivered {} \
         (expected {} {})",
        run.acked.len(),
        run.in_doubt,
        want.len(),
        got.0.iter().flatten().count(),
        text(&got.1),
        text(&without.1),
        got.2,
        got.3,
        without.2,
        without.3,
    ))
}

#[derive(Debug, Default)]
struct PowerReport {
    total_calls: u64,
    cut_points: u64,
    /// Cut points at which the store had not finished opening (nothing acknowledged).
    before_open: u64,
    /// Cut points also run for real, with the same result as the replay.
    real_runs: u64,
    images: u64,
    /// Images that failed the check (losses and panics).
    failures: u64,
    /// Images on which redb panicked.
    panics: u64,
    /// Images that opened and lacked acknowledged state (or held it wrong).
    losses: u64,
    first_loss: Option<String>,
    first_failures: Vec<String>,
}

/// Cuts the power before every `stride`-th storage call of the whole run (opens, reads, writes,
/// syncs and closes alike), `target_cuts` cut points in all, and checks two fixed and
/// `random_images` random crash images at each. Every `real_every`-th cut point is also run for
/// real. Stops at the first cut point that lost acknowledged state when `stop_at_first` is set.
fn power_loss_campaign(
    seed: u64,
    flaw: Flaw,
    target_cuts: u64,
    random_images: usize,
    real_every: u64,
    stop_at_first: bool,
) -> PowerReport {
    let steps = power_steps(seed);
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x5eed);
    let mut report = PowerReport::default();
    let recorder = PowerBackend::default();
    let (run, timeline) = power_run(&recorder, &steps, flaw);
    assert_eq!(
        run.acked.len(),
        steps.len(),
        "the workload must run to completion without a power cut ({flaw:?}): {run:?}"
    );
    report.total_calls = recorder.calls();
    let log = std::mem::take(&mut recorder.0.lock().unwrap().log);
    let stride = (report.total_calls / target_cuts).max(1);
    let mut disk = DiskAtCut::default();
    let mut next = 0;
    let mut cut = 1 + seed % stride;
    while cut <= report.total_calls + 1 {
        while next < log.len() && log[next].0 < cut {
            match &log[next].1 {
                Logged::Sync => disk.sync(),
                Logged::Change(op) => disk.unsynced.push(op.clone()),
            }
            next += 1;
        }
        let run = outcome_at(&timeline, steps.len(), cut);
        if report.cut_points % real_every == 0 {
            let real = PowerBackend::cutting_at(cut);
            let (real_run, _) = power_run(&real, &steps, flaw);
            assert_eq!(real_run, run, "cut at call {cut}: real run vs replay");
            assert!(
                real.0.lock().unwrap().disk == disk,
                "cut at call {cut}: the real run left another disk than the replay"
            );
            report.real_runs += 1;
        }
        report.cut_points += 1;
        if !run.opened {
            report.before_open += 1;
        }
        let mut lost_here = false;
        let kinds = [Image::Durable, Image::Everything]
            .into_iter()
            .chain(std::iter::repeat_n(Image::Random, random_images));
        for kind in kinds {
            let img = disk.crash_image(kind, &mut rng);
            report.images += 1;
            // redb may panic on a file that is no state it ever wrote (a lying disk): that is a
            // failed image too, not a crashed test.
            let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                check_image(&img, &steps, &run)
            }))
            .unwrap_or_else(|p| {
                report.panics += 1;
                let msg = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                Err(format!("opening or reading the image panicked: {msg}"))
            });
            let r = match checked {
                // Nothing was acknowledged: the image need not even open, but if it does it must
                // be empty.
                Err(e) if !run.opened && e.starts_with("the crash image does not open") => Ok(()),
                other => other,
            };
            if let Err(e) = r {
                let e = format!("cut at call {cut} ({kind:?} image): {e}");
                report.failures += 1;
                if !e.contains("panicked") {
                    report.losses += 1;
                    lost_here = true;
                    report.first_loss.get_or_insert_with(|| e.clone());
                }
                if report.first_failures.len() < 5 {
                    report.first_failures.push(e);
                }
            }
        }
        if lost_here && stop_at_first {
            break;
        }
        cut += stride;
    }
    report
}

#[test]
fn power_loss_never_loses_an_acknowledged_record() {
    let started = Instant::now();
    // About 400 cut points (every third storage call) keep this near 7 s in a debug build;
    // COLIBRI_POWER_LOSS_EXHAUSTIVE=1 cuts at every call with five random images each.
    let exhaustive = std::env::var_os("COLIBRI_POWER_LOSS_EXHAUSTIVE").is_some();
    let report = if exhaustive {
        power_loss_campaign(1, Flaw::None, u64::MAX, 5, 30, false)
    } else {
        power_loss_campaign(1, Flaw::None, 400, 3, 20, false)
    };
    eprintln!(
        "power loss: {} storage calls in the run, {} cut points ({} before the store opened, {} \
         also run for real), {} crash images checked, {} failed ({} panics), in {:?}",
        report.total_calls,
        report.cut_points,
        report.before_open,
        report.real_runs,
        report.images,
        report.failures,
        report.panics,
        started.elapsed()
    );
    assert!(report.cut_points >= 300, "{report:?}");
    assert_eq!(
        report.failures, 0,
        "acknowledged records lost: {:#?}",
        report.first_failures
    );
}

/// Runs a control campaign and asserts the checker saw acknowledged records go missing.
fn control_catches(flaw: Flaw) {
    let started = Instant::now();
    let report = power_loss_campaign(1, flaw, 400, 3, 20, true);
    eprintln!(
        "{flaw:?} control: {} cut points, {} images, {} losses, {} panics, in {:?}; first loss: \
         {:?}",
        report.cut_points,
        report.images,
        report.losses,
        report.panics,
        started.elapsed(),
        report.first_loss
    );
    assert!(
        report
            .first_loss
            .as_deref()
            .is_some_and(|l| l.contains("acknowledged records missing")),
        "the checker missed acknowledged records that never reached the disk ({flaw:?}): \
         {report:?}"
    );
}

#[test]
fn power_loss_checker_catches_a_lying_disk() {
    // The same workload on a disk whose fsync reports success and does nothing: acknowledged
    // records must go missing at some cut point, or the checker above proves nothing.
    control_catches(Flaw::LyingDisk);
}

#[test]
fn power_loss_checker_catches_the_planted_no_fsync_bug() {
    control_catches(Flaw::NoFsync);
}

#[test]
fn open_backend_works_on_a_backend_without_locks() {
    let mut store = Store::open_backend(
        InMemoryBackend::new(),
        unbounded(),
        &[stream(S)],
        OpenOptions::default(),
    )
    .expect("open_backend says it opens a store on any redb backend");
    append(&mut store, S, &recs("a", 1), T0).unwrap();
}

// -------------------------------------------------------------------------------------------------
// 5. I/O errors

#[derive(Debug, Clone, Copy)]
enum Fault {
    Sync,
    Write,
}

impl Fault {
    fn set(self, disk: &MemDisk, on: bool) {
        let flag = match self {
            Fault::Sync => &disk.faults.fail_sync,
            Fault::Write => &disk.faults.fail_write,
        };
        flag.store(on, Ordering::SeqCst);
    }
}

/// The records of every queued job, oldest first, taken and released again.
fn queued_records(store: &mut Store, stream: &str) -> Vec<Vec<Vec<u8>>> {
    let jobs = take_all(store, stream, u64::MAX);
    for j in &jobs {
        store.release(&j.lease);
    }
    jobs.into_iter().map(|j| owned(&j)).collect()
}

#[test]
fn failed_fsync_or_write_is_not_acknowledged_and_a_new_store_recovers() {
    for fault in [Fault::Sync, Fault::Write] {
        for clear_before_drop in [false, true] {
            let ctx = format!("{fault:?}, cleared before drop: {clear_before_drop}");
            let disk = MemDisk::default();
            let streams = [stream(S)];
            let mut store = open_mem(&disk, unbounded(), &streams);
            append(&mut store, S, &recs("acked", 3), T0).unwrap();

            fault.set(&disk, true);
            let r = store.transaction().and_then(|mut tx| {
                tx.append(S, &recs("doubt", 2), Some(("src", b"doubt")), T0)
                    .map_err(|e| StoreError::io(e.to_string()))?;
                tx.commit()
            });
            assert!(matches!(r, Err(StoreError::Io(_))), "{ctx}: {r:?}");
            // Whatever the old store does now, it must not claim success.
            let again = store.transaction().and_then(|mut tx| {
                tx.append(S, &recs("later", 1), None, T0)
                    .map_err(|e| StoreError::io(e.to_string()))?;
                tx.commit()
            });
            assert!(again.is_err(), "{ctx}: committed while the disk fails");
            if clear_before_drop {
                fault.set(&disk, false);
                drop(store);
            } else {
                drop(store);
                fault.set(&disk, false);
            }

            let mut store = open_mem(&disk, unbounded(), &streams);
            let q = queued_records(&mut store, S);
            assert_eq!(
                q.first(),
                Some(&recs("acked", 3)),
                "{ctx}: acknowledged job"
            );
            // The failed commit's outcome is unknown: whole or absent, never half.
            let doubt_in = q.len() == 2;
            match q.len() {
                1 => {}
                2 => assert_eq!(q[1], recs("doubt", 2), "{ctx}"),
                n => panic!("{ctx}: {n} jobs"),
            }
            assert_eq!(
                store.checkpoint("src").unwrap().is_some(),
                doubt_in,
                "{ctx}: checkpoint and records commit together"
            );
            append(&mut store, S, &recs("after", 4), T0).unwrap();
            let q = queued_records(&mut store, S);
            assert_eq!(q.last(), Some(&recs("after", 4)), "{ctx}");
            let mut store = {
                drop(store);
                open_mem(&disk, unbounded(), &streams)
            };
            let jobs = take_all(&mut store, S, T0);
            let leases: Vec<&Lease> = jobs.iter().map(|j| &j.lease).collect();
            ack(&mut store, &leases);
            let c = counters(&store, S);
            assert_eq!(c.ready_jobs, 0, "{ctx}");
            assert_eq!(
                c.delivered_records,
                3 + 4 + if doubt_in { 2 } else { 0 },
                "{ctx}"
            );
        }
    }
}

// -------------------------------------------------------------------------------------------------
// 6. The group-commit writer

fn spawn_on(disk: &MemDisk, streams: Vec<StreamConfig>) -> writer::StoreHandle {
    let store = open_mem(disk, unbounded(), &streams);
    let d = disk.clone();
    let reopen = Box::new(move || {
        Store::open_backend(d.clone(), unbounded(), &streams, OpenOptions::default())
    });
    writer::spawn(store, reopen, writer::WriterOptions::default()).expect("the writer starts")
}

#[tokio::test]
async fn writer_group_commits_concurrent_producers() {
    const PRODUCERS: usize = 64;
    const BATCHES: usize = 20;
    const RECORDS: usize = 10;
    let disk = MemDisk::default();
    let handle = spawn_on(&disk, vec![stream(S)]);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for p in 0..PRODUCERS {
        let h = handle.clone();
        tasks.push(tokio::spawn(async move {
            for b in 0..BATCHES {
                let records = recs(&format!("p{p:02}b{b:02}"), RECORDS);
                let a = h
                    .append(S, records, None, None)
                    .await
                    .expect("acknowledged");
                assert_eq!(a.records, RECORDS as u64);
            }
        }));
    }
    for t in tasks {
        t.await.expect("producer");
    }
    let appends = (PRODUCERS * BATCHES) as u64;
    let commits = handle.stats().commits.load(Ordering::Relaxed);
    eprintln!(
        "writer: {appends} appends in {commits} commits ({} fsyncs) in {:?}",
        disk.faults.syncs.load(Ordering::Relaxed),
        started.elapsed()
    );
    assert!(commits < appends, "no group commit: {commits} commits");
    let snap = handle.snapshot().await.unwrap();
    let c = &snap.streams[0].1;
    assert_eq!(c.appended_records, appends * RECORDS as u64);
    assert_eq!(c.ready_records, appends * RECORDS as u64);
    assert!(c.balanced());
    // Every acknowledged record is stored once, and each producer's batches are in order.
    let jobs = handle.take(S, usize::MAX).await.unwrap();
    assert_eq!(jobs.len() as u64, appends);
    let mut next = [0usize; PRODUCERS];
    for j in &jobs {
        let first = String::from_utf8(owned(j)[0].clone()).unwrap();
        let p: usize = first[1..3].parse().unwrap();
        let b: usize = first[4..6].parse().unwrap();
        assert_eq!(b, next[p], "producer {p}: batches out of order");
        next[p] += 1;
        assert_eq!(owned(j), recs(&format!("p{p:02}b{b:02}"), RECORDS));
    }
    assert!(next.iter().all(|&n| n == BATCHES));
    handle.shutdown().await;
    // What the writer acknowledged is on the disk.
    let store = open_mem(&disk, unbounded(), &[stream(S)]);
    assert_eq!(counters(&store, S).ready_records, appends * RECORDS as u64);
}

#[tokio::test]
async fn writer_block_waits_until_the_deadline_or_until_room_appears() {
    let mut cfg = stream(S);
    cfg.max_jobs = 2;
    let disk = MemDisk::default();
    let handle = spawn_on(&disk, vec![cfg]);
    for tag in ["a", "b"] {
        handle.append(S, recs(tag, 1), None, None).await.unwrap();
    }
    // No wait: full at once.
    let r = handle.append(S, recs("c", 1), None, None).await;
    assert!(
        matches!(
            r,
            Err(AppendError::Full {
                reason: FullReason::Jobs,
                ..
            })
        ),
        "{r:?}"
    );
    // Nothing frees room: Full after about the wait.
    let wait = Duration::from_millis(200);
    let t = Instant::now();
    let r = handle.append(S, recs("c", 1), None, Some(wait)).await;
    let waited = t.elapsed();
    assert!(matches!(r, Err(AppendError::Full { .. })), "{r:?}");
    assert!(
        waited >= wait && waited < wait + Duration::from_millis(800),
        "waited {waited:?}"
    );

    // A take and an ack free room before the deadline: the parked append goes in.
    let t = Instant::now();
    let deadline = Duration::from_secs(2);
    let (appended, freed) = tokio::join!(
        biased;
        handle.append(S, recs("c", 1), None, Some(deadline)),
        async {
            let jobs = handle.take(S, 1).await.unwrap();
            assert_eq!(ids(&jobs), [1]);
            handle.ack(jobs[0].lease.clone()).await.unwrap();
            t.elapsed()
        }
    );
    let took = t.elapsed();
    appended.expect("room appeared before the deadline");
    assert!(
        took >= freed && took < deadline,
        "took {took:?}, freed at {freed:?}"
    );
    let snap = handle.snapshot().await.unwrap();
    let c = &snap.streams[0].1;
    assert_eq!(
        (c.ready_jobs, c.delivered_jobs, c.appended_records),
        (2, 1, 3)
    );
    let jobs = handle.take(S, 10).await.unwrap();
    assert_eq!(owned(&jobs[1]), recs("c", 1));
    handle.shutdown().await;
}

#[tokio::test]
async fn writer_reopens_the_store_after_a_failed_commit() {
    let disk = MemDisk::default();
    let handle = spawn_on(&disk, vec![stream(S)]);
    handle
        .append(S, recs("acked", 2), None, None)
        .await
        .unwrap();
    disk.faults.fail_sync.store(true, Ordering::SeqCst);
    let r = handle.append(S, recs("doubt", 2), None, None).await;
    assert!(
        matches!(r, Err(AppendError::Store(StoreError::Io(_)))),
        "{r:?}"
    );
    assert_eq!(handle.stats().failed_commits.load(Ordering::Relaxed), 1);
    disk.faults.fail_sync.store(false, Ordering::SeqCst);
    // The writer reopens with backoff; poll with a deadline.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match handle.append(S, recs("after", 1), None, None).await {
            Ok(_) => break,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("the writer did not recover: {e}"),
        }
    }
    let jobs = handle.take(S, 100).await.unwrap();
    let records: Vec<Vec<Vec<u8>>> = jobs.iter().map(owned).collect();
    assert_eq!(records.first(), Some(&recs("acked", 2)));
    assert_eq!(records.last(), Some(&recs("after", 1)));
    assert!(
        records.len() == 2 || records[1] == recs("doubt", 2),
        "{records:?}"
    );
    let snap = handle.snapshot().await.unwrap();
    assert!(snap.streams[0].1.balanced());
    handle.shutdown().await;
}

// -------------------------------------------------------------------------------------------------
// Regressions from review.

/// A value that goes bad while its job is in flight is quarantined when the attempt fails, not
/// silently dropped.
#[test]
fn a_job_that_rots_in_flight_is_quarantined_on_fail() {
    let d = Dir::new(vec![stream(S)]);
    let mut store = d.open();
    append(&mut store, S, &recs("a", 3), T0).unwrap();
    let jobs = take(&mut store, S, 1, T0);
    overwrite_ready(&mut store, S, jobs[0].lease.id, |v| {
        let last = v.len() - 1;
        v[last] ^= 0x40;
    });
    let mut tx = store.transaction().unwrap();
    let r = tx.fail(&jobs[0].lease, &transient(T0 + 1000, 5), T0);
    assert!(matches!(r, Err(StoreError::Corrupted(_))), "{r:?}");
    tx.commit().unwrap();
    let c = counters(&store, S);
    assert_eq!((c.ready_records, c.quarantined_records), (0, 3), "{c:?}");
    assert!(c.balanced(), "{c:?}");
    assert_eq!(store.quarantined().unwrap(), 1);
    assert_eq!(store.in_flight(S), 0);
}

/// Deleting old jobs frees no filesystem space, so below `min_free` drop_oldest deletes nothing.
#[test]
fn drop_oldest_never_deletes_for_an_append_refused_by_min_free() {
    let mut cfg = stream(S);
    cfg.when_full = WhenFull::DropOldest;
    cfg.max_jobs = 2;
    let d = Dir::new(vec![cfg]);
    let mut store = d.open();
    append(&mut store, S, &recs("a", 1), T0).unwrap();
    append(&mut store, S, &recs("b", 1), T0).unwrap();
    store.storage.min_free = u64::MAX / 2;
    let mut tx = store.transaction().unwrap();
    let r = tx.append(S, &recs("c", 1), None, T0);
    assert!(matches!(r, Err(AppendError::Full { .. })), "{r:?}");
    tx.commit().unwrap();
    let c = counters(&store, S);
    assert_eq!((c.ready_jobs, c.dropped_oldest_records), (2, 0), "{c:?}");
}

/// An append parked behind another gets its answer at its own deadline, not at the other's.
#[tokio::test]
async fn a_parked_append_is_answered_at_its_own_deadline() {
    let mut cfg = stream(S);
    cfg.max_jobs = 1;
    let disk = MemDisk::default();
    let handle = spawn_on(&disk, vec![cfg]);
    handle.append(S, recs("a", 1), None, None).await.unwrap();
    let long = {
        let h = handle.clone();
        tokio::spawn(async move {
            h.append(S, recs("b", 1), None, Some(Duration::from_secs(3)))
                .await
        })
    };
    // Let the long one park first.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let t = Instant::now();
    let r = handle
        .append(S, recs("c", 1), None, Some(Duration::from_millis(200)))
        .await;
    let waited = t.elapsed();
    assert!(matches!(r, Err(AppendError::Full { .. })), "{r:?}");
    assert!(
        waited < Duration::from_millis(1500),
        "answered after {waited:?}, behind the 3 s one"
    );
    let r = long.await.unwrap();
    assert!(matches!(r, Err(AppendError::Full { .. })), "{r:?}");
}

// -------------------------------------------------------------------------------------------------
// 7. Settling part of a job (a sink that splits a job on HTTP 413), offsets, the store id

/// A dead letter as the tests compare it: (id, offset, attempts, reason, records).
type Letter = (u64, u32, u32, Option<String>, Vec<String>);

/// A stream's dead letters, oldest first.
fn dead_letters(store: &Store, stream: &str) -> Vec<Letter> {
    store
        .peek(stream, true, usize::MAX)
        .unwrap()
        .into_iter()
        .map(|p| {
            let records = p.records.expect("dead letters decode");
            (p.id, p.offset, p.attempts, p.last_error, records)
        })
        .collect()
}

fn strings(records: &[Vec<u8>]) -> Vec<String> {
    records
        .iter()
        .map(|r| String::from_utf8(r.clone()).unwrap())
        .collect()
}

#[test]
fn settle_delivered_cuts_the_prefix_and_the_rest_is_acked_later() {
    let d = Dir::new(vec![stream(S)]);
    let mut store = d.open();
    let all = recs("a", 5);
    append(&mut store, S, &all, T0).unwrap();
    append(&mut store, S, &recs("b", 1), T0).unwrap();
    let jobs = take(&mut store, S, 1, T0);
    let lease = jobs[0].lease.clone();
    assert_eq!(jobs[0].offset, 0);

    let rest = settle(&mut store, &lease, 2, &Settle::Delivered, T0 + 1);
    assert_eq!(rest.lease, lease, "same job, same lease");
    assert_eq!((rest.offset, rest.attempts, rest.created_ms), (2, 0, T0));
    assert_eq!(owned(&rest), all[2..]);
    let c = counters(&store, S);
    assert_eq!((c.delivered_jobs, c.delivered_records), (0, 2));
    assert_eq!((c.ready_jobs, c.ready_records), (2, 3 + 1));
    assert_eq!(
        c.ready_bytes,
        rest_bytes(&all[2..], 2) + job_bytes(&recs("b", 1))
    );
    assert_eq!(c.next_id, 3, "no new job");
    // Still in flight: not handed out again.
    assert_eq!(ids(&take(&mut store, S, 10, T0)), [2]);
    let rest = settle(&mut store, &lease, 1, &Settle::Delivered, T0 + 2);
    assert_eq!((rest.offset, rest.record_count()), (3, 2));

    // After a restart the job is ready again with what is left, and its offset.
    let mut store = d.reopen(store);
    let again = take(&mut store, S, 1, T0);
    assert_eq!(ids(&again), [1]);
    assert_eq!(again[0].offset, 3);
    assert_eq!(owned(&again[0]), all[3..]);
    ack(&mut store, &[&again[0].lease]);
    let c = counters(&store, S);
    assert_eq!((c.delivered_jobs, c.delivered_records), (1, 5));
    // The parts add up to the job's size, as one ack of the whole job would have counted.
    assert_eq!(c.delivered_bytes, job_bytes(&all));
    assert_eq!((c.ready_jobs, c.ready_records), (1, 1));
    d.reopen(store);
}

#[test]
fn settle_dead_makes_a_dead_letter_of_the_prefix_and_trims_dead_letters() {
    let mut cfg = stream(S);
    cfg.dead_max_jobs = 2;
    let d = Dir::new(vec![cfg]);
    let mut store = d.open();
    let all = recs("a", 6);
    append(&mut store, S, &all, T0).unwrap();
    let jobs = take(&mut store, S, 1, T0);
    let lease = jobs[0].lease.clone();

    let rest = settle(
        &mut store,
        &lease,
        2,
        &dead("400: record 0 rejected"),
        T0 + 5,
    );
    assert_eq!((rest.offset, rest.record_count()), (2, 4));
    assert_eq!(owned(&rest), all[2..]);
    let c = counters(&store, S);
    assert_eq!(
        (c.dead_jobs, c.dead_records, c.dead_lettered_records),
        (1, 2, 2)
    );
    assert_eq!((c.ready_jobs, c.ready_records), (1, 4));
    assert_eq!((c.next_id, c.delivered_records), (3, 0));
    assert_eq!(
        dead_letters(&store, S),
        [(
            2,
            0,
            0,
            Some("400: record 0 rejected".into()),
            strings(&all[..2])
        )]
    );
    let peeked = store.peek(S, true, 1).unwrap();
    assert_eq!(
        (peeked[0].created_ms, peeked[0].last_failed_ms),
        (T0, T0 + 5)
    );

    // Two more dead parts: the table holds 2, the oldest goes (counted as dropped).
    settle(&mut store, &lease, 1, &dead("bad 2"), T0 + 6);
    let rest = settle(&mut store, &lease, 1, &dead("bad 3"), T0 + 7);
    assert_eq!((rest.offset, rest.record_count()), (4, 2));
    let c = counters(&store, S);
    assert_eq!((c.dead_jobs, c.dead_records), (2, 2));
    assert_eq!(
        (c.dead_lettered_records, c.dropped_dead_full_records),
        (4, 2)
    );
    let letters = dead_letters(&store, S);
    assert_eq!(
        letters
            .iter()
            .map(|l| (l.0, l.1, l.4.clone()))
            .collect::<Vec<_>>(),
        [(3, 2, strings(&all[2..3])), (4, 3, strings(&all[3..4]))]
    );
    // The rest is delivered: every record is accounted for exactly once.
    ack(&mut store, &[&lease]);
    let c = counters(&store, S);
    assert_eq!((c.delivered_records, c.ready_records), (2, 0));
    assert_eq!(c.appended_records, 6);
    d.reopen(store);
}

#[test]
fn settle_a_job_taken_from_the_retry_table() {
    let d = Dir::new(vec![stream(S)]);
    let mut store = d.open();
    let all = recs("a", 4);
    append(&mut store, S, &all, T0).unwrap();
    let jobs = take(&mut store, S, 1, T0);
    fail(&mut store, &jobs[0].lease, &transient(T0 + 100, 5), T0);
    let jobs = take(&mut store, S, 1, T0 + 100);
    let lease = jobs[0].lease.clone();
    assert_eq!(lease.retry_due, Some(T0 + 100));

    let rest = settle(&mut store, &lease, 1, &Settle::Delivered, T0 + 101);
    assert_eq!(rest.lease, lease, "same key in the retry table");
    assert_eq!((rest.offset, rest.attempts), (1, 1));
    assert_eq!(rest.last_error.as_deref(), Some("503"));
    let c = counters(&store, S);
    assert_eq!((c.retry_jobs, c.retry_records, c.ready_jobs), (1, 3, 0));
    assert_eq!(c.delivered_records, 1);
    assert!(
        take(&mut store, S, 10, T0 + 100).is_empty(),
        "still in flight"
    );

    // A dead part keeps the attempts of the job it came from.
    let rest = settle(&mut store, &lease, 1, &dead("422"), T0 + 102);
    assert_eq!((rest.offset, rest.record_count()), (2, 2));
    assert_eq!(
        dead_letters(&store, S),
        [(2, 1, 1, Some("422".into()), strings(&all[1..2]))]
    );
    let c = counters(&store, S);
    assert_eq!((c.retry_records, c.dead_records), (2, 1));

    let mut store = d.reopen(store);
    let again = take(&mut store, S, 10, T0 + 100);
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].lease, lease);
    assert_eq!((again[0].offset, again[0].attempts), (2, 1));
    assert_eq!(owned(&again[0]), all[2..]);
    ack(&mut store, &[&again[0].lease]);
    let c = counters(&store, S);
    assert_eq!((c.delivered_jobs, c.delivered_records), (1, 3));
    assert_eq!((c.retry_jobs, c.dead_records), (0, 1));
}

#[test]
fn settle_of_no_records_or_all_of_them_is_refused_and_changes_nothing() {
    let d = Dir::new(vec![stream(S)]);
    let mut store = d.open();
    append(&mut store, S, &recs("a", 3), T0).unwrap();
    append(&mut store, S, &recs("b", 1), T0).unwrap();
    let jobs = take(&mut store, S, 2, T0);
    let before = counters(&store, S);
    let cases = [
        (&jobs[0], 0, 3),
        (&jobs[0], 3, 3),
        (&jobs[0], 4, 3),
        (&jobs[0], u32::MAX, 3),
        // A one-record job has no part to settle.
        (&jobs[1], 1, 1),
    ];
    for (job, n, records) in cases {
        for outcome in [Settle::Delivered, dead("x")] {
            let mut tx = store.transaction().unwrap();
            let r = tx.settle_prefix(&job.lease, n, &outcome, T0);
            match r {
                Err(StoreError::InvalidSettle {
                    n: got_n,
                    records: got_records,
                    id,
                    ..
                }) => assert_eq!((got_n, got_records, id), (n, records, job.lease.id)),
                other => panic!("n = {n}: {other:?}"),
            }
            assert!(!tx.is_dirty(), "n = {n}: a refused settle changes nothing");
            tx.commit().unwrap();
            check(&store);
            assert_eq!(counters(&store, S), before, "n = {n}");
        }
    }
    let missing = Lease {
        stream: S.into(),
        id: 99,
        retry_due: None,
        store: store.id(),
    };
    let mut tx = store.transaction().unwrap();
    assert!(matches!(
        tx.settle_prefix(&missing, 1, &Settle::Delivered, T0),
        Err(StoreError::NoSuchJob { id: 99, .. })
    ));
    // A lease handed out by another (since replaced) store file names no job here, even with the
    // same id; releasing it does not touch the real lease either.
    let mut foreign = jobs[0].lease.clone();
    foreign.store ^= 1;
    assert!(matches!(
        tx.ack(&foreign),
        Err(StoreError::NoSuchJob { .. })
    ));
    tx.abort().unwrap();
    store.release(&foreign);
    // The jobs are untouched and still in flight.
    assert_eq!(store.in_flight(S), 2);
    ack(&mut store, &[&jobs[0].lease, &jobs[1].lease]);
    let c = counters(&store, S);
    assert_eq!((c.delivered_jobs, c.delivered_records), (2, 4));
}

#[test]
fn offset_survives_fail_retry_dead_and_replay() {
    let d = Dir::new(vec![stream(S)]);
    let mut store = d.open();
    let all = recs("a", 5);
    append(&mut store, S, &all, T0).unwrap();
    let jobs = take(&mut store, S, 1, T0);
    settle(&mut store, &jobs[0].lease, 2, &Settle::Delivered, T0);
    fail(&mut store, &jobs[0].lease, &transient(T0 + 100, 2), T0);

    let mut store = d.reopen(store);
    let jobs = take(&mut store, S, 1, T0 + 100);
    assert_eq!((jobs[0].offset, jobs[0].attempts), (2, 1));
    assert_eq!(owned(&jobs[0]), all[2..]);
    let rest = settle(&mut store, &jobs[0].lease, 1, &Settle::Delivered, T0 + 100);
    assert_eq!((rest.offset, rest.attempts), (3, 1));
    assert_eq!(
        fail(
            &mut store,
            &jobs[0].lease,
            &transient(T0 + 200, 2),
            T0 + 100
        ),
        Failed::Dead { attempts: 2 }
    );
    assert_eq!(
        dead_letters(&store, S),
        [(1, 3, 2, Some("503".into()), strings(&all[3..]))]
    );

    let mut tx = store.transaction().unwrap();
    assert_eq!(tx.replay_dead(S, None, usize::MAX).unwrap(), (1, 2));
    tx.commit().unwrap();
    check(&store);
    let back = take(&mut store, S, 10, T0 + 200);
    assert_eq!(ids(&back), [1]);
    assert_eq!(
        (back[0].offset, back[0].attempts),
        (3, 0),
        "offset kept, attempts reset"
    );
    assert_eq!(back[0].last_error, None);
    assert_eq!(owned(&back[0]), all[3..]);
    ack(&mut store, &[&back[0].lease]);
    let c = counters(&store, S);
    assert_eq!(
        (c.delivered_records, c.replayed_records, c.dead_records),
        (5, 2, 0)
    );
    d.reopen(store);
}

#[test]
fn store_id_is_stable_across_reopen_and_differs_between_stores() {
    let a = Dir::new(vec![stream(S)]);
    let b = Dir::new(vec![stream(S)]);
    let store_a = a.open();
    let id = store_a.id();
    assert_ne!(id, 0);
    let store_a = a.reopen(store_a);
    assert_eq!(store_a.id(), id, "the same file keeps its id");
    let store_b = b.open();
    assert_ne!(store_b.id(), 0);
    assert_ne!(store_b.id(), id, "two fresh files differ");
    drop(store_a);
    let ro = OpenOptions {
        read_only: true,
        ..OpenOptions::default()
    };
    let read_only = Store::open(a.dir.path(), a.storage, &a.streams, ro).unwrap();
    assert_eq!(read_only.id(), id);
    drop(read_only);

    // A file written before ids: read-only it has none (0); the next writable open gives it one
    // and it sticks.
    let mut store_a = a.open();
    let txn = store_a.db.rw().unwrap().begin_write().unwrap();
    txn.open_table(META).unwrap().remove(STORE_ID).unwrap();
    txn.commit().unwrap();
    drop(store_a);
    let read_only = Store::open(a.dir.path(), a.storage, &a.streams, ro).unwrap();
    assert_eq!(read_only.id(), 0);
    drop(read_only);
    let store_a = a.open();
    let new_id = store_a.id();
    assert_ne!(new_id, 0);
    assert_eq!(a.reopen(store_a).id(), new_id);
}

fn assert_send_static<T: Send + 'static>(t: T) -> T {
    t
}

/// A delivery worker queues its ack and then its next take without waiting for the ack's fsync.
#[tokio::test]
async fn writer_ack_later_is_queued_before_a_take_behind_it() {
    let disk = MemDisk::default();
    let handle = spawn_on(&disk, vec![stream(S)]);
    for tag in ["a", "b"] {
        handle.append(S, recs(tag, 1), None, None).await.unwrap();
    }
    let jobs = handle.take(S, 1).await.unwrap();
    assert_eq!(ids(&jobs), [1]);
    // Released, job 1 would be handed out again by a take that ran before the ack.
    handle.release(jobs[0].lease.clone());
    let acked = assert_send_static(handle.ack_later(jobs[0].lease.clone()));
    let next = handle.take(S, 10).await.unwrap();
    assert_eq!(
        ids(&next),
        [2],
        "the ack was applied before the take queued behind it"
    );
    // Queued at the call, not when first polled: its commit came before the take's reply.
    let snap = handle.snapshot().await.unwrap();
    assert_eq!(snap.streams[0].1.delivered_jobs, 1);
    acked.await.expect("acknowledged");
    // A second ack of the same job fails, through the same path.
    let again = handle.ack_later(jobs[0].lease.clone()).await;
    assert!(
        matches!(again, Err(StoreError::NoSuchJob { id: 1, .. })),
        "{again:?}"
    );
    handle.shutdown().await;
    // Once the writer is gone the future fails instead of hanging.
    let gone = handle.ack_later(next[0].lease.clone()).await;
    assert!(matches!(gone, Err(StoreError::WriterStopped)), "{gone:?}");
    let store = open_mem(&disk, unbounded(), &[stream(S)]);
    let c = counters(&store, S);
    assert_eq!((c.delivered_jobs, c.ready_jobs), (1, 1));
}

#[tokio::test]
async fn writer_settles_a_prefix_durably_and_knows_the_store_id() {
    let disk = MemDisk::default();
    let handle = spawn_on(&disk, vec![stream(S)]);
    let all = recs("a", 4);
    handle.append(S, all.clone(), None, None).await.unwrap();
    let jobs = handle.take(S, 1).await.unwrap();
    let lease = jobs[0].lease.clone();
    let rest = handle
        .settle_prefix(lease.clone(), 1, Settle::Delivered)
        .await
        .unwrap();
    assert_eq!((rest.offset, owned(&rest)), (1, all[1..].to_vec()));
    let rest = handle
        .settle_prefix(lease.clone(), 2, dead("400"))
        .await
        .unwrap();
    assert_eq!((rest.offset, owned(&rest)), (3, all[3..].to_vec()));
    let r = handle
        .settle_prefix(lease.clone(), 1, Settle::Delivered)
        .await;
    assert!(matches!(r, Err(StoreError::InvalidSettle { .. })), "{r:?}");
    let id = handle.store_id();
    handle.shutdown().await;
    // Durable on return: the file says what the replies said.
    let store = open_mem(&disk, unbounded(), &[stream(S)]);
    assert_eq!(store.id(), id);
    let c = counters(&store, S);
    assert_eq!(
        (c.delivered_records, c.dead_records, c.ready_records),
        (1, 2, 1)
    );
    assert_eq!(dead_letters(&store, S)[0].4, strings(&all[1..3]));
}

/// A store replaced by a fresh file (after corruption) has a new id, and the handle says so.
#[tokio::test]
async fn writer_store_id_follows_a_replaced_store() {
    let first = MemDisk::default();
    let second = MemDisk::default();
    let streams = vec![stream(S)];
    let store = open_mem(&first, unbounded(), &streams);
    let old_id = store.id();
    let replacement = second.clone();
    let reopen_streams = streams.clone();
    let reopen = Box::new(move || {
        Store::open_backend(
            replacement.clone(),
            unbounded(),
            &reopen_streams,
            OpenOptions::default(),
        )
    });
    let handle = writer::spawn(store, reopen, writer::WriterOptions::default()).unwrap();
    assert_eq!(handle.store_id(), old_id);
    first.faults.fail_sync.store(true, Ordering::SeqCst);
    assert!(handle.append(S, recs("lost", 1), None, None).await.is_err());
    let deadline = Instant::now() + Duration::from_secs(10);
    while handle.append(S, recs("new", 1), None, None).await.is_err() {
        assert!(Instant::now() < deadline, "the writer did not reopen");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let new_id = handle.store_id();
    assert_ne!(new_id, old_id);
    handle.shutdown().await;
    assert_eq!(open_mem(&second, unbounded(), &streams).id(), new_id);
}

/// A batch that could not fit even in an empty stream and an empty store is `TooLarge`, not `Full`
/// (whose sender would wait and retry the same batch forever), under every `when_full`, and
/// changes nothing: no job, no drop counted, no old job deleted.
#[test]
fn a_batch_that_can_never_fit_is_too_large_and_changes_nothing() {
    for when_full in [WhenFull::Block, WhenFull::DropNewest, WhenFull::DropOldest] {
        // More bytes than the stream's max_bytes: 3 jobs of one 900-byte record, 2 KiB bound.
        let mut cfg = stream(S);
        cfg.when_full = when_full;
        cfg.max_bytes = 2048;
        cfg.batch.max_bytes = 1024;
        let d = Dir::new(vec![cfg]);
        let mut store = d.open();
        let r = append(&mut store, S, &sized(b'a', &[900, 900, 900]), T0);
        match &r {
            Err(e @ AppendError::TooLarge { max: 2048, .. }) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("can never fit") && msg.contains("smaller batches"),
                    "{msg}"
                );
            }
            _ => panic!("{when_full:?}: {r:?}"),
        }
        let c = counters(&store, S);
        assert_eq!(
            (c.appended_records, c.dropped_newest_records, c.ready_jobs),
            (0, 0, 0),
            "{when_full:?}"
        );
        // Each job alone fits.
        append(&mut store, S, &sized(b'b', &[900]), T0).unwrap();

        // More jobs than the stream's max_jobs; an old job is not deleted for it.
        let mut cfg = stream(S);
        cfg.when_full = when_full;
        cfg.max_jobs = 2;
        cfg.batch.max_records = 1;
        let d = Dir::new(vec![cfg]);
        let mut store = d.open();
        append(&mut store, S, &recs("old", 1), T0).unwrap();
        let r = append(&mut store, S, &recs("x", 3), T0);
        assert!(
            matches!(
                r,
                Err(AppendError::TooLarge {
                    size: 3,
                    max: 2,
                    ..
                })
            ),
            "{when_full:?}: {r:?}"
        );
        let c = counters(&store, S);
        assert_eq!(
            (c.appended_records, c.dropped_newest_records, c.ready_jobs),
            (1, 0, 1),
            "{when_full:?}"
        );
        append(&mut store, S, &recs("y", 1), T0).unwrap();

        // More bytes than storage.max_bytes.
        let one = sized(b'c', &[500]);
        let size = job_bytes(&one);
        let mut cfg = stream(S);
        cfg.when_full = when_full;
        cfg.batch.max_records = 1;
        let d = Dir::new(vec![cfg]).with_storage(StorageConfig {
            max_bytes: size * 2,
            min_free: 0,
        });
        let mut store = d.open();
        let r = append(&mut store, S, &sized(b'c', &[500, 500, 500]), T0);
        assert!(
            matches!(r, Err(AppendError::TooLarge { max, .. }) if max == size * 2),
            "{when_full:?}: {r:?}"
        );
        assert_eq!(counters(&store, S).appended_records, 0);
        append(&mut store, S, &sized(b'c', &[500, 500]), T0).unwrap();
    }
}

// -------------------------------------------------------------------------------------------------
// File jobs: spooled files, their bytes in the bounds, their disposal.

/// Puts a file of `len` bytes in the spool of task `t` and returns its key.
fn spool_file(dir: &Dir, name: &str, len: usize) -> Vec<u8> {
    let rel = spool::task_dir("t").join(spool::new_name(std::ffi::OsStr::new(name), T0));
    let path = dir.dir.path().join(&rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, vec![b'f'; len]).unwrap();
    rel.into_os_string().into_encoded_bytes()
}

#[track_caller]
fn append_file(
    store: &mut Store,
    stream: &str,
    spool: &[u8],
    len: u64,
    archive: Option<&[u8]>,
) -> Result<FileAppend, AppendError> {
    let mut tx = store.transaction().expect("begin");
    let r = tx.append_file(stream, spool, b"orig.csv", len, T0, archive, T0);
    tx.commit().expect("commit");
    check(store);
    r
}

/// Both spool tables: the files jobs ship, then those to dispose of.
fn spool_entries(store: &Store) -> Vec<(Vec<u8>, SpoolEntry)> {
    let rtx = store.db.begin_read().unwrap();
    let mut out = Vec::new();
    for table in [SPOOL, DISPOSE] {
        let t = rtx.open_table(table).unwrap();
        out.extend(t.iter().unwrap().map(|e| {
            let (k, v) = e.unwrap();
            (k.value().to_vec(), spool_entry(v.value()).unwrap())
        }));
    }
    out
}

#[test]
fn a_file_job_counts_its_file_ships_it_and_archives_it_after_delivery() {
    let d = Dir::new(vec![stream(S)]);
    let mut s = d.open();
    let key = spool_file(&d, "orig.csv", 5000);
    let archive = d.dir.path().join("archive");
    std::fs::create_dir(&archive).unwrap();
    let arc = archive.as_os_str().as_encoded_bytes().to_vec();
    assert_eq!(
        append_file(&mut s, S, &key, 5000, Some(&arc)).unwrap(),
        FileAppend::Queued { id: 1 }
    );
    // The same file again (a lost reply, a recovery): nothing new.
    assert_eq!(
        append_file(&mut s, S, &key, 5000, Some(&arc)).unwrap(),
        FileAppend::Known
    );
    let c = counters(&s, S);
    assert_eq!(
        (c.ready_jobs, c.ready_records, c.appended_records),
        (1, 1, 1)
    );
    assert!(
        c.ready_bytes > 5000,
        "the file's bytes count: {}",
        c.ready_bytes
    );
    let mut s = d.reopen(s);
    let jobs = take(&mut s, S, 10, T0);
    let f = jobs[0].file().expect("a file job");
    assert_eq!((f.len, f.name.to_str()), (5000, Some("orig.csv")));
    assert_eq!(std::fs::read(&f.path).unwrap().len(), 5000);
    assert_eq!(jobs[0].bytes(), c.ready_bytes);
    ack(&mut s, &[&jobs[0].lease]);
    let c = counters(&s, S);
    assert_eq!((c.delivered_records, c.ready_bytes), (1, 0));
    // Marked for disposal in the ack's transaction, and handed out after it committed.
    assert!(matches!(
        &spool_entries(&s)[..],
        [(k, SpoolEntry::Dispose { archive: Some(_), .. })] if *k == key
    ));
    let disposals = s.take_disposals();
    assert_eq!(disposals.len(), 1);
    // A crash now: the reopened store still knows it must be archived.
    let mut s = d.reopen(s);
    assert_eq!(s.take_disposals(), disposals);
    spool::dispose(s.data_dir(), &disposals[0]).unwrap();
    let mut tx = s.transaction().unwrap();
    tx.forget_spool(std::slice::from_ref(&key)).unwrap();
    tx.commit().unwrap();
    assert!(spool_entries(&s).is_empty());
    assert_eq!(std::fs::read(archive.join("orig.csv")).unwrap().len(), 5000);
    let s = d.reopen(s);
    assert!(s.disposals.is_empty());
}

#[test]
fn a_full_stream_refuses_a_file_without_counting_it_unless_it_may_drop_the_oldest() {
    let mut st = stream(S);
    st.max_bytes = 12_000;
    st.when_full = WhenFull::DropNewest;
    let d = Dir::new(vec![st]);
    let mut s = d.open();
    let a = spool_file(&d, "a", 5000);
    let b = spool_file(&d, "b", 5000);
    let c = spool_file(&d, "c", 5000);
    append_file(&mut s, S, &a, 5000, None).unwrap();
    append_file(&mut s, S, &b, 5000, None).unwrap();
    let before = counters(&s, S);
    assert!(matches!(
        append_file(&mut s, S, &c, 5000, None),
        Err(AppendError::Full { .. })
    ));
    assert_eq!(counters(&s, S), before, "a refused file is not counted");
    assert!(matches!(
        append_file(&mut s, S, &c, 50_000, None),
        Err(AppendError::TooLarge { .. })
    ));
    drop(s);

    // drop_oldest: the oldest file job goes (counted, its file deleted) to make room.
    let mut st = stream(S);
    st.max_bytes = 12_000;
    st.when_full = WhenFull::DropOldest;
    let d2 = Dir {
        dir: d.dir,
        storage: unbounded(),
        streams: vec![st],
    };
    let mut s = d2.open();
    assert!(matches!(
        append_file(&mut s, S, &c, 5000, None).unwrap(),
        FileAppend::Queued { .. }
    ));
    let n = counters(&s, S);
    assert_eq!((n.dropped_oldest_records, n.ready_jobs), (1, 2));
    let disposals = s.take_disposals();
    assert_eq!(disposals.len(), 1);
    assert_eq!(
        (disposals[0].spool.clone(), disposals[0].archive.clone()),
        (a, None)
    );
}

#[test]
fn dead_file_jobs_are_replayed_with_their_file_and_purged_with_it() {
    let d = Dir::new(vec![stream(S)]);
    let mut s = d.open();
    let key = spool_file(&d, "x", 100);
    append_file(&mut s, S, &key, 100, None).unwrap();
    let jobs = take(&mut s, S, 1, T0);
    fail(&mut s, &jobs[0].lease, &permanent(), T0);
    assert_eq!(counters(&s, S).dead_records, 1);
    let mut tx = s.transaction().unwrap();
    assert_eq!(tx.replay_dead(S, None, 10).unwrap(), (1, 1));
    tx.commit().unwrap();
    let jobs = take(&mut s, S, 1, T0);
    assert!(jobs[0].file().is_some(), "still a file job after replay");
    // A split is refused: a file is one record.
    let mut tx = s.transaction().unwrap();
    assert!(matches!(
        tx.settle_prefix(&jobs[0].lease, 1, &Settle::Delivered, T0),
        Err(StoreError::InvalidSettle { .. })
    ));
    drop(tx);
    s.load_counters().unwrap();
    // Still in flight: fail it for good.
    fail(&mut s, &jobs[0].lease, &permanent(), T0);
    let mut tx = s.transaction().unwrap();
    assert_eq!(tx.purge_dead(S, None, 10).unwrap(), (1, 1));
    tx.commit().unwrap();
    check(&s);
    let path = d.dir.path().join(std::str::from_utf8(&key).unwrap());
    assert!(path.exists());
    assert_eq!(s.dispose_now().unwrap(), 1);
    assert!(!path.exists(), "a purged file job takes its file along");
    assert!(spool_entries(&s).is_empty());
}

#[test]
fn a_damaged_file_job_is_quarantined_and_its_intact_file_can_be_queued_again() {
    let d = Dir::new(vec![stream(S)]);
    let mut s = d.open();
    let key = spool_file(&d, "x", 100);
    append_file(&mut s, S, &key, 100, None).unwrap();
    // Flip a byte of the stored value (bit rot on the card).
    {
        let Db::Rw(db) = &s.db else {
            panic!("writable")
        };
        let txn = db.begin_write().unwrap();
        {
            let st = &s.streams[S];
            let mut t = txn.open_table(st.ready_def()).unwrap();
            let mut v = t.get(1).unwrap().unwrap().value().to_vec();
            let last = v.len() - 1;
            v[last] ^= 0xff;
            t.insert(1, v.as_slice()).unwrap();
        }
        txn.commit().unwrap();
    }
    let jobs = take(&mut s, S, 10, T0);
    assert!(jobs.is_empty());
    let c = counters(&s, S);
    assert_eq!((c.quarantined_records, c.ready_jobs), (1, 0));
    assert!(!s.spool_known(&key).unwrap(), "the spool entry is released");
    // The task's recovery queues the same file again, as a new job.
    assert_eq!(
        append_file(&mut s, S, &key, 100, None).unwrap(),
        FileAppend::Queued { id: 2 }
    );
    assert!(counters(&s, S).balanced());
}

// -------------------------------------------------------------------------------------------------
// Compaction

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
