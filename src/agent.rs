//! `colibri run`: wires the parts together for one life of the process and owns them while it
//! runs. It creates the data directory, opens the store (when streams are configured) and starts its
//! writer, starts the sinks (a link monitor and upload workers each), the producers (ingest, tail
//! sources), the wall-clock watcher, the scheduler and the admin endpoint, tells systemd it is
//! ready, and then runs the main loop: signals, reloads (SIGHUP or `POST /-/reload`) and the
//! systemd watchdog.
//!
//! A reload loads and checks the whole file; any problem keeps the running config (every problem
//! logged, `colibri_config_last_reload_successful 0`). A valid file is applied by difference
//! ([`crate::reload::plan`]): changed and added tasks are re-planned (a run in progress finishes
//! with its old definition), removed ones forgotten; changed sinks and sources are stopped (their
//! requests in progress and checkpoints finish) and started again with the new settings, untouched
//! ones keep running; settings that shape storage or listeners log "needs restart" and keep their
//! values. Stream data is never touched by a reload.
//!
//! The stop: the first SIGTERM or SIGINT stops intake and scheduling (ingest answers 503, sources
//! commit their checkpoints), gives running tasks and requests in progress `shutdown_grace`,
//! leaves the rest queued, closes the store cleanly, flushes the log and exits 0; a second signal
//! kills every task's process group and exits at once. It owns no policy of its own.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use anyhow::Context as _;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::admin::{AgentState, Live, ReloadReport, ReloadRequest, ReloadResult};
use crate::clock::{self, SystemClock};
use crate::config::Config;
use crate::delivery::{SinkRuntime, SinkStats};
use crate::metrics::Registry;
use crate::net::tls_server::ServerTls;
use crate::notify::notify;
use crate::reload::Changes;
use crate::scheduler::{Change, Drained, Scheduler, SchedulerHandle};
use crate::source::SourceStats;
use crate::store::{self, Store, writer};
use crate::task::{RunContext, TaskDef};
use crate::units::fmt_duration;

/// Exit status after a second stop signal cut the grace short.
pub const EXIT_FORCED: i32 = 1;
/// How long a watchdog check waits for the store writer's answer.
const WATCHDOG_STORE_WAIT: Duration = Duration::from_millis(500);
/// How long the stop waits for the store writer's final counters (for the delivery summary).
const SUMMARY_WAIT: Duration = Duration::from_secs(5);

pub async fn run(config: Config) -> anyhow::Result<()> {
    // Signals first: a SIGTERM during start-up then stops colibri cleanly instead of killing it.
    let signals = Signals::install()?;
    store::create_data_dir(&config.data_dir)
        .with_context(|| format!("cannot create data_dir {}", config.data_dir.display()))?;
    let store_handle = open_store(&config)?;
    if let Some(handle) = &store_handle {
        salvage_damaged(handle, &config);
    }

    let ctx = RunContext {
        stopping: Default::default(),
        abort: Default::default(),
        groups: Default::default(),
        store: store_handle,
    };
    // Summaries of repeated log events (refused requests, dropped dead letters) are written as
    // their intervals end.
    tokio::spawn(crate::logging::summary::run());
    let clock_set = Arc::new(Notify::new());
    if let Err(e) = clock::watch_wall_clock(Arc::clone(&clock_set)) {
        tracing::warn!(error = %e, "cannot watch for wall-clock changes; jumps are noticed within an hour");
    }
    let (mut process, scheduler) =
        Process::start(Arc::new(config), ctx, signals, clock_set).await?;
    let config = &process.agent.config;
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        config = %config.source.display(),
        tasks = config.tasks.len(),
        workers = config.workers,
        "colibri started"
    );
    notify("READY=1\nSTATUS=serving");
    release_startup_memory();
    let scheduler = scheduler.run();
    tokio::pin!(scheduler);
    let mut watchdog = Watchdog::new();
    let first = process.serve(scheduler.as_mut(), &mut watchdog).await?;
    process.stop(first, scheduler, &mut watchdog).await
}

/// The signals colibri acts on, installed before anything else starts.
struct Signals {
    term: Signal,
    int: Signal,
    hup: Signal,
}

impl Signals {
    fn install() -> anyhow::Result<Self> {
        Ok(Self {
            term: signal(SignalKind::terminate()).context("cannot install the SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("cannot install the SIGINT handler")?,
            hup: signal(SignalKind::hangup()).context("cannot install the SIGHUP handler")?,
        })
    }

    /// The next stop signal (SIGTERM or SIGINT), by name (the second one, during the stop).
    async fn stop(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

/// systemd's watchdog, when it asks for one: a beat at its interval.
struct Watchdog {
    on: bool,
    beat: tokio::time::Interval,
}

impl Watchdog {
    fn new() -> Self {
        let interval = crate::notify::watchdog_interval();
        Self {
            on: interval.is_some(),
            beat: tokio::time::interval(interval.unwrap_or(Duration::from_secs(3600))),
        }
    }
}

/// One life of the process once started: the agent, and what only the main loop and the stop
/// use.
struct Process {
    agent: Agent,
    ctx: RunContext,
    signals: Signals,
    /// `POST /-/reload`'s requests.
    reloads: mpsc::Receiver<ReloadRequest>,
    /// The admin endpoint's server, until `admin_stop`.
    admin: Option<JoinHandle<()>>,
    admin_stop: CancellationToken,
}

impl Process {
    /// Starts the parts, the scheduler (returned, to be run) and the admin endpoint.
    async fn start(
        config: Arc<Config>,
        ctx: RunContext,
        signals: Signals,
        clock_set: Arc<Notify>,
    ) -> anyhow::Result<(Self, Scheduler)> {
        // The agent owns the task and source counters: they outlive the tasks and sources a reload
        // replaces, and the metrics page reads them from the state.
        let task_stats = Arc::new(Registry::default());
        let source_stats = Arc::new(SourceStats::default());
        // Held streams are held before their workers start, and the clock is asked before the
        // first append (whose jobs it stamps when unsynchronised).
        let paused = Arc::new(crate::paused::Paused::default());
        let held = config
            .streams
            .iter()
            .filter(|s| s.hold_until_clock_synced)
            .map(|s| s.name.clone())
            .collect();
        crate::clock_hold::start(held, ctx.store.clone(), &paused, ctx.stopping.clone());
        let parts = Parts::start(
            &config,
            ctx.store.clone(),
            &ctx.stopping,
            Arc::clone(&source_stats),
            paused,
        )
        .await?;
        let (scheduler, tasks) = Scheduler::new(
            &config.tasks,
            Arc::new(SystemClock),
            ctx.clone(),
            config.workers,
            config.shutdown_grace,
            clock_set,
            Arc::clone(&task_stats),
        );
        let (reload_tx, reloads) = mpsc::channel(4);
        let state = Arc::new(AgentState::new(
            Arc::clone(&config),
            parts.runtimes(),
            ctx.store.clone(),
            reload_tx,
            tasks.clone(),
            crate::admin::Handles {
                tasks: task_stats,
                sources: source_stats,
                ingest: parts
                    .ingest
                    .as_ref()
                    .map(crate::source::ingest::Running::stats),
                paused: Arc::clone(&parts.paused),
            },
        ));
        let admin_stop = CancellationToken::new();
        let admin = match &config.admin {
            Some(a) => Some(
                crate::admin::start(a.clone(), Arc::clone(&state), admin_stop.clone())
                    .await?
                    .1,
            ),
            None => None,
        };
        let agent = Agent {
            config,
            parts,
            tasks,
            state,
            store: ctx.store.clone(),
            stopping: ctx.stopping.clone(),
        };
        let process = Self {
            agent,
            ctx,
            signals,
            reloads,
            admin,
            admin_stop,
        };
        Ok((process, scheduler))
    }

    /// The main loop, until the first stop signal (its name): reloads and watchdog beats.
    async fn serve(
        &mut self,
        mut scheduler: Pin<&mut impl Future<Output = Drained>>,
        watchdog: &mut Watchdog,
    ) -> anyhow::Result<&'static str> {
        loop {
            tokio::select! {
                _ = self.signals.term.recv() => return Ok("SIGTERM"),
                _ = self.signals.int.recv() => return Ok("SIGINT"),
                _ = self.signals.hup.recv() => {
                    let _ = self.agent.reload().await;
                }
                Some(req) = self.reloads.recv() => {
                    let r = self.agent.reload().await;
                    let _ = req.reply.send(r);
                }
                _ = watchdog.beat.tick(), if watchdog.on => {
                    // Bounded, so signals and reloads are never held up for long: a writer that
                    // misses one beat is retried at the next, and one that is stuck for WatchdogSec
                    // gets colibri restarted.
                    if self.agent.state.not_ready(WATCHDOG_STORE_WAIT).await.is_none() {
                        notify("WATCHDOG=1");
                    }
                }
                _ = &mut scheduler => {
                    self.agent.state.scheduler_running.store(false, Relaxed);
                    anyhow::bail!("the scheduler stopped on its own");
                }
            }
        }
    }

    /// The stop after the `first` signal: no new runs or intake, the rest within the grace
    /// ([`wind_down`]); a second signal kills every task's process group and exits at once.
    async fn stop(
        self,
        first: &str,
        scheduler: Pin<&mut impl Future<Output = Drained>>,
        watchdog: &mut Watchdog,
    ) -> anyhow::Result<()> {
        let Self {
            mut agent,
            ctx,
            mut signals,
            admin,
            admin_stop,
            ..
        } = self;
        agent.state.stopping.store(true, Relaxed);
        notify("STOPPING=1\nSTATUS=stopping");
        let grace = agent.config.shutdown_grace;
        tracing::info!(
            signal = first,
            grace = %fmt_duration(grace),
            "stopping: no new task runs or intake; a second signal kills running tasks at once"
        );
        ctx.stopping.cancel();
        if let Some(handle) = &agent.store {
            // Appends waiting for room in a full `block` stream are answered "stopping" now rather
            // than holding the stop for their whole wait.
            handle.stop_waiting();
        }
        let stop = wind_down(&mut agent, scheduler, admin, &admin_stop);
        tokio::pin!(stop);
        loop {
            tokio::select! {
                drained = &mut stop => {
                    tracing::info!(killed = drained.killed, "colibri stopped");
                    return Ok(());
                }
                second = signals.stop() => {
                    let n = ctx.groups.signal_all(libc::SIGKILL);
                    tracing::error!(signal = second, killed_groups = n, "second signal: exiting now");
                    crate::logging::exit(EXIT_FORCED);
                }
                // A stop within the grace is still a live process: systemd must not kill it for it.
                _ = watchdog.beat.tick(), if watchdog.on => notify("WATCHDOG=1"),
            }
        }
    }
}

/// The stop's orderly part, once intake and firing have stopped: the scheduler drains its runs,
/// the parts end, the store closes, then the ingest listener and the admin endpoint.
async fn wind_down(
    agent: &mut Agent,
    scheduler: Pin<&mut impl Future<Output = Drained>>,
    admin: Option<JoinHandle<()>>,
    admin_stop: &CancellationToken,
) -> Drained {
    let drained = scheduler.await;
    // Intake has stopped (ingest answers 503, sources commit their checkpoints); requests in
    // progress finish within the grace; then the store closes cleanly.
    let runtimes = agent.parts.runtimes();
    agent.parts.join().await;
    if let Some(handle) = &agent.store {
        let snap = tokio::time::timeout(SUMMARY_WAIT, handle.snapshot())
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
        for rt in &runtimes {
            log_summary(rt, &snap);
        }
        handle.shutdown().await;
    }
    // Until here a new ingest request got 503 rather than a refused connection.
    agent.parts.close_ingest().await;
    admin_stop.cancel();
    if let Some(a) = admin {
        let _ = a.await;
    }
    crate::logging::summary::flush();
    drained
}

/// The running parts the main loop owns and a reload changes.
struct Agent {
    /// What runs now (the file as last applied, with restart-only settings as started).
    config: Arc<Config>,
    parts: Parts,
    tasks: SchedulerHandle,
    state: Arc<AgentState>,
    store: Option<writer::StoreHandle>,
    stopping: CancellationToken,
}

/// Gives back what start-up or a reload used and the running agent does not. The heap they freed:
/// after the config was compiled (when `cli` trims once), building the parts read and parsed TLS
/// files and certificates, the config check built its own clients, the store read its file; in
/// glibc's heaps below live data, that stayed resident (0.4 MB of an idle agent's 0.75 MB heap
/// with a tail source and an HTTP sink). And the mapping of the code only they ran (see
/// `memory::release_code`): 1.0-1.2 MB of the 6.2 MB of the binary mapped then.
fn release_startup_memory() {
    crate::memory::give_back();
}

impl Agent {
    /// Loads the file again and applies what changed, all or nothing.
    async fn reload(&mut self) -> ReloadResult {
        crate::notify::reloading();
        let result = self.try_reload().await;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        match &result {
            Ok(report) => {
                self.state.last_reload_ok.store(true, Relaxed);
                self.state.last_success_s.store(now, Relaxed);
                tracing::info!(
                    generation = report.generation,
                    changes = report.changes.len(),
                    sha256 = %self.config.sha256,
                    "config reloaded"
                );
            }
            Err(refusal) => {
                self.state.last_reload_ok.store(false, Relaxed);
                self.state.last_failure_s.store(now, Relaxed);
                // One line in the text format too: a multi-line event would be cut into
                // unrelated lines by journald and by anything that reads the log line by line.
                tracing::error!(
                    config = %self.config.source.display(),
                    count = refusal.problems.len(),
                    problems = %refusal.problems.join("; "),
                    "reload refused: the running config stays"
                );
            }
        }
        notify("READY=1\nSTATUS=serving");
        release_startup_memory();
        result.map_err(|r| r.text)
    }

    async fn try_reload(&mut self) -> Result<ReloadReport, Refusal> {
        let new = crate::config::load(&self.config.source).map_err(|e| Refusal {
            text: e.to_string(),
            problems: e.lines(),
        })?;
        // The listeners' TLS files were read again by the load: what the running listeners take
        // when they are the same files (other files need a restart, as the rest of the section).
        let fresh_tls = [
            new.ingest.as_ref().and_then(|i| i.tls.clone()),
            new.admin.as_ref().and_then(|a| a.tls.clone()),
        ];
        let plan = crate::reload::plan(&self.config, new);
        let effective = Arc::new(plan.effective);
        // Everything that can still fail comes first (building a sink reads its TLS files), so a
        // refused reload has changed nothing.
        let built = self.build_sinks(&plan.sinks, &effective)?;
        let mut changes = Vec::new();
        self.reread_certificates(&fresh_tls, &mut changes);
        self.hold_for_restart(&plan.needs_restart, &mut changes);
        self.apply_tasks(&plan.tasks, &mut changes);
        self.apply_sinks(&plan.sinks, built, &effective, &mut changes);
        self.apply_sources(&plan.sources, &effective, &mut changes);
        Ok(self.publish(effective, changes))
    }

    /// The sinks a reload starts or restarts, built from `effective` (none without a store); the
    /// first that cannot be built refuses the reload.
    fn build_sinks(
        &self,
        sinks: &Changes<String>,
        effective: &Config,
    ) -> Result<BTreeMap<String, crate::sink::Sink>, Refusal> {
        let mut built = BTreeMap::new();
        if self.store.is_none() {
            return Ok(built);
        }
        for name in sinks.added.iter().chain(&sinks.changed) {
            if let Some(cfg) = effective.sinks.iter().find(|s| &s.name == name) {
                let sink = crate::sink::Sink::new(Arc::clone(cfg)).map_err(|e| {
                    let problem = format!("sinks.{name}: {e}");
                    Refusal {
                        text: problem.clone(),
                        problems: vec![problem],
                    }
                })?;
                built.insert(name.clone(), sink);
            }
        }
        Ok(built)
    }

    /// A running listener whose TLS files are the same takes what the reload read from them.
    fn reread_certificates(&self, fresh_tls: &[Option<ServerTls>; 2], changes: &mut Vec<String>) {
        let running_tls = [
            (
                "ingest",
                self.config.ingest.as_ref().and_then(|i| i.tls.as_ref()),
            ),
            (
                "admin",
                self.config.admin.as_ref().and_then(|a| a.tls.as_ref()),
            ),
        ];
        for ((listener, running), fresh) in running_tls.into_iter().zip(fresh_tls) {
            if let (Some(running), Some(fresh)) = (running, fresh)
                && running == fresh
            {
                running.replace_with(fresh);
                tracing::info!(listener, cert_file = %fresh.files.cert_file.display(), "certificate read again: new connections get it");
                changes.push(format!("{listener}.tls: certificate read again"));
            }
        }
    }

    /// Settings that changed but keep their running value: logged, and shown by the metrics.
    fn hold_for_restart(&self, needs_restart: &[String], changes: &mut Vec<String>) {
        self.state
            .restart_pending
            .store(!needs_restart.is_empty(), Relaxed);
        for key in needs_restart {
            tracing::warn!(setting = %key, "changed in the file, needs restart: the running value stays until then");
            changes.push(format!("{key}: needs restart (the running value stays)"));
        }
    }

    /// Removed tasks forgotten, added and changed ones (re-)planned by the scheduler.
    fn apply_tasks(&self, tasks: &Changes<Arc<TaskDef>>, changes: &mut Vec<String>) {
        for name in &tasks.removed {
            self.tasks.send(Change::Remove(name.clone()));
            self.state.task_stats.forget(name);
            changes.push(format!("task {name}: removed"));
        }
        for (what, defs) in [("added", &tasks.added), ("changed", &tasks.changed)] {
            for def in defs {
                self.tasks.send(Change::Upsert(Arc::clone(def)));
                changes.push(format!("task {}: {what}", def.name));
            }
        }
    }

    /// Removed sinks stopped, added and changed ones started with what [`Agent::build_sinks`]
    /// built (a sink no longer built is stopped).
    fn apply_sinks(
        &mut self,
        sinks: &Changes<String>,
        mut built: BTreeMap<String, crate::sink::Sink>,
        effective: &Config,
        changes: &mut Vec<String>,
    ) {
        let Some(store) = &self.store else {
            return;
        };
        for name in &sinks.removed {
            self.parts.stop_sink(name);
            changes.push(format!("sink {name}: stopped"));
        }
        for (what, names) in [("started", &sinks.added), ("restarted", &sinks.changed)] {
            for name in names {
                match built.remove(name) {
                    Some(sink) => self
                        .parts
                        .start_sink(effective, sink, store, &self.stopping),
                    None => self.parts.stop_sink(name),
                }
                changes.push(format!("sink {name}: {what}"));
            }
        }
    }

    /// Removed sources stopped, added and changed ones (re)started.
    fn apply_sources(
        &mut self,
        sources: &Changes<String>,
        effective: &Config,
        changes: &mut Vec<String>,
    ) {
        let Some(store) = &self.store else {
            return;
        };
        for name in &sources.removed {
            self.parts.stop_source(name);
            changes.push(format!("source {name}: stopped"));
        }
        for (what, names) in [("started", &sources.added), ("restarted", &sources.changed)] {
            for name in names {
                self.parts
                    .start_source(effective, name, store, &self.stopping, Default::default());
                changes.push(format!("source {name}: {what}"));
            }
        }
    }

    /// The reload's config becomes the running one, for the next reload and for the endpoint.
    fn publish(&mut self, effective: Arc<Config>, changes: Vec<String>) -> ReloadReport {
        let generation = self.state.generation.fetch_add(1, Relaxed) + 1;
        self.config = Arc::clone(&effective);
        self.state.live.store(Arc::new(Live {
            config: effective,
            sinks: self.parts.runtimes(),
        }));
        for c in &changes {
            tracing::info!(generation, change = %c, "reload");
        }
        ReloadReport {
            generation,
            changes,
        }
    }
}

/// Why a reload was refused: the admin endpoint's answer (the problems a line each) and the
/// same problems for the log.
struct Refusal {
    text: String,
    problems: Vec<String>,
}

/// One sink at run time: its runtime (shared with the metrics) and the task that runs its link
/// monitor and workers until its own stop (a child of colibri's).
struct SinkGroup {
    rt: Arc<SinkRuntime>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

struct SourceGroup {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// Everything that runs beside the scheduler.
#[derive(Default)]
struct Parts {
    sinks: BTreeMap<String, SinkGroup>,
    sources: BTreeMap<String, SourceGroup>,
    ingest: Option<crate::source::ingest::Running>,
    /// Every source's counters, by kind and name (also read by the metrics page): a source
    /// restarted by a reload, or removed and added again, goes on counting into the same ones.
    source_stats: Arc<SourceStats>,
    /// Groups stopped by a reload, still finishing their work: awaited at the stop.
    retired: Vec<JoinHandle<()>>,
    /// Streams the operator paused or held for the clock (kept across reloads, which rebuild
    /// the sinks' runtimes).
    paused: Arc<crate::paused::Paused>,
}

impl Parts {
    async fn start(
        config: &Config,
        store: Option<writer::StoreHandle>,
        stopping: &CancellationToken,
        source_stats: Arc<SourceStats>,
        paused: Arc<crate::paused::Paused>,
    ) -> anyhow::Result<Parts> {
        let mut parts = Parts {
            source_stats,
            paused,
            ..Parts::default()
        };
        let Some(store) = store else {
            return Ok(parts);
        };
        for cfg in &config.sinks {
            let sink = crate::sink::Sink::new(Arc::clone(cfg))
                .map_err(|e| anyhow::anyhow!("sinks.{}: {e}", cfg.name))?;
            parts.start_sink(config, sink, &store, stopping);
        }
        // The ingest API is bound now, so a taken port stops the start.
        if let Some(ingest) = &config.ingest {
            let listen = ingest.listen;
            parts.ingest = Some(
                crate::source::ingest::start(ingest.clone(), store.clone(), stopping.clone())
                    .await
                    .with_context(|| format!("cannot start the ingest API on {listen}"))?,
            );
        }
        // Every listener is bound before anything runs, so a taken port stops the start, naming
        // the source and the address, as ingest's and admin's do.
        let mut sockets = Vec::new();
        for source in &config.sources {
            let bound = source
                .bind()
                .with_context(|| format!("cannot start source {}", source.name()))?;
            sockets.push(bound);
        }
        for (source, bound) in config.sources.iter().zip(sockets) {
            parts.start_source(config, source.name(), &store, stopping, bound);
        }
        Ok(parts)
    }

    fn runtimes(&self) -> Vec<Arc<SinkRuntime>> {
        self.sinks.values().map(|g| Arc::clone(&g.rt)).collect()
    }

    /// Starts (or, when it runs, restarts) `sink` with the streams of `config` that deliver to it;
    /// a sink no stream uses is not started. A restarted sink's workers begin once the old ones
    /// have finished their requests; its counters carry over.
    fn start_sink(
        &mut self,
        config: &Config,
        sink: crate::sink::Sink,
        store: &writer::StoreHandle,
        stopping: &CancellationToken,
    ) {
        // A sink with a connection of its own (MQTT) opens it now, whether or not anything waits:
        // its status messages say the gateway is up.
        sink.start();
        let name = sink.name().to_string();
        let name = name.as_str();
        let streams: Vec<(String, crate::store::Replay, crate::store::BatchConfig)> = config
            .streams
            .iter()
            .filter(|s| s.sink.as_deref() == Some(name))
            .map(|s| (s.name.clone(), s.replay, s.batch))
            .collect();
        if streams.is_empty() {
            self.stop_sink(name);
            return;
        }
        let (stats, before) = match self.sinks.remove(name) {
            Some(old) => {
                old.stop.cancel();
                old.rt
                    .stats
                    .transitions_before
                    .store(old.rt.transitions(), Relaxed);
                (Arc::clone(&old.rt.stats), Some(old.task))
            }
            None => (Arc::new(SinkStats::default()), None),
        };
        let rt = Arc::new(SinkRuntime::new(
            Arc::new(sink),
            streams,
            config.shutdown_grace,
            stats,
            Arc::clone(&self.paused),
        ));
        let stop = stopping.child_token();
        let task = tokio::spawn(run_sink(
            Arc::clone(&rt),
            store.clone(),
            stop.clone(),
            before,
        ));
        self.sinks
            .insert(name.to_string(), SinkGroup { rt, stop, task });
    }

    fn stop_sink(&mut self, name: &str) {
        if let Some(old) = self.sinks.remove(name) {
            old.stop.cancel();
            self.retired.push(old.task);
        }
    }

    /// Starts (or restarts) the source `name` of `config`, on `sockets` when bound: a restarted
    /// one begins after the old one has ended (a tail source's checkpoint is committed, a
    /// listener's port let go).
    fn start_source(
        &mut self,
        config: &Config,
        name: &str,
        store: &writer::StoreHandle,
        stopping: &CancellationToken,
        sockets: crate::source::Sockets,
    ) {
        let before = self.sources.remove(name).map(|old| {
            old.stop.cancel();
            old.task
        });
        let Some(source) = config.sources.iter().find(|s| s.name() == name) else {
            self.retired.extend(before);
            return;
        };
        let stop = stopping.child_token();
        let stats = Arc::clone(&self.source_stats);
        let (source, store, token) = (source.clone(), store.clone(), stop.clone());
        let task = tokio::spawn(async move {
            if let Some(old) = before {
                let _ = old.await;
            }
            source.run(&stats, store, token, sockets).await;
        });
        self.sources
            .insert(name.to_string(), SourceGroup { stop, task });
    }

    fn stop_source(&mut self, name: &str) {
        if let Some(old) = self.sources.remove(name) {
            old.stop.cancel();
            self.retired.push(old.task);
        }
    }

    /// Waits for everything to end (after colibri's stop was cancelled): intake first (ingest's
    /// requests in progress, sources), then the sinks' requests in progress. The ingest listener
    /// stays open (answering 503) until [`Parts::close_ingest`].
    async fn join(&mut self) {
        if let Some(i) = &self.ingest {
            i.drained().await;
        }
        for (_, g) in std::mem::take(&mut self.sources) {
            let _ = g.task.await;
        }
        for (_, g) in std::mem::take(&mut self.sinks) {
            let _ = g.task.await;
        }
        for t in self.retired.drain(..) {
            let _ = t.await;
        }
    }

    /// The end of the stop: the ingest listener closes.
    async fn close_ingest(&mut self) {
        if let Some(i) = self.ingest.take() {
            i.close().await;
        }
    }
}

/// One sink's life: after its previous runtime (a reload) has finished, its link monitor and
/// `concurrency` workers per stream, until `stop`.
async fn run_sink(
    rt: Arc<SinkRuntime>,
    store: writer::StoreHandle,
    stop: CancellationToken,
    before: Option<JoinHandle<()>>,
) {
    if let Some(old) = before {
        let _ = old.await;
    }
    if stop.is_cancelled() {
        return;
    }
    let mut tasks = vec![tokio::spawn(crate::link::monitor(
        Arc::clone(&rt.link),
        Arc::clone(&rt.sink),
        store.clone(),
        rt.streams.clone(),
        stop.clone(),
    ))];
    for stream in &rt.streams {
        tracing::info!(stream, sink = %rt.sink.describe(), concurrency = rt.sink.config.concurrency, "delivery started");
        for _ in 0..rt.sink.config.concurrency {
            tasks.push(tokio::spawn(crate::delivery::run(
                stream.clone(),
                Arc::clone(&rt),
                store.clone(),
                stop.clone(),
            )));
        }
    }
    for t in tasks {
        let _ = t.await;
    }
}

/// Opens the store and starts its writer thread; `None` when no stream is configured.
fn open_store(config: &Config) -> anyhow::Result<Option<writer::StoreHandle>> {
    if config.streams.is_empty() {
        return Ok(None);
    }
    let started = std::time::Instant::now();
    let (dir, storage, streams) = (
        config.data_dir.clone(),
        config.storage,
        config.streams.clone(),
    );
    let opened = Store::open_or_replace(&dir, storage, &streams, false).map_err(|e| {
        if e.names_file() {
            anyhow::Error::from(e)
        } else {
            anyhow::Error::from(e).context(format!("cannot open the store in {}", dir.display()))
        }
    })?;
    tracing::info!(
        path = %opened.path().display(),
        file_bytes = opened.file_bytes(),
        queued_bytes = opened.stored_bytes(),
        streams = streams.len(),
        duration_ms = started.elapsed().as_millis() as u64,
        "store opened"
    );
    // After a failure the file is verified page by page; a corrupted one is replaced.
    let reopen = Box::new(move || Store::open_or_replace(&dir, storage, &streams, true));
    let handle = writer::spawn(opened, reopen, writer::WriterOptions::default())
        .context("cannot start the store writer thread")?;
    Ok(Some(handle))
}

/// Puts the intact jobs of every damaged store file not yet salvaged back into the live store, on
/// a thread of its own: the file is read there and each chunk appended through the writer among
/// its other work, so the agent is in service (ready, taking appends, delivering) meanwhile. A
/// file whose salvage ended is renamed `….salvaged` (kept, and counted against the budget, until
/// an operator removes it); one whose salvage failed is tried again after a pause, and one cut
/// short goes on where it stopped at the next start (the store keeps its progress). A file the writer moves aside while running is
/// salvaged the same way as soon as the new one is open. Sources
/// whose checkpoint was in the damaged file read their files from the beginning (see `tail`).
fn salvage_damaged(handle: &writer::StoreHandle, config: &Config) {
    let streams: Vec<String> = config.streams.iter().map(|s| s.name.clone()).collect();
    let handle = handle.clone();
    let spawned = std::thread::Builder::new()
        .name("colibri-salvage".into())
        .spawn(move || {
            let names: Vec<&str> = streams.iter().map(String::as_str).collect();
            // The files damaged before this start, then each one the writer moves aside while
            // running (it replaces a file a request found damaged): this thread waits for those.
            // A salvage that failed (the writer reopening its file, a full disk) is tried again
            // after a pause that doubles up to 5 minutes; it goes on where it stopped.
            let mut replaced = handle.replacements();
            let mut pause = Duration::from_secs(1);
            loop {
                let mut failed = false;
                for f in handle.damaged_files().into_iter().filter(|f| !f.salvaged) {
                    failed |= !salvage_one(&handle, &f, &names);
                }
                let limit = failed.then_some(pause);
                pause = if failed {
                    (pause * 2).min(Duration::from_secs(300))
                } else {
                    Duration::from_secs(1)
                };
                replaced = handle.wait_replaced(replaced, limit);
            }
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the salvage thread; it is tried again at the next start");
    }
}

/// Salvages one damaged file into the running store (see [`salvage_damaged`]); whether it ended.
fn salvage_one(handle: &writer::StoreHandle, f: &store::aside::AsideFile, names: &[&str]) -> bool {
    tracing::warn!(file = %f.path.display(), bytes = f.bytes, "salvaging the intact jobs of a damaged store file");
    let started = std::time::Instant::now();
    match store::salvage::salvage(&f.path, names, &mut writer::Restoring::new(handle, &f.path)) {
        Ok(report) => {
            use std::sync::atomic::Ordering::Relaxed;
            let stats = handle.stats();
            stats.salvaged_jobs.fetch_add(report.jobs, Relaxed);
            stats.salvaged_records.fetch_add(report.records, Relaxed);
            // Jobs the scan saw and could not put back; the records lost are what the counters
            // booked (`lost_to_damage_records`), which also counts what left no trace (a zeroed
            // page).
            let unrestored = report.damaged
                + report.unattributable
                + report.unknown_streams.values().sum::<u64>();
            stats.lost_jobs.fetch_add(unrestored, Relaxed);
            let marked = store::aside::mark_salvaged(&f.path);
            tracing::warn!(
                file = %f.path.display(),
                jobs = report.jobs,
                records = report.records,
                lost_records = report.lost_records,
                resent_records = report.resent_records,
                unrestored_jobs = unrestored,
                checkpoints_restored = report.checkpoints_restored,
                in_doubt = report.in_doubt,
                counters_carried_on = report.counters_carried_on,
                put_back_before = report.put_back_before,
                ended_before = report.ended_before,
                duration_ms = started.elapsed().as_millis() as u64,
                renamed_to = %marked.as_ref().map_or_else(|e| format!("(not renamed: {e})"), |p| p.display().to_string()),
                "salvage done: intact jobs are back in their streams"
            );
            true
        }
        Err(e) => {
            tracing::error!(
                file = %f.path.display(),
                error = %e,
                "salvage failed; it is tried again, from where it stopped"
            );
            false
        }
    }
}

/// What a sink did in this life of the process, logged at stop.
fn log_summary(rt: &SinkRuntime, snap: &store::writer::Snapshot) {
    rt.stats.log_summary(
        rt.sink.name(),
        rt.link.is_up(),
        rt.transitions(),
        rt.replay_backlog(snap),
    );
}
