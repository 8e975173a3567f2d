//! An answer cut short: a connection's I/O that lets only the first [`CUT_AFTER`] bytes of an
//! answer through, then fails, so the client sees a truncated response.

use std::io::{self};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::*;

/// A connection's I/O that, once `cut` is set, lets only the first [`CUT_AFTER`] bytes of the next
/// write through, flushes them, and then fails every write (so hyper drops the connection).
pub(super) struct CutIo<T> {
    inner: T,
    cut: Arc<AtomicBool>,
    state: CutState,
}

pub(super) enum CutState {
    Normal,
    Writing { prefix: Vec<u8>, written: usize },
    Flushing,
    Dead,
}

impl<T> CutIo<T> {
    pub(super) fn new(inner: T, cut: Arc<AtomicBool>) -> Self {
        CutIo {
            inner,
            cut,
            state: CutState::Normal,
        }
    }
}

pub(super) fn cut_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "answer cut short on purpose",
    )
}

impl<T: AsyncRead + Unpin> AsyncRead for CutIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for CutIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        loop {
            match &mut this.state {
                CutState::Normal => {
                    if !this.cut.load(Ordering::SeqCst) {
                        return Pin::new(&mut this.inner).poll_write(cx, buf);
                    }
                    let prefix = buf[..buf.len().min(CUT_AFTER)].to_vec();
                    this.state = CutState::Writing { prefix, written: 0 };
                }
                CutState::Writing { prefix, written } => {
                    if *written >= prefix.len() {
                        this.state = CutState::Flushing;
                        continue;
                    }
                    let n = ready!(Pin::new(&mut this.inner).poll_write(cx, &prefix[*written..]))?;
                    if n == 0 {
                        this.state = CutState::Dead;
                    } else {
                        *written += n;
                    }
                }
                CutState::Flushing => {
                    let _ = ready!(Pin::new(&mut this.inner).poll_flush(cx));
                    this.state = CutState::Dead;
                }
                CutState::Dead => return Poll::Ready(Err(cut_error())),
            }
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.state {
            CutState::Normal => Pin::new(&mut self.inner).poll_flush(cx),
            _ => Poll::Ready(Err(cut_error())),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.state {
            CutState::Normal => Pin::new(&mut self.inner).poll_shutdown(cx),
            _ => Poll::Ready(Err(cut_error())),
        }
    }
}
