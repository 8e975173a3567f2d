//! `colibri run`: wires the parts together for one life of the process. It creates the data directory,
//! opens the store (when streams are configured) and starts its writer, starts the wall-clock watcher
//! and the scheduler, and turns signals into the stop sequence: the first SIGTERM or SIGINT stops
//! scheduling and gives running tasks `shutdown_grace`, then closes the store cleanly and exits 0; a
//! second signal kills every task's process group and exits at once. It owns no policy of its own.

use std::sync::Arc;

use anyhow::Context as _;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::Notify;

use crate::clock::{self, SystemClock};
use crate::config::{Config, units::fmt_duration};
use crate::delivery::SinkRuntime;
use crate::scheduler::Scheduler;
use crate::store::{self, OpenOptions, Store, StoreError, writer};
use crate::task::RunContext;
use tokio::task::JoinHandle;

/// Exit status after a second stop signal cut the grace short.
pub const EXIT_FORCED: i32 = 1;

pub async fn run(config: Config) -> anyhow::Result<()> {
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("cannot create data_dir {}", config.data_dir.display()))?;
    let store_handle = open_store(&config)?;
    let mut sigterm =
        signal(SignalKind::terminate()).context("cannot install the SIGTERM handler")?;
    let mut sigint =
        signal(SignalKind::interrupt()).context("cannot install the SIGINT handler")?;

    let ctx = RunContext {
        stopping: Default::default(),
        abort: Default::default(),
        groups: Default::default(),
        store: store_handle.clone(),
    };
    let clock_set = Arc::new(Notify::new());
    if let Err(e) = clock::watch_wall_clock(Arc::clone(&clock_set)) {
        tracing::warn!(error = %e, "cannot watch for wall-clock changes; jumps are noticed within an hour");
    }
    let delivery = start_delivery(&config, store_handle.as_ref(), &ctx.stopping)?;
    let producers = start_producers(&config, store_handle.as_ref(), &ctx.stopping).await?;
    let (scheduler, _handle) = Scheduler::new(
        &config.tasks,
        Arc::new(SystemClock),
        ctx.clone(),
        config.workers,
        config.shutdown_grace,
        clock_set,
    );
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        config = %config.source.display(),
        tasks = config.tasks.len(),
        workers = config.workers,
        "colibri started"
    );
    let scheduler = scheduler.run();
    tokio::pin!(scheduler);

    let first = tokio::select! {
        _ = sigterm.recv() => "SIGTERM",
        _ = sigint.recv() => "SIGINT",
        _ = &mut scheduler => anyhow::bail!("the scheduler stopped on its own"),
    };
    tracing::info!(
        signal = first,
        grace = %fmt_duration(config.shutdown_grace),
        "stopping: no new task runs; a second signal kills running tasks at once"
    );
    ctx.stopping.cancel();
    tokio::select! {
        drained = &mut scheduler => {
            // Deliveries in progress finish (each is one job); then the store closes cleanly.
            // Intake stops first (ingest answers 503, sources commit their checkpoints), then
            // deliveries in progress finish, then the store closes.
            for p in producers {
                let _ = p.await;
            }
            for t in delivery.tasks {
                let _ = t.await;
            }
            if let Some(handle) = &store_handle {
                let snap = handle.snapshot().await.unwrap_or_default();
                for rt in &delivery.sinks {
                    log_summary(rt, &snap);
                }
            }
            if let Some(handle) = &store_handle {
                handle.shutdown().await;
            }
            tracing::info!(killed = drained.killed, "colibri stopped");
            Ok(())
        }
        second = async { tokio::select! { _ = sigterm.recv() => "SIGTERM", _ = sigint.recv() => "SIGINT" } } => {
            let n = ctx.groups.signal_all(libc::SIGKILL);
            tracing::error!(signal = second, killed_groups = n, "second signal: exiting now");
            crate::logging::exit(EXIT_FORCED);
        }
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
    let opened = open_or_replace(&dir, storage, &streams, false)
        .with_context(|| format!("cannot open the store in {}", dir.display()))?;
    tracing::info!(
        path = %opened.path().display(),
        file_bytes = opened.file_bytes(),
        queued_bytes = opened.stored_bytes(),
        streams = streams.len(),
        duration_ms = started.elapsed().as_millis() as u64,
        "store opened"
    );
    // After a failure the file is verified page by page; a corrupted one is replaced.
    let reopen = Box::new(move || open_or_replace(&dir, storage, &streams, true));
    let handle = writer::spawn(opened, reopen, writer::WriterOptions::default())
        .context("cannot start the store writer thread")?;
    Ok(Some(handle))
}

/// Opens the store; a file redb reports as corrupted is moved aside (kept for inspection) and a fresh
/// one created, so the agent comes back into service. Logged at ERROR: data in the old file is no
/// longer served.
fn open_or_replace(
    dir: &std::path::Path,
    storage: store::StorageConfig,
    streams: &[store::StreamConfig],
    verify: bool,
) -> Result<Store, StoreError> {
    let opts = OpenOptions {
        verify,
        ..OpenOptions::default()
    };
    let first = Store::open(dir, storage, streams, opts);
    // A plain open trusts redb's recorded allocator state; a verifying one checks every page and
    // rebuilds it, and may well succeed. Only a file that fails that too is given up on.
    let opened = match first {
        Err(StoreError::Corrupted(reason)) if !verify => {
            tracing::warn!(
                reason,
                "the store looks damaged; opening it again with full verification"
            );
            let opts = OpenOptions {
                verify: true,
                ..OpenOptions::default()
            };
            Store::open(dir, storage, streams, opts)
        }
        other => other,
    };
    match opened {
        Err(StoreError::Corrupted(reason)) => {
            let path = dir.join(store::DB_FILE);
            let aside = path.with_extension(format!("redb.corrupt-{}", store::now_ms()));
            std::fs::rename(&path, &aside).map_err(|e| {
                StoreError::Io(format!(
                    "cannot move the corrupted store {} aside: {e}",
                    path.display()
                ))
            })?;
            tracing::error!(
                reason,
                moved_to = %aside.display(),
                "the store is corrupted; it was moved aside and a new one created"
            );
            Store::open(dir, storage, streams, OpenOptions::default())
        }
        other => other,
    }
}

/// Builds every sink that a stream uses and starts its link monitor and its workers (`concurrency`
/// per stream).
fn start_delivery(
    config: &Config,
    store: Option<&writer::StoreHandle>,
    stopping: &tokio_util::sync::CancellationToken,
) -> anyhow::Result<Delivery> {
    let Some(store) = store else {
        return Ok(Delivery::default());
    };
    let (mut sinks, mut tasks) = (Vec::new(), Vec::new());
    for sink_cfg in &config.sinks {
        let streams: Vec<String> = config
            .streams
            .iter()
            .filter(|s| s.sink.as_deref() == Some(sink_cfg.name.as_str()))
            .map(|s| s.name.clone())
            .collect();
        if streams.is_empty() {
            continue;
        }
        let sink = crate::sink::Sink::new(Arc::clone(sink_cfg))
            .map_err(|e| anyhow::anyhow!("sinks.{}: {e}", sink_cfg.name))?;
        let rt = Arc::new(SinkRuntime::new(
            Arc::new(sink),
            streams,
            config.shutdown_grace,
        ));
        tasks.push(tokio::spawn(crate::link::monitor(
            Arc::clone(&rt.link),
            Arc::clone(&rt.sink),
            store.clone(),
            rt.streams.clone(),
            stopping.clone(),
        )));
        for stream in &rt.streams {
            tracing::info!(stream, sink = %rt.sink.describe(), concurrency = rt.sink.concurrency(), "delivery started");
            for _ in 0..rt.sink.concurrency() {
                tasks.push(tokio::spawn(crate::delivery::run(
                    stream.clone(),
                    Arc::clone(&rt),
                    store.clone(),
                    stopping.clone(),
                )));
            }
        }
        sinks.push(rt);
    }
    Ok(Delivery { sinks, tasks })
}

/// Starts what appends on its own: the ingest API (bound now, so a taken port stops the start) and
/// every source.
async fn start_producers(
    config: &Config,
    store: Option<&writer::StoreHandle>,
    stopping: &tokio_util::sync::CancellationToken,
) -> anyhow::Result<Vec<JoinHandle<()>>> {
    let Some(store) = store else {
        return Ok(Vec::new());
    };
    let mut tasks = Vec::new();
    if let Some(ingest) = &config.ingest {
        let listen = ingest.listen;
        tasks.push(
            crate::ingest::start(ingest.clone(), store.clone(), stopping.clone())
                .await
                .with_context(|| format!("cannot start the ingest API on {listen}"))?,
        );
    }
    for source in &config.sources {
        tasks.push(tokio::spawn(crate::tail::run(
            Arc::clone(source),
            store.clone(),
            stopping.clone(),
        )));
    }
    Ok(tasks)
}

/// The running delivery side: each sink's shared state and every worker and monitor task.
#[derive(Default)]
struct Delivery {
    sinks: Vec<Arc<SinkRuntime>>,
    tasks: Vec<JoinHandle<()>>,
}

/// What a sink did in this life of the process, logged at stop (the metrics endpoint will expose
/// the same counters).
fn log_summary(rt: &SinkRuntime, snap: &store::writer::Snapshot) {
    use std::sync::atomic::Ordering::Relaxed;
    let s = &rt.stats;
    tracing::info!(
        sink = rt.sink.name(),
        requests_ok = s.requests_ok.load(Relaxed),
        requests_transport = s.requests_transport.load(Relaxed),
        requests_retryable = s.requests_retryable.load(Relaxed),
        requests_too_large = s.requests_too_large.load(Relaxed),
        requests_rejected = s.requests_rejected.load(Relaxed),
        attempts_failed = s.attempts_failed.load(Relaxed),
        dead_lettered_records = s.dead_lettered_records.load(Relaxed),
        records_delivered = s.records_delivered.load(Relaxed),
        bytes_delivered = s.bytes_delivered.load(Relaxed),
        link_up = rt.link.is_up(),
        link_transitions = rt.link.transitions.load(Relaxed),
        replay_backlog = rt.replay_backlog(snap),
        "delivery summary"
    );
}
