//! The scheduler: a min-heap of (next fire time, task) driven by one timer. It sleeps until the earliest
//! task is due, until it is told the set of tasks changed, or until the kernel says the wall clock was
//! set; an idle colibri does not wake otherwise (sleeps are capped at [`MAX_SLEEP`] only to bound the
//! drift between the monotonic and the wall clock during very long sleeps). A task still running when it
//! is due again is skipped and counted, never stacked. It owns the running task futures and, at
//! shutdown, their grace period. It does not know how a task runs (`task::run`) or what the file says.
//! Called by `agent`.
//!
//! Deadlines are kept on the monotonic clock. Cron tasks are planned on the wall clock and converted;
//! when the wall clock moves against the monotonic one by more than [`JUMP_TOLERANCE`] (an NTP step,
//! an RTC reset), every cron task is re-planned from the new "now": nothing fires in a burst and
//! nothing sleeps for a day. Interval tasks live on the monotonic clock alone and are not disturbed.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{Notify, Semaphore, mpsc, oneshot};
use tokio::task::{Id, JoinSet};
use tokio::time::Instant;

use crate::clock::Clock;
use crate::metrics::Registry;
use crate::schedule::Schedule;
use crate::task::{self, RunContext, TaskDef, TaskStats, exec::KILL_GRACE};
use crate::units::fmt_duration;

/// A wall-clock move larger than this, relative to the monotonic clock, is a jump.
pub const JUMP_TOLERANCE: Duration = Duration::from_secs(2);
/// The longest single sleep. At the worst NTP slew rate (500 ppm) an hour drifts 1.8 s.
pub const MAX_SLEEP: Duration = Duration::from_secs(3600);

/// A reading of both clocks.
#[derive(Debug, Clone, Copy)]
pub struct Now {
    pub mono: Instant,
    pub wall: DateTime<Utc>,
}

/// A change to the set of tasks, sent through a [`SchedulerHandle`].
#[derive(Debug)]
pub enum Change {
    /// Add a task, or replace the one with the same name (re-planned; a run in progress finishes).
    Upsert(Arc<TaskDef>),
    Remove(String),
    /// Run the task now, outside its schedule (`colibri task run`): answered as soon as the run is
    /// started (it then waits for a worker like any other) or refused.
    RunNow {
        name: String,
        /// The runs of the task that had ended when this one started: the next to end is it.
        reply: oneshot::Sender<Result<u64, RunRefused>>,
    },
}

/// Why a run asked for now did not start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunRefused {
    NoSuchTask,
    /// Runs of one task never overlap.
    AlreadyRunning,
}

/// Sends changes to a running scheduler.
#[derive(Debug, Clone)]
pub struct SchedulerHandle {
    tx: mpsc::UnboundedSender<Change>,
}

impl SchedulerHandle {
    /// Returns false when the scheduler has stopped.
    pub fn send(&self, change: Change) -> bool {
        self.tx.send(change).is_ok()
    }
}

struct Slot {
    def: Arc<TaskDef>,
    stats: Arc<TaskStats>,
    /// Bumped on every re-plan; heap entries of an older generation are stale.
    generation: u64,
    running: bool,
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    mono: Instant,
    seq: u64,
    slot: usize,
    generation: u64,
    wall: DateTime<Utc>,
}

/// One due occurrence, handed out by [`Plan::pop_due`].
pub struct Fire {
    pub slot: usize,
    pub def: Arc<TaskDef>,
    pub stats: Arc<TaskStats>,
    pub due_mono: Instant,
    pub due_wall: DateTime<Utc>,
}

/// The heap and the task slots, without any I/O: every decision about *when* lives here, so tests can
/// drive it with made-up clock readings.
pub struct Plan {
    slots: Vec<Option<Slot>>,
    by_name: HashMap<String, usize>,
    heap: BinaryHeap<Reverse<Entry>>,
    seq: u64,
    origin: Instant,
    /// `wall - mono` (ns) when the wall clock was last trusted; a change beyond the tolerance is a jump.
    reference: i128,
    /// The agent's task counters: a new slot takes its task's (a task a reload changed keeps
    /// its slot and so its counters).
    stats: Arc<Registry<TaskStats>>,
}

impl Plan {
    pub fn new(now: Now, stats: Arc<Registry<TaskStats>>) -> Self {
        let mut p = Plan {
            stats,
            slots: Vec::new(),
            by_name: HashMap::new(),
            heap: BinaryHeap::new(),
            seq: 0,
            origin: now.mono,
            reference: 0,
        };
        p.reference = p.skew(now);
        p
    }

    fn skew(&self, now: Now) -> i128 {
        let wall = i128::from(now.wall.timestamp_nanos_opt().unwrap_or(i64::MAX));
        wall - (now.mono - self.origin).as_nanos() as i128
    }

    #[cfg(test)]
    /// Number of tasks planned.
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// Adds or replaces a task. `at_start` is true for the tasks present when the agent starts (only
    /// those run `@reboot`).
    pub fn upsert(&mut self, def: Arc<TaskDef>, now: Now, at_start: bool) {
        let slot = match self.by_name.get(&def.name) {
            Some(&i) => {
                let s = self.slots[i]
                    .as_mut()
                    .expect("by_name points at live slots");
                s.def = Arc::clone(&def);
                s.generation += 1;
                i
            }
            None => {
                self.slots.push(Some(Slot {
                    def: Arc::clone(&def),
                    stats: self.stats.get(&def.name),
                    generation: 0,
                    running: false,
                }));
                let i = self.slots.len() - 1;
                self.by_name.insert(def.name.clone(), i);
                i
            }
        };
        match first_fire(&def.schedule, now, at_start) {
            Some((mono, wall)) => self.push(slot, mono, wall),
            None => {
                if let Some(s) = &self.slots[slot] {
                    s.stats.next_ms.store(0, Ordering::Relaxed);
                }
            }
        }
    }

    /// Forgets a task; a run in progress finishes on its own.
    pub fn remove(&mut self, name: &str) -> bool {
        match self.by_name.remove(name) {
            Some(i) => {
                self.slots[i] = None;
                true
            }
            None => false,
        }
    }

    #[cfg(test)]
    pub fn stats(&self, name: &str) -> Option<Arc<TaskStats>> {
        let i = *self.by_name.get(name)?;
        self.slots[i].as_ref().map(|s| Arc::clone(&s.stats))
    }

    /// The occurrence of `name` asked for now, unless it is running.
    pub fn fire_now(&self, name: &str, now: Now) -> Result<Fire, RunRefused> {
        let slot = *self.by_name.get(name).ok_or(RunRefused::NoSuchTask)?;
        let s = self.slots[slot].as_ref().ok_or(RunRefused::NoSuchTask)?;
        if s.running {
            return Err(RunRefused::AlreadyRunning);
        }
        Ok(Fire {
            slot,
            def: Arc::clone(&s.def),
            stats: Arc::clone(&s.stats),
            due_mono: now.mono,
            due_wall: now.wall,
        })
    }

    fn push(&mut self, slot: usize, mono: Instant, wall: DateTime<Utc>) {
        if let Some(s) = &self.slots[slot] {
            s.stats
                .next_ms
                .store(crate::task::unix_ms(wall), Ordering::Relaxed);
        }
        let generation = self.slots[slot].as_ref().map_or(0, |s| s.generation);
        self.seq += 1;
        self.heap.push(Reverse(Entry {
            mono,
            seq: self.seq,
            slot,
            generation,
            wall,
        }));
    }

    fn is_stale(&self, e: &Entry) -> bool {
        self.slots[e.slot]
            .as_ref()
            .is_none_or(|s| s.generation != e.generation)
    }

    /// When the earliest task is due, dropping stale entries on the way.
    pub fn next_deadline(&mut self) -> Option<Instant> {
        while let Some(Reverse(top)) = self.heap.peek() {
            if self.is_stale(top) {
                self.heap.pop();
            } else {
                return Some(top.mono);
            }
        }
        None
    }

    /// Hands out the next occurrence due at `now` and plans the one after it.
    pub fn pop_due(&mut self, now: Now) -> Option<Fire> {
        loop {
            let Reverse(top) = self.heap.peek()?;
            if self.is_stale(top) {
                self.heap.pop();
                continue;
            }
            if top.mono > now.mono {
                return None;
            }
            let Reverse(e) = self.heap.pop().expect("peeked");
            let s = self.slots[e.slot].as_ref().expect("not stale");
            let (def, stats) = (Arc::clone(&s.def), Arc::clone(&s.stats));
            match following_fire(&def.schedule, e.mono, e.wall, now) {
                Some((mono, wall)) => self.push(e.slot, mono, wall),
                None => stats.next_ms.store(0, Ordering::Relaxed),
            }
            return Some(Fire {
                slot: e.slot,
                def,
                stats,
                due_mono: e.mono,
                due_wall: e.wall,
            });
        }
    }

    /// How far the wall clock moved against the monotonic clock since it was last trusted, when that
    /// is more than [`JUMP_TOLERANCE`].
    pub fn clock_jump(&self, now: Now) -> Option<chrono::Duration> {
        let moved = self.skew(now) - self.reference;
        (moved.unsigned_abs() > JUMP_TOLERANCE.as_nanos())
            .then(|| chrono::Duration::nanoseconds(i64::try_from(moved).unwrap_or(i64::MAX)))
    }

    /// Re-plans every cron task from `now` after a wall-clock jump; returns how many.
    pub fn replan_wall(&mut self, now: Now) -> usize {
        self.reference = self.skew(now);
        let mut n = 0;
        for i in 0..self.slots.len() {
            let Some(s) = self.slots[i].as_mut() else {
                continue;
            };
            if !matches!(s.def.schedule, Schedule::Cron(_)) {
                continue;
            }
            s.generation += 1;
            let def = Arc::clone(&s.def);
            if let Some((mono, wall)) = first_fire(&def.schedule, now, false) {
                self.push(i, mono, wall);
            }
            n += 1;
        }
        n
    }

    pub fn is_running(&self, slot: usize) -> bool {
        self.slots[slot].as_ref().is_some_and(|s| s.running)
    }

    pub fn set_running(&mut self, slot: usize, running: bool) {
        if let Some(s) = self.slots[slot].as_mut() {
            s.running = running;
        }
    }
}

fn mono_at(now: Now, wall: DateTime<Utc>) -> Instant {
    now.mono + (wall - now.wall).to_std().unwrap_or(Duration::ZERO)
}

/// The first occurrence after `now` (for `@reboot`, `now` itself, at start only).
pub fn first_fire(
    schedule: &Schedule,
    now: Now,
    at_start: bool,
) -> Option<(Instant, DateTime<Utc>)> {
    match schedule {
        Schedule::Every { period, offset } => {
            let d = offset.resolve(*period);
            Some((now.mono + d, now.wall + chrono::Duration::from_std(d).ok()?))
        }
        Schedule::Cron(c) => {
            let wall = c.next_after(now.wall)?;
            Some((mono_at(now, wall), wall))
        }
        Schedule::Reboot => at_start.then_some((now.mono, now.wall)),
    }
}

/// The occurrence after the one due at `due_*`. Occurrences missed while the process could not run
/// (a suspended machine, a stalled runtime) are skipped, not fired in a burst.
fn following_fire(
    schedule: &Schedule,
    due_mono: Instant,
    due_wall: DateTime<Utc>,
    now: Now,
) -> Option<(Instant, DateTime<Utc>)> {
    match schedule {
        Schedule::Every { period, .. } => {
            let p = period.as_nanos().max(1);
            let behind = now.mono.saturating_duration_since(due_mono).as_nanos();
            let steps = u32::try_from(behind / p + 1).unwrap_or(u32::MAX);
            let mono = due_mono + period.saturating_mul(steps);
            let wall = now.wall + chrono::Duration::from_std(mono - now.mono).ok()?;
            Some((mono, wall))
        }
        Schedule::Cron(c) => {
            let mut wall = c.next_after(due_wall)?;
            if wall + chrono::Duration::seconds(1) < now.wall {
                wall = c.next_after(now.wall)?;
            }
            Some((mono_at(now, wall), wall))
        }
        Schedule::Reboot => None,
    }
}

/// How the scheduler ended.
#[derive(Debug, Default)]
pub struct Drained {
    /// Runs still going when the grace ran out, which were killed.
    pub killed: usize,
}

pub struct Scheduler {
    plan: Plan,
    clock: Arc<dyn Clock>,
    ctx: RunContext,
    workers: Arc<Semaphore>,
    grace: Duration,
    runs: JoinSet<usize>,
    run_slots: HashMap<Id, usize>,
    changes: Option<mpsc::UnboundedReceiver<Change>>,
    clock_set: Arc<Notify>,
    /// Times the loop woke, for any reason: the measure of "an idle colibri does not wake".
    wakeups: Arc<AtomicU64>,
}

impl Scheduler {
    pub fn new(
        tasks: &[Arc<TaskDef>],
        clock: Arc<dyn Clock>,
        ctx: RunContext,
        workers: usize,
        grace: Duration,
        clock_set: Arc<Notify>,
        stats: Arc<Registry<TaskStats>>,
    ) -> (Self, SchedulerHandle) {
        let now = Now {
            mono: Instant::now(),
            wall: clock.wall(),
        };
        let mut plan = Plan::new(now, stats);
        for t in tasks {
            plan.upsert(Arc::clone(t), now, true);
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let s = Scheduler {
            plan,
            clock,
            ctx,
            workers: Arc::new(Semaphore::new(workers.max(1))),
            grace,
            runs: JoinSet::new(),
            run_slots: HashMap::new(),
            changes: Some(rx),
            clock_set,
            wakeups: Arc::default(),
        };
        (s, SchedulerHandle { tx })
    }

    #[cfg(test)]
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    #[cfg(test)]
    pub fn wakeups(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.wakeups)
    }

    fn now(&self) -> Now {
        Now {
            mono: Instant::now(),
            wall: self.clock.wall(),
        }
    }

    /// Runs until `ctx.stopping` is cancelled, then gives running tasks the grace period.
    pub async fn run(mut self) -> Drained {
        loop {
            let now = Instant::now();
            let cap = now + MAX_SLEEP;
            let wake = self.plan.next_deadline().map_or(cap, |d| d.min(cap));
            tokio::select! {
                biased;
                _ = self.ctx.stopping.cancelled() => break,
                Some(done) = self.runs.join_next_with_id(), if !self.runs.is_empty() => self.finished(done),
                change = recv(&mut self.changes) => self.apply(change),
                _ = self.clock_set.notified() => {}
                _ = tokio::time::sleep_until(wake) => {}
            }
            self.wakeups.fetch_add(1, Ordering::Relaxed);
            let now = self.now();
            if let Some(by) = self.plan.clock_jump(now) {
                let n = self.plan.replan_wall(now);
                tracing::warn!(
                    jump_s = by.num_milliseconds() as f64 / 1000.0,
                    replanned = n,
                    "wall clock jumped; cron tasks re-planned from the new time"
                );
            }
            while let Some(fire) = self.plan.pop_due(now) {
                self.fire(fire);
            }
        }
        // A change sent from now on (a run asked for now) is refused at once, not left waiting.
        self.changes = None;
        self.drain().await
    }

    fn apply(&mut self, change: Option<Change>) {
        let now = self.now();
        match change {
            None => self.changes = None,
            Some(Change::Upsert(def)) => {
                tracing::info!(task = %def.name, schedule = %def.schedule, "task planned");
                self.plan.upsert(def, now, false);
            }
            Some(Change::Remove(name)) => {
                if self.plan.remove(&name) {
                    tracing::info!(task = %name, "task removed");
                }
            }
            Some(Change::RunNow { name, reply }) => {
                let started = self.plan.fire_now(&name, now).map(|fire| {
                    tracing::info!(task = %name, "run asked for now (outside the schedule)");
                    // Not running (fire_now refuses then), and a scheduled time while this run
                    // goes on is skipped: the next run to end is this one.
                    let ended = fire.stats.ended();
                    self.fire(fire);
                    ended
                });
                let _ = reply.send(started);
            }
        }
    }

    fn fire(&mut self, fire: Fire) {
        if self.plan.is_running(fire.slot) {
            let skipped = fire.stats.skipped.fetch_add(1, Ordering::Relaxed) + 1;
            tracing::warn!(
                task = %fire.def.name,
                skipped_total = skipped,
                "run skipped: the previous run is still going"
            );
            return;
        }
        self.plan.set_running(fire.slot, true);
        let ctx = self.ctx.clone();
        let workers = Arc::clone(&self.workers);
        let slot = fire.slot;
        let handle = self.runs.spawn(async move {
            // Stopping wins over a free worker: no run starts once the stop has begun.
            let permit = tokio::select! {
                biased;
                _ = ctx.stopping.cancelled() => return slot,
                p = workers.acquire_owned() => p,
            };
            let late = Instant::now().saturating_duration_since(fire.due_mono);
            task::run(&fire.def, &fire.stats, &ctx, fire.due_wall, late).await;
            drop(permit);
            slot
        });
        self.run_slots.insert(handle.id(), slot);
    }

    fn finished(&mut self, done: Result<(Id, usize), tokio::task::JoinError>) {
        let id = match &done {
            Ok((id, _)) => *id,
            Err(e) => e.id(),
        };
        if let Some(slot) = self.run_slots.remove(&id) {
            self.plan.set_running(slot, false);
        }
        if let Err(e) = done
            && e.is_panic()
        {
            tracing::error!("a task run panicked; the task stays scheduled");
        }
    }

    async fn drain(mut self) -> Drained {
        let running = self.runs.len();
        if running > 0 {
            tracing::info!(
                running,
                grace = %fmt_duration(self.grace),
                "waiting for running tasks to finish"
            );
        }
        let deadline = Instant::now() + self.grace;
        loop {
            tokio::select! {
                done = self.runs.join_next_with_id() => match done {
                    Some(d) => self.finished(d),
                    None => return Drained::default(),
                },
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
        let killed = self.runs.len();
        tracing::warn!(
            killed,
            "shutdown grace is over; terminating the remaining task runs"
        );
        self.ctx.abort.cancel();
        // Each run now signals its group (SIGTERM, then SIGKILL after KILL_GRACE); allow for both
        // grace periods, then stop waiting regardless.
        let hard = Instant::now() + KILL_GRACE * 3;
        loop {
            tokio::select! {
                done = self.runs.join_next_with_id() => match done {
                    Some(d) => self.finished(d),
                    None => break,
                },
                _ = tokio::time::sleep_until(hard) => {
                    self.runs.abort_all();
                    break;
                }
            }
        }
        Drained { killed }
    }
}

async fn recv(rx: &mut Option<mpsc::UnboundedReceiver<Change>>) -> Option<Change> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
