//! Compression at rest: when a job is stored compressed (`AtRest`), what the bounds count, and
//! that every operation keeps a compressed job compressed and its counters exact.

use super::*;

fn compressed_stream(at_rest: AtRest) -> StreamConfig {
    StreamConfig {
        compression: at_rest,
        ..stream(S)
    }
}

/// Log-like records: `n` of them, tagged, 120 bytes each.
fn lines(tag: &str, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            format!(
                "{{\"tag\":\"{tag}\",\"i\":{i},\"msg\":\"{}\"}}",
                "y".repeat(90)
            )
            .into_bytes()
        })
        .collect()
}

fn codec_of(store: &Store, id: u64) -> format::Codec {
    let rtx = store.db.begin_read().unwrap();
    let t = rtx.open_table(store.streams[S].ready_def()).unwrap();
    let v = t.get(id).unwrap().expect("the job").value().to_vec();
    format::header(&v).unwrap().area.expect("version 3").0
}

/// `auto`: jobs appended while fewer than WAITING_JOBS wait untaken are stored as they are, the
/// rest compressed; jobs in flight are not waiting.
#[test]
fn auto_compresses_what_waits() {
    let d = Dir::new(vec![compressed_stream(AtRest::Waiting)]);
    let mut store = d.open();
    let n = WAITING_JOBS as usize + 4;
    for i in 0..n {
        append(&mut store, S, &lines(&format!("a{i}"), 10), T0).unwrap();
    }
    let codecs: Vec<format::Codec> = (1..=n as u64).map(|id| codec_of(&store, id)).collect();
    let plain = WAITING_JOBS as usize;
    assert!(
        codecs[..plain].iter().all(|c| *c == format::Codec::None),
        "{codecs:?}"
    );
    assert!(
        codecs[plain..].iter().all(|c| *c == format::Codec::Zstd),
        "{codecs:?}"
    );
    let c = counters(&store, S);
    assert!(c.ready_raw_bytes > c.ready_bytes, "{c:?}");
    // Every job taken (a worker keeps up): the next append passes through.
    let jobs = take(&mut store, S, 100, T0);
    append(&mut store, S, &lines("b", 10), T0).unwrap();
    assert_eq!(codec_of(&store, n as u64 + 1), format::Codec::None);
    for (j, i) in jobs.iter().zip(0..) {
        assert!(
            owned(j) == lines(&format!("a{i}"), 10),
            "job {i}: compressed or not, the same records"
        );
    }
}

/// The bounds count bytes on disk: a stream holds more records compressed than it could raw.
#[test]
fn bounds_count_bytes_on_disk() {
    let one = format::encode(T0, &fresh_meta(0, None), &lines("x", 10)).len() as u64;
    let d = Dir::new(vec![StreamConfig {
        max_bytes: one * 4,
        ..compressed_stream(AtRest::Always)
    }]);
    let mut store = d.open();
    for i in 0..20 {
        append(&mut store, S, &lines(&format!("x{i}"), 10), T0)
            .unwrap_or_else(|e| panic!("job {i}: {e}"));
    }
    let c = counters(&store, S);
    assert!(
        c.ready_bytes <= one * 4 && c.ready_raw_bytes > one * 4 * 4,
        "{c:?}"
    );
}

/// A compressed job keeps its area through a failed attempt, a partial settle (both parts stored
/// compressed again), a dead letter and its replay; counters (raw included) stay exact.
#[test]
fn a_compressed_job_stays_compressed_through_its_life() {
    let d = Dir::new(vec![compressed_stream(AtRest::Always)]);
    let mut store = d.open();
    append(&mut store, S, &lines("a", 40), T0).unwrap();
    assert_eq!(codec_of(&store, 1), format::Codec::Zstd);
    let job = take(&mut store, S, 1, T0).remove(0);
    let rest = settle(&mut store, &job.lease, 10, &dead("refused"), T0);
    assert_eq!(codec_of(&store, 1), format::Codec::Zstd);
    assert!(owned(&rest) == lines("a", 40)[10..]);
    let rest = settle(&mut store, &rest.lease, 10, &Settle::Delivered, T0);
    assert!(owned(&rest) == lines("a", 40)[20..]);
    let mut tx = store.transaction().unwrap();
    tx.fail(
        &rest.lease,
        &Failure::Permanent {
            reason: "no".into(),
        },
        T0,
    )
    .unwrap();
    tx.commit().unwrap();
    check(&store);
    let mut tx = store.transaction().unwrap();
    let (jobs, records) = tx.replay_dead(S, None, None, 100).unwrap();
    tx.commit().unwrap();
    check(&store);
    assert_eq!((jobs, records), (2, 30));
    // The dead part got the next id (2), after what is left of job 1.
    let back = take(&mut store, S, 10, T0);
    let all: Vec<Vec<u8>> = back.iter().flat_map(owned).collect();
    let mut want = lines("a", 40)[20..].to_vec();
    want.extend_from_slice(&lines("a", 40)[..10]);
    assert!(all == want, "records 20..40 then 0..10");
    let leases: Vec<&Lease> = back.iter().map(|j| &j.lease).collect();
    ack(&mut store, &leases);
    let c = counters(&store, S);
    assert_eq!(
        (c.delivered_records, c.ready_raw_bytes, c.dead_raw_bytes),
        (40, 0, 0)
    );
}
