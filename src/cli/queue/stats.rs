//! `colibri queue stats`: per stream what its tables hold now and what has flowed through it,
//! read from the store (read-only, beside a running agent), and what only the running agent
//! knows (in its memory): whether it has the stream paused, and how long its last live and
//! backlog jobs took from append to delivery; as a table or as JSON. Owns only the report; opening the store is `queue`'s. Called by `queue::run`.

use std::collections::BTreeMap;

use super::{Access, open};
use crate::cli::admin_client::{AdminArgs, AdminClient, AdminError};
use crate::clock;
use crate::config::Config;
use crate::store;
use crate::units::{fmt_duration, fmt_size};

pub(super) fn stats(c: &Config, admin: &AdminArgs, json: bool) -> anyhow::Result<()> {
    let agent = ask_agent(c, admin);
    let report = Report::read(c, agent.as_ref())?;
    if json {
        return report.print_json(c);
    }
    report.print_summary(c);
    report.print_streams();
    report.print_latencies();
    if agent.is_none() {
        println!(
            "PAUSED -: no agent answered at its admin endpoint (a pause lives in the running agent)"
        );
    }
    report.print_aside();
    Ok(())
}

/// What `stats` reports, read from the store (closed again before anything is printed).
struct Report {
    /// A JSON object per stream (what `--json` prints; the table reads them back).
    rows: Vec<serde_json::Value>,
    file_bytes: u64,
    stored: u64,
    raw: u64,
    reclaimable: u64,
    quarantined: u64,
    aside: Vec<store::aside::AsideFile>,
}

impl Report {
    fn read(
        c: &Config,
        agent: Option<&BTreeMap<String, serde_json::Value>>,
    ) -> anyhow::Result<Self> {
        let s = open(c, Access::Read)?;
        let now = clock::now_ms();
        let mut rows = Vec::new();
        for (cfg, n) in s.streams() {
            let oldest = s.oldest_ms(&cfg.name)?;
            rows.push(serde_json::json!({
                "stream": cfg.name,
                "ready": { "jobs": n.ready_jobs, "records": n.ready_records, "bytes": n.ready_bytes, "raw_bytes": n.ready_raw_bytes },
                "retry": { "jobs": n.retry_jobs, "records": n.retry_records, "bytes": n.retry_bytes, "raw_bytes": n.retry_raw_bytes },
                "dead": { "jobs": n.dead_jobs, "records": n.dead_records, "bytes": n.dead_bytes, "raw_bytes": n.dead_raw_bytes },
                "oldest_age_ms": oldest.map(|o| now.saturating_sub(o)),
                "counters": n,
                "balanced": n.balanced(),
                "paused": agent.and_then(|a| a.get(&cfg.name)?.get("paused")),
                "latency_ms": agent.and_then(|a| a.get(&cfg.name)?.get("latency_ms")),
            }));
        }
        let file_bytes = s.file_bytes();
        let stored = s.stored_bytes();
        let raw: u64 = s.streams().map(|(_, n)| n.raw_bytes()).sum();
        let quarantined = s.quarantined()?;
        let aside = s.aside_files();
        drop(s);
        // Read-only handles cannot see redb's free-page statistics, and a writable open here would
        // compete with an agent starting at the same moment: report the upper bound instead.
        let reclaimable = file_bytes.saturating_sub(stored);
        Ok(Self {
            rows,
            file_bytes,
            stored,
            raw,
            reclaimable,
            quarantined,
            aside,
        })
    }

    fn print_json(&self, c: &Config) -> anyhow::Result<()> {
        let doc = serde_json::json!({
            "file": c.data_dir.join(store::DB_FILE),
            "file_bytes": self.file_bytes,
            "stored_bytes": self.stored,
            "raw_bytes": self.raw,
            "reclaimable_bytes_at_most": self.reclaimable,
            "quarantined_entries": self.quarantined,
            "damaged_files": self.aside,
            "streams": self.rows,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        Ok(())
    }

    /// The store file: its size and what it holds.
    fn print_summary(&self, c: &Config) {
        println!(
            "{}: {} on disk, {} in jobs ({} uncompressed), up to {} reclaimable by compaction, {} quarantined",
            c.data_dir.join(store::DB_FILE).display(),
            fmt_size(self.file_bytes),
            fmt_size(self.stored),
            fmt_size(self.raw),
            fmt_size(self.reclaimable),
            self.quarantined,
        );
    }

    /// The table, a row per stream.
    fn print_streams(&self) {
        // What is in each table now (QUEUED: ready and retry on disk, RAW: the same uncompressed),
        // then what has flowed through the stream (in records) since it began: appended, delivered,
        // moved to the dead letters, expired (ttl) and dropped.
        let header = format!(
            "{:<16} {:>18} {:>10} {:>10} {:>10} {:>10} {:>8} {:>10} {:>10} {:>13} {:>8} {:>8} {:>6}",
            "STREAM",
            "READY jobs/records",
            "RETRY jobs",
            "DEAD jobs",
            "QUEUED",
            "RAW",
            "OLDEST",
            "APPENDED",
            "DELIVERED",
            "DEAD-LETTERED",
            "EXPIRED",
            "DROPPED",
            "PAUSED"
        );
        println!("{header}");
        for r in &self.rows {
            let n: store::Counters =
                serde_json::from_value(r["counters"].clone()).unwrap_or_default();
            let age = r["oldest_age_ms"].as_u64().map_or("-".to_string(), |ms| {
                fmt_duration(std::time::Duration::from_secs(ms / 1000))
            });
            println!(
                "{:<16} {:>18} {:>10} {:>10} {:>10} {:>10} {:>8} {:>10} {:>10} {:>13} {:>8} {:>8} {:>6}",
                r["stream"].as_str().unwrap_or(""),
                format!("{}/{}", n.ready_jobs, n.ready_records),
                n.retry_jobs,
                n.dead_jobs,
                fmt_size(n.ready_bytes + n.retry_bytes),
                fmt_size(n.ready_raw_bytes + n.retry_raw_bytes),
                age,
                n.appended_records,
                n.delivered_records,
                n.dead_lettered_records,
                n.expired_records,
                n.dropped_records(),
                match r["paused"].as_bool() {
                    Some(true) => "yes",
                    Some(false) => "no",
                    None => "-",
                },
            );
        }
    }

    /// What the running agent says of its lanes: a line per stream that has delivered, how long
    /// its last live and backlog jobs took from append to delivery.
    fn print_latencies(&self) {
        for r in &self.rows {
            let ms = |lane: &str| r["latency_ms"][lane].as_u64().filter(|ms| *ms > 0);
            let parts: Vec<String> = [("live", ms("live")), ("backlog", ms("backlog"))]
                .into_iter()
                .filter_map(|(lane, ms)| {
                    let d = std::time::Duration::from_millis(ms?);
                    Some(format!("{lane} {}", fmt_duration(d)))
                })
                .collect();
            if !parts.is_empty() {
                println!(
                    "{}: last delivered {} after its append",
                    r["stream"].as_str().unwrap_or(""),
                    parts.join(", ")
                );
            }
        }
    }

    /// Damaged store files the agent moved aside: they hold disk (and count against
    /// storage.max_bytes) until removed.
    fn print_aside(&self) {
        for f in &self.aside {
            let moved = chrono::DateTime::from_timestamp_millis(f.moved_ms as i64)
                .map_or("?".into(), |t| {
                    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                });
            println!(
                "damaged store moved aside {moved}: {} ({}; counts against storage.max_bytes until removed)",
                f.path.display(),
                fmt_size(f.bytes)
            );
        }
    }
}

/// How long `stats` waits for the agent's answer: the store's figures do not wait on a hung agent.
const ASK_WITHIN: std::time::Duration = std::time::Duration::from_secs(3);

/// Per stream, what the running agent says of it (`GET /-/queues`: whether it is paused, its
/// lanes' latency); `None` when no agent answers (a stopped agent delivers nothing, and its next
/// start delivers every stream). Asking is best effort: the store's figures are the report, so a
/// failure to ask is said on stderr and the columns left out.
fn ask_agent(c: &Config, admin: &AdminArgs) -> Option<BTreeMap<String, serde_json::Value>> {
    let asked = admin.admin.is_some();
    let client = match AdminClient::new(c, admin) {
        Ok(client) => client,
        Err(e) => {
            if asked {
                eprintln!("warning: cannot ask the agent which streams are paused: {e:#}");
            }
            return None;
        }
    };
    let answer = match client.get_within("/-/queues", ASK_WITHIN) {
        Ok(a) if a.status == 200 => a,
        Ok(a) => {
            eprintln!(
                "warning: the agent answered {} to GET /-/queues: {}",
                a.status,
                a.body.trim()
            );
            return None;
        }
        Err(AdminError::NotRunning(_)) => return None,
        Err(AdminError::Other(e)) => {
            eprintln!("warning: cannot ask the agent which streams are paused: {e:#}");
            return None;
        }
    };
    let doc: serde_json::Value = serde_json::from_str(&answer.body).ok()?;
    let streams = doc["streams"].as_array()?;
    Some(
        streams
            .iter()
            .filter_map(|s| Some((s["stream"].as_str()?.to_string(), s.clone())))
            .collect(),
    )
}
