//! `http_scrape` from the real binary against a local endpoint: raw answers stored as JSON records
//! with their scrape time, and failed scrapes (an error status, a malformed body, an answer over
//! `max_body`) logged with the reason and counted, storing nothing, while the agent carries on.

use serde_json::Value;

use crate::util::secs;
use crate::util::serve::Endpoint;
use crate::util::{Proc, Sandbox, assert_code, colibri, field, finish, quote};

#[test]
fn raw_scrapes_are_stored_with_their_time_and_failed_ones_store_nothing() {
    let sb = Sandbox::new();
    // GET 1, 4, 7 ... are fine; 2, 5, ... answer 500; 3, 6, ... are not Prometheus text.
    let endpoint = Endpoint::start(Box::new(|path, n| match (path, n % 3) {
        ("/raw", _) => (200, "text/csv", format!("line,{n}\nsecond \"row\"\n")),
        ("/prom", 1) => (200, "text/plain", format!("up {n}\n")),
        ("/prom", 2) => (500, "text/plain", "broken\n".into()),
        ("/prom", _) => (200, "text/plain", "up{ 1\n".into()),
        _ => (200, "text/plain", "x".repeat(4096)),
    }));
    let config = sb.write_config(&format!(
        r#"data_dir: data
log: {{format: json}}
streams: {{ raw: {{}}, prom: {{}}, big: {{}} }}
tasks:
  - {{ name: raw, type: http_scrape, every: 500ms, url: {raw}, format: raw, stream: raw }}
  - {{ name: prom, type: http_scrape, every: 500ms, url: {prom}, format: prometheus, stream: prom }}
  - {{ name: big, type: http_scrape, every: 500ms, url: {big}, format: raw, stream: big, max_body: 1KiB }}
"#,
        raw = quote(endpoint.url("/raw")),
        prom = quote(endpoint.url("/prom")),
        big = quote(endpoint.url("/big")),
    ));
    let mut agent = Proc::run(&config);
    agent.wait_until(secs(20), "six prometheus scrapes", || {
        endpoint.served("/prom").len() >= 4 && endpoint.served("/raw").len() >= 3
    });
    agent.signal(libc::SIGTERM);
    assert_code(agent.wait_exit(secs(20)), 0, &agent.stderr());

    let runs = |task: &str, outcome: &str| {
        agent.events_where(|e| field(e, "task") == task && field(e, "outcome") == outcome)
    };
    let failed = runs("prom", "failed");
    assert!(
        failed
            .iter()
            .any(|e| field(e, "reason").contains("answered 500")),
        "{failed:#?}"
    );
    assert!(
        failed
            .iter()
            .any(|e| field(e, "reason").contains("not Prometheus text: line 1")),
        "{failed:#?}"
    );
    let ok = runs("prom", "ok");
    assert!(ok.iter().all(|e| e["records"] == 1), "{ok:#?}");
    let big = runs("big", "failed");
    assert!(
        !big.is_empty()
            && big
                .iter()
                .all(|e| field(e, "reason").contains("over max_body")),
        "{big:#?}"
    );

    let peek = |stream: &str| -> Vec<Value> {
        let mut cmd = colibri();
        cmd.args(["queue", "peek", "--json", "--all", "--config"])
            .arg(&config)
            .arg(stream);
        let f = finish(cmd, secs(20));
        assert_code(f.status, 0, &f.stderr);
        f.stdout
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON job"))
            .collect()
    };
    // Only the good prometheus scrapes were stored, one record each.
    let prom: Vec<String> = peek("prom")
        .iter()
        .flat_map(|j| j["records"].as_array().expect("decoded records").clone())
        .map(|r| r.as_str().unwrap().to_string())
        .collect();
    assert_eq!(prom.len(), ok.len(), "{prom:?}");
    assert!(prom.iter().all(|r| r.starts_with("prom up=")), "{prom:?}");
    assert!(
        peek("big").is_empty(),
        "nothing of an oversized answer is stored"
    );

    let raw: Vec<Value> = peek("raw")
        .iter()
        .flat_map(|j| j["records"].as_array().expect("decoded records").clone())
        .map(|r| serde_json::from_str(r.as_str().unwrap()).expect("a JSON envelope"))
        .collect();
    let served = endpoint.served("/raw");
    assert_eq!(raw.len(), served.len(), "{raw:#?}");
    for (r, (n, at)) in raw.iter().zip(&served) {
        assert_eq!(r["task"], "raw");
        assert_eq!(r["status"], 200);
        assert_eq!(r["body"], format!("line,{n}\nsecond \"row\"\n"));
        let t = r["time_ms"].as_u64().expect("time_ms");
        assert!(t <= *at && at - t < 2000, "stamped {t}, answered {at}");
    }
}
