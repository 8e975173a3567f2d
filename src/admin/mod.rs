//! The admin endpoint (`admin:`, on by default on 127.0.0.1:9464): `GET /metrics` (Prometheus
//! text), `GET /healthz` (the process answers), `GET /readyz` (the store is open and the scheduler
//! runs; 503 with the reason otherwise), `POST /-/reload` (the same all-or-nothing reload as
//! SIGHUP; the answer says what happened). A non-loopback address is refused at load unless
//! `allow_remote: true` and a token; with a token, everything but `/healthz` and `/readyz` needs
//! it (Bearer). `GET /-/tasks` and `POST /-/tasks/{name}/run` are [`tasks`]'; `GET /-/sinks` is
//! [`sinks`]'; the queue operations under `/-/queues/` are [`queues`]'; `GET /-/tap/{stream}` is
//! [`tap`]'s.
//!
//! This file owns the routes, the bearer token check and the listener's settings (its connections
//! are `crate::net::server`'s). What the endpoint reads is [`state`]'s [`AgentState`]; the page of
//! `/metrics` is [`render`]'s. It changes nothing itself: a reload is a request to the agent's
//! main loop, which owns the running parts. Started by `agent`.

mod queues;
mod render;
mod sinks;
mod state;
mod tap;
mod tasks;

pub use render::render;
pub use state::{AgentState, Handles, Live, ReloadReport, ReloadRequest, ReloadResult};

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::config::admin::AdminConfig;

/// Connections served at once; past that the one idle longest is closed for a newcomer.
const MAX_CONNECTIONS: usize = 64;
/// Tap requests (long polls of up to 5 s) in progress at once; one more is answered 503 at once.
/// Half the connections: the other half stay for health checks, scrapes and operator commands,
/// which never wait behind a viewer.
const MAX_TAPS: usize = MAX_CONNECTIONS / 2;
/// From accept to a complete request header (a scraper that stalls does not hold a slot long).
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// A kept-alive connection between requests.
const IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// hyper's read buffer per connection: request headers must fit.
const MAX_BUF: usize = 16 << 10;
/// The body of `POST /-/reload` is not used: at most this much of it is read.
const MAX_RELOAD_BODY: usize = 64 << 10;
/// The body of a `queue push` batch at most (the command sends 100 records per request).
const MAX_PUSH_BODY: usize = 16 << 20;
/// How long `/readyz` and the metrics wait for the store writer's snapshot.
const STORE_ANSWER: Duration = Duration::from_secs(5);

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
    tracing::info!(listen = %local, token = config.token.is_some(), tls = config.tls.is_some(), "admin endpoint listening");
    let tls = config.tls.clone();
    let config = Arc::new(config);
    let limits = crate::net::server::Limits {
        name: "admin",
        max_connections: MAX_CONNECTIONS,
        header_timeout: HEADER_TIMEOUT,
        idle_timeout: IDLE_TIMEOUT,
        max_buf: MAX_BUF,
        long: Some(crate::net::server::LongRequests {
            is_long: |req| tap::route(req.uri().path()).is_some(),
            max: MAX_TAPS,
        }),
    };
    let handler = move |req, peer| {
        let (state, config) = (Arc::clone(&state), Arc::clone(&config));
        async move { handle(req, &state, &config, peer).await }
    };
    let task = tokio::spawn(crate::net::server::serve(
        listener, limits, tls, stopping, handler,
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

fn text(status: StatusCode, body: String) -> Reply {
    let mut r = Response::new(Full::new(bytes::Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// A `u64` query parameter (`name=123`), `None` when absent; the reason when it is not a number.
fn query_u64(query: &str, name: &str) -> Result<Option<u64>, String> {
    for pair in query.split('&') {
        if let Some(v) = pair.strip_prefix(name).and_then(|r| r.strip_prefix('=')) {
            return v
                .parse()
                .map(Some)
                .map_err(|_| format!("{name}={v:?} is not a whole number"));
        }
    }
    Ok(None)
}

fn json(status: StatusCode, body: String) -> Reply {
    with_header(
        text(status, body),
        hyper::header::CONTENT_TYPE,
        "application/json",
    )
}

/// `r` with the header `name: value` (in place of one of that name).
fn with_header(mut r: Reply, name: hyper::header::HeaderName, value: &'static str) -> Reply {
    r.headers_mut()
        .insert(name, hyper::header::HeaderValue::from_static(value));
    r
}

/// What a request asks for, from its path alone.
enum Route {
    Metrics,
    Healthz,
    Readyz,
    Tasks,
    Sinks,
    Queues,
    Reload,
    /// `/-/tap/{stream}`.
    Tap(String),
    /// `/-/queues/{stream}/...`.
    Queue(String, queues::Op),
    /// `/-/tasks/{name}/run`.
    RunTask(String),
}

impl Route {
    /// `None`: no such endpoint.
    fn of(path: &str) -> Option<Self> {
        Some(match path {
            "/metrics" => Self::Metrics,
            "/healthz" => Self::Healthz,
            "/readyz" => Self::Readyz,
            "/-/tasks" => Self::Tasks,
            "/-/sinks" => Self::Sinks,
            "/-/queues" => Self::Queues,
            "/-/reload" => Self::Reload,
            _ => {
                if let Some(stream) = tap::route(path) {
                    Self::Tap(stream)
                } else if let Some((stream, op)) = queues::route(path) {
                    Self::Queue(stream, op)
                } else {
                    let name = path
                        .strip_prefix("/-/tasks/")
                        .and_then(|p| p.strip_suffix("/run"))
                        .filter(|name| !name.is_empty() && !name.contains('/'))?;
                    Self::RunTask(name.to_string())
                }
            }
        })
    }

    /// A read takes GET (and HEAD), a change POST.
    fn method(&self) -> Method {
        match self {
            Self::Reload | Self::RunTask(_) => Method::POST,
            Self::Queue(_, op) if *op != queues::Op::List => Method::POST,
            _ => Method::GET,
        }
    }

    /// Everything but the probes: what colibri holds, and what changes it.
    fn needs_token(&self) -> bool {
        !matches!(self, Self::Healthz | Self::Readyz)
    }
}

type Reply = Response<Full<bytes::Bytes>>;

async fn handle(
    req: Request<Incoming>,
    state: &AgentState,
    config: &AdminConfig,
    peer: SocketAddr,
) -> Reply {
    let path = req.uri().path().to_string();
    let Some(route) = Route::of(&path) else {
        return text(
            StatusCode::NOT_FOUND,
            format!(
                "no such endpoint {path:?} (GET /metrics, /healthz, /readyz, /-/tasks, /-/sinks, /-/queues, /-/tap/STREAM, /-/queues/STREAM/dead; POST /-/reload, /-/tasks/NAME/run, /-/queues/STREAM/{{dead/replay,dead/purge,records,pause,resume}})\n"
            ),
        );
    };
    if let Some(refused) = wrong_method(req.method(), &path, route.method()) {
        return refused;
    }
    if route.needs_token()
        && let Some(refused) = without_token(&req, config, &path, peer)
    {
        return refused;
    }
    match route {
        Route::Tap(stream) => {
            let query = req.uri().query().unwrap_or("").to_string();
            let (status, body) = tap::read(state, &stream, &query).await;
            json(status, body)
        }
        Route::Queue(stream, op) => queue(req, state, &stream, op).await,
        Route::RunTask(name) => {
            let (status, body) = tasks::run(state, &name).await;
            json(status, body)
        }
        Route::Healthz => text(StatusCode::OK, "ok\n".into()),
        Route::Tasks => json(StatusCode::OK, tasks::list(state)),
        Route::Sinks => json(StatusCode::OK, sinks::list(state)),
        Route::Queues => json(StatusCode::OK, queues::list(state)),
        Route::Readyz => match state.not_ready(STORE_ANSWER).await {
            None => text(StatusCode::OK, format!("ready\n{}", clock_detail())),
            Some(why) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {why}\n{}", clock_detail()),
            ),
        },
        Route::Metrics => with_header(
            text(StatusCode::OK, render(state).await),
            hyper::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        ),
        Route::Reload => reload(req, state).await,
    }
}

/// `/readyz`'s word on the wall clock, when it is not synchronised: ready all the same (records
/// are accepted; the streams that hold them say so in `/-/queues`).
fn clock_detail() -> &'static str {
    if crate::timesync::observe() {
        ""
    } else {
        "clock: not synchronised\n"
    }
}

/// 405 unless the request's method is `allowed` (HEAD goes where GET does).
fn wrong_method(method: &Method, path: &str, allowed: Method) -> Option<Reply> {
    if *method == allowed || (allowed == Method::GET && *method == Method::HEAD) {
        return None;
    }
    let r = text(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{path} takes {allowed}\n"),
    );
    let allow = if allowed == Method::GET {
        "GET, HEAD"
    } else {
        "POST"
    };
    Some(with_header(r, hyper::header::ALLOW, allow))
}

/// 401 when a token is configured and the request does not carry it.
fn without_token(
    req: &Request<Incoming>,
    config: &AdminConfig,
    path: &str,
    peer: SocketAddr,
) -> Option<Reply> {
    let token = config.token.as_ref()?;
    let given = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
    if given.is_some_and(|g| token.matches(g)) {
        return None;
    }
    log_unauthorized(path, peer);
    let r = text(
        StatusCode::UNAUTHORIZED,
        "this endpoint needs Authorization: Bearer <admin.token>\n".into(),
    );
    Some(with_header(r, hyper::header::WWW_AUTHENTICATE, "Bearer"))
}

/// A queue operation: its body read whole (within limits), then [`queues::handle`].
async fn queue(req: Request<Incoming>, state: &AgentState, stream: &str, op: queues::Op) -> Reply {
    let query = req.uri().query().unwrap_or("").to_string();
    let body = http_body_util::Limited::new(req.into_body(), MAX_PUSH_BODY);
    let body = match tokio::time::timeout(IDLE_TIMEOUT, body.collect()).await {
        Ok(Ok(b)) => b.to_bytes(),
        _ => {
            return json(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "{{\"error\":\"the body must arrive within {}s and hold at most {MAX_PUSH_BODY} bytes\"}}",
                    IDLE_TIMEOUT.as_secs()
                ),
            );
        }
    };
    let (status, body) = queues::handle(state, stream, op, &query, &body).await;
    json(status, body)
}

/// `POST /-/reload`: asks the main loop and answers what it did.
async fn reload(req: Request<Incoming>, state: &AgentState) -> Reply {
    // The body is not used; read (a little of) it so the connection stays usable.
    let body = http_body_util::Limited::new(req.into_body(), MAX_RELOAD_BODY);
    if tokio::time::timeout(IDLE_TIMEOUT, body.collect())
        .await
        .map_or(true, |r| r.is_err())
    {
        let r = text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "POST /-/reload takes no body (at most {MAX_RELOAD_BODY} bytes of one are read)\n"
            ),
        );
        return with_header(r, hyper::header::CONNECTION, "close");
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
