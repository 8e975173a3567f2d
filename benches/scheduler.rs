//! Scheduler benchmark: spawns the real `colibri` binary (built with the bench profile) and prints
//! start-to-first-run time, resident memory and CPU seconds while idle with 200 and 10,000 scheduled
//! tasks, and what 10,000 busy interval tasks cost. Figures, not assertions: see BENCHMARKS.md.
//!
//!   cargo bench --bench scheduler                    # 60 s idle windows
//!   BENCH_IDLE_SECS=10 cargo bench --bench scheduler # quicker, noisier
//!   COLIBRI_BIN=path/to/static/colibri cargo bench --bench scheduler   # measure another build

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod common;

use common::{bin, cores, rss_kib, spawn_run, stop};

fn main() {
    let idle_secs: u64 = std::env::var("BENCH_IDLE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let dir = tempfile::tempdir().expect("temp dir");
    println!(
        "colibri scheduler benchmark ({} cores, idle window {idle_secs} s, binary {})",
        cores(),
        bin()
    );
    println!();
    start_to_first_run(dir.path());
    for n in [200, 10_000] {
        idle(dir.path(), n, idle_secs);
    }
    busy(dir.path(), 10_000, idle_secs.max(60));
}

/// Writes a config; logs at INFO in JSON so the bench can read readiness and run events.
fn write_config(dir: &Path, name: &str, body: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    let text = format!(
        "data_dir: {}\nworkers: 64\nshutdown_grace: 15s\nlog: {{ level: info, format: json }}\n{body}",
        dir.join("data").display()
    );
    std::fs::write(&path, text).expect("write config");
    path
}

/// CPU seconds a process has run, summed over its threads, from the scheduler's nanosecond counters
/// (`/proc/PID/task/*/schedstat`): clock-tick accounting (`utime`) is too coarse for an idle process.
fn cpu_secs(pid: u32) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0.0;
    };
    let ns: u64 = tasks
        .filter_map(Result::ok)
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| {
            s.split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
        })
        .sum();
    ns as f64 / 1e9
}

fn wait_for_line(child: &mut Child, needle: &str, limit: Duration) -> Option<Instant> {
    let stderr = child.stderr.take().expect("piped stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    let needle = needle.to_string();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains(&needle) {
                let _ = tx.send(Instant::now());
            }
        }
    });
    rx.recv_timeout(limit).ok()
}

fn start_to_first_run(dir: &Path) {
    let stamp = dir.join("first-run");
    let cfg = write_config(
        dir,
        "first.yaml",
        &format!(
            "tasks:\n  - {{ name: first, type: exec, schedule: \"@reboot\", command: [/bin/sh, -c, \"date +%s%N > {}\"] }}\n",
            stamp.display()
        ),
    );
    let mut samples = Vec::new();
    for _ in 0..10 {
        let _ = std::fs::remove_file(&stamp);
        let t0 = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_nanos();
        let child = spawn_run(&cfg);
        let deadline = Instant::now() + Duration::from_secs(10);
        let ran_at = loop {
            if let Ok(s) = std::fs::read_to_string(&stamp)
                && let Ok(ns) = s.trim().parse::<u128>()
            {
                break ns;
            }
            assert!(Instant::now() < deadline, "first run did not happen");
            std::thread::sleep(Duration::from_millis(1));
        };
        samples.push((ran_at.saturating_sub(t0)) as f64 / 1e6);
        stop(child);
    }
    samples.sort_by(f64::total_cmp);
    println!(
        "start to first run (@reboot task, spawn -> the task's own timestamp): median {:.1} ms, max {:.1} ms over {} starts",
        samples[samples.len() / 2],
        samples[samples.len() - 1],
        samples.len()
    );
}

fn idle(dir: &Path, n: usize, secs: u64) {
    // Half crontab, half long intervals: all scheduled, none due within the window.
    let mut body = String::from("tasks:\n");
    for i in 0..n {
        if i % 2 == 0 {
            body.push_str(&format!("  - {{ name: t{i}, type: exec, schedule: \"{} {} 1 1 *\", command: [/bin/true] }}\n", i % 60, i % 24));
        } else {
            body.push_str(&format!(
                "  - {{ name: t{i}, type: exec, every: 24h, offset: 12h, command: [/bin/true] }}\n"
            ));
        }
    }
    let cfg = write_config(dir, &format!("idle-{n}.yaml"), &body);
    let t0 = Instant::now();
    let mut child = spawn_run(&cfg);
    let ready = wait_for_line(&mut child, "colibri started", Duration::from_secs(60));
    let ready_ms = ready.map(|t| (t - t0).as_secs_f64() * 1e3);
    std::thread::sleep(Duration::from_secs(2)); // let start-up allocations settle
    let pid = child.id();
    let cpu0 = cpu_secs(pid);
    let w0 = Instant::now();
    std::thread::sleep(Duration::from_secs(secs));
    let cpu = cpu_secs(pid) - cpu0;
    let wall = w0.elapsed().as_secs_f64();
    let (rss, hwm) = rss_kib(pid);
    stop(child);
    println!(
        "idle with {n:>6} tasks: start to ready {}, resident {:.2} MB (peak {:.2} MB), CPU {:.6} s over {:.0} s = {:.5} %",
        ready_ms.map_or("n/a".into(), |m| format!("{m:.1} ms")),
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0,
        cpu,
        wall,
        100.0 * cpu / wall
    );
}

fn busy(dir: &Path, n: usize, secs: u64) {
    let mut body = String::from("tasks:\n");
    for i in 0..n {
        body.push_str(&format!(
            "  - {{ name: b{i}, type: exec, every: 60s, offset: random, command: [/bin/true] }}\n"
        ));
    }
    let cfg = write_config(dir, "busy.yaml", &body);
    let mut child = spawn_run(&cfg);
    let stderr = child.stderr.take().expect("piped stderr");
    let counter = std::thread::spawn(move || {
        let (mut runs, mut max_late, mut skipped) = (0u64, 0u64, 0u64);
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            if v["message"] == "task run finished" {
                runs += 1;
                max_late = max_late.max(v["late_ms"].as_u64().unwrap_or(0));
            } else if v["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("run skipped"))
            {
                skipped += 1;
            }
        }
        (runs, max_late, skipped)
    });
    let pid = child.id();
    let cpu0 = cpu_secs(pid);
    std::thread::sleep(Duration::from_secs(secs));
    let cpu = cpu_secs(pid) - cpu0;
    let (rss, hwm) = rss_kib(pid);
    stop(child);
    let (runs, max_late, skipped) = counter.join().expect("counter thread");
    println!(
        "busy with {n:>6} tasks every 60 s (random offsets) for {secs} s: {runs} runs ({:.0}/s), max lateness {max_late} ms, {skipped} skipped, \
         resident {:.2} MB (peak {:.2} MB), colibri CPU {cpu:.2} s",
        runs as f64 / secs as f64,
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0,
    );
}
