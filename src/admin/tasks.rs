//! The admin endpoint's task routes: `GET /-/tasks` (every task of the running config with its
//! schedule, whether it runs now, its last run and outcome, its last success and its next run, as
//! JSON) and `POST /-/tasks/{name}/run` (run it now, outside its schedule: 202 once started, 404
//! for an unknown task, 409 while it runs). The scheduler starts the run; this file only asks it
//! and reads the task counters. Called by `admin`'s router; `colibri task` is the client.

use std::sync::atomic::Ordering::Relaxed;

use chrono::{DateTime, SecondsFormat, Utc};
use hyper::StatusCode;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use super::AgentState;
use crate::scheduler::{Change, RunRefused};
use crate::task::{Outcome, TaskStats};

/// RFC 3339 of Unix ms, `null` for 0 (never).
pub(super) fn time(ms: u64) -> Value {
    if ms == 0 {
        return Value::Null;
    }
    i64::try_from(ms)
        .ok()
        .and_then(DateTime::<Utc>::from_timestamp_millis)
        .map_or(Value::Null, |t| {
            Value::String(t.to_rfc3339_opts(SecondsFormat::Millis, true))
        })
}

fn task_json(name: &str, schedule: String, s: &TaskStats) -> Value {
    // The counters first (Acquire): a run counted there has its `last_*` written.
    let ended = s.ended();
    let last = Outcome::label_of(s.last_outcome.load(Relaxed)).map(|outcome| {
        json!({
            "start": time(s.last_start_ms.load(Relaxed)),
            "duration_s": s.last_duration_ms.load(Relaxed) as f64 / 1000.0,
            "outcome": outcome,
        })
    });
    json!({
        "name": name,
        "schedule": schedule,
        "running": s.running.load(Relaxed) > 0,
        "runs": ended,
        "ok": s.ok.load(Relaxed),
        "failed": s.failed.load(Relaxed),
        "timeouts": s.timeouts.load(Relaxed),
        "skipped": s.skipped.load(Relaxed),
        "last": last,
        "last_success": time(s.last_success_ms.load(Relaxed)),
        "next": time(s.next_ms.load(Relaxed)),
    })
}

/// `GET /-/tasks`: one JSON array, in the file's order.
pub(super) fn list(state: &AgentState) -> String {
    let live = state.live.load();
    let tasks: Vec<Value> = live
        .config
        .tasks
        .iter()
        .map(|t| {
            task_json(
                &t.name,
                t.schedule.to_string(),
                &state.task_stats.get(&t.name),
            )
        })
        .collect();
    let mut body = Value::Array(tasks).to_string();
    body.push('\n');
    body
}

/// `POST /-/tasks/{name}/run`: the status and a JSON body.
pub(super) async fn run(state: &AgentState, name: &str) -> (StatusCode, String) {
    let (reply, rx) = oneshot::channel();
    let asked = state.scheduler.send(Change::RunNow {
        name: name.to_string(),
        reply,
    });
    let answer = match rx.await {
        Ok(a) if asked => a,
        _ => {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"error": "colibri is stopping"}).to_string(),
            );
        }
    };
    match answer {
        Ok(ended) => (
            StatusCode::ACCEPTED,
            json!({"task": name, "started": true, "runs_before": ended}).to_string(),
        ),
        Err(RunRefused::NoSuchTask) => (
            StatusCode::NOT_FOUND,
            json!({"error": format!("no task named {name:?} in the running config")}).to_string(),
        ),
        Err(RunRefused::AlreadyRunning) => (
            StatusCode::CONFLICT,
            json!({"error": format!("task {name:?} is running now; runs of one task never overlap")})
                .to_string(),
        ),
    }
}
