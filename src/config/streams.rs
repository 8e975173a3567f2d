//! The `streams:` section: the file shape of a durable queue (batching, when full, TTL, dead
//! letters) and `compile_stream`, which checks an entry against the sinks declared and builds the
//! store's `StreamConfig`, and the checks across streams and their sinks once all are compiled
//! (`check_moves`, `settle_downsample`). It does not queue anything (`store` does). Called by
//! `config::compile`.

use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

#[cfg(feature = "schema")]
use super::units::u32_schema;
use super::units::{self, Dur, Size};
use super::{Problems, named_entry, stream_format};
use crate::record::RecordFormat;
use crate::scrape::downsample::Keep;
use crate::sink::SinkConfig;
use crate::store::{
    AtRest, BatchConfig, Downsample, MaxAge, OnMaxAge, Replay, StreamConfig, WhenFull,
};
use std::sync::Arc;

/// One stream: a bounded, durable FIFO of transfer jobs.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct StreamSpec {
    /// The sink the stream is delivered to (a name under `sinks:`). A stream without one only queues.
    #[serde(default)]
    pub sink: Option<String>,
    /// How records are cut into transfer jobs.
    #[serde(default)]
    pub batch: BatchSpec,
    /// Most jobs queued (ready and retry). Default 100000.
    #[serde(default, deserialize_with = "units::de_opt_u32")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "u32_schema"))]
    pub max_jobs: Option<u32>,
    /// Most bytes queued (ready and retry). Default 256MiB.
    #[serde(default)]
    pub max_bytes: Option<Size>,
    /// What a full stream does: `block` (producers wait, then get an error), `drop_oldest` (the oldest
    /// ready jobs are deleted and counted), `drop_newest` (new records are refused and counted),
    /// `downsample` (for metrics: the oldest jobs are replaced by aggregates per series and window,
    /// coarser as it stays full; see `downsample`).
    #[serde(default)]
    pub when_full: WhenFullSpec,
    /// With `when_full: downsample`: the first window and the aggregates kept.
    #[serde(default)]
    pub downsample: Option<DownsampleSpec>,
    /// Jobs older than this are deleted and counted as expired. Default: kept until delivered.
    #[serde(default)]
    pub ttl: Option<Dur>,
    /// Jobs older than this when their turn comes are not sent: deleted and counted as expired
    /// (unlike `ttl`, checked at every take, so nothing older ever reaches the sink). For a
    /// receiver that no longer wants old data, such as Prometheus without an out-of-order window.
    /// Default: none.
    #[serde(default)]
    pub max_age: Option<Dur>,
    /// What becomes of a job older than `max_age`: `drop` (the default: deleted, counted as
    /// expired) or `stream:NAME` (moved, with its idempotency key, to the stream NAME, for
    /// example an archive whose sink is a directory or a bulk endpoint; counted as moved out here
    /// and moved in there; NAME must not move jobs on itself, and its sink must take the same
    /// records).
    #[serde(default)]
    pub on_max_age: Option<String>,
    /// Dead letters: jobs that failed for good.
    #[serde(default)]
    pub dead_letter: DeadLetterSpec,
    /// Jobs stored compressed (zstd) on disk: `auto` (default: jobs that wait, a backlog that
    /// builds while the sink's link is down or slow, are compressed; a stream delivered as fast
    /// as it comes is not, saving the CPU; every job when the sink sends `compression: zstd`
    /// bodies, which then go out as they are stored), `zstd` (every job: the least disk written)
    /// or `none`. Bounds count the bytes on disk.
    #[serde(default)]
    pub compression: AtRestSpec,
    /// The order a backlog is sent in once the link is back: `oldest_first` (default: the whole
    /// queue in order, for receivers that need it) or `live_first` (jobs younger than
    /// `live_window` go first, oldest first among them, while the backlog drains oldest first
    /// behind them, never with less than `backfill_share` of the link).
    #[serde(default)]
    pub replay: ReplaySpec,
    /// Jobs younger than this are live, older ones the backlog, in either order; a job of the
    /// backlog is sent with the replayed marker. Default 10s.
    #[serde(default)]
    pub live_window: Option<Dur>,
    /// With `replay: live_first`: the least share of what the link carries that goes to the
    /// backlog while live jobs wait too (bytes taken, a number above 0, up to 1). Default 0.25.
    #[serde(default)]
    pub backfill_share: Option<f64>,
    /// Among the streams of one sink (0-9, higher first; 0 when unset): while the sink has more to
    /// send than its `concurrency` or `replay_rate` allows, a higher stream's jobs go first. A sink
    /// whose streams all have the same priority sends as they come.
    #[serde(default)]
    pub priority: Option<u8>,
    /// The least share of the sink's bytes this stream gets while a higher-priority stream is
    /// busy, so it is delayed, never starved (above 0, below 1). Default 0.1.
    #[serde(default)]
    pub min_share: Option<f64>,
    /// For a box without a real-time clock: while the kernel says the wall clock is not
    /// synchronised (no NTP sync yet since boot), jobs appended here carry the time since boot
    /// beside their wall-clock time, and the stream is not delivered; once the clock is
    /// synchronised, the timestamps colibri gave their records (line protocol) are corrected by
    /// the error observed, and delivery starts. Records whose time is not colibri's clock's are
    /// left as they are (counted). Default false.
    #[serde(default)]
    pub hold_until_clock_synced: bool,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ReplaySpec {
    #[default]
    OldestFirst,
    LiveFirst,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum AtRestSpec {
    #[default]
    Auto,
    Zstd,
    None,
}

#[derive(Debug, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct BatchSpec {
    /// Most records in one job. Default 1000.
    #[serde(default, deserialize_with = "units::de_opt_u32")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "u32_schema"))]
    pub max_records: Option<u32>,
    /// Most bytes of records in one job. Default 1MiB.
    #[serde(default)]
    pub max_bytes: Option<Size>,
    /// How long a source may hold records back to fill a job. Default 1s.
    #[serde(default)]
    pub linger: Option<Dur>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum WhenFullSpec {
    #[default]
    Block,
    DropOldest,
    DropNewest,
    Downsample,
}

/// `downsample:` of a stream whose sink takes line protocol.
#[derive(Debug, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct DownsampleSpec {
    /// The window of the first aggregates. Default 1m.
    #[serde(default)]
    pub window: Option<Dur>,
    /// The coarser windows used while the stream stays full, each a multiple of the one before.
    /// Default: 10 and 60 times `window` (1m, 10m, 1h).
    #[serde(default)]
    pub ladder: Option<Vec<Dur>>,
    /// The aggregates written per field besides its count (`F_count`, always): `last` (the field
    /// under its own name), `min` (`F_min`), `max` (`F_max`), `mean` (`F_mean`). Default all.
    #[serde(default)]
    pub keep: Option<Vec<KeepSpec>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum KeepSpec {
    Last,
    Min,
    Max,
    Mean,
    Count,
}

#[derive(Debug, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct DeadLetterSpec {
    /// Most dead jobs kept; beyond it the oldest is deleted and counted. Default 10000.
    #[serde(default, deserialize_with = "units::de_opt_u32")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "u32_schema"))]
    pub max_jobs: Option<u32>,
}

pub(super) fn compile_stream(
    name: String,
    value: Value,
    sinks: &[&str],
    streams: &[&str],
    problems: &mut Problems<'_>,
) -> Option<StreamConfig> {
    let (spec, mut err) = named_entry::<StreamSpec>("streams", "stream", &name, value, problems);
    let spec = spec?;
    if let Some(sink) = &spec.sink
        && !sinks.contains(&sink.as_str())
    {
        let known = if sinks.is_empty() {
            "none".to_string()
        } else {
            sinks.join(", ")
        };
        err.add(
            "sink",
            format!("sink {sink:?} is not defined under sinks: (defined: {known})"),
        );
    }
    let batch = BatchConfig {
        max_records: spec.batch.max_records.unwrap_or(1000),
        max_bytes: spec.batch.max_bytes.map_or(1 << 20, |s| s.0),
        linger: spec.batch.linger.map_or(Duration::from_secs(1), |d| d.0),
    };
    if batch.max_records == 0 {
        err.add("batch.max_records", "must be at least 1".into());
    }
    if batch.max_bytes == 0 {
        err.add("batch.max_bytes", "must be positive".into());
    }
    let max_jobs = spec.max_jobs.unwrap_or(100_000);
    if max_jobs == 0 {
        err.add("max_jobs", "must be at least 1".into());
    }
    let max_bytes = spec.max_bytes.map_or(256 << 20, |s| s.0);
    // A full job is its records plus a header and 4 bytes per record.
    let job_max = batch.max_bytes + 64 + 4 * u64::from(batch.max_records);
    if max_bytes < job_max {
        err.add(
            "max_bytes",
            format!(
                "{max_bytes} bytes cannot hold one full job of batch.max_bytes ({job_max} bytes with its framing)"
            ),
        );
    }
    if spec.ttl.is_some_and(|d| d.0.is_zero()) {
        err.add(
            "ttl",
            "must be positive (leave it out to keep jobs until delivered)".into(),
        );
    }
    let replay = compile_replay(&spec, &mut err);
    if spec.max_age.is_some_and(|d| d.0.is_zero()) {
        err.add("max_age", "must be positive".into());
    }
    let then = on_max_age(&name, spec.on_max_age.as_deref(), streams, &mut err);
    if spec.on_max_age.is_some() && spec.max_age.is_none() {
        err.add("on_max_age", "applies only with max_age".into());
    }
    let downsample = compile_downsample(&spec, &mut err);
    Some(StreamConfig {
        name,
        sink: spec.sink,
        batch,
        max_jobs: u64::from(max_jobs),
        max_bytes,
        when_full: match spec.when_full {
            WhenFullSpec::Block => WhenFull::Block,
            WhenFullSpec::DropOldest => WhenFull::DropOldest,
            WhenFullSpec::DropNewest => WhenFull::DropNewest,
            WhenFullSpec::Downsample => WhenFull::Downsample,
        },
        downsample,
        ttl: spec.ttl.map(|d| d.0),
        max_age: spec.max_age.map(|d| MaxAge { age: d.0, then }),
        dead_max_jobs: u64::from(spec.dead_letter.max_jobs.unwrap_or(10_000)),
        // `auto` becomes `Always` when the sink sends zstd bodies (`config::compile` knows it).
        compression: match spec.compression {
            AtRestSpec::Auto => AtRest::Waiting,
            AtRestSpec::Zstd => AtRest::Always,
            AtRestSpec::None => AtRest::Plain,
        },
        replay,
        hold_until_clock_synced: spec.hold_until_clock_synced,
    })
}

/// `downsample:` with `when_full: downsample` (the sink's precision is set by
/// `config::compile_streams`, which refuses a sink that does not take line protocol).
fn compile_downsample(spec: &StreamSpec, err: &mut Problems<'_>) -> Option<Downsample> {
    let Some(ds) = &spec.downsample else {
        if spec.when_full == WhenFullSpec::Downsample {
            return Some(Downsample::default());
        }
        return None;
    };
    if spec.when_full != WhenFullSpec::Downsample {
        err.add(
            "downsample",
            "applies only with when_full: downsample".into(),
        );
        return None;
    }
    let window = ds.window.map_or(Duration::from_secs(60), |d| d.0);
    if window < Duration::from_secs(1) {
        err.add("downsample.window", "must be at least 1s".into());
    }
    let ladder: Vec<Duration> = match &ds.ladder {
        Some(l) => l.iter().map(|d| d.0).collect(),
        None => vec![window * 10, window * 60],
    };
    let mut windows = vec![window];
    for (i, w) in ladder.into_iter().enumerate() {
        let last = *windows.last().expect("starts with the window");
        if w <= last || w.as_millis() % last.as_millis().max(1) != 0 {
            err.add(
                &format!("downsample.ladder[{i}]"),
                format!(
                    "must be a multiple of the window before it ({}s) and longer",
                    last.as_secs_f64()
                ),
            );
        }
        windows.push(w);
    }
    let keep = ds.keep.as_ref().map_or(Keep::ALL, |k| Keep {
        last: k.contains(&KeepSpec::Last),
        min: k.contains(&KeepSpec::Min),
        max: k.contains(&KeepSpec::Max),
        mean: k.contains(&KeepSpec::Mean),
    });
    Some(Downsample {
        windows,
        keep,
        ..Downsample::default()
    })
}

/// `on_max_age`: `drop`, or `stream:NAME` naming another declared stream.
fn on_max_age(
    name: &str,
    value: Option<&str>,
    streams: &[&str],
    err: &mut Problems<'_>,
) -> OnMaxAge {
    let target = match value {
        None | Some("drop") => return OnMaxAge::Drop,
        Some(v) => v.strip_prefix("stream:"),
    };
    match target {
        Some(t) if t == name => err.add(
            "on_max_age",
            format!("{t:?} is this stream: name another one (an archive)"),
        ),
        Some(t) if streams.contains(&t) => return OnMaxAge::Move(t.to_string()),
        Some(t) => err.add(
            "on_max_age",
            format!(
                "stream {t:?} is not defined under streams: (defined: {})",
                streams.join(", ")
            ),
        ),
        None => err.add(
            "on_max_age",
            format!(
                "{:?}: expected drop or stream:NAME",
                value.unwrap_or_default()
            ),
        ),
    }
    OnMaxAge::Drop
}

fn compile_replay(spec: &StreamSpec, err: &mut Problems<'_>) -> Replay {
    let live_first = spec.replay == ReplaySpec::LiveFirst;
    let live_window = spec.live_window.map_or(Replay::LIVE_WINDOW, |d| d.0);
    if live_window.is_zero() {
        err.add("live_window", "must be positive".into());
    }
    let backfill_share = spec.backfill_share.unwrap_or(Replay::BACKFILL_SHARE);
    if !(backfill_share > 0.0 && backfill_share <= 1.0) {
        err.add(
            "backfill_share",
            format!("{backfill_share} is not a share: give a number above 0, up to 1"),
        );
    }
    if spec.backfill_share.is_some() && !live_first {
        err.add(
            "backfill_share",
            "applies only with replay: live_first (oldest_first sends the backlog before anything newer)".into(),
        );
    }
    let priority = spec.priority.unwrap_or(0);
    if priority > 9 {
        err.add("priority", format!("{priority} is not a priority: 0 to 9"));
    }
    let min_share = spec.min_share.unwrap_or(Replay::MIN_SHARE);
    if !(min_share > 0.0 && min_share < 1.0) {
        err.add(
            "min_share",
            format!("{min_share} is not a share: give a number above 0, below 1"),
        );
    }
    Replay {
        live_first,
        live_window,
        backfill_share,
        priority,
        min_share,
    }
}

/// `when_full: downsample` aggregates line-protocol points: the stream's sink must take them, and
/// its precision is the unit of their timestamps.
pub(super) fn settle_downsample(
    streams: &mut [StreamConfig],
    sinks: &[Arc<SinkConfig>],
    problems: &mut Problems<'_>,
) {
    let formats: Vec<RecordFormat> = streams
        .iter()
        .map(|s| stream_format(streams, sinks, &s.name))
        .collect();
    for (st, format) in streams.iter_mut().zip(formats) {
        let Some(ds) = &mut st.downsample else {
            continue;
        };
        match format {
            RecordFormat::LineProtocol(p) => {
                ds.ticks_per_second = p.from_unix_ms(1000).unwrap_or(1);
            }
            other => problems.add(
                &format!("streams.{}.when_full", st.name),
                format!(
                    "downsample aggregates metric records (line protocol), and this stream is delivered as {}{}",
                    other.describe(),
                    if st.sink.is_none() { " (it has no sink)" } else { "" }
                ),
            ),
        }
    }
}

/// A stream that moves too old jobs (`on_max_age: stream:NAME`) moves them into a stream that
/// moves none on itself (a move is one step, never a loop), and whose sink takes its records as
/// they are (a moved job is not rewritten).
pub(super) fn check_moves(
    streams: &[StreamConfig],
    sinks: &[Arc<SinkConfig>],
    problems: &mut Problems<'_>,
) {
    let moves_to = |s: &StreamConfig| match &s.max_age {
        Some(crate::store::MaxAge {
            then: crate::store::OnMaxAge::Move(t),
            ..
        }) => Some(t.clone()),
        _ => None,
    };
    for s in streams {
        let Some(to) = moves_to(s) else { continue };
        let at = format!("streams.{}.on_max_age", s.name);
        let Some(target) = streams.iter().find(|t| t.name == to) else {
            continue; // said where the stream's own entry is compiled
        };
        if moves_to(target).is_some() {
            problems.add(
                &at,
                format!(
                    "stream {to:?} moves jobs on itself (its own on_max_age): moves are one step"
                ),
            );
        }
        let (from_format, to_format) = (
            stream_format(streams, sinks, &s.name),
            stream_format(streams, sinks, &to),
        );
        if to_format != RecordFormat::Lines && to_format != from_format {
            problems.add(
                &at,
                format!(
                    "stream {to:?} is delivered as {}, this one as {}: a moved job keeps its records",
                    to_format.describe(),
                    from_format.describe()
                ),
            );
        }
    }
}
