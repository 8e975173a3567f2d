//! A controllable HTTP/1.1 receiver for integration tests and benchmarks: the sink end of an HTTP
//! delivery, with a synchronous API for plain `#[test]` functions.
//!
//! The server runs on its own thread with its own (two-worker) tokio runtime and speaks HTTP/1.1
//! through hyper, over plain TCP or TLS (rustls, optionally verifying client certificates). What it
//! answers is set with [`Receiver::set_mode`]; every request is recorded as a [`Received`], and the
//! records of accepted requests can be awaited with [`Receiver::wait_records`] (a condition
//! variable, no polling). [`Receiver::start_counting`] keeps no bodies at all, only counters, for
//! benchmarks. [`Receiver::start_digesting`] streams each body through SHA-256 and keeps only the
//! digest and the length, for uploads of large files.
//!
//! Standalone on purpose: it uses std and the dev-dependencies only, so a bench can include it
//! with `#[path = "../tests/it/util/http/mod.rs"] mod http;`. This file holds the test's side (the
//! API and the state it shares with the server); `server.rs` the server, `cut.rs` the answers cut
//! short, `pki.rs` the certificates.
//!
//! A request is recorded (and counted) once its body has been read and before the answer is
//! written: a waiter can wake up a moment before the client has read its `200`.

#![allow(
    dead_code,
    unused_imports,
    reason = "shared by several test and bench binaries; each uses its own part"
)]

mod cut;
mod pki;
mod server;

use cut::CutIo;
pub use pki::{TestPki, client_config};
use server::*;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;

/// How long [`Receiver::set_mode`] keeps retrying to bind the same port again after [`Mode::Refuse`].
pub const REBIND_LIMIT: Duration = Duration::from_secs(10);

/// How many bytes of the status line and headers [`Mode::CloseMidResponse`] lets through.
pub const CUT_AFTER: usize = 20;

/// What the receiver answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// `200 OK`, the records are accepted.
    #[default]
    Accept,
    /// Nothing listens on the port: connects get ECONNREFUSED and open connections are closed.
    /// Any other mode binds the same port again.
    Refuse,
    /// The request is read and recorded, but not answered until the mode is set again (to anything,
    /// even `Hang`); then the connection is closed without an answer.
    Hang,
    /// This status with a short text body (`"<code> <reason>: refused by the test receiver"`); the
    /// records are accepted when the status is 2xx.
    Status(u16),
    /// This status with this text body.
    StatusWith(u16, &'static str),
    /// This status with a `Retry-After: secs` header (e.g. 429 or 503).
    RetryAfter { status: u16, secs: u64 },
    /// The first [`CUT_AFTER`] bytes of a `200` answer (part of its status line and headers), then
    /// the connection is closed.
    CloseMidResponse,
    /// `413` when the decompressed body is longer than this many bytes, else `200` (accepted).
    MaxBody(usize),
}

/// One request as the receiver saw it.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    /// The URI's path, without the query.
    pub path: String,
    pub query: Option<String>,
    /// The status answered; `None` when no complete answer was sent (`Hang`, `CloseMidResponse`).
    pub status: Option<u16>,
    pub idempotency_key: Option<String>,
    pub user_agent: Option<String>,
    pub content_type: Option<String>,
    pub content_encoding: Option<String>,
    /// Every header, names in lower case, values lossily decoded, in the order received.
    pub headers: Vec<(String, String)>,
    /// The body after undoing `Content-Encoding` (gzip or zstd); the raw bytes when that failed.
    pub body: Vec<u8>,
    /// The body's length on the wire (before decompression).
    pub wire_len: usize,
    /// Set when the body could not be decoded (the answer was then 400 or 415 in the accepting modes).
    pub decode_error: Option<String>,
    /// For a digesting receiver: the SHA-256 of the body (hex); `body` is then empty.
    pub sha256: Option<String>,
    pub at: Instant,
}

impl Received {
    /// The first header of that name (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The records this body holds (see [`Receiver::records`]), whatever was answered.
    pub fn records(&self) -> Vec<String> {
        let mut out = Vec::new();
        split_records(self.content_type.as_deref(), &self.body, &mut out);
        out
    }
}

/// A running receiver; dropping it stops the server thread.
pub struct Receiver {
    addr: SocketAddr,
    tls: bool,
    shared: Arc<Shared>,
    ctl: mpsc::UnboundedSender<Ctl>,
    thread: Option<JoinHandle<()>>,
}

impl Receiver {
    /// Plain HTTP on 127.0.0.1 (a free port), in [`Mode::Accept`], keeping every request.
    pub fn start() -> Receiver {
        Receiver::launch(None, false)
    }

    /// HTTPS with `pki`'s server certificate (valid for `localhost` and `127.0.0.1`). With
    /// `require_client_cert`, clients must present a certificate signed by `pki`'s CA.
    pub fn start_tls(pki: &TestPki, require_client_cert: bool) -> Receiver {
        Receiver::launch(Some(pki.server_config(require_client_cert)), false)
    }

    /// Plain HTTP that keeps no requests and no records, only [`Receiver::counts`]: for benchmarks.
    pub fn start_counting() -> Receiver {
        Receiver::launch(None, true)
    }

    /// Plain HTTP that keeps every request but not its body: the body is streamed through SHA-256
    /// ([`Received::sha256`]) without being held in memory, for large uploads.
    pub fn start_digesting() -> Receiver {
        let r = Receiver::launch(None, false);
        r.shared.digesting.store(true, Ordering::SeqCst);
        r
    }

    fn launch(tls: Option<rustls::ServerConfig>, counting: bool) -> Receiver {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            cond: Condvar::new(),
            counting,
            digesting: AtomicBool::new(false),
        });
        let is_tls = tls.is_some();
        let acceptor = tls.map(|c| TlsAcceptor::from(Arc::new(c)));
        let (ctl, ctl_rx) = mpsc::unbounded_channel();
        let (bound_tx, bound_rx) = std::sync::mpsc::sync_channel(1);
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("test-http-receiver".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name("test-http-receiver")
                    .enable_all()
                    .build()
                    .expect("build the receiver's runtime");
                rt.block_on(async move {
                    let listener = match bind(SocketAddr::from(([127, 0, 0, 1], 0))) {
                        Ok(l) => l,
                        Err(e) => {
                            let _ = bound_tx.send(Err(e.to_string()));
                            return;
                        }
                    };
                    let addr = listener.local_addr().expect("a bound address");
                    let _ = bound_tx.send(Ok(addr));
                    supervise(listener, addr, acceptor, thread_shared, ctl_rx).await;
                });
                rt.shutdown_timeout(Duration::from_secs(2));
            })
            .expect("spawn the receiver thread");
        let addr = match bound_rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(addr)) => addr,
            Ok(Err(e)) => panic!("the test receiver could not bind: {e}"),
            Err(e) => panic!("the test receiver did not start: {e}"),
        };
        Receiver {
            addr,
            tls: is_tls,
            shared,
            ctl,
            thread: Some(thread),
        }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT{path}`, or `https://localhost:PORT{path}` for TLS. `path` should
    /// start with `/`.
    pub fn url(&self, path: &str) -> String {
        if self.tls {
            format!("https://localhost:{}{path}", self.port())
        } else {
            format!("http://127.0.0.1:{}{path}", self.port())
        }
    }

    /// Switches the mode; returns once it is in force: after `Refuse`, the port is closed and so is
    /// every open connection; after leaving `Refuse`, the port is bound again (retried for up to
    /// [`REBIND_LIMIT`]; panics if it cannot be).
    pub fn set_mode(&self, mode: Mode) {
        let (ack, done) = std::sync::mpsc::sync_channel(1);
        self.ctl
            .send(Ctl::SetMode(mode, ack))
            .expect("the receiver thread is running");
        match done.recv_timeout(REBIND_LIMIT + Duration::from_secs(10)) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("set_mode({mode:?}): {e}"),
            Err(e) => panic!("set_mode({mode:?}): no answer from the receiver thread: {e}"),
        }
    }

    pub fn mode(&self) -> Mode {
        self.shared.lock().mode
    }

    /// Every request so far, in arrival order (empty for a counting receiver).
    pub fn requests(&self) -> Vec<Received> {
        self.shared.lock().requests.clone()
    }

    /// The records of every accepted (2xx) request, in arrival order: for `application/json`, each
    /// element of the body's array serialized compactly (a body that is not an array is one
    /// record; one that is not JSON is one record, its text); otherwise the body's lines (split on
    /// `\n`, an empty last piece dropped).
    pub fn records(&self) -> Vec<String> {
        self.shared.lock().records.clone()
    }

    /// Waits until at least `n` records were accepted, for at most `limit`.
    pub fn wait_records(&self, n: usize, limit: Duration) -> Result<Vec<String>, String> {
        let state = self.shared.wait(limit, |s| s.records.len() >= n)?;
        match state {
            Ok(s) => Ok(s.records.clone()),
            Err(s) => Err(format!(
                "{} of {n} records arrived within {limit:?} ({})",
                s.records.len(),
                s.summary()
            )),
        }
    }

    /// Waits until at least `n` requests (answered anything) were received, for at most `limit`.
    pub fn wait_requests(&self, n: usize, limit: Duration) -> Result<Vec<Received>, String> {
        let state = self.shared.wait(limit, |s| s.total_requests >= n as u64)?;
        match state {
            Ok(s) => Ok(s.requests.clone()),
            Err(s) => Err(format!(
                "{} of {n} requests arrived within {limit:?} ({})",
                s.total_requests,
                s.summary()
            )),
        }
    }

    /// Accepted `(requests, records, bytes)`; bytes are decompressed body bytes. Kept in every
    /// kind of receiver.
    pub fn counts(&self) -> (u64, u64, u64) {
        let s = self.shared.lock();
        (s.accepted_requests, s.accepted_records, s.accepted_bytes)
    }

    /// Waits until at least `n` records were accepted, for at most `limit`; returns
    /// [`Receiver::counts`].
    pub fn wait_count(&self, n: u64, limit: Duration) -> Result<(u64, u64, u64), String> {
        let state = self.shared.wait(limit, |s| s.accepted_records >= n)?;
        match state {
            Ok(s) => Ok((s.accepted_requests, s.accepted_records, s.accepted_bytes)),
            Err(s) => Err(format!(
                "{} of {n} records arrived within {limit:?} ({})",
                s.accepted_records,
                s.summary()
            )),
        }
    }

    /// Every request received, whatever was answered (also kept by a counting receiver).
    pub fn total_requests(&self) -> u64 {
        self.shared.lock().total_requests
    }

    /// TLS handshakes that failed (e.g. a client without an accepted certificate), as error texts.
    pub fn tls_errors(&self) -> Vec<String> {
        self.shared.lock().tls_errors.clone()
    }

    /// Waits until at least `n` TLS handshakes have failed, for at most `limit`.
    pub fn wait_tls_errors(&self, n: usize, limit: Duration) -> Result<Vec<String>, String> {
        let state = self.shared.wait(limit, |s| s.tls_errors.len() >= n)?;
        match state {
            Ok(s) => Ok(s.tls_errors.clone()),
            Err(s) => Err(format!(
                "{} of {n} TLS handshake failures within {limit:?} ({})",
                s.tls_errors.len(),
                s.summary()
            )),
        }
    }

    /// Forgets every request, record, count and TLS error so far.
    pub fn clear(&self) {
        let mut s = self.shared.lock();
        let mode = s.mode;
        *s = State::default();
        s.mode = mode;
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.ctl.send(Ctl::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// State shared between the server and the test.

struct Shared {
    state: Mutex<State>,
    cond: Condvar,
    counting: bool,
    digesting: AtomicBool,
}

#[derive(Default)]
struct State {
    mode: Mode,
    requests: Vec<Received>,
    records: Vec<String>,
    total_requests: u64,
    accepted_requests: u64,
    accepted_records: u64,
    accepted_bytes: u64,
    tls_errors: Vec<String>,
}

impl State {
    fn summary(&self) -> String {
        let mut statuses: Vec<String> = self
            .requests
            .iter()
            .map(|r| r.status.map_or_else(|| "-".to_string(), |s| s.to_string()))
            .collect();
        if statuses.len() > 20 {
            let n = statuses.len();
            statuses.drain(..n - 20);
            statuses.insert(0, "...".into());
        }
        format!(
            "{} requests in all, {} accepted; mode {:?}; last statuses [{}]; {} TLS failures",
            self.total_requests,
            self.accepted_requests,
            self.mode,
            statuses.join(" "),
            self.tls_errors.len()
        )
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for `done`, at most `limit`: `Ok(guard)` when it holds, `Err(guard)` on timeout.
    #[allow(
        clippy::type_complexity,
        reason = "a guard either way; allow, as a bench that never calls this does not lint it"
    )]
    fn wait(
        &self,
        limit: Duration,
        done: impl Fn(&State) -> bool,
    ) -> Result<Result<MutexGuard<'_, State>, MutexGuard<'_, State>>, String> {
        let deadline = Instant::now() + limit;
        let mut guard = self.lock();
        loop {
            if done(&guard) {
                return Ok(Ok(guard));
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(Err(guard));
            }
            guard = self
                .cond
                .wait_timeout(guard, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn tls_error(&self, e: String) {
        self.lock().tls_errors.push(e);
        self.cond.notify_all();
    }
}

/// Lower-case hex.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
