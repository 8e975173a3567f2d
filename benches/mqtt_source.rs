//! MQTT source benchmark: QoS 1 messages from Debian's mosquitto into a durable stream through
//! the real binary, each acknowledged only after the commit that holds it. A message counts once
//! the stream has committed it (`colibri_mqtt_source_records_total`, read from the admin
//! endpoint). Prints, per scenario, messages/s, colibri's CPU seconds per million and its peak
//! resident memory. Figures, not assertions: see BENCHMARKS.md.
//!
//!   cargo bench --bench mqtt_source
//!   BENCH_RECORDS=200000 cargo bench --bench mqtt_source                # quicker
//!   COLIBRI_BIN=path/to/static/colibri cargo bench --bench mqtt_source  # measure another build
//!
//! With acknowledgement after commit, a QoS 1 subscriber is bounded by the broker's in-flight
//! window divided by the commit time. The window is colibri's `max_in_flight` (the Receive
//! Maximum it sends; mosquitto keeps to it for MQTT 5 clients). Scenarios, each on a fresh store
//! and broker: a backlog published while colibri was stopped, drained at windows of 20
//! (mosquitto's `max_inflight_messages` default, what MQTT 3.1.1 clients get), 1,000 (colibri's
//! default) and 5,000; and messages published while colibri runs (the publisher's own pace
//! included), at 1,000.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

mod common;
#[path = "../tests/it/util/mqtt_publish.rs"]
mod mqtt_publish;

use common::{
    admin_addr, bin, cores, cpu_secs, env_u64, log_lines, metric, rss_kib, spawn_run, stop,
    wait_log,
};
use mqtt_publish::{Publish, publish};

fn main() {
    let n = env_u64("BENCH_RECORDS", 1_000_000);
    let base = PathBuf::from(
        std::env::var("BENCH_DIR").unwrap_or_else(|_| env!("CARGO_TARGET_TMPDIR").into()),
    )
    .join("mqtt-source-bench");
    println!(
        "colibri mqtt source benchmark ({} cores; {n} QoS 1 messages of ~100 bytes per scenario; files under {})",
        cores(),
        base.display()
    );
    println!("binary: {}", bin());
    println!();
    run(&base, "backlog, window 20", n, 20, true);
    run(&base, "backlog, window 1000 (the default)", n, 1000, true);
    run(&base, "backlog, window 5000", n, 5000, true);
    run(&base, "online, window 1000", n, 1000, false);
    reference(&base, n);
}

/// The same online traffic to `mosquitto_sub` (QoS 1, acknowledging at once, writing nowhere):
/// what this machine carries from the publisher through mosquitto to a subscriber that stores
/// nothing, beside colibri's online figure.
fn reference(base: &Path, n: u64) {
    let dir = base.join("run");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("bench dir");
    let port = free_port();
    let mut broker = mosquitto(&dir, port);
    let mut sub = Command::new("mosquitto_sub")
        .args([
            "-h",
            "127.0.0.1",
            "-V",
            "mqttv5",
            "-q",
            "1",
            "-p",
            &port.to_string(),
        ])
        .args(["-t", "plant/#", "-C", &n.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("mosquitto_sub (Debian's mosquitto-clients)");
    std::thread::sleep(Duration::from_millis(500));
    let t0 = Instant::now();
    send(port, n);
    let status = sub.wait().expect("mosquitto_sub");
    let secs = t0.elapsed().as_secs_f64();
    let _ = broker.kill();
    let _ = broker.wait();
    assert!(status.success(), "mosquitto_sub: {status}");
    println!(
        "reference, online to mosquitto_sub instead of colibri: {n} messages in {secs:.2} s = {:.0} messages/s",
        n as f64 / secs
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("an address")
        .port()
}

/// A mosquitto on `port` that keeps every message for an absent session (its other settings,
/// `max_inflight_messages` among them, are Debian's defaults).
fn mosquitto(dir: &Path, port: u16) -> Child {
    let conf = dir.join("mosquitto.conf");
    std::fs::write(
        &conf,
        format!("listener {port} 127.0.0.1\nallow_anonymous true\nmax_queued_messages 0\n"),
    )
    .expect("mosquitto.conf");
    let bin = ["/usr/sbin/mosquitto", "mosquitto"]
        .into_iter()
        .find(|b| Path::new(b).exists())
        .unwrap_or("mosquitto");
    let child = Command::new(bin)
        .arg("-c")
        .arg(&conf)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("mosquitto (Debian's package; scripts/test.sh installs it)");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "mosquitto did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

fn send(port: u16, n: u64) {
    let p = Publish {
        window: 1000,
        ..Publish::new(port, "plant/line-1/meter", n)
    };
    let pad = "x".repeat(60);
    publish(
        &p,
        |i| format!("{{\"seq\":{i},\"kwh\":{}.5,\"pad\":\"{pad}\"}}", i % 1000).into_bytes(),
        &Arc::new(AtomicU64::new(0)),
        Duration::from_secs(1800),
    )
    .expect("published");
}

/// `window`: the source's `max_in_flight` (MQTT 5's Receive Maximum, which mosquitto keeps to).
fn run(base: &Path, name: &str, n: u64, window: u16, backlog: bool) {
    let dir = base.join("run");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("bench dir");
    let port = free_port();
    let mut broker = mosquitto(&dir, port);
    let config = dir.join("colibri.yaml");
    std::fs::write(
        &config,
        format!(
            "data_dir: {}\nlog: {{ format: json }}\nadmin: {{ listen: \"127.0.0.1:0\" }}\n\
             streams:\n  meters: {{ max_bytes: 4GiB, max_jobs: 1000000 }}\n\
             sources:\n  floor: {{ type: mqtt, url: \"mqtt://127.0.0.1:{port}\", topics: [\"plant/#\"], stream: meters, max_in_flight: {window} }}\n",
            dir.join("data").display()
        ),
    )
    .expect("config");
    // A first life subscribes: the broker keeps the session (and what is published for it).
    let mut child = spawn_run(&config);
    let mut logs = log_lines(&mut child);
    let mut admin = admin_addr(&logs);
    wait_log(&logs, "mqtt source subscribed", Duration::from_secs(30));
    let mut published = None;
    if backlog {
        stop(child);
        let t = Instant::now();
        send(port, n);
        published = Some(t.elapsed());
        child = spawn_run(&config);
        logs = log_lines(&mut child);
    }
    // A backlog is measured from the start of the process that drains it.
    let (t0, cpu0) = (
        Instant::now(),
        if backlog { 0.0 } else { cpu_secs(child.id()) },
    );
    let pid = child.id();
    if backlog {
        admin = admin_addr(&logs);
    }
    let publisher = (!backlog).then(|| std::thread::spawn(move || send(port, n)));
    let committed = || metric(admin, "colibri_mqtt_source_records_total{").unwrap_or(0.0) as u64;
    let limit = Duration::from_secs(1800);
    let mut peak_kib = 0;
    while committed() < n && t0.elapsed() < limit {
        peak_kib = peak_kib.max(rss_kib(pid).1);
        std::thread::sleep(Duration::from_millis(50));
    }
    let secs = t0.elapsed().as_secs_f64();
    if let Some(p) = publisher {
        p.join().expect("publisher");
    }
    let got = committed();
    let cpu = cpu_secs(pid) - cpu0;
    peak_kib = peak_kib.max(rss_kib(pid).1);
    stop(child);
    let _ = broker.kill();
    let _ = broker.wait();
    assert!(
        got >= n,
        "{name}: only {got} of {n} committed within {limit:?}"
    );
    let preload = published.map_or(String::new(), |t| {
        format!(" (published beforehand in {:.1} s)", t.as_secs_f64())
    });
    println!(
        "{name}: {got} messages in {secs:.2} s = {:.0} messages/s{preload}; CPU {cpu:.2} s = {:.2} CPU-s per million; peak RSS {:.1} MB",
        got as f64 / secs,
        cpu / got as f64 * 1e6,
        peak_kib as f64 / 1024.0,
    );
    let _ = std::fs::remove_dir_all(&dir);
}
