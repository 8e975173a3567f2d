//! Settling part of a job (a sink that splits a job on HTTP 413), offsets, and the store id that
//! keeps leases of a replaced file from settling the new file's jobs.

use super::*;

use super::group_commit::spawn_on;

/// A dead letter as the tests compare it: (id, offset, attempts, reason, records).
type Letter = (u64, u32, u32, Option<String>, Vec<String>);

/// A stream's dead letters, oldest first.
fn dead_letters(store: &Store, stream: &str) -> Vec<Letter> {
    store
        .peek(stream, true, usize::MAX)
        .unwrap()
        .into_iter()
        .map(|p| {
            let records = p.records.expect("dead letters decode");
            (p.id, p.offset, p.attempts, p.last_error, records)
        })
        .collect()
}

fn strings(records: &[Vec<u8>]) -> Vec<String> {
    records
        .iter()
        .map(|r| String::from_utf8(r.clone()).unwrap())
        .collect()
}

#[test]
fn settle_delivered_cuts_the_prefix_and_the_rest_is_acked_later() {
    let d = Dir::new(vec![stream(S)]);
    let mut store = d.open();
    let all = recs("a", 5);
    append(&mut store, S, &all, T0).unwrap();
    append(&mut store, S, &recs("b", 1), T0).unwrap();
    let jobs = take(&mut store, S, 1, T0);
    let lease = jobs[0].lease.clone();
    assert_eq!(jobs[0].offset, 0);

    let rest = settle(&mut store, &lease, 2, &Settle::Delivered, T0 + 1);
    assert_eq!(rest.lease, lease, "same job, same lease");
    assert_eq!((rest.offset, rest.attempts, rest.created_ms), (2, 0, T0));
    assert_eq!(owned(&rest), all[2..]);
    let c = counters(&store, S);
    assert_eq!((c.delivered_jobs, c.delivered_records), (0, 2));
    assert_eq!((c.ready_jobs, c.ready_records), (2, 3 + 1));
    assert_eq!(
        c.ready_bytes,
        rest_bytes(&all[2..], 2) + job_bytes(&recs("b", 1))
    );
    assert_eq!(c.next_id, 3, "no new job");
    // Still in flight: not handed out again.
    assert_eq!(ids(&take(&mut store, S, 10, T0)), [2]);
    let rest = settle(&mut store, &lease, 1, &Settle::Delivered, T0 + 2);
    assert_eq!((rest.offset, rest.record_count()), (3, 2));

    // After a restart the job is ready again with what is left, and its offset.
    let mut store = d.reopen(store);
    let again = take(&mut store, S, 1, T0);
    assert_eq!(ids(&again), [1]);
    assert_eq!(again[0].offset, 3);
    assert_eq!(owned(&again[0]), all[3..]);
    ack(&mut store, &[&again[0].lease]);
    let c = counters(&store, S);
    assert_eq!((c.delivered_jobs, c.delivered_records), (1, 5));
    // The parts add up to the job's size, as one ack of the whole job would have counted.
    assert_eq!(c.delivered_bytes, job_bytes(&all));
    assert_eq!((c.ready_jobs, c.ready_records), (1, 1));
    d.reopen(store);
}

#[test]
fn settle_dead_makes_a_dead_letter_of_the_prefix_and_trims_dead_letters() {
    let mut cfg = stream(S);
    cfg.dead_max_jobs = 2;
    let d = Dir::new(vec![cfg]);
    let mut store = d.open();
    let all = recs("a", 6);
    append(&mut store, S, &all, T0).unwrap();
    let jobs = take(&mut store, S, 1, T0);
    let lease = jobs[0].lease.clone();

    let rest = settle(
        &mut store,
        &lease,
        2,
        &dead("400: record 0 rejected"),
        T0 + 5,
    );
    assert_eq!((rest.offset, rest.record_count()), (2, 4));
    assert_eq!(owned(&rest), all[2..]);
    let c = counters(&store, S);
    assert_eq!(
        (c.dead_jobs, c.dead_records, c.dead_lettered_records),
        (1, 2, 2)
    );
    assert_eq!((c.ready_jobs, c.ready_records), (1, 4));
    assert_eq!((c.next_id, c.delivered_records), (3, 0));
    assert_eq!(
        dead_letters(&store, S),
        [(
            2,
            0,
            0,
            Some("400: record 0 rejected".into()),
            strings(&all[..2])
        )]
    );
    let peeked = store.peek(S, true, 1).unwrap();
    assert_eq!(
        (peeked[0].created_ms, peeked[0].last_failed_ms),
        (T0, T0 + 5)
    );

    // Two more dead parts: the table holds 2, the oldest goes (counted as dropped).
    settle(&mut store, &lease, 1, &dead("bad 2"), T0 + 6);
    let rest = settle(&mut store, &lease, 1, &dead("bad 3"), T0 + 7);
    assert_eq!((rest.offset, rest.record_count()), (4, 2));
    let c = counters(&store, S);
    assert_eq!((c.dead_jobs, c.dead_records), (2, 2));
    assert_eq!(
        (c.dead_lettered_records, c.dropped_dead_full_records),
        (4, 2)
    );
    let letters = dead_letters(&store, S);
    assert_eq!(
        letters
            .iter()
            .map(|l| (l.0, l.1, l.4.clone()))
            .collect::<Vec<_>>(),
        [(3, 2, strings(&all[2..3])), (4, 3, strings(&all[3..4]))]
    );
    // The rest is delivered: every record is accounted for exactly once.
    ack(&mut store, &[&lease]);
    let c = counters(&store, S);
    assert_eq!((c.delivered_records, c.ready_records), (2, 0));
    assert_eq!(c.appended_records, 6);
    d.reopen(store);
}

#[test]
fn settle_a_job_taken_from_the_retry_table() {
    let d = Dir::new(vec![stream(S)]);
    let mut store = d.open();
    let all = recs("a", 4);
    append(&mut store, S, &all, T0).unwrap();
    let jobs = take(&mut store, S, 1, T0);
    fail(&mut store, &jobs[0].lease, &transient(T0 + 100, 5), T0);
    let jobs = take(&mut store, S, 1, T0 + 100);
    let lease = jobs[0].lease.clone();
    assert_eq!(lease.retry_due, Some(T0 + 100));

    let rest = settle(&mut store, &lease, 1, &Settle::Delivered, T0 + 101);
    assert_eq!(rest.lease, lease, "same key in the retry table");
    assert_eq!((rest.offset, rest.attempts), (1, 1));
    assert_eq!(rest.last_error.as_deref(), Some("503"));
    let c = counters(&store, S);
    assert_eq!((c.retry_jobs, c.retry_records, c.ready_jobs), (1, 3, 0));
    assert_eq!(c.delivered_records, 1);
    assert!(
        take(&mut store, S, 10, T0 + 100).is_empty(),
        "still in flight"
    );

    // A dead part keeps the attempts of the job it came from.
    let rest = settle(&mut store, &lease, 1, &dead("422"), T0 + 102);
    assert_eq!((rest.offset, rest.record_count()), (2, 2));
    assert_eq!(
        dead_letters(&store, S),
        [(2, 1, 1, Some("422".into()), strings(&all[1..2]))]
    );
    let c = counters(&store, S);
    assert_eq!((c.retry_records, c.dead_records), (2, 1));

    let mut store = d.reopen(store);
    let again = take(&mut store, S, 10, T0 + 100);
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].lease, lease);
    assert_eq!((again[0].offset, again[0].attempts), (2, 1));
    assert_eq!(owned(&again[0]), all[2..]);
    ack(&mut store, &[&again[0].lease]);
    let c = counters(&store, S);
    assert_eq!((c.delivered_jobs, c.delivered_records), (1, 3));
    assert_eq!((c.retry_jobs, c.dead_records), (0, 1));
}

#[test]
fn settle_of_no_records_or_all_of_them_is_refused_and_changes_nothing() {
    let d = Dir::new(vec![stream(S)]);
    let mut store = d.open();
    append(&mut store, S, &recs("a", 3), T0).unwrap();
    append(&mut store, S, &recs("b", 1), T0).unwrap();
    let jobs = take(&mut store, S, 2, T0);
    let before = counters(&store, S);
    let cases = [
        (&jobs[0], 0, 3),
        (&jobs[0], 3, 3),
        (&jobs[0], 4, 3),
        (&jobs[0], u32::MAX, 3),
        // A one-record job has no part to settle.
        (&jobs[1], 1, 1),
    ];
    for (job, n, records) in cases {
        for outcome in [Settle::Delivered, dead("x")] {
            let mut tx = store.transaction().unwrap();
            let r = tx.settle_prefix(&job.lease, n, &outcome, T0);
            match r {
                Err(StoreError::InvalidSettle {
                    n: got_n,
                    records: got_records,
                    id,
                    ..
                }) => assert_eq!((got_n, got_records, id), (n, records, job.lease.id)),
                other => panic!("n = {n}: {other:?}"),
            }
            assert!(!tx.is_dirty(), "n = {n}: a refused settle changes nothing");
            tx.commit().unwrap();
            check(&store);
            assert_eq!(counters(&store, S), before, "n = {n}");
        }
    }
    let missing = Lease {
        stream: S.into(),
        id: 99,
        retry_due: None,
        store: store.id(),
    };
    let mut tx = store.transaction().unwrap();
    assert!(matches!(
        tx.settle_prefix(&missing, 1, &Settle::Delivered, T0),
        Err(StoreError::NoSuchJob { id: 99, .. })
    ));
    // A lease handed out by another (since replaced) store file names no job here, even with the
    // same id; releasing it does not touch the real lease either.
    let mut foreign = jobs[0].lease.clone();
    foreign.store ^= 1;
    assert!(matches!(
        tx.ack(&foreign),
        Err(StoreError::NoSuchJob { .. })
    ));
    tx.abort().unwrap();
    store.release(&foreign);
    // The jobs are untouched and still in flight.
    assert_eq!(store.in_flight(S), 2);
    ack(&mut store, &[&jobs[0].lease, &jobs[1].lease]);
    let c = counters(&store, S);
    assert_eq!((c.delivered_jobs, c.delivered_records), (2, 4));
}

#[test]
fn offset_survives_fail_retry_dead_and_replay() {
    let d = Dir::new(vec![stream(S)]);
    let mut store = d.open();
    let all = recs("a", 5);
    append(&mut store, S, &all, T0).unwrap();
    let jobs = take(&mut store, S, 1, T0);
    settle(&mut store, &jobs[0].lease, 2, &Settle::Delivered, T0);
    fail(&mut store, &jobs[0].lease, &transient(T0 + 100, 2), T0);

    let mut store = d.reopen(store);
    let jobs = take(&mut store, S, 1, T0 + 100);
    assert_eq!((jobs[0].offset, jobs[0].attempts), (2, 1));
    assert_eq!(owned(&jobs[0]), all[2..]);
    let rest = settle(&mut store, &jobs[0].lease, 1, &Settle::Delivered, T0 + 100);
    assert_eq!((rest.offset, rest.attempts), (3, 1));
    assert_eq!(
        fail(
            &mut store,
            &jobs[0].lease,
            &transient(T0 + 200, 2),
            T0 + 100
        ),
        Failed::Dead { attempts: 2 }
    );
    assert_eq!(
        dead_letters(&store, S),
        [(1, 3, 2, Some("503".into()), strings(&all[3..]))]
    );

    let mut tx = store.transaction().unwrap();
    assert_eq!(tx.replay_dead(S, None, None, usize::MAX).unwrap(), (1, 2));
    tx.commit().unwrap();
    check(&store);
    let back = take(&mut store, S, 10, T0 + 200);
    assert_eq!(ids(&back), [1]);
    assert_eq!(
        (back[0].offset, back[0].attempts),
        (3, 0),
        "offset kept, attempts reset"
    );
    assert_eq!(back[0].last_error, None);
    assert_eq!(owned(&back[0]), all[3..]);
    ack(&mut store, &[&back[0].lease]);
    let c = counters(&store, S);
    assert_eq!(
        (c.delivered_records, c.replayed_records, c.dead_records),
        (5, 2, 0)
    );
    d.reopen(store);
}

#[test]
fn store_id_is_stable_across_reopen_and_differs_between_stores() {
    let a = Dir::new(vec![stream(S)]);
    let b = Dir::new(vec![stream(S)]);
    let store_a = a.open();
    let id = store_a.id();
    assert_ne!(id, 0);
    let store_a = a.reopen(store_a);
    assert_eq!(store_a.id(), id, "the same file keeps its id");
    let store_b = b.open();
    assert_ne!(store_b.id(), 0);
    assert_ne!(store_b.id(), id, "two fresh files differ");
    drop(store_a);
    let ro = OpenOptions {
        read_only: true,
        ..OpenOptions::default()
    };
    let read_only = Store::open(a.dir.path(), a.storage, &a.streams, ro).unwrap();
    assert_eq!(read_only.id(), id);
    drop(read_only);

    // A file written before ids: read-only it has none (0); the next writable open gives it one
    // and it sticks.
    let mut store_a = a.open();
    let txn = store_a.db.rw().unwrap().begin_write().unwrap();
    txn.open_table(META).unwrap().remove(STORE_ID).unwrap();
    txn.commit().unwrap();
    drop(store_a);
    let read_only = Store::open(a.dir.path(), a.storage, &a.streams, ro).unwrap();
    assert_eq!(read_only.id(), 0);
    drop(read_only);
    let store_a = a.open();
    let new_id = store_a.id();
    assert_ne!(new_id, 0);
    assert_eq!(a.reopen(store_a).id(), new_id);
}

/// A delivery worker acknowledges the jobs it took together: one commit deletes them all; an ack
/// of a job no longer there fails without holding back the others.
#[tokio::test]
async fn writer_acks_many_jobs_in_one_commit() {
    let disk = MemDisk::default();
    let handle = spawn_on(&disk, vec![stream(S)]);
    for tag in ["a", "b", "c", "d"] {
        handle.append(S, recs(tag, 1), None, None).await.unwrap();
    }
    let jobs = handle.take(S, 3, u64::MAX).await.unwrap();
    assert_eq!(ids(&jobs), [1, 2, 3]);
    let commits = handle.snapshot().await.unwrap().commits;
    let leases: Vec<Lease> = jobs.iter().map(|j| j.lease.clone()).collect();
    handle.ack_many(leases.clone()).await.expect("acknowledged");
    let snap = handle.snapshot().await.unwrap();
    assert_eq!(snap.commits, commits + 1, "one commit for the three");
    assert_eq!(snap.streams[0].1.delivered_jobs, 3);
    // Job 1 again (gone) with job 4: 4 is acknowledged, the answer names 1.
    let four = handle.take(S, 10, u64::MAX).await.unwrap();
    assert_eq!(ids(&four), [4]);
    let again = handle
        .ack_many(vec![leases[0].clone(), four[0].lease.clone()])
        .await;
    assert!(
        matches!(again, Err(StoreError::NoSuchJob { id: 1, .. })),
        "{again:?}"
    );
    handle.shutdown().await;
    // Once the writer is gone the request fails instead of hanging.
    let gone = handle.ack(four[0].lease.clone()).await;
    assert!(matches!(gone, Err(StoreError::WriterStopped)), "{gone:?}");
    let store = open_mem(&disk, unbounded(), &[stream(S)]);
    let c = counters(&store, S);
    assert_eq!((c.delivered_jobs, c.ready_jobs), (4, 0));
}

/// A take stops at its byte budget (but always hands out one job).
#[tokio::test]
async fn writer_takes_up_to_a_byte_budget() {
    let disk = MemDisk::default();
    let handle = spawn_on(&disk, vec![stream(S)]);
    for tag in ["a", "b", "c"] {
        handle
            .append(S, sized(tag.as_bytes()[0], &[1000]), None, None)
            .await
            .unwrap();
    }
    assert_eq!(
        ids(&handle.take(S, 10, 1).await.unwrap()),
        [1],
        "one at least"
    );
    assert_eq!(ids(&handle.take(S, 10, 1500).await.unwrap()), [2, 3]);
    handle.shutdown().await;
}

#[tokio::test]
async fn writer_settles_a_prefix_durably_and_knows_the_store_id() {
    let disk = MemDisk::default();
    let handle = spawn_on(&disk, vec![stream(S)]);
    let all = recs("a", 4);
    handle.append(S, all.clone(), None, None).await.unwrap();
    let jobs = handle.take(S, 1, u64::MAX).await.unwrap();
    let lease = jobs[0].lease.clone();
    let rest = handle
        .settle_prefix(lease.clone(), 1, Settle::Delivered)
        .await
        .unwrap();
    assert_eq!((rest.offset, owned(&rest)), (1, all[1..].to_vec()));
    let rest = handle
        .settle_prefix(lease.clone(), 2, dead("400"))
        .await
        .unwrap();
    assert_eq!((rest.offset, owned(&rest)), (3, all[3..].to_vec()));
    let r = handle
        .settle_prefix(lease.clone(), 1, Settle::Delivered)
        .await;
    assert!(matches!(r, Err(StoreError::InvalidSettle { .. })), "{r:?}");
    let id = handle.store_id();
    handle.shutdown().await;
    // Durable on return: the file says what the replies said.
    let store = open_mem(&disk, unbounded(), &[stream(S)]);
    assert_eq!(store.id(), id);
    let c = counters(&store, S);
    assert_eq!(
        (c.delivered_records, c.dead_records, c.ready_records),
        (1, 2, 1)
    );
    assert_eq!(dead_letters(&store, S)[0].4, strings(&all[1..3]));
}

/// A store replaced by a fresh file (after corruption) has a new id, and the handle says so.
#[tokio::test]
async fn writer_store_id_follows_a_replaced_store() {
    let first = MemDisk::default();
    let second = MemDisk::default();
    let streams = vec![stream(S)];
    let store = open_mem(&first, unbounded(), &streams);
    let old_id = store.id();
    let replacement = second.clone();
    let reopen_streams = streams.clone();
    let reopen = Box::new(move || {
        Store::open_backend(
            replacement.clone(),
            unbounded(),
            &reopen_streams,
            OpenOptions::default(),
        )
    });
    let handle = writer::spawn(store, reopen, writer::WriterOptions::default()).unwrap();
    assert_eq!(handle.store_id(), old_id);
    first.faults.fail_sync.store(true, Ordering::SeqCst);
    assert!(handle.append(S, recs("lost", 1), None, None).await.is_err());
    let deadline = Instant::now() + Duration::from_secs(10);
    while handle.append(S, recs("new", 1), None, None).await.is_err() {
        assert!(Instant::now() < deadline, "the writer did not reopen");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let new_id = handle.store_id();
    assert_ne!(new_id, old_id);
    handle.shutdown().await;
    assert_eq!(open_mem(&second, unbounded(), &streams).id(), new_id);
}

/// A batch that could not fit even in an empty stream and an empty store is `TooLarge`, not `Full`
/// (whose sender would wait and retry the same batch forever), under every `when_full`, and
/// changes nothing: no job, no drop counted, no old job deleted.
#[test]
fn a_batch_that_can_never_fit_is_too_large_and_changes_nothing() {
    for when_full in [WhenFull::Block, WhenFull::DropNewest, WhenFull::DropOldest] {
        // More bytes than the stream's max_bytes: 3 jobs of one 900-byte record, 2 KiB bound.
        let mut cfg = stream(S);
        cfg.when_full = when_full;
        cfg.max_bytes = 2048;
        cfg.batch.max_bytes = 1024;
        let d = Dir::new(vec![cfg]);
        let mut store = d.open();
        let r = append(&mut store, S, &sized(b'a', &[900, 900, 900]), T0);
        match &r {
            Err(e @ AppendError::TooLarge { max: 2048, .. }) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("can never fit") && msg.contains("smaller batches"),
                    "{msg}"
                );
            }
            _ => panic!("{when_full:?}: {r:?}"),
        }
        let c = counters(&store, S);
        assert_eq!(
            (c.appended_records, c.dropped_newest_records, c.ready_jobs),
            (0, 0, 0),
            "{when_full:?}"
        );
        // Each job alone fits.
        append(&mut store, S, &sized(b'b', &[900]), T0).unwrap();

        // More jobs than the stream's max_jobs; an old job is not deleted for it.
        let mut cfg = stream(S);
        cfg.when_full = when_full;
        cfg.max_jobs = 2;
        cfg.batch.max_records = 1;
        let d = Dir::new(vec![cfg]);
        let mut store = d.open();
        append(&mut store, S, &recs("old", 1), T0).unwrap();
        let r = append(&mut store, S, &recs("x", 3), T0);
        assert!(
            matches!(
                r,
                Err(AppendError::TooLarge {
                    size: 3,
                    max: 2,
                    ..
                })
            ),
            "{when_full:?}: {r:?}"
        );
        let c = counters(&store, S);
        assert_eq!(
            (c.appended_records, c.dropped_newest_records, c.ready_jobs),
            (1, 0, 1),
            "{when_full:?}"
        );
        append(&mut store, S, &recs("y", 1), T0).unwrap();

        // More bytes than storage.max_bytes.
        let one = sized(b'c', &[500]);
        let size = job_bytes(&one);
        let mut cfg = stream(S);
        cfg.when_full = when_full;
        cfg.batch.max_records = 1;
        let d = Dir::new(vec![cfg]).with_storage(StorageConfig {
            max_bytes: size * 2,
            min_free: 0,
        });
        let mut store = d.open();
        let r = append(&mut store, S, &sized(b'c', &[500, 500, 500]), T0);
        assert!(
            matches!(r, Err(AppendError::TooLarge { max, .. }) if max == size * 2),
            "{when_full:?}: {r:?}"
        );
        assert_eq!(counters(&store, S).appended_records, 0);
        append(&mut store, S, &sized(b'c', &[500, 500]), T0).unwrap();
    }
}
