//! Tests of a `live_first` stream's lanes: the live lane first and in order, the backlog behind
//! it one job at a time while live jobs wait and never below its share, the boundary moving as
//! jobs age and found again after a reopen, retries and oldest-first streams unchanged.

use super::*;

const SECOND: u64 = 1000;

fn live_first(share: f64) -> StreamConfig {
    StreamConfig {
        replay: Replay {
            live_first: true,
            live_window: Duration::from_secs(10),
            backfill_share: share,
            ..Replay::OLDEST_FIRST
        },
        ..stream(S)
    }
}

/// Jobs 1..=3 appended at T0 (the backlog a minute later), 4..=5 at T0 + 60 s.
fn backlog_and_live(store: &mut Store) {
    for i in 0..3 {
        append(store, S, &recs(&format!("old{i}"), 2), T0).unwrap();
    }
    for i in 0..2 {
        append(store, S, &recs(&format!("new{i}"), 2), T0 + 60 * SECOND).unwrap();
    }
}

#[test]
fn the_live_lane_is_taken_first_in_order_then_the_backlog_oldest_first() {
    let d = Dir::new(vec![live_first(0.25)]);
    let mut store = d.open();
    backlog_and_live(&mut store);
    let now = T0 + 61 * SECOND;
    assert_eq!(
        ids(&take(&mut store, S, 16, now)),
        [4, 5],
        "the live lane first"
    );
    // The live lane is in flight: the backlog alone, as many as asked.
    assert_eq!(ids(&take(&mut store, S, 16, now)), [1, 2, 3]);
    assert!(take(&mut store, S, 16, now).is_empty());
}

#[test]
fn while_live_jobs_wait_the_backlog_gets_one_job_a_take_and_its_share() {
    let d = Dir::new(vec![live_first(0.5)]);
    let mut store = d.open();
    backlog_and_live(&mut store);
    let now = T0 + 61 * SECOND;
    let live = take(&mut store, S, 1, now);
    assert_eq!(ids(&live), [4]);
    // Job 5 waits in the live lane, and the backlog has had nothing of its half: one backlog job.
    assert_eq!(ids(&take(&mut store, S, 16, now)), [1]);
    // Even now (half each): the live lane again.
    assert_eq!(ids(&take(&mut store, S, 16, now)), [5]);
    // The live lane is empty: the rest of the backlog together.
    assert_eq!(ids(&take(&mut store, S, 16, now)), [2, 3]);
}

#[test]
fn jobs_leave_the_live_lane_as_they_age() {
    let d = Dir::new(vec![live_first(0.25)]);
    let mut store = d.open();
    backlog_and_live(&mut store);
    // The first take finds the boundary from the newest job backwards.
    assert_eq!(ids(&take(&mut store, S, 1, T0 + 61 * SECOND)), [4]);
    store = d.reopen(store);
    // Twenty seconds on, everything is backlog: oldest first again.
    assert_eq!(
        ids(&take(&mut store, S, 16, T0 + 80 * SECOND)),
        [1, 2, 3, 4, 5]
    );
    // A new job is live and goes first.
    let mut store = d.reopen(store);
    append(&mut store, S, &recs("newer", 1), T0 + 80 * SECOND).unwrap();
    assert_eq!(ids(&take(&mut store, S, 1, T0 + 81 * SECOND)), [6]);
    assert_eq!(
        ids(&take(&mut store, S, 16, T0 + 81 * SECOND)),
        [1, 2, 3, 4, 5]
    );
}

#[test]
fn due_retries_still_go_first_and_oldest_first_streams_are_unchanged() {
    let d = Dir::new(vec![live_first(0.25), stream("plain")]);
    let mut store = d.open();
    backlog_and_live(&mut store);
    let now = T0 + 61 * SECOND;
    let first = take(&mut store, S, 1, now);
    fail(&mut store, &first[0].lease, &transient(now, 5), now);
    assert_eq!(ids(&take(&mut store, S, 1, now)), [4], "a due retry first");
    for t in [T0, T0 + 60 * SECOND] {
        append(&mut store, "plain", &recs("p", 1), t).unwrap();
    }
    assert_eq!(ids(&take(&mut store, "plain", 16, now)), [1, 2]);
}
