//! Per-record JSON work of a tail source, measured alone: escaping a line into a JSON string (the
//! byte-by-byte loop tail records were made with before issue 16, and `src/record/json.rs`'s run-at-a-
//! time escaping), checking the line's UTF-8, and checking that a line is a JSON object for
//! `format: json` (serde_json with `IgnoredAny`, as the ingest API checks records, against
//! `src/record/json.rs`'s strict checker). Lines: the backlog benchmark's 200-byte JSON line, a
//! plain-text log line of the same length, and a line of multibyte text. Figures, not assertions:
//! nanoseconds per line (the median of BENCH_ROUNDS rounds), see BENCHMARKS.md.
//!
//!   cargo bench --bench records
//!   BENCH_ROUNDS=21 cargo bench --bench records

use std::hint::black_box;
use std::time::Instant;

mod common;
#[path = "../src/record/json.rs"]
#[allow(dead_code, reason = "the bench uses part of the module")]
mod json;

/// Lines per round.
const LINES: usize = 200_000;

fn main() {
    let rounds = common::env_u64("BENCH_ROUNDS", 11) as usize;
    let json_line = {
        let mut l =
            b"{\"ts\":\"2026-11-30T12:00:00.000Z\",\"level\":\"info\",\"seq\":123456,\"msg\":\""
                .to_vec();
        l.resize(197, b'x');
        l.extend_from_slice(b"\"}");
        String::from_utf8(l).expect("ASCII")
    };
    let text_line = {
        let mut l = "2026-11-30 12:00:00.000 INFO  [worker-3] GET /api/v1/items?page=7 200 12ms "
            .to_string();
        while l.len() < 199 {
            l.push_str("lorem ipsum ");
        }
        l.truncate(199);
        l
    };
    let multibyte = "Ünïcödé ľíñé – 日本語のログ行 😀 ".repeat(4);
    println!(
        "colibri per-record JSON work ({} cores; {LINES} lines per round, median of {rounds} rounds; ns per line)",
        common::cores()
    );
    println!();
    for (name, line) in [
        ("the backlog bench's JSON line", json_line.as_str()),
        ("a plain-text log line", text_line.as_str()),
        ("a line of multibyte text", multibyte.as_str()),
    ] {
        println!("{name} ({} bytes):", line.len());
        let mut out = Vec::with_capacity(LINES * 2 * line.len().max(64));
        let per = |f: &mut dyn FnMut()| median_ns(rounds, f);
        let old = per(&mut || {
            out.clear();
            for _ in 0..LINES {
                escape_bytewise(&mut out, black_box(line));
            }
        });
        let new = per(&mut || {
            out.clear();
            for _ in 0..LINES {
                json::escape_into(&mut out, black_box(line));
            }
        });
        println!("  escape: byte by byte {old:.1}, a word at a time {new:.1}");
        let bytes = line.as_bytes();
        let lossy = per(&mut || {
            for _ in 0..LINES {
                black_box(String::from_utf8_lossy(black_box(bytes)));
            }
        });
        let strict = per(&mut || {
            for _ in 0..LINES {
                let _ = black_box(std::str::from_utf8(black_box(bytes)));
            }
        });
        println!("  UTF-8: from_utf8_lossy {lossy:.1}, from_utf8 {strict:.1}");
        let serde = per(&mut || {
            for _ in 0..LINES {
                let _ = black_box(serde_json::from_str::<serde::de::IgnoredAny>(black_box(
                    line,
                )));
            }
        });
        let ours = per(&mut || {
            for _ in 0..LINES {
                black_box(json::object(black_box(line), |k| {
                    black_box(k);
                }));
            }
        });
        println!(
            "  JSON object check: serde_json IgnoredAny {serde:.1}, tail::json::object {ours:.1}"
        );
        println!();
    }
}

/// Nanoseconds per line of `f` (one round of LINES lines), the median of `rounds`.
fn median_ns(rounds: usize, f: &mut dyn FnMut()) -> f64 {
    f(); // warm
    let mut ns: Vec<f64> = (0..rounds)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_nanos() as f64 / LINES as f64
        })
        .collect();
    ns.sort_by(f64::total_cmp);
    ns[ns.len() / 2]
}

/// The escaping tail records were made with before issue 16 (src/tail/record.rs then): a match on
/// every byte.
fn escape_bytewise(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = s.as_bytes();
    let mut run = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let esc: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[run..i]);
        if esc.is_empty() {
            out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[(b >> 4) as usize],
                HEX[(b & 15) as usize],
            ]);
        } else {
            out.extend_from_slice(esc);
        }
        run = i + 1;
    }
    out.extend_from_slice(&bytes[run..]);
}
