//! The Prometheus text exposition format (version 0.0.4) into line-protocol records: one record per
//! sample line, `measurement,<labels + extra tags> <metric name>=<value> <timestamp>`. It owns the
//! parsing of sample lines; it does not fetch the body, bound its size (the caller does), check the
//! `# TYPE` metadata or group histogram and summary series (`foo_bucket`, `foo_sum`, `foo_count`
//! stay separate fields, with `le` and `quantile` as tags). Called by the `http_scrape` task
//! handler for `format: prometheus`.
//!
//! Decisions: an extra tag (set by the operator) wins over a sample label of the same name; a
//! sample whose value is NaN or ±Inf is skipped and counted (line protocol cannot carry it); a
//! sample's own timestamp (milliseconds) wins over the scrape time; a label with an empty value is
//! left out, as Prometheus treats it as absent. A malformed line (bad syntax, a duplicate label
//! name, a timestamp the precision cannot hold) fails the whole response. The parser works on
//! bytes and slices only at ASCII delimiters, so no input can make it panic (fuzzed by
//! `fuzz/fuzz_targets/prometheus.rs`).

use std::borrow::Cow;

use super::lineproto::{FieldValue, LineBuilder, Precision};

/// How samples become records.
#[derive(Debug, Clone, Copy)]
pub struct PromOptions<'a> {
    pub measurement: &'a str,
    /// Tags added to every record (e.g. the scraped target's name); they win over sample labels.
    pub extra_tags: &'a [(String, String)],
    /// Used for samples without a timestamp of their own.
    pub scrape_ts_ns: i64,
    pub precision: Precision,
}

/// What one response gave.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PromStats {
    /// Records written (one per sample line with a finite value).
    pub samples: u64,
    /// Sample lines left out because their value was NaN, +Inf or -Inf.
    pub skipped_non_finite: u64,
}

/// A malformed line; the whole response is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct ParseError {
    /// 1-based.
    pub line: usize,
    pub message: String,
}

/// Converts a whole exposition-format body, appending one record per sample to `out`. On error
/// `out` is left as it was on entry, so the caller never stores half a response.
pub fn to_lines(
    text: &str,
    opts: &PromOptions,
    out: &mut Vec<Vec<u8>>,
) -> Result<PromStats, ParseError> {
    let entry_len = out.len();
    let result = convert(text, opts, out);
    if result.is_err() {
        out.truncate(entry_len);
    }
    result
}

fn convert(
    text: &str,
    opts: &PromOptions,
    out: &mut Vec<Vec<u8>>,
) -> Result<PromStats, ParseError> {
    // Sorted once per response so each record merges two sorted lists without allocating.
    let mut extra: Vec<(&str, &str)> = opts
        .extra_tags
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    extra.sort_by(|a, b| a.0.cmp(b.0));
    extra.dedup_by(|later, earlier| later.0 == earlier.0);
    // What the extra tags add to each record, to reserve it once.
    let extra_len: usize = extra.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
    let scrape_ts = opts.precision.from_unix_ns(opts.scrape_ts_ns);
    // Reused for every line: a label costs no allocation unless its value has escapes.
    let mut labels: Vec<(&str, Cow<str>)> = Vec::new();
    let mut stats = PromStats::default();

    for (index, raw) in text.split('\n').enumerate() {
        let line_no = index + 1;
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        let line = line.trim_start_matches([' ', '\t']);
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fail = |message: String| ParseError {
            line: line_no,
            message,
        };
        labels.clear();
        let sample = parse_sample(line, &mut labels).map_err(fail)?;
        labels.sort_unstable_by(|a, b| a.0.cmp(b.0));
        if let Some(pair) = labels.windows(2).find(|pair| pair[0].0 == pair[1].0) {
            return Err(fail(format!(
                "label {:?} appears twice on {}",
                pair[0].0, sample.name
            )));
        }
        let ts = match sample.ts_ms {
            Some(ms) => opts.precision.from_unix_ms(ms).ok_or_else(|| {
                fail(format!(
                    "timestamp {ms} ms is out of range for precision {}",
                    opts.precision.name()
                ))
            })?,
            None => scrape_ts,
        };
        if !sample.value.is_finite() {
            stats.skipped_non_finite += 1;
            continue;
        }

        let mut record = LineBuilder::with_capacity(opts.measurement, line.len() + extra_len);
        // The operator's tags win over the target's labels.
        record.merged_tags(&labels, &extra);
        let mut fields = record.fields();
        fields.field(sample.name, &FieldValue::Float(sample.value));
        let record = fields
            .finish(Some(ts))
            .expect("a finite value under a non-empty metric name is always written");
        out.push(record);
        stats.samples += 1;
    }
    Ok(stats)
}

/// One sample line, its labels in the caller's vector.
struct Sample<'t> {
    name: &'t str,
    value: f64,
    ts_ms: Option<i64>,
}

/// A position in one line. Every index it stops at is just before or after an ASCII byte (or at
/// an end), so slicing the line there is always on a character boundary.
struct Cursor<'t> {
    s: &'t str,
    pos: usize,
}

impl<'t> Cursor<'t> {
    fn peek(&self) -> Option<u8> {
        self.s.as_bytes().get(self.pos).copied()
    }

    fn skip_blanks(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.pos += 1;
        }
    }

    /// The rest of the line, shortened for an error message.
    fn rest(&self) -> String {
        snippet(&self.s[self.pos..])
    }

    /// A run of bytes up to a blank or the end (a value or a timestamp).
    fn token(&mut self) -> &'t str {
        let start = self.pos;
        while !matches!(self.peek(), None | Some(b' ' | b'\t')) {
            self.pos += 1;
        }
        &self.s[start..self.pos]
    }

    /// `[first][rest]*`, ASCII only; empty when the first byte does not fit.
    fn name(&mut self, first: fn(u8) -> bool, rest: fn(u8) -> bool) -> &'t str {
        let start = self.pos;
        if self.peek().is_some_and(first) {
            self.pos += 1;
            while self.peek().is_some_and(rest) {
                self.pos += 1;
            }
        }
        &self.s[start..self.pos]
    }
}

fn metric_first(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_' || b == b':'
}

fn metric_rest(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b':'
}

fn label_first(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_'
}

fn label_rest(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// At most 40 characters of `s`, quoted, for error messages (cut at a character boundary).
fn snippet(s: &str) -> String {
    match s.char_indices().nth(40) {
        Some((cut, _)) => format!("{:?}...", &s[..cut]),
        None => format!("{s:?}"),
    }
}

/// Parses `name[{labels}] value [timestamp]` (leading blanks already gone).
fn parse_sample<'t>(
    line: &'t str,
    labels: &mut Vec<(&'t str, Cow<'t, str>)>,
) -> Result<Sample<'t>, String> {
    let mut c = Cursor { s: line, pos: 0 };
    let name = c.name(metric_first, metric_rest);
    if name.is_empty() {
        return Err(format!("expected a metric name, found {}", c.rest()));
    }
    // Go's parser would read `up+1` as `up` = `+1`; a name running into other text is far more
    // likely a name with a character Prometheus does not allow (`bad-name 2`), so say that.
    if !matches!(c.peek(), None | Some(b' ' | b'\t' | b'{')) {
        return Err(format!(
            "expected a blank or \"{{\" after metric name {name}, found {}",
            c.rest()
        ));
    }
    c.skip_blanks();
    if c.peek() == Some(b'{') {
        c.pos += 1;
        parse_labels(&mut c, name, labels)?;
        c.skip_blanks();
    }
    let value_text = c.token();
    if value_text.is_empty() {
        return Err(format!("{name}: expected a value"));
    }
    let value = parse_value(value_text)
        .ok_or_else(|| format!("{name}: invalid value {}", snippet(value_text)))?;
    c.skip_blanks();
    let ts_ms = if c.peek().is_some() {
        let ts_text = c.token();
        let ts: i64 = ts_text.parse().map_err(|_| {
            format!(
                "{name}: invalid timestamp {} (expected integer milliseconds)",
                snippet(ts_text)
            )
        })?;
        c.skip_blanks();
        if c.peek().is_some() {
            return Err(format!(
                "{name}: unexpected text after the timestamp: {}",
                c.rest()
            ));
        }
        Some(ts)
    } else {
        None
    };
    Ok(Sample { name, value, ts_ms })
}

/// Parses the labels after `{` up to and including `}`.
fn parse_labels<'t>(
    c: &mut Cursor<'t>,
    metric: &str,
    labels: &mut Vec<(&'t str, Cow<'t, str>)>,
) -> Result<(), String> {
    loop {
        c.skip_blanks();
        // `{}`, and a trailing comma before `}`, are allowed.
        if c.peek() == Some(b'}') {
            c.pos += 1;
            return Ok(());
        }
        let label = c.name(label_first, label_rest);
        if label.is_empty() {
            return Err(format!(
                "{metric}: expected a label name or \"}}\", found {}",
                c.rest()
            ));
        }
        c.skip_blanks();
        if c.peek() != Some(b'=') {
            return Err(format!(
                "{metric}: expected \"=\" after label {label}, found {}",
                c.rest()
            ));
        }
        c.pos += 1;
        c.skip_blanks();
        if c.peek() != Some(b'"') {
            return Err(format!(
                "{metric}: expected a quoted value for label {label}, found {}",
                c.rest()
            ));
        }
        c.pos += 1;
        let value = parse_label_value(c)
            .map_err(|problem| format!("{metric}: label {label}: {problem}"))?;
        labels.push((label, value));
        c.skip_blanks();
        match c.peek() {
            Some(b',') => c.pos += 1,
            Some(b'}') => {
                c.pos += 1;
                return Ok(());
            }
            _ => {
                return Err(format!(
                    "{metric}: expected \",\" or \"}}\" after label {label}, found {}",
                    c.rest()
                ));
            }
        }
    }
}

/// Parses a label value after its opening quote, through the closing one. Borrowed unless it has
/// escapes.
fn parse_label_value<'t>(c: &mut Cursor<'t>) -> Result<Cow<'t, str>, String> {
    let bytes = c.s.as_bytes();
    let start = c.pos;
    let mut owned: Option<String> = None;
    // Start of the text not yet copied into `owned`.
    let mut copied = start;
    while let Some(&b) = bytes.get(c.pos) {
        match b {
            b'"' => {
                let tail = &c.s[copied..c.pos];
                c.pos += 1;
                return Ok(match owned {
                    None => Cow::Borrowed(tail),
                    Some(mut s) => {
                        s.push_str(tail);
                        Cow::Owned(s)
                    }
                });
            }
            b'\\' => {
                let unescaped = match bytes.get(c.pos + 1) {
                    Some(b'\\') => '\\',
                    Some(b'"') => '"',
                    Some(b'n') => '\n',
                    Some(_) => {
                        // `pos + 1` follows an ASCII byte, so it is a character boundary.
                        let next = c.s[c.pos + 1..].chars().next().unwrap_or_default();
                        return Err(format!(
                            "invalid escape \"\\{next}\" (only \\\\, \\\" and \\n are allowed)"
                        ));
                    }
                    None => break,
                };
                let s = owned.get_or_insert_with(String::new);
                s.push_str(&c.s[copied..c.pos]);
                s.push(unescaped);
                c.pos += 2;
                copied = c.pos;
            }
            _ => c.pos += 1,
        }
    }
    Err("unterminated value (no closing quote)".into())
}

/// A sample value as Go's `strconv.ParseFloat` reads it, minus hexadecimal floats, which no
/// Prometheus client writes: decimals with an optional sign and exponent, and `NaN`, `Inf`, `+Inf`,
/// `-Inf` in any case. Rust's parser accepts the same set (and `infinity`, as Go does).
fn parse_value(text: &str) -> Option<f64> {
    text.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TS: i64 = 1_700_000_000_123_456_789;

    fn run(
        text: &str,
        extra: &[(String, String)],
        precision: Precision,
    ) -> (Vec<String>, PromStats) {
        let opts = PromOptions {
            measurement: "prom",
            extra_tags: extra,
            scrape_ts_ns: TS,
            precision,
        };
        let mut out = Vec::new();
        let stats = to_lines(text, &opts, &mut out).expect("parses");
        let lines = out
            .into_iter()
            .map(|r| String::from_utf8(r).expect("utf-8"))
            .collect();
        (lines, stats)
    }

    fn fail(text: &str) -> ParseError {
        let opts = PromOptions {
            measurement: "prom",
            extra_tags: &[],
            scrape_ts_ns: TS,
            precision: Precision::Ns,
        };
        let mut out = vec![b"kept".to_vec()];
        let err = to_lines(text, &opts, &mut out).expect_err("must fail");
        assert_eq!(out, vec![b"kept".to_vec()], "output left as on entry");
        err
    }

    #[test]
    fn node_exporter_snippet() {
        let text = "\
# HELP node_cpu_seconds_total Seconds the CPUs spent in each mode.
# TYPE node_cpu_seconds_total counter
node_cpu_seconds_total{cpu=\"0\",mode=\"idle\"} 2.6418186e+06
node_cpu_seconds_total{cpu=\"0\",mode=\"user\"} 4431.07
# HELP node_filesystem_avail_bytes Filesystem space available to non-root users in bytes.
# TYPE node_filesystem_avail_bytes gauge
node_filesystem_avail_bytes{device=\"/dev/sda1\",fstype=\"ext4\",mountpoint=\"/\"} 4.2312089e+10
# HELP node_load1 1m load average.
# TYPE node_load1 gauge
node_load1 0.21

# HELP go_goroutines Number of goroutines that currently exist.
# TYPE go_goroutines gauge
go_goroutines 8
";
        let (lines, stats) = run(text, &[], Precision::S);
        assert_eq!(
            lines,
            [
                "prom,cpu=0,mode=idle node_cpu_seconds_total=2641818.6 1700000000",
                "prom,cpu=0,mode=user node_cpu_seconds_total=4431.07 1700000000",
                "prom,device=/dev/sda1,fstype=ext4,mountpoint=/ node_filesystem_avail_bytes=42312089000 1700000000",
                "prom node_load1=0.21 1700000000",
                "prom go_goroutines=8 1700000000",
            ]
        );
        assert_eq!(
            stats,
            PromStats {
                samples: 5,
                skipped_non_finite: 0
            }
        );
    }

    #[test]
    fn histogram_with_inf_bucket() {
        let text = "\
# HELP http_request_duration_seconds A histogram of the request duration.
# TYPE http_request_duration_seconds histogram
http_request_duration_seconds_bucket{handler=\"/api\",le=\"0.05\"} 24054
http_request_duration_seconds_bucket{handler=\"/api\",le=\"0.1\"} 33444
http_request_duration_seconds_bucket{handler=\"/api\",le=\"+Inf\"} 144320
http_request_duration_seconds_sum{handler=\"/api\"} 53423
http_request_duration_seconds_count{handler=\"/api\"} 144320
";
        let (lines, stats) = run(text, &[], Precision::Ms);
        assert_eq!(
            lines,
            [
                "prom,handler=/api,le=0.05 http_request_duration_seconds_bucket=24054 1700000000123",
                "prom,handler=/api,le=0.1 http_request_duration_seconds_bucket=33444 1700000000123",
                "prom,handler=/api,le=+Inf http_request_duration_seconds_bucket=144320 1700000000123",
                "prom,handler=/api http_request_duration_seconds_sum=53423 1700000000123",
                "prom,handler=/api http_request_duration_seconds_count=144320 1700000000123",
            ]
        );
        assert_eq!(stats.samples, 5);
    }

    #[test]
    fn summary_with_quantiles_and_a_nan() {
        let text = "\
# HELP rpc_duration_seconds A summary of the RPC duration in seconds.
# TYPE rpc_duration_seconds summary
rpc_duration_seconds{quantile=\"0.01\"} 3102
rpc_duration_seconds{quantile=\"0.5\"} 4773
rpc_duration_seconds{quantile=\"0.99\"} NaN
rpc_duration_seconds_sum 1.7560473e+07
rpc_duration_seconds_count 2693
";
        let (lines, stats) = run(text, &[], Precision::S);
        assert_eq!(
            lines,
            [
                "prom,quantile=0.01 rpc_duration_seconds=3102 1700000000",
                "prom,quantile=0.5 rpc_duration_seconds=4773 1700000000",
                "prom rpc_duration_seconds_sum=17560473 1700000000",
                "prom rpc_duration_seconds_count=2693 1700000000",
            ]
        );
        assert_eq!(
            stats,
            PromStats {
                samples: 4,
                skipped_non_finite: 1
            }
        );
    }

    #[test]
    fn non_finite_values_are_skipped_and_counted() {
        let text = "a +Inf\nb -Inf\nc Inf\nd nan\ne -0.5\nf 1e500\n";
        let (lines, stats) = run(text, &[], Precision::S);
        assert_eq!(lines, ["prom e=-0.5 1700000000"]);
        assert_eq!(
            stats,
            PromStats {
                samples: 1,
                skipped_non_finite: 5
            }
        );
    }

    #[test]
    fn escaped_label_values() {
        let text =
            r#"windows_file_size{path="C:\\dir\\app.log",note="say \"hi\"",msg="two\nlines"} 1024"#;
        let (lines, _) = run(text, &[], Precision::S);
        assert_eq!(
            lines,
            [
                r#"prom,msg=two\ lines,note=say\ "hi",path=C:\dir\app.log windows_file_size=1024 1700000000"#
            ]
        );
    }

    #[test]
    fn label_syntax_variants() {
        let text = "\
m1{} 1
m2{a=\"x\",} 2
m3 { a = \"x\" , b=\"y\" , } 3
m4{a=\"\",b=\"kept\"} 4
m5{a=\"x,y=z w\"}\t5
\tm6 6
";
        let (lines, _) = run(text, &[], Precision::S);
        assert_eq!(
            lines,
            [
                "prom m1=1 1700000000",
                "prom,a=x m2=2 1700000000",
                "prom,a=x,b=y m3=3 1700000000",
                "prom,b=kept m4=4 1700000000",
                r"prom,a=x\,y\=z\ w m5=5 1700000000",
                "prom m6=6 1700000000",
            ]
        );
    }

    #[test]
    fn sample_timestamps_win_over_the_scrape_time() {
        let text = "\
http_requests_total{method=\"post\",code=\"200\"} 1027 1395066363000
http_requests_total{method=\"post\",code=\"400\"}    3 1395066363000
old_value 1 -1500
no_ts 2
";
        let (ns, _) = run(text, &[], Precision::Ns);
        assert_eq!(
            ns,
            [
                "prom,code=200,method=post http_requests_total=1027 1395066363000000000",
                "prom,code=400,method=post http_requests_total=3 1395066363000000000",
                "prom old_value=1 -1500000000",
                "prom no_ts=2 1700000000123456789",
            ]
        );
        let (us, _) = run(text, &[], Precision::Us);
        assert_eq!(
            us[0],
            "prom,code=200,method=post http_requests_total=1027 1395066363000000"
        );
        assert_eq!(us[3], "prom no_ts=2 1700000000123456");
        let (s, _) = run(text, &[], Precision::S);
        assert_eq!(s[2], "prom old_value=1 -2");
        assert_eq!(s[3], "prom no_ts=2 1700000000");
    }

    #[test]
    fn crlf_line_endings() {
        let text = "# HELP up Whether the target is up.\r\n# TYPE up gauge\r\nup{job=\"plc\"} 1\r\n\r\nup{job=\"hmi\"} 0 1395066363000\r\n";
        let (lines, stats) = run(text, &[], Precision::Ms);
        assert_eq!(
            lines,
            [
                "prom,job=plc up=1 1700000000123",
                "prom,job=hmi up=0 1395066363000",
            ]
        );
        assert_eq!(stats.samples, 2);
    }

    #[test]
    fn extra_tags_are_added_and_win() {
        let extra = vec![
            ("target".to_string(), "plc-1".to_string()),
            ("job".to_string(), "edge".to_string()),
            ("site".to_string(), "".to_string()),
        ];
        let text = "up{job=\"from-target\",zone=\"b\"} 1\nplain 2\n";
        let (lines, _) = run(text, &extra, Precision::S);
        assert_eq!(
            lines,
            [
                "prom,job=edge,target=plc-1,zone=b up=1 1700000000",
                "prom,job=edge,target=plc-1 plain=2 1700000000",
            ]
        );
    }

    #[test]
    fn malformed_lines_name_their_line_and_keep_out_unchanged() {
        let good = "# TYPE up gauge\nup 1\n";
        let cases = [
            (
                format!("{good}up{{job=\"x\" 1\n"),
                3,
                "up: expected \",\" or \"}\" after label job, found \"1\"",
            ),
            (
                format!("{good}up{{job=x}} 1\n"),
                3,
                "up: expected a quoted value for label job, found \"x} 1\"",
            ),
            (
                format!("{good}up{{job=\"x}} 1\n"),
                3,
                "up: label job: unterminated value (no closing quote)",
            ),
            (
                format!("{good}up{{job=\"a\\tb\"}} 1\n"),
                3,
                "up: label job: invalid escape \"\\t\" (only \\\\, \\\" and \\n are allowed)",
            ),
            (
                format!("{good}up{{1job=\"x\"}} 1\n"),
                3,
                "up: expected a label name or \"}\", found \"1job=\\\"x\\\"} 1\"",
            ),
            (
                format!("{good}up{{job\"x\"}} 1\n"),
                3,
                "up: expected \"=\" after label job, found \"\\\"x\\\"} 1\"",
            ),
            (format!("{good}up\n"), 3, "up: expected a value"),
            (format!("{good}up one\n"), 3, "up: invalid value \"one\""),
            (
                format!("{good}up 1 12.5\n"),
                3,
                "up: invalid timestamp \"12.5\" (expected integer milliseconds)",
            ),
            (
                format!("{good}up 1 12 extra\n"),
                3,
                "up: unexpected text after the timestamp: \"extra\"",
            ),
            (
                format!("{good}9up 1\n"),
                3,
                "expected a metric name, found \"9up 1\"",
            ),
            (
                format!("{good}up{{a=\"1\",a=\"2\"}} 1\n"),
                3,
                "label \"a\" appears twice on up",
            ),
            (
                "up 1\r\nbad-name 2\r\n".to_string(),
                2,
                "expected a blank or \"{\" after metric name bad, found \"-name 2\"",
            ),
            (
                format!("{good}up 1 9223372036854775\n"),
                3,
                "timestamp 9223372036854775 ms is out of range for precision ns",
            ),
        ];
        for (text, line, message) in cases {
            let err = fail(&text);
            assert_eq!(err.line, line, "{text:?}");
            assert_eq!(err.message, message, "{text:?}");
            assert_eq!(err.to_string(), format!("line {line}: {message}"));
        }
    }

    #[test]
    fn error_snippets_cut_at_character_boundaries() {
        let text = format!("up{{{}}} 1", "é".repeat(60));
        let err = fail(&text);
        assert_eq!(
            err.message,
            format!(
                "up: expected a label name or \"}}\", found \"{}\"...",
                "é".repeat(40)
            )
        );
        // Multi-byte text in every position a parser could slice.
        for text in [
            "é",
            "up{é",
            "up{a=\"é",
            "up{a=\"\\é\"} 1",
            "up 1é",
            "up 1 2é",
            "up{a=\"x\"é",
        ] {
            let _ = fail(text);
        }
    }

    #[test]
    fn a_unicode_label_value_is_kept() {
        let (lines, _) = run(
            "temp{room=\"Büro 2\"} 21.5 1395066363000",
            &[],
            Precision::S,
        );
        assert_eq!(lines, [r"prom,room=Büro\ 2 temp=21.5 1395066363"]);
    }

    #[test]
    fn empty_and_comment_only_bodies() {
        let (lines, stats) = run("", &[], Precision::S);
        assert!(lines.is_empty());
        assert_eq!(stats, PromStats::default());
        let (lines, _) = run("# just a comment\n\n   \n#\n", &[], Precision::S);
        assert!(lines.is_empty());
    }

    /// A stable-toolchain stand-in for the fuzz target: token soup built from the grammar's
    /// pieces, checked for the same invariants (no panic, all or nothing, one line per record).
    #[test]
    fn token_soup_never_panics_and_stays_single_line() {
        const PIECES: &[&str] = &[
            "up",
            "node_cpu",
            "_x:y",
            "{",
            "}",
            "=",
            ",",
            "\"",
            "\\",
            "\\n",
            "\\\"",
            "\\t",
            " ",
            "\t",
            "\n",
            "\r\n",
            "\r",
            "#",
            "# HELP x y",
            "1",
            "-1.5e3",
            "NaN",
            "+Inf",
            "-Inf",
            "1e400",
            "1395066363000",
            "-9223372036854775808",
            "le",
            "a",
            "é",
            "€",
            "😀",
            "0x1p3",
        ];
        let extra = vec![("job".to_string(), "j".to_string())];
        let mut rng = fastrand::Rng::with_seed(0x5c4a_7e11);
        let mut ok = 0;
        for round in 0..20_000 {
            let mut text = String::new();
            for _ in 0..rng.usize(1..40) {
                text.push_str(PIECES[rng.usize(..PIECES.len())]);
            }
            let precision = [Precision::Ns, Precision::Us, Precision::Ms, Precision::S][round % 4];
            let opts = PromOptions {
                measurement: "m",
                extra_tags: &extra,
                scrape_ts_ns: TS,
                precision,
            };
            let mut out = vec![b"x".to_vec()];
            match to_lines(&text, &opts, &mut out) {
                Ok(stats) => {
                    ok += 1;
                    assert_eq!(out.len() as u64, 1 + stats.samples, "{text:?}");
                }
                Err(e) => assert_eq!(out.len(), 1, "{text:?}: {e}"),
            }
            for r in &out {
                assert!(!r.contains(&b'\n') && !r.contains(&b'\r'), "{text:?}");
            }
        }
        // The soup must reach the success path too, or it tests only the error paths.
        assert!(ok > 100, "only {ok} inputs parsed");
    }

    #[test]
    fn output_is_appended_after_existing_records() {
        let opts = PromOptions {
            measurement: "prom",
            extra_tags: &[],
            scrape_ts_ns: TS,
            precision: Precision::S,
        };
        let mut out = vec![b"earlier".to_vec()];
        let stats = to_lines("a 1\nb 2", &opts, &mut out).expect("parses");
        assert_eq!(stats.samples, 2);
        assert_eq!(
            out,
            vec![
                b"earlier".to_vec(),
                b"prom a=1 1700000000".to_vec(),
                b"prom b=2 1700000000".to_vec(),
            ]
        );
    }
}
