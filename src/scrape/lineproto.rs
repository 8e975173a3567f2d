//! Writing InfluxDB line protocol: one record is one line (without its `\n`), built by
//! [`LineBuilder`] (tags, then [`FieldsBuilder`] for fields and the timestamp) or by [`line()`] in one
//! call. It owns the escaping rules and the text form of field values and timestamps; it does not
//! parse line protocol, choose what becomes a tag or a field, or know where a record goes. Called by
//! [`super::prometheus`] and [`super::json`], which the `http_scrape` task handler calls.
//!
//! The rules, chosen so that a record always parses, into the same measurement, tags and fields, in
//! InfluxDB 1.x/2.x (the Go parser) and 3.x (the Rust parser), and can never become two lines:
//!
//! - Measurement: `,` and space are escaped with `\`. Tag keys, tag values and field keys: `,`, `=`
//!   and space. Nothing else is escaped: the spec does not escape other characters.
//! - Tab, `\n` and `\r` in those elements become a space (then escaped): line protocol has no
//!   escape for a newline there, and InfluxDB 3.x ends an element at a tab.
//! - A backslash is written as it is, except that a run of backslashes right before an escaped
//!   character is doubled, so it cannot swallow the escape (3.x reads `\\\,` back as `\,`; 1.x/2.x
//!   keep the separators but read `\\,`: they have no escaped backslash), and backslashes at the
//!   end of an element are dropped: no parser can read one there (3.x refuses it, 1.x/2.x take the
//!   following separator as escaped). 3.x also reads two backslashes in a row as one, so such a
//!   value loses one of them there; 1.x/2.x read it exactly.
//! - A tag whose key or value is empty (after the rules above) is left out: InfluxDB refuses empty
//!   tag values. A field whose key is empty is left out too.
//! - String field values are double-quoted with `"` and `\` escaped (`\"`, `\\`); a `\n` or `\r`
//!   inside is written as the two characters `\n` or `\r`, which InfluxDB stores as they are (a
//!   backslash and a letter): lossy, but the record stays one line and the text stays readable.
//! - Floats are written in their shortest form that reads back to the same value, without a `.0`
//!   (`3`, `1.5`, `1e+300`, `-2.5e-7`; the exponent always has a sign, which 3.x requires). NaN and
//!   ±Inf cannot be written: such a field is left out, like a missing one.

use std::io::Write as _;

/// The unit of the timestamps written, which the sink's write URL must name (`precision=`); also
/// the file's word (an http sink's `precision:`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    /// Nanoseconds (the default).
    #[default]
    Ns,
    /// Microseconds.
    Us,
    /// Milliseconds.
    Ms,
    /// Seconds.
    S,
}

impl Precision {
    /// Converts a Unix time in nanoseconds to this precision, rounding toward negative infinity (a
    /// time before 1970 that is not a whole unit goes to the unit before it, like the positive side
    /// does): `-1` ns is `-1` us, `-1` ms, `-1` s.
    pub fn from_unix_ns(self, ns: i64) -> i64 {
        match self {
            Precision::Ns => ns,
            Precision::Us => ns.div_euclid(1_000),
            Precision::Ms => ns.div_euclid(1_000_000),
            Precision::S => ns.div_euclid(1_000_000_000),
        }
    }

    /// Converts a Unix time in milliseconds (a Prometheus sample's timestamp) to this precision,
    /// without a detour through nanoseconds that could overflow. `None` when the result does not
    /// fit an `i64` (only for `Ns` and `Us`, beyond the year 2262 or before 1677). Rounds like
    /// [`Precision::from_unix_ns`].
    pub fn from_unix_ms(self, ms: i64) -> Option<i64> {
        match self {
            Precision::Ns => ms.checked_mul(1_000_000),
            Precision::Us => ms.checked_mul(1_000),
            Precision::Ms => Some(ms),
            Precision::S => Some(ms.div_euclid(1_000)),
        }
    }

    /// The name InfluxDB's write API uses for it (`precision=ms`).
    pub fn name(self) -> &'static str {
        match self {
            Precision::Ns => "ns",
            Precision::Us => "us",
            Precision::Ms => "ms",
            Precision::S => "s",
        }
    }
}

/// A field's value. A `Float` that is NaN or infinite is not writable: [`FieldsBuilder::field`]
/// leaves it out and says so.
#[derive(Debug, Clone, PartialEq)]
pub enum FieldValue {
    Float(f64),
    Int(i64),
    Bool(bool),
    Str(String),
}

impl FieldValue {
    /// False only for a non-finite float, which line protocol has no way to write.
    pub fn is_writable(&self) -> bool {
        match self {
            FieldValue::Float(v) => v.is_finite(),
            FieldValue::Int(_) | FieldValue::Bool(_) | FieldValue::Str(_) => true,
        }
    }
}

/// Where an element sits in the line: each escapes its own set of characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Element {
    Measurement,
    /// Tag keys, tag values and field keys.
    Key,
}

impl Element {
    fn escapes(self, b: u8) -> bool {
        match self {
            Element::Measurement => b == b',' || b == b' ',
            Element::Key => b == b',' || b == b' ' || b == b'=',
        }
    }
}

/// Tab, LF and CR become a space in names and tag values (see the module rules).
fn blank(b: u8) -> u8 {
    if matches!(b, b'\t' | b'\n' | b'\r') {
        b' '
    } else {
        b
    }
}

/// Appends `s` escaped for `element`; returns how many bytes it wrote (0: the element is empty).
/// Works on bytes: every character it looks at is ASCII, and UTF-8 never uses ASCII bytes inside a
/// multi-byte character, so the other bytes are copied through whole.
fn write_escaped(buf: &mut Vec<u8>, s: &str, element: Element) -> usize {
    let start = buf.len();
    let bytes = s.as_bytes();
    // The common case (a plain name or value) is copied at once.
    if !bytes
        .iter()
        .any(|&b| matches!(b, b',' | b' ' | b'=' | b'\\' | b'\t' | b'\n' | b'\r'))
    {
        buf.extend_from_slice(bytes);
        return bytes.len();
    }
    let mut i = 0;
    while i < bytes.len() {
        let b = blank(bytes[i]);
        if b == b'\\' {
            let run = bytes[i..].iter().take_while(|&&c| c == b'\\').count();
            match bytes.get(i + run).map(|&c| blank(c)) {
                // Trailing backslashes are dropped: no parser reads them back.
                None => {}
                Some(next) if element.escapes(next) => {
                    buf.extend(std::iter::repeat_n(b'\\', 2 * run));
                }
                Some(_) => buf.extend(std::iter::repeat_n(b'\\', run)),
            }
            i += run;
            continue;
        }
        if element.escapes(b) {
            buf.push(b'\\');
        }
        buf.push(b);
        i += 1;
    }
    buf.len() - start
}

/// Appends `s` as a double-quoted string field value.
fn write_string_value(buf: &mut Vec<u8>, s: &str) {
    buf.push(b'"');
    for &b in s.as_bytes() {
        match b {
            b'"' => buf.extend_from_slice(b"\\\""),
            b'\\' => buf.extend_from_slice(b"\\\\"),
            b'\n' => buf.extend_from_slice(b"\\n"),
            b'\r' => buf.extend_from_slice(b"\\r"),
            _ => buf.push(b),
        }
    }
    buf.push(b'"');
}

/// Appends a finite float in the form described in the module rules.
pub(crate) fn write_float(buf: &mut Vec<u8>, v: f64) {
    let start = buf.len();
    // `{:?}` is the shortest text that reads back to the same f64, and switches to an exponent for
    // very large and very small magnitudes (so 1e300 is not 301 digits).
    write!(buf, "{v:?}").expect("writing to a Vec cannot fail");
    if let Some(e) = buf[start..].iter().position(|&b| b == b'e') {
        let after = start + e + 1;
        if buf.get(after) != Some(&b'-') {
            buf.insert(after, b'+');
        }
    } else if buf.ends_with(b".0") {
        buf.truncate(buf.len() - 2);
    }
}

/// The first half of a record: the measurement and the tags. Add tags in key order (InfluxDB's
/// recommendation, and what makes the output deterministic; this builder does not sort), then
/// call [`LineBuilder::fields`].
#[derive(Debug)]
pub struct LineBuilder {
    buf: Vec<u8>,
}

impl LineBuilder {
    /// Starts a record. The measurement should have passed [`check_measurement`] (at config time):
    /// an empty one, or one starting with `#`, gives a line InfluxDB refuses or ignores.
    pub fn new(measurement: &str) -> Self {
        Self::with_capacity(measurement, 64)
    }

    /// Like [`LineBuilder::new`], reserving `extra` bytes beyond the measurement for the rest.
    pub fn with_capacity(measurement: &str, extra: usize) -> Self {
        let mut buf = Vec::with_capacity(measurement.len() + extra);
        write_escaped(&mut buf, measurement, Element::Measurement);
        LineBuilder { buf }
    }

    /// Adds a tag; one with an empty key or value is left out (InfluxDB refuses empty values).
    pub fn tag(&mut self, key: &str, value: &str) -> &mut Self {
        let mark = self.buf.len();
        self.buf.push(b',');
        let written_key = write_escaped(&mut self.buf, key, Element::Key);
        self.buf.push(b'=');
        let written_value = write_escaped(&mut self.buf, value, Element::Key);
        if written_key == 0 || written_value == 0 {
            self.buf.truncate(mark);
        }
        self
    }

    /// Adds two tag lists, each sorted by key with unique keys, as one sorted list; where both
    /// have a key, the entry of `winners` is written (the operator's tags over the data's).
    pub fn merged_tags<V: AsRef<str>>(
        &mut self,
        own: &[(&str, V)],
        winners: &[(&str, &str)],
    ) -> &mut Self {
        let (mut i, mut j) = (0, 0);
        loop {
            match (own.get(i), winners.get(j)) {
                (Some(o), Some(w)) => match o.0.cmp(w.0) {
                    std::cmp::Ordering::Less => {
                        self.tag(o.0, o.1.as_ref());
                        i += 1;
                    }
                    std::cmp::Ordering::Equal => {
                        self.tag(w.0, w.1);
                        i += 1;
                        j += 1;
                    }
                    std::cmp::Ordering::Greater => {
                        self.tag(w.0, w.1);
                        j += 1;
                    }
                },
                (Some(o), None) => {
                    self.tag(o.0, o.1.as_ref());
                    i += 1;
                }
                (None, Some(w)) => {
                    self.tag(w.0, w.1);
                    j += 1;
                }
                (None, None) => return self,
            }
        }
    }

    /// Ends the tags; fields come next.
    pub fn fields(self) -> FieldsBuilder {
        FieldsBuilder {
            buf: self.buf,
            count: 0,
        }
    }
}

/// The second half of a record: fields, then [`FieldsBuilder::finish`] with the timestamp.
#[derive(Debug)]
pub struct FieldsBuilder {
    buf: Vec<u8>,
    count: usize,
}

impl FieldsBuilder {
    /// Adds a field; returns false when it was left out (a non-finite float, or an empty key).
    pub fn field(&mut self, key: &str, value: &FieldValue) -> bool {
        match value {
            FieldValue::Float(v) if !v.is_finite() => false,
            FieldValue::Float(v) => self.write(key, |buf| write_float(buf, *v)),
            FieldValue::Int(v) => self.write(key, |buf| {
                write!(buf, "{v}i").expect("writing to a Vec cannot fail");
            }),
            FieldValue::Bool(v) => self.write(key, |buf| {
                buf.extend_from_slice(if *v { b"true" } else { b"false" });
            }),
            FieldValue::Str(s) => self.field_str(key, s),
        }
    }

    /// Adds a string field from a borrowed `&str`, saving the `String` a [`FieldValue::Str`] needs.
    pub fn field_str(&mut self, key: &str, value: &str) -> bool {
        self.write(key, |buf| write_string_value(buf, value))
    }

    fn write(&mut self, key: &str, value: impl FnOnce(&mut Vec<u8>)) -> bool {
        let mark = self.buf.len();
        self.buf.push(if self.count == 0 { b' ' } else { b',' });
        if write_escaped(&mut self.buf, key, Element::Key) == 0 {
            self.buf.truncate(mark);
            return false;
        }
        self.buf.push(b'=');
        value(&mut self.buf);
        self.count += 1;
        true
    }

    /// Fields written so far.
    pub fn count(&self) -> usize {
        self.count
    }

    /// The record, with the timestamp (already in the sink's precision) when given; `None` when no
    /// field was written, since InfluxDB refuses a line without one.
    pub fn finish(mut self, ts: Option<i64>) -> Option<Vec<u8>> {
        if self.count == 0 {
            return None;
        }
        if let Some(ts) = ts {
            write!(self.buf, " {ts}").expect("writing to a Vec cannot fail");
        }
        Some(self.buf)
    }
}

/// Builds one record at once. Tags are written sorted by key (a key given twice: the first wins);
/// tags with an empty key or value and fields that cannot be written are left out. `None` when no
/// field remains.
pub fn line(
    measurement: &str,
    tags: &[(&str, &str)],
    fields: &[(&str, FieldValue)],
    ts: Option<i64>,
) -> Option<Vec<u8>> {
    let mut b = LineBuilder::new(measurement);
    if tags.is_sorted_by(|a, b| a.0 < b.0) {
        for (k, v) in tags {
            b.tag(k, v);
        }
    } else {
        let mut sorted: Vec<&(&str, &str)> = tags.iter().collect();
        // Stable, so among equal keys the first given stays first and wins.
        sorted.sort_by(|a, b| a.0.cmp(b.0));
        sorted.dedup_by(|later, earlier| later.0 == earlier.0);
        for (k, v) in sorted {
            b.tag(k, v);
        }
    }
    let mut f = b.fields();
    for (k, v) in fields {
        f.field(k, v);
    }
    f.finish(ts)
}

/// Config-time check of a measurement name: InfluxDB refuses an empty one, a line starting with
/// `#` is a comment, and a name made only of backslashes would be written empty.
pub fn check_measurement(name: &str) -> Result<(), String> {
    if name.starts_with('#') {
        return Err(format!("measurement {name:?} must not start with \"#\""));
    }
    let mut probe = Vec::new();
    if write_escaped(&mut probe, name, Element::Measurement) == 0 {
        return Err("measurement must not be empty".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(rec: Option<Vec<u8>>) -> String {
        String::from_utf8(rec.expect("a record")).expect("utf-8")
    }

    #[test]
    fn precision_converts_a_known_time() {
        // 2023-11-14T22:13:20.123456789Z
        let ns = 1_700_000_000_123_456_789;
        assert_eq!(Precision::Ns.from_unix_ns(ns), 1_700_000_000_123_456_789);
        assert_eq!(Precision::Us.from_unix_ns(ns), 1_700_000_000_123_456);
        assert_eq!(Precision::Ms.from_unix_ns(ns), 1_700_000_000_123);
        assert_eq!(Precision::S.from_unix_ns(ns), 1_700_000_000);
        assert_eq!(Precision::Us.name(), "us");
        assert_eq!(Precision::Ns.name(), "ns");
        assert_eq!(Precision::Ms.name(), "ms");
        assert_eq!(Precision::S.name(), "s");
    }

    #[test]
    fn precision_rounds_toward_negative_infinity() {
        assert_eq!(Precision::S.from_unix_ns(-1), -1);
        assert_eq!(Precision::Ms.from_unix_ns(-1_500_000), -2);
        assert_eq!(Precision::Us.from_unix_ns(-1_000), -1);
        assert_eq!(Precision::S.from_unix_ms(-1), Some(-1));
        assert_eq!(Precision::S.from_unix_ms(1_999), Some(1));
    }

    #[test]
    fn precision_from_ms_overflows_to_none() {
        assert_eq!(
            Precision::Ns.from_unix_ms(1_700_000_000_123),
            Some(1_700_000_000_123_000_000)
        );
        assert_eq!(
            Precision::Us.from_unix_ms(1_700_000_000_123),
            Some(1_700_000_000_123_000)
        );
        assert_eq!(Precision::Ns.from_unix_ms(i64::MAX / 1_000), None);
        assert_eq!(Precision::Ms.from_unix_ms(i64::MAX), Some(i64::MAX));
    }

    #[test]
    fn every_field_type() {
        let rec = line(
            "weather",
            &[("station", "ZRH")],
            &[
                ("temp", FieldValue::Float(21.5)),
                ("hum", FieldValue::Float(64.0)),
                ("count", FieldValue::Int(-5)),
                ("ok", FieldValue::Bool(true)),
                ("bad", FieldValue::Bool(false)),
                ("note", FieldValue::Str("sunny".into())),
            ],
            Some(1_700_000_000),
        );
        assert_eq!(
            text(rec),
            "weather,station=ZRH temp=21.5,hum=64,count=-5i,ok=true,bad=false,note=\"sunny\" 1700000000"
        );
    }

    #[test]
    fn floats_are_short_and_parseable() {
        let cases = [
            (3.0, "3"),
            (-0.0, "-0"),
            (0.1, "0.1"),
            (1e15, "1000000000000000"),
            (1e16, "1e+16"),
            (1.5e300, "1.5e+300"),
            (-2.5e-7, "-2.5e-7"),
            (0.0001, "0.0001"),
            (f64::MAX, "1.7976931348623157e+308"),
            (f64::MIN_POSITIVE, "2.2250738585072014e-308"),
        ];
        for (v, want) in cases {
            let rec = line("m", &[], &[("v", FieldValue::Float(v))], None);
            assert_eq!(text(rec), format!("m v={want}"), "{v:?}");
            let back: f64 = want.parse().expect("parses back");
            assert_eq!(back.to_bits(), v.to_bits(), "{want}");
        }
    }

    #[test]
    fn non_finite_floats_are_left_out() {
        assert!(!FieldValue::Float(f64::NAN).is_writable());
        assert!(FieldValue::Float(1.0).is_writable());
        let rec = line(
            "m",
            &[],
            &[
                ("a", FieldValue::Float(f64::NAN)),
                ("b", FieldValue::Float(2.0)),
                ("c", FieldValue::Float(f64::NEG_INFINITY)),
            ],
            None,
        );
        assert_eq!(text(rec), "m b=2");
        let none = line(
            "m",
            &[("host", "a")],
            &[("a", FieldValue::Float(f64::INFINITY))],
            Some(1),
        );
        assert_eq!(none, None);
        assert_eq!(line("m", &[], &[], None), None);
    }

    #[test]
    fn escaping_in_each_element() {
        let rec = line(
            "cpu load,total",
            &[("host name", "edge 1,rack=2"), ("a=b", "x")],
            &[("user time,s=1", FieldValue::Int(1))],
            None,
        );
        assert_eq!(
            text(rec),
            r"cpu\ load\,total,a\=b=x,host\ name=edge\ 1\,rack\=2 user\ time\,s\=1=1i"
        );
        // `=` needs no escape in a measurement.
        assert_eq!(
            text(line("a=b", &[], &[("v", FieldValue::Int(1))], None)),
            "a=b v=1i"
        );
    }

    #[test]
    fn string_values_escape_quotes_backslashes_and_newlines() {
        let rec = line(
            "log",
            &[],
            &[(
                "msg",
                FieldValue::Str("say \"hi\" to C:\\dir\nnext\r\nline, a=b".into()),
            )],
            None,
        );
        assert_eq!(
            text(rec),
            r#"log msg="say \"hi\" to C:\\dir\nnext\r\nline, a=b""#
        );
        let mut f = LineBuilder::new("log").fields();
        assert!(f.field_str("empty", ""));
        assert_eq!(text(f.finish(None)), r#"log empty="""#);
    }

    #[test]
    fn newlines_and_tabs_in_names_become_spaces() {
        let rec = line(
            "multi\nline",
            &[("k\r\ney", "v\tw")],
            &[("f\nk", FieldValue::Bool(true))],
            None,
        );
        let s = text(rec);
        assert_eq!(s, r"multi\ line,k\ \ ey=v\ w f\ k=true");
        assert!(!s.contains('\n') && !s.contains('\r') && !s.contains('\t'));
    }

    #[test]
    fn backslashes_keep_the_separators_in_place() {
        let rec = line(
            "m",
            &[
                ("path", r"C:\dir"),
                ("before_comma", r"a\,b"),
                ("trailing", r"C:\"),
                ("only", r"\\"),
                ("run", r"x\\ y"),
            ],
            &[("v", FieldValue::Int(1))],
            None,
        );
        // `only` is all trailing backslashes, so it is empty and left out.
        assert_eq!(
            text(rec),
            r"m,before_comma=a\\\,b,path=C:\dir,run=x\\\\\ y,trailing=C: v=1i"
        );
    }

    #[test]
    fn empty_tags_and_keys_are_left_out() {
        let rec = line(
            "m",
            &[("empty", ""), ("", "no key"), ("ok", "1")],
            &[("", FieldValue::Int(1)), ("v", FieldValue::Int(2))],
            None,
        );
        assert_eq!(text(rec), "m,ok=1 v=2i");
    }

    #[test]
    fn tags_are_sorted_and_the_first_duplicate_wins() {
        let rec = line(
            "m",
            &[("zone", "b"), ("host", "x"), ("zone", "a"), ("app", "y")],
            &[("v", FieldValue::Int(1))],
            Some(-5),
        );
        assert_eq!(text(rec), "m,app=y,host=x,zone=b v=1i -5");
    }

    #[test]
    fn merged_tags_let_the_winners_win() {
        let mut b = LineBuilder::new("m");
        b.merged_tags(
            &[("a", "own"), ("job", "own"), ("z", "own")],
            &[("b", "win"), ("job", "win")],
        );
        let mut f = b.fields();
        f.field("v", &FieldValue::Int(1));
        assert_eq!(text(f.finish(None)), "m,a=own,b=win,job=win,z=own v=1i");
    }

    #[test]
    fn builder_counts_fields() {
        let mut b = LineBuilder::with_capacity("m", 8);
        b.tag("a", "1").tag("b", "");
        let mut f = b.fields();
        assert!(!f.field("nan", &FieldValue::Float(f64::NAN)));
        assert_eq!(f.count(), 0);
        assert!(f.field("x", &FieldValue::Float(0.5)));
        assert_eq!(f.count(), 1);
        assert_eq!(text(f.finish(Some(7))), "m,a=1 x=0.5 7");
    }

    #[test]
    fn measurement_check() {
        assert!(check_measurement("prometheus").is_ok());
        assert!(check_measurement("with space").is_ok());
        assert_eq!(
            check_measurement(""),
            Err("measurement must not be empty".into())
        );
        assert_eq!(
            check_measurement("\\"),
            Err("measurement must not be empty".into())
        );
        assert_eq!(
            check_measurement("#x"),
            Err("measurement \"#x\" must not start with \"#\"".into())
        );
    }
}
