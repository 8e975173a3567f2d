//! Logging through `tracing`: to stderr by default (text for a person at a terminal, colour only
//! when stderr is a terminal; JSON lines for machines and journald pipelines), or, with `log.file`,
//! to a file that a thread of its own writes and rotates (`file`), for boxes without journald.
//! Installed once by the CLI before the agent starts, together with a panic hook that logs the panic
//! and flushes; `flush` and `exit` make sure the last events are in the file before the process
//! ends. Everything else only emits events; this module does not decide what is logged.

mod file;
pub mod summary;

use std::io::IsTerminal;
use std::sync::OnceLock;
use std::time::Duration;

use serde::Deserialize;
use tracing::Dispatch;
use tracing::level_filters::LevelFilter;
use tracing_subscriber::fmt::MakeWriter;

pub use file::LogFile;

// The level and format are the `log:` section's values as they are written in the file; serde reads
// them straight into these types so config needs no copy. No `///` docs here: they would become
// schema descriptions, and the schema must not change.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Error,
    Warn,
    #[default]
    Info,
    Debug,
    Trace,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// The longest [`flush`] waits for the writer thread: a stop must not hang on a dead disk.
const FLUSH_WAIT: Duration = Duration::from_secs(2);

/// The file writer of the installed subscriber, when `log.file` is set.
static FILE: OnceLock<file::FileWriter> = OnceLock::new();

/// Installs the subscriber and the panic hook. With `file`, events go there only; the error is
/// the file's (or the writer thread's) that could not be opened (started).
pub fn init(level: LogLevel, format: LogFormat, file: Option<&LogFile>) -> std::io::Result<()> {
    let level = match level {
        LogLevel::Error => LevelFilter::ERROR,
        LogLevel::Warn => LevelFilter::WARN,
        LogLevel::Info => LevelFilter::INFO,
        LogLevel::Debug => LevelFilter::DEBUG,
        LogLevel::Trace => LevelFilter::TRACE,
    };
    JSON.store(
        format == LogFormat::Json,
        std::sync::atomic::Ordering::Relaxed,
    );
    let (subscriber, writer) = match file {
        None => (
            dispatch(
                level,
                format,
                std::io::stderr().is_terminal(),
                std::io::stderr,
            ),
            None,
        ),
        Some(spec) => {
            let writer = file::start(spec.clone(), format, file::CAPACITY)?;
            (dispatch(level, format, false, writer.clone()), Some(writer))
        }
    };
    // A second init (tests that run the agent in-process) keeps the first subscriber.
    if tracing::dispatcher::set_global_default(subscriber).is_ok()
        && let Some(w) = writer
    {
        let _ = FILE.set(w);
    }
    install_panic_hook(file.is_some());
    Ok(())
}

/// The subscriber for `format`; `ansi` (colour) only applies to text.
fn dispatch<W>(level: LevelFilter, format: LogFormat, ansi: bool, writer: W) -> Dispatch
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(writer)
        .with_target(false);
    match format {
        LogFormat::Text => quiet(builder.with_ansi(ansi).finish()),
        LogFormat::Json => quiet(
            builder
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .with_span_list(false)
                .finish(),
        ),
    }
}

/// The dispatch of `subscriber`, with the protocol clients' own events left out: the NATS client
/// logs each failed reconnect as an ERROR, every few seconds through an outage, and the OPC UA
/// stack each failed connect and lost transport, while the sink or source reports the outage
/// once (a WARN when it goes down, an INFO when it is back), with the reason.
fn quiet<S>(subscriber: S) -> Dispatch
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a> + Send + Sync,
{
    use tracing_subscriber::layer::SubscriberExt as _;
    let clients: &[&str] = &[
        #[cfg(feature = "nats")]
        "async_nats",
        #[cfg(feature = "kafka")]
        "krafka",
        #[cfg(feature = "opcua")]
        "opcua_client",
        #[cfg(feature = "opcua")]
        "opcua_core",
        #[cfg(feature = "opcua")]
        "opcua_crypto",
        #[cfg(feature = "opcua")]
        "opcua_types",
    ];
    let targets = clients.iter().fold(
        tracing_subscriber::filter::Targets::new().with_default(LevelFilter::TRACE),
        |t, c| t.with_target(*c, LevelFilter::OFF),
    );
    Dispatch::new(subscriber.with(targets))
}

/// A panic (redb on a damaged page, or a bug) is logged like any other event, so JSON logs stay
/// one object per line, and flushed, so it is in the file even when the process dies of it. With
/// a file, Rust's default hook runs afterwards and prints it on stderr too (the supervisor's log);
/// without one stderr is the log, and gets the event only.
fn install_panic_hook(to_file: bool) {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let backtrace = std::backtrace::Backtrace::capture();
        // `info` reads "panicked at <file>:<line>:<column>:\n<message>".
        tracing::error!(panic = %info, backtrace = %backtrace, "panic");
        flush();
        if to_file {
            default(info);
        }
    }));
}

/// Writes the pending summaries of repeated events ([`summary`]), then every event queued so far,
/// and fdatasyncs the log file, waiting for it at most 2 s (without `log.file`, stderr is
/// unbuffered). Called before every exit of `colibri run`.
pub fn flush() {
    summary::flush();
    if let Some(w) = FILE.get() {
        w.flush(FLUSH_WAIT);
    }
}

/// [`flush`], then `std::process::exit(code)`: for exits that skip the normal return path.
pub fn exit(code: i32) -> ! {
    flush();
    std::process::exit(code)
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
