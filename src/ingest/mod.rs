//! The local ingest API: programs on this machine POST records to a stream over HTTP/1.1, and get
//! `200 {"accepted": N}` only once the records are on disk (the store writer's reply to the append).
//! The contract is `schemas/openapi.yaml`; the request handling and the status codes are in
//! [`api`], the body formats in [`body`].
//!
//! This file owns the listener and the connections: the listener is bound by [`start`] (a taken
//! port stops colibri's start), connections are bounded by `max_connections` (more wait in the
//! listen backlog), each is served by hyper with `read_timeout` for headers and idle keep-alive.
//! Stop: when `stopping` is cancelled, new requests are answered 503 while requests in progress
//! finish (at least [`DRAIN_MIN`], at most `read_timeout + wait + 2s`); then the listener is closed,
//! idle connections are closed, and the task ends once every connection has (again within
//! `read_timeout + wait + 2s`, then they are aborted), so the agent closes the store after the last
//! append.

pub mod api;
pub mod body;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::units::{fmt_duration, fmt_size};
use crate::store::writer::StoreHandle;

/// After `stopping`, new requests are answered 503 for at least this long, and until the requests
/// in progress have finished.
pub const DRAIN_MIN: Duration = Duration::from_millis(500);

/// hyper's read buffer per connection (its default is ~400 KiB): request headers must fit.
const MAX_BUF: usize = 64 << 10;

/// The compiled `ingest:` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IngestConfig {
    pub listen: SocketAddr,
    /// Largest body, on the wire and decompressed.
    pub max_body: u64,
    pub token: Option<Token>,
    pub max_connections: u32,
    /// Requests whose bodies are read and stored at once.
    pub max_requests: u32,
    /// For the headers, then for the body, of each request; and idle keep-alive.
    pub read_timeout: Duration,
    /// How long an append waits for room in a full stream.
    pub wait: Duration,
    /// The streams requests may name, and what their records must be (their sinks' formats).
    pub streams: std::collections::BTreeMap<String, crate::sink::RecordFormat>,
}

impl IngestConfig {
    /// For `colibri check`.
    pub fn describe(&self) -> String {
        format!(
            "http://{}/v1/streams/{{stream}}/records, {}, bodies <= {}, {} requests / {} connections at once, read timeout {}, waits {} for room",
            self.listen,
            if self.token.is_some() {
                "bearer token required"
            } else {
                "no token"
            },
            fmt_size(self.max_body),
            self.max_requests,
            self.max_connections,
            fmt_duration(self.read_timeout),
            fmt_duration(self.wait),
        )
    }
}

/// The bearer token: never printed, compared in constant time.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    pub fn new(token: String) -> Self {
        Token(token)
    }

    /// Whether `given` is the token, in time that depends on the token's length only.
    pub fn matches(&self, given: &[u8]) -> bool {
        let want = self.0.as_bytes();
        let mut diff = want.len() ^ given.len();
        for (i, w) in want.iter().enumerate() {
            let g = given.get(i).copied().unwrap_or(0);
            diff |= usize::from(w ^ g);
        }
        std::hint::black_box(diff) == 0
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// What every connection and request shares.
pub(crate) struct Shared {
    pub config: IngestConfig,
    pub store: StoreHandle,
    pub stopping: CancellationToken,
    /// `max_requests` permits.
    pub requests: Arc<Semaphore>,
    /// Records requests that have not been answered yet.
    pub in_progress: AtomicUsize,
}

/// Binds the listener (an error here stops colibri's start) and serves until `stopping`.
pub async fn start(
    config: IngestConfig,
    store: StoreHandle,
    stopping: CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let listener =
        bind(config.listen).with_context(|| format!("cannot listen on {}", config.listen))?;
    let local = listener
        .local_addr()
        .context("the listener has no address")?;
    tracing::info!(
        listen = %local,
        max_body = config.max_body,
        max_requests = config.max_requests,
        max_connections = config.max_connections,
        token = config.token.is_some(),
        "ingest listening"
    );
    if !local.ip().is_loopback() && config.token.is_none() {
        tracing::warn!(
            listen = %local,
            "ingest listens beyond this machine without a token: anyone who can reach the port can append records (set ingest.token)"
        );
    }
    let shared = Arc::new(Shared {
        requests: Arc::new(Semaphore::new(config.max_requests as usize)),
        in_progress: AtomicUsize::new(0),
        config,
        store,
        stopping,
    });
    Ok(tokio::spawn(serve(listener, shared)))
}

pub(crate) fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
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

async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let connections = Arc::new(Semaphore::new(shared.config.max_connections as usize));
    let closing = CancellationToken::new();
    let mut tasks = JoinSet::new();
    let stopping = shared.stopping.clone();
    // Serving.
    loop {
        let permit = tokio::select! {
            p = Arc::clone(&connections).acquire_owned() => p.expect("never closed"),
            _ = stopping.cancelled() => break,
        };
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stopping.cancelled() => break,
        };
        accepted_connection(accepted, permit, &shared, &closing, &mut tasks).await;
        while tasks.try_join_next().is_some() {}
    }
    // Stopping: new requests get 503 until the ones in progress are done.
    let drain_from = tokio::time::Instant::now();
    tracing::info!(
        in_progress = shared.in_progress.load(Ordering::Relaxed),
        "ingest stopping: new requests are answered 503 while requests in progress finish"
    );
    // Every request in progress is bounded by read_timeout (its body) and wait (its append); this
    // bounds the drain, and then the connections, should one be stuck anyway.
    let limit = shared.config.read_timeout + shared.config.wait + Duration::from_secs(2);
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    loop {
        let elapsed = drain_from.elapsed();
        let in_progress = shared.in_progress.load(Ordering::Acquire);
        if elapsed >= DRAIN_MIN && in_progress == 0 {
            break;
        }
        if elapsed >= limit.max(DRAIN_MIN) {
            tracing::warn!(
                in_progress,
                "ingest stopping: requests still in progress after the drain limit; closing anyway"
            );
            break;
        }
        tokio::select! {
            a = listener.accept() => {
                // Past max_connections a newcomer is closed at once rather than queued.
                if let Ok(permit) = Arc::clone(&connections).try_acquire_owned() {
                    accepted_connection(a, permit, &shared, &closing, &mut tasks).await;
                }
            }
            _ = tick.tick() => {}
        }
        while tasks.try_join_next().is_some() {}
    }
    drop(listener);
    closing.cancel();
    let all_closed = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(limit, all_closed).await.is_err() {
        tracing::warn!(
            connections = tasks.len(),
            "ingest stopped with connections still open; they are closed without an answer"
        );
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }
    tracing::info!("ingest stopped");
}

async fn accepted_connection(
    accepted: std::io::Result<(TcpStream, SocketAddr)>,
    permit: OwnedSemaphorePermit,
    shared: &Arc<Shared>,
    closing: &CancellationToken,
    tasks: &mut JoinSet<()>,
) {
    match accepted {
        Ok((stream, peer)) => {
            let _ = stream.set_nodelay(true);
            tasks.spawn(connection(
                stream,
                peer,
                Arc::clone(shared),
                closing.clone(),
                permit,
            ));
        }
        Err(e) => {
            // E.g. out of file descriptors: not fatal, but do not spin.
            tracing::warn!(error = %e, "ingest cannot accept a connection");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    closing: CancellationToken,
    _permit: OwnedSemaphorePermit,
) {
    let timeout = shared.config.read_timeout;
    let service = service_fn(move |req| {
        let shared = Arc::clone(&shared);
        async move { Ok::<_, std::convert::Infallible>(api::handle(req, &shared, peer).await) }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(timeout)
        .keep_alive(true)
        // Headers and each read of a body: a connection's buffer stays small (bodies are
        // collected by the handler, within max_body).
        .max_buf_size(MAX_BUF)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        _ = closing.cancelled() => conn.as_mut().graceful_shutdown(),
    }
    let _ = conn.await;
}
