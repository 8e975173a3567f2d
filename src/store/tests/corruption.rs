//! Corruption: values that fail their checksum are quarantined and counted, never dropped
//! silently, and a damaged file is reported as such.

use super::*;

/// Overwrites the value of job `id` in the ready table of `stream`, bypassing the store.
pub(super) fn overwrite_ready(
    store: &mut Store,
    stream: &str,
    id: u64,
    f: impl FnOnce(&mut Vec<u8>),
) {
    let tx = store.transaction().unwrap();
    {
        let st = &tx.rollback.store.streams[stream];
        let mut t = tx.txn.open_table(st.ready_def()).unwrap();
        let mut v = t.get(id).unwrap().expect("the job exists").value().to_vec();
        f(&mut v);
        t.insert(id, v.as_slice()).unwrap();
    }
    tx.commit().unwrap();
}

fn quarantine_entries(store: &Store) -> Vec<QuarantineEntry> {
    let rtx = store.db.begin_read().unwrap();
    let t = rtx.open_table(QUARANTINE).unwrap();
    t.iter()
        .unwrap()
        .map(|e| postcard::from_bytes(e.unwrap().1.value()).expect("a quarantine entry"))
        .collect()
}

#[test]
fn undecodable_job_is_quarantined_and_the_good_ones_delivered() {
    let d = Dir::new(vec![stream(S)]);
    let mut store = d.open();
    for tag in ["a", "b", "c"] {
        append(&mut store, S, &recs(tag, 2), T0).unwrap();
    }
    // Bit rot in the last byte of job 2's records: the header is intact, the checksum is not.
    let mut rotten = Vec::new();
    overwrite_ready(&mut store, S, 2, |v| {
        *v.last_mut().unwrap() ^= 0x40;
        rotten = v.clone();
    });
    check(&store);
    let jobs = take(&mut store, S, 10, T0);
    assert_eq!(ids(&jobs), [1, 3]);
    assert_eq!(owned(&jobs[1]), recs("c", 2));
    assert_eq!(store.quarantined().unwrap(), 1);
    let c = counters(&store, S);
    assert_eq!(c.quarantined_records, 2);
    assert!(c.balanced());
    let q = quarantine_entries(&store);
    assert_eq!(
        (q[0].stream.as_str(), q[0].table.as_str(), q[0].id),
        (S, "ready", 2)
    );
    assert_eq!(q[0].raw, rotten);
    assert!(q[0].reason.contains("checksum"), "{}", q[0].reason);
    let leases: Vec<&Lease> = jobs.iter().map(|j| &j.lease).collect();
    ack(&mut store, &leases);
    let c = counters(&store, S);
    assert_eq!((c.ready_jobs, c.ready_records, c.ready_bytes), (0, 0, 0));
    assert_eq!(c.delivered_records, 4);
    // The store still opens and works.
    let mut store = d.reopen(store);
    assert_eq!(store.quarantined().unwrap(), 1);
    append(&mut store, S, &recs("d", 1), T0).unwrap();
    assert_eq!(ids(&take(&mut store, S, 10, T0)), [4]);
}

#[test]
fn garbage_value_between_good_jobs_is_quarantined() {
    let d = Dir::new(vec![stream(S)]);
    let mut store = d.open();
    for tag in ["a", "b", "c"] {
        append(&mut store, S, &recs(tag, 2), T0).unwrap();
    }
    overwrite_ready(&mut store, S, 2, |v| {
        *v = b"\xffnot a job at all, just some bytes".to_vec()
    });
    // (No table check here: see `garbage_value_leaves_no_phantom_backlog`.)
    let jobs = take_all(&mut store, S, T0);
    assert_eq!(ids(&jobs), [1, 3]);
    assert_eq!(owned(&jobs[1]), recs("c", 2));
    assert_eq!(store.quarantined().unwrap(), 1);
    assert!(counters(&store, S).balanced());
    let q = quarantine_entries(&store);
    assert_eq!((q[0].table.as_str(), q[0].id), ("ready", 2));
    assert!(q[0].reason.contains("version"), "{}", q[0].reason);
    ack_unchecked(&mut store, &jobs);
    assert!(counters(&store, S).balanced());
    assert_eq!(counters(&store, S).delivered_records, 4);
    // Quarantined values are not taken again, also after a restart, and the store works.
    drop(store);
    let mut store =
        Store::open(d.dir.path(), d.storage, &d.streams, OpenOptions::default()).unwrap();
    assert!(take_all(&mut store, S, T0).is_empty());
    assert_eq!(store.quarantined().unwrap(), 1);
    let mut tx = store.transaction().unwrap();
    tx.append_list(S, &recs("d", 1), None, T0).unwrap();
    tx.commit().unwrap();
    assert_eq!(ids(&take_all(&mut store, S, T0)), [4]);
    assert!(counters(&store, S).balanced());
}

/// Acknowledges jobs without checking the tables against the counters.
fn ack_unchecked(store: &mut Store, jobs: &[Job]) {
    let mut tx = store.transaction().unwrap();
    for j in jobs {
        tx.ack(&j.lease).unwrap();
    }
    tx.commit().unwrap();
}

#[test]
fn garbage_value_leaves_no_phantom_backlog() {
    let d = Dir::new(vec![stream(S)]);
    let mut store = d.open();
    for tag in ["a", "b", "c"] {
        append(&mut store, S, &recs(tag, 2), T0).unwrap();
    }
    overwrite_ready(&mut store, S, 2, |v| {
        *v = b"\xffnot a job at all, just some bytes".to_vec()
    });
    let jobs = take_all(&mut store, S, T0);
    ack_unchecked(&mut store, &jobs);
    let c = counters(&store, S);
    assert_eq!(c.ready_jobs, 0);
    assert_eq!(
        (c.ready_records, c.ready_bytes),
        (0, 0),
        "an empty queue reports a backlog: {c:?}"
    );
    assert_eq!(c.quarantined_records, 2);
    check(&store);
}

#[test]
fn bit_flip_in_the_record_count_keeps_the_accounting_balanced() {
    let d = Dir::new(vec![stream(S)]);
    let mut store = d.open();
    for tag in ["a", "b", "c", "d"] {
        append(&mut store, S, &recs(tag, 2), T0).unwrap();
    }
    // Bit 10 of the record count: job 2 now claims 1026 records.
    overwrite_ready(&mut store, S, 2, |v| v[2] ^= 0x04);
    let jobs = take_all(&mut store, S, T0);
    assert_eq!(ids(&jobs), [1, 3, 4]);
    ack_unchecked(&mut store, &jobs);
    let c = counters(&store, S);
    assert!(c.balanced(), "unbalanced after a bit flip: {c:?}");
    assert_eq!(c.quarantined_records, 2, "{c:?}");
    check(&store);
}

/// A compressed job whose frame went bad behind a valid checksum: it is taken (a frame is checked
/// when it is read, not at every take), its records refuse to decompress, and `quarantine_taken`
/// moves it out of the queue, counted; the others are delivered and the identity holds.
#[test]
fn a_compressed_job_that_cannot_be_decompressed_is_quarantined_when_read() {
    let d = Dir::new(vec![StreamConfig {
        compression: AtRest::Always,
        ..stream(S)
    }]);
    let mut store = d.open();
    let big = |tag: &str| -> Vec<Vec<u8>> {
        (0..50)
            .map(|i| format!("{tag}-{i}-{}", "x".repeat(100)).into_bytes())
            .collect()
    };
    for tag in ["a", "b", "c"] {
        append(&mut store, S, &big(tag), T0).unwrap();
    }
    overwrite_ready(&mut store, S, 2, |v| {
        let area = format::decode(v).unwrap().area.bytes.len();
        assert_eq!(
            format::header(v).unwrap().area.unwrap().0,
            format::Codec::Zstd
        );
        let at = v.len() - area / 2;
        v[at] ^= 0x5a;
        format::seal(v);
    });
    check(&store);
    let jobs = take(&mut store, S, 10, T0);
    assert_eq!(ids(&jobs), [1, 2, 3], "the checksum holds: taken");
    let e = jobs[1].records().unwrap_err();
    assert!(matches!(e, format::FormatError::Compressed(_)), "{e}");
    let mut tx = store.transaction().unwrap();
    tx.quarantine_taken(&jobs[1].lease, &e.to_string()).unwrap();
    tx.commit().unwrap();
    assert_eq!(store.quarantined().unwrap(), 1);
    assert_eq!(owned(&jobs[2]), big("c"));
    ack(&mut store, &[&jobs[0].lease, &jobs[2].lease]);
    let c = counters(&store, S);
    assert_eq!((c.quarantined_records, c.delivered_records), (50, 100));
    assert_eq!((c.ready_jobs, c.ready_bytes, c.ready_raw_bytes), (0, 0, 0));
    assert!(c.balanced(), "{c:?}");
    let q = quarantine_entries(&store);
    assert!(
        q[0].reason.starts_with("compressed record area"),
        "{}",
        q[0].reason
    );
}
