//! Appending records: cutting them into jobs, checking the bounds before anything is written, and
//! what a full stream does (`block`, `drop_newest`, `drop_oldest`). Called through [`Tx::append`]
//! by the writer (ingest, sources) and `colibri queue push`.

use redb::ReadableTable;

use super::Tx;
use crate::store::error::{AppendError, StoreError};
use crate::store::files::file_value;
use crate::store::format::{self, Codec, Framing};
use crate::store::job::{Appended, fresh_meta};
use crate::store::layout::{CHECKPOINTS, Table};
use crate::store::record_buf::RecordBuf;
use crate::store::stream::{AtRest, WAITING_JOBS, WhenFull};

/// What an append that was refused for room took, and how many jobs of its stream waited then.
#[derive(Debug, Clone, Copy)]
pub(in crate::store) struct Need {
    jobs: u64,
    bytes: u64,
    waiting: u64,
}

impl Tx<'_> {
    /// Appends records to a stream, cut into jobs by `batch.max_records` / `batch.max_bytes`, and,
    /// when given, saves a source checkpoint in the same transaction. Bounds are checked before
    /// anything is written; the stream's `when_full` decides what happens when they are exceeded.
    pub fn append(
        &mut self,
        stream: &str,
        records: &RecordBuf,
        checkpoint: Option<(&str, &[u8])>,
        now_ms: u64,
    ) -> Result<Appended, AppendError> {
        self.append_again(stream, records, checkpoint, now_ms, &mut None)
    }

    /// [`Tx::append`] for an append that waits for room (the writer retries it at least every
    /// 50 ms while its stream is full): `need` holds the jobs and bytes it took when it was last
    /// found full, and while the stream cannot hold even those the records are not cut, framed
    /// and compressed again only to find that out (during an outage, up to 2 MiB 20 times a
    /// second). What it needs now is checked as it is encoded, as for any append; a refusal for
    /// room under `when_full: block` leaves that in `need`.
    pub(in crate::store) fn append_again(
        &mut self,
        stream: &str,
        records: &RecordBuf,
        checkpoint: Option<(&str, &[u8])>,
        now_ms: u64,
        need: &mut Option<Need>,
    ) -> Result<Appended, AppendError> {
        // With as many jobs waiting or fewer, `auto` compresses no more of the records than it
        // did, so they take at least what they took then.
        if let Some(n) = *need
            && self.stream(stream)?.waiting() <= n.waiting
            && let Some(reason) = self.full(stream, n.jobs, n.bytes, n.bytes)
        {
            return Err(AppendError::Full {
                stream: stream.into(),
                reason,
            });
        }
        let st = self.stream(stream)?;
        let (max_jobs, when_full, waiting) = (st.cfg.max_jobs, st.cfg.when_full, st.waiting());
        let cut = Cut {
            stream,
            batch: st.cfg.batch,
            max_bytes: st.cfg.max_bytes,
            compression: st.cfg.compression,
            waiting,
            now_ms,
            fit: true,
            clock: st
                .cfg
                .hold_until_clock_synced
                .then(crate::timesync::stamp_if_unsynced)
                .flatten(),
        };
        let max_bytes = cut.max_bytes;
        let new = encode(records, cut, max_jobs)?;
        self.never_fits(stream, &new, max_jobs, max_bytes)?;
        let dropped_oldest = self.make_room(stream, &new, when_full, waiting, need)?;
        self.write_jobs(stream, &new, checkpoint)?;
        Ok(Appended {
            jobs: new.jobs(),
            records: new.records,
            dropped_oldest,
        })
    }

    /// A batch that would not fit even in an empty stream and an empty store is refused as too
    /// large, before anything changes: `Full` would have its sender wait and retry forever.
    fn never_fits(
        &self,
        stream: &str,
        new: &Encoded,
        max_jobs: u64,
        max_bytes: u64,
    ) -> Result<(), AppendError> {
        let (n_jobs, bytes) = (new.jobs(), new.bytes);
        let never = if n_jobs > max_jobs {
            Some((n_jobs, max_jobs, "jobs", "the stream's max_jobs"))
        } else if bytes > max_bytes {
            Some((bytes, max_bytes, "bytes", "the stream's max_bytes"))
        } else if bytes > self.rollback.store.storage.max_bytes {
            Some((
                bytes,
                self.rollback.store.storage.max_bytes,
                "bytes",
                "storage.max_bytes",
            ))
        } else {
            None
        };
        let Some((size, max, unit, bound)) = never else {
            return Ok(());
        };
        let n_records = new.records;
        Err(AppendError::TooLarge {
            stream: stream.into(),
            size,
            max,
            why: format!(
                "a batch of {n_records} records ({size} {unit}) can never fit in stream {stream:?} ({bound} is {max} {unit}): send smaller batches"
            ),
        })
    }

    /// Room for `new` when the stream or the store is full, as `when_full` says: `block` refuses
    /// (leaving what it needs in `need`), `drop_newest` counts the records as dropped and refuses,
    /// `drop_oldest` deletes old jobs. The records that deleted.
    fn make_room(
        &mut self,
        stream: &str,
        new: &Encoded,
        when_full: WhenFull,
        waiting: u64,
        need: &mut Option<Need>,
    ) -> Result<u64, AppendError> {
        let (n_jobs, bytes, n_records) = (new.jobs(), new.bytes, new.records);
        let Some(reason) = self.full(stream, n_jobs, bytes, bytes) else {
            return Ok(0);
        };
        match when_full {
            WhenFull::Block => {
                *need = Some(Need {
                    jobs: n_jobs,
                    bytes,
                    waiting,
                });
                Err(AppendError::Full {
                    stream: stream.into(),
                    reason,
                })
            }
            WhenFull::DropNewest => {
                let st = self.stream_mut(stream)?;
                st.counters.appended_records += n_records;
                st.counters.dropped_newest_records += n_records;
                self.dirty.insert(stream.into());
                Err(AppendError::Refused {
                    stream: stream.into(),
                    reason,
                    records: n_records,
                })
            }
            WhenFull::DropOldest | WhenFull::Downsample => {
                if when_full == WhenFull::Downsample {
                    self.downsample_until_fits(stream, n_jobs, bytes)?;
                }
                // What aggregates cannot free (the coarsest window full too, or only jobs in
                // flight left) the oldest give.
                let dropped_oldest = self.drop_oldest_until_fits(stream, n_jobs, bytes, bytes)?;
                if let Some(reason) = self.full(stream, n_jobs, bytes, bytes) {
                    // Not enough old jobs to delete (in flight, or other streams fill the disk).
                    return Err(AppendError::Full {
                        stream: stream.into(),
                        reason,
                    });
                }
                Ok(dropped_oldest)
            }
        }
    }

    /// Writes `new`'s jobs to the stream's ready table and `checkpoint` with them, and counts
    /// them.
    fn write_jobs(
        &mut self,
        stream: &str,
        new: &Encoded,
        checkpoint: Option<(&str, &[u8])>,
    ) -> Result<(), AppendError> {
        let (txn, st) = self.txn_and_stream(stream)?;
        {
            let mut ready = txn.open_table(st.ready_def())?;
            for job in &new.jobs {
                ready.insert(st.counters.next_id, job.as_slice())?;
                st.counters.next_id += 1;
            }
        }
        if let Some((source, cp)) = checkpoint {
            let mut t = txn.open_table(CHECKPOINTS)?;
            t.insert(source, cp)?;
        }
        st.counters.ready_jobs += new.jobs();
        st.counters.ready_records += new.records;
        st.counters.ready_bytes += new.bytes;
        st.counters.ready_raw_bytes += new.raw_bytes;
        st.counters.appended_jobs += new.jobs();
        st.counters.appended_records += new.records;
        self.dirty.insert(stream.into());
        self.fed.insert(stream.into());
        // Later appends in this transaction see the space this one takes.
        self.consume(new.bytes);
        Ok(())
    }

    /// [`append`](Self::append) of a list of records (tests).
    #[cfg(test)]
    pub fn append_list<R: AsRef<[u8]>>(
        &mut self,
        stream: &str,
        records: &[R],
        checkpoint: Option<(&str, &[u8])>,
        now_ms: u64,
    ) -> Result<Appended, AppendError> {
        self.append(stream, &RecordBuf::from(records), checkpoint, now_ms)
    }

    /// Deletes the oldest ready jobs (never one in flight) so that `jobs`/`bytes` more fit in the
    /// stream's bounds and the storage budget; returns the records dropped. Deletes nothing when even
    /// that cannot make room (jobs in flight or in retry, other streams filling the budget, a batch
    /// larger than the stream): old data is never thrown away for an append that is refused anyway.
    pub(in crate::store) fn drop_oldest_until_fits(
        &mut self,
        stream: &str,
        jobs: u64,
        bytes: u64,
        disk: u64,
    ) -> Result<u64, StoreError> {
        // Deleting jobs frees no filesystem space (redb keeps the pages, and reuses them only
        // after later commits), so it cannot help with min_free now: do not throw old data away
        // for that.
        if self.below_min_free(disk) {
            return Ok(0);
        }
        let stored_elsewhere = self.rollback.store.budget_used()
            - self.rollback.store.streams[stream].counters.stored_bytes();
        let budget = self.rollback.store.storage.max_bytes;
        let (txn, st) = self.txn_and_stream(stream)?;
        let mut ready = txn.open_table(st.ready_def())?;
        let (mut q_jobs, mut q_bytes, mut all_bytes) = (
            st.counters.ready_jobs + st.counters.retry_jobs,
            st.counters.queued_bytes(),
            st.counters.stored_bytes(),
        );
        let fits = |q_jobs: u64, q_bytes: u64, all_bytes: u64| {
            q_jobs + jobs <= st.cfg.max_jobs
                && q_bytes + bytes <= st.cfg.max_bytes
                && stored_elsewhere + all_bytes + bytes <= budget
        };
        let mut victims = Vec::new();
        for e in ready.iter()? {
            if fits(q_jobs, q_bytes, all_bytes) {
                break;
            }
            let (k, v) = e?;
            let id = k.value();
            if st.in_flight.contains(&id) {
                continue;
            }
            let size = format::size(v.value());
            victims.push((id, size, file_value(v.value())));
            q_jobs -= 1;
            q_bytes = q_bytes.saturating_sub(size.bytes);
            all_bytes = all_bytes.saturating_sub(size.bytes);
        }
        if !fits(q_jobs, q_bytes, all_bytes) {
            return Ok(0);
        }
        let mut dropped = 0u64;
        let mut files = Vec::new();
        for (id, size, file) in victims {
            ready.remove(id)?;
            let recs = st.counters.remove_job(Table::Ready, size);
            st.counters.dropped_oldest_records += recs;
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
}

/// An append's records as jobs, encoded, before anything is written.
struct Encoded {
    jobs: Vec<Vec<u8>>,
    records: u64,
    /// The jobs' bytes as stored.
    bytes: u64,
    /// The same uncompressed.
    raw_bytes: u64,
}

impl Encoded {
    fn jobs(&self) -> u64 {
        self.jobs.len() as u64
    }
}

/// `records` as jobs, cut to fill their pages unless that makes more than the stream's `max_jobs`.
fn encode(records: &RecordBuf, mut cut: Cut<'_>, max_jobs: u64) -> Result<Encoded, AppendError> {
    let (mut jobs, mut raw_bytes) = cut_jobs(records, &cut)?;
    if jobs.len() as u64 > max_jobs {
        // Cut to fit their pages, the records need more jobs than the stream may hold, while
        // `batch` alone would have cut few enough (a producer sizes its batches by that):
        // store them in fewer, emptier pages rather than refuse them.
        cut.fit = false;
        (jobs, raw_bytes) = cut_jobs(records, &cut)?;
    }
    let bytes = jobs.iter().map(|j| j.len() as u64).sum();
    Ok(Encoded {
        jobs,
        records: records.len() as u64,
        bytes,
        raw_bytes,
    })
}

/// How [`cut_jobs`] cuts an append's records.
struct Cut<'a> {
    stream: &'a str,
    batch: crate::store::BatchConfig,
    /// The stream's `max_bytes`: a job larger than that can never be stored.
    max_bytes: u64,
    compression: AtRest,
    /// Jobs of the stream no worker has taken (see [`AtRest::Waiting`]).
    waiting: u64,
    now_ms: u64,
    /// Cut plain jobs to fill their pages ([`page_fit`]).
    fit: bool,
    /// The jobs' clock stamp, for a stream held while the clock is unsynchronised.
    clock: Option<crate::timesync::ClockStamp>,
}

/// The jobs `records` make, encoded (compressed where `compression` says so), and their raw bytes.
fn cut_jobs(records: &RecordBuf, c: &Cut<'_>) -> Result<(Vec<Vec<u8>>, u64), AppendError> {
    let mut jobs: Vec<Vec<u8>> = Vec::new();
    let mut raw_bytes = 0u64;
    let mut start = 0;
    while start < records.len() {
        let mut end = start;
        let mut size = 0u64;
        while end < records.len() && (end - start) < c.batch.max_records as usize {
            let r = records.record_len(end) as u64;
            if end > start && size + r > c.batch.max_bytes {
                break;
            }
            size += r;
            end += 1;
        }
        let codec = match c.compression {
            AtRest::Plain => Codec::None,
            AtRest::Always => Codec::Zstd,
            AtRest::Waiting if c.waiting + jobs.len() as u64 >= WAITING_JOBS => Codec::Zstd,
            AtRest::Waiting => Codec::None,
        };
        if c.fit && codec == Codec::None {
            end = page_fit(records, start, end);
        }
        let n = u32::try_from(end - start).expect("a job holds at most u32::MAX records");
        let meta = fresh_meta(0, None).with_extras(c.clock, 0);
        let job = match records.lines(start..end) {
            Some(lines) => format::encode_area(c.now_ms, &meta, lines, Framing::Lines, n, codec),
            None => {
                let part: Vec<&[u8]> = records.iter().skip(start).take(end - start).collect();
                let (plain, framing) = format::frame(&part);
                format::encode_area(c.now_ms, &meta, &plain, framing, n, codec)
            }
        };
        if job.len() as u64 > c.max_bytes {
            let size = size.max(job.len() as u64);
            return Err(AppendError::TooLarge {
                stream: c.stream.into(),
                size,
                max: c.max_bytes,
                why: format!(
                    "a record of {size} bytes can never fit in stream {:?} (max_bytes {})",
                    c.stream, c.max_bytes
                ),
            });
        }
        raw_bytes += format::size(&job).raw;
        jobs.push(job);
        start = end;
    }
    Ok((jobs, raw_bytes))
}

/// Where to end a job of records `start..end` that is stored as it is so that it fills its redb
/// page. redb keeps a value too large to share a page in a power-of-two run of 4 KiB pages, written
/// whole: a job of 1,000 records of 320 bytes takes 512 KiB, a third of it empty and written all
/// the same. A job whose page would stay more than a quarter empty is cut back to fit the page half
/// that size, the rest opening the next job; so an append makes at most twice the jobs that
/// `batch` alone would cut, and never more than the stream's `max_jobs` when `batch` alone stays
/// within it (the append then cuts without this). Jobs whose page is
/// 64 KiB or less are left alone: each commit writes about 50 KB besides its jobs anyway. A
/// compressed job's size is known only once compressed, and is small: it is not cut.
fn page_fit(records: &RecordBuf, start: usize, end: usize) -> usize {
    const SMALL: u64 = 64 << 10;
    // The job's header and metadata, redb's leaf header and key, rounded up; and per record its
    // framing at most (4 bytes of length).
    const FIXED: u64 = format::HEADER_LEN_AREA as u64 + 64;
    const PER_RECORD: u64 = 4;
    let cost = |from: usize, to: usize| -> u64 {
        FIXED
            + (from..to)
                .map(|i| records.record_len(i) as u64 + PER_RECORD)
                .sum::<u64>()
    };
    let need = cost(start, end);
    let page = need.next_power_of_two();
    if page <= SMALL || need * 4 >= page * 3 {
        return end;
    }
    let half = page / 2;
    let mut fit = start;
    let mut used = FIXED;
    while fit < end {
        let next = records.record_len(fit) as u64 + PER_RECORD;
        if used + next > half {
            break;
        }
        used += next;
        fit += 1;
    }
    if fit > start { fit } else { end }
}
