//! What a stream may hold and how it behaves when full ([`StreamConfig`], [`BatchConfig`],
//! [`WhenFull`]), the store-wide bounds ([`StorageConfig`]), and a stream's state while the store is
//! open (its counters, the jobs in flight, the names of its three tables). Built by
//! `config::compile`; read by the store. It does not touch the database.

use std::collections::HashSet;
use std::time::Duration;

use redb::TableDefinition;

use super::counters::Counters;
use super::lanes::Lanes;

/// What a stream may hold and how it behaves when full. Built by `config::compile`.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamConfig {
    pub name: String,
    /// The sink's name, when the stream is delivered.
    pub sink: Option<String>,
    pub batch: BatchConfig,
    pub max_jobs: u64,
    pub max_bytes: u64,
    pub when_full: WhenFull,
    pub ttl: Option<Duration>,
    /// Jobs older than this when a take comes are never handed out: deleted (counted as expired)
    /// or moved to another stream.
    pub max_age: Option<MaxAge>,
    pub dead_max_jobs: u64,
    /// When jobs are stored compressed.
    pub compression: AtRest,
    /// In which order a backlog is handed out, and where the live lane ends.
    pub replay: Replay,
    /// With `when_full: downsample`: how.
    pub downsample: Option<Downsample>,
    /// Jobs appended while the wall clock is unsynchronised carry a clock stamp, and the stream
    /// is not delivered until it is synchronised and their times are corrected.
    pub hold_until_clock_synced: bool,
}

/// A stream's `max_age` and what becomes of a job older than it when a take comes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaxAge {
    pub age: Duration,
    pub then: OnMaxAge,
}

/// What becomes of a job older than its stream's `max_age`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnMaxAge {
    /// Deleted, counted as expired.
    Drop,
    /// Moved, with its idempotency key, to the ready queue of the named stream (which moves
    /// nothing on itself), counted out here and in there.
    Move(String),
}

/// In which order a stream's queue is handed out once a backlog exists, and its priority among
/// the streams of its sink. A job younger than
/// `live_window` is *live*; an older one is *backlog* (and marked replayed when it is sent, in
/// either order).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Replay {
    /// `live_first`: the live lane is handed out first (oldest first within it), the backlog
    /// behind it; `oldest_first` (false): the whole queue oldest first.
    pub live_first: bool,
    pub live_window: Duration,
    /// `live_first`: of the bytes taken while both lanes wait, the backlog's least share, so a
    /// busy present never starves the past. In (0, 1].
    pub backfill_share: f64,
    /// Between the streams of one sink, higher first (0-9; 0 when unset). A sink whose streams
    /// all have the same one sends as they come.
    pub priority: u8,
    /// The least share of the sink's bytes this stream gets while a higher-priority one is busy.
    pub min_share: f64,
}

impl Replay {
    /// Jobs younger than 10 s are live: a healthy link sends a job within its batch's linger (1 s
    /// by default) and one round trip, so a job older than that was held back by an outage or a
    /// slow link; 10 s leaves room for a slow request without calling the present the past.
    pub const LIVE_WINDOW: Duration = Duration::from_secs(10);
    /// A quarter of the link for the backlog while live data would take it all: live data
    /// is usually a small part of the link, so the backlog normally gets far more.
    pub const BACKFILL_SHARE: f64 = 0.25;

    /// A tenth of the sink for a lower-priority stream while a higher one is busy: delayed,
    /// never starved.
    pub const MIN_SHARE: f64 = 0.1;

    /// Today's order: oldest first, the default window, no priority.
    pub const OLDEST_FIRST: Replay = Replay {
        live_first: false,
        live_window: Replay::LIVE_WINDOW,
        backfill_share: Replay::BACKFILL_SHARE,
        priority: 0,
        min_share: Replay::MIN_SHARE,
    };

    /// Whether a job created at `created_ms` is backlog at `now_ms`.
    pub fn is_backlog(&self, created_ms: u64, now_ms: u64) -> bool {
        now_ms.saturating_sub(created_ms) > self.window_ms()
    }

    pub(super) fn window_ms(&self) -> u64 {
        u64::try_from(self.live_window.as_millis()).unwrap_or(u64::MAX)
    }
}

/// When a stream's jobs are stored compressed (zstd, see `codec`): the disk and the flash's
/// wear against the CPU of compressing a job that is sent moments after its commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtRest {
    /// Never (`compression: none`).
    Plain,
    /// Every job (`compression: zstd`; and `auto` when the sink sends zstd bodies, since the
    /// stored frame is then sent as it is and the sink compresses nothing itself).
    Always,
    /// Jobs appended while at least [`WAITING_JOBS`] jobs wait that no worker has taken (`auto`):
    /// a backlog that builds while the link is down or slow is compressed, a stream that is sent
    /// as fast as it comes passes through.
    Waiting,
}

/// Jobs waiting (queued and not in flight) from which `auto` compresses new ones. A delivery
/// worker takes what waits (up to 16 jobs or 512 KiB) as soon as its last request is answered,
/// so a stream that keeps up rarely has this many waiting, and one whose link is down or slow
/// soon has more.
pub const WAITING_JOBS: u64 = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchConfig {
    pub max_records: u32,
    pub max_bytes: u64,
    /// How long a source may hold records back to fill a job (used by sources, not here).
    pub linger: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StorageConfig {
    /// Bytes of job values across all streams (ready, retry and dead).
    pub max_bytes: u64,
    /// Free bytes the filesystem keeps; below it every stream is full.
    pub min_free: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenFull {
    Block,
    DropOldest,
    DropNewest,
    /// The oldest jobs are replaced by aggregates (see [`Downsample`]).
    Downsample,
}

/// `when_full: downsample`: the windows, finest first (a ladder), the aggregates written, and the
/// unit of the records' timestamps (per second: the sink's precision).
#[derive(Debug, Clone, PartialEq)]
pub struct Downsample {
    pub windows: Vec<Duration>,
    pub keep: crate::scrape::downsample::Keep,
    pub ticks_per_second: i64,
}

impl Default for Downsample {
    fn default() -> Self {
        Downsample {
            windows: [60, 600, 3600].map(Duration::from_secs).to_vec(),
            keep: crate::scrape::downsample::Keep::ALL,
            ticks_per_second: 1_000_000_000,
        }
    }
}

impl Downsample {
    /// Window `level` (1 for the first) in the records' timestamp unit.
    pub fn ticks(&self, level: usize) -> i64 {
        let w = i64::try_from(self.windows[level - 1].as_millis()).unwrap_or(i64::MAX);
        (w / 1000)
            .saturating_mul(self.ticks_per_second)
            .saturating_add(w % 1000 * self.ticks_per_second / 1000)
    }
}

impl std::fmt::Display for WhenFull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WhenFull::Block => "block",
            WhenFull::DropOldest => "drop_oldest",
            WhenFull::DropNewest => "drop_newest",
            WhenFull::Downsample => "downsample",
        })
    }
}
pub(super) struct StreamState {
    pub(super) cfg: StreamConfig,
    pub(super) counters: Counters,
    /// Jobs handed out and not yet acknowledged, failed or released. Not persisted: after a crash
    /// they are simply ready again (at-least-once).
    pub(super) in_flight: HashSet<u64>,
    /// Where the live lane begins and what each lane was given (`live_first` streams).
    pub(super) lanes: Lanes,
    pub(super) ready: String,
    pub(super) retry: String,
    pub(super) dead: String,
}

impl StreamState {
    /// Jobs no worker has taken yet: what `compression: auto` calls a backlog.
    pub(super) fn waiting(&self) -> u64 {
        (self.counters.ready_jobs + self.counters.retry_jobs)
            .saturating_sub(self.in_flight.len() as u64)
    }

    pub(super) fn new(cfg: StreamConfig) -> Self {
        StreamState {
            ready: format!("ready/{}", cfg.name),
            retry: format!("retry/{}", cfg.name),
            dead: format!("dead/{}", cfg.name),
            cfg,
            counters: Counters::default(),
            in_flight: HashSet::new(),
            lanes: Lanes::default(),
        }
    }

    pub(super) fn ready_def(&self) -> TableDefinition<'_, u64, &'static [u8]> {
        TableDefinition::new(&self.ready)
    }
    pub(super) fn retry_def(&self) -> TableDefinition<'_, (u64, u64), &'static [u8]> {
        TableDefinition::new(&self.retry)
    }
    pub(super) fn dead_def(&self) -> TableDefinition<'_, u64, &'static [u8]> {
        TableDefinition::new(&self.dead)
    }
}
