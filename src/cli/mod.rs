//! The command line: `run`, `check` (with `--bind`, [`bind`]), `queue ...`, `task ...`, `tap`, `top`, `schema` and `version`, their help text, and exit
//! codes (0 ok, 1 a bad config or a failure at run time, 2 a usage error). It loads the config,
//! installs logging and the runtime, and hands over to `agent` (or to `queue` for the operator's
//! commands); it does not validate anything itself.

mod admin_client;
mod bind;
#[cfg(feature = "opcua")]
mod opcua;
mod queue;
mod tap;
mod task;
mod top;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::config::{self, Config, Unset};
use crate::schedule::{Offset, Schedule};
use crate::units::{fmt_duration, fmt_size};

#[derive(Debug, Parser)]
#[command(
    name = "colibri",
    version,
    about = "A resident agent for edge machines: scheduled chores and store-and-forward telemetry",
    long_about = "A resident agent for edge machines: scheduled chores and store-and-forward telemetry.\n\n\
        Everything colibri does is described in one YAML file. Start with `colibri check` to see what a\n\
        file defines and whether it is valid, then `colibri run` to run it (under systemd in production).",
    after_help = "Examples:\n  colibri check --config configs/quickstart.yaml\n  colibri run --config /etc/colibri/colibri.yaml\n  COLIBRI_CONFIG=/etc/colibri/colibri.yaml colibri run"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the agent in the foreground until SIGTERM or SIGINT (logs go to stderr)
    #[command(
        long_about = "Run the agent in the foreground: schedule the tasks in the config file until SIGTERM or SIGINT.\n\n\
        On the first signal colibri stops starting new runs, gives running ones `shutdown_grace` to finish,\n\
        kills what is left (whole process groups) and exits 0. A second signal exits at once."
    )]
    Run(ConfigArg),
    /// Validate a config file: print a summary and exit 0, or list every problem and exit 1
    Check(CheckArgs),
    /// Inspect and repair the stream queues: stats, peek, push, dead-letter replay and purge
    #[command(subcommand)]
    Queue(queue::QueueCommand),
    /// The running agent's tasks: list them with their last and next runs, or run one now
    #[command(subcommand)]
    Task(task::TaskCommand),
    /// Print the records appended to a stream of the running agent as they arrive
    Tap(tap::TapArgs),
    /// A live view of the running agent: streams, sinks, tasks, sources (--once: plain text)
    Top(top::TopArgs),
    /// OPC UA servers: browse a server's nodes to write a source's `nodes:`
    #[cfg(feature = "opcua")]
    #[command(subcommand)]
    Opcua(opcua::OpcuaCommand),
    /// Print the JSON Schema of the config file, for editors and CI
    Schema,
    /// Print the version
    Version,
}

#[derive(Debug, Args)]
struct CheckArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Also bind every listener (admin, ingest, each source's ports) and close it again: report
    /// each that cannot be bound (a port taken, or one below 1024 without the right) and exit 1
    #[arg(long)]
    bind: bool,
}

#[derive(Debug, Args)]
pub(crate) struct ConfigArg {
    /// The YAML config file
    #[arg(
        short,
        long,
        env = "COLIBRI_CONFIG",
        default_value = "/etc/colibri/colibri.yaml"
    )]
    pub(crate) config: PathBuf,
}

/// The command line's definition: what `--help` shows, and what `tests/it/man.rs` renders colibri(1)
/// from.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Version => {
            println!("colibri {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Command::Schema => {
            print!("{}", config::json_schema());
            ExitCode::SUCCESS
        }
        Command::Queue(cmd) => queue::main(cmd),
        Command::Task(cmd) => task::main(cmd),
        Command::Tap(args) => tap::main(args),
        Command::Top(args) => top::main(args),
        #[cfg(feature = "opcua")]
        Command::Opcua(cmd) => opcua::main(cmd),
        // `check` validates the file without running it: an unset variable (a secret that only
        // the unit's environment file holds) is a warning here, and `run` refuses it.
        Command::Check(args) => {
            match config::load_with(
                &args.config.config,
                Unset::Warn {
                    needed: &[],
                    read_keys: true,
                },
            ) {
                Ok(c) => {
                    print_warnings(&c.warnings);
                    print!("{}", summary(&c));
                    if args.bind {
                        return check_binds(&c);
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    print_warnings(e.warnings());
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Run(args) => {
            let code = run(&args);
            // Every return of `run` passes here, so the last events (an ERROR before the stop
            // included) are in the log file before the process ends.
            crate::logging::flush();
            code
        }
    }
}

/// `check --bind`: every listener that cannot be bound, one line each.
fn check_binds(c: &Config) -> ExitCode {
    let failed = bind::try_binds(c);
    let tried = bind::listeners(c).len();
    for f in &failed {
        eprintln!("error: {f}");
    }
    if failed.is_empty() {
        println!("  bind            {tried} listeners bound and closed again");
        ExitCode::SUCCESS
    } else {
        eprintln!(
            "error: {} of {tried} listeners cannot be bound",
            failed.len()
        );
        ExitCode::FAILURE
    }
}

/// The file, for a command that does not run it: an unset variable elsewhere than in the
/// settings it `needed` (a sink's token, say, for `queue`) is a warning, not an error.
fn load_needing(arg: &ConfigArg, needed: &'static [&'static str]) -> anyhow::Result<Config> {
    // These commands talk to the agent or open its store; they serve nothing.
    match config::load_with(
        &arg.config,
        Unset::Warn {
            needed,
            read_keys: false,
        },
    ) {
        Ok(c) => {
            print_warnings(&c.warnings);
            Ok(c)
        }
        Err(e) => {
            print_warnings(e.warnings());
            Err(e.into())
        }
    }
}

/// Unix time `t` (seconds; 0 is none) as "in 3s" or "12s ago" from `now`; "-" for none. For the
/// views of a running agent (`task list`, `top`).
fn from_now(t: f64, now: chrono::DateTime<chrono::Utc>) -> String {
    if t <= 0.0 {
        return "-".into();
    }
    let d = t - now.timestamp_millis() as f64 / 1000.0;
    let span = fmt_duration(std::time::Duration::from_secs(d.abs() as u64));
    if d >= 0.0 {
        format!("in {span}")
    } else {
        format!("{span} ago")
    }
}

/// Unix seconds of an RFC 3339 time in the agent's JSON (0 for none).
fn unix_s(v: &serde_json::Value) -> f64 {
    v.as_str()
        .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok())
        .map_or(0.0, |t| t.timestamp_millis() as f64 / 1000.0)
}

/// `colibri run`. The runtime is dropped before this returns, so what its shutdown logs is
/// flushed too.
fn run(args: &ConfigArg) -> ExitCode {
    let config = match config::load(&args.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = crate::logging::init(
        config.log_level,
        config.log_format,
        config.log_file.as_ref(),
    ) {
        // Only a log file can fail (to open, or its writer thread to start).
        eprintln!("error: log.file: {e}");
        return ExitCode::FAILURE;
    }
    // glibc keeps freed memory for reuse; after a large file (10,000 tasks) the parse tree's
    // would stay resident for the life of the process.
    crate::memory::trim_heap();
    // One thread: task runs are child processes and timers, so a single event loop keeps
    // memory and idle wake-ups at their minimum.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let to_file = config.log_file.is_some();
    match runtime.block_on(crate::agent::run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Once: without `log.file` the log is stderr (the journal, under systemd), so the
            // event is the report; with one, the event goes to the file and stderr (what the
            // supervisor shows) gets the line too.
            tracing::error!("{e:#}");
            if to_file {
                eprintln!("error: {e:#}");
            }
            ExitCode::FAILURE
        }
    }
}

/// The config's warnings on stderr, one line each.
pub(crate) fn print_warnings(warnings: &[String]) {
    for w in warnings {
        eprintln!("warning: {w}");
    }
}

/// At most this many tasks are listed by `check`; the rest are counted.
const SUMMARY_ROWS: usize = 20;

/// The one-screen summary `colibri check` prints.
pub fn summary(c: &Config) -> String {
    let mut out = String::new();
    let now = chrono::Utc::now();
    let _ = writeln!(out, "{}: ok", c.source.display());
    summarize_process(&mut out, c);
    if !c.streams.is_empty() {
        summarize_telemetry(&mut out, c);
        summarize_streams(&mut out, c);
    }
    let _ = writeln!(out, "  tasks           {}", c.tasks.len());
    if !c.tasks.is_empty() {
        summarize_tasks(&mut out, c, now);
    }
    out
}

/// The process's own settings: data_dir, workers, shutdown_grace, log.
fn summarize_process(out: &mut String, c: &Config) {
    let _ = writeln!(out, "  data_dir        {}", c.data_dir.display());
    let _ = writeln!(out, "  workers         {}", c.workers);
    let _ = writeln!(out, "  shutdown_grace  {}", fmt_duration(c.shutdown_grace));
    let mut log = format!("{:?}, {:?}", c.log_level, c.log_format).to_lowercase();
    if let Some(f) = &c.log_file {
        let _ = write!(
            log,
            ", to {} (rotated at {}, {} kept)",
            f.path.display(),
            fmt_size(f.max_size),
            f.max_files
        );
    }
    let _ = writeln!(out, "  log             {log}");
}

/// What carries records (shown when streams are configured): storage, sinks, the admin
/// endpoint, ingest and sources.
fn summarize_telemetry(out: &mut String, c: &Config) {
    let _ = writeln!(
        out,
        "  storage         max {}, keep {} free",
        fmt_size(c.storage.max_bytes),
        fmt_size(c.storage.min_free)
    );
    if !c.sinks.is_empty() {
        let sinks: Vec<String> = c.sinks.iter().map(|k| k.describe()).collect();
        let _ = writeln!(out, "  sinks           {}", sinks.join(", "));
    }
    match &c.admin {
        Some(a) => {
            let _ = writeln!(
                out,
                "  admin           {}://{}/metrics, /healthz, /readyz, POST /-/reload{}",
                if a.tls.is_some() { "https" } else { "http" },
                a.listen,
                if a.token.is_some() {
                    ", bearer token required"
                } else {
                    ""
                }
            );
        }
        None => {
            let _ = writeln!(out, "  admin           off");
        }
    }
    if let Some(i) = &c.ingest {
        let _ = writeln!(out, "  ingest          {}", i.describe());
    }
    for s in &c.sources {
        let _ = writeln!(out, "  source {:<8} {}", s.name(), s.describe());
    }
}

/// The streams, a line each: where they deliver and their bounds.
fn summarize_streams(out: &mut String, c: &Config) {
    let _ = writeln!(out, "  streams         {}", c.streams.len());
    for s in &c.streams {
        let ttl = s
            .ttl
            .map_or(String::new(), |t| format!(", ttl {}", fmt_duration(t)));
        let to = s
            .sink
            .as_deref()
            .map_or("queue only".to_string(), |k| format!("to {k}"));
        let _ = writeln!(
            out,
            "    {:<14} {to}, max {} jobs / {}, when full: {}{ttl}, jobs of <= {} records / {}",
            s.name,
            s.max_jobs,
            fmt_size(s.max_bytes),
            s.when_full,
            s.batch.max_records,
            fmt_size(s.batch.max_bytes),
        );
    }
}

/// The first [`SUMMARY_ROWS`] tasks as a table, each with its next run; the rest counted.
fn summarize_tasks(out: &mut String, c: &Config, now: chrono::DateTime<chrono::Utc>) {
    let rows: Vec<[String; 5]> = c
        .tasks
        .iter()
        .take(SUMMARY_ROWS)
        .map(|t| {
            [
                t.name.clone(),
                t.action.kind().to_string(),
                t.schedule.to_string(),
                fmt_duration(t.timeout),
                next_run(&t.schedule, now),
            ]
        })
        .collect();
    let headers = ["NAME", "TYPE", "SCHEDULE", "TIMEOUT", "NEXT RUN"];
    let widths: Vec<usize> = (0..4)
        .map(|i| {
            rows.iter()
                .map(|r| r[i].chars().count())
                .max()
                .unwrap_or(0)
                .max(headers[i].len())
        })
        .collect();
    let line = |cells: [&str; 5]| {
        let mut l = String::from("   ");
        for (i, cell) in cells.iter().enumerate() {
            if i < 4 {
                let _ = write!(l, " {cell:<w$} ", w = widths[i]);
            } else {
                let _ = write!(l, " {cell}");
            }
        }
        l.trim_end().to_string()
    };
    let _ = writeln!(out, "{}", line(headers));
    for r in &rows {
        let _ = writeln!(out, "{}", line([&r[0], &r[1], &r[2], &r[3], &r[4]]));
    }
    if c.tasks.len() > SUMMARY_ROWS {
        let _ = writeln!(out, "    ... and {} more", c.tasks.len() - SUMMARY_ROWS);
    }
}

/// When a task with `schedule` runs next: a local time for a cron schedule, else relative to
/// the start.
fn next_run(schedule: &Schedule, now: chrono::DateTime<chrono::Utc>) -> String {
    match schedule {
        Schedule::Cron(cron) => cron.next_after(now).map_or_else(
            || "never".to_string(),
            |n| {
                n.with_timezone(&chrono::Local)
                    .format("%Y-%m-%d %H:%M:%S %Z")
                    .to_string()
            },
        ),
        Schedule::Every {
            offset: Offset::Fixed(d),
            ..
        } if d.is_zero() => "at start".into(),
        Schedule::Every {
            offset: Offset::Fixed(d),
            ..
        } => format!("{} after start", fmt_duration(*d)),
        Schedule::Every {
            period,
            offset: Offset::Random,
        } => {
            format!("within {} of start", fmt_duration(*period))
        }
        Schedule::Reboot => "at start".into(),
    }
}
