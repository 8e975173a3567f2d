//! What one append to the store carries: a [`Batch`] of encoded records with the checkpoint that
//! covers them, kept within the store's [`Limits`] (how it cuts an append into jobs) so a batch is
//! never refused for its size.
//!
//! It does not read files or make records (`tailer.rs` and `emit.rs` do) nor append (the driver
//! in `mod.rs` does).

use std::time::Instant;

pub use crate::store::AppendLimits as Limits;
use crate::store::RecordBuf;

/// Records read and not yet appended, with the checkpoint that covers them.
#[derive(Debug, Default)]
pub struct Batch {
    /// The records, written in place ([`Batch::push_with`]).
    pub records: RecordBuf,
    /// The state after the last record (set whenever it changed since the last append).
    pub checkpoint: Option<Vec<u8>>,
    /// When the oldest thing in the batch (a record or a checkpoint change) arrived.
    pub since: Option<Instant>,
    limits: Limits,
    tally: Tally,
    /// A record did not fit.
    refused: bool,
}

/// What the records of a batch add up to, as the store will cut them into jobs.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    /// Record bytes plus their framing in a job.
    bytes: usize,
    /// Jobs the store will cut the records into, and the last one's records and bytes.
    jobs: usize,
    job_records: usize,
    job_bytes: usize,
}

impl Tally {
    /// Whether a record of `len` bytes starts a new job (the store's cut, see `Store::append`).
    fn opens_job(&self, limits: &Limits, len: usize) -> bool {
        self.jobs == 0
            || self.job_records >= limits.job_records
            || self.job_bytes + len > limits.job_bytes
    }

    fn add(&mut self, limits: &Limits, len: usize) {
        if self.opens_job(limits, len) {
            self.jobs += 1;
            self.job_records = 0;
            self.job_bytes = 0;
        }
        self.job_records += 1;
        self.job_bytes += len;
        self.bytes += len + 4;
    }

    /// Whether records of these sizes fit after the `records` held (a first record always does).
    fn fits(mut self, limits: &Limits, mut records: usize, lens: &[usize]) -> bool {
        for &len in lens {
            if records > 0
                && (records >= limits.records
                    || self.bytes + len + 4 > 2 * limits.bytes
                    || (self.opens_job(limits, len)
                        && (self.jobs >= limits.jobs || self.bytes >= limits.bytes)))
            {
                return false;
            }
            self.add(limits, len);
            records += 1;
        }
        true
    }
}

impl Batch {
    pub fn new(limits: Limits) -> Batch {
        Batch {
            limits,
            ..Batch::default()
        }
    }

    /// An empty batch with the same limits.
    pub fn take(&mut self) -> Batch {
        std::mem::replace(self, Batch::new(self.limits))
    }

    /// Record bytes plus their framing in a job.
    pub fn bytes(&self) -> usize {
        self.tally.bytes
    }

    /// Whether records of these sizes fit (a first record always does). A refusal makes the batch
    /// full. (Records are checked as they are written, by [`Batch::push_with`].)
    #[cfg(test)]
    pub fn fits(&mut self, lens: &[usize]) -> bool {
        let fits = self.would_fit(lens);
        self.refused |= !fits;
        fits
    }

    #[cfg(test)]
    fn would_fit(&self, lens: &[usize]) -> bool {
        self.tally.fits(&self.limits, self.records.len(), lens)
    }

    /// Appends a copy of `rec`, whether it fits or not.
    #[cfg(test)]
    pub fn push(&mut self, rec: &[u8], now: Instant) {
        self.push_with(true, now, |out| out.extend_from_slice(rec));
    }

    /// Writes one record in place: `write` appends its bytes to the buffer (and must not touch
    /// what the buffer held before). The record is kept when it fits or `force`; otherwise it is
    /// taken back, the batch is full, and false is returned (nothing changed then but `refused`).
    pub fn push_with(
        &mut self,
        force: bool,
        now: Instant,
        write: impl FnOnce(&mut Vec<u8>),
    ) -> bool {
        let Batch {
            records,
            since,
            limits,
            tally,
            refused,
            ..
        } = self;
        let held = records.len();
        let mut w = records.record();
        if held == 0 {
            // Room for what a batch holds at most, so it is not copied as it grows (pages not
            // written to are not resident; the buffer goes to the store with the append).
            w.buf().reserve(limits.bytes.saturating_mul(2));
        }
        write(w.buf());
        let len = w.len();
        if !force && !tally.fits(limits, held, &[len]) {
            *refused = true;
            return false; // the writer, dropped, takes the bytes back
        }
        // A tail record is JSON colibri escaped (or a JSON object it checked, its line breaks
        // made spaces): never a raw newline.
        w.finish_line();
        tally.add(limits, len);
        since.get_or_insert(now);
        true
    }

    /// No room for more (a hint between reads: records are checked one by one with `fits`).
    pub fn is_full(&self) -> bool {
        self.refused
            || self.records.len() >= self.limits.records
            || self.tally.bytes >= 2 * self.limits.bytes
            || (self.tally.jobs >= self.limits.jobs
                && self.tally.job_records >= self.limits.job_records)
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty() && self.checkpoint.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_count_jobs_as_the_store_cuts_them() {
        let mut b = Batch::new(Limits {
            job_records: 2,
            job_bytes: 100,
            jobs: 2,
            records: 10,
            bytes: 1000,
        });
        let now = Instant::now();
        assert!(b.fits(&[500]), "a first record always fits");
        b.push(&[b'x'; 60], now);
        b.push(&[b'x'; 30], now); // job 1: 2 records
        assert!(!b.is_full());
        b.push(&[b'x'; 60], now); // job 2
        assert!(b.fits(&[40]), "fits in job 2 by records and bytes");
        assert!(!b.fits(&[41]), "would open job 3");
        assert!(b.is_full(), "a refusal makes it full");
        let b = Batch::new(b.limits).take();
        assert!(b.records.is_empty() && !b.is_full());
        // Past `bytes`, no new job; never past twice `bytes`.
        let mut b = Batch::new(Limits {
            job_records: 2,
            job_bytes: 100,
            jobs: 10,
            records: 100,
            bytes: 100,
        });
        for len in [60, 30, 10, 10] {
            assert!(b.fits(&[len]), "{len}");
            b.push(&vec![0; len], now);
        }
        assert!(!b.fits(&[5]), "a third job past 100 bytes");
        let mut b = Batch::new(b.limits);
        b.push(&[0; 10], now);
        assert!(b.fits(&[90]) && !b.fits(&[190]), "twice the bytes at most");
        let mut b = Batch::new(Limits {
            records: 2,
            ..Limits::default()
        });
        b.push(&[1], now);
        b.push(&[1], now);
        assert!(b.is_full() && !b.would_fit(&[1]));
    }

    #[test]
    fn a_record_written_in_place_is_taken_back_when_it_does_not_fit() {
        let now = Instant::now();
        let mut b = Batch::new(Limits {
            job_records: 10,
            job_bytes: 100,
            jobs: 1,
            records: 10,
            bytes: 1000,
        });
        assert!(b.push_with(false, now, |out| out.extend_from_slice(&[b'a'; 60])));
        assert!(!b.is_full());
        // 60 + 50 opens a second job: refused, its bytes taken back.
        assert!(!b.push_with(false, now, |out| out.extend_from_slice(&[b'b'; 50])));
        assert!(b.is_full());
        assert_eq!(b.records.len(), 1);
        assert_eq!(
            b.records.lines(0..1),
            Some([[b'a'; 60].as_slice(), b"\n"].concat().as_slice())
        );
        assert_eq!(b.bytes(), 64);
        // Forced, it goes in anyway.
        assert!(b.push_with(true, now, |out| out.extend_from_slice(b"forced")));
        assert_eq!(b.records.get(1), Some(b"forced".as_slice()));
        assert_eq!(b.bytes(), 64 + 10);
    }
}
