//! `colibri top`: a live view of a running agent, read every second from its admin endpoint
//! (`/metrics`, `/-/sinks` and `/-/tasks`, with the same address and token as the other
//! commands): per stream the backlog (records, jobs, bytes on disk and raw, the age of the
//! oldest ready job), in and out rates, dead letters, drops, and whether it is paused; per sink
//! the link, since when it is down, the next probe, its rate and failures, and its last error;
//! per task whether it runs, the last run, its outcome and duration, the next run; per source
//! its rate, total and (tail) how many bytes its files hold unread. An agent that stops answering
//! (a restart) is shown as away over the last screen, and asked again every second. Keys: `s` changes the sort (name, backlog, rate), `/` filters by name (Enter keeps it,
//! Esc clears it), `q` quits. With `--once`, or when stdout is not a terminal, it prints one
//! screen as plain text and exits. The screen is plain text lines, the same for both; crossterm
//! only puts the terminal in raw mode and reads keys (a TUI framework would add far more to the
//! binary than the text needs).

use std::io::{IsTerminal as _, Write as _};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use clap::Args;
use serde_json::Value;

use super::admin_client::{AdminArgs, AdminClient, AdminError};
use super::{from_now as when, unix_s as rfc3339};
use crate::units::{fmt_duration, fmt_size};

#[derive(Debug, Args)]
pub struct TopArgs {
    #[command(flatten)]
    config: super::ConfigArg,
    #[command(flatten)]
    admin: AdminArgs,
    /// Print one screen as plain text and exit (also when stdout is not a terminal)
    #[arg(long)]
    once: bool,
}

/// How often the screen is read again.
const REFRESH: Duration = Duration::from_secs(1);

pub fn main(args: TopArgs) -> ExitCode {
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// One sample of the metrics page.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

impl Sample {
    fn label(&self, k: &str) -> &str {
        self.labels
            .iter()
            .find(|(n, _)| n == k)
            .map_or("", |(_, v)| v.as_str())
    }
}

/// The Prometheus text format, as colibri writes it (no timestamps).
fn parse(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (head, value) = match line.rsplit_once(' ') {
            Some(x) => x,
            None => continue,
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let (name, labels) = match head.split_once('{') {
            None => (head.to_string(), Vec::new()),
            Some((name, rest)) => (
                name.to_string(),
                labels(rest.strip_suffix('}').unwrap_or(rest)),
            ),
        };
        out.push(Sample {
            name,
            labels,
            value,
        });
    }
    out
}

/// `a="x",b="y\"z"` into pairs.
fn labels(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        let name: String = chars.by_ref().take_while(|&c| c != '=').collect();
        if name.is_empty() || chars.next() != Some('"') {
            return out;
        }
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(c) => value.push(c),
                    None => break,
                },
                '"' => break,
                c => value.push(c),
            }
        }
        out.push((name.trim_start_matches(',').to_string(), value));
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
}

/// What one read of the endpoint gave.
struct Reading {
    at: Instant,
    samples: Vec<Sample>,
    tasks: Vec<Value>,
    sinks: Vec<Value>,
}

impl Reading {
    fn sum(&self, name: &str, key: &str, item: &str, filter: impl Fn(&Sample) -> bool) -> f64 {
        self.samples
            .iter()
            .filter(|s| s.name == name && s.label(key) == item && filter(s))
            .map(|s| s.value)
            .sum()
    }

    fn total(&self, name: &str, key: &str, item: &str) -> f64 {
        self.sum(name, key, item, |_| true)
    }

    fn single(&self, name: &str) -> f64 {
        self.samples
            .iter()
            .find(|s| s.name == name)
            .map_or(0.0, |s| s.value)
    }

    /// The values of label `key` among the samples of `name`, in order.
    fn items(&self, name: &str, key: &str) -> Vec<String> {
        let mut v: Vec<String> = self
            .samples
            .iter()
            .filter(|s| s.name == name)
            .map(|s| s.label(key).to_string())
            .collect();
        v.sort();
        v.dedup();
        v
    }
}

fn read(client: &AdminClient) -> anyhow::Result<Reading> {
    // `None` for a 404: an agent older than the route.
    let fetch = |path: &str| {
        // Kept typed: at the start it ends top, later the agent is only away.
        let a = client.get(path).map_err(|e| match e {
            AdminError::NotRunning(_) => anyhow::Error::new(e),
            AdminError::Other(e) => e,
        })?;
        match a.status {
            200 => Ok(Some(a.body)),
            404 => Ok(None),
            s => anyhow::bail!("GET {path} answered {s}: {}", a.body.trim()),
        }
    };
    let json = |path: &str| -> anyhow::Result<Vec<Value>> {
        fetch(path)?.map_or(Ok(Vec::new()), |body| {
            serde_json::from_str(&body).with_context(|| format!("GET {path}: not JSON"))
        })
    };
    let samples = parse(
        &fetch("/metrics")?
            .context("GET /metrics answered 404: is this colibri's admin endpoint?")?,
    );
    let tasks = json("/-/tasks")?;
    // Without it (an older agent) the sinks show no last error.
    let sinks = json("/-/sinks")?;
    Ok(Reading {
        at: Instant::now(),
        samples,
        tasks,
        sinks,
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sort {
    Name,
    Backlog,
    Rate,
}

impl Sort {
    fn next(self) -> Sort {
        match self {
            Sort::Name => Sort::Backlog,
            Sort::Backlog => Sort::Rate,
            Sort::Rate => Sort::Name,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Sort::Name => "name",
            Sort::Backlog => "backlog",
            Sort::Rate => "rate",
        }
    }
}

/// What the viewer chose.
struct View {
    sort: Sort,
    filter: String,
    /// Typing a filter (after `/`).
    typing: bool,
}

/// `n` as a short count: 999, 12.3k, 4.5M.
fn short(n: f64) -> String {
    if n < 1e3 {
        format!("{n:.0}")
    } else if n < 1e6 {
        format!("{:.1}k", n / 1e3)
    } else {
        format!("{:.1}M", n / 1e6)
    }
}

/// Seconds as one short unit: 45s, 12m, 3h, 2d.
fn short_age(secs: f64) -> String {
    let s = secs.max(0.0) as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86_400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// A latency: milliseconds below a second (`180ms`), one decimal below a minute (`2.4s`), else
/// one short unit.
fn short_latency(secs: f64) -> String {
    if secs < 1.0 {
        format!("{:.0}ms", secs * 1000.0)
    } else if secs < 60.0 {
        format!("{secs:.1}s")
    } else {
        short_age(secs)
    }
}

/// The agent stopped answering (a restart, a stop): since when, and why the last read failed.
/// The screen keeps the last reading under a line that says so, and top asks again every second.
struct Away {
    since: DateTime<Utc>,
    reason: String,
}

/// An error chain (`outer: inner: innermost`, as colibri writes one) with its innermost cause first
/// (`innermost (outer: inner)`): the part that says what happened survives a cut at the screen's
/// edge ("connection refused", not "error sending request: clie").
fn cause_first(message: &str) -> String {
    let message = message.replace('\n', " ");
    match message.rsplit_once(": ") {
        Some((outer, cause)) if !cause.trim().is_empty() => format!("{cause} ({outer})"),
        _ => message,
    }
}

/// One screen, as lines of at most `width` characters; `away` when the last read failed.
fn screen(
    now: &Reading,
    before: Option<&Reading>,
    away: Option<&Away>,
    view: &View,
    wall: DateTime<Utc>,
    width: usize,
) -> Vec<String> {
    let f = Frame {
        now,
        before,
        secs: before.map(|b| now.at.duration_since(b.at).as_secs_f64().max(0.001)),
        view,
        wall,
    };
    let mut lines = f.header(away);
    f.streams(&mut lines);
    f.sinks(&mut lines);
    f.tasks(&mut lines);
    f.sources(&mut lines);
    lines
        .into_iter()
        .map(|l| l.chars().take(width).collect())
        .collect()
}

/// What one screen is drawn from: this reading, the one before (for rates), the view, the time.
struct Frame<'a> {
    now: &'a Reading,
    before: Option<&'a Reading>,
    /// Seconds between the two readings.
    secs: Option<f64>,
    view: &'a View,
    wall: DateTime<Utc>,
}

fn fmt_rate(r: Option<f64>) -> String {
    r.map_or("-".to_string(), short)
}

impl Frame<'_> {
    /// Per second since the reading before, of the counter `name` of `key="item"`.
    fn rate(&self, name: &str, key: &str, item: &str) -> Option<f64> {
        let (b, s) = (self.before?, self.secs?);
        Some(((self.now.total(name, key, item) - b.total(name, key, item)) / s).max(0.0))
    }

    fn shown(&self, name: &str) -> bool {
        self.view.filter.is_empty() || name.contains(self.view.filter.as_str())
    }

    /// The agent's line (and, while it is away, why), and the keys.
    fn header(&self, away: Option<&Away>) -> Vec<String> {
        let mut lines = Vec::new();
        let version = self
            .now
            .samples
            .iter()
            .find(|s| s.name == "colibri_build_info")
            .map_or("?", |s| s.label("version"));
        if let Some(a) = away {
            lines.push(format!(
                "AGENT AWAY since {} ({}): {}; asking every {}s",
                a.since.format("%H:%M:%S"),
                fmt_duration(Duration::from_secs(
                    (self.wall - a.since).num_seconds().max(0).unsigned_abs()
                )),
                cause_first(&a.reason),
                REFRESH.as_secs(),
            ));
        }
        let up =
            self.wall.timestamp() as f64 - self.now.single("colibri_process_start_time_seconds");
        lines.push(format!(
            "colibri {version}  up {}  config generation {}{}  memory {}  workers {}/{}",
            fmt_duration(Duration::from_secs(up.max(0.0) as u64)),
            self.now.single("colibri_config_generation"),
            if self.now.single("colibri_config_restart_pending") > 0.0 {
                " (restart pending)"
            } else {
                ""
            },
            fmt_size(self.now.single("colibri_process_resident_memory_bytes") as u64),
            self.now.single("colibri_workers_busy"),
            self.now.single("colibri_workers"),
        ));
        lines.push(format!(
            "sort: {} (s)  filter: {}{} (/)  quit: q",
            self.view.sort.label(),
            if self.view.filter.is_empty() && !self.view.typing {
                "-"
            } else {
                self.view.filter.as_str()
            },
            if self.view.typing { "_" } else { "" },
        ));
        lines.push(String::new());
        lines
    }

    /// The streams' table (a paused one marked), with drops by reason.
    fn streams(&self, lines: &mut Vec<String>) {
        // Streams.
        let queued = |s: &str, what: &str| {
            self.now.sum(what, "stream", s, |x| {
                matches!(x.label("queue"), "ready" | "retry")
            })
        };
        let mut streams: Vec<(String, f64, f64)> = self
            .now
            .items("colibri_stream_records", "stream")
            .into_iter()
            .filter(|s| self.shown(s))
            .map(|s| {
                let backlog = queued(&s, "colibri_stream_records");
                let r = self
                    .rate("colibri_stream_appended_records_total", "stream", &s)
                    .unwrap_or(0.0);
                (s, backlog, r)
            })
            .collect();
        sort_rows(&mut streams, self.view.sort);
        lines.push(format!(
            "{:<16} {:>7} {:>6} {:>7} {:>7} {:>5} {:>6} {:>6} {:>5} {:>5}",
            "STREAM", "QUEUED", "JOBS", "DISK", "RAW", "AGE", "IN/s", "OUT/s", "DEAD", "DROP"
        ));
        let wall_s = self.wall.timestamp_millis() as f64 / 1000.0;
        let retrying = |s: &str| {
            self.now.sum("colibri_stream_jobs", "stream", s, |x| {
                x.label("queue") == "retry"
            }) > 0.0
        };
        let mut any_paused = false;
        for (s, backlog, _) in &streams {
            // A paused stream is marked on its name: the row has no room for a word more.
            let paused = self.now.total("colibri_stream_paused", "stream", s) > 0.0;
            any_paused |= paused;
            let head = self
                .now
                .total("colibri_stream_oldest_ready_timestamp_seconds", "stream", s);
            lines.push(format!(
                "{:<16} {:>7} {:>6} {:>7} {:>7} {:>5} {:>6} {:>6} {:>5} {:>5}",
                if paused { format!("{s}*") } else { s.clone() },
                short(*backlog),
                short(queued(s, "colibri_stream_jobs")),
                fmt_size(queued(s, "colibri_stream_bytes") as u64),
                fmt_size(queued(s, "colibri_stream_raw_bytes") as u64),
                // The ready queue's head; a `+` when jobs wait to be retried as well, which may be
                // older (the metric does not walk them).
                format!(
                    "{}{}",
                    if head > 0.0 {
                        short_age(wall_s - head)
                    } else {
                        "-".into()
                    },
                    if retrying(s) { "+" } else { "" }
                ),
                fmt_rate(self.rate("colibri_stream_appended_records_total", "stream", s)),
                fmt_rate(self.rate("colibri_stream_delivered_records_total", "stream", s)),
                short(
                    self.now
                        .sum("colibri_stream_records", "stream", s, |x| x.label("queue")
                            == "dead")
                ),
                short(
                    self.now
                        .total("colibri_stream_dropped_records_total", "stream", s)
                ),
            ));
            // Drops by reason, on a line of their own when there are any.
            let reasons: Vec<String> = self
                .now
                .samples
                .iter()
                .filter(|x| {
                    x.name == "colibri_stream_dropped_records_total"
                        && x.label("stream") == s.as_str()
                        && x.value > 0.0
                })
                .map(|x| format!("{} {}", x.label("reason"), short(x.value)))
                .collect();
            if !reasons.is_empty() {
                lines.push(format!("  dropped: {}", reasons.join(", ")));
            }
            self.stream_flow(s, lines);
        }
        lines.push(if any_paused {
            "* paused: nothing delivered until `colibri queue resume`".into()
        } else {
            String::new()
        });
    }

    /// A stream's lanes and moves, on a line of their own when there is something to say: how
    /// long the last live and backlog jobs took from append to delivery, and what `on_max_age`
    /// moved out of or into it.
    fn stream_flow(&self, s: &str, lines: &mut Vec<String>) {
        let of = |name: &str, key: &str, value: &str| {
            self.now.sum(name, "stream", s, |x| x.label(key) == value)
        };
        let mut parts = Vec::new();
        for lane in ["live", "backlog"] {
            let secs = of("colibri_stream_delivery_latency_seconds", "lane", lane);
            if secs > 0.0 {
                parts.push(format!("{lane} {}", short_latency(secs)));
            }
        }
        let mut line = if parts.is_empty() {
            String::new()
        } else {
            format!("  latency: {}", parts.join(", "))
        };
        for d in ["out", "in"] {
            let n = of("colibri_stream_moved_records_total", "direction", d);
            if n > 0.0 {
                line.push_str(&format!("  moved {d}: {}", short(n)));
            }
        }
        if !line.is_empty() {
            lines.push(line);
        }
    }

    /// The sinks' table, each with its last error.
    fn sinks(&self, lines: &mut Vec<String>) {
        // Sinks.
        lines.push(format!(
            "{:<16} {:<5} {:>12} {:>12} {:>8} {:>7} {:>6}",
            "SINK", "LINK", "DOWN SINCE", "NEXT PROBE", "DELIV/s", "DEAD", "FAILED"
        ));
        for s in self
            .now
            .items("colibri_sink_link_up", "sink")
            .into_iter()
            .filter(|s| self.shown(s))
        {
            let up = self.now.total("colibri_sink_link_up", "sink", &s) > 0.0;
            // While up (a trial included, which is still part of the outage) neither is shown.
            let while_down = |metric: &str| match up {
                true => "-".to_string(),
                false => when(self.now.total(metric, "sink", &s), self.wall),
            };
            lines.push(format!(
                "{:<16} {:<5} {:>12} {:>12} {:>8} {:>7} {:>6}",
                s,
                if up { "up" } else { "DOWN" },
                while_down("colibri_sink_link_down_since_timestamp_seconds"),
                while_down("colibri_sink_link_next_probe_timestamp_seconds"),
                fmt_rate(self.rate("colibri_sink_delivered_records_total", "sink", &s)),
                short(
                    self.now
                        .total("colibri_sink_dead_lettered_records_total", "sink", &s)
                ),
                short(
                    self.now
                        .total("colibri_sink_failed_attempts_total", "sink", &s)
                ),
            ));
            let error = self
                .now
                .sinks
                .iter()
                .find(|x| x["name"] == s.as_str())
                .map(|x| &x["last_error"])
                .filter(|e| e.is_object());
            if let Some(e) = error {
                lines.push(format!(
                    "  last error {}: {}",
                    when(rfc3339(&e["at"]), self.wall),
                    cause_first(e["message"].as_str().unwrap_or("?")),
                ));
            }
        }
        lines.push(String::new());
    }

    /// The tasks' table.
    fn tasks(&self, lines: &mut Vec<String>) {
        // Tasks.
        lines.push(format!(
            "{:<16} {:<8} {:>12} {:<9} {:>8} {:>12}",
            "TASK", "STATE", "LAST RUN", "OUTCOME", "TOOK", "NEXT RUN"
        ));
        let mut tasks: Vec<&Value> = self
            .now
            .tasks
            .iter()
            .filter(|t| self.shown(t["name"].as_str().unwrap_or("")))
            .collect();
        if self.view.sort != Sort::Name {
            tasks.sort_by(|a, b| {
                rfc3339(&b["last"]["start"]).total_cmp(&rfc3339(&a["last"]["start"]))
            });
        }
        for t in tasks {
            let last = &t["last"];
            lines.push(format!(
                "{:<16} {:<8} {:>12} {:<9} {:>8} {:>12}",
                t["name"].as_str().unwrap_or("?"),
                if t["running"] == true {
                    "running"
                } else {
                    "idle"
                },
                when(rfc3339(&last["start"]), self.wall),
                last["outcome"].as_str().unwrap_or("-"),
                last["duration_s"]
                    .as_f64()
                    .map_or("-".into(), |s| fmt_duration(Duration::from_secs_f64(
                        s.max(0.0)
                    ))),
                when(rfc3339(&t["next"]), self.wall),
            ));
        }
        lines.push(String::new());
    }

    /// The sources' table.
    fn sources(&self, lines: &mut Vec<String>) {
        // Sources.
        lines.push(format!(
            "{:<16} {:<7} {:>9} {:>9} {:>8}",
            "SOURCE", "TYPE", "RECORDS/s", "RECORDS", "LAG"
        ));
        for (kind, metric) in [
            ("tail", "colibri_source_records_total"),
            ("syslog", "colibri_syslog_records_total"),
            ("mqtt", "colibri_mqtt_source_records_total"),
            ("opcua", "colibri_opcua_source_records_total"),
        ] {
            for s in self
                .now
                .items(metric, "source")
                .into_iter()
                .filter(|s| self.shown(s))
            {
                // Only a tail source reads at its own pace; the others take what is pushed. An
                // opcua source shows its session instead: "up" with the nodes it reads of all it
                // has, or "down".
                let lag = match kind {
                    "tail" => {
                        fmt_size(self.now.total("colibri_source_lag_bytes", "source", &s) as u64)
                    }
                    "opcua" => self.opcua_state(&s),
                    _ => "-".into(),
                };
                lines.push(format!(
                    "{:<16} {:<7} {:>9} {:>9} {:>8}",
                    s,
                    kind,
                    fmt_rate(self.rate(metric, "source", &s)),
                    short(self.now.total(metric, "source", &s)),
                    lag,
                ));
            }
        }
    }

    /// An opcua source's session: `up 9/10` (nodes read of nodes named) or `down`.
    fn opcua_state(&self, source: &str) -> String {
        let n = |name: &str, state: &str| {
            self.now.sum(name, "source", source, |x| {
                state.is_empty() || x.label("state") == state
            })
        };
        if n("colibri_opcua_source_connected", "") < 1.0 {
            return "down".into();
        }
        let ok = n("colibri_opcua_source_items", "ok");
        let all = ok + n("colibri_opcua_source_items", "unknown");
        format!("up {ok}/{all}")
    }
}

fn sort_rows(rows: &mut [(String, f64, f64)], sort: Sort) {
    match sort {
        Sort::Name => rows.sort_by(|a, b| a.0.cmp(&b.0)),
        Sort::Backlog => rows.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))),
        Sort::Rate => rows.sort_by(|a, b| b.2.total_cmp(&a.2).then(a.0.cmp(&b.0))),
    }
}

fn run(args: &TopArgs) -> anyhow::Result<()> {
    let c = super::load_needing(&args.config, &["admin"])?;
    let client = AdminClient::new(&c, &args.admin)?;
    let mut view = View {
        sort: Sort::Name,
        filter: String::new(),
        typing: false,
    };
    let first = || {
        read(&client).map_err(|e| match e.downcast_ref::<AdminError>() {
            Some(AdminError::NotRunning(_)) => anyhow::anyhow!("{e}: top reads a running agent"),
            _ => e,
        })
    };
    if args.once || !std::io::stdout().is_terminal() {
        for line in screen(&first()?, None, None, &view, Utc::now(), usize::MAX) {
            println!("{}", line.trim_end());
        }
        return Ok(());
    }
    let _terminal = Terminal::enter()?;
    let mut before: Option<Reading> = None;
    let mut now = first()?;
    let mut away: Option<Away> = None;
    let mut asked = now.at;
    let redraw = |now: &Reading, before: Option<&Reading>, away: Option<&Away>, view: &View| {
        draw(&screen(
            now,
            before,
            away,
            view,
            Utc::now(),
            terminal_width(),
        ))
    };
    loop {
        redraw(&now, before.as_ref(), away.as_ref(), &view)?;
        let next = asked + REFRESH;
        // Keys until the next read; each redraws at once.
        loop {
            let left = next.saturating_duration_since(Instant::now());
            if left.is_zero() || !crossterm::event::poll(left)? {
                break;
            }
            use crossterm::event::{Event, KeyCode, KeyEventKind, KeyModifiers};
            let Event::Key(k) = crossterm::event::read()? else {
                continue;
            };
            if k.kind != KeyEventKind::Press {
                continue;
            }
            let ctrl_c =
                k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
            if view.typing {
                match k.code {
                    _ if ctrl_c => return Ok(()),
                    KeyCode::Enter => view.typing = false,
                    KeyCode::Esc => {
                        view.typing = false;
                        view.filter.clear();
                    }
                    KeyCode::Backspace => {
                        view.filter.pop();
                    }
                    KeyCode::Char(ch) => view.filter.push(ch),
                    _ => {}
                }
            } else {
                match k.code {
                    _ if ctrl_c => return Ok(()),
                    KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                    KeyCode::Char('s') => view.sort = view.sort.next(),
                    KeyCode::Char('/') => {
                        view.typing = true;
                        view.filter.clear();
                    }
                    _ => {}
                }
            }
            redraw(&now, before.as_ref(), away.as_ref(), &view)?;
        }
        asked = Instant::now();
        (now, before, away) = next_reading(read(&client), now, before, away);
    }
}

/// The screen's state after a read: a fresh reading (rates against the one before it, none
/// across an absence: a restarted agent's counters start again), or the last one kept with the
/// agent away since the first read that failed.
fn next_reading(
    fresh: anyhow::Result<Reading>,
    now: Reading,
    before: Option<Reading>,
    away: Option<Away>,
) -> (Reading, Option<Reading>, Option<Away>) {
    match fresh {
        Ok(fresh) if away.is_some() => (fresh, None, None),
        Ok(fresh) => (fresh, Some(now), None),
        Err(e) => {
            let since = away.map_or_else(Utc::now, |a| a.since);
            let reason = format!("{e:#}");
            (now, before, Some(Away { since, reason }))
        }
    }
}

fn terminal_width() -> usize {
    crossterm::terminal::size().map_or(80, |(w, _)| usize::from(w))
}

/// The lines from the top left, as many as the terminal has rows.
fn draw(lines: &[String]) -> anyhow::Result<()> {
    use crossterm::{cursor, queue, terminal};
    let rows = crossterm::terminal::size().map_or(24, |(_, h)| usize::from(h));
    let mut out = std::io::stdout().lock();
    queue!(
        out,
        cursor::MoveTo(0, 0),
        terminal::Clear(terminal::ClearType::All)
    )?;
    for (i, l) in lines.iter().take(rows).enumerate() {
        if i > 0 {
            out.write_all(b"\r\n")?;
        }
        out.write_all(l.as_bytes())?;
    }
    out.flush()?;
    Ok(())
}

/// Raw mode and the alternate screen while `top` runs; put back however it ends.
struct Terminal;

impl Terminal {
    fn enter() -> anyhow::Result<Terminal> {
        use crossterm::{cursor, execute, terminal};
        terminal::enable_raw_mode().context("cannot put the terminal in raw mode")?;
        execute!(
            std::io::stdout(),
            terminal::EnterAlternateScreen,
            cursor::Hide
        )?;
        Ok(Terminal)
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        use crossterm::{cursor, execute, terminal};
        let _ = execute!(
            std::io::stdout(),
            cursor::Show,
            terminal::LeaveAlternateScreen
        );
        let _ = terminal::disable_raw_mode();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_metrics_text_is_read_with_its_labels() {
        let s = parse(
            "# TYPE x gauge\nx{a=\"1\",b=\"q\\\"z\"} 2.5\ny 3\ncolibri_build_info{version=\"0.1.0\"} 1\n",
        );
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].name, "x");
        assert_eq!(s[0].label("a"), "1");
        assert_eq!(s[0].label("b"), "q\"z");
        assert_eq!(s[0].value, 2.5);
        assert_eq!((s[1].name.as_str(), s[1].value), ("y", 3.0));
    }

    #[test]
    fn a_screen_fits_80_columns() {
        let r = Reading {
            at: Instant::now(),
            samples: parse(
                "colibri_stream_records{stream=\"telemetry-long-name\",queue=\"ready\"} 123456\n\
                 colibri_stream_dropped_records_total{stream=\"telemetry-long-name\",reason=\"oldest\"} 12\n\
                 colibri_stream_dropped_records_total{stream=\"telemetry-long-name\",reason=\"purged\"} 0\n\
                 colibri_stream_delivery_latency_seconds{stream=\"telemetry-long-name\",lane=\"live\"} 0.184\n\
                 colibri_stream_delivery_latency_seconds{stream=\"telemetry-long-name\",lane=\"backlog\"} 7250\n\
                 colibri_stream_moved_records_total{stream=\"telemetry-long-name\",direction=\"out\"} 4200\n\
                 colibri_sink_link_up{sink=\"upstream\"} 0\n",
            ),
            tasks: vec![
                serde_json::json!({"name": "rotate", "running": false, "last": null, "next": null}),
            ],
            sinks: vec![serde_json::json!({"name": "upstream", "link": "down",
                "last_error": {"at": "2026-12-03T10:00:00.000Z", "message": "connection refused ".repeat(9)}})],
        };
        let view = View {
            sort: Sort::Backlog,
            filter: String::new(),
            typing: false,
        };
        let lines = screen(&r, None, None, &view, Utc::now(), 80);
        assert!(lines.iter().all(|l| l.chars().count() <= 80));
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("telemetry-long-name") || l.starts_with("telemetry-long")),
            "{lines:#?}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("upstream") && l.contains("DOWN")),
            "{lines:#?}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("  last error") && l.contains("connection refused")),
            "{lines:#?}"
        );
        assert!(
            lines.iter().any(|l| l == "  dropped: oldest 12"),
            "{lines:#?}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l == "  latency: live 184ms, backlog 2h  moved out: 4.2k"),
            "{lines:#?}"
        );
    }

    #[test]
    fn the_innermost_cause_comes_first() {
        assert_eq!(
            cause_first(
                "http sink up (http://127.0.0.1:9/in): error sending request: client error (Connect): tcp connect error: Connection refused (os error 111)"
            ),
            "Connection refused (os error 111) (http sink up (http://127.0.0.1:9/in): error sending request: client error (Connect): tcp connect error)"
        );
        assert_eq!(
            cause_first("no agent answers at https://127.0.0.1:9464"),
            "no agent answers at https://127.0.0.1:9464"
        );
    }

    #[test]
    fn an_agent_that_stops_answering_is_away_and_back_without_rates_across() {
        let reading = || Reading {
            at: Instant::now(),
            samples: Vec::new(),
            tasks: Vec::new(),
            sinks: Vec::new(),
        };
        let (now, before, away) = next_reading(Ok(reading()), reading(), None, None);
        assert!(before.is_some() && away.is_none());
        let (now, before, away) = next_reading(Err(anyhow::anyhow!("gone")), now, before, away);
        let since = away.as_ref().expect("away").since;
        assert!(before.is_some());
        let (now, before, away) =
            next_reading(Err(anyhow::anyhow!("still gone")), now, before, away);
        let a = away.as_ref().expect("still away");
        assert_eq!((a.since, a.reason.as_str()), (since, "still gone"));
        let view = View {
            sort: Sort::Name,
            filter: String::new(),
            typing: false,
        };
        let lines = screen(&now, before.as_ref(), away.as_ref(), &view, Utc::now(), 80);
        assert!(lines[0].starts_with("AGENT AWAY since "), "{lines:#?}");
        assert!(
            lines[0].ends_with(": still gone; asking every 1s"),
            "{lines:#?}"
        );
        let (_, before, away) = next_reading(Ok(reading()), now, before, away);
        assert!(
            before.is_none() && away.is_none(),
            "back, no rate across the absence"
        );
    }

    #[test]
    fn ages_are_one_short_unit() {
        assert_eq!(short_age(45.2), "45s");
        assert_eq!(short_age(754.0), "12m");
        assert_eq!(short_age(3.0 * 3600.0 + 5.0), "3h");
        assert_eq!(short_age(2.5 * 86_400.0), "2d");
        assert_eq!(short_age(-3.0), "0s");
    }
}
