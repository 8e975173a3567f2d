//! The admin endpoint (`admin:`, on by default on 127.0.0.1:9464): `GET /metrics` (Prometheus
//! text), `GET /healthz` (the process answers), `GET /readyz` (the store is open and the scheduler
//! runs; 503 with the reason otherwise), `POST /-/reload` (the same all-or-nothing reload as
//! SIGHUP; the answer says what happened). A non-loopback address is refused at load unless
//! `allow_remote: true` and a token; with a token, `/metrics` and `/-/reload` need it (Bearer).
//!
//! It owns the routes, the listener's settings (its connections are `crate::net::server`'s) and
//! [`render`], which reads every counter colibri keeps (tasks, streams through a store snapshot,
//! sinks, the store writer, tail sources, the process) into one page; it changes nothing itself:
//! a reload is a request to the agent's main loop, which owns the running parts. Started by
//! `agent`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use arc_swap::ArcSwap;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::config::admin::AdminConfig;
use crate::delivery::SinkRuntime;
use crate::metrics::{Kind, Text};
use crate::store::writer::StoreHandle;

/// Connections served at once; past that the one idle longest is closed for a newcomer.
const MAX_CONNECTIONS: usize = 64;
/// From accept to a complete request header (a scraper that stalls does not hold a slot long).
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// A kept-alive connection between requests.
const IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// hyper's read buffer per connection: request headers must fit.
const MAX_BUF: usize = 16 << 10;
/// The body of `POST /-/reload` is not used: at most this much of it is read.
const MAX_RELOAD_BODY: usize = 64 << 10;
/// How long `/readyz` and the metrics wait for the store writer's snapshot.
const STORE_ANSWER: Duration = Duration::from_secs(5);

/// What a reload did, for `POST /-/reload` and the log.
pub type ReloadResult = Result<ReloadReport, String>;

#[derive(Debug, Clone, Default)]
pub struct ReloadReport {
    pub generation: u64,
    /// One line per change applied, and per setting that needs a restart.
    pub changes: Vec<String>,
}

/// A reload asked for through the endpoint, answered by the agent's main loop.
pub struct ReloadRequest {
    pub reply: oneshot::Sender<ReloadResult>,
}

/// The running configuration and the sinks it started: swapped whole on reload.
pub struct Live {
    pub config: Arc<Config>,
    pub sinks: Vec<Arc<SinkRuntime>>,
}

/// What the endpoint reads (and the agent's main loop writes).
pub struct AgentState {
    pub started: SystemTime,
    pub live: ArcSwap<Live>,
    pub store: Option<StoreHandle>,
    /// 1 for the config colibri started with, +1 per successful reload.
    pub generation: AtomicU64,
    pub last_reload_ok: AtomicBool,
    /// Unix seconds of the last successful (or the start) and failed reload; 0 when none.
    pub last_success_s: AtomicU64,
    pub last_failure_s: AtomicU64,
    /// Set when the stop begins: `/readyz` says so.
    pub stopping: AtomicBool,
    /// Cleared if the scheduler ends.
    pub scheduler_running: AtomicBool,
    pub reloads: mpsc::Sender<ReloadRequest>,
}

impl AgentState {
    pub fn new(
        config: Arc<Config>,
        sinks: Vec<Arc<SinkRuntime>>,
        store: Option<StoreHandle>,
        reloads: mpsc::Sender<ReloadRequest>,
    ) -> AgentState {
        let now = unix_s(SystemTime::now());
        AgentState {
            started: SystemTime::now(),
            live: ArcSwap::from_pointee(Live { config, sinks }),
            store,
            generation: AtomicU64::new(1),
            last_reload_ok: AtomicBool::new(true),
            last_success_s: AtomicU64::new(now),
            last_failure_s: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
            scheduler_running: AtomicBool::new(true),
            reloads,
        }
    }

    /// Why colibri is not ready, if it is not; the store writer must answer within `wait`.
    pub async fn not_ready(&self, wait: Duration) -> Option<String> {
        if self.stopping.load(Relaxed) {
            return Some("stopping".into());
        }
        if !self.scheduler_running.load(Relaxed) {
            return Some("the scheduler is not running".into());
        }
        if let Some(store) = &self.store {
            if !store.stats().store_open.load(Relaxed) {
                return Some("the store is not open (reopening after an i/o error)".into());
            }
            if tokio::time::timeout(wait, store.snapshot()).await.is_err() {
                return Some(format!(
                    "the store writer did not answer within {} ms",
                    wait.as_millis()
                ));
            }
        }
        None
    }
}

fn unix_s(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Binds the listener (a taken port stops colibri's start) and serves until `stopping`.
pub async fn start(
    config: AdminConfig,
    state: Arc<AgentState>,
    stopping: CancellationToken,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = crate::net::server::bind(config.listen)
        .with_context(|| format!("cannot listen on {} (admin.listen)", config.listen))?;
    let local = listener
        .local_addr()
        .context("the listener has no address")?;
    tracing::info!(listen = %local, token = config.token.is_some(), "admin endpoint listening");
    let config = Arc::new(config);
    let limits = crate::net::server::Limits {
        name: "admin",
        max_connections: MAX_CONNECTIONS,
        header_timeout: HEADER_TIMEOUT,
        idle_timeout: IDLE_TIMEOUT,
        max_buf: MAX_BUF,
    };
    let handler = move |req, peer| {
        let (state, config) = (Arc::clone(&state), Arc::clone(&config));
        async move { handle(req, &state, &config, peer).await }
    };
    let task = tokio::spawn(crate::net::server::serve(
        listener, limits, stopping, handler,
    ));
    Ok((local, task))
}

/// A request without the token: one WARN, then a count per minute (a scanner trying tokens must
/// not flood the log).
fn log_unauthorized(path: &str, peer: SocketAddr) {
    let first = crate::logging::summary::first("admin 401", 1, Duration::from_secs(60), || {
        |n, _, window| {
            tracing::warn!(
                status = 401,
                repeated = n,
                "admin request refused: {n} more like it in the last {}s",
                crate::logging::summary::secs(window)
            )
        }
    });
    if first {
        tracing::warn!(status = 401, path, %peer, reason = "no or wrong bearer token", "admin request refused");
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<bytes::Bytes>> {
    let mut r = Response::new(Full::new(bytes::Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

async fn handle(
    req: Request<Incoming>,
    state: &AgentState,
    config: &AdminConfig,
    peer: SocketAddr,
) -> Response<Full<bytes::Bytes>> {
    let path = req.uri().path().to_string();
    let allowed = match path.as_str() {
        "/metrics" | "/healthz" | "/readyz" => Method::GET,
        "/-/reload" => Method::POST,
        _ => {
            return text(
                StatusCode::NOT_FOUND,
                format!(
                    "no such endpoint {path:?} (GET /metrics, /healthz, /readyz; POST /-/reload)\n"
                ),
            );
        }
    };
    if req.method() != allowed && !(allowed == Method::GET && req.method() == Method::HEAD) {
        let mut r = text(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{path} takes {allowed}\n"),
        );
        r.headers_mut().insert(
            hyper::header::ALLOW,
            hyper::header::HeaderValue::from_static(if allowed == Method::GET {
                "GET, HEAD"
            } else {
                "POST"
            }),
        );
        return r;
    }
    let guarded = matches!(path.as_str(), "/metrics" | "/-/reload");
    if guarded && let Some(token) = &config.token {
        let given = req
            .headers()
            .get(hyper::header::AUTHORIZATION)
            .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
        if !given.is_some_and(|g| token.matches(g)) {
            log_unauthorized(&path, peer);
            let mut r = text(
                StatusCode::UNAUTHORIZED,
                "this endpoint needs Authorization: Bearer <admin.token>\n".into(),
            );
            r.headers_mut().insert(
                hyper::header::WWW_AUTHENTICATE,
                hyper::header::HeaderValue::from_static("Bearer"),
            );
            return r;
        }
    }
    match path.as_str() {
        "/healthz" => text(StatusCode::OK, "ok\n".into()),
        "/readyz" => match state.not_ready(STORE_ANSWER).await {
            None => text(StatusCode::OK, "ready\n".into()),
            Some(why) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {why}\n"),
            ),
        },
        "/metrics" => {
            let mut r = text(StatusCode::OK, render(state).await);
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            r
        }
        _ => {
            // The body is not used; read (a little of) it so the connection stays usable.
            let body = http_body_util::Limited::new(req.into_body(), MAX_RELOAD_BODY);
            if tokio::time::timeout(IDLE_TIMEOUT, body.collect())
                .await
                .map_or(true, |r| r.is_err())
            {
                let mut r = text(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!(
                        "POST /-/reload takes no body (at most {MAX_RELOAD_BODY} bytes of one are read)\n"
                    ),
                );
                r.headers_mut().insert(
                    hyper::header::CONNECTION,
                    hyper::header::HeaderValue::from_static("close"),
                );
                return r;
            }
            let (reply, rx) = oneshot::channel();
            if state.reloads.send(ReloadRequest { reply }).await.is_err() {
                return text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "colibri is stopping\n".into(),
                );
            }
            match rx.await {
                Ok(Ok(report)) => {
                    let mut body = format!("reloaded: generation {}\n", report.generation);
                    for c in &report.changes {
                        body.push_str(c);
                        body.push('\n');
                    }
                    text(StatusCode::OK, body)
                }
                Ok(Err(problems)) => text(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    format!("reload refused, the running config stays:\n{problems}\n"),
                ),
                Err(_) => text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "colibri is stopping\n".into(),
                ),
            }
        }
    }
}

/// The whole metrics page.
pub async fn render(state: &AgentState) -> String {
    let mut t = Text::default();
    let live = state.live.load();
    t.family(
        "colibri_build_info",
        Kind::Gauge,
        "colibri's version (always 1).",
    );
    t.sample(
        "colibri_build_info",
        &[("version", env!("CARGO_PKG_VERSION"))],
        1.0,
    );
    process_metrics(&mut t, state.started);
    config_metrics(&mut t, state, &live.config);
    task_metrics(&mut t);
    let snap = match &state.store {
        Some(s) => tokio::time::timeout(STORE_ANSWER, s.snapshot())
            .await
            .ok()
            .and_then(Result::ok),
        None => None,
    };
    if let Some(snap) = &snap {
        stream_metrics(&mut t, snap);
    }
    sink_metrics(&mut t, &live.sinks, snap.as_ref());
    if let Some(store) = &state.store {
        store_metrics(&mut t, store, snap.as_ref(), &live.config);
    }
    source_metrics(&mut t);
    t.finish()
}

fn process_metrics(t: &mut Text, started: SystemTime) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let rss_kib: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    t.single(
        "colibri_process_resident_memory_bytes",
        Kind::Gauge,
        "Resident memory of the colibri process.",
        rss_kib * 1024.0,
    );
    let fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
    t.single(
        "colibri_process_open_fds",
        Kind::Gauge,
        "Open file descriptors.",
        fds as f64,
    );
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = stat.rsplit_once(") ").map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11..13).map_or(0.0, |v| {
        v.iter().filter_map(|x| x.parse::<f64>().ok()).sum()
    });
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    t.single(
        "colibri_process_cpu_seconds_total",
        Kind::Counter,
        "User and system CPU time.",
        if hz > 0.0 { ticks / hz } else { 0.0 },
    );
    t.single(
        "colibri_process_start_time_seconds",
        Kind::Gauge,
        "When the process started, Unix seconds.",
        unix_s(started) as f64,
    );
}

fn config_metrics(t: &mut Text, state: &AgentState, config: &Config) {
    t.single(
        "colibri_config_generation",
        Kind::Gauge,
        "The running config: 1 at start, +1 per successful reload.",
        state.generation.load(Relaxed) as f64,
    );
    t.single(
        "colibri_config_last_reload_successful",
        Kind::Gauge,
        "Whether the last reload was applied (1) or refused (0).",
        f64::from(u8::from(state.last_reload_ok.load(Relaxed))),
    );
    t.single(
        "colibri_config_last_reload_success_timestamp_seconds",
        Kind::Gauge,
        "When a config was last applied (the start, or a reload), Unix seconds.",
        state.last_success_s.load(Relaxed) as f64,
    );
    t.single(
        "colibri_config_last_reload_failure_timestamp_seconds",
        Kind::Gauge,
        "When a reload was last refused, Unix seconds (0: never).",
        state.last_failure_s.load(Relaxed) as f64,
    );
    t.family(
        "colibri_config_info",
        Kind::Gauge,
        "The running config file's SHA-256 (always 1).",
    );
    t.sample("colibri_config_info", &[("sha256", &config.sha256)], 1.0);
}

fn task_metrics(t: &mut Text) {
    let tasks = crate::task::all_stats();
    t.family(
        "colibri_task_runs_total",
        Kind::Counter,
        "Finished task runs by outcome (retries are part of one run).",
    );
    for (name, s) in &tasks {
        for (outcome, v) in [
            ("ok", &s.ok),
            ("failed", &s.failed),
            ("timeout", &s.timeouts),
            ("cancelled", &s.cancelled),
        ] {
            t.sample(
                "colibri_task_runs_total",
                &[("task", name), ("outcome", outcome)],
                v.load(Relaxed) as f64,
            );
        }
    }
    t.family(
        "colibri_task_skipped_total",
        Kind::Counter,
        "Runs skipped because the previous run was still going.",
    );
    for (name, s) in &tasks {
        t.sample(
            "colibri_task_skipped_total",
            &[("task", name)],
            s.skipped.load(Relaxed) as f64,
        );
    }
    t.family(
        "colibri_task_retries_total",
        Kind::Counter,
        "Attempts after a run's first.",
    );
    for (name, s) in &tasks {
        t.sample(
            "colibri_task_retries_total",
            &[("task", name)],
            s.retries.load(Relaxed) as f64,
        );
    }
    t.family(
        "colibri_task_duration_seconds",
        Kind::Histogram,
        "How long task runs took, retries included.",
    );
    for (name, s) in &tasks {
        t.histogram(
            "colibri_task_duration_seconds",
            &[("task", name)],
            &s.duration,
        );
    }
}

fn stream_metrics(t: &mut Text, snap: &crate::store::writer::Snapshot) {
    type Get = fn(&crate::store::Counters) -> u64;
    let queues: [(&str, Get, Get, Get); 3] = [
        (
            "ready",
            |c| c.ready_jobs,
            |c| c.ready_records,
            |c| c.ready_bytes,
        ),
        (
            "retry",
            |c| c.retry_jobs,
            |c| c.retry_records,
            |c| c.retry_bytes,
        ),
        (
            "dead",
            |c| c.dead_jobs,
            |c| c.dead_records,
            |c| c.dead_bytes,
        ),
    ];
    for (metric, help, which) in [
        (
            "colibri_stream_jobs",
            "Transfer jobs in a stream's queue now.",
            0,
        ),
        (
            "colibri_stream_records",
            "Records in a stream's queue now.",
            1,
        ),
        (
            "colibri_stream_bytes",
            "Bytes in a stream's queue now (spooled files included).",
            2,
        ),
    ] {
        t.family(metric, Kind::Gauge, help);
        for (cfg, c) in &snap.streams {
            for (queue, jobs, records, bytes) in &queues {
                let v = match which {
                    0 => jobs(c),
                    1 => records(c),
                    _ => bytes(c),
                };
                t.sample(metric, &[("stream", &cfg.name), ("queue", queue)], v as f64);
            }
        }
    }
    let flows: [(&str, &str, Get); 7] = [
        (
            "colibri_stream_appended_records_total",
            "Records accepted into the stream (durable).",
            |c| c.appended_records,
        ),
        (
            "colibri_stream_delivered_records_total",
            "Records its sink acknowledged.",
            |c| c.delivered_records,
        ),
        (
            "colibri_stream_delivered_bytes_total",
            "Stored bytes of the jobs delivered.",
            |c| c.delivered_bytes,
        ),
        (
            "colibri_stream_expired_records_total",
            "Records deleted for being older than the stream's ttl.",
            |c| c.expired_records,
        ),
        (
            "colibri_stream_quarantined_records_total",
            "Records of jobs that failed their checksum, moved to quarantine.",
            |c| c.quarantined_records,
        ),
        (
            "colibri_stream_dead_lettered_records_total",
            "Records moved to the dead letters.",
            |c| c.dead_lettered_records,
        ),
        (
            "colibri_stream_retried_attempts_total",
            "Failed delivery attempts that went to retry.",
            |c| c.retried_attempts,
        ),
    ];
    for (metric, help, get) in flows {
        t.family(metric, Kind::Counter, help);
        for (cfg, c) in &snap.streams {
            t.sample(metric, &[("stream", &cfg.name)], get(c) as f64);
        }
    }
    t.family(
        "colibri_stream_dropped_records_total",
        Kind::Counter,
        "Records dropped, by reason: oldest/newest (when_full), purged (by an operator), dead_full (the dead-letter table's bound).",
    );
    for (cfg, c) in &snap.streams {
        for (reason, v) in [
            ("oldest", c.dropped_oldest_records),
            ("newest", c.dropped_newest_records),
            ("purged", c.dropped_purged_records),
            ("dead_full", c.dropped_dead_full_records),
        ] {
            t.sample(
                "colibri_stream_dropped_records_total",
                &[("stream", &cfg.name), ("reason", reason)],
                v as f64,
            );
        }
    }
}

fn sink_metrics(
    t: &mut Text,
    sinks: &[Arc<SinkRuntime>],
    snap: Option<&crate::store::writer::Snapshot>,
) {
    t.family(
        "colibri_sink_requests_total",
        Kind::Counter,
        "Requests by result: ok (2xx), transport (no answer; no attempt spent), retryable (5xx/408/429), too_large (413), rejected (other 4xx).",
    );
    for rt in sinks {
        let s = &rt.stats;
        for (result, v) in [
            ("ok", &s.requests_ok),
            ("transport", &s.requests_transport),
            ("retryable", &s.requests_retryable),
            ("too_large", &s.requests_too_large),
            ("rejected", &s.requests_rejected),
        ] {
            t.sample(
                "colibri_sink_requests_total",
                &[("sink", rt.sink.name()), ("result", result)],
                v.load(Relaxed) as f64,
            );
        }
    }
    type Get = fn(&crate::delivery::SinkStats) -> &AtomicU64;
    let counters: [(&str, &str, Get); 4] = [
        (
            "colibri_sink_failed_attempts_total",
            "Failed attempts that count against retry.max_attempts.",
            |s| &s.attempts_failed,
        ),
        (
            "colibri_sink_dead_lettered_records_total",
            "Records the sink's failures sent to the dead letters.",
            |s| &s.dead_lettered_records,
        ),
        (
            "colibri_sink_delivered_records_total",
            "Records delivered.",
            |s| &s.records_delivered,
        ),
        (
            "colibri_sink_delivered_bytes_total",
            "Request body bytes delivered (after compression).",
            |s| &s.bytes_delivered,
        ),
    ];
    for (metric, help, get) in counters {
        t.family(metric, Kind::Counter, help);
        for rt in sinks {
            t.sample(
                metric,
                &[("sink", rt.sink.name())],
                get(&rt.stats).load(Relaxed) as f64,
            );
        }
    }
    t.family(
        "colibri_sink_request_duration_seconds",
        Kind::Histogram,
        "Requests from sending to the answer or the failure.",
    );
    for rt in sinks {
        t.histogram(
            "colibri_sink_request_duration_seconds",
            &[("sink", rt.sink.name())],
            &rt.stats.request_duration,
        );
    }
    t.family(
        "colibri_sink_link_up",
        Kind::Gauge,
        "Whether the sink's destination answers (1), or deliveries wait for it (0).",
    );
    for rt in sinks {
        t.sample(
            "colibri_sink_link_up",
            &[("sink", rt.sink.name())],
            f64::from(u8::from(rt.link.is_up())),
        );
    }
    t.family(
        "colibri_sink_link_transitions_total",
        Kind::Counter,
        "Link state changes, down and up (an outage counts two once it is over).",
    );
    for rt in sinks {
        t.sample(
            "colibri_sink_link_transitions_total",
            &[("sink", rt.sink.name())],
            rt.transitions() as f64,
        );
    }
    t.family(
        "colibri_sink_replay_backlog_records",
        Kind::Gauge,
        "Records waiting in streams whose backlog is being replayed (after an outage or at start).",
    );
    for rt in sinks {
        let v = snap.map_or(0, |s| rt.replay_backlog(s));
        t.sample(
            "colibri_sink_replay_backlog_records",
            &[("sink", rt.sink.name())],
            v as f64,
        );
    }
}

fn store_metrics(
    t: &mut Text,
    store: &StoreHandle,
    snap: Option<&crate::store::writer::Snapshot>,
    config: &Config,
) {
    let s = store.stats();
    t.single(
        "colibri_store_commits_total",
        Kind::Counter,
        "Store commits that reached the disk (one fsync each).",
        s.commits.load(Relaxed) as f64,
    );
    t.single(
        "colibri_store_failed_commits_total",
        Kind::Counter,
        "Store commits that failed (nothing in them was acknowledged).",
        s.failed_commits.load(Relaxed) as f64,
    );
    t.family(
        "colibri_store_commit_duration_seconds",
        Kind::Histogram,
        "Store commits, fsync included.",
    );
    t.histogram(
        "colibri_store_commit_duration_seconds",
        &[],
        &s.commit_duration,
    );
    t.single(
        "colibri_store_file_bytes",
        Kind::Gauge,
        "Size of the store's database file.",
        snap.map_or(0, |s| s.file_bytes) as f64,
    );
    t.single(
        "colibri_storage_used_bytes",
        Kind::Gauge,
        "Bytes the streams hold (ready, retry, dead; spooled files included), counted against storage.max_bytes.",
        snap.map_or(0, |s| s.stored_bytes) as f64,
    );
    t.single(
        "colibri_storage_max_bytes",
        Kind::Gauge,
        "storage.max_bytes.",
        config.storage.max_bytes as f64,
    );
    t.single(
        "colibri_storage_free_disk_bytes",
        Kind::Gauge,
        "Free bytes on the data directory's filesystem.",
        crate::files::free_bytes(&config.data_dir).unwrap_or(0) as f64,
    );
    t.single(
        "colibri_storage_min_free_bytes",
        Kind::Gauge,
        "storage.min_free: below it every stream is full.",
        config.storage.min_free as f64,
    );
}

fn source_metrics(t: &mut Text) {
    let sources = crate::tail::all_stats();
    type Get = fn(&crate::tail::TailStats) -> &AtomicU64;
    let counters: [(&str, &str, Get); 5] = [
        (
            "colibri_source_lines_total",
            "Lines a tail source read.",
            |s| &s.lines_read,
        ),
        (
            "colibri_source_records_total",
            "Records a tail source appended (durable).",
            |s| &s.records_appended,
        ),
        (
            "colibri_source_filtered_lines_total",
            "Lines dropped by include_lines, exclude_lines or min_level.",
            |s| &s.filtered_lines,
        ),
        (
            "colibri_source_truncated_lines_total",
            "Lines cut at max_line_bytes.",
            |s| &s.truncated_lines,
        ),
        (
            "colibri_source_rotations_total",
            "Followed files renamed away or deleted.",
            |s| &s.rotations,
        ),
    ];
    for (metric, help, get) in counters {
        t.family(metric, Kind::Counter, help);
        for (name, s) in &sources {
            t.sample(metric, &[("source", name)], get(s).load(Relaxed) as f64);
        }
    }
}
