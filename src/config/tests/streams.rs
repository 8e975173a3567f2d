//! Tests of the `streams:` and `storage:` sections: defaults, every setting, and every problem
//! reported with its path.

use super::*;
use crate::store::{MaxAge, OnMaxAge};

#[test]
fn streams_and_storage_compile_with_defaults() {
    let c = load(
        r#"
storage: { max_bytes: 1GiB, min_free: 64MiB }
streams:
  logs:
    batch: { max_records: 500, max_bytes: 256KiB, linger: 250ms }
    max_jobs: 5000
    max_bytes: 512MiB
    when_full: drop_oldest
    ttl: 7d
    dead_letter: { max_jobs: 100 }
    replay: live_first
    live_window: 30s
    backfill_share: 0.1
    priority: 7
    min_share: 0.2
    max_age: 1h
    on_max_age: drop
  metrics: {}
"#,
    )
    .unwrap();
    assert_eq!(
        c.storage,
        StorageConfig {
            max_bytes: 1 << 30,
            min_free: 64 << 20
        }
    );
    assert_eq!(c.streams.len(), 2);
    let logs = &c.streams[0];
    assert_eq!(logs.name, "logs");
    assert_eq!(
        logs.batch,
        BatchConfig {
            max_records: 500,
            max_bytes: 256 << 10,
            linger: Duration::from_millis(250)
        }
    );
    assert_eq!((logs.max_jobs, logs.max_bytes), (5000, 512 << 20));
    assert_eq!(logs.when_full, WhenFull::DropOldest);
    assert_eq!(logs.ttl, Some(Duration::from_secs(7 * 86400)));
    assert_eq!(logs.dead_max_jobs, 100);
    assert_eq!(
        logs.max_age,
        Some(MaxAge {
            age: Duration::from_secs(3600),
            then: OnMaxAge::Drop
        })
    );
    assert_eq!(
        logs.replay,
        Replay {
            live_first: true,
            live_window: Duration::from_secs(30),
            backfill_share: 0.1,
            priority: 7,
            min_share: 0.2
        }
    );
    let m = &c.streams[1];
    assert_eq!(
        m.batch,
        BatchConfig {
            max_records: 1000,
            max_bytes: 1 << 20,
            linger: Duration::from_secs(1)
        }
    );
    assert_eq!(
        (m.max_jobs, m.max_bytes, m.when_full, m.ttl, m.dead_max_jobs),
        (100_000, 256 << 20, WhenFull::Block, None, 10_000)
    );
    assert_eq!(m.replay, Replay::OLDEST_FIRST);
    assert_eq!(
        load("").unwrap().storage,
        StorageConfig {
            max_bytes: 2 << 30,
            min_free: 256 << 20
        }
    );
}

#[test]
fn stream_problems_are_all_reported() {
    let p = problems(
        r#"
storage: { max_bytes: 0B }
streams:
  "bad name": {}
  a: { sink: central }
  b: { batch: { max_records: 0, max_bytes: 0B } }
  c: { max_jobs: 0, ttl: 0s }
  d: { max_bytes: 1KiB, batch: { max_bytes: 1MiB } }
  e: { when_full: explode }
  f: { flavour: vanilla }
  g: 5
  h: { replay: newest_first, live_window: 0s }
  i: { replay: live_first, backfill_share: 0 }
  j: { backfill_share: 1.5 }
  k: { priority: 10, min_share: 1 }
  l: { max_age: 0s, on_max_age: "stream:archive" }
  m: { on_max_age: drop }
  n: { max_age: 1h, on_max_age: "stream:n" }
  o: { max_age: 1h, on_max_age: shelf }
  p: { max_age: 1h, on_max_age: "stream:q" }
  q: { max_age: 1h, on_max_age: "stream:m" }
"#,
    );
    let expect = [
        "storage.max_bytes: must be positive",
        "streams.bad name: a stream name must be 1-64 letters",
        "streams.a.sink: sink \"central\" is not defined",
        "streams.b.batch.max_records: must be at least 1",
        "streams.b.batch.max_bytes: must be positive",
        "streams.c.max_jobs: must be at least 1",
        "streams.c.ttl: must be positive",
        "streams.d.max_bytes: 1024 bytes cannot hold one full job of batch.max_bytes (1052640 bytes with its framing)",
        "streams.e.when_full: unknown variant `explode`",
        "streams.f.flavour: unknown field `flavour`",
        "streams.g: invalid type: integer",
        "streams.h.replay: unknown variant `newest_first`",
        "streams.h.live_window: must be positive",
        "streams.i.backfill_share: 0 is not a share: give a number above 0, up to 1",
        "streams.j.backfill_share: 1.5 is not a share",
        "streams.j.backfill_share: applies only with replay: live_first",
        "streams.k.priority: 10 is not a priority: 0 to 9",
        "streams.k.min_share: 1 is not a share: give a number above 0, below 1",
        "streams.l.max_age: must be positive",
        "streams.l.on_max_age: stream \"archive\" is not defined under streams: (defined: a, b, bad name,",
        "streams.m.on_max_age: applies only with max_age",
        "streams.n.on_max_age: \"n\" is this stream: name another one (an archive)",
        "streams.o.on_max_age: \"shelf\": expected drop or stream:NAME",
        "streams.p.on_max_age: stream \"q\" moves jobs on itself (its own on_max_age): moves are one step",
    ];
    assert_has(&p, &expect);
    assert_eq!(p.len(), expect.len(), "{p:#?}");
}

/// `on_max_age: stream:NAME` names the stream a too old job moves to; its sink must take the same
/// records as the first one's (a moved job is not rewritten), or any line (a directory).
#[test]
fn on_max_age_moves_into_another_stream_whose_sink_takes_the_same_records() {
    let c = load(
        r#"
sinks:
  tsdb: { type: http, url: "http://127.0.0.1:9/write", encoding: influx_line }
  bulk: { type: http, url: "http://127.0.0.1:9/bulk", encoding: influx_line }
  disk: { type: file, path: /tmp/colibri-archive }
streams:
  metrics: { sink: tsdb, max_age: 5m, on_max_age: "stream:archive" }
  archive: { sink: bulk }
  logs: { sink: tsdb, max_age: 5m, on_max_age: "stream:shelf" }
  shelf: { sink: disk }
"#,
    )
    .unwrap();
    let metrics = c.streams.iter().find(|s| s.name == "metrics").unwrap();
    assert_eq!(
        metrics.max_age,
        Some(MaxAge {
            age: Duration::from_secs(300),
            then: OnMaxAge::Move("archive".into())
        })
    );
    let p = problems(
        r#"
sinks:
  tsdb: { type: http, url: "http://127.0.0.1:9/write", encoding: influx_line }
  json: { type: http, url: "http://127.0.0.1:9/bulk" }
streams:
  metrics: { sink: tsdb, max_age: 5m, on_max_age: "stream:archive" }
  archive: { sink: json }
"#,
    );
    assert_eq!(p.len(), 1, "{p:#?}");
    assert!(
        p[0].starts_with("streams.metrics.on_max_age: stream \"archive\" is delivered as"),
        "{p:#?}"
    );
}

/// `when_full: downsample` aggregates line protocol: a stream whose sink takes it gets the ladder
/// in the sink's timestamp unit; any other is refused with the reason, and so are a ladder that
/// does not grow by multiples and `downsample` without it.
#[test]
fn downsample_takes_metric_streams_and_a_ladder_of_multiples() {
    let c = load(
        r#"
sinks:
  tsdb: { type: http, url: "http://127.0.0.1:9/write", encoding: influx_line, precision: ms }
streams:
  metrics: { sink: tsdb, when_full: downsample, downsample: { window: 30s, keep: [min, max] } }
  plain: { sink: tsdb, when_full: downsample }
"#,
    )
    .unwrap();
    let ds = |name: &str| {
        c.streams
            .iter()
            .find(|s| s.name == name)
            .unwrap()
            .downsample
            .clone()
            .unwrap()
    };
    let m = ds("metrics");
    assert_eq!(
        m.windows,
        [30, 300, 1800].map(Duration::from_secs).to_vec(),
        "default ladder: 10 and 60 times the window"
    );
    assert_eq!((m.ticks_per_second, m.ticks(1)), (1000, 30_000));
    assert!(m.keep.min && m.keep.max && !m.keep.last && !m.keep.mean);
    assert_eq!(ds("plain").windows.len(), 3);

    let p = problems(
        r#"
sinks:
  tsdb: { type: http, url: "http://127.0.0.1:9/write", encoding: influx_line }
  logs: { type: http, url: "http://127.0.0.1:9/logs" }
streams:
  a: { sink: logs, when_full: downsample }
  b: { when_full: downsample }
  c: { sink: tsdb, when_full: downsample, downsample: { window: 1m, ladder: [90s, 1h] } }
  d: { sink: tsdb, downsample: { window: 1m } }
"#,
    );
    let expect = [
        "streams.a.when_full: downsample aggregates metric records (line protocol), and this stream is delivered as JSON records",
        "streams.b.when_full: downsample aggregates metric records (line protocol), and this stream is delivered as lines (it has no sink)",
        "streams.c.downsample.ladder[0]: must be a multiple of the window before it (60s) and longer",
        "streams.d.downsample: applies only with when_full: downsample",
    ];
    assert_has(&p, &expect);
    assert_eq!(p.len(), expect.len(), "{p:#?}");
}
