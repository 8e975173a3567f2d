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

mod append_limits;
pub mod aside;
mod codec;
mod counters;
mod error;
mod files;
pub mod format;
mod job;
mod lanes;
mod layout;
mod open;
mod read;
mod record_buf;
pub mod salvage;
pub mod spool;
mod stream;
pub mod tap;
mod tx;
pub mod writer;

pub use append_limits::AppendLimits;
pub use counters::Counters;
pub use error::{AppendError, FullReason, StoreError};
pub use files::{Disposal, FileAppend, SpooledFile};
pub use job::{Appended, Failed, Failure, FileJob, Job, JobRecords, Lease, Settle};
pub use layout::DB_FILE;
pub use open::{DATA_DIR_MODE, OpenOptions, QUICK_REPAIR_FROM, Store, create_data_dir};
pub use read::{DeadPage, Peeked};
pub use record_buf::{RecordBuf, RecordWriter};
pub use salvage::SalvageReport;
pub use stream::{
    AtRest, BatchConfig, Downsample, MaxAge, OnMaxAge, Replay, StorageConfig, StreamConfig,
    WAITING_JOBS, WhenFull,
};
pub use tx::{ClockFixed, EXPIRE_CHUNK, FixRecord, Tx};

#[cfg(test)]
mod tests;
