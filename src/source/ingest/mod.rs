//! The local ingest API: programs on this machine POST records to a stream over HTTP/1.1, and get
//! `200 {"accepted": N}` only once the records are on disk (the store writer's reply to the append).
//! The contract is `schemas/openapi.yaml`; the request handling and the status codes are in
//! [`api`], the body formats in [`body`]; connections (bounded, deadlines from accept, the idle
//! one closed for a newcomer, half-closed clients answered) are `crate::net::server`'s.
//!
//! This file owns the listener's life: [`start`] binds it (a taken port stops colibri's start).
//! The stop: from `stopping` on, new requests are answered 503 while requests in progress finish
//! ([`Running::drained`], bounded by `read_timeout + wait + 2s`; an append waiting for room in a
//! full stream is answered 503 at once, the agent tells the store writer); the listener keeps
//! answering 503 until the agent ends the stop with [`Running::close`], after the store is closed.

pub mod api;
pub mod body;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::net::token::Token;
use crate::store::writer::StoreHandle;
use crate::units::{fmt_duration, fmt_size};

/// hyper's read buffer per connection (its default is ~400 KiB): request headers must fit.
const MAX_BUF: usize = 64 << 10;

/// The compiled `ingest:` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IngestConfig {
    pub listen: SocketAddr,
    /// Largest body, on the wire and decompressed.
    pub max_body: u64,
    /// What the bodies of all requests in progress may hold at once ([`body_cost`] each).
    pub max_memory: u64,
    pub token: Option<Token>,
    pub max_connections: u32,
    /// Requests whose bodies are read and stored at once.
    pub max_requests: u32,
    /// For the body of each request, and between requests on a kept-alive connection (the first
    /// header: [`HEADER_TIMEOUT`], or this when shorter).
    pub read_timeout: Duration,
    /// How long an append waits for room in a full stream.
    pub wait: Duration,
    /// The streams requests may name, and what their records must be (their sinks' formats).
    pub streams: std::collections::BTreeMap<String, crate::record::RecordFormat>,
    /// HTTPS instead of HTTP.
    pub tls: Option<crate::net::tls_server::ServerTls>,
}

impl IngestConfig {
    /// For `colibri check`.
    pub fn describe(&self) -> String {
        format!(
            "{}://{}/v1/streams/{{stream}}/records{}, {}, bodies <= {} ({} of memory for all), {} requests / {} connections at once, read timeout {}, waits {} for room",
            if self.tls.is_some() { "https" } else { "http" },
            self.listen,
            match &self.tls {
                Some(t) if t.files.client_ca_file.is_some() =>
                    " (TLS, client certificates required)",
                Some(_) => " (TLS)",
                None => "",
            },
            if self.token.is_some() {
                "bearer token required"
            } else {
                "no token"
            },
            fmt_size(self.max_body),
            fmt_size(self.max_memory),
            self.max_requests,
            self.max_connections,
            fmt_duration(self.read_timeout),
            fmt_duration(self.wait),
        )
    }
}

/// Bytes a parsed record costs beyond its own: its entry in the list of records and the
/// allocator's rounding.
const RECORD_OVERHEAD: u64 = 64;

/// The most memory a request's body may hold at once while it is read, decoded, split into records
/// and stored: twice what it decodes to (the body and its records; the compressed copy is freed
/// before the split, and the encoded jobs are made from the records once the body is gone) plus
/// [`RECORD_OVERHEAD`] per record it may hold. A gzip body may decode to `max_body` whatever its
/// length. A request reserves this much of `max_memory` before its body is read.
pub fn body_cost(length: u64, gzip: bool, max_body: u64) -> u64 {
    let decoded = if gzip { max_body } else { length };
    // A record is at least one byte and a separator.
    let records = (decoded / 2 + 1).min(body::MAX_RECORDS as u64);
    decoded.saturating_mul(2) + records * RECORD_OVERHEAD
}

/// A request that reserved more than this gives the allocator's free memory back to the system
/// once it is answered (see [`give_back_memory`]).
pub(crate) const TRIM_ABOVE: u64 = 4 << 20;

/// Returns the free memory of every allocator arena to the system. glibc keeps what a thread
/// freed in that thread's arena: the records of one large body (parsed on one blocking-pool
/// thread) and its encoded jobs (on the store writer's) would stay resident beside the next
/// body, so peak RSS would be about three bodies' worth rather than the two `body_cost` counts.
/// Runs on the blocking pool (it walks the heaps).
pub(crate) fn give_back_memory() {
    tokio::task::spawn_blocking(crate::memory::trim_heap);
}

/// What every connection and request shares.
pub(crate) struct Shared {
    pub config: IngestConfig,
    pub store: StoreHandle,
    pub stopping: CancellationToken,
    /// `max_requests` permits.
    pub requests: Arc<Semaphore>,
    /// `max_memory` permits, one per byte: reserved by [`body_cost`] before a body is read.
    pub memory: Arc<Semaphore>,
    /// Records requests that have not been answered yet.
    pub in_progress: AtomicUsize,
    /// Signalled when one of them is answered (the stop waits for the last).
    pub answered: tokio::sync::Notify,
    /// When `stopping` was noticed: the drain is bounded from then.
    pub stop_began: std::sync::OnceLock<tokio::time::Instant>,
    pub stats: Arc<IngestStats>,
}

/// Answers by stream and status: what `/metrics` shows of the ingest API.
#[derive(Debug, Default)]
pub struct IngestStats {
    /// (stream, status) → requests; the stream is "" for paths that name none, or name a stream
    /// the config does not have (a label holds only names from the file).
    pub answers: crate::metrics::CountsBy<(String, u16)>,
}

/// A connection's first request header must be complete this long after accept (at most
/// `read_timeout`): an idle socket does not hold a slot for long.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// The running listener, as the agent's stop sequence drives it.
pub struct Running {
    shared: Arc<Shared>,
    close: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

/// Binds the listener (an error here stops colibri's start) and serves; from `stopping` on, new
/// requests are answered 503 until [`Running::close`].
pub async fn start(
    config: IngestConfig,
    store: StoreHandle,
    stopping: CancellationToken,
) -> anyhow::Result<Running> {
    let listener = crate::net::server::bind(config.listen)
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let local = listener
        .local_addr()
        .context("the listener has no address")?;
    tracing::info!(
        listen = %local,
        max_body = config.max_body,
        max_requests = config.max_requests,
        max_connections = config.max_connections,
        token = config.token.is_some(),
        tls = config.tls.is_some(),
        "ingest listening"
    );
    if !local.ip().is_loopback() && config.token.is_none() {
        tracing::warn!(
            listen = %local,
            "ingest listens beyond this machine without a token: anyone who can reach the port can append records (set ingest.token)"
        );
    }
    let limits = crate::net::server::Limits {
        name: "ingest",
        max_connections: config.max_connections as usize,
        header_timeout: HEADER_TIMEOUT.min(config.read_timeout),
        idle_timeout: config.read_timeout,
        max_buf: MAX_BUF,
        // An append waits for room only within `wait`: every request is a short one.
        long: None,
    };
    let shared = Arc::new(Shared {
        requests: Arc::new(Semaphore::new(config.max_requests as usize)),
        memory: Arc::new(Semaphore::new(config.max_memory as usize)),
        in_progress: AtomicUsize::new(0),
        answered: tokio::sync::Notify::new(),
        stop_began: std::sync::OnceLock::new(),
        stats: Arc::default(),
        config,
        store,
        stopping: stopping.clone(),
    });
    let handler = {
        let shared = Arc::clone(&shared);
        move |req, peer| {
            let shared = Arc::clone(&shared);
            async move { api::handle(req, &shared, peer).await }
        }
    };
    let close = CancellationToken::new();
    let task = tokio::spawn(crate::net::server::serve(
        listener,
        limits,
        shared.config.tls.clone(),
        close.clone(),
        handler,
    ));
    {
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            stopping.cancelled().await;
            let _ = shared.stop_began.set(tokio::time::Instant::now());
            tracing::info!(
                in_progress = shared.in_progress.load(Ordering::Relaxed),
                "ingest stopping: new requests are answered 503 until the stop ends; requests in progress finish"
            );
        });
    }
    Ok(Running {
        shared,
        close,
        task,
    })
}

impl Running {
    /// Its counters, for `/metrics`.
    pub fn stats(&self) -> Arc<IngestStats> {
        Arc::clone(&self.shared.stats)
    }

    /// After `stopping`: returns once every request that began before it has been answered. Each
    /// is bounded by `read_timeout` (its body) and `wait` (its append), which bounds this too:
    /// at most `read_timeout + wait + 2s` after the stop began.
    pub async fn drained(&self) {
        let s = &self.shared;
        let limit = s.config.read_timeout + s.config.wait + Duration::from_secs(2);
        let began = *s.stop_began.get_or_init(tokio::time::Instant::now);
        let until = began + limit;
        loop {
            let answered = s.answered.notified();
            let in_progress = s.in_progress.load(Ordering::Acquire);
            if in_progress == 0 {
                tracing::info!(
                    "ingest drained: every request in progress was answered; new ones get 503 until the stop ends"
                );
                return;
            }
            tokio::select! {
                _ = answered => {}
                _ = tokio::time::sleep_until(until) => {
                    tracing::warn!(
                        in_progress,
                        "ingest stopping: requests still in progress after the drain limit; the stop goes on"
                    );
                    return;
                }
            }
        }
    }

    /// The end of the stop: closes the listener and the connections (those still answering get
    /// a moment to finish).
    pub async fn close(self) {
        self.close.cancel();
        let _ = self.task.await;
        tracing::info!("ingest stopped");
    }
}
