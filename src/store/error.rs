//! The store's errors: [`StoreError`] (anything that went wrong in the database), [`AppendError`]
//! (an append refused, or failed) and [`FullReason`] (which bound a full stream hit). Callers match
//! on the variants; the messages are what an operator reads. Used by every part of the store and by
//! its callers (ingest, sources, delivery, `colibri queue`).

use std::path::{Path, PathBuf};

use redb::DatabaseError;
use serde::Serialize;

use super::layout::LAYOUT_VERSION;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A read, write or commit failed. A failed commit may still have been durable: the outcome is
    /// unknown, so nothing is acknowledged and the job may be delivered again (at-least-once).
    ///
    /// The cause is kept as it was (a caller may downcast it, e.g. to a `redb::StorageError` or a
    /// `std::io::Error`), but it is not a `source`: the message shows it already, and a caller
    /// printing the chain (`{:#}`) would show it twice.
    #[error("storage i/o error: {0}")]
    Io(Box<dyn std::error::Error + Send + Sync + 'static>),
    /// The disk is full: a write or commit failed with ENOSPC ([`StoreError::is_no_space`] finds
    /// one in an `Io`). Nothing in that transaction was acknowledged; redb writes its header last,
    /// so a commit that ran out of space did not take effect, and the store is reopened to go on
    /// once there is room. A producer is told to send again later (ingest: 507, `Retry-After`).
    #[error("no space left on the disk: {0}")]
    NoSpace(String),
    /// A read-only open (`colibri queue ...` beside a running agent) found no database file.
    #[error("storage i/o error: {} does not exist", path.display())]
    Missing { path: PathBuf },
    /// The store writer's thread has ended (shutdown, or it panicked): nothing can reach the store.
    #[error("storage i/o error: the store writer has stopped")]
    WriterStopped,
    /// The writer holds no open store (a failed commit closed it; it reopens with backoff): nothing
    /// was done. `detail` says what is known of why, as part of the message.
    #[error("storage i/o error: the store is unavailable{detail}")]
    Unavailable { detail: &'static str },
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
    /// Whether this error is the disk being full: [`StoreError::NoSpace`], or an `Io` whose cause
    /// (however redb wrapped it) is an I/O error with ENOSPC.
    pub fn is_no_space(&self) -> bool {
        match self {
            StoreError::NoSpace(_) => true,
            StoreError::Io(e) => cause_is_no_space(e.as_ref()),
            _ => false,
        }
    }

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
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
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
    /// Its name in metrics (the setting that is exhausted).
    pub fn label(self) -> &'static str {
        match self {
            FullReason::Jobs => "max_jobs",
            FullReason::Bytes => "max_bytes",
            FullReason::Budget => "storage_max_bytes",
            FullReason::MinFree => "min_free",
        }
    }

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

/// redb's errors (and the file system's) become [`StoreError::Io`], so `?` works on them; in an
/// append they become `AppendError::Store` the same way.
macro_rules! io_errors {
    ($($t:ty),* $(,)?) => {$(
        impl From<$t> for StoreError {
            fn from(e: $t) -> Self {
                StoreError::Io(Box::new(e))
            }
        }

        impl From<$t> for AppendError {
            fn from(e: $t) -> Self {
                AppendError::Store(e.into())
            }
        }
    )*};
}

io_errors!(
    redb::Error,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::CompactionError,
    redb::SetDurabilityError,
    std::io::Error,
);

impl StoreError {
    /// An [`StoreError::Io`] with only a message (the cause is known as text only).
    pub fn io(message: impl Into<String>) -> StoreError {
        StoreError::Io(message.into().into())
    }
}

/// ENOSPC anywhere in `e`: redb's error types each wrap a `StorageError`, whose `Io` variant holds
/// the `std::io::Error`; they are looked through by type, since not all of them give a `source`.
pub(super) fn cause_is_no_space(e: &(dyn std::error::Error + 'static)) -> bool {
    fn storage(e: &redb::StorageError) -> bool {
        matches!(e, redb::StorageError::Io(io) if io.raw_os_error() == Some(libc::ENOSPC))
    }
    let mut next = Some(e);
    while let Some(e) = next {
        let found = if let Some(io) = e.downcast_ref::<std::io::Error>() {
            io.raw_os_error() == Some(libc::ENOSPC)
        } else if let Some(s) = e.downcast_ref::<redb::StorageError>() {
            storage(s)
        } else if let Some(c) = e.downcast_ref::<redb::CommitError>() {
            matches!(c, redb::CommitError::Storage(s) if storage(s))
        } else if let Some(t) = e.downcast_ref::<redb::TransactionError>() {
            matches!(t, redb::TransactionError::Storage(s) if storage(s))
        } else if let Some(t) = e.downcast_ref::<redb::TableError>() {
            matches!(t, redb::TableError::Storage(s) if storage(s))
        } else if let Some(c) = e.downcast_ref::<redb::CompactionError>() {
            matches!(c, redb::CompactionError::Storage(s) if storage(s))
        } else if let Some(d) = e.downcast_ref::<redb::DatabaseError>() {
            matches!(d, redb::DatabaseError::Storage(s) if storage(s))
        } else if let Some(r) = e.downcast_ref::<redb::Error>() {
            matches!(r, redb::Error::Io(io) if io.raw_os_error() == Some(libc::ENOSPC))
        } else if let Some(s) = e.downcast_ref::<StoreError>() {
            s.is_no_space()
        } else {
            false
        };
        if found {
            return true;
        }
        next = e.source();
    }
    false
}

pub(super) fn db_error(path: &Path, e: DatabaseError) -> StoreError {
    match e {
        DatabaseError::DatabaseAlreadyOpen => StoreError::Locked {
            path: path.to_path_buf(),
        },
        DatabaseError::RepairAborted => StoreError::NeedsRepair {
            path: path.to_path_buf(),
        },
        DatabaseError::Storage(redb::StorageError::Corrupted(m)) => StoreError::Corrupted(m),
        // What redb says of a file that is not (or no longer) a database: a damaged magic
        // number or header (`InvalidData`), a file cut shorter than its header (`UnexpectedEof`).
        // Damage, not a failing device: the agent moves such a file aside like any corrupted one.
        DatabaseError::Storage(redb::StorageError::Io(e))
            if matches!(
                e.kind(),
                std::io::ErrorKind::InvalidData | std::io::ErrorKind::UnexpectedEof
            ) =>
        {
            StoreError::Corrupted(e.to_string())
        }
        other => StoreError::Io(Box::new(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enospc() -> std::io::Error {
        std::io::Error::from_raw_os_error(libc::ENOSPC)
    }

    /// ENOSPC is found however redb wrapped it, and nothing else is taken for it.
    #[test]
    fn no_space_is_found_through_redb_s_wrappers() {
        let storage = || redb::StorageError::Io(enospc());
        let full: Vec<StoreError> = vec![
            enospc().into(),
            storage().into(),
            redb::CommitError::Storage(storage()).into(),
            redb::TransactionError::Storage(storage()).into(),
            redb::TableError::Storage(storage()).into(),
            redb::CompactionError::Storage(storage()).into(),
            redb::Error::Io(enospc()).into(),
            StoreError::NoSpace("commit failed".into()),
        ];
        for e in &full {
            assert!(e.is_no_space(), "{e}");
        }
        let other: Vec<StoreError> = vec![
            std::io::Error::from_raw_os_error(libc::EIO).into(),
            redb::CommitError::Storage(redb::StorageError::PreviousIo).into(),
            StoreError::io("No space left on device (as text only)"),
            StoreError::Unavailable { detail: "" },
        ];
        for e in &other {
            assert!(!e.is_no_space(), "{e}");
        }
    }
}
