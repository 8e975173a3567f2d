//! The pure parts of turning file bytes into a tail source's records: the record's JSON shape and
//! where a line is cut. Nothing here touches a file. (The level of a line and the line filters,
//! which the syslog and mqtt sources share, are `crate::record::filter`'s; the JSON escaping
//! `crate::record::json`'s.)
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
//! ([`crate::record::json::escape_into`]).

use crate::record::json::escape_into;
use crate::record::{json_string, labels_field};

/// Bytes of a file's start that identify it (with its device and inode).
pub const FP_BYTES: usize = 256;

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
    /// [`crate::record::json::object`]), with the fields it lacks added at its end. `\n` joining the lines
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
        let o = crate::record::json::object(text, |name| present.note(name))?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{json_string, text};

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
}
