//! A model-based random test: seeded random operations against the store and a simple in-memory
//! model, compared after every step (counters, the accounting identity, contents).

use super::*;

/// A job as the model knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MJob {
    created: u64,
    attempts: u32,
    offset: u32,
    records: Vec<Vec<u8>>,
}

impl MJob {
    fn n(&self) -> u64 {
        self.records.len() as u64
    }
}

/// What one stream should hold: plain maps, no redb.
struct Model {
    cfg: StreamConfig,
    next_id: u64,
    ready: BTreeMap<u64, MJob>,
    retry: BTreeMap<(u64, u64), MJob>,
    dead: BTreeMap<u64, MJob>,
    in_flight: BTreeSet<u64>,
    appended: u64,
    delivered: u64,
    dropped_oldest: u64,
    dropped_newest: u64,
    dropped_dead_full: u64,
    dropped_purged: u64,
    expired: u64,
    replayed: u64,
    /// Jobs a refused `drop_oldest` append may or may not have dropped.
    undecided_drops: Option<Vec<u64>>,
}

#[derive(Debug, PartialEq, Eq)]
enum MAppend {
    Ok(Appended),
    Full,
    Refused(u64),
    /// More jobs than `max_jobs`: can never fit, nothing changes.
    TooLarge,
}

impl Model {
    fn new(cfg: StreamConfig) -> Model {
        Model {
            cfg,
            next_id: 1,
            ready: BTreeMap::new(),
            retry: BTreeMap::new(),
            dead: BTreeMap::new(),
            in_flight: BTreeSet::new(),
            appended: 0,
            delivered: 0,
            dropped_oldest: 0,
            dropped_newest: 0,
            dropped_dead_full: 0,
            dropped_purged: 0,
            expired: 0,
            replayed: 0,
            undecided_drops: None,
        }
    }

    /// Cuts records into jobs: at most `max_records`, at most `max_bytes` of records unless alone.
    fn cut(&self, records: &[Vec<u8>]) -> Vec<Vec<Vec<u8>>> {
        let mut jobs: Vec<Vec<Vec<u8>>> = Vec::new();
        let mut size = 0;
        for r in records {
            let fits = jobs.last().is_some_and(|j| {
                j.len() < self.cfg.batch.max_records as usize
                    && size + r.len() as u64 <= self.cfg.batch.max_bytes
            });
            if !fits {
                jobs.push(Vec::new());
                size = 0;
            }
            jobs.last_mut().unwrap().push(r.clone());
            size += r.len() as u64;
        }
        jobs
    }

    fn queued(&self) -> u64 {
        (self.ready.len() + self.retry.len()) as u64
    }

    fn append(&mut self, records: &[Vec<u8>], now: u64) -> MAppend {
        let jobs = self.cut(records);
        let nj = jobs.len() as u64;
        let n = records.len() as u64;
        let mut dropped = 0;
        if nj > self.cfg.max_jobs {
            return MAppend::TooLarge;
        }
        if self.queued() + nj > self.cfg.max_jobs {
            match self.cfg.when_full {
                WhenFull::Block => return MAppend::Full,
                WhenFull::Downsample => unreachable!("the model does not downsample"),
                WhenFull::DropNewest => {
                    self.appended += n;
                    self.dropped_newest += n;
                    return MAppend::Refused(n);
                }
                WhenFull::DropOldest => {
                    let mut q = self.queued();
                    let mut victims = Vec::new();
                    for &id in self.ready.keys() {
                        if q + nj <= self.cfg.max_jobs {
                            break;
                        }
                        if !self.in_flight.contains(&id) {
                            victims.push(id);
                            q -= 1;
                        }
                    }
                    if q + nj > self.cfg.max_jobs {
                        // Cannot fit even after dropping: whether the droppable jobs go anyway
                        // is left open (see `drop_oldest_deletes_nothing_when_the_batch_cannot_
                        // fit_anyway`); the caller settles it from what the store did.
                        self.undecided_drops = Some(victims);
                        return MAppend::Full;
                    }
                    for id in victims {
                        dropped += self.ready.remove(&id).unwrap().n();
                    }
                    self.dropped_oldest += dropped;
                }
            }
        }
        for records in jobs {
            self.ready.insert(
                self.next_id,
                MJob {
                    created: now,
                    attempts: 0,
                    offset: 0,
                    records,
                },
            );
            self.next_id += 1;
        }
        self.appended += n;
        MAppend::Ok(Appended {
            jobs: nj,
            records: n,
            dropped_oldest: dropped,
        })
    }

    /// (id, retry due, job) in the order `take` must hand them out.
    fn take(&mut self, max: usize, now: u64) -> Vec<(u64, Option<u64>, MJob)> {
        let mut out = Vec::new();
        for (&(due, id), j) in self.retry.range(..=(now, u64::MAX)) {
            if out.len() >= max {
                break;
            }
            if !self.in_flight.contains(&id) {
                out.push((id, Some(due), j.clone()));
            }
        }
        for (&id, j) in &self.ready {
            if out.len() >= max {
                break;
            }
            if !self.in_flight.contains(&id) {
                out.push((id, None, j.clone()));
            }
        }
        for (id, _, _) in &out {
            self.in_flight.insert(*id);
        }
        out
    }

    fn remove_leased(&mut self, lease: &Lease) -> MJob {
        self.in_flight.remove(&lease.id);
        match lease.retry_due {
            None => self.ready.remove(&lease.id),
            Some(due) => self.retry.remove(&(due, lease.id)),
        }
        .expect("the model knows the job")
    }

    fn ack(&mut self, lease: &Lease) {
        let j = self.remove_leased(lease);
        self.delivered += j.n();
    }

    fn fail(&mut self, lease: &Lease, failure: &Failure) -> Failed {
        let mut j = self.remove_leased(lease);
        j.attempts += 1;
        let attempts = j.attempts;
        match failure {
            Failure::Transient {
                retry_at_ms,
                max_attempts,
                ..
            } if attempts < *max_attempts => {
                self.retry.insert((*retry_at_ms, lease.id), j);
                Failed::Retry {
                    attempts,
                    due_ms: *retry_at_ms,
                }
            }
            _ => {
                self.dead.insert(lease.id, j);
                self.trim_dead();
                Failed::Dead { attempts }
            }
        }
    }

    fn trim_dead(&mut self) {
        while self.dead.len() as u64 > self.cfg.dead_max_jobs {
            let (_, old) = self.dead.pop_first().unwrap();
            self.dropped_dead_full += old.n();
        }
    }

    fn leased(&mut self, lease: &Lease) -> &mut MJob {
        match lease.retry_due {
            None => self.ready.get_mut(&lease.id),
            Some(due) => self.retry.get_mut(&(due, lease.id)),
        }
        .expect("the model knows the job")
    }

    /// The first `n` records of a leased job are delivered, or become a dead letter of their own.
    fn settle(&mut self, lease: &Lease, n: usize, dead: bool) -> MJob {
        let j = self.leased(lease);
        let part = MJob {
            created: j.created,
            attempts: j.attempts,
            offset: j.offset,
            records: j.records.drain(..n).collect(),
        };
        j.offset += n as u32;
        let rest = j.clone();
        if dead {
            self.dead.insert(self.next_id, part);
            self.next_id += 1;
            self.trim_dead();
        } else {
            self.delivered += part.n();
        }
        rest
    }

    fn expire(&mut self, now: u64) -> u64 {
        let Some(ttl) = self.cfg.ttl else { return 0 };
        let cutoff = now.saturating_sub(ttl.as_millis() as u64);
        let mut n = 0;
        let mut victims = Vec::new();
        for (&id, j) in &self.ready {
            if j.created > cutoff {
                break;
            }
            if !self.in_flight.contains(&id) {
                victims.push(id);
            }
        }
        for id in victims {
            n += self.ready.remove(&id).unwrap().n();
        }
        let victims: Vec<(u64, u64)> = self
            .retry
            .iter()
            .filter(|(k, j)| j.created <= cutoff && !self.in_flight.contains(&k.1))
            .map(|(k, _)| *k)
            .collect();
        for k in victims {
            n += self.retry.remove(&k).unwrap().n();
        }
        self.expired += n;
        n
    }

    fn replay_all(&mut self) -> (u64, u64) {
        let (mut jobs, mut records) = (0, 0);
        for (id, mut j) in std::mem::take(&mut self.dead) {
            j.attempts = 0;
            jobs += 1;
            records += j.n();
            self.ready.insert(id, j);
        }
        self.replayed += records;
        (jobs, records)
    }

    fn purge_all(&mut self) -> (u64, u64) {
        let jobs = self.dead.len() as u64;
        let records: u64 = self.dead.values().map(MJob::n).sum();
        self.dead.clear();
        self.dropped_purged += records;
        (jobs, records)
    }

    #[track_caller]
    fn compare(&self, store: &Store, ctx: &str) {
        let c = counters(store, &self.cfg.name);
        let want = [
            ("next_id", self.next_id),
            ("ready_jobs", self.ready.len() as u64),
            ("ready_records", total(self.ready.values())),
            ("retry_jobs", self.retry.len() as u64),
            ("retry_records", total(self.retry.values())),
            ("dead_jobs", self.dead.len() as u64),
            ("dead_records", total(self.dead.values())),
            ("appended_records", self.appended),
            ("delivered_records", self.delivered),
            ("dropped_oldest_records", self.dropped_oldest),
            ("dropped_newest_records", self.dropped_newest),
            ("dropped_dead_full_records", self.dropped_dead_full),
            ("dropped_purged_records", self.dropped_purged),
            ("expired_records", self.expired),
            ("replayed_records", self.replayed),
            ("quarantined_records", 0),
        ];
        let got: BTreeMap<&str, u64> = Counters::NAMES.iter().copied().zip(c.values()).collect();
        for (name, v) in want {
            assert_eq!(got[name], v, "{ctx}: counter {name}");
        }
        assert_eq!(
            store.in_flight(&self.cfg.name),
            self.in_flight.len(),
            "{ctx}: jobs in flight"
        );
    }
}

fn total<'a>(jobs: impl Iterator<Item = &'a MJob>) -> u64 {
    jobs.map(MJob::n).sum()
}

/// Random records: unique content, lengths that make `batch.max_bytes` cut.
fn random_records(rng: &mut fastrand::Rng, tag: &mut u64, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|_| {
            *tag += 1;
            let mut r = format!("{tag}:").into_bytes();
            r.resize(r.len() + rng.usize(0..20), b'.');
            r
        })
        .collect()
}

/// How often the random runs reached each interesting case (a vacuous run would pass too).
#[derive(Debug, Default)]
struct Coverage {
    full: u64,
    refused: u64,
    dropped_oldest: u64,
    refused_after_dropping: u64,
    retry_taken: u64,
    dead_trimmed: u64,
    expired: u64,
    replayed: u64,
    purged: u64,
    reopens: u64,
    aborts: u64,
    settled_delivered: u64,
    settled_dead: u64,
}

/// The stream of the model runs.
const M: &str = "m";

fn run_model(seed: u64, ops: usize, cov: &mut Coverage) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let cfg = random_config(seed, &mut rng);
    let disk = MemDisk::default();
    let streams = [cfg.clone()];
    let mut store = open_mem(&disk, unbounded(), &streams);
    let mut run = Run {
        rng,
        model: Model::new(cfg),
        held: Vec::new(),
        now: T0,
        tag: 0,
        cov,
    };
    for step in 0..ops {
        run.now += run.rng.u64(0..300);
        let op = run.rng.u32(0..100);
        let ctx = format!("seed {seed} step {step} op {op}");
        let holds = !run.held.is_empty();
        match op {
            0..30 => run.append(&mut store, &ctx),
            30..50 | 97..100 => run.take(&mut store, &ctx, op >= 97),
            50..74 if holds => run.settle_held(&mut store, &ctx, op),
            74..79 if holds => run.release(&mut store),
            79..85 => run.expire(&mut store, &ctx),
            85..88 => {
                drop(store);
                store = open_mem(&disk, unbounded(), &streams);
                run.reopened();
            }
            88..92 => run.abort(&mut store, &ctx),
            92..95 => run.replay(&mut store, &ctx),
            95..97 => run.purge(&mut store, &ctx),
            _ => continue,
        }
        check(&store);
        run.model.compare(&store, &ctx);
    }
    // The end state survives a restart, and everything left is delivered in model order.
    drop(store);
    let Run { mut model, cov, .. } = run;
    cov.dead_trimmed += model.dropped_dead_full;
    cov.expired += model.expired;
    cov.replayed += model.replayed;
    cov.purged += model.dropped_purged;
    let mut store = open_mem(&disk, unbounded(), &streams);
    model.in_flight.clear();
    model.compare(&store, &format!("seed {seed} after the final reopen"));
    let want = model.take(usize::MAX, u64::MAX);
    let got = take_all(&mut store, M, u64::MAX);
    assert_eq!(
        ids(&got),
        want.iter().map(|w| w.0).collect::<Vec<_>>(),
        "seed {seed}: final drain"
    );
}

/// The model stream's settings, drawn from `rng` (its policies from `seed`).
fn random_config(seed: u64, rng: &mut fastrand::Rng) -> StreamConfig {
    StreamConfig {
        name: M.into(),
        sink: None,
        batch: BatchConfig {
            max_records: rng.u32(1..6),
            max_bytes: rng.u64(8..64),
            linger: Duration::ZERO,
        },
        max_jobs: rng.u64(4..24),
        max_bytes: 1 << 40,
        when_full: [WhenFull::Block, WhenFull::DropNewest, WhenFull::DropOldest]
            [(seed % 3) as usize],
        ttl: rng
            .bool()
            .then(|| Duration::from_millis(rng.u64(2_000..8_000))),
        max_age: None,
        dead_max_jobs: rng.u64(1..6),
        compression: [AtRest::Plain, AtRest::Always, AtRest::Waiting][(seed / 3 % 3) as usize],
        replay: crate::store::Replay::OLDEST_FIRST,
        hold_until_clock_synced: false,
        downsample: None,
    }
}

/// One seeded run between its operations: the randomness, the model, the leases held, the clock,
/// the records' next tag, and the coverage counted. An operation per method, each checking the
/// store against the model.
struct Run<'a> {
    rng: fastrand::Rng,
    model: Model,
    held: Vec<Lease>,
    now: u64,
    tag: u64,
    cov: &'a mut Coverage,
}

impl Run<'_> {
    fn append(&mut self, store: &mut Store, ctx: &str) {
        let n = self.rng.usize(1..=12);
        let records = random_records(&mut self.rng, &mut self.tag, n);
        let want = self.model.append(&records, self.now);
        let got = append(store, M, &records, self.now);
        let got = match got {
            Ok(a) => MAppend::Ok(a),
            Err(AppendError::Full { .. }) => MAppend::Full,
            Err(AppendError::Refused { records, .. }) => MAppend::Refused(records),
            Err(AppendError::TooLarge { .. }) => MAppend::TooLarge,
            Err(e) => panic!("{ctx}: {e}"),
        };
        assert_eq!(got, want, "{ctx}: append");
        match &got {
            MAppend::Full | MAppend::TooLarge => self.cov.full += 1,
            MAppend::Refused(_) => self.cov.refused += 1,
            MAppend::Ok(a) if a.dropped_oldest > 0 => self.cov.dropped_oldest += 1,
            MAppend::Ok(_) => {}
        }
        if let Some(victims) = self.model.undecided_drops.take()
            && counters(store, M).dropped_oldest_records != self.model.dropped_oldest
        {
            // The store dropped what it could before refusing: follow it (the counters
            // and every later take check that it dropped exactly these).
            for id in victims {
                self.model.dropped_oldest += self.model.ready.remove(&id).unwrap().n();
            }
            self.cov.refused_after_dropping += 1;
        }
    }

    /// Takes jobs; `deliver`: acks them in the same transaction, else holds their leases.
    fn take(&mut self, store: &mut Store, ctx: &str, deliver: bool) {
        let max = self.rng.usize(1..6);
        let want = self.model.take(max, self.now);
        let mut tx = store.transaction().unwrap();
        let jobs = tx.take(M, max, u64::MAX, self.now).unwrap();
        let got: Vec<(u64, Option<u64>, MJob)> = jobs
            .iter()
            .map(|j| {
                (
                    j.lease.id,
                    j.lease.retry_due,
                    MJob {
                        created: j.created_ms,
                        attempts: j.attempts,
                        offset: j.offset,
                        records: owned(j),
                    },
                )
            })
            .collect();
        assert_eq!(got, want, "{ctx}: take");
        self.cov.retry_taken += got.iter().filter(|g| g.1.is_some()).count() as u64;
        if deliver {
            // Deliver in the same transaction.
            for j in &jobs {
                tx.ack(&j.lease).unwrap();
                self.model.ack(&j.lease);
            }
            tx.commit().unwrap();
        } else {
            tx.commit().unwrap();
            self.held.extend(jobs.into_iter().map(|j| j.lease));
        }
    }

    /// Settles a held job by `op`: part of it, all of it delivered, or a transient or permanent
    /// failure.
    fn settle_held(&mut self, store: &mut Store, ctx: &str, op: u32) {
        let lease = self.held.swap_remove(self.rng.usize(..self.held.len()));
        let count = self.model.leased(&lease).records.len();
        match op {
            50..56 if count >= 2 => self.settle_part(store, ctx, lease, count),
            50..63 => {
                self.model.ack(&lease);
                ack(store, &[&lease]);
            }
            63..71 => {
                let f = transient(self.now + self.rng.u64(0..3_000), 3);
                let want = self.model.fail(&lease, &f);
                assert_eq!(fail(store, &lease, &f, self.now), want, "{ctx}: fail");
            }
            _ => {
                let want = self.model.fail(&lease, &permanent());
                let got = fail(store, &lease, &permanent(), self.now);
                assert_eq!(got, want, "{ctx}: permanent fail");
            }
        }
    }

    /// Settles the first records of a held job of `count`, delivered or dead; the rest stays held.
    fn settle_part(&mut self, store: &mut Store, ctx: &str, lease: Lease, count: usize) {
        let n = self.rng.usize(1..count);
        let to_dead = self.rng.bool();
        let want = self.model.settle(&lease, n, to_dead);
        let outcome = if to_dead {
            self.cov.settled_dead += 1;
            Settle::Dead {
                reason: format!("{ctx}: refused"),
            }
        } else {
            self.cov.settled_delivered += 1;
            Settle::Delivered
        };
        let rest = settle(store, &lease, n as u32, &outcome, self.now);
        let got = MJob {
            created: rest.created_ms,
            attempts: rest.attempts,
            offset: rest.offset,
            records: owned(&rest),
        };
        assert_eq!(got, want, "{ctx}: settle");
        assert_eq!(rest.lease, lease, "{ctx}: settle keeps the lease");
        self.held.push(lease);
    }

    fn release(&mut self, store: &mut Store) {
        let lease = self.held.swap_remove(self.rng.usize(..self.held.len()));
        self.model.in_flight.remove(&lease.id);
        store.release(&lease);
    }

    fn expire(&mut self, store: &mut Store, ctx: &str) {
        self.now += self.rng.u64(0..4_000);
        let want = self.model.expire(self.now);
        let mut tx = store.transaction().unwrap();
        assert_eq!(tx.expire(self.now).unwrap(), want, "{ctx}: expire");
        tx.commit().unwrap();
    }

    /// After the store was reopened: no lease survives it.
    fn reopened(&mut self) {
        self.cov.reopens += 1;
        self.held.clear();
        self.model.in_flight.clear();
    }

    /// Work that is never committed.
    fn abort(&mut self, store: &mut Store, ctx: &str) {
        self.cov.aborts += 1;
        let n = self.rng.usize(1..5);
        let records = random_records(&mut self.rng, &mut self.tag, n);
        {
            let mut tx = store.transaction().unwrap();
            let _ = tx.append_list(M, &records, Some(("src", b"aborted")), self.now);
            let _ = tx.take(M, 3, u64::MAX, self.now).unwrap();
            if let Some(l) = self.held.first() {
                tx.ack(l).unwrap();
            }
            tx.expire(self.now + 1_000_000).unwrap();
        }
        // The next transaction reloads the counters.
        store.transaction().unwrap().commit().unwrap();
        assert_eq!(store.checkpoint("src").unwrap(), None);
        // The aborted ack released its lease; take it back so `held` stays true.
        if let Some(l) = self.held.first() {
            assert!(!store.streams[M].in_flight.contains(&l.id), "{ctx}");
            store.streams.get_mut(M).unwrap().in_flight.insert(l.id);
        }
    }

    fn replay(&mut self, store: &mut Store, ctx: &str) {
        let want = self.model.replay_all();
        let mut tx = store.transaction().unwrap();
        assert_eq!(
            tx.replay_dead(M, None, None, usize::MAX).unwrap(),
            want,
            "{ctx}: replay"
        );
        tx.commit().unwrap();
    }

    fn purge(&mut self, store: &mut Store, ctx: &str) {
        let want = self.model.purge_all();
        let mut tx = store.transaction().unwrap();
        assert_eq!(
            tx.purge_dead(M, None, usize::MAX).unwrap(),
            want,
            "{ctx}: purge"
        );
        tx.commit().unwrap();
    }
}

#[test]
fn model_based_random_operations() {
    let started = Instant::now();
    let mut cov = Coverage::default();
    for seed in 0..40 {
        run_model(seed, 300, &mut cov);
    }
    eprintln!(
        "model-based: 40 seeds x 300 ops in {:?}; {cov:?}",
        started.elapsed()
    );
    let c = &cov;
    for (what, n) in [
        ("full", c.full),
        ("refused", c.refused),
        ("dropped oldest", c.dropped_oldest),
        ("retry jobs taken", c.retry_taken),
        ("dead letters trimmed", c.dead_trimmed),
        ("expired", c.expired),
        ("replayed", c.replayed),
        ("purged", c.purged),
        ("reopens", c.reopens),
        ("aborted transactions", c.aborts),
        ("settled as delivered", c.settled_delivered),
        ("settled as dead", c.settled_dead),
    ] {
        assert!(n > 0, "the random runs never reached: {what}");
    }
}
