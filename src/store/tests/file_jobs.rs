//! File jobs: spooled files, their bytes in the bounds, their disposal.

use super::*;

/// Puts a file of `len` bytes in the spool of task `t` and returns its key.
fn spool_file(dir: &Dir, name: &str, len: usize) -> Vec<u8> {
    let rel = spool::task_dir("t").join(spool::new_name(std::ffi::OsStr::new(name), T0));
    let path = dir.dir.path().join(&rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, vec![b'f'; len]).unwrap();
    rel.into_os_string().into_encoded_bytes()
}

#[track_caller]
fn append_file(
    store: &mut Store,
    stream: &str,
    spool: &[u8],
    len: u64,
    archive: Option<&[u8]>,
) -> Result<FileAppend, AppendError> {
    let mut tx = store.transaction().expect("begin");
    let file = SpooledFile {
        spool: spool.to_vec(),
        name: b"orig.csv".to_vec(),
        len,
        mtime_ms: T0,
        archive: archive.map(<[u8]>::to_vec),
    };
    let r = tx.append_file(stream, &file, T0);
    tx.commit().expect("commit");
    check(store);
    r
}

/// Both spool tables: the files jobs ship, then those to dispose of.
fn spool_entries(store: &Store) -> Vec<(Vec<u8>, SpoolEntry)> {
    let rtx = store.db.begin_read().unwrap();
    let mut out = Vec::new();
    for table in [SPOOL, DISPOSE] {
        let t = rtx.open_table(table).unwrap();
        out.extend(t.iter().unwrap().map(|e| {
            let (k, v) = e.unwrap();
            (k.value().to_vec(), spool_entry(v.value()).unwrap())
        }));
    }
    out
}

#[test]
fn a_file_job_counts_its_file_ships_it_and_archives_it_after_delivery() {
    let d = Dir::new(vec![stream(S)]);
    let mut s = d.open();
    let key = spool_file(&d, "orig.csv", 5000);
    let archive = d.dir.path().join("archive");
    std::fs::create_dir(&archive).unwrap();
    let arc = archive.as_os_str().as_encoded_bytes().to_vec();
    assert_eq!(
        append_file(&mut s, S, &key, 5000, Some(&arc)).unwrap(),
        FileAppend::Queued { id: 1 }
    );
    // The same file again (a lost reply, a recovery): nothing new.
    assert_eq!(
        append_file(&mut s, S, &key, 5000, Some(&arc)).unwrap(),
        FileAppend::Known
    );
    let c = counters(&s, S);
    assert_eq!(
        (c.ready_jobs, c.ready_records, c.appended_records),
        (1, 1, 1)
    );
    assert!(
        c.ready_bytes > 5000,
        "the file's bytes count: {}",
        c.ready_bytes
    );
    let mut s = d.reopen(s);
    let jobs = take(&mut s, S, 10, T0);
    let f = jobs[0].file().expect("a file job");
    assert_eq!((f.len, f.name.to_str()), (5000, Some("orig.csv")));
    assert_eq!(std::fs::read(&f.path).unwrap().len(), 5000);
    assert_eq!(jobs[0].bytes(), c.ready_bytes);
    ack(&mut s, &[&jobs[0].lease]);
    let c = counters(&s, S);
    assert_eq!((c.delivered_records, c.ready_bytes), (1, 0));
    // Marked for disposal in the ack's transaction, and handed out after it committed.
    assert!(matches!(
        &spool_entries(&s)[..],
        [(k, SpoolEntry::Dispose { archive: Some(_), .. })] if *k == key
    ));
    let disposals = s.take_disposals();
    assert_eq!(disposals.len(), 1);
    // A crash now: the reopened store still knows it must be archived.
    let mut s = d.reopen(s);
    assert_eq!(s.take_disposals(), disposals);
    spool::dispose(s.data_dir(), &disposals[0]).unwrap();
    let mut tx = s.transaction().unwrap();
    tx.forget_spool(std::slice::from_ref(&key)).unwrap();
    tx.commit().unwrap();
    assert!(spool_entries(&s).is_empty());
    assert_eq!(std::fs::read(archive.join("orig.csv")).unwrap().len(), 5000);
    let s = d.reopen(s);
    assert!(s.disposals.is_empty());
}

#[test]
fn a_full_stream_refuses_a_file_without_counting_it_unless_it_may_drop_the_oldest() {
    let mut st = stream(S);
    st.max_bytes = 12_000;
    st.when_full = WhenFull::DropNewest;
    let d = Dir::new(vec![st]);
    let mut s = d.open();
    let a = spool_file(&d, "a", 5000);
    let b = spool_file(&d, "b", 5000);
    let c = spool_file(&d, "c", 5000);
    append_file(&mut s, S, &a, 5000, None).unwrap();
    append_file(&mut s, S, &b, 5000, None).unwrap();
    let before = counters(&s, S);
    assert!(matches!(
        append_file(&mut s, S, &c, 5000, None),
        Err(AppendError::Full { .. })
    ));
    assert_eq!(counters(&s, S), before, "a refused file is not counted");
    assert!(matches!(
        append_file(&mut s, S, &c, 50_000, None),
        Err(AppendError::TooLarge { .. })
    ));
    drop(s);

    // drop_oldest: the oldest file job goes (counted, its file deleted) to make room.
    let mut st = stream(S);
    st.max_bytes = 12_000;
    st.when_full = WhenFull::DropOldest;
    let d2 = Dir {
        dir: d.dir,
        storage: unbounded(),
        streams: vec![st],
    };
    let mut s = d2.open();
    assert!(matches!(
        append_file(&mut s, S, &c, 5000, None).unwrap(),
        FileAppend::Queued { .. }
    ));
    let n = counters(&s, S);
    assert_eq!((n.dropped_oldest_records, n.ready_jobs), (1, 2));
    let disposals = s.take_disposals();
    assert_eq!(disposals.len(), 1);
    assert_eq!(
        (disposals[0].spool.clone(), disposals[0].archive.clone()),
        (a, None)
    );
}

#[test]
fn dead_file_jobs_are_replayed_with_their_file_and_purged_with_it() {
    let d = Dir::new(vec![stream(S)]);
    let mut s = d.open();
    let key = spool_file(&d, "x", 100);
    append_file(&mut s, S, &key, 100, None).unwrap();
    let jobs = take(&mut s, S, 1, T0);
    fail(&mut s, &jobs[0].lease, &permanent(), T0);
    assert_eq!(counters(&s, S).dead_records, 1);
    let mut tx = s.transaction().unwrap();
    assert_eq!(tx.replay_dead(S, None, None, 10).unwrap(), (1, 1));
    tx.commit().unwrap();
    let jobs = take(&mut s, S, 1, T0);
    assert!(jobs[0].file().is_some(), "still a file job after replay");
    // A split is refused: a file is one record.
    let mut tx = s.transaction().unwrap();
    assert!(matches!(
        tx.settle_prefix(&jobs[0].lease, 1, &Settle::Delivered, T0),
        Err(StoreError::InvalidSettle { .. })
    ));
    drop(tx);
    s.load_counters().unwrap();
    // Still in flight: fail it for good.
    fail(&mut s, &jobs[0].lease, &permanent(), T0);
    let mut tx = s.transaction().unwrap();
    assert_eq!(tx.purge_dead(S, None, 10).unwrap(), (1, 1));
    tx.commit().unwrap();
    check(&s);
    let path = d.dir.path().join(std::str::from_utf8(&key).unwrap());
    assert!(path.exists());
    assert_eq!(s.dispose_now().unwrap(), 1);
    assert!(!path.exists(), "a purged file job takes its file along");
    assert!(spool_entries(&s).is_empty());
}

#[test]
fn a_damaged_file_job_is_quarantined_and_its_intact_file_can_be_queued_again() {
    let d = Dir::new(vec![stream(S)]);
    let mut s = d.open();
    let key = spool_file(&d, "x", 100);
    append_file(&mut s, S, &key, 100, None).unwrap();
    // Flip a byte of the stored value (bit rot on the card).
    {
        let Db::Rw(db) = &s.db else {
            panic!("writable")
        };
        let txn = db.begin_write().unwrap();
        {
            let st = &s.streams[S];
            let mut t = txn.open_table(st.ready_def()).unwrap();
            let mut v = t.get(1).unwrap().unwrap().value().to_vec();
            let last = v.len() - 1;
            v[last] ^= 0xff;
            t.insert(1, v.as_slice()).unwrap();
        }
        txn.commit().unwrap();
    }
    let jobs = take(&mut s, S, 10, T0);
    assert!(jobs.is_empty());
    let c = counters(&s, S);
    assert_eq!((c.quarantined_records, c.ready_jobs), (1, 0));
    assert!(!s.spool_known(&key).unwrap(), "the spool entry is released");
    // The task's recovery queues the same file again, as a new job.
    assert_eq!(
        append_file(&mut s, S, &key, 100, None).unwrap(),
        FileAppend::Queued { id: 2 }
    );
    assert!(counters(&s, S).balanced());
}
