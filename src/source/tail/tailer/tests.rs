//! The tailer on real files in a temporary directory, without inotify (every step looks at every
//! file) and with an explicit clock.

use super::*;

use std::io::Write;
use std::time::Duration;

use crate::record::filter::Filter;
use crate::source::tail::batch::Limits;
use crate::source::tail::identity::same_content;
use crate::source::tail::lines::MultilineConfig;
use crate::source::tail::{Exclude, StartAt, TailConfig, WatchMode};

fn config(dir: &Path, patterns: &[&str]) -> TailConfig {
    TailConfig {
        name: "t".into(),
        stream: "s".into(),
        paths: patterns.iter().map(|p| p.to_string()).collect(),
        patterns: patterns
            .iter()
            .map(|p| format!("{}/{p}", dir.display()))
            .collect(),
        exclude: Vec::new(),
        start_at: StartAt::Beginning,
        filter: Filter::default(),
        max_line_bytes: 1024,
        multiline: None,
        fields: crate::source::tail::record::Fields::ALL,
        labels: Vec::new(),
        format: crate::source::tail::Format::Text,
        watch: WatchMode::Poll,
        poll_interval: Duration::from_millis(10),
        scan_interval: Duration::from_secs(1),
        rotate_wait: Duration::from_secs(1),
    }
}

fn settings(cfg: TailConfig) -> Settings {
    Settings::new(Arc::new(cfg), None, 1 << 30)
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Rec {
    line: String,
    path: String,
    offset: u64,
}

struct Rig {
    dir: tempfile::TempDir,
    settings: Settings,
    now: Instant,
    t: Option<Tailer>,
    /// The last checkpoint a step produced.
    cp: Option<Vec<u8>>,
    limits: Limits,
    /// Records of each step.
    steps: Vec<usize>,
}

impl Rig {
    fn new(patterns: &[&str], tweak: impl FnOnce(&mut TailConfig)) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(dir.path(), patterns);
        tweak(&mut cfg);
        Rig {
            dir,
            settings: settings(cfg),
            now: Instant::now(),
            t: None,
            cp: None,
            limits: Limits::default(),
            steps: Vec::new(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn name(&self, rec: &Rec) -> String {
        Path::new(&rec.path)
            .strip_prefix(self.dir.path())
            .unwrap()
            .display()
            .to_string()
    }

    fn append(&self, name: &str, text: &str) {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path(name))
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }

    /// Starts (again) from the last checkpoint, as after a crash.
    fn start(&mut self) {
        self.start_lost(false);
    }

    /// Starts; `lost`: the checkpoint may have been in a damaged store file.
    fn start_lost(&mut self, lost: bool) {
        self.t = None;
        self.t = Some(Tailer::start(
            self.settings.clone(),
            self.cp.as_deref(),
            lost,
            None,
            Arc::new(TailStats::default()),
            self.now,
        ));
    }

    fn advance(&mut self, d: Duration) {
        self.now += d;
    }

    /// Steps (rescanning, looking at every file) until nothing more comes; returns the records.
    fn drain(&mut self) -> Vec<Rec> {
        self.drain_scanning(true)
    }

    /// [`Rig::drain`], with or without the glob scans the driver makes every `scan_interval`.
    fn drain_scanning(&mut self, rescan: bool) -> Vec<Rec> {
        let mut out = Vec::new();
        for _ in 0..100 {
            let mut b = Batch::new(self.limits);
            let input = StepInput {
                events: Vec::new(),
                rescan,
                check_all: true,
            };
            self.t.as_mut().unwrap().step(&input, &mut b, self.now);
            if let Some(cp) = b.checkpoint.take() {
                self.cp = Some(cp);
            }
            let done = b.records.is_empty();
            self.steps.push(b.records.len());
            out.extend(b.records.iter().map(|r| {
                let v: serde_json::Value = serde_json::from_slice(r).unwrap();
                Rec {
                    line: v["line"].as_str().unwrap().to_string(),
                    path: v["path"].as_str().unwrap().to_string(),
                    offset: v["offset"].as_u64().unwrap(),
                }
            }));
            if done && !self.t.as_ref().unwrap().has_work() {
                return out;
            }
        }
        panic!("the tailer never ran out of work");
    }

    fn lines(&mut self) -> Vec<String> {
        self.drain().into_iter().map(|r| r.line).collect()
    }

    fn stats(&self) -> &TailStats {
        &self.t.as_ref().unwrap().stats
    }

    fn checkpoint(&self) -> Checkpoint {
        checkpoint::decode(self.cp.as_deref().unwrap()).unwrap()
    }
}

/// `n` lines `tag-<i>` of about 60 bytes, from `from`.
fn numbered(tag: &str, from: usize, n: usize) -> String {
    (from..from + n)
        .map(|i| format!("{tag}-{i:05} some padding to make the line longer than a few bytes\n"))
        .collect()
}

fn names(tag: &str, from: usize, n: usize) -> Vec<String> {
    numbered(tag, from, n).lines().map(str::to_string).collect()
}

#[test]
fn lines_come_with_path_and_offset_and_resume_at_the_checkpoint() {
    let mut r = Rig::new(&["*.log"], |_| {});
    r.append("a.log", "one\ntwo\r\nthr");
    r.start();
    let recs = r.drain();
    assert_eq!(
        recs.iter()
            .map(|x| (x.line.as_str(), x.offset))
            .collect::<Vec<_>>(),
        vec![("one", 0), ("two", 4)]
    );
    assert_eq!(r.name(&recs[0]), "a.log");
    assert_eq!(
        r.checkpoint().files[0].offset,
        9,
        "the incomplete line is not covered"
    );
    r.append("a.log", "ee\nfour\n");
    // A crash: the new tailer resumes at the checkpoint.
    r.start();
    assert_eq!(r.lines(), vec!["three", "four"]);
    r.start();
    assert!(r.lines().is_empty());
}

#[test]
fn start_at_end_applies_only_to_files_of_the_first_life() {
    let mut r = Rig::new(&["*.log"], |c| c.start_at = StartAt::End);
    r.append("old.log", "old 1\nold 2\n");
    r.start();
    assert!(r.lines().is_empty());
    r.append("old.log", "old 3\n");
    r.append("new.log", "new 1\n");
    let mut lines = r.lines();
    lines.sort();
    assert_eq!(lines, vec!["new 1", "old 3"]);
    // A later life: a file that appeared meanwhile is new, read from its start.
    r.append("late.log", "late 1\n");
    r.start();
    assert_eq!(r.lines(), vec!["late 1"]);
}

/// A checkpoint lost with a damaged store: `start_at: end` would skip what was not yet read, so
/// the files are read from their beginning (lines twice rather than none).
#[test]
fn a_checkpoint_lost_with_a_damaged_store_reads_from_the_beginning_despite_start_at_end() {
    let mut r = Rig::new(&["*.log"], |c| c.start_at = StartAt::End);
    r.append("a.log", "one\ntwo\n");
    r.start_lost(true);
    assert_eq!(r.lines(), vec!["one", "two"]);
}

#[test]
fn a_reused_inode_or_rewritten_file_is_read_from_its_start() {
    let mut r = Rig::new(&["a.log"], |_| {});
    r.append("a.log", &numbered("first", 0, 10));
    r.start();
    assert_eq!(r.lines(), names("first", 0, 10));
    let before = r.checkpoint().files[0].clone();
    // While stopped: same inode, different content, longer than the old offset (so the size alone
    // does not tell). This is what a reused inode looks like.
    std::fs::write(r.path("a.log"), numbered("second", 0, 20)).unwrap();
    let meta = std::fs::metadata(r.path("a.log")).unwrap();
    assert_eq!((meta.dev(), meta.ino()), (before.dev, before.ino));
    r.start();
    assert_eq!(r.lines(), names("second", 0, 20));
    assert_eq!(r.stats().truncations.load(Relaxed), 1);

    // A file shorter than 256 bytes: fingerprinted over what it had, extended as it grows.
    let mut r = Rig::new(&["b.log"], |_| {});
    r.append("b.log", "short 1\n");
    r.start();
    assert_eq!(r.lines(), vec!["short 1"]);
    assert_eq!(r.checkpoint().files[0].fp_len, 8);
    r.append("b.log", &numbered("more", 0, 5));
    assert_eq!(r.lines(), names("more", 0, 5));
    assert_eq!(r.checkpoint().files[0].fp_len, 256);
    std::fs::write(
        r.path("b.log"),
        format!("short 2\n{}", numbered("other", 0, 9)),
    )
    .unwrap();
    r.start();
    let mut want = vec!["short 2".to_string()];
    want.extend(names("other", 0, 9));
    assert_eq!(r.lines(), want);
}

#[test]
fn identity_needs_device_inode_and_both_fingerprints() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    std::fs::write(&path, numbered("x", 0, 10)).unwrap();
    let file = File::open(&path).unwrap();
    let size = file.metadata().unwrap().len();
    let head = read_head(&file, size);
    assert_eq!(head.len(), FP_BYTES);
    let (fp_len, fp) = (head.len() as u16, hash(&head));
    let e = Entry {
        path: Vec::new(),
        dev: 0,
        ino: 0,
        fp_len,
        fp,
        offset: 300,
        tail: tail_at(&file, 300).unwrap(),
        skipping: false,
    };
    assert!(same_content(&file, size, &e));
    assert!(!same_content(
        &file,
        size,
        &Entry {
            fp: fp ^ 1,
            ..e.clone()
        }
    ));
    assert!(!same_content(
        &file,
        size,
        &Entry {
            tail: e.tail ^ 1,
            ..e.clone()
        }
    ));
    assert!(!same_content(&file, 299, &e), "shorter than the offset");
    assert!(!same_content(
        &file,
        size,
        &Entry {
            offset: size + 1,
            ..e.clone()
        }
    ));
    assert_eq!(window(10), (0, 10));
    assert_eq!(window(1000), (744, 256));
    assert_eq!(tail_at(&file, 0), Some(hash(b"")));
}

#[test]
fn rename_rotation_reads_the_old_file_to_its_end_then_releases_it() {
    let mut r = Rig::new(&["app.log"], |_| {});
    r.append("app.log", &numbered("a", 0, 5));
    r.start();
    assert_eq!(r.lines(), names("a", 0, 5));
    // The writer keeps its descriptor across the rename and writes two more lines (one without
    // a newline) before it reopens.
    let mut writer = std::fs::OpenOptions::new()
        .append(true)
        .open(r.path("app.log"))
        .unwrap();
    std::fs::rename(r.path("app.log"), r.path("app.log.1")).unwrap();
    writer.write_all(numbered("a", 5, 1).as_bytes()).unwrap();
    writer.write_all(b"a-last").unwrap();
    r.append("app.log", &numbered("b", 0, 3));
    let recs = r.drain();
    let lines: Vec<&str> = recs.iter().map(|x| x.line.as_str()).collect();
    assert_eq!(lines[..1], names("a", 5, 1)[..], "{lines:?}");
    assert_eq!(lines[1..], names("b", 0, 3)[..], "{lines:?}");
    assert_eq!(
        r.name(&recs[0]),
        "app.log",
        "the rotated file keeps its name"
    );
    assert_eq!(r.stats().rotations.load(Relaxed), 1);
    assert_eq!(r.t.as_ref().unwrap().files(), 2);
    // Quiet for rotate_wait: released, its last line emitted.
    r.advance(Duration::from_millis(1100));
    let recs = r.drain();
    assert_eq!(recs.len(), 1, "{recs:?}");
    assert_eq!(recs[0].line, "a-last");
    assert_eq!(r.t.as_ref().unwrap().files(), 1);
    assert_eq!(r.stats().files_released.load(Relaxed), 1);
    assert_eq!(r.checkpoint().files.len(), 1);
    drop(writer);
}

#[test]
fn a_rotation_while_stopped_is_read_from_the_renamed_file() {
    let mut r = Rig::new(&["app.log"], |_| {});
    r.append("app.log", &numbered("a", 0, 5));
    r.start();
    assert_eq!(r.lines(), names("a", 0, 5));
    r.append("app.log", &numbered("a", 5, 2));
    std::fs::rename(r.path("app.log"), r.path("app.log.1")).unwrap();
    r.append("app.log", &numbered("b", 0, 2));
    r.start();
    let mut want = names("a", 5, 2);
    want.extend(names("b", 0, 2));
    assert_eq!(r.lines(), want);
}

#[test]
fn copy_truncate_reads_the_unread_lines_from_the_copy() {
    for matched_copy in [false, true] {
        let pattern = if matched_copy { "app.log*" } else { "app.log" };
        let mut r = Rig::new(&[pattern], |_| {});
        r.append("app.log", &numbered("a", 0, 10));
        r.start();
        assert_eq!(r.lines(), names("a", 0, 10));
        // Lines not read yet, then copy and truncate, then new lines.
        r.append("app.log", &numbered("a", 10, 5));
        if matched_copy {
            // The copy is seen before the truncation: held, not read.
            std::fs::copy(r.path("app.log"), r.path("app.log.1")).unwrap();
            assert_eq!(r.lines(), names("a", 10, 5));
            r.append("app.log", &numbered("a", 15, 3));
            std::fs::copy(r.path("app.log"), r.path("app.log.1")).unwrap();
        } else {
            std::fs::copy(r.path("app.log"), r.path("app.log.1")).unwrap();
        }
        std::fs::write(r.path("app.log"), numbered("b", 0, 4)).unwrap();
        let recs = r.drain();
        let lines: Vec<String> = recs.iter().map(|x| x.line.clone()).collect();
        let mut want = if matched_copy {
            names("a", 15, 3)
        } else {
            names("a", 10, 5)
        };
        want.extend(names("b", 0, 4));
        assert_eq!(lines, want, "matched copy: {matched_copy}");
        assert!(recs.iter().all(|x| r.name(x) == "app.log"), "{recs:?}");
        // The copy is not read again later.
        r.advance(Duration::from_secs(5));
        assert!(r.lines().is_empty());
        r.start();
        assert!(r.lines().is_empty(), "matched copy: {matched_copy}");
    }
}

#[test]
fn copy_truncate_while_stopped_is_recovered_from_the_copy() {
    let mut r = Rig::new(&["app.log"], |_| {});
    r.append("app.log", &numbered("a", 0, 10));
    r.start();
    assert_eq!(r.lines(), names("a", 0, 10));
    r.append("app.log", &numbered("a", 10, 5));
    std::fs::copy(r.path("app.log"), r.path("app.log.1")).unwrap();
    std::fs::write(r.path("app.log"), numbered("b", 0, 4)).unwrap();
    r.start();
    let mut want = names("a", 10, 5);
    want.extend(names("b", 0, 4));
    assert_eq!(r.lines(), want);
}

/// The same when the patterns match the copy too (`app.log*`): the copy, followed from the
/// original's read position, is not released after `rotate_wait` and then found by the next scan
/// as a new file and read whole.
#[test]
fn a_copy_recovered_at_start_is_not_read_again_when_the_patterns_match_it() {
    let mut r = Rig::new(&["app.log*"], |_| {});
    r.append("app.log", &numbered("a", 0, 10));
    r.start();
    assert_eq!(r.lines(), names("a", 0, 10));
    r.append("app.log", &numbered("a", 10, 5));
    std::fs::copy(r.path("app.log"), r.path("app.log.1")).unwrap();
    std::fs::write(r.path("app.log"), numbered("b", 0, 4)).unwrap();
    r.start();
    let lines = |r: &mut Rig, rescan| -> Vec<String> {
        r.drain_scanning(rescan)
            .into_iter()
            .map(|x| x.line)
            .collect()
    };
    let mut want = names("a", 10, 5);
    want.extend(names("b", 0, 4));
    assert_eq!(lines(&mut r, false), want);
    // rotate_wait passes before the next scan, which then looks at the directory again.
    r.advance(Duration::from_secs(2));
    assert_eq!(lines(&mut r, false), Vec::<String>::new());
    assert_eq!(lines(&mut r, true), Vec::<String>::new());
}

#[test]
fn a_backup_copy_is_read_past_the_read_position_and_a_lookalike_read_whole() {
    let mut r = Rig::new(&["*.log"], |_| {});
    r.append("app.log", &numbered("a", 0, 10));
    r.start();
    assert_eq!(r.lines(), names("a", 0, 10));
    std::fs::copy(r.path("app.log"), r.path("backup.log")).unwrap();
    // Same first 256 bytes, different afterwards.
    let head: String = numbered("a", 0, 10).chars().take(300).collect();
    r.append("lookalike.log", &format!("{head}\n{}", numbered("z", 0, 3)));
    assert!(r.lines().is_empty(), "both held");
    r.advance(Duration::from_millis(1100));
    let lines = r.lines();
    assert!(!lines.iter().any(|l| l.starts_with("a-00009")), "{lines:?}");
    assert!(lines.ends_with(&names("z", 0, 3)), "{lines:?}");
    r.append("backup.log", "appended to the backup\n");
    assert_eq!(r.lines(), vec!["appended to the backup"]);
}

/// A banner of more than 256 bytes that every log file of an app starts with.
fn banner() -> String {
    (0..5)
        .map(|i| {
            format!("=== app 1.2.3 started, banner line {i} with some padding to be long ===\n")
        })
        .collect()
}

#[test]
fn a_new_file_with_the_same_banner_is_read_whole() {
    // app.log is renamed to app.log.1 (still matched) and a new app.log starts with the same
    // banner: held like a copy at first, but it does not hold what app.log.1 was read to.
    for (old, new) in [(20, 0), (20, 3), (3, 20)] {
        let mut r = Rig::new(&["app.log*"], |_| {});
        r.append("app.log", &(banner() + &numbered("a", 0, old)));
        r.start();
        assert_eq!(r.lines().len(), 5 + old);
        std::fs::rename(r.path("app.log"), r.path("app.log.1")).unwrap();
        r.append("app.log", &(banner() + &numbered("b", 0, new)));
        assert!(r.lines().is_empty(), "held at first");
        r.advance(Duration::from_millis(1100));
        let recs = r.drain();
        let mut want: Vec<String> = banner().lines().map(str::to_string).collect();
        want.extend(names("b", 0, new));
        assert_eq!(
            recs.iter().map(|x| x.line.clone()).collect::<Vec<_>>(),
            want
        );
        assert!(recs.iter().all(|x| r.name(x) == "app.log"), "{recs:?}");
        assert_eq!(recs[0].offset, 0);
        r.append("app.log", "later\n");
        assert_eq!(r.lines(), vec!["later"]);
        r.advance(Duration::from_secs(5));
        assert!(r.lines().is_empty());
        r.start();
        assert!(r.lines().is_empty(), "nothing twice after a restart");
    }
}

#[test]
fn a_small_backup_copy_is_not_read_again() {
    let mut r = Rig::new(&["*.log"], |_| {});
    r.append("app.log", "one\ntwo\n");
    r.start();
    assert_eq!(r.lines(), vec!["one", "two"]);
    std::fs::copy(r.path("app.log"), r.path("backup.log")).unwrap();
    assert!(r.lines().is_empty());
    r.advance(Duration::from_millis(1100));
    assert!(r.lines().is_empty(), "its lines were read from app.log");
    r.append("backup.log", "three\n");
    assert_eq!(r.lines(), vec!["three"]);
}

#[test]
fn a_slow_copy_is_held_until_it_is_complete() {
    let mut r = Rig::new(&["app.log*"], |_| {});
    r.append("app.log", &numbered("a", 0, 20));
    r.start();
    assert_eq!(r.lines(), names("a", 0, 20));
    r.append("app.log", &numbered("a", 20, 2));
    let whole = std::fs::read(r.path("app.log")).unwrap();
    // The copy grows slower than rotate_wait.
    for part in [300, 600, 900] {
        std::fs::write(r.path("app.log.1"), &whole[..part]).unwrap();
        let lines = r.lines();
        assert!(lines.iter().all(|l| l.starts_with("a-0002")), "{lines:?}");
        r.advance(Duration::from_millis(1100));
    }
    std::fs::write(r.path("app.log.1"), &whole).unwrap();
    std::fs::write(r.path("app.log"), numbered("b", 0, 2)).unwrap();
    assert_eq!(r.lines(), names("b", 0, 2));
    r.advance(Duration::from_secs(5));
    assert!(
        r.lines().is_empty(),
        "the copy's lines were read from app.log"
    );
}

#[test]
fn a_truncated_file_is_read_again_from_its_start() {
    let mut r = Rig::new(&["a.log"], |_| {});
    r.append("a.log", &numbered("a", 0, 10));
    r.start();
    assert_eq!(r.lines(), names("a", 0, 10));
    std::fs::OpenOptions::new()
        .write(true)
        .open(r.path("a.log"))
        .unwrap()
        .set_len(0)
        .unwrap();
    r.append("a.log", "after\n");
    assert_eq!(r.lines(), vec!["after"]);
    assert_eq!(r.stats().truncations.load(Relaxed), 1);
}

#[test]
fn a_deleted_file_is_released_and_a_new_one_read() {
    let mut r = Rig::new(&["a.log"], |_| {});
    r.append("a.log", "x\n");
    r.start();
    assert_eq!(r.lines(), vec!["x"]);
    std::fs::remove_file(r.path("a.log")).unwrap();
    assert!(r.lines().is_empty());
    assert_eq!(r.t.as_ref().unwrap().files(), 1, "kept for rotate_wait");
    r.advance(Duration::from_millis(1100));
    assert!(r.lines().is_empty());
    assert_eq!(r.t.as_ref().unwrap().files(), 0);
    r.append("a.log", "y\n");
    assert_eq!(r.lines(), vec!["y"]);
}

#[test]
fn long_lines_are_cut_and_a_crash_inside_one_skips_its_rest() {
    let mut r = Rig::new(&["a.log"], |c| c.max_line_bytes = 10);
    r.append("a.log", "short\n0123456789abcdef");
    r.start();
    assert_eq!(r.lines(), vec!["short", "0123456789"]);
    assert!(r.checkpoint().files[0].skipping);
    assert_eq!(r.stats().truncated_lines.load(Relaxed), 1);
    r.append("a.log", "ghij\nnext\n");
    r.start();
    assert_eq!(r.lines(), vec!["next"]);
}

#[test]
fn multiline_groups_are_checkpointed_at_their_start() {
    let mut r = Rig::new(&["a.log"], |c| {
        c.multiline = Some(MultilineConfig {
            start: regex_lite::Regex::new(r"^\d").unwrap(),
            max_lines: 100,
            max_bytes: 10_000,
            timeout: Duration::from_secs(1),
        })
    });
    r.append("a.log", "1 boom\n  at a\n  at b\n2 next\n  at c\n");
    r.start();
    let recs = r.drain();
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].line, "1 boom\n  at a\n  at b");
    let group_start = "1 boom\n  at a\n  at b\n".len() as u64;
    assert_eq!(r.checkpoint().files[0].offset, group_start);
    // A crash with a group pending: it is assembled again.
    r.start();
    assert!(r.lines().is_empty());
    r.advance(Duration::from_millis(1100));
    let recs = r.drain();
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].line, "2 next\n  at c");
    assert_eq!(recs[0].offset, group_start);
}

#[test]
fn filters_advance_the_checkpoint_without_records() {
    let mut r = Rig::new(&["a.log"], |c| {
        c.filter.exclude = vec![regex_lite::Regex::new("noise").unwrap()];
    });
    r.append("a.log", "noise 1\nnoise 2\n");
    r.start();
    assert!(r.lines().is_empty());
    assert_eq!(r.checkpoint().files[0].offset, 16);
    assert_eq!(r.stats().filtered_lines.load(Relaxed), 2);
}

#[test]
fn excluded_files_are_not_followed() {
    let mut r = Rig::new(&["*"], |c| {
        c.exclude = vec![Exclude {
            pattern: glob::Pattern::new("*.gz").unwrap(),
            name_only: true,
            text: "*.gz".into(),
        }]
    });
    r.append("a.log", "a\n");
    r.append("a.log.1.gz", "binary\n");
    r.start();
    assert_eq!(r.lines(), vec!["a"]);
}

#[test]
fn a_copy_seen_while_being_written_is_not_read_twice() {
    let mut r = Rig::new(&["app.log*"], |_| {});
    r.append("app.log", &numbered("a", 0, 10));
    r.start();
    assert_eq!(r.lines(), names("a", 0, 10));
    r.append("app.log", &numbered("a", 10, 5));
    // cp has created the copy and written its first 100 bytes.
    let whole = std::fs::read(r.path("app.log")).unwrap();
    std::fs::write(r.path("app.log.1"), &whole[..100]).unwrap();
    assert_eq!(r.lines(), names("a", 10, 5), "the copy is not read yet");
    std::fs::write(r.path("app.log.1"), &whole).unwrap();
    std::fs::write(r.path("app.log"), numbered("b", 0, 2)).unwrap();
    assert_eq!(r.lines(), names("b", 0, 2));
    r.advance(Duration::from_secs(5));
    assert!(r.lines().is_empty());
}

#[test]
fn a_batch_holds_what_the_stream_takes_in_one_append() {
    // 3 records a job, 2 jobs an append: a read stops in the middle of a buffer and goes on
    // there at the next step, also after the file was looked at again in between.
    let mut r = Rig::new(&["a.log"], |_| {});
    r.limits = Limits {
        job_records: 3,
        job_bytes: 1 << 20,
        jobs: 2,
        records: 1000,
        bytes: 1 << 20,
    };
    r.append("a.log", &numbered("a", 0, 20));
    r.start();
    assert_eq!(r.lines(), names("a", 0, 20));
    assert!(r.steps.iter().all(|&n| n <= 6), "{:?}", r.steps);
    assert_eq!(
        r.checkpoint().files[0].offset,
        numbered("a", 0, 20).len() as u64
    );
}

#[test]
fn a_quiet_round_gives_the_read_buffer_back_and_the_next_read_takes_one_again() {
    let mut r = Rig::new(&["*.log"], |_| {});
    r.append("a.log", &numbered("a", 0, 10));
    r.start();
    let step = |r: &mut Rig| {
        let mut b = Batch::new(r.limits);
        let input = StepInput {
            events: Vec::new(),
            rescan: true,
            check_all: true,
        };
        r.t.as_mut().unwrap().step(&input, &mut b, r.now);
        let buf = r.t.as_ref().unwrap().buf.capacity();
        (b.records.len(), buf)
    };
    let (records, buf) = step(&mut r);
    assert_eq!(records, 10);
    assert!(
        buf >= r.settings.chunk,
        "a round that read keeps its buffer"
    );
    r.advance(QUIET - Duration::from_millis(1));
    let (records, buf) = step(&mut r);
    assert_eq!(records, 0);
    assert!(
        buf >= r.settings.chunk,
        "a source quiet for less than QUIET keeps it"
    );
    r.advance(Duration::from_millis(1));
    assert_eq!(step(&mut r), (0, 0), "then it gives it back");
    assert_eq!(step(&mut r), (0, 0));
    r.append("a.log", &numbered("a", 10, 2));
    let (records, buf) = step(&mut r);
    assert_eq!(records, 2);
    assert!(buf >= r.settings.chunk);
}
