//! The pure parts of turning file bytes into records: the record's JSON shape, the level of a JSON
//! or logfmt line, the line filters, and the fingerprint hash. Nothing here touches a file.
//!
//! A record is one JSON object per line (or per multiline group):
//!
//! ```json
//! {"line":"GET /health 200","path":"/var/log/app.log","offset":1042,"host":"gw-7","labels":{"app":"api"}}
//! ```
//!
//! - `line`: the text without its line ending (`\n`, and a `\r` before it); lines of a multiline group
//!   joined with `\n`. Invalid UTF-8 is replaced with U+FFFD.
//! - `path`: the file's path when colibri first saw it (a rotated file keeps the name it was written
//!   under), `offset`: the byte offset of the line's first byte in that file.
//! - `lines`: only for a multiline group of more than one line: how many.
//! - `truncated: true`: only when the line (or group) was cut at `max_line_bytes` (`multiline.max_bytes`).
//! - `host` and `labels` (when configured) come last.
//!
//! Which of `path`, `offset`, `lines`, `truncated` and `host` a record carries is the source's
//! `fields` ([`Fields`]); `line` is always there. Under `format: json` ([`Shape::json`]) a line
//! that is a JSON object is the record itself, with the fields it does not have already (its own
//! keys win) added at its end; any other line is wrapped as above.
//!
//! Records are written in place into the batch's buffer ([`Shape::wrap`], [`Shape::object`]): no
//! allocation per record; the line's text is escaped a run of plain bytes at a time
//! ([`super::json::escape_into`]).

use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

pub use super::json::escape_into;

/// Bytes of a file's start that identify it (with its device and inode).
pub const FP_BYTES: usize = 256;

/// FNV-1a, 64 bits: the fingerprint of a file's first bytes and of the bytes before an offset. Stable
/// across builds (it is stored in checkpoints), cheap for 256 bytes.
pub fn hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// `"labels":{"k":"v",...}`, encoded once per source; `None` without labels. The sources'
/// records all carry their labels so.
pub fn labels_field(labels: &[(String, String)]) -> Option<String> {
    (!labels.is_empty()).then(|| {
        let mut out = String::from("\"labels\":{");
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&json_string(k));
            out.push(':');
            out.push_str(&json_string(v));
        }
        out.push('}');
        out
    })
}

/// `s` as a JSON string, quotes included.
pub fn json_string(s: &str) -> String {
    let mut v = Vec::with_capacity(s.len() + 2);
    v.push(b'"');
    escape_into(&mut v, s);
    v.push(b'"');
    String::from_utf8(v).expect("escaping keeps UTF-8")
}

/// The text of a line as UTF-8: borrowed when it is (checked the fast way), with U+FFFD for each
/// invalid sequence when it is not.
pub fn text(line: &[u8]) -> std::borrow::Cow<'_, str> {
    match std::str::from_utf8(line) {
        Ok(s) => std::borrow::Cow::Borrowed(s),
        Err(_) => String::from_utf8_lossy(line),
    }
}

/// The fields a record carries beyond `line` (and `labels`, which come with the labels set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fields(u8);

impl Fields {
    pub const NONE: Fields = Fields(0);
    pub const PATH: Fields = Fields(1);
    pub const OFFSET: Fields = Fields(2);
    pub const LINES: Fields = Fields(4);
    pub const TRUNCATED: Fields = Fields(8);
    pub const HOST: Fields = Fields(16);
    /// Every field, as records carried them before `fields` could be set.
    pub const ALL: Fields = Fields(31);

    pub fn contains(self, f: Fields) -> bool {
        self.0 & f.0 == f.0
    }

    #[must_use]
    pub fn with(self, f: Fields) -> Fields {
        Fields(self.0 | f.0)
    }

    #[must_use]
    pub fn without(self, f: Fields) -> Fields {
        Fields(self.0 & !f.0)
    }

    /// The names, in the order records carry them.
    pub fn names(self) -> Vec<&'static str> {
        [
            (Fields::PATH, "path"),
            (Fields::OFFSET, "offset"),
            (Fields::LINES, "lines"),
            (Fields::TRUNCATED, "truncated"),
            (Fields::HOST, "host"),
        ]
        .into_iter()
        .filter(|&(f, _)| self.contains(f))
        .map(|(_, n)| n)
        .collect()
    }
}

/// Names of a JSON object's members that colibri would add: a passed-through object that has one
/// keeps its own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Present {
    fields: u8,
    labels: bool,
}

impl Present {
    fn note(&mut self, name: &[u8]) {
        match name {
            b"path" => self.fields |= Fields::PATH.0,
            b"offset" => self.fields |= Fields::OFFSET.0,
            b"lines" => self.fields |= Fields::LINES.0,
            b"truncated" => self.fields |= Fields::TRUNCATED.0,
            b"host" => self.fields |= Fields::HOST.0,
            b"labels" => self.labels = true,
            // A name written with escapes may still spell one of them (rare: decoded only then).
            n if n.contains(&b'\\') && n.len() <= 64 => {
                let mut quoted = Vec::with_capacity(n.len() + 2);
                quoted.push(b'"');
                quoted.extend_from_slice(n);
                quoted.push(b'"');
                if let Ok(decoded) = serde_json::from_slice::<String>(&quoted)
                    && !decoded.contains('\\')
                {
                    self.note(decoded.as_bytes());
                }
            }
            _ => {}
        }
    }
}

/// How the records of one source are made: the fields it carries, its host and labels (encoded
/// once), and whether lines that are JSON objects are records as they are (`format: json`).
#[derive(Debug, Clone)]
pub struct Shape {
    fields: Fields,
    /// `"host":"gw-7"` (no comma), when records carry the host.
    host: Option<String>,
    /// `"labels":{...}`, when labels are set.
    labels: Option<String>,
    /// `format: json`.
    pub json: bool,
}

impl Shape {
    /// `host` is the machine's name when records carry it (`fields` has `host` and the name is
    /// known).
    pub fn new(
        fields: Fields,
        host: Option<&str>,
        labels: &[(String, String)],
        json: bool,
    ) -> Shape {
        let host = host
            .filter(|_| fields.contains(Fields::HOST))
            .map(|h| format!("\"host\":{}", json_string(h)));
        let labels = labels_field(labels);
        Shape {
            fields: fields.without(Fields::HOST),
            host,
            labels,
            json,
        }
    }

    /// Bytes a record may take besides its line's text (escaped) and path: what a record cut to
    /// fit a small stream leaves room for.
    pub fn overhead(&self) -> usize {
        self.host.as_ref().map_or(0, String::len) + self.labels.as_ref().map_or(0, String::len) + 80
    }

    /// A record wrapping `text` (see the module docs), appended to `out`.
    pub fn wrap(
        &self,
        out: &mut Vec<u8>,
        text: &str,
        path_json: &str,
        offset: u64,
        lines: u32,
        truncated: bool,
    ) {
        out.extend_from_slice(b"{\"line\":\"");
        escape_into(out, text);
        out.push(b'"');
        self.fields_into(
            out,
            Present::default(),
            true,
            path_json,
            offset,
            lines,
            truncated,
        );
        out.push(b'}');
    }

    /// A record that is the JSON object `object` (the whole text, checked by
    /// [`super::json::object`]), with the fields it lacks added at its end. `\n` joining the lines
    /// of a multiline group become spaces (they can only be whitespace between tokens in valid
    /// JSON): a record is one line. `None` (nothing written) when `text` is not one JSON object.
    pub fn object(
        &self,
        out: &mut Vec<u8>,
        text: &str,
        path_json: &str,
        offset: u64,
        lines: u32,
    ) -> Option<()> {
        let mut present = Present::default();
        let o = super::json::object(text, |name| present.note(name))?;
        let object = &text.as_bytes()[o.start..o.end];
        let start = out.len();
        // Without its closing brace: the fields go before it.
        out.extend_from_slice(&object[..object.len() - 1]);
        if lines > 1 {
            for b in &mut out[start..] {
                if *b == b'\n' {
                    *b = b' ';
                }
            }
        }
        self.fields_into(out, present, !o.empty, path_json, offset, lines, false);
        out.push(b'}');
        Some(())
    }

    /// `,"path":...` and the rest this shape adds, but those already `present`; `comma`: whether
    /// the first one needs a comma before it.
    #[expect(
        clippy::too_many_arguments,
        reason = "one record's facts, written in place"
    )]
    fn fields_into(
        &self,
        out: &mut Vec<u8>,
        present: Present,
        mut comma: bool,
        path_json: &str,
        offset: u64,
        lines: u32,
        truncated: bool,
    ) {
        let f = self.fields.without(Fields(present.fields));
        let mut field = |out: &mut Vec<u8>, name: &[u8]| {
            if comma {
                out.push(b',');
            }
            comma = true;
            out.extend_from_slice(name);
        };
        if f.contains(Fields::PATH) {
            field(out, b"\"path\":");
            out.extend_from_slice(path_json.as_bytes());
        }
        if f.contains(Fields::OFFSET) {
            field(out, b"\"offset\":");
            push_u64(out, offset);
        }
        if lines > 1 && f.contains(Fields::LINES) {
            field(out, b"\"lines\":");
            push_u64(out, u64::from(lines));
        }
        if truncated && f.contains(Fields::TRUNCATED) {
            field(out, b"\"truncated\":true");
        }
        if let Some(h) = &self.host
            && present.fields & Fields::HOST.0 == 0
        {
            field(out, h.as_bytes());
        }
        if let Some(l) = &self.labels
            && !present.labels
        {
            field(out, l.as_bytes());
        }
    }
}

/// `n` in decimal, without allocating.
fn push_u64(out: &mut Vec<u8>, mut n: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

/// The longest prefix of `bytes` of at most `max` bytes that does not split a UTF-8 sequence.
pub fn cut_at_char(bytes: &[u8], max: usize) -> &[u8] {
    if bytes.len() <= max {
        return bytes;
    }
    let mut cut = max;
    // Back off over continuation bytes (at most 3) to the start of the sequence that crosses `max`.
    while cut > 0 && max - cut < 4 && (bytes[cut] & 0xC0) == 0x80 {
        cut -= 1;
    }
    if max - cut >= 4 {
        cut = max; // not UTF-8 anyway
    }
    &bytes[..cut]
}

// -------------------------------------------------------------------------------------------------
// Levels

/// A log level, least to most severe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
    Fatal,
}

impl Level {
    pub fn name(self) -> &'static str {
        match self {
            Level::Trace => "trace",
            Level::Debug => "debug",
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Error => "error",
            Level::Fatal => "fatal",
        }
    }

    /// A level word, in any case: `trace`; `debug`/`dbg`; `info`/`information`/`informational`/
    /// `notice`; `warn`/`warning`; `error`/`err`; `fatal`/`critical`/`crit`/`alert`/`emerg`/
    /// `emergency`/`panic`. A single letter (`T D I W E F`) too.
    pub fn parse_word(word: &str) -> Option<Level> {
        let w = word.trim();
        if w.len() > 13 {
            return None;
        }
        let mut buf = [0u8; 13];
        for (i, b) in w.bytes().enumerate() {
            buf[i] = b.to_ascii_lowercase();
        }
        Some(match &buf[..w.len()] {
            b"trace" | b"t" => Level::Trace,
            b"debug" | b"dbg" | b"d" => Level::Debug,
            b"info" | b"information" | b"informational" | b"notice" | b"i" => Level::Info,
            b"warn" | b"warning" | b"w" => Level::Warn,
            b"error" | b"err" | b"e" => Level::Error,
            b"fatal" | b"critical" | b"crit" | b"alert" | b"emerg" | b"emergency" | b"panic"
            | b"f" => Level::Fatal,
            _ => return None,
        })
    }

    /// A numeric level as bunyan and pino write them: 10 trace, 20 debug, 30 info, 40 warn,
    /// 50 error, 60 fatal (values between round down).
    pub fn from_number(n: f64) -> Level {
        match n {
            n if n < 20.0 => Level::Trace,
            n if n < 30.0 => Level::Debug,
            n if n < 40.0 => Level::Info,
            n if n < 50.0 => Level::Warn,
            n if n < 60.0 => Level::Error,
            _ => Level::Fatal,
        }
    }
}

/// The level a line declares: a JSON object's top-level `level` (or `severity`) field, a string or
/// a number; or, for other lines, a logfmt `level=` (or `severity=`, `lvl=`) pair. `None` when the
/// line carries no level this recognises.
pub fn level_of(line: &str) -> Option<Level> {
    let trimmed = line.trim_start();
    if trimmed.starts_with('{') {
        return serde_json::from_str::<LevelProbe>(trimmed)
            .ok()
            .and_then(|p| p.level.or(p.severity).flatten());
    }
    logfmt_level(line)
}

fn logfmt_level(line: &str) -> Option<Level> {
    let bytes = line.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        // At the start of a token.
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        let key_start = i;
        while i < bytes.len() && !bytes[i].is_ascii_whitespace() && bytes[i] != b'=' {
            i += 1;
        }
        let key = &bytes[key_start..i];
        if i < bytes.len() && bytes[i] == b'=' {
            i += 1;
            let (value, next) = if i < bytes.len() && bytes[i] == b'"' {
                let start = i + 1;
                let end = bytes[start..]
                    .iter()
                    .position(|&b| b == b'"')
                    .map_or(bytes.len(), |p| start + p);
                (&line[start..end], (end + 1).min(bytes.len()))
            } else {
                let start = i;
                let end = bytes[start..]
                    .iter()
                    .position(|b| b.is_ascii_whitespace())
                    .map_or(bytes.len(), |p| start + p);
                (&line[start..end], end)
            };
            if key.eq_ignore_ascii_case(b"level")
                || key.eq_ignore_ascii_case(b"severity")
                || key.eq_ignore_ascii_case(b"lvl")
            {
                return Level::parse_word(value);
            }
            i = next;
        } else if i < bytes.len() && bytes[i] == b'"' {
            // A quoted bare token: skip it whole.
            i += 1;
            while i < bytes.len() && bytes[i] != b'"' {
                i += 1;
            }
            i += 1;
        }
    }
    None
}

#[derive(Deserialize)]
struct LevelProbe {
    #[serde(default, deserialize_with = "de_level")]
    level: Option<Option<Level>>,
    #[serde(default, deserialize_with = "de_level")]
    severity: Option<Option<Level>>,
}

fn de_level<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<Level>>, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Option<Level>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a level")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok(Level::parse_word(v))
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Ok(Some(Level::from_number(v as f64)))
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
            Ok(Some(Level::from_number(v as f64)))
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
            Ok(Some(Level::from_number(v)))
        }
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
            while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok(None)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Self::Value, A::Error> {
            while s.next_element::<IgnoredAny>()?.is_some() {}
            Ok(None)
        }
    }
    d.deserialize_any(V).map(Some)
}

// -------------------------------------------------------------------------------------------------
// Filters

/// Which records are kept: `include_lines` (any must match, when given), then `exclude_lines` (none
/// may match), then `min_level` (a record without a recognised level is kept).
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub include: Vec<regex_lite::Regex>,
    pub exclude: Vec<regex_lite::Regex>,
    pub min_level: Option<Level>,
}

impl Filter {
    pub fn is_empty(&self) -> bool {
        self.include.is_empty() && self.exclude.is_empty() && self.min_level.is_none()
    }

    /// Whether a record whose text is `text` (its first line is `first`) is kept.
    pub fn keeps(&self, text: &str, first: &str) -> bool {
        if !self.include.is_empty() && !self.include.iter().any(|r| r.is_match(text)) {
            return false;
        }
        if self.exclude.iter().any(|r| r.is_match(text)) {
            return false;
        }
        match self.min_level {
            Some(min) => level_of(first).is_none_or(|l| l >= min),
            None => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(rec: &[u8]) -> serde_json::Value {
        serde_json::from_slice(rec)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(rec)))
    }

    fn wrap(shape: &Shape, text: &str, path: &str, offset: u64, lines: u32, cut: bool) -> Vec<u8> {
        let mut out = b"earlier record\n".to_vec();
        shape.wrap(&mut out, text, &json_string(path), offset, lines, cut);
        out.split_off(15)
    }

    fn object(shape: &Shape, text: &str, offset: u64, lines: u32) -> Option<String> {
        let mut out = Vec::new();
        shape.object(&mut out, text, "\"p\"", offset, lines)?;
        serde_json::from_slice::<serde_json::Value>(&out).expect("valid JSON");
        Some(String::from_utf8(out).unwrap())
    }

    fn labels() -> Vec<(String, String)> {
        vec![("app".into(), "api".into()), ("env".into(), "prod".into())]
    }

    #[test]
    fn records_are_json_with_line_path_offset_and_extras() {
        let shape = Shape::new(Fields::ALL, Some("gw\"7"), &labels(), false);
        let r = wrap(
            &shape,
            "say \"hi\"\\\t\u{1}é",
            "/var/log/a.log",
            1042,
            1,
            false,
        );
        let v = parse(&r);
        assert_eq!(v["line"], "say \"hi\"\\\t\u{1}é");
        assert_eq!(v["path"], "/var/log/a.log");
        assert_eq!(v["offset"], 1042);
        assert_eq!(v["host"], "gw\"7");
        assert_eq!(v["labels"]["app"], "api");
        assert_eq!(v["labels"]["env"], "prod");
        assert!(v.get("truncated").is_none() && v.get("lines").is_none());
        let bare = Shape::new(Fields::ALL, None, &[], false);
        let r = wrap(&bare, "a\nb", "p", 0, 2, true);
        assert_eq!(
            String::from_utf8(r).unwrap(),
            r#"{"line":"a\nb","path":"p","offset":0,"lines":2,"truncated":true}"#
        );
    }

    #[test]
    fn fields_name_what_a_record_carries_beyond_its_line() {
        let only = |fields: Fields, labels: &[(String, String)]| {
            let shape = Shape::new(fields, Some("gw"), labels, false);
            String::from_utf8(wrap(&shape, "x", "p", 7, 3, true)).unwrap()
        };
        assert_eq!(only(Fields::NONE, &[]), r#"{"line":"x"}"#);
        assert_eq!(
            only(Fields::NONE, &labels()),
            r#"{"line":"x","labels":{"app":"api","env":"prod"}}"#
        );
        assert_eq!(
            only(Fields::OFFSET.with(Fields::HOST), &[]),
            r#"{"line":"x","offset":7,"host":"gw"}"#
        );
        assert_eq!(
            only(Fields::ALL, &[]),
            r#"{"line":"x","path":"p","offset":7,"lines":3,"truncated":true,"host":"gw"}"#
        );
        assert_eq!(
            only(
                Fields::ALL.without(Fields::LINES).without(Fields::PATH),
                &[]
            ),
            r#"{"line":"x","offset":7,"truncated":true,"host":"gw"}"#
        );
        assert_eq!(
            Fields::ALL.names(),
            ["path", "offset", "lines", "truncated", "host"]
        );
        assert!(Fields::NONE.names().is_empty());
    }

    #[test]
    fn json_objects_are_records_with_the_fields_they_lack() {
        let shape = Shape::new(Fields::ALL, Some("gw"), &labels(), true);
        assert_eq!(
            object(&shape, r#" {"msg":"hi","n":[1]}  "#, 5, 1).unwrap(),
            r#"{"msg":"hi","n":[1],"path":"p","offset":5,"host":"gw","labels":{"app":"api","env":"prod"}}"#
        );
        assert_eq!(
            object(&shape, "{}", 5, 1).unwrap(),
            r#"{"path":"p","offset":5,"host":"gw","labels":{"app":"api","env":"prod"}}"#
        );
        // Its own keys win (also when written with escapes); nested ones do not count.
        assert_eq!(
            object(
                &shape,
                r#"{"host":"own","labels":1,"o\u0066fset":2,"x":{"path":3}}"#,
                5,
                1
            )
            .unwrap(),
            r#"{"host":"own","labels":1,"o\u0066fset":2,"x":{"path":3},"path":"p"}"#
        );
        // A multiline group's joins become spaces; the group's line count is added.
        assert_eq!(
            object(&shape, "{\n  \"a\": 1\n}", 9, 3).unwrap(),
            r#"{   "a": 1 ,"path":"p","offset":9,"lines":3,"host":"gw","labels":{"app":"api","env":"prod"}}"#
        );
        // As they are with no field and no label.
        let bare = Shape::new(Fields::NONE, Some("gw"), &[], true);
        let line = r#"{"ts":"2026-11-30T12:00:00.000Z","level":"info","msg":"x\"y"}"#;
        assert_eq!(object(&bare, line, 0, 1).unwrap(), line);
        for not in [
            "",
            "plain",
            "[1]",
            "{\"a\":}",
            r#"{"a":"\ud800"}"#,
            "{} {}",
            "\"{}\"",
        ] {
            let mut out = b"keep".to_vec();
            assert!(
                shape.object(&mut out, not, "\"p\"", 0, 1).is_none(),
                "{not:?}"
            );
            assert_eq!(out, b"keep", "nothing written for {not:?}");
        }
    }

    #[test]
    fn invalid_utf8_is_replaced_and_every_control_byte_escaped() {
        let t = text(b"ok \xff\xfe end");
        assert_eq!(t, "ok \u{fffd}\u{fffd} end");
        assert!(matches!(
            text("é".as_bytes()),
            std::borrow::Cow::Borrowed("é")
        ));
        let all: String = (0u8..0x80).map(char::from).collect();
        let shape = Shape::new(Fields::ALL, None, &[], false);
        let v = parse(&wrap(&shape, &all, "p", 7, 1, false));
        assert_eq!(v["line"], all.as_str());
    }

    #[test]
    fn cuts_never_split_a_character() {
        assert_eq!(cut_at_char(b"abcdef", 4), b"abcd");
        assert_eq!(cut_at_char(b"abc", 4), b"abc");
        let s = "aé€😀".as_bytes(); // 1 + 2 + 3 + 4 bytes
        assert_eq!(cut_at_char(s, 2), b"a");
        assert_eq!(cut_at_char(s, 3), "aé".as_bytes());
        assert_eq!(cut_at_char(s, 5), "aé".as_bytes());
        assert_eq!(cut_at_char(s, 6), "aé€".as_bytes());
        assert_eq!(cut_at_char(s, 9), "aé€".as_bytes());
        assert_eq!(cut_at_char(&[0x80; 10], 5).len(), 5);
    }

    #[test]
    fn levels_of_json_and_logfmt_lines() {
        let cases: &[(&str, Option<Level>)] = &[
            (r#"{"level":"info","msg":"x"}"#, Some(Level::Info)),
            (r#"{"msg":"x","level":"WARNING"}"#, Some(Level::Warn)),
            (r#"  {"severity":"Error"}"#, Some(Level::Error)),
            (r#"{"level":30}"#, Some(Level::Info)),
            (
                r#"{"level":50,"x":[1,{"level":"debug"}]}"#,
                Some(Level::Error),
            ),
            (r#"{"level":{"n":1}}"#, None),
            (r#"{"lvl":"error"}"#, None),
            (r#"{"level":"loud"}"#, None),
            (r#"{"level":"info""#, None),
            (
                r#"{"level":"debug","severity":"fatal"}"#,
                Some(Level::Debug),
            ),
            ("ts=1 level=debug msg=x", Some(Level::Debug)),
            ("level=ERROR", Some(Level::Error)),
            (
                r#"msg="level=info inside" level="crit""#,
                Some(Level::Fatal),
            ),
            ("ts=1 severity=notice", Some(Level::Info)),
            ("ts=1 lvl=warn", Some(Level::Warn)),
            ("xlevel=warn", None),
            ("plain text ERROR line", None),
            ("", None),
        ];
        for (line, want) in cases {
            assert_eq!(level_of(line), *want, "{line}");
        }
        assert!(Level::Trace < Level::Debug && Level::Error < Level::Fatal);
        assert_eq!(Level::from_number(10.0), Level::Trace);
        assert_eq!(Level::from_number(60.0), Level::Fatal);
        assert_eq!(Level::parse_word("averyveryverylongword"), None);
    }

    #[test]
    fn filters_include_then_exclude_then_level() {
        let f = Filter {
            include: vec![regex_lite::Regex::new("api|db").unwrap()],
            exclude: vec![regex_lite::Regex::new("health").unwrap()],
            min_level: Some(Level::Warn),
        };
        assert!(f.keeps("api level=error", "api level=error"));
        assert!(
            !f.keeps("web level=error", "web level=error"),
            "not included"
        );
        assert!(
            !f.keeps("api health level=error", "api health level=error"),
            "excluded"
        );
        assert!(
            !f.keeps("api level=info", "api level=info"),
            "below min_level"
        );
        assert!(
            f.keeps("api no level here", "api no level here"),
            "no level: kept"
        );
        assert!(Filter::default().keeps("x", "x"));
        assert!(Filter::default().is_empty());
    }

    #[test]
    fn the_hash_is_fnv1a() {
        assert_eq!(hash(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(hash(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_ne!(hash(b"ab"), hash(b"ba"));
    }
}
