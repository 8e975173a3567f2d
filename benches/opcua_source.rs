//! OPC UA source benchmark: data changes from a real OPC UA server (PyPI's asyncua, the tests'
//! fixture `tests/fixtures/opcua_server.py`, which scripts/test.sh installs) subscribed by the
//! real binary into a durable stream, each notification acknowledged only after its commit. A
//! change counts once committed (`colibri_opcua_source_records_total`, read from the admin
//! endpoint). Prints, per scenario, records/s, colibri's CPU seconds per second of the run and its
//! peak resident memory. Figures, not assertions: see BENCHMARKS.md.
//!
//!   cargo bench --bench opcua_source
//!   BENCH_SECS=10 cargo bench --bench opcua_source                      # quicker
//!   COLIBRI_BIN=path/to/static/colibri cargo bench --bench opcua_source  # measure another build
//!
//! Scenarios, each on a fresh store and server: 10,000 monitored items sampled every second (the
//! server writes every one of them each second), and 100 items sampled every 10 ms (written every
//! 10 ms). The server is Python: where it cannot write as fast as asked, the records/s show what it
//! managed, and colibri's CPU is per record as well as per second.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{
    admin_addr, bin, cores, cpu_secs, env_u64, log_lines, metric, rss_kib, spawn_run, stop,
    wait_log,
};

fn main() {
    let secs = env_u64("BENCH_SECS", 30);
    let base = PathBuf::from(
        std::env::var("BENCH_DIR").unwrap_or_else(|_| env!("CARGO_TARGET_TMPDIR").into()),
    )
    .join("opcua-source-bench");
    println!(
        "colibri opcua source benchmark ({} cores; {secs} s per scenario; files under {})",
        cores(),
        base.display()
    );
    println!("binary: {}", bin());
    println!();
    run(&base, 10_000, 1000, "1s", "1s", secs);
    run(&base, 100, 10, "10ms", "100ms", secs);
}

/// The python with asyncua: `COLIBRI_TEST_PYTHON`, else scripts/test.sh's venv.
fn python() -> String {
    std::env::var("COLIBRI_TEST_PYTHON").unwrap_or_else(|_| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("target/test-venv/bin/python3")
            .display()
            .to_string()
    })
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("an address")
        .port()
}

fn server(port: u16, count: usize, period_ms: u64) -> Child {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/opcua_server.py");
    let child = Command::new(python())
        .arg(script)
        .args([port.to_string(), count.to_string(), period_ms.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3 with asyncua (scripts/test.sh installs it)");
    let deadline = Instant::now() + Duration::from_secs(120);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "the OPC UA server did not listen"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

fn run(base: &Path, count: usize, period_ms: u64, sampling: &str, publishing: &str, secs: u64) {
    let dir = base.join("run");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("bench dir");
    let port = free_port();
    let mut srv = server(port, count, period_ms);
    let nodes: String = (0..count)
        .map(|i| format!("      - {{ id: \"nsu=urn:colibri:test;s=v{i}\" }}\n"))
        .collect();
    let config = dir.join("colibri.yaml");
    std::fs::write(
        &config,
        format!(
            "data_dir: {}\nlog: {{ format: json }}\nadmin: {{ listen: \"127.0.0.1:0\" }}\n\
             streams:\n  plant: {{ max_bytes: 4GiB, max_jobs: 1000000 }}\n\
             sources:\n  plc:\n    type: opcua\n    url: opc.tcp://127.0.0.1:{port}/\n    stream: plant\n\
             \x20   publishing_interval: {publishing}\n    sampling_interval: {sampling}\n    nodes:\n{nodes}",
            dir.join("data").display()
        ),
    )
    .expect("config");
    let mut child = spawn_run(&config);
    let logs = log_lines(&mut child);
    let admin = admin_addr(&logs);
    wait_log(&logs, "opcua session started", Duration::from_secs(300));
    let committed = || metric(admin, "colibri_opcua_source_records_total{").unwrap_or(0.0);
    // The first reports (every item's current value) are not the steady state: a second later.
    std::thread::sleep(Duration::from_secs(2));
    let pid = child.id();
    let (t0, cpu0, n0) = (Instant::now(), cpu_secs(pid), committed());
    let mut peak_kib = 0;
    while t0.elapsed() < Duration::from_secs(secs) {
        peak_kib = peak_kib.max(rss_kib(pid).1);
        std::thread::sleep(Duration::from_millis(200));
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let (cpu, n) = (cpu_secs(pid) - cpu0, committed() - n0);
    peak_kib = peak_kib.max(rss_kib(pid).1);
    stop(child);
    let _ = srv.kill();
    let _ = srv.wait();
    println!(
        "{count} items, sampled every {sampling}, published every {publishing}: {:.0} records/s (asked {:.0}); colibri {:.3} CPU-s per s = {:.2} CPU-s per million records; peak RSS {:.1} MB",
        n / elapsed,
        count as f64 * 1000.0 / period_ms as f64,
        cpu / elapsed,
        cpu / n.max(1.0) * 1e6,
        peak_kib as f64 / 1024.0,
    );
    let _ = std::fs::remove_dir_all(&dir);
}
