//! Tests of the writer thread: checkpoints with appends, parked appends, idle wake-ups and
//! compaction, a full disk, one request's refusal in a shared transaction.

use super::*;
use crate::store::{BatchConfig, OpenOptions, StorageConfig, WhenFull};

fn stream() -> StreamConfig {
    StreamConfig {
        name: "s".into(),
        sink: None,
        batch: BatchConfig {
            max_records: 1000,
            max_bytes: 1 << 20,
            linger: Duration::ZERO,
        },
        max_jobs: 1000,
        max_bytes: 1 << 30,
        when_full: WhenFull::Block,
        ttl: None,
        max_age: None,
        dead_max_jobs: 10,
        compression: crate::store::AtRest::Plain,
        replay: crate::store::Replay::OLDEST_FIRST,
        hold_until_clock_synced: false,
        downsample: None,
    }
}

/// What opens (and reopens) a store of `cfg` in `dir`, as the agent's reopen does.
fn opener(
    dir: &std::path::Path,
    cfg: StreamConfig,
) -> impl FnMut() -> Result<Store, StoreError> + Clone + Send + 'static {
    let dir = dir.to_path_buf();
    let storage = StorageConfig {
        max_bytes: 1 << 30,
        min_free: 0,
    };
    move || {
        Store::open(
            &dir,
            storage,
            std::slice::from_ref(&cfg),
            OpenOptions::default(),
        )
    }
}

/// A backlog that waits (an outage) must not wake the writer: the compaction timer applies
/// only to a drained store. (It once fell to 0 once the store had been idle for its 10 s while
/// jobs waited, and the thread woke every millisecond for the rest of the outage.)
#[test]
fn a_waiting_backlog_does_not_wake_the_writer() {
    let dir = tempfile::tempdir().unwrap();
    let mut open = opener(dir.path(), stream());
    let mut store = open().unwrap();
    let mut tx = store.transaction().unwrap();
    tx.append_list("s", &[b"queued"], None, now_ms()).unwrap();
    tx.commit().unwrap();
    let mut w = idle_writer(store, open);
    assert!(
        w.next_timeout() >= Duration::from_secs(3600),
        "a store with a backlog sleeps until a request: {:?}",
        w.next_timeout()
    );
    // Drained, it wakes for its compaction.
    let mut tx = w.store.as_mut().unwrap().transaction().unwrap();
    let jobs = tx.take("s", 10, u64::MAX, now_ms()).unwrap();
    tx.ack(&jobs[0].lease).unwrap();
    tx.commit().unwrap();
    assert_eq!(w.next_timeout(), Duration::from_millis(1));
}

/// A dead-letter replay of an id that does not exist is refused on its own: the appends that
/// share its transaction are committed and acknowledged (issue 31 B: the whole group commit
/// failed, and concurrent producers were answered 503).
#[test]
fn a_replay_of_a_missing_dead_letter_does_not_fail_the_appends_beside_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut open = opener(dir.path(), stream());
    let store = open().unwrap();
    let mut w = idle_writer(store, open);
    let append = |tag: &'static [u8]| {
        let (reply, rx) = tokio::sync::oneshot::channel();
        let req = Request::Append {
            stream: "s".into(),
            records: Arc::new(RecordBuf::from(&[tag][..])),
            checkpoint: None,
            deadline: None,
            reply,
        };
        (req, rx)
    };
    let (a, mut a_rx) = append(b"before");
    let (b, mut b_rx) = append(b"after");
    let (reply, mut replay_rx) = tokio::sync::oneshot::channel();
    let replay = Request::Dead {
        stream: "s".into(),
        op: DeadOp::Replay {
            id: Some(99_999),
            failed_before_ms: None,
            limit: 1000,
        },
        reply,
    };
    let commits = w.stats.commits.load(Ordering::Relaxed);
    w.apply(vec![a, replay, b]);
    assert_eq!(
        w.stats.commits.load(Ordering::Relaxed),
        commits + 1,
        "one transaction"
    );
    let r = replay_rx.try_recv().expect("answered");
    assert!(
        matches!(r, Err(StoreError::NoSuchJob { id: 99_999, .. })),
        "{r:?}"
    );
    assert_eq!(
        r.unwrap_err().to_string(),
        "no job 99999 in dead of stream \"s\""
    );
    a_rx.try_recv().expect("answered").expect("acknowledged");
    b_rx.try_recv().expect("answered").expect("acknowledged");
    let snap = w.snapshot();
    assert_eq!(snap.streams[0].1.ready_records, 2);
    drop(w);
    let store = opener(dir.path(), stream())().unwrap();
    assert_eq!(store.counters("s").unwrap().ready_records, 2, "on the disk");
}

/// A writer around `store` (reopened by `open`) whose last request was long ago.
fn idle_writer(
    store: Store,
    open: impl FnMut() -> Result<Store, StoreError> + Send + 'static,
) -> Writer {
    let mut w = Writer::new(
        store,
        Box::new(open),
        WriterOptions::default(),
        Arc::default(),
        Arc::default(),
        Arc::default(),
    );
    w.last_write = Instant::now() - COMPACT_AFTER_IDLE * 2;
    w
}

/// Producers retrying against a full disk (refused appends), and `/metrics` snapshots, change
/// nothing: they must not put off the compaction of a drained store (issue 17: with the 507's
/// `Retry-After` as long as the quiet time, a producer that retried on time put it off
/// forever). A write does.
#[test]
fn refused_appends_and_reads_do_not_put_compaction_off() {
    let dir = tempfile::tempdir().unwrap();
    let mut open = opener(dir.path(), stream());
    let mut store = open().unwrap();
    store.storage.min_free = u64::MAX / 2;
    let mut w = idle_writer(store, open);
    let append = |w: &mut Writer| {
        let (reply, mut rx) = tokio::sync::oneshot::channel();
        let (snap, _snap_rx) = tokio::sync::oneshot::channel();
        w.apply(vec![
            Request::Append {
                stream: "s".into(),
                records: Arc::new(RecordBuf::from(&[b"r"][..])),
                checkpoint: None,
                deadline: None,
                reply,
            },
            Request::Snapshot { reply: snap },
        ]);
        rx.try_recv().expect("answered")
    };
    for _ in 0..5 {
        let r = append(&mut w);
        assert!(
            matches!(r, Err(AppendError::Full { reason, .. }) if reason.is_disk()),
            "{r:?}"
        );
        assert_eq!(w.next_timeout(), Duration::from_millis(1), "compaction due");
    }
    w.store.as_mut().unwrap().storage.min_free = 0;
    append(&mut w).unwrap();
    assert!(
        w.next_timeout() > Duration::from_secs(1),
        "a write puts it off"
    );
}

/// Once drained and idle, a store whose file is mostly free pages is compacted, small as it
/// is (a compressed backlog of a few MB).
#[test]
fn a_drained_idle_store_gives_its_disk_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut open = opener(dir.path(), stream());
    let mut store = open().unwrap();
    let mut rng = fastrand::Rng::with_seed(9);
    let records: Vec<Vec<u8>> = (0..3000)
        .map(|_| (0..1000).map(|_| rng.alphanumeric() as u8).collect())
        .collect();
    let mut tx = store.transaction().unwrap();
    tx.append_list("s", &records, None, now_ms()).unwrap();
    tx.commit().unwrap();
    let full = store.file_bytes();
    assert!(full > 3 << 20, "{full}");
    let mut tx = store.transaction().unwrap();
    for j in tx.take("s", 100, u64::MAX, now_ms()).unwrap() {
        tx.ack(&j.lease).unwrap();
    }
    tx.commit().unwrap();
    let mut w = idle_writer(store, open);
    w.housekeeping();
    assert!(w.compacted);
    let after = w.store.as_ref().unwrap().file_bytes();
    assert!(after < full / 2, "{after} of {full} bytes after compaction");
}

/// An append waiting for room in a full `block` stream is answered "stopping" as soon as the
/// stop begins, with nothing stored; later ones that find the stream full do not wait either.
#[tokio::test]
async fn a_waiting_append_is_answered_at_once_when_the_stop_begins() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StreamConfig {
        max_jobs: 1,
        ..stream()
    };
    let mut open = opener(dir.path(), cfg);
    let handle = spawn(
        open().unwrap(),
        Box::new(open.clone()),
        WriterOptions::default(),
    )
    .unwrap();
    handle
        .append("s", vec![b"1".to_vec()], None, None)
        .await
        .unwrap();
    let waiting = {
        let handle = handle.clone();
        tokio::spawn(async move {
            handle
                .append(
                    "s",
                    vec![b"2".to_vec()],
                    None,
                    Some(Duration::from_secs(600)),
                )
                .await
        })
    };
    // The spawned append is sent at its first poll (this runtime has one thread); this one
    // goes behind it in the writer's queue, so once it is answered the other one waits.
    tokio::task::yield_now().await;
    let full = handle.append("s", vec![b"3".to_vec()], None, None).await;
    assert!(matches!(full, Err(AppendError::Full { .. })), "{full:?}");
    handle.stop_waiting();
    let r = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("answered well before its 600 s wait")
        .unwrap();
    assert!(matches!(r, Err(AppendError::Stopping)), "{r:?}");
    let later = handle
        .append(
            "s",
            vec![b"4".to_vec()],
            None,
            Some(Duration::from_secs(600)),
        )
        .await;
    assert!(matches!(later, Err(AppendError::Stopping)), "{later:?}");
    let snap = handle.snapshot().await.unwrap();
    assert_eq!(
        snap.streams[0].1.ready_records, 1,
        "only the first is stored"
    );
    handle.shutdown().await;
}

#[test]
fn the_ttl_sweep_runs_every_tenth_of_the_shortest_ttl_within_bounds() {
    let s = Duration::from_secs;
    assert_eq!(expire_interval(std::iter::empty()), EXPIRE_EVERY);
    assert_eq!(expire_interval([s(7 * 86_400)].into_iter()), EXPIRE_EVERY);
    assert_eq!(expire_interval([s(7 * 86_400), s(60)].into_iter()), s(6));
    assert_eq!(expire_interval([s(2)].into_iter()), EXPIRE_MIN);
}

/// A job past a short TTL leaves the queue within a few seconds, not at the next 30 s sweep.
#[tokio::test]
async fn a_job_past_a_short_ttl_expires_within_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let mut short = stream();
    short.ttl = Some(Duration::from_secs(2));
    let mut open = opener(dir.path(), short);
    let handle = spawn(
        open().unwrap(),
        Box::new(open.clone()),
        WriterOptions::default(),
    )
    .unwrap();
    handle
        .append("s", vec![b"r1".to_vec(), b"r2".to_vec()], None, None)
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let counters = loop {
        let snap = handle.snapshot().await.unwrap();
        let c = snap.streams[0].1.clone();
        if c.expired_records == 2 || tokio::time::Instant::now() >= deadline {
            break c;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(counters.expired_records, 2, "{counters:?}");
    assert_eq!(counters.ready_records, 0, "{counters:?}");
}

/// A checkpoint saved with an append is read back through the handle, after a restart too.
#[tokio::test]
async fn checkpoint_is_read_back_through_the_handle() {
    let dir = tempfile::tempdir().unwrap();
    let mut open = opener(dir.path(), stream());
    let handle = spawn(
        open().unwrap(),
        Box::new(open.clone()),
        WriterOptions::default(),
    )
    .unwrap();
    assert_eq!(handle.checkpoint("tail").await.unwrap(), None);
    let cp = Some(("tail".to_string(), b"cp-1".to_vec()));
    handle
        .append("s", vec![b"r".to_vec()], cp, None)
        .await
        .unwrap();
    assert_eq!(
        handle.checkpoint("tail").await.unwrap(),
        Some(b"cp-1".to_vec())
    );
    assert_eq!(handle.checkpoint("other").await.unwrap(), None);
    handle.shutdown().await;
    let handle = spawn(open().unwrap(), Box::new(open), WriterOptions::default()).unwrap();
    assert_eq!(
        handle.checkpoint("tail").await.unwrap(),
        Some(b"cp-1".to_vec())
    );
    handle.shutdown().await;
}
