//! `storage.min_free` counts the store file's free pages as free space: a drained backlog's file
//! holds the next appends without growing, so refusing them until compaction would be for
//! nothing (issue 17). Counting is not done per append.

use super::*;

/// No disk is ever enough: only the file's own free pages can take an append.
fn no_disk() -> StorageConfig {
    StorageConfig {
        max_bytes: u64::MAX / 4,
        min_free: u64::MAX / 4,
    }
}

/// `n` records of 1000 bytes (the stream stores them as they are: a job takes its size).
fn thousands(n: usize) -> Vec<Vec<u8>> {
    vec![vec![b'r'; 1000]; n]
}

/// A store in `dir` that held a backlog of about `mb` MB, drained but for its newest job (which
/// sits at the file's end, so redb cannot trim the free pages below it off the file); closed.
fn drained_store(dir: &std::path::Path, mb: usize) {
    let mut s = Store::open(dir, unbounded(), &[stream(S)], OpenOptions::default()).unwrap();
    for _ in 0..mb {
        append_one(&mut s, S, &thousands(1000), T0).unwrap();
    }
    // Large enough to be a leaf of its own, which the others' deletions do not rewrite elsewhere.
    append_one(&mut s, S, &thousands(1000), T0).unwrap();
    let newest = counters(&s, S).next_id - 1;
    loop {
        let jobs = take(&mut s, S, 100, T0);
        let older: Vec<&Lease> = jobs
            .iter()
            .filter(|j| j.lease.id != newest)
            .map(|j| &j.lease)
            .collect();
        if older.is_empty() {
            break;
        }
        ack(&mut s, &older);
        for j in &jobs {
            s.release(&j.lease);
        }
    }
    assert_eq!(counters(&s, S).ready_records, 1000);
    // The pages the last acknowledgements freed are released by the commits after them.
    for _ in 0..2 {
        s.transaction().unwrap().commit().unwrap();
    }
}

/// One append in its own transaction, committed (the refused ones too, as the writer's are), without
/// the full check of the fixtures' `append`: it reads every table, and these stores are large.
fn append_one(
    store: &mut Store,
    stream: &str,
    records: &[Vec<u8>],
    now: u64,
) -> Result<Appended, AppendError> {
    let mut tx = store.transaction().expect("begin");
    let r = tx.append_list(stream, records, None, now);
    tx.commit().expect("commit");
    r
}

fn reopen(dir: &std::path::Path, storage: StorageConfig) -> Store {
    Store::open(dir, storage, &[stream(S)], OpenOptions::default()).unwrap()
}

#[track_caller]
fn assert_min_free(r: Result<Appended, AppendError>) {
    assert!(
        matches!(
            r,
            Err(AppendError::Full {
                reason: FullReason::MinFree,
                ..
            })
        ),
        "{r:?}"
    );
}

#[test]
fn a_drained_file_s_free_pages_take_appends_the_disk_would_refuse() {
    // A new file has no free pages: the disk decides, and refuses.
    let fresh = tempfile::tempdir().unwrap();
    let mut s = reopen(fresh.path(), no_disk());
    assert_min_free(append_one(&mut s, S, &thousands(100), T0));

    let dir = tempfile::tempdir().unwrap();
    drained_store(dir.path(), 8);
    let mut s = reopen(dir.path(), no_disk());
    // 100 KB fit in what 8 MB left free, many times over.
    for i in 0..10 {
        append_one(&mut s, S, &thousands(100), T0).unwrap_or_else(|e| panic!("append {i}: {e}"));
    }
    // More than the file ever held does not.
    let big = thousands(20_000);
    assert_min_free(append_one(&mut s, S, &big, T0));
    assert_eq!(counters(&s, S).ready_records, 2000);
}

/// One transaction counts once, then counts its appends down: it takes about what the file has
/// free, not more.
#[test]
fn one_transaction_counts_once_and_takes_no_more_than_is_free() {
    let dir = tempfile::tempdir().unwrap();
    drained_store(dir.path(), 8);
    let mut s = reopen(dir.path(), no_disk());
    let counts = s.free_pages.counts;
    let mut tx = s.transaction().unwrap();
    let (mut accepted, mut refused) = (0u64, 0);
    for i in 0..200 {
        match tx.append_list(S, &thousands(100), None, T0) {
            Ok(a) => accepted += a.records,
            Err(AppendError::Full {
                reason: FullReason::MinFree,
                ..
            }) => refused += 1,
            Err(e) => panic!("append {i}: {e}"),
        }
    }
    let free = tx.free_pages.expect("counted");
    tx.commit().unwrap();
    assert_eq!(s.free_pages.counts, counts + 1, "one count for 200 appends");
    assert!(refused > 0, "20 MB do not fit in an 8 MB file");
    let taken = accepted * 1000;
    assert!(
        (4 << 20..=9 << 20).contains(&taken),
        "{taken} bytes accepted ({free} bytes left uncounted)"
    );
    // Refused appends, with no commit between them, do not count again.
    for _ in 0..20 {
        assert_min_free(append_one(&mut s, S, &thousands(20_000), T0));
    }
    assert!(
        s.free_pages.counts <= counts + 1 + 20,
        "at most one count per transaction"
    );
    assert!(counters(&s, S).balanced());
}

/// Counting costs as much as the backlog is large; measured here and printed. The throttle
/// (`COUNT_DUTY`) holds the next count back for 20 times what it is expected to take: with the
/// same backlog, what the last one took; once it drained, next to nothing.
#[test]
fn counting_free_pages_costs_with_the_backlog_and_is_throttled() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = reopen(dir.path(), unbounded());
    let record = thousands(1);
    for _ in 0..32 {
        append_one(&mut s, S, &thousands(1000), T0).unwrap();
    }
    drop(s);
    // More than the few pages a backlog's commits leave free.
    let big = thousands(4000);
    let mut s = reopen(dir.path(), no_disk());
    assert_min_free(append_one(&mut s, S, &big, T0));
    assert_eq!(s.free_pages.counts, 1);
    let queued = s.free_pages.last_took;
    // Stale (the refused append's transaction committed), but within the throttle's wait.
    assert_min_free(append_one(&mut s, S, &big, T0));
    assert_eq!(s.free_pages.counts, 1, "counted again at once");
    // Drained, it is counted at once: the walk is expected to be short now, and this is when the
    // count matters (issue 17: a drained store refused appends for as long as the throttle held).
    loop {
        let jobs = take(&mut s, S, 100, T0);
        if jobs.is_empty() {
            break;
        }
        ack(&mut s, &jobs.iter().map(|j| &j.lease).collect::<Vec<_>>());
    }
    append_one(&mut s, S, &record, T0).unwrap();
    assert_eq!(s.free_pages.counts, 2, "counted at once after the drain");
    let drained = s.free_pages.last_took;
    eprintln!(
        "a count of free pages: {queued:?} with 32 MB queued, {drained:?} with 32 MB drained"
    );
}
