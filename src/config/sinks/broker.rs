//! What the broker sinks' entries (`mqtt`, `nats`) check alike: the message template and `batch`,
//! `timeout`, `concurrency`, `replay_rate`. Called by `sinks::mqtt` and `sinks::nats`.

use std::time::Duration;

use super::super::Problems;
use super::super::units::{Dur, Size};
use crate::sink::template::{Rules, Template};

/// `template` (under `field`) parsed; with `batch`, one naming a record's field is refused.
pub(super) fn template(
    field: &str,
    template: &str,
    rules: Rules,
    batch: bool,
    err: &mut Problems<'_>,
) -> Option<Template> {
    let t = Template::parse(template, rules)
        .map_err(|m| err.add(field, m))
        .ok()?;
    if batch && t.uses_fields() {
        err.add(
            field,
            "names a record's field, and batch: true sends a job's records as one message".into(),
        );
    }
    Some(t)
}

/// `timeout` (default 10s), `concurrency` (1-64, default 1) and `replay_rate` checked.
pub(super) fn limits(
    timeout: Option<Dur>,
    concurrency: Option<u32>,
    replay_rate: Option<Size>,
    err: &mut Problems<'_>,
) -> (Duration, usize, Option<u64>) {
    let timeout = timeout.map_or(Duration::from_secs(10), |d| d.0);
    if timeout.is_zero() {
        err.add("timeout", "must be positive".into());
    }
    let concurrency = concurrency.unwrap_or(1);
    if !(1..=64).contains(&concurrency) {
        err.add(
            "concurrency",
            format!("must be between 1 and 64, not {concurrency}"),
        );
    }
    if replay_rate.is_some_and(|r| r.0 == 0) {
        err.add(
            "replay_rate",
            "must be positive (leave it out for unlimited)".into(),
        );
    }
    (timeout, concurrency as usize, replay_rate.map(|r| r.0))
}
