//! The `file_move` handler: takes the settled files of one directory whose names match the task's
//! globs and moves them into another directory, so that a crash at any moment leaves each file in
//! exactly one place (or, across filesystems, in both with identical content, never in neither).
//!
//! It owns the scan (glob on the name, `exclude`, regular files only, settled by mtime age, oldest
//! first, at most `max_files`), the conflict policy, and both ways of moving: `rename(2)` on one
//! filesystem (then fsync of both directories), and on `EXDEV` copy to a temporary name in `to`, fsync,
//! rename into place, fsync `to`, remove the source, fsync `from`. The file work is synchronous and
//! runs on the blocking pool; a timeout or shutdown stops it between files (or between chunks of a
//! copy, whose temporary file is then removed). Called by `task::run`; it does not retry or log the
//! run's outcome (that is `task::run`), and it never creates `from` or `to`. With `to_stream`
//! instead of `to`, files go into the data directory's spool and are queued for delivery
//! ([`ship`]).

mod ship;
pub use ship::Ship;

use std::ffi::{OsStr, OsString};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use super::{Attempt, Needs, Outcome, RunContext};
use crate::files::{copy_to_temp, exists, fsync_dir, is_copy_of, place_numbered, rename_noreplace};
use crate::store::writer::StoreHandle;
pub use config::FileMoveSpec as Spec;

mod config;

/// What to do when a file's name is already in `to`; also the file's word (`on_conflict:`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum OnConflict {
    /// `name.1.ext`, `name.2.ext`, ... (the first free one; the default).
    #[default]
    Rename,
    /// Replace the existing file (atomically: rename over it).
    Overwrite,
    /// Leave the file in `from`.
    Skip,
}

#[derive(Debug, Clone)]
pub struct FileMove {
    pub from: PathBuf,
    /// The destination directory (with `ship`: the spool directory).
    pub to: PathBuf,
    /// Set for `to_stream`: files are spooled and queued instead of moved.
    pub ship: Option<Ship>,
    /// On the file name; any match takes the file.
    pub pattern: Vec<glob::Pattern>,
    pub exclude: Vec<glob::Pattern>,
    /// Minimum mtime age.
    pub settle: Duration,
    pub on_conflict: OnConflict,
    pub max_files: usize,
}

/// What one run did, file by file.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub moved: u64,
    /// Left in `from` by `on_conflict: skip`.
    pub skipped: u64,
    pub failed: u64,
    /// Matching files left for a later run: not settled, changed while being moved, beyond
    /// `max_files`, or not reached before a stop.
    pub waiting: u64,
}

/// A matching, settled file as the scan saw it.
#[derive(Debug, Clone)]
struct Candidate {
    name: OsString,
    len: u64,
    mtime: SystemTime,
}

/// How one file ended.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    Moved(PathBuf),
    Skipped,
    /// Its size or mtime changed since the scan: it is being written; next run.
    Changed,
    /// The stop flag was raised during a copy.
    Stopped,
    /// The stream (or the disk) has no room for it: it waits in `from`.
    NoRoom(String),
    /// Larger than its stream can ever hold: it stays in `from`, untouched (`ship` logs it,
    /// summarised, since every run finds it again). Counted as failed; it does not fail the run.
    NeverFits,
}

/// What the blocking part reports.
#[derive(Debug, Default)]
struct Report {
    counts: Counts,
    /// The scan failed (e.g. `from` is gone): nothing was moved.
    scan_error: Option<String>,
    /// The first file that failed, and why.
    first_failure: Option<String>,
    /// Why files had to wait for room in the stream, when they did.
    no_room: Option<String>,
}

impl crate::task::kind::Settings for FileMove {
    /// With `to_stream`: its stream and its spool.
    fn needs(&self) -> Needs<'_> {
        Needs {
            stream: self.ship.as_ref().map(|ship| ship.stream.as_str()),
            spool: self.ship.as_ref().map(|ship| ship.spool_dir.as_path()),
            sink_settings: false,
        }
    }
}

impl crate::task::kind::Handler for FileMove {
    fn run(
        &self,
        _task: &str,
        _due: chrono::DateTime<chrono::Utc>,
        timeout: Duration,
        ctx: &RunContext,
    ) -> impl std::future::Future<Output = Attempt> + Send {
        FileMove::run(self, timeout, ctx)
    }
}

impl FileMove {
    /// Runs one attempt: the file work on the blocking pool, stopped between files on timeout or
    /// abort (the attempt then waits for the file in progress to finish or be rolled back).
    pub async fn run(&self, timeout: Duration, ctx: &RunContext) -> Attempt {
        let job = self.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let store = ctx.store.clone();
        let mut work = tokio::task::spawn_blocking(move || {
            job.run_blocking(SystemTime::now(), &flag, store.as_ref())
        });
        let (kind, joined) = tokio::select! {
            r = &mut work => (None, r),
            _ = tokio::time::sleep(timeout) => {
                stop.store(true, Ordering::Relaxed);
                (Some(Outcome::TimedOut), work.await)
            }
            _ = ctx.abort.cancelled() => {
                stop.store(true, Ordering::Relaxed);
                (Some(Outcome::Cancelled), work.await)
            }
        };
        let report = match joined {
            Ok(r) => r,
            Err(e) => Report {
                scan_error: Some(format!("the file work panicked: {e}")),
                ..Report::default()
            },
        };
        let c = report.counts;
        let outcome = match (kind, report.scan_error, report.first_failure) {
            (Some(k), _, _) => k,
            (None, Some(e), _) => Outcome::Failed(e),
            (None, None, Some(first)) => Outcome::Failed(format!(
                "{} of {} files failed; first: {first}",
                c.failed,
                c.failed + c.moved
            )),
            // Back-pressure: nothing could be queued; the files wait in `from`.
            (None, None, None) if c.moved == 0 && report.no_room.is_some() => {
                Outcome::Failed(format!(
                    "{}; {} files wait",
                    report.no_room.unwrap_or_default(),
                    c.waiting
                ))
            }
            (None, None, None) => Outcome::Ok,
        };
        Attempt {
            outcome,
            exit: None,
            pid: None,
            stdout: String::new(),
            stderr: String::new(),
            files: Some(c),
            records: None,
            values: None,
        }
    }

    /// The synchronous run: scan, then move each candidate until done or `stop`.
    fn run_blocking(
        &self,
        now: SystemTime,
        stop: &AtomicBool,
        store: Option<&StoreHandle>,
    ) -> Report {
        let mut report = Report::default();
        let ship = match (&self.ship, store) {
            (None, _) => None,
            (Some(s), Some(store)) => Some((s, store)),
            (Some(_), None) => {
                report.scan_error = Some("the store is not open".into());
                return report;
            }
        };
        let _claim = match ship {
            Some((s, _)) => match ship::claim(&s.spool_dir) {
                Some(c) => Some(c),
                None => {
                    report.scan_error = Some(
                        "a run of this task from before a reload is still going; this run waits for the next".into(),
                    );
                    return report;
                }
            },
            None => None,
        };
        if let Some((s, store)) = ship
            && !s.recovered.load(Ordering::Relaxed)
            && let Err(e) = ship::recover(self, s, store, stop)
        {
            report.scan_error = Some(format!(
                "cannot check the spool {}: {e}",
                s.spool_dir.display()
            ));
            return report;
        }
        let (candidates, waiting) = match self.scan(now) {
            Ok(s) => s,
            Err(e) => {
                report.scan_error = Some(format!("cannot read {}: {e}", self.from.display()));
                return report;
            }
        };
        report.counts.waiting = waiting;
        let mut rest = candidates.len() as u64;
        for c in &candidates {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            rest -= 1;
            let step = match ship {
                Some((s, store)) => ship::ship_one(self, s, c, store, stop),
                None => self.move_one(c, stop),
            };
            match step {
                Ok(Step::Moved(dst)) => {
                    report.counts.moved += 1;
                    tracing::debug!(from = %self.from.join(&c.name).display(), to = %dst.display(), "file moved");
                }
                Ok(Step::Skipped) => report.counts.skipped += 1,
                Ok(Step::Changed) | Ok(Step::Stopped) => report.counts.waiting += 1,
                Ok(Step::NeverFits) => report.counts.failed += 1,
                Ok(Step::NoRoom(why)) => {
                    // The rest would not fit either: they wait for the next run.
                    report.counts.waiting += 1 + rest;
                    rest = 0;
                    report.no_room = Some(why);
                    break;
                }
                Err(e) => {
                    report.counts.failed += 1;
                    if report.first_failure.is_none() {
                        report.first_failure =
                            Some(format!("{}: {e}", self.from.join(&c.name).display()));
                    }
                }
            }
        }
        // Not reached because of a stop: still waiting.
        report.counts.waiting += rest;
        report
    }

    fn wanted(&self, name: &OsStr) -> bool {
        let Some(name) = name.to_str() else {
            // Globs are text; a name that is not UTF-8 matches only through its lossy form.
            return self.wanted_str(&name.to_string_lossy());
        };
        self.wanted_str(name)
    }

    fn wanted_str(&self, name: &str) -> bool {
        let opts = glob::MatchOptions {
            case_sensitive: true,
            require_literal_separator: true,
            require_literal_leading_dot: true,
        };
        self.pattern.iter().any(|p| p.matches_with(name, opts))
            && !self.exclude.iter().any(|p| p.matches_with(name, opts))
    }

    /// The settled matching regular files, oldest first, at most `max_files`; and how many matching
    /// files wait (not settled, or beyond `max_files`).
    fn scan(&self, now: SystemTime) -> io::Result<(Vec<Candidate>, u64)> {
        let mut found = Vec::new();
        let mut waiting = 0;
        for entry in fs::read_dir(&self.from)? {
            let entry = entry?;
            let name = entry.file_name();
            if !self.wanted(&name) {
                continue;
            }
            // Not following symlinks: only regular files are moved.
            let Ok(meta) = entry.metadata() else {
                continue; // removed since the listing
            };
            if !meta.is_file() {
                continue;
            }
            let mtime = meta.modified()?;
            // A future mtime (clock set back) is not settled.
            let settled = now
                .duration_since(mtime)
                .is_ok_and(|age| age >= self.settle);
            if !settled {
                waiting += 1;
                continue;
            }
            found.push(Candidate {
                name,
                len: meta.len(),
                mtime,
            });
        }
        found.sort_by(|a, b| a.mtime.cmp(&b.mtime).then_with(|| a.name.cmp(&b.name)));
        if found.len() > self.max_files {
            waiting += (found.len() - self.max_files) as u64;
            found.truncate(self.max_files);
        }
        Ok((found, waiting))
    }

    /// True when the file at `path` still has the size and mtime the scan saw.
    fn unchanged(path: &Path, c: &Candidate) -> io::Result<bool> {
        let m = fs::symlink_metadata(path)?;
        Ok(m.is_file() && m.len() == c.len && m.modified()? == c.mtime)
    }

    fn move_one(&self, c: &Candidate, stop: &AtomicBool) -> io::Result<Step> {
        let src = self.from.join(&c.name);
        if !Self::unchanged(&src, c)? {
            return Ok(Step::Changed);
        }
        let placed = self.place(&c.name, |dst, replace| {
            if replace {
                fs::rename(&src, dst)
            } else {
                rename_noreplace(&src, dst)
            }
        });
        match placed {
            Err(e) if e.raw_os_error() == Some(libc::EXDEV) => self.move_across(c, stop),
            Err(e) => Err(e),
            Ok(None) => Ok(Step::Skipped),
            Ok(Some(dst)) => {
                // The new entry first: if the crash comes between the two, the rename is durable
                // in `to`, and the old entry at worst reappears as a second name of the same file.
                fsync_dir(&self.to)?;
                fsync_dir(&self.from)?;
                Ok(Step::Moved(dst))
            }
        }
    }

    /// Moves a file to another filesystem: copy to a temporary name in `to`, fsync it, rename it
    /// into place, fsync `to`, then remove the source and fsync `from`. A crash leaves the file in
    /// `from`, or in both with identical content, which the next attempt recognises and finishes;
    /// a left-over temporary file is overwritten by the next attempt at the same name.
    fn move_across(&self, c: &Candidate, stop: &AtomicBool) -> io::Result<Step> {
        let src_path = self.from.join(&c.name);
        let dst = self.to.join(&c.name);
        if is_copy_of(&src_path, &dst, stop)? {
            // The copy of an earlier move that a crash interrupted before the source was
            // removed: finish that move rather than place a second copy under a numbered name.
            fs::remove_file(&src_path)?;
            fsync_dir(&self.from)?;
            return Ok(Step::Moved(dst));
        }
        if self.on_conflict == OnConflict::Skip && exists(&dst)? {
            return Ok(Step::Skipped); // no copy for nothing
        }
        // A left-over temporary file (a crash mid-copy) is overwritten by this attempt.
        let Some(tmp) = copy_to_temp(&src_path, &self.to, stop)? else {
            return Ok(Step::Stopped);
        };
        let result = (|| {
            // Written to while we copied: not settled after all; try again next run.
            if !Self::unchanged(&src_path, c)? {
                return Ok(Step::Changed);
            }
            let placed = self.place(&c.name, |dst, replace| {
                if replace {
                    fs::rename(&tmp, dst)
                } else {
                    rename_noreplace(&tmp, dst)
                }
            })?;
            let Some(dst) = placed else {
                return Ok(Step::Skipped);
            };
            fsync_dir(&self.to)?;
            // Only now, with the copy durable under its final name, does the source go.
            fs::remove_file(&src_path)?;
            fsync_dir(&self.from)?;
            Ok(Step::Moved(dst))
        })();
        if !matches!(result, Ok(Step::Moved(_))) {
            let _ = fs::remove_file(&tmp);
        }
        result
    }

    /// Puts the file under its name in `to` by the conflict policy. `put(dst, replace)` performs the
    /// rename; with `replace` false it must fail with `AlreadyExists` rather than replace. Returns the
    /// destination, or `None` when skipped.
    fn place(
        &self,
        name: &OsStr,
        mut put: impl FnMut(&Path, bool) -> io::Result<()>,
    ) -> io::Result<Option<PathBuf>> {
        let dst = self.to.join(name);
        match self.on_conflict {
            OnConflict::Overwrite => put(&dst, true).map(|()| Some(dst)),
            OnConflict::Skip => match put(&dst, false) {
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(None),
                r => r.map(|()| Some(dst)),
            },
            OnConflict::Rename => place_numbered(&self.to, name, |dst| put(dst, false)).map(Some),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;

    struct Dirs {
        _root: tempfile::TempDir,
        from: PathBuf,
        to: PathBuf,
    }

    fn dirs() -> Dirs {
        let root = tempfile::tempdir().unwrap();
        let from = root.path().join("from");
        let to = root.path().join("to");
        fs::create_dir(&from).unwrap();
        fs::create_dir(&to).unwrap();
        Dirs {
            _root: root,
            from,
            to,
        }
    }

    fn task(d: &Dirs, pattern: &[&str], on_conflict: OnConflict) -> FileMove {
        FileMove {
            ship: None,
            from: d.from.clone(),
            to: d.to.clone(),
            pattern: pattern
                .iter()
                .map(|p| glob::Pattern::new(p).unwrap())
                .collect(),
            exclude: vec![],
            settle: Duration::from_secs(60),
            on_conflict,
            max_files: 1000,
        }
    }

    /// Writes `dir/name` with `text` and an mtime `age` in the past.
    fn write_aged(dir: &Path, name: &str, text: &str, age: Duration) {
        let path = dir.join(name);
        fs::write(&path, text).unwrap();
        let f = File::options().write(true).open(&path).unwrap();
        f.set_modified(SystemTime::now() - age).unwrap();
    }

    const OLD: Duration = Duration::from_secs(3600);

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    fn run(t: &FileMove) -> Report {
        t.run_blocking(SystemTime::now(), &AtomicBool::new(false), None)
    }

    #[test]
    fn only_settled_files_are_moved() {
        let d = dirs();
        let t = task(&d, &["*.csv"], OnConflict::Rename);
        write_aged(&d.from, "old.csv", "old", OLD);
        write_aged(&d.from, "fresh.csv", "fresh", Duration::from_secs(5));
        write_aged(&d.from, "old.txt", "not matched", OLD);
        write_aged(&d.from, ".hidden.csv", "hidden", OLD);
        let r = run(&t);
        assert_eq!(
            r.counts,
            Counts {
                moved: 1,
                skipped: 0,
                failed: 0,
                waiting: 1
            }
        );
        assert_eq!(names(&d.to), ["old.csv"]);
        assert_eq!(fs::read_to_string(d.to.join("old.csv")).unwrap(), "old");
        assert_eq!(names(&d.from), [".hidden.csv", "fresh.csv", "old.txt"]);
        // Once settled, it goes too.
        File::options()
            .write(true)
            .open(d.from.join("fresh.csv"))
            .unwrap()
            .set_modified(SystemTime::now() - OLD)
            .unwrap();
        assert_eq!(run(&t).counts.moved, 1);
        assert_eq!(names(&d.to), ["fresh.csv", "old.csv"]);
    }

    #[test]
    fn a_file_written_after_the_scan_is_not_taken() {
        let d = dirs();
        let t = task(&d, &["*"], OnConflict::Rename);
        write_aged(&d.from, "a.log", "first", OLD);
        let (cands, _) = t.scan(SystemTime::now()).unwrap();
        assert_eq!(cands.len(), 1);
        fs::write(d.from.join("a.log"), "first and more").unwrap();
        let stop = AtomicBool::new(false);
        assert_eq!(t.move_one(&cands[0], &stop).unwrap(), Step::Changed);
        assert_eq!(t.move_across(&cands[0], &stop).unwrap(), Step::Changed);
        assert_eq!(names(&d.to), Vec::<String>::new(), "no temp file is left");
        assert_eq!(names(&d.from), ["a.log"]);
    }

    #[test]
    fn excluded_names_stay() {
        let d = dirs();
        let mut t = task(&d, &["*.csv", "*.json"], OnConflict::Rename);
        t.exclude = vec![glob::Pattern::new("draft-*").unwrap()];
        write_aged(&d.from, "a.csv", "a", OLD);
        write_aged(&d.from, "b.json", "b", OLD);
        write_aged(&d.from, "draft-c.csv", "c", OLD);
        assert_eq!(run(&t).counts.moved, 2);
        assert_eq!(names(&d.to), ["a.csv", "b.json"]);
        assert_eq!(names(&d.from), ["draft-c.csv"]);
    }

    #[test]
    fn directories_and_symlinks_are_not_taken() {
        let d = dirs();
        let t = task(&d, &["*"], OnConflict::Rename);
        fs::create_dir(d.from.join("sub")).unwrap();
        write_aged(&d.to, "target", "x", OLD);
        std::os::unix::fs::symlink(d.to.join("target"), d.from.join("link")).unwrap();
        assert_eq!(run(&t).counts, Counts::default());
        assert_eq!(names(&d.from), ["link", "sub"]);
    }

    #[test]
    fn conflict_rename_numbers_the_name() {
        let d = dirs();
        let t = task(&d, &["*"], OnConflict::Rename);
        write_aged(&d.to, "r.csv", "existing", OLD);
        write_aged(&d.to, "r.1.csv", "existing 1", OLD);
        write_aged(&d.to, "plain", "existing", OLD);
        write_aged(&d.from, "r.csv", "new", OLD);
        write_aged(&d.from, "plain", "new plain", OLD);
        assert_eq!(run(&t).counts.moved, 2);
        assert_eq!(fs::read_to_string(d.to.join("r.csv")).unwrap(), "existing");
        assert_eq!(fs::read_to_string(d.to.join("r.2.csv")).unwrap(), "new");
        assert_eq!(
            fs::read_to_string(d.to.join("plain.1")).unwrap(),
            "new plain"
        );
        assert!(names(&d.from).is_empty());
    }

    #[test]
    fn conflict_overwrite_replaces() {
        let d = dirs();
        let t = task(&d, &["*"], OnConflict::Overwrite);
        write_aged(&d.to, "o.csv", "existing", OLD);
        write_aged(&d.from, "o.csv", "new", OLD);
        assert_eq!(run(&t).counts.moved, 1);
        assert_eq!(names(&d.to), ["o.csv"]);
        assert_eq!(fs::read_to_string(d.to.join("o.csv")).unwrap(), "new");
        assert!(names(&d.from).is_empty());
    }

    #[test]
    fn conflict_skip_leaves_the_file() {
        let d = dirs();
        let t = task(&d, &["*"], OnConflict::Skip);
        write_aged(&d.to, "s.csv", "existing", OLD);
        write_aged(&d.from, "s.csv", "new", OLD);
        write_aged(&d.from, "t.csv", "other", OLD);
        let r = run(&t);
        assert_eq!((r.counts.moved, r.counts.skipped), (1, 1));
        assert_eq!(fs::read_to_string(d.to.join("s.csv")).unwrap(), "existing");
        assert_eq!(names(&d.from), ["s.csv"]);
    }

    #[test]
    fn max_files_bounds_a_run_oldest_first() {
        let d = dirs();
        let mut t = task(&d, &["*.dat"], OnConflict::Rename);
        t.max_files = 3;
        for i in 0..5u64 {
            // f0 is the oldest.
            write_aged(
                &d.from,
                &format!("f{i}.dat"),
                "x",
                OLD + Duration::from_secs(100 * (5 - i)),
            );
        }
        let r = run(&t);
        assert_eq!((r.counts.moved, r.counts.waiting), (3, 2));
        assert_eq!(names(&d.to), ["f0.dat", "f1.dat", "f2.dat"]);
        assert_eq!(run(&t).counts.moved, 2);
        assert!(names(&d.from).is_empty());
    }

    #[test]
    fn cross_filesystem_path_copies_then_removes_the_source() {
        let d = dirs();
        let t = task(&d, &["*"], OnConflict::Rename);
        let big: String = (0..100_000).map(|i| format!("{i}\n")).collect();
        write_aged(&d.from, "big.txt", &big, OLD);
        write_aged(&d.to, "big.txt", "existing", OLD);
        let (cands, _) = t.scan(SystemTime::now()).unwrap();
        let stop = AtomicBool::new(false);
        let step = t.move_across(&cands[0], &stop).unwrap();
        assert_eq!(step, Step::Moved(d.to.join("big.1.txt")));
        assert_eq!(fs::read_to_string(d.to.join("big.1.txt")).unwrap(), big);
        let m = fs::metadata(d.to.join("big.1.txt")).unwrap();
        assert_eq!(m.modified().unwrap(), cands[0].mtime, "mtime kept");
        assert_eq!(names(&d.to), ["big.1.txt", "big.txt"], "no temp file left");
        assert!(names(&d.from).is_empty());

        // Overwrite and skip on the same path.
        write_aged(&d.from, "big.txt", "newer", OLD);
        let (cands, _) = t.scan(SystemTime::now()).unwrap();
        let mut skip = t.clone();
        skip.on_conflict = OnConflict::Skip;
        assert_eq!(skip.move_across(&cands[0], &stop).unwrap(), Step::Skipped);
        assert_eq!(names(&d.from), ["big.txt"]);
        let mut over = t.clone();
        over.on_conflict = OnConflict::Overwrite;
        assert_eq!(
            over.move_across(&cands[0], &stop).unwrap(),
            Step::Moved(d.to.join("big.txt"))
        );
        assert_eq!(fs::read_to_string(d.to.join("big.txt")).unwrap(), "newer");
        assert!(names(&d.from).is_empty());
    }

    /// A crash between placing the copy and removing the source leaves the file in both places:
    /// the next run removes the source instead of copying it again under a numbered name.
    #[test]
    fn a_move_across_filesystems_interrupted_before_the_removal_is_finished_not_repeated() {
        let d = dirs();
        let t = task(&d, &["*"], OnConflict::Rename);
        write_aged(&d.from, "a.dat", "the same bytes", OLD);
        let stop = AtomicBool::new(false);
        let tmp = copy_to_temp(&d.from.join("a.dat"), &d.to, &stop)
            .unwrap()
            .unwrap();
        fs::rename(&tmp, d.to.join("a.dat")).unwrap();
        let (cands, _) = t.scan(SystemTime::now()).unwrap();
        let step = t.move_across(&cands[0], &stop).unwrap();
        assert_eq!(step, Step::Moved(d.to.join("a.dat")));
        assert_eq!(names(&d.to), ["a.dat"]);
        assert!(names(&d.from).is_empty());
        // A different file under the same name is a conflict as before.
        write_aged(&d.from, "a.dat", "other bytes", OLD);
        let (cands, _) = t.scan(SystemTime::now()).unwrap();
        let step = t.move_across(&cands[0], &stop).unwrap();
        assert_eq!(step, Step::Moved(d.to.join("a.1.dat")));
    }

    #[test]
    fn a_stopped_copy_leaves_the_source_and_no_temp_file() {
        let d = dirs();
        let t = task(&d, &["*"], OnConflict::Rename);
        write_aged(&d.from, "a", "content", OLD);
        let (cands, _) = t.scan(SystemTime::now()).unwrap();
        let stop = AtomicBool::new(true);
        assert_eq!(t.move_across(&cands[0], &stop).unwrap(), Step::Stopped);
        assert!(names(&d.to).is_empty());
        assert_eq!(names(&d.from), ["a"]);
        // A raised flag before the loop leaves every file waiting.
        let r = t.run_blocking(SystemTime::now(), &stop, None);
        assert_eq!(r.counts.waiting, 1);
    }

    #[tokio::test]
    async fn the_attempt_reports_counts_and_failures() {
        let d = dirs();
        let t = task(&d, &["*"], OnConflict::Rename);
        write_aged(&d.from, "a", "a", OLD);
        let ctx = RunContext {
            stopping: Default::default(),
            abort: Default::default(),
            groups: Default::default(),
            store: None,
        };
        let a = t.run(Duration::from_secs(5), &ctx).await;
        assert_eq!(a.outcome, Outcome::Ok);
        assert_eq!(a.files.unwrap().moved, 1);
        fs::remove_dir(&d.from).unwrap();
        let a = t.run(Duration::from_secs(5), &ctx).await;
        assert!(
            matches!(&a.outcome, Outcome::Failed(r) if r.contains("cannot read")),
            "{:?}",
            a.outcome
        );
    }
}
