//! Fuzzes the Prometheus exposition parser: any UTF-8 text, never a panic; on success one record
//! per counted sample, on error nothing left behind; every record is exactly one line and a
//! line-protocol point the checker (`lineparse`) accepts, with a timestamp. Run:
//! `cargo +nightly fuzz run prometheus` from the repository root.
#![no_main]

use colibri::scrape::lineparse;
use colibri::scrape::lineproto::Precision;
use colibri::scrape::prometheus::{PromOptions, to_lines};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // The first byte picks the precision, so the timestamp conversions are fuzzed too.
    let precision = match data.first().map(|b| b % 4) {
        Some(0) => Precision::Ns,
        Some(1) => Precision::Us,
        Some(2) => Precision::Ms,
        _ => Precision::S,
    };
    let extra = [
        ("job".to_string(), "edge 1,a=b\n".to_string()),
        ("le".to_string(), String::new()),
    ];
    let opts = PromOptions {
        measurement: "prom\r\nx",
        extra_tags: &extra,
        scrape_ts_ns: 1_700_000_000_123_456_789,
        precision,
    };
    let mut out = vec![b"before".to_vec()];
    match to_lines(text, &opts, &mut out) {
        Ok(stats) => assert_eq!(out.len() as u64, 1 + stats.samples),
        Err(e) => {
            assert_eq!(out.len(), 1, "records left behind after {e}");
            assert!(e.line >= 1);
        }
    }
    for record in &out[1..] {
        assert_eq!(
            lineparse::check(record),
            Ok(true),
            "{:?}",
            String::from_utf8_lossy(record)
        );
    }
    for record in &out {
        assert!(!record.contains(&b'\n'), "a record spans lines: {record:?}");
        assert!(!record.contains(&b'\r'), "a record holds a CR: {record:?}");
        assert!(std::str::from_utf8(record).is_ok());
    }
});
