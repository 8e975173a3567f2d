//! Group commit: one thread owns the [`Store`] and every write transaction. Producers and delivery
//! workers send requests through a [`StoreHandle`]; the thread takes everything that is waiting,
//! applies it in one transaction, commits once (one fsync for many producers), and only then replies.
//! A reply is therefore a durability receipt: an `Ok` from `append` means the records are on disk.
//!
//! Appends to a full `block` stream are parked (in order) until room appears or their deadline
//! passes. A failed commit fails every request in it (nothing is acknowledged) and the store is
//! reopened with backoff, since redb refuses work after an I/O error. When the store has been idle
//! for a while with nothing queued, the file is compacted so a drained backlog gives its disk back.
//! Spooled files whose jobs left the store are deleted or archived by a second thread (a copy to an
//! archive on another filesystem must not hold up commits), which reports back so their SPOOL
//! entries are forgotten in a later transaction.
//! Called by `agent` (and benchmarks); it does not decide what to deliver or when.
//!
//! This file holds the protocol between the two sides ([`Request`], the replies, [`spawn`]); the
//! async API is in `handle.rs`, the thread in `thread.rs`.

mod handle;
mod thread;

pub use handle::{Restoring, StoreHandle};

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tokio::sync::{Notify, oneshot};

pub use super::SpooledFile;
use super::{
    AppendError, Appended, Counters, Failed, Failure, FileAppend, Job, Lease, RecordBuf, Settle,
    Store, StoreError, StreamConfig,
};

/// Requests taken into one transaction at most.
const MAX_BATCH: usize = 4096;
/// How often TTLs are enforced at most: a job past its `ttl` is deleted this long after it at
/// worst. Shorter TTLs are swept every tenth of the shortest one, but not more often than
/// [`EXPIRE_MIN`] (README, `ttl`).
const EXPIRE_EVERY: Duration = Duration::from_secs(30);
const EXPIRE_MIN: Duration = Duration::from_secs(1);

/// The sweep interval for streams with these TTLs.
fn expire_interval(ttls: impl Iterator<Item = Duration>) -> Duration {
    ttls.map(|t| t / 10)
        .min()
        .map_or(EXPIRE_EVERY, |t| t.clamp(EXPIRE_MIN, EXPIRE_EVERY))
}
/// Quiet time before an idle, drained store is compacted.
const COMPACT_AFTER_IDLE: Duration = Duration::from_secs(10);
/// Compaction is worth it when at least this much of the file is free pages, and at least half
/// of it: a drained store holds little, so compacting it moves little (a bounded cost), and a
/// small store (a compressed backlog of a few MB) gives its disk back too.
const COMPACT_SLACK: u64 = 1 << 20;

type Reply<T> = oneshot::Sender<T>;

enum Request {
    Append {
        stream: String,
        records: Arc<RecordBuf>,
        checkpoint: Option<(String, Vec<u8>)>,
        deadline: Option<Instant>,
        reply: Reply<Result<Appended, AppendError>>,
    },
    AppendFile {
        stream: String,
        file: SpooledFile,
        reply: Reply<Result<FileAppend, AppendError>>,
    },
    SpoolKnown {
        spool: Vec<u8>,
        reply: Reply<Result<bool, StoreError>>,
    },
    /// Disposed of on disk by the disposal thread: forget them.
    SpoolForget {
        spools: Vec<Vec<u8>>,
    },
    Take {
        stream: String,
        max_jobs: usize,
        max_bytes: u64,
        reply: Reply<Result<Vec<Job>, StoreError>>,
    },
    /// Delivered jobs, deleted in one transaction.
    Ack {
        leases: Vec<Lease>,
        reply: Reply<Result<(), StoreError>>,
    },
    Fail {
        lease: Lease,
        failure: Failure,
        reply: Reply<Result<Failed, StoreError>>,
    },
    Settle {
        lease: Lease,
        n: u32,
        outcome: Settle,
        reply: Reply<Result<Job, StoreError>>,
    },
    /// A taken job whose records cannot be read (a damaged compressed area).
    Quarantine {
        lease: Lease,
        reason: String,
        reply: Reply<Result<(), StoreError>>,
    },
    Release {
        lease: Lease,
    },
    Snapshot {
        reply: Reply<Snapshot>,
    },
    Checkpoint {
        source: String,
        reply: Reply<Result<Option<Vec<u8>>, StoreError>>,
    },
    NextDue {
        stream: String,
        reply: Reply<Result<Option<u64>, StoreError>>,
    },
    /// A page of a stream's dead letters (`queue dead list` through the agent).
    DeadLetters {
        stream: String,
        after: Option<u64>,
        n: usize,
        max_raw: u64,
        reply: Reply<Result<crate::store::DeadPage, StoreError>>,
    },
    /// How far the salvage of a damaged file kept under `key` went.
    SalvageProgress {
        key: String,
        reply: Reply<Result<Option<crate::store::salvage::Progress>, StoreError>>,
    },
    /// One step of a salvage, with its progress, in one transaction.
    Salvage {
        key: String,
        step: crate::store::salvage::Step,
        reply: Reply<Result<crate::store::salvage::Stepped, StoreError>>,
    },
    /// An operator's replay or purge of dead letters, one chunk in one transaction.
    Dead {
        stream: String,
        op: DeadOp,
        reply: Reply<Result<(u64, u64), StoreError>>,
    },
    /// The clock is synchronised: up to `limit` of a stream's jobs held for it are corrected, one
    /// chunk in one transaction.
    FixClock {
        stream: String,
        anchor: crate::timesync::Anchor,
        fix: crate::store::FixRecord,
        limit: usize,
        reply: Reply<Result<crate::store::ClockFixed, StoreError>>,
    },
    /// The stop has begun: appends waiting for room are answered [`AppendError::Stopping`] now,
    /// and later ones do not wait.
    StopWaiting,
    Shutdown {
        reply: Reply<()>,
    },
}

/// What an operator does to a stream's dead letters (`colibri queue dead replay / purge` while the
/// agent runs): at most `limit` jobs per request, so a long one is many short transactions and
/// can be interrupted and run again to finish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadOp {
    /// Back to the queue, attempts reset: the one with `id`, or those that failed before
    /// `failed_before_ms` (any, when `None`).
    Replay {
        id: Option<u64>,
        failed_before_ms: Option<u64>,
        limit: usize,
    },
    /// Deleted, counted as dropped (`purged`).
    Purge {
        failed_before_ms: Option<u64>,
        limit: usize,
    },
}

/// Counters of every stream and of the writer itself, at one moment.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub streams: Vec<(StreamConfig, Counters)>,
    /// Per stream (same order): creation time of the job at the head of its ready queue (Unix
    /// ms), none when it is empty.
    pub ready_head_ms: Vec<Option<u64>>,
    pub stored_bytes: u64,
    pub file_bytes: u64,
    pub commits: u64,
}

/// Writer statistics, readable without a round trip.
#[derive(Debug)]
pub struct WriterStats {
    /// Commits that reached the disk (each one fsync).
    pub commits: AtomicU64,
    /// Requests applied in those commits.
    pub requests: AtomicU64,
    pub failed_commits: AtomicU64,
    /// Commits that wrote something, from the start of the commit to its return (the fsync).
    pub commit_duration: crate::metrics::Histogram,
    /// The writer holds an open store (false while it reopens one after an I/O error).
    pub store_open: std::sync::atomic::AtomicBool,
    /// Salvages of damaged files in this process: jobs and records put back, jobs lost to damage
    /// (found damaged, of no known stream, or whose stream could not be told).
    pub salvaged_jobs: AtomicU64,
    pub salvaged_records: AtomicU64,
    pub lost_jobs: AtomicU64,
    /// How many times the writer replaced its store file with a new one (a damaged file moved
    /// aside while running), and the signal of each: what the agent's salvage waits on.
    pub(super) replaced: (std::sync::Mutex<u64>, std::sync::Condvar),
    /// Appends answered "full" (nothing stored; under `block` the producer may try again, and
    /// each answer counts) or refused by `drop_newest`, by stream and reason.
    pub refused: crate::metrics::CountsBy<(String, crate::store::FullReason)>,
}

impl Default for WriterStats {
    fn default() -> Self {
        WriterStats {
            commits: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            failed_commits: AtomicU64::new(0),
            commit_duration: crate::metrics::Histogram::new(crate::metrics::COMMIT_BUCKETS),
            store_open: std::sync::atomic::AtomicBool::new(true),
            salvaged_jobs: AtomicU64::new(0),
            salvaged_records: AtomicU64::new(0),
            lost_jobs: AtomicU64::new(0),
            replaced: Default::default(),
            refused: Default::default(),
        }
    }
}
/// Tuning that does not belong in the config file.
#[derive(Debug, Clone, Copy, Default)]
pub struct WriterOptions {
    /// Extra time to wait for more requests before committing. Zero (the default) already batches
    /// whatever arrived during the previous fsync; see BENCHMARKS.md.
    pub window: Duration,
}

/// Starts the writer thread. `reopen` builds a fresh store after an I/O error or a damaged page.
pub fn spawn(
    store: Store,
    reopen: Box<dyn FnMut() -> Result<Store, StoreError> + Send>,
    opts: WriterOptions,
) -> std::io::Result<StoreHandle> {
    let (tx, rx) = mpsc::channel();
    let stats = Arc::new(WriterStats::default());
    let thread_stats = Arc::clone(&stats);
    let notifiers: Arc<HashMap<String, Arc<Notify>>> = Arc::new(
        store
            .streams()
            .map(|(cfg, _)| (cfg.name.clone(), Arc::default()))
            .collect(),
    );
    let thread_notifiers = Arc::clone(&notifiers);
    let store_id = Arc::new(AtomicU64::new(store.id()));
    let data_dir = Arc::new(store.data_dir().to_path_buf());
    let thread_store_id = Arc::clone(&store_id);
    std::thread::Builder::new()
        .name("colibri-store".into())
        .spawn(move || {
            thread::Writer::new(
                store,
                reopen,
                opts,
                thread_stats,
                thread_notifiers,
                thread_store_id,
            )
            .run(rx)
        })?;
    Ok(StoreHandle {
        tx,
        stats,
        notifiers,
        store_id,
        data_dir,
        taps: Arc::default(),
        delivered_taps: Arc::default(),
    })
}
