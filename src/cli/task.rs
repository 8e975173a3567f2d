//! `colibri task list` and `colibri task run NAME`: the running agent's tasks, through its admin
//! endpoint (`GET /-/tasks`, `POST /-/tasks/{name}/run`). `list` shows each task's schedule,
//! whether it runs now, its last run (when, how long, how it ended) and its next run; `run` starts
//! one now, outside its schedule, and waits for it to end (exit 0 when it succeeded, 1 otherwise,
//! as a script expects), so an operator can test a chore without waiting for its time. Both need
//! the agent running: the scheduler owns the runs.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use clap::Subcommand;
use serde_json::Value;

use super::admin_client::{AdminArgs, AdminClient, AdminError};
use crate::units::fmt_duration;

#[derive(Debug, Subcommand)]
pub enum TaskCommand {
    /// List the running agent's tasks: schedule, running now, last run, its outcome, next run
    List {
        #[command(flatten)]
        config: super::ConfigArg,
        #[command(flatten)]
        admin: AdminArgs,
        /// Print the agent's JSON instead of a table
        #[arg(long)]
        json: bool,
    },
    /// Run a task now in the running agent, outside its schedule, and wait for it to end; exit 0
    /// when it succeeded, 1 otherwise (the agent's log has its output)
    Run {
        #[command(flatten)]
        config: super::ConfigArg,
        #[command(flatten)]
        admin: AdminArgs,
        /// The task
        name: String,
        /// Return once the run has started
        #[arg(long)]
        no_wait: bool,
    },
}

/// How often `run` looks whether the run has ended.
const POLL: Duration = Duration::from_millis(200);

pub fn main(cmd: TaskCommand) -> ExitCode {
    match run(cmd) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn client(config: &super::ConfigArg, admin: &AdminArgs) -> anyhow::Result<AdminClient> {
    let c = super::load_needing(config, &["admin"])?;
    AdminClient::new(&c, admin)
}

/// Needs the agent: no answer says how to start it.
fn agent<T>(r: Result<T, AdminError>) -> anyhow::Result<T> {
    r.map_err(|e| match e {
        AdminError::NotRunning(at) => anyhow::anyhow!(
            "no agent answers at {at}: tasks run in a running agent (colibri run, or systemctl start colibri)"
        ),
        AdminError::Other(e) => e,
    })
}

fn tasks(client: &AdminClient) -> anyhow::Result<Vec<Value>> {
    let a = agent(client.get("/-/tasks"))?;
    if a.status != 200 {
        anyhow::bail!("GET /-/tasks answered {}: {}", a.status, a.body.trim());
    }
    serde_json::from_str(&a.body).context("GET /-/tasks did not answer a JSON list")
}

fn run(cmd: TaskCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        TaskCommand::List {
            config,
            admin,
            json,
        } => {
            let list = tasks(&client(&config, &admin)?)?;
            if json {
                for t in &list {
                    println!("{t}");
                }
            } else {
                print!("{}", table(&list, Utc::now()));
            }
            Ok(ExitCode::SUCCESS)
        }
        TaskCommand::Run {
            config,
            admin,
            name,
            no_wait,
        } => {
            let client = client(&config, &admin)?;
            let a = agent(client.post(&format!("/-/tasks/{name}/run"), String::new()))?;
            if a.status != 202 {
                let why = serde_json::from_str::<Value>(&a.body)
                    .ok()
                    .and_then(|v| v["error"].as_str().map(str::to_string))
                    .unwrap_or_else(|| a.body.trim().to_string());
                anyhow::bail!("{why}");
            }
            let before = serde_json::from_str::<Value>(&a.body)
                .ok()
                .and_then(|v| v["runs_before"].as_u64())
                .context("the agent's answer does not say which run started")?;
            println!("task {name}: started");
            if no_wait {
                return Ok(ExitCode::SUCCESS);
            }
            let began = Instant::now();
            let mut note = began + Duration::from_secs(60);
            loop {
                std::thread::sleep(POLL);
                let list = tasks(&client)?;
                if ended(&list, &name) > before {
                    let t = find(&list, &name).context("the task left the running config")?;
                    let outcome = t["last"]["outcome"].as_str().unwrap_or("?");
                    let took = t["last"]["duration_s"].as_f64().unwrap_or(0.0);
                    println!(
                        "task {name}: {outcome} in {}",
                        fmt_duration(Duration::from_secs_f64(took.max(0.0)))
                    );
                    return Ok(if outcome == "ok" {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::FAILURE
                    });
                }
                if find(&list, &name).is_none() {
                    anyhow::bail!(
                        "task {name} left the running config (a reload) before its run ended"
                    );
                }
                if Instant::now() >= note {
                    note += Duration::from_secs(60);
                    eprintln!(
                        "task {name}: still running after {}",
                        fmt_duration(Duration::from_secs(began.elapsed().as_secs()))
                    );
                }
            }
        }
    }
}

fn find<'a>(list: &'a [Value], name: &str) -> Option<&'a Value> {
    list.iter().find(|t| t["name"] == name)
}

/// Runs of `name` that ended (0 when it is not listed).
fn ended(list: &[Value], name: &str) -> u64 {
    find(list, name)
        .and_then(|t| t["runs"].as_u64())
        .unwrap_or(0)
}

/// "12s ago" / "in 48s" from an RFC 3339 time; "-" for none.
fn relative(v: &Value, now: DateTime<Utc>) -> String {
    super::from_now(super::unix_s(v), now)
}

/// The table `task list` prints: one row per task, within 80 columns for usual names.
fn table(list: &[Value], now: DateTime<Utc>) -> String {
    let mut out = format!(
        "{:<16} {:<18} {:<8} {:<12} {:<9} {:<8} {}\n",
        "TASK", "SCHEDULE", "STATE", "LAST RUN", "OUTCOME", "TOOK", "NEXT RUN"
    );
    for t in list {
        let last = &t["last"];
        let took = last["duration_s"].as_f64().map_or("-".into(), |s| {
            fmt_duration(Duration::from_secs_f64(s.max(0.0)))
        });
        out.push_str(&format!(
            "{:<16} {:<18} {:<8} {:<12} {:<9} {:<8} {}\n",
            t["name"].as_str().unwrap_or("?"),
            t["schedule"].as_str().unwrap_or("?"),
            if t["running"] == true {
                "running"
            } else {
                "idle"
            },
            relative(&last["start"], now),
            last["outcome"].as_str().unwrap_or("-"),
            took,
            relative(&t["next"], now),
        ));
    }
    if list.is_empty() {
        out.push_str("(no tasks)\n");
    }
    out
}
