//! The `http_scrape` handler: one GET of a (local) endpoint per run, its answer turned into records
//! (`scrape::prometheus`, `scrape::json`, or the raw body in a JSON envelope), all carrying the
//! scrape's time, and appended to the task's stream in one append: a scrape is stored whole or not
//! at all, and acknowledged only once durable. A failed scrape (no answer, a status other than 2xx,
//! an answer over `max_body`, a malformed body, a full stream) is a failed attempt with the reason;
//! `task::run` logs, counts and retries it. It does not decide where records go after the stream
//! (the sink does) nor when to run (the scheduler). Built by its `config.rs`, called by `task::run`.

use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{Attempt, Needs, RunContext};
use crate::net::client::{self, BadHeader, chain, shown_url};
use crate::scrape::json::JsonMapping;
use crate::scrape::lineproto::Precision;
use crate::scrape::{json, prometheus};
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

    /// One scrape: GET and parse within `timeout` (until colibri aborts runs), then append.
    pub async fn run(&self, task: &str, timeout: Duration, ctx: &RunContext) -> Attempt {
        Attempt::of_records(timeout, ctx, &self.stream, |_| self.scrape(task)).await
    }

    /// GET and parse: the records to append.
    async fn scrape(&self, task: &str) -> Result<Vec<Vec<u8>>, String> {
        // The time the measurement was taken: what every record carries, however late it is
        // delivered.
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_err(|_| "the clock is before 1970")?;
        let ts_ns = i64::try_from(now.as_nanos()).map_err(|_| "the clock is past 2262")?;
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
        Ok(records)
    }
}
