//! The `http_scrape` handler: one GET of a (local) endpoint per run, its answer turned into records
//! (`scrape::prometheus`, `scrape::json`, or the raw body in a JSON envelope), all carrying the
//! scrape's time, and appended to the task's stream in one append: a scrape is stored whole or not
//! at all, and acknowledged only once durable. A failed scrape (no answer, a status other than 2xx,
//! an answer over `max_body`, a malformed body, a full stream) is a failed attempt with the reason;
//! `task::run` logs, counts and retries it. It does not decide where records go after the stream
//! (the sink does) nor when to run (the scheduler). Built by its `config.rs`, called by `task::run`.

use std::sync::OnceLock;
use std::time::Duration;

use super::{Attempt, Needs, RunContext};
use crate::net::client::{self, BadHeader, chain, shown_url};
use crate::scrape::exception::{Decided, Exceptions, Rule, Sample};
use crate::scrape::json::JsonMapping;
use crate::scrape::lineproto::{self, FieldValue, Precision};
use crate::scrape::{json, lineparse, prometheus};
pub use config::HttpScrapeSpec as Spec;

mod config;

/// How an answer becomes records.
#[derive(Debug, Clone)]
pub enum Format {
    Prometheus,
    Json(JsonMapping),
    Raw,
}

/// The compiled `http_scrape` settings.
#[derive(Debug)]
pub struct ScrapeConfig {
    pub url: reqwest::Url,
    /// Extra request headers; values may hold credentials (sent marked sensitive).
    pub headers: Vec<(String, String)>,
    pub format: Format,
    pub stream: String,
    pub measurement: String,
    pub tags: Vec<(String, String)>,
    /// The timestamp unit of line-protocol records (the stream's sink's `precision`).
    pub precision: Precision,
    pub max_body: u64,
    /// With a `deadband` or `heartbeat`: the rules and the values last sent.
    pub exceptions: Option<ByException>,
}

/// Report by exception over line-protocol records: the task's rule, the fields' own, and the
/// task's state, keyed by series (measurement and tags) and field.
#[derive(Debug)]
pub struct ByException {
    rule: Rule,
    /// The fields with a rule of their own (few: looked up in order).
    fields: Vec<(String, Rule)>,
    state: Exceptions,
}

impl ByException {
    pub fn new(rule: Rule, fields: Vec<(String, Rule)>) -> ByException {
        ByException {
            rule,
            fields,
            state: Exceptions::default(),
        }
    }

    /// Drops from `records` the fields not worth sending, and the records left without any;
    /// what was decided, to settle once stored.
    fn filter(&self, records: &mut Vec<Vec<u8>>, now_ms: u64) -> Decided {
        let mut decided = Decided::default();
        records.retain_mut(|line| {
            // Lines this task wrote: they parse (a line that would not is kept as it is).
            let Ok(point) = lineparse::parse(line) else {
                return true;
            };
            let series = series_of(&point);
            let keep: Vec<bool> = point
                .fields
                .iter()
                .map(|(name, v)| {
                    let rule = self
                        .fields
                        .iter()
                        .find_map(|(f, r)| (f == name).then_some(r))
                        .unwrap_or(&self.rule);
                    let key = (series.clone(), name.clone());
                    self.state
                        .decide(key, sample(v), rule, now_ms, &mut decided)
                })
                .collect();
            if keep.iter().all(|k| *k) {
                return true;
            }
            match rebuilt(&point, &keep) {
                Some(l) => {
                    *line = l;
                    true
                }
                None => false,
            }
        });
        decided
    }
}

/// A series' key: its measurement and tags, as the line wrote them (sorted).
fn series_of(p: &lineparse::Point) -> String {
    let mut key = p.measurement.clone();
    for (k, v) in &p.tags {
        key.push(',');
        key.push_str(k);
        key.push('=');
        key.push_str(v);
    }
    key
}

fn sample(v: &lineparse::Value) -> Sample {
    match v {
        lineparse::Value::Float(x) => Sample::Number(*x),
        lineparse::Value::Int(x) => Sample::Number(*x as f64),
        lineparse::Value::UInt(x) => Sample::Number(*x as f64),
        lineparse::Value::Bool(b) => Sample::Other(b.to_string()),
        lineparse::Value::Str(s) => Sample::Other(s.clone()),
    }
}

/// The line with only the fields `keep` says; `None` when none is left.
fn rebuilt(p: &lineparse::Point, keep: &[bool]) -> Option<Vec<u8>> {
    let tags: Vec<(&str, &str)> = p
        .tags
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let fields: Vec<(&str, FieldValue)> = p
        .fields
        .iter()
        .zip(keep)
        .filter(|(_, k)| **k)
        .map(|((name, v), _)| {
            let v = match v {
                lineparse::Value::Float(x) => FieldValue::Float(*x),
                lineparse::Value::Int(x) => FieldValue::Int(*x),
                // This task writes no unsigned field; kept as a float if one came.
                lineparse::Value::UInt(x) => FieldValue::Float(*x as f64),
                lineparse::Value::Bool(b) => FieldValue::Bool(*b),
                lineparse::Value::Str(s) => FieldValue::Str(s.clone()),
            };
            (name.as_str(), v)
        })
        .collect();
    lineproto::line(&p.measurement, &tags, &fields, p.timestamp)
}

/// A scrape task's handler: its settings (which it reads as, through `Deref`) and the client made
/// from them at the first run.
#[derive(Debug)]
pub struct Scrape {
    config: ScrapeConfig,
    /// Built at the first run (connection pool and all), then reused.
    client: OnceLock<Result<reqwest::Client, String>>,
}

impl std::ops::Deref for Scrape {
    type Target = ScrapeConfig;

    fn deref(&self) -> &ScrapeConfig {
        &self.config
    }
}

impl crate::task::kind::Settings for Scrape {
    fn is_scrape(&self) -> bool {
        true
    }

    fn by_exception(&self) -> bool {
        self.exceptions.is_some()
    }

    fn timed_out(&self, timeout: Duration) -> String {
        format!(
            "GET {}: no complete answer within the timeout ({})",
            shown_url(&self.url),
            crate::units::fmt_duration(timeout)
        )
    }

    /// Its stream, and its sink's `precision` it stamps records in.
    fn needs(&self) -> Needs<'_> {
        Needs {
            stream: Some(&self.stream),
            spool: None,
            sink_settings: true,
        }
    }
}

impl crate::task::kind::Handler for Scrape {
    fn run(
        &self,
        task: &str,
        _due: chrono::DateTime<chrono::Utc>,
        timeout: Duration,
        ctx: &RunContext,
    ) -> impl std::future::Future<Output = Attempt> + Send {
        Scrape::run(self, task, timeout, ctx)
    }
}

impl Scrape {
    pub fn new(config: ScrapeConfig) -> Scrape {
        Scrape {
            config,
            client: OnceLock::new(),
        }
    }

    fn client(&self) -> Result<&reqwest::Client, String> {
        self.client
            .get_or_init(|| {
                let headers =
                    client::sensitive_headers(&self.headers).map_err(|bad| match bad {
                        BadHeader::Name(k) => format!("headers.{k}: not a valid header name"),
                        BadHeader::Value(k) => format!("headers.{k}: not a valid header value"),
                    })?;
                client::builder()
                    .default_headers(headers)
                    .redirect(reqwest::redirect::Policy::limited(3))
                    .pool_max_idle_per_host(1)
                    .build()
                    .map_err(|e| format!("cannot build the HTTP client: {e}"))
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// One scrape: GET and parse within `timeout` (until colibri aborts runs), then append. By
    /// exception, what the scrape decided stands once its records are stored.
    pub async fn run(&self, task: &str, timeout: Duration, ctx: &RunContext) -> Attempt {
        let state = self.exceptions.as_ref().map(|x| &x.state);
        Attempt::of_samples(timeout, ctx, &self.stream, state, || async {
            let (mut records, now_ms) = self.scrape(task).await?;
            let decided = self
                .exceptions
                .as_ref()
                .map(|x| x.filter(&mut records, now_ms));
            Ok((records, decided))
        })
        .await
    }

    /// GET and parse: the records to append, and the scrape's time (Unix ms).
    async fn scrape(&self, task: &str) -> Result<(Vec<Vec<u8>>, u64), String> {
        // The time the measurement was taken: what every record carries, however late it is
        // delivered.
        let ts_ns = crate::clock::unix_ns();
        if ts_ns < 0 {
            return Err("the clock is before 1970".into());
        }
        let shown = shown_url(&self.url);
        let mut resp = self
            .client()?
            .get(self.url.clone())
            .send()
            .await
            .map_err(|e| format!("GET {shown}: {}", chain(&e.without_url())))?;
        let status = resp.status();
        if !status.is_success() {
            return Err(format!("GET {shown} answered {status}"));
        }
        if resp.content_length().is_some_and(|l| l > self.max_body) {
            return Err(format!(
                "GET {shown}: the answer is over max_body ({} bytes)",
                self.max_body
            ));
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| {
            format!(
                "GET {shown}: reading the answer: {}",
                chain(&e.without_url())
            )
        })? {
            if (body.len() + chunk.len()) as u64 > self.max_body {
                return Err(format!(
                    "GET {shown}: the answer is over max_body ({} bytes)",
                    self.max_body
                ));
            }
            body.extend_from_slice(&chunk);
        }
        let mut records = Vec::new();
        match &self.format {
            Format::Prometheus => {
                let text = std::str::from_utf8(&body)
                    .map_err(|e| format!("GET {shown}: the answer is not UTF-8: {e}"))?;
                let opts = prometheus::PromOptions {
                    measurement: &self.measurement,
                    extra_tags: &self.tags,
                    scrape_ts_ns: ts_ns,
                    precision: self.precision,
                };
                prometheus::to_lines(text, &opts, &mut records)
                    .map_err(|e| format!("GET {shown}: not Prometheus text: {e}"))?;
            }
            Format::Json(m) => {
                json::to_lines(&body, m, &self.tags, ts_ns, self.precision, &mut records)
                    .map_err(|e| format!("GET {shown}: {e}"))?;
            }
            Format::Raw => {
                let envelope = serde_json::json!({
                    "time_ms": ts_ns / 1_000_000,
                    "task": task,
                    "url": shown,
                    "status": status.as_u16(),
                    "body": String::from_utf8_lossy(&body),
                });
                records.push(envelope.to_string().into_bytes());
            }
        }
        Ok((records, (ts_ns / 1_000_000) as u64))
    }
}
