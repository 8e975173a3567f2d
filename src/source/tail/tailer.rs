//! The synchronous core of one tail source: the files it follows and their roles (rotation,
//! truncation, copies), reading them in large chunks into a [`Batch`] of records, and the
//! checkpoint that describes exactly what the records cover. Which files it follows is
//! `tailer/discover.rs`; what tells files apart is `identity.rs`; lines become records in
//! `emit.rs`. It does blocking file I/O and is run on tokio's blocking pool by the driver in
//! `mod.rs`, which owns timing, inotify and the store.
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

mod discover;

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::fd::AsRawFd as _;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use super::TailStats;
use super::batch::Batch;
use super::checkpoint::{self, Checkpoint, Entry};
use super::emit::{Emit, Settings};
use super::identity::{Identity, mtime, read_full_at, read_head, tail_at, window};
use super::lines::{self, Assembler, Line};
use super::record::{self, FP_BYTES};
use super::watch::{Event, Watcher};
use crate::files::fnv1a as hash;

/// How long a source reads nothing before it gives its read buffer back: a source that reads
/// every few seconds keeps it.
const QUIET: Duration = Duration::from_secs(5);

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
    settings: Settings,
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
    /// Where the next round of reads starts, so one busy file cannot starve the others.
    next_file: usize,
    changed: bool,
    /// Truncated file -> the copy of its old content that is read before it.
    waits: HashMap<Identity, Identity>,
    /// Matched files that cannot be opened, reported once each.
    unreadable: HashSet<PathBuf>,
}

/// Where a file that starts like `orig` is read from when it is a copy of it: `orig`'s read
/// position, if it has the bytes `orig` was read to (the 256 before the position are the same).
fn copy_offset(file: &File, size: u64, orig: &Tracked) -> Option<u64> {
    let pos = orig.pos;
    (pos > 0 && size >= pos && tail_at(file, pos) == Some(orig.tail)).then_some(pos)
}

impl Tailer {
    /// Starts from a stored checkpoint (`None`: the source never ran, so `start_at` applies).
    pub fn start(
        settings: Settings,
        stored: Option<&[u8]>,
        lost: bool,
        watcher: Option<Watcher>,
        stats: Arc<TailStats>,
        now: Instant,
    ) -> Tailer {
        let mut t = Tailer {
            buf: Vec::new(),
            settings,
            stats,
            files: Vec::new(),
            watcher,
            dirs: HashMap::new(),
            dir_wds: HashMap::new(),
            file_wds: HashMap::new(),
            watch_failed: false,
            rescan_wanted: false,
            next_file: 0,
            changed: true,
            waits: HashMap::new(),
            unreadable: HashSet::new(),
        };
        let (entries, first_life) = match stored.map(checkpoint::decode) {
            None if lost => {
                tracing::warn!(source = %t.settings.cfg.name, "this source's checkpoint may have been in a damaged store file; files are read from their beginning");
                (Vec::new(), false)
            }
            None => (Vec::new(), true),
            Some(Ok(cp)) => (cp.files, false),
            Some(Err(e)) => {
                tracing::warn!(source = %t.settings.cfg.name, error = %e, "the stored tail checkpoint cannot be read; files are read from their beginning");
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
        // A timer's round (the rescan, a poll) with nothing read from any file for QUIET: the
        // burst is over. The read buffer (a chunk, 256 KiB at least) is not kept resident while
        // the source stays quiet, and what the burst left (free memory in the allocator's heaps,
        // the mapping of the code it ran) goes back with it: once per burst, as the buffer is
        // taken again only by a read.
        if !self.buf.is_empty()
            && input.events.is_empty()
            && !self.has_work()
            && self
                .files
                .iter()
                .all(|f| now.saturating_duration_since(f.idle_since) >= QUIET)
        {
            self.buf = Vec::new();
            crate::memory::give_back();
        }
        if self.changed {
            self.changed = false;
            self.publish_positions();
            batch.checkpoint = Some(checkpoint::encode(&self.checkpoint()));
            batch.since.get_or_insert(now);
        }
    }

    /// Where each file is read to, for the metrics page's lag: the positions updated in place
    /// while the same files are followed (a batch costs no allocation), rebuilt when they change.
    /// A descriptor is published, never used to read: the page only stats it.
    fn publish_positions(&self) {
        let mut read_to = self.stats.read_to.lock().unwrap_or_else(|e| e.into_inner());
        let same = read_to.len() == self.files.len()
            && read_to
                .iter()
                .zip(&self.files)
                .all(|(r, f)| r.id == f.id && r.fd == f.file.as_raw_fd());
        if same {
            for (r, f) in read_to.iter_mut().zip(&self.files) {
                r.pos = f.pos;
            }
        } else {
            *read_to = self
                .files
                .iter()
                .map(|f| super::ReadTo {
                    fd: f.file.as_raw_fd(),
                    id: f.id,
                    pos: f.pos,
                })
                .collect();
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
        let wait = self.settings.cfg.rotate_wait;
        self.files
            .iter()
            .filter_map(|f| {
                let group = self
                    .settings
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
            let i = (self.next_file + k) % self.files.len();
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
                    self.next_file = i + 1;
                }
            }
        }
        self.next_file = self.next_file.wrapping_add(1);
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
                tracing::info!(source = %self.settings.cfg.name, path = %self.files[i].path.display(), like = %g.path.display(), "a new file starts like a followed one (a copy?): held until that one is truncated or rotate_wait passes");
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
                let emit = Emit {
                    settings: &self.settings,
                    stats: &self.stats,
                    path_json: &f.path_json,
                    now,
                };
                emit.offer_group(batch, &g, true);
            }
            (f.id, f.pos, f.tail, f.head.clone())
        };
        self.stats.truncations.fetch_add(1, Relaxed);
        tracing::info!(source = %self.settings.cfg.name, path = %self.files[i].path.display(), offset = pos, "file truncated: reading it again from its start");
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
            tracing::info!(source = %self.settings.cfg.name, path = %c.path.display(), offset = from, "copy of a truncated file: reading it from where the original was");
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
        f.tail = crate::files::fnv1a(b"");
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
        let max_line = self.settings.cfg.max_line_bytes;
        loop {
            let Tailer {
                files,
                settings,
                stats,
                ..
            } = self;
            let f = &mut files[i];
            let back = f.pos.min(FP_BYTES as u64) as usize;
            let want = settings.chunk + back;
            if buf.len() < want {
                buf.resize(want, 0);
            }
            let base = f.pos;
            let n = match read_full_at(&f.file, &mut buf[..want], base - back as u64) {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(source = %settings.cfg.name, path = %f.path.display(), error = %e, "cannot read file");
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
                    let emit = Emit {
                        settings,
                        stats,
                        path_json,
                        now,
                    };
                    let line = Line {
                        bytes: line,
                        offset,
                        truncated,
                    };
                    let taken = emit.take_line(group, batch, line, || window_hash(offset));
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
        if let Some(ml) = &self.settings.cfg.multiline {
            for f in &mut self.files {
                if !f.dirty
                    && f.group.deadline(ml).is_some_and(|d| d <= now)
                    && let Some(g) = &f.group.pending
                    && (Emit {
                        settings: &self.settings,
                        stats: &self.stats,
                        path_json: &f.path_json,
                        now,
                    })
                    .offer_group(batch, g, false)
                {
                    f.group.pending = None;
                    self.changed = true;
                }
            }
        }
        let wait = self.settings.cfg.rotate_wait;
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
            tracing::info!(source = %self.settings.cfg.name, path = %c.path.display(), size, "a copy of a followed file is still being written: held on");
            self.files[i].role = Role::Held {
                of,
                since: now,
                size,
            };
            return;
        }
        let copy = from.is_some();
        let from = from.unwrap_or(0);
        tracing::info!(source = %self.settings.cfg.name, path = %c.path.display(), offset = from, copy, "a file that starts like a followed one: following it");
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
            let max = self.settings.cfg.max_line_bytes;
            let cut = record::cut_at_char(&rest, max);
            let truncated = cut.len() < rest.len();
            let tail = f.tail;
            let Tracked {
                group, path_json, ..
            } = f;
            let emit = Emit {
                settings: &self.settings,
                stats: &self.stats,
                path_json,
                now,
            };
            let line = Line {
                bytes: cut,
                offset: f.pos,
                truncated,
            };
            if !emit.take_line(group, batch, line, || tail) {
                return false;
            }
            f.pos = f.seen;
            self.changed = true;
        }
        if let Some(g) = &f.group.pending {
            let emit = Emit {
                settings: &self.settings,
                stats: &self.stats,
                path_json: &f.path_json,
                now,
            };
            if !emit.offer_group(batch, g, false) {
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
        tracing::info!(source = %self.settings.cfg.name, path = %f.path.display(), offset = size, "released file (rotated or deleted, read to its end)");
        self.changed = true;
        true
    }
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
