//! Durable file operations shared by the parts that move files: `rename(2)` that never replaces,
//! directory fsync, numbered names for conflicts, an interruptible copy, and a durable move of one
//! file into a directory (rename, or copy + fsync + rename + remove across filesystems). It owns no
//! policy (which files, when, what a conflict means to the user): `task::file_move` and the store's
//! spool (archiving shipped files) call it.

use std::ffi::{OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// Numbered names tried before a move counts as failed.
pub const MAX_RENAME: u32 = 10_000;
/// Copy chunk; the stop flag is checked between chunks.
pub const COPY_CHUNK: usize = 256 * 1024;

/// `report.csv` → `report.<n>.csv`; `data` → `data.<n>`; `.hidden` → `.hidden.<n>`.
pub fn numbered(name: &OsStr, n: u32) -> OsString {
    let bytes = name.as_bytes();
    let (stem, ext) = match bytes.iter().rposition(|b| *b == b'.') {
        Some(i) if i > 0 => (&bytes[..i], &bytes[i..]),
        _ => (bytes, &b""[..]),
    };
    let mut out = stem.to_vec();
    out.extend_from_slice(format!(".{n}").as_bytes());
    out.extend_from_slice(ext);
    OsString::from_vec(out)
}

/// Whether anything (a file, a dangling symlink) has this name.
pub fn exists(path: &Path) -> io::Result<bool> {
    match fs::symlink_metadata(path) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Copies all of `src` into `dst`; false when `stop` was raised first.
pub fn copy_until_stopped(src: &mut File, dst: &mut File, stop: &AtomicBool) -> io::Result<bool> {
    let mut buf = vec![0u8; COPY_CHUNK];
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(false);
        }
        let n = match src.read(&mut buf) {
            Ok(0) => return Ok(true),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        dst.write_all(&buf[..n])?;
    }
}

/// Whether `copy` is a finished copy of `src`, as a cross-filesystem move leaves it when a crash
/// comes between placing the copy and removing the source: same length, same mtime (the copy keeps
/// it) and the same bytes. `false` when `copy` does not exist, or when `stop` interrupts.
pub fn is_copy_of(src: &Path, copy: &Path, stop: &AtomicBool) -> io::Result<bool> {
    let (a, b) = match (fs::metadata(src), fs::symlink_metadata(copy)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) => return Err(e),
        (_, Err(e)) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        (_, Err(e)) => return Err(e),
    };
    if !b.is_file() || a.len() != b.len() || a.modified()? != b.modified()? {
        return Ok(false);
    }
    let (mut x, mut y) = (File::open(src)?, File::open(copy)?);
    let (mut bx, mut by) = (vec![0u8; COPY_CHUNK], vec![0u8; COPY_CHUNK]);
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(false);
        }
        let n = read_full(&mut x, &mut bx)?;
        if n != read_full(&mut y, &mut by)? || bx[..n] != by[..n] {
            return Ok(false);
        }
        if n < COPY_CHUNK {
            return Ok(true);
        }
    }
}

/// Reads until `buf` is full or the file ends.
fn read_full(f: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// rename(2) that never replaces: `renameat2(RENAME_NOREPLACE)`, or, on a filesystem without it,
/// a check then a rename (a name created between the two is replaced; rare and documented).
pub fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    use std::ffi::CString;
    let c = |p: &Path| {
        CString::new(p.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))
    };
    let (f, t) = (c(from)?, c(to)?);
    // SAFETY: both pointers are valid NUL-terminated strings for the duration of the call.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EINVAL) | Some(libc::ENOSYS) | Some(libc::ENOTSUP) => {
            if exists(to)? {
                Err(io::ErrorKind::AlreadyExists.into())
            } else {
                fs::rename(from, to)
            }
        }
        _ => Err(e),
    }
}

/// Bytes available to unprivileged writers on the filesystem holding `dir` (statvfs).
pub fn free_bytes(dir: &Path) -> Option<u64> {
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: zeroed is a valid bit pattern for this plain C struct.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `s` a valid statvfs owned by this frame.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut s) };
    #[expect(
        clippy::useless_conversion,
        reason = "the field types differ between targets (u64 on x86_64 glibc, u32 elsewhere)"
    )]
    (rc == 0).then(|| u64::from(s.f_bavail).saturating_mul(u64::from(s.f_frsize)))
}

pub fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Puts something under `name` in `dir`, or the first free numbered name (`name.1.ext`, ...):
/// `put(dst)` must fail with `AlreadyExists` rather than replace. Returns where it went.
pub fn place_numbered(
    dir: &Path,
    name: &OsStr,
    mut put: impl FnMut(&Path) -> io::Result<()>,
) -> io::Result<PathBuf> {
    for n in 0..=MAX_RENAME {
        let dst = if n == 0 {
            dir.join(name)
        } else {
            dir.join(numbered(name, n))
        };
        match put(&dst) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            r => return r.map(|()| dst),
        }
    }
    Err(io::Error::other(format!(
        "no free name in {} after {MAX_RENAME} numbered tries",
        dir.display()
    )))
}

/// Copies `src` to a temporary name in `dir`, fsyncs it (keeping its mode and mtime), and returns
/// the temporary path; false in the pair when `stop` was raised (the temporary file is removed).
pub fn copy_to_temp(src: &Path, dir: &Path, stop: &AtomicBool) -> io::Result<Option<PathBuf>> {
    let mut tmp_name = OsString::from(".");
    tmp_name.push(src.file_name().unwrap_or(OsStr::new("file")));
    tmp_name.push(".colibri-tmp");
    let tmp = dir.join(tmp_name);
    let result = (|| {
        let mut input = File::open(src)?;
        let meta = input.metadata()?;
        let mut out = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        if !copy_until_stopped(&mut input, &mut out, stop)? {
            return Ok(false);
        }
        out.set_permissions(fs::Permissions::from_mode(
            meta.permissions().mode() & 0o7777,
        ))?;
        out.set_modified(meta.modified()?)?;
        out.sync_all()?;
        Ok(true)
    })();
    match result {
        Ok(true) => Ok(Some(tmp)),
        other => {
            let _ = fs::remove_file(&tmp);
            other.map(|_| None)
        }
    }
}

/// Moves the file `src` into `dir` as `name` (numbered when taken), durably: a rename and fsync of
/// both directories on one filesystem; across filesystems a copy to a temporary name, fsync, rename
/// into place, fsync of `dir`, then removal of `src` and fsync of its directory. A crash leaves the
/// file in one place, or in both with identical content.
pub fn move_into(src: &Path, dir: &Path, name: &OsStr) -> io::Result<PathBuf> {
    let src_dir = src.parent().unwrap_or(Path::new("."));
    match place_numbered(dir, name, |dst| rename_noreplace(src, dst)) {
        Ok(dst) => {
            fsync_dir(dir)?;
            fsync_dir(src_dir)?;
            Ok(dst)
        }
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
            let never = AtomicBool::new(false);
            let tmp = copy_to_temp(src, dir, &never)?.expect("never stopped");
            let placed = place_numbered(dir, name, |dst| rename_noreplace(&tmp, dst));
            let dst = match placed {
                Ok(d) => d,
                Err(e) => {
                    let _ = fs::remove_file(&tmp);
                    return Err(e);
                }
            };
            fsync_dir(dir)?;
            fs::remove_file(src)?;
            fsync_dir(src_dir)?;
            Ok(dst)
        }
        Err(e) => Err(e),
    }
}

/// FNV-1a, 64 bits: the fingerprint of a file's first bytes and of the bytes before an offset. Stable
/// across builds (it is stored in checkpoints), cheap for 256 bytes.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbered_names() {
        assert_eq!(numbered(OsStr::new("a.csv"), 1), "a.1.csv");
        assert_eq!(numbered(OsStr::new("a.tar.gz"), 2), "a.tar.2.gz");
        assert_eq!(numbered(OsStr::new("data"), 3), "data.3");
        assert_eq!(numbered(OsStr::new(".hidden"), 1), ".hidden.1");
    }

    #[test]
    fn move_into_numbers_a_taken_name_and_keeps_the_content() {
        let d = tempfile::tempdir().unwrap();
        let (a, b) = (d.path().join("a"), d.path().join("b"));
        fs::create_dir_all(&a).unwrap();
        fs::create_dir_all(&b).unwrap();
        fs::write(a.join("x.csv"), "new").unwrap();
        fs::write(b.join("x.csv"), "old").unwrap();
        let dst = move_into(&a.join("x.csv"), &b, OsStr::new("x.csv")).unwrap();
        assert_eq!(dst, b.join("x.1.csv"));
        assert_eq!(fs::read_to_string(&dst).unwrap(), "new");
        assert_eq!(fs::read_to_string(b.join("x.csv")).unwrap(), "old");
        assert!(!a.join("x.csv").exists());
    }

    #[test]
    fn copy_to_temp_keeps_mtime_and_a_raised_stop_leaves_nothing() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("s");
        fs::write(&src, "content").unwrap();
        let when = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        File::options()
            .write(true)
            .open(&src)
            .unwrap()
            .set_modified(when)
            .unwrap();
        let out = d.path().join("out");
        fs::create_dir(&out).unwrap();
        let tmp = copy_to_temp(&src, &out, &AtomicBool::new(false))
            .unwrap()
            .unwrap();
        assert_eq!(fs::read_to_string(&tmp).unwrap(), "content");
        assert_eq!(fs::metadata(&tmp).unwrap().modified().unwrap(), when);
        fs::remove_file(&tmp).unwrap();
        assert!(
            copy_to_temp(&src, &out, &AtomicBool::new(true))
                .unwrap()
                .is_none()
        );
        assert_eq!(fs::read_dir(&out).unwrap().count(), 0);
    }

    #[test]
    fn the_hash_is_fnv1a() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_ne!(fnv1a(b"ab"), fnv1a(b"ba"));
    }
}
