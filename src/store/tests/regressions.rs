//! Regressions from review, one test each.

use super::*;

use super::corruption::overwrite_ready;
use super::group_commit::spawn_on;

/// A value that goes bad while its job is in flight is quarantined when the attempt fails, not
/// silently dropped.
#[test]
fn a_job_that_rots_in_flight_is_quarantined_on_fail() {
    let d = Dir::new(vec![stream(S)]);
    let mut store = d.open();
    append(&mut store, S, &recs("a", 3), T0).unwrap();
    let jobs = take(&mut store, S, 1, T0);
    overwrite_ready(&mut store, S, jobs[0].lease.id, |v| {
        let last = v.len() - 1;
        v[last] ^= 0x40;
    });
    let mut tx = store.transaction().unwrap();
    let r = tx.fail(&jobs[0].lease, &transient(T0 + 1000, 5), T0);
    assert!(matches!(r, Err(StoreError::Corrupted(_))), "{r:?}");
    tx.commit().unwrap();
    let c = counters(&store, S);
    assert_eq!((c.ready_records, c.quarantined_records), (0, 3), "{c:?}");
    assert!(c.balanced(), "{c:?}");
    assert_eq!(store.quarantined().unwrap(), 1);
    assert_eq!(store.in_flight(S), 0);
}

/// Deleting old jobs frees no filesystem space, so below `min_free` drop_oldest deletes nothing.
#[test]
fn drop_oldest_never_deletes_for_an_append_refused_by_min_free() {
    let mut cfg = stream(S);
    cfg.when_full = WhenFull::DropOldest;
    cfg.max_jobs = 2;
    let d = Dir::new(vec![cfg]);
    let mut store = d.open();
    append(&mut store, S, &recs("a", 1), T0).unwrap();
    append(&mut store, S, &recs("b", 1), T0).unwrap();
    store.storage.min_free = u64::MAX / 2;
    let mut tx = store.transaction().unwrap();
    let r = tx.append_list(S, &recs("c", 1), None, T0);
    assert!(matches!(r, Err(AppendError::Full { .. })), "{r:?}");
    tx.commit().unwrap();
    let c = counters(&store, S);
    assert_eq!((c.ready_jobs, c.dropped_oldest_records), (2, 0), "{c:?}");
}

/// An append parked behind another gets its answer at its own deadline, not at the other's.
#[tokio::test]
async fn a_parked_append_is_answered_at_its_own_deadline() {
    let mut cfg = stream(S);
    cfg.max_jobs = 1;
    let disk = MemDisk::default();
    let handle = spawn_on(&disk, vec![cfg]);
    handle.append(S, recs("a", 1), None, None).await.unwrap();
    let long = {
        let h = handle.clone();
        tokio::spawn(async move {
            h.append(S, recs("b", 1), None, Some(Duration::from_secs(3)))
                .await
        })
    };
    // Let the long one park first.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let t = Instant::now();
    let r = handle
        .append(S, recs("c", 1), None, Some(Duration::from_millis(200)))
        .await;
    let waited = t.elapsed();
    assert!(matches!(r, Err(AppendError::Full { .. })), "{r:?}");
    assert!(
        waited < Duration::from_millis(1500),
        "answered after {waited:?}, behind the 3 s one"
    );
    let r = long.await.unwrap();
    assert!(matches!(r, Err(AppendError::Full { .. })), "{r:?}");
}
