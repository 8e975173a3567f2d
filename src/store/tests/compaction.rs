//! Compaction: a drained backlog gives its disk space back.

use super::*;

/// A box that buffered a backlog gets its disk back once the backlog drained.
#[test]
fn a_drained_backlog_gives_its_disk_back() {
    let dir = tempfile::tempdir().unwrap();
    let stream = StreamConfig {
        name: "s".into(),
        sink: None,
        batch: BatchConfig {
            max_records: 100,
            max_bytes: 1 << 20,
            linger: Duration::from_secs(1),
        },
        max_jobs: 1_000_000,
        max_bytes: 1 << 30,
        when_full: WhenFull::Block,
        ttl: None,
        max_age: None,
        dead_max_jobs: 10,
        compression: AtRest::Plain,
        replay: crate::store::Replay::OLDEST_FIRST,
        hold_until_clock_synced: false,
        downsample: None,
    };
    let storage = StorageConfig {
        max_bytes: 1 << 30,
        min_free: 0,
    };
    let mut s = Store::open(
        dir.path(),
        storage,
        std::slice::from_ref(&stream),
        OpenOptions::default(),
    )
    .unwrap();
    let record = vec![b'x'; 200];
    let batch: Vec<&[u8]> = vec![record.as_slice(); 1000];
    for _ in 0..150 {
        let mut tx = s.transaction().unwrap();
        tx.append_list("s", &batch, None, now_ms()).unwrap();
        tx.commit().unwrap();
    }
    let full = s.file_bytes();
    assert!(full > 25 << 20, "a 30 MB backlog is on disk: {full}");
    loop {
        let mut tx = s.transaction().unwrap();
        let jobs = tx.take("s", 500, u64::MAX, now_ms()).unwrap();
        if jobs.is_empty() {
            break;
        }
        for j in &jobs {
            tx.ack(&j.lease).unwrap();
        }
        tx.commit().unwrap();
    }
    assert!(s.reclaimable_bytes().unwrap() > 0);
    let freed = s.compact().unwrap();
    let after = s.file_bytes();
    assert!(
        after < 2 << 20,
        "after draining and compacting the file is small: {after} (was {full}, freed {freed})"
    );
    let c = s.counters("s").unwrap();
    assert_eq!(c.delivered_records, 150_000);
    assert!(c.balanced());
    // Still usable after compaction.
    let mut tx = s.transaction().unwrap();
    tx.append_list("s", &batch[..10], None, now_ms()).unwrap();
    tx.commit().unwrap();
}
