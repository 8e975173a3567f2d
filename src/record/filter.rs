//! Which records a source keeps: the level a line declares (a JSON object's `level` or `severity`,
//! a logfmt pair) and the filters over a record's text (`include_lines`, `exclude_lines`,
//! `min_level`). Shared by the tail, syslog and mqtt sources; compiled by `config`.

use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// A log level, least to most severe; also the file's word for it (`min_level: warn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
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
}
