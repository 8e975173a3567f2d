//! `colibri queue salvage FILE` on the real binary: a store file damaged where redb refuses it
//! (its magic) is salvaged whole into the configured store, the report says so, and `queue
//! stats` shows the jobs back under their streams; a missing file fails naming it, and the live
//! store itself is refused as a usage error.

use std::path::Path;

use crate::util::{
    Sandbox, assert_code, finish, finish_with_stdin, queue, queue_stats, quote_path, secs,
    stream_stats,
};

fn config(sb: &Sandbox, data: &Path) -> std::path::PathBuf {
    sb.write_config(&format!(
        "data_dir: {data}\n\
         streams:\n  \
           logs: {{ batch: {{ max_records: 5 }} }}\n  \
           metrics: {{ batch: {{ max_records: 5 }} }}\n",
        data = quote_path(data),
    ))
}

fn push(sb: &Sandbox, config: &Path, stream: &str, n: usize) {
    let lines: String = (0..n).map(|i| format!("{stream} line {i}\n")).collect();
    let f = finish_with_stdin(
        sb,
        queue(config, &["push", stream, "--batch", "5"]),
        &lines,
        secs(60),
    );
    assert_code(f.status, 0, &f.stderr);
}

#[test]
fn a_damaged_store_is_salvaged_into_the_configured_one() {
    let sb = Sandbox::new();
    let data = sb.file("data");
    let cfg = config(&sb, &data);
    push(&sb, &cfg, "logs", 300);
    push(&sb, &cfg, "metrics", 100);
    // Damage the magic (redb refuses the file) and move it aside, as start-up does.
    let live = data.join("colibri.redb");
    let aside = data.join("colibri.redb.corrupt-1");
    let mut bytes = std::fs::read(&live).unwrap();
    bytes[2] ^= 0xff;
    std::fs::write(&aside, &bytes).unwrap();
    std::fs::remove_file(&live).unwrap();

    let f = finish(queue(&cfg, &["salvage", aside.to_str().unwrap()]), secs(60));
    assert_code(f.status, 0, &f.stderr);
    assert!(
        f.stdout.contains("jobs restored      80 (400 records)"),
        "{}",
        f.stdout
    );
    assert!(f.stdout.contains("lost to damage     0"), "{}", f.stdout);
    let stats = queue_stats(&cfg, &[]);
    assert_eq!(
        stream_stats(&stats, "logs")["ready"]["records"],
        300,
        "{stats}"
    );
    assert_eq!(
        stream_stats(&stats, "metrics")["ready"]["records"],
        100,
        "{stats}"
    );

    // JSON, into a store that has them already: salvaged again (a salvage is not idempotent).
    let f = finish(
        queue(&cfg, &["salvage", aside.to_str().unwrap(), "--json"]),
        secs(60),
    );
    assert_code(f.status, 0, &f.stderr);
    let doc: serde_json::Value = serde_json::from_str(&f.stdout).unwrap();
    assert_eq!(doc["jobs"], 80, "{doc}");

    let missing = data.join("nope.redb");
    let f = finish(
        queue(&cfg, &["salvage", missing.to_str().unwrap()]),
        secs(60),
    );
    assert_code(f.status, 1, &f.stderr);
    assert!(f.stderr.contains("nope.redb"), "{}", f.stderr);

    let f = finish(queue(&cfg, &["salvage", live.to_str().unwrap()]), secs(60));
    assert_code(f.status, 2, &f.stderr);
    assert!(f.stderr.contains("configured store itself"), "{}", f.stderr);

    // Random bytes: an empty report, exit 0.
    let junk = data.join("junk");
    std::fs::write(&junk, vec![7u8; 10_000]).unwrap();
    let f = finish(queue(&cfg, &["salvage", junk.to_str().unwrap()]), secs(60));
    assert_code(f.status, 0, &f.stderr);
    assert!(
        f.stdout.contains("jobs restored      0 (0 records)"),
        "{}",
        f.stdout
    );
}
