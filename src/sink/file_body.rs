//! A request body that streams a spooled file from disk: chunks are read on the blocking pool and
//! handed over a small bounded channel, so an upload of any size holds at most a few chunks in
//! memory and the event loop never waits for the disk. It owns reading the file and checking that
//! it still has the length its job recorded; it does not know HTTP status codes or retries (the
//! HTTP sink does). Built by `sink::http::HttpSink::send_file`.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::mpsc;

/// Bytes read at a time.
const CHUNK: usize = 256 * 1024;
/// Chunks read ahead of the socket at most.
const AHEAD: usize = 2;

pub struct FileBody {
    rx: mpsc::Receiver<io::Result<Bytes>>,
    len: u64,
}

impl FileBody {
    /// Opens `path` now (a missing file is reported before any request is made) and starts reading
    /// it; the body ends with an error if the file holds fewer than `len` bytes, and sends no more
    /// than `len` (a file that grew is cut at the length its job counted).
    pub fn open(path: &Path, len: u64) -> io::Result<FileBody> {
        let mut file = File::open(path)?;
        let (tx, rx) = mpsc::channel(AHEAD);
        tokio::task::spawn_blocking(move || {
            let mut left = len;
            while left > 0 {
                let want = usize::try_from(left).map_or(CHUNK, |l| l.min(CHUNK));
                let mut buf = vec![0u8; want];
                let chunk = match file.read(&mut buf) {
                    Ok(0) => Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("the spooled file ended {left} bytes short of its recorded length"),
                    )),
                    Ok(n) => {
                        buf.truncate(n);
                        left -= n as u64;
                        Ok(Bytes::from(buf))
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => Err(e),
                };
                let failed = chunk.is_err();
                // The request was dropped (abandoned, or the peer went away): stop reading.
                if tx.blocking_send(chunk).is_err() || failed {
                    return;
                }
            }
        });
        Ok(FileBody { rx, len })
    }
}

impl Body for FileBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        self.rx.poll_recv(cx).map(|c| c.map(|r| r.map(Frame::data)))
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn streams_the_file_in_chunks_and_stops_at_its_length() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        let content: Vec<u8> = (0..(CHUNK * 3 + 17)).map(|i| (i % 251) as u8).collect();
        std::fs::write(&p, &content).unwrap();
        let body = FileBody::open(&p, content.len() as u64).unwrap();
        assert_eq!(body.size_hint().exact(), Some(content.len() as u64));
        let got = body.collect().await.unwrap().to_bytes();
        assert_eq!(&got[..], &content[..]);
        // A file that grew is cut at its recorded length.
        let body = FileBody::open(&p, 10).unwrap();
        assert_eq!(
            &body.collect().await.unwrap().to_bytes()[..],
            &content[..10]
        );
    }

    #[tokio::test]
    async fn a_short_file_is_an_error_and_a_missing_one_fails_at_once() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, b"abc").unwrap();
        let e = FileBody::open(&p, 10)
            .unwrap()
            .collect()
            .await
            .err()
            .unwrap();
        assert!(e.to_string().contains("7 bytes short"), "{e}");
        assert_eq!(
            FileBody::open(&d.path().join("gone"), 1)
                .err()
                .unwrap()
                .kind(),
            io::ErrorKind::NotFound
        );
    }
}
