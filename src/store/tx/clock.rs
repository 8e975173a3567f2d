//! Jobs held for the clock (a `hold_until_clock_synced` stream's jobs appended while the wall clock
//! was unsynchronised, carrying a [`ClockStamp`]): once it is synchronised, each is written again
//! under its own key with its records' times corrected by the error the clock had when it was
//! appended, and without the stamp. Counted, not kept: how many records were corrected, left as
//! they were (their time is not colibri's clock's), or could not be (stamped in another boot,
//! whose time since boot says nothing now). What a record's time is belongs to the caller's
//! [`FixRecord`]; the agent runs this in chunks before it lets the stream be delivered.

use redb::ReadableTable;

use super::Tx;
use crate::store::error::StoreError;
use crate::store::format;
use crate::store::layout::Table;
use crate::timesync::Anchor;

/// A record with its time moved by `offset_ms`, given the job's creation time by the same clock;
/// `None` when the record's time is not colibri's clock's (left as it is).
pub type FixRecord = fn(record: &[u8], offset_ms: i64, created_ms: u64) -> Option<Vec<u8>>;

/// What one chunk of [`Tx::fix_clock`] did, in records (`jobs` rewritten).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClockFixed {
    pub jobs: u64,
    pub corrected: u64,
    pub kept: u64,
    pub unknown_boot: u64,
    /// More held jobs remain: run another chunk.
    pub more: bool,
}

impl Tx<'_> {
    /// Corrects up to `limit` of `stream`'s held jobs (ready, retry and dead) by `anchor`.
    pub fn fix_clock(
        &mut self,
        stream: &str,
        anchor: Anchor,
        fix: FixRecord,
        limit: usize,
    ) -> Result<ClockFixed, StoreError> {
        let mut done = ClockFixed::default();
        let mut sizes = Vec::new();
        let (txn, st) = self.txn_and_stream(stream)?;
        for (table, def) in [(Table::Ready, st.ready_def()), (Table::Dead, st.dead_def())] {
            let held = held(&txn.open_table(def)?, |k| k.value(), limit, &mut done)?;
            let mut t = txn.open_table(def)?;
            for (id, raw) in held {
                let value = corrected(&raw, anchor, fix, &mut done);
                t.insert(id, value.as_slice())?;
                sizes.push((table, format::size(&raw), format::size(&value)));
            }
        }
        let retry = st.retry_def();
        let held = held(&txn.open_table(retry)?, |k| k.value(), limit, &mut done)?;
        let mut t = txn.open_table(retry)?;
        for (key, raw) in held {
            let value = corrected(&raw, anchor, fix, &mut done);
            t.insert(key, value.as_slice())?;
            sizes.push((Table::Retry, format::size(&raw), format::size(&value)));
        }
        drop(t);
        for (table, old, new) in sizes {
            st.counters.remove_job(table, old);
            st.counters.add_job(table, new);
        }
        if done.jobs > 0 {
            self.dirty.insert(stream.to_string());
        }
        Ok(done)
    }
}

/// The held jobs of one table, up to what is left of `limit` (`done.more` when some remain). A
/// value that cannot be decoded is not held: it is quarantined when its turn comes.
fn held<K: redb::Key + 'static, O>(
    t: &impl ReadableTable<K, &'static [u8]>,
    key: impl Fn(&redb::AccessGuard<'_, K>) -> O,
    limit: usize,
    done: &mut ClockFixed,
) -> Result<Vec<(O, Vec<u8>)>, StoreError> {
    let mut out = Vec::new();
    for e in t.iter()? {
        let (k, v) = e?;
        if !format::held_for_clock(v.value()) {
            continue;
        }
        if done.jobs as usize + out.len() >= limit {
            done.more = true;
            break;
        }
        out.push((key(&k), v.value().to_vec()));
    }
    done.jobs += out.len() as u64;
    Ok(out)
}

/// `raw` without its clock stamp, its records corrected when its boot is `anchor`'s.
fn corrected(raw: &[u8], anchor: Anchor, fix: FixRecord, done: &mut ClockFixed) -> Vec<u8> {
    let Ok(d) = format::decode(raw) else {
        return raw.to_vec();
    };
    let meta = format::Meta::new(
        d.attempts,
        d.last_error.clone(),
        d.last_failed_ms,
        d.offset,
        d.origin.clone(),
    )
    .with_extras(None, d.window_ms);
    let records = u64::from(d.header.records);
    let offset = d
        .clock
        .and_then(|c| anchor.offset_ms(c, d.header.created_ms));
    let (Some(offset), Ok(recs), None) = (offset, d.area.to_records(), d.header.file_len) else {
        // Another boot's stamp (or a file job, whose file is not rewritten): sent as it is.
        done.unknown_boot += records;
        return format::reencode(&d, &meta);
    };
    let fixed: Vec<Vec<u8>> = recs
        .into_iter()
        .map(|r| match fix(&r, offset, d.header.created_ms) {
            Some(f) => {
                done.corrected += 1;
                f
            }
            None => {
                done.kept += 1;
                r
            }
        })
        .collect();
    let (plain, framing) = format::frame(&fixed);
    // Its own time corrected too: `ttl`, `max_age` and the lanes read it (a job stamped at 1970
    // would expire at once).
    let created = u64::try_from(
        i64::try_from(d.header.created_ms)
            .unwrap_or(i64::MAX)
            .saturating_add(offset),
    )
    .unwrap_or(0);
    // Compressed again when it was.
    format::encode_area(
        created,
        &meta,
        &plain,
        framing,
        d.header.records,
        d.area.codec,
    )
}
