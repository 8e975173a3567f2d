//! The config file as a whole: parsing the YAML (the only module that names the YAML library),
//! `${VAR}` expansion, the top-level shape (`FileSpec`, from which the JSON Schema is generated), and
//! `compile`, which validates everything and turns the file into the runtime types the rest of
//! colibri uses (`Config`, `task::TaskDef`, parsed schedules, `Duration`s, resolved paths). Each
//! sink's, source's and task's own shape lives beside it (its `config.rs` in `sink/`, `source/`,
//! `task/`), with the toolkit they share in `shape/`; this module splits an entry's `type` off and
//! hands the rest to that kind's list. Nothing that runs sees a `*Spec`. Called by the CLI (`run`,
//! `check`, `queue`, `schema`) and by the agent's reload.
//!
//! Validation collects every problem before refusing, each with its path in the file, e.g.
//! `tasks[3] "rotate": schedule "61 * * * *": minute 61 out of range 0-59`. A value that came from
//! `${VAR}` is never shown in a problem (it may be a secret): the message names the variable.
//!
//! Each section of the file has a module of its own (`admin`, `log`, `storage`, `sinks`, `streams`,
//! `tasks`, `ingest`, `sources`); this one keeps the top level (`FileSpec`, `Config`), loading, and
//! the glue the sections share.

pub mod admin;
pub mod env;
pub mod ingest;
pub mod log;
pub mod sinks;
pub mod sources;
pub mod storage;
pub mod streams;
pub mod tasks;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use crate::logging::{LogFile, LogFormat, LogLevel};
use crate::record::RecordFormat;
pub use crate::shape::Problem;
use crate::shape::problems::tree_path;
use crate::shape::{Problems, de_all, io_reason, units};
use crate::sink::SinkConfig;
use crate::sink::SinkSpec;
use crate::store::{AtRest, StorageConfig, StreamConfig};
use crate::task::TaskDef;
use admin::AdminConfig;
use log::{LogSpec, compile_log};
use sinks::compile_sink;
use storage::StorageSpec;
use streams::{StreamSpec, compile_stream};
use tasks::{TaskCtx, TaskSpec, compile_task};
#[cfg(feature = "schema")]
use units::u32_schema;
use units::{Dur, de_u32};

// ---------------------------------------------------------------------------------------------------
// The file's shape. Field docs become the schema's descriptions, which editors show on hover.

/// colibri's configuration file.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "schema", schemars(title = "colibri configuration"))]
pub struct FileSpec {
    /// Directory for colibri's queues and state. Relative paths are read from the config file's directory.
    #[serde(default = "default_data_dir")]
    pub data_dir: String,
    /// How many task runs may execute at once; runs that find every worker busy wait for one.
    #[serde(default = "default_workers", deserialize_with = "de_u32")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "u32_schema"))]
    pub workers: u32,
    /// On SIGTERM, how long running tasks may take to finish before they are killed. Every task's
    /// timeout must be shorter.
    #[serde(default = "default_grace")]
    pub shutdown_grace: Dur,
    /// Logging: to stderr, or to a file colibri rotates by size.
    #[serde(default)]
    pub log: LogSpec,
    /// The data directory's disk budget, shared by every stream.
    #[serde(default)]
    pub storage: StorageSpec,
    /// Where streams are delivered, by name.
    #[serde(default)]
    pub sinks: BTreeMap<String, SinkSpec>,
    /// Durable queues of transfer jobs, by name. What a stream accepts is on disk (fsync'd) before
    /// anyone is told "stored".
    #[serde(default)]
    pub streams: BTreeMap<String, StreamSpec>,
    /// Scheduled chores.
    #[serde(default)]
    pub tasks: Vec<TaskSpec>,
    /// The local ingest API (off unless `listen` is set).
    #[serde(default)]
    pub ingest: Option<ingest::IngestSpec>,
    /// The admin endpoint: `GET /metrics` (Prometheus text), `/healthz`, `/readyz`, `POST /-/reload`.
    /// On by default, on 127.0.0.1:9464.
    #[serde(default)]
    pub admin: Option<admin::AdminSpec>,
    /// Producers of records that run on their own (log tailing), by name.
    #[serde(default)]
    pub sources: BTreeMap<String, crate::source::SourceSpec>,
}

pub(super) fn yes() -> bool {
    true
}

/// What each entry of the file said (after `${VAR}` expansion), to tell what a reload changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fingerprint {
    /// Top-level settings other than the four maps below (`data_dir`, `log`, `ingest`, ...).
    pub top: BTreeMap<String, String>,
    pub tasks: BTreeMap<String, String>,
    pub sinks: BTreeMap<String, String>,
    pub streams: BTreeMap<String, String>,
    pub sources: BTreeMap<String, String>,
}

fn default_data_dir() -> String {
    "/var/lib/colibri".into()
}
fn default_workers() -> u32 {
    8
}
fn default_grace() -> Dur {
    Dur(Duration::from_secs(15))
}

/// The JSON Schema of the file, as committed in `schemas/colibri.schema.json`: generated from the
/// types above.
#[cfg(feature = "schema")]
pub fn json_schema() -> String {
    let schema = schemars::schema_for!(FileSpec);
    let mut text = serde_json::to_string_pretty(&schema).expect("a schema is plain JSON");
    text.push('\n');
    text
}

/// The JSON Schema of the file. A build without the `schema` feature (the release binary, to stay
/// within its size budget) carries the committed copy, which a test keeps identical to the generated
/// one.
#[cfg(not(feature = "schema"))]
pub fn json_schema() -> String {
    include_str!("../../schemas/colibri.schema.json").to_string()
}

// ---------------------------------------------------------------------------------------------------
// Runtime configuration: what the file means, checked.

#[derive(Debug)]
pub struct Config {
    /// The file it came from.
    pub source: PathBuf,
    pub data_dir: PathBuf,
    pub workers: usize,
    pub shutdown_grace: Duration,
    pub log_level: LogLevel,
    pub log_format: LogFormat,
    /// Where events go instead of stderr, and its rotation.
    pub log_file: Option<LogFile>,
    pub storage: StorageConfig,
    pub sinks: Vec<Arc<SinkConfig>>,
    pub streams: Vec<StreamConfig>,
    pub tasks: Vec<Arc<TaskDef>>,
    pub ingest: Option<crate::source::ingest::IngestConfig>,
    pub sources: Vec<crate::source::Source>,
    /// `None`: switched off.
    pub admin: Option<AdminConfig>,
    /// Per entry, what the file said: a reload compares these.
    pub fingerprint: Fingerprint,
    /// SHA-256 of the file's bytes (hex).
    pub sha256: String,
    /// Unset variables the command went on without ([`Unset::Warn`]), one line each, for the
    /// command to print; empty under [`Unset::Refuse`].
    pub warnings: Vec<String>,
}

impl Config {
    /// What the records of `stream` must be: its sink's format ([`RecordFormat::Lines`] for a
    /// stream without a sink, or one not defined here).
    pub fn record_format(&self, stream: &str) -> RecordFormat {
        stream_format(&self.streams, &self.sinks, stream)
    }
}

pub(super) fn stream_format(
    streams: &[StreamConfig],
    sinks: &[Arc<SinkConfig>],
    stream: &str,
) -> RecordFormat {
    streams
        .iter()
        .find(|s| s.name == stream)
        .and_then(|s| s.sink.as_deref())
        .and_then(|name| sinks.iter().find(|k| k.name == name))
        .map_or(RecordFormat::Lines, |k| k.record_format())
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    // The reason is part of the message and not a `source`: a caller printing the chain
    // (`{:#}`) would show it twice.
    #[error("cannot read config file {}: {error}", path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{}: not valid UTF-8 at line {line}, column {column} (byte {byte:#04x}); save the file as UTF-8", path.display())]
    NotUtf8 {
        path: PathBuf,
        line: usize,
        column: usize,
        byte: u8,
    },
    #[error("{}: not valid YAML: {message}", path.display())]
    Syntax { path: PathBuf, message: String },
    #[error("{}: {} problem{}:\n{}", path.display(), problems.len(), if problems.len() == 1 { "" } else { "s" },
        problems.iter().map(|p| format!("  {p}")).collect::<Vec<_>>().join("\n"))]
    Invalid {
        path: PathBuf,
        problems: Vec<Problem>,
        /// Unset variables the command went on without (see [`Unset::Warn`]), as for
        /// [`Config::warnings`]: printed beside the problems, not part of them.
        warnings: Vec<String>,
    },
}

impl ConfigError {
    /// Each problem as one line without line breaks, for a log event that must stay on one line
    /// (the caller joins them and names the file: only `Invalid`'s problems leave it out).
    pub fn lines(&self) -> Vec<String> {
        match self {
            ConfigError::Invalid { problems, .. } => problems
                .iter()
                .map(|p| p.to_string().replace('\n', " "))
                .collect(),
            other => vec![other.to_string().replace('\n', " ")],
        }
    }

    /// Unset variables the command would have gone on without.
    pub fn warnings(&self) -> &[String] {
        match self {
            ConfigError::Invalid { warnings, .. } => warnings,
            _ => &[],
        }
    }
}

/// What an unset `${VAR}` without a default means for the command loading the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unset {
    /// An error: `colibri run` and reloads never start with a value missing.
    Refuse,
    /// A warning (`Config::warnings`), and the reference expands to nothing, for commands that
    /// do not run the file: packaged installs keep secrets in an environment file only the unit
    /// reads, and `check` or `queue stats` from a shell must work without them. A setting that
    /// cannot be empty (a token, a number) is then left out, as a bad setting is, without a
    /// problem of its own. Under the top-level keys in `needed` an unset variable stays an error:
    /// the queue commands must not guess where the store is or how it is bounded.
    /// `read_keys: false` (the commands that only talk to the agent or its store: `queue`,
    /// `task`, `tap`, `top`) leaves the listeners' `tls` files unread: an operator who may not
    /// read the key still can use them; `check` reads them.
    Warn {
        needed: &'static [&'static str],
        read_keys: bool,
    },
}

/// The settings the `queue` commands take from the file: where the store is and its streams.
pub const QUEUE_NEEDS: &[&str] = &["data_dir", "storage", "streams"];

/// Reads, expands and validates the file at `path` against the process environment; an unset
/// variable is an error.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    load_with(path, Unset::Refuse)
}

/// [`load`], with unset variables treated as `unset` says.
pub fn load_with(path: &Path, unset: Unset) -> Result<Config, ConfigError> {
    let bytes = std::fs::read(path).map_err(|error| ConfigError::Read {
        path: path.to_path_buf(),
        error,
    })?;
    let text = String::from_utf8(bytes).map_err(|e| {
        let bytes = e.as_bytes();
        let good = &bytes[..e.utf8_error().valid_up_to()];
        let line_start = good.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        let column = String::from_utf8_lossy(&good[line_start..]).chars().count() + 1;
        ConfigError::NotUtf8 {
            path: path.to_path_buf(),
            line: good.iter().filter(|b| **b == b'\n').count() + 1,
            column,
            byte: bytes[good.len()],
        }
    })?;
    load_str_with(&text, path, &|name| std::env::var(name).ok(), unset)
}

/// Same as [`load`] for text already in memory; `path` names the file in messages and anchors relative
/// paths; `lookup` stands in for the environment.
pub fn load_str(
    text: &str,
    path: &Path,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigError> {
    load_str_with(text, path, lookup, Unset::Refuse)
}

/// [`load_str`], with unset variables treated as `unset` says.
pub fn load_str_with(
    text: &str,
    path: &Path,
    lookup: &dyn Fn(&str) -> Option<String>,
    unset: Unset,
) -> Result<Config, ConfigError> {
    let mut root: Value = if text.trim().is_empty() {
        Value::Object(Default::default())
    } else {
        // YAML 1.2 core booleans only: `name: off` or `env: {FEATURE: no}` stay the strings the user
        // wrote instead of turning into false (the "Norway problem"); `0755` stays a string too.
        let options = serde_saphyr::options! {
            strict_booleans: true,
            leading_zero_numbers_as_strings: true,
        };
        serde_saphyr::from_str_with_options(text, options).map_err(|e| ConfigError::Syntax {
            path: path.to_path_buf(),
            message: syntax_message(&e),
        })?
    };
    if root.is_null() {
        root = Value::Object(Default::default());
    }
    let tolerate = |at: &str| match unset {
        Unset::Refuse => false,
        Unset::Warn { needed, .. } => !needed.iter().any(|k| under(at, k)),
    };
    let expanded = env::expand_tree(&mut root, lookup, &tolerate);
    let mut problems: Vec<Problem> = expanded
        .problems
        .iter()
        .map(|(path, message)| Problem {
            path: path.clone(),
            message: message.clone(),
        })
        .collect();
    let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let mut compiled = Vec::new();
    let expanded_paths: Vec<String> = expanded.expansions.iter().map(|e| e.path.clone()).collect();
    let read_keys = !matches!(
        unset,
        Unset::Warn {
            read_keys: false,
            ..
        }
    );
    let mut problems_of_compile = Problems::of_file(&mut compiled, &expanded_paths, read_keys);
    let config = compile(root, path, &base, &mut problems_of_compile).map(|mut c| {
        let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
        c.sha256 = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        c
    });
    // A value that could not be expanded was left as written; what compile says about it would
    // only repeat the problem.
    compiled.retain(|p| {
        let at = tree_path(&p.path);
        !expanded.problems.iter().any(|(failed, _)| *failed == at)
    });
    problems.append(&mut compiled);
    // A value left empty for a variable the command goes on without may not be one the field
    // can take (an empty token, a number): that is the warning's to say, not a problem. The
    // part of the file it was in is then left out of what the command sees (a `check` summary,
    // say), and nothing that runs the file ever gets here.
    problems.retain(|p| {
        let at = tree_path(&p.path);
        !expanded
            .expansions
            .iter()
            .any(|e| e.path == at && !e.unset.is_empty())
    });
    for p in &mut problems {
        let at = tree_path(&p.path);
        p.message = redact(&expanded.expansions, &at, std::mem::take(&mut p.message));
    }
    let mut warnings = unset_warnings(&expanded.expansions, path);
    warnings.extend(placeholder_warnings(&expanded.expansions, path));
    match config {
        Some(mut c) if problems.is_empty() => {
            c.warnings = warnings;
            Ok(c)
        }
        _ => Err(ConfigError::Invalid {
            path: path.to_path_buf(),
            problems,
            warnings,
        }),
    }
}

/// A YAML error in words for people: the location but no source snippet (it would span lines in
/// a log) and none of the library's hints about its own options.
fn syntax_message(e: &serde_saphyr::Error) -> String {
    let formatter = serde_saphyr::UserMessageFormatter;
    e.render_with_options(serde_saphyr::render_options! {
        formatter: &formatter,
        snippets: serde_saphyr::SnippetMode::Off,
    })
}

/// One warning per unset variable the command went on without, naming where the file uses it.
fn unset_warnings(expansions: &[env::Expansion], file: &Path) -> Vec<String> {
    let mut by_var: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for e in expansions {
        for name in &e.unset {
            by_var.entry(name).or_default().push(&e.path);
        }
    }
    by_var
        .into_iter()
        .map(|(name, paths)| {
            format!(
                "${{{name}}} is not set ({}: {}); this command goes on without it, `colibri run` refuses the file until it is set",
                file.display(),
                paths.join(", ")
            )
        })
        .collect()
}

/// One warning per secret that took the default the file writes for it (`${TOKEN:-change-me}`):
/// an example config's stand-in, which anyone who reads the file knows, is no secret. The default
/// is still used (a quickstart must run), but the operator is told before it goes anywhere.
fn placeholder_warnings(expansions: &[env::Expansion], file: &Path) -> Vec<String> {
    expansions
        .iter()
        .filter(|e| !e.defaulted.is_empty() && is_secret_field(&e.path))
        .map(|e| {
            let vars: Vec<String> = e.defaulted.iter().map(|v| format!("${{{v}}}")).collect();
            format!(
                "{}: {} is a placeholder: {} is not set and the default written in the file stands in for a secret; set {}",
                file.display(),
                e.path,
                vars.join(", "),
                e.defaulted.join(", ")
            )
        })
        .collect()
}

/// Whether a tree path names a secret: a token, a password, an API key or an Authorization
/// header (a `key_file` names a file, not a secret).
fn is_secret_field(path: &str) -> bool {
    let field = path
        .rsplit(['.', '['])
        .next()
        .unwrap_or(path)
        .to_ascii_lowercase();
    if field.ends_with("_file") {
        return false;
    }
    [
        "token",
        "password",
        "secret",
        "authorization",
        "api_key",
        "apikey",
    ]
    .iter()
    .any(|w| field.contains(w))
}

/// Whether tree path `path` is `at` or inside it (`sinks.up.url` is inside `sinks` and
/// `sinks.up`; `tasks[1]` is inside `tasks`). Everything is inside the root, `""`.
fn under(path: &str, at: &str) -> bool {
    at.is_empty()
        || path
            .strip_prefix(at)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
}

/// `message`, a problem at tree path `at`, with every value that came from `${...}` at or inside
/// `at` replaced by the words that name its variable (`the value of ${TOKEN}`): the value may be
/// a secret and is never shown. The value is replaced in every form a message quotes it in
/// (serde's backticks, Rust's and JSON's quotes, and as a bare word), and the message's own
/// producers quote a value whole or not at all; a message that still holds the value afterwards
/// is dropped for a plain one.
fn redact(expansions: &[env::Expansion], at: &str, message: String) -> String {
    let mut m = message;
    let mut names = Vec::new();
    for e in expansions
        .iter()
        .filter(|e| !e.value.is_empty() && under(&e.path, at))
    {
        // A marker first, the words last, so one value's words are never taken for another value.
        let marker = format!("\u{0}{}\u{0}", names.len());
        names.push(e.shown());
        let variant = format!("unknown variant `{}`, expected ", e.value);
        if let Some(rest) = m.strip_prefix(&variant) {
            m = format!("expected {rest}, found {marker}");
        }
        let json = serde_json::to_string(&e.value).expect("a string serializes");
        for form in [format!("`{}`", e.value), format!("{:?}", e.value), json] {
            m = m.replace(&form, &marker);
        }
        // Bare, only where it is surely this value: at its own path, or long enough not to be
        // a word of the message.
        if e.path == at || e.value.chars().count() >= 8 {
            m = replace_word(&m, &e.value, &marker);
        }
        if e.value.chars().count() >= 4 && m.contains(&e.value) {
            m = format!("{marker} is not valid here");
        }
    }
    for (i, shown) in names.iter().enumerate() {
        m = m.replace(&format!("\u{0}{i}\u{0}"), shown);
    }
    m
}

/// `text` with each occurrence of `word` that is not part of a longer word replaced.
fn replace_word(text: &str, word: &str, with: &str) -> String {
    if word.is_empty() {
        return text.to_string();
    }
    let is_word = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(word) {
        out.push_str(&rest[..i]);
        let before = out.chars().next_back();
        let after = rest[i + word.len()..].chars().next();
        if before.is_some_and(is_word) || after.is_some_and(is_word) {
            out.push_str(word);
        } else {
            out.push_str(with);
        }
        rest = &rest[i + word.len()..];
    }
    out.push_str(rest);
    out
}

/// Validates the expanded tree and builds the runtime config. Returns `None` only when the file's top
/// level is unusable; otherwise keeps going so every problem is reported.
fn compile(root: Value, source: &Path, base: &Path, problems: &mut Problems<'_>) -> Option<Config> {
    let Value::Object(mut map) = root else {
        problems.add(
            "",
            "the file must be a mapping of settings (data_dir, tasks, ...)".into(),
        );
        return None;
    };
    let sections = Sections::take(&mut map);
    let fingerprint = fingerprint(&map, &sections);
    // Each top-level key on its own first, so one bad setting neither hides another nor stops the
    // tasks from being checked; bad keys are left out and their defaults stand in.
    let spec: FileSpec = de_all(Value::Object(map), problems)?;
    let grace = check_top_level(&spec, problems);

    let log_file = compile_log(&spec.log, base, problems);

    let storage = storage::compile(&spec.storage, problems);
    let declared_sinks = declared_names(sections.sinks.as_ref());
    let declared_streams = declared_names(sections.streams.as_ref());
    // Before the entries: MQTT client ids are made unique per store from it.
    let data_dir = base.join(&spec.data_dir);
    let sinks = compile_sinks(sections.sinks, base, &data_dir, problems);
    let streams = compile_streams(
        sections.streams,
        (&declared_sinks, &declared_streams),
        &sinks,
        problems,
    );
    let stream_names: Vec<&str> = declared_streams.iter().map(String::as_str).collect();
    let format = |stream: &str| stream_format(&streams, &sinks, stream);
    let sources = compile_sources(
        sections.sources,
        base,
        &data_dir,
        (&stream_names, &format),
        problems,
    );
    let ingest = compile_ingest(spec.ingest, &stream_names, &streams, &sinks, base, problems);
    check_source_streams(&sources, &streams, &sinks, problems);
    let admin = admin::compile_admin(spec.admin, base, problems);

    let ctx = TaskCtx {
        grace,
        file: crate::task::Compile {
            task: "",
            base,
            data_dir: &data_dir,
            streams: &streams,
            declared_streams: &declared_streams,
            format: &format,
            storage: &storage,
        },
    };
    let tasks = compile_tasks(sections.tasks, &ctx, problems);

    Some(Config {
        source: source.to_path_buf(),
        data_dir,
        workers: spec.workers as usize,
        shutdown_grace: grace,
        log_level: spec.log.level,
        log_format: spec.log.format,
        log_file,
        storage,
        sinks,
        streams,
        tasks,
        ingest,
        sources,
        admin,
        fingerprint,
        sha256: String::new(),
        warnings: Vec::new(),
    })
}

/// The top-level keys compiled entry by entry (each entry's problems under its own path) instead
/// of being deserialized with the rest of the file.
struct Sections {
    tasks: Option<Value>,
    streams: Option<Value>,
    sinks: Option<Value>,
    sources: Option<Value>,
}

impl Sections {
    /// Takes the sections off the file's top level; what is left are its single settings.
    fn take(map: &mut serde_json::Map<String, Value>) -> Self {
        Self {
            tasks: map.remove("tasks"),
            streams: map.remove("streams"),
            sinks: map.remove("sinks"),
            sources: map.remove("sources"),
        }
    }
}

/// What a reload compares: each top-level setting of `top` and each entry of the sections, as
/// written (after expansion); tasks by their name.
fn fingerprint(top: &serde_json::Map<String, Value>, sections: &Sections) -> Fingerprint {
    let entries = |v: &Option<Value>| match v {
        Some(Value::Object(m)) => m.iter().map(|(k, v)| (k.clone(), v.to_string())).collect(),
        _ => BTreeMap::new(),
    };
    let mut tasks = BTreeMap::new();
    if let Some(Value::Array(items)) = &sections.tasks {
        for v in items {
            if let Some(name) = v.get("name").and_then(Value::as_str) {
                tasks.insert(name.to_string(), v.to_string());
            }
        }
    }
    Fingerprint {
        top: top
            .iter()
            .map(|(k, v)| (k.clone(), v.to_string()))
            .collect(),
        tasks,
        sinks: entries(&sections.sinks),
        streams: entries(&sections.streams),
        sources: entries(&sections.sources),
    }
}

/// The checks of `data_dir`, `workers` and `shutdown_grace`; returns the grace.
fn check_top_level(spec: &FileSpec, problems: &mut Problems<'_>) -> Duration {
    if spec.data_dir.trim().is_empty() {
        problems.add("data_dir", "must not be empty".into());
    }
    if spec.workers == 0 {
        problems.add("workers", "must be at least 1".into());
    }
    let grace = spec.shutdown_grace.0;
    if grace.is_zero() {
        problems.add("shutdown_grace", "must be positive".into());
    }
    grace
}

/// Every name a section declares, compiled or not: an entry with a problem of its own is still
/// known to the entries that refer to it, which must not add a false "not defined".
fn declared_names(section: Option<&Value>) -> Vec<String> {
    match section {
        Some(Value::Object(m)) => m.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

/// The `sinks:` map, each entry compiled by [`compile_sink`].
fn compile_sinks(
    value: Option<Value>,
    base: &Path,
    data_dir: &Path,
    problems: &mut Problems<'_>,
) -> Vec<Arc<SinkConfig>> {
    each_entry(value, "sinks", "sink", problems, |n, v, p| {
        compile_sink(n, v, base, data_dir, p).map(Arc::new)
    })
}

/// The `streams:` map, each entry compiled by [`compile_stream`] against the declared sink names,
/// then its `compression: auto` settled by its sink.
fn compile_streams(
    value: Option<Value>,
    declared: (&[String], &[String]),
    sinks: &[Arc<SinkConfig>],
    problems: &mut Problems<'_>,
) -> Vec<StreamConfig> {
    let sink_names: Vec<&str> = declared.0.iter().map(String::as_str).collect();
    let stream_names: Vec<&str> = declared.1.iter().map(String::as_str).collect();
    let mut streams: Vec<StreamConfig> =
        each_entry(value, "streams", "stream", problems, |n, v, p| {
            compile_stream(n, v, &sink_names, &stream_names, p)
        });
    streams::check_moves(&streams, sinks, problems);
    streams::settle_downsample(&mut streams, sinks, problems);
    // `compression: auto` stores every job compressed when the sink sends the stored frame as its
    // zstd body: the sink would compress it anyway.
    for st in &mut streams {
        if st.compression == AtRest::Waiting
            && sinks
                .iter()
                .any(|k| Some(&k.name) == st.sink.as_ref() && k.sends_zstd_lines())
        {
            st.compression = AtRest::Always;
        }
    }
    streams
}

/// The `sources:` map, each entry compiled by [`sources::compile_entry`] against the declared
/// stream names.
fn compile_sources(
    value: Option<Value>,
    base: &Path,
    data_dir: &Path,
    (stream_names, format): (&[&str], crate::record::FormatOf<'_>),
    problems: &mut Problems<'_>,
) -> Vec<crate::source::Source> {
    each_entry(value, "sources", "source", problems, |n, v, p| {
        sources::compile_entry(&n, v, base, data_dir, stream_names, format, p)
    })
}

/// The `ingest:` section, with the record format each declared stream is delivered in.
fn compile_ingest(
    spec: Option<ingest::IngestSpec>,
    stream_names: &[&str],
    streams: &[StreamConfig],
    sinks: &[Arc<SinkConfig>],
    base: &Path,
    problems: &mut Problems<'_>,
) -> Option<crate::source::ingest::IngestConfig> {
    let stream_formats: Vec<(&str, RecordFormat)> = stream_names
        .iter()
        .map(|&s| (s, stream_format(streams, sinks, s)))
        .collect();
    spec.and_then(|i| ingest::compile(i, &stream_formats, base, &mut problems.under("ingest")))
}

/// Each entry of a top-level map (`sinks`, `streams`, `sources`) compiled by `f` (name, value,
/// problems); anything but a map is one problem.
fn each_entry<T>(
    value: Option<Value>,
    key: &str,
    what: &str,
    problems: &mut Problems<'_>,
    mut f: impl FnMut(String, Value, &mut Problems<'_>) -> Option<T>,
) -> Vec<T> {
    match value {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Object(entries)) => entries
            .into_iter()
            .filter_map(|(name, value)| f(name, value, problems))
            .collect(),
        Some(other) => {
            problems.add(
                key,
                format!("expected a mapping of {what} names to settings, found {other}"),
            );
            Vec::new()
        }
    }
}

/// A source's records are JSON objects: a stream delivered as line protocol cannot carry them.
fn check_source_streams(
    sources: &[crate::source::Source],
    streams: &[StreamConfig],
    sinks: &[Arc<SinkConfig>],
    problems: &mut Problems<'_>,
) {
    for (src, stream) in sources
        .iter()
        .filter(|s| !s.settings().follows_sink_format())
        .flat_map(|s| s.streams().into_iter().map(move |st| (s, st)))
    {
        if let RecordFormat::LineProtocol(_) = stream_format(streams, sinks, stream) {
            problems.add(
                &format!("sources.{}.stream", src.name()),
                format!(
                    "stream {:?} is delivered as influx line protocol (its sink has encoding: influx_line), but a {} source's records are JSON objects its sink would send unreadable: send this source to a stream with a JSON or file sink",
                    stream,
                    src.kind()
                ),
            );
        }
    }
}

/// The `tasks` list, each compiled in `ctx`; a name used twice is a problem of the second.
fn compile_tasks(
    tasks_value: Option<Value>,
    ctx: &TaskCtx<'_>,
    problems: &mut Problems<'_>,
) -> Vec<Arc<TaskDef>> {
    let task_values = match tasks_value {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items,
        Some(other) => {
            problems.add("tasks", format!("expected a list of tasks, found {other}"));
            Vec::new()
        }
    };
    let mut tasks = Vec::with_capacity(task_values.len());
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (i, value) in task_values.into_iter().enumerate() {
        let name = value
            .get("name")
            .and_then(Value::as_str)
            .map(str::to_string);
        let at = match &name {
            Some(n) => format!("tasks[{i}] {n:?}"),
            None => format!("tasks[{i}]"),
        };
        if let Some(n) = &name {
            if let Some(first) = seen.get(n) {
                problems.add(
                    &at,
                    format!("duplicate name (first used by tasks[{first}])"),
                );
            } else {
                seen.insert(n.clone(), i);
            }
        }
        if let Some(task) = compile_task(value, &at, ctx, problems) {
            tasks.push(Arc::new(task));
        }
    }
    tasks
}

/// Names of tasks and streams: they appear in logs, metric labels and table names.
pub(super) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// The first step for one entry of a named map (`sinks.<name>`, `streams.<name>`): the name is
/// checked. Returns the entry and a reporter for the caller's own checks (paths relative to the
/// entry).
pub(super) fn named<'p>(
    section: &str,
    what: &str,
    name: &str,
    value: Value,
    problems: &'p mut Problems<'_>,
) -> (Value, Problems<'p>) {
    let mut err = problems.under(&format!("{section}.{name}"));
    if !valid_name(name) {
        err.add(
            "",
            format!("a {what} name must be 1-64 letters, digits, -, _ or ."),
        );
    }
    (value, err)
}

/// [`named`], then the entry deserialized, problems reported under its path.
pub(super) fn named_entry<'p, T: serde::de::DeserializeOwned>(
    section: &str,
    what: &str,
    name: &str,
    value: Value,
    problems: &'p mut Problems<'_>,
) -> (Option<T>, Problems<'p>) {
    let (value, mut err) = named(section, what, name, value, problems);
    let spec = de_all(value, &mut err);
    (spec, err)
}

/// Splits the `type` off an entry of a closed set (`{type: http, url: ...}`), so the caller reads
/// the rest as that type's own struct. Reading the internally tagged enum whole would lose the
/// path of a problem inside it (serde buffers the entry first), and `encoding: xml` would be
/// reported at the entry instead of at `encoding`.
pub(super) fn split_type(
    value: Value,
    types: &[&str],
    err: &mut Problems<'_>,
) -> Option<(String, Value)> {
    let one_of = || {
        types
            .iter()
            .map(|t| format!("`{t}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let Value::Object(mut map) = value else {
        err.add(
            "",
            format!(
                "expected a mapping with a type ({}) and its settings, found {value}",
                one_of()
            ),
        );
        return None;
    };
    match map.remove("type") {
        None => {
            err.add("", format!("missing field `type` (one of {})", one_of()));
            None
        }
        Some(Value::String(t)) if types.contains(&t.as_str()) => Some((t, Value::Object(map))),
        Some(Value::String(t)) => {
            err.add(
                "type",
                format!("unknown variant `{t}`, expected one of {}", one_of()),
            );
            None
        }
        Some(other) => {
            err.add(
                "type",
                format!("expected one of {}, found {other}", one_of()),
            );
            None
        }
    }
}

#[cfg(test)]
mod tests;
