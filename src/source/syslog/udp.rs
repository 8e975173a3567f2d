//! The syslog source's UDP socket: opened with the receive buffer the config asks for
//! (`SO_RCVBUF`, which the kernel caps at `net.core.rmem_max`), and asked how many datagrams the
//! kernel dropped because that buffer was full. UDP cannot pause a sender: a burst faster than
//! colibri reads fills the buffer and the kernel drops the rest before colibri sees them (the
//! `RcvbufErrors` of `/proc/net/snmp`). These drops are read from the socket's own counter
//! (`SO_MEMINFO`'s `SK_MEMINFO_DROPS`) rather than from `SO_RXQ_OVFL`'s control message, because
//! that message only comes with a later datagram: the drops at the end of a burst would stay
//! uncounted until the next one. Linux only, as colibri is. Used by [`super::listen`].

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::UdpSocket;

/// Largest `receive_buffer` accepted (`SO_RCVBUF` is an `int` the kernel doubles).
pub const MAX_RECEIVE_BUFFER: u64 = 1 << 30;

/// A bound UDP socket and the receive buffer the kernel granted it.
pub struct Opened {
    pub socket: UdpSocket,
    /// In the units `SO_RCVBUF` is set in (Linux reports twice that, the half being its
    /// bookkeeping; this is the half).
    pub receive_buffer: usize,
}

/// Binds `addr` with `receive_buffer` bytes asked (the kernel's default when `None`). Must run
/// inside the runtime.
pub fn open(addr: SocketAddr, receive_buffer: Option<usize>) -> io::Result<Opened> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if let Some(bytes) = receive_buffer {
        socket.set_recv_buffer_size(bytes)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    let granted = socket.recv_buffer_size()? / 2;
    let socket = UdpSocket::from_std(socket.into())?;
    Ok(Opened {
        socket,
        receive_buffer: granted,
    })
}

/// Datagrams the kernel dropped for `socket` since it was opened (a `u32` that wraps; callers
/// count the difference). `None` where the kernel does not say (before Linux 4.6).
pub fn kernel_drops(socket: &UdpSocket) -> Option<u32> {
    let mut info = [0u32; libc::SK_MEMINFO_DROPS as usize + 1];
    let mut len = std::mem::size_of_val(&info) as libc::socklen_t;
    // SAFETY: `info` is a live, writable buffer of `len` bytes for the whole call, and `len` is
    // a valid socklen_t the kernel updates; the descriptor is the socket's own, open while
    // `socket` is borrowed. SO_MEMINFO writes at most `len` bytes (it truncates to what fits).
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_MEMINFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    let filled = len as usize / std::mem::size_of::<u32>();
    (rc == 0 && filled > libc::SK_MEMINFO_DROPS as usize)
        .then(|| info[libc::SK_MEMINFO_DROPS as usize])
}

/// Counts the kernel's drops on one socket as they grow.
#[derive(Default)]
pub struct Drops {
    last: u32,
}

impl Drops {
    /// Drops since the last call.
    pub fn new_since(&mut self, socket: &UdpSocket) -> u64 {
        let Some(now) = kernel_drops(socket) else {
            return 0;
        };
        let new = now.wrapping_sub(self.last);
        self.last = now;
        u64::from(new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_burst_past_a_small_receive_buffer_is_counted_as_dropped() {
        let Opened {
            socket,
            receive_buffer,
        } = open("127.0.0.1:0".parse().unwrap(), Some(4096)).unwrap();
        assert!(receive_buffer >= 4096, "{receive_buffer}");
        let to = socket.local_addr().unwrap();
        let mut drops = Drops::default();
        assert_eq!(drops.new_since(&socket), 0);
        let sender = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let sent = 200u64;
        for _ in 0..sent {
            sender.send_to(&[b'x'; 1000], to).unwrap();
        }
        let mut buf = [0u8; 2048];
        let mut read = 0u64;
        // Everything there is read (the sends to loopback were delivered or dropped when made).
        let wait = std::time::Duration::from_millis(200);
        while let Ok(r) = tokio::time::timeout(wait, socket.recv_from(&mut buf)).await {
            r.unwrap();
            read += 1;
        }
        let dropped = drops.new_since(&socket);
        assert!(dropped > 0, "read {read} of {sent}");
        assert_eq!(read + dropped, sent);
        assert_eq!(drops.new_since(&socket), 0, "counted once");
    }
}
