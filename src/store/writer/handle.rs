//! The async side of the writer: [`StoreHandle`], through which producers and delivery workers
//! send requests to the writer thread and await its replies (one request/reply shape for all of
//! them). Cloned freely; it does not touch the store itself.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, oneshot};

use super::{DeadOp, Reply, Request, Snapshot, SpooledFile, WriterStats};
use crate::store::{
    AppendError, Appended, Failed, Failure, FileAppend, Job, Lease, RecordBuf, Settle, StoreError,
};

#[derive(Clone)]
pub struct StoreHandle {
    pub(super) tx: mpsc::Sender<Request>,
    pub(super) stats: Arc<WriterStats>,
    /// Per stream, signalled after a commit that gave it new jobs.
    pub(super) notifiers: Arc<HashMap<String, Arc<Notify>>>,
    /// The id of the store the writer holds; the writer updates it when it reopens one (a file
    /// that replaced a corrupted one has a new id).
    pub(super) store_id: Arc<AtomicU64>,
    /// The data directory, where damaged store files are kept.
    pub(super) data_dir: Arc<std::path::PathBuf>,
    /// Recent appends of the streams someone taps.
    pub(super) taps: Arc<crate::store::tap::Taps>,
    pub(super) delivered_taps: Arc<crate::store::tap::Taps>,
}

pub(super) fn gone() -> StoreError {
    StoreError::WriterStopped
}

impl StoreHandle {
    /// Queues the request `make` builds around a fresh reply channel; the channel's other end, or
    /// [`StoreError::WriterStopped`] when the writer is gone. Every request/reply goes through here.
    fn send<T>(
        &self,
        make: impl FnOnce(Reply<T>) -> Request,
    ) -> Result<oneshot::Receiver<T>, StoreError> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(make(reply)).map_err(|_| gone())?;
        Ok(rx)
    }

    /// A request and the writer's answer to it; a writer that stops before answering is
    /// [`StoreError::WriterStopped`], never a hang.
    async fn ask<T, E: From<StoreError>>(
        &self,
        make: impl FnOnce(Reply<Result<T, E>>) -> Request,
    ) -> Result<T, E> {
        let rx = self.send(make)?;
        rx.await.map_err(|_| gone())?
    }

    /// [`ask`](Self::ask) from a thread outside the event loop (a task's blocking file work).
    fn ask_blocking<T, E: From<StoreError>>(
        &self,
        make: impl FnOnce(Reply<Result<T, E>>) -> Request,
    ) -> Result<T, E> {
        self.send(make)?.blocking_recv().map_err(|_| gone())?
    }
    /// Damaged store files moved aside in the data directory (read from it now).
    pub fn damaged_files(&self) -> Vec<crate::store::aside::AsideFile> {
        crate::store::aside::list(&self.data_dir)
    }

    /// Appends records and returns once they are durable. Under `when_full: block`, waits for room
    /// up to `wait` (None: fail at once when full).
    pub async fn append(
        &self,
        stream: &str,
        records: impl Into<RecordBuf>,
        checkpoint: Option<(String, Vec<u8>)>,
        wait: Option<Duration>,
    ) -> Result<Appended, AppendError> {
        self.append_shared(stream, Arc::new(records.into()), checkpoint, wait)
            .await
    }

    /// [`append`](Self::append) of records shared with the caller, so a producer that must send
    /// them again after a refusal keeps them without a copy.
    pub async fn append_shared(
        &self,
        stream: &str,
        records: Arc<RecordBuf>,
        checkpoint: Option<(String, Vec<u8>)>,
        wait: Option<Duration>,
    ) -> Result<Appended, AppendError> {
        let stream = stream.to_string();
        let deadline = wait.map(|w| Instant::now() + w);
        let tapped = self
            .taps
            .watching()
            .then(|| (stream.clone(), Arc::clone(&records)));
        let appended = self
            .ask(|reply| Request::Append {
                stream,
                records,
                checkpoint,
                deadline,
                reply,
            })
            .await;
        if let (Ok(_), Some((stream, records))) = (&appended, tapped) {
            self.taps.appended(&stream, records.iter());
        }
        appended
    }

    /// Recent appends of tapped streams (`colibri tap`).
    pub fn taps(&self) -> &crate::store::tap::Taps {
        &self.taps
    }

    /// Recent deliveries of tapped streams (`colibri tap --delivered`): fed by the delivery
    /// workers, kept here because the handle outlives the sinks a reload replaces.
    pub fn delivered_taps(&self) -> &crate::store::tap::Taps {
        &self.delivered_taps
    }

    /// Queues a spooled file as a file job, from a thread outside the event loop (a task's file
    /// work on the blocking pool); returns once that is durable.
    pub fn append_file_blocking(
        &self,
        stream: &str,
        file: SpooledFile,
    ) -> Result<FileAppend, AppendError> {
        self.ask_blocking(|reply| Request::AppendFile {
            stream: stream.to_string(),
            file,
            reply,
        })
    }

    /// Whether the store knows a spooled file (queued, or delivered and being disposed of), from a
    /// thread outside the event loop.
    pub fn spool_known_blocking(&self, spool: &[u8]) -> Result<bool, StoreError> {
        self.ask_blocking(|reply| Request::SpoolKnown {
            spool: spool.to_vec(),
            reply,
        })
    }

    /// Takes up to `max_jobs` due jobs, oldest first, and fewer once they hold `max_bytes` (one at
    /// least): see [`crate::store::Tx::take`].
    pub async fn take(
        &self,
        stream: &str,
        max_jobs: usize,
        max_bytes: u64,
    ) -> Result<Vec<Job>, StoreError> {
        self.ask(|reply| Request::Take {
            stream: stream.to_string(),
            max_jobs,
            max_bytes,
            reply,
        })
        .await
    }

    /// Deletes a delivered job; returns once that is durable.
    pub async fn ack(&self, lease: Lease) -> Result<(), StoreError> {
        self.ack_many(vec![lease]).await
    }

    /// Deletes delivered jobs in one transaction (one commit, whatever their number); returns once
    /// that is durable. Every job is deleted even when one is not there any more (the first such
    /// error is returned): a delivery worker acknowledges what it took together.
    pub async fn ack_many(&self, leases: Vec<Lease>) -> Result<(), StoreError> {
        self.ask(|reply| Request::Ack { leases, reply }).await
    }

    /// Settles the first `n` records of a leased job (see [`crate::store::Tx::settle_prefix`]) and returns
    /// what is left of it, still leased, once the change is durable.
    pub async fn settle_prefix(
        &self,
        lease: Lease,
        n: u32,
        outcome: Settle,
    ) -> Result<Job, StoreError> {
        self.ask(|reply| Request::Settle {
            lease,
            n,
            outcome,
            reply,
        })
        .await
    }

    pub async fn fail(&self, lease: Lease, failure: Failure) -> Result<Failed, StoreError> {
        self.ask(|reply| Request::Fail {
            lease,
            failure,
            reply,
        })
        .await
    }

    /// A taken job whose records cannot be read ([`Job::records`] failed: its compressed area is
    /// damaged) leaves the queue for quarantine, counted; returns once that is durable.
    pub async fn quarantine(&self, lease: Lease, reason: String) -> Result<(), StoreError> {
        self.ask(|reply| Request::Quarantine {
            lease,
            reason,
            reply,
        })
        .await
    }

    /// When the stream's earliest retry falls due (Unix ms), if it has one.
    pub async fn next_retry_due(&self, stream: &str) -> Result<Option<u64>, StoreError> {
        self.ask(|reply| Request::NextDue {
            stream: stream.to_string(),
            reply,
        })
        .await
    }

    /// A page of `stream`'s dead letters (see [`crate::store::Store::dead_letters`]): the jobs,
    /// and the id to ask after next when more follow.
    pub async fn dead_letters(
        &self,
        stream: &str,
        after: Option<u64>,
        n: usize,
        max_raw: u64,
    ) -> Result<crate::store::DeadPage, StoreError> {
        self.ask(|reply| Request::DeadLetters {
            stream: stream.to_string(),
            after,
            n,
            max_raw,
            reply,
        })
        .await
    }

    /// Signalled after each commit that gave `stream` new jobs (a permit is kept when nobody
    /// waits, so a wake-up between a take and the wait is not lost).
    pub fn fed(&self, stream: &str) -> Option<Arc<Notify>> {
        self.notifiers.get(stream).cloned()
    }

    pub fn release(&self, lease: Lease) {
        let _ = self.tx.send(Request::Release { lease });
    }

    pub async fn snapshot(&self) -> Result<Snapshot, StoreError> {
        let rx = self.send(|reply| Request::Snapshot { reply })?;
        rx.await.map_err(|_| gone())
    }

    /// The settings of `stream`, for the source `source` that appends to it (an unavailable
    /// store has none yet: wait; a writer that failed and is reopening answers again later).
    /// `None` once colibri stops.
    pub async fn stream_settings(
        &self,
        source: &str,
        stream: &str,
        stopping: &tokio_util::sync::CancellationToken,
    ) -> Option<crate::store::StreamConfig> {
        const RETRY_BASE: Duration = Duration::from_millis(100);
        const RETRY_CAP: Duration = Duration::from_secs(5);
        let mut attempt = 0u32;
        loop {
            match self.snapshot().await {
                Ok(snap) => {
                    if let Some(s) = snap
                        .streams
                        .into_iter()
                        .map(|(c, _)| c)
                        .find(|c| c.name == stream)
                    {
                        return Some(s);
                    }
                }
                Err(_) if stopping.is_cancelled() => return None,
                Err(e) => {
                    if attempt == 0 {
                        tracing::warn!(source, error = %e, "cannot read the stream's settings from the store; retrying");
                    }
                }
            }
            tokio::select! {
                _ = stopping.cancelled() => return None,
                _ = tokio::time::sleep(crate::backoff::jittered(attempt, RETRY_BASE, RETRY_CAP)) => {}
            }
            attempt = attempt.saturating_add(1);
        }
    }

    /// The last committed checkpoint of `source` (see [`Store::checkpoint`]). Read before the
    /// transaction of the batch it arrives in: ask after the replies of your own appends.
    pub async fn checkpoint(&self, source: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.ask(|reply| Request::Checkpoint {
            source: source.to_string(),
            reply,
        })
        .await
    }

    /// One chunk of an operator's replay or purge of `stream`'s dead letters: (jobs, records).
    pub async fn dead(&self, stream: &str, op: DeadOp) -> Result<(u64, u64), StoreError> {
        let stream = stream.to_string();
        self.ask(|reply| Request::Dead { stream, op, reply }).await
    }

    /// Corrects up to `limit` of `stream`'s jobs held for the clock (see `tx::clock`), in one
    /// commit; `more` in the answer when some remain.
    pub async fn fix_clock(
        &self,
        stream: &str,
        anchor: crate::timesync::Anchor,
        fix: crate::store::FixRecord,
        limit: usize,
    ) -> Result<crate::store::ClockFixed, StoreError> {
        let stream = stream.to_string();
        self.ask(|reply| Request::FixClock {
            stream,
            anchor,
            fix,
            limit,
            reply,
        })
        .await
    }

    /// Finishes what is queued, closes the database cleanly (so the next start needs no repair)
    /// and stops the thread.
    pub async fn shutdown(&self) {
        if let Ok(rx) = self.send(|reply| Request::Shutdown { reply }) {
            let _ = rx.await;
        }
    }

    pub fn stats(&self) -> &WriterStats {
        &self.stats
    }

    /// The stop has begun: appends waiting for room in a full `block` stream are answered
    /// [`AppendError::Stopping`] at once (nothing of them stored), and from now on an append that
    /// finds its stream full gets that answer instead of waiting.
    pub fn stop_waiting(&self) {
        let _ = self.tx.send(Request::StopWaiting);
    }

    /// The id of the store behind this handle (see [`Store::id`]), without a round trip. It changes
    /// only when the writer had to replace a corrupted file with a fresh one.
    pub fn store_id(&self) -> u64 {
        self.store_id.load(Ordering::Acquire)
    }

    /// How many times the writer has replaced its store file so far (see [`Self::wait_replaced`]).
    pub fn replacements(&self) -> u64 {
        *self
            .stats
            .replaced
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Blocks until the writer has replaced its store file more than `seen` times (a file found
    /// damaged while running is moved aside for salvage and a new one created), or `limit`
    /// passes; returns the count. For a thread outside the event loop.
    pub fn wait_replaced(&self, seen: u64, limit: Option<Duration>) -> u64 {
        let (count, signal) = &self.stats.replaced;
        let guard = count
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let replaced = |n: &mut u64| *n <= seen;
        match limit {
            None => *signal
                .wait_while(guard, replaced)
                .unwrap_or_else(std::sync::PoisonError::into_inner),
            Some(limit) => {
                *signal
                    .wait_timeout_while(guard, limit, replaced)
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .0
            }
        }
    }
}

/// The running agent's writer as where a salvage puts what it found: a transaction per chunk,
/// among the writer's other work, so the agent stays in service while a damaged file is read.
/// From a thread outside the event loop (it blocks on each answer). Logs its progress every
/// [`Restoring::PROGRESS_EVERY`] while it lasts.
pub struct Restoring<'a> {
    handle: &'a StoreHandle,
    file: &'a std::path::Path,
    jobs: u64,
    logged: Instant,
}

impl<'a> Restoring<'a> {
    const PROGRESS_EVERY: Duration = Duration::from_secs(5);

    pub fn new(handle: &'a StoreHandle, file: &'a std::path::Path) -> Self {
        Restoring {
            handle,
            file,
            jobs: 0,
            logged: Instant::now(),
        }
    }
}

impl crate::store::salvage::Restore for Restoring<'_> {
    fn progress(
        &mut self,
        key: &str,
    ) -> Result<Option<crate::store::salvage::Progress>, StoreError> {
        let key = key.to_string();
        self.handle
            .ask_blocking(|reply| Request::SalvageProgress { key, reply })
    }

    fn step(
        &mut self,
        key: &str,
        step: crate::store::salvage::Step,
    ) -> Result<crate::store::salvage::Stepped, StoreError> {
        let jobs = match &step {
            crate::store::salvage::Step::Jobs { jobs, .. } => jobs.len() as u64,
            _ => 0,
        };
        let key = key.to_string();
        let n = self
            .handle
            .ask_blocking(|reply| Request::Salvage { key, step, reply })?;
        self.jobs += jobs;
        if jobs > 0 && self.logged.elapsed() >= Self::PROGRESS_EVERY {
            self.logged = Instant::now();
            tracing::info!(file = %self.file.display(), jobs = self.jobs, "salvage in progress");
        }
        Ok(n)
    }
}
