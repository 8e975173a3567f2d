//! The HTTP sink: one request per job (or per part of a job split after a 413), over a reused
//! connection pool with rustls (ring provider, no OpenSSL, so the binary stays static). It builds the
//! body in the configured encoding and compression, sends it with an `Idempotency-Key` and a
//! `User-Agent`, and classifies the outcome: no response at all is a transport failure (the link's
//! business, no attempt spent), 408/429/5xx may pass (an attempt, `Retry-After` honoured), 413 asks
//! for a split, any other 4xx never passes. It does not retry, pause or touch the store: the delivery
//! worker does that with the classification. Its file shape is [`config`]'s. Built from the
//! compiled config by `sink::Sink::new`.
//!
//! The folder is the HTTP transport's: [`remote_write`] (`type: prometheus_remote_write`) is this
//! sink with a protobuf body, so it lives here rather than importing a peer.

use std::io::Write as _;
use std::time::Duration;

use reqwest::header::{
    CONTENT_DISPOSITION, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, HeaderValue, RETRY_AFTER,
};
use reqwest::{Client, Method, Url};

use crate::net::client::{self, BadHeader, chain, shown_url};
use crate::net::tls_client::TlsConfig;
use crate::record::RecordFormat;
use crate::setting::SettingError;
use crate::sink::SinkConfig;
use crate::sink::deliver::{Batch, Deliver, DeliveryError, Payload, Probe, REPLAYED};
use crate::sink::kind::{KindConfig, Settings};
use crate::store::FileJob;

pub use config::HttpSinkSpec as Spec;

mod config;
#[cfg(feature = "remote-write")]
pub mod remote_write;

/// How much of a refusal's body goes into the dead-letter reason and the log.
const BODY_PREFIX: usize = 256;
/// Bodies at least this large are compressed off the event loop.
const COMPRESS_INLINE_MAX: usize = 64 << 10;
/// The slowest upload rate a file is allowed before its request counts as stalled: the sink's
/// `timeout` covers the answer, and a file's body gets this much more time (a 50 MB scan on a
/// 64 KiB/s uplink takes 13 minutes and must not be cut at the 10 s default).
const MIN_UPLOAD_RATE: u64 = 64 << 10;

/// The compiled `type: http` settings.
#[derive(Clone, PartialEq, Eq)]
pub struct HttpConfig {
    pub url: Url,
    pub method: HttpMethod,
    pub encoding: Encoding,
    /// For `influx_line`: the records' timestamp unit, already in `url` as `precision=`.
    pub precision: Option<crate::scrape::lineproto::Precision>,
    pub compression: Compression,
    /// Extra request headers. Values may hold credentials: never logged, redacted in `Debug`.
    pub headers: Vec<(String, String)>,
    pub tls: TlsConfig,
}

impl std::fmt::Debug for HttpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let headers: Vec<_> = self
            .headers
            .iter()
            .map(|(k, _)| (k, "<redacted>"))
            .collect();
        f.debug_struct("HttpConfig")
            .field("url", &self.url.as_str())
            .field("method", &self.method)
            .field("encoding", &self.encoding)
            .field("precision", &self.precision)
            .field("compression", &self.compression)
            .field("headers", &headers)
            .field("tls", &self.tls)
            .finish()
    }
}

impl Settings for HttpConfig {
    /// What the records of a stream delivered here must be.
    fn record_format(&self) -> RecordFormat {
        match self.encoding {
            Encoding::Ndjson | Encoding::JsonArray => RecordFormat::Json,
            Encoding::InfluxLine => RecordFormat::LineProtocol(
                self.precision
                    .unwrap_or(crate::scrape::lineproto::Precision::Ns),
            ),
        }
    }

    /// Whether a job stored as a zstd frame of lines is this sink's body as it is: NDJSON and
    /// line protocol are the stored lines, and the frame is a `Content-Encoding: zstd` body.
    fn sends_zstd_lines(&self) -> bool {
        zstd_lines(self.compression, self.encoding)
    }

    /// The key is a header: a request may carry several jobs.
    fn sends_groups(&self) -> bool {
        true
    }

    /// For logs: the sink's type, name and URL (never header values, no credentials).
    fn describe(&self, name: &str) -> String {
        format!("http sink {name} ({})", shown_url(&self.url))
    }
}

impl KindConfig for HttpConfig {
    type Built = HttpSink;

    fn build(&self, sink: &SinkConfig) -> Result<HttpSink, SettingError> {
        HttpSink::new(self, &sink.link.probe, sink.timeout, sink.concurrency)
    }
}

// The runtime types below are their own file shape (`method`, `encoding`, `compression`): the
// schema keeps the names they had as separate file types.

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "HttpMethodSpec"))]
#[serde(rename_all = "snake_case")]
pub enum HttpMethod {
    Post,
    Put,
}

// How records become a request body. Records are passed through as they were stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "EncodingSpec"))]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    /// A record per line, `application/x-ndjson`: the stream's records are JSON values.
    Ndjson,
    /// One JSON array of the records, `application/json`: the stream's records are JSON values.
    JsonArray,
    /// A record per line, `text/plain` (InfluxDB / VictoriaMetrics `/write`): the stream's records
    /// are line-protocol points (ingest takes `text/plain` for it, `queue push` checks each line;
    /// tail sources and `format: raw` scrapes cannot feed it).
    InfluxLine,
}

impl Encoding {
    pub fn content_type(self) -> &'static str {
        match self {
            Encoding::Ndjson => "application/x-ndjson",
            Encoding::JsonArray => "application/json",
            Encoding::InfluxLine => "text/plain; charset=utf-8",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "CompressionSpec"))]
#[serde(rename_all = "snake_case")]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

/// A ready-to-use HTTP sink: the client (connection pool, TLS, configured headers) and the request
/// template.
pub struct HttpSink {
    client: Client,
    url: Url,
    /// The URL as logs and dead-letter reasons show it: no password, no secret query values.
    shown: String,
    method: Method,
    content_type: HeaderValue,
    content_encoding: Option<HeaderValue>,
    encoding: Encoding,
    compression: Compression,
    /// Where a TCP probe connects: the URL's host and port (resolved at each probe).
    probe_addr: (String, u16),
    /// With `tls.server_name`: (the URL's original host, the name it is reached by).
    renamed: Option<(String, String)>,
    /// The longest wait for a request's answer (the sink's `timeout`).
    timeout: Duration,
}

impl HttpSink {
    /// Builds the client: reads the CA and client certificate files, checks the headers. Errors name
    /// the setting at fault. `probe` is the sink's link probe: with the URL, it says whether the
    /// client ever makes a TLS connection; `timeout` bounds a request, `concurrency` (requests in
    /// flight at once) sizes the connection pool.
    pub fn new(
        spec: &HttpConfig,
        probe: &Probe,
        timeout: Duration,
        concurrency: usize,
    ) -> Result<HttpSink, SettingError> {
        let mut url = spec.url.clone();
        let host = url
            .host_str()
            .ok_or_else(|| SettingError::new("url", format!("{} has no host", spec.url)))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let port = url
            .port_or_known_default()
            .ok_or_else(|| SettingError::new("url", format!("{} has no port", spec.url)))?;
        let mut b = client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(10)))
            // A redirect would re-send the body somewhere nobody configured: treated as a failure.
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(concurrency)
            .pool_idle_timeout(Duration::from_secs(60))
            .tcp_nodelay(true);
        b = with_tls(b, spec, probe)?;
        let tls = &spec.tls;
        let renamed = tls.server_name.clone().map(|n| (host.clone(), n));
        if let Some(name) = &tls.server_name {
            // Connect to the URL's host but verify (and send SNI for) `name`: the URL is rewritten
            // to the name, and the name resolved to the original host when a connection is made
            // (not now: DNS may well be down while colibri starts).
            url.set_host(Some(name))
                .map_err(|e| SettingError::new("tls.server_name", format!("{name:?}: {e}")))?;
            b = b.dns_resolver(ServerName {
                name: name.clone(),
                host: host.clone(),
            });
        }
        let headers = client::sensitive_headers(&spec.headers).map_err(|bad| match bad {
            BadHeader::Name(k) => {
                SettingError::new(format!("headers.{k}"), "not a valid header name".into())
            }
            BadHeader::Value(k) => SettingError::new(
                format!("headers.{k}"),
                "the value has characters a header cannot carry".into(),
            ),
        })?;
        // Sent with every request (probes too: a probe through an authenticating proxy or
        // gateway needs them), without a copy per request.
        b = b.default_headers(headers);
        let client = b.build().map_err(|e| {
            SettingError::new("", format!("cannot build the HTTP client: {}", chain(&e)))
        })?;
        Ok(HttpSink {
            client,
            shown: shown_url(&url),
            url,
            method: match spec.method {
                HttpMethod::Post => Method::POST,
                HttpMethod::Put => Method::PUT,
            },
            content_type: HeaderValue::from_static(spec.encoding.content_type()),
            content_encoding: match spec.compression {
                Compression::None => None,
                Compression::Gzip => Some(HeaderValue::from_static("gzip")),
                Compression::Zstd => Some(HeaderValue::from_static("zstd")),
            },
            encoding: spec.encoding,
            compression: spec.compression,
            probe_addr: (host, port),
            renamed,
            timeout,
        })
    }

    /// Sends `body` for `batch` with these content headers and `extra` ones (a sink built on this
    /// one, with a body of its own: `prometheus_remote_write`), and classifies the outcome.
    pub(super) async fn send_as(
        &self,
        batch: &Batch<'_>,
        body: Vec<u8>,
        content_type: HeaderValue,
        content_encoding: Option<HeaderValue>,
        extra: &[(&'static str, HeaderValue)],
    ) -> Result<(), DeliveryError> {
        let mut req = self
            .client
            .request(self.method.clone(), self.url.clone())
            .header(CONTENT_TYPE, content_type)
            .header("idempotency-key", batch.idempotency_key());
        if batch.replayed {
            req = req.header(REPLAYED, "true");
        }
        if let Some(enc) = content_encoding {
            req = req.header(CONTENT_ENCODING, enc);
        }
        for (name, value) in extra {
            req = req.header(*name, value.clone());
        }
        self.exchange(req.body(body)).await
    }

    /// Sends a request and classifies the outcome.
    async fn exchange(&self, req: reqwest::RequestBuilder) -> Result<(), DeliveryError> {
        let resp = match req.send().await {
            Ok(r) => r,
            // No response at all: refused, reset, DNS, TLS handshake, timeout, closed mid-response.
            Err(e) => {
                return Err(DeliveryError::Unavailable(format!(
                    "{} {}: {}",
                    self.method,
                    self.shown,
                    chain(&e.without_url())
                )));
            }
        };
        let status = resp.status();
        if status.is_success() {
            // Read the (normally empty) answer so the connection goes back to the pool.
            let _ = drain(resp, 64 << 10).await;
            return Ok(());
        }
        let retry_after = resp.headers().get(RETRY_AFTER).and_then(parse_retry_after);
        let prefix = drain(resp, BODY_PREFIX).await;
        let text = String::from_utf8_lossy(&prefix);
        let text = text.trim();
        let reason = if text.is_empty() {
            format!("{} {} answered {status}", self.method, self.shown)
        } else {
            format!("{} {} answered {status}: {text}", self.method, self.shown)
        };
        Err(match status.as_u16() {
            413 => DeliveryError::TooLarge(reason),
            // Refused credentials are the sink's problem, not the job's: an expired token must not
            // send the whole backlog to the dead letters. Treated like an outage (no attempt
            // spent, the link goes down and waits) until the credentials are accepted.
            401 | 403 => DeliveryError::Unavailable(format!(
                "{reason} (credentials refused; deliveries wait until they are accepted)"
            )),
            408 | 429 | 500..=599 => DeliveryError::Transient {
                reason,
                retry_after,
            },
            400..=499 => DeliveryError::Permanent(reason),
            // 1xx/3xx: nothing this sink can act on; may pass after someone fixes the far end.
            _ => DeliveryError::Transient {
                reason,
                retry_after: None,
            },
        })
    }
}

/// `b` with the TLS of `spec`: its CA bundle (or none at all when no TLS connection is ever made)
/// and its client certificate. Reads the files; errors name the setting.
fn with_tls(
    mut b: reqwest::ClientBuilder,
    spec: &HttpConfig,
    probe: &Probe,
) -> Result<reqwest::ClientBuilder, SettingError> {
    let tls = &spec.tls;
    if let Some(ca) = &tls.ca_file {
        let bad = |m: String| SettingError::new("tls.ca_file", format!("{}: {m}", ca.display()));
        let pem = std::fs::read(ca).map_err(|e| bad(format!("cannot read: {e}")))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| bad(format!("not a PEM certificate bundle: {}", chain(&e))))?;
        if certs.is_empty() {
            return Err(bad("holds no PEM certificate".into()));
        }
        b = b.tls_certs_only(certs);
    } else if !uses_tls(&spec.url, probe) {
        // Requests and probes go to `http://` URLs and redirects are refused: no TLS
        // connection is ever made, so the system's roots (reading /etc/ssl/certs and parsing
        // ~150 certificates at each start, ~100 KB kept by the client) are not loaded.
        b = b.tls_certs_only([]);
    }
    match (&tls.client_cert, &tls.client_key) {
        (Some(cert), Some(key)) => {
            let mut pem = std::fs::read(cert).map_err(|e| {
                SettingError::new(
                    "tls.client_cert",
                    format!("{}: cannot read: {e}", cert.display()),
                )
            })?;
            pem.push(b'\n');
            pem.extend(std::fs::read(key).map_err(|e| {
                SettingError::new(
                    "tls.client_key",
                    format!("{}: cannot read: {e}", key.display()),
                )
            })?);
            let id = reqwest::Identity::from_pem(&pem).map_err(|e| {
                SettingError::new(
                    "tls.client_cert",
                    format!(
                        "{} with tls.client_key {}: not a usable PEM certificate and key: {}",
                        cert.display(),
                        key.display(),
                        chain(&e)
                    ),
                )
            })?;
            b = b.identity(id);
        }
        (None, None) => {}
        (Some(_), None) => {
            return Err(SettingError::new(
                "tls.client_key",
                "missing: tls.client_cert needs it".into(),
            ));
        }
        (None, Some(_)) => {
            return Err(SettingError::new(
                "tls.client_cert",
                "missing: tls.client_key needs it".into(),
            ));
        }
    }
    Ok(b)
}

impl Deliver for HttpSink {
    /// The request body for the batch's records, encoded and compressed (a stored zstd frame of
    /// lines goes as it is).
    async fn body(&self, batch: &Batch<'_>) -> Result<Vec<u8>, DeliveryError> {
        if let Payload::ZstdLines(frame) = batch.payload
            && zstd_lines(self.compression, self.encoding)
        {
            return Ok(frame.to_vec());
        }
        let body = encode(self.encoding, &batch.payload)?;
        let compression = self.compression;
        if compression == Compression::None {
            return Ok(body);
        }
        let compressed = if body.len() < COMPRESS_INLINE_MAX {
            compress(compression, &body)
        } else {
            tokio::task::spawn_blocking(move || compress(compression, &body))
                .await
                .map_err(|e| DeliveryError::Transient {
                    reason: format!("compression stopped: {e}"),
                    retry_after: None,
                })?
        };
        compressed.map_err(|e| DeliveryError::Transient {
            reason: format!("cannot compress the body: {e}"),
            retry_after: None,
        })
    }

    /// Sends one body and classifies the outcome.
    async fn send(&self, batch: &Batch<'_>, body: Vec<u8>) -> Result<(), DeliveryError> {
        let (content_type, encoding) = (self.content_type.clone(), self.content_encoding.clone());
        self.send_as(batch, body, content_type, encoding, &[]).await
    }

    /// Uploads a spooled file as the request body, streamed from disk, with its length and its
    /// name (`Content-Disposition`); never compressed. A file that is gone from the spool can never
    /// be delivered: permanent.
    async fn send_file(&self, batch: &Batch<'_>, file: &FileJob) -> Result<(), DeliveryError> {
        let (key, path, len) = (batch.idempotency_key(), file.path.as_path(), file.len);
        let body = match crate::sink::file_body::FileBody::open(path, len) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(DeliveryError::Permanent(format!(
                    "the spooled file {} is missing",
                    path.display()
                )));
            }
            Err(e) => {
                return Err(DeliveryError::Transient {
                    reason: format!("cannot read the spooled file {}: {e}", path.display()),
                    retry_after: None,
                });
            }
        };
        let mut req = self
            .client
            .request(self.method.clone(), self.url.clone())
            .timeout(self.timeout + Duration::from_secs(len / MIN_UPLOAD_RATE))
            .header(CONTENT_TYPE, "application/octet-stream")
            .header(CONTENT_LENGTH, len)
            .header(CONTENT_DISPOSITION, content_disposition(&file.name))
            .header("idempotency-key", key);
        if batch.replayed {
            req = req.header(REPLAYED, "true");
        }
        let req = req.body(reqwest::Body::wrap(body));
        match self.exchange(req).await {
            // A failure that came from reading the file, not from the peer, is not an outage: a
            // spooled file that shrank or vanished can never be sent whole.
            Err(DeliveryError::Unavailable(reason))
                if std::fs::metadata(path).map_or(true, |m| m.len() < len) =>
            {
                Err(DeliveryError::Permanent(format!(
                    "the spooled file {} no longer holds its {len} bytes ({reason})",
                    path.display()
                )))
            }
            other => other,
        }
    }

    /// A TCP connect to the URL's host and port; or, given a probe URL, a GET that gets any
    /// answer at all (a 404 still proves the link works).
    async fn probe(&self, how: &Probe) -> Result<(), String> {
        let url = match how {
            Probe::Tcp => None,
            Probe::Http(u) => Some(u),
        };
        match url {
            None => {
                let (host, port) = (&self.probe_addr.0, self.probe_addr.1);
                let connect = tokio::net::TcpStream::connect((host.as_str(), port));
                match tokio::time::timeout(self.timeout, connect).await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(e)) => Err(format!("tcp connect to {host}:{port}: {e}")),
                    Err(_) => Err(format!("tcp connect to {host}:{port}: timed out")),
                }
            }
            Some(url) => {
                let mut url = url.clone();
                // The sink's own host is reached by its `tls.server_name`, like its requests.
                if let Some((host, name)) = &self.renamed
                    && url.host_str() == Some(host.as_str())
                {
                    let _ = url.set_host(Some(name));
                }
                match self.client.get(url.clone()).send().await {
                    Ok(resp) => {
                        let _ = drain(resp, 64 << 10).await;
                        Ok(())
                    }
                    Err(e) => Err(format!(
                        "GET {}: {}",
                        shown_url(&url),
                        chain(&e.without_url())
                    )),
                }
            }
        }
    }
}

/// Whether a sink with this URL and probe makes TLS connections: its requests (redirects are
/// refused, so they stay on the URL's scheme) and an HTTP probe's.
fn uses_tls(url: &Url, probe: &Probe) -> bool {
    let https = |u: &Url| u.scheme() != "http";
    https(url) || matches!(probe, Probe::Http(p) if https(p))
}

/// Resolves the configured `tls.server_name` to the URL's original host; other names as usual.
struct ServerName {
    name: String,
    host: String,
}

impl reqwest::dns::Resolve for ServerName {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let target = if name.as_str().eq_ignore_ascii_case(&self.name) {
            self.host.clone()
        } else {
            name.as_str().to_string()
        };
        Box::pin(async move {
            // The port is the URL's; the connector sets it on every address.
            let addrs = tokio::net::lookup_host((target.as_str(), 0)).await?;
            Ok(Box::new(addrs.collect::<Vec<_>>().into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// `attachment; filename="<ASCII>"; filename*=UTF-8''<percent-encoded>` (RFC 6266): the plain
/// form for simple receivers (other bytes become `_`), the encoded one exact for any name.
pub fn content_disposition(name: &std::ffi::OsStr) -> String {
    use std::os::unix::ffi::OsStrExt;
    let b = name.as_bytes();
    let plain: String = b
        .iter()
        .map(|&c| match c {
            b' '..=b'~' if c != b'"' && c != b'\\' => c as char,
            _ => '_',
        })
        .collect();
    let mut encoded = String::with_capacity(b.len() * 3);
    for &c in b {
        if c.is_ascii_alphanumeric() || b"-._~".contains(&c) {
            encoded.push(c as char);
        } else {
            encoded.push_str(&format!("%{c:02X}"));
        }
    }
    format!("attachment; filename=\"{plain}\"; filename*=UTF-8''{encoded}")
}

/// See [`HttpConfig::sends_zstd_lines`].
fn zstd_lines(compression: Compression, encoding: Encoding) -> bool {
    compression == Compression::Zstd && encoding != Encoding::JsonArray
}

/// Encodes records as one body.
pub fn encode(encoding: Encoding, payload: &Payload<'_>) -> Result<Vec<u8>, DeliveryError> {
    match (encoding, payload) {
        (Encoding::Ndjson | Encoding::InfluxLine, p) => p.lines(),
        (Encoding::JsonArray, Payload::Lines(lines)) => {
            // The lines with each separator but the last turned into a comma: no record holds a
            // `\n`, so every one of them is a separator.
            let mut body = Vec::with_capacity(lines.len() + 2);
            body.push(b'[');
            body.extend_from_slice(lines.strip_suffix(b"\n").unwrap_or(lines));
            for b in &mut body[1..] {
                if *b == b'\n' {
                    *b = b',';
                }
            }
            body.push(b']');
            Ok(body)
        }
        (Encoding::JsonArray, Payload::Records(records)) => {
            let len: usize = records.iter().map(|r| r.len() + 1).sum::<usize>() + 2;
            let mut body = Vec::with_capacity(len);
            body.push(b'[');
            for (i, r) in records.iter().enumerate() {
                if i > 0 {
                    body.push(b',');
                }
                body.extend_from_slice(r);
            }
            body.push(b']');
            Ok(body)
        }
        (Encoding::JsonArray, p @ Payload::ZstdLines(_)) => p.lines(),
    }
}

fn compress(c: Compression, body: &[u8]) -> std::io::Result<Vec<u8>> {
    match c {
        Compression::None => Ok(body.to_vec()),
        Compression::Gzip => {
            // Level 3: most of the size win at a fraction of the default level's CPU.
            let mut enc = flate2::write::GzEncoder::new(
                Vec::with_capacity(body.len() / 4),
                flate2::Compression::new(3),
            );
            enc.write_all(body)?;
            enc.finish()
        }
        // Level 1, as jobs at rest are (BENCHMARKS.md): most of the ratio at a fraction of the CPU.
        Compression::Zstd => zstd::bulk::compress(body, 1),
    }
}

/// Reads up to `limit` bytes of a response body; the rest is dropped with the connection.
async fn drain(mut resp: reqwest::Response, limit: usize) -> Vec<u8> {
    let mut out = Vec::new();
    while out.len() < limit {
        match resp.chunk().await {
            Ok(Some(c)) => out.extend_from_slice(&c[..c.len().min(limit - out.len())]),
            _ => break,
        }
    }
    out
}

/// `Retry-After` as seconds or an HTTP date.
pub fn parse_retry_after(v: &HeaderValue) -> Option<Duration> {
    let s = v.to_str().ok()?.trim();
    if let Ok(secs) = s.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = chrono::DateTime::parse_from_rfc2822(s).ok()?;
    let ms = at.timestamp_millis() - chrono::Utc::now().timestamp_millis();
    Some(Duration::from_millis(u64::try_from(ms).unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_https_requests_or_probes_need_tls_roots() {
        let url = |s: &str| Url::parse(s).unwrap();
        let plain = url("http://127.0.0.1:8428/write");
        let secure = url("https://collector.example/v1");
        assert!(!uses_tls(&plain, &Probe::Tcp));
        assert!(!uses_tls(
            &plain,
            &Probe::Http(url("http://127.0.0.1:8428/health"))
        ));
        assert!(uses_tls(
            &plain,
            &Probe::Http(url("https://gw.example/health"))
        ));
        assert!(uses_tls(&secure, &Probe::Tcp));
        assert!(uses_tls(&secure, &Probe::Http(plain)));
    }

    #[test]
    fn encodings_pass_records_through() {
        let recs: Vec<&[u8]> = vec![b"{\"a\":1}", b"{\"b\":2}"];
        let enc = |e, p: Payload<'_>| encode(e, &p).unwrap();
        let body = b"{\"a\":1}\n{\"b\":2}\n";
        assert_eq!(enc(Encoding::Ndjson, Payload::Records(&recs)), body);
        assert_eq!(enc(Encoding::Ndjson, Payload::Lines(body)), body);
        let array = b"[{\"a\":1},{\"b\":2}]";
        assert_eq!(enc(Encoding::JsonArray, Payload::Records(&recs)), array);
        assert_eq!(enc(Encoding::JsonArray, Payload::Lines(body)), array);
        assert_eq!(enc(Encoding::JsonArray, Payload::Records(&[])), b"[]");
        assert_eq!(enc(Encoding::JsonArray, Payload::Lines(b"")), b"[]");
        assert_eq!(enc(Encoding::JsonArray, Payload::Lines(b"1\n")), b"[1]");
        let lines: Vec<&[u8]> = vec![b"cpu,host=a v=1 1", b"cpu,host=a v=2 2"];
        assert_eq!(
            encode(Encoding::InfluxLine, &Payload::Records(&lines)).unwrap(),
            b"cpu,host=a v=1 1\ncpu,host=a v=2 2\n"
        );
    }

    fn sink(encoding: Encoding, compression: Compression) -> HttpSink {
        HttpSink::new(
            &HttpConfig {
                url: Url::parse("http://127.0.0.1:9/in").unwrap(),
                method: HttpMethod::Post,
                encoding,
                precision: None,
                compression,
                headers: Vec::new(),
                tls: TlsConfig::default(),
            },
            &Probe::Tcp,
            Duration::from_secs(1),
            1,
        )
        .unwrap()
    }

    /// A job stored as a zstd frame of lines is the body of a zstd NDJSON or line-protocol sink as
    /// it is: not decompressed, not compressed again.
    #[tokio::test]
    async fn a_stored_zstd_frame_is_the_body_as_it_is() {
        let frame = b"(\xb5/\xfd not even decoded".as_slice();
        let recs: [&[u8]; 0] = [];
        let mut batch = crate::sink::deliver::tests::batch(1, &recs);
        batch.payload = Payload::ZstdLines(frame);
        for encoding in [Encoding::Ndjson, Encoding::InfluxLine] {
            let s = sink(encoding, Compression::Zstd);
            assert!(zstd_lines(Compression::Zstd, encoding));
            assert_eq!(s.body(&batch).await.unwrap(), frame);
        }
        assert!(!zstd_lines(Compression::Zstd, Encoding::JsonArray));
        assert!(!zstd_lines(Compression::Gzip, Encoding::Ndjson));
        assert!(!zstd_lines(Compression::None, Encoding::Ndjson));
    }

    #[test]
    fn compressed_bodies_decompress_to_the_encoding() {
        use std::io::Read as _;
        let body = b"{\"a\":1}\n".repeat(1000);
        let gz = compress(Compression::Gzip, &body).unwrap();
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, body);
        assert!(gz.len() < body.len() / 10);
        let zs = compress(Compression::Zstd, &body).unwrap();
        let mut out = Vec::new();
        ruzstd::decoding::StreamingDecoder::new(&zs[..])
            .unwrap()
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, body);
    }

    #[test]
    fn file_names_travel_in_content_disposition() {
        use std::os::unix::ffi::OsStrExt;
        assert_eq!(
            content_disposition(std::ffi::OsStr::new("scan-01.pdf")),
            "attachment; filename=\"scan-01.pdf\"; filename*=UTF-8''scan-01.pdf"
        );
        assert_eq!(
            content_disposition(std::ffi::OsStr::new("Prüf \"1\".csv")),
            "attachment; filename=\"Pr__f _1_.csv\"; filename*=UTF-8''Pr%C3%BCf%20%221%22.csv"
        );
        let raw = std::ffi::OsStr::from_bytes(b"a\xffb");
        assert!(content_disposition(raw).ends_with("UTF-8''a%FFb"));
    }

    #[test]
    fn retry_after_takes_seconds_or_a_date() {
        let v = HeaderValue::from_static("7");
        assert_eq!(parse_retry_after(&v), Some(Duration::from_secs(7)));
        let later = chrono::Utc::now() + chrono::Duration::seconds(120);
        let v = HeaderValue::from_str(&later.to_rfc2822()).unwrap();
        let d = parse_retry_after(&v).unwrap();
        assert!(
            d > Duration::from_secs(100) && d <= Duration::from_secs(120),
            "{d:?}"
        );
        let past = HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT");
        assert_eq!(parse_retry_after(&past), Some(Duration::ZERO));
        assert_eq!(parse_retry_after(&HeaderValue::from_static("soon")), None);
    }
}
