//! Jobs held for the clock: stamped when appended to a holding stream while the clock is
//! unsynchronised (and only then), kept stamped through a failed attempt, and corrected chunk by
//! chunk under their own ids, counters exact, each once.

use super::*;
use crate::timesync::{self, Anchor, ClockStamp};

const HOUR: u64 = 3_600_000;

fn held(name: &str) -> StreamConfig {
    StreamConfig {
        hold_until_clock_synced: true,
        ..stream(name)
    }
}

fn fix(store: &mut Store, stream: &str, anchor: Anchor, limit: usize) -> ClockFixed {
    let mut tx = store.transaction().expect("begin");
    let done = tx
        .fix_clock(stream, anchor, crate::scrape::lineparse::shift_time, limit)
        .expect("fix");
    tx.commit().expect("commit");
    check(store);
    done
}

/// Colibri's stamp 5 ms before the append (by the wrong clock), a producer's own time an hour
/// later, and a point without a time.
fn points(tag: &str) -> Vec<Vec<u8>> {
    vec![
        format!("{tag} v=1 {}", T0 - 5).into_bytes(),
        format!("{tag} v=2 {}", T0 + HOUR).into_bytes(),
        format!("{tag} v=3").into_bytes(),
    ]
}

/// The clock stamps of a stream's ready jobs, by id.
fn stamps(store: &Store, stream: &str) -> Vec<(u64, Option<ClockStamp>)> {
    let rtx = store.db.begin_read().expect("read");
    let t = rtx
        .open_table(store.streams[stream].ready_def())
        .expect("ready table");
    t.iter()
        .expect("iter")
        .map(|e| {
            let (k, v) = e.expect("entry");
            (k.value(), format::decode(v.value()).expect("decodes").clock)
        })
        .collect()
}

#[test]
fn held_jobs_are_corrected_under_their_ids_chunk_by_chunk_and_counted() {
    timesync::force(false);
    let zstd = StreamConfig {
        compression: AtRest::Always,
        ..held("z")
    };
    let dir = Dir::new(vec![held(S), zstd, stream("free")]);
    let mut store = dir.open();
    for tag in ["a", "b"] {
        append(&mut store, S, &points(tag), T0).unwrap();
    }
    append(&mut store, "z", &points("c"), T0).unwrap();
    append(&mut store, "free", &points("d"), T0).unwrap();
    let stamped = stamps(&store, S);
    assert_eq!(stamped.len(), 2);
    let stamp = stamped[0].1.expect("a holding stream's job is stamped");
    assert!(stamps(&store, "z")[0].1.is_some());
    assert_eq!(stamps(&store, "free")[0].1, None, "only holding streams");
    // The first job fails once: it waits for its retry, stamp and all.
    let first = take(&mut store, S, 1, T0);
    fail(&mut store, &first[0].lease, &transient(T0 + 1, 10), T0);

    // The boot truly began so that the appends happened an hour later than the clock said.
    let anchor = Anchor {
        boot: stamp.boot,
        epoch_ms: (T0 + HOUR) as i64 - stamp.boot_ms as i64,
    };
    let one = fix(&mut store, S, anchor, 1);
    assert_eq!((one.jobs, one.more), (1, true));
    let two = fix(&mut store, S, anchor, 1);
    assert_eq!((two.jobs, two.more), (1, false));
    assert_eq!(
        fix(&mut store, S, anchor, 10),
        ClockFixed::default(),
        "once"
    );
    assert_eq!((one.corrected + two.corrected, one.kept + two.kept), (2, 4));
    // Their own times too (ttl, max_age and the lanes read them): an hour later than recorded.
    let rtx = store.db.begin_read().expect("read");
    let t = rtx.open_table(store.streams[S].ready_def()).expect("ready");
    let created = format::header(t.get(stamped[1].0).unwrap().unwrap().value())
        .unwrap()
        .created_ms;
    let later = stamped[1].1.expect("stamped").boot_ms - stamp.boot_ms;
    assert_eq!(created, T0 + HOUR + later);
    drop(t);
    drop(rtx);
    let jobs = take(&mut store, S, 10, T0 + 10);
    let mut got: Vec<(u64, Vec<Vec<u8>>)> = jobs.iter().map(|j| (j.lease.id, owned(j))).collect();
    got.sort();
    // Each job by its own stamp: appended this long after the first.
    let want = |tag: &str, (id, s): (u64, Option<ClockStamp>)| {
        let later = s.expect("stamped").boot_ms - stamp.boot_ms;
        let mut p = points(tag);
        p[0] = format!("{tag} v=1 {}", T0 + HOUR - 5 + later).into_bytes();
        (id, p)
    };
    assert_eq!(got, vec![want("a", stamped[0]), want("b", stamped[1])]);

    // Another boot's stamp cannot be placed: sent as it is, counted, the stamp gone.
    let other = Anchor {
        boot: stamp.boot ^ 1,
        ..anchor
    };
    let z = fix(&mut store, "z", other, 10);
    assert_eq!((z.jobs, z.unknown_boot, z.corrected), (1, 3, 0));
    assert_eq!(stamps(&store, "z")[0].1, None);
    let jobs = take(&mut store, "z", 10, T0);
    assert_eq!(owned(&jobs[0]), points("c"), "compressed again as it was");
    assert_eq!(fix(&mut store, "free", anchor, 10), ClockFixed::default());
}
