//! The TCP stream under every MQTT connection (the sink's, both protocol versions, and the
//! source's): dialled at the URL's host (also when `tls.server_name` names another), with Nagle
//! off and TCP_QUICKACK re-armed after every read ([`QuickAck`]). It knows nothing of MQTT packets. Given to the client as its
//! socket connector by `net::mqtt::connection_options` and the sink's 3.1.1 client.

use std::pin::Pin;
use std::task::{Context, Poll};

use rumqttc::NetworkOptions;

/// Connects to `dial` (`host:port`) when set, else to the address the client asks for.
pub async fn connect(
    dial: Option<String>,
    addr: String,
    net: NetworkOptions,
) -> std::io::Result<QuickAck> {
    let stream = rumqttc::default_socket_connect(dial.unwrap_or(addr), net).await?;
    Ok(QuickAck(stream))
}

/// The broker's TCP stream, with TCP_QUICKACK re-armed after every read. A broker that leaves
/// Nagle's algorithm on (mosquitto does unless `set_tcp_nodelay true`) holds back a job's last
/// PUBACKs until colibri's kernel acknowledges the segment before them, which it delays by up to
/// 40 ms when it has nothing to send: a job of 100 records took 48 ms (2,000 records/s; 31,000
/// with quick ACKs, BENCHMARKS.md). Linux clears the flag on its own, hence after each read.
pub struct QuickAck(tokio::net::TcpStream);

impl QuickAck {
    fn arm(&self) {
        use std::os::fd::AsRawFd as _;
        let one: libc::c_int = 1;
        // SAFETY: the descriptor is the open socket `self.0` owns for as long as this call; the
        // option value points at a live c_int and the length given is its size. A failure (not a
        // TCP socket) only leaves the kernel's default ACK timing, so the result is not checked.
        unsafe {
            libc::setsockopt(
                self.0.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_QUICKACK,
                (&raw const one).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
}

impl tokio::io::AsyncRead for QuickAck {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let read = Pin::new(&mut self.0).poll_read(cx, buf);
        if read.is_ready() {
            self.arm();
        }
        read
    }
}

impl tokio::io::AsyncWrite for QuickAck {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
