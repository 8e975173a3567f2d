//! Where the salvager reads from: [`ReadAt`] (a file, or bytes in memory for tests and the fuzz
//! target) and [`Reader`], which reads bounded windows at given offsets and counts the bytes it
//! read. It never reads a whole file at once and never trusts a length it was not given by the
//! source itself. Used only by the salvager's page walk.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Bytes readable at any offset: the damaged file, or a slice in memory.
pub trait ReadAt {
    /// The length in bytes (what a read can reach).
    fn len(&self) -> u64;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Reads into `buf` from `offset`; fewer bytes only at the end.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
}

impl ReadAt for [u8] {
    fn len(&self) -> u64 {
        <[u8]>::len(self) as u64
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        let src = self.get(start..).unwrap_or_default();
        let n = src.len().min(buf.len());
        buf[..n].copy_from_slice(&src[..n]);
        Ok(n)
    }
}

/// The file's length is taken once, when the salvage starts: a file that changes under the
/// salvager is read as it was then, and a read past its end is short.
pub struct FileSource {
    file: File,
    len: u64,
}

impl FileSource {
    pub fn new(file: File) -> io::Result<Self> {
        let len = file.metadata()?.len();
        Ok(FileSource { file, len })
    }
}

impl ReadAt for FileSource {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            let at = offset.saturating_add(done as u64);
            match self.file.read_at(&mut buf[done..], at) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }
}

/// Reads windows of the source, counting what it read. The last window read is kept, so the
/// walk's several looks at one page (its type, then as each kind of leaf) read it once.
pub struct Reader<'a, R: ReadAt + ?Sized> {
    src: &'a R,
    len: u64,
    /// Bytes read from the source so far (a byte read again later counts again).
    pub bytes_read: u64,
    last: (u64, Vec<u8>),
}

impl<'a, R: ReadAt + ?Sized> Reader<'a, R> {
    pub fn new(src: &'a R) -> Self {
        Reader {
            len: src.len(),
            src,
            bytes_read: 0,
            last: (0, Vec::new()),
        }
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Up to `n` bytes at `offset`: fewer at the end of the source, none past it.
    pub fn read(&mut self, offset: u64, n: usize) -> io::Result<Vec<u8>> {
        let left = self.len.saturating_sub(offset);
        let n = n.min(usize::try_from(left).unwrap_or(usize::MAX));
        let (at, kept) = &self.last;
        if let Some(from) = offset
            .checked_sub(*at)
            .and_then(|d| usize::try_from(d).ok())
            && let Some(b) = from.checked_add(n).and_then(|end| kept.get(from..end))
        {
            return Ok(b.to_vec());
        }
        let mut buf = vec![0u8; n];
        let got = self.src.read_at(&mut buf, offset)?;
        buf.truncate(got);
        self.bytes_read += got as u64;
        // Keep a page-sized window (the page just looked at), never a large value.
        if got <= 4096 {
            self.last = (offset, buf.clone());
        }
        Ok(buf)
    }
}
