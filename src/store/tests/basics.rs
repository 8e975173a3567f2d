//! Basics of the `Tx` API on a real file: append, take, ack, fail, bounds and `when_full`, dead
//! letters, expiry, checkpoints, reopening.

use super::*;

#[test]
fn take_hands_out_jobs_fifo_and_ack_deletes_them() {
    let d = Dir::new(vec![stream(S)]);
    let mut store = d.open();
    for (tag, n) in [("a", 3), ("b", 2), ("c", 1)] {
        let a = append(&mut store, S, &recs(tag, n), T0).unwrap();
        assert_eq!(
            a,
            Appended {
                jobs: 1,
                records: n as u64,
                dropped_oldest: 0
            }
        );
    }
    let first = take(&mut store, S, 2, T0 + 1);
    assert_eq!(ids(&first), [1, 2]);
    assert_eq!(owned(&first[0]), recs("a", 3));
    assert_eq!(owned(&first[1]), recs("b", 2));
    assert_eq!(first[0].attempts, 0);
    assert_eq!(first[0].created_ms, T0);
    assert_eq!(first[0].lease.retry_due, None);
    assert_eq!(first[0].last_error, None);
    let rest = take(&mut store, S, 10, T0 + 1);
    assert_eq!(ids(&rest), [3]);
    assert!(take(&mut store, S, 10, T0 + 1).is_empty());
    assert_eq!(store.in_flight(S), 3);

    // Acknowledged out of order; each deletes exactly its job.
    ack(&mut store, &[&first[1].lease]);
    ack(&mut store, &[&first[0].lease, &rest[0].lease]);
    let c = counters(&store, S);
    assert_eq!((c.delivered_jobs, c.delivered_records), (3, 6));
    assert_eq!((c.ready_jobs, c.ready_records, c.ready_bytes), (0, 0, 0));
    assert_eq!(c.appended_records, 6);
    assert_eq!(store.in_flight(S), 0);
    // A second ack of a delivered job is an error, not a double count.
    let mut tx = store.transaction().unwrap();
    assert!(matches!(
        tx.ack(&first[0].lease),
        Err(StoreError::NoSuchJob { id: 1, .. })
    ));
    // Nothing changed: after an abort the counters read back the same.
    tx.abort().unwrap();

    // Ids keep growing across a reopen.
    let mut store = d.reopen(store);
    append(&mut store, S, &recs("d", 1), T0).unwrap();
    assert_eq!(ids(&take(&mut store, S, 10, T0)), [4]);
}

#[test]
fn append_cuts_jobs_by_max_records_and_max_bytes() {
    let mut cfg = stream(S);
    cfg.batch.max_records = 3;
    cfg.batch.max_bytes = 10;
    let d = Dir::new(vec![cfg]);
    let mut store = d.open();
    // (record sizes, expected records per job)
    let cases: [(&[usize], &[usize]); 5] = [
        (&[1, 1, 1, 1, 1, 1, 1], &[3, 3, 1]),
        (&[4, 4, 4, 4], &[2, 2]),
        // A record larger than max_bytes travels alone.
        (&[6, 15, 1], &[1, 1, 1]),
        // Exactly max_bytes fits.
        (&[5, 5, 1], &[2, 1]),
        (&[2], &[1]),
    ];
    for (i, (sizes, cut)) in cases.iter().enumerate() {
        let records = sized(i as u8 * 40, sizes);
        let a = append(&mut store, S, &records, T0).unwrap();
        assert_eq!(a.jobs, cut.len() as u64, "case {i}");
        assert_eq!(a.records, records.len() as u64, "case {i}");
        let jobs = take(&mut store, S, 100, T0);
        let got: Vec<usize> = jobs.iter().map(|j| j.record_count()).collect();
        assert_eq!(&got, cut, "case {i}: records per job");
        let flat: Vec<Vec<u8>> = jobs.iter().flat_map(owned).collect();
        assert_eq!(flat, records, "case {i}: records in order");
        let leases: Vec<&Lease> = jobs.iter().map(|j| &j.lease).collect();
        ack(&mut store, &leases);
    }
    let c = counters(&store, S);
    assert_eq!(c.appended_jobs, 3 + 2 + 3 + 2 + 1);
    assert_eq!(c.delivered_jobs, c.appended_jobs);
    d.reopen(store);
}

#[test]
fn due_retry_jobs_come_before_ready_ones_and_early_ones_wait() {
    let d = Dir::new(vec![stream(S)]);
    let mut store = d.open();
    for tag in ["a", "b", "c"] {
        append(&mut store, S, &recs(tag, 1), T0).unwrap();
    }
    let jobs = take(&mut store, S, 2, T0);
    assert_eq!(ids(&jobs), [1, 2]);
    assert_eq!(
        fail(&mut store, &jobs[0].lease, &transient(T0 + 1000, 5), T0),
        Failed::Retry {
            attempts: 1,
            due_ms: T0 + 1000
        }
    );
    assert_eq!(
        fail(&mut store, &jobs[1].lease, &transient(T0 + 500, 5), T0),
        Failed::Retry {
            attempts: 1,
            due_ms: T0 + 500
        }
    );
    let c = counters(&store, S);
    assert_eq!((c.retry_jobs, c.ready_jobs, c.retried_attempts), (2, 1, 2));

    // Nothing is due yet: only the ready job.
    let now = take(&mut store, S, 10, T0 + 499);
    assert_eq!(ids(&now), [3]);
    store.release(&now[0].lease);

    // Job 2 is due (its time has come exactly), job 1 is not.
    let now = take(&mut store, S, 10, T0 + 500);
    assert_eq!(ids(&now), [2, 3]);
    assert_eq!(now[0].lease.retry_due, Some(T0 + 500));
    assert_eq!(now[0].attempts, 1);
    assert_eq!(now[0].last_error.as_deref(), Some("503"));
    assert_eq!(owned(&now[0]), recs("b", 1));
    assert_eq!(now[1].lease.retry_due, None);
    for j in &now {
        store.release(&j.lease);
    }

    // Both due: by due time, then the ready one; max_jobs cuts the list.
    assert_eq!(ids(&take(&mut store, S, 1, T0 + 5000)), [2]);
    let all = take(&mut store, S, 10, T0 + 5000);
    assert_eq!(ids(&all), [1, 3]);
    assert_eq!(all[0].lease.retry_due, Some(T0 + 1000));
    // After a restart nothing is in flight: the same order again.
    let mut store = d.reopen(store);
    let all = take(&mut store, S, 10, T0 + 5000);
    assert_eq!(ids(&all), [2, 1, 3]);
    // Acknowledging a retry job deletes it from the retry table.
    ack(&mut store, &[&all[0].lease, &all[1].lease]);
    let c = counters(&store, S);
    assert_eq!((c.retry_jobs, c.delivered_jobs), (0, 2));
}

#[test]
fn transient_failures_go_dead_after_max_attempts() {
    let d = Dir::new(vec![stream(S)]);
    let mut store = d.open();
    append(&mut store, S, &recs("a", 4), T0).unwrap();
    let mut now = T0;
    for attempt in 1..=3u32 {
        let jobs = take(&mut store, S, 10, now);
        assert_eq!(ids(&jobs), [1], "attempt {attempt}");
        assert_eq!(jobs[0].attempts, attempt - 1);
        let r = fail(&mut store, &jobs[0].lease, &transient(now + 100, 3), now);
        if attempt < 3 {
            assert_eq!(
                r,
                Failed::Retry {
                    attempts: attempt,
                    due_ms: now + 100
                }
            );
        } else {
            assert_eq!(r, Failed::Dead { attempts: 3 });
        }
        now += 100;
    }
    assert!(take(&mut store, S, 10, now + 1_000_000).is_empty());
    let c = counters(&store, S);
    assert_eq!((c.dead_jobs, c.dead_records), (1, 4));
    assert_eq!((c.retry_jobs, c.ready_jobs), (0, 0));
    assert_eq!((c.retried_attempts, c.dead_lettered_records), (2, 4));
    let dead = store.peek(S, true, 10).unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!((dead[0].id, dead[0].attempts), (1, 3));
    assert_eq!(dead[0].last_error.as_deref(), Some("503"));
    assert_eq!(dead[0].last_failed_ms, T0 + 200);
    d.reopen(store);
}

#[test]
fn permanent_failure_goes_dead_at_once() {
    let d = Dir::new(vec![stream(S)]);
    let mut store = d.open();
    append(&mut store, S, &recs("a", 2), T0).unwrap();
    let jobs = take(&mut store, S, 10, T0);
    assert_eq!(
        fail(&mut store, &jobs[0].lease, &permanent(), T0 + 7),
        Failed::Dead { attempts: 1 }
    );
    let c = counters(&store, S);
    assert_eq!((c.dead_jobs, c.dead_records, c.retried_attempts), (1, 2, 0));
    let dead = store.peek(S, true, 10).unwrap();
    assert_eq!(dead[0].last_error.as_deref(), Some("400 bad request"));
    assert_eq!(dead[0].records, Ok(vec!["a-0".to_string(), "a-1".into()]));
    assert!(take(&mut store, S, 10, u64::MAX).is_empty());
    d.reopen(store);
}

#[test]
fn dead_letters_beyond_max_jobs_drop_the_oldest() {
    let mut cfg = stream(S);
    cfg.dead_max_jobs = 2;
    let d = Dir::new(vec![cfg]);
    let mut store = d.open();
    // Job i holds i records, so what was dropped is visible in the count.
    for i in 1..=4 {
        append(&mut store, S, &recs(&format!("j{i}"), i), T0).unwrap();
    }
    let jobs = take(&mut store, S, 10, T0);
    for j in &jobs {
        fail(&mut store, &j.lease, &permanent(), T0);
    }
    let c = counters(&store, S);
    assert_eq!((c.dead_jobs, c.dead_records), (2, 3 + 4));
    assert_eq!(c.dropped_dead_full_records, 1 + 2);
    assert_eq!(c.dead_lettered_records, 10);
    let dead: Vec<u64> = store
        .peek(S, true, 10)
        .unwrap()
        .iter()
        .map(|p| p.id)
        .collect();
    assert_eq!(dead, [3, 4]);
    d.reopen(store);
}

/// `on_max_age: stream:NAME`: a too old job (ready or waiting for a retry) moves to the other
/// stream's ready queue in the take's transaction, keeping its key (store, id, stream) and
/// starting its attempts over; both streams balance (moved out here, moved in there) after every
/// commit and across a reopen. A job in flight is left alone.
#[test]
fn a_job_older_than_max_age_moves_to_its_archive_stream_with_its_key() {
    let mut cfg = stream(S);
    cfg.max_age = Some(MaxAge {
        age: Duration::from_secs(30),
        then: OnMaxAge::Move("archive".into()),
    });
    let d = Dir::new(vec![cfg, stream("archive")]);
    let mut store = d.open();
    append(&mut store, S, &recs("a", 1), T0).unwrap(); // 1
    append(&mut store, S, &recs("b", 2), T0 + 1_000).unwrap(); // 2
    append(&mut store, S, &recs("c", 3), T0 + 2_000).unwrap(); // 3
    append(&mut store, S, &recs("d", 4), T0 + 50_000).unwrap(); // 4
    append(&mut store, "archive", &recs("own", 1), T0 + 50_000).unwrap();
    // Job 1 in flight; job 2 fails once (to retry, due at once).
    let taken = take(&mut store, S, 2, T0 + 20_000);
    assert_eq!(ids(&taken), [1, 2]);
    fail(
        &mut store,
        &taken[1].lease,
        &transient(T0 + 20_000, 5),
        T0 + 20_000,
    );
    assert_eq!(ids(&take(&mut store, S, 16, T0 + 51_000)), [4]);
    check(&store);
    let (c, a) = (counters(&store, S), counters(&store, "archive"));
    assert_eq!(
        (c.moved_out_records, a.moved_in_records),
        (5, 5),
        "jobs 2 and 3"
    );
    assert_eq!(
        (c.retry_jobs, c.ready_jobs),
        (0, 2),
        "job 1 in flight, job 4"
    );
    assert_eq!((a.ready_jobs, a.appended_records), (3, 1));
    let moved = take(&mut store, "archive", 16, T0 + 51_000);
    let keys: Vec<_> = moved
        .iter()
        .map(|j| (owned(j).len(), j.attempts, j.origin.clone()))
        .collect();
    let origin = |job| {
        Some(format::Origin {
            store: store.id,
            job,
            stream: Some(S.to_string()),
        })
    };
    assert_eq!(
        keys,
        [(1, 0, None), (3, 0, origin(3)), (2, 0, origin(2))],
        "its own job, then the moved ones in the order they were found (ready, then retry)"
    );
    d.reopen(store);
}

#[test]
fn a_take_never_hands_out_a_job_older_than_max_age() {
    let mut cfg = stream(S);
    cfg.max_age = Some(MaxAge {
        age: Duration::from_secs(30),
        then: OnMaxAge::Drop,
    });
    let d = Dir::new(vec![cfg]);
    let mut store = d.open();
    append(&mut store, S, &recs("a", 1), T0).unwrap(); // 1
    append(&mut store, S, &recs("b", 2), T0 + 20_000).unwrap(); // 2
    append(&mut store, S, &recs("c", 3), T0 + 50_000).unwrap(); // 3
    // Job 1 is in flight when it and job 2 get too old: job 2 goes unsent, job 1 stays leased.
    assert_eq!(ids(&take(&mut store, S, 1, T0 + 20_000)), [1]);
    assert_eq!(ids(&take(&mut store, S, 16, T0 + 51_000)), [3]);
    let c = counters(&store, S);
    assert_eq!(
        c.expired_records, 2,
        "job 2 (two records) older than 30 s: {c:?}"
    );
    assert_eq!(
        (c.ready_jobs, c.ready_records),
        (2, 4),
        "job 1 in flight, job 3"
    );
    d.reopen(store);
}

#[test]
fn ttl_expires_old_queued_jobs_but_never_one_in_flight() {
    let mut cfg = stream(S);
    cfg.ttl = Some(Duration::from_secs(10));
    let d = Dir::new(vec![cfg, stream("no-ttl")]);
    let mut store = d.open();
    append(&mut store, S, &recs("a", 1), T0).unwrap(); // 1
    append(&mut store, S, &recs("b", 2), T0 + 5_000).unwrap(); // 2
    append(&mut store, S, &recs("c", 3), T0 + 8_000).unwrap(); // 3
    append(&mut store, S, &recs("d", 4), T0 + 9_000).unwrap(); // 4
    append(&mut store, "no-ttl", &recs("x", 5), T0).unwrap();
    // Job 3 waits in retry, job 4 is in flight.
    let jobs = take(&mut store, S, 4, T0 + 9_000);
    fail(
        &mut store,
        &jobs[2].lease,
        &transient(T0 + 60_000, 9),
        T0 + 9_000,
    );
    store.release(&jobs[0].lease);
    store.release(&jobs[1].lease);

    let expire = |store: &mut Store, now: u64| {
        let mut tx = store.transaction().unwrap();
        let n = tx.expire(now).unwrap();
        tx.commit().unwrap();
        check(store);
        n
    };
    assert_eq!(expire(&mut store, T0 + 9_999), 0);
    // Age exactly the ttl: expired.
    assert_eq!(expire(&mut store, T0 + 10_000), 1);
    assert_eq!(expire(&mut store, T0 + 15_000), 2);
    // Job 3 (in retry) goes too; job 4 is in flight and stays.
    assert_eq!(expire(&mut store, T0 + 100_000), 3);
    let c = counters(&store, S);
    assert_eq!(c.expired_records, 6);
    assert_eq!((c.ready_jobs, c.retry_jobs), (1, 0));
    assert_eq!(counters(&store, "no-ttl").expired_records, 0);
    store.release(&jobs[3].lease);
    assert_eq!(expire(&mut store, T0 + 100_000), 4);
    assert!(take(&mut store, S, 10, u64::MAX).is_empty());
    let c = counters(&store, S);
    assert_eq!((c.expired_records, c.ready_jobs), (10, 0));
    d.reopen(store);
}

#[test]
fn replay_moves_dead_back_to_ready_and_purge_counts_as_dropped() {
    let d = Dir::new(vec![stream(S)]);
    let mut store = d.open();
    for i in 1..=4 {
        append(&mut store, S, &recs(&format!("j{i}"), i), T0).unwrap();
    }
    let jobs = take(&mut store, S, 3, T0);
    for j in &jobs {
        fail(&mut store, &j.lease, &permanent(), T0);
    }
    // Dead: 1, 2, 3; ready: 4.
    let mut tx = store.transaction().unwrap();
    assert!(matches!(
        tx.replay_dead(S, Some(99), None, usize::MAX),
        Err(StoreError::NoSuchJob { id: 99, .. })
    ));
    assert_eq!(
        tx.replay_dead(S, Some(2), None, usize::MAX).unwrap(),
        (1, 2)
    );
    tx.commit().unwrap();
    check(&store);
    let back = take(&mut store, S, 10, T0);
    assert_eq!(ids(&back), [2, 4], "keeps its id, so its old place");
    assert_eq!((back[0].attempts, back[0].last_error.clone()), (0, None));
    assert_eq!(owned(&back[0]), recs("j2", 2));
    assert_eq!(back[0].created_ms, T0);
    for j in &back {
        store.release(&j.lease);
    }
    let mut tx = store.transaction().unwrap();
    assert_eq!(
        tx.replay_dead(S, None, None, usize::MAX).unwrap(),
        (2, 1 + 3)
    );
    tx.commit().unwrap();
    check(&store);
    assert_eq!(counters(&store, S).replayed_records, 2 + 4);
    let all = take(&mut store, S, 10, T0);
    assert_eq!(ids(&all), [1, 2, 3, 4]);

    // Fail 1 and 3 at different times; purge what failed before a time, then the rest.
    fail(&mut store, &all[0].lease, &permanent(), T0 + 100);
    fail(&mut store, &all[2].lease, &permanent(), T0 + 200);
    let mut tx = store.transaction().unwrap();
    assert_eq!(
        tx.purge_dead(S, Some(T0 + 150), usize::MAX).unwrap(),
        (1, 1)
    );
    tx.commit().unwrap();
    check(&store);
    let mut tx = store.transaction().unwrap();
    assert_eq!(tx.purge_dead(S, None, usize::MAX).unwrap(), (1, 3));
    tx.commit().unwrap();
    check(&store);
    let c = counters(&store, S);
    assert_eq!(c.dropped_purged_records, 4);
    assert_eq!(c.dead_jobs, 0);
    assert_eq!(c.dropped_records(), 4);
    d.reopen(store);
}

#[test]
fn in_flight_jobs_are_not_handed_out_twice_and_are_ready_again_after_reopen() {
    let d = Dir::new(vec![stream(S)]);
    let mut store = d.open();
    for tag in ["a", "b", "c"] {
        append(&mut store, S, &recs(tag, 2), T0).unwrap();
    }
    let first = take(&mut store, S, 2, T0);
    assert_eq!(ids(&first), [1, 2]);
    assert_eq!(ids(&take(&mut store, S, 10, T0)), [3]);
    assert!(take(&mut store, S, 10, T0).is_empty());
    // A released job is served again, and only it.
    store.release(&first[1].lease);
    assert_eq!(ids(&take(&mut store, S, 10, T0)), [2]);

    // A transaction that takes and is then dropped hands nothing out.
    store.release(&first[0].lease);
    {
        let mut tx = store.transaction().unwrap();
        assert_eq!(ids(&tx.take(S, 10, u64::MAX, T0).unwrap()), [1]);
    }
    assert_eq!(ids(&take(&mut store, S, 10, T0)), [1]);
    assert_eq!(store.in_flight(S), 3);

    // Taken but never acknowledged: after a restart they are all ready again, in order.
    let mut store = d.reopen(store);
    let again = take(&mut store, S, 10, T0);
    assert_eq!(ids(&again), [1, 2, 3]);
    assert_eq!(owned(&again[2]), recs("c", 2));
    assert_eq!(counters(&store, S).delivered_jobs, 0);
}

#[test]
fn aborted_transaction_changes_nothing_and_counters_are_reloaded() {
    let d = Dir::new(vec![stream(S)]);
    let mut store = d.open();
    append(&mut store, S, &recs("a", 2), T0).unwrap();
    let before = counters(&store, S);
    {
        let mut tx = store.transaction().unwrap();
        tx.append_list(S, &recs("gone", 5), Some(("src", b"never")), T0)
            .unwrap();
        let jobs = tx.take(S, 10, u64::MAX, T0).unwrap();
        tx.ack(&jobs[0].lease).unwrap();
    }
    assert!(store.stale);
    store.transaction().unwrap().commit().unwrap();
    check(&store);
    assert_eq!(counters(&store, S), before);
    assert_eq!(store.checkpoint("src").unwrap(), None);
    let jobs = take(&mut store, S, 10, T0);
    assert_eq!(ids(&jobs), [1]);
    assert_eq!(owned(&jobs[0]), recs("a", 2));
    // The id the aborted append used is handed out again.
    append(&mut store, S, &recs("b", 1), T0).unwrap();
    assert_eq!(ids(&take(&mut store, S, 10, T0)), [2]);
    d.reopen(store);
}

#[test]
fn checkpoint_commits_with_its_records() {
    let d = Dir::new(vec![stream(S)]);
    let mut store = d.open();
    assert_eq!(store.checkpoint("tail").unwrap(), None);
    let mut tx = store.transaction().unwrap();
    tx.append_list(S, &recs("a", 3), Some(("tail", b"offset=30")), T0)
        .unwrap();
    tx.commit().unwrap();
    assert_eq!(
        store.checkpoint("tail").unwrap().as_deref(),
        Some(b"offset=30".as_slice())
    );
    // Not committed: neither the records nor the checkpoint.
    {
        let mut tx = store.transaction().unwrap();
        tx.append_list(S, &recs("b", 3), Some(("tail", b"offset=60")), T0)
            .unwrap();
    }
    assert_eq!(
        store.checkpoint("tail").unwrap().as_deref(),
        Some(b"offset=30".as_slice())
    );
    // A refused append (block, full) does not move the checkpoint either.
    store.streams.get_mut(S).unwrap().cfg.max_jobs = 1;
    let mut tx = store.transaction().unwrap();
    assert!(matches!(
        tx.append_list(S, &recs("c", 1), Some(("tail", b"offset=90")), T0),
        Err(AppendError::Full { .. })
    ));
    tx.append_list(S, &recs("c", 0), Some(("other", b"x")), T0)
        .unwrap();
    tx.commit().unwrap();
    check(&store);
    let store = d.reopen(store);
    assert_eq!(
        store.checkpoint("tail").unwrap().as_deref(),
        Some(b"offset=30".as_slice())
    );
    // An append of no records still saves its checkpoint.
    assert_eq!(
        store.checkpoint("other").unwrap().as_deref(),
        Some(b"x".as_slice())
    );
    assert_eq!(counters(&store, S).ready_records, 3);
}

#[test]
fn when_full_block_refuses_everything_and_stores_nothing() {
    let one = recs("x", 2);
    let size = job_bytes(&one);
    for (max_jobs, max_bytes, reason) in [
        (2, 1 << 40, FullReason::Jobs),
        (1 << 30, size * 5 / 2, FullReason::Bytes),
    ] {
        let mut cfg = stream(S);
        cfg.max_jobs = max_jobs;
        cfg.max_bytes = max_bytes;
        let d = Dir::new(vec![cfg]);
        let mut store = d.open();
        append(&mut store, S, &one, T0).unwrap();
        // A batch that would make two jobs when only one fits: all or nothing.
        let mut tx = store.transaction().unwrap();
        store_batch_limit(&mut tx, 1);
        let r = tx.append_list(S, &recs("y", 2), None, T0);
        assert!(
            matches!(&r, Err(AppendError::Full { reason: r, .. }) if *r == reason),
            "{r:?}"
        );
        tx.commit().unwrap();
        store.streams.get_mut(S).unwrap().cfg.batch.max_records = 1000;
        check(&store);
        append(&mut store, S, &one, T0).unwrap();
        let before = counters(&store, S);
        let r = append(&mut store, S, &one, T0);
        match r {
            Err(AppendError::Full { stream, reason: r }) => {
                assert_eq!((stream.as_str(), r), (S, reason));
                assert!(!r.is_disk());
            }
            other => panic!("expected Full, got {other:?}"),
        }
        assert_eq!(counters(&store, S), before, "nothing stored or counted");
        // Room appears when a job is delivered.
        let jobs = take(&mut store, S, 1, T0);
        ack(&mut store, &[&jobs[0].lease]);
        append(&mut store, S, &one, T0).unwrap();
        d.reopen(store);
    }
}

/// Sets the stream's batch size from inside a transaction (the config is the store's own copy).
fn store_batch_limit(tx: &mut Tx<'_>, max_records: u32) {
    tx.rollback
        .store
        .streams
        .get_mut(S)
        .unwrap()
        .cfg
        .batch
        .max_records = max_records;
}

#[test]
fn when_full_drop_newest_refuses_and_counts() {
    let one = recs("x", 3);
    let size = job_bytes(&one);
    for (max_jobs, max_bytes, reason) in [
        (2, 1 << 40, FullReason::Jobs),
        (1 << 30, size * 5 / 2, FullReason::Bytes),
    ] {
        let mut cfg = stream(S);
        cfg.max_jobs = max_jobs;
        cfg.max_bytes = max_bytes;
        cfg.when_full = WhenFull::DropNewest;
        let d = Dir::new(vec![cfg]);
        let mut store = d.open();
        append(&mut store, S, &one, T0).unwrap();
        append(&mut store, S, &one, T0).unwrap();
        let r = append(&mut store, S, &one, T0);
        match r {
            Err(AppendError::Refused {
                stream,
                reason: r,
                records,
            }) => assert_eq!((stream.as_str(), r, records), (S, reason, 3)),
            other => panic!("expected Refused, got {other:?}"),
        }
        let c = counters(&store, S);
        assert_eq!(c.appended_records, 9);
        assert_eq!(c.dropped_newest_records, 3);
        assert_eq!((c.ready_jobs, c.ready_records), (2, 6));
        let jobs = take(&mut store, S, 10, T0);
        assert_eq!(ids(&jobs), [1, 2], "the old ones are kept");
        d.reopen(store);
    }
}

#[test]
fn when_full_drop_oldest_deletes_old_ready_jobs_never_in_flight() {
    let one = |tag: &str| recs(tag, 2);
    let size = job_bytes(&one("a"));
    for (max_jobs, max_bytes) in [(3, 1 << 40), (1 << 30, size * 7 / 2)] {
        let mut cfg = stream(S);
        cfg.max_jobs = max_jobs;
        cfg.max_bytes = max_bytes;
        cfg.when_full = WhenFull::DropOldest;
        let d = Dir::new(vec![cfg]);
        let mut store = d.open();
        for (i, tag) in ["a", "b", "c", "d", "e"].iter().enumerate() {
            let a = append(&mut store, S, &one(tag), T0).unwrap();
            assert_eq!(a.dropped_oldest, if i < 3 { 0 } else { 2 }, "append {i}");
        }
        let c = counters(&store, S);
        assert_eq!(c.dropped_oldest_records, 4);
        assert_eq!((c.ready_jobs, c.appended_records), (3, 10));
        // Job 3 is in flight: the next append drops 4, not 3.
        let t = take(&mut store, S, 1, T0);
        assert_eq!(ids(&t), [3]);
        let a = append(&mut store, S, &one("f"), T0).unwrap();
        assert_eq!(a.dropped_oldest, 2);
        store.release(&t[0].lease);
        let left = take(&mut store, S, 10, T0);
        assert_eq!(ids(&left), [3, 5, 6]);
        assert_eq!(owned(&left[1]), one("e"));
        // Everything in flight: nothing can be dropped, so the stream is full.
        let r = append(&mut store, S, &one("g"), T0);
        assert!(matches!(r, Err(AppendError::Full { .. })), "{r:?}");
        assert_eq!(counters(&store, S).dropped_oldest_records, 6);
        d.reopen(store);
    }
}

#[test]
fn drop_oldest_deletes_nothing_when_the_batch_cannot_fit_anyway() {
    let mut cfg = stream(S);
    cfg.max_jobs = 3;
    cfg.batch.max_records = 1;
    cfg.when_full = WhenFull::DropOldest;
    let d = Dir::new(vec![cfg]);
    let mut store = d.open();
    append(&mut store, S, &recs("old", 3), T0).unwrap();
    // Jobs 1 and 2 are in flight; only job 3 could be dropped, and a batch of two needs two.
    let t = take(&mut store, S, 2, T0);
    assert_eq!(ids(&t), [1, 2]);
    let r = append(&mut store, S, &recs("new", 2), T0);
    assert!(matches!(r, Err(AppendError::Full { .. })), "{r:?}");
    let c = counters(&store, S);
    assert_eq!(
        (c.ready_jobs, c.dropped_oldest_records),
        (3, 0),
        "refused, yet job 3 was dropped: {c:?}"
    );
    // A batch of more jobs than max_jobs: never fits, so nothing may be dropped for it.
    store.release(&t[0].lease);
    store.release(&t[1].lease);
    let r = append(&mut store, S, &recs("huge", 4), T0);
    assert!(matches!(r, Err(AppendError::TooLarge { .. })), "{r:?}");
    assert_eq!(
        counters(&store, S).ready_jobs,
        3,
        "the whole backlog was dropped for a batch that was refused"
    );
}

#[test]
fn record_larger_than_the_stream_is_too_large() {
    let mut cfg = stream(S);
    cfg.max_bytes = 100;
    let d = Dir::new(vec![cfg]);
    let mut store = d.open();
    let r = append(&mut store, S, &[vec![7u8; 200]], T0);
    assert!(
        matches!(r, Err(AppendError::TooLarge { max: 100, .. })),
        "{r:?}"
    );
    assert_eq!(counters(&store, S).appended_records, 0);
    let r = append(&mut store, "nope", &recs("a", 1), T0);
    assert!(
        matches!(r, Err(AppendError::Store(StoreError::UnknownStream(_)))),
        "{r:?}"
    );
}

#[test]
fn storage_max_bytes_across_streams_is_full_with_reason_budget() {
    let one = recs("x", 2);
    let size = job_bytes(&one);
    let mut newest = stream("b");
    newest.when_full = WhenFull::DropNewest;
    let d = Dir::new(vec![stream("a"), newest]).with_storage(StorageConfig {
        max_bytes: size * 3,
        min_free: 0,
    });
    let mut store = d.open();
    append(&mut store, "a", &one, T0).unwrap();
    append(&mut store, "a", &one, T0).unwrap();
    append(&mut store, "b", &one, T0).unwrap();
    assert_eq!(store.stored_bytes(), size * 3);
    let r = append(&mut store, "a", &one, T0);
    assert!(
        matches!(
            r,
            Err(AppendError::Full {
                reason: FullReason::Budget,
                ..
            })
        ),
        "{r:?}"
    );
    let r = append(&mut store, "b", &one, T0);
    assert!(
        matches!(
            r,
            Err(AppendError::Refused {
                reason: FullReason::Budget,
                records: 2,
                ..
            })
        ),
        "{r:?}"
    );
    assert!(FullReason::Budget.is_disk());
    // Dead letters count against the budget too: failing a job frees nothing.
    let jobs = take(&mut store, "a", 1, T0);
    fail(&mut store, &jobs[0].lease, &permanent(), T0);
    assert!(append(&mut store, "a", &one, T0).is_err());
    // Purging them does.
    let mut tx = store.transaction().unwrap();
    tx.purge_dead("a", None, usize::MAX).unwrap();
    tx.commit().unwrap();
    append(&mut store, "a", &one, T0).unwrap();
    d.reopen(store);
}

#[test]
fn drop_oldest_makes_room_under_the_storage_budget() {
    let one = recs("x", 2);
    let size = job_bytes(&one);
    let mut cfg = stream(S);
    cfg.when_full = WhenFull::DropOldest;
    let d = Dir::new(vec![cfg]).with_storage(StorageConfig {
        max_bytes: size * 3,
        min_free: 0,
    });
    let mut store = d.open();
    for _ in 0..3 {
        append(&mut store, S, &one, T0).unwrap();
    }
    let r = append(&mut store, S, &one, T0);
    assert!(
        matches!(
            r,
            Ok(Appended {
                dropped_oldest: 2,
                ..
            })
        ),
        "a drop_oldest stream alone on the disk must drop its oldest job, got {r:?}"
    );
}

#[test]
fn min_free_makes_every_stream_full_with_reason_min_free() {
    let mut newest = stream("b");
    newest.when_full = WhenFull::DropNewest;
    let d = Dir::new(vec![stream("a"), newest]).with_storage(StorageConfig {
        max_bytes: u64::MAX / 4,
        min_free: u64::MAX / 2,
    });
    let mut store = d.open();
    let r = append(&mut store, "a", &recs("x", 1), T0);
    match r {
        Err(AppendError::Full { reason, .. }) => {
            assert_eq!(reason, FullReason::MinFree);
            assert!(reason.is_disk());
        }
        other => panic!("expected Full(MinFree), got {other:?}"),
    }
    let r = append(&mut store, "b", &recs("x", 1), T0);
    assert!(
        matches!(
            r,
            Err(AppendError::Refused {
                reason: FullReason::MinFree,
                ..
            })
        ),
        "{r:?}"
    );
    assert_eq!(counters(&store, "a").appended_records, 0);
    assert_eq!(counters(&store, "b").dropped_newest_records, 1);
    d.reopen(store);
}

#[test]
fn counters_survive_reopen_exactly() {
    let mut a = stream("a");
    a.dead_max_jobs = 1;
    a.ttl = Some(Duration::from_secs(1));
    let mut b = stream("b");
    b.max_jobs = 2;
    b.when_full = WhenFull::DropOldest;
    let d = Dir::new(vec![a, b]);
    let mut store = d.open();
    let mut rng = fastrand::Rng::with_seed(11);
    for round in 0..6u64 {
        let now = T0 + round * 400;
        for _ in 0..3 {
            append(&mut store, "a", &recs("a", rng.usize(1..5)), now).unwrap();
        }
        append(&mut store, "b", &recs("b", rng.usize(1..5)), now).unwrap();
        let jobs = take(&mut store, "a", 3, now);
        for (i, j) in jobs.iter().enumerate() {
            match i % 3 {
                0 => ack(&mut store, &[&j.lease]),
                1 => {
                    fail(&mut store, &j.lease, &permanent(), now);
                }
                _ => {
                    fail(&mut store, &j.lease, &transient(now + 100, 5), now);
                }
            }
        }
        let mut tx = store.transaction().unwrap();
        tx.expire(now).unwrap();
        tx.commit().unwrap();
        check(&store);
        store = d.reopen(store);
    }
    // Everything left in "a" is now older than its ttl.
    let mut tx = store.transaction().unwrap();
    assert!(tx.expire(T0 + 60_000).unwrap() > 0);
    tx.commit().unwrap();
    let store = d.reopen(store);
    let c = counters(&store, "a");
    assert!(
        c.delivered_records > 0 && c.dropped_dead_full_records > 0 && c.expired_records > 0,
        "{c:?}"
    );
    assert!(counters(&store, "b").dropped_oldest_records > 0);
}

/// A job stored as it is fills its redb page: 1,000 records of 320 bytes (a 321 KB job, which
/// would take a 512 KiB page) are cut into a job that fits 256 KiB and one of the rest; 1,000 of
/// 200 bytes (a 205 KB job in a 256 KiB page) stay one job.
#[test]
fn plain_jobs_are_cut_to_fill_their_page() {
    let d = Dir::new(vec![stream(S)]);
    let mut store = d.open();
    append(&mut store, S, &sized(b'a', &[320; 1000]), T0).unwrap();
    let jobs = take(&mut store, S, 10, T0);
    let counts: Vec<usize> = jobs.iter().map(Job::record_count).collect();
    assert_eq!(counts.len(), 2, "{counts:?}");
    assert_eq!(counts.iter().sum::<usize>(), 1000);
    assert!(
        jobs[0].bytes() + 16 <= 256 << 10,
        "{} bytes fit a 256 KiB page with redb's leaf",
        jobs[0].bytes()
    );
    assert!(jobs[1].bytes() <= 64 << 10, "{}", jobs[1].bytes());
    let leases: Vec<&Lease> = jobs.iter().map(|j| &j.lease).collect();
    ack(&mut store, &leases);
    append(&mut store, S, &sized(b'b', &[200; 1000]), T0).unwrap();
    let jobs = take(&mut store, S, 10, T0);
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].record_count(), 1000);
}

/// Cutting jobs to fit their pages never makes a batch that `batch` cuts within `max_jobs` too
/// large for the stream: such a batch is stored in emptier pages instead (a tail source sizes its
/// batches by `max_jobs`; with `max_jobs: 1` a split would refuse every batch forever).
#[test]
fn page_fit_never_takes_a_batch_past_max_jobs() {
    let d = Dir::new(vec![StreamConfig {
        max_jobs: 1,
        ..stream(S)
    }]);
    let mut store = d.open();
    append(&mut store, S, &sized(b'a', &[320; 1000]), T0).unwrap();
    let jobs = take(&mut store, S, 10, T0);
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].record_count(), 1000);
}

#[test]
fn dead_letters_come_in_pages_bounded_in_jobs_and_bytes() {
    let d = Dir::new(vec![stream(S)]);
    let mut store = d.open();
    for i in 1..=5u8 {
        append(&mut store, S, &sized(i, &[1000]), T0).unwrap();
    }
    for j in take(&mut store, S, 10, T0) {
        fail(&mut store, &j.lease, &permanent(), T0);
    }
    // Dead: ids 1 to 5, a little over 1,000 bytes of records each.
    let page = |after: Option<u64>, n: usize, max_raw: u64| {
        let page = store.dead_letters(S, after, n, max_raw).unwrap();
        (
            page.jobs.iter().map(|j| j.id).collect::<Vec<_>>(),
            page.next,
        )
    };
    assert_eq!(page(None, 2, u64::MAX), (vec![1, 2], Some(2)));
    assert_eq!(page(Some(2), 10, u64::MAX), (vec![3, 4, 5], None));
    assert_eq!(page(None, 10, 2500), (vec![1, 2], Some(2)), "bytes bound");
    // A job over the byte bound still comes, alone: a page always moves on.
    assert_eq!(page(Some(1), 10, 10), (vec![2], Some(2)));
    assert_eq!(page(Some(4), 10, 10), (vec![5], None));
    assert_eq!(page(Some(5), 10, u64::MAX), (vec![], None));
    assert_eq!(page(Some(u64::MAX), 10, u64::MAX), (vec![], None));
    let first = &store.dead_letters(S, None, 1, u64::MAX).unwrap().jobs[0];
    assert_eq!(first.to_json()["last_error"], "400 bad request");
    d.reopen(store);
}
