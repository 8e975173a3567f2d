//! The salvager (issue 17, "lose only what is damaged"): reads a damaged store file without
//! trusting its tree and puts every intact job back into the live store under its stream, with its
//! records and metadata (attempts, settled offset) as they were, byte for byte. [`scan`] finds them
//! (`scan.rs`: the live tree, a walk of every page, attribution and the choice of copies, on
//! redb's format as `page.rs` reads it, through the bounded windows of `source.rs`);
//! [`salvage`] hands them on in bounded chunks to a [`Restore`] (the store, or the writer thread)
//! and restores checkpoints.
//!
//! What it restores: record jobs of the target store's streams, to the table they were in
//! (ready, retry with its due time, dead), with new ids in the old ids' order (so new idempotency
//! keys: a receiver may get a job twice, never lose it); source checkpoints, only where the live
//! store has none and only when nothing says data was lost (a checkpoint past lost records would
//! skip them for good: "if in doubt keep the older position", here: the source starts as a new
//! one). Not restored: file jobs (their spooled files are still in the spool, which the
//! `file_move` task re-queues when it starts), counters (the salvaged jobs are counted as
//! appended), quarantine, the old store id (reported only). Stream bounds are not applied: the
//! jobs were admitted under them once. Called by `colibri queue salvage` (into the store) and by
//! the agent at start-up (into the running writer, [`crate::store::writer::Restoring`]).

mod page;
mod scan;
mod source;

use std::collections::BTreeMap;
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

pub use scan::{Found, FoundJob, Kind, scan};
pub use source::{FileSource, ReadAt, Reader};

use redb::ReadableTable;

use super::error::StoreError;
use super::format;
use super::layout::{CHECKPOINTS, Table};
use super::open::Store;
use super::tx::Tx;

/// Jobs appended per transaction, and bytes: what a salvage holds in memory at once.
const CHUNK_JOBS: usize = 256;
const CHUNK_BYTES: usize = 16 << 20;

/// What a salvage did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SalvageReport {
    pub file: PathBuf,
    /// Jobs and records restored, in all and per stream.
    pub jobs: u64,
    pub records: u64,
    pub streams: BTreeMap<String, (u64, u64)>,
    /// Jobs whose values look like jobs but fail their checks, with no intact copy.
    pub damaged: u64,
    /// Intact jobs whose stream could not be told.
    pub unattributable: u64,
    /// Intact jobs of streams this store does not have, by stream.
    pub unknown_streams: BTreeMap<String, u64>,
    /// File jobs found intact and left to their task's spool recovery.
    pub file_jobs: u64,
    pub checkpoints_restored: u64,
    /// Checkpoints not restored: the live store has its own.
    pub checkpoints_kept: u64,
    /// Checkpoints not restored because data may have been lost before them.
    pub checkpoints_withheld: u64,
    /// Something says data may be missing beyond what is counted (a page lost whole says nothing).
    pub in_doubt: bool,
    pub old_store_id: Option<u64>,
    pub bytes_read: u64,
}

impl fmt::Display for SalvageReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "salvaged from {}", self.file.display())?;
        writeln!(
            f,
            "  jobs restored      {} ({} records)",
            self.jobs, self.records
        )?;
        for (s, (j, r)) in &self.streams {
            writeln!(f, "    {s}: {j} jobs, {r} records")?;
        }
        writeln!(f, "  lost to damage     {}", self.damaged)?;
        writeln!(f, "  unattributable     {}", self.unattributable)?;
        for (s, n) in &self.unknown_streams {
            writeln!(
                f,
                "  not restored: {n} jobs of stream {s:?}, which this config does not have"
            )?;
        }
        if self.file_jobs > 0 {
            writeln!(
                f,
                "  file jobs          {} (left to their task: it re-queues its spool)",
                self.file_jobs
            )?;
        }
        writeln!(
            f,
            "  checkpoints        {} restored, {} kept (already set), {} withheld (data may be lost before them)",
            self.checkpoints_restored, self.checkpoints_kept, self.checkpoints_withheld
        )?;
        if let Some(id) = self.old_store_id {
            writeln!(f, "  old store id       {id:016x}")?;
        }
        if self.in_doubt {
            writeln!(
                f,
                "  the file was damaged where jobs may have been: some may be lost uncounted"
            )?;
        }
        write!(f, "  bytes read         {}", self.bytes_read)
    }
}

/// One intact job of a damaged file on its way into the live store: its value as it was, and
/// where it goes.
#[derive(Debug, Clone)]
pub struct Restored {
    pub stream: String,
    pub kind: Kind,
    /// Retry: when it falls due.
    pub due: u64,
    pub value: Vec<u8>,
}

/// Where a salvage puts what it found: the store itself (`queue salvage`, tests) or the running
/// agent's writer thread, a chunk per transaction.
pub trait Restore {
    /// Appends these jobs, in this order, in one transaction.
    fn jobs(&mut self, jobs: Vec<Restored>) -> Result<(), StoreError>;
    /// Saves these checkpoints where the store has none; returns how many it saved and how many
    /// it kept because the store had its own.
    fn checkpoints(&mut self, cps: Vec<(String, Vec<u8>)>) -> Result<(u64, u64), StoreError>;
}

/// Reads `file` (a damaged or moved-aside store) and gives every intact job it holds of
/// `streams` to `into`, in old id order, in chunks of at most [`CHUNK_JOBS`] jobs or
/// [`CHUNK_BYTES`]; then the checkpoints (see the module header). An unreadable file is an
/// error; a file holding nothing usable is an empty report.
pub fn salvage(
    file: &Path,
    streams: &[&str],
    into: &mut impl Restore,
) -> Result<SalvageReport, StoreError> {
    let cannot = |e: std::io::Error| StoreError::io(format!("cannot read {}: {e}", file.display()));
    let src = FileSource::new(File::open(file).map_err(cannot)?).map_err(cannot)?;
    let found = scan(&src, streams).map_err(cannot)?;
    let mut report = SalvageReport {
        file: file.to_path_buf(),
        damaged: found.damaged,
        unattributable: found.unattributable,
        unknown_streams: found.unknown_streams.clone(),
        file_jobs: found.file_jobs,
        in_doubt: found.in_doubt,
        old_store_id: found.store_id,
        ..SalvageReport::default()
    };
    let mut rd = Reader::new(&src);
    let mut jobs = found.jobs.iter().peekable();
    while jobs.peek().is_some() {
        let (mut chunk, mut bytes) = (Vec::new(), 0);
        while chunk.len() < CHUNK_JOBS && bytes < CHUNK_BYTES {
            let Some(job) = jobs.next() else { break };
            let value = rd.read(job.at, job.len).map_err(cannot)?;
            // Read again: checked again, in case the file changed since the scan.
            let Ok(d) = format::decode(&value) else {
                report.damaged += 1;
                continue;
            };
            let records = u64::from(d.header.records);
            let s = report.streams.entry(job.stream.clone()).or_default();
            s.0 += 1;
            s.1 += records;
            report.jobs += 1;
            report.records += records;
            bytes += value.len();
            chunk.push(Restored {
                stream: job.stream.clone(),
                kind: job.kind,
                due: job.due,
                value,
            });
        }
        if !chunk.is_empty() {
            into.jobs(chunk)?;
        }
    }
    if found.in_doubt {
        report.checkpoints_withheld = found.checkpoints.len() as u64;
    } else if !found.checkpoints.is_empty() {
        let cps = found.checkpoints.clone();
        (report.checkpoints_restored, report.checkpoints_kept) = into.checkpoints(cps)?;
    }
    report.bytes_read = found.bytes_read + rd.bytes_read;
    Ok(report)
}

impl Store {
    /// [`salvage`] into this store (`colibri queue salvage`, with the agent stopped).
    pub fn salvage_from(&mut self, file: &Path) -> Result<SalvageReport, StoreError> {
        let names: Vec<String> = self.streams.keys().cloned().collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        salvage(file, &refs, self)
    }
}

impl Restore for Store {
    fn jobs(&mut self, jobs: Vec<Restored>) -> Result<(), StoreError> {
        let mut tx = self.transaction()?;
        tx.restore_jobs(&jobs)?;
        tx.commit()
    }

    fn checkpoints(&mut self, cps: Vec<(String, Vec<u8>)>) -> Result<(u64, u64), StoreError> {
        let mut tx = self.transaction()?;
        let n = tx.restore_checkpoints(&cps)?;
        tx.close()?;
        Ok(n)
    }
}

impl Tx<'_> {
    /// Appends salvaged jobs as they are (see [`Tx::restore`]).
    pub(in crate::store) fn restore_jobs(&mut self, jobs: &[Restored]) -> Result<(), StoreError> {
        for j in jobs {
            self.restore(&j.stream, j.kind, j.due, &j.value)?;
        }
        Ok(())
    }

    /// Saves salvaged checkpoints where this store has none: (saved, kept).
    pub(in crate::store) fn restore_checkpoints(
        &mut self,
        cps: &[(String, Vec<u8>)],
    ) -> Result<(u64, u64), StoreError> {
        let (mut saved, mut kept) = (0, 0);
        for (source, value) in cps {
            if self.has_checkpoint(source)? {
                kept += 1;
            } else {
                self.restore_checkpoint(source, value)?;
                saved += 1;
            }
        }
        Ok((saved, kept))
    }

    /// Appends a salvaged job value as it is to `stream`'s `kind` table under a new id (retry:
    /// at its old due time), counted as appended.
    fn restore(
        &mut self,
        stream: &str,
        kind: Kind,
        due: u64,
        value: &[u8],
    ) -> Result<(), StoreError> {
        let (txn, st) = self.txn_and_stream(stream)?;
        let id = st.counters.next_id;
        let table = match kind {
            Kind::Ready => {
                txn.open_table(st.ready_def())?.insert(id, value)?;
                Table::Ready
            }
            Kind::Retry => {
                txn.open_table(st.retry_def())?.insert((due, id), value)?;
                Table::Retry
            }
            Kind::Dead => {
                txn.open_table(st.dead_def())?.insert(id, value)?;
                Table::Dead
            }
        };
        let size = format::size(value);
        st.counters.next_id += 1;
        st.counters.add_job(table, size);
        st.counters.appended_jobs += 1;
        st.counters.appended_records += size.records;
        // Not counted as dead-lettered (a flow of this store's failures, which alerts watch): a
        // salvaged dead letter failed in the old file.
        self.dirty.insert(stream.into());
        self.fed.insert(stream.into());
        Ok(())
    }

    fn has_checkpoint(&self, source: &str) -> Result<bool, StoreError> {
        let t = self.txn.open_table(CHECKPOINTS)?;
        Ok(t.get(source)?.is_some())
    }

    fn restore_checkpoint(&mut self, source: &str, value: &[u8]) -> Result<(), StoreError> {
        self.txn.open_table(CHECKPOINTS)?.insert(source, value)?;
        self.touched = true;
        Ok(())
    }
}
