//! File jobs in the store: the SPOOL table (which spooled file a job ships) and DISPOSE (files
//! whose jobs left, to delete or archive), appending a file job, marking a file for disposal in the
//! transaction that removes its job, and handing disposals out once that commits. The names and
//! the moves on disk are [`super::spool`]'s. Called by the writer (for `file_move` tasks) and
//! `colibri queue`.

use redb::ReadableTable;
use serde::Serialize;

use super::error::{AppendError, StoreError};
use super::format;
use super::job::fresh_meta;
use super::layout::{DISPOSE, SPOOL, Table};
use super::open::Store;
use super::spool;
use super::stream::WhenFull;
use super::tx::Tx;

/// What became of a spooled file. Variants are only ever appended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub(super) enum SpoolEntry {
    /// A job (ready, retry or dead) ships it.
    Queued { stream: String, job: u64 },
    /// Its job left the store: the file is to be deleted, or moved into `archive` (delivered).
    Dispose {
        name: Vec<u8>,
        archive: Option<Vec<u8>>,
    },
}

pub(super) fn spool_entry(bytes: &[u8]) -> Option<SpoolEntry> {
    postcard::from_bytes(bytes).ok()
}

pub(super) fn spool_bytes(e: &SpoolEntry) -> Vec<u8> {
    postcard::to_stdvec(e).expect("postcard encodes a plain enum into a Vec")
}

/// A file in the spool, to be queued as a file job ([`Tx::append_file`]).
#[derive(Debug, Clone)]
pub struct SpooledFile {
    /// Relative to the data directory.
    pub spool: Vec<u8>,
    pub name: Vec<u8>,
    pub len: u64,
    pub mtime_ms: u64,
    pub archive: Option<Vec<u8>>,
}

/// A spooled file whose job left the store, to delete or archive (see [`spool::dispose`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disposal {
    /// Relative to the data directory.
    pub spool: Vec<u8>,
    /// Its original name (kept when archived).
    pub name: Vec<u8>,
    /// Delivered, and to be moved into this directory; otherwise deleted.
    pub archive: Option<Vec<u8>>,
}

/// What `append_file` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileAppend {
    /// A new job ships the file.
    Queued { id: u64 },
    /// The file was known already (queued, or delivered and being disposed of): nothing added.
    Known,
}
impl Store {
    pub(super) fn pending_disposals(&self) -> Result<Vec<Disposal>, StoreError> {
        let rtx = self.db.begin_read()?;
        let t = match rtx.open_table(DISPOSE) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        let mut out = Vec::new();
        for e in t.iter()? {
            let (k, v) = e?;
            if let Some(SpoolEntry::Dispose { name, archive }) = spool_entry(v.value()) {
                out.push(Disposal {
                    spool: k.value().to_vec(),
                    name,
                    archive,
                });
            }
        }
        Ok(out)
    }

    /// Spooled files to delete or archive now: their jobs left the store in committed
    /// transactions. Once done on disk, [`Tx::forget_spool`] removes them from the DISPOSE table.
    pub fn take_disposals(&mut self) -> Vec<Disposal> {
        std::mem::take(&mut self.disposals)
    }

    /// Disposes of spooled files now and forgets them, for an operator's command on a stopped agent
    /// (a running agent's writer does this on its own thread). Returns how many were disposed of.
    pub fn dispose_now(&mut self) -> Result<usize, StoreError> {
        let mut done = Vec::new();
        for d in self.take_disposals() {
            match spool::dispose(&self.data_dir, &d) {
                Ok(()) => done.push(d.spool),
                Err(e) => tracing::error!(
                    file = %String::from_utf8_lossy(&d.spool),
                    error = %e,
                    "cannot dispose of a spooled file; tried again at the next start"
                ),
            }
        }
        if !done.is_empty() {
            let mut tx = self.transaction()?;
            tx.forget_spool(&done)?;
            tx.commit()?;
        }
        Ok(done.len())
    }

    /// Whether the store knows this spooled file (queued, or delivered and being disposed of).
    pub fn spool_known(&self, spool: &[u8]) -> Result<bool, StoreError> {
        let rtx = self.db.begin_read()?;
        for table in [SPOOL, DISPOSE] {
            match rtx.open_table(table) {
                Ok(t) if t.get(spool)?.is_some() => return Ok(true),
                Ok(_) | Err(redb::TableError::TableDoesNotExist(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(false)
    }
}

impl Tx<'_> {
    /// A job left the store (`delivered`: acknowledged; otherwise dropped, expired or purged). For
    /// a file job, its spooled file is marked for disposal in this transaction (archived when
    /// delivered and the task asked for it, deleted otherwise) and handed out once it commits.
    /// A file job moved to another stream under a new id (`on_max_age: stream:NAME`): its spool
    /// entry follows it, so a salvage or a check finds the file's job where it is now.
    pub(super) fn file_job_moved(
        &mut self,
        raw: &[u8],
        stream: &str,
        id: u64,
    ) -> Result<(), StoreError> {
        if format::header(raw).map_or(true, |h| h.file_len.is_none()) {
            return Ok(());
        }
        let Ok(format::FileRef::V1 { spool, .. }) = format::file_of(raw) else {
            return Ok(()); // quarantined when taken there; its file stays in the spool
        };
        let entry = SpoolEntry::Queued {
            stream: stream.to_string(),
            job: id,
        };
        self.txn
            .open_table(SPOOL)?
            .insert(spool.as_slice(), spool_bytes(&entry).as_slice())?;
        self.touched = true;
        Ok(())
    }

    pub(super) fn job_left(&mut self, raw: &[u8], delivered: bool) -> Result<(), StoreError> {
        if format::header(raw).map_or(true, |h| h.file_len.is_none()) {
            return Ok(());
        }
        let file = format::file_of(raw);
        let format::FileRef::V1 {
            spool,
            name,
            archive,
            ..
        } = match file {
            Ok(f) => f,
            Err(e) => {
                // Verified when taken; only a value that went bad since gets here. Its file stays
                // (an operator finds it in the spool directory).
                tracing::error!(error = %e, "a file job's reference cannot be read; its spooled file is left in place");
                return Ok(());
            }
        };
        let archive = if delivered { archive } else { None };
        let entry = SpoolEntry::Dispose {
            name: name.clone(),
            archive: archive.clone(),
        };
        let txn = &self.txn;
        txn.open_table(SPOOL)?.remove(spool.as_slice())?;
        txn.open_table(DISPOSE)?
            .insert(spool.as_slice(), spool_bytes(&entry).as_slice())?;
        self.touched = true;
        self.disposals.push(Disposal {
            spool,
            name,
            archive,
        });
        Ok(())
    }

    /// Appends a file job for a file already in the spool (`spool`: its path relative to the data
    /// directory; `len`: its size). Bounds count the file; `min_free` counts only the job's value, as
    /// the file is on the disk already. A stream that is full refuses it whatever its `when_full`,
    /// except that `drop_oldest` first makes room: the caller keeps the file (nothing is counted).
    /// A file the store knows already (a retry after a lost reply, or the recovery after a crash)
    /// adds nothing.
    pub fn append_file(
        &mut self,
        stream: &str,
        file: &SpooledFile,
        now_ms: u64,
    ) -> Result<FileAppend, AppendError> {
        let spool = file.spool.as_slice();
        let len = file.len;
        let st = self.stream(stream)?;
        let (max_bytes, when_full) = (st.cfg.max_bytes, st.cfg.when_full);
        let queued = {
            let t = self.txn.open_table(SPOOL)?;
            t.get(spool)?.is_some()
        };
        if queued {
            return Ok(FileAppend::Known);
        }
        let disposing = {
            let t = self.txn.open_table(DISPOSE)?;
            t.get(spool)?.map(|v| spool_entry(v.value()))
        };
        if let Some(entry) = disposing {
            if let Some(SpoolEntry::Dispose { name, archive }) = entry {
                // Delivered already and back on disk (a disposal lost to a crash): dispose again.
                // The entry is durable already, so this needs no commit of its own.
                self.rollback.store.disposals.push(Disposal {
                    spool: spool.to_vec(),
                    name,
                    archive,
                });
            }
            return Ok(FileAppend::Known);
        }
        let stored = format::FileRef::V1 {
            spool: file.spool.clone(),
            name: file.name.clone(),
            mtime_ms: file.mtime_ms,
            archive: file.archive.clone(),
        };
        let value = format::encode_file(now_ms, &fresh_meta(0, None), &stored, len);
        let bytes = format::stored_len(&value);
        let disk = value.len() as u64;
        let storage_max = self.rollback.store.storage.max_bytes;
        if bytes > max_bytes || bytes > storage_max {
            let (max, bound) = if bytes > max_bytes {
                (max_bytes, "the stream's max_bytes")
            } else {
                (storage_max, "storage.max_bytes")
            };
            return Err(AppendError::TooLarge {
                stream: stream.into(),
                size: bytes,
                max,
                why: format!(
                    "a file of {len} bytes can never fit in stream {stream:?} ({bound} is {max} bytes)"
                ),
            });
        }
        if let Some(reason) = self.full(stream, 1, bytes, disk)
            && (when_full != WhenFull::DropOldest
                || self.drop_oldest_until_fits(stream, 1, bytes, disk)? == 0
                || self.full(stream, 1, bytes, disk).is_some())
        {
            return Err(AppendError::Full {
                stream: stream.into(),
                reason,
            });
        }
        let (txn, st) = self.txn_and_stream(stream)?;
        let id = st.counters.next_id;
        txn.open_table(st.ready_def())?
            .insert(id, value.as_slice())?;
        let entry = SpoolEntry::Queued {
            stream: stream.to_string(),
            job: id,
        };
        txn.open_table(SPOOL)?
            .insert(spool, spool_bytes(&entry).as_slice())?;
        st.counters.next_id += 1;
        st.counters.add_job(Table::Ready, format::size(&value));
        st.counters.appended_jobs += 1;
        st.counters.appended_records += 1;
        self.dirty.insert(stream.into());
        self.fed.insert(stream.into());
        self.consume(disk);
        Ok(FileAppend::Queued { id })
    }

    /// Forgets spooled files that were disposed of on disk (see [`Store::take_disposals`]).
    pub fn forget_spool(&mut self, spools: &[Vec<u8>]) -> Result<(), StoreError> {
        let txn = &self.txn;
        let mut t = txn.open_table(DISPOSE)?;
        for key in spools {
            if t.remove(key.as_slice())?.is_some() {
                self.touched = true;
            }
        }
        Ok(())
    }
}

/// The value itself when it is a file job (whose file must be disposed of when it leaves).
pub(super) fn file_value(v: &[u8]) -> Option<Vec<u8>> {
    format::header(v)
        .is_ok_and(|h| h.file_len.is_some())
        .then(|| v.to_vec())
}
