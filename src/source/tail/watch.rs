//! inotify, driven by tokio's `AsyncFd`: the descriptor is readable when events are queued, so a
//! quiet set of files costs no wake-ups at all. [`Watcher`] adds and removes watches from any thread
//! (the tailer runs on the blocking pool); [`Inotify`] waits for and reads events on the event loop.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use tokio::io::unix::AsyncFd;

/// What a followed file reports: writes and truncation (`IN_MODIFY`), a changed link count
/// (`IN_ATTRIB`: deleted), renamed or deleted.
pub const FILE_MASK: u32 =
    libc::IN_MODIFY | libc::IN_ATTRIB | libc::IN_MOVE_SELF | libc::IN_DELETE_SELF;
/// What a directory that may hold matches reports: entries created, renamed or deleted.
pub const DIR_MASK: u32 = libc::IN_CREATE
    | libc::IN_MOVED_TO
    | libc::IN_MOVED_FROM
    | libc::IN_DELETE
    | libc::IN_DELETE_SELF
    | libc::IN_MOVE_SELF
    | libc::IN_ONLYDIR;

/// One event; names are not needed (a directory event triggers a rescan).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// -1 for a queue overflow.
    pub wd: i32,
    pub mask: u32,
}

/// Adds and removes watches. Valid while its [`Inotify`] lives.
#[derive(Debug, Clone, Copy)]
pub struct Watcher {
    fd: RawFd,
}

impl Watcher {
    pub fn add(&self, path: &Path, mask: u32) -> io::Result<i32> {
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with a NUL byte"))?;
        // SAFETY: a valid C string and the inotify descriptor this watcher belongs to.
        let wd = unsafe { libc::inotify_add_watch(self.fd, c.as_ptr(), mask) };
        if wd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(wd)
    }

    /// A watch on an open file's inode, whatever its path has become.
    pub fn add_fd(&self, fd: RawFd, mask: u32) -> io::Result<i32> {
        self.add(Path::new(&format!("/proc/self/fd/{fd}")), mask)
    }

    pub fn remove(&self, wd: i32) {
        // SAFETY: plain integers; a watch the kernel already dropped gives EINVAL, which is fine.
        unsafe { libc::inotify_rm_watch(self.fd, wd) };
    }
}

pub struct Inotify {
    fd: AsyncFd<OwnedFd>,
    buf: Vec<u8>,
}

impl Inotify {
    /// A non-blocking inotify instance registered with the running tokio runtime.
    pub fn new() -> io::Result<(Inotify, Watcher)> {
        // SAFETY: no pointers; the result is checked.
        let raw = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor we just created and own.
        let owned = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: `owned` is an open OwnedFd moved into the AsyncFd, which keeps it open and returns
        // the same raw fd from every as_raw_fd() until it is dropped.
        let fd = unsafe { AsyncFd::register_with_interest(owned, tokio::io::Interest::READABLE) }
            .map_err(io::Error::from)?;
        Ok((
            Inotify {
                fd,
                buf: vec![0; 64 * 1024],
            },
            Watcher { fd: raw },
        ))
    }

    /// Waits until events are queued, then appends every queued event to `out`.
    pub async fn read(&mut self, out: &mut Vec<Event>) -> io::Result<()> {
        loop {
            let mut guard = self.fd.readable().await?;
            let buf = &mut self.buf;
            let mut got = false;
            loop {
                match guard.try_io(|fd| {
                    // SAFETY: a buffer of buf.len() writable bytes.
                    let n =
                        unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
                    if n < 0 {
                        Err(io::Error::last_os_error())
                    } else {
                        Ok(n as usize)
                    }
                }) {
                    Ok(Ok(n)) => {
                        parse(&buf[..n], out);
                        got = true;
                    }
                    Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                    Ok(Err(e)) => return Err(e),
                    // Drained: readiness cleared by try_io.
                    Err(_would_block) => break,
                }
            }
            if got {
                return Ok(());
            }
        }
    }
}

/// Parses `struct inotify_event` records.
fn parse(mut bytes: &[u8], out: &mut Vec<Event>) {
    const HEAD: usize = 16; // wd, mask, cookie, len
    while bytes.len() >= HEAD {
        let word = |i: usize| u32::from_ne_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
        let (wd, mask, len) = (word(0) as i32, word(4), word(12) as usize);
        out.push(Event { wd, mask });
        bytes = &bytes[(HEAD + len).min(bytes.len())..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_parsed() {
        let mut raw = Vec::new();
        for (wd, mask, name) in [
            (1i32, libc::IN_MODIFY, &b""[..]),
            (2, libc::IN_CREATE, b"abc\0\0\0\0\0"),
        ] {
            raw.extend_from_slice(&wd.to_ne_bytes());
            raw.extend_from_slice(&mask.to_ne_bytes());
            raw.extend_from_slice(&0u32.to_ne_bytes());
            raw.extend_from_slice(&(name.len() as u32).to_ne_bytes());
            raw.extend_from_slice(name);
        }
        let mut out = Vec::new();
        parse(&raw, &mut out);
        assert_eq!(
            out,
            vec![
                Event {
                    wd: 1,
                    mask: libc::IN_MODIFY
                },
                Event {
                    wd: 2,
                    mask: libc::IN_CREATE
                }
            ]
        );
    }

    #[tokio::test]
    async fn writes_to_a_watched_file_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.log");
        std::fs::write(&path, b"a\n").unwrap();
        let (mut ino, w) = Inotify::new().unwrap();
        let f = std::fs::File::open(&path).unwrap();
        let fwd = w.add_fd(f.as_raw_fd(), FILE_MASK).unwrap();
        let dwd = w.add(dir.path(), DIR_MASK).unwrap();
        assert_ne!(fwd, dwd);
        use std::io::Write;
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"b\n")
            .unwrap();
        std::fs::write(dir.path().join("new.log"), b"x").unwrap();
        let mut events = Vec::new();
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while !(events
            .iter()
            .any(|e: &Event| e.wd == fwd && e.mask & libc::IN_MODIFY != 0)
            && events
                .iter()
                .any(|e| e.wd == dwd && e.mask & libc::IN_CREATE != 0))
        {
            tokio::time::timeout_at(deadline, ino.read(&mut events))
                .await
                .expect("events within 10 s")
                .unwrap();
        }
        w.remove(fwd);
    }
}
