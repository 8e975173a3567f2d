//! `when_full: downsample` (issue 34): what the rewrite costs. A metrics stream bounded at 4 MiB
//! takes 10 minutes of 50 series sampled every 100 ms (300,000 points, about 12 MB of line
//! protocol) in appends of 5,000 points, each its own commit, on a real disk, once with
//! `drop_oldest` and once with `downsample`. Printed per run: CPU seconds (user + system, this
//! process), bytes written to the disk (`/proc/self/io` write_bytes), what the stream holds at the
//! end, and for downsample the extra CPU and bytes written per MB of points replaced by aggregates.
//! Figures, not assertions: see BENCHMARKS.md.
//!
//!   cargo bench --bench downsample
//!
//! Settings (environment): BENCH_ROUNDS (3) runs per mode, the median printed; BENCH_DIR (cargo's
//! target/tmp: a real disk).

use std::path::Path;

mod common;

use colibri::config;
use colibri::store::{OpenOptions, RecordBuf, Store};

const SERIES: u64 = 50;
const STEP_MS: u64 = 100;
const STEPS: u64 = 6000;
const PER_APPEND: u64 = 100;
const T0: u64 = 1_700_000_000_000;

fn points(from: u64) -> RecordBuf {
    let mut out = RecordBuf::new();
    for step in from..from + PER_APPEND {
        for s in 0..SERIES {
            let v = (step / 50) as f64 + ((step * 7919 + s * 104_729) % 97) as f64 / 8.0;
            out.push(format!("plant,s={s:02} v={v} {}", T0 + step * STEP_MS).as_bytes());
        }
    }
    out
}

fn cpu_secs() -> f64 {
    common::cpu_secs(std::process::id())
}

fn written_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("write_bytes: ").and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

#[derive(Debug, Clone, Copy, Default)]
struct Run {
    cpu: f64,
    written: u64,
    appended_bytes: u64,
    replaced: u64,
    made: u64,
    dropped: u64,
    held: u64,
}

fn run(base: &Path, when_full: &str) -> Run {
    let dir = tempfile::tempdir_in(base).expect("a temporary directory");
    let cfg = dir.path().join("colibri.yaml");
    std::fs::write(
        &cfg,
        format!(
            "data_dir: {}\n\
             sinks:\n  tsdb: {{ type: http, url: \"http://127.0.0.1:9/write\", encoding: influx_line, precision: ms }}\n\
             streams:\n  metrics: {{ sink: tsdb, max_bytes: 4MiB, compression: none, when_full: {when_full}, \
               batch: {{ max_records: 2000, max_bytes: 256KiB }} }}\n",
            dir.path().join("data").display()
        ),
    )
    .expect("write the config");
    let c = config::load(&cfg).unwrap_or_else(|e| panic!("{e}"));
    std::fs::create_dir_all(&c.data_dir).expect("data_dir");
    let mut store =
        Store::open(&c.data_dir, c.storage, &c.streams, OpenOptions::default()).expect("open");
    let batches: Vec<RecordBuf> = (0..STEPS / PER_APPEND)
        .map(|i| points(i * PER_APPEND))
        .collect();
    let appended_bytes = batches
        .iter()
        .flat_map(|b| b.iter())
        .map(|p| p.len() as u64 + 1)
        .sum();
    let (cpu0, w0) = (cpu_secs(), written_bytes());
    for (i, b) in batches.iter().enumerate() {
        let mut tx = store.transaction().expect("begin");
        tx.append("metrics", b, None, T0 + i as u64 * 10_000)
            .expect("appended");
        tx.commit().expect("commit");
    }
    let (cpu, written) = (cpu_secs() - cpu0, written_bytes() - w0);
    let k = store.counters("metrics").expect("the stream").clone();
    Run {
        cpu,
        written,
        appended_bytes,
        replaced: k.downsampled_in_records,
        made: k.downsampled_out_records,
        dropped: k.dropped_records(),
        held: k.pending_records(),
    }
}

fn median(mut runs: Vec<Run>) -> Run {
    runs.sort_by(|a, b| a.cpu.total_cmp(&b.cpu));
    runs[runs.len() / 2]
}

fn main() {
    let rounds = common::env_u64("BENCH_ROUNDS", 3).max(1) as usize;
    let base = std::env::var("BENCH_DIR").unwrap_or_else(|_| env!("CARGO_TARGET_TMPDIR").into());
    std::fs::create_dir_all(&base).expect("create BENCH_DIR");
    println!(
        "colibri downsample benchmark ({} cores; {rounds} rounds per mode; files under {base})",
        common::cores()
    );
    println!(
        "{} points of {SERIES} series every {STEP_MS} ms into a 4 MiB stream, {PER_APPEND} steps per append",
        STEPS * SERIES
    );
    let mut results = Vec::new();
    for mode in ["drop_oldest", "downsample"] {
        let r = median((0..rounds).map(|_| run(Path::new(&base), mode)).collect());
        println!(
            "  {mode:<12} CPU {:.2} s, written {:.1} MB ({:.1} MB of points appended); held {} points, dropped {}, replaced {} by {} aggregates",
            r.cpu,
            r.written as f64 / 1e6,
            r.appended_bytes as f64 / 1e6,
            r.held,
            r.dropped,
            r.replaced,
            r.made
        );
        results.push(r);
    }
    let (drop, ds) = (results[0], results[1]);
    let avg = ds.appended_bytes as f64 / (STEPS * SERIES) as f64;
    let replaced_mb = ds.replaced as f64 * avg / 1e6;
    println!(
        "  => downsampling {replaced_mb:.1} MB of points cost {:.3} CPU-s and {:.2} MB written per MB replaced, beyond drop_oldest",
        (ds.cpu - drop.cpu) / replaced_mb,
        (ds.written as f64 - drop.written as f64) / 1e6 / replaced_mb
    );
}
