//! The agent's watch on the wall clock's synchronisation: logs each change (a WARN when the
//! clock is, or becomes, unsynchronised; INFO when it is synchronised), holds the delivery of every
//! `hold_until_clock_synced` stream while it is not (through [`Paused`]), and, once it is, has
//! the store correct the jobs appended meanwhile (`store::tx::clock`, chunk by chunk, with the
//! line-protocol rule of `scrape::lineparse::shift_time`) before it lets them go. Counts what the
//! correction did per stream for `/metrics`. What "synchronised" means is `timesync`'s; started
//! by the agent before any part runs.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::paused::{Paused, Why};
use crate::store::ClockFixed;
use crate::store::writer::StoreHandle;
use crate::timesync::{self, Anchor};

/// How often the clock is asked while streams are held for it (one waits at most this long after
/// the sync), and otherwise (a change is logged that much later: no wake-up a second on a box
/// whose clock is never synchronised and where nothing waits for it).
const POLL_HELD: Duration = Duration::from_secs(1);
const POLL_IDLE: Duration = Duration::from_secs(60);

/// Held jobs corrected per transaction.
const CHUNK: usize = 1000;

/// Records of held jobs per stream: corrected, left as they were (not colibri's clock's time),
/// not correctable (another boot's).
static COUNTS: Mutex<BTreeMap<String, [u64; 3]>> = Mutex::new(BTreeMap::new());

/// The correction counts of every stream that had held jobs, for `/metrics`.
pub fn counts() -> BTreeMap<String, [u64; 3]> {
    lock().clone()
}

/// Asks the clock once, holds `streams` until the watcher has corrected their held jobs, and
/// starts the watcher. An unsynchronised clock at start is a WARN when streams wait for it, INFO
/// otherwise (a VM kept by its hypervisor's clock without an NTP client reports unsynchronised
/// for ever: that is worth a line, not an alarm at every start).
pub fn start(
    streams: Vec<String>,
    store: Option<StoreHandle>,
    paused: &Arc<Paused>,
    stopping: CancellationToken,
) {
    let synced = timesync::observe();
    if !synced && streams.is_empty() {
        tracing::info!(
            "the system clock is not synchronised (the kernel says so: no NTP sync yet); records carry its time"
        );
    } else if !synced {
        warn_unsynced(&streams);
    }
    let Some(store) = store.filter(|_| !streams.is_empty()) else {
        tokio::spawn(watch(
            Vec::new(),
            None,
            Arc::clone(paused),
            synced,
            stopping,
        ));
        return;
    };
    for s in &streams {
        paused.set_for(Why::Clock, s, true);
    }
    tokio::spawn(watch(
        streams,
        Some(store),
        Arc::clone(paused),
        synced,
        stopping,
    ));
}

/// Until the stop: corrects and releases the held streams whenever the clock is synchronised
/// (again after a failed correction), and holds them again when it is not.
async fn watch(
    streams: Vec<String>,
    store: Option<StoreHandle>,
    paused: Arc<Paused>,
    mut synced: bool,
    stopping: CancellationToken,
) {
    loop {
        let held = streams.iter().any(|s| paused.is_for(Why::Clock, s));
        if synced
            && held
            && let Some(store) = &store
        {
            release(&streams, store, &paused).await;
        }
        let wait = if held { POLL_HELD } else { POLL_IDLE };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stopping.cancelled() => return,
        }
        let now = timesync::observe();
        if now == synced {
            continue;
        }
        synced = now;
        if synced {
            tracing::info!("the system clock is synchronised");
        } else {
            warn_unsynced(&streams);
            for s in &streams {
                paused.set_for(Why::Clock, s, true);
            }
        }
    }
}

fn warn_unsynced(streams: &[String]) {
    tracing::warn!(
        held = ?streams,
        "the system clock is not synchronised (the kernel says so: no NTP sync yet); records keep their time since boot and the streams held wait for the sync"
    );
}

/// Corrects each stream's held jobs and lets it be delivered; a stream whose correction fails is
/// tried again at the next poll (it stays held: its records' times would be wrong).
async fn release(streams: &[String], store: &StoreHandle, paused: &Paused) {
    let anchor = Anchor::now();
    for s in streams {
        match correct(s, store, anchor).await {
            Ok(()) => {
                paused.set_for(Why::Clock, s, false);
            }
            Err(e) => tracing::error!(
                stream = s,
                error = %e,
                "cannot correct the times of the records held for the clock; the stream stays held"
            ),
        }
    }
}

async fn correct(
    stream: &str,
    store: &StoreHandle,
    anchor: Anchor,
) -> Result<(), crate::store::StoreError> {
    let fix = crate::scrape::lineparse::shift_time;
    let mut total = ClockFixed::default();
    loop {
        let done = store.fix_clock(stream, anchor, fix, CHUNK).await?;
        let mut counts = lock();
        let c = counts.entry(stream.to_string()).or_default();
        c[0] += done.corrected;
        c[1] += done.kept;
        c[2] += done.unknown_boot;
        drop(counts);
        total.jobs += done.jobs;
        total.corrected += done.corrected;
        total.kept += done.kept;
        total.unknown_boot += done.unknown_boot;
        if !done.more {
            break;
        }
    }
    if total.jobs > 0 {
        tracing::info!(
            stream,
            jobs = total.jobs,
            corrected = total.corrected,
            kept = total.kept,
            other_boot = total.unknown_boot,
            "records held for the clock corrected; delivery starts"
        );
    }
    Ok(())
}

fn lock() -> std::sync::MutexGuard<'static, BTreeMap<String, [u64; 3]>> {
    COUNTS.lock().expect("never poisoned: no panics while held")
}
