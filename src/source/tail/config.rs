//! The `type: tail` source entry: its file shape ([`TailSpec`]) and its compilation into
//! [`TailConfig`] (the glob patterns made absolute from the config file's directory, exclusions,
//! the line filter, line and multiline bounds, the record's fields, the polling intervals). It
//! reads no file: the source does. Called through the sources' list (`source::compile_kind`).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use super::lines::MultilineConfig;
use super::record::Fields;
use super::{Exclude, Format, StartAt, TailConfig, WatchMode};
use crate::record::filter::{Filter, Level};
use crate::shape::Problems;
#[cfg(feature = "schema")]
use crate::shape::units::u32_schema;
use crate::shape::units::{Dur, Size, de_opt_u32};
use crate::source::config::{check_stream, regexes};
use crate::source::kind::{Compile, KindSpec};

/// Longest `max_line_bytes` (and `multiline.max_bytes`) accepted.
const MAX_LINE_LIMIT: u64 = 16 << 20;

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct TailSpec {
    /// The stream the lines go to.
    pub stream: String,
    /// Glob patterns of the files to follow (`*`, `?`, `[a-z]`, `**` for any depth), re-scanned for
    /// new files. Relative patterns are read from the config file's directory. A file renamed away
    /// from a matching name is read to its end; a pattern that also matches rotated names
    /// (`app.log*`) keeps them followed until deleted, which also covers rotations while colibri
    /// is stopped (exclude compressed ones: `exclude: ['*.gz']`).
    pub paths: Vec<String>,
    /// Glob patterns of files not to follow: a pattern with a `/` is matched against the whole path,
    /// one without against the file name (e.g. `*.gz`).
    #[serde(default)]
    pub exclude: Vec<String>,
    /// Where to start in files that are there when the source first runs (no checkpoint yet):
    /// `beginning` (default) or `end`. Files that appear later are always read from their beginning.
    #[serde(default)]
    pub start_at: StartAt,
    /// Regular expressions; when given, only records matching at least one are kept.
    #[serde(default)]
    pub include_lines: Vec<String>,
    /// Regular expressions; records matching any are dropped (after `include_lines`).
    #[serde(default)]
    pub exclude_lines: Vec<String>,
    /// Drops records below this level. The level is read from a JSON line's `level` (or `severity`)
    /// field, a string or a bunyan/pino number, or from a logfmt `level=` (`severity=`, `lvl=`) pair;
    /// lines without one are kept.
    #[serde(default)]
    pub min_level: Option<Level>,
    /// Longer lines are cut to this many bytes (marked `"truncated": true`, and counted); the rest of
    /// the line is skipped. Default 64KiB.
    #[serde(default)]
    pub max_line_bytes: Option<Size>,
    /// Joins lines into one record, e.g. a stack trace with the line that announced it.
    #[serde(default)]
    pub multiline: Option<MultilineSpec>,
    /// What a record carries besides `line` (always there): any of `path` (the file's path, as
    /// first seen), `offset` (the line's byte offset in it), `lines` (how many lines a multiline
    /// record joins, when more than one), `truncated` (`true` when the line was cut) and `host`
    /// (the machine's name), in that order. Default: all of them. `fields: []` sends
    /// `{"line":"..."}` alone (with `labels` when set), the least on the wire.
    #[serde(default)]
    #[cfg_attr(
        feature = "schema",
        schemars(extend("default" = ["path", "offset", "lines", "truncated", "host"]))
    )]
    pub fields: Option<Vec<FieldSpec>>,
    /// Add the machine's host name as `host`. Default true. `host: false` is the same as leaving
    /// `host` out of `fields`; when both are set they must agree.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(with = "bool", extend("default" = true)))]
    pub host: Option<bool>,
    /// Fields added to every record under `labels`.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// What the lines are. `text` (default): each line is the `line` of a record. `json`: a line
    /// that is one JSON object is sent as the record itself, with the `fields` and `labels` it
    /// does not have already added at its end (its own keys win; `fields: []` and no labels send
    /// it exactly as written); any other line (not JSON, not an object, invalid UTF-8, cut at
    /// `max_line_bytes`) is wrapped as with `text` and counted, so a receiver never gets a record
    /// it cannot read. Lines of a multiline group are checked together, as one text.
    #[serde(default)]
    pub format: Format,
    /// `auto` (default): inotify, or polling where it is not available; `poll`: check the files
    /// every `poll_interval` (e.g. for network filesystems, where inotify sees no remote writes).
    #[serde(default)]
    pub watch: WatchMode,
    /// How often files are checked for new data when polling. Default 1s.
    #[serde(default)]
    pub poll_interval: Option<Dur>,
    /// How often the `paths` globs are expanded again to find new files (with inotify, new files in
    /// watched directories are found at once; this catches new directories). Default 10s.
    #[serde(default)]
    pub scan_interval: Option<Dur>,
    /// How long a file that was renamed away or deleted is kept open after its last new data, so
    /// lines its writer adds before reopening are still read. Default 5s.
    #[serde(default)]
    pub rotate_wait: Option<Dur>,
}

/// A field a tail record may carry besides `line`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum FieldSpec {
    Path,
    Offset,
    Lines,
    Truncated,
    Host,
}

/// Lines that belong together.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct MultilineSpec {
    /// A regular expression: a line matching it starts a new record; lines that do not are added to
    /// the record before them, e.g. `'^\d{4}-\d{2}-\d{2}'` for lines that start with a date.
    pub start: String,
    /// Most lines in one record; further lines start the next record. Default 500.
    #[serde(default, deserialize_with = "de_opt_u32")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "u32_schema"))]
    pub max_lines: Option<u32>,
    /// Most bytes in one record; a line that would pass it starts the next record. Default 1MiB.
    #[serde(default)]
    pub max_bytes: Option<Size>,
    /// A record that got no new line for this long is complete. Default 1s.
    #[serde(default)]
    pub timeout: Option<Dur>,
}

impl KindSpec for TailSpec {
    type Config = TailConfig;

    fn compile(self, cx: &mut Compile<'_, '_>) -> Option<TailConfig> {
        let (spec, err) = (self, &mut *cx.err);
        check_stream(&spec.stream, cx.streams, err);
        if spec.paths.is_empty() {
            err.add("paths", "at least one glob pattern is needed".into());
        }
        // Relative patterns are read from the config file's directory, whose name may hold glob
        // characters of its own: those are escaped.
        let base = glob::Pattern::escape(&cx.base.to_string_lossy());
        let patterns = patterns(&spec.paths, &base, err);
        let exclude = excludes(&spec.exclude, &base, err);
        let filter = filter(&spec, err);
        let max_line_bytes = spec
            .max_line_bytes
            .map_or(crate::source::tail::DEFAULT_MAX_LINE_BYTES, |s| s.0);
        if max_line_bytes == 0 || max_line_bytes > MAX_LINE_LIMIT {
            err.add(
                "max_line_bytes",
                format!("must be between 1 byte and 16MiB, not {max_line_bytes} bytes"),
            );
        }
        let multiline = spec
            .multiline
            .and_then(|m| multiline(m, max_line_bytes, err));
        let fields = compile_fields(spec.fields.as_deref(), spec.host, err);
        for key in spec.labels.keys() {
            if key.is_empty() {
                err.add("labels", "a label name must not be empty".into());
            }
        }
        let poll_interval = at_least(
            "poll_interval",
            spec.poll_interval,
            Duration::from_secs(1),
            Duration::from_millis(10),
            err,
        );
        let scan_interval = at_least(
            "scan_interval",
            spec.scan_interval,
            Duration::from_secs(10),
            Duration::from_millis(100),
            err,
        );
        let rotate_wait = spec.rotate_wait.map_or(Duration::from_secs(5), |d| d.0);
        Some(TailConfig {
            name: cx.name.to_string(),
            stream: spec.stream,
            paths: spec.paths,
            patterns,
            exclude,
            start_at: spec.start_at,
            filter,
            max_line_bytes: max_line_bytes as usize,
            multiline,
            fields,
            labels: spec.labels.into_iter().collect(),
            format: spec.format,
            watch: spec.watch,
            poll_interval,
            scan_interval,
            rotate_wait,
        })
    }
}

/// `p` made absolute from `base` (the config file's directory as a glob pattern).
fn absolute(base: &str, p: &str) -> String {
    if p.starts_with('/') || base.is_empty() {
        p.to_string()
    } else {
        format!("{}/{p}", base.trim_end_matches('/'))
    }
}

/// `paths` as absolute glob patterns, each bad one named as `paths[i]`.
fn patterns(paths: &[String], base: &str, err: &mut Problems<'_>) -> Vec<String> {
    let mut patterns = Vec::new();
    for (i, p) in paths.iter().enumerate() {
        let at = format!("paths[{i}]");
        if p.trim().is_empty() {
            err.add(&at, "must not be empty".into());
            continue;
        }
        if p.ends_with('/') {
            err.add(
                &at,
                format!("{p:?} names a directory; match the files in it, e.g. \"{p}*.log\""),
            );
            continue;
        }
        let abs = absolute(base, p);
        match glob::Pattern::new(&abs) {
            Ok(_) => patterns.push(abs),
            Err(e) => err.add(&at, format!("bad glob {p:?}: {e}")),
        }
    }
    patterns
}

/// `exclude` compiled: a pattern without a `/` matches a file's name, any other its absolute path.
fn excludes(list: &[String], base: &str, err: &mut Problems<'_>) -> Vec<Exclude> {
    let mut exclude = Vec::new();
    for (i, p) in list.iter().enumerate() {
        let at = format!("exclude[{i}]");
        let name_only = !p.contains('/');
        let text = if name_only {
            p.clone()
        } else {
            absolute(base, p)
        };
        match glob::Pattern::new(&text) {
            Ok(pattern) if !p.is_empty() => exclude.push(Exclude {
                pattern,
                name_only,
                text: p.clone(),
            }),
            Ok(_) => err.add(&at, "must not be empty".into()),
            Err(e) => err.add(&at, format!("bad glob {p:?}: {e}")),
        }
    }
    exclude
}

/// The line filter: lines to keep, lines to drop, the lowest level kept.
fn filter(spec: &TailSpec, err: &mut Problems<'_>) -> Filter {
    Filter {
        include: regexes("include_lines", &spec.include_lines, err),
        exclude: regexes("exclude_lines", &spec.exclude_lines, err),
        min_level: spec.min_level,
    }
}

/// `multiline` checked against `max_line_bytes`; `None` when its start pattern is bad.
fn multiline(
    m: MultilineSpec,
    max_line_bytes: u64,
    err: &mut Problems<'_>,
) -> Option<MultilineConfig> {
    let start = match regex_lite::Regex::new(&m.start) {
        Ok(re) => Some(re),
        Err(e) => {
            err.add("multiline.start", format!("bad regex {:?}: {e}", m.start));
            None
        }
    };
    let max_lines = m.max_lines.unwrap_or(500);
    if max_lines == 0 {
        err.add("multiline.max_lines", "must be at least 1".into());
    }
    let max_bytes = m.max_bytes.map_or(1 << 20, |s| s.0);
    if max_bytes > MAX_LINE_LIMIT {
        err.add("multiline.max_bytes", "must be at most 16MiB".into());
    } else if max_bytes < max_line_bytes {
        err.add(
            "multiline.max_bytes",
            format!(
                "{max_bytes} bytes is less than max_line_bytes ({max_line_bytes}): one line must fit in a record"
            ),
        );
    }
    let timeout = m.timeout.map_or(Duration::from_secs(1), |d| d.0);
    if timeout.is_zero() {
        err.add("multiline.timeout", "must be positive".into());
    }
    Some(MultilineConfig {
        start: start?,
        max_lines,
        max_bytes: max_bytes as usize,
        timeout,
    })
}

/// `d` (or `default`), refused under `min`.
fn at_least(
    field: &str,
    d: Option<Dur>,
    default: Duration,
    min: Duration,
    err: &mut Problems<'_>,
) -> Duration {
    let d = d.map_or(default, |d| d.0);
    if d < min {
        err.add(
            field,
            format!("must be at least {}", crate::units::fmt_duration(min)),
        );
    }
    d
}

/// `fields` (default: all) and `host` (the older way to leave the host out) as one set.
fn compile_fields(
    list: Option<&[FieldSpec]>,
    host: Option<bool>,
    err: &mut Problems<'_>,
) -> Fields {
    let Some(list) = list else {
        return match host {
            Some(false) => Fields::ALL.without(Fields::HOST),
            _ => Fields::ALL,
        };
    };
    let mut fields = Fields::NONE;
    for (i, f) in list.iter().enumerate() {
        let (bit, name) = match f {
            FieldSpec::Path => (Fields::PATH, "path"),
            FieldSpec::Offset => (Fields::OFFSET, "offset"),
            FieldSpec::Lines => (Fields::LINES, "lines"),
            FieldSpec::Truncated => (Fields::TRUNCATED, "truncated"),
            FieldSpec::Host => (Fields::HOST, "host"),
        };
        if fields.contains(bit) {
            err.add(&format!("fields[{i}]"), format!("{name} is listed twice"));
        }
        fields = fields.with(bit);
    }
    if let Some(host) = host
        && host != fields.contains(Fields::HOST)
    {
        err.add(
            "host",
            format!(
                "host: {host} disagrees with fields, which {} host: list it in fields (or not) and leave host out",
                if host { "does not list" } else { "lists" }
            ),
        );
    }
    fields
}

#[cfg(test)]
mod tests {
    use crate::config::{ConfigError, load_str};
    use crate::source::kind::Settings as _;
    use crate::source::tail::record::Fields;
    use std::path::Path;

    fn load(sources: &str) -> Result<crate::config::Config, Vec<String>> {
        let text = format!("data_dir: /tmp/x\nstreams:\n  logs: {{}}\nsources:\n{sources}");
        load_str(&text, Path::new("/etc/colibri/colibri.yaml"), &|_| None).map_err(|e| match e {
            ConfigError::Invalid { problems, .. } => {
                problems.iter().map(|p| p.to_string()).collect()
            }
            other => vec![other.to_string()],
        })
    }

    fn tail(c: &crate::config::Config) -> &crate::source::tail::TailConfig {
        match &c.sources[0] {
            crate::source::Source::Tail(t) => t,
            #[cfg(feature = "syslog")]
            other => panic!("not a tail source: {other:?}"),
        }
    }

    /// `problems` are exactly `want`, each named by the start of its text.
    fn assert_problems(problems: &[String], want: &[&str]) {
        for w in want {
            assert!(
                problems.iter().any(|p| p.starts_with(w)),
                "no problem starting {w:?} in:\n{}",
                problems.join("\n")
            );
        }
        assert_eq!(problems.len(), want.len(), "{}", problems.join("\n"));
    }

    #[test]
    fn a_full_tail_source_compiles() {
        let c = load(
            r#"  app:
    type: tail
    stream: logs
    paths: ["/var/log/app/*.log", "rel/*.log"]
    exclude: ["*.gz", "/var/log/app/secret.log"]
    start_at: end
    include_lines: ["api"]
    exclude_lines: ["health"]
    min_level: warn
    max_line_bytes: 1KiB
    multiline: { start: '^\d{4}-', max_lines: 50, max_bytes: 64KiB, timeout: 2s }
    host: false
    labels: { app: api, env: prod }
    watch: poll
    poll_interval: 250ms
    scan_interval: 3s
    rotate_wait: 1s
"#,
        )
        .unwrap();
        let s = tail(&c);
        assert_eq!(s.name, "app");
        assert_eq!(s.stream, "logs");
        assert_eq!(
            s.patterns,
            vec!["/var/log/app/*.log", "/etc/colibri/rel/*.log"]
        );
        assert!(s.exclude[0].name_only && !s.exclude[1].name_only);
        assert_eq!(s.start_at, crate::source::tail::StartAt::End);
        assert_eq!(s.filter.min_level, Some(crate::record::filter::Level::Warn));
        assert_eq!(s.max_line_bytes, 1024);
        let m = s.multiline.as_ref().unwrap();
        assert_eq!((m.max_lines, m.max_bytes), (50, 64 << 10));
        assert_eq!(m.timeout, std::time::Duration::from_secs(2));
        assert_eq!(s.fields, Fields::ALL.without(Fields::HOST));
        assert_eq!(s.labels.len(), 2);
        assert_eq!(s.watch, crate::source::tail::WatchMode::Poll);
        assert_eq!(s.rotate_wait, std::time::Duration::from_secs(1));
        let d = s.describe();
        assert!(
            d.contains("/var/log/app/*.log") && d.contains("-> logs"),
            "{d}"
        );
        assert!(
            d.contains("multiline") && d.contains("min_level warn"),
            "{d}"
        );
    }

    #[test]
    fn defaults() {
        let c = load("  app: { type: tail, stream: logs, paths: [/var/log/*.log] }\n").unwrap();
        let s = tail(&c);
        assert_eq!(s.start_at, crate::source::tail::StartAt::Beginning);
        assert_eq!(s.max_line_bytes, 64 << 10);
        assert!(s.multiline.is_none() && s.filter.is_empty());
        assert_eq!(s.fields, Fields::ALL);
        assert_eq!(s.format, crate::source::tail::Format::Text);
        assert_eq!(s.watch, crate::source::tail::WatchMode::Auto);
        assert_eq!(s.scan_interval, std::time::Duration::from_secs(10));
        assert_eq!(s.rotate_wait, std::time::Duration::from_secs(5));
    }

    #[test]
    fn every_problem_names_its_field() {
        let problems = load(
            r#"  app:
    type: tail
    stream: nope
    paths: ["/var/log/[z-a", "", "/var/log/"]
    exclude: ["[", ""]
    include_lines: ["(unclosed"]
    exclude_lines: ["ok", "*bad"]
    max_line_bytes: 0
    multiline: { start: "[", max_lines: 0, timeout: 0s }
    poll_interval: 1ms
    scan_interval: 1ms
  "bad name":
    type: tail
    stream: logs
    paths: []
  other:
    type: tail
    stream: logs
    paths: [a.log]
    surprise: 1
"#,
        )
        .unwrap_err();
        let want = [
            "sources.app.stream: stream \"nope\" is not defined under streams: (defined: logs)",
            "sources.app.paths[0]: bad glob",
            "sources.app.paths[1]: must not be empty",
            "sources.app.paths[2]: \"/var/log/\" names a directory",
            "sources.app.exclude[0]: bad glob",
            "sources.app.exclude[1]: must not be empty",
            "sources.app.include_lines[0]: bad regex \"(unclosed\"",
            "sources.app.exclude_lines[1]: bad regex",
            "sources.app.max_line_bytes: must be between",
            "sources.app.multiline.start: bad regex",
            "sources.app.multiline.max_lines: must be at least 1",
            "sources.app.multiline.timeout: must be positive",
            "sources.app.poll_interval: must be at least 10ms",
            "sources.app.scan_interval: must be at least 100ms",
            "sources.bad name: a source name",
            "sources.bad name.paths: at least one glob pattern",
            "sources.other.surprise: unknown field `surprise`",
        ];
        assert_problems(&problems, &want);
    }

    #[test]
    fn fields_and_format_compile() {
        let one = |settings: &str| {
            let c = load(&format!(
                "  app: {{ type: tail, stream: logs, paths: [a.log]{settings} }}\n"
            ))
            .unwrap_or_else(|p| panic!("{settings}: {p:?}"));
            let s = tail(&c);
            (s.fields, s.format)
        };
        let text = crate::source::tail::Format::Text;
        assert_eq!(one(""), (Fields::ALL, text));
        assert_eq!(one(", fields: []"), (Fields::NONE, text));
        assert_eq!(
            one(", fields: [offset, host], format: json"),
            (
                Fields::OFFSET.with(Fields::HOST),
                crate::source::tail::Format::Json
            )
        );
        assert_eq!(
            one(", host: false"),
            (Fields::ALL.without(Fields::HOST), text)
        );
        assert_eq!(one(", fields: [path], host: false"), (Fields::PATH, text));
        assert_eq!(
            one(", fields: [host, truncated, lines], host: true"),
            (
                Fields::HOST.with(Fields::TRUNCATED).with(Fields::LINES),
                text
            )
        );
        let c = load(
            "  app: { type: tail, stream: logs, paths: [a.log], fields: [offset], format: json }\n",
        )
        .unwrap();
        let d = c.sources[0].describe();
        assert!(
            d.contains("format json") && d.contains("fields: line, offset"),
            "{d}"
        );
        let c = load("  app: { type: tail, stream: logs, paths: [a.log], fields: [] }\n").unwrap();
        let d = c.sources[0].describe();
        assert!(d.contains("fields: line only"), "{d}");
    }

    #[test]
    fn fields_and_format_problems_name_their_field() {
        let problems = load(
            r#"  a: { type: tail, stream: logs, paths: [a.log], fields: [path, offset, path] }
  b: { type: tail, stream: logs, paths: [a.log], fields: [path], host: true }
  c: { type: tail, stream: logs, paths: [a.log], fields: [host], host: false }
  d: { type: tail, stream: logs, paths: [a.log], fields: [line] }
  e: { type: tail, stream: logs, paths: [a.log], format: xml }
  f: { type: tail, stream: logs, paths: [a.log], fields: path }
"#,
        )
        .unwrap_err();
        let want = [
            "sources.a.fields[2]: path is listed twice",
            "sources.b.host: host: true disagrees with fields, which does not list host",
            "sources.c.host: host: false disagrees with fields, which lists host",
            "sources.d.fields[0]: unknown variant `line`",
            "sources.e.format: unknown variant `xml`",
            "sources.f.fields:",
        ];
        assert_problems(&problems, &want);
    }

    #[test]
    fn multiline_must_hold_a_line() {
        let problems = load(
            "  app: { type: tail, stream: logs, paths: [a], max_line_bytes: 2MiB, multiline: { start: x } }\n",
        )
        .unwrap_err();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with(
                "sources.app.multiline.max_bytes: 1048576 bytes is less than max_line_bytes"
            ),
            "{problems:?}"
        );
    }
}
