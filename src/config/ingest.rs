//! The `ingest:` section: its file shape and its compilation into [`crate::source::ingest::IngestConfig`].
//! Called by `config::compile`; the server itself is `crate::source::ingest`.

use super::Problems;
use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

#[cfg(feature = "schema")]
use super::units::u32_schema;
use super::units::{Dur, Size, de_opt_u32};
use crate::net::token::Token;
use crate::record::RecordFormat;
use crate::shape::listener_tls::ListenerTlsSpec;
use crate::source::ingest::IngestConfig;
use crate::units::fmt_size;

/// Defaults, also named in the field docs below and in `schemas/openapi.yaml`.
pub const DEFAULT_MAX_BODY: u64 = 4 << 20;
pub const DEFAULT_MAX_CONNECTIONS: u32 = 256;
pub const DEFAULT_MAX_REQUESTS: u32 = 16;
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_WAIT: Duration = Duration::from_secs(5);
pub const DEFAULT_MAX_MEMORY: u64 = 64 << 20;

/// Largest `max_body` accepted at all; in practice `max_memory` bounds it further (see
/// [`crate::source::ingest::body_cost`]).
const MAX_MAX_BODY: u64 = 256 << 20;

/// The most `max_memory` may be: what request bodies may hold at once, with room left under the
/// packaged unit's `MemoryMax=256M` for the rest of colibri (README, "Memory").
pub const MAX_MAX_MEMORY: u64 = 192 << 20;

/// Largest `read_timeout` and `wait`: a stop waits up to `read_timeout + wait + 2s` for the
/// requests in progress.
const MAX_READ_TIMEOUT: Duration = Duration::from_secs(60);
const MAX_WAIT: Duration = Duration::from_secs(60);

/// The local ingest API: programs on this machine POST records to streams over HTTP
/// (`POST /v1/streams/{stream}/records`, see schemas/openapi.yaml). Off unless `listen` is set.
/// A request is answered 200 only once its records are on disk.
#[derive(Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct IngestSpec {
    /// Address to listen on, e.g. `127.0.0.1:9465` or `[::1]:9465`. Unset or empty: ingest is off.
    /// An address other than loopback needs a `token`, or `allow_remote: true`.
    #[serde(default)]
    pub listen: Option<String>,
    /// Accept a `listen` address other than loopback without a `token`: anyone who can reach the
    /// port may append records (logged as a warning at start). Default false.
    #[serde(default)]
    pub allow_remote: bool,
    /// Largest request body, before and after gzip decompression, e.g. `1MiB`. Default 4MiB. A
    /// request may hold about twice its decompressed size in memory while it is read and stored,
    /// so `max_memory` must have room for one request of `max_body` (with gzip, which may always
    /// decompress to `max_body`).
    #[serde(default)]
    pub max_body: Option<Size>,
    /// Memory that the request bodies being read and stored may hold at once, all requests
    /// together, e.g. `32MiB`. Each request reserves what its body can cost before reading it
    /// (about twice its `Content-Length`, or twice `max_body` for gzip, plus a few bytes per
    /// record); one that finds no room within `wait` is answered 503 with `Retry-After`. Default
    /// 64MiB, at most 192MiB (the packaged unit has `MemoryMax=256M`).
    #[serde(default)]
    pub max_memory: Option<Size>,
    /// When set, every request must carry `Authorization: Bearer <token>` (compared in constant
    /// time, never logged). Use `${VAR}` to keep it out of the file.
    #[serde(default)]
    pub token: Option<String>,
    /// Open client connections at most; when all are taken, the one idle longest (no complete
    /// request header yet, or between requests) is closed for a newcomer. Default 256.
    #[serde(default, deserialize_with = "de_opt_u32")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "u32_schema"))]
    pub max_connections: Option<u32>,
    /// Requests read and stored at once (their memory together is bounded by `max_memory`); more
    /// wait for a turn without being read. Default 16.
    #[serde(default, deserialize_with = "de_opt_u32")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "u32_schema"))]
    pub max_requests: Option<u32>,
    /// Longest time a client may take to send a request's body (slower: 408), and to send the
    /// next request's header after an answer on a kept-alive connection (slower: closed without an
    /// answer). A new connection's first header must be complete within 5s of accept (or this,
    /// when shorter). Default 10s, at most 60s. At a stop, requests in progress are waited for up
    /// to `read_timeout + wait + 2s`: keep that below `shutdown_grace`.
    #[serde(default)]
    pub read_timeout: Option<Dur>,
    /// How long a request waits for room in a full `when_full: block` stream before it is answered
    /// 429 (or 507 when the disk budget is what is exhausted). `0s` answers at once. Default 5s, at
    /// most 60s; with `read_timeout` it bounds how long a stop waits for requests in progress
    /// (keep `read_timeout + wait + 2s` below `shutdown_grace`). A `when_full: drop_newest`
    /// stream answers 429 at once and counts the refused records as dropped, again on each retry
    /// of the same records.
    #[serde(default)]
    pub wait: Option<Dur>,
    /// Serve HTTPS: `cert_file`, `key_file`, and `client_ca_file` to require client certificates
    /// (mutual TLS). The files are read again at each reload (SIGHUP): new connections get a
    /// replaced certificate, open ones keep theirs. Off loopback a `token` is still required
    /// (or `allow_remote: true`).
    #[serde(default)]
    pub tls: Option<ListenerTlsSpec>,
}

/// By hand: the token is a secret, shown as `<redacted>` when set.
impl std::fmt::Debug for IngestSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IngestSpec")
            .field("listen", &self.listen)
            .field("allow_remote", &self.allow_remote)
            .field("max_body", &self.max_body)
            .field("max_memory", &self.max_memory)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("max_connections", &self.max_connections)
            .field("max_requests", &self.max_requests)
            .field("read_timeout", &self.read_timeout)
            .field("wait", &self.wait)
            .field("tls", &self.tls)
            .finish()
    }
}

/// Compiles the section; `None` when ingest is off. Problems go to `err.add(path, message)` with paths
/// relative to `ingest`. Every field is checked even when `listen` is unset.
pub(super) fn compile(
    spec: IngestSpec,
    streams: &[(&str, RecordFormat)],
    base: &std::path::Path,
    err: &mut Problems<'_>,
) -> Option<IngestConfig> {
    let max_body = compile_max_body(spec.max_body, err);
    let token = compile_token(spec.token, err);
    let max_memory = compile_max_memory(spec.max_memory, max_body, err);
    let (max_connections, max_requests) =
        compile_concurrency(spec.max_connections, spec.max_requests, err);
    let read_timeout = compile_read_timeout(spec.read_timeout, err);
    let wait = compile_wait(spec.wait, err);
    let tls = spec
        .tls
        .and_then(|t| crate::shape::listener_tls::compile(t, base, err));
    let listen = compile_listen(spec.listen, token.is_some(), spec.allow_remote, err)?;
    if streams.is_empty() {
        err.add(
            "listen",
            "ingest needs at least one stream to append to: define one under streams:".into(),
        );
        return None;
    }
    Some(IngestConfig {
        listen,
        max_body,
        max_memory,
        token,
        max_connections,
        max_requests,
        read_timeout,
        wait,
        streams: streams.iter().map(|&(s, f)| (s.to_string(), f)).collect(),
        tls,
    })
}

/// `max_body`, defaulted; out of range is reported and the value still returned, so that
/// `max_memory` is checked against what was written.
fn compile_max_body(max_body: Option<Size>, err: &mut Problems<'_>) -> u64 {
    let max_body = max_body.map_or(DEFAULT_MAX_BODY, |s| s.0);
    if !max_body_in_range(max_body) {
        err.add(
            "max_body",
            format!("{max_body} bytes is out of range 1KiB-256MiB"),
        );
    }
    max_body
}

fn max_body_in_range(max_body: u64) -> bool {
    (1024..=MAX_MAX_BODY).contains(&max_body)
}

/// `token`: `None` when unset or unusable (then reported).
fn compile_token(token: Option<String>, err: &mut Problems<'_>) -> Option<Token> {
    match token {
        None => None,
        Some(t) if t.is_empty() => {
            // An empty `${TOKEN:-}` must not quietly turn authentication off.
            err.add(
                "token",
                "must not be empty (leave the field out to accept requests without a token)".into(),
            );
            None
        }
        Some(t) if !t.bytes().all(|b| b.is_ascii_graphic()) => {
            // Not the value: it is a secret.
            err.add(
                "token",
                "must be printable ASCII without spaces (it travels in an HTTP header)".into(),
            );
            None
        }
        Some(t) => Some(Token::new(t)),
    }
}

/// `max_memory`, defaulted, and whether one request of `max_body` fits in it. The fit is only
/// judged when both are in range, so one mistake is not reported twice.
fn compile_max_memory(max_memory: Option<Size>, max_body: u64, err: &mut Problems<'_>) -> u64 {
    let max_memory = max_memory.map_or(DEFAULT_MAX_MEMORY, |s| s.0);
    let worst = crate::source::ingest::body_cost(max_body, true, max_body);
    if !(1 << 20..=MAX_MAX_MEMORY).contains(&max_memory) {
        err.add(
            "max_memory",
            format!(
                "{} is out of range 1MiB-192MiB (the packaged unit caps all of colibri at MemoryMax=256M)",
                fmt_size(max_memory)
            ),
        );
    } else if max_body_in_range(max_body) && worst > max_memory {
        err.add(
            "max_body",
            format!(
                "a request of max_body ({}) may hold up to {} while it is read and stored (twice its decompressed size, plus its records), more than ingest.max_memory ({}): lower max_body or raise max_memory",
                fmt_size(max_body),
                fmt_size(worst),
                fmt_size(max_memory)
            ),
        );
    }
    max_memory
}

/// `max_connections` and `max_requests`, defaulted and range-checked.
fn compile_concurrency(
    max_connections: Option<u32>,
    max_requests: Option<u32>,
    err: &mut Problems<'_>,
) -> (u32, u32) {
    let max_connections = max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS);
    if !(1..=65_536).contains(&max_connections) {
        err.add(
            "max_connections",
            format!("{max_connections} is out of range 1-65536"),
        );
    }
    let max_requests = max_requests.unwrap_or(DEFAULT_MAX_REQUESTS);
    if !(1..=4096).contains(&max_requests) {
        err.add(
            "max_requests",
            format!("{max_requests} is out of range 1-4096"),
        );
    }
    (max_connections, max_requests)
}

/// `read_timeout`, defaulted: positive, and short enough for a stop to wait for it.
fn compile_read_timeout(read_timeout: Option<Dur>, err: &mut Problems<'_>) -> Duration {
    let read_timeout = read_timeout.map_or(DEFAULT_READ_TIMEOUT, |d| d.0);
    if read_timeout.is_zero() {
        err.add("read_timeout", "must be positive".into());
    } else if read_timeout > MAX_READ_TIMEOUT {
        err.add(
            "read_timeout",
            "must be at most 60s (a stop waits up to read_timeout + wait for requests in progress)"
                .into(),
        );
    }
    read_timeout
}

/// `wait`, defaulted: short enough for a client and a stop to wait for it.
fn compile_wait(wait: Option<Dur>, err: &mut Problems<'_>) -> Duration {
    let wait = wait.map_or(DEFAULT_WAIT, |d| d.0);
    if wait > MAX_WAIT {
        err.add(
            "wait",
            "must be at most 60s (the client waits that long for its answer, and a stop waits for it)"
                .into(),
        );
    }
    wait
}

/// `listen`: `None` when unset or empty (ingest off) or not an address. An address other than
/// loopback without a token is reported unless `allow_remote` accepts it.
fn compile_listen(
    listen: Option<String>,
    has_token: bool,
    allow_remote: bool,
    err: &mut Problems<'_>,
) -> Option<SocketAddr> {
    let listen = listen.filter(|l| !l.trim().is_empty())?;
    let listen: SocketAddr = match listen.trim().parse() {
        Ok(addr) => addr,
        Err(_) => {
            err.add(
                "listen",
                format!(
                    "{listen:?} is not an address:port (write e.g. 127.0.0.1:9465 or [::1]:9465; host names are not resolved)"
                ),
            );
            return None;
        }
    };
    if !listen.ip().is_loopback() && !has_token && !allow_remote {
        err.add(
            "listen",
            format!(
                "{listen} is not a loopback address and there is no token: anyone who can reach it could append records; set ingest.token, or ingest.allow_remote: true to accept that"
            ),
        );
    }
    Some(listen)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn compile_yaml(yaml: &str, streams: &[&str]) -> (Option<IngestConfig>, Vec<String>) {
        let spec: IngestSpec = serde_saphyr::from_str(yaml).expect("test yaml");
        let mut problems = Vec::new();
        let streams: Vec<_> = streams.iter().map(|&s| (s, RecordFormat::Json)).collect();
        let c = compile(
            spec,
            &streams,
            std::path::Path::new("/etc/colibri"),
            &mut Problems::new(&mut problems).under("ingest"),
        );
        (c, problems.iter().map(|p| p.to_string()).collect())
    }

    #[test]
    fn defaults_and_off() {
        let (c, p) = compile_yaml("listen: 127.0.0.1:9465", &["logs"]);
        assert!(p.is_empty(), "{p:?}");
        let c = c.expect("on");
        assert_eq!(c.max_body, DEFAULT_MAX_BODY);
        assert_eq!(c.max_connections, DEFAULT_MAX_CONNECTIONS);
        assert_eq!(c.max_requests, DEFAULT_MAX_REQUESTS);
        assert_eq!(c.read_timeout, DEFAULT_READ_TIMEOUT);
        assert_eq!(c.wait, DEFAULT_WAIT);
        assert!(c.token.is_none());
        assert_eq!(
            c.streams,
            BTreeMap::from([("logs".to_string(), RecordFormat::Json)])
        );
        for off in ["{}", "listen: ''", "max_body: 1MiB"] {
            let (c, p) = compile_yaml(off, &["logs"]);
            assert!(c.is_none() && p.is_empty(), "{off}: {p:?}");
        }
    }

    #[test]
    fn every_problem_names_its_field() {
        let (c, p) = compile_yaml(
            "{ listen: 'localhost:80', max_body: 10, token: '', max_connections: 0, max_requests: 5000, read_timeout: 0s, wait: 1h }",
            &["logs"],
        );
        assert!(c.is_none());
        let fields: Vec<&str> = p
            .iter()
            .map(|m| m.split(':').next().unwrap_or(""))
            .collect();
        assert_eq!(
            fields,
            [
                "ingest.max_body",
                "ingest.token",
                "ingest.max_connections",
                "ingest.max_requests",
                "ingest.read_timeout",
                "ingest.wait",
                "ingest.listen"
            ],
            "{p:#?}"
        );
    }

    #[test]
    fn read_timeout_and_wait_are_capped() {
        let (c, p) = compile_yaml(
            "{ listen: '127.0.0.1:1', read_timeout: 60s, wait: 60s }",
            &["logs"],
        );
        assert!(p.is_empty() && c.is_some(), "{p:?}");
        let (_, p) = compile_yaml(
            "{ listen: '127.0.0.1:1', read_timeout: 61s, wait: 2m }",
            &["logs"],
        );
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(
            p[0].starts_with("ingest.read_timeout: must be at most 60s"),
            "{p:?}"
        );
        assert!(
            p[1].starts_with("ingest.wait: must be at most 60s"),
            "{p:?}"
        );
    }

    #[test]
    fn a_token_is_checked_and_never_shown() {
        let (_, p) = compile_yaml("{ listen: '127.0.0.1:1', token: 'two words' }", &["logs"]);
        assert_eq!(p.len(), 1);
        assert!(!p[0].contains("two words"), "{p:?}");
        let spec: IngestSpec = serde_saphyr::from_str("{ token: 's3cret' }").expect("yaml");
        let shown = format!("{spec:?}");
        assert!(
            !shown.contains("s3cret") && shown.contains("<redacted>"),
            "{shown}"
        );
        let (c, p) = compile_yaml("{ listen: '[::1]:1', token: 's3cret' }", &["logs"]);
        assert!(p.is_empty(), "{p:?}");
        let c = c.expect("on");
        assert!(!format!("{c:?}").contains("s3cret"));
        assert!(!c.describe().contains("s3cret"));
        assert!(c.token.as_ref().expect("set").matches(b"s3cret"));
        assert!(!c.token.as_ref().expect("set").matches(b"s3cre"));
        assert!(!c.token.as_ref().expect("set").matches(b"s3cretx"));
    }

    #[test]
    fn the_memory_budget_must_hold_one_request_of_max_body() {
        let (c, p) = compile_yaml("{ listen: '127.0.0.1:1', max_body: 16MiB }", &["logs"]);
        assert!(p.is_empty(), "{p:?}");
        assert_eq!(c.expect("on").max_memory, DEFAULT_MAX_MEMORY);
        // Twice 32MiB (gzip may inflate to max_body) plus the records' bookkeeping is over 64MiB.
        let (_, p) = compile_yaml("{ listen: '127.0.0.1:1', max_body: 32MiB }", &["logs"]);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].starts_with(
                "ingest.max_body: a request of max_body (32MiB) may hold up to 70.1MiB"
            ) && p[0].contains("ingest.max_memory (64MiB)"),
            "{p:?}"
        );
        let (c, p) = compile_yaml(
            "{ listen: '127.0.0.1:1', max_body: 32MiB, max_memory: 71MiB }",
            &["logs"],
        );
        assert!(p.is_empty(), "{p:?}");
        assert_eq!(c.expect("on").max_memory, 71 << 20);
        for bad in ["193MiB", "512KiB"] {
            let (_, p) = compile_yaml(
                &format!("{{ listen: '127.0.0.1:1', max_memory: {bad} }}"),
                &["logs"],
            );
            assert_eq!(p.len(), 1, "{bad}: {p:?}");
            assert!(p[0].starts_with("ingest.max_memory: "), "{p:?}");
        }
    }

    #[test]
    fn a_listener_beyond_loopback_needs_a_token_or_allow_remote() {
        for listen in ["0.0.0.0:1", "[::]:1", "192.0.2.1:1"] {
            let (c, p) = compile_yaml(&format!("{{ listen: '{listen}' }}"), &["logs"]);
            assert_eq!(p.len(), 1, "{listen}: {p:?}");
            assert!(
                p[0].starts_with("ingest.listen: ") && p[0].contains("allow_remote: true"),
                "{p:?}"
            );
            assert!(c.is_some(), "the rest is still compiled");
            for ok in ["token: t", "allow_remote: true"] {
                let (c, p) = compile_yaml(&format!("{{ listen: '{listen}', {ok} }}"), &["logs"]);
                assert!(p.is_empty() && c.is_some(), "{listen} {ok}: {p:?}");
            }
        }
        let (_, p) = compile_yaml("{ listen: '[::1]:1' }", &["logs"]);
        assert!(p.is_empty(), "{p:?}");
    }

    #[test]
    fn ingest_needs_a_stream() {
        let (c, p) = compile_yaml("listen: 127.0.0.1:9465", &[]);
        assert!(c.is_none());
        assert_eq!(p.len(), 1);
        assert!(p[0].starts_with("ingest.listen: ingest needs"), "{p:?}");
    }
}
