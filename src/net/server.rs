//! The HTTP/1.1 server under both listeners, the ingest API and the admin endpoint: binding, the
//! accept loop, and the life of each connection. It decides which connections are served, never
//! what a request means (that is the handler each listener passes in).
//!
//! Idle connections must not starve real ones. A connection takes one of `max_connections` slots;
//! it must deliver a complete request header within `header_timeout` of being accepted, and each
//! later one within `idle_timeout` of the previous answer, or it is closed. When every slot is
//! taken, the connection that has been idle longest (no complete header yet, or waiting between
//! requests) is closed to make room for the newcomer; only when every slot is in the middle of a
//! request does the newcomer wait (with the listen backlog behind it) for one to end. Clients
//! that shut down their write side after the request (`shutdown(SHUT_WR)`, `nc -N`) still get the
//! answer (hyper's half-close). With TLS, the handshake is part of the first header's deadline,
//! and each handshake takes the listener's certificate as it is then (a reload may have replaced
//! it; connections already open keep theirs). Used by `ingest` and `admin`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::tls_server::ServerTls;
use crate::logging::summary;

pub type Answer = Response<Full<Bytes>>;

/// How long connections still open when the listener closes may take to finish their answer.
const LINGER: Duration = Duration::from_secs(2);

/// Repeated events of the accept loop (room made, accept errors) are summarised this often.
const SUMMARY_EVERY: Duration = Duration::from_secs(60);

/// Bounds of one listener.
#[derive(Debug, Clone)]
pub struct Limits {
    /// `ingest` or `admin`: names the listener in log events.
    pub name: &'static str,
    pub max_connections: usize,
    /// From accept to the first complete request header.
    pub header_timeout: Duration,
    /// From an answer to the next complete request header on a kept-alive connection.
    pub idle_timeout: Duration,
    /// hyper's read buffer per connection: request headers must fit.
    pub max_buf: usize,
}

/// Binds a listening socket (an error here stops colibri's start).
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // A restart right after a crash must not wait for the old connections' TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

const IDLE: u8 = 0;
const BUSY: u8 = 1;
/// Closed by the server (to make room, or past its deadline): no request may begin on it.
const CLOSED: u8 = 2;

/// One connection's place.
struct Slot {
    peer: SocketAddr,
    state: AtomicU8,
    /// When it last became idle (accept, or an answer), in ms since the server started.
    idle_since: AtomicU64,
    /// Requests begun on it: the first header is due `header_timeout` after accept, later ones
    /// `idle_timeout` after an answer.
    requests: AtomicU64,
    /// Cancelled to close the connection at once.
    evict: CancellationToken,
}

impl Slot {
    /// A request's header arrived: the connection is busy (false when it was just closed).
    fn begin(&self) -> bool {
        let ok = self
            .state
            .compare_exchange(IDLE, BUSY, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if ok {
            self.requests.fetch_add(1, Ordering::AcqRel);
        }
        ok
    }

    fn end(&self, now_ms: u64) {
        self.idle_since.store(now_ms, Ordering::Release);
        let _ = self
            .state
            .compare_exchange(BUSY, IDLE, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Closes it if it is idle; false when a request is in progress.
    fn close_if_idle(&self) -> bool {
        let closed = self
            .state
            .compare_exchange(IDLE, CLOSED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if closed {
            self.evict.cancel();
        }
        closed
    }

    /// When an idle connection's next header is due (`None` while a request is in progress).
    fn due_ms(&self, limits: &Limits) -> Option<u64> {
        if self.state.load(Ordering::Acquire) != IDLE {
            return None;
        }
        let wait = if self.requests.load(Ordering::Acquire) == 0 {
            limits.header_timeout
        } else {
            limits.idle_timeout
        };
        Some(self.idle_since.load(Ordering::Acquire) + wait.as_millis() as u64)
    }
}

/// The open connections of one listener.
struct Conns {
    epoch: Instant,
    slots: Mutex<HashMap<u64, Arc<Slot>>>,
    /// Signalled when a connection ends or becomes idle: room may be made for a waiting newcomer.
    changed: tokio::sync::Notify,
}

impl Conns {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn at(&self, ms: u64) -> Instant {
        self.epoch + Duration::from_millis(ms)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Slot>>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn remove(&self, id: u64) {
        self.lock().remove(&id);
        self.changed.notify_one();
    }

    /// Closes the connection idle longest, if any is idle; returns its peer.
    fn close_oldest_idle(&self) -> Option<SocketAddr> {
        let mut slots = self.lock();
        let mut idle: Vec<(u64, u64)> = slots
            .iter()
            .filter(|(_, s)| s.state.load(Ordering::Acquire) == IDLE)
            .map(|(id, s)| (s.idle_since.load(Ordering::Acquire), *id))
            .collect();
        idle.sort_unstable();
        for (_, id) in idle {
            let slot = Arc::clone(&slots[&id]);
            if slot.close_if_idle() {
                slots.remove(&id);
                return Some(slot.peer);
            }
        }
        None
    }
}

/// Serves `listener` with `handler` until `close`; then stops accepting, lets the connections
/// finish their answers (at most [`LINGER`]), and returns.
pub async fn serve<H, F>(
    listener: TcpListener,
    limits: Limits,
    tls: Option<ServerTls>,
    close: CancellationToken,
    handler: H,
) where
    H: Fn(Request<Incoming>, SocketAddr) -> F + Send + Sync + 'static,
    F: Future<Output = Answer> + Send + 'static,
{
    let handler = Arc::new(handler);
    let limits = Arc::new(limits);
    let conns = Arc::new(Conns {
        epoch: Instant::now(),
        slots: Mutex::default(),
        changed: tokio::sync::Notify::new(),
    });
    let closing = CancellationToken::new();
    let mut tasks = JoinSet::new();
    let mut next_id: u64 = 0;
    'accept: loop {
        let (stream, peer) = tokio::select! {
            biased;
            _ = close.cancelled() => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    // E.g. out of file descriptors: not fatal, but do not spin.
                    let name = limits.name;
                    if summary::first(&format!("{name} accept error"), 1, SUMMARY_EVERY, || {
                        move |n, _, window| tracing::warn!(listener = name, repeated = n, "{name} cannot accept connections: {n} more errors like it in the last {}s", summary::secs(window))
                    }) {
                        tracing::warn!(listener = name, error = %e, "{name} cannot accept a connection");
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                        _ = close.cancelled() => break,
                    }
                    continue;
                }
            },
        };
        loop {
            let changed = conns.changed.notified();
            if conns.lock().len() < limits.max_connections {
                break;
            }
            if let Some(idle) = conns.close_oldest_idle() {
                made_room(&limits, idle, peer);
                break;
            }
            // Every slot is in the middle of a request (each bounded by its handler's own
            // timeouts): this newcomer, and those in the listen backlog behind it, wait for one
            // to end or go idle.
            tokio::select! {
                _ = changed => {}
                _ = close.cancelled() => break 'accept,
            }
        }
        let _ = stream.set_nodelay(true);
        let slot = Arc::new(Slot {
            peer,
            state: AtomicU8::new(IDLE),
            idle_since: AtomicU64::new(conns.now_ms()),
            requests: AtomicU64::new(0),
            evict: CancellationToken::new(),
        });
        let id = next_id;
        next_id += 1;
        conns.lock().insert(id, Arc::clone(&slot));
        let at = Place {
            id,
            slot,
            conns: Arc::clone(&conns),
            limits: Arc::clone(&limits),
            closing: closing.clone(),
        };
        let handler = Arc::clone(&handler);
        match &tls {
            None => tasks.spawn(connection(stream, at, handler)),
            Some(tls) => tasks.spawn(handshake(
                tokio_rustls::TlsAcceptor::from(tls.config()),
                stream,
                at,
                handler,
            )),
        };
    }
    drop(listener);
    closing.cancel();
    let all_closed = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(LINGER, all_closed).await.is_err() {
        tracing::debug!(
            listener = limits.name,
            connections = tasks.len(),
            "connections still open after the listener closed; they are closed without an answer"
        );
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }
}

fn made_room(limits: &Limits, idle: SocketAddr, newcomer: SocketAddr) {
    let name = limits.name;
    let max = limits.max_connections;
    let first = summary::first(&format!("{name} made room"), 1, SUMMARY_EVERY, || {
        move |n, _, window| {
            tracing::warn!(
                listener = name,
                max_connections = max,
                repeated = n,
                "{name}: all connections taken, the one idle longest closed for a newcomer: {n} more like it in the last {}s",
                summary::secs(window)
            )
        }
    });
    if first {
        tracing::warn!(
            listener = name,
            max_connections = max,
            closed = %idle,
            peer = %newcomer,
            "{name}: all connections taken, the one idle longest closed for a newcomer"
        );
    }
}

/// The answer to a request that arrived just as its connection was being closed (never read: the
/// connection goes right after).
fn closed_answer() -> Answer {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    r.headers_mut().insert(
        hyper::header::CONNECTION,
        hyper::header::HeaderValue::from_static("close"),
    );
    r
}

/// A connection's place in the server: its slot and what it shares with the others.
struct Place {
    id: u64,
    slot: Arc<Slot>,
    conns: Arc<Conns>,
    limits: Arc<Limits>,
    closing: CancellationToken,
}

/// The TLS handshake, within the first header's deadline (a client that stalls in it holds its
/// slot no longer than one that stalls in its header), then the connection.
async fn handshake<H, F>(
    acceptor: tokio_rustls::TlsAcceptor,
    stream: TcpStream,
    at: Place,
    handler: Arc<H>,
) where
    H: Fn(Request<Incoming>, SocketAddr) -> F + Send + Sync + 'static,
    F: Future<Output = Answer> + Send + 'static,
{
    let deadline = at.limits.header_timeout;
    let failed = tokio::select! {
        biased;
        _ = at.slot.evict.cancelled() => None,
        _ = at.closing.cancelled() => None,
        r = tokio::time::timeout(deadline, acceptor.accept(stream)) => match r {
            Ok(Ok(tls)) => return connection(tls, at, handler).await,
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some(format!("no handshake within {}s", deadline.as_secs_f64())),
        },
    };
    if let Some(error) = failed {
        handshake_failed(&at.limits, at.slot.peer, &error);
    }
    at.conns.remove(at.id);
}

/// One WARN, then a count per minute: a scanner or a client without the CA must not flood the log.
fn handshake_failed(limits: &Limits, peer: SocketAddr, error: &str) {
    let name = limits.name;
    let first = summary::first(&format!("{name} tls"), 1, SUMMARY_EVERY, || {
        move |n, _, window| {
            tracing::warn!(
                listener = name,
                repeated = n,
                "{name}: {n} more TLS handshakes failed in the last {}s",
                summary::secs(window)
            )
        }
    });
    if first {
        tracing::warn!(listener = name, %peer, error, "{name}: TLS handshake failed");
    }
}

async fn connection<S, H, F>(stream: S, at: Place, handler: Arc<H>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    H: Fn(Request<Incoming>, SocketAddr) -> F + Send + Sync + 'static,
    F: Future<Output = Answer> + Send + 'static,
{
    let Place {
        id,
        slot,
        conns,
        limits,
        closing,
    } = at;
    let peer = slot.peer;
    let service = {
        let (slot, conns) = (Arc::clone(&slot), Arc::clone(&conns));
        service_fn(move |req| {
            let (slot, conns, handler) =
                (Arc::clone(&slot), Arc::clone(&conns), Arc::clone(&handler));
            async move {
                if !slot.begin() {
                    return Ok::<_, Infallible>(closed_answer());
                }
                let answer = handler(req, peer).await;
                slot.end(conns.now_ms());
                conns.changed.notify_one();
                Ok(answer)
            }
        })
    };
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        // The deadlines below replace hyper's header timeout: they run from accept and from each
        // answer, not from when hyper starts reading.
        .header_read_timeout(None)
        .keep_alive(true)
        .half_close(true)
        // Headers and each read of a body: a connection's buffer stays small (bodies are read
        // by the handlers, within their limits).
        .max_buf_size(limits.max_buf)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let mut shutting_down = false;
    loop {
        // While a request is in progress its handler bounds it; look again after idle_timeout.
        let due = slot
            .due_ms(&limits)
            .map_or(Instant::now() + limits.idle_timeout, |ms| conns.at(ms));
        tokio::select! {
            biased;
            _ = slot.evict.cancelled() => break,
            _ = conn.as_mut() => break,
            _ = closing.cancelled(), if !shutting_down => {
                shutting_down = true;
                conn.as_mut().graceful_shutdown();
            }
            _ = tokio::time::sleep_until(due) => {
                if slot.due_ms(&limits).is_some_and(|ms| conns.now_ms() >= ms) && slot.close_if_idle() {
                    break;
                }
            }
        }
    }
    conns.remove(id);
}
