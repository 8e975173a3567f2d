//! `file_move` with `to_stream`: each settled file is moved into the task's spool directory
//! (`data_dir/spool/<task>/`, under a unique name that still tells its original one) and queued as a
//! file job; the store ships it and, after delivery, deletes it or moves it to `archive`.
//!
//! On one filesystem the file is renamed into the spool first (fsync of both directories), then
//! queued: a crash in between leaves it only in the spool, and the next run's recovery queues it.
//! Across filesystems it is copied to `<name>.part` in the spool, fsync'd and renamed, queued, and
//! only then removed from `from`: a crash leaves it in `from`, or in both places with identical
//! content, and recovery sorts out which (a copy whose job never committed is removed; a source
//! whose copy was queued is removed). A stream that is full puts the file back (rename) or drops
//! the copy, so the file waits in `from`. A file larger than the stream can ever hold is not
//! touched: it stays in `from`, logged once in full and then hourly with a count (every run finds
//! it again), and counted as failed without failing the run. Called by `FileMove::run_blocking`.

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use super::{Candidate, FileMove, Step};
use crate::files::{copy_until_stopped, fsync_dir, place_numbered, rename_noreplace};
use crate::logging::summary;
use crate::store::writer::{SpooledFile, StoreHandle};
use crate::store::{AppendError, FileAppend, spool};

/// Room a file job's value takes beyond its file, at most (header, metadata, names).
const JOB_OVERHEAD: u64 = 1024;

/// How often a file that can never fit is logged again (with the count of runs that found it).
const NEVER_FITS_EVERY: std::time::Duration = std::time::Duration::from_secs(3600);

/// Where a shipping `file_move` puts its files.
#[derive(Debug, Clone)]
pub struct Ship {
    pub stream: String,
    /// `data_dir/spool/<task>` (absolute).
    pub spool_dir: PathBuf,
    /// The same, relative to the data directory: how the store names spooled files.
    pub spool_rel: PathBuf,
    /// After delivery, files are moved here; otherwise deleted.
    pub archive: Option<PathBuf>,
    /// `storage.min_free`: a copy from another filesystem never takes the disk below it.
    pub min_free: u64,
    /// The largest file the stream can ever hold (its `max_bytes`, or `storage.max_bytes`): a
    /// larger one is refused before it is touched.
    pub max_bytes: u64,
    /// The spool was checked against the store in this life of the process (see [`recover`]).
    pub recovered: Arc<AtomicBool>,
}

/// Spool directories a run is working in (this process is the only writer of its data_dir).
static BUSY: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

/// A run's hold on its spool directory: two runs of one task never overlap (the scheduler sees to
/// that) unless a reload removed the task and added it again while a run went on; the second must
/// then wait, or its recovery would take the first run's copy for a leftover.
pub struct Claim(PathBuf);

impl Drop for Claim {
    fn drop(&mut self) {
        BUSY.lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|p| p != &self.0);
    }
}

/// Claims `dir`, or `None` while another run holds it.
pub fn claim(dir: &Path) -> Option<Claim> {
    let mut busy = BUSY.lock().unwrap_or_else(|e| e.into_inner());
    if busy.iter().any(|p| p == dir) {
        return None;
    }
    busy.push(dir.to_path_buf());
    Some(Claim(dir.to_path_buf()))
}

fn ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Ship {
    fn key(&self, spooled: &OsStr) -> Vec<u8> {
        self.spool_rel
            .join(spooled)
            .into_os_string()
            .into_encoded_bytes()
    }

    fn queue(
        &self,
        store: &StoreHandle,
        spooled: &OsStr,
        name: &OsStr,
        len: u64,
        mtime: SystemTime,
    ) -> Result<FileAppend, AppendError> {
        let file = SpooledFile {
            spool: self.key(spooled),
            name: name.as_bytes().to_vec(),
            len,
            mtime_ms: ms(mtime),
            archive: self
                .archive
                .as_ref()
                .map(|a| a.as_os_str().as_bytes().to_vec()),
        };
        store.append_file_blocking(&self.stream, file)
    }
}

/// A file that can never fit its stream is found again by every run: an ERROR the first time,
/// then one line per [`NEVER_FITS_EVERY`] with how many runs found it meanwhile.
fn never_fits(src: &Path, len: u64, ship: &Ship) {
    let file = src.display().to_string();
    let key = format!("never fits {file}");
    let first = summary::first(&key, 1, NEVER_FITS_EVERY, || {
        let (file, stream) = (file.clone(), ship.stream.clone());
        move |n, _, window| {
            tracing::error!(
                file,
                stream,
                repeated = n,
                "a file too large for its stream stays where it is: found {n} more times in the last {}s",
                summary::secs(window)
            )
        }
    });
    if first {
        tracing::error!(
            file,
            stream = %ship.stream,
            bytes = len,
            max_bytes = ship.max_bytes,
            reason = format!(
                "{len} bytes can never fit in stream {:?} (max_bytes {})",
                ship.stream, ship.max_bytes
            ),
            "a file too large for its stream stays where it is"
        );
    }
}

/// True when `a` and `b` are the same content by size and mtime (a copy keeps the source's mtime).
fn same_file(a: &Path, b: &Path) -> bool {
    match (fs::metadata(a), fs::metadata(b)) {
        (Ok(x), Ok(y)) => {
            x.is_file()
                && y.is_file()
                && x.len() == y.len()
                && x.modified().ok() == y.modified().ok()
        }
        _ => false,
    }
}

/// Reconciles the spool with the store after a crash (once per life of the process, and after a
/// store error): an incomplete copy (`.part`) is removed; a spooled file the store does not know
/// is queued, unless its source is still in `from` (a copy whose job never committed: removed, the
/// source is shipped by the scan); a source left in `from` beside a queued copy is removed.
pub fn recover(
    m: &FileMove,
    ship: &Ship,
    store: &StoreHandle,
    stop: &AtomicBool,
) -> io::Result<u64> {
    fs::create_dir_all(&ship.spool_dir)?;
    let mut queued = 0;
    for entry in fs::read_dir(&ship.spool_dir)? {
        if stop.load(Ordering::Relaxed) {
            return Ok(queued);
        }
        let entry = entry?;
        let spooled = entry.file_name();
        let path = entry.path();
        if spooled.as_bytes().ends_with(spool::PART_SUFFIX.as_bytes()) {
            fs::remove_file(&path)?;
            continue;
        }
        let Some(name) = spool::original_name(&spooled) else {
            continue; // not one of ours
        };
        let source = m.from.join(name);
        let known = store
            .spool_known_blocking(&ship.key(&spooled))
            .map_err(|e| io::Error::other(format!("cannot ask the store: {e}")))?;
        if known {
            if same_file(&path, &source) {
                fs::remove_file(&source)?;
                fsync_dir(&m.from)?;
                tracing::info!(file = %source.display(), "recovered: removed the source of a file already queued");
            }
            continue;
        }
        if same_file(&path, &source) {
            fs::remove_file(&path)?;
            fsync_dir(&ship.spool_dir)?;
            continue;
        }
        let meta = fs::metadata(&path)?;
        match ship.queue(store, &spooled, name, meta.len(), meta.modified()?) {
            Ok(_) => {
                queued += 1;
                tracing::warn!(file = %path.display(), stream = %ship.stream, "recovered: a spooled file whose job was not committed before a crash is queued now");
            }
            // Full or failed: it stays in the spool and is tried again by the next recovery.
            Err(e) => {
                return Err(io::Error::other(format!(
                    "cannot queue {}: {e}",
                    path.display()
                )));
            }
        }
    }
    ship.recovered.store(true, Ordering::Relaxed);
    Ok(queued)
}

/// Spools one settled file and queues it.
pub fn ship_one(
    m: &FileMove,
    ship: &Ship,
    c: &Candidate,
    store: &StoreHandle,
    stop: &AtomicBool,
) -> io::Result<Step> {
    let src = m.from.join(&c.name);
    // The job's own value takes a few hundred bytes besides the file.
    if c.len.saturating_add(JOB_OVERHEAD) > ship.max_bytes {
        never_fits(&src, c.len, ship);
        return Ok(Step::NeverFits);
    }
    if !FileMove::unchanged(&src, c)? {
        return Ok(Step::Changed);
    }
    let spooled = spool::new_name(&c.name, ms(SystemTime::now()));
    let dst = ship.spool_dir.join(&spooled);
    // From the moment the file is in the spool, an error leaves it there unqueued: the next run's
    // recovery must look (it queues it, or removes a copy whose source is still in `from`).
    let rearm = |e: io::Error| {
        ship.recovered.store(false, Ordering::Relaxed);
        e
    };
    let copied = match rename_noreplace(&src, &dst) {
        Ok(()) => {
            fsync_dir(&ship.spool_dir).map_err(rearm)?;
            fsync_dir(&m.from).map_err(rearm)?;
            false
        }
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
            if let Some(free) = crate::files::free_bytes(&ship.spool_dir)
                && free.saturating_sub(c.len) < ship.min_free
            {
                return Ok(Step::NoRoom(format!(
                    "copying {} bytes would take the data directory's disk below storage.min_free",
                    c.len
                )));
            }
            let mut part = spooled.clone();
            part.push(spool::PART_SUFFIX);
            let part = ship.spool_dir.join(part);
            let copy = (|| {
                let mut input = fs::File::open(&src)?;
                let mut out = fs::File::create(&part)?;
                if !copy_until_stopped(&mut input, &mut out, stop)? {
                    return Ok(Some(Step::Stopped));
                }
                out.set_modified(c.mtime)?;
                out.sync_all()?;
                if !FileMove::unchanged(&src, c)? {
                    return Ok(Some(Step::Changed));
                }
                fs::rename(&part, &dst)?;
                fsync_dir(&ship.spool_dir).map_err(rearm)?;
                Ok(None)
            })();
            match copy {
                Ok(None) => true,
                Ok(Some(step)) => {
                    let _ = fs::remove_file(&part);
                    return Ok(step);
                }
                Err(e) => {
                    let _ = fs::remove_file(&part);
                    return Err(e);
                }
            }
        }
        Err(e) => return Err(e),
    };
    // Put back what cannot be queued: the file waits in `from` (a source still there after a
    // copy needs only the copy removed).
    let undo = || -> io::Result<()> {
        if copied {
            fs::remove_file(&dst)?;
            fsync_dir(&ship.spool_dir)
        } else {
            place_numbered(&m.from, &c.name, |back| rename_noreplace(&dst, back))?;
            fsync_dir(&m.from)?;
            fsync_dir(&ship.spool_dir)
        }
    };
    match ship.queue(store, &spooled, &c.name, c.len, c.mtime) {
        Ok(_) => {
            if copied {
                // Queued durably: only now does the source go (a failure leaves both copies:
                // recovery removes the source of a queued copy).
                fs::remove_file(&src).map_err(rearm)?;
                fsync_dir(&m.from).map_err(rearm)?;
            }
            Ok(Step::Moved(dst))
        }
        Err(AppendError::Full { reason, .. }) => {
            undo().map_err(rearm)?;
            Ok(Step::NoRoom(format!(
                "stream {:?} is full: {reason}",
                ship.stream
            )))
        }
        Err(AppendError::TooLarge { why, .. }) => {
            undo().map_err(rearm)?;
            Err(io::Error::other(why))
        }
        Err(e) => {
            // The outcome is unknown (a commit that failed may still be durable): the spooled file
            // stays, and the recovery at the next run finds out whether its job exists.
            ship.recovered.store(false, Ordering::Relaxed);
            Err(io::Error::other(format!(
                "cannot queue it ({e}); it is kept in {} and checked again at the next run",
                ship.spool_dir.display()
            )))
        }
    }
}
