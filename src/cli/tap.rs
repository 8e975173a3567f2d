//! `colibri tap STREAM`: prints the records appended to a stream of the running agent as they
//! arrive, or with `--delivered` as its sink acknowledges them (one per line, or with `--json`
//! one object per line with the stream), read from its admin endpoint (`GET /-/tap/{stream}`)
//! from the moment it starts, until `--limit` records or
//! Ctrl-C. A viewer slower than the stream is told on stderr how many records it missed; the
//! agent never waits for it.

use std::io::Write as _;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;
use serde_json::Value;

use super::admin_client::{AdminArgs, AdminClient, AdminError};

#[derive(Debug, Args)]
pub struct TapArgs {
    #[command(flatten)]
    config: super::ConfigArg,
    #[command(flatten)]
    admin: AdminArgs,
    /// The stream
    stream: String,
    /// Stop after this many records
    #[arg(long, short = 'n')]
    limit: Option<u64>,
    /// One JSON object per record: {"stream", "record"} (the record as stored when it is JSON, else
    /// as a string); with --delivered also "lane" (live or backlog) and "replayed"
    #[arg(long)]
    json: bool,
    /// The records as the stream's sink acknowledges them, instead of as they are appended
    #[arg(long)]
    delivered: bool,
}

pub fn main(args: TapArgs) -> ExitCode {
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &TapArgs) -> anyhow::Result<()> {
    let c = super::load_needing(&args.config, &["admin"])?;
    let client = AdminClient::new(&c, &args.admin)?;
    let stream = &args.stream;
    let mut after: Option<u64> = None;
    let mut printed = 0u64;
    let mut out = std::io::stdout().lock();
    while args.limit.is_none_or(|l| printed < l) {
        let want = args.limit.map_or(1000, |l| (l - printed).min(1000));
        let mut path = format!(
            "/-/tap/{stream}?limit={want}&wait_ms=2000&delivered={}",
            u8::from(args.delivered)
        );
        if let Some(a) = after {
            path.push_str(&format!("&after={a}"));
        }
        let a = client.get(&path).map_err(|e| match e {
            AdminError::NotRunning(at) => {
                anyhow::anyhow!("no agent answers at {at}: tap reads a running agent")
            }
            AdminError::Other(e) => e,
        })?;
        let v: Value = serde_json::from_str(&a.body).unwrap_or_default();
        if a.status != 200 {
            let why = v["error"].as_str().unwrap_or(a.body.trim());
            anyhow::bail!("{why}");
        }
        if args.delivered && v["delivered"] != true {
            anyhow::bail!(
                "the running agent does not tap deliveries (an older version): restart it to use --delivered"
            );
        }
        after = Some(v["next"].as_u64().context("an answer without next")?);
        if let Some(n) = v["skipped"].as_u64().filter(|&n| n > 0) {
            eprintln!("tap: {n} records skipped (this viewer fell behind the stream)");
        }
        let replayed = v["replayed"].as_array();
        for (i, r) in v["records"].as_array().into_iter().flatten().enumerate() {
            let text = r.as_str().unwrap_or_default();
            let line = if args.json {
                let replayed = replayed.and_then(|m| m.get(i)).and_then(Value::as_bool);
                json_line(stream, text, replayed)
            } else {
                text.to_string()
            };
            // A closed pipe (`| head`) ends the tap quietly.
            if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
                return Ok(());
            }
            printed += 1;
        }
    }
    Ok(())
}

/// `{"stream":…,"record":…}` with a JSON record embedded as it is stored, byte for byte: parsed
/// only to check that it is JSON, so its keys keep their order (a parsed map would sort them).
/// Any other line is a JSON string. A delivered record (`replayed` known) also says its lane:
/// `"lane":"backlog","replayed":true` or `"lane":"live","replayed":false`.
fn json_line(stream: &str, text: &str, replayed: Option<bool>) -> String {
    let record = if serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok() {
        text.to_string()
    } else {
        Value::String(text.to_string()).to_string()
    };
    let lane = match replayed {
        Some(true) => ",\"lane\":\"backlog\",\"replayed\":true",
        Some(false) => ",\"lane\":\"live\",\"replayed\":false",
        None => "",
    };
    format!(
        "{{\"stream\":{}{lane},\"record\":{record}}}",
        Value::String(stream.to_string())
    )
}

#[cfg(test)]
mod tests {
    use super::json_line;

    #[test]
    fn a_tapped_record_is_printed_as_it_is_stored() {
        assert_eq!(
            json_line("logs", r#"{"z":1,"a":{"y":2,"b":3}}"#, None),
            r#"{"stream":"logs","record":{"z":1,"a":{"y":2,"b":3}}}"#
        );
        assert_eq!(
            json_line("l\"x", "not json", None),
            r#"{"stream":"l\"x","record":"not json"}"#
        );
        assert_eq!(
            json_line("logs", "1", Some(true)),
            r#"{"stream":"logs","lane":"backlog","replayed":true,"record":1}"#
        );
    }
}
