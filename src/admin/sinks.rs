//! `GET /-/sinks`: every sink of the running config with its link (up, trial or down; since
//! when and why it went down; the next probe), its streams and its last failed request (when
//! and why), as JSON. What a text cannot be in a metric: the reasons. Reads the sinks' link and
//! counters; changes nothing. Called by `admin`'s router; `colibri top` is the client.

use serde_json::{Value, json};

use super::AgentState;
use super::tasks::time;

/// One JSON array, in the file's order.
pub(super) fn list(state: &AgentState) -> String {
    let live = state.live.load();
    let sinks: Vec<Value> = live
        .sinks
        .iter()
        .map(|rt| {
            let link = if !rt.link.is_up() {
                "down"
            } else if rt.link.on_trial() {
                "trial"
            } else {
                "up"
            };
            let last_error = rt
                .stats
                .last_error()
                .map(|(at, message)| json!({ "at": time(at), "message": message }));
            json!({
                "name": rt.sink.name(),
                "streams": rt.streams,
                "link": link,
                "down_since": time(rt.link.down_since_ms()),
                "down_reason": rt.link.down_reason(),
                "next_probe": time(rt.link.next_probe_ms()),
                "last_error": last_error,
            })
        })
        .collect();
    Value::Array(sinks).to_string()
}
