//! The HTTP/1.1 server under both listeners, the ingest API and the admin endpoint: binding, the
//! accept loop, and the life of each connection. It decides which connections are served, never
//! what a request means (that is the handler each listener passes in).
//!
//! Idle connections must not starve real ones. A connection takes one of `max_connections` slots
//! ([`super::slots`]); it must deliver a complete request header within `header_timeout` of being accepted, and each
//! later one within `idle_timeout` of the previous answer, or it is closed. When every slot is
//! taken, the connection that has been idle longest (no complete header yet, or waiting between
//! requests) is closed to make room for the newcomer; only when every slot is in the middle of a
//! request does the newcomer wait (with the listen backlog behind it) for one to end. Clients
//! that shut down their write side after the request (`shutdown(SHUT_WR)`, `nc -N`) still get the
//! answer (hyper's half-close). With TLS, the handshake is part of the first header's deadline,
//! and each handshake takes the listener's certificate as it is then (a reload may have replaced
//! it; connections already open keep theirs); a plain HTTP request on a TLS port is answered
//! with a plain `400` saying the port speaks https. Long polls (a listener's [`LongRequests`],
//! admin's tap) may be in progress in only their share of the slots, so that they never make
//! a short request wait or leave only their own connections to close for it. Used by `ingest` and `admin`.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
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

use super::slots::{Slot, Slots, Taken};
use super::tls_server::ServerTls;
use crate::logging::summary;

pub type Answer = Response<Full<Bytes>>;

/// How long connections still open when the listener closes may take to finish their answer.
const LINGER: Duration = Duration::from_secs(2);

/// Repeated events of the accept loop (accept errors, failed handshakes) are summarised this often.
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
    /// Requests that wait for something before they answer (long polls) and how many may be in
    /// progress at once; one past that is answered 503 at once. The other slots are kept for
    /// short requests (health checks, scrapes, operator commands), which then never wait
    /// behind long polls, nor find only long-polling connections to close for room.
    pub long: Option<LongRequests>,
}

/// Which requests are long polls, and how many may be in progress at once.
#[derive(Debug, Clone, Copy)]
pub struct LongRequests {
    pub is_long: fn(&Request<Incoming>) -> bool,
    pub max: usize,
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

/// When an idle connection's next header is due (`None` while a request is in progress): the
/// first `header_timeout` after accept, later ones `idle_timeout` after an answer.
fn due_ms(slot: &Slot, limits: &Limits) -> Option<u64> {
    if !slot.is_idle() {
        return None;
    }
    let wait = if slot.begun() == 0 {
        limits.header_timeout
    } else {
        limits.idle_timeout
    };
    Some(slot.idle_since_ms() + wait.as_millis() as u64)
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
    let long = limits
        .long
        .map(|l| (l, Arc::new(tokio::sync::Semaphore::new(l.max))));
    let handler = Arc::new(handler);
    let handler = Arc::new(move |req: Request<Incoming>, peer| {
        // A long poll holds one of its own permits while in progress.
        let permit = match &long {
            Some((l, permits)) if (l.is_long)(&req) => {
                match Arc::clone(permits).try_acquire_owned() {
                    Ok(p) => Some(p),
                    Err(_) => return ready_answer(too_many_long(l.max)),
                }
            }
            _ => None,
        };
        let answer = handler(req, peer);
        Box::pin(async move {
            let answer = answer.await;
            drop(permit);
            answer
        }) as std::pin::Pin<Box<dyn Future<Output = Answer> + Send>>
    });
    let limits = Arc::new(limits);
    let slots = Slots::new(limits.name, limits.max_connections);
    let closing = CancellationToken::new();
    let mut tasks = JoinSet::new();
    loop {
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
        // Every request is bounded by its handler's own timeouts: a newcomer that finds every
        // slot busy waits for one.
        let Some(taken) = slots.take(peer, &close).await else {
            break;
        };
        let _ = stream.set_nodelay(true);
        let at = Place {
            taken,
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

/// An answer given without running the handler.
fn ready_answer(a: Answer) -> std::pin::Pin<Box<dyn Future<Output = Answer> + Send>> {
    Box::pin(std::future::ready(a))
}

/// The answer to a long poll past [`LongRequests::max`]: at once, so that it holds no slot.
fn too_many_long(max: usize) -> Answer {
    let mut r = Response::new(Full::new(Bytes::from(format!(
        "too many long requests in progress ({max}, such as tap viewers): try again later\n"
    ))));
    *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    let h = r.headers_mut();
    h.insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(
        hyper::header::RETRY_AFTER,
        hyper::header::HeaderValue::from_static("1"),
    );
    r
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
    taken: Taken,
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
        _ = at.taken.slot.evict.cancelled() => None,
        _ = at.closing.cancelled() => None,
        r = tokio::time::timeout(deadline, accept(acceptor, stream)) => match r {
            Ok(Accepted::Tls(tls)) => return connection(*tls, at, handler).await,
            Ok(Accepted::Plain(stream)) => {
                refuse_plain(stream, &at.limits, at.taken.slot.peer).await;
                None
            }
            Ok(Accepted::Failed(e)) => Some(e.to_string()),
            Err(_) => Some(format!("no handshake within {}s", deadline.as_secs_f64())),
        },
    };
    if let Some(error) = failed {
        handshake_failed(&at.limits, at.taken.slot.peer, &error);
    }
}

/// What the first bytes of a connection to a TLS listener turned out to be.
enum Accepted {
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
    /// Plain text that starts like an HTTP request: a client that forgot `https://`.
    Plain(TcpStream),
    Failed(std::io::Error),
}

/// The handshake, unless the client speaks plain HTTP: a TLS record starts with its content type
/// (0x14-0x17), an HTTP request with its method in capitals.
async fn accept(acceptor: tokio_rustls::TlsAcceptor, stream: TcpStream) -> Accepted {
    let mut first = [0u8; 1];
    match stream.peek(&mut first).await {
        Ok(1) if first[0].is_ascii_uppercase() => return Accepted::Plain(stream),
        Ok(_) => {}
        Err(e) => return Accepted::Failed(e),
    }
    match acceptor.accept(stream).await {
        Ok(tls) => Accepted::Tls(Box::new(tls)),
        Err(e) => Accepted::Failed(e),
    }
}

/// How long the refusal of a plain request may take to write.
const REFUSAL_WRITE: Duration = Duration::from_secs(1);

/// Answers a plain HTTP request on a TLS port with a plain refusal the client can read (rather
/// than TLS bytes it shows as garbage), and says so in the log: once, then a count per minute.
async fn refuse_plain(mut stream: TcpStream, limits: &Limits, peer: SocketAddr) {
    use tokio::io::AsyncWriteExt as _;
    const BODY: &str = "this port speaks https: use https:// (TLS)\n";
    let answer = format!(
        "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{BODY}",
        BODY.len()
    );
    let write = async {
        stream.write_all(answer.as_bytes()).await?;
        stream.shutdown().await
    };
    let _ = tokio::time::timeout(REFUSAL_WRITE, write).await;
    let name = limits.name;
    if first_of_its_kind(
        name,
        "plain http",
        "plain HTTP requests on the TLS port refused",
    ) {
        tracing::warn!(listener = name, %peer, "{name}: plain HTTP request on the TLS port refused (this port speaks https)");
    }
}

/// Whether this is the first of a kind of event on listener `name` within the summary interval;
/// the rest are counted and reported once a minute as "`name`: N more `repeated` in the last Ns".
fn first_of_its_kind(name: &'static str, kind: &str, repeated: &'static str) -> bool {
    summary::first(&format!("{name} {kind}"), 1, SUMMARY_EVERY, || {
        move |n, _, window| {
            tracing::warn!(
                listener = name,
                repeated = n,
                "{name}: {n} more {repeated} in the last {}s",
                summary::secs(window)
            )
        }
    })
}

/// One WARN, then a count per minute: a scanner or a client without the CA must not flood the log.
fn handshake_failed(limits: &Limits, peer: SocketAddr, error: &str) {
    let name = limits.name;
    if first_of_its_kind(name, "tls", "TLS handshakes failed") {
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
        taken,
        limits,
        closing,
    } = at;
    let taken = Arc::new(taken);
    let slot = Arc::clone(&taken.slot);
    let peer = slot.peer;
    let service = {
        let taken = Arc::clone(&taken);
        service_fn(move |req| {
            let (taken, handler) = (Arc::clone(&taken), Arc::clone(&handler));
            async move {
                if !taken.slot.begin() {
                    return Ok::<_, Infallible>(closed_answer());
                }
                let answer = handler(req, peer).await;
                taken.end();
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
        let slots = taken.slots();
        let due =
            due_ms(&slot, &limits).map_or(Instant::now() + limits.idle_timeout, |ms| slots.at(ms));
        tokio::select! {
            biased;
            _ = slot.evict.cancelled() => break,
            _ = conn.as_mut() => break,
            _ = closing.cancelled(), if !shutting_down => {
                shutting_down = true;
                conn.as_mut().graceful_shutdown();
            }
            _ = tokio::time::sleep_until(due) => {
                if due_ms(&slot, &limits).is_some_and(|ms| slots.now_ms() >= ms) && slot.close_if_idle() {
                    break;
                }
            }
        }
    }
}
