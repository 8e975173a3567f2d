//! `when_full: downsample` (issue 34) from the binary to a real VictoriaMetrics: a metrics stream
//! bounded at 4 MiB takes 10 minutes of 50 series sampled every 100 ms (10 MB of line protocol)
//! while VictoriaMetrics is down, is killed (kill -9) while it rewrites, and once VictoriaMetrics
//! is back holds the whole outage at decreasing resolution: every sample counted once, in a raw
//! point or in one window's aggregate equal to what its raw samples give, the stream never over its
//! bound, the identity exact.
//!
//! The outage is played faster than it happened: the points carry their producer's times (10
//! minutes before the test) and are posted as fast as colibri takes them, which is the hard case
//! for the rewrite (a scrape every 100 ms would give it more time).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::lanes::{sample, scrape};
use crate::tsdb::{Vm, free_port, now_ms};
use crate::util::client::Client;
use crate::util::{Proc, Sandbox, poll, secs};

const SERIES: u64 = 50;
const STEP_MS: u64 = 100;
const STEPS: u64 = 10 * 60 * 10;
/// Steps per post: 5,000 points, about 200 KB.
const PER_POST: u64 = 100;
const MAX_BYTES: u64 = 4 << 20;

fn value(step: u64, s: u64) -> f64 {
    // A slow ramp with noise, in eighths (exact in a float and in VictoriaMetrics' decimals).
    (step / 50) as f64 + ((step * 7919 + s * 104_729) % 97) as f64 / 8.0
}

fn body(start_ms: u64, from: u64) -> String {
    let mut b = String::new();
    for step in from..from + PER_POST {
        for s in 0..SERIES {
            b.push_str(&format!(
                "plant,s={s:02} v={} {}\n",
                value(step, s),
                start_ms + step * STEP_MS
            ));
        }
    }
    b
}

fn post(ingest: u16, body: &str) -> Result<u16, String> {
    let mut c = Client::new(std::net::SocketAddr::from(([127, 0, 0, 1], ingest)));
    c.post(
        "/v1/streams/metrics/records",
        "text/plain",
        &[],
        body.as_bytes(),
    )
    .map(|a| a.status)
    .map_err(|e| e.to_string())
}

fn stream(text: &str, family: &str, labels: &str) -> f64 {
    sample(text, &format!("{family}{{stream=\"metrics\"{labels}}}"))
}

fn queued_bytes(text: &str) -> f64 {
    ["ready", "retry"]
        .iter()
        .map(|q| stream(text, "colibri_stream_bytes", &format!(",queue=\"{q}\"")))
        .sum()
}

#[test]
fn a_full_metrics_stream_keeps_the_whole_outage_at_decreasing_resolution() {
    let sb = Sandbox::new();
    let mut vm = Vm::start(&sb.file("vm"), free_port());
    vm.stop();
    let (ingest, admin) = (free_port(), free_port());
    let config = sb.write_config(&format!(
        r#"data_dir: data
log: {{format: json}}
ingest: {{ listen: "127.0.0.1:{ingest}" }}
admin: {{ listen: "127.0.0.1:{admin}" }}
sinks:
  vm:
    type: http
    url: "http://127.0.0.1:{vm}/write?db=plant"
    encoding: influx_line
    precision: ms
    link: {{ down_after: 1, backoff_base: 100ms, backoff_cap: 500ms }}
streams:
  metrics:
    sink: vm
    max_bytes: 4MiB
    compression: none
    batch: {{ max_records: 2000, max_bytes: 256KiB }}
    when_full: downsample
    downsample: {{ window: 1m }}
"#,
        vm = vm.port(),
    ));
    let start_ms = (now_ms() - 11 * 60_000) / 60_000 * 60_000 + 12_345;
    let mut agent = Proc::start(&config);
    let mut posted = 0u64; // steps
    let mut killed = false;
    while posted < STEPS {
        let b = body(start_ms, posted);
        if !killed && posted == STEPS / 2 {
            // Killed while it takes a post (the stream is full by now: each append rewrites).
            let sent = Arc::new(AtomicBool::new(false));
            let poster = {
                let sent = Arc::clone(&sent);
                std::thread::spawn(move || send_then_read(ingest, &b, &sent))
            };
            agent.wait_until(secs(30), "the post sent", || sent.load(Ordering::SeqCst));
            agent.signal(libc::SIGKILL);
            agent.wait_exit(secs(10));
            let _ = poster.join();
            agent = Proc::start(&config);
            killed = true;
            // Whether it landed, the store says.
            let appended = stream(&scrape(admin), "colibri_stream_appended_records_total", "");
            posted = appended as u64 / SERIES;
            assert!(
                posted == STEPS / 2 || posted == STEPS / 2 + PER_POST,
                "{appended}"
            );
            continue;
        }
        assert_eq!(post(ingest, &b), Ok(200), "post at step {posted}");
        posted += PER_POST;
        let text = scrape(admin);
        assert!(
            queued_bytes(&text) <= MAX_BYTES as f64,
            "over its bound after step {posted}: {}",
            queued_bytes(&text)
        );
    }
    let text = scrape(admin);
    let made = stream(
        &text,
        "colibri_stream_downsampled_records_total",
        ",direction=\"out\"",
    );
    assert!(made > 0.0, "the stream was full: it downsampled");

    vm.restart();
    agent.wait_until(secs(120), "the stream drained", || {
        let text = scrape(admin);
        ["ready", "retry"]
            .iter()
            .map(|q| stream(&text, "colibri_stream_records", &format!(",queue=\"{q}\"")))
            .sum::<f64>()
            == 0.0
    });
    let text = scrape(admin);
    let of = |f: &str, l: &str| stream(&text, f, l);
    let (appended, delivered, dropped) = (
        of("colibri_stream_appended_records_total", ""),
        of("colibri_stream_delivered_records_total", ""),
        of("colibri_stream_dropped_records_total", ",reason=\"oldest\""),
    );
    let (ds_in, ds_out) = (
        of(
            "colibri_stream_downsampled_records_total",
            ",direction=\"in\"",
        ),
        of(
            "colibri_stream_downsampled_records_total",
            ",direction=\"out\"",
        ),
    );
    assert_eq!(appended, (STEPS * SERIES) as f64);
    assert_eq!(dropped, 0.0, "nothing dropped: the ladder held it all");
    assert_eq!(appended + ds_out, delivered + ds_in, "the identity");
    eprintln!(
        "{appended} points in 4 MiB: {ds_in} replaced by {ds_out} aggregates, {delivered} delivered"
    );

    // What VictoriaMetrics holds: per series, points at distinct times; a point with a count is an
    // aggregate of that many samples from its window's start, the others raw samples.
    let series = poll(secs(60), || {
        let series = vm.export(r#"{__name__=~"plant_v.*"}"#);
        (samples_covered(&series) == appended as u64).then_some(series)
    })
    .unwrap_or_else(|| {
        let series = vm.export(r#"{__name__=~"plant_v.*"}"#);
        panic!(
            "VictoriaMetrics holds {} samples' worth, not {appended}",
            samples_covered(&series)
        )
    });
    check_series(&series, start_ms);
    drop(crate::util::stop(agent));
}

/// A post written whole to the socket, then `sent` set, then its answer read (or the connection
/// found closed): the agent is working on it once `sent` is set.
fn send_then_read(ingest: u16, body: &str, sent: &AtomicBool) {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", ingest)) else {
        return;
    };
    let head = format!(
        "POST /v1/streams/metrics/records HTTP/1.1\r\nHost: colibri\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let wrote = s
        .write_all(head.as_bytes())
        .and_then(|()| s.write_all(body.as_bytes()));
    sent.store(true, Ordering::SeqCst);
    if wrote.is_ok() {
        let _ = s.set_read_timeout(Some(secs(30)));
        let _ = s.read_to_end(&mut Vec::new());
    }
}

/// The samples VictoriaMetrics' points stand for: an aggregate's count, 1 for a raw point.
fn samples_covered(series: &BTreeMap<String, Vec<(u64, f64)>>) -> u64 {
    let counts: BTreeMap<(String, u64), f64> = series
        .iter()
        .filter(|(k, _)| k.contains(r#""__name__":"plant_v_count""#))
        .flat_map(|(k, v)| {
            let s = k.replace("plant_v_count", "plant_v");
            v.iter().map(move |(t, n)| ((s.clone(), *t), *n))
        })
        .collect();
    series
        .iter()
        .filter(|(k, _)| k.contains(r#""__name__":"plant_v""#))
        .flat_map(|(k, v)| v.iter().map(move |(t, _)| (k, *t)))
        .map(|(k, t)| counts.get(&(k.clone(), t)).map_or(1, |n| *n as u64))
        .sum()
}

fn check_series(series: &BTreeMap<String, Vec<(u64, f64)>>, start_ms: u64) {
    let of = |name: &str, s: u64| -> BTreeMap<u64, f64> {
        let key = series
            .keys()
            .find(|k| {
                k.contains(&format!(r#""__name__":"{name}""#))
                    && k.contains(&format!(r#""s":"{s:02}""#))
            })
            .unwrap_or_else(|| panic!("no {name} of s={s:02}"));
        series[key].iter().copied().collect()
    };
    for s in 0..SERIES {
        let (v, count) = (of("plant_v", s), of("plant_v_count", s));
        let (min, max, mean) = (
            of("plant_v_min", s),
            of("plant_v_max", s),
            of("plant_v_mean", s),
        );
        let mut spans = Vec::new();
        for (&t, &last) in &v {
            let first = (t.saturating_sub(start_ms)).div_ceil(STEP_MS);
            let Some(&n) = count.get(&t) else {
                assert_eq!((t - start_ms) % STEP_MS, 0, "s={s:02}: a raw point at {t}");
                assert_eq!(last, value(first, s), "s={s:02}: raw at {t}");
                spans.push((first, 1));
                continue;
            };
            let n = n as u64;
            let vals: Vec<f64> = (first..first + n).map(|i| value(i, s)).collect();
            let want_mean = vals.iter().sum::<f64>() / n as f64;
            assert_eq!(
                min[&t],
                vals.iter().copied().fold(f64::MAX, f64::min),
                "s={s:02} {t}: min"
            );
            assert_eq!(
                max[&t],
                vals.iter().copied().fold(f64::MIN, f64::max),
                "s={s:02} {t}: max"
            );
            assert_eq!(last, vals[vals.len() - 1], "s={s:02} {t}: last");
            assert!(
                (mean[&t] - want_mean).abs() <= 1e-9 * want_mean.abs().max(1.0),
                "s={s:02} {t}: mean {} for {want_mean}",
                mean[&t]
            );
            spans.push((first, n));
        }
        spans.sort_unstable();
        let mut next = 0;
        for (first, n) in &spans {
            assert_eq!(
                *first, next,
                "s={s:02}: a sample missing or counted twice at step {next}"
            );
            next += n;
        }
        assert_eq!(next, STEPS, "s={s:02}: the whole outage, every sample once");
        let (t0, t1) = (v.keys().next().copied(), v.keys().last().copied());
        assert!(
            t0.is_some_and(|t| t <= start_ms),
            "s={s:02}: covers the start"
        );
        assert!(
            t1.is_some_and(|t| t >= start_ms + (STEPS - 1) * STEP_MS - 60_000),
            "s={s:02}: covers the end"
        );
    }
}
