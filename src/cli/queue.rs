//! `colibri queue ...`: the operator's view of the stream queues. `stats`, `peek` and `dead list`
//! open the store read-only, so they work beside a running agent. `push`, `dead replay` and `dead
//! purge` change the queues: through the running agent's admin endpoint when it answers (the
//! store has one writer), otherwise in the store itself (`Via`), with the same output; `push`
//! creates the store (and its data directory) as `colibri run` does when there is none yet.
//! `pause` and `resume` ask the running agent only. The file is loaded without needing the
//! unit's secrets (`config::Unset::Warn`): only where the store is and its streams must be there.
//! `--json` output is plain data for scripts. Long operations work in chunks with a progress line;
//! `purge` asks for confirmation on a terminal and, without one, refuses (exit 2) unless `--yes`.

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;

use anyhow::Context as _;

use clap::{Args, Subcommand};

use super::admin_client::{AdminArgs, AdminClient, AdminError};
use crate::clock;
use crate::config::{self, Config};
use crate::record::RecordFormat;
use crate::store::{self, OpenOptions, RecordBuf, Store, StoreError};
use crate::units::fmt_duration;

#[derive(Debug, Subcommand)]
pub enum QueueCommand {
    /// Per stream: jobs, records and bytes in ready, retry and dead; age of the oldest job; totals;
    /// whether the running agent has it paused
    Stats {
        #[command(flatten)]
        config: super::ConfigArg,
        #[command(flatten)]
        admin: AdminArgs,
        /// Print JSON instead of a table
        #[arg(long)]
        json: bool,
    },
    /// Show the oldest jobs of a stream without taking them
    Peek {
        #[command(flatten)]
        config: super::ConfigArg,
        /// The stream
        stream: String,
        /// Show dead letters instead of queued jobs (as `dead list` does)
        #[arg(long)]
        dead: bool,
        #[command(flatten)]
        show: Show,
    },
    /// Append lines from stdin to a stream, one record per line, checked as the stream's sink needs
    /// them (JSON, or line protocol); prints "acked N" after each durable batch (through the
    /// running agent, or into the store when it is stopped)
    Push {
        #[command(flatten)]
        config: super::ConfigArg,
        #[command(flatten)]
        admin: AdminArgs,
        /// The stream
        stream: String,
        /// Records per commit
        #[arg(long, default_value_t = 100)]
        batch: usize,
    },
    /// Stop delivering a stream in the running agent (appends go on and queue up) until `resume`
    /// or a restart
    Pause {
        #[command(flatten)]
        config: super::ConfigArg,
        #[command(flatten)]
        admin: AdminArgs,
        /// The stream
        stream: String,
    },
    /// Deliver a paused stream again
    Resume {
        #[command(flatten)]
        config: super::ConfigArg,
        #[command(flatten)]
        admin: AdminArgs,
        /// The stream
        stream: String,
    },
    /// Dead letters: list them, replay them into the queue, or purge them
    #[command(subcommand)]
    Dead(DeadCommand),
    /// Read a damaged store file (one moved aside as colibri.redb.corrupt-<ms>) and append every
    /// intact job in it to the configured store, under its stream; prints what was restored and
    /// what was lost (the agent must be stopped)
    Salvage {
        #[command(flatten)]
        config: super::ConfigArg,
        /// The damaged file
        file: std::path::PathBuf,
        /// Print the report as JSON
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum DeadCommand {
    /// Show the oldest dead letters of a stream with the reason each failed (read-only; through
    /// the running agent when it answers, or from the store)
    List {
        #[command(flatten)]
        target: DeadTarget,
        #[command(flatten)]
        admin: AdminArgs,
        #[command(flatten)]
        show: Show,
    },
    /// Move dead letters back to the queue with their attempts reset (through the running agent,
    /// or in the store when it is stopped); in chunks, so an interrupted replay is finished by
    /// running it again
    Replay {
        #[command(flatten)]
        target: DeadTarget,
        #[command(flatten)]
        admin: AdminArgs,
        /// Only the job with this id
        #[arg(long, conflicts_with = "older_than")]
        id: Option<u64>,
        /// Only those that failed longer ago than this, e.g. 1h
        #[arg(long, value_parser = parse_dur)]
        older_than: Option<std::time::Duration>,
        /// Print the outcome as JSON
        #[arg(long)]
        json: bool,
    },
    /// Delete dead letters for good; counted as dropped (through the running agent, or in the
    /// store when it is stopped). Asks first on a terminal; without one it needs --yes
    Purge {
        #[command(flatten)]
        target: DeadTarget,
        #[command(flatten)]
        admin: AdminArgs,
        /// Only those that failed longer ago than this, e.g. 7d
        #[arg(long, value_parser = parse_dur)]
        older_than: Option<std::time::Duration>,
        /// Do not ask for confirmation
        #[arg(long)]
        yes: bool,
        /// Print the outcome as JSON
        #[arg(long)]
        json: bool,
    },
}

/// How many jobs `peek` and `dead list` show, and how.
#[derive(Debug, Args)]
pub struct Show {
    /// How many jobs
    #[arg(short = 'n', long, default_value_t = 10, conflicts_with = "all")]
    count: usize,
    /// Every job (large output for a large backlog)
    #[arg(long)]
    all: bool,
    /// One JSON object per job, per line
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct DeadTarget {
    #[command(flatten)]
    config: super::ConfigArg,
    /// The stream
    stream: String,
}

fn parse_dur(s: &str) -> Result<std::time::Duration, String> {
    crate::units::parse_duration(s)
}

/// Jobs per transaction for long operations, so progress can be shown and memory stays bounded.
mod stats;
use stats::stats;

const CHUNK: usize = 1000;

pub fn main(cmd: QueueCommand) -> ExitCode {
    // redb can panic on a damaged page instead of returning an error: report it as what it is.
    let result = std::panic::catch_unwind(|| run(cmd)).unwrap_or_else(|_| {
        Err(anyhow::anyhow!(
            "the store file is damaged (redb failed reading it); `colibri run` verifies it and moves a corrupted file aside"
        ))
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            if e.is::<Usage>() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// A command line that cannot be carried out as written (exit code 2, like clap's own usage
/// errors): a script sees it apart from a failure.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Usage(String);

fn load(arg: &super::ConfigArg) -> anyhow::Result<Config> {
    super::load_needing(arg, config::QUEUE_NEEDS)
}

/// How a command uses the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    /// `stats`, `peek`, `dead list`: read-only, so they work beside a running agent.
    Read,
    /// `dead replay`, `dead purge`: they change jobs that must be there already.
    Change,
    /// `push`: appends, creating the data directory and the store as `colibri run` would.
    Append,
}

fn open(c: &Config, access: Access) -> anyhow::Result<Store> {
    if c.streams.is_empty() {
        anyhow::bail!("{} defines no streams", c.source.display());
    }
    let read_only = access == Access::Read;
    let opts = OpenOptions {
        read_only,
        ..OpenOptions::default()
    };
    let path = c.data_dir.join(store::DB_FILE);
    if access == Access::Append {
        store::create_data_dir(&c.data_dir)
            .with_context(|| format!("cannot create data_dir {}", c.data_dir.display()))?;
    } else if !path.exists() {
        anyhow::bail!(
            "no store at {} yet (`colibri run` creates it when it first runs, and so does `colibri queue push`)",
            path.display()
        );
    }
    let opened = match Store::open(&c.data_dir, c.storage, &c.streams, opts) {
        // A read-only open refuses a file that was not closed cleanly (a crash, a full disk) when
        // no agent holds it. Open it writable once, which repairs it, then look again.
        Err(StoreError::NeedsRepair { .. }) if read_only => {
            drop(Store::open(
                &c.data_dir,
                c.storage,
                &c.streams,
                OpenOptions::default(),
            )?);
            Store::open(&c.data_dir, c.storage, &c.streams, opts)
        }
        other => other,
    };
    opened.map_err(|e| match e {
        StoreError::Locked { .. } => anyhow::anyhow!(
            "{e}; `stats` and `peek` work beside a running agent, `push` and `dead` reach it through its admin endpoint (none answered at admin.listen: pass --admin URL)"
        ),
        // The file is named once.
        other if other.names_file() => anyhow::Error::from(other),
        other => anyhow::Error::from(other).context(format!("cannot open {}", path.display())),
    })
}

fn known(s: &Store, stream: &str) -> anyhow::Result<()> {
    if s.counters(stream).is_none() {
        let names: Vec<String> = s.streams().map(|(c, _)| c.name.clone()).collect();
        anyhow::bail!("unknown stream {stream:?} (streams: {})", names.join(", "));
    }
    Ok(())
}

fn run(cmd: QueueCommand) -> anyhow::Result<()> {
    match cmd {
        QueueCommand::Stats {
            config,
            admin,
            json,
        } => stats(&load(&config)?, &admin, json),
        QueueCommand::Peek {
            config,
            stream,
            dead,
            show,
        } => show_jobs(&load(&config)?, &stream, dead, &show),
        QueueCommand::Dead(DeadCommand::List {
            target,
            admin,
            show,
        }) => dead_list(&target, &admin, &show),
        QueueCommand::Push {
            config,
            admin,
            stream,
            batch,
        } => {
            let c = load(&config)?;
            push(&c, via(&c, &admin, Access::Append)?, &stream, batch.max(1))
        }
        QueueCommand::Pause {
            config,
            admin,
            stream,
        } => pause(&load(&config)?, &admin, &stream, true),
        QueueCommand::Resume {
            config,
            admin,
            stream,
        } => pause(&load(&config)?, &admin, &stream, false),
        QueueCommand::Salvage { config, file, json } => salvage(&load(&config)?, &file, json),
        QueueCommand::Dead(DeadCommand::Replay {
            target,
            admin,
            id,
            older_than,
            json,
        }) => dead_replay(&target, &admin, id, older_than, json),
        QueueCommand::Dead(DeadCommand::Purge {
            target,
            admin,
            older_than,
            yes,
            json,
        }) => dead_purge(&target, &admin, older_than, yes, json),
    }
}

/// `dead list`: through the running agent when it answers, else from the store.
fn dead_list(target: &DeadTarget, admin: &AdminArgs, show: &Show) -> anyhow::Result<()> {
    let c = load(&target.config)?;
    let stream = &target.stream;
    match via(&c, admin, Access::Read)? {
        Via::Agent(a) => match list_dead_via(&a, stream, show)? {
            Listed::Done => Ok(()),
            // Reading changes nothing: the store beside the agent answers as well.
            Listed::Refused(why) => {
                eprintln!("{why}; reading the store instead");
                list_jobs(&open(&c, Access::Read)?, stream, true, show)
            }
        },
        Via::Store(s) => list_jobs(&s, stream, true, show),
    }
}

/// `dead replay`: in chunks, each its own commit, through the agent or in the store.
fn dead_replay(
    target: &DeadTarget,
    admin: &AdminArgs,
    id: Option<u64>,
    older_than: Option<std::time::Duration>,
    json: bool,
) -> anyhow::Result<()> {
    let c = load(&target.config)?;
    let stream = &target.stream;
    let mut via = via(&c, admin, Access::Change)?;
    let total = via.dead_jobs(&c, stream)?;
    // One cut-off for the whole run: a job that fails again while it runs (the agent
    // delivering) dies after it and is not replayed again and again.
    let before = cut_off(older_than);
    let (jobs, records) = match &mut via {
        Via::Store(s) => in_chunks(
            "replayed",
            total,
            |j| j == 0 || id.is_some(),
            || chunk(s, |tx| tx.replay_dead(stream, id, Some(before), CHUNK)),
        )?,
        Via::Agent(a) => {
            let mut q = format!("limit={CHUNK}&failed_before_ms={before}");
            if let Some(id) = id {
                q.push_str(&format!("&id={id}"));
            }
            in_chunks(
                "replayed",
                total,
                |j| j == 0 || id.is_some(),
                || a.counts(&format!("/-/queues/{stream}/dead/replay?{q}")),
            )?
        }
    };
    if json {
        let doc = serde_json::json!({
            "stream": stream, "replayed_jobs": jobs, "replayed_records": records,
        });
        println!("{doc}");
    } else {
        println!(
            "replayed {} ({}) of stream {stream:?} into its queue",
            count(jobs, "dead job"),
            count(records, "record"),
        );
    }
    Ok(())
}

/// `dead purge`: once confirmed ([`purge_confirmed`]), in chunks, each its own commit.
fn dead_purge(
    target: &DeadTarget,
    admin: &AdminArgs,
    older_than: Option<std::time::Duration>,
    yes: bool,
    json: bool,
) -> anyhow::Result<()> {
    let c = load(&target.config)?;
    let mut via = via(&c, admin, Access::Change)?;
    let counters = via.counters(&c, &target.stream)?;
    let what = match older_than {
        Some(d) => format!(
            "the dead jobs of stream {:?} that failed more than {} ago",
            target.stream,
            fmt_duration(d)
        ),
        None => format!(
            "{} ({}) of stream {:?}",
            count(counters.dead_jobs, "dead job"),
            count(counters.dead_records, "record"),
            target.stream
        ),
    };
    if !yes && !purge_confirmed(&what)? {
        println!("nothing purged");
        return Ok(());
    }
    let stream = &target.stream;
    let before = cut_off(older_than);
    let last = |j| j < CHUNK as u64;
    let (jobs, records) = match &mut via {
        Via::Store(s) => {
            let done = in_chunks("purged", counters.dead_jobs, last, || {
                chunk(s, |tx| tx.purge_dead(stream, Some(before), CHUNK))
            })?;
            // Purged file jobs take their spooled files with them (the running agent's
            // writer does so itself).
            s.dispose_now()?;
            done
        }
        Via::Agent(a) => {
            let q = format!("limit={CHUNK}&failed_before_ms={before}");
            in_chunks("purged", counters.dead_jobs, last, || {
                a.counts(&format!("/-/queues/{stream}/dead/purge?{q}"))
            })?
        }
    };
    if json {
        let doc = serde_json::json!({
            "stream": target.stream, "purged_jobs": jobs, "purged_records": records,
        });
        println!("{doc}");
    } else {
        println!(
            "purged {} ({}) of stream {:?}",
            count(jobs, "dead job"),
            count(records, "record"),
            target.stream
        );
    }
    Ok(())
}

/// Whether the operator at the terminal confirms deleting `what`; without a terminal nobody can,
/// which is a usage error.
fn purge_confirmed(what: &str) -> anyhow::Result<bool> {
    if !std::io::stdin().is_terminal() {
        return Err(Usage(format!(
            "not purging {what}: stdin is not a terminal, so nobody can confirm; add --yes to purge without asking"
        ))
        .into());
    }
    confirm(&format!("delete {what} for good?"))
}

/// Changes dead letters one chunk at a time (`dead replay`, `dead purge`; each chunk its own
/// commit, so an interrupted run has done what it showed and a second run finishes it) until
/// `last` says, from the jobs a chunk changed, that it was the last one; shows progress on a
/// terminal. The jobs and records changed in all.
fn in_chunks(
    verb: &'static str,
    total: u64,
    last: impl Fn(u64) -> bool,
    mut chunk: impl FnMut() -> anyhow::Result<(u64, u64)>,
) -> anyhow::Result<(u64, u64)> {
    let (mut jobs, mut records) = (0u64, 0u64);
    let mut progress = Progress::new(verb, total);
    loop {
        let (j, r) = chunk()?;
        jobs += j;
        records += r;
        progress.show(jobs);
        if last(j) {
            break;
        }
    }
    progress.done();
    Ok((jobs, records))
}

/// One transaction of the store's.
fn chunk(
    s: &mut Store,
    change: impl FnOnce(&mut store::Tx<'_>) -> Result<(u64, u64), StoreError>,
) -> anyhow::Result<(u64, u64)> {
    let mut tx = s.transaction()?;
    let n = change(&mut tx)?;
    tx.commit()?;
    Ok(n)
}

/// The dead letters a replay or purge takes: those that failed before this (Unix ms): `older_than`
/// ago, or now (all of them, but none that fail again while it runs).
fn cut_off(older_than: Option<std::time::Duration>) -> u64 {
    match older_than {
        Some(d) => clock::now_ms().saturating_sub(d.as_millis() as u64),
        None => clock::now_ms() + 1,
    }
}

/// Where a command that changes the queues goes: the running agent (the store has one writer),
/// or the store itself when no agent answers.
enum Via {
    Agent(AdminClient),
    Store(Store),
}

/// The running agent when its admin endpoint answers, otherwise the store opened for `access`.
fn via(c: &Config, admin: &AdminArgs, access: Access) -> anyhow::Result<Via> {
    // Without an address to ask (admin off, or port 0 and no --admin) only the store is left;
    // its lock then says whether an agent holds it.
    match AdminClient::new(c, admin) {
        Ok(client) => match client.get("/healthz") {
            Ok(_) => return Ok(Via::Agent(client)),
            Err(AdminError::NotRunning(_)) => {}
            Err(AdminError::Other(e)) => return Err(e),
        },
        // Asked for explicitly (an address, or HTTPS that needs its settings): say what is wrong.
        Err(e) if admin.admin.is_some() || c.admin.as_ref().is_some_and(|a| a.tls.is_some()) => {
            return Err(e);
        }
        Err(_) => {}
    }
    Ok(Via::Store(open(c, access)?))
}

impl Via {
    /// The stream's counters; through the agent they are read beside it (read-only), as `stats`
    /// does.
    fn counters(&mut self, c: &Config, stream: &str) -> anyhow::Result<store::Counters> {
        let read;
        let s = match self {
            Via::Store(s) => &*s,
            Via::Agent(_) => {
                read = open(c, Access::Read)?;
                &read
            }
        };
        known(s, stream)?;
        Ok(s.counters(stream).cloned().unwrap_or_default())
    }

    fn dead_jobs(&mut self, c: &Config, stream: &str) -> anyhow::Result<u64> {
        Ok(self.counters(c, stream)?.dead_jobs)
    }
}

impl AdminClient {
    /// A POST whose answer is `{"jobs", "records"}`.
    fn counts(&self, path: &str) -> anyhow::Result<(u64, u64)> {
        let v = self.post_json(path, String::new())?;
        Ok((
            v["jobs"].as_u64().unwrap_or(0),
            v["records"].as_u64().unwrap_or(0),
        ))
    }
}

/// `queue pause / resume`: only a running agent delivers, so only it can be asked.
fn pause(c: &Config, admin: &AdminArgs, stream: &str, pause: bool) -> anyhow::Result<()> {
    let client = AdminClient::new(c, admin)?;
    let verb = if pause { "pause" } else { "resume" };
    let v = match client.post_json(&format!("/-/queues/{stream}/{verb}"), String::new()) {
        Err(e)
            if e.downcast_ref::<AdminError>()
                .is_some_and(|e| matches!(e, AdminError::NotRunning(_))) =>
        {
            anyhow::bail!(
                "{e}: a stream is paused in a running agent (a start delivers every stream)"
            )
        }
        other => other?,
    };
    let state = if pause { "paused" } else { "delivering" };
    let already = if v["changed"] == false {
        " (already)"
    } else {
        ""
    };
    println!("stream {stream:?}: {state}{already}");
    Ok(())
}

/// `1 record`, `2 records`.
fn count(n: u64, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// `peek` and `dead list` from the store: the oldest jobs of a stream, as text or one JSON
/// object per line.
fn show_jobs(c: &Config, stream: &str, dead: bool, show: &Show) -> anyhow::Result<()> {
    list_jobs(&open(c, Access::Read)?, stream, dead, show)
}

fn list_jobs(s: &Store, stream: &str, dead: bool, show: &Show) -> anyhow::Result<()> {
    known(s, stream)?;
    let n = if show.all { usize::MAX } else { show.count };
    // One job decoded at a time, written through a buffer (stdout alone flushes every line: a
    // write per record).
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut printed = 0u64;
    s.peek_each(stream, dead, n, |job| {
        printed += 1;
        print_job(&mut out, &job.to_json(), show.json).map_err(anyhow::Error::from)
    })?;
    out.flush()?;
    say_if_none(printed, stream, dead);
    Ok(())
}

/// An empty list says so (on stderr: standard output stays what a script counts lines of).
fn say_if_none(printed: u64, stream: &str, dead: bool) {
    if printed == 0 {
        let what = if dead { "dead letters" } else { "jobs waiting" };
        eprintln!("no {what} in stream {stream}");
    }
}

/// How a list through the agent ended.
enum Listed {
    Done,
    /// Before anything was printed, the agent would not list (no token or a wrong one, or an
    /// agent older than the route): why.
    Refused(String),
}

/// `dead list` through the running agent: pages of `GET /-/queues/{stream}/dead`, printed as
/// the store's own list is.
fn list_dead_via(a: &AdminClient, stream: &str, show: &Show) -> anyhow::Result<Listed> {
    let mut left = if show.all {
        u64::MAX
    } else {
        show.count as u64
    };
    let mut after: Option<u64> = None;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut printed = 0u64;
    while left > 0 {
        let mut path = format!("/-/queues/{stream}/dead?limit={}", left.min(1000));
        if let Some(a) = after {
            path.push_str(&format!("&after={a}"));
        }
        let answer = a.get(&path)?;
        let v: serde_json::Value = match serde_json::from_str(&answer.body) {
            Ok(v) => v,
            // A refusal may be plain text (an older agent's 404, the token's 401).
            Err(_) if answer.status != 200 => serde_json::Value::Null,
            Err(e) => anyhow::bail!("GET {path}: the agent's answer is not JSON: {e}"),
        };
        if answer.status != 200 {
            let why = format!(
                "GET {path}: {} (the agent answered {})",
                v["error"].as_str().unwrap_or(answer.body.trim()),
                answer.status
            );
            if after.is_none() && matches!(answer.status, 401 | 403 | 404) {
                return Ok(Listed::Refused(why));
            }
            anyhow::bail!(why);
        }
        let jobs = v["jobs"].as_array().map_or(&[][..], Vec::as_slice);
        for job in jobs
            .iter()
            .take(usize::try_from(left).unwrap_or(usize::MAX))
        {
            print_job(&mut out, job, show.json)?;
            left -= 1;
            printed += 1;
        }
        out.flush()?;
        match v["next"].as_u64() {
            Some(next) if after.is_some_and(|a| next <= a) => {
                anyhow::bail!("GET {path}: the agent's next page ({next}) does not move on")
            }
            Some(next) => after = Some(next),
            None => break,
        }
    }
    say_if_none(printed, stream, true);
    Ok(Listed::Done)
}

/// One job (as [`store::Peeked::to_json`] makes it, from the store or the agent): its JSON line,
/// or a line about it and its records indented below.
fn print_job(out: &mut impl Write, job: &serde_json::Value, json: bool) -> std::io::Result<()> {
    if json {
        // Straight into the writer: `{job}` goes through `fmt`, a small write per escaped piece.
        serde_json::to_writer(&mut *out, job)?;
        return out.write_all(b"\n");
    }
    let created = job["created_ms"]
        .as_i64()
        .and_then(chrono::DateTime::from_timestamp_millis)
        .map_or("?".into(), |t| {
            t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
        });
    write!(
        out,
        "{} #{} created {created}, {} bytes",
        job["table"].as_str().unwrap_or("?"),
        job["id"],
        job["bytes"]
    )?;
    if let Some(n) = job["attempts"].as_u64().filter(|&n| n > 0) {
        write!(out, ", {n} attempts")?;
    }
    if let Some(e) = job["last_error"].as_str() {
        write!(out, ", last error: {e}")?;
    }
    if let Some(o) = job["salvaged_from"].as_object() {
        write!(
            out,
            ", salvaged from store {} #{}",
            o["store_id"].as_str().unwrap_or("?"),
            o["job"]
        )?;
    }
    if let Some(o) = job["moved_from"].as_object() {
        write!(
            out,
            ", moved from stream {} (key {}:{}:{})",
            o["stream"].as_str().unwrap_or("?"),
            o["store_id"].as_str().unwrap_or("?"),
            o["stream"].as_str().unwrap_or("?"),
            o["job"]
        )?;
    }
    writeln!(out)?;
    match job["records"].as_array() {
        Some(records) => {
            for r in records {
                writeln!(out, "  {}", r.as_str().unwrap_or_default())?;
            }
        }
        None => writeln!(
            out,
            "  (cannot be decoded: {})",
            job["decode_error"].as_str().unwrap_or("?")
        )?,
    }
    Ok(())
}

fn push(c: &Config, mut via: Via, stream: &str, batch: usize) -> anyhow::Result<()> {
    if let Via::Store(s) = &via {
        known(s, stream)?;
    }
    // Each line is checked as the stream's sink needs it, as the ingest API checks a body.
    let carries = c.record_format(stream);
    let stdin = std::io::stdin().lock();
    let mut out = std::io::stdout().lock();
    let mut pending = RecordBuf::new();
    let mut acked = 0u64;
    let mut flush =
        |pending: &mut RecordBuf, acked: &mut u64, out: &mut dyn Write| -> anyhow::Result<()> {
            if pending.is_empty() {
                return Ok(());
            }
            match &mut via {
                Via::Store(s) => {
                    let mut tx = s.transaction()?;
                    tx.append(stream, pending, None, clock::now_ms())?;
                    tx.commit()?;
                }
                Via::Agent(a) => {
                    let mut body = Vec::new();
                    for r in pending.iter() {
                        body.extend_from_slice(r);
                        body.push(b'\n');
                    }
                    let body = String::from_utf8(body).context("a record is not UTF-8")?;
                    a.post_json(&format!("/-/queues/{stream}/records"), body)
                        .with_context(|| format!("after acked {acked}"))?;
                }
            }
            *acked += pending.len() as u64;
            pending.clear();
            // Printed only after the commit is durable: a line here is a receipt.
            writeln!(out, "acked {acked}")?;
            out.flush()?;
            Ok(())
        };
    for (i, line) in stdin.split(b'\n').enumerate() {
        let line = line?;
        let record = match crate::record::line::line_record(carries, &line, clock::unix_ns()) {
            Ok(None) => continue,
            Ok(Some(r)) => Ok(r),
            Err(why) => Err(match carries {
                RecordFormat::Json => format!("{why} (stream {stream:?}'s sink sends JSON)"),
                _ => format!("{why} (stream {stream:?}'s sink has encoding: influx_line)"),
            }),
        };
        match record {
            Ok(r) => pending.push(&r),
            Err(why) => {
                // What came before the bad line is stored; nothing from it on.
                flush(&mut pending, &mut acked, &mut out)?;
                anyhow::bail!(
                    "stdin line {} {why}; the lines before it are stored (acked {acked}), nothing from line {} on",
                    i + 1,
                    i + 1
                );
            }
        }
        if pending.len() >= batch {
            flush(&mut pending, &mut acked, &mut out)?;
        }
    }
    flush(&mut pending, &mut acked, &mut out)?;
    Ok(())
}

/// Asks on the terminal (the caller has checked there is one).
/// `queue salvage`: the file is checked before the store is opened (or created), and refused
/// when it is the configured store itself (its jobs would be queued twice).
fn salvage(c: &Config, file: &std::path::Path, json: bool) -> anyhow::Result<()> {
    let meta =
        std::fs::metadata(file).with_context(|| format!("cannot read {}", file.display()))?;
    if !meta.is_file() {
        anyhow::bail!("{} is not a file", file.display());
    }
    let live = c.data_dir.join(store::DB_FILE);
    let same = |a: &std::path::Path, b: &std::path::Path| matches!((a.canonicalize(), b.canonicalize()), (Ok(a), Ok(b)) if a == b);
    if same(file, &live) {
        return Err(Usage(format!(
            "{} is the configured store itself; salvage reads a file moved aside (colibri.redb.corrupt-<ms>)",
            file.display()
        ))
        .into());
    }
    let mut s = open(c, Access::Append)?;
    let report = s
        .salvage_from(file)
        .with_context(|| format!("cannot salvage {}", file.display()))?;
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!("{report}");
    }
    Ok(())
}

fn confirm(question: &str) -> anyhow::Result<bool> {
    eprint!("{question} [y/N] ");
    std::io::stderr().flush()?;
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer)?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
}

/// A one-line progress report on stderr, redrawn in place on a terminal.
struct Progress {
    verb: &'static str,
    total: u64,
    tty: bool,
    shown: bool,
}

impl Progress {
    fn new(verb: &'static str, total: u64) -> Self {
        Progress {
            verb,
            total,
            tty: std::io::stderr().is_terminal(),
            shown: false,
        }
    }

    fn show(&mut self, done: u64) {
        if self.tty && self.total > CHUNK as u64 {
            let pct = (done * 100)
                .checked_div(self.total)
                .map_or(100, |p| p.min(100));
            let width = 30;
            let filled = (pct as usize * width) / 100;
            eprint!(
                "\r{} [{}{}] {done}/{} jobs",
                self.verb,
                "#".repeat(filled),
                " ".repeat(width - filled),
                self.total
            );
            self.shown = true;
        }
    }

    fn done(&self) {
        if self.shown {
            eprintln!();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peeked(records: Result<Vec<String>, String>) -> store::Peeked {
        store::Peeked {
            table: "ready",
            id: 7,
            retry_due_ms: None,
            created_ms: 1,
            attempts: 0,
            last_error: None,
            last_failed_ms: 0,
            offset: 0,
            origin: None,
            bytes: 10,
            raw_bytes: 10,
            records,
        }
    }

    #[test]
    fn jobs_are_plain_json_with_a_decode_error_of_their_own() {
        let ok = peeked(Ok(vec!["a".into(), "b".into()])).to_json();
        assert_eq!(ok["records"], serde_json::json!(["a", "b"]));
        assert_eq!(ok["decode_error"], serde_json::Value::Null);
        let bad = peeked(Err("checksum mismatch".into())).to_json();
        assert_eq!(bad["records"], serde_json::Value::Null);
        assert_eq!(bad["decode_error"], "checksum mismatch");
        assert_eq!(bad["id"], 7);
        // The text is written from the same JSON (the agent's answer or the store's job).
        let text = |job: &serde_json::Value| {
            let mut out = Vec::new();
            print_job(&mut out, job, false).unwrap();
            String::from_utf8(out).unwrap()
        };
        assert_eq!(
            text(&ok),
            "ready #7 created 1970-01-01T00:00:00.001Z, 10 bytes\n  a\n  b\n"
        );
        assert!(
            text(&bad).ends_with("\n  (cannot be decoded: checksum mismatch)\n"),
            "{}",
            text(&bad)
        );
    }
}
