//! The receiver's server: its thread, the accept loop over plain TCP or TLS, one request at a time
//! by the current mode, and the body handling (decoding, splitting into records, counting).

use std::io::{self, Read};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use super::*;

pub(super) enum Ctl {
    SetMode(Mode, std::sync::mpsc::SyncSender<Result<(), String>>),
    Shutdown,
}

/// The per-connection context.
#[derive(Clone)]
pub(super) struct Ctx {
    shared: Arc<Shared>,
    /// (generation, mode): the generation grows with every `set_mode`.
    mode: watch::Receiver<(u64, Mode)>,
}

pub(super) fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

/// The port held, bound but not listening, while the receiver refuses: connections are refused
/// (RST) as with nothing there, and the kernel cannot give the port to another socket meanwhile (a
/// colibri admin endpoint on port 0 once took it, and its sink posted to itself).
fn hold(addr: SocketAddr) -> io::Result<TcpSocket> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    Ok(socket)
}

pub(super) async fn rebind(addr: SocketAddr) -> Result<TcpListener, String> {
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

pub(super) async fn accept(listener: &Option<TcpListener>) -> io::Result<TcpStream> {
    match listener {
        Some(l) => l.accept().await.map(|(s, _)| s),
        None => std::future::pending().await,
    }
}

pub(super) async fn supervise(
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
    let mut held: Option<TcpSocket> = None;
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
                        if listener.take().is_some() {
                            held = hold(addr).ok();
                        }
                        conns.abort_all();
                        while conns.join_next().await.is_some() {}
                        Ok(())
                    } else if listener.is_none() {
                        match held.take().map(|h| h.listen(1024)) {
                            Some(Ok(l)) => {
                                listener = Some(l);
                                Ok(())
                            }
                            _ => rebind(addr).await.map(|l| listener = Some(l)),
                        }
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

pub(super) async fn serve(stream: TcpStream, tls: Option<TlsAcceptor>, ctx: Ctx) {
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

pub(super) async fn serve_http<T>(io: CutIo<T>, cut: Arc<AtomicBool>, ctx: Ctx)
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
pub(super) struct Close(&'static str);

impl std::fmt::Display for Close {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for Close {}

#[allow(
    clippy::too_many_lines,
    reason = "the test receiver's one request handler, every mode side by side; `allow`: the benches include this file too"
)]
pub(super) async fn handle(
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

pub(super) fn default_text(status: u16) -> String {
    let reason = StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("status");
    format!("{status} {reason}: refused by the test receiver")
}

/// Undoes `Content-Encoding` (none, identity, gzip, x-gzip, zstd).
pub(super) fn decode(encoding: Option<&str>, wire: Bytes) -> Result<Bytes, String> {
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

pub(super) fn is_json(content_type: Option<&str>) -> bool {
    content_type.is_some_and(|ct| {
        ct.split(';')
            .next()
            .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
    })
}

/// Appends the records of `body` to `out` (see [`Receiver::records`]).
pub(super) fn split_records(content_type: Option<&str>, body: &[u8], out: &mut Vec<String>) {
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
pub(super) fn count_records(content_type: Option<&str>, body: &[u8]) -> u64 {
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
pub(super) fn count_newlines(body: &[u8]) -> u64 {
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
pub(super) fn count_json_elements(body: &[u8]) -> u64 {
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
