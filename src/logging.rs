//! Logging through `tracing` to stderr: text for a person at a terminal (colour only when stderr is a
//! terminal), JSON lines for machines and journald pipelines. Installed once by the CLI before the agent
//! starts; everything else only emits events.

use std::io::IsTerminal;

use tracing::level_filters::LevelFilter;

use crate::config::{LogFormat, LogLevel};

pub fn init(level: LogLevel, format: LogFormat) {
    let level = match level {
        LogLevel::Error => LevelFilter::ERROR,
        LogLevel::Warn => LevelFilter::WARN,
        LogLevel::Info => LevelFilter::INFO,
        LogLevel::Debug => LevelFilter::DEBUG,
        LogLevel::Trace => LevelFilter::TRACE,
    };
    let builder = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_target(false);
    JSON.store(
        format == LogFormat::Json,
        std::sync::atomic::Ordering::Relaxed,
    );
    // A second init (tests that run the agent in-process) keeps the first subscriber.
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .try_init(),
    };
}

static JSON: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Captured program output as a log field: left out when empty, kept raw in JSON (the JSON writer
/// escapes it), quoted and escaped in text so a multi-line tail stays on one log line.
pub fn output(s: &str) -> Option<tracing::field::DisplayValue<Output<'_>>> {
    (!s.is_empty()).then(|| tracing::field::display(Output(s)))
}

pub struct Output<'a>(&'a str);

impl std::fmt::Display for Output<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if JSON.load(std::sync::atomic::Ordering::Relaxed) {
            f.write_str(self.0)
        } else {
            write!(f, "{:?}", self.0)
        }
    }
}
