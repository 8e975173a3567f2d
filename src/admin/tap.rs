//! `GET /-/tap/{stream}?after=&limit=&wait_ms=&delivered=`: the records appended to a stream
//! (with `delivered=1`: that its sink acknowledged) since sequence number `after` (from now on
//! without it), waiting up to `wait_ms` (at most 5 s) for the first, as `{"next", "skipped",
//! "records": [...]}` (with `delivered=1` also `"replayed": [...]`, per record: sent from the
//! backlog, marked replayed); the viewer asks again from `next`. Reads [`crate::store::tap::Taps`],
//! which keeps recent records only while someone asks. Called by
//! `admin`'s router; `colibri tap` is the client.

use std::time::Duration;

use hyper::StatusCode;
use serde_json::json;

use super::{AgentState, query_u64};

/// The longest a request waits for a record (below the endpoint's idle timeout).
const MAX_WAIT: Duration = Duration::from_secs(5);
/// Records per answer at most.
const MAX_RECORDS: usize = 1000;

/// The stream of a tap path.
pub(super) fn route(path: &str) -> Option<String> {
    path.strip_prefix("/-/tap/")
        .filter(|s| !s.is_empty() && !s.contains('/'))
        .map(str::to_string)
}

pub(super) async fn read(state: &AgentState, stream: &str, query: &str) -> (StatusCode, String) {
    let known = state
        .live
        .load()
        .config
        .streams
        .iter()
        .any(|s| s.name == stream);
    let Some(store) = state.store.as_ref().filter(|_| known) else {
        return (
            StatusCode::NOT_FOUND,
            json!({ "error": format!("no stream named {stream:?} in the running config") })
                .to_string(),
        );
    };
    let params = (|| {
        let limit =
            query_u64(query, "limit")?.map_or(MAX_RECORDS, |l| (l as usize).clamp(1, MAX_RECORDS));
        let wait = query_u64(query, "wait_ms")?
            .map_or(MAX_WAIT, |ms| Duration::from_millis(ms).min(MAX_WAIT));
        let delivered = query_u64(query, "delivered")?.is_some_and(|d| d > 0);
        Ok::<_, String>((limit, wait, query_u64(query, "after")?, delivered))
    })();
    let (limit, wait, after, delivered) = match params {
        Ok(p) => p,
        Err(e) => return (StatusCode::BAD_REQUEST, json!({ "error": e }).to_string()),
    };
    let taps = if delivered {
        store.delivered_taps()
    } else {
        store.taps()
    };
    let r = taps.read(stream, after, limit, wait).await;
    let records: Vec<String> = r
        .records
        .iter()
        .map(|t| String::from_utf8_lossy(&t.record).into_owned())
        .collect();
    // `delivered` says which records these are: a viewer asking for deliveries can tell an agent
    // that knows the parameter from one that would ignore it.
    let mut body = json!({ "stream": stream, "delivered": delivered, "next": r.next,
        "skipped": r.skipped, "records": records });
    if delivered {
        // Per record: sent from the backlog, marked replayed.
        let replayed: Vec<bool> = r.records.iter().map(|t| t.replayed).collect();
        body["replayed"] = json!(replayed);
    }
    (StatusCode::OK, body.to_string())
}
