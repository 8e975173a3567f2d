//! `colibri run`: wires the parts together for one life of the process. It creates the data directory,
//! starts the wall-clock watcher and the scheduler, and turns signals into the stop sequence: the first
//! SIGTERM or SIGINT stops scheduling and gives running tasks `shutdown_grace`, then exits 0; a second
//! signal kills every task's process group and exits at once. It owns no policy of its own.

use std::sync::Arc;

use anyhow::Context as _;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::Notify;

use crate::clock::{self, SystemClock};
use crate::config::{Config, units::fmt_duration};
use crate::scheduler::Scheduler;
use crate::task::RunContext;

/// Exit status after a second stop signal cut the grace short.
pub const EXIT_FORCED: i32 = 1;

pub async fn run(config: Config) -> anyhow::Result<()> {
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("cannot create data_dir {}", config.data_dir.display()))?;
    let mut sigterm =
        signal(SignalKind::terminate()).context("cannot install the SIGTERM handler")?;
    let mut sigint =
        signal(SignalKind::interrupt()).context("cannot install the SIGINT handler")?;

    let ctx = RunContext {
        stopping: Default::default(),
        abort: Default::default(),
        groups: Default::default(),
    };
    let clock_set = Arc::new(Notify::new());
    if let Err(e) = clock::watch_wall_clock(Arc::clone(&clock_set)) {
        tracing::warn!(error = %e, "cannot watch for wall-clock changes; jumps are noticed within an hour");
    }
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
            tracing::info!(killed = drained.killed, "colibri stopped");
            Ok(())
        }
        second = async { tokio::select! { _ = sigterm.recv() => "SIGTERM", _ = sigint.recv() => "SIGINT" } } => {
            let n = ctx.groups.signal_all(libc::SIGKILL);
            tracing::error!(signal = second, killed_groups = n, "second signal: exiting now");
            std::process::exit(EXIT_FORCED);
        }
    }
}
