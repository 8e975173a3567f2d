//! Report by exception (issue 34): how many of a sampled signal's values a deadband lets through,
//! and what deciding costs. The signal is the tests' ramp (tests/it/modbus.rs, tests/it/tsdb.rs):
//! 0.002 a sample with noise within ±0.05, and a step of 5 at 60% of the run; one sample every
//! 100 ms. Figures, not assertions: values sent per 1,000 samples for each rule, and nanoseconds
//! per decision (the median of BENCH_ROUNDS rounds), see BENCHMARKS.md.
//!
//!   cargo bench --bench deadband

use std::hint::black_box;
use std::time::{Duration, Instant};

use colibri::scrape::exception::{Deadband, Decided, Exceptions, Rule, Sample};

mod common;

/// Samples per round: 10,000 s at one every 100 ms.
const SAMPLES: u64 = 100_000;

fn value(n: u64) -> f64 {
    let noise = ((n * 7919) % 101) as f64 / 1000.0 - 0.05;
    let step = if n >= SAMPLES * 6 / 10 { 5.0 } else { 0.0 };
    20.0 + 0.002 * n as f64 + noise + step
}

/// Values sent of [`SAMPLES`], and the time the decisions took.
fn run(rule: &Rule) -> (u64, Duration) {
    let x = Exceptions::default();
    let key = ("tank,site=plant-1".to_string(), "level".to_string());
    let mut sent = 0;
    let started = Instant::now();
    for n in 0..SAMPLES {
        let mut d = Decided::default();
        let now_ms = n * 100;
        if x.decide(key.clone(), Sample::Number(value(n)), rule, now_ms, &mut d) {
            sent += 1;
        }
        x.stored(black_box(d));
    }
    (sent, started.elapsed())
}

fn main() {
    let rounds = common::env_u64("BENCH_ROUNDS", 11) as usize;
    let rules = [
        ("no deadband (every value)", None, None),
        ("deadband 0.5", Some(Deadband::Absolute(0.5)), None),
        (
            "deadband 0.5, heartbeat 10s",
            Some(Deadband::Absolute(0.5)),
            Some(Duration::from_secs(10)),
        ),
        ("deadband 1%", Some(Deadband::Percent(1.0)), None),
        (
            "deadband 0.1 (inside the noise)",
            Some(Deadband::Absolute(0.1)),
            None,
        ),
    ];
    println!(
        "report by exception: {SAMPLES} samples of a noisy ramp with a step, one every 100 ms"
    );
    for (name, deadband, heartbeat) in rules {
        let rule = Rule {
            deadband,
            heartbeat,
        };
        let mut times = Vec::with_capacity(rounds);
        let mut sent = 0;
        for _ in 0..rounds {
            let (s, t) = if rule.filters() {
                run(&rule)
            } else {
                (SAMPLES, Duration::ZERO)
            };
            sent = s;
            times.push(t);
        }
        times.sort();
        let ns = times[rounds / 2].as_nanos() as f64 / SAMPLES as f64;
        println!(
            "  {name:<34} {:>7.1} sent per 1,000 samples, {ns:>5.0} ns a decision",
            sent as f64 * 1000.0 / SAMPLES as f64
        );
    }
}
