//! What tells one followed file from another and from a copy of it: its [`Identity`] (device
//! and inode), the fingerprints of its bytes (the first 256, the 256 before a read position),
//! opening a path only while it is still the same file, and searching a directory for a renamed
//! file or a copy. Plain blocking file I/O on positions; it keeps no state.
//!
//! What these checks mean for a file's role (active, rotated, held) is the tailer's; who calls
//! them is `tailer.rs` and `tailer/discover.rs`.

use std::ffi::OsString;
use std::fs::{File, Metadata};
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::checkpoint::Entry;
use super::record::FP_BYTES;
use crate::files::fnv1a as hash;

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

pub(super) fn read_full_at(file: &File, buf: &mut [u8], mut offset: u64) -> io::Result<usize> {
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
pub(super) fn window(offset: u64) -> (u64, usize) {
    let len = offset.min(FP_BYTES as u64);
    (offset - len, len as usize)
}

/// The hash of `len` bytes at `at`, if the file has them all.
pub(super) fn hash_at(file: &File, at: u64, len: usize) -> Option<u64> {
    let mut b = [0u8; FP_BYTES];
    match read_full_at(file, &mut b[..len], at) {
        Ok(n) if n == len => Some(hash(&b[..len])),
        _ => None,
    }
}

pub(super) fn tail_at(file: &File, offset: u64) -> Option<u64> {
    let (start, len) = window(offset);
    hash_at(file, start, len)
}

/// The first min(size, 256) bytes of a file of `size` bytes.
pub(super) fn read_head(file: &File, size: u64) -> Vec<u8> {
    let mut b = vec![0u8; size.min(FP_BYTES as u64) as usize];
    let n = read_full_at(file, &mut b, 0).unwrap_or(0);
    b.truncate(n);
    b
}

pub(super) fn mtime(m: &Metadata) -> (i64, i64) {
    (m.mtime(), m.mtime_nsec())
}

pub(super) fn path_from(bytes: &[u8]) -> PathBuf {
    PathBuf::from(OsString::from_vec(bytes.to_vec()))
}

/// Whether `file` is the file `e` describes, at least `e.offset` long with the same bytes at its
/// start and before the offset.
pub(super) fn same_content(file: &File, size: u64, e: &Entry) -> bool {
    size >= e.offset
        && hash_at(file, 0, e.fp_len as usize) == Some(e.fp)
        && tail_at(file, e.offset) == Some(e.tail)
}

/// Opens `path` if it still is the file `id`.
pub(super) fn open_as(path: &Path, id: Identity) -> Option<(File, Metadata)> {
    let file = File::open(path).ok()?;
    let meta = file.metadata().ok()?;
    (meta.is_file() && Identity::of(&meta) == id).then_some((file, meta))
}

/// The first regular file in `dir` (at most [`DIR_SEARCH_LIMIT`] entries looked at) that `pred`
/// accepts.
pub(super) fn search_dir(
    dir: &Path,
    mut pred: impl FnMut(&Path, &Metadata) -> bool,
) -> Option<PathBuf> {
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
