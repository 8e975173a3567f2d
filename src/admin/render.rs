//! The page of `GET /metrics`: every counter colibri keeps (the process, the config's
//! generation, tasks and the worker pool, streams through a store snapshot, sinks, the store
//! writer and its refused appends, the ingest API, the sources)
//! written in the Prometheus text format of `crate::metrics`. Most families have one sample per
//! task, stream, sink or source; they are written through [`Items`], so a family is one row of a
//! table and adding a counter is adding a row. The sources' and sinks' counters are declared with
//! their families where they are counted (`crate::counters`) and only written here.
//!
//! It reads and never changes: the counters live with the code that counts them (reached through
//! [`AgentState`]). The families and their types are documented in `deploy/prometheus/metrics.txt`
//! and must stay the same. Called by the `/metrics` route.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::SystemTime;

use super::STORE_ANSWER;
use super::state::{AgentState, unix_s};
use crate::config::Config;
use crate::counters::Declared;
use crate::delivery::{SinkRuntime, SinkStats};
use crate::metrics::{Histogram, Kind, Text};
use crate::source::tail::TailStats;
use crate::store::Counters;
use crate::store::writer::{Snapshot, StoreHandle};
use crate::task::TaskStats;

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
    task_metrics(&mut t, &state.task_stats.all());
    worker_metrics(&mut t, &state.task_stats.all(), &live.config);
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
        refused_metrics(&mut t, store);
        t.family(
            "colibri_tap_skipped_records_total",
            Kind::Counter,
            "Records `colibri tap` viewers missed because they read more slowly than the stream grew (tap=\"appended\") or delivered (tap=\"delivered\", --delivered).",
        );
        for (tap, taps) in [
            ("appended", store.taps()),
            ("delivered", store.delivered_taps()),
        ] {
            t.sample(
                "colibri_tap_skipped_records_total",
                &[("tap", tap)],
                taps.skipped.load(Relaxed) as f64,
            );
        }
    }
    if let Some(ingest) = &state.ingest {
        ingest_metrics(&mut t, ingest);
    }
    if !live.config.streams.is_empty() {
        t.family(
            "colibri_stream_paused",
            Kind::Gauge,
            "Whether the operator paused the stream's delivery (colibri queue pause): 1, or 0.",
        );
        for s in &live.config.streams {
            let paused = state.paused.is_for(crate::paused::Why::Operator, &s.name);
            let paused = f64::from(u8::from(paused));
            t.sample("colibri_stream_paused", &[("stream", &s.name)], paused);
        }
    }
    clock_metrics(&mut t, &live.config);
    state.source_stats.write_metrics(&mut t);
    tail_lag_metrics(&mut t, &state.source_stats.tail.all());
    t.finish()
}

/// Whether the wall clock is synchronised, and what the correction of records held for it did.
fn clock_metrics(t: &mut Text, config: &Config) {
    t.single(
        "colibri_clock_synchronized",
        Kind::Gauge,
        "Whether the kernel says the wall clock is synchronised (1), or not (0: no NTP sync yet).",
        f64::from(u8::from(crate::timesync::observe())),
    );
    let counts = crate::clock_hold::counts();
    let held: Vec<&str> = config
        .streams
        .iter()
        .filter(|s| s.hold_until_clock_synced)
        .map(|s| s.name.as_str())
        .collect();
    if held.is_empty() {
        return;
    }
    t.family(
        "colibri_stream_clock_held_records_total",
        Kind::Counter,
        "Records held for the clock (hold_until_clock_synced), once it was synchronised: their time corrected (outcome=\"corrected\"), left as it was because it was not colibri's clock's (\"kept\"), or not correctable because they were held in an earlier boot (\"other_boot\").",
    );
    for stream in held {
        let c = counts.get(stream).copied().unwrap_or_default();
        for (outcome, n) in [("corrected", c[0]), ("kept", c[1]), ("other_boot", c[2])] {
            t.sample(
                "colibri_stream_clock_held_records_total",
                &[("stream", stream), ("outcome", outcome)],
                n as f64,
            );
        }
    }
}

/// What a family reads of one item.
type Read<T> = fn(&T) -> u64;

/// The parts of a family split by a second label: that label's value and what it reads.
type Parts<T> = [(&'static str, Read<T>)];

/// The items of the families that have one sample each per task, stream, sink or source: the
/// label that names them (`task`, `stream`, ...) and, per item, that name and what is read.
struct Items<'a, T> {
    label: &'static str,
    items: Vec<(&'a str, &'a T)>,
}

impl<T> Items<'_, T> {
    /// One family, a sample per item.
    fn family(&self, t: &mut Text, metric: &str, kind: Kind, help: &str, read: impl Fn(&T) -> u64) {
        self.family_f64(t, metric, kind, help, |item| read(item) as f64);
    }

    /// One family of values that are not whole numbers (times in seconds), a sample per item.
    fn family_f64(
        &self,
        t: &mut Text,
        metric: &str,
        kind: Kind,
        help: &str,
        read: impl Fn(&T) -> f64,
    ) {
        t.family(metric, kind, help);
        for (name, item) in &self.items {
            t.sample(metric, &[(self.label, name)], read(item));
        }
    }

    /// A family per row of `rows`: (name, help, what it reads).
    fn families(&self, t: &mut Text, kind: Kind, rows: &[(&str, &str, Read<T>)]) {
        for (metric, help, read) in rows {
            self.family(t, metric, kind, help, read);
        }
    }

    /// One family whose samples are split per item by a second label `by` (an outcome, a
    /// queue, a reason): a sample per item and part, in that order.
    fn split(
        &self,
        t: &mut Text,
        metric: &str,
        kind: Kind,
        help: &str,
        by: &str,
        parts: &Parts<T>,
    ) {
        t.family(metric, kind, help);
        for (name, item) in &self.items {
            for (part, read) in parts {
                t.sample(metric, &[(self.label, name), (by, part)], read(item) as f64);
            }
        }
    }

    /// A histogram family, one histogram per item.
    fn histograms(&self, t: &mut Text, metric: &str, help: &str, read: fn(&T) -> &Histogram) {
        t.family(metric, Kind::Histogram, help);
        for (name, item) in &self.items {
            t.histogram(metric, &[(self.label, name)], read(item));
        }
    }
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
    t.single(
        "colibri_config_restart_pending",
        Kind::Gauge,
        "Whether the file changed settings that only a restart applies (1) since the last reload.",
        f64::from(u8::from(state.restart_pending.load(Relaxed))),
    );
    t.family(
        "colibri_config_info",
        Kind::Gauge,
        "The running config file's SHA-256 (always 1).",
    );
    t.sample("colibri_config_info", &[("sha256", &config.sha256)], 1.0);
}

fn task_metrics(t: &mut Text, stats: &[(String, Arc<TaskStats>)]) {
    let tasks = Items {
        label: "task",
        items: stats.iter().map(|(n, s)| (n.as_str(), &**s)).collect(),
    };
    tasks.split(
        t,
        "colibri_task_runs_total",
        Kind::Counter,
        "Finished task runs by outcome (retries are part of one run).",
        "outcome",
        &[
            ("ok", |s| s.ok.load(Relaxed)),
            ("failed", |s| s.failed.load(Relaxed)),
            ("timeout", |s| s.timeouts.load(Relaxed)),
            ("cancelled", |s| s.cancelled.load(Relaxed)),
        ],
    );
    tasks.families(
        t,
        Kind::Counter,
        &[
            (
                "colibri_task_skipped_total",
                "Runs skipped because the previous run was still going.",
                |s| s.skipped.load(Relaxed),
            ),
            (
                "colibri_task_retries_total",
                "Attempts after a run's first.",
                |s| s.retries.load(Relaxed),
            ),
        ],
    );
    tasks.histograms(
        t,
        "colibri_task_duration_seconds",
        "How long task runs took, retries included.",
        |s| &s.duration,
    );
    tasks.families(
        t,
        Kind::Gauge,
        &[(
            "colibri_task_running",
            "Runs of the task holding a worker now (0 or 1).",
            |s| s.running.load(Relaxed),
        )],
    );
    tasks.family_f64(
        t,
        "colibri_task_last_success_timestamp_seconds",
        Kind::Gauge,
        "When the task's last successful run ended, Unix seconds (0: none since colibri started).",
        |s| s.last_success_ms.load(Relaxed) as f64 / 1000.0,
    );
}

/// The worker pool (`workers`) and how much of it runs tasks now: what the pool is sized by.
/// Scrape tasks (`http_scrape`, `modbus`) also say whether their last run reached the target and
/// how many samples it stored, as Prometheus says of its own targets.
fn worker_metrics(t: &mut Text, stats: &[(String, Arc<TaskStats>)], config: &Config) {
    t.single(
        "colibri_workers",
        Kind::Gauge,
        "Task runs that may hold a worker at once (`workers`).",
        config.workers as f64,
    );
    t.single(
        "colibri_workers_busy",
        Kind::Gauge,
        "Task runs holding a worker now.",
        stats
            .iter()
            .map(|(_, s)| s.running.load(Relaxed))
            .sum::<u64>() as f64,
    );
    let scrapes = Items {
        label: "task",
        items: stats
            .iter()
            .filter(|(name, s)| {
                s.last_outcome.load(Relaxed) != 0
                    && config
                        .tasks
                        .iter()
                        .any(|d| &d.name == name && d.action.is_scrape())
            })
            .map(|(n, s)| (n.as_str(), &**s))
            .collect(),
    };
    scrapes.families(
        t,
        Kind::Gauge,
        &[
            (
                "colibri_scrape_up",
                "Whether the scrape task's last run reached its target and stored what it read (1) or not (0).",
                |s| u64::from(s.last_outcome.load(Relaxed) == 1),
            ),
            (
                "colibri_scrape_samples_scraped",
                "Samples (records) the scrape task's last run stored.",
                |s| s.last_records.load(Relaxed),
            ),
        ],
    );
    let by_exception = Items {
        label: "task",
        items: stats
            .iter()
            .filter(|(name, _)| {
                config
                    .tasks
                    .iter()
                    .any(|d| &d.name == name && d.action.by_exception())
            })
            .map(|(n, s)| (n.as_str(), &**s))
            .collect(),
    };
    by_exception.split(
        t,
        "colibri_scrape_values_total",
        Kind::Counter,
        "Values a scrape task with a deadband or heartbeat sampled, by outcome: sent (stored), or suppressed (inside their deadband).",
        "outcome",
        &[
            ("sent", |s| s.values_sent.load(Relaxed)),
            ("suppressed", |s| s.values_suppressed.load(Relaxed)),
        ],
    );
}

fn stream_metrics(t: &mut Text, snap: &Snapshot) {
    let streams = Items {
        label: "stream",
        items: snap
            .streams
            .iter()
            .map(|(c, n)| (c.name.as_str(), n))
            .collect(),
    };
    stream_queue_metrics(t, &streams, snap);
    stream_flow_metrics(t, &streams);
}

/// What a stream's queue holds now (gauges).
fn stream_queue_metrics(t: &mut Text, streams: &Items<Counters>, snap: &Snapshot) {
    let queues: [(&str, &str, &Parts<Counters>); 4] = [
        (
            "colibri_stream_jobs",
            "Transfer jobs in a stream's queue now.",
            &[
                ("ready", |c| c.ready_jobs),
                ("retry", |c| c.retry_jobs),
                ("dead", |c| c.dead_jobs),
            ],
        ),
        (
            "colibri_stream_records",
            "Records in a stream's queue now.",
            &[
                ("ready", |c| c.ready_records),
                ("retry", |c| c.retry_records),
                ("dead", |c| c.dead_records),
            ],
        ),
        (
            "colibri_stream_bytes",
            "Bytes in a stream's queue now (spooled files included).",
            &[
                ("ready", |c| c.ready_bytes),
                ("retry", |c| c.retry_bytes),
                ("dead", |c| c.dead_bytes),
            ],
        ),
        (
            "colibri_stream_raw_bytes",
            "What the jobs in a stream's queue would take uncompressed (colibri_stream_bytes is what they take on disk).",
            &[
                ("ready", |c| c.ready_raw_bytes),
                ("retry", |c| c.retry_raw_bytes),
                ("dead", |c| c.dead_raw_bytes),
            ],
        ),
    ];
    for (metric, help, parts) in &queues {
        streams.split(t, metric, Kind::Gauge, help, "queue", parts);
    }
    streams.family(
        t,
        "colibri_stream_salvaging_records",
        Kind::Gauge,
        "Records a damaged store file held that its salvage, still running, has not put back yet.",
        |c| c.salvaging_records,
    );
    t.family(
        "colibri_stream_oldest_ready_timestamp_seconds",
        Kind::Gauge,
        "When the job at the head of a stream's ready queue (the oldest ready job, delivered next) was created, Unix seconds; 0 when none is ready. Jobs waiting to be retried are not looked at.",
    );
    for ((c, _), head) in snap.streams.iter().zip(&snap.ready_head_ms) {
        let secs = head.map_or(0.0, |ms| ms as f64 / 1000.0);
        t.sample(
            "colibri_stream_oldest_ready_timestamp_seconds",
            &[("stream", &c.name)],
            secs,
        );
    }
}

/// What a stream took in and what left it, by outcome (counters).
fn stream_flow_metrics(t: &mut Text, streams: &Items<Counters>) {
    streams.families(
        t,
        Kind::Counter,
        &[
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
                "Records deleted for being older than the stream's ttl, or than its max_age when a take came (on_max_age: drop).",
                |c| c.expired_records,
            ),
            (
                "colibri_stream_quarantined_records_total",
                "Records of jobs that failed their checksum, moved to quarantine.",
                |c| c.quarantined_records,
            ),
            (
                "colibri_stream_lost_to_damage_records_total",
                "Records a damaged store file held that its salvage could not put back.",
                |c| c.lost_to_damage_records,
            ),
            (
                "colibri_stream_salvage_resent_records_total",
                "Records of old copies a salvage put back in doubt (not live in the damaged file, most delivered before): appended again, a re-send.",
                |c| c.salvage_resent_records,
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
        ],
    );
    streams.split(
        t,
        "colibri_stream_dropped_records_total",
        Kind::Counter,
        "Records dropped, by reason: oldest/newest (when_full), purged (by an operator), dead_full (the dead-letter table's bound).",
        "reason",
        &[
            ("oldest", |c| c.dropped_oldest_records),
            ("newest", |c| c.dropped_newest_records),
            ("purged", |c| c.dropped_purged_records),
            ("dead_full", |c| c.dropped_dead_full_records),
        ],
    );
    streams.split(
        t,
        "colibri_stream_moved_records_total",
        Kind::Counter,
        "Records of jobs older than max_age moved between streams (on_max_age: stream:NAME): out of the stream they were in, into the one they were moved to. The identity: appended + moved in = delivered + dropped + expired + quarantined + lost + moved out + dead + queued.",
        "direction",
        &[
            ("in", |c| c.moved_in_records),
            ("out", |c| c.moved_out_records),
        ],
    );
    streams.split(
        t,
        "colibri_stream_downsampled_records_total",
        Kind::Counter,
        "when_full: downsample: records replaced by aggregates (direction=\"in\": raw points, or aggregates of a finer window) and the aggregates written in their place (\"out\"). The identity gains both: appended + moved in + downsampled out = delivered + dropped + expired + quarantined + lost + moved out + downsampled in + dead + queued.",
        "direction",
        &[
            ("in", |c| c.downsampled_in_records),
            ("out", |c| c.downsampled_out_records),
        ],
    );
}

fn sink_metrics(t: &mut Text, sinks: &[Arc<SinkRuntime>], snap: Option<&Snapshot>) {
    let sinks = Items {
        label: "sink",
        items: sinks.iter().map(|rt| (rt.sink.name(), &**rt)).collect(),
    };
    let stats: Vec<_> = sinks.items.iter().map(|(n, rt)| (*n, &*rt.stats)).collect();
    crate::counters::write(t, "sink", &stats, SinkStats::FAMILIES);
    sinks.histograms(
        t,
        "colibri_sink_request_duration_seconds",
        "Requests from sending to the answer or the failure.",
        |rt| &rt.stats.request_duration,
    );
    sinks.family(
        t,
        "colibri_sink_link_up",
        Kind::Gauge,
        "Whether the sink's destination answers (1), or deliveries wait for it (0).",
        |rt| u64::from(rt.link.is_up()),
    );
    // Milliseconds as seconds: a probe every 2 s is worth more than whole seconds.
    let secs = |ms: u64| ms as f64 / 1000.0;
    sinks.family_f64(
        t,
        "colibri_sink_link_down_since_timestamp_seconds",
        Kind::Gauge,
        "When the sink's link went down, Unix seconds; 0 while up (an outage lasts until a request after a passing probe is answered).",
        |rt| secs(rt.link.down_since_ms()),
    );
    sinks.family_f64(
        t,
        "colibri_sink_link_next_probe_timestamp_seconds",
        Kind::Gauge,
        "When the down link is probed next, Unix seconds (a time past: the probe is running); 0 while up or while a passing probe's requests are tried.",
        |rt| secs(rt.link.next_probe_ms()),
    );
    sinks.family(
        t,
        "colibri_sink_link_transitions_total",
        Kind::Counter,
        "Link state changes, down and up (an outage counts two once it is over).",
        SinkRuntime::transitions,
    );
    sinks.family(
        t,
        "colibri_sink_replay_backlog_records",
        Kind::Gauge,
        "Records waiting in streams whose backlog is being replayed (after an outage or at start).",
        |rt| snap.map_or(0, |s| rt.replay_backlog(s)),
    );
    let name = "colibri_stream_delivery_latency_seconds";
    t.family(
        name,
        Kind::Gauge,
        "From its append to its delivery, the last job delivered from each lane of a stream: live (younger than the stream's live_window when sent) or backlog (older, sent marked replayed); 0 before the first.",
    );
    for rt in &sinks.items {
        for (stream, [live, backlog]) in rt.1.latencies() {
            for (lane, ms) in [("live", live), ("backlog", backlog)] {
                t.sample(name, &[("stream", stream), ("lane", lane)], secs(ms));
            }
        }
    }
}

/// Appends refused for want of room, by stream and the bound that is reached.
fn refused_metrics(t: &mut Text, store: &StoreHandle) {
    t.family(
        "colibri_stream_appends_refused_total",
        Kind::Counter,
        "Appends answered \"full\" (nothing stored; a producer under `block` tries again, and each answer counts) or refused by drop_newest, by reason: max_jobs, max_bytes, storage_max_bytes, min_free.",
    );
    for ((stream, reason), n) in store.stats().refused.all() {
        t.sample(
            "colibri_stream_appends_refused_total",
            &[("stream", &stream), ("reason", reason.label())],
            n as f64,
        );
    }
}

/// The ingest API's answers by stream and status code.
fn ingest_metrics(t: &mut Text, ingest: &crate::source::ingest::IngestStats) {
    t.family(
        "colibri_ingest_requests_total",
        Kind::Counter,
        "Ingest API requests by stream (\"\" when the path names none of the file's) and status code.",
    );
    for ((stream, status), n) in ingest.answers.all() {
        t.sample(
            "colibri_ingest_requests_total",
            &[("stream", &stream), ("code", &status.to_string())],
            n as f64,
        );
    }
}

fn store_metrics(t: &mut Text, store: &StoreHandle, snap: Option<&Snapshot>, config: &Config) {
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
    // Read from the data directory at each scrape (a readdir): an operator who removes a damaged
    // file sees it leave the metrics at once.
    let aside = crate::store::aside::list(&config.data_dir);
    t.single(
        "colibri_store_damaged_files",
        Kind::Gauge,
        "Damaged store files moved aside and still in the data directory.",
        aside.len() as f64,
    );
    t.single(
        "colibri_store_damaged_bytes",
        Kind::Gauge,
        "Bytes of those files, counted against storage.max_bytes until removed.",
        aside.iter().map(|f| f.bytes).sum::<u64>() as f64,
    );
    t.single(
        "colibri_store_last_damage_timestamp_seconds",
        Kind::Gauge,
        "When the newest of those files was moved aside (0: none).",
        aside.last().map_or(0, |f| f.moved_ms) as f64 / 1000.0,
    );
    let s = store.stats();
    t.single(
        "colibri_store_salvaged_jobs_total",
        Kind::Counter,
        "Jobs put back into the store from damaged files by this process.",
        s.salvaged_jobs.load(Relaxed) as f64,
    );
    t.single(
        "colibri_store_salvaged_records_total",
        Kind::Counter,
        "Records in those jobs.",
        s.salvaged_records.load(Relaxed) as f64,
    );
    t.single(
        "colibri_store_lost_to_damage_jobs_total",
        Kind::Counter,
        "Jobs of damaged files that could not be put back: damaged themselves, of a stream no longer configured, or of no stream that could be told.",
        s.lost_jobs.load(Relaxed) as f64,
    );
}

/// How far each tail source is behind its files.
fn tail_lag_metrics(t: &mut Text, stats: &[(String, Arc<TailStats>)]) {
    let sources = Items {
        label: "source",
        items: stats.iter().map(|(n, s)| (n.as_str(), &**s)).collect(),
    };
    sources.family(
        t,
        "colibri_source_lag_bytes",
        Kind::Gauge,
        "Bytes a tail source's followed files hold beyond what it has read: how far it is behind.",
        TailStats::lag_bytes,
    );
}
