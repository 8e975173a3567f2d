//! How much one append may carry ([`AppendLimits`]): the store cuts an append into jobs of the
//! stream's `batch` size and refuses (or, under `block`, parks) one with more jobs than the stream
//! holds, so every producer (the tail, syslog and mqtt sources) sizes its appends by these. Read
//! from a stream's settings; used by the sources; the store itself does not consult it.

use super::StreamConfig;

/// An append starts no new job past this many bytes (and holds at most twice as many): whole
/// jobs of the stream's `batch` size where they are smaller, otherwise about this much. Each
/// append is a commit, and a commit costs ~50 KB of writes and a fsync whatever it holds: a file
/// read from its start in appends of 256 KiB spent a third more CPU per line than in 1 MiB
/// ones (BENCHMARKS.md); more costs memory for little.
pub const APPEND_BYTES: usize = 1 << 20;
pub const APPEND_RECORDS: usize = 8192;

/// How much one append may carry. The store cuts an append into jobs of `job_records` /
/// `job_bytes` and refuses (or, under `block`, parks) one with more jobs than the stream holds, so
/// a batch is kept to half the stream's `max_jobs` and `max_bytes`. Past `bytes` it starts no new
/// job; it never holds more than twice `bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendLimits {
    pub job_records: usize,
    pub job_bytes: usize,
    pub jobs: usize,
    pub records: usize,
    pub bytes: usize,
}

impl Default for AppendLimits {
    fn default() -> Self {
        AppendLimits {
            job_records: 1000,
            job_bytes: 1 << 20,
            jobs: usize::MAX,
            records: APPEND_RECORDS,
            bytes: APPEND_BYTES,
        }
    }
}

impl AppendLimits {
    pub fn for_stream(s: &StreamConfig) -> AppendLimits {
        AppendLimits {
            job_records: (s.batch.max_records as usize).max(1),
            job_bytes: usize::try_from(s.batch.max_bytes)
                .unwrap_or(usize::MAX)
                .max(1),
            jobs: usize::try_from(s.max_jobs / 2).unwrap_or(usize::MAX).max(1),
            records: APPEND_RECORDS,
            bytes: APPEND_BYTES.min(usize::try_from(s.max_bytes / 4).unwrap_or(usize::MAX)),
        }
    }

    /// The records and bytes one append may carry whole: the append's own limits, and no more
    /// jobs than the stream takes at once (for a producer without a checkpoint to cut at, such
    /// as the syslog, mqtt and opcua sources).
    #[cfg(any(feature = "syslog", feature = "mqtt", feature = "opcua"))]
    pub fn per_append(&self) -> (usize, usize) {
        (
            self.records
                .min(self.jobs.saturating_mul(self.job_records))
                .max(1),
            self.bytes
                .min(self.jobs.saturating_mul(self.job_bytes))
                .max(1),
        )
    }
}
