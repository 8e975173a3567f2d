//! The salvager on real redb files, damaged on purpose: a flipped byte in the magic, a zeroed
//! header page, truncations, a flipped byte in each page in turn, zeroed pages; random bytes and
//! an empty file. Every case checks that what comes back is exactly jobs that were in the file
//! (same stream, same records, once each; a delivered job only when the salvager says it is in
//! doubt), and, where the damage left the trees whole, that every job with an intact copy came back.

use super::*;

use crate::store::salvage::{Found, scan};

/// A store file and what it held: live jobs' records by (stream, old id), and delivered ones.
struct Fixture {
    file: Vec<u8>,
    live: Jobs,
    delivered: Jobs,
    /// Where each live job's value bytes occur in the file (every copy).
    copies: BTreeMap<(String, u64), Vec<std::ops::Range<usize>>>,
    /// The counters of its last commit, by stream, and its store id.
    counters: BTreeMap<String, Counters>,
    store_id: u64,
}

fn streams() -> Vec<StreamConfig> {
    vec![stream("a"), stream("b")]
}

fn fixture(stream_names: &[&str], jobs_per_stream: usize) -> Fixture {
    let cfg: Vec<StreamConfig> = stream_names.iter().map(|s| stream(s)).collect();
    fixture_of(cfg, jobs_per_stream, 0)
}

/// Jobs by (stream, id): their records.
type Jobs = BTreeMap<(String, u64), Vec<Vec<u8>>>;

/// `big`: every seventh job of each stream holds records of about this many bytes (a value
/// larger than a page lives in a multi-page leaf of its own).
fn fixture_of(cfg: Vec<StreamConfig>, jobs_per_stream: usize, big: usize) -> Fixture {
    let names: Vec<String> = cfg.iter().map(|c| c.name.clone()).collect();
    let stream_names: Vec<&str> = names.iter().map(String::as_str).collect();
    let stream_names = stream_names.as_slice();
    let d = Dir::new(cfg);
    let mut store = d.open();
    let delivered = fill(&mut store, stream_names, jobs_per_stream, big);
    let (live, values) = live_jobs(&store, stream_names);
    let path = store.path().to_path_buf();
    let fx_counters = stream_names
        .iter()
        .map(|s| (s.to_string(), counters(&store, s)))
        .collect();
    let store_id = store.id();
    drop(store);
    let file = std::fs::read(&path).unwrap();
    let copies = copies_in(&file, &values);
    Fixture {
        file,
        live,
        delivered,
        copies,
        counters: fx_counters,
        store_id,
    }
}

/// Appends `jobs_per_stream` jobs to each stream, a commit each (with a source checkpoint), and
/// settles some every 50 rounds; returns the jobs delivered.
fn fill(store: &mut Store, stream_names: &[&str], jobs_per_stream: usize, big: usize) -> Jobs {
    let mut delivered = BTreeMap::new();
    for i in 0..jobs_per_stream {
        for s in stream_names {
            let pad = if big > 0 && i % 7 == 3 {
                big + i * 37
            } else {
                i % 40
            };
            let recs: Vec<Vec<u8>> = (0..3)
                .map(|j| format!("{s}-{i}-{j}-{}", pad_text(pad, i + j)).into_bytes())
                .collect();
            let mut tx = store.transaction().unwrap();
            let cp = format!("{i}");
            tx.append_list(s, &recs, Some(("tail-src", cp.as_bytes())), T0 + i as u64)
                .unwrap();
            tx.commit().unwrap();
        }
        if i % 50 == 49 {
            // Deliver some (freed pages then hold jobs long gone), fail some to retry and dead.
            for s in stream_names {
                settle_some(store, s, &mut delivered);
            }
        }
    }
    delivered
}

/// Takes 10 jobs of stream `s`: delivers 6 (into `delivered`), fails one to retry and one to the
/// dead letters, releases the rest.
fn settle_some(store: &mut Store, s: &str, delivered: &mut Jobs) {
    let jobs = take(store, s, 10, T0);
    for j in &jobs[..6] {
        delivered.insert((s.to_string(), j.lease.id), owned(j));
        ack(store, &[&j.lease]);
    }
    fail(
        store,
        &jobs[6].lease,
        &Failure::Transient {
            reason: "503".into(),
            retry_at_ms: T0 + 99,
            max_attempts: 5,
        },
        T0,
    );
    fail(
        store,
        &jobs[7].lease,
        &Failure::Permanent {
            reason: "400".into(),
        },
        T0,
    );
    for j in &jobs[8..] {
        store.release(&j.lease);
    }
}

/// The jobs in the streams' ready, retry and dead tables: their records, and their stored
/// values, by (stream, id).
fn live_jobs(store: &Store, stream_names: &[&str]) -> (Jobs, BTreeMap<(String, u64), Vec<u8>>) {
    let mut live = BTreeMap::new();
    let mut values = BTreeMap::new();
    let rtx = store.db.begin_read().unwrap();
    for s in stream_names {
        let st = &store.streams[*s];
        let mut add = |id: u64, v: &[u8]| {
            let recs = format::decode(v).unwrap().area.to_records().unwrap();
            live.insert((s.to_string(), id), recs);
            values.insert((s.to_string(), id), v.to_vec());
        };
        for e in rtx.open_table(st.ready_def()).unwrap().iter().unwrap() {
            let (k, v) = e.unwrap();
            add(k.value(), v.value());
        }
        for e in rtx.open_table(st.retry_def()).unwrap().iter().unwrap() {
            let (k, v) = e.unwrap();
            add(k.value().1, v.value());
        }
        for e in rtx.open_table(st.dead_def()).unwrap().iter().unwrap() {
            let (k, v) = e.unwrap();
            add(k.value(), v.value());
        }
    }
    (live, values)
}

/// Where each job's value occurs in `file` (every copy; at least one).
#[track_caller]
fn copies_in(
    file: &[u8],
    values: &BTreeMap<(String, u64), Vec<u8>>,
) -> BTreeMap<(String, u64), Vec<std::ops::Range<usize>>> {
    values
        .iter()
        .map(|(k, v)| {
            let at: Vec<_> = memchr::memmem::find_iter(file, v)
                .map(|i| i..i + v.len())
                .collect();
            assert!(!at.is_empty(), "job {k:?} is in the file");
            (k.clone(), at)
        })
        .collect()
}

/// `n` bytes of text that compresses somewhat, different for each `seed`.
fn pad_text(n: usize, seed: usize) -> String {
    let mut rng = fastrand::Rng::with_seed(seed as u64);
    (0..n).map(|_| char::from(b'a' + rng.u8(0..8))).collect()
}

/// What comes back is jobs that were there, once each, with their records; delivered ones only
/// when the salvager is in doubt. Returns the (stream, id) salvaged.
#[track_caller]
fn sound(fx: &Fixture, file: &[u8], found: &Found, what: &str) -> BTreeSet<(String, u64)> {
    let mut got = BTreeSet::new();
    for j in &found.jobs {
        let key = (j.stream.clone(), j.id);
        assert!(got.insert(key.clone()), "{what}: {key:?} salvaged twice");
        let v = &file[j.at as usize..j.at as usize + j.len];
        let recs = format::decode(v).unwrap().area.to_records().unwrap();
        match (fx.live.get(&key), fx.delivered.get(&key)) {
            (Some(r), _) => assert_eq!(&recs, r, "{what}: {key:?} has its records"),
            (None, Some(r)) => {
                assert!(
                    found.in_doubt,
                    "{what}: delivered {key:?} came back without doubt"
                );
                assert_eq!(&recs, r, "{what}: {key:?} has its records");
            }
            (None, None) => panic!("{what}: {key:?} was never in the file"),
        }
    }
    got
}

/// Live jobs no copy of which `touched` overlaps (a job with a damaged copy may or may not come
/// back: its other copies may be old ones in pages no tree leads to any more).
fn intact(fx: &Fixture, touched: &std::ops::Range<usize>) -> BTreeSet<(String, u64)> {
    fx.copies
        .iter()
        .filter(|(_, at)| {
            at.iter()
                .all(|r| r.end <= touched.start || r.start >= touched.end)
        })
        .map(|(k, _)| k.clone())
        .collect()
}

fn names<'a>(fx: &[&'a str]) -> Vec<&'a str> {
    fx.to_vec()
}

#[test]
fn an_undamaged_file_gives_back_exactly_its_live_jobs() {
    let fx = fixture(&["a", "b"], 150);
    let found = scan(&fx.file[..], &names(&["a", "b"])).unwrap();
    let got = sound(&fx, &fx.file, &found, "undamaged");
    let want: BTreeSet<_> = fx.live.keys().cloned().collect();
    assert_eq!(got, want);
    assert!(!found.in_doubt);
    assert_eq!((found.damaged, found.unattributable), (0, 0));
    assert_eq!(
        found.checkpoints,
        [("tail-src".to_string(), b"149".to_vec())]
    );
    assert!(found.store_id.is_some());
    // Every page once, and the live tree's pages again (its walk comes first).
    let n = fx.file.len() as u64;
    assert!(
        found.bytes_read >= n - 4096 && found.bytes_read <= 3 * n,
        "{} of {n}",
        found.bytes_read
    );
}

#[test]
fn a_flipped_magic_byte_loses_nothing() {
    let fx = fixture(&["a", "b"], 150);
    let mut f = fx.file.clone();
    f[3] ^= 0xff;
    let found = scan(&f[..], &names(&["a", "b"])).unwrap();
    let got = sound(&fx, &f, &found, "magic");
    assert_eq!(got, fx.live.keys().cloned().collect());
}

#[test]
fn a_zeroed_header_page_with_one_stream_loses_nothing() {
    let fx = fixture(&["a"], 200);
    let mut f = fx.file.clone();
    f[..4096].fill(0);
    let found = scan(&f[..], &["a"]).unwrap();
    let got = sound(&fx, &f, &found, "zeroed header, one stream");
    assert!(found.in_doubt);
    // Every live job is somewhere intact (nothing but the header was touched); with no live tree
    // freed copies count too, so delivered jobs may come back (allowed by `sound`).
    let want: BTreeSet<_> = fx.live.keys().cloned().collect();
    assert!(
        want.is_subset(&got),
        "missing {:?}",
        want.difference(&got).collect::<Vec<_>>()
    );
}

#[test]
fn a_zeroed_header_page_with_two_streams_attributes_through_old_tables() {
    let fx = fixture(&["a", "b"], 150);
    let mut f = fx.file.clone();
    f[..4096].fill(0);
    let found = scan(&f[..], &names(&["a", "b"])).unwrap();
    let got = sound(&fx, &f, &found, "zeroed header, two streams");
    assert!(found.in_doubt);
    // The table tree's pages and the branches are still there: every live job is attributed.
    let want: BTreeSet<_> = fx.live.keys().cloned().collect();
    assert!(
        want.is_subset(&got),
        "missing {:?}",
        want.difference(&got).collect::<Vec<_>>()
    );
    eprintln!(
        "zeroed header: {} live jobs back, {} of {} delivered ones sent again",
        want.len(),
        got.len() - want.len(),
        fx.delivered.len()
    );
    assert!(found.checkpoints.is_empty(), "no live tree: no checkpoint");
}

#[test]
fn truncations_never_give_back_anything_wrong() {
    let fx = fixture(&["a", "b"], 150);
    let n = fx.file.len();
    for cut in [0, 100, 4096, 5000, n / 4, n / 2, n - 4096, n - 1] {
        let f = &fx.file[..cut];
        let found = scan(f, &names(&["a", "b"])).unwrap();
        sound(&fx, f, &found, &format!("cut at {cut}"));
    }
}

#[test]
fn a_flipped_byte_in_each_page_loses_at_most_that_page() {
    let fx = fixture(&["a", "b"], 100);
    let pages = fx.file.len() / 4096;
    for p in 0..pages {
        let start = p * 4096;
        // Inside the page's first value when it is a leaf of jobs, else the page's middle.
        let at = (start..start + 4096)
            .find(|i| {
                matches!(fx.file[*i], 1..=3)
                    && i - start > 200
                    && fx.copies.values().any(|c| c.iter().any(|r| r.start == *i))
            })
            .map_or(start + 2048, |i| i + 20);
        let mut f = fx.file.clone();
        f[at] ^= 0x5a;
        let found = scan(&f[..], &names(&["a", "b"])).unwrap();
        let got = sound(&fx, &f, &found, &format!("page {p} byte {at}"));
        let page_starts_leaf = fx.file[start] == 1;
        if page_starts_leaf && at - start > 200 {
            // A job leaf's value: the tree is whole, so only jobs with no other copy are lost.
            let want = intact(&fx, &(at..at + 1));
            assert!(
                want.is_subset(&got),
                "page {p}: missing {:?}",
                want.difference(&got).collect::<Vec<_>>()
            );
        }
    }
}

#[test]
fn zeroed_pages_never_give_back_anything_wrong() {
    let fx = fixture(&["a", "b"], 150);
    let pages = fx.file.len() / 4096;
    let mut rng = fastrand::Rng::with_seed(17);
    for _ in 0..30 {
        let p = rng.usize(1..pages);
        let k = rng.usize(1..4).min(pages - p);
        let mut f = fx.file.clone();
        f[p * 4096..(p + k) * 4096].fill(0);
        let found = scan(&f[..], &names(&["a", "b"])).unwrap();
        sound(&fx, &f, &found, &format!("pages {p}..{}", p + k));
    }
}

#[test]
fn random_bytes_and_an_empty_file_give_an_empty_report() {
    assert!(scan(&[][..], &["a"]).unwrap().jobs.is_empty());
    let mut rng = fastrand::Rng::with_seed(5);
    for n in [1, 100, 4096, 4097, 64 << 10, 300_000] {
        let b: Vec<u8> = (0..n).map(|_| rng.u8(..)).collect();
        let found = scan(&b[..], &["a"]).unwrap();
        assert!(
            found.jobs.is_empty() && found.checkpoints.is_empty(),
            "{n} random bytes"
        );
        // Pages that look like leaves and branches, with random rest.
        let mut b = b;
        for p in (0..b.len()).step_by(4096) {
            b[p] = [1, 2][p / 4096 % 2];
        }
        let found = scan(&b[..], &["a", "b"]).unwrap();
        assert!(found.jobs.is_empty(), "{n} random bytes as pages");
    }
}

#[test]
fn salvage_from_appends_into_a_live_store_and_restores_checkpoints() {
    let fx = fixture(&["a", "b"], 120);
    let d = Dir::new(streams());
    let old = d.dir.path().join("old.redb");
    std::fs::write(&old, &fx.file).unwrap();
    let mut store = d.open();
    append(&mut store, "a", &recs("new", 2), T0).unwrap();
    let report = store.salvage_from(&old).unwrap();
    check(&store);
    assert_eq!(report.jobs, fx.live.len() as u64);
    let records: u64 = fx.live.values().map(|r| r.len() as u64).sum();
    assert_eq!(report.records, records);
    assert_eq!(
        (
            report.damaged,
            report.unattributable,
            report.checkpoints_restored
        ),
        (0, 0, 1)
    );
    assert_eq!(
        store.checkpoint("tail-src").unwrap().as_deref(),
        Some(b"119".as_slice())
    );
    assert!(report.to_string().contains("jobs restored"), "{report}");
    // The ready jobs come out in their old order after what the store held.
    let jobs = take_all(&mut store, "a", T0);
    assert_eq!(owned(&jobs[0]), recs("new", 2));
    let ready_a: Vec<Vec<Vec<u8>>> = fx
        .live
        .iter()
        .filter(|((s, _), r)| s == "a" && !r.is_empty())
        .map(|(_, r)| r.clone())
        .collect();
    let salvaged: Vec<Vec<Vec<u8>>> = jobs[1..].iter().map(owned).collect();
    assert!(salvaged.iter().all(|j| ready_a.contains(j)));
    let c = counters(&store, "b");
    assert!(c.balanced());
    let dead = fx.live.keys().filter(|(s, _)| s == "b").count() as u64;
    assert_eq!(c.ready_jobs + c.retry_jobs + c.dead_jobs, dead);
    let store = d.reopen(store);
    drop(store);
    // Missing file: an error that names it.
    let mut store = d.open();
    let e = store.salvage_from(&d.dir.path().join("nope")).unwrap_err();
    assert!(e.to_string().contains("nope"), "{e}");
    // An empty file: an empty report.
    let empty = d.dir.path().join("empty");
    std::fs::write(&empty, b"").unwrap();
    let r = store.salvage_from(&empty).unwrap();
    assert_eq!((r.jobs, r.damaged), (0, 0));
}

#[test]
fn large_and_compressed_jobs_come_back_from_their_own_pages() {
    let mut zstd = stream("z");
    zstd.compression = AtRest::Always;
    let fx = fixture_of(vec![stream("a"), zstd], 60, 9000);
    let found = scan(&fx.file[..], &["a", "z"]).unwrap();
    let got = sound(&fx, &fx.file, &found, "large, undamaged");
    assert_eq!(got, fx.live.keys().cloned().collect());
    assert!(
        fx.live
            .values()
            .any(|r| r.iter().map(Vec::len).sum::<usize>() > 8192)
    );
    // A flipped byte in each page: what comes back is right, and every job no copy of which
    // was touched comes back when the page was a leaf of jobs.
    for p in 1..fx.file.len() / 4096 {
        let at = p * 4096 + 1500;
        let mut f = fx.file.clone();
        f[at] ^= 0x81;
        let found = scan(&f[..], &["a", "z"]).unwrap();
        let got = sound(&fx, &f, &found, &format!("large, page {p}"));
        let in_a_value = fx.copies.values().flatten().any(|r| r.contains(&at));
        if in_a_value {
            let want = intact(&fx, &(at..at + 1));
            assert!(
                want.is_subset(&got),
                "page {p}: missing {:?}",
                want.difference(&got).collect::<Vec<_>>()
            );
        }
    }
}

/// The old file's counters are carried on: what it had appended, delivered, dropped... stays
/// counted, what it held comes back into the queue, and a job whose bytes were damaged is counted
/// lost to damage once the salvage ends; the identity holds throughout.
#[test]
fn a_salvage_carries_the_counters_on_and_counts_what_it_could_not_put_back_as_lost() {
    let fx = fixture(&["a", "b"], 120);
    // Damage the value of one live job of `a` that has a single copy.
    let (key, at) = fx
        .copies
        .iter()
        .find(|((s, _), at)| s == "a" && at.len() == 1)
        .map(|(k, at)| (k.clone(), at[0].clone()))
        .expect("a job with one copy");
    let mut file = fx.file.clone();
    file[at.start + 40] ^= 0x55;
    let d = Dir::new(streams());
    let old = d.dir.path().join("old.redb");
    std::fs::write(&old, &file).unwrap();
    let mut store = d.open();
    let report = store.salvage_from(&old).unwrap();
    check(&store);
    assert_eq!(report.counters_carried_on, 2, "{report}");
    assert!(report.to_string().contains("carried on"), "{report}");
    let lost = fx.live[&key].len() as u64;
    for s in ["a", "b"] {
        let (old, new) = (&fx.counters[s], counters(&store, s));
        assert_eq!(new.appended_records, old.appended_records, "{s}");
        assert_eq!(new.delivered_records, old.delivered_records, "{s}");
        assert_eq!(new.dead_lettered_records, old.dead_lettered_records, "{s}");
        assert_eq!(new.salvaging_records, 0, "{s}");
        let want_lost = if s == "a" { lost } else { 0 };
        assert_eq!(new.lost_to_damage_records, want_lost, "{s}");
        assert_eq!(
            new.pending_records() + new.dead_records + want_lost,
            old.pending_records() + old.dead_records,
            "{s}"
        );
    }
}

/// A salvaged job keeps where it came from (the old store id and its old id) through a failed
/// attempt, a replay from the dead letters and a split: a sink's idempotency key stays the one a
/// receiver saw before the damage.
#[test]
fn salvaged_jobs_keep_their_old_store_and_id_through_failures_and_splits() {
    let fx = fixture(&["a"], 60);
    let d = Dir::new(vec![stream("a")]);
    let old = d.dir.path().join("old.redb");
    std::fs::write(&old, &fx.file).unwrap();
    let mut store = d.open();
    store.salvage_from(&old).unwrap();
    let jobs = take_all(&mut store, "a", T0 + 1000);
    assert_eq!(
        jobs.len() as u64,
        counters(&store, "a").ready_jobs + counters(&store, "a").retry_jobs
    );
    for j in &jobs {
        let o = j.origin.clone().expect("a salvaged job has its origin");
        assert_eq!(o.store, fx.store_id);
        assert_eq!(owned(j), fx.live[&("a".to_string(), o.job)], "{o:?}");
        assert_ne!(j.lease.id, o.job, "new ids in the new file");
    }
    let origin = |j: &Job| j.origin.clone().expect("origin");
    let (first, second) = (&jobs[0], &jobs[1]);
    let failed = fail(&mut store, &first.lease, &permanent(), T0);
    assert!(matches!(failed, Failed::Dead { .. }));
    let replayed = {
        let mut tx = store.transaction().unwrap();
        let n = tx.replay_dead("a", None, None, 100).unwrap();
        tx.commit().unwrap();
        n
    };
    assert!(replayed.0 >= 1);
    let again = take_all(&mut store, "a", T0 + 1000);
    let back = again
        .iter()
        .find(|j| owned(j) == owned(first))
        .expect("the replayed job");
    assert_eq!(origin(back), origin(first));
    let rest = settle(&mut store, &second.lease, 1, &Settle::Delivered, T0);
    assert_eq!(origin(&rest), origin(second));
    assert_eq!(rest.offset, second.offset + 1);
    check(&store);
}

/// A store that fails a salvage's step after `chunks_left` chunks, as a kill -9 would.
struct Cut<'a> {
    store: &'a mut Store,
    chunks_left: usize,
}

impl crate::store::salvage::Restore for Cut<'_> {
    fn progress(
        &mut self,
        key: &str,
    ) -> Result<Option<crate::store::salvage::Progress>, StoreError> {
        self.store.progress(key)
    }

    fn step(
        &mut self,
        key: &str,
        step: crate::store::salvage::Step,
    ) -> Result<crate::store::salvage::Stepped, StoreError> {
        if matches!(step, crate::store::salvage::Step::Jobs { .. }) {
            if self.chunks_left == 0 {
                return Err(StoreError::io("cut short"));
            }
            self.chunks_left -= 1;
        }
        self.store.step(key, step)
    }
}

/// A salvage that fails part way (here after its first chunk: in the agent, kill -9 or a power
/// cut) goes on where it stopped when run again, so no job is put back twice; one that ended is
/// not done again.
#[test]
fn a_salvage_cut_short_goes_on_where_it_stopped_and_one_that_ended_is_not_done_again() {
    use crate::store::salvage::salvage;
    let fx = fixture(&["a"], 700);
    let d = Dir::new(vec![stream("a")]);
    let old = d.dir.path().join("colibri.redb.corrupt-1");
    std::fs::write(&old, &fx.file).unwrap();
    let mut store = d.open();
    let mut cut = Cut {
        store: &mut store,
        chunks_left: 1,
    };
    salvage(&old, &["a"], &mut cut).expect_err("cut short");
    check(&store);
    let c = counters(&store, "a");
    assert_eq!(c.ready_jobs + c.retry_jobs + c.dead_jobs, 256);
    assert!(c.salvaging_records > 0 && c.balanced());
    let mut store = d.reopen(store);
    let report = store.salvage_from(&old).unwrap();
    assert_eq!(report.put_back_before, 256, "{report}");
    assert!(report.to_string().contains("put back before"), "{report}");
    assert_eq!(report.jobs + 256, fx.live.len() as u64);
    check(&store);
    // Each old job once, by the origin it carries.
    let mut seen = BTreeSet::new();
    let held: Vec<_> = take_all(&mut store, "a", u64::MAX / 2)
        .iter()
        .map(|j| j.origin.clone())
        .chain(
            store
                .peek("a", true, 100_000)
                .unwrap()
                .iter()
                .map(|p| p.origin.clone()),
        )
        .collect();
    for o in held {
        let o = o.expect("origin").job;
        assert!(seen.insert(o), "job {o} put back twice");
    }
    assert_eq!(seen.len(), fx.live.len());
    let c = counters(&store, "a");
    assert_eq!(
        (c.salvaging_records, c.lost_to_damage_records),
        (0, 0),
        "{c:?}"
    );
    assert_eq!(c.appended_records, fx.counters["a"].appended_records);
    // Ended: nothing done again.
    let again = store.salvage_from(&old).unwrap();
    assert!(again.ended_before && again.jobs == 0, "{again}");
    assert!(again.to_string().contains("nothing done"), "{again}");
}

/// Two damaged files salvaged in turn, the first cut short before the second: the second's end
/// books only its own remainder as lost, and the first, resumed, finds its share still held: in
/// the end nothing is lost and both files' counters are carried on once each.
#[test]
fn a_files_salvage_ending_books_only_its_own_remainder_as_lost() {
    use crate::store::salvage::salvage;
    let fx = fixture(&["a"], 700);
    let d = Dir::new(vec![stream("a")]);
    let a = d.dir.path().join("colibri.redb.corrupt-1");
    let b = d.dir.path().join("colibri.redb.corrupt-2");
    std::fs::write(&a, &fx.file).unwrap();
    std::fs::write(&b, &fx.file).unwrap();
    let mut store = d.open();
    let mut cut = Cut {
        store: &mut store,
        chunks_left: 1,
    };
    salvage(&a, &["a"], &mut cut).expect_err("cut short");
    let held = counters(&store, "a").salvaging_records;
    store.salvage_from(&b).unwrap();
    check(&store);
    let mid = counters(&store, "a");
    assert_eq!(
        (mid.lost_to_damage_records, mid.salvaging_records),
        (0, held),
        "b ended: a's share still held"
    );
    store.salvage_from(&a).unwrap();
    check(&store);
    let c = counters(&store, "a");
    let old = &fx.counters["a"];
    assert_eq!(
        (c.lost_to_damage_records, c.salvaging_records),
        (0, 0),
        "{c:?}"
    );
    assert_eq!(c.appended_records, 2 * old.appended_records, "{c:?}");
    assert_eq!(
        c.pending_records() + c.dead_records,
        2 * (old.pending_records() + old.dead_records)
    );
}

/// A zeroed live leaf of a ready table whose other pages held delivered jobs (issue 31 A): the
/// scan, finding the live tree incomplete, takes old copies "in doubt", and those of jobs
/// delivered before come back. They are counted as a re-send, not as the lost leaf's jobs: the
/// counter books the zeroed leaf's records as lost, the report says the same number, and what
/// really arrives is what was held, less what was lost, plus what was re-sent.
#[test]
fn a_zeroed_leaf_is_counted_lost_even_when_old_copies_of_delivered_jobs_come_back() {
    let d = Dir::new(vec![stream("a")]);
    let mut store = d.open();
    for i in 0..400usize {
        let recs: Vec<Vec<u8>> = (0..3)
            .map(|j| format!("a-{i}-{j}-{}", pad_text(30, i + j)).into_bytes())
            .collect();
        let mut tx = store.transaction().unwrap();
        tx.append_list("a", &recs, None, T0 + i as u64).unwrap();
        tx.commit().unwrap();
    }
    // Deliver the head: its leaves' old copies stay in freed pages.
    let head = take(&mut store, "a", 120, T0);
    for j in &head {
        ack(&mut store, &[&j.lease]);
    }
    let old_counters = counters(&store, "a");
    let path = store.path().to_path_buf();
    drop(store);
    let file = std::fs::read(&path).unwrap();

    // A live leaf of ready jobs, not the first: its records are what zeroing it loses.
    let found = scan(&file[..], &["a"]).unwrap();
    let mut leaves: BTreeMap<u64, (u64, usize)> = BTreeMap::new();
    for j in found.jobs.iter().filter(|j| j.live) {
        let l = leaves.entry(j.leaf).or_default();
        l.0 += j.records;
        l.1 = l.1.max(j.at as usize + j.len - j.leaf as usize);
    }
    let (&leaf, &(want_lost, _)) = leaves
        .iter()
        .filter(|(_, (_, end))| *end <= 4096)
        .nth(1)
        .expect("several live leaves of one page");
    assert!(want_lost > 0);
    let mut damaged = file.clone();
    damaged[leaf as usize..leaf as usize + 4096].fill(0);

    let d2 = Dir::new(vec![stream("a")]);
    let old = d2.dir.path().join("colibri.redb.corrupt-1");
    std::fs::write(&old, &damaged).unwrap();
    let mut store = d2.open();
    let report = store.salvage_from(&old).unwrap();
    check(&store);
    let c = counters(&store, "a");
    assert!(c.balanced(), "{c:?}");
    assert!(
        report.resent_records > 0,
        "old copies of delivered jobs came back in doubt: {report}"
    );
    assert_eq!(c.lost_to_damage_records, want_lost, "{report}\n{c:?}");
    assert_eq!(report.lost_records, c.lost_to_damage_records, "{report}");
    assert_eq!(c.salvage_resent_records, report.resent_records, "{c:?}");
    assert!(
        report.to_string().contains(&format!("{want_lost} records")),
        "{report}"
    );

    // What really arrives: held, less lost, plus re-sent.
    let jobs = take_all(&mut store, "a", u64::MAX / 2);
    let arrived: u64 = jobs.iter().map(|j| owned(j).len() as u64).sum();
    for j in &jobs {
        ack(&mut store, &[&j.lease]);
    }
    let held = old_counters.pending_records() + old_counters.dead_records;
    assert_eq!(arrived, held - want_lost + report.resent_records);
    let c = counters(&store, "a");
    assert!(c.balanced(), "{c:?}");
    assert_eq!(c.pending_records(), 0);
    assert_eq!(
        c.appended_records,
        old_counters.appended_records + report.resent_records,
        "a re-send is appended again, never netted against the loss"
    );
    check(&store);
}

/// A job moved to an archive stream (`on_max_age: stream:NAME`) and then salvaged from a damaged
/// copy of its file keeps the key it had before the move: the store, id and stream it was
/// appended to, not the archive's nor the salvaged file's.
#[test]
fn a_moved_job_salvaged_keeps_the_key_it_had_before_the_move() {
    let mut m = stream("m");
    m.max_age = Some(MaxAge {
        age: Duration::from_secs(30),
        then: OnMaxAge::Move("archive".into()),
    });
    let streams = vec![m, stream("archive")];
    let first = Dir::new(streams.clone());
    let mut store = first.open();
    append(&mut store, "m", &recs("old", 2), T0).unwrap();
    assert!(
        take(&mut store, "m", 16, T0 + 60_000).is_empty(),
        "moved, not handed out"
    );
    let store_id = store.id;
    drop(store);
    let d = Dir::new(streams);
    let old = d.dir.path().join("old.redb");
    std::fs::copy(first.dir.path().join(DB_FILE), &old).unwrap();
    let mut store = d.open();
    store.salvage_from(&old).unwrap();
    let jobs = take_all(&mut store, "archive", T0 + 60_000);
    assert_eq!(jobs.len(), 1);
    let want = format::Origin {
        store: store_id,
        job: 1,
        stream: Some("m".into()),
    };
    assert_eq!(jobs[0].origin, Some(want));
    assert_eq!(owned(&jobs[0]), recs("old", 2));
}
