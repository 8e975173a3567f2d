//! The syslog source's listeners: a UDP socket (one message per datagram, RFC 5426) and a TCP
//! listener whose connections are framed by [`super::frame`]. Each turns what one read returned
//! into a chunk of records ([`super::parse`], filtered) and hands it to the appender with its
//! share of the source's budget; a TCP connection reads nothing more until that share is free
//! (this is how a full `block` stream pauses its sender), a UDP chunk that finds the budget spent
//! is dropped and counted. The sockets come bound from [`super::bind`] at colibri's start; for a
//! source a reload started, a port that cannot be bound is logged and tried again. Called by
//! [`super::run`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Shared;
use super::append::{Chunk, permits_for};
use super::frame::Framer;
use super::parse::{Context, Parsed};
use crate::net::slots::{Slots, Taken};
use crate::store::RecordBuf;

/// One read of a TCP connection: its buffer is held while the connection is open, so 256 idle
/// connections hold 4 MiB (until `idle_timeout`, or a newcomer closes the one idle longest).
const TCP_READ_BYTES: usize = 16 << 10;
/// The largest UDP datagram.
const UDP_READ_BYTES: usize = 64 << 10;
/// Datagrams gathered into one chunk when they arrive faster than they are handed over: at most
/// this many, and no more once it holds this many bytes of records.
const UDP_CHUNK: usize = 256;
const UDP_CHUNK_BYTES: usize = 256 << 10;
/// Waits between tries to bind a port that is taken.
const BIND_RETRY: Duration = Duration::from_secs(5);
/// How long a TLS client has to complete its handshake.
const HANDSHAKE: Duration = Duration::from_secs(10);
/// How long a connection may go on reading what is already there once colibri stops.
const STOP_WAIT: Duration = Duration::from_secs(2);
/// At the stop, reading on needs this much room in the budget (what one read's records may take:
/// a 16 KiB read of short lines makes ~16x its size in records).
const DRAIN_ROOM: usize = 16 * TCP_READ_BYTES;
/// At the stop, a read that finds nothing within this long means the sender had nothing more.
const DRAIN_READ: Duration = Duration::from_millis(50);
/// Idle TCP connections are probed after this long (SO_KEEPALIVE), so a sender that vanished (a
/// device rebooted, a NAT forgot the flow) does not hold a connection slot for ever.
const KEEPALIVE: Duration = Duration::from_secs(300);

/// Receives datagrams until `stopping`.
pub async fn udp(
    addr: SocketAddr,
    shared: Arc<Shared>,
    tx: mpsc::UnboundedSender<Chunk>,
    stopping: CancellationToken,
    bound: Option<super::udp::Opened>,
) {
    let opened = match bound {
        Some(opened) => opened,
        None => {
            let asked = shared.cfg.receive_buffer;
            let open = |a| std::future::ready(super::udp::open(a, asked));
            let Some(opened) = bind(addr, "udp", &shared, &stopping, open).await else {
                return;
            };
            opened
        }
    };
    listening(&shared, addr, "udp");
    receive_buffer_granted(&shared, addr, opened.receive_buffer);
    let socket = opened.socket;
    let mut drops = super::udp::Drops::default();
    let mut buf = vec![0u8; UDP_READ_BYTES];
    loop {
        let first = tokio::select! {
            _ = stopping.cancelled() => return,
            r = socket.recv_from(&mut buf) => r,
        };
        let mut chunk = Read::new();
        match first {
            Ok((n, peer)) => chunk.datagram(&shared, &buf[..n], peer),
            Err(e) => {
                tracing::debug!(source = %shared.cfg.name, error = %e, "udp receive failed");
                continue;
            }
        }
        // Whatever else is already waiting goes in the same chunk.
        while chunk.messages < UDP_CHUNK && chunk.records.record_bytes() < UDP_CHUNK_BYTES {
            match socket.try_recv_from(&mut buf) {
                Ok((n, peer)) => chunk.datagram(&shared, &buf[..n], peer),
                Err(_) => break,
            }
        }
        // The kernel drops only while its buffer is full, that is while chunks are being read:
        // looking after each one counts every drop by the time the buffer is empty again.
        let dropped = drops.new_since(&socket);
        if dropped > 0 {
            shared
                .stats
                .udp_receive_buffer_dropped
                .fetch_add(dropped, Relaxed);
        }
        if chunk.records.is_empty() {
            continue;
        }
        // UDP cannot pause its senders: what finds no room in the budget or the channel is
        // dropped, and counted.
        let n = chunk.records.len() as u64;
        let need = permits_for(chunk.records.record_bytes());
        let taken = match Arc::clone(&shared.budget).try_acquire_many_owned(need) {
            Ok(permit) => tx.send(Chunk::new(chunk.records, Some(permit))).is_ok(),
            Err(_) => false,
        };
        if !taken {
            shared.stats.udp_dropped.fetch_add(n, Relaxed);
        }
    }
}

/// Says what receive buffer the kernel granted, and warns when it is less than the config asked
/// (the kernel caps `SO_RCVBUF` at `net.core.rmem_max`).
fn receive_buffer_granted(shared: &Shared, addr: SocketAddr, granted: usize) {
    let name = &shared.cfg.name;
    match shared.cfg.receive_buffer {
        Some(asked) if granted < asked => tracing::warn!(
            source = %name,
            %addr,
            receive_buffer = asked,
            granted,
            "syslog udp receive buffer smaller than asked: the kernel caps it at net.core.rmem_max (raise it with sysctl -w net.core.rmem_max={asked})"
        ),
        _ => {
            tracing::debug!(source = %name, %addr, receive_buffer = granted, "syslog udp receive buffer")
        }
    }
}

/// Accepts connections until `stopping`; each is read by its own task.
pub async fn tcp(
    addr: SocketAddr,
    shared: Arc<Shared>,
    tx: mpsc::UnboundedSender<Chunk>,
    stopping: CancellationToken,
    bound: Option<TcpListener>,
) {
    let listener = match bound {
        Some(listener) => listener,
        None => {
            let open = |a| std::future::ready(crate::net::server::bind(a));
            let Some(listener) = bind(addr, "tcp", &shared, &stopping, open).await else {
                return;
            };
            listener
        }
    };
    listening(&shared, addr, "tcp");
    let slots = Slots::new(
        format!("syslog source {}", shared.cfg.name),
        shared.cfg.max_connections,
    );
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            _ = stopping.cancelled() => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            a = listener.accept() => a,
        };
        let (sock, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors, mostly: wait rather than spin.
                tracing::warn!(source = %shared.cfg.name, error = %e, "syslog tcp accept failed");
                tokio::select! {
                    _ = stopping.cancelled() => break,
                    _ = tokio::time::sleep(Duration::from_millis(100)) => continue,
                }
            }
        };
        // The connection idle longest is closed for this one; when every one is busy handing
        // over a read (a full `block` stream), this one waits, and the backlog behind it.
        let Some(taken) = slots.take(peer, &stopping).await else {
            break;
        };
        if taken.made_room {
            shared.stats.connections_closed_idle.fetch_add(1, Relaxed);
        }
        shared.stats.connections.fetch_add(1, Relaxed);
        let keepalive = socket2::TcpKeepalive::new().with_time(KEEPALIVE);
        if let Err(e) = socket2::SockRef::from(&sock).set_tcp_keepalive(&keepalive) {
            tracing::debug!(source = %shared.cfg.name, %peer, error = %e, "cannot set TCP keepalive");
        }
        let (shared, tx, stopping) = (Arc::clone(&shared), tx.clone(), stopping.clone());
        conns.spawn(async move {
            let at = Conn {
                peer,
                taken,
                shared: &shared,
                tx: &tx,
                stopping: &stopping,
            };
            match &shared.cfg.tls {
                None => connection(sock, at).await,
                Some(tls) => {
                    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::clone(tls));
                    let handshake = tokio::select! {
                        _ = stopping.cancelled() => return,
                        _ = at.taken.slot.evict.cancelled() => return,
                        h = tokio::time::timeout(HANDSHAKE, acceptor.accept(sock)) => h,
                    };
                    match handshake {
                        Ok(Ok(stream)) => connection(stream, at).await,
                        Ok(Err(e)) => tls_failed(&shared, peer, &e.to_string()),
                        Err(_) => tls_failed(&shared, peer, "no handshake within 10s"),
                    }
                }
            }
        });
    }
    drop(listener);
    while conns.join_next().await.is_some() {}
}

/// A TLS handshake that failed: counted, and logged once per source at WARN (a scanner or a
/// misconfigured sender would fill the log), the rest at DEBUG.
fn tls_failed(shared: &Shared, peer: SocketAddr, error: &str) {
    let before = shared.stats.tls_failures.fetch_add(1, Relaxed);
    if before == 0 {
        tracing::warn!(source = %shared.cfg.name, %peer, error, "syslog TLS handshake failed (further failures are counted, and logged at debug)");
    } else {
        tracing::debug!(source = %shared.cfg.name, %peer, error, "syslog TLS handshake failed");
    }
}

/// One accepted connection and what its reading needs.
struct Conn<'a> {
    peer: SocketAddr,
    taken: Taken,
    shared: &'a Shared,
    tx: &'a mpsc::UnboundedSender<Chunk>,
    stopping: &'a CancellationToken,
}

/// Why a connection's reading ended.
#[derive(PartialEq, Eq)]
enum End {
    /// The sender closed it.
    Eof,
    /// Silent past `idle_timeout`, or closed as the connection idle longest to make room for a
    /// newcomer: the sender is done (a last message without its newline is kept, as at an end).
    Idle,
    /// Failed, or colibri stops (after what was there was read): a message without its end is a
    /// cut one.
    Cut,
    /// The sender broke the framing: what is left is not a message.
    Framing,
}

/// Reads one connection until it ends, breaks the framing, idles past `idle_timeout`, or colibri
/// stops; at the stop it reads on what is already there for [`STOP_WAIT`] at most, while the
/// budget has room, so a graceful stop loses no more than the kernel still held (nothing, unless
/// the stream is full). A last message without its newline is kept when the sender closed the
/// connection or went idle, and dropped (counted in `cut`) when colibri or the network cut it.
async fn connection<S: AsyncRead + AsyncWrite + Unpin>(mut sock: S, at: Conn<'_>) {
    let Conn {
        peer,
        taken,
        shared,
        tx,
        stopping,
    } = at;
    let name = &shared.cfg.name;
    let mut framer = Framer::new(shared.cfg.max_message_bytes);
    let mut buf = vec![0u8; TCP_READ_BYTES];
    let peer_json = peer_string(peer);
    let idle = shared.cfg.idle_timeout;
    let mut draining_until: Option<Instant> = None;
    let end = loop {
        let read = match draining_until {
            None => tokio::select! {
                _ = stopping.cancelled() => {
                    draining_until = Some(Instant::now() + STOP_WAIT);
                    continue;
                }
                // Closed to make room for a newcomer, as the connection idle longest.
                _ = taken.slot.evict.cancelled() => {
                    tracing::debug!(source = %name, %peer, "syslog connection idle longest: closed for a newcomer");
                    break End::Idle;
                }
                r = tokio::time::timeout(idle, sock.read(&mut buf)) => match r {
                    Ok(r) => r,
                    Err(_) => {
                        tracing::debug!(source = %name, %peer, "syslog connection idle: closed");
                        break End::Idle;
                    }
                },
            },
            Some(until) => {
                // Only while the budget has room: with the stream full, what the kernel holds is
                // left unread (memory stays bounded; the sender sees the connection reset).
                if shared.budget.available_permits() < DRAIN_ROOM {
                    break End::Cut;
                }
                let left = until
                    .saturating_duration_since(Instant::now())
                    .min(DRAIN_READ);
                match tokio::time::timeout(left, sock.read(&mut buf)).await {
                    Ok(r) => r,
                    // Nothing more is there (or the stop's time is up).
                    Err(_) => break End::Cut,
                }
            }
        };
        let n = match read {
            Ok(0) => break End::Eof,
            Ok(n) => n,
            Err(e) => {
                tracing::debug!(source = %name, %peer, error = %e, "syslog connection failed");
                break End::Cut;
            }
        };
        shared.stats.bytes.fetch_add(n as u64, Relaxed);
        // Busy until its records are handed over (a wait for the budget is not idleness). A
        // read that raced its eviction is still handed over, and then the connection ends.
        let evicted = !taken.slot.begin();
        let mut chunk = Read::new();
        let framed = framer.feed(&buf[..n], |m, cut| {
            chunk.message(shared, m, cut, &peer_json)
        });
        if !send(chunk, shared, tx, stopping).await {
            return;
        }
        taken.end();
        if let Err(e) = framed {
            shared.stats.framing_errors.fetch_add(1, Relaxed);
            tracing::warn!(source = %name, %peer, error = %e, "syslog connection closed");
            break End::Framing;
        }
        if evicted {
            break End::Idle;
        }
    };
    if end == End::Cut {
        // colibri stopped reading (a stop or reload) or the connection broke: a message without
        // its end is a cut one, not the sender's last, and is not stored.
        if framer.discard() {
            shared.stats.cut.fetch_add(1, Relaxed);
            tracing::debug!(source = %name, %peer, "a message cut by the connection's end is not stored");
        }
    } else if end != End::Framing {
        let mut chunk = Read::new();
        if framer.finish(|m, cut| chunk.message(shared, m, cut, &peer_json)) {
            shared.stats.framing_errors.fetch_add(1, Relaxed);
            tracing::warn!(source = %name, %peer, "syslog connection ended inside an octet-counted message: that message is lost");
        }
        send(chunk, shared, tx, stopping).await;
    }
    if end == End::Eof {
        // A TLS sender waits for our close_notify; a plain one sees the FIN.
        let _ = tokio::time::timeout(HANDSHAKE, sock.shutdown()).await;
    }
}

/// Hands a read's records to the appender, first waiting for their bytes of the budget (the
/// pause of a `block` stream: the connection reads nothing meanwhile). Once colibri stops it does
/// not wait: the last reads of each connection go without their share, so a reload or a stop
/// loses nothing that was read. False when the appender is gone (nothing can be stored).
async fn send(
    read: Read,
    shared: &Shared,
    tx: &mpsc::UnboundedSender<Chunk>,
    stopping: &CancellationToken,
) -> bool {
    if read.records.is_empty() {
        return true;
    }
    let n = read.records.len() as u64;
    let need = permits_for(read.records.record_bytes());
    let budget = Arc::clone(&shared.budget);
    let permit = if stopping.is_cancelled() {
        budget.try_acquire_many_owned(need).ok()
    } else {
        tokio::select! {
            p = Arc::clone(&budget).acquire_many_owned(need) => p.ok(),
            _ = stopping.cancelled() => budget.try_acquire_many_owned(need).ok(),
        }
    };
    if tx.send(Chunk::new(read.records, permit)).is_err() {
        shared.stats.records_lost.fetch_add(n, Relaxed);
        tracing::error!(source = %shared.cfg.name, records = n, "the syslog appender has ended: records read are lost");
        return false;
    }
    true
}

/// Records made from one read (or a few datagrams).
struct Read {
    records: RecordBuf,
    received: String,
    messages: usize,
}

impl Read {
    fn new() -> Read {
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        Read {
            records: RecordBuf::new(),
            received: format!("\"{now}\""),
            messages: 0,
        }
    }

    fn datagram(&mut self, shared: &Shared, data: &[u8], peer: SocketAddr) {
        shared.stats.bytes.fetch_add(data.len() as u64, Relaxed);
        let end = data
            .iter()
            .rposition(|b| !matches!(b, b'\r' | b'\n' | 0))
            .map_or(0, |i| i + 1);
        if end == 0 {
            return;
        }
        let max = shared.cfg.max_message_bytes;
        let cut = end > max;
        self.message(shared, &data[..end.min(max)], cut, &peer_string(peer));
    }

    /// Parses, filters and records one message.
    fn message(&mut self, shared: &Shared, raw: &[u8], cut: bool, peer: &str) {
        let stats = &shared.stats;
        self.messages += 1;
        stats.messages.fetch_add(1, Relaxed);
        if cut {
            stats.truncated.fetch_add(1, Relaxed);
        }
        let text = String::from_utf8_lossy(raw);
        let parsed = Parsed::new(&text);
        let cfg = &shared.cfg;
        let too_mild =
            matches!((cfg.min_severity, parsed.severity()), (Some(min), Some(s)) if s > min);
        if too_mild || !cfg.filter.keeps(&text, &text) {
            stats.filtered.fetch_add(1, Relaxed);
            return;
        }
        if !parsed.is_parsed() {
            stats.unparsed.fetch_add(1, Relaxed);
        }
        let ctx = Context {
            received: &self.received,
            peer,
            labels: &shared.labels,
        };
        let mut w = self.records.record();
        parsed.write(w.buf(), &ctx, cut);
        w.finish_line();
    }
}

fn peer_string(peer: SocketAddr) -> String {
    let mut out = Vec::new();
    super::parse::string(&mut out, &peer.to_string());
    String::from_utf8(out).expect("JSON written from a string is UTF-8")
}

fn listening(shared: &Shared, addr: SocketAddr, proto: &str) {
    tracing::info!(source = %shared.cfg.name, %addr, proto, "syslog listening");
}

/// Binds `addr` for a source a reload started (at colibri's start the sockets are bound before,
/// and a taken port stops the start), trying again every few seconds while it is taken (another
/// syslog daemon that has not let go yet): a reload does not stop a running agent. `None` once
/// colibri stops.
async fn bind<S, F, Fut>(
    addr: SocketAddr,
    proto: &str,
    shared: &Shared,
    stopping: &CancellationToken,
    bind: F,
) -> Option<S>
where
    F: Fn(SocketAddr) -> Fut,
    Fut: std::future::Future<Output = std::io::Result<S>>,
{
    let mut logged = false;
    loop {
        match bind(addr).await {
            Ok(s) => return Some(s),
            Err(e) => {
                if !logged {
                    tracing::error!(source = %shared.cfg.name, %addr, proto, error = %e, "cannot listen for syslog; trying again every 5s");
                    logged = true;
                }
            }
        }
        tokio::select! {
            _ = stopping.cancelled() => return None,
            _ = tokio::time::sleep(BIND_RETRY) => {}
        }
    }
}
