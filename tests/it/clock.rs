//! Time you can trust (issue 34): a stream with `hold_until_clock_synced` keeps what is appended
//! while the kernel says the wall clock is unsynchronised, across a kill -9, and delivers it once
//! the clock is synchronised, with the times colibri gave the records corrected by the error the
//! clock had. The clock is the binary's test seam (`COLIBRI_FAKE_CLOCK`: the kernel's answer and
//! the wall clock's error); the receiver is a real VictoriaMetrics.

use std::path::Path;

use crate::lanes::{sample, scrape};
use crate::tsdb::{Vm, free_port, now_ms};
use crate::util::client::Client;
use crate::util::{Proc, Sandbox, colibri, field, poll, secs};

/// The box believes it is two hours earlier than it is.
const ERROR_MS: i64 = -2 * 3600 * 1000;

fn run(config: &Path, clock: &Path) -> Proc {
    let mut cmd = colibri();
    cmd.arg("run")
        .arg("--config")
        .arg(config)
        .env("COLIBRI_FAKE_CLOCK", clock);
    let agent = Proc::spawn(cmd);
    agent.wait_for_event(secs(30), "colibri started", |e| {
        field(e, "message") == "colibri started"
    });
    agent
}

fn post(port: u16, body: &str) -> (u64, u64) {
    let mut c = Client::new(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    let before = now_ms();
    let a = c
        .post(
            "/v1/streams/metrics/records",
            "text/plain",
            &[],
            body.as_bytes(),
        )
        .expect("an answer");
    assert_eq!(a.status, 200, "{}", a.text());
    (before, now_ms())
}

fn admin_get(port: u16, path: &str) -> String {
    let mut c = Client::new(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    c.request("GET", path, &[], None)
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
        .text()
}

#[test]
fn records_held_for_the_clock_go_out_at_their_true_time_once_it_is_synchronised() {
    let sb = Sandbox::new();
    let vm = Vm::start(&sb.file("vm"), free_port());
    let clock = sb.file("clock");
    std::fs::write(&clock, format!("unsynced {ERROR_MS}\n")).unwrap();
    let (ingest, admin) = (free_port(), free_port());
    let config = sb.write_config(&format!(
        r#"data_dir: data
log: {{format: json}}
ingest: {{ listen: "127.0.0.1:{ingest}" }}
admin: {{ listen: "127.0.0.1:{admin}" }}
sinks:
  vm: {{ type: http, url: "http://127.0.0.1:{vm}/write?db=box", encoding: influx_line, precision: ms }}
streams:
  metrics: {{ sink: vm, hold_until_clock_synced: true }}
"#,
        vm = vm.port(),
    ));
    let mut agent = run(&config, &clock);
    agent.wait_for_event(secs(10), "a WARN that the clock is unsynchronised", |e| {
        field(e, "level") == "WARN" && field(e, "message").contains("not synchronised")
    });
    assert!(admin_get(admin, "/readyz").contains("clock: not synchronised"));
    // Two points colibri stamps, and one with its producer's own (true) time.
    let own = now_ms() - 1_000;
    let first = post(
        ingest,
        &format!("held,n=1 v=1\nheld,n=2 v=2\nown,n=1 v=3 {own}\n"),
    );
    let text = scrape(admin);
    assert_eq!(sample(&text, "colibri_clock_synchronized"), 0.0);
    assert!(admin_get(admin, "/-/queues").contains(r#""held_for_clock":true"#));

    // Killed before the sync: the stamps are on disk with the jobs.
    agent.signal(libc::SIGKILL);
    agent.wait_exit(secs(10));
    let agent = run(&config, &clock);
    let second = post(ingest, "held,n=3 v=4\n");
    let text = scrape(admin);
    let of = |series: &str| sample(&text, &format!("{series}{{stream=\"metrics\"}}"));
    assert_eq!(of("colibri_stream_appended_records_total"), 4.0);
    assert_eq!(of("colibri_stream_delivered_records_total"), 0.0, "held");
    assert!(vm.export(r#"{__name__=~"held_v|own_v"}"#).is_empty());

    // NTP steps the clock: the error is gone and the kernel says synchronised.
    std::fs::write(&clock, "synced\n").unwrap();
    let got = poll(secs(30), || {
        let e = vm.export(r#"{__name__=~"held_v|own_v"}"#);
        (e.values().map(Vec::len).sum::<usize>() == 4).then_some(e)
    })
    .unwrap_or_else(|| panic!("4 samples in VictoriaMetrics; stderr:\n{}", agent.stderr()));
    // The one sample of `name`{n="n"}: its time.
    let at = |name: &str, n: &str| -> u64 {
        let (k, v) = got
            .iter()
            .find(|(k, _)| {
                k.contains(&format!(r#""__name__":"{name}""#))
                    && k.contains(&format!(r#""n":"{n}""#))
            })
            .unwrap_or_else(|| panic!("no {name}{{n={n}}} in {got:?}"));
        assert_eq!(v.len(), 1, "{k}");
        v[0].0
    };
    // The correction is the difference of two clock readings in whole milliseconds, taken an
    // instant apart: it may be a millisecond off either way (one CI run saw a record 1 ms before
    // its window), which says nothing about the hours of error it removes.
    let within = |t: u64, (from, to): (u64, u64), what: &str| {
        assert!(
            (from.saturating_sub(1)..=to + 1).contains(&t),
            "{what} at {t}, true time of its append {from}..={to} (the wrong clock said {})",
            t as i64 + ERROR_MS
        );
    };
    within(at("held_v", "1"), first, "held n=1");
    within(at("held_v", "2"), first, "held n=2");
    within(at("held_v", "3"), second, "held n=3 (after the restart)");
    assert_eq!(
        at("own_v", "1"),
        own,
        "a producer's own time is left as it is"
    );

    let text = scrape(admin);
    let held = |outcome: &str| {
        sample(
            &text,
            &format!(
                "colibri_stream_clock_held_records_total{{stream=\"metrics\",outcome=\"{outcome}\"}}"
            ),
        )
    };
    assert_eq!((held("corrected"), held("kept")), (3.0, 1.0));
    assert_eq!(sample(&text, "colibri_clock_synchronized"), 1.0);
    assert!(!admin_get(admin, "/readyz").contains("clock"));
    drop(crate::util::stop(agent));
}
