//! The group-commit writer: batching, producers that block, settlement through the handle, and
//! what happens when the writer stops or the store fails.

use super::*;

pub(super) fn spawn_on(disk: &MemDisk, streams: Vec<StreamConfig>) -> writer::StoreHandle {
    let store = open_mem(disk, unbounded(), &streams);
    let d = disk.clone();
    let reopen = Box::new(move || {
        Store::open_backend(d.clone(), unbounded(), &streams, OpenOptions::default())
    });
    writer::spawn(store, reopen, writer::WriterOptions::default()).expect("the writer starts")
}

#[tokio::test]
async fn writer_group_commits_concurrent_producers() {
    const PRODUCERS: usize = 64;
    const BATCHES: usize = 20;
    const RECORDS: usize = 10;
    let disk = MemDisk::default();
    let handle = spawn_on(&disk, vec![stream(S)]);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for p in 0..PRODUCERS {
        let h = handle.clone();
        tasks.push(tokio::spawn(async move {
            for b in 0..BATCHES {
                let records = recs(&format!("p{p:02}b{b:02}"), RECORDS);
                let a = h
                    .append(S, records, None, None)
                    .await
                    .expect("acknowledged");
                assert_eq!(a.records, RECORDS as u64);
            }
        }));
    }
    for t in tasks {
        t.await.expect("producer");
    }
    let appends = (PRODUCERS * BATCHES) as u64;
    let commits = handle.stats().commits.load(Ordering::Relaxed);
    eprintln!(
        "writer: {appends} appends in {commits} commits ({} fsyncs) in {:?}",
        disk.faults.syncs.load(Ordering::Relaxed),
        started.elapsed()
    );
    assert!(commits < appends, "no group commit: {commits} commits");
    let snap = handle.snapshot().await.unwrap();
    let c = &snap.streams[0].1;
    assert_eq!(c.appended_records, appends * RECORDS as u64);
    assert_eq!(c.ready_records, appends * RECORDS as u64);
    assert!(c.balanced());
    // Every acknowledged record is stored once, and each producer's batches are in order.
    let jobs = handle.take(S, usize::MAX, u64::MAX).await.unwrap();
    assert_eq!(jobs.len() as u64, appends);
    let mut next = [0usize; PRODUCERS];
    for j in &jobs {
        let first = String::from_utf8(owned(j)[0].clone()).unwrap();
        let p: usize = first[1..3].parse().unwrap();
        let b: usize = first[4..6].parse().unwrap();
        assert_eq!(b, next[p], "producer {p}: batches out of order");
        next[p] += 1;
        assert_eq!(owned(j), recs(&format!("p{p:02}b{b:02}"), RECORDS));
    }
    assert!(next.iter().all(|&n| n == BATCHES));
    handle.shutdown().await;
    // What the writer acknowledged is on the disk.
    let store = open_mem(&disk, unbounded(), &[stream(S)]);
    assert_eq!(counters(&store, S).ready_records, appends * RECORDS as u64);
}

#[tokio::test]
async fn writer_block_waits_until_the_deadline_or_until_room_appears() {
    let mut cfg = stream(S);
    cfg.max_jobs = 2;
    let disk = MemDisk::default();
    let handle = spawn_on(&disk, vec![cfg]);
    for tag in ["a", "b"] {
        handle.append(S, recs(tag, 1), None, None).await.unwrap();
    }
    // No wait: full at once.
    let r = handle.append(S, recs("c", 1), None, None).await;
    assert!(
        matches!(
            r,
            Err(AppendError::Full {
                reason: FullReason::Jobs,
                ..
            })
        ),
        "{r:?}"
    );
    // Nothing frees room: Full after about the wait.
    let wait = Duration::from_millis(200);
    let t = Instant::now();
    let r = handle.append(S, recs("c", 1), None, Some(wait)).await;
    let waited = t.elapsed();
    assert!(matches!(r, Err(AppendError::Full { .. })), "{r:?}");
    assert!(
        waited >= wait && waited < wait + Duration::from_millis(800),
        "waited {waited:?}"
    );

    // A take and an ack free room before the deadline: the parked append goes in.
    let t = Instant::now();
    let deadline = Duration::from_secs(2);
    let (appended, freed) = tokio::join!(
        biased;
        handle.append(S, recs("c", 1), None, Some(deadline)),
        async {
            let jobs = handle.take(S, 1, u64::MAX).await.unwrap();
            assert_eq!(ids(&jobs), [1]);
            handle.ack(jobs[0].lease.clone()).await.unwrap();
            t.elapsed()
        }
    );
    let took = t.elapsed();
    appended.expect("room appeared before the deadline");
    assert!(
        took >= freed && took < deadline,
        "took {took:?}, freed at {freed:?}"
    );
    let snap = handle.snapshot().await.unwrap();
    let c = &snap.streams[0].1;
    assert_eq!(
        (c.ready_jobs, c.delivered_jobs, c.appended_records),
        (2, 1, 3)
    );
    let jobs = handle.take(S, 10, u64::MAX).await.unwrap();
    assert_eq!(owned(&jobs[1]), recs("c", 1));
    handle.shutdown().await;
}

#[tokio::test]
async fn writer_reopens_the_store_after_a_failed_commit() {
    let disk = MemDisk::default();
    let handle = spawn_on(&disk, vec![stream(S)]);
    handle
        .append(S, recs("acked", 2), None, None)
        .await
        .unwrap();
    disk.faults.fail_sync.store(true, Ordering::SeqCst);
    let r = handle.append(S, recs("doubt", 2), None, None).await;
    assert!(
        matches!(r, Err(AppendError::Store(StoreError::Io(_)))),
        "{r:?}"
    );
    assert_eq!(handle.stats().failed_commits.load(Ordering::Relaxed), 1);
    disk.faults.fail_sync.store(false, Ordering::SeqCst);
    // The writer reopens with backoff; poll with a deadline.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match handle.append(S, recs("after", 1), None, None).await {
            Ok(_) => break,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("the writer did not recover: {e}"),
        }
    }
    let jobs = handle.take(S, 100, u64::MAX).await.unwrap();
    let records: Vec<Vec<Vec<u8>>> = jobs.iter().map(owned).collect();
    assert_eq!(records.first(), Some(&recs("acked", 2)));
    assert_eq!(records.last(), Some(&recs("after", 1)));
    assert!(
        records.len() == 2 || records[1] == recs("doubt", 2),
        "{records:?}"
    );
    let snap = handle.snapshot().await.unwrap();
    assert!(snap.streams[0].1.balanced());
    handle.shutdown().await;
}
