//! One request: routing, the checks in the order the contract gives them, the bounded body read,
//! the append, and the answer. Every refusal is a [`Reject`] with its status and a reason that is
//! both logged (with the stream and the peer, never the token or the body) and sent as
//! `{"error": "..."}`.
//!
//! Order: route (404, even while shutting down), then for a known path: shutting down (503),
//! method (405), token (401), stream (404), encoding and content type (415), length (411, 413),
//! room in `max_memory` for what the body can cost (503 after `wait`), a turn among
//! `max_requests`, the body within `read_timeout` (408), its records (400, 413), then the append:
//! 200 once durable; 429 when a stream's own bound is reached (after `wait` under
//! `block`, at once under `drop_newest`, whose refused records are counted as dropped, on every
//! retry too); 507 when the disk budget is; 413 for a record, or a batch, that the stream can never
//! hold (even empty); 503 when the store cannot commit (nothing acknowledged), and when the stop
//! begins while it waits for room.
//!
//! A refusal decided before the body is read still reads (and discards) a body of acceptable
//! length, within `read_timeout`, so the client sees the answer rather than a reset connection
//! and the connection can be reused.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use http_body_util::{BodyExt as _, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};

use super::body::{self, BadBody};
use super::{IngestConfig, Shared};
use crate::logging::summary;
use crate::store::{AppendError, RecordBuf, StoreError};

/// Bodies up to this size are decoded on the event loop; larger ones on the blocking pool.
const INLINE_MAX: usize = 64 << 10;

/// Repeated refusals of one status are summarised this often.
const REFUSALS_EVERY: Duration = Duration::from_secs(60);

/// Seconds in `Retry-After`.
const RETRY_FULL: u64 = 1;
const RETRY_DISK: u64 = 10;
const RETRY_STORE: u64 = 1;
const RETRY_STOPPING: u64 = 5;
const RETRY_MEMORY: u64 = 1;

pub type Answer = Response<Full<Bytes>>;

/// A refused request.
#[derive(Debug)]
pub struct Reject {
    pub status: StatusCode,
    pub reason: String,
    /// Extra fields of the JSON body (`line`, `index`).
    pub at: Option<(&'static str, u64)>,
    pub retry_after: Option<u64>,
    /// Close the connection after the answer (the body was not read, or the client is slow).
    pub close: bool,
    /// `Allow` of a 405.
    pub allow: &'static str,
    /// Back-pressure (a full stream, a stop) rather than a client or disk problem: logged at
    /// DEBUG, as it is expected under load.
    pub routine: bool,
}

impl Reject {
    fn new(status: StatusCode, reason: impl Into<String>) -> Self {
        Reject {
            status,
            reason: reason.into(),
            at: None,
            retry_after: None,
            close: false,
            allow: "POST",
            routine: false,
        }
    }

    fn routine(mut self) -> Self {
        self.routine = true;
        self
    }

    fn retry_after(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs);
        self
    }

    fn close(mut self) -> Self {
        self.close = true;
        self
    }

    fn answer(&self) -> Answer {
        let mut doc = serde_json::json!({ "error": self.reason });
        if let Some((k, v)) = self.at {
            doc[k] = v.into();
        }
        let mut resp = json(self.status, &doc);
        let h = resp.headers_mut();
        if let Some(secs) = self.retry_after {
            h.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        match self.status {
            StatusCode::METHOD_NOT_ALLOWED => {
                h.insert(header::ALLOW, HeaderValue::from_static(self.allow));
            }
            StatusCode::UNAUTHORIZED => {
                h.insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"colibri\""),
                );
            }
            _ => {}
        }
        if self.close {
            h.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        resp
    }
}

fn json(status: StatusCode, doc: &serde_json::Value) -> Answer {
    let mut resp = Response::new(Full::new(Bytes::from(doc.to_string())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

enum Route<'a> {
    Records(&'a str),
    Health,
    Unknown,
}

fn route(path: &str) -> Route<'_> {
    if path == "/v1/health" {
        return Route::Health;
    }
    match path
        .strip_prefix("/v1/streams/")
        .and_then(|rest| rest.strip_suffix("/records"))
    {
        Some(stream) if !stream.is_empty() && !stream.contains('/') => Route::Records(stream),
        _ => Route::Unknown,
    }
}

/// Answers one request; never fails (hyper closes the connection only on I/O errors).
pub(crate) async fn handle(req: Request<Incoming>, s: &Shared, peer: SocketAddr) -> Answer {
    let path = req.uri().path().to_string();
    let (stream, outcome) = match route(&path) {
        Route::Health => ("", health(&req, s)),
        Route::Records(stream) => (stream, records(req, stream, s).await),
        Route::Unknown => (
            "",
            Err(refuse_early(
                req,
                s,
                Reject::new(
                    StatusCode::NOT_FOUND,
                    format!(
                        "no such path {path:?}: records go to POST /v1/streams/{{stream}}/records"
                    ),
                ),
            )
            .await),
        ),
    };
    let answer = match outcome {
        Ok(answer) => answer,
        Err(rej) => {
            log_reject(&rej, stream, &path, peer);
            rej.answer()
        }
    };
    let known = if s.config.streams.contains_key(stream) {
        stream
    } else {
        ""
    };
    s.stats
        .answers
        .add((known.to_string(), answer.status().as_u16()));
    answer
}

/// Refusals of one status are logged in full the first time, then counted: one line per
/// [`REFUSALS_EVERY`] says how many more there were (a client retrying a bad request, or a scan
/// without the token, must not flood the log). Back-pressure stays at DEBUG, one line each.
fn log_reject(rej: &Reject, stream: &str, path: &str, peer: SocketAddr) {
    let status = rej.status.as_u16();
    if rej.routine {
        tracing::debug!(stream, status, reason = %rej.reason, %peer, path, "ingest request refused");
        return;
    }
    let first = summary::first(&format!("ingest {status}"), 1, REFUSALS_EVERY, || {
        move |n, _, window| {
            tracing::warn!(
                status,
                repeated = n,
                "ingest request refused: {n} more like it in the last {}s",
                summary::secs(window)
            )
        }
    });
    if first {
        tracing::warn!(stream, status, reason = %rej.reason, %peer, path, "ingest request refused");
    }
}

fn stopping() -> Reject {
    Reject::new(StatusCode::SERVICE_UNAVAILABLE, "colibri is shutting down")
        .retry_after(RETRY_STOPPING)
        .close()
        .routine()
}

fn no_memory(max_memory: u64) -> Reject {
    Reject::new(
        StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "the bodies of other requests hold the memory ingest may use (ingest.max_memory, {}): nothing was stored, send it again",
            crate::units::fmt_size(max_memory)
        ),
    )
    .retry_after(RETRY_MEMORY)
    .routine()
}

fn health(req: &Request<Incoming>, s: &Shared) -> Result<Answer, Reject> {
    if s.stopping.is_cancelled() {
        return Err(stopping());
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = Reject::new(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{} is not allowed here: use GET", req.method()),
        );
        r.allow = "GET, HEAD";
        r.close = true;
        return Err(r);
    }
    Ok(json(StatusCode::OK, &serde_json::json!({ "status": "ok" })))
}

fn header_str(headers: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    headers.get(name).map(|v| v.to_str().unwrap_or("\u{fffd}"))
}

/// `POST /v1/streams/{stream}/records`.
async fn records(req: Request<Incoming>, stream: &str, s: &Shared) -> Result<Answer, Reject> {
    if s.stopping.is_cancelled() {
        return Err(refuse_early(req, s, stopping()).await);
    }
    s.in_progress.fetch_add(1, Ordering::AcqRel);
    let _in_progress = InProgress(s);
    let (encoding, format) = match admit(&req, stream, s) {
        Ok(taken) => taken,
        Err(r) => return Err(refuse_early(req, s, r).await),
    };
    let length = body_length(req.headers(), &s.config)?;
    let _memory = match reserve(s, length, encoding).await {
        Ok(reserved) => reserved,
        Err(r) => return Err(refuse_early(req, s, r).await),
    };
    // A turn: bodies are read and held by at most max_requests requests at once. One still
    // waiting for its turn when the stop comes has not begun: it is refused, so the stop waits
    // for one round of requests at most.
    let _permit = tokio::select! {
        p = s.requests.acquire() => p.expect("never closed"),
        _ = s.stopping.cancelled() => return Err(stopping()),
    };
    let records = read_records(req.into_body(), length, encoding, format, &s.config).await?;
    let n = records.len() as u64;
    if n > 0 {
        s.store
            .append(stream, RecordBuf::from(records), None, Some(s.config.wait))
            .await
            .map_err(append_error)?;
    }
    Ok(json(StatusCode::OK, &serde_json::json!({ "accepted": n })))
}

/// The checks of the request line and headers, in the contract's order: method (405), token
/// (401), stream (404), encoding and content type (415). How the body is to be read.
fn admit(
    req: &Request<Incoming>,
    stream: &str,
    s: &Shared,
) -> Result<(body::ContentEncoding, body::Format), Reject> {
    let cfg = &s.config;
    if req.method() != Method::POST {
        return Err(Reject::new(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{} is not allowed here: use POST", req.method()),
        ));
    }
    if let Some(token) = &cfg.token {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .map(|v| v.as_bytes())
            .and_then(bearer);
        let reason = match given {
            None => Some("no bearer token: send Authorization: Bearer <token>"),
            Some(t) if !token.matches(t) => Some("wrong bearer token"),
            Some(_) => None,
        };
        if let Some(reason) = reason {
            return Err(Reject::new(StatusCode::UNAUTHORIZED, reason));
        }
    }
    let Some(&carries) = cfg.streams.get(stream) else {
        let names: Vec<&str> = cfg.streams.keys().map(String::as_str).collect();
        return Err(Reject::new(
            StatusCode::NOT_FOUND,
            format!("no stream {stream:?} (defined: {})", names.join(", ")),
        ));
    };
    let h = req.headers();
    let encoding = body::encoding_of(header_str(h, header::CONTENT_ENCODING));
    // The body must be what the stream's sink sends; a line without a timestamp gets this one.
    let format = body::format_of(
        header_str(h, header::CONTENT_TYPE),
        carries,
        crate::clock::unix_ns(),
    );
    match (encoding, format) {
        (Ok(e), Ok(f)) => Ok((e, f)),
        (Err(why), _) | (_, Err(why)) => Err(Reject::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, why)),
    }
}

/// The body's length: declared (411) and within max_body (413). Either refusal closes the
/// connection: the body is not read.
fn body_length(h: &HeaderMap, cfg: &IngestConfig) -> Result<u64, Reject> {
    let length = match content_length(h) {
        Ok(n) => n,
        Err(why) => return Err(Reject::new(StatusCode::LENGTH_REQUIRED, why).close()),
    };
    if length > cfg.max_body {
        let r = Reject::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "a body of {length} bytes is over max_body ({} bytes): send smaller batches",
                cfg.max_body
            ),
        );
        return Err(r.close());
    }
    Ok(length)
}

/// Room in the memory budget for what this body can cost, before any of it is read: all the
/// bodies in progress together stay within max_memory. No room within `wait`: 503.
async fn reserve(
    s: &Shared,
    length: u64,
    encoding: body::ContentEncoding,
) -> Result<Reserved<'_>, Reject> {
    let cfg = &s.config;
    let cost = super::body_cost(
        length,
        encoding == body::ContentEncoding::Gzip,
        cfg.max_body,
    )
    .min(cfg.max_memory);
    let cost = u32::try_from(cost).expect("max_memory is at most 192MiB");
    tokio::select! {
        p = tokio::time::timeout(cfg.wait, s.memory.acquire_many(cost)) => match p {
            Ok(p) => Ok(Reserved {
                _permit: p.expect("never closed"),
                large: u64::from(cost) > super::TRIM_ABOVE,
            }),
            Err(_) => Err(no_memory(cfg.max_memory)),
        },
        _ = s.stopping.cancelled() => Err(stopping()),
    }
}

/// The body within `read_timeout` (408), then its records (400, 413): decoded on the event loop
/// when small and not compressed, else on the blocking pool.
async fn read_records(
    body: Incoming,
    length: u64,
    encoding: body::ContentEncoding,
    format: body::Format,
    cfg: &IngestConfig,
) -> Result<Vec<Vec<u8>>, Reject> {
    let wire = read_body(body, length, cfg.read_timeout).await?;
    let max_body = cfg.max_body;
    let parsed = if wire.len() <= INLINE_MAX && encoding == body::ContentEncoding::Identity {
        body::records(wire, format, encoding, max_body)
    } else {
        tokio::task::spawn_blocking(move || body::records(wire, format, encoding, max_body))
            .await
            .map_err(|e| {
                Reject::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("the body could not be decoded: {e}"),
                )
                .retry_after(RETRY_STORE)
            })?
    };
    parsed.map_err(|bad| match bad {
        BadBody::TooLarge(why) => Reject::new(StatusCode::PAYLOAD_TOO_LARGE, why),
        BadBody::Invalid {
            message,
            line,
            index,
        } => {
            let mut r = Reject::new(StatusCode::BAD_REQUEST, message);
            r.at = line.map(|l| ("line", l)).or(index.map(|i| ("index", i)));
            r
        }
    })
}

/// A request's share of `max_memory`, held until it is answered. Declared before the body and
/// its records, it is dropped after them: a large one then gives the freed memory back to the
/// system, whatever the answer.
struct Reserved<'a> {
    _permit: tokio::sync::SemaphorePermit<'a>,
    large: bool,
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        if self.large {
            super::give_back_memory();
        }
    }
}

/// Counts a records request until it is answered (the stop waits for these).
struct InProgress<'a>(&'a Shared);

impl Drop for InProgress<'_> {
    fn drop(&mut self) {
        if self.0.in_progress.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.answered.notify_one();
        }
    }
}

/// The token of `Authorization: Bearer <token>` (scheme case-insensitive).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"bearer") || rest.first() != Some(&b' ') {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// The declared length; chunked bodies are refused (411) so a body's size is known before it is
/// read.
fn content_length(h: &HeaderMap) -> Result<u64, String> {
    if h.contains_key(header::TRANSFER_ENCODING) {
        return Err("chunked bodies are not accepted: send Content-Length".into());
    }
    let Some(v) = h.get(header::CONTENT_LENGTH) else {
        return Err("no Content-Length: send the body's length".into());
    };
    // hyper has already refused a malformed or repeated Content-Length.
    v.to_str()
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .ok_or_else(|| "Content-Length is not a number".into())
}

/// Reads the whole body (exactly `length` bytes, hyper enforces it) within `limit`.
async fn read_body(mut body: Incoming, length: u64, limit: Duration) -> Result<Vec<u8>, Reject> {
    let mut wire = Vec::with_capacity(length as usize);
    let read = async {
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| {
                Reject::new(
                    StatusCode::BAD_REQUEST,
                    format!("the body could not be read: {e}"),
                )
                .close()
            })?;
            if let Ok(data) = frame.into_data() {
                wire.extend_from_slice(&data);
            }
        }
        Ok(())
    };
    match tokio::time::timeout(limit, read).await {
        Ok(Ok(())) => Ok(wire),
        Ok(Err(r)) => Err(r),
        Err(_) => Err(Reject::new(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the body did not arrive within read_timeout ({} ms)",
                limit.as_millis()
            ),
        )
        .close()),
    }
}

/// Reads and discards the body of a request refused before its body was needed, when it is of an
/// acceptable length, so the client reads the answer instead of a reset; otherwise the connection
/// closes after the answer.
async fn refuse_early(req: Request<Incoming>, s: &Shared, rej: Reject) -> Reject {
    let h = req.headers();
    let continue_expected = h
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    if continue_expected {
        // The client waits for "100 Continue" before sending its body: it will not send it.
        return rej.close();
    }
    let length = if h.contains_key(header::TRANSFER_ENCODING) {
        return rej.close();
    } else if !h.contains_key(header::CONTENT_LENGTH) {
        0 // neither header: no body
    } else {
        match content_length(h) {
            Ok(n) if n <= s.config.max_body => n,
            _ => return rej.close(),
        }
    };
    if length == 0 {
        return rej;
    }
    let mut body = req.into_body();
    let drain = async {
        while let Some(frame) = body.frame().await {
            if frame.is_err() {
                return false;
            }
        }
        true
    };
    match tokio::time::timeout(s.config.read_timeout, drain).await {
        Ok(true) => rej,
        _ => rej.close(),
    }
}

fn append_error(e: AppendError) -> Reject {
    match e {
        AppendError::Full { stream, reason } if reason.is_disk() => Reject::new(
            StatusCode::INSUFFICIENT_STORAGE,
            format!("stream {stream:?} cannot take records: {reason}; nothing was stored"),
        )
        .retry_after(RETRY_DISK),
        AppendError::Full { stream, reason } => Reject::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!("stream {stream:?} is full ({reason}); nothing was stored"),
        )
        .retry_after(RETRY_FULL)
        .routine(),
        AppendError::Refused {
            stream,
            reason,
            records,
        } => {
            let status = if reason.is_disk() {
                StatusCode::INSUFFICIENT_STORAGE
            } else {
                StatusCode::TOO_MANY_REQUESTS
            };
            let retry = if reason.is_disk() { RETRY_DISK } else { RETRY_FULL };
            let mut r = Reject::new(
                status,
                format!(
                    "stream {stream:?} is full ({reason}): the {records} records were dropped (when_full: drop_newest)"
                ),
            )
            .retry_after(retry);
            r.routine = !reason.is_disk();
            r
        }
        AppendError::TooLarge { why, .. } => Reject::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("{why}; nothing was stored"),
        ),
        // The stop began while the append waited for room.
        AppendError::Stopping => stopping(),
        AppendError::Store(StoreError::UnknownStream(stream)) => {
            Reject::new(StatusCode::NOT_FOUND, format!("no stream {stream:?}"))
        }
        // The disk is full (ENOSPC): the same answer as an exhausted budget, since what the
        // producer must do is the same (send again later); nothing was acknowledged.
        AppendError::Store(e @ StoreError::NoSpace(_)) => Reject::new(
            StatusCode::INSUFFICIENT_STORAGE,
            format!("{e}: send the records again later"),
        )
        .retry_after(RETRY_DISK),
        AppendError::Store(e) => Reject::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the store could not take the records ({e}); they may or may not have been stored: send them again"),
        )
        .retry_after(RETRY_STORE),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert!(matches!(
            route("/v1/streams/logs/records"),
            Route::Records("logs")
        ));
        assert!(matches!(route("/v1/health"), Route::Health));
        for p in [
            "/",
            "/v1/streams//records",
            "/v1/streams/a/b/records",
            "/v1/streams/logs",
            "/v1/streams/logs/records/",
            "/v2/streams/logs/records",
        ] {
            assert!(matches!(route(p), Route::Unknown), "{p}");
        }
    }

    #[test]
    fn bearer_tokens() {
        assert_eq!(bearer(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"bearer  abc "), Some(&b"abc"[..]));
        assert_eq!(bearer(b"Bearer"), None);
        assert_eq!(bearer(b"Bearer "), None);
        assert_eq!(bearer(b"Basic abc"), None);
        assert_eq!(bearer(b"Bearerabc"), None);
    }
}
