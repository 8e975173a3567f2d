//! `when_full: downsample`: a stream bounded far below what is appended holds all of it at
//! decreasing resolution, never over its bound, the identity exact after every commit, and each
//! window's aggregates what the raw samples give, each sample counted once.

use std::collections::BTreeMap;

use super::*;
use crate::scrape::downsample::Keep;
use crate::scrape::lineparse::{Raw, raw_point};

const SERIES: u64 = 5;
const STEP_MS: u64 = 1000;

fn metrics(max_bytes: u64) -> StreamConfig {
    StreamConfig {
        batch: BatchConfig {
            max_records: 20,
            max_bytes: 4 << 10,
            linger: Duration::ZERO,
        },
        max_bytes,
        when_full: WhenFull::Downsample,
        downsample: Some(Downsample {
            windows: vec![Duration::from_secs(60), Duration::from_secs(600)],
            keep: Keep::ALL,
            ticks_per_second: 1000,
        }),
        ..stream(S)
    }
}

fn value(i: u64, s: u64) -> f64 {
    ((i * 7919 + s * 104_729) % 1000) as f64 / 8.0
}

/// One scrape: a point per series at `T0 + i * STEP_MS`.
fn scrape(i: u64) -> Vec<Vec<u8>> {
    (0..SERIES)
        .map(|s| format!("m,s={s} v={} {}", value(i, s), T0 + i * STEP_MS).into_bytes())
        .collect()
}

/// Every record queued, with its job's window (0 for raw).
fn queued(store: &Store) -> Vec<(u64, Vec<u8>)> {
    let rtx = store.db.begin_read().expect("read");
    let t = rtx.open_table(store.streams[S].ready_def()).expect("ready");
    let mut out = Vec::new();
    for e in t.iter().expect("iter") {
        let (_, v) = e.expect("entry");
        let window = format::window_ms(v.value());
        let d = format::decode(v.value()).expect("decodes");
        for r in d.area.to_records().expect("records") {
            out.push((window, r));
        }
    }
    out
}

fn number(raw: Raw<'_>) -> f64 {
    match raw {
        Raw::Float(v) => v,
        Raw::Int(v) => v as f64,
        other => panic!("not a number: {other:?}"),
    }
}

#[test]
fn a_full_stream_holds_everything_at_decreasing_resolution_each_sample_once() {
    const SCRAPES: u64 = 20 * 60; // 20 minutes at 1 s
    const MAX: u64 = 16 << 10;
    let dir = Dir::new(vec![metrics(MAX)]);
    let mut store = dir.open();
    for i in 0..SCRAPES {
        append(&mut store, S, &scrape(i), T0 + i * STEP_MS).unwrap();
        let c = counters(&store, S);
        assert!(c.queued_bytes() <= MAX, "over its bound at {i}: {c:?}");
    }
    let c = counters(&store, S);
    assert_eq!(c.dropped_records(), 0, "all of it held: {c:?}");
    assert!(
        c.downsampled_in_records > 0 && c.downsampled_out_records > 0,
        "{c:?}"
    );
    // Per series: the samples each point stands for, checked against what was appended.
    let mut covered: BTreeMap<String, Vec<(u64, u64)>> = BTreeMap::new(); // (first, count)
    let mut windows = std::collections::BTreeSet::new();
    for (window, line) in queued(&store) {
        let p = raw_point(&line).expect("line protocol");
        let series = String::from_utf8(p.series.to_vec()).unwrap();
        let s: u64 = series.strip_prefix("m,s=").unwrap().parse().unwrap();
        let t = p.timestamp.expect("timestamped");
        let field = |k: &str| {
            p.fields
                .iter()
                .find(|(f, _)| *f == k.as_bytes())
                .map(|(_, v)| number(*v))
        };
        let first_index = |t: i64| (t as u64).saturating_sub(T0).div_ceil(STEP_MS);
        if window == 0 {
            assert_eq!(field("v"), Some(value((t as u64 - T0) / STEP_MS, s)));
            assert!(
                windows.insert((series.clone(), t)),
                "two points of {series} at {t}"
            );
            covered
                .entry(series)
                .or_default()
                .push(((t as u64 - T0) / STEP_MS, 1));
            continue;
        }
        assert!(
            windows.insert((series.clone(), t)),
            "two points of {series} at {t}"
        );
        let n = field("v_count").expect("a count") as u64;
        // The window's first n samples (a window may be split between aggregates and the raw
        // jobs after them, never between two aggregates).
        let first = first_index(t);
        let vals: Vec<f64> = (first..first + n).map(|i| value(i, s)).collect();
        assert!(
            T0 + (first + n - 1) * STEP_MS < t as u64 + window,
            "{series} {t}: {n} in the window"
        );
        let min = vals.iter().copied().fold(f64::MAX, f64::min);
        let max = vals.iter().copied().fold(f64::MIN, f64::max);
        let mean = vals.iter().sum::<f64>() / n as f64;
        assert_eq!(field("v_min"), Some(min), "{series} {t}");
        assert_eq!(field("v_max"), Some(max), "{series} {t}");
        assert_eq!(field("v"), vals.last().copied(), "{series} {t}: last");
        let got = field("v_mean").expect("a mean");
        assert!(
            (got - mean).abs() <= 1e-9 * mean.abs().max(1.0),
            "{series} {t}: mean {got} {mean}"
        );
        covered.entry(series).or_default().push((first, n));
    }
    assert_eq!(covered.len() as u64, SERIES);
    for (series, mut spans) in covered {
        spans.sort_unstable();
        let mut next = 0;
        for (first, n) in spans {
            assert_eq!(
                first, next,
                "{series}: a sample missing or doubled at {next}"
            );
            next += n;
        }
        assert_eq!(next, SCRAPES, "{series}: every sample once");
    }
    let q = queued(&store);
    let per: Vec<(u64, usize, usize)> = [0, 60_000, 600_000]
        .iter()
        .map(|w| {
            let l: Vec<_> = q.iter().filter(|(x, _)| x == w).collect();
            (*w, l.len(), l.iter().map(|(_, r)| r.len()).sum())
        })
        .collect();
    assert!(
        per[2].1 > 0,
        "the ladder's second window used: {per:?} {c:?}"
    );
}

/// The windows of the jobs in `stream`'s retry and dead tables.
fn windows_in(store: &Store, table: &str) -> Vec<u64> {
    let rtx = store.db.begin_read().expect("read");
    let st = &store.streams[S];
    let mut out = Vec::new();
    if table == "retry" {
        let t = rtx.open_table(st.retry_def()).expect("retry");
        for e in t.iter().expect("iter") {
            out.push(format::window_ms(e.expect("entry").1.value()));
        }
    } else {
        let t = rtx.open_table(st.dead_def()).expect("dead");
        for e in t.iter().expect("iter") {
            out.push(format::window_ms(e.expect("entry").1.value()));
        }
    }
    out
}

/// An aggregate job that fails stays one (its window is not lost when it is written again, or the
/// next round would read its aggregates as raw points), and so does one replayed from the dead.
#[test]
fn an_aggregate_stays_one_through_a_failed_attempt_and_a_replay() {
    let dir = Dir::new(vec![metrics(16 << 10)]);
    let mut store = dir.open();
    let mut i = 0;
    while counters(&store, S).downsampled_out_records == 0 {
        append(&mut store, S, &scrape(i), T0 + i * STEP_MS).unwrap();
        i += 1;
        assert!(i < 10_000, "never full");
    }
    let oldest = take(&mut store, S, 1, T0);
    fail(&mut store, &oldest[0].lease, &transient(T0 + 1, 10), T0);
    assert_eq!(windows_in(&store, "retry"), [60_000]);
    let again = take(&mut store, S, 1, T0 + 2);
    fail(&mut store, &again[0].lease, &permanent(), T0 + 2);
    assert_eq!(windows_in(&store, "dead"), [60_000]);
    let mut tx = store.transaction().expect("begin");
    tx.replay_dead(S, None, None, 10).expect("replay");
    tx.commit().expect("commit");
    check(&store);
    assert_eq!(
        queued(&store)[0].0,
        60_000,
        "back at the head, an aggregate"
    );
}

/// Jobs held for the clock are not aggregated before their times are corrected (their stamp
/// would be lost): a stream full of them drops its oldest, as `drop_oldest` would.
#[test]
fn jobs_held_for_the_clock_are_not_aggregated() {
    crate::timesync::force(false);
    let dir = Dir::new(vec![StreamConfig {
        hold_until_clock_synced: true,
        ..metrics(16 << 10)
    }]);
    let mut store = dir.open();
    for i in 0..400 {
        append(&mut store, S, &scrape(i), T0 + i * STEP_MS).unwrap();
    }
    let c = counters(&store, S);
    assert_eq!(c.downsampled_out_records, 0, "{c:?}");
    assert!(c.dropped_oldest_records > 0, "{c:?}");
}
