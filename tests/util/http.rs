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
//! with `#[path = "../tests/util/http.rs"] mod http;`.
//!
//! A request is recorded (and counted) once its body has been read and before the answer is
//! written: a waiter can wake up a moment before the client has read its `200`.

#![allow(dead_code)] // shared by several test and bench binaries; each uses its own part

use std::io::{self, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, ready};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

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
    #[allow(clippy::type_complexity)]
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

// ---------------------------------------------------------------------------------------------
// The server.

enum Ctl {
    SetMode(Mode, std::sync::mpsc::SyncSender<Result<(), String>>),
    Shutdown,
}

/// The per-connection context.
#[derive(Clone)]
struct Ctx {
    shared: Arc<Shared>,
    /// (generation, mode): the generation grows with every `set_mode`.
    mode: watch::Receiver<(u64, Mode)>,
}

fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

async fn rebind(addr: SocketAddr) -> Result<TcpListener, String> {
    let deadline = Instant::now() + REBIND_LIMIT;
    loop {
        match bind(addr) {
            Ok(l) => return Ok(l),
            Err(e) if Instant::now() >= deadline => {
                return Err(format!(
                    "could not bind {addr} again within {REBIND_LIMIT:?}: {e}"
                ));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

async fn accept(listener: &Option<TcpListener>) -> io::Result<TcpStream> {
    match listener {
        Some(l) => l.accept().await.map(|(s, _)| s),
        None => std::future::pending().await,
    }
}

async fn supervise(
    listener: TcpListener,
    addr: SocketAddr,
    tls: Option<TlsAcceptor>,
    shared: Arc<Shared>,
    mut ctl: mpsc::UnboundedReceiver<Ctl>,
) {
    let (mode_tx, mode_rx) = watch::channel((0u64, Mode::Accept));
    let ctx = Ctx {
        shared: Arc::clone(&shared),
        mode: mode_rx,
    };
    let mut listener = Some(listener);
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            cmd = ctl.recv() => match cmd {
                None | Some(Ctl::Shutdown) => break,
                Some(Ctl::SetMode(mode, ack)) => {
                    shared.lock().mode = mode;
                    mode_tx.send_modify(|(generation, m)| {
                        *generation += 1;
                        *m = mode;
                    });
                    let result = if mode == Mode::Refuse {
                        listener = None;
                        conns.abort_all();
                        while conns.join_next().await.is_some() {}
                        Ok(())
                    } else if listener.is_none() {
                        rebind(addr).await.map(|l| listener = Some(l))
                    } else {
                        Ok(())
                    };
                    let _ = ack.send(result);
                }
            },
            accepted = accept(&listener) => match accepted {
                Ok(stream) => {
                    let _ = stream.set_nodelay(true);
                    conns.spawn(serve(stream, tls.clone(), ctx.clone()));
                }
                // E.g. out of file descriptors: try again shortly.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

async fn serve(stream: TcpStream, tls: Option<TlsAcceptor>, ctx: Ctx) {
    let cut = Arc::new(AtomicBool::new(false));
    match tls {
        None => serve_http(CutIo::new(stream, Arc::clone(&cut)), cut, ctx).await,
        Some(acceptor) => {
            match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream)).await {
                Ok(Ok(tls)) => serve_http(CutIo::new(tls, Arc::clone(&cut)), cut, ctx).await,
                Ok(Err(e)) => ctx.shared.tls_error(e.to_string()),
                Err(_) => ctx.shared.tls_error("TLS handshake timed out".into()),
            }
        }
    }
}

async fn serve_http<T>(io: CutIo<T>, cut: Arc<AtomicBool>, ctx: Ctx)
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |req| handle(req, ctx.clone(), Arc::clone(&cut)));
    let _ = http1::Builder::new()
        .keep_alive(true)
        .serve_connection(TokioIo::new(io), service)
        .await;
}

/// An error that makes hyper close the connection without answering.
#[derive(Debug)]
struct Close(&'static str);

impl std::fmt::Display for Close {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for Close {}

async fn handle(
    req: Request<Incoming>,
    ctx: Ctx,
    cut: Arc<AtomicBool>,
) -> Result<Response<Full<Bytes>>, Close> {
    let (parts, mut body) = req.into_parts();
    let mut sha256 = None;
    let mut streamed = 0usize;
    let wire = if ctx.shared.digesting.load(Ordering::SeqCst) {
        let mut h = ring::digest::Context::new(&ring::digest::SHA256);
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else {
                return Err(Close("the request body could not be read"));
            };
            if let Some(d) = frame.data_ref() {
                h.update(d);
                streamed += d.len();
            }
        }
        sha256 = Some(hex(h.finish().as_ref()));
        Bytes::new()
    } else {
        match body.collect().await {
            Ok(c) => c.to_bytes(),
            Err(_) => return Err(Close("the request body could not be read")),
        }
    };
    let at = Instant::now();
    let (generation, mode) = *ctx.mode.borrow();
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    };
    let content_type = header("content-type");
    let content_encoding = header("content-encoding");
    let wire_len = wire.len().max(streamed);
    let (body, decode_error) = match decode(content_encoding.as_deref(), wire.clone()) {
        Ok(b) => (b, None),
        Err(e) => (wire, Some(e)),
    };

    let reply = |status: u16, text: String| (Some(status), text);
    let (status, text) = match mode {
        Mode::Refuse => return Err(Close("refusing")),
        Mode::Hang | Mode::CloseMidResponse => (None, String::new()),
        Mode::Status(s) => reply(s, default_text(s)),
        Mode::StatusWith(s, text) => reply(s, text.to_string()),
        Mode::RetryAfter { status, .. } => reply(status, default_text(status)),
        Mode::Accept | Mode::MaxBody(_) if decode_error.is_some() => {
            let e = decode_error.as_deref().unwrap_or_default();
            let s = if e.starts_with("unsupported") {
                415
            } else {
                400
            };
            reply(s, format!("cannot decode the body: {e}"))
        }
        Mode::MaxBody(max) if body.len() > max => {
            reply(413, format!("body of {} bytes is over {max}", body.len()))
        }
        Mode::Accept | Mode::MaxBody(_) => reply(200, String::new()),
    };
    let accepted = status.is_some_and(|s| (200..300).contains(&s));

    {
        let mut state = ctx.shared.lock();
        state.total_requests += 1;
        if accepted {
            state.accepted_requests += 1;
            state.accepted_bytes += body.len().max(streamed) as u64;
        }
        if ctx.shared.counting {
            if accepted {
                state.accepted_records += count_records(content_type.as_deref(), &body);
            }
        } else {
            if accepted {
                let before = state.records.len();
                split_records(content_type.as_deref(), &body, &mut state.records);
                state.accepted_records += (state.records.len() - before) as u64;
            }
            let headers = parts
                .headers
                .iter()
                .map(|(n, v)| {
                    (
                        n.as_str().to_string(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect();
            state.requests.push(Received {
                method: parts.method.to_string(),
                path: parts.uri.path().to_string(),
                query: parts.uri.query().map(str::to_string),
                status,
                idempotency_key: header("idempotency-key"),
                user_agent: header("user-agent"),
                content_type,
                content_encoding,
                headers,
                body: body.to_vec(),
                wire_len,
                decode_error,
                sha256,
                at,
            });
        }
    }
    ctx.shared.cond.notify_all();

    match (mode, status) {
        (Mode::Hang, _) => {
            let mut rx = ctx.mode.clone();
            let _ = rx.wait_for(|(g, _)| *g != generation).await;
            Err(Close("hung up"))
        }
        (Mode::CloseMidResponse, _) => {
            cut.store(true, Ordering::SeqCst);
            Ok(Response::new(Full::new(Bytes::from_static(
                b"this answer is cut short",
            ))))
        }
        (_, Some(status)) => {
            let mut resp = Response::new(Full::new(Bytes::from(text)));
            *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
            resp.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            if let Mode::RetryAfter { secs, .. } = mode {
                resp.headers_mut()
                    .insert(hyper::header::RETRY_AFTER, secs.into());
            }
            Ok(resp)
        }
        (_, None) => Err(Close("no answer")),
    }
}

/// Lower-case hex.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn default_text(status: u16) -> String {
    let reason = StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("status");
    format!("{status} {reason}: refused by the test receiver")
}

/// Undoes `Content-Encoding` (none, identity, gzip, x-gzip, zstd).
fn decode(encoding: Option<&str>, wire: Bytes) -> Result<Bytes, String> {
    let encoding = encoding.map(|e| e.trim().to_ascii_lowercase());
    match encoding.as_deref() {
        None | Some("") | Some("identity") => Ok(wire),
        Some("gzip") | Some("x-gzip") => {
            let mut out = Vec::with_capacity(wire.len() * 4);
            flate2::read::MultiGzDecoder::new(&wire[..])
                .read_to_end(&mut out)
                .map_err(|e| format!("gzip: {e}"))?;
            Ok(Bytes::from(out))
        }
        Some("zstd") => {
            let mut out = Vec::with_capacity(wire.len() * 4);
            let mut src: &[u8] = &wire;
            // One or more concatenated frames.
            while !src.is_empty() {
                let before = src.len();
                let mut dec = ruzstd::decoding::StreamingDecoder::new(&mut src)
                    .map_err(|e| format!("zstd: {e}"))?;
                dec.read_to_end(&mut out)
                    .map_err(|e| format!("zstd: {e}"))?;
                drop(dec);
                if src.len() == before {
                    return Err("zstd: no progress".into());
                }
            }
            Ok(Bytes::from(out))
        }
        Some(other) => Err(format!("unsupported content-encoding {other:?}")),
    }
}

fn is_json(content_type: Option<&str>) -> bool {
    content_type.is_some_and(|ct| {
        ct.split(';')
            .next()
            .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
    })
}

/// Appends the records of `body` to `out` (see [`Receiver::records`]).
fn split_records(content_type: Option<&str>, body: &[u8], out: &mut Vec<String>) {
    if is_json(content_type) {
        match serde_json::from_slice::<serde_json::Value>(body) {
            Ok(serde_json::Value::Array(items)) => out.extend(
                items
                    .iter()
                    .map(|v| serde_json::to_string(v).expect("a JSON value serializes")),
            ),
            Ok(v) => out.push(serde_json::to_string(&v).expect("a JSON value serializes")),
            Err(_) => out.push(String::from_utf8_lossy(body).into_owned()),
        }
        return;
    }
    let mut pieces: Vec<&[u8]> = body.split(|b| *b == b'\n').collect();
    if pieces.last().is_some_and(|p| p.is_empty()) {
        pieces.pop();
    }
    out.extend(
        pieces
            .into_iter()
            .map(|p| String::from_utf8_lossy(p).into_owned()),
    );
}

/// How many records `body` holds, without allocating per record.
fn count_records(content_type: Option<&str>, body: &[u8]) -> u64 {
    if is_json(content_type) {
        return count_json_elements(body);
    }
    let newlines = count_newlines(body);
    match body.last() {
        None => 0,
        Some(b'\n') => newlines,
        Some(_) => newlines + 1,
    }
}

/// Counts `\n` eight bytes at a time (SWAR), so even an unoptimized build keeps up.
fn count_newlines(body: &[u8]) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    let nl = ONES * u64::from(b'\n');
    let mut chunks = body.chunks_exact(8);
    let mut n = 0u64;
    for c in &mut chunks {
        let x = u64::from_ne_bytes(c.try_into().expect("8 bytes")) ^ nl;
        // A byte of `x` is zero exactly where the input had '\n'; set its high bit then (exact,
        // no false positives from borrows).
        let zero = !(((x & LOW7) + LOW7) | x | LOW7) & HIGH;
        n += u64::from(zero.count_ones());
    }
    n + chunks.remainder().iter().filter(|b| **b == b'\n').count() as u64
}

/// The number of elements of a top-level JSON array (1 for any other value, 1 for non-JSON).
fn count_json_elements(body: &[u8]) -> u64 {
    use serde::de::{Deserializer, IgnoredAny, SeqAccess, Visitor};

    struct Count;
    impl<'de> Visitor<'de> for Count {
        type Value = u64;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON array")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<u64, A::Error> {
            let mut n = 0;
            while seq.next_element::<IgnoredAny>()?.is_some() {
                n += 1;
            }
            Ok(n)
        }
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    de.deserialize_seq(Count).unwrap_or(1)
}

// ---------------------------------------------------------------------------------------------
// Cutting an answer short.

/// A connection's I/O that, once `cut` is set, lets only the first [`CUT_AFTER`] bytes of the next
/// write through, flushes them, and then fails every write (so hyper drops the connection).
struct CutIo<T> {
    inner: T,
    cut: Arc<AtomicBool>,
    state: CutState,
}

enum CutState {
    Normal,
    Writing { prefix: Vec<u8>, written: usize },
    Flushing,
    Dead,
}

impl<T> CutIo<T> {
    fn new(inner: T, cut: Arc<AtomicBool>) -> Self {
        CutIo {
            inner,
            cut,
            state: CutState::Normal,
        }
    }
}

fn cut_error() -> io::Error {
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

// ---------------------------------------------------------------------------------------------
// Certificates.

/// A throw-away PKI in a directory: a CA, a server certificate for `localhost` and `127.0.0.1`
/// and a client certificate both signed by it, and a second, unrelated CA with a client
/// certificate of its own. Every path is a PEM file; keys are PKCS#8.
pub struct TestPki {
    pub dir: PathBuf,
    /// `ca.pem`: the CA that signed the server and client certificates.
    pub ca: PathBuf,
    /// `server.pem` / `server.key`: for DNS `localhost` and IP `127.0.0.1`.
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    /// `client.pem` / `client.key`: a client certificate signed by the CA.
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// `other-ca.pem`: a CA that signed neither of the above.
    pub other_ca: PathBuf,
    /// `other-client.pem` / `other-client.key`: a client certificate signed by the other CA.
    pub other_client_cert: PathBuf,
    pub other_client_key: PathBuf,
    ca_der: CertificateDer<'static>,
    server_der: CertificateDer<'static>,
    server_key_der: Vec<u8>,
}

impl TestPki {
    /// Generates everything (ECDSA P-256, valid 1975-4096) and writes it into `dir`.
    pub fn generate(dir: &Path) -> TestPki {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
            KeyPair, KeyUsagePurpose,
        };

        fn ca(name: &str) -> (rcgen::Certificate, Issuer<'static, KeyPair>) {
            let mut params = CertificateParams::new(Vec::<String>::new()).expect("no names");
            params.distinguished_name = rcgen::DistinguishedName::new();
            params.distinguished_name.push(DnType::CommonName, name);
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.key_usages = vec![
                KeyUsagePurpose::KeyCertSign,
                KeyUsagePurpose::CrlSign,
                KeyUsagePurpose::DigitalSignature,
            ];
            let key = KeyPair::generate().expect("generate a CA key");
            let cert = params.self_signed(&key).expect("self-sign the CA");
            (cert, Issuer::new(params, key))
        }

        fn leaf(
            name: &str,
            sans: &[&str],
            purpose: ExtendedKeyUsagePurpose,
            issuer: &Issuer<'static, KeyPair>,
        ) -> (rcgen::Certificate, KeyPair) {
            let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
            let mut params = CertificateParams::new(sans).expect("valid names");
            params.distinguished_name = rcgen::DistinguishedName::new();
            params.distinguished_name.push(DnType::CommonName, name);
            params.use_authority_key_identifier_extension = true;
            params.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            params.extended_key_usages = vec![purpose];
            let key = KeyPair::generate().expect("generate a key");
            let cert = params.signed_by(&key, issuer).expect("sign a certificate");
            (cert, key)
        }

        let (ca_cert, ca_issuer) = ca("colibri test CA");
        let (other_cert, other_issuer) = ca("colibri unrelated test CA");
        let (server, server_key) = leaf(
            "localhost",
            &["localhost", "127.0.0.1"],
            ExtendedKeyUsagePurpose::ServerAuth,
            &ca_issuer,
        );
        let (client, client_key) = leaf(
            "colibri test client",
            &[],
            ExtendedKeyUsagePurpose::ClientAuth,
            &ca_issuer,
        );
        let (other_client, other_client_key) = leaf(
            "colibri unrelated test client",
            &[],
            ExtendedKeyUsagePurpose::ClientAuth,
            &other_issuer,
        );

        let write = |name: &str, pem: String| {
            let path = dir.join(name);
            std::fs::write(&path, pem).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
            path
        };
        TestPki {
            dir: dir.to_path_buf(),
            ca: write("ca.pem", ca_cert.pem()),
            server_cert: write("server.pem", server.pem()),
            server_key: write("server.key", server_key.serialize_pem()),
            client_cert: write("client.pem", client.pem()),
            client_key: write("client.key", client_key.serialize_pem()),
            other_ca: write("other-ca.pem", other_cert.pem()),
            other_client_cert: write("other-client.pem", other_client.pem()),
            other_client_key: write("other-client.key", other_client_key.serialize_pem()),
            ca_der: ca_cert.der().clone(),
            server_der: server.der().clone(),
            server_key_der: server_key.serialize_der(),
        }
    }

    /// The CA certificate (DER), e.g. for a test's own TLS client.
    pub fn ca_der(&self) -> CertificateDer<'static> {
        self.ca_der.clone()
    }

    fn server_config(&self, require_client_cert: bool) -> rustls::ServerConfig {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions");
        let builder = if require_client_cert {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(self.ca_der()).expect("the CA certificate parses");
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .expect("a client verifier");
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.server_key_der.clone()));
        builder
            .with_single_cert(vec![self.server_der.clone()], key)
            .expect("the server certificate and key match")
    }
}
