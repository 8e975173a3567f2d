//! Ingest memory under the large-body attack: 16 clients POST 63 MiB NDJSON bodies at once to a
//! listener with `max_body: 64MiB`, each until it is stored (a 503 is sent again after its
//! `Retry-After`). Prints colibri's peak resident memory (VmHWM over its whole life) against its
//! idle figure and `ingest.max_memory`, how the requests were answered, and how long storing all
//! of them took. Figures, not assertions: see BENCHMARKS.md.
//!
//!   cargo bench --bench ingest_memory
//!   COLIBRI_BIN=path/to/colibri BENCH_OLD=1 cargo bench --bench ingest_memory   # a build without max_memory
//!
//! Scenarios, each on a fresh store: 16 x 63 MiB with `max_memory` 192MiB (the ceiling) and
//! 140MiB (just over what one 64MiB request may need); 16 x 4 MiB with the defaults
//! (`max_body: 4MiB`, `max_memory: 64MiB`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "../tests/it/util/client.rs"]
mod client;
mod common;

use client::Client;
use common::{bin, cores, log_lines, rss_kib, spawn_run, stop, wait_log};

const STREAM: &str = "bench";
const CLIENTS: usize = 16;
const RECORD_BYTES: usize = 1000;

fn main() {
    let old = std::env::var_os("BENCH_OLD").is_some();
    let base = PathBuf::from(
        std::env::var("BENCH_DIR").unwrap_or_else(|_| env!("CARGO_TARGET_TMPDIR").into()),
    )
    .join("ingest-memory-bench");
    println!(
        "colibri ingest memory benchmark ({} cores; {CLIENTS} clients at once, NDJSON records of {RECORD_BYTES} bytes; files under {})",
        cores(),
        base.display()
    );
    println!("binary: {}", bin());
    println!();
    let scenarios: &[(&str, u64, Option<u64>)] = if old {
        &[("max_body 64MiB, no memory budget (BENCH_OLD)", 64, None)]
    } else {
        &[
            ("max_body 64MiB, max_memory 192MiB", 64, Some(192)),
            ("max_body 64MiB, max_memory 140MiB", 64, Some(140)),
            ("defaults: max_body 4MiB, max_memory 64MiB", 4, Some(64)),
        ]
    };
    for &(name, max_body_mib, max_memory_mib) in scenarios {
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).expect("create the bench directory");
        let port = free_port();
        let cfg = write_config(&base, port, max_body_mib, max_memory_mib);
        // Just under max_body: the declared length is accepted.
        let size =
            (max_body_mib << 20) as usize - (1 << 20).min((max_body_mib << 20) as usize / 16);
        run(name, &cfg, port, Arc::new(body(size)));
    }
    let _ = std::fs::remove_dir_all(&base);
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("an address").port()
}

fn write_config(dir: &Path, port: u16, max_body_mib: u64, max_memory_mib: Option<u64>) -> PathBuf {
    let path = dir.join("colibri.yaml");
    let memory = max_memory_mib.map_or(String::new(), |m| format!(", max_memory: {m}MiB"));
    let text = format!(
        "data_dir: {}\n\
         storage: {{ min_free: 512MiB, max_bytes: 16GiB }}\n\
         log: {{ level: info, format: json }}\n\
         ingest: {{ listen: \"127.0.0.1:{port}\", max_body: {max_body_mib}MiB{memory}, read_timeout: 60s, wait: 5s }}\n\
         streams:\n  \
           {STREAM}: {{ batch: {{ max_records: 1000, max_bytes: 1MiB }}, max_jobs: 10000000, max_bytes: 8GiB }}\n",
        dir.join("data").display()
    );
    std::fs::write(&path, text).expect("write config");
    path
}

/// NDJSON records of RECORD_BYTES bytes (with a newline), `size` bytes at most.
fn body(size: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(size);
    let mut seq = 0u64;
    while out.len() + RECORD_BYTES <= size {
        let mut r = format!("{{\"seq\":{seq},\"pad\":\"").into_bytes();
        r.resize(RECORD_BYTES - 3, b'x');
        r.extend_from_slice(b"\"}\n");
        out.extend_from_slice(&r);
        seq += 1;
    }
    out
}

#[derive(Default)]
struct Seen {
    stored: bool,
    /// Answers other than 200, by status (each sent again after its Retry-After).
    refused: Vec<u16>,
    failed: Vec<String>,
}

/// Sends `body` until it is answered 200, at most 60 times.
fn client(addr: SocketAddr, body: Arc<Vec<u8>>) -> Seen {
    let mut seen = Seen::default();
    let mut c = Client::new(addr);
    c.timeout = Duration::from_secs(120);
    for _ in 0..60 {
        match c.post(
            &format!("/v1/streams/{STREAM}/records"),
            "application/x-ndjson",
            &[],
            &body,
        ) {
            Ok(a) if a.status == 200 => {
                seen.stored = true;
                break;
            }
            Ok(a) => {
                seen.refused.push(a.status);
                let wait: u64 = a
                    .header("retry-after")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(1);
                std::thread::sleep(Duration::from_secs(wait));
            }
            Err(e) => {
                seen.failed.push(e.to_string());
                c.close();
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
    seen
}

fn run(name: &str, cfg: &Path, port: u16, body: Arc<Vec<u8>>) {
    println!(
        "== {name}: {CLIENTS} x {:.1} MiB",
        body.len() as f64 / (1 << 20) as f64
    );
    let mut child = spawn_run(cfg);
    let pid = child.id();
    let logs = log_lines(&mut child);
    wait_log(&logs, "colibri started", Duration::from_secs(60));
    let (idle, _) = rss_kib(pid);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let t0 = Instant::now();
    let threads: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let body = Arc::clone(&body);
            std::thread::spawn(move || client(addr, body))
        })
        .collect();
    let seen: Vec<Seen> = threads
        .into_iter()
        .map(|t| t.join().expect("a client thread"))
        .collect();
    let secs = t0.elapsed().as_secs_f64();
    let (_, hwm) = rss_kib(pid);
    stop(child);
    let stored = seen.iter().filter(|s| s.stored).count();
    let mut refused: Vec<u16> = seen
        .iter()
        .flat_map(|s| s.refused.iter().copied())
        .collect();
    refused.sort_unstable();
    let failed: Vec<&String> = seen.iter().flat_map(|s| s.failed.iter()).collect();
    println!(
        "  {stored} of {CLIENTS} bodies stored in {secs:.1} s ({:.0} MB/s); {} answers refused (statuses {:?}), {} failed{}",
        stored as f64 * body.len() as f64 / 1e6 / secs,
        refused.len(),
        {
            let mut d = refused.clone();
            d.dedup();
            d
        },
        failed.len(),
        failed
            .first()
            .map_or(String::new(), |e| format!(" (first: {e})"))
    );
    println!(
        "  colibri: peak RSS {:.1} MB (idle {:.1} MB)",
        hwm as f64 / 1024.0,
        idle as f64 / 1024.0
    );
    println!();
}
