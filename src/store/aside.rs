//! Damaged store files moved aside: the name each gets (`colibri.redb.corrupt-<ms>`, the moment
//! it was moved, with `-2`, `-3`... when two are moved within the same millisecond, so a second
//! damaged file never replaces the first), moving one there, and listing those in a data
//! directory with their sizes (they count against `storage.max_bytes`, and `queue stats` and
//! `/metrics` show them until an operator removes them). Not the decision to move a file: that is
//! [`super::Store::open_or_replace`]'s. Used by `open` and `read`.

use std::path::{Path, PathBuf};

use super::error::StoreError;
use super::layout::DB_FILE;

/// What a moved-aside file's name starts with, after [`DB_FILE`].
const SUFFIX: &str = ".corrupt-";
/// What a moved-aside file's name ends with once its intact jobs were salvaged (so a restart does
/// not salvage them twice).
const SALVAGED: &str = ".salvaged";

/// One damaged store file kept beside the live one.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AsideFile {
    pub path: PathBuf,
    pub bytes: u64,
    /// When it was moved aside (from its name), ms since the epoch.
    pub moved_ms: u64,
    /// Its intact jobs were put back into the live store.
    pub salvaged: bool,
}

/// Renames a moved-aside file to say it was salvaged; returns the new name.
pub fn mark_salvaged(path: &Path) -> std::io::Result<PathBuf> {
    let mut name = path.as_os_str().to_owned();
    name.push(SALVAGED);
    let to = PathBuf::from(name);
    std::fs::rename(path, &to)?;
    if let Some(dir) = path.parent()
        && let Ok(d) = std::fs::File::open(dir)
    {
        let _ = d.sync_all();
    }
    Ok(to)
}

/// Moves `dir`'s store file to a name no other file has; returns that name.
pub(super) fn move_aside(dir: &Path, now_ms: u64) -> Result<PathBuf, StoreError> {
    let path = dir.join(DB_FILE);
    let aside = (1..)
        .map(|n| {
            let tail = if n == 1 {
                String::new()
            } else {
                format!("-{n}")
            };
            dir.join(format!("{DB_FILE}{SUFFIX}{now_ms}{tail}"))
        })
        .find(|p| std::fs::symlink_metadata(p).is_err())
        .expect("some suffix is free");
    std::fs::rename(&path, &aside).map_err(|e| {
        StoreError::io(format!(
            "cannot move the damaged store {} aside: {e}",
            path.display()
        ))
    })?;
    // The rename must survive a power cut, or the next start finds the damaged file again (and
    // moves it again: harmless) or, worse, neither name.
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(aside)
}

/// The damaged store files in `dir`, oldest first. A directory that cannot be read has none.
pub fn list(dir: &Path) -> Vec<AsideFile> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let prefix = format!("{DB_FILE}{SUFFIX}");
    let mut out: Vec<AsideFile> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let rest = name.to_str()?.strip_prefix(&prefix)?;
            let (rest, salvaged) = match rest.strip_suffix(SALVAGED) {
                Some(r) => (r, true),
                None => (rest, false),
            };
            let moved_ms = rest.split('-').next()?.parse().ok()?;
            let meta = e.metadata().ok().filter(|m| m.is_file())?;
            Some(AsideFile {
                path: e.path(),
                bytes: meta.len(),
                moved_ms,
                salvaged,
            })
        })
        .collect();
    out.sort_by(|a, b| (a.moved_ms, &a.path).cmp(&(b.moved_ms, &b.path)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_damaged_file_never_replaces_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let mut moved = Vec::new();
        for body in ["first", "second", "third"] {
            std::fs::write(dir.path().join(DB_FILE), body).unwrap();
            moved.push(move_aside(dir.path(), 1_700_000_000_000).unwrap());
        }
        let names: Vec<String> = moved
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "colibri.redb.corrupt-1700000000000",
                "colibri.redb.corrupt-1700000000000-2",
                "colibri.redb.corrupt-1700000000000-3"
            ]
        );
        assert_eq!(std::fs::read_to_string(&moved[0]).unwrap(), "first");
        assert!(!dir.path().join(DB_FILE).exists());
        std::fs::write(dir.path().join("colibri.redb.corrupt-nonsense"), "x").unwrap();
        std::fs::write(dir.path().join("other"), "x").unwrap();
        let listed = list(dir.path());
        assert_eq!(listed.len(), 3);
        assert_eq!(listed[1].path, moved[1]);
        assert_eq!(
            (listed[2].bytes, listed[2].moved_ms),
            (5, 1_700_000_000_000)
        );
        // Salvaged, it is still listed (and counted), as salvaged.
        let marked = mark_salvaged(&moved[1]).unwrap();
        assert!(
            marked.to_string_lossy().ends_with("-2.salvaged"),
            "{}",
            marked.display()
        );
        let listed = list(dir.path());
        assert_eq!(
            listed.iter().map(|f| f.salvaged).collect::<Vec<_>>(),
            [false, true, false]
        );
    }
}
