//! The salvager (issue 17, "lose only what is damaged"): reads a damaged store file without
//! trusting its tree and puts every intact job back into the live store under its stream, with its
//! records and metadata (attempts, settled offset) as they were, byte for byte. [`scan`] finds them
//! (`scan.rs`: the live tree, a walk of every page, attribution and the choice of copies, on
//! redb's format as `page.rs` reads it, through the bounded windows of `source.rs`);
//! [`salvage`] hands them on in bounded chunks to a [`Restore`] (the store, or the writer thread)
//! and restores checkpoints.
//!
//! What it restores: record jobs of the target store's streams, to the table they were in
//! (ready, retry with its due time, dead), with new ids in the old ids' order, each marked with its
//! [`format::Origin`] (old store id and old id, when the old store id was read) so that a sink's
//! idempotency key is the one a receiver saw before; the old file's counters, carried on
//! ([`crate::store::Counters::carry_on`]: what the file held is `salvaging` until it is put back,
//! the rest `lost_to_damage` when the salvage ends; an old copy, not live at the file's last
//! commit, taken where a live tree was incomplete, is a re-send, `salvage_resent`, never a job
//! filling the place of a lost one, so a loss stays counted); source checkpoints, only where the live store
//! has none and only when nothing says data was lost (a checkpoint past lost records would skip
//! them for good: "if in doubt keep the older position", here: the source starts as a new one).
//! Not restored: file jobs (their spooled files are still in the spool, which the `file_move` task
//! re-queues when it starts), quarantine. Stream bounds are not applied: the jobs were admitted
//! under them once. Each [`Step`] is one transaction that also saves the file's [`Progress`], so a
//! salvage cut short goes on where it stopped and one that ended is not done again. Called by
//! `colibri queue salvage` (into the store) and by the agent at start-up (into the running writer,
//! [`crate::store::writer::Restoring`]).

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
use super::layout::{CHECKPOINTS, SALVAGE, Table};
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
    /// Records the file held (by its carried-on counters) that were not put back, booked as
    /// `lost_to_damage_records` when the salvage ended: what the counter says, whether or not
    /// the scan saw the jobs (a zeroed page holds nothing that looks like a job).
    pub lost_records: u64,
    /// Records of old copies put back "in doubt" (not live at the file's last commit): counted
    /// as a re-send (`salvage_resent_records`), most of them delivered before.
    pub resent_records: u64,
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
    /// Streams whose counters were read from the file and carried on (see the module header).
    pub counters_carried_on: u64,
    /// Jobs an earlier salvage of this file, cut short, had put back already.
    pub put_back_before: u64,
    /// An earlier salvage of this file ended: nothing was done again.
    pub ended_before: bool,
    pub bytes_read: u64,
}

impl fmt::Display for SalvageReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "salvaged from {}", self.file.display())?;
        if self.ended_before {
            return write!(
                f,
                "  nothing done: this file was salvaged into this store before"
            );
        }
        if self.put_back_before > 0 {
            writeln!(
                f,
                "  put back before    {} jobs (an earlier salvage was cut short; it went on from there)",
                self.put_back_before
            )?;
        }
        writeln!(
            f,
            "  jobs restored      {} ({} records)",
            self.jobs, self.records
        )?;
        for (s, (j, r)) in &self.streams {
            writeln!(f, "    {s}: {j} jobs, {r} records")?;
        }
        writeln!(
            f,
            "  lost to damage     {} records ({} jobs seen damaged)",
            self.lost_records, self.damaged
        )?;
        if self.resent_records > 0 {
            writeln!(
                f,
                "  re-sent            {} records (old copies, most delivered before: sent again)",
                self.resent_records
            )?;
        }
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
            writeln!(
                f,
                "  old store id       {id:016x} (the jobs keep their idempotency keys)"
            )?;
        }
        writeln!(
            f,
            "  counters           {}",
            if self.counters_carried_on > 0 {
                "carried on (what was not put back is counted lost to damage)"
            } else {
                "not readable (jobs put back are counted as appended)"
            }
        )?;
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
    /// Live at the old file's last commit (else an old copy, put back "in doubt": a re-send).
    pub live: bool,
    /// Its old store's id and its id there, when the old store id was read: kept in the job
    /// (see [`format::Origin`]) so its idempotency key does not change.
    pub origin: Option<format::Origin>,
}

/// How far the salvage of one file went, saved in the live store in the transaction of each step:
/// a salvage cut short (kill -9, power cut) goes on from there at the next start, and one that
/// ended is not done again. Kept by [`progress_key`].
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Progress {
    /// The last job put back, as (stream, old id, place in the file): they are put back in that
    /// order.
    pub last: Option<(String, u64, u64)>,
    /// The salvage ended (the file may still await its rename to `….salvaged`).
    pub done: bool,
    /// By stream, the records this file's carried-on counters said it held and that are not back
    /// yet: its share of `salvaging_records` (several files may be salvaged in turn, and each
    /// books only its own as lost when it ends).
    pub salvaging: BTreeMap<String, u64>,
}

/// One transaction of a salvage.
#[derive(Debug)]
pub enum Step {
    /// The first: the old file's counters carried on ([`crate::store::Counters::carry_on`]).
    Begin {
        counters: BTreeMap<String, crate::store::Counters>,
    },
    /// Jobs put back, in this order; the last one's (stream, old id, place in the file).
    Jobs {
        jobs: Vec<Restored>,
        last: (String, u64, u64),
    },
    /// The last: checkpoints saved where the store has none; what was not put back is lost.
    End { checkpoints: Vec<(String, Vec<u8>)> },
}

/// What a step did that the report tells: for [`Step::End`], the checkpoints saved and kept
/// (the store had its own) and the records booked as lost to damage; else nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stepped {
    pub checkpoints_restored: u64,
    pub checkpoints_kept: u64,
    pub lost_records: u64,
}

/// Where a salvage puts what it found: the store itself (`queue salvage`, tests) or the running
/// agent's writer thread, a step per transaction.
pub trait Restore {
    /// How far an earlier salvage under `key` went.
    fn progress(&mut self, key: &str) -> Result<Option<Progress>, StoreError>;
    /// Does `step` and saves the progress it makes under `key`, in one transaction.
    fn step(&mut self, key: &str, step: Step) -> Result<Stepped, StoreError>;
}

/// What a file's progress is kept under: its name and old store id (an id alone could be shared
/// by two copies of a file, a name by two files of different stores).
pub fn progress_key(file: &Path, store_id: Option<u64>) -> String {
    let name = file
        .file_name()
        .map_or_else(|| file.to_string_lossy(), |n| n.to_string_lossy());
    match store_id {
        Some(id) => format!("{name}:{id:016x}"),
        None => format!("{name}:?"),
    }
}

/// Reads `file` (a damaged or moved-aside store) and gives every intact job it holds of
/// `streams` to `into`, in old id order, in chunks of at most [`CHUNK_JOBS`] jobs or
/// [`CHUNK_BYTES`], after the old counters and before the checkpoints (see the module header).
/// Goes on where an earlier salvage of the same file stopped, and does nothing for one that
/// ended. An unreadable file is an error; a file holding nothing usable is an empty report.
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
        bytes_read: found.bytes_read,
        ..SalvageReport::default()
    };
    let key = progress_key(file, found.store_id);
    let after = match into.progress(&key)? {
        Some(p) if p.done => {
            report.ended_before = true;
            return Ok(report);
        }
        Some(p) => p.last,
        None => {
            let counters: BTreeMap<_, _> = found
                .counters
                .iter()
                .filter(|(s, _)| streams.contains(&s.as_str()))
                .map(|(s, c)| (s.clone(), c.clone()))
                .collect();
            report.counters_carried_on = counters.len() as u64;
            into.step(&key, Step::Begin { counters })?;
            None
        }
    };
    let mut rd = Reader::new(&src);
    let mut jobs = found
        .jobs
        .iter()
        .filter(|j| {
            let done = after
                .as_ref()
                .is_some_and(|(s, id, at)| (&j.stream, j.id, j.at) <= (s, *id, *at));
            report.put_back_before += u64::from(done);
            !done
        })
        .peekable();
    while jobs.peek().is_some() {
        let (mut chunk, mut bytes, mut last) = (Vec::new(), 0, None);
        while chunk.len() < CHUNK_JOBS && bytes < CHUNK_BYTES {
            let Some(job) = jobs.next() else { break };
            last = Some((job.stream.clone(), job.id, job.at));
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
            if !job.live {
                report.resent_records += records;
            }
            bytes += value.len();
            chunk.push(Restored {
                stream: job.stream.clone(),
                kind: job.kind,
                due: job.due,
                value,
                live: job.live,
                // Twins (see `scan`) must not share a key, or a receiver drops one as a replay;
                // which one had it cannot be told: both get new keys (a re-send, never a loss).
                origin: found
                    .store_id
                    .filter(|_| !job.twin)
                    .map(|store| format::Origin {
                        store,
                        job: job.id,
                        stream: None,
                    }),
            });
        }
        if let Some(last) = last {
            into.step(&key, Step::Jobs { jobs: chunk, last })?;
        }
    }
    let checkpoints = if found.in_doubt {
        report.checkpoints_withheld = found.checkpoints.len() as u64;
        Vec::new()
    } else {
        found.checkpoints.clone()
    };
    let end = into.step(&key, Step::End { checkpoints })?;
    report.checkpoints_restored = end.checkpoints_restored;
    report.checkpoints_kept = end.checkpoints_kept;
    report.lost_records = end.lost_records;
    report.bytes_read += rd.bytes_read;
    Ok(report)
}

impl Store {
    /// [`salvage`] into this store (`colibri queue salvage`, with the agent stopped).
    pub fn salvage_from(&mut self, file: &Path) -> Result<SalvageReport, StoreError> {
        let names: Vec<String> = self.streams.keys().cloned().collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        salvage(file, &refs, self)
    }

    /// How far the salvage kept under `key` went.
    pub(in crate::store) fn salvage_progress(
        &self,
        key: &str,
    ) -> Result<Option<Progress>, StoreError> {
        let rtx = self.db.begin_read()?;
        let t = match rtx.open_table(SALVAGE) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let Some(v) = t.get(key)? else {
            return Ok(None);
        };
        postcard::from_bytes(v.value())
            .map(Some)
            .map_err(|e| StoreError::io(format!("salvage progress of {key} cannot be read: {e}")))
    }
}

impl Restore for Store {
    fn progress(&mut self, key: &str) -> Result<Option<Progress>, StoreError> {
        self.salvage_progress(key)
    }

    fn step(&mut self, key: &str, step: Step) -> Result<Stepped, StoreError> {
        let mut tx = self.transaction()?;
        let n = tx.salvage_step(key, step)?;
        tx.commit()?;
        Ok(n)
    }
}

impl Tx<'_> {
    /// Does one step of a salvage kept under `key` and saves the progress it makes (see
    /// [`Restore::step`]).
    pub(in crate::store) fn salvage_step(
        &mut self,
        key: &str,
        step: Step,
    ) -> Result<Stepped, StoreError> {
        let mut progress = self
            .rollback
            .store
            .salvage_progress(key)?
            .unwrap_or_default();
        let mut done = Stepped::default();
        match step {
            Step::Begin { counters } => {
                for (stream, old) in &counters {
                    let c = &mut self.stream_mut(stream)?.counters;
                    let before = c.salvaging_records;
                    c.carry_on(old);
                    let share = c.salvaging_records - before;
                    progress.salvaging.insert(stream.clone(), share);
                    self.dirty.insert(stream.clone());
                }
            }
            Step::Jobs { jobs, last } => {
                for j in &jobs {
                    let share = progress.salvaging.entry(j.stream.clone()).or_default();
                    self.restore(j, share)?;
                }
                progress.last = Some(last);
            }
            Step::End { checkpoints } => {
                (done.checkpoints_restored, done.checkpoints_kept) =
                    self.restore_checkpoints(&checkpoints)?;
                for (stream, share) in &mut progress.salvaging {
                    if *share > 0 {
                        done.lost_records += self
                            .stream_mut(stream)?
                            .counters
                            .salvage_ended(std::mem::take(share));
                        self.dirty.insert(stream.clone());
                    }
                }
                progress.done = true;
            }
        }
        let v = postcard::to_stdvec(&progress).expect("postcard encodes a plain struct");
        self.txn.open_table(SALVAGE)?.insert(key, v.as_slice())?;
        self.touched = true;
        Ok(done)
    }

    /// Saves salvaged checkpoints where this store has none: (saved, kept).
    fn restore_checkpoints(&mut self, cps: &[(String, Vec<u8>)]) -> Result<(u64, u64), StoreError> {
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

    /// Appends a salvaged job to its stream's table under a new id (retry: at its old due time),
    /// with its origin written into it; counted out of its file's share of what is being salvaged
    /// when it was live there, else as a re-send ([`crate::store::Counters::salvaged`]).
    fn restore(&mut self, j: &Restored, share: &mut u64) -> Result<(), StoreError> {
        let with_origin;
        let value = match &j.origin {
            Some(origin) => {
                // Salvaged twice: the first origin is the one receivers know.
                with_origin = format::with_meta(&j.value, |d| {
                    let origin = Some(d.origin.clone().unwrap_or_else(|| origin.clone()));
                    format::Meta::new(
                        d.attempts,
                        d.last_error.clone(),
                        d.last_failed_ms,
                        d.offset,
                        origin,
                    )
                    .with_extras(d.clock, d.window_ms)
                })
                .map_err(|e| StoreError::io(format!("a salvaged job cannot be re-encoded: {e}")))?;
                with_origin.as_slice()
            }
            None => j.value.as_slice(),
        };
        let (txn, st) = self.txn_and_stream(&j.stream)?;
        let id = st.counters.next_id;
        let table = match j.kind {
            Kind::Ready => {
                txn.open_table(st.ready_def())?.insert(id, value)?;
                Table::Ready
            }
            Kind::Retry => {
                txn.open_table(st.retry_def())?.insert((j.due, id), value)?;
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
        st.counters.salvaged(size.records, j.live, share);
        // Not counted as dead-lettered (a flow of this store's failures, which alerts watch): a
        // salvaged dead letter failed in the old file.
        self.dirty.insert(j.stream.clone());
        self.fed.insert(j.stream.clone());
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
