//! `when_full: downsample`: a full stream of metric records makes room by replacing its oldest
//! jobs with aggregates per series and window (`scrape::downsample`), coarser as it stays full,
//! so it holds a whole outage at decreasing resolution instead of its most recent part.
//!
//! The ready queue keeps one order: the coarsest aggregates first, then each finer window, then
//! the raw jobs (aggregates always replace the oldest jobs of their level, under the smallest ids
//! of what they replace). The stream's `max_bytes` is shared evenly by the raw jobs and each
//! window of the ladder: a round takes the finest level over its share (or, when none is, the
//! finest that has jobs), reads its oldest jobs until half its share is left, and aggregates them
//! into the next window together with the newest job already there (a window split between two
//! rounds is merged, so each window is written once). What is left when the coarsest window is
//! over its share, `append` drops as `drop_oldest` does.
//!
//! All in the appending transaction: a crash keeps either the jobs or their aggregates. An
//! aggregate job's idempotency key is derived from the keys of the jobs it replaced and its window
//! (its `origin`), so a rewrite done again after a crash sends the same window under the same key.
//! Counted: records replaced (`downsampled_in_records`) and aggregates written
//! (`downsampled_out_records`), terms of the identity. Called by `append` (`make_room`).

use redb::ReadableTable;

use super::Tx;
use crate::scrape::downsample::Aggregator;
use crate::store::error::StoreError;
use crate::store::format::{self, Codec, Meta, StoreJob};
use crate::store::layout::Table;
use crate::store::stream::{AtRest, Downsample};

/// Rounds one append may run before it falls back to dropping the oldest.
const ROUNDS: usize = 16;
/// Bytes of jobs one round reads at most (they are held in memory with their records).
const ROUND_BYTES: u64 = 8 << 20;

/// A job of the ready queue as the survey sees it.
#[derive(Debug, Clone, Copy)]
struct Seen {
    id: u64,
    level: usize,
    bytes: u64,
    busy: bool,
}

impl Tx<'_> {
    /// Replaces `stream`'s oldest jobs by aggregates until `jobs` more jobs and `bytes` more
    /// bytes fit, or nothing more can be aggregated.
    pub(in crate::store) fn downsample_until_fits(
        &mut self,
        stream: &str,
        jobs: u64,
        bytes: u64,
    ) -> Result<(), StoreError> {
        for _ in 0..ROUNDS {
            if self.full(stream, jobs, bytes, bytes).is_none() || !self.downsample_round(stream)? {
                break;
            }
        }
        Ok(())
    }

    /// One round; whether it replaced anything.
    fn downsample_round(&mut self, stream: &str) -> Result<bool, StoreError> {
        let Some(ds) = self.stream(stream)?.cfg.downsample.clone() else {
            return Ok(false);
        };
        let queue = self.survey(stream, &ds)?;
        let Some((level, take)) = choose(&queue, &ds, self.stream(stream)?.cfg.max_bytes) else {
            return Ok(false);
        };
        // The newest aggregate of the next window, merged so no window is written twice; while it
        // is in flight, nothing is aggregated into its level (the oldest are dropped instead).
        let tail = queue.iter().rev().find(|s| s.level == level + 1);
        if tail.is_some_and(|s| s.busy) {
            return Ok(false);
        }
        let tail = tail.map(|s| s.id);
        let inputs: Vec<u64> = tail.into_iter().chain(take).collect();
        self.aggregate(stream, &ds, level + 1, &inputs)
    }

    /// The ready queue in order: each job's level (0 raw, n the ladder's n-th window), size and
    /// whether it is in flight. Reads the metadata of the aggregates and of the raw jobs up to
    /// [`ROUND_BYTES`] (a round takes no more), not the rest.
    fn survey(&mut self, stream: &str, ds: &Downsample) -> Result<Vec<Seen>, StoreError> {
        let (txn, st) = self.txn_and_stream(stream)?;
        let ready = txn.open_table(st.ready_def())?;
        let mut seen = Vec::new();
        let mut raw = 0u64;
        for e in ready.iter()? {
            let (k, v) = e?;
            let (id, v) = (k.value(), v.value());
            let window = format::window_ms(v);
            let level = ds
                .windows
                .iter()
                .take_while(|w| w.as_millis() <= u128::from(window) && window > 0)
                .count();
            let bytes = v.len() as u64;
            if level == 0 {
                if raw >= ROUND_BYTES {
                    break;
                }
                raw += bytes;
            }
            seen.push(Seen {
                id,
                level,
                bytes,
                busy: st.in_flight.contains(&id),
            });
        }
        // The raw jobs not read: their bytes count for the raw level all the same.
        let counted: u64 = seen.iter().map(|s| s.bytes).sum();
        if let Some(rest) = st.counters.ready_bytes.checked_sub(counted)
            && rest > 0
        {
            seen.push(Seen {
                id: u64::MAX,
                level: 0,
                bytes: rest,
                busy: true,
            });
        }
        Ok(seen)
    }

    /// Replaces the jobs `inputs` (ids, in queue order: the next window's newest job first when
    /// merged) by aggregates of window `level`, under the smallest of their ids.
    fn aggregate(
        &mut self,
        stream: &str,
        ds: &Downsample,
        level: usize,
        inputs: &[u64],
    ) -> Result<bool, StoreError> {
        let store_id = self.rollback.store.id;
        let window_ms = u64::try_from(ds.windows[level - 1].as_millis()).unwrap_or(u64::MAX);
        let (txn, st) = self.txn_and_stream(stream)?;
        let mut ready = txn.open_table(st.ready_def())?;
        let mut agg = Aggregator::new(ds.ticks(level), ds.keep);
        let (mut used, mut gone, mut records_in) = (Vec::new(), Vec::new(), 0u64);
        let mut key = Vec::new();
        let (mut created, mut same_window) = (u64::MAX, false);
        for &id in inputs {
            let Some(v) = ready.get(id)? else { continue };
            let raw = v.value().to_vec();
            drop(v);
            // A damaged job stays where it is, to be quarantined when its turn comes (a file job
            // too: it is no metric).
            let Ok(d) = format::decode(&raw) else {
                continue;
            };
            let (Ok(recs), None) = (d.area.to_records(), d.header.file_len) else {
                continue;
            };
            // Held for the clock: its times are corrected first (`tx::clock`), then it is a job
            // like any other.
            if d.clock.is_some() {
                continue;
            }
            let window = format::window_ms(&raw);
            same_window |= window == window_ms;
            let aggregates = window > 0;
            for r in &recs {
                if aggregates {
                    agg.add_aggregate(r);
                } else {
                    agg.add_raw(r);
                }
            }
            let (o_store, o_job) = d
                .origin
                .as_ref()
                .map_or((store_id, id), |o| (o.store, o.job));
            key.extend_from_slice(format!("{o_store:x}:{o_job};").as_bytes());
            created = created.min(d.header.created_ms);
            records_in += u64::from(d.header.records);
            gone.push(format::size(&raw));
            used.push(id);
        }
        // Only the next window's own newest job: nothing to aggregate.
        if used.is_empty() || (used.len() == 1 && same_window) {
            return Ok(false);
        }
        let lines = agg.finish();
        let parts = cut(
            &lines,
            st.cfg.batch.max_records,
            st.cfg.batch.max_bytes,
            used.len(),
        );
        let codec = match st.cfg.compression {
            AtRest::Plain => Codec::None,
            AtRest::Waiting | AtRest::Always => Codec::Zstd,
        };
        for id in &used {
            ready.remove(*id)?;
        }
        let mut made = Vec::new();
        let mut records_out = 0u64;
        let mut ids = used.clone();
        ids.sort_unstable();
        key.extend_from_slice(format!("w{window_ms}").as_bytes());
        for (i, part) in parts.iter().enumerate() {
            let mut k = key.clone();
            k.extend_from_slice(format!("#{i}").as_bytes());
            let origin = StoreJob {
                store: store_id,
                job: (1 << 63) | (crate::files::fnv1a(&k) >> 1),
            };
            let (plain, framing) = format::frame(part);
            let n = u32::try_from(part.len()).expect("a part holds at most a batch of records");
            let value = format::encode_area(
                created,
                &Meta::aggregate(origin, window_ms),
                &plain,
                framing,
                n,
                codec,
            );
            ready.insert(ids[i], value.as_slice())?;
            records_out += u64::from(n);
            made.push(format::size(&value));
        }
        drop(ready);
        for size in gone {
            st.counters.remove_job(Table::Ready, size);
        }
        for size in made {
            st.counters.add_job(Table::Ready, size);
        }
        st.counters.downsampled_in_records += records_in;
        st.counters.downsampled_out_records += records_out;
        self.dirty.insert(stream.to_string());
        Ok(true)
    }
}

/// The level to aggregate and its oldest jobs to take: the coarsest level over its share of
/// `max_bytes` below the coarsest window (or the finest with jobs, when none is); its jobs from
/// the oldest until half its share would be left, stopping at one in flight.
fn choose(queue: &[Seen], ds: &Downsample, max_bytes: u64) -> Option<(usize, Vec<u64>)> {
    let levels = ds.windows.len();
    let share = max_bytes / (levels as u64 + 1);
    let bytes = |l: usize| -> u64 { queue.iter().filter(|s| s.level == l).map(|s| s.bytes).sum() };
    let takes = |l: usize| {
        queue
            .iter()
            .filter(|s| s.level == l && !s.busy)
            .nth(1)
            .is_some()
    };
    let level = (0..levels)
        .rev()
        .find(|&l| bytes(l) > share && takes(l))
        .or_else(|| (0..levels).find(|&l| takes(l)))?;
    let over = bytes(level).saturating_sub(share / 2).max(1);
    // Never the level's newest job: the window it ends with may still grow (from the finer
    // level's next round, or the next append), and a window is written at one level only.
    let region: Vec<&Seen> = queue.iter().filter(|s| s.level == level).collect();
    let (mut take, mut sum) = (Vec::new(), 0u64);
    for s in region.iter().take(region.len().saturating_sub(1)) {
        if s.busy || sum >= over.min(ROUND_BYTES) {
            break;
        }
        sum += s.bytes;
        take.push(s.id);
    }
    (!take.is_empty()).then_some((level, take))
}

/// The aggregate lines (with their window's start) cut into jobs of at most `max_records` and
/// `max_bytes`, only between two windows (a window in two jobs would be two points when the first
/// is no longer the level's newest), at most `jobs` of them (the last takes the rest: aggregates
/// are never more than what they replace, so that is only ever a little).
fn cut(lines: &[(i64, Vec<u8>)], max_records: u32, max_bytes: u64, jobs: usize) -> Vec<Vec<&[u8]>> {
    let mut parts: Vec<Vec<&[u8]>> = vec![Vec::new()];
    let mut bytes = 0u64;
    let mut window = None;
    for (w, l) in lines {
        let last = parts.last_mut().expect("starts with one");
        let full =
            last.len() as u64 >= u64::from(max_records) || bytes + l.len() as u64 + 1 > max_bytes;
        let new_window = window != Some(*w);
        window = Some(*w);
        if full && new_window && !last.is_empty() && parts.len() < jobs.max(1) {
            parts.push(Vec::new());
            bytes = 0;
        }
        parts.last_mut().expect("one at least").push(l);
        bytes += l.len() as u64 + 1;
    }
    parts.retain(|p| !p.is_empty());
    parts
}

#[cfg(test)]
mod tests {
    use super::cut;

    /// Jobs are cut between windows only: a window's points stay in one job.
    #[test]
    fn a_window_is_never_cut_in_two() {
        let lines: Vec<(i64, Vec<u8>)> = [0, 0, 0, 60, 60, 120]
            .iter()
            .map(|w| (*w, format!("m v=1 {w}").into_bytes()))
            .collect();
        let sizes = |parts: Vec<Vec<&[u8]>>| parts.iter().map(Vec::len).collect::<Vec<_>>();
        assert_eq!(sizes(cut(&lines, 2, 1 << 20, 10)), [3, 2, 1]);
        assert_eq!(
            sizes(cut(&lines, 2, 1 << 20, 2)),
            [3, 3],
            "never more than the jobs replaced"
        );
        assert_eq!(sizes(cut(&lines, 100, 1 << 20, 10)), [6]);
    }
}
