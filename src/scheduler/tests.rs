use super::*;
use crate::clock::testing::FakeClock;
use crate::schedule::{Offset, Zone, parse_cron};
use crate::task::{Action, RetryPolicy, exec::Exec};
use chrono::TimeZone;

const S: Duration = Duration::from_secs(1);

fn def(name: &str, schedule: Schedule) -> Arc<TaskDef> {
    def_cmd(name, schedule, &["/bin/true"])
}

fn def_cmd(name: &str, schedule: Schedule, argv: &[&str]) -> Arc<TaskDef> {
    Arc::new(TaskDef {
        name: name.into(),
        schedule,
        timeout: Duration::from_secs(5),
        retry: RetryPolicy {
            max_retry: 0,
            base: S,
            cap: S,
        },
        action: Action::Exec(Box::new(Exec {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            env: vec![],
            cwd: None,
            output: None,
        })),
    })
}

fn every(secs: u64) -> Schedule {
    Schedule::Every {
        period: Duration::from_secs(secs),
        offset: Offset::Fixed(Duration::ZERO),
    }
}

fn cron(expr: &str) -> Schedule {
    parse_cron(
        expr,
        Zone::Named(crate::zone::NamedZone::load("UTC").unwrap()),
    )
    .unwrap()
}

/// A pair of clock readings that advance together, with a wall clock that can jump.
struct Clocks {
    mono0: Instant,
    wall0: DateTime<Utc>,
    elapsed: Duration,
    jump: chrono::Duration,
}

impl Clocks {
    fn at(wall: DateTime<Utc>) -> Self {
        Clocks {
            mono0: Instant::now(),
            wall0: wall,
            elapsed: Duration::ZERO,
            jump: chrono::Duration::zero(),
        }
    }
    fn now(&self) -> Now {
        Now {
            mono: self.mono0 + self.elapsed,
            wall: self.wall0 + chrono::Duration::from_std(self.elapsed).unwrap() + self.jump,
        }
    }
    fn advance(&mut self, d: Duration) -> Now {
        self.elapsed += d;
        self.now()
    }
}

/// Steps the plan through `total` of simulated time in `step`s; returns (second, task) for each fire.
fn simulate(
    plan: &mut Plan,
    clocks: &mut Clocks,
    total: Duration,
    step: Duration,
) -> Vec<(u64, String)> {
    let mut fired = Vec::new();
    let end = clocks.elapsed + total;
    while clocks.elapsed < end {
        let now = clocks.advance(step);
        while let Some(f) = plan.pop_due(now) {
            fired.push((clocks.elapsed.as_secs(), f.def.name.clone()));
        }
    }
    fired
}

fn wall(h: u32, m: u32, s: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, h, m, s).unwrap()
}

#[test]
fn interval_tasks_fire_on_time_in_order() {
    let mut c = Clocks::at(wall(10, 0, 0));
    let mut plan = Plan::new(c.now(), Default::default());
    plan.upsert(def("fast", every(2)), c.now(), true);
    plan.upsert(def("slow", every(5)), c.now(), true);
    // Both are due at start.
    let first: Vec<String> = std::iter::from_fn(|| plan.pop_due(c.now()))
        .map(|f| f.def.name.clone())
        .collect();
    assert_eq!(first, ["fast", "slow"]);
    let fired = simulate(
        &mut plan,
        &mut c,
        Duration::from_secs(10),
        Duration::from_millis(100),
    );
    let fast: Vec<u64> = fired
        .iter()
        .filter(|(_, n)| n == "fast")
        .map(|(t, _)| *t)
        .collect();
    let slow: Vec<u64> = fired
        .iter()
        .filter(|(_, n)| n == "slow")
        .map(|(t, _)| *t)
        .collect();
    assert_eq!(fast, [2, 4, 6, 8, 10]);
    assert_eq!(slow, [5, 10]);
    assert_eq!(
        plan.next_deadline(),
        Some(c.mono0 + Duration::from_secs(12))
    );
}

#[test]
fn fixed_offsets_and_random_offsets_spread_the_first_run() {
    let c = Clocks::at(wall(10, 0, 0));
    let mut plan = Plan::new(c.now(), Default::default());
    let offset = |o| Schedule::Every {
        period: Duration::from_secs(60),
        offset: o,
    };
    plan.upsert(
        def("fixed", offset(Offset::Fixed(Duration::from_secs(7)))),
        c.now(),
        true,
    );
    assert_eq!(plan.next_deadline(), Some(c.mono0 + Duration::from_secs(7)));
    let mut plan = Plan::new(c.now(), Default::default());
    for i in 0..500 {
        plan.upsert(def(&format!("r{i}"), offset(Offset::Random)), c.now(), true);
    }
    // Count how many of the 500 first runs fall in each 6 s tenth of the minute.
    let mut buckets = [0u32; 10];
    let mut c2 = Clocks::at(wall(10, 0, 0));
    c2.mono0 = c.mono0;
    for _ in 0..600 {
        let now = c2.advance(Duration::from_millis(100));
        while plan.pop_due(now).is_some() {
            let b = ((c2.elapsed.as_millis() - 1) / 6000) as usize;
            buckets[b.min(9)] += 1;
        }
    }
    assert_eq!(
        buckets.iter().sum::<u32>(),
        500,
        "every task fired exactly once in its first period"
    );
    assert!(buckets.iter().all(|b| *b < 150), "no burst: {buckets:?}");
}

#[test]
fn cron_tasks_fire_at_their_wall_times() {
    let mut c = Clocks::at(wall(10, 0, 30));
    let mut plan = Plan::new(c.now(), Default::default());
    plan.upsert(def("minutely", cron("* * * * *")), c.now(), true);
    assert_eq!(
        plan.next_deadline(),
        Some(c.mono0 + Duration::from_secs(30))
    );
    let fired = simulate(
        &mut plan,
        &mut c,
        Duration::from_secs(150),
        Duration::from_millis(250),
    );
    let at: Vec<u64> = fired.iter().map(|(t, _)| *t).collect();
    assert_eq!(at, [30, 90, 150]);
}

#[test]
fn reboot_runs_once_at_start_only() {
    let mut c = Clocks::at(wall(10, 0, 0));
    let mut plan = Plan::new(c.now(), Default::default());
    plan.upsert(def("boot", Schedule::Reboot), c.now(), true);
    assert_eq!(
        plan.pop_due(c.now()).map(|f| f.def.name.clone()).as_deref(),
        Some("boot")
    );
    assert!(simulate(&mut plan, &mut c, Duration::from_secs(100), S).is_empty());
    // Added later (a reload), it does not run.
    plan.upsert(def("late-boot", Schedule::Reboot), c.now(), false);
    assert!(simulate(&mut plan, &mut c, Duration::from_secs(10), S).is_empty());
}

#[test]
fn add_remove_and_change_while_planned() {
    let mut c = Clocks::at(wall(10, 0, 0));
    let mut plan = Plan::new(c.now(), Default::default());
    plan.upsert(
        def(
            "a",
            Schedule::Every {
                period: Duration::from_secs(10),
                offset: Offset::Fixed(Duration::from_secs(10)),
            },
        ),
        c.now(),
        true,
    );
    plan.upsert(
        def(
            "b",
            Schedule::Every {
                period: Duration::from_secs(10),
                offset: Offset::Fixed(Duration::from_secs(10)),
            },
        ),
        c.now(),
        true,
    );
    assert_eq!(plan.len(), 2);
    // Change a to every 3 s: its old entry (due at 10 s) is stale and must not fire.
    plan.upsert(
        def(
            "a",
            Schedule::Every {
                period: Duration::from_secs(3),
                offset: Offset::Fixed(Duration::from_secs(3)),
            },
        ),
        c.now(),
        false,
    );
    assert_eq!(plan.len(), 2);
    // Remove b: nothing of it fires.
    assert!(plan.remove("b"));
    assert!(!plan.remove("b"));
    plan.upsert(
        def(
            "c",
            Schedule::Every {
                period: Duration::from_secs(5),
                offset: Offset::Fixed(Duration::from_secs(5)),
            },
        ),
        c.now(),
        false,
    );
    let fired = simulate(
        &mut plan,
        &mut c,
        Duration::from_secs(10),
        Duration::from_millis(100),
    );
    let names: Vec<(u64, &str)> = fired.iter().map(|(t, n)| (*t, n.as_str())).collect();
    assert_eq!(names, [(3, "a"), (5, "c"), (6, "a"), (9, "a"), (10, "c")]);
    assert_eq!(plan.len(), 2);
    // Stale entries are dropped on the way, so the heap does not grow with changes.
    for _ in 0..1000 {
        plan.upsert(def("a", every(3)), c.now(), false);
    }
    plan.next_deadline();
    assert!(
        plan.heap.len() < 1010,
        "heap holds {} entries",
        plan.heap.len()
    );
}

#[test]
fn missed_occurrences_are_skipped_not_burst() {
    let mut c = Clocks::at(wall(10, 0, 0));
    let mut plan = Plan::new(c.now(), Default::default());
    plan.upsert(def("i", every(1)), c.now(), true);
    plan.upsert(def("m", cron("* * * * *")), c.now(), true);
    assert!(plan.pop_due(c.now()).is_some()); // i at start
    // The process could not run for an hour (suspend, stall): one fire each, then back on the grid.
    let now = c.advance(Duration::from_secs(3600));
    let burst: Vec<String> = std::iter::from_fn(|| plan.pop_due(now))
        .map(|f| f.def.name.clone())
        .collect();
    assert_eq!(burst.len(), 2, "{burst:?}");
    let fired = simulate(
        &mut plan,
        &mut c,
        Duration::from_secs(60),
        Duration::from_millis(100),
    );
    assert_eq!(fired.iter().filter(|(_, n)| n == "i").count(), 60);
    assert_eq!(fired.iter().filter(|(_, n)| n == "m").count(), 1);
}

#[test]
fn a_forward_clock_jump_replans_instead_of_firing_everything() {
    let mut c = Clocks::at(wall(10, 0, 0));
    let mut plan = Plan::new(c.now(), Default::default());
    plan.upsert(def("hourly", cron("0 * * * *")), c.now(), true);
    plan.upsert(def("tick", every(10)), c.now(), true);
    assert!(plan.pop_due(c.now()).is_some()); // tick at start
    // An RTC-less box boots in 1970... here: NTP steps the clock a day forward.
    c.jump = chrono::Duration::days(1);
    let now = c.advance(Duration::from_millis(10));
    assert!(plan.clock_jump(now).is_some());
    assert_eq!(plan.replan_wall(now), 1);
    assert!(plan.clock_jump(now).is_none(), "the new offset is trusted");
    // Nothing fires in a burst; hourly is due at the next full hour of the new time (11:00 tomorrow).
    assert!(plan.pop_due(now).is_none());
    let fired = simulate(&mut plan, &mut c, Duration::from_secs(3600), S);
    let hourly: Vec<u64> = fired
        .iter()
        .filter(|(_, n)| n == "hourly")
        .map(|(t, _)| *t)
        .collect();
    assert_eq!(hourly, [3600]);
    // The interval task was not disturbed: every 10 s on the monotonic clock.
    assert_eq!(fired.iter().filter(|(_, n)| n == "tick").count(), 360);
}

#[test]
fn a_backward_clock_jump_does_not_sleep_for_a_day() {
    let mut c = Clocks::at(wall(10, 30, 0));
    let mut plan = Plan::new(c.now(), Default::default());
    plan.upsert(def("hourly", cron("0 * * * *")), c.now(), true);
    assert_eq!(
        plan.next_deadline(),
        Some(c.mono0 + Duration::from_secs(1800))
    );
    // The clock is set back a day: without a re-plan the task would wait 24.5 h.
    c.jump = -chrono::Duration::days(1);
    let now = c.advance(Duration::from_secs(60));
    let jump = plan.clock_jump(now).expect("a day is a jump");
    assert_eq!(jump.num_hours(), -24);
    plan.replan_wall(now);
    assert_eq!(
        plan.next_deadline(),
        Some(c.mono0 + Duration::from_secs(1800))
    );
}

#[test]
fn small_drift_is_not_a_jump() {
    let mut c = Clocks::at(wall(10, 0, 0));
    let plan = Plan::new(c.now(), Default::default());
    c.jump = chrono::Duration::milliseconds(1500);
    assert!(
        plan.clock_jump(c.advance(Duration::from_secs(3600)))
            .is_none()
    );
    c.jump = chrono::Duration::milliseconds(2500);
    assert!(plan.clock_jump(c.now()).is_some());
}

fn ctx() -> RunContext {
    RunContext {
        stopping: Default::default(),
        abort: Default::default(),
        groups: Default::default(),
        store: None,
    }
}

/// With nothing due for an hour, the loop does not wake at all (paused time advances 50 minutes).
#[tokio::test(start_paused = true)]
async fn idle_scheduler_does_not_wake() {
    let clock = FakeClock::starting_at(wall(10, 0, 0));
    let tasks = [def("later", cron("0 11 * * *")), def("hourly", every(3600))];
    let c = ctx();
    let (mut s, _h) = Scheduler::new(
        &tasks,
        clock,
        c.clone(),
        2,
        S,
        Arc::new(Notify::new()),
        Default::default(),
    );
    // Take "hourly"'s start run out of the way so only future work is planned.
    s.plan.pop_due(Now {
        mono: Instant::now(),
        wall: wall(10, 0, 0),
    });
    let wakeups = s.wakeups();
    let run = tokio::spawn(s.run());
    tokio::time::sleep(Duration::from_secs(50 * 60)).await;
    assert_eq!(wakeups.load(Ordering::Relaxed), 0);
    c.stopping.cancel();
    run.await.unwrap();
}

/// A wall-clock change notification wakes the loop once, and it re-plans.
#[tokio::test(start_paused = true)]
async fn clock_set_notification_wakes_and_replans() {
    let clock = FakeClock::starting_at(wall(10, 30, 0));
    let tasks = [def("hourly", cron("0 * * * *"))];
    let c = ctx();
    let notify = Arc::new(Notify::new());
    let (s, _h) = Scheduler::new(
        &tasks,
        clock.clone(),
        c.clone(),
        2,
        S,
        notify.clone(),
        Default::default(),
    );
    let wakeups = s.wakeups();
    let run = tokio::spawn(s.run());
    tokio::time::sleep(Duration::from_secs(60)).await;
    clock.jump(-chrono::Duration::days(1));
    notify.notify_one();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(wakeups.load(Ordering::Relaxed), 1);
    c.stopping.cancel();
    run.await.unwrap();
}

/// Real processes, real time: a change sent through the handle is planned and runs; a run still going
/// when due again is skipped and counted.
#[tokio::test]
async fn handle_changes_and_overlap_skips() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let c = ctx();
    let slow = def_cmd(
        "slow",
        Schedule::Every {
            period: Duration::from_millis(200),
            offset: Offset::Fixed(Duration::ZERO),
        },
        &["/bin/sleep", "1"],
    );
    let (s, handle) = Scheduler::new(
        &[slow],
        Arc::new(crate::clock::SystemClock),
        c.clone(),
        4,
        Duration::from_secs(5),
        Arc::new(Notify::new()),
        Default::default(),
    );
    let stats = s.plan().stats("slow").unwrap();
    let run = tokio::spawn(s.run());
    let script = format!("echo ran >> {}", out.display());
    let added = def_cmd(
        "added",
        Schedule::Every {
            period: Duration::from_millis(100),
            offset: Offset::Fixed(Duration::ZERO),
        },
        &["/bin/sh", "-c", &script],
    );
    assert!(handle.send(Change::Upsert(added)));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let runs = std::fs::read_to_string(&out)
            .map(|t| t.lines().count())
            .unwrap_or(0);
        if runs >= 3 && stats.skipped.load(Ordering::Relaxed) >= 2 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "runs={runs} skipped={:?}",
            stats.skipped
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(handle.send(Change::Remove("added".into())));
    c.stopping.cancel();
    let drained = run.await.unwrap();
    assert_eq!(
        drained.killed, 0,
        "the 1 s sleep finishes within the 5 s grace"
    );
    assert!(stats.ok.load(Ordering::Relaxed) >= 1);
}

/// Past the grace, running tasks are killed and the scheduler still returns.
#[tokio::test]
async fn grace_expiry_kills_running_tasks() {
    let c = ctx();
    let t = def_cmd("stuck", Schedule::Reboot, &["/bin/sleep", "30"]);
    let (s, _h) = Scheduler::new(
        &[t],
        Arc::new(crate::clock::SystemClock),
        c.clone(),
        1,
        Duration::from_millis(300),
        Arc::new(Notify::new()),
        Default::default(),
    );
    let stats = s.plan().stats("stuck").unwrap();
    let run = tokio::spawn(s.run());
    tokio::time::sleep(Duration::from_millis(300)).await;
    c.stopping.cancel();
    let started = std::time::Instant::now();
    let drained = tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("drain is bounded")
        .unwrap();
    assert_eq!(drained.killed, 1);
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(stats.cancelled.load(Ordering::Relaxed), 1);
}

#[test]
fn a_task_changed_by_a_reload_keeps_its_counters() {
    // The agent owns the registry; a changed task's new slot takes the counters kept by name.
    let c = Clocks::at(wall(10, 0, 0));
    let registry: Arc<Registry<TaskStats>> = Default::default();
    let mut plan = Plan::new(c.now(), Arc::clone(&registry));
    let every = |s| Schedule::Every {
        period: Duration::from_secs(s),
        offset: Offset::Fixed(Duration::from_secs(s)),
    };
    plan.upsert(def("a", every(10)), c.now(), true);
    plan.stats("a")
        .unwrap()
        .skipped
        .fetch_add(3, Ordering::Relaxed);
    plan.upsert(def("a", every(3)), c.now(), false);
    let kept = plan.stats("a").unwrap();
    assert_eq!(kept.skipped.load(Ordering::Relaxed), 3);
    assert!(Arc::ptr_eq(&kept, &registry.get("a")));
}
