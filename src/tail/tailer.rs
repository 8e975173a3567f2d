//! The synchronous core of one tail source: which files it follows (glob scans, identities,
//! rotation, truncation, copies), reading them in large chunks into a [`Batch`] of records, and the
//! checkpoint that describes exactly what the records cover. It does blocking file I/O and is run
//! on tokio's blocking pool by the driver in `mod.rs`, which owns timing, inotify and the store.
//!
//! A followed file is, at any moment, one of:
//! - **active**: matched by `paths` (and not `exclude`) at the last scan;
//! - **rotated**: no longer matched (renamed away or deleted): read to its end, then released
//!   after `rotate_wait` without new data (its last line is emitted even without a newline);
//! - **held**: a new file whose first 256 bytes equal those of an active file, i.e. probably a
//!   copy of it (copy-truncate rotation). It is not read until the original is truncated (then it
//!   is read from where the original was, if it holds the same bytes there) or `rotate_wait`
//!   passes (then a copy that holds the bytes the original was read to is read from there, and
//!   anything else, e.g. a new file with the same banner, is read whole; never from its own end).

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::fs::{File, Metadata};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use super::checkpoint::{self, Checkpoint, Entry};
use super::lines::{self, Assembler, Group};
use super::record::{self, FP_BYTES, hash};
use super::watch::{self, Event, Watcher};
use super::{StartAt, TailConfig, TailStats};

/// An append starts no new job past this many bytes (and holds at most twice as many): whole
/// jobs of the stream's `batch` size where they are smaller, otherwise about this much. Larger
/// appends gain nothing (the commit's fsync is already a small part) and cost memory.
pub const APPEND_BYTES: usize = 256 << 10;
pub const APPEND_RECORDS: usize = 8192;
/// How `paths` patterns match: `*` stops at `/`, `**` crosses it.
const GLOB: glob::MatchOptions = glob::MatchOptions {
    case_sensitive: true,
    require_literal_separator: true,
    require_literal_leading_dot: false,
};
/// Smallest read.
const MIN_CHUNK: usize = 256 << 10;
/// Entries of a directory looked at when searching it for a renamed file or a copy.
const DIR_SEARCH_LIMIT: usize = 10_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Identity {
    pub dev: u64,
    pub ino: u64,
}

impl Identity {
    pub fn of(m: &Metadata) -> Identity {
        Identity {
            dev: m.dev(),
            ino: m.ino(),
        }
    }
}

/// What one source needs at run time besides its config.
#[derive(Debug, Clone)]
pub struct Settings {
    pub cfg: Arc<TailConfig>,
    /// `,"host":...,"labels":{...}`.
    pub extra: String,
    /// Bytes read at once (past the 256 bytes of context before the position).
    pub chunk: usize,
    /// Largest record the stream can hold.
    pub record_limit: usize,
}

impl Settings {
    pub fn new(cfg: Arc<TailConfig>, host: Option<&str>, stream_max_bytes: u64) -> Settings {
        let extra = record::extra_fields(host, &cfg.labels);
        let chunk = MIN_CHUNK.max(2 * cfg.max_line_bytes + 2);
        let record_limit = usize::try_from(stream_max_bytes.saturating_sub(256))
            .unwrap_or(usize::MAX)
            .max(64);
        Settings {
            cfg,
            extra,
            chunk,
            record_limit,
        }
    }
}

/// How much one append may carry. The store cuts an append into jobs of `job_records` /
/// `job_bytes` and refuses (or, under `block`, parks) one with more jobs than the stream holds, so
/// a batch is kept to half the stream's `max_jobs` and `max_bytes`. Past `bytes` it starts no new
/// job; it never holds more than twice `bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub job_records: usize,
    pub job_bytes: usize,
    pub jobs: usize,
    pub records: usize,
    pub bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            job_records: 1000,
            job_bytes: 1 << 20,
            jobs: usize::MAX,
            records: APPEND_RECORDS,
            bytes: APPEND_BYTES,
        }
    }
}

impl Limits {
    pub fn for_stream(s: &crate::store::StreamConfig) -> Limits {
        Limits {
            job_records: (s.batch.max_records as usize).max(1),
            job_bytes: usize::try_from(s.batch.max_bytes)
                .unwrap_or(usize::MAX)
                .max(1),
            jobs: usize::try_from(s.max_jobs / 2).unwrap_or(usize::MAX).max(1),
            records: APPEND_RECORDS,
            bytes: APPEND_BYTES.min(usize::try_from(s.max_bytes / 4).unwrap_or(usize::MAX)),
        }
    }
}

/// Records read and not yet appended, with the checkpoint that covers them.
#[derive(Debug, Default)]
pub struct Batch {
    pub records: Vec<Vec<u8>>,
    /// Record bytes plus their framing in a job.
    pub bytes: usize,
    /// The state after the last record (set whenever it changed since the last append).
    pub checkpoint: Option<Vec<u8>>,
    /// When the oldest thing in the batch (a record or a checkpoint change) arrived.
    pub since: Option<Instant>,
    limits: Limits,
    /// Jobs the store will cut the records into, and the last one's records and bytes.
    jobs: usize,
    job_records: usize,
    job_bytes: usize,
    /// A record did not fit.
    refused: bool,
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

    /// Whether a record of `len` bytes starts a new job (the store's cut, see `Store::append`).
    fn opens_job(&self, len: usize) -> bool {
        self.jobs == 0
            || self.job_records >= self.limits.job_records
            || self.job_bytes + len > self.limits.job_bytes
    }

    /// Whether records of these sizes fit (a first record always does). A refusal makes the batch
    /// full.
    pub fn fits(&mut self, lens: &[usize]) -> bool {
        let fits = self.would_fit(lens);
        self.refused |= !fits;
        fits
    }

    fn would_fit(&self, lens: &[usize]) -> bool {
        let (mut n, mut bytes, mut jobs, mut jr, mut jb) = (
            self.records.len(),
            self.bytes,
            self.jobs,
            self.job_records,
            self.job_bytes,
        );
        for &len in lens {
            if n > 0 {
                let opens =
                    jobs == 0 || jr >= self.limits.job_records || jb + len > self.limits.job_bytes;
                if n >= self.limits.records
                    || bytes + len + 4 > 2 * self.limits.bytes
                    || (opens && (jobs >= self.limits.jobs || bytes >= self.limits.bytes))
                {
                    return false;
                }
            }
            if jobs == 0 || jr >= self.limits.job_records || jb + len > self.limits.job_bytes {
                jobs += 1;
                jr = 0;
                jb = 0;
            }
            jr += 1;
            jb += len;
            n += 1;
            bytes += len + 4;
        }
        true
    }

    pub fn push(&mut self, rec: Vec<u8>, now: Instant) {
        let len = rec.len();
        if self.opens_job(len) {
            self.jobs += 1;
            self.job_records = 0;
            self.job_bytes = 0;
        }
        self.job_records += 1;
        self.job_bytes += len;
        self.bytes += len + 4;
        self.records.push(rec);
        self.since.get_or_insert(now);
    }

    /// No room for more (a hint between reads: records are checked one by one with `fits`).
    pub fn is_full(&self) -> bool {
        self.refused
            || self.records.len() >= self.limits.records
            || self.bytes >= 2 * self.limits.bytes
            || (self.jobs >= self.limits.jobs && self.job_records >= self.limits.job_records)
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty() && self.checkpoint.is_none()
    }
}

/// What happened since the last step, for the tailer to act on.
#[derive(Debug, Default)]
pub struct StepInput {
    pub events: Vec<Event>,
    /// Expand the globs again.
    pub rescan: bool,
    /// Look at every file (polling, or a periodic safety check).
    pub check_all: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Found by a scan, not read yet: classified (active or held) at its first read.
    New {
        since: Instant,
    },
    Active,
    Rotated,
    Held {
        of: Identity,
        since: Instant,
        /// Its size when held (or last seen growing): a copy still being written is held on.
        size: u64,
    },
}

impl Role {
    /// Not read, and not in the checkpoint.
    fn waits(self) -> bool {
        matches!(self, Role::New { .. } | Role::Held { .. })
    }
}

struct Tracked {
    id: Identity,
    /// The path it had when first seen: records carry it.
    path: PathBuf,
    path_json: String,
    file: File,
    /// The file's first (up to 256) bytes as last seen: its fingerprint, and what a new file is
    /// compared with to tell a copy.
    head: Vec<u8>,
    /// The next byte to read: the start of a line (or a point inside a long line being skipped).
    pos: u64,
    /// Bytes known to exist (pos plus an incomplete last line).
    seen: u64,
    mtime: (i64, i64),
    /// Fingerprint of the up to 256 bytes before `pos`.
    tail: u64,
    skipping: bool,
    group: Assembler,
    role: Role,
    /// May have unread data.
    dirty: bool,
    /// Check size and fingerprints before reading (truncation, replacement).
    verify: bool,
    wd: Option<i32>,
    /// Last time data was read or the file changed.
    idle_since: Instant,
    /// A copy of this file's earlier content (copy-truncate) is read first: its lines come before
    /// this file's new ones.
    wait_for: Option<Identity>,
}

impl Tracked {
    fn fp(&self) -> u64 {
        hash(&self.head)
    }

    /// Lines before this offset are in records (or filtered out).
    fn checkpoint_offset(&self) -> (u64, u64, bool) {
        match &self.group.pending {
            Some(g) => (g.offset, g.tail, false),
            None => (self.pos, self.tail, self.skipping),
        }
    }
}

pub struct Tailer {
    s: Settings,
    stats: Arc<TailStats>,
    files: Vec<Tracked>,
    watcher: Option<Watcher>,
    dirs: HashMap<PathBuf, i32>,
    dir_wds: HashMap<i32, PathBuf>,
    file_wds: HashMap<i32, Identity>,
    /// Inotify could not watch something (limits): the driver switches to polling.
    pub watch_failed: bool,
    rescan_wanted: bool,
    buf: Vec<u8>,
    rr: usize,
    changed: bool,
    /// Truncated file -> the copy of its old content that is read before it.
    waits: HashMap<Identity, Identity>,
    /// Matched files that cannot be opened, reported once each.
    unreadable: HashSet<PathBuf>,
}

fn read_full_at(file: &File, buf: &mut [u8], mut offset: u64) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], offset) {
            Ok(0) => break,
            Ok(k) => {
                n += k;
                offset += k as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// `[offset - min(offset, 256), offset)`.
fn window(offset: u64) -> (u64, usize) {
    let len = offset.min(FP_BYTES as u64);
    (offset - len, len as usize)
}

/// The hash of `len` bytes at `at`, if the file has them all.
fn hash_at(file: &File, at: u64, len: usize) -> Option<u64> {
    let mut b = [0u8; FP_BYTES];
    match read_full_at(file, &mut b[..len], at) {
        Ok(n) if n == len => Some(hash(&b[..len])),
        _ => None,
    }
}

fn tail_at(file: &File, offset: u64) -> Option<u64> {
    let (start, len) = window(offset);
    hash_at(file, start, len)
}

/// The first min(size, 256) bytes of a file of `size` bytes.
/// Where a file that starts like `orig` is read from when it is a copy of it: `orig`'s read
/// position, if it has the bytes `orig` was read to (the 256 before the position are the same).
fn copy_offset(file: &File, size: u64, orig: &Tracked) -> Option<u64> {
    let pos = orig.pos;
    (pos > 0 && size >= pos && tail_at(file, pos) == Some(orig.tail)).then_some(pos)
}

fn read_head(file: &File, size: u64) -> Vec<u8> {
    let mut b = vec![0u8; size.min(FP_BYTES as u64) as usize];
    let n = read_full_at(file, &mut b, 0).unwrap_or(0);
    b.truncate(n);
    b
}

fn mtime(m: &Metadata) -> (i64, i64) {
    (m.mtime(), m.mtime_nsec())
}

fn path_from(bytes: &[u8]) -> PathBuf {
    PathBuf::from(OsString::from_vec(bytes.to_vec()))
}

/// Whether `file` is the file `e` describes, at least `e.offset` long with the same bytes at its
/// start and before the offset.
fn same_content(file: &File, size: u64, e: &Entry) -> bool {
    size >= e.offset
        && hash_at(file, 0, e.fp_len as usize) == Some(e.fp)
        && tail_at(file, e.offset) == Some(e.tail)
}

impl Tailer {
    /// Starts from a stored checkpoint (`None`: the source never ran, so `start_at` applies).
    pub fn start(
        s: Settings,
        stored: Option<&[u8]>,
        watcher: Option<Watcher>,
        stats: Arc<TailStats>,
        now: Instant,
    ) -> Tailer {
        let mut t = Tailer {
            buf: Vec::new(),
            s,
            stats,
            files: Vec::new(),
            watcher,
            dirs: HashMap::new(),
            dir_wds: HashMap::new(),
            file_wds: HashMap::new(),
            watch_failed: false,
            rescan_wanted: false,
            rr: 0,
            changed: true,
            waits: HashMap::new(),
            unreadable: HashSet::new(),
        };
        let (entries, first_life) = match stored.map(checkpoint::decode) {
            None => (Vec::new(), true),
            Some(Ok(cp)) => (cp.files, false),
            Some(Err(e)) => {
                tracing::warn!(source = %t.s.cfg.name, error = %e, "the stored tail checkpoint cannot be read; files are read from their beginning");
                (Vec::new(), false)
            }
        };
        let candidates = t.scan();
        for e in entries {
            t.resume(e, &candidates, now);
        }
        let tracked: HashSet<Identity> = t.files.iter().map(|f| f.id).collect();
        for (path, id) in &candidates {
            if !tracked.contains(id) {
                t.discover(path, now, first_life);
            }
        }
        t.watch_dirs(&candidates);
        t
    }

    pub fn files(&self) -> usize {
        self.files.len()
    }

    fn is_tracked(&self, id: Identity) -> bool {
        self.files.iter().any(|f| f.id == id)
    }

    /// Regular files matched by `paths` and not by `exclude`, one path per identity, in pattern
    /// order then path order.
    fn scan(&self) -> Vec<(PathBuf, Identity)> {
        let opts = GLOB;
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for pattern in &self.s.cfg.patterns {
            let Ok(paths) = glob::glob_with(pattern, opts) else {
                continue;
            };
            for path in paths.flatten() {
                if self.excluded(&path) {
                    continue;
                }
                let Ok(meta) = std::fs::metadata(&path) else {
                    continue;
                };
                if meta.is_file() && seen.insert(Identity::of(&meta)) {
                    out.push((path, Identity::of(&meta)));
                }
            }
        }
        out
    }

    /// Whether a scan would find `path`: matched by `paths`, not by `exclude`.
    fn matched(&self, path: &Path) -> bool {
        !self.excluded(path)
            && self
                .s
                .cfg
                .patterns
                .iter()
                .any(|p| glob::Pattern::new(p).is_ok_and(|p| p.matches_path_with(path, GLOB)))
    }

    fn excluded(&self, path: &Path) -> bool {
        self.s.cfg.exclude.iter().any(|e| {
            if e.name_only {
                path.file_name()
                    .is_some_and(|n| e.pattern.matches(&n.to_string_lossy()))
            } else {
                e.pattern.matches_path(path)
            }
        })
    }

    /// Watches the directories that hold matches or may: those of the files found and those the
    /// patterns' directory parts match.
    fn watch_dirs(&mut self, candidates: &[(PathBuf, Identity)]) {
        let Some(w) = self.watcher else { return };
        let mut dirs: Vec<PathBuf> = candidates
            .iter()
            .filter_map(|(p, _)| p.parent().map(Path::to_path_buf))
            .collect();
        for pattern in &self.s.cfg.patterns {
            let Some((parent, _)) = pattern.rsplit_once('/') else {
                continue;
            };
            let parent = if parent.is_empty() { "/" } else { parent };
            if let Ok(found) = glob::glob(parent) {
                dirs.extend(found.flatten().filter(|d| d.is_dir()));
            }
        }
        for d in dirs {
            if self.dirs.contains_key(&d) {
                continue;
            }
            match w.add(&d, watch::DIR_MASK) {
                Ok(wd) => {
                    self.dirs.insert(d.clone(), wd);
                    self.dir_wds.insert(wd, d);
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => self.watch_failed = true,
                Err(_) => {}
            }
        }
    }

    /// Follows the file of a checkpoint entry again: where the scan found it, renamed in its
    /// directory, or as a copy (copy-truncate while colibri was stopped).
    fn resume(&mut self, e: Entry, candidates: &[(PathBuf, Identity)], now: Instant) {
        let id = Identity {
            dev: e.dev,
            ino: e.ino,
        };
        let logical = path_from(&e.path);
        if let Some((path, _)) = candidates.iter().find(|(_, c)| *c == id) {
            if let Some((file, meta)) = open_as(path, id) {
                if same_content(&file, meta.len(), &e) {
                    self.track(
                        file,
                        &meta,
                        logical,
                        e.offset,
                        e.skipping,
                        Role::Active,
                        now,
                        "checkpoint",
                    );
                    return;
                }
                // Replaced or truncated while colibri was stopped: the scan reads it from its
                // start; the lines it had past the offset may be in a copy.
                self.stats.truncations.fetch_add(1, Relaxed);
                tracing::info!(source = %self.s.cfg.name, path = %path.display(), offset = e.offset, "file truncated or replaced while colibri was stopped: reading it from its start");
            }
            let dir = path.parent().map(Path::to_path_buf);
            if let Some(copy) = self.recover_copy(&e, dir.as_deref(), logical, now) {
                self.waits.insert(id, copy);
            }
            return;
        }
        // Not where the patterns look any more: renamed away (rotated) or deleted.
        let dir = logical.parent().map(Path::to_path_buf);
        if let Some(dir) = &dir {
            let found = search_dir(dir, |_, m| Identity::of(m) == id);
            if let Some(path) = found
                && let Some((file, meta)) = open_as(&path, id)
                && same_content(&file, meta.len(), &e)
            {
                self.track(
                    file,
                    &meta,
                    logical,
                    e.offset,
                    e.skipping,
                    Role::Rotated,
                    now,
                    "rotated while stopped",
                );
                return;
            }
        }
        self.recover_copy(&e, dir.as_deref(), logical, now);
    }

    /// Looks in `dir` for a copy of the entry's file holding its bytes up to the offset, and
    /// follows it from there: as an active file when the patterns match it (`app.log*` matches the
    /// copy `app.log.1`), so that it is not released and then found again as a new file and read
    /// whole; as a rotated one otherwise.
    fn recover_copy(
        &mut self,
        e: &Entry,
        dir: Option<&Path>,
        logical: PathBuf,
        now: Instant,
    ) -> Option<Identity> {
        if e.offset == 0 || e.fp_len == 0 {
            return None;
        }
        let dir = dir?;
        let tracked: HashSet<Identity> = self.files.iter().map(|f| f.id).collect();
        let found = search_dir(dir, |path, m| {
            !tracked.contains(&Identity::of(m))
                && m.len() >= e.offset
                && File::open(path).is_ok_and(|f| same_content(&f, m.len(), e))
        });
        if let Some(path) = found
            && let Ok(file) = File::open(&path)
            && let Ok(meta) = file.metadata()
            && same_content(&file, meta.len(), e)
        {
            tracing::info!(source = %self.s.cfg.name, path = %logical.display(), copy = %path.display(), offset = e.offset, "reading the rest of a truncated file from its copy");
            let copy = Identity::of(&meta);
            let role = if self.matched(&path) {
                Role::Active
            } else {
                Role::Rotated
            };
            self.track(
                file, &meta, logical, e.offset, e.skipping, role, now, "copy",
            );
            return Some(copy);
        }
        None
    }

    /// Starts following a file the scan found and nobody follows yet.
    fn discover(&mut self, path: &Path, now: Instant, first_life: bool) {
        let file = match File::open(path) {
            Ok(f) => f,
            Err(e) => {
                if self.unreadable.len() < 1000 && self.unreadable.insert(path.to_path_buf()) {
                    tracing::warn!(source = %self.s.cfg.name, path = %path.display(), error = %e, "cannot open a matched file; it is skipped until it can be");
                }
                return;
            }
        };
        let Ok(meta) = file.metadata() else { return };
        if !meta.is_file() || self.is_tracked(Identity::of(&meta)) {
            return;
        }
        let (pos, role, why) = if first_life && self.s.cfg.start_at == StartAt::End {
            (meta.len(), Role::Active, "new, start_at end")
        } else {
            (0, Role::New { since: now }, "new")
        };
        self.track(file, &meta, path.to_path_buf(), pos, false, role, now, why);
    }

    #[allow(clippy::too_many_arguments)]
    fn track(
        &mut self,
        file: File,
        meta: &Metadata,
        path: PathBuf,
        pos: u64,
        skipping: bool,
        role: Role,
        now: Instant,
        why: &str,
    ) {
        let id = Identity::of(meta);
        let head = read_head(&file, meta.len());
        let tail = tail_at(&file, pos).unwrap_or(0);
        let wd = match self.watcher {
            Some(w) => match w.add_fd(file.as_raw_fd(), watch::FILE_MASK) {
                Ok(wd) => {
                    self.file_wds.insert(wd, id);
                    Some(wd)
                }
                Err(_) => {
                    self.watch_failed = true;
                    None
                }
            },
            None => None,
        };
        tracing::info!(source = %self.s.cfg.name, path = %path.display(), offset = pos, size = meta.len(), why, "following file");
        self.stats.files_opened.fetch_add(1, Relaxed);
        self.files.push(Tracked {
            id,
            path_json: record::json_string(&path.to_string_lossy()),
            path,
            file,
            head,
            pos,
            seen: pos,
            mtime: (i64::MIN, 0),
            tail,
            skipping,
            group: Assembler::default(),
            role,
            dirty: true,
            verify: true,
            wd,
            idle_since: now,
            wait_for: self.waits.remove(&id),
        });
        self.changed = true;
    }

    /// Expands the globs again: new files are followed, followed files no longer matched are
    /// rotated (read to their end, then released).
    fn rescan(&mut self, now: Instant) {
        self.rescan_wanted = false;
        let candidates = self.scan();
        let present: HashSet<Identity> = candidates.iter().map(|(_, id)| *id).collect();
        for f in &mut self.files {
            let here = present.contains(&f.id);
            match f.role {
                Role::Rotated if here => f.role = Role::Active,
                Role::New { .. } | Role::Held { .. } if !here => {
                    // Gone before it was read: read it whole.
                    f.role = Role::Rotated;
                    f.dirty = true;
                    f.verify = true;
                    f.idle_since = now;
                }
                Role::Active if !here => {
                    f.role = Role::Rotated;
                    f.dirty = true;
                    f.verify = true;
                    f.idle_since = now;
                    self.stats.rotations.fetch_add(1, Relaxed);
                    tracing::info!(source = %self.s.cfg.name, path = %f.path.display(), offset = f.pos, "file rotated or deleted: reading it to its end");
                }
                _ => {}
            }
        }
        let tracked: HashSet<Identity> = self.files.iter().map(|f| f.id).collect();
        for (path, id) in &candidates {
            if !tracked.contains(id) {
                self.discover(path, now, false);
            }
        }
        self.watch_dirs(&candidates);
    }

    pub fn apply(&mut self, input: &StepInput) {
        for e in &input.events {
            if e.wd < 0 || e.mask & libc::IN_Q_OVERFLOW != 0 {
                self.rescan_wanted = true;
                for f in &mut self.files {
                    f.dirty = true;
                    f.verify = true;
                }
                continue;
            }
            if e.mask & libc::IN_IGNORED != 0 {
                if let Some(d) = self.dir_wds.remove(&e.wd) {
                    self.dirs.remove(&d);
                    self.rescan_wanted = true;
                }
                if let Some(id) = self.file_wds.remove(&e.wd)
                    && let Some(f) = self.files.iter_mut().find(|f| f.id == id)
                {
                    f.wd = None;
                }
                continue;
            }
            if let Some(id) = self.file_wds.get(&e.wd) {
                if let Some(f) = self.files.iter_mut().find(|f| f.id == *id) {
                    f.dirty = true;
                    f.verify = true;
                }
                if e.mask & (libc::IN_ATTRIB | libc::IN_MOVE_SELF | libc::IN_DELETE_SELF) != 0 {
                    self.rescan_wanted = true;
                }
            } else if self.dir_wds.contains_key(&e.wd) {
                self.rescan_wanted = true;
            }
        }
        if input.check_all {
            for f in &mut self.files {
                f.dirty = true;
                f.verify = true;
            }
        }
    }

    /// One round: apply what happened, rescan if asked, complete timed-out groups, release
    /// rotated files, and read into `batch` until it is full or nothing is left to read. Sets the
    /// batch's checkpoint when the state changed.
    pub fn step(&mut self, input: &StepInput, batch: &mut Batch, now: Instant) {
        self.apply(input);
        if input.rescan || self.rescan_wanted {
            self.rescan(now);
        }
        self.fill(batch, now);
        self.tick(batch, now);
        if self.changed {
            self.changed = false;
            batch.checkpoint = Some(checkpoint::encode(&self.checkpoint()));
            batch.since.get_or_insert(now);
        }
    }

    /// Stops using inotify (reading its events failed; the driver polls now). Its watches are
    /// removed while its descriptor is still open: a copy of the raw descriptor kept past that
    /// could name an unrelated file later.
    pub fn forget_watcher(&mut self) {
        if let Some(w) = self.watcher.take() {
            for wd in self.file_wds.keys().chain(self.dir_wds.keys()) {
                w.remove(*wd);
            }
        }
        self.file_wds.clear();
        self.dir_wds.clear();
        self.dirs.clear();
        for f in &mut self.files {
            f.wd = None;
        }
    }

    /// Some file has data to read, or a rescan is pending.
    pub fn has_work(&self) -> bool {
        self.rescan_wanted
            || self
                .files
                .iter()
                .any(|f| f.dirty && !matches!(f.role, Role::Held { .. }))
    }

    /// The earliest moment a timer of the tailer runs out (multiline groups, rotated and held
    /// files).
    pub fn deadline(&self) -> Option<Instant> {
        let wait = self.s.cfg.rotate_wait;
        self.files
            .iter()
            .filter_map(|f| {
                let group = self
                    .s
                    .cfg
                    .multiline
                    .as_ref()
                    .and_then(|m| f.group.deadline(m));
                let role = match f.role {
                    Role::Active => None,
                    Role::Rotated => Some(f.idle_since + wait),
                    Role::Held { since, .. } | Role::New { since } => Some(since + wait),
                };
                [group, role].into_iter().flatten().min()
            })
            .min()
    }

    pub fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            files: self
                .files
                .iter()
                .filter(|f| !f.role.waits())
                .map(|f| {
                    let (offset, tail, skipping) = f.checkpoint_offset();
                    Entry {
                        path: f.path.as_os_str().as_bytes().to_vec(),
                        dev: f.id.dev,
                        ino: f.id.ino,
                        fp_len: f.head.len() as u16,
                        fp: f.fp(),
                        offset,
                        tail,
                        skipping,
                    }
                })
                .collect(),
        }
    }

    fn fill(&mut self, batch: &mut Batch, now: Instant) {
        let mut buf = std::mem::take(&mut self.buf);
        // Files found while reading (copies) are read in the same round.
        let mut k = 0;
        while k < self.files.len() && !batch.is_full() {
            let i = (self.rr + k) % self.files.len();
            k += 1;
            if let Role::New { .. } = self.files[i].role
                && self.files[i].dirty
            {
                self.classify(i, now);
            }
            if self.files[i].dirty && !self.files[i].role.waits() && !self.waiting(i) {
                self.read_file(i, &mut buf, batch, now);
                if self.files.get(i).is_some_and(|f| f.wait_for.is_some()) {
                    // It was truncated and a copy takes its old lines first: read that now.
                    k = 0;
                    self.rr = i + 1;
                }
            }
        }
        self.rr = self.rr.wrapping_add(1);
        self.buf = buf;
    }

    /// Decides what a new file is, at its first read: a copy of an active file (its first 256
    /// bytes are that file's) is held; a file shorter than 256 bytes that so far equals the start
    /// of an active file may be a copy being written and stays new (up to `rotate_wait`); anything
    /// else is active, read from its start.
    fn classify(&mut self, i: usize, now: Instant) {
        let f = &self.files[i];
        let size = f.file.metadata().map_or(0, |m| m.len());
        let head = read_head(&f.file, size);
        let id = f.id;
        if head.is_empty() {
            self.files[i].dirty = false;
            return;
        }
        let like = self.files.iter().find(|g| {
            g.id != id
                && g.role == Role::Active
                && g.head.len() >= head.len()
                && g.head[..head.len()] == head[..]
        });
        let role = match like {
            Some(g) if head.len() == FP_BYTES => {
                tracing::info!(source = %self.s.cfg.name, path = %self.files[i].path.display(), like = %g.path.display(), "a new file starts like a followed one (a copy?): held until that one is truncated or rotate_wait passes");
                Role::Held {
                    of: g.id,
                    since: now,
                    size,
                }
            }
            Some(_) => {
                self.files[i].dirty = false;
                return;
            }
            None => Role::Active,
        };
        let f = &mut self.files[i];
        f.role = role;
        f.head = head;
        self.changed = true;
    }

    /// Whether file `i` waits for the copy of its old content to be read to its end.
    fn waiting(&mut self, i: usize) -> bool {
        let Some(copy) = self.files[i].wait_for else {
            return false;
        };
        let busy = self
            .files
            .iter()
            .any(|f| f.id == copy && (f.dirty || f.verify) && !f.role.waits());
        if !busy {
            self.files[i].wait_for = None;
        }
        busy
    }

    /// Checks a file's size and fingerprints; handles a truncation or replacement. Returns whether
    /// there may be data to read.
    fn verify(&mut self, i: usize, batch: &mut Batch, now: Instant) -> bool {
        let f = &mut self.files[i];
        let Ok(meta) = f.file.metadata() else {
            f.dirty = false;
            return false;
        };
        if meta.nlink() == 0 && f.role == Role::Active {
            self.rescan_wanted = true;
        }
        let size = meta.len();
        let f = &mut self.files[i];
        if size == f.seen && mtime(&meta) == f.mtime {
            return false;
        }
        f.mtime = mtime(&meta);
        f.idle_since = now;
        let replaced = size < f.pos
            || read_head(&f.file, f.head.len() as u64) != f.head
            || tail_at(&f.file, f.pos) != Some(f.tail);
        if replaced {
            self.truncated(i, batch, now);
            return true;
        }
        if f.head.len() < FP_BYTES && size > f.head.len() as u64 {
            f.head = read_head(&f.file, size);
            self.changed = true;
        }
        size > f.seen
    }

    /// The file got shorter (or its bytes changed): what was read stays read; copies of it get the
    /// lines past the position; it is read again from its start.
    fn truncated(&mut self, i: usize, batch: &mut Batch, now: Instant) {
        let (id, pos, tail, old_head) = {
            let f = &mut self.files[i];
            if let Some(g) = f.group.pending.take() {
                // The file is read again from its start: its pending group goes now, even past
                // the batch's limits (by one record).
                offer_group(&self.s, &self.stats, &f.path_json, batch, &g, now, true);
            }
            (f.id, f.pos, f.tail, f.head.clone())
        };
        self.stats.truncations.fetch_add(1, Relaxed);
        tracing::info!(source = %self.s.cfg.name, path = %self.files[i].path.display(), offset = pos, "file truncated: reading it again from its start");
        let (orig_path, orig_json) = (self.files[i].path.clone(), self.files[i].path_json.clone());
        // Copies already found: held for this file, or new files (being copied when first seen)
        // that now start with its old first bytes.
        let held: Vec<usize> = (0..self.files.len())
            .filter(|&j| {
                let c = &self.files[j];
                match c.role {
                    Role::Held { of, .. } => of == id,
                    Role::New { .. } => {
                        !old_head.is_empty()
                            && read_head(&c.file, old_head.len() as u64) == old_head
                    }
                    _ => false,
                }
            })
            .collect();
        let mut copies: Vec<Identity> = held.iter().map(|&j| self.files[j].id).collect();
        if held.is_empty() {
            let e = Entry {
                path: Vec::new(),
                dev: id.dev,
                ino: id.ino,
                fp_len: old_head.len() as u16,
                fp: hash(&old_head),
                offset: pos,
                tail,
                skipping: false,
            };
            let dir = orig_path.parent().map(Path::to_path_buf);
            copies.extend(self.recover_copy(&e, dir.as_deref(), orig_path.clone(), now));
        }
        for j in held {
            let c = &mut self.files[j];
            let size = c.file.metadata().map_or(0, |m| m.len());
            // Never from its own end: what does not hold the original's bytes is read whole.
            let from = if size >= pos && tail_at(&c.file, pos) == Some(tail) {
                pos
            } else {
                0
            };
            tracing::info!(source = %self.s.cfg.name, path = %c.path.display(), offset = from, "copy of a truncated file: reading it from where the original was");
            c.role = Role::Active;
            c.head = read_head(&c.file, size);
            c.pos = from;
            c.seen = from;
            c.tail = tail_at(&c.file, from).unwrap_or(0);
            c.dirty = true;
            c.verify = true;
            c.idle_since = now;
            if from == pos {
                // Its lines belong to the original.
                c.path_json = orig_json.clone();
                c.path = orig_path.clone();
            }
        }
        let f = &mut self.files[i];
        let size = f.file.metadata().map_or(0, |m| m.len());
        f.head = read_head(&f.file, size);
        f.pos = 0;
        f.seen = 0;
        f.tail = record::hash(b"");
        f.skipping = false;
        f.dirty = true;
        f.idle_since = now;
        f.wait_for = copies.first().copied();
        self.changed = true;
    }

    fn read_file(&mut self, i: usize, buf: &mut Vec<u8>, batch: &mut Batch, now: Instant) {
        if self.files[i].verify {
            self.files[i].verify = false;
            if !self.verify(i, batch, now) {
                self.files[i].dirty = false;
                return;
            }
            if self.files[i].wait_for.is_some() {
                return;
            }
        }
        let max_line = self.s.cfg.max_line_bytes;
        loop {
            let Tailer {
                files, s, stats, ..
            } = self;
            let f = &mut files[i];
            let back = f.pos.min(FP_BYTES as u64) as usize;
            let want = s.chunk + back;
            if buf.len() < want {
                buf.resize(want, 0);
            }
            let base = f.pos;
            let n = match read_full_at(&f.file, &mut buf[..want], base - back as u64) {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(source = %s.cfg.name, path = %f.path.display(), error = %e, "cannot read file");
                    f.dirty = false;
                    return;
                }
            };
            if n < back {
                // Shorter than the position: truncated under us.
                self.truncated(i, batch, now);
                if self.files[i].wait_for.is_some() {
                    return;
                }
                continue;
            }
            let data = &buf[back..n];
            let buf_base = base - back as u64;
            let Tracked {
                group, path_json, ..
            } = f;
            let window_hash = |offset: u64| {
                let (start, len) = window(offset);
                let at = (start - buf_base) as usize;
                hash(&buf[at..at + len])
            };
            let mut stopped = false;
            let split = lines::split(
                data,
                base,
                f.skipping,
                max_line,
                |line, offset, truncated| {
                    let taken = take_line(
                        s,
                        stats,
                        group,
                        path_json,
                        batch,
                        line,
                        offset,
                        truncated,
                        now,
                        || window_hash(offset),
                    );
                    stopped = !taken;
                    taken
                },
            );
            f.skipping = split.skipping;
            if split.consumed > 0 {
                let pos = base + split.consumed as u64;
                f.tail = window_hash(pos);
                f.pos = pos;
                f.idle_since = now;
                stats.bytes_read.fetch_add(split.consumed as u64, Relaxed);
                self.changed = true;
            }
            let f = &mut self.files[i];
            // Stopped early, what follows the position is unread, not an incomplete line.
            f.seen = if stopped {
                f.pos
            } else {
                base + data.len() as u64
            };
            if stopped || batch.is_full() {
                // No room: the rest is read when the batch was appended.
                return;
            }
            if n < want {
                f.dirty = false;
                return;
            }
        }
    }

    /// Completes timed-out groups, settles held files, releases rotated files that stayed quiet.
    fn tick(&mut self, batch: &mut Batch, now: Instant) {
        if let Some(ml) = &self.s.cfg.multiline {
            for f in &mut self.files {
                if !f.dirty
                    && f.group.deadline(ml).is_some_and(|d| d <= now)
                    && let Some(g) = &f.group.pending
                    && offer_group(&self.s, &self.stats, &f.path_json, batch, g, now, false)
                {
                    f.group.pending = None;
                    self.changed = true;
                }
            }
        }
        let wait = self.s.cfg.rotate_wait;
        for i in 0..self.files.len() {
            match self.files[i].role {
                Role::Held { of, since, size } if now.saturating_duration_since(since) >= wait => {
                    self.settle(i, Some((of, size)), now);
                }
                Role::New { since } if now.saturating_duration_since(since) >= wait => {
                    self.settle(i, None, now);
                }
                _ => {}
            }
        }
        let mut i = 0;
        while i < self.files.len() {
            let f = &self.files[i];
            if f.role == Role::Rotated
                && !f.dirty
                && now.saturating_duration_since(f.idle_since) >= wait
                && self.release(i, batch, now)
            {
                continue;
            }
            i += 1;
        }
    }

    /// A new or held file (one that starts like followed files) whose original was not truncated
    /// within `rotate_wait`. A copy, one that holds the bytes an original was read to, is read
    /// from there (only the lines past what was read); a copy still being written (a growing
    /// prefix of its original, short of the read position) is held on; anything else is read
    /// whole. It is never followed from its own end: a new file that merely starts with the same
    /// banner must not lose its lines.
    fn settle(&mut self, i: usize, held: Option<(Identity, u64)>, now: Instant) {
        let c = &self.files[i];
        let size = c.file.metadata().map_or(0, |m| m.len());
        let head = read_head(&c.file, size);
        let like = |g: &&Tracked| {
            g.id != c.id
                && match held {
                    Some((of, _)) => g.id == of,
                    None => {
                        g.role == Role::Active
                            && g.head.len() >= head.len()
                            && g.head[..head.len()] == head[..]
                    }
                }
        };
        let from = self
            .files
            .iter()
            .filter(like)
            .find_map(|g| copy_offset(&c.file, size, g));
        if from.is_none()
            && let Some((of, was)) = held
            && size > was
            && let Some(g) = self.files.iter().find(|g| g.id == of)
            && size < g.pos
            && tail_at(&c.file, size).is_some()
            && tail_at(&c.file, size) == tail_at(&g.file, size)
        {
            tracing::info!(source = %self.s.cfg.name, path = %c.path.display(), size, "a copy of a followed file is still being written: held on");
            self.files[i].role = Role::Held {
                of,
                since: now,
                size,
            };
            return;
        }
        let copy = from.is_some();
        let from = from.unwrap_or(0);
        tracing::info!(source = %self.s.cfg.name, path = %c.path.display(), offset = from, copy, "a file that starts like a followed one: following it");
        let c = &mut self.files[i];
        c.role = Role::Active;
        c.head = head;
        c.pos = from;
        c.seen = from;
        c.tail = tail_at(&c.file, from).unwrap_or(0);
        c.dirty = true;
        c.verify = true;
        c.idle_since = now;
        self.changed = true;
    }

    /// Releases a rotated file read to its end; its last line counts even without a newline.
    /// Returns false when it turned out to have more data.
    fn release(&mut self, i: usize, batch: &mut Batch, now: Instant) -> bool {
        let f = &mut self.files[i];
        let size = f.file.metadata().map_or(f.seen, |m| m.len());
        if size > f.seen {
            f.dirty = true;
            f.verify = true;
            return false;
        }
        if f.seen > f.pos && !f.skipping {
            let mut rest = vec![0u8; (f.seen - f.pos) as usize];
            let n = read_full_at(&f.file, &mut rest, f.pos).unwrap_or(0);
            rest.truncate(n);
            let max = self.s.cfg.max_line_bytes;
            let cut = record::cut_at_char(&rest, max);
            let truncated = cut.len() < rest.len();
            let tail = f.tail;
            let Tracked {
                group, path_json, ..
            } = f;
            if !take_line(
                &self.s,
                &self.stats,
                group,
                path_json,
                batch,
                cut,
                f.pos,
                truncated,
                now,
                || tail,
            ) {
                return false;
            }
            f.pos = f.seen;
            self.changed = true;
        }
        if let Some(g) = &f.group.pending {
            if !offer_group(&self.s, &self.stats, &f.path_json, batch, g, now, false) {
                return false;
            }
            f.group.pending = None;
        }
        let f = self.files.remove(i);
        if let (Some(w), Some(wd)) = (self.watcher, f.wd) {
            self.file_wds.remove(&wd);
            w.remove(wd);
        }
        self.stats.files_released.fetch_add(1, Relaxed);
        tracing::info!(source = %self.s.cfg.name, path = %f.path.display(), offset = size, "released file (rotated or deleted, read to its end)");
        self.changed = true;
        true
    }
}

/// Opens `path` if it still is the file `id`.
fn open_as(path: &Path, id: Identity) -> Option<(File, Metadata)> {
    let file = File::open(path).ok()?;
    let meta = file.metadata().ok()?;
    (meta.is_file() && Identity::of(&meta) == id).then_some((file, meta))
}

/// The first regular file in `dir` (at most [`DIR_SEARCH_LIMIT`] entries looked at) that `pred`
/// accepts.
fn search_dir(dir: &Path, mut pred: impl FnMut(&Path, &Metadata) -> bool) -> Option<PathBuf> {
    let entries = std::fs::read_dir(dir).ok()?;
    for entry in entries.flatten().take(DIR_SEARCH_LIMIT) {
        let path = entry.path();
        if let Ok(m) = std::fs::metadata(&path)
            && m.is_file()
            && pred(&path, &m)
        {
            return Some(path);
        }
    }
    None
}

/// Takes one line of a file into its multiline group or, without multiline, into the batch as a
/// record. False when the batch has no room for what the line completes (nothing changed then).
#[allow(clippy::too_many_arguments)]
fn take_line(
    s: &Settings,
    stats: &TailStats,
    group: &mut Assembler,
    path_json: &str,
    batch: &mut Batch,
    line: &[u8],
    offset: u64,
    truncated: bool,
    now: Instant,
    tail: impl FnOnce() -> u64,
) -> bool {
    match &s.cfg.multiline {
        Some(ml) => {
            let starts = ml.start.is_match(&record::text(line));
            if group.completes(ml, line.len(), starts) {
                let g = group
                    .pending
                    .as_ref()
                    .expect("completes only a pending group");
                if !offer_group(s, stats, path_json, batch, g, now, false) {
                    return false;
                }
                group.pending = None;
            }
            group.push(ml, line, offset, truncated, starts, now, tail);
        }
        None => {
            let text = record::text(line);
            if !offer(
                s, stats, path_json, batch, &text, &text, offset, 1, truncated, now, false,
            ) {
                return false;
            }
        }
    }
    stats.lines_read.fetch_add(1, Relaxed);
    if truncated {
        stats.truncated_lines.fetch_add(1, Relaxed);
    }
    true
}

#[allow(clippy::too_many_arguments)]
fn offer_group(
    s: &Settings,
    stats: &TailStats,
    path_json: &str,
    batch: &mut Batch,
    g: &Group,
    now: Instant,
    force: bool,
) -> bool {
    let text = record::text(&g.text);
    let first = match text.find('\n') {
        Some(i) => &text[..i],
        None => &text[..],
    };
    offer(
        s,
        stats,
        path_json,
        batch,
        &text,
        first,
        g.offset,
        g.lines,
        g.truncated,
        now,
        force,
    )
}

/// Filters a record and, when kept, adds it to the batch if it fits (or `force`). False when it
/// did not fit (nothing changed then).
#[allow(clippy::too_many_arguments)]
fn offer(
    s: &Settings,
    stats: &TailStats,
    path_json: &str,
    batch: &mut Batch,
    text: &str,
    first: &str,
    offset: u64,
    lines: u32,
    truncated: bool,
    now: Instant,
    force: bool,
) -> bool {
    if !s.cfg.filter.is_empty() && !s.cfg.filter.keeps(text, first) {
        stats.filtered_lines.fetch_add(u64::from(lines), Relaxed);
        return true;
    }
    let mut rec = record::encode(text, path_json, offset, lines, truncated, &s.extra);
    let mut cut = false;
    if rec.len() > s.record_limit {
        // Only for streams whose max_bytes is smaller than a line: cut it to what surely fits
        // (escaping can make a byte six).
        let room = s
            .record_limit
            .saturating_sub(path_json.len() + s.extra.len() + 80)
            / 6;
        let text = record::text(record::cut_at_char(text.as_bytes(), room));
        rec = record::encode(&text, path_json, offset, lines, true, &s.extra);
        cut = !truncated;
    }
    if !force && !batch.fits(&[rec.len()]) {
        return false;
    }
    if cut {
        stats.truncated_lines.fetch_add(1, Relaxed);
    }
    batch.push(rec, now);
    true
}

impl Drop for Tailer {
    /// Its watches go with it (a tailer restarted from the checkpoint adds its own).
    fn drop(&mut self) {
        if let Some(w) = self.watcher {
            for wd in self.file_wds.keys().chain(self.dir_wds.keys()) {
                w.remove(*wd);
            }
        }
    }
}

#[cfg(test)]
mod tests;
