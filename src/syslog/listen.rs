//! The syslog source's listeners: a UDP socket (one message per datagram, RFC 5426) and a TCP
//! listener whose connections are framed by [`super::frame`]. Each turns what one read returned
//! into a chunk of records ([`super::parse`], filtered) and sends it to the appender; a TCP
//! connection reads nothing more until the chunk is taken (this is how a full `block` stream pauses
//! its sender), a UDP chunk that finds no room is dropped and counted. A port that cannot be bound
//! is logged and tried again. Called by [`super::run`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use super::Shared;
use super::frame::Framer;
use super::parse::{Context, Parsed};
use crate::store::RecordBuf;

/// One read of a TCP connection: its buffer is held while the connection is open, so 256 idle
/// connections hold 4 MiB.
const TCP_READ_BYTES: usize = 16 << 10;
/// The largest UDP datagram.
const UDP_READ_BYTES: usize = 64 << 10;
/// Datagrams gathered into one chunk when they arrive faster than they are handed over: at most
/// this many, and no more once it holds this many bytes of records.
const UDP_CHUNK: usize = 256;
const UDP_CHUNK_BYTES: usize = 256 << 10;
/// Waits between tries to bind a port that is taken.
const BIND_RETRY: Duration = Duration::from_secs(5);
/// How long a connection may wait to hand over its last chunk once colibri stops.
const STOP_WAIT: Duration = Duration::from_secs(2);

/// Receives datagrams until `stopping`.
pub async fn udp(
    addr: SocketAddr,
    shared: Arc<Shared>,
    tx: mpsc::Sender<RecordBuf>,
    stopping: CancellationToken,
) {
    let Some(socket) = bind(addr, "udp", &shared, &stopping, UdpSocket::bind).await else {
        return;
    };
    let mut buf = vec![0u8; UDP_READ_BYTES];
    loop {
        let first = tokio::select! {
            _ = stopping.cancelled() => return,
            r = socket.recv_from(&mut buf) => r,
        };
        let mut chunk = Chunk::new();
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
        if chunk.records.is_empty() {
            continue;
        }
        let n = chunk.records.len() as u64;
        if let Err(mpsc::error::TrySendError::Full(_)) = tx.try_send(chunk.records) {
            shared.stats.udp_dropped.fetch_add(n, Relaxed);
        }
    }
}

/// Accepts connections until `stopping`; each is read by its own task.
pub async fn tcp(
    addr: SocketAddr,
    shared: Arc<Shared>,
    tx: mpsc::Sender<RecordBuf>,
    stopping: CancellationToken,
) {
    let Some(listener) = bind(addr, "tcp", &shared, &stopping, TcpListener::bind).await else {
        return;
    };
    let slots = Arc::new(Semaphore::new(shared.cfg.max_connections));
    let mut conns = tokio::task::JoinSet::new();
    let mut refused_logged = false;
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
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            shared.stats.connections_refused.fetch_add(1, Relaxed);
            if !refused_logged {
                tracing::warn!(source = %shared.cfg.name, %peer, max_connections = shared.cfg.max_connections, "syslog connection refused: max_connections open (counted from now on, not logged)");
                refused_logged = true;
            }
            drop(sock);
            continue;
        };
        shared.stats.connections.fetch_add(1, Relaxed);
        let (shared, tx, stopping) = (Arc::clone(&shared), tx.clone(), stopping.clone());
        conns.spawn(async move {
            connection(sock, peer, &shared, &tx, &stopping).await;
            drop(slot);
        });
    }
    drop(listener);
    while conns.join_next().await.is_some() {}
}

/// Reads one connection until it ends, breaks the framing, idles past `idle_timeout`, or colibri
/// stops (what was read by then is handed over).
async fn connection(
    mut sock: TcpStream,
    peer: SocketAddr,
    shared: &Shared,
    tx: &mpsc::Sender<RecordBuf>,
    stopping: &CancellationToken,
) {
    let name = &shared.cfg.name;
    let mut framer = Framer::new(shared.cfg.max_message_bytes);
    let mut buf = vec![0u8; TCP_READ_BYTES];
    let peer_json = peer_string(peer);
    let idle = shared.cfg.idle_timeout.unwrap_or(Duration::MAX);
    loop {
        let read = tokio::select! {
            _ = stopping.cancelled() => break,
            r = tokio::time::timeout(idle, sock.read(&mut buf)) => r,
        };
        let n = match read {
            Err(_) => {
                tracing::debug!(source = %name, %peer, "syslog connection idle: closed");
                break;
            }
            Ok(Err(e)) => {
                tracing::debug!(source = %name, %peer, error = %e, "syslog connection failed");
                break;
            }
            Ok(Ok(0)) => {
                let mut chunk = Chunk::new();
                if framer.finish(|m, cut| chunk.message(shared, m, cut, &peer_json)) {
                    shared.stats.framing_errors.fetch_add(1, Relaxed);
                    tracing::warn!(source = %name, %peer, "syslog connection ended inside an octet-counted message: that message is lost");
                }
                send(chunk, shared, tx, stopping).await;
                return;
            }
            Ok(Ok(n)) => n,
        };
        shared.stats.bytes.fetch_add(n as u64, Relaxed);
        let mut chunk = Chunk::new();
        let framed = framer.feed(&buf[..n], |m, cut| {
            chunk.message(shared, m, cut, &peer_json)
        });
        if !send(chunk, shared, tx, stopping).await {
            return;
        }
        if let Err(e) = framed {
            shared.stats.framing_errors.fetch_add(1, Relaxed);
            tracing::warn!(source = %name, %peer, error = %e, "syslog connection closed");
            return;
        }
    }
}

/// Hands a chunk to the appender, waiting while it is behind (the pause of a `block` stream);
/// once colibri stops, for [`STOP_WAIT`] at most. False when it was not taken (counted lost:
/// syslog has no acknowledgement to withhold, so what was read and not stored is gone).
async fn send(
    chunk: Chunk,
    shared: &Shared,
    tx: &mpsc::Sender<RecordBuf>,
    stopping: &CancellationToken,
) -> bool {
    if chunk.records.is_empty() {
        return true;
    }
    let records = chunk.records;
    if !stopping.is_cancelled() {
        tokio::select! {
            r = tx.reserve() => {
                return match r {
                    Ok(permit) => {
                        permit.send(records);
                        true
                    }
                    Err(_) => false,
                };
            }
            _ = stopping.cancelled() => {}
        }
    }
    let n = records.len() as u64;
    match tokio::time::timeout(STOP_WAIT, tx.send(records)).await {
        Ok(Ok(())) => true,
        _ => {
            shared.stats.records_lost.fetch_add(n, Relaxed);
            tracing::warn!(source = %shared.cfg.name, records = n, "colibri is stopping: syslog records read and not stored are lost");
            false
        }
    }
}

/// Records made from one read.
struct Chunk {
    records: RecordBuf,
    received: String,
    messages: usize,
}

impl Chunk {
    fn new() -> Chunk {
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        Chunk {
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

/// Binds `addr`, trying again every few seconds while it is taken (another syslog daemon that has
/// not let go yet). `None` once colibri stops.
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
            Ok(s) => {
                tracing::info!(source = %shared.cfg.name, %addr, proto, "syslog listening");
                return Some(s);
            }
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
