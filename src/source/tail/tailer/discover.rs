//! Which files a tailer follows: the glob scans (`paths` less `exclude`), the directories
//! watched for new names, resuming each checkpoint entry (by identity, by path, or by searching
//! its directory for the renamed file or a copy), and tracking a newly found file.
//!
//! Reading the files, rotation and truncation are `tailer.rs`'s; this is the part of the same
//! [`Tailer`] that decides what it follows, kept apart for size.

use std::collections::HashSet;
use std::fs::{File, Metadata};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use super::{Role, Tailer, Tracked};
use crate::source::tail::StartAt;
use crate::source::tail::checkpoint::Entry;
use crate::source::tail::identity::{
    Identity, open_as, path_from, read_head, same_content, search_dir, tail_at,
};
use crate::source::tail::lines::Assembler;
use crate::source::tail::watch;

/// How `paths` patterns match: `*` stops at `/`, `**` crosses it.
const GLOB: glob::MatchOptions = glob::MatchOptions {
    case_sensitive: true,
    require_literal_separator: true,
    require_literal_leading_dot: false,
};

/// Where and as what a newly tracked file is followed: its read position (and whether that is
/// inside a long line being skipped), its role, and why (for the log).
struct FollowFrom {
    pos: u64,
    skipping: bool,
    role: Role,
    why: &'static str,
}

impl Tailer {
    /// Regular files matched by `paths` and not by `exclude`, one path per identity, in pattern
    /// order then path order.
    pub(super) fn scan(&self) -> Vec<(PathBuf, Identity)> {
        let opts = GLOB;
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for pattern in &self.settings.cfg.patterns {
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
                .settings
                .cfg
                .patterns
                .iter()
                .any(|p| glob::Pattern::new(p).is_ok_and(|p| p.matches_path_with(path, GLOB)))
    }

    fn excluded(&self, path: &Path) -> bool {
        self.settings.cfg.exclude.iter().any(|e| {
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
    pub(super) fn watch_dirs(&mut self, candidates: &[(PathBuf, Identity)]) {
        let Some(w) = self.watcher else { return };
        let mut dirs: Vec<PathBuf> = candidates
            .iter()
            .filter_map(|(p, _)| p.parent().map(Path::to_path_buf))
            .collect();
        for pattern in &self.settings.cfg.patterns {
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
    pub(super) fn resume(&mut self, e: Entry, candidates: &[(PathBuf, Identity)], now: Instant) {
        let id = Identity {
            dev: e.dev,
            ino: e.ino,
        };
        let logical = path_from(&e.path);
        if let Some((path, _)) = candidates.iter().find(|(_, c)| *c == id) {
            if let Some((file, meta)) = open_as(path, id) {
                if same_content(&file, meta.len(), &e) {
                    let from = FollowFrom {
                        pos: e.offset,
                        skipping: e.skipping,
                        role: Role::Active,
                        why: "checkpoint",
                    };
                    self.track(file, &meta, logical, from, now);
                    return;
                }
                // Replaced or truncated while colibri was stopped: the scan reads it from its
                // start; the lines it had past the offset may be in a copy.
                self.stats.truncations.fetch_add(1, Relaxed);
                tracing::info!(source = %self.settings.cfg.name, path = %path.display(), offset = e.offset, "file truncated or replaced while colibri was stopped: reading it from its start");
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
                let from = FollowFrom {
                    pos: e.offset,
                    skipping: e.skipping,
                    role: Role::Rotated,
                    why: "rotated while stopped",
                };
                self.track(file, &meta, logical, from, now);
                return;
            }
        }
        self.recover_copy(&e, dir.as_deref(), logical, now);
    }

    /// Looks in `dir` for a copy of the entry's file holding its bytes up to the offset, and
    /// follows it from there: as an active file when the patterns match it (`app.log*` matches the
    /// copy `app.log.1`), so that it is not released and then found again as a new file and read
    /// whole; as a rotated one otherwise.
    pub(super) fn recover_copy(
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
            tracing::info!(source = %self.settings.cfg.name, path = %logical.display(), copy = %path.display(), offset = e.offset, "reading the rest of a truncated file from its copy");
            let copy = Identity::of(&meta);
            let role = if self.matched(&path) {
                Role::Active
            } else {
                Role::Rotated
            };
            let from = FollowFrom {
                pos: e.offset,
                skipping: e.skipping,
                role,
                why: "copy",
            };
            self.track(file, &meta, logical, from, now);
            return Some(copy);
        }
        None
    }

    /// Starts following a file the scan found and nobody follows yet.
    pub(super) fn discover(&mut self, path: &Path, now: Instant, first_life: bool) {
        let file = match File::open(path) {
            Ok(f) => f,
            Err(e) => {
                if self.unreadable.len() < 1000 && self.unreadable.insert(path.to_path_buf()) {
                    tracing::warn!(source = %self.settings.cfg.name, path = %path.display(), error = %e, "cannot open a matched file; it is skipped until it can be");
                }
                return;
            }
        };
        let Ok(meta) = file.metadata() else { return };
        if !meta.is_file() || self.is_tracked(Identity::of(&meta)) {
            return;
        }
        let (pos, role, why) = if first_life && self.settings.cfg.start_at == StartAt::End {
            (meta.len(), Role::Active, "new, start_at end")
        } else {
            (0, Role::New { since: now }, "new")
        };
        let from = FollowFrom {
            pos,
            skipping: false,
            role,
            why,
        };
        self.track(file, &meta, path.to_path_buf(), from, now);
    }

    /// Follows an opened file from `from`.
    fn track(
        &mut self,
        file: File,
        meta: &Metadata,
        path: PathBuf,
        from: FollowFrom,
        now: Instant,
    ) {
        let FollowFrom {
            pos,
            skipping,
            role,
            why,
        } = from;
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
        tracing::info!(source = %self.settings.cfg.name, path = %path.display(), offset = pos, size = meta.len(), why, "following file");
        self.stats.files_opened.fetch_add(1, Relaxed);
        self.files.push(Tracked {
            id,
            path_json: crate::record::json_string(&path.to_string_lossy()),
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
    pub(super) fn rescan(&mut self, now: Instant) {
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
                    tracing::info!(source = %self.settings.cfg.name, path = %f.path.display(), offset = f.pos, "file rotated or deleted: reading it to its end");
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
}
