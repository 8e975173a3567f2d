//! The `prometheus_remote_write` sink draining a backlog into a real VictoriaMetrics (Debian's
//! `victoria-metrics`, on a loopback port), beside the `http` sink (`encoding: influx_line` to the
//! same server's `/write`) draining the same backlog: `BENCH_SAMPLES` (default 1,000,000) samples
//! of 700 series, queued with `colibri queue push` while no agent runs (the state after an
//! outage), then `colibri run` delivers them. Printed per sink: the drain time and records per
//! second, colibri's CPU seconds per million records, its peak resident memory (VmHWM), and the
//! rows VictoriaMetrics counted.
//!
//! Run: `cargo bench --bench remote_write` (`COLIBRI_BIN=<static build>` to measure the release
//! binary, `BENCH_SAMPLES=...`, `BENCH_DIR=...` for where the files go).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{admin_addr, bin, cores, cpu_secs, log_lines, metric, rss_kib, spawn_run, stop};

fn main() {
    let samples = common::env_u64("BENCH_SAMPLES", 1_000_000);
    let base = PathBuf::from(
        std::env::var("BENCH_DIR").unwrap_or_else(|_| env!("CARGO_TARGET_TMPDIR").into()),
    )
    .join("remote-write-bench");
    println!(
        "colibri remote write benchmark ({} cores; {samples} samples of 700 series; files under {})",
        cores(),
        base.display()
    );
    println!("binary: {}", bin());
    let lines = backlog(samples);
    for (name, sink) in [
        (
            "prometheus_remote_write",
            "{ type: prometheus_remote_write, url: \"http://127.0.0.1:PORT/api/v1/write\" }",
        ),
        (
            "http influx_line",
            "{ type: http, url: \"http://127.0.0.1:PORT/write\", encoding: influx_line, precision: ms }",
        ),
    ] {
        drain(
            &base.join(name.replace(' ', "-")),
            name,
            sink,
            &lines,
            samples,
        );
    }
}

/// `n` line-protocol samples, a millisecond apart, ending now: 100 hosts x 7 lines.
fn backlog(n: u64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64;
    let mut out = String::with_capacity(n as usize * 64);
    for i in 0..n {
        let ts = now - (n - i);
        out.push_str(&format!(
            "plant,host=h{},line=l{} temperature={} {ts}\n",
            i % 100,
            i % 7,
            i % 1000
        ));
    }
    out
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("an address")
        .port()
}

/// Starts VictoriaMetrics and waits until it answers.
fn victoria(dir: &Path, port: u16) -> Child {
    let mut child = Command::new("victoria-metrics")
        .arg(format!("-storageDataPath={}", dir.join("vm").display()))
        .arg(format!("-httpListenAddr=127.0.0.1:{port}"))
        .arg("-retentionPeriod=100y")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("victoria-metrics (Debian's package; scripts/test.sh installs it)");
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return child;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("victoria-metrics did not listen within 30 s");
}

/// The sum of VictoriaMetrics' `vm_rows_inserted_total` series.
fn rows_inserted(port: u16) -> f64 {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    common::metric_sum(addr, "vm_rows_inserted_total", "").unwrap_or(0.0)
}

fn drain(dir: &Path, name: &str, sink: &str, lines: &str, samples: u64) {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).expect("bench dir");
    let port = free_port();
    let mut vm = victoria(dir, port);
    let config = dir.join("colibri.yaml");
    std::fs::write(
        &config,
        format!(
            "data_dir: {}\nlog: {{ format: json }}\nsinks:\n  tsdb: {}\nstreams:\n  m: {{ sink: tsdb }}\n",
            dir.join("data").display(),
            sink.replace("PORT", &port.to_string())
        ),
    )
    .expect("config");
    let mut push = Command::new(bin())
        .args(["queue", "push", "m", "--config"])
        .arg(&config)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("colibri queue push");
    push.stdin
        .take()
        .expect("stdin")
        .write_all(lines.as_bytes())
        .expect("push the backlog");
    assert!(push.wait().expect("push").success(), "queue push failed");

    let t0 = Instant::now();
    let mut child = spawn_run(&config);
    let pid = child.id();
    let logs = log_lines(&mut child);
    let admin = admin_addr(&logs);
    let limit = Duration::from_secs(600);
    let delivered = || {
        metric(
            admin,
            "colibri_stream_delivered_records_total{stream=\"m\"}",
        )
        .unwrap_or(0.0) as u64
    };
    let mut peak_kib = 0;
    while delivered() < samples && t0.elapsed() < limit {
        peak_kib = peak_kib.max(rss_kib(pid).1);
        std::thread::sleep(Duration::from_millis(100));
    }
    let secs = t0.elapsed().as_secs_f64();
    let got = delivered();
    let cpu = cpu_secs(pid);
    peak_kib = peak_kib.max(rss_kib(pid).1);
    stop(child);
    assert!(
        got >= samples,
        "{name}: only {got} of {samples} delivered within {limit:?}"
    );
    // VictoriaMetrics counts rows as it takes them in; give it a moment to flush its counters.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut rows = rows_inserted(port);
    while rows < samples as f64 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        rows = rows_inserted(port);
    }
    let _ = vm.kill();
    let _ = vm.wait();
    println!(
        "{name}: drained {got} in {secs:.2} s = {:.0} records/s; CPU {:.2} s = {:.2} CPU-s per million; peak RSS {:.1} MB; VictoriaMetrics rows inserted {rows:.0}",
        got as f64 / secs,
        cpu,
        cpu / got as f64 * 1e6,
        peak_kib as f64 / 1024.0,
    );
}
