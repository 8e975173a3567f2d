//! The spool: files a `file_move` task with `to_stream` took from its directory, waiting in
//! `data_dir/spool/<task>/` for their file jobs to be delivered. This module owns the names there
//! (`<ms>-<random>-<original name>`, unique, and telling the original name back after a crash) and
//! what happens to a file once its job left the store ([`dispose`]: delete it, or move it to the
//! task's archive after delivery). Which files are queued, and when a file may go, is the store's
//! business (the SPOOL table); putting files in is the task's. Called by the store writer's
//! disposal thread, `colibri queue` and `task::file_move`.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use super::Disposal;

/// The spool's directory under the data directory.
pub const DIR: &str = "spool";
/// Bytes of the original name kept in a spooled file's name (NAME_MAX is 255; the prefix is 23).
const NAME_KEPT: usize = 200;
/// A file being copied into the spool from another filesystem: incomplete until renamed.
pub const PART_SUFFIX: &str = ".part";

/// The spool directory of one task, relative to the data directory.
pub fn task_dir(task: &str) -> PathBuf {
    Path::new(DIR).join(task)
}

/// A new unique name in the spool for a file called `original`: `<ms>-<random>-<original>`, the
/// original cut to [`NAME_KEPT`] bytes.
pub fn new_name(original: &OsStr, now_ms: u64) -> OsString {
    let mut out = format!("{now_ms:013}-{:08x}-", fastrand::u32(..)).into_bytes();
    let b = original.as_bytes();
    out.extend_from_slice(&b[..b.len().min(NAME_KEPT)]);
    OsString::from_vec(out)
}

/// The original name a spooled file's name carries (cut to [`NAME_KEPT`] bytes); `None` for a name
/// the spool did not make.
pub fn original_name(spooled: &OsStr) -> Option<&OsStr> {
    let b = spooled.as_bytes();
    let (ms, rest) = (b.get(..13)?, b.get(13..)?);
    let rest = rest.strip_prefix(b"-")?;
    let (rand, rest) = (rest.get(..8)?, rest.get(8..)?);
    let name = rest.strip_prefix(b"-")?;
    let ok = ms.iter().all(u8::is_ascii_digit) && rand.iter().all(u8::is_ascii_hexdigit);
    (ok && !name.is_empty()).then(|| OsStr::from_bytes(name))
}

/// Deletes a spooled file whose job left the store, or, when it was delivered and its task has an
/// archive, moves it there under its original name (numbered when taken). Done durably (the
/// directories are fsync'd) so the SPOOL entry may be forgotten afterwards; a file already gone
/// counts as done (the disposal is repeated after a crash).
pub fn dispose(data_dir: &Path, d: &Disposal) -> io::Result<()> {
    let path = data_dir.join(OsStr::from_bytes(&d.spool));
    let dir = path.parent().unwrap_or(data_dir);
    match &d.archive {
        None => match std::fs::remove_file(&path) {
            Ok(()) => crate::files::fsync_dir(dir),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        },
        Some(archive) => {
            if !path.exists() {
                return Ok(());
            }
            let archive = Path::new(OsStr::from_bytes(archive));
            let name = OsStr::from_bytes(&d.name);
            crate::files::move_into(&path, archive, name).map(drop)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spooled_names_are_unique_and_give_the_original_back() {
        let a = new_name(OsStr::new("scan 1.pdf"), 1_700_000_000_000);
        let b = new_name(OsStr::new("scan 1.pdf"), 1_700_000_000_000);
        assert_ne!(a, b);
        assert_eq!(original_name(&a), Some(OsStr::new("scan 1.pdf")));
        let long = "x".repeat(300);
        let n = new_name(OsStr::new(&long), 5);
        assert!(n.len() <= 255, "{}", n.len());
        assert_eq!(original_name(&n).map(OsStr::len), Some(NAME_KEPT));
        assert_eq!(original_name(OsStr::new("other-file")), None);
        assert_eq!(original_name(OsStr::new("0000000000005-zzzzzzzz-a")), None);
    }

    #[test]
    fn dispose_deletes_or_archives_and_repeats_harmlessly() {
        let d = tempfile::tempdir().unwrap();
        let data = d.path().join("data");
        let spool = data.join(task_dir("t"));
        std::fs::create_dir_all(&spool).unwrap();
        let archive = d.path().join("archive");
        std::fs::create_dir(&archive).unwrap();
        std::fs::write(spool.join("0000000000001-0000000a-a.csv"), "a").unwrap();
        std::fs::write(spool.join("0000000000001-0000000b-b.csv"), "b").unwrap();
        let rel = |n: &str| task_dir("t").join(n).into_os_string().into_vec();
        let del = Disposal {
            spool: rel("0000000000001-0000000a-a.csv"),
            name: b"a.csv".to_vec(),
            archive: None,
        };
        let arc = Disposal {
            spool: rel("0000000000001-0000000b-b.csv"),
            name: b"b.csv".to_vec(),
            archive: Some(archive.as_os_str().as_bytes().to_vec()),
        };
        dispose(&data, &del).unwrap();
        dispose(&data, &arc).unwrap();
        assert_eq!(std::fs::read_dir(&spool).unwrap().count(), 0);
        assert_eq!(std::fs::read_to_string(archive.join("b.csv")).unwrap(), "b");
        // After a crash the same disposals come again: nothing left to do, no error.
        dispose(&data, &del).unwrap();
        dispose(&data, &arc).unwrap();
        assert_eq!(std::fs::read_dir(&archive).unwrap().count(), 1);
    }
}
