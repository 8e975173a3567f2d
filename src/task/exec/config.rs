//! The `type: exec` task entry: its file shape ([`ExecSpec`], with `stream:` and what it takes)
//! and its compilation into `task::exec::Exec`: the program checked (an absolute one must exist and
//! be executable), `cwd`, `env`, and the output's format against the stream's sink. It runs
//! nothing. Called through the tasks' list (`task::read_kind`, `TaskKind::compile`) for `type: exec`.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use serde::Deserialize;

use super::Exec;
use crate::record::RecordFormat;
use crate::shape::scalar::Scalar;
use crate::shape::units::Size;
use crate::shape::{Problems, io_reason};
use crate::task::kind::{Compile, KindSpec};

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ExecSpec {
    /// The program and its arguments. A program named by an absolute path must exist and be
    /// executable; a relative path with a `/` is read from the config file's directory; a bare name is
    /// looked up in PATH when the task runs. colibri expands `${VAR}` here before any shell sees the
    /// text: write `$${VAR}` for a shell variable in braces and `$$$$` for the shell's `$$`.
    pub command: Vec<Scalar>,
    /// Extra environment variables for the program (colibri's own environment is inherited).
    #[serde(default)]
    pub env: BTreeMap<String, Scalar>,
    /// Working directory. Default: colibri's own. Relative paths are read from the config file's
    /// directory.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Append what the program prints on stdout to this stream after a successful run (in one
    /// append: a run is stored whole or not at all). A failed or timed-out run appends nothing
    /// unless `append_failed`.
    #[serde(default)]
    pub stream: Option<String>,
    /// With `stream`: `lines` (default: a record per non-empty line, each what the stream's sink
    /// sends: JSON for a JSON sink, a point for an `influx_line` sink, stamped with the run's start
    /// when it has no time, any line for the others), `json` (each line must be JSON),
    /// `line_protocol` (each line a point, stamped likewise) or `whole` (the output as one JSON
    /// record `{"task", "time_ms", "output"}`). A line that is not what it must be fails the run
    /// naming the line.
    #[serde(default)]
    pub format: Option<ExecFormatSpec>,
    /// With `stream`: the most stdout a run may print, e.g. `1MiB` (the default; at most 64MiB);
    /// over it the run fails with the reason and nothing is appended.
    #[serde(default)]
    pub max_output: Option<Size>,
    /// With `stream`: a failed or timed-out run appends its output as one JSON record
    /// `{"task", "time_ms", "output", "failed": <reason>}`. Default false.
    #[serde(default)]
    pub append_failed: bool,
}

/// `format:` of an `exec` task with `stream`.
#[derive(Debug, Clone, Copy, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ExecFormatSpec {
    Lines,
    Json,
    LineProtocol,
    Whole,
}

const DEFAULT_MAX_OUTPUT: u64 = 1 << 20;
/// The largest `max_output`: a run's output is held whole, and made into records, before the one
/// append that stores it.
const MAX_OUTPUT_LIMIT: u64 = 64 << 20;

impl KindSpec for ExecSpec {
    type Handler = Exec;

    fn compile(self, cx: &Compile<'_>, err: &mut Problems<'_>) -> Option<Exec> {
        compile_exec(self, cx, err)
    }
}

fn compile_exec(spec: ExecSpec, ctx: &Compile<'_>, err: &mut Problems<'_>) -> Option<Exec> {
    let base = ctx.base;
    let output = exec_output(&spec, ctx, err);
    let mut argv: Vec<String> = spec.command.into_iter().map(|s| s.0).collect();
    let mut ok = true;
    match argv.first_mut() {
        None => {
            err.add(
                "command",
                "must name a program, e.g. [\"/usr/bin/env\", \"true\"]".into(),
            );
            ok = false;
        }
        Some(p) if p.is_empty() => {
            err.add("command[0]", "the program name is empty".into());
            ok = false;
        }
        Some(program) => {
            let path = Path::new(program.as_str());
            if path.is_relative() && program.contains('/') {
                *program = base.join(path).to_string_lossy().into_owned();
            }
            let path = Path::new(program.as_str());
            if path.is_absolute() {
                match std::fs::metadata(path) {
                    Err(e) => {
                        err.add("command[0]", format!("{program}: {}", io_reason(&e)));
                        ok = false;
                    }
                    Ok(m) if !m.is_file() => {
                        err.add("command[0]", format!("{program} is not a regular file"));
                        ok = false;
                    }
                    Ok(m) if m.permissions().mode() & 0o111 == 0 => {
                        err.add("command[0]", format!("{program} is not executable"));
                        ok = false;
                    }
                    Ok(_) => {}
                }
            }
        }
    }
    let cwd = spec.cwd.map(|c| base.join(c));
    if let Some(dir) = &cwd
        && !dir.is_dir()
    {
        err.add("cwd", format!("{} is not a directory", dir.display()));
        ok = false;
    }
    let mut env = Vec::with_capacity(spec.env.len());
    for (k, v) in spec.env {
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.0.contains('\0') {
            err.add(
                &format!("env.{k}"),
                "variable names must be non-empty without = or NUL".into(),
            );
            ok = false;
        }
        env.push((k, v.0));
    }
    match output {
        Ok(output) if ok => Some(Exec {
            argv,
            env,
            cwd,
            output,
        }),
        _ => None,
    }
}

/// The `stream:` settings of an `exec` entry: `Ok(None)` without a stream; `Err` once a problem
/// is reported.
fn exec_output(
    spec: &ExecSpec,
    ctx: &Compile<'_>,
    err: &mut Problems<'_>,
) -> Result<Option<crate::task::exec::output::Output>, ()> {
    use crate::scrape::lineproto::Precision;
    use crate::task::exec::output::{Output, OutputFormat};
    let Some(stream) = &spec.stream else {
        let mut ok = true;
        for (set, field) in [
            (spec.format.is_some(), "format"),
            (spec.max_output.is_some(), "max_output"),
            (spec.append_failed, "append_failed"),
        ] {
            if set {
                err.add(field, "applies only with stream".into());
                ok = false;
            }
        }
        return if ok { Ok(None) } else { Err(()) };
    };
    if let Err(m) = ctx.stream(stream) {
        if let Some(m) = m {
            err.add("stream", m);
        }
        return Err(());
    }
    let carries = ctx.format(stream);
    let spec_format = spec.format.unwrap_or(ExecFormatSpec::Lines);
    let format = match (spec_format, carries) {
        (ExecFormatSpec::Lines, c) => Ok(OutputFormat::Lines(c)),
        (ExecFormatSpec::Json | ExecFormatSpec::Whole, RecordFormat::LineProtocol(_)) => Err(
            "writes JSON records, but the stream's sink sends influx line protocol (encoding: influx_line): use format: lines or line_protocol",
        ),
        (ExecFormatSpec::Json, _) => Ok(OutputFormat::Lines(RecordFormat::Json)),
        (ExecFormatSpec::Whole, _) => Ok(OutputFormat::Whole),
        (ExecFormatSpec::LineProtocol, RecordFormat::Json) => Err(
            "writes influx line protocol, but the stream's sink sends JSON (encoding: ndjson or json_array): use format: json, lines or whole",
        ),
        (ExecFormatSpec::LineProtocol, RecordFormat::LineProtocol(p)) => {
            Ok(OutputFormat::Lines(RecordFormat::LineProtocol(p)))
        }
        // A sink that takes any line (file, stdout): points stamped in nanoseconds.
        (ExecFormatSpec::LineProtocol, RecordFormat::Lines) => Ok(OutputFormat::Lines(
            RecordFormat::LineProtocol(Precision::Ns),
        )),
    };
    let mut ok = true;
    let format = format.unwrap_or_else(|why| {
        err.add("format", format!("{why} (stream {stream:?})"));
        ok = false;
        OutputFormat::Whole
    });
    if spec.append_failed && matches!(carries, RecordFormat::LineProtocol(_)) {
        err.add(
            "append_failed",
            format!(
                "writes a JSON record, but stream {stream:?}'s sink sends influx line protocol"
            ),
        );
        ok = false;
    }
    let max_output = spec.max_output.map_or(DEFAULT_MAX_OUTPUT, |s| s.0);
    if !(1..=MAX_OUTPUT_LIMIT).contains(&max_output) {
        err.add(
            "max_output",
            "must be between 1 byte and 64MiB (a run's output is held in memory until it is stored)"
                .into(),
        );
        ok = false;
    }
    if !ok {
        return Err(());
    }
    Ok(Some(Output {
        stream: stream.clone(),
        format,
        max_output,
        append_failed: spec.append_failed,
    }))
}
