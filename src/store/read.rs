//! What the store answers without changing the disk: counters, the jobs in flight, when the next
//! retry falls due, the oldest queued job, a peek at jobs for an operator, checkpoints, quarantine;
//! and giving a drained backlog's space back ([`Store::compact`]). Releasing a lease is here too:
//! it only changes memory. Called by the writer, delivery, `/metrics` and `colibri queue`.

use redb::{ReadableTable, ReadableTableMetadata};
use serde::Serialize;

use super::counters::Counters;
use super::error::StoreError;
use super::format;
use super::job::Lease;
use super::layout::{CHECKPOINTS, QUARANTINE};
use super::open::Store;
use super::stream::StreamConfig;

impl Store {
    /// Every stream, by name.
    pub fn streams(&self) -> impl Iterator<Item = (&StreamConfig, &Counters)> {
        self.streams.values().map(|s| (&s.cfg, &s.counters))
    }

    pub fn counters(&self, stream: &str) -> Option<&Counters> {
        self.streams.get(stream).map(|s| &s.counters)
    }

    /// Returns a taken job to the queue without an attempt (the link went down, shutdown).
    pub fn release(&mut self, lease: &Lease) {
        if lease.store != self.id {
            return;
        }
        if let Some(st) = self.streams.get_mut(&lease.stream) {
            st.in_flight.remove(&lease.id);
        }
    }

    /// Every job handed out and not yet settled, as (stream, id).
    pub fn in_flight_leases(&self) -> Vec<(String, u64)> {
        self.streams
            .iter()
            .flat_map(|(name, st)| st.in_flight.iter().map(move |id| (name.clone(), *id)))
            .collect()
    }

    /// Marks jobs as handed out (leases that outlived a previous `Store` of the same file).
    pub fn restore_in_flight(&mut self, leases: Vec<(String, u64)>) {
        for (stream, id) in leases {
            if let Some(st) = self.streams.get_mut(&stream) {
                st.in_flight.insert(id);
            }
        }
    }

    pub fn in_flight(&self, stream: &str) -> usize {
        self.streams.get(stream).map_or(0, |s| s.in_flight.len())
    }

    /// Bytes of job values in every stream.
    pub fn stored_bytes(&self) -> u64 {
        self.streams
            .values()
            .map(|s| s.counters.stored_bytes())
            .sum()
    }

    /// What counts against `storage.max_bytes`: the streams' bytes and the damaged store files
    /// kept beside this one when it was opened (an operator frees that part by removing them; the
    /// next open sees it: an append must not read the directory).
    pub fn budget_used(&self) -> u64 {
        self.stored_bytes() + self.aside_bytes
    }

    /// The damaged store files moved aside in this store's directory, oldest first (read from
    /// the directory: an operator may have removed some).
    pub fn aside_files(&self) -> Vec<super::aside::AsideFile> {
        super::aside::list(&self.data_dir)
    }

    /// The database file's size on disk.
    pub fn file_bytes(&self) -> u64 {
        std::fs::metadata(&self.path).map_or(0, |m| m.len())
    }

    /// When the earliest retry of a stream falls due, if it has any.
    pub fn next_retry_due(&self, stream: &str) -> Result<Option<u64>, StoreError> {
        let st = self
            .streams
            .get(stream)
            .ok_or_else(|| StoreError::UnknownStream(stream.into()))?;
        let rtx = self.db.begin_read()?;
        let Ok(t) = rtx.open_table(st.retry_def()) else {
            return Ok(None);
        };
        // Jobs being delivered are not due for anyone else: a worker must not wake for them (it
        // would find nothing to take and spin). At most `in_flight` entries are skipped.
        for e in t.iter()? {
            let (k, _) = e?;
            let (due, id) = k.value();
            if !st.in_flight.contains(&id) {
                return Ok(Some(due));
            }
        }
        Ok(None)
    }

    /// Per stream of `names` (none for one unknown or unreadable), the creation time of the job
    /// at the head of its ready queue (the next one delivered, or in flight): the oldest ready
    /// job, since ids follow creation and a replayed dead letter keeps its id. One lookup per
    /// stream in one read transaction, cheap enough for every metrics scrape, where
    /// [`Store::oldest_ms`] walks the retry table too.
    pub fn ready_heads<'n>(
        &self,
        names: impl Iterator<Item = &'n str>,
    ) -> Result<Vec<Option<u64>>, StoreError> {
        let rtx = self.db.begin_read()?;
        Ok(names
            .map(|name| {
                let st = self.streams.get(name)?;
                ready_head(&rtx, st).ok().flatten()
            })
            .collect())
    }

    /// Oldest creation time among a stream's queued (ready or retry) jobs.
    pub fn oldest_ms(&self, stream: &str) -> Result<Option<u64>, StoreError> {
        let st = self
            .streams
            .get(stream)
            .ok_or_else(|| StoreError::UnknownStream(stream.into()))?;
        let rtx = self.db.begin_read()?;
        let mut oldest = ready_head(&rtx, st)?;
        if let Ok(t) = rtx.open_table(st.retry_def()) {
            for entry in t.iter()? {
                let (_, v) = entry?;
                if let Ok(h) = format::header(v.value()) {
                    oldest = Some(oldest.map_or(h.created_ms, |o| o.min(h.created_ms)));
                }
            }
        }
        Ok(oldest)
    }

    /// A page of a stream's dead letters in id order, after `after` (from the first without
    /// it): at most `n` jobs and, past the first, at most `max_raw` bytes of records (a page is
    /// decoded whole, by the store writer when the agent asks). Returns the jobs and, when more
    /// follow, the id to ask after next.
    pub fn dead_letters(
        &self,
        stream: &str,
        after: Option<u64>,
        n: usize,
        max_raw: u64,
    ) -> Result<DeadPage, StoreError> {
        let st = self
            .streams
            .get(stream)
            .ok_or_else(|| StoreError::UnknownStream(stream.into()))?;
        let from = match after {
            None => 0,
            Some(a) => match a.checked_add(1) {
                Some(f) => f,
                None => return Ok(DeadPage::default()),
            },
        };
        let rtx = self.db.begin_read()?;
        let mut out: Vec<Peeked> = Vec::new();
        let mut raw = 0u64;
        if let Ok(t) = rtx.open_table(st.dead_def()) {
            for e in t.range(from..)? {
                let (k, v) = e?;
                let size = format::size(v.value()).raw;
                if let Some(last) = out.last().map(|j| j.id)
                    && (out.len() >= n || raw.saturating_add(size) > max_raw)
                {
                    return Ok(DeadPage {
                        jobs: out,
                        next: Some(last),
                    });
                }
                raw = raw.saturating_add(size);
                out.push(Peeked::from_bytes("dead", k.value(), None, v.value()));
            }
        }
        Ok(DeadPage {
            jobs: out,
            next: None,
        })
    }

    /// Up to `n` jobs of a stream without taking them: ready then retry, or the dead letters.
    pub fn peek(&self, stream: &str, dead: bool, n: usize) -> Result<Vec<Peeked>, StoreError> {
        let mut out = Vec::new();
        self.peek_each(stream, dead, n, |job| {
            out.push(job);
            Ok::<_, StoreError>(())
        })?;
        Ok(out)
    }

    /// As [`Self::peek`], each job handed to `each` as it is read and decoded: an operator's
    /// `peek --all` of a large backlog holds one decoded job at a time, not the whole backlog
    /// (half a million compressible records are 500 MB decoded in a 4 MB store). An error of
    /// `each` ends the walk and is returned.
    pub fn peek_each<E: From<StoreError>>(
        &self,
        stream: &str,
        dead: bool,
        n: usize,
        mut each: impl FnMut(Peeked) -> Result<(), E>,
    ) -> Result<(), E> {
        let st = self
            .streams
            .get(stream)
            .ok_or_else(|| StoreError::UnknownStream(stream.into()))?;
        let rtx = self.db.begin_read()?;
        let mut left = n;
        if dead {
            if let Ok(t) = rtx.open_table(st.dead_def()) {
                for e in t.iter().map_err(StoreError::from)?.take(left) {
                    let (k, v) = e.map_err(StoreError::from)?;
                    each(Peeked::from_bytes("dead", k.value(), None, v.value()))?;
                }
            }
            return Ok(());
        }
        if let Ok(t) = rtx.open_table(st.ready_def()) {
            for e in t.iter().map_err(StoreError::from)?.take(left) {
                let (k, v) = e.map_err(StoreError::from)?;
                each(Peeked::from_bytes("ready", k.value(), None, v.value()))?;
                left -= 1;
            }
        }
        if let Ok(t) = rtx.open_table(st.retry_def()) {
            for e in t.iter().map_err(StoreError::from)?.take(left) {
                let (k, v) = e.map_err(StoreError::from)?;
                let (due, id) = k.value();
                each(Peeked::from_bytes("retry", id, Some(due), v.value()))?;
            }
        }
        Ok(())
    }

    /// Reclaims the space a drained backlog left in the file. redb needs no live transaction for
    /// this; the store's owner calls it when idle. Returns the bytes given back.
    pub fn compact(&mut self) -> Result<u64, StoreError> {
        let before = self.file_bytes();
        while self.db.rw()?.compact()? {}
        Ok(before.saturating_sub(self.file_bytes()))
    }

    /// Space compaction could give back, estimated from redb's own statistics.
    pub fn reclaimable_bytes(&mut self) -> Result<u64, StoreError> {
        // Pages the last transactions freed (a drain's acknowledgements) are released by the
        // commits after them: two empty ones (redb also trims free pages off the file's end).
        // Called once per drain, when the store is idle.
        for _ in 0..2 {
            self.begin_write()?.0.commit()?;
        }
        let txn = self.db.rw()?.begin_write()?;
        let stats = txn.stats()?;
        let fragmented = stats.fragmented_bytes();
        txn.abort()?;
        Ok(fragmented.min(self.file_bytes()))
    }

    /// Saves a source's checkpoint outside any append (appends can carry one too).
    pub fn checkpoint(&self, source: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let rtx = self.db.begin_read()?;
        let t = match rtx.open_table(CHECKPOINTS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        Ok(t.get(source)?.map(|v| v.value().to_vec()))
    }

    /// Entries in quarantine.
    pub fn quarantined(&self) -> Result<u64, StoreError> {
        let rtx = self.db.begin_read()?;
        match rtx.open_table(QUARANTINE) {
            Ok(t) => Ok(t.len()?),
            Err(redb::TableError::TableDoesNotExist(_)) => Ok(0),
            Err(e) => Err(e.into()),
        }
    }
}

/// A job as shown to an operator.
#[derive(Debug, Clone, Serialize)]
pub struct Peeked {
    pub table: &'static str,
    pub id: u64,
    pub retry_due_ms: Option<u64>,
    pub created_ms: u64,
    pub attempts: u32,
    pub last_error: Option<String>,
    pub last_failed_ms: u64,
    /// Records of the original job settled and cut from its front before.
    pub offset: u32,
    /// For a salvaged job: the store and id it had before the damage; for a moved one, also the
    /// stream it was moved from.
    pub origin: Option<format::Origin>,
    pub bytes: u64,
    /// What it would take uncompressed (`bytes` when it is stored as it is).
    pub raw_bytes: u64,
    /// Records as text (lossy UTF-8), or the reason the job cannot be decoded.
    pub records: Result<Vec<String>, String>,
}

/// A page of dead letters, and the id to ask after next when more follow.
#[derive(Debug, Default)]
pub struct DeadPage {
    pub jobs: Vec<Peeked>,
    pub next: Option<u64>,
}

/// Creation time of the job at the head of a stream's ready queue, in `rtx`.
fn ready_head(
    rtx: &redb::ReadTransaction,
    st: &super::stream::StreamState,
) -> Result<Option<u64>, StoreError> {
    let Ok(t) = rtx.open_table(st.ready_def()) else {
        return Ok(None);
    };
    Ok(t.first()?
        .and_then(|(_, v)| format::header(v.value()).ok())
        .map(|h| h.created_ms))
}

impl Peeked {
    /// The job as plain data for scripts, the same from the store and through the agent: its
    /// records a list of strings, or (for a job whose bytes cannot be decoded) `records: null`
    /// and the reason in `decode_error`. `last_error` is the delivery failure, a different thing.
    pub fn to_json(&self) -> serde_json::Value {
        let (records, decode_error) = match &self.records {
            Ok(r) => (serde_json::json!(r), serde_json::Value::Null),
            Err(e) => (serde_json::Value::Null, serde_json::json!(e)),
        };
        serde_json::json!({
            "table": self.table,
            "id": self.id,
            "created_ms": self.created_ms,
            "retry_due_ms": self.retry_due_ms,
            "attempts": self.attempts,
            "last_error": self.last_error,
            "last_failed_ms": self.last_failed_ms,
            "offset": self.offset,
            "salvaged_from": self.origin.as_ref().filter(|o| o.stream.is_none()).map(|o| serde_json::json!({
                "store_id": format!("{:016x}", o.store),
                "job": o.job,
            })),
            "moved_from": self.origin.as_ref().and_then(|o| Some(serde_json::json!({
                "stream": o.stream.as_ref()?,
                "store_id": format!("{:016x}", o.store),
                "job": o.job,
            }))),
            "bytes": self.bytes,
            "records": records,
            "decode_error": decode_error,
        })
    }

    pub(super) fn from_bytes(table: &'static str, id: u64, due: Option<u64>, v: &[u8]) -> Peeked {
        match format::decode(v) {
            Ok(d) => Peeked {
                table,
                id,
                retry_due_ms: due,
                created_ms: d.header.created_ms,
                attempts: d.attempts,
                last_error: d.last_error,
                last_failed_ms: d.last_failed_ms,
                offset: d.offset,
                origin: d.origin,
                bytes: format::stored_len(v),
                raw_bytes: format::size(v).raw,
                records: match d.header.file_len {
                    // A file job: what it ships, readably.
                    Some(len) => Ok(vec![match format::file_of(v) {
                        Ok(format::FileRef::V1 { spool, name, .. }) => format!(
                            "file {:?} ({len} bytes), spooled as {}",
                            String::from_utf8_lossy(&name),
                            String::from_utf8_lossy(&spool)
                        ),
                        Err(e) => e.to_string(),
                    }]),
                    None => d
                        .area
                        .to_records()
                        .map(|recs| {
                            recs.iter()
                                .map(|r| String::from_utf8_lossy(r).into_owned())
                                .collect()
                        })
                        .map_err(|e| e.to_string()),
                },
            },
            Err(e) => Peeked {
                table,
                id,
                retry_due_ms: due,
                created_ms: 0,
                attempts: 0,
                last_error: None,
                last_failed_ms: 0,
                offset: 0,
                origin: None,
                bytes: v.len() as u64,
                raw_bytes: v.len() as u64,
                records: Err(e.to_string()),
            },
        }
    }
}
