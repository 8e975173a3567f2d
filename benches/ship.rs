//! Shipping benchmark: the real binary ships BENCH_FILES (100) files of 1-50 MB (seeded sizes and
//! content) from a directory to a local receiver that digests each upload with SHA-256 and keeps
//! nothing (tests/it/util/http). The receiver refuses connections while every file is spooled, then
//! answers 503 for a few seconds, then accepts. Prints the drain rate, colibri's peak resident memory
//! (which must not grow with file sizes: uploads are streamed from disk) and its CPU time, and checks
//! every file arrived intact. Figures, not assertions on time: see BENCHMARKS.md.
//!
//!   cargo bench --bench ship
//!   BENCH_FILES=20 BENCH_MAX_MB=10 cargo bench --bench ship     # quicker
//!   COLIBRI_BIN=path/to/static/colibri cargo bench --bench ship

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

mod common;
#[path = "../tests/it/util/http/mod.rs"]
mod http;

use common::{bin, cores, cpu_secs, env_u64, log_lines, rss_kib, spawn_run, stop, wait_log};
use http::{Mode, Receiver, hex};

#[expect(
    clippy::too_many_lines,
    reason = "the benchmark's script, read top to bottom"
)]
fn main() {
    let files = env_u64("BENCH_FILES", 100) as usize;
    let max_mb = env_u64("BENCH_MAX_MB", 50) as usize;
    let base = PathBuf::from(
        std::env::var("BENCH_DIR").unwrap_or_else(|_| env!("CARGO_TARGET_TMPDIR").into()),
    )
    .join("ship-bench");
    let _ = std::fs::remove_dir_all(&base);
    let from = base.join("in");
    std::fs::create_dir_all(&from).expect("create the bench directory");
    println!(
        "colibri shipping benchmark ({} cores; {files} files of 1-{max_mb} MB under {})",
        cores(),
        base.display()
    );
    println!("binary: {}", bin());
    let t = Instant::now();
    let expected = make_files(&from, files, max_mb);
    let total: u64 = expected.values().map(|(len, _)| *len).sum();
    println!(
        "  wrote {:.0} MB in {:.1} s",
        total as f64 / 1e6,
        t.elapsed().as_secs_f64()
    );

    let rx = Receiver::start_digesting();
    rx.set_mode(Mode::Refuse);
    let cfg = base.join("colibri.yaml");
    std::fs::write(
        &cfg,
        format!(
            "data_dir: {data}\n\
             log: {{ format: json }}\n\
             storage: {{ max_bytes: 64GiB, min_free: 1GiB }}\n\
             sinks:\n  up: {{ type: http, url: \"{url}\", timeout: 60s, retry: {{ base: 200ms, cap: 1s, max_attempts: 1000 }}, link: {{ down_after: 1, backoff_base: 200ms, backoff_cap: 1s }} }}\n\
             streams:\n  files: {{ sink: up, max_bytes: 32GiB }}\n\
             tasks:\n  - {{ name: ship, type: file_move, every: 1s, from: {from}, pattern: [\"*.bin\"], to_stream: files, settle: 1s, timeout: 10s }}\n",
            data = base.join("data").display(),
            url = rx.url("/upload"),
            from = from.display(),
        ),
    )
    .expect("write config");
    let mut child = spawn_run(&cfg);
    let pid = child.id();
    let logs = log_lines(&mut child);
    wait_log(&logs, "colibri started", Duration::from_secs(60));
    let spooled = Instant::now();
    while std::fs::read_dir(&from).map_or(0, |d| d.count()) > 0 {
        assert!(
            spooled.elapsed() < Duration::from_secs(300),
            "files not spooled"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    println!(
        "  every file spooled and queued {:.2} s after start (the link is down)",
        spooled.elapsed().as_secs_f64()
    );
    std::thread::sleep(Duration::from_secs(2));
    rx.set_mode(Mode::Status(503));
    std::thread::sleep(Duration::from_secs(3));
    let (cpu0, t0) = (cpu_secs(pid), Instant::now());
    rx.set_mode(Mode::Accept);
    let mut peak_sampled = 0;
    let deadline = t0 + Duration::from_secs(1200);
    loop {
        let ok = rx
            .requests()
            .iter()
            .filter(|r| r.status == Some(200))
            .count();
        peak_sampled = peak_sampled.max(rss_kib(pid).0);
        if ok >= files || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu = cpu_secs(pid) - cpu0;
    let (_, hwm) = rss_kib(pid);
    stop(child);
    let mut got = BTreeMap::new();
    for r in rx.requests().into_iter().filter(|r| r.status == Some(200)) {
        let cd = r.header("content-disposition").expect("a name").to_string();
        let start = cd.find("filename=\"").expect("filename") + 10;
        let name = cd[start..start + cd[start..].find('"').expect("quote")].to_string();
        got.insert(name, (r.wire_len as u64, r.sha256.clone().expect("digest")));
    }
    let intact = expected
        .iter()
        .filter(|(n, v)| got.get(*n) == Some(v))
        .count();
    let refused = rx
        .requests()
        .iter()
        .filter(|r| r.status == Some(503))
        .count();
    println!(
        "  {intact} of {files} files arrived intact ({refused} requests answered 503 first); {:.0} MB in {secs:.1} s after the receiver accepted: {:.0} MB/s",
        total as f64 / 1e6,
        total as f64 / 1e6 / secs
    );
    println!(
        "  colibri: peak RSS {:.1} MB over its life (sampled during the drain: {:.1} MB), {cpu:.2} CPU-s for the drain ({:.2} CPU-s per GB)",
        hwm as f64 / 1024.0,
        peak_sampled as f64 / 1024.0,
        cpu / (total as f64 / 1e9)
    );
    assert_eq!(intact, files, "every file must arrive intact");
    let _ = std::fs::remove_dir_all(&base);
}

/// `n` files of seeded sizes (1..=max MB) and content; name -> (length, SHA-256).
fn make_files(dir: &Path, n: usize, max_mb: usize) -> BTreeMap<String, (u64, String)> {
    let mut rng = fastrand::Rng::with_seed(1);
    let mut out = BTreeMap::new();
    let mut buf = vec![0u8; 1 << 20];
    for i in 0..n {
        let name = format!("file-{i:03}.bin");
        let len = rng.usize(1 << 20..=max_mb << 20);
        let path = dir.join(&name);
        let mut f = std::fs::File::create(&path).expect("create");
        let mut h = ring::digest::Context::new(&ring::digest::SHA256);
        let mut left = len;
        while left > 0 {
            let k = left.min(buf.len());
            rng.fill(&mut buf[..k]);
            std::io::Write::write_all(&mut f, &buf[..k]).expect("write");
            h.update(&buf[..k]);
            left -= k;
        }
        f.set_modified(SystemTime::now() - Duration::from_secs(60))
            .expect("age");
        out.insert(name, (len as u64, hex(h.finish().as_ref())));
    }
    out
}
