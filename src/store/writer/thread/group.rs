//! One group commit of the writer thread: the appends parked on a full stream tried again first,
//! then each request of the batch applied to one transaction (a function per kind of request), and
//! the transaction's fate decided (kept whole or not at all: a step that failed part way or a
//! damaged page keeps nothing) before any reply is sent. Owns [`Parked`] and [`Pending`] (a reply
//! waiting for the commit). Called by the writer thread's `apply_batch`.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::super::*;
use super::fail_with;
use crate::clock::now_ms;
use crate::store::tx::Tx;
use crate::store::{AppendError, Appended, Failed, FileAppend, Job, RecordBuf, Store, StoreError};

pub(super) struct Parked {
    /// Why the stream was full when this append was last tried.
    reason: crate::store::FullReason,
    stream: String,
    records: Arc<RecordBuf>,
    checkpoint: Option<(String, Vec<u8>)>,
    pub(super) deadline: Instant,
    pub(super) reply: Reply<Result<Appended, AppendError>>,
    /// The jobs and bytes it needed when last found full (see [`Tx::append_again`]).
    need: Option<crate::store::tx::Need>,
}

/// A reply to send once the transaction's fate is known.
/// An append's answer, queued for the commit; a refusal for want of room is counted.
fn answer(
    pending: &mut Vec<Pending>,
    stats: &WriterStats,
    reply: Reply<Result<Appended, AppendError>>,
    result: Result<Appended, AppendError>,
) {
    if let Err(AppendError::Full { stream, reason } | AppendError::Refused { stream, reason, .. }) =
        &result
    {
        stats.refused.add((stream.clone(), *reason));
    }
    pending.push(Pending::Append(reply, result));
}

pub(super) enum Pending {
    Append(
        Reply<Result<Appended, AppendError>>,
        Result<Appended, AppendError>,
    ),
    Take(
        Reply<Result<Vec<Job>, StoreError>>,
        Result<Vec<Job>, StoreError>,
    ),
    Ack(Reply<Result<(), StoreError>>, Result<(), StoreError>),
    Fail(
        Reply<Result<Failed, StoreError>>,
        Result<Failed, StoreError>,
    ),
    Settle(Reply<Result<Job, StoreError>>, Result<Job, StoreError>),
    AppendFile(
        Reply<Result<FileAppend, AppendError>>,
        Result<FileAppend, AppendError>,
    ),
    Counts(
        Reply<Result<(u64, u64), StoreError>>,
        Result<(u64, u64), StoreError>,
    ),
    /// A request applied whole or not at all (a dead-letter chunk that failed after changing
    /// something): its error keeps nothing of the transaction.
    Whole(
        Reply<Result<(u64, u64), StoreError>>,
        Result<(u64, u64), StoreError>,
    ),
    /// A chunk of held jobs corrected for the clock: applied whole or not at all.
    Clock(
        Reply<Result<crate::store::ClockFixed, StoreError>>,
        Result<crate::store::ClockFixed, StoreError>,
    ),
    /// A salvage step: applied whole or not at all, as [`Pending::Whole`].
    Salvage(
        Reply<Result<crate::store::salvage::Stepped, StoreError>>,
        Result<crate::store::salvage::Stepped, StoreError>,
    ),
}

impl Pending {
    /// Its own result found the file damaged (see [`TxResult::StoreDamaged`]): why.
    fn damage(&self) -> Option<String> {
        match self {
            Pending::Take(_, Err(StoreError::Corrupted(m))) => Some(m.clone()),
            _ => None,
        }
    }

    /// Whether its own result failed for want of disk space.
    fn no_space(&self) -> bool {
        let store = |e: &StoreError| e.is_no_space();
        let append = |e: &AppendError| matches!(e, AppendError::Store(e) if e.is_no_space());
        match self {
            Pending::Append(_, Err(e)) => append(e),
            Pending::AppendFile(_, Err(e)) => append(e),
            Pending::Take(_, Err(e)) | Pending::Ack(_, Err(e)) => store(e),
            Pending::Fail(_, Err(e)) => store(e),
            Pending::Settle(_, Err(e)) => store(e),
            _ => false,
        }
    }

    /// Sends the result, or, when the commit failed, an error in its place: `no_space` when the
    /// transaction ran out of disk (a commit after a failed write fails with redb's "previous
    /// i/o error", which no longer says why).
    fn send(self, commit: &Result<(), StoreError>, no_space: bool) {
        let failed = |e: &StoreError| {
            let why = format!("commit failed, nothing acknowledged: {e}");
            if no_space {
                StoreError::NoSpace(why)
            } else {
                StoreError::io(why)
            }
        };
        match (self, commit) {
            (Pending::Append(r, v), Ok(())) => drop(r.send(v)),
            (Pending::Append(r, _), Err(e)) => drop(r.send(Err(AppendError::Store(failed(e))))),
            (Pending::Take(r, v), Ok(())) => drop(r.send(v)),
            (Pending::Take(r, _), Err(e)) => drop(r.send(Err(failed(e)))),
            (Pending::Ack(r, v), Ok(())) => drop(r.send(v)),
            (Pending::Ack(r, _), Err(e)) => drop(r.send(Err(failed(e)))),
            (Pending::Fail(r, v), Ok(())) => drop(r.send(v)),
            (Pending::Fail(r, _), Err(e)) => drop(r.send(Err(failed(e)))),
            (Pending::Settle(r, v), Ok(())) => drop(r.send(v)),
            (Pending::Settle(r, _), Err(e)) => drop(r.send(Err(failed(e)))),
            (Pending::AppendFile(r, v), Ok(())) => drop(r.send(v)),
            (Pending::AppendFile(r, _), Err(e)) => drop(r.send(Err(AppendError::Store(failed(e))))),
            (Pending::Counts(r, v) | Pending::Whole(r, v), Ok(())) => drop(r.send(v)),
            (Pending::Counts(r, _) | Pending::Whole(r, _), Err(e)) => drop(r.send(Err(failed(e)))),
            (Pending::Clock(r, v), Ok(())) => drop(r.send(v)),
            (Pending::Clock(r, _), Err(e)) => drop(r.send(Err(failed(e)))),
            (Pending::Salvage(r, v), Ok(())) => drop(r.send(v)),
            (Pending::Salvage(r, _), Err(e)) => drop(r.send(Err(failed(e)))),
        }
    }
}

pub(super) enum TxResult {
    /// With the streams that received jobs; `wrote`: it changed the disk (not only leases).
    Committed { fed: Vec<String>, wrote: bool },
    /// Nothing needed committing.
    Nothing,
    /// The transaction could not begin or commit: the store must be reopened. `no_space`: it
    /// failed for want of disk space.
    StoreLost { no_space: bool },
    /// A request found the file damaged where redb did not (keys out of order): nothing was
    /// committed; the file is moved aside and salvaged, and a new one opened.
    StoreDamaged { reason: String },
}

/// What one transaction gathers: the replies waiting for its commit, the appends still parked,
/// the requests applied.
struct Group<'a> {
    pending: Vec<Pending>,
    still_parked: VecDeque<Parked>,
    requests: u64,
    stats: &'a WriterStats,
    /// The time the transaction stamps (ms) and the one deadlines are held to.
    now: u64,
    wall: Instant,
}

/// Applies parked appends and a batch of requests in one transaction, commits, and replies.
pub(super) fn run_tx(
    store: &mut Store,
    parked: VecDeque<Parked>,
    work: Vec<Request>,
    stats: &WriterStats,
) -> (VecDeque<Parked>, TxResult) {
    let mut tx = match store.transaction() {
        Ok(tx) => tx,
        Err(e) => {
            tracing::error!(error = %e, "cannot begin a store transaction; reopening the database");
            let no_space = e.is_no_space();
            for req in work {
                fail_with(req, || {
                    if no_space {
                        StoreError::NoSpace(e.to_string())
                    } else {
                        StoreError::io(e.to_string())
                    }
                });
            }
            return (parked, TxResult::StoreLost { no_space });
        }
    };
    let mut g = Group {
        pending: Vec::with_capacity(work.len() + parked.len()),
        still_parked: VecDeque::new(),
        requests: 0,
        stats,
        now: now_ms(),
        wall: Instant::now(),
    };
    // Parked appends go first, in arrival order; a stream with parked appends keeps new ones
    // behind them so producers are served fairly. A deadline is honoured wherever an append waits.
    for p in parked {
        g.retry_parked(&mut tx, p);
    }
    for req in work {
        g.requests += 1;
        g.apply(&mut tx, req);
    }
    let result = g.decide(tx);
    (g.still_parked, result)
}

impl Group<'_> {
    /// An append's answer, queued for the commit; a refusal for want of room is counted.
    fn answer(
        &mut self,
        reply: Reply<Result<Appended, AppendError>>,
        result: Result<Appended, AppendError>,
    ) {
        answer(&mut self.pending, self.stats, reply, result);
    }

    /// A parked append: answered "full" past its deadline, left parked behind another of its
    /// stream or while it still does not fit, else appended.
    fn retry_parked(&mut self, tx: &mut Tx<'_>, p: Parked) {
        if self.wall >= p.deadline {
            let full = AppendError::Full {
                stream: p.stream,
                reason: p.reason,
            };
            self.answer(p.reply, Err(full));
            return;
        }
        if self.still_parked.iter().any(|q| q.stream == p.stream) {
            self.still_parked.push_back(p);
            return;
        }
        let cp = p
            .checkpoint
            .as_ref()
            .map(|(s, c)| (s.as_str(), c.as_slice()));
        let mut need = p.need;
        match tx.append_again(&p.stream, &p.records, cp, self.now, &mut need) {
            Err(AppendError::Full { reason, .. }) => {
                self.still_parked.push_back(Parked { reason, need, ..p })
            }
            result => {
                self.requests += 1;
                self.answer(p.reply, result);
            }
        }
    }

    /// One request of the batch, applied to the transaction; its answer waits for the commit.
    fn apply(&mut self, tx: &mut Tx<'_>, req: Request) {
        let now = self.now;
        let pending = match req {
            Request::Append {
                stream,
                records,
                checkpoint,
                deadline,
                reply,
            } => return self.append(tx, stream, records, checkpoint, deadline, reply),
            Request::Take {
                stream,
                max_jobs,
                max_bytes,
                reply,
            } => Pending::Take(reply, tx.take(&stream, max_jobs, max_bytes, now)),
            Request::Ack { leases, reply } => Pending::Ack(reply, ack_all(tx, &leases)),
            Request::Fail {
                lease,
                failure,
                reply,
            } => Pending::Fail(reply, tx.fail(&lease, &failure, now)),
            Request::Quarantine {
                lease,
                reason,
                reply,
            } => Pending::Ack(reply, tx.quarantine_taken(&lease, &reason)),
            Request::Salvage { key, step, reply } => {
                Pending::Salvage(reply, tx.salvage_step(&key, step))
            }
            Request::Dead { stream, op, reply } => dead(tx, &stream, op, reply),
            Request::FixClock {
                stream,
                anchor,
                fix,
                limit,
                reply,
            } => Pending::Clock(reply, tx.fix_clock(&stream, anchor, fix, limit)),
            Request::Settle {
                lease,
                n,
                outcome,
                reply,
            } => Pending::Settle(reply, tx.settle_prefix(&lease, n, &outcome, now)),
            Request::AppendFile {
                stream,
                file,
                reply,
            } => Pending::AppendFile(reply, tx.append_file(&stream, &file, now)),
            Request::SpoolForget { spools } => {
                // Only lost if the transaction fails: then they are disposed of (harmlessly, the
                // files being gone) and forgotten after the next start.
                if let Err(e) = tx.forget_spool(&spools) {
                    tracing::warn!(error = %e, "cannot forget disposed spool files");
                }
                return;
            }
            Request::Release { .. }
            | Request::Snapshot { .. }
            | Request::Checkpoint { .. }
            | Request::SalvageProgress { .. }
            | Request::NextDue { .. }
            | Request::DeadLetters { .. }
            | Request::SpoolKnown { .. }
            | Request::StopWaiting
            | Request::Shutdown { .. } => {
                unreachable!("handled before the transaction")
            }
        };
        self.pending.push(pending);
    }

    /// A new append. Behind parked appends of the same stream it is not tried: it waits in line
    /// (or, without a wait, fails at once, as the stream is full for everyone before it).
    fn append(
        &mut self,
        tx: &mut Tx<'_>,
        stream: String,
        records: Arc<RecordBuf>,
        checkpoint: Option<(String, Vec<u8>)>,
        deadline: Option<Instant>,
        reply: Reply<Result<Appended, AppendError>>,
    ) {
        let mut need = None;
        let result = match self.still_parked.iter().find(|q| q.stream == stream) {
            Some(ahead) => Err(AppendError::Full {
                stream: stream.clone(),
                reason: ahead.reason,
            }),
            None => {
                let cp = checkpoint.as_ref().map(|(s, c)| (s.as_str(), c.as_slice()));
                tx.append_again(&stream, &records, cp, self.now, &mut need)
            }
        };
        match (result, deadline) {
            (Err(AppendError::Full { reason, .. }), Some(deadline)) if deadline > self.wall => {
                self.still_parked.push_back(Parked {
                    reason,
                    stream,
                    records,
                    checkpoint,
                    deadline,
                    reply,
                    need,
                });
            }
            (result, _) => self.answer(reply, result),
        }
    }

    /// What becomes of the transaction: nothing to commit, kept whole or not at all, or
    /// committed; every waiting reply is sent accordingly.
    fn decide(&mut self, tx: Tx<'_>) -> TxResult {
        let pending = std::mem::take(&mut self.pending);
        if pending.is_empty() {
            // Only parked appends that still do not fit: nothing to commit.
            let _ = tx.close();
            return TxResult::Nothing;
        }
        if let Some(e) = pending.iter().find_map(|p| match p {
            Pending::Whole(_, Err(e)) => Some(e.to_string()),
            Pending::Salvage(_, Err(e)) | Pending::Clock(_, Err(e)) => Some(e.to_string()),
            _ => None,
        }) {
            // A salvage step (or a dead-letter chunk) that failed part way must not commit half
            // of it (jobs put back without the progress that says so, counters carried on twice
            // at the next try): nothing of the transaction is kept, and every request in it is
            // told so (at-least-once).
            drop(tx);
            let commit = Err(StoreError::io(format!(
                "a salvage or dead-letter step failed part way ({e}); nothing of its transaction was kept"
            )));
            for p in pending {
                p.send(&commit, false);
            }
            return TxResult::Nothing;
        }
        if let Some(reason) = pending.iter().find_map(Pending::damage) {
            // Nothing of a transaction that read a damaged page is kept: the leases it handed out
            // are undone, the rest is answered "not stored" (at-least-once) and done again in the
            // salvaged store.
            drop(tx);
            let commit = Err(StoreError::Corrupted(reason.clone()));
            for p in pending {
                p.send(&commit, false);
            }
            return TxResult::StoreDamaged { reason };
        }
        self.commit(tx, pending)
    }

    /// Commits (a transaction that changed nothing does not touch the disk), counts, replies.
    fn commit(&self, tx: Tx<'_>, pending: Vec<Pending>) -> TxResult {
        let (stats, requests) = (self.stats, self.requests);
        let (dirty, fed) = (tx.is_dirty(), tx.fed_streams());
        let started = Instant::now();
        let commit = tx.close();
        let no_space = commit.as_ref().is_err_and(StoreError::is_no_space)
            || (commit.is_err() && pending.iter().any(Pending::no_space));
        let result = match &commit {
            Ok(()) => {
                if dirty {
                    stats.commits.fetch_add(1, Ordering::Relaxed);
                    stats.commit_duration.observe(started.elapsed());
                }
                stats.requests.fetch_add(requests, Ordering::Relaxed);
                TxResult::Committed { fed, wrote: dirty }
            }
            Err(e) if no_space => {
                stats.failed_commits.fetch_add(1, Ordering::Relaxed);
                tracing::error!(error = %e, requests, "store commit failed: the disk is full; nothing in it was acknowledged; reopening the database, appends answered \"no space\" until it is");
                TxResult::StoreLost { no_space }
            }
            Err(e) => {
                stats.failed_commits.fetch_add(1, Ordering::Relaxed);
                tracing::error!(error = %e, requests, "store commit failed: nothing in it was acknowledged; reopening the database");
                TxResult::StoreLost { no_space }
            }
        };
        for p in pending {
            p.send(&commit, no_space);
        }
        result
    }
}

/// Each lease acknowledged; the first error (a job no longer there) is the answer.
fn ack_all(tx: &mut Tx<'_>, leases: &[crate::store::Lease]) -> Result<(), StoreError> {
    let mut r = Ok(());
    for lease in leases {
        if let Err(e) = tx.ack(lease)
            && r.is_ok()
        {
            r = Err(e);
        }
    }
    r
}

/// A dead-letter replay or purge chunk. Both refuse an unknown stream or a missing id before they
/// change anything: that refusal is this request's answer alone, and the producers sharing the
/// transaction are committed. Any other error came part way: it keeps nothing of the transaction.
fn dead(
    tx: &mut Tx<'_>,
    stream: &str,
    op: DeadOp,
    reply: Reply<Result<(u64, u64), StoreError>>,
) -> Pending {
    let r = match op {
        DeadOp::Replay {
            id,
            failed_before_ms,
            limit,
        } => tx.replay_dead(stream, id, failed_before_ms, limit),
        DeadOp::Purge {
            failed_before_ms,
            limit,
        } => tx.purge_dead(stream, failed_before_ms, limit),
    };
    let refused = matches!(
        r,
        Err(StoreError::UnknownStream(_) | StoreError::NoSuchJob { .. })
    );
    if refused {
        Pending::Counts(reply, r)
    } else {
        Pending::Whole(reply, r)
    }
}
