//! What the admin endpoint reads and the agent's main loop writes: [`AgentState`] holds the live
//! config and the sinks it started (swapped whole on reload), the task and source counters, the
//! config generation, the last reload's status and what readiness depends on; plus the reload request and its report that
//! travel between the endpoint and the main loop.
//!
//! It does not serve anything (the routes are in `admin`) nor render metrics (`admin::render`),
//! and it applies no reload itself: the agent owns the running parts. Built by `agent`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use tokio::sync::{mpsc, oneshot};

use crate::config::Config;
use crate::delivery::SinkRuntime;
use crate::metrics::Registry;
use crate::paused::Paused;
use crate::scheduler::SchedulerHandle;
use crate::source::SourceStats;
use crate::source::ingest::IngestStats;
use crate::store::writer::StoreHandle;
use crate::task::TaskStats;

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
    /// The last applied reload left settings that need a restart.
    pub restart_pending: AtomicBool,
    /// Unix seconds of the last successful (or the start) and failed reload; 0 when none.
    pub last_success_s: AtomicU64,
    pub last_failure_s: AtomicU64,
    /// Set when the stop begins: `/readyz` says so.
    pub stopping: AtomicBool,
    /// Cleared if the scheduler ends.
    pub scheduler_running: AtomicBool,
    pub reloads: mpsc::Sender<ReloadRequest>,
    /// The counters of tasks and sources, by name (the agent's: it hands them out when it
    /// builds a task or a source).
    pub task_stats: Arc<Registry<TaskStats>>,
    pub source_stats: Arc<SourceStats>,
    /// Where a run asked for now goes.
    pub scheduler: SchedulerHandle,
    /// The ingest API's counters, when it runs.
    pub ingest: Option<Arc<IngestStats>>,
    /// Streams the operator paused.
    pub paused: Arc<Paused>,
}

/// The counters and controls the agent owns and hands to the parts it builds, which the endpoint
/// reads (and, for `paused`, changes).
pub struct Handles {
    pub tasks: Arc<Registry<TaskStats>>,
    pub sources: Arc<SourceStats>,
    pub ingest: Option<Arc<IngestStats>>,
    pub paused: Arc<Paused>,
}

impl AgentState {
    pub fn new(
        config: Arc<Config>,
        sinks: Vec<Arc<SinkRuntime>>,
        store: Option<StoreHandle>,
        reloads: mpsc::Sender<ReloadRequest>,
        scheduler: SchedulerHandle,
        handles: Handles,
    ) -> AgentState {
        let now = unix_s(SystemTime::now());
        AgentState {
            started: SystemTime::now(),
            live: ArcSwap::from_pointee(Live { config, sinks }),
            store,
            generation: AtomicU64::new(1),
            last_reload_ok: AtomicBool::new(true),
            restart_pending: AtomicBool::new(false),
            last_success_s: AtomicU64::new(now),
            last_failure_s: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
            scheduler_running: AtomicBool::new(true),
            reloads,
            task_stats: handles.tasks,
            source_stats: handles.sources,
            scheduler,
            ingest: handles.ingest,
            paused: handles.paused,
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

pub(super) fn unix_s(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
