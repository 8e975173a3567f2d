//! Syslog source benchmark: senders write syslog over TCP to the real binary as fast as it reads,
//! and a message counts once the stream has committed it (`colibri_syslog_records_total`, read
//! from the admin endpoint). Prints, per scenario, messages/s from the first byte to the last
//! commit, colibri's CPU seconds per million and its peak resident memory. Figures, not
//! assertions: see BENCHMARKS.md.
//!
//!   cargo bench --bench syslog
//!   BENCH_RECORDS=200000 cargo bench --bench syslog                   # quicker
//!   COLIBRI_BIN=path/to/static/colibri cargo bench --bench syslog     # measure another build
//!
//! Messages are RFC 5424 with structured data (~150 bytes) or RFC 3164 (~90 bytes), newline
//! framed or octet-counted; the stream only queues (its sink is elsewhere). Scenarios, each on a
//! fresh store: one connection (RFC 5424, newline), one connection (RFC 5424, octet counting, as
//! rsyslog forwards), one connection (RFC 3164), and 4 connections (RFC 5424) at once.

use std::io::Write as _;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod common;

use common::{
    admin_addr, bin, cores, cpu_secs, env_u64, log_lines, metric, rss_kib, spawn_run, stop,
};

fn main() {
    let n = env_u64("BENCH_RECORDS", 1_000_000);
    let base = PathBuf::from(
        std::env::var("BENCH_DIR").unwrap_or_else(|_| env!("CARGO_TARGET_TMPDIR").into()),
    )
    .join("syslog-bench");
    println!(
        "colibri syslog benchmark ({} cores; {n} messages per scenario; files under {})",
        cores(),
        base.display()
    );
    println!("binary: {}", bin());
    println!();
    for (name, conns, format) in [
        (
            "1 connection, RFC 5424, newline framing",
            1,
            Format::Rfc5424,
        ),
        ("1 connection, RFC 5424, octet counting", 1, Format::Octets),
        (
            "1 connection, RFC 3164, newline framing",
            1,
            Format::Rfc3164,
        ),
        (
            "4 connections, RFC 5424, newline framing",
            4,
            Format::Rfc5424,
        ),
    ] {
        run(&base, name, n, conns, format);
    }
}

#[derive(Clone, Copy)]
enum Format {
    Rfc5424,
    Octets,
    Rfc3164,
}

/// `count` messages of sender `conn`, as the wire carries them.
fn messages(conn: usize, count: u64, format: Format) -> Vec<u8> {
    let mut out = Vec::with_capacity(count as usize * 160);
    let mut line = String::new();
    for i in 0..count {
        line.clear();
        match format {
            Format::Rfc5424 | Format::Octets => {
                use std::fmt::Write as _;
                let _ = write!(
                    line,
                    "<134>1 2026-12-02T10:00:00.{:03}Z gw-17 plc {conn} TEMP [meter@32473 line=\"{conn}\" seq=\"{i}\"] temperature 21.5 C on line {conn}",
                    i % 1000
                );
            }
            Format::Rfc3164 => {
                use std::fmt::Write as _;
                let _ = write!(
                    line,
                    "<134>Dec  2 10:00:00 gw-17 plc[{conn}]: seq {i} temperature 21.5 C"
                );
            }
        }
        if let Format::Octets = format {
            let _ = write!(out, "{} ", line.len());
            out.extend_from_slice(line.as_bytes());
        } else {
            out.extend_from_slice(line.as_bytes());
            out.push(b'\n');
        }
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

fn run(base: &Path, name: &str, n: u64, conns: usize, format: Format) {
    let dir = base.join("run");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("bench dir");
    let port = free_port();
    let config = dir.join("colibri.yaml");
    std::fs::write(
        &config,
        format!(
            "data_dir: {}\nlog: {{ format: json }}\nadmin: {{ listen: \"127.0.0.1:0\" }}\n\
             streams:\n  logs: {{ max_bytes: 4GiB, max_jobs: 1000000 }}\n\
             sources:\n  plant: {{ type: syslog, stream: logs, tcp: \"127.0.0.1:{port}\" }}\n",
            dir.join("data").display()
        ),
    )
    .expect("config");
    let per_conn = n / conns as u64;
    let payloads: Vec<Vec<u8>> = (0..conns).map(|c| messages(c, per_conn, format)).collect();
    let bytes: usize = payloads.iter().map(Vec::len).sum();
    let total = per_conn * conns as u64;
    let mut child = spawn_run(&config);
    let pid = child.id();
    let logs = log_lines(&mut child);
    let admin = admin_addr(&logs);
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("an address");
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(addr).is_err() {
        assert!(
            Instant::now() < deadline,
            "the syslog listener did not open"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The probe above was one connection: it sent nothing.
    let cpu0 = cpu_secs(pid);
    let t0 = Instant::now();
    let senders: Vec<_> = payloads
        .into_iter()
        .map(|p| {
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(addr).expect("connect");
                s.write_all(&p).expect("send");
            })
        })
        .collect();
    let committed = || metric(admin, "colibri_syslog_records_total{").unwrap_or(0.0) as u64;
    let limit = Duration::from_secs(900);
    let mut peak_kib = 0;
    while committed() < total && t0.elapsed() < limit {
        peak_kib = peak_kib.max(rss_kib(pid).1);
        std::thread::sleep(Duration::from_millis(50));
    }
    let secs = t0.elapsed().as_secs_f64();
    for s in senders {
        s.join().expect("sender");
    }
    let got = committed();
    let cpu = cpu_secs(pid) - cpu0;
    peak_kib = peak_kib.max(rss_kib(pid).1);
    stop(child);
    assert!(
        got >= total,
        "{name}: only {got} of {total} committed within {limit:?}"
    );
    println!(
        "{name}: {got} messages ({:.0} MB) in {secs:.2} s = {:.0} messages/s; CPU {cpu:.2} s = {:.2} CPU-s per million; peak RSS {:.1} MB",
        bytes as f64 / 1e6,
        got as f64 / secs,
        cpu / got as f64 * 1e6,
        peak_kib as f64 / 1024.0,
    );
    let _ = std::fs::remove_dir_all(&dir);
}
