//! I/O errors at the storage seam: a failed write or fsync is never acknowledged, and a new store
//! on the same disk recovers.

use super::*;

#[derive(Debug, Clone, Copy)]
enum Fault {
    Sync,
    Write,
}

impl Fault {
    fn set(self, disk: &MemDisk, on: bool) {
        let flag = match self {
            Fault::Sync => &disk.faults.fail_sync,
            Fault::Write => &disk.faults.fail_write,
        };
        flag.store(on, Ordering::SeqCst);
    }
}

/// The records of every queued job, oldest first, taken and released again.
fn queued_records(store: &mut Store, stream: &str) -> Vec<Vec<Vec<u8>>> {
    let jobs = take_all(store, stream, u64::MAX);
    for j in &jobs {
        store.release(&j.lease);
    }
    jobs.into_iter().map(|j| owned(&j)).collect()
}

#[test]
fn failed_fsync_or_write_is_not_acknowledged_and_a_new_store_recovers() {
    for fault in [Fault::Sync, Fault::Write] {
        for clear_before_drop in [false, true] {
            let ctx = format!("{fault:?}, cleared before drop: {clear_before_drop}");
            let disk = MemDisk::default();
            let streams = [stream(S)];
            let mut store = open_mem(&disk, unbounded(), &streams);
            append(&mut store, S, &recs("acked", 3), T0).unwrap();

            fault.set(&disk, true);
            let r = store.transaction().and_then(|mut tx| {
                tx.append_list(S, &recs("doubt", 2), Some(("src", b"doubt")), T0)
                    .map_err(|e| StoreError::io(e.to_string()))?;
                tx.commit()
            });
            assert!(matches!(r, Err(StoreError::Io(_))), "{ctx}: {r:?}");
            // Whatever the old store does now, it must not claim success.
            let again = store.transaction().and_then(|mut tx| {
                tx.append_list(S, &recs("later", 1), None, T0)
                    .map_err(|e| StoreError::io(e.to_string()))?;
                tx.commit()
            });
            assert!(again.is_err(), "{ctx}: committed while the disk fails");
            if clear_before_drop {
                fault.set(&disk, false);
                drop(store);
            } else {
                drop(store);
                fault.set(&disk, false);
            }

            let mut store = open_mem(&disk, unbounded(), &streams);
            let q = queued_records(&mut store, S);
            assert_eq!(
                q.first(),
                Some(&recs("acked", 3)),
                "{ctx}: acknowledged job"
            );
            // The failed commit's outcome is unknown: whole or absent, never half.
            let doubt_in = q.len() == 2;
            match q.len() {
                1 => {}
                2 => assert_eq!(q[1], recs("doubt", 2), "{ctx}"),
                n => panic!("{ctx}: {n} jobs"),
            }
            assert_eq!(
                store.checkpoint("src").unwrap().is_some(),
                doubt_in,
                "{ctx}: checkpoint and records commit together"
            );
            append(&mut store, S, &recs("after", 4), T0).unwrap();
            let q = queued_records(&mut store, S);
            assert_eq!(q.last(), Some(&recs("after", 4)), "{ctx}");
            let mut store = {
                drop(store);
                open_mem(&disk, unbounded(), &streams)
            };
            let jobs = take_all(&mut store, S, T0);
            let leases: Vec<&Lease> = jobs.iter().map(|j| &j.lease).collect();
            ack(&mut store, &leases);
            let c = counters(&store, S);
            assert_eq!(c.ready_jobs, 0, "{ctx}");
            assert_eq!(
                c.delivered_records,
                3 + 4 + if doubt_in { 2 } else { 0 },
                "{ctx}"
            );
        }
    }
}

/// A commit that meets a full disk (ENOSPC) is answered "no space" (ingest's 507), not a store
/// failure; so is every append while the disk stays full; the acknowledged records stay, and
/// once there is room the next append is stored, by the same writer (the store reopened).
#[tokio::test]
async fn a_full_disk_is_no_space_and_the_writer_takes_appends_again_once_there_is_room() {
    let disk = MemDisk::default();
    let handle = group_commit_spawn(&disk);
    handle
        .append(S, recs("acked", 3), None, None)
        .await
        .unwrap();
    disk.faults.full.store(true, Ordering::SeqCst);
    for i in 0..3 {
        let r = handle.append(S, recs("full", 2), None, None).await;
        assert!(
            matches!(&r, Err(AppendError::Store(e)) if e.is_no_space()),
            "append {i} on a full disk: {r:?}"
        );
    }
    disk.faults.full.store(false, Ordering::SeqCst);
    handle.append(S, recs("room", 1), None, None).await.unwrap();
    let snap = handle.snapshot().await.unwrap();
    assert_eq!(
        snap.streams[0].1.ready_records, 4,
        "{:?}",
        snap.streams[0].1
    );
    handle.shutdown().await;
}

fn group_commit_spawn(disk: &MemDisk) -> writer::StoreHandle {
    super::group_commit::spawn_on(disk, vec![stream(S)])
}
