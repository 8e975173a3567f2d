//! Fuzzes line protocol both ways. Any bytes: the checker never panics, `check`, `parse` and
//! `record` (which trims the line first) agree, and a stored record always checks again, with a
//! timestamp. Built points: what
//! the writer (`lineproto`) makes of any measurement, tags and fields always checks, and parses back
//! into as many tags and fields and the same timestamp; exactly the same names and values when the
//! text holds none of what the writer documents as lossy (backslashes, tabs, line breaks). Run:
//! `cargo +nightly fuzz run lineproto` from the repository root.
#![no_main]

use colibri::scrape::lineparse::{self, Value};
use colibri::scrape::lineproto::{FieldValue, check_measurement, line};
use libfuzzer_sys::fuzz_target;

fn clean(s: &str) -> bool {
    !s.contains(['\\', '\t', '\n', '\r'])
}

fuzz_target!(|data: &[u8]| {
    // As a line from a client.
    let checked = lineparse::check(data);
    let parsed = lineparse::parse(data);
    assert_eq!(checked.as_ref().err(), parsed.as_ref().err());
    if let Ok(p) = &parsed {
        assert_eq!(checked, Ok(p.timestamp.is_some()));
        assert!(!p.fields.is_empty() && !p.measurement.is_empty());
    }
    // A record is the trimmed line, checked; what it stores checks again, with a timestamp.
    let trimmed = data.trim_ascii();
    match lineparse::record(data, 7) {
        Ok(Some(rec)) => {
            assert_eq!(lineparse::check(&rec), Ok(true), "a stored record has a timestamp");
            assert!(lineparse::check(trimmed).is_ok());
        }
        Ok(None) => assert!(trimmed.is_empty() || trimmed[0] == b'#'),
        Err(e) => assert_eq!(lineparse::check(trimmed), Err(e)),
    }

    // As parts for the writer: NUL-separated strings, the first byte picks the value types.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut parts = text.split('\0');
    let kinds = parts.next().unwrap_or("").as_bytes().to_vec();
    let measurement = parts.next().unwrap_or("m");
    let strings: Vec<&str> = parts.collect();
    if check_measurement(measurement).is_err() {
        return; // refused at config time
    }
    let (tag_strs, field_strs) = strings.split_at(strings.len() / 2);
    let tags: Vec<(&str, &str)> = tag_strs.chunks_exact(2).map(|c| (c[0], c[1])).collect();
    let fields: Vec<(&str, FieldValue)> = field_strs
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let kind = kinds.get(i).copied().unwrap_or(0);
            let v = match kind % 4 {
                0 => FieldValue::Float(f64::from(kind) * 1.5e-3 - 0.1),
                1 => FieldValue::Int(i64::from(kind) - 128),
                2 => FieldValue::Bool(kind % 8 == 2),
                _ => FieldValue::Str(k.chars().rev().collect()),
            };
            (*k, v)
        })
        .collect();
    let ts = kinds.first().map(|&b| i64::from(b) * 1_000_000_007 - 99);
    let Some(rec) = line(measurement, &tags, &fields, ts) else {
        return; // no writable field: nothing is written
    };
    let p = lineparse::parse(&rec).unwrap_or_else(|e| {
        panic!("the writer wrote {:?}, which does not check: {e}", String::from_utf8_lossy(&rec))
    });
    assert_eq!(p.timestamp, ts);
    let mut written_tags: Vec<(&str, &str)> = tags.clone();
    written_tags.sort_by(|a, b| a.0.cmp(b.0));
    written_tags.dedup_by(|later, earlier| later.0 == earlier.0);
    let all_clean = clean(measurement)
        && tags.iter().all(|(k, v)| clean(k) && clean(v))
        && fields.iter().all(|(k, v)| {
            clean(k) && !matches!(v, FieldValue::Str(s) if s.contains(['\\', '\n', '\r']))
        });
    if all_clean {
        written_tags.retain(|(k, v)| !k.is_empty() && !v.is_empty());
        assert_eq!(p.measurement, measurement);
        let got: Vec<(&str, &str)> = p.tags.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(got, written_tags);
        let want: Vec<(String, Value)> = fields
            .iter()
            .filter(|(k, _)| !k.is_empty())
            .map(|(k, v)| {
                let v = match v {
                    FieldValue::Float(x) => Value::Float(*x),
                    FieldValue::Int(x) => Value::Int(*x),
                    FieldValue::Bool(x) => Value::Bool(*x),
                    FieldValue::Str(s) => Value::Str(s.clone()),
                };
                (k.to_string(), v)
            })
            .collect();
        assert_eq!(p.fields, want);
    } else {
        assert!(p.tags.len() <= written_tags.len());
        assert!(!p.fields.is_empty() && p.fields.len() <= fields.len());
    }
});
