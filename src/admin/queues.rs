//! The admin endpoint's queue operations on a running agent, what `colibri queue` asks when the
//! agent runs (the store has one writer, so the command cannot open it then):
//! `POST /-/queues/{stream}/dead/replay?id=&failed_before_ms=&limit=` and `.../dead/purge?...` (one
//! chunk of at most `limit` dead letters per request, each its own commit: a long replay is many
//! requests, shows progress and can be stopped and run again), `POST /-/queues/{stream}/records`
//! (lines appended as records, answered once durable: `queue push`), and
//! `POST /-/queues/{stream}/pause` / `resume` (its delivery stops taking jobs), `GET /-/queues`
//! (every stream of the running config and whether it is paused: what the store cannot tell
//! `queue stats`), and `GET
//! /-/queues/{stream}/dead?after=&limit=` (a page of dead letters in id order, at most 1,000 jobs
//! and 4 MiB of records past the first, `{"jobs": [...], "next"}`, `next` the id to ask after
//! when more follow; each job as `queue dead list --json` prints it). Answers are JSON.
//! The store writer and [`crate::paused`] do the work; this file parses and answers. Called by
//! `admin`'s router.

use std::time::Duration;

use hyper::StatusCode;
use serde_json::json;

use super::{AgentState, query_u64 as param};
use crate::clock;
use crate::config::ingest::DEFAULT_MAX_BODY;
use crate::paused::Why;
use crate::store::writer::{DeadOp, StoreHandle};
use crate::store::{AppendError, RecordBuf, StoreError};

/// Dead letters per request at most (the command asks for 1,000).
const MAX_CHUNK: usize = 10_000;
/// Dead letters listed per request at most (each with its records).
const MAX_LISTED: usize = 1000;
/// Records' bytes listed per request at most, past the first job: the page is decoded by the
/// store writer, which every stream waits for meanwhile, and held whole as JSON.
const MAX_LISTED_RAW: u64 = 4 << 20;
/// How long a push waits for room in a full `block` stream before it is refused.
const PUSH_WAIT: Duration = Duration::from_secs(5);

/// One operation, from a path under `/-/queues/` (`None`: not one of these paths).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Op {
    /// The only one that changes nothing (GET).
    List,
    Replay,
    Purge,
    Push,
    Pause,
    Resume,
}

/// `{stream}/{op}` of a path under `/-/queues/`.
pub(super) fn route(path: &str) -> Option<(String, Op)> {
    let rest = path.strip_prefix("/-/queues/")?;
    let (stream, op) = rest.split_once('/')?;
    let op = match op {
        "dead" => Op::List,
        "dead/replay" => Op::Replay,
        "dead/purge" => Op::Purge,
        "records" => Op::Push,
        "pause" => Op::Pause,
        "resume" => Op::Resume,
        _ => return None,
    };
    (!stream.is_empty()).then(|| (stream.to_string(), op))
}

/// `GET /-/queues`: `{"streams": [{"stream", "paused", "held_for_clock", "latency_ms"}]}`, in the
/// running config's order; `latency_ms` is `{"live", "backlog"}`, from append to delivery of the last job of each
/// lane (0 before the first), for a stream that is delivered.
pub(super) fn list(state: &AgentState) -> String {
    let live = state.live.load();
    let latencies: std::collections::HashMap<&str, [u64; 2]> =
        live.sinks.iter().flat_map(|rt| rt.latencies()).collect();
    let streams: Vec<_> = live
        .config
        .streams
        .iter()
        .map(|s| {
            let latency = latencies
                .get(s.name.as_str())
                .map(|[live, backlog]| json!({ "live": live, "backlog": backlog }));
            json!({
                "stream": s.name,
                "paused": state.paused.is_for(Why::Operator, &s.name),
                "held_for_clock": state.paused.is_for(Why::Clock, &s.name),
                "latency_ms": latency,
            })
        })
        .collect();
    json!({ "streams": streams }).to_string()
}

fn error(status: StatusCode, message: impl std::fmt::Display) -> (StatusCode, String) {
    (status, json!({ "error": message.to_string() }).to_string())
}

/// Carries out `op` on `stream`; `body` is read for a push only.
pub(super) async fn handle(
    state: &AgentState,
    stream: &str,
    op: Op,
    query: &str,
    body: &[u8],
) -> (StatusCode, String) {
    let live = state.live.load();
    if !live.config.streams.iter().any(|s| s.name == stream) {
        return error(
            StatusCode::NOT_FOUND,
            format!("no stream named {stream:?} in the running config"),
        );
    }
    let Some(store) = &state.store else {
        return error(StatusCode::SERVICE_UNAVAILABLE, "the store is not open");
    };
    match op {
        Op::List => list_dead(store, stream, query).await,
        Op::Pause | Op::Resume => pause(state, stream, op == Op::Pause),
        Op::Replay | Op::Purge => settle_dead(store, stream, &op, query).await,
        Op::Push => push(state, store, stream, body).await,
    }
}

/// `GET .../dead`: a page of dead letters after `after`.
async fn list_dead(store: &StoreHandle, stream: &str, query: &str) -> (StatusCode, String) {
    let (after, limit) = match list_params(query) {
        Ok(p) => p,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    match store
        .dead_letters(stream, after, limit, MAX_LISTED_RAW)
        .await
    {
        Ok(page) => {
            let jobs: Vec<_> = page.jobs.iter().map(|j| j.to_json()).collect();
            (
                StatusCode::OK,
                json!({ "stream": stream, "jobs": jobs, "next": page.next }).to_string(),
            )
        }
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e),
    }
}

/// `after` and `limit` (clamped to `1..=MAX_LISTED`) of a dead letter listing.
fn list_params(query: &str) -> Result<(Option<u64>, usize), String> {
    let limit = param(query, "limit")?.map_or(MAX_LISTED, |l| (l as usize).clamp(1, MAX_LISTED));
    Ok((param(query, "after")?, limit))
}

/// `POST .../pause` and `.../resume`: logged only when it changes something.
fn pause(state: &AgentState, stream: &str, pause: bool) -> (StatusCode, String) {
    let changed = state.paused.set(stream, pause);
    if changed {
        tracing::info!(
            stream,
            paused = pause,
            "stream {} by the operator",
            if pause { "paused" } else { "resumed" }
        );
    }
    (
        StatusCode::OK,
        json!({ "stream": stream, "paused": pause, "changed": changed }).to_string(),
    )
}

/// `POST .../dead/replay` and `.../dead/purge`: one chunk, one commit.
async fn settle_dead(
    store: &StoreHandle,
    stream: &str,
    op: &Op,
    query: &str,
) -> (StatusCode, String) {
    let op = match dead_op(op, query) {
        Ok(op) => op,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    match store.dead(stream, op).await {
        Ok((jobs, records)) => (
            StatusCode::OK,
            json!({ "stream": stream, "jobs": jobs, "records": records }).to_string(),
        ),
        Err(e @ StoreError::NoSuchJob { .. }) => error(StatusCode::NOT_FOUND, e),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e),
    }
}

/// The store writer's request for a replay (`op` is [`Op::Replay`]) or a purge, from the query.
fn dead_op(op: &Op, query: &str) -> Result<DeadOp, String> {
    let limit = param(query, "limit")?.map_or(1000, |l| (l as usize).clamp(1, MAX_CHUNK));
    // Absolute, fixed by the command for its whole run: a dead letter that fails again
    // meanwhile is not taken again.
    let before = param(query, "failed_before_ms")?;
    Ok(if *op == Op::Replay {
        DeadOp::Replay {
            id: param(query, "id")?,
            failed_before_ms: before,
            limit,
        }
    } else {
        DeadOp::Purge {
            failed_before_ms: before,
            limit,
        }
    })
}

/// `POST .../records`: the body's lines appended, answered once durable.
async fn push(
    state: &AgentState,
    store: &StoreHandle,
    stream: &str,
    body: &[u8],
) -> (StatusCode, String) {
    let records = match push_records(state, stream, body) {
        Ok(r) => r,
        Err(refused) => return refused,
    };
    let n = records.len();
    if n == 0 {
        return (
            StatusCode::OK,
            json!({ "stream": stream, "stored": 0 }).to_string(),
        );
    }
    match store.append(stream, records, None, Some(PUSH_WAIT)).await {
        Ok(_) => (
            StatusCode::OK,
            json!({ "stream": stream, "stored": n }).to_string(),
        ),
        Err(e @ (AppendError::Full { .. } | AppendError::Refused { .. })) => {
            error(StatusCode::TOO_MANY_REQUESTS, e)
        }
        Err(e @ AppendError::TooLarge { .. }) => error(StatusCode::PAYLOAD_TOO_LARGE, e),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e),
    }
}

/// The body's lines as records of `stream`, each checked as its sink needs it by the check
/// `queue push` and an `exec` task's output go through ([`body::line_record`]), and none larger
/// than the ingest API's `max_body` (its default when ingest is off): every way into a stream
/// takes the same records. A refusal (400 or 413) names the line.
fn push_records(
    state: &AgentState,
    stream: &str,
    body: &[u8],
) -> Result<RecordBuf, (StatusCode, String)> {
    let config = &state.live.load().config;
    let carries = config.record_format(stream);
    let max = config
        .ingest
        .as_ref()
        .map_or(DEFAULT_MAX_BODY, |i| i.max_body);
    let mut records = RecordBuf::new();
    for (i, line) in body.split(|&b| b == b'\n').enumerate() {
        if line.len() as u64 > max {
            return Err(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "line {} is {} bytes, more than max_body ({max} bytes): nothing was stored",
                    i + 1,
                    line.len()
                ),
            ));
        }
        match crate::record::line::line_record(carries, line, clock::unix_ns()) {
            Ok(None) => {}
            Ok(Some(r)) => records.push(&r),
            Err(why) => {
                return Err(error(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "line {} {why} (stream {stream:?}): nothing was stored",
                        i + 1
                    ),
                ));
            }
        }
    }
    Ok(records)
}
