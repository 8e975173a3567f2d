//! A job and what is said about it: the [`Job`] handed out for delivery with its [`Lease`], what
//! an append did ([`Appended`]), how an attempt failed ([`Failure`]), what a partial settle does
//! ([`Settle`]) and where a failed job went ([`Failed`]); decoding a stored value into a job. It
//! does not read or write tables (the transaction in [`super::tx`] does). Used by the store, its
//! writer and delivery.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use super::format::{self, Codec, Framing, Meta, Origin};

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
    /// For a salvaged job, the store and id it had before the damage: its idempotency key is
    /// built from them, so a receiver sees the key it saw before.
    pub origin: Option<Origin>,
    /// The stored value (one copy out of the database, verified; a compressed area is checked
    /// when it is decompressed); records are read from it in place.
    pub(super) value: Vec<u8>,
    /// Where its record area starts in `value`, and how it is kept.
    pub(super) area: AreaAt,
    /// For a file job, the spooled file it ships.
    pub(super) file: Option<FileJob>,
}

/// A job's record area within its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct AreaAt {
    pub(super) start: usize,
    pub(super) codec: Codec,
    pub(super) framing: Framing,
    pub(super) plain_len: u64,
    pub(super) records: u32,
}

impl AreaAt {
    fn of(value: &[u8], area: &format::Area<'_>) -> AreaAt {
        AreaAt {
            start: value.len() - area.bytes.len(),
            codec: area.codec,
            framing: area.framing,
            plain_len: area.plain_len,
            records: area.records,
        }
    }
}

/// A job's records, uncompressed: borrowed from the job when it is stored as it is.
#[derive(Debug)]
pub struct JobRecords<'a> {
    plain: Cow<'a, [u8]>,
    framing: Framing,
    records: u32,
}

impl JobRecords<'_> {
    /// The records as lines (each followed by `\n`): an NDJSON or line-protocol body as it is.
    /// `None` when a record holds a `\n` (the job is framed by lengths).
    pub fn lines(&self) -> Option<&[u8]> {
        (self.framing == Framing::Lines).then_some(&self.plain[..])
    }

    /// Each record, as a slice.
    pub fn list(&self) -> Vec<&[u8]> {
        // Checked when the job was taken (or decompressed): cannot fail.
        format::split(&self.plain, self.framing, self.records).unwrap_or_default()
    }
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

    /// The job's records, as they were appended: borrowed when stored as they are, decompressed
    /// (and checked) when stored compressed. An error means the stored frame is damaged: the job
    /// belongs in quarantine ([`crate::store::writer::StoreHandle::quarantine`]).
    pub fn records(&self) -> Result<JobRecords<'_>, format::FormatError> {
        let a = self.area;
        let area = format::Area {
            codec: a.codec,
            framing: a.framing,
            records: a.records,
            plain_len: a.plain_len,
            bytes: &self.value[a.start..],
        };
        Ok(JobRecords {
            plain: area.plain()?,
            framing: a.framing,
            records: a.records,
        })
    }

    /// The job's records as stored when that is a zstd frame of lines: a `Content-Encoding:
    /// zstd` NDJSON or line-protocol body as it is, sent without decompressing.
    pub fn zstd_lines(&self) -> Option<&[u8]> {
        let a = self.area;
        (a.codec == Codec::Zstd && a.framing == Framing::Lines).then(|| &self.value[a.start..])
    }

    pub fn record_count(&self) -> usize {
        self.area.records as usize
    }

    /// Whether its records are lines (each followed by `\n`, none holding one), compressed or
    /// not: what an NDJSON or line-protocol body is, so several such jobs make one by
    /// concatenation.
    pub fn is_lines(&self) -> bool {
        self.file.is_none() && self.area.framing == Framing::Lines
    }

    /// Bytes of its records uncompressed (as lines or framed by lengths).
    pub fn plain_len(&self) -> u64 {
        self.area.plain_len
    }

    /// Bytes the job occupies: its value and, for a file job, the file.
    pub fn bytes(&self) -> u64 {
        format::stored_len(&self.value)
    }

    /// A job as `take` would hand it out (tests of the parts downstream of the store).
    #[cfg(test)]
    pub fn for_test<R: AsRef<[u8]>>(lease: Lease, records: &[R]) -> Job {
        let value = format::encode(0, &fresh_meta(0, None), records);
        job_from_value(lease, value).expect("a fresh job decodes")
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
/// Metadata of a job with no attempts behind it: appended, or replayed (keeping its `offset` and
/// `origin`).
pub(super) fn fresh_meta(offset: u32, origin: Option<Origin>) -> Meta {
    Meta::new(0, None, 0, offset, origin)
}
pub(super) fn job_from(
    store: u64,
    data_dir: &Path,
    stream: &str,
    id: u64,
    due: Option<u64>,
    v: &[u8],
) -> Result<Job, String> {
    let lease = Lease {
        stream: stream.to_string(),
        id,
        retry_due: due,
        store,
    };
    let mut job = job_from_value(lease, v.to_vec()).map_err(|e| e.to_string())?;
    if let Some(len) = format::header(v).ok().and_then(|h| h.file_len) {
        use std::os::unix::ffi::OsStringExt;
        let format::FileRef::V1 { spool, name, .. } =
            format::file_of(v).map_err(|e| e.to_string())?;
        job.file = Some(FileJob {
            path: data_dir.join(std::ffi::OsString::from_vec(spool)),
            name: std::ffi::OsString::from_vec(name),
            len,
        });
    }
    Ok(job)
}

/// A job from its value, verified (no file resolved: see [`job_from`]).
pub(super) fn job_from_value(lease: Lease, value: Vec<u8>) -> Result<Job, format::FormatError> {
    let d = format::decode(&value)?;
    let area = AreaAt::of(&value, &d.area);
    let (created_ms, attempts, offset, origin) =
        (d.header.created_ms, d.attempts, d.offset, d.origin);
    let last_error = d.last_error;
    Ok(Job {
        lease,
        created_ms,
        attempts,
        last_error,
        offset,
        origin,
        area,
        value,
        file: None,
    })
}
