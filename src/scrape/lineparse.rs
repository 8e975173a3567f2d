//! Reading InfluxDB line protocol: whether one line is a point that InfluxDB (1.x, 2.x, 3.x) and
//! VictoriaMetrics all read the way it is written, and its parts. It owns the grammar below and the
//! record a producer's line becomes (trimmed, a timestamp added when it has none); it does not
//! write line protocol (that is [`super::lineproto`]), know streams or sinks, or read a body. Called
//! by the ingest API (`text/plain` bodies) and `colibri queue push` for streams whose sink speaks
//! line protocol, and by tests and fuzz targets that check [`super::lineproto`]'s output.
//!
//! A point is `measurement[,key=value...] field=value[,field=value...][ timestamp]`:
//!
//! - The line is UTF-8 and one line: no `\n` or `\r` anywhere, no tab outside a string value
//!   (VictoriaMetrics does not take a tab for a separator).
//! - A backslash takes the byte after it into the element it is in, whatever that byte is (how every
//!   one of those parsers finds the ends of elements, although they unescape differently); an
//!   element cannot end with a lone backslash.
//! - The measurement ends at the first unescaped `,` or space; it is not empty. A line that starts
//!   with `#` is a comment, not a point.
//! - Each tag is `key=value`, both non-empty, ending at an unescaped `,` or space; an unescaped `=`
//!   in a tag value is refused (InfluxDB 1.x refuses it).
//! - One or more spaces, then at least one field: `key=value`, the key non-empty. A value is a
//!   float (`-?digits[.digits][e[+-]digits]`, finite: VictoriaMetrics reads `1.` and `.5` as 0),
//!   an integer (`-?digits` then `i`, within i64), an unsigned integer (`digits` then `u`, within
//!   u64), a boolean (`t`, `T`, `true`, `True`, `TRUE`, `f`, `F`, `false`, `False`, `FALSE`) or a
//!   string in double quotes (a backslash takes the next byte, so `\"` does not end it).
//! - Optionally one or more spaces and a timestamp: `-?digits` within i64, nothing after it.

use std::fmt;

/// Why a line is not a point: what is wrong, and where (1-based byte column).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineError {
    pub column: usize,
    pub message: String,
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (column {})", self.message, self.column)
    }
}

impl std::error::Error for LineError {}

/// What a point must look like, for error messages.
const SHAPE: &str =
    "a point is `measurement[,tag=value...] field=value[,field=value...] [timestamp]`";

/// A field's value as read.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Float(f64),
    Int(i64),
    UInt(u64),
    Bool(bool),
    Str(String),
}

/// A point, unescaped: a backslash before a character its element escapes (`,` and space in the
/// measurement; `,`, `=` and space in keys and tag values) or before a backslash is dropped, any
/// other backslash kept (InfluxDB 3.x's reading; 1.x/2.x keep a doubled backslash doubled).
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub measurement: String,
    pub tags: Vec<(String, String)>,
    pub fields: Vec<(String, Value)>,
    pub timestamp: Option<i64>,
}

/// Checks one line (without its line ending); `Ok` says whether it carries a timestamp. Allocates
/// nothing for a good line.
pub fn check(line: &[u8]) -> Result<bool, LineError> {
    let mut stamped = false;
    scan(line, &mut |part| {
        if let Part::Timestamp(_) = part {
            stamped = true;
        }
    })?;
    Ok(stamped)
}

/// Reads one line into its parts.
pub fn parse(line: &[u8]) -> Result<Point, LineError> {
    let mut p = Point {
        measurement: String::new(),
        tags: Vec::new(),
        fields: Vec::new(),
        timestamp: None,
    };
    scan(line, &mut |part| match part {
        Part::Measurement(m) => p.measurement = unescape(m, b", "),
        Part::Tag(k, v) => p.tags.push((unescape(k, b", ="), unescape(v, b", ="))),
        Part::Field(k, v) => {
            let v = match v {
                Raw::Float(x) => Value::Float(x),
                Raw::Int(x) => Value::Int(x),
                Raw::UInt(x) => Value::UInt(x),
                Raw::Bool(x) => Value::Bool(x),
                Raw::Str(s) => Value::Str(unescape(s, b"\"")),
            };
            p.fields.push((unescape(k, b", ="), v));
        }
        Part::Timestamp(t) => p.timestamp = Some(t),
    })?;
    Ok(p)
}

/// The record a producer's line becomes: surrounding whitespace trimmed, `None` for an empty line
/// or a `#` comment, otherwise the checked point with ` <now>` appended when it has no timestamp
/// (`now` in the sink's precision), so a point queued through an outage keeps the time it was
/// accepted instead of taking the time it is delivered.
pub fn record(line: &[u8], now: i64) -> Result<Option<Vec<u8>>, LineError> {
    let line = line.trim_ascii();
    if line.is_empty() || line[0] == b'#' {
        return Ok(None);
    }
    if check(line)? {
        return Ok(Some(line.to_vec()));
    }
    let mut out = Vec::with_capacity(line.len() + 21);
    out.extend_from_slice(line);
    out.push(b' ');
    out.extend_from_slice(now.to_string().as_bytes());
    Ok(Some(out))
}

/// A point as written, nothing unescaped: its series (the measurement and tags, up to the space
/// before the fields), its fields' keys and values, its timestamp.
#[derive(Debug, Clone, PartialEq)]
pub struct RawPoint<'a> {
    pub series: &'a [u8],
    pub fields: Vec<(&'a [u8], Raw<'a>)>,
    pub timestamp: Option<i64>,
}

/// Reads one line into a [`RawPoint`] (for `when_full: downsample`, which writes the series and
/// keys back as they were).
pub fn raw_point(line: &[u8]) -> Result<RawPoint<'_>, LineError> {
    let mut p = RawPoint {
        series: &[],
        fields: Vec::new(),
        timestamp: None,
    };
    let end_of = |part: &[u8]| part.as_ptr() as usize - line.as_ptr() as usize + part.len();
    scan(line, &mut |part| match part {
        Part::Measurement(m) => p.series = &line[..end_of(m)],
        Part::Tag(_, v) => p.series = &line[..end_of(v)],
        Part::Field(k, v) => p.fields.push((k, v)),
        Part::Timestamp(t) => p.timestamp = Some(t),
    })?;
    Ok(p)
}

/// How long before its job was appended a point colibri stamped can carry its time (a scrape's
/// or a run's length): a timestamp in that span, by the job's clock, is that clock's.
const STAMPED_BEFORE_MS: i64 = 5 * 60 * 1000;

/// A point with its timestamp moved by `offset_ms` (for `hold_until_clock_synced`: the wall
/// clock's error when its job was appended at `created_ms`, by that clock), in whichever
/// precision puts it within [`STAMPED_BEFORE_MS`] before `created_ms` (to 1 s after); `None`
/// for a point without a timestamp or whose time is not that clock's (a producer's own, from
/// another clock: left as it is).
pub fn shift_time(line: &[u8], offset_ms: i64, created_ms: u64) -> Option<Vec<u8>> {
    if !check(line).ok()? {
        return None;
    }
    let at = line.iter().rposition(|&b| b == b' ')?;
    let t: i64 = std::str::from_utf8(&line[at + 1..]).ok()?.parse().ok()?;
    let created = i64::try_from(created_ms).ok()?;
    let on_clock = |ms: i64| (created - STAMPED_BEFORE_MS..=created + 1000).contains(&ms);
    // The precision (units per millisecond: ns, us, ms; seconds apart) that puts the point
    // nearest its append: near 1970 a millisecond stamp read as nanoseconds would fit too.
    let as_ms = |per_ms: i64| {
        if per_ms > 0 {
            Some(t / per_ms)
        } else {
            t.checked_mul(1000)
        }
    };
    let per_ms = [1_000_000i64, 1_000, 1, 0]
        .into_iter()
        .filter(|&p| as_ms(p).is_some_and(on_clock))
        .min_by_key(|&p| as_ms(p).map_or(i64::MAX, |ms| (ms - created).abs()))?;
    let shifted = if per_ms > 0 {
        t.checked_add(offset_ms.checked_mul(per_ms)?)?
    } else {
        t.checked_add(offset_ms / 1000)?
    };
    let mut out = Vec::with_capacity(line.len() + 4);
    out.extend_from_slice(&line[..=at]);
    out.extend_from_slice(shifted.to_string().as_bytes());
    Some(out)
}

enum Part<'a> {
    Measurement(&'a [u8]),
    Tag(&'a [u8], &'a [u8]),
    Field(&'a [u8], Raw<'a>),
    Timestamp(i64),
}

/// A field's value as written (see [`raw_point`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Raw<'a> {
    Float(f64),
    Int(i64),
    UInt(u64),
    Bool(bool),
    /// Between the quotes, still escaped.
    Str(&'a [u8]),
}

fn fail<T>(column: usize, message: impl Into<String>) -> Result<T, LineError> {
    Err(LineError {
        column: column + 1,
        message: message.into(),
    })
}

/// Text for a message: a part of the line as the client sent it.
fn shown(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// From `i`, the end of an element: the first unescaped byte of `stops`, or the end of the line.
fn element_end(line: &[u8], mut i: usize, stops: &[u8]) -> Result<usize, LineError> {
    while i < line.len() {
        let b = line[i];
        if b == b'\\' {
            match line.get(i + 1) {
                None => {
                    return fail(
                        i,
                        "the line ends with a backslash, which has nothing to escape",
                    );
                }
                Some(b'\t') => return fail(i + 1, "a tab: separate with a space"),
                Some(_) => {}
            }
            i += 2;
            continue;
        }
        if b == b'\t' {
            return fail(i, "a tab: separate with a space");
        }
        if stops.contains(&b) {
            break;
        }
        i += 1;
    }
    Ok(i)
}

fn skip_spaces(line: &[u8], mut i: usize) -> usize {
    while line.get(i) == Some(&b' ') {
        i += 1;
    }
    i
}

/// The grammar of the module documentation, calling `out` for each part in order. A bad line that
/// starts like JSON says so: that is the mistake a client of a JSON stream makes.
fn scan<'a>(line: &'a [u8], out: &mut impl FnMut(Part<'a>)) -> Result<(), LineError> {
    scan_point(line, out).map_err(|mut e| {
        if matches!(line.first(), Some(b'{' | b'[' | b'"')) {
            e.message = format!("this looks like JSON, not line protocol: {SHAPE}");
        }
        e
    })
}

fn scan_point<'a>(line: &'a [u8], out: &mut impl FnMut(Part<'a>)) -> Result<(), LineError> {
    check_line(line)?;
    let end = element_end(line, 0, b", ")?;
    if end == 0 {
        return fail(0, format!("no measurement: {SHAPE}"));
    }
    out(Part::Measurement(&line[..end]));
    let i = scan_tags(line, end, out)?;
    if i == line.len() {
        return fail(i, format!("no field: {SHAPE}"));
    }
    // Here line[i] is a space.
    let i = skip_spaces(line, i);
    if i == line.len() {
        return fail(i, format!("no field after the space: {SHAPE}"));
    }
    match scan_fields(line, i, out)? {
        None => Ok(()),
        Some(i) => scan_timestamp(line, i, out),
    }
}

/// What refuses the line as a whole: not UTF-8, more than one line, a comment.
#[inline]
fn check_line(line: &[u8]) -> Result<(), LineError> {
    if let Err(e) = std::str::from_utf8(line) {
        return fail(e.valid_up_to(), "not UTF-8");
    }
    // A record is one line. (Tabs are refused by `element_end`: they are fine in strings.)
    if let Some(i) = line.iter().position(|&b| b == b'\n' || b == b'\r') {
        return fail(i, "a line break inside the line");
    }
    if line.first() == Some(&b'#') {
        return fail(0, "a comment, not a point");
    }
    Ok(())
}

/// The tags from `i` (each `,key=value`; none when `line[i]` is not a comma); where they end.
#[inline]
fn scan_tags<'a>(
    line: &'a [u8],
    mut i: usize,
    out: &mut impl FnMut(Part<'a>),
) -> Result<usize, LineError> {
    while line.get(i) == Some(&b',') {
        let (key, key_end) = key_at(line, i + 1, "tag")?;
        let value_end = element_end(line, key_end + 1, b"=, ")?;
        let value = &line[key_end + 1..value_end];
        if line.get(value_end) == Some(&b'=') {
            return fail(
                value_end,
                format!("an unescaped = in the value of tag {:?}", shown(key)),
            );
        }
        if value.is_empty() {
            return fail(
                key_end + 1,
                format!("tag {:?} has an empty value", shown(key)),
            );
        }
        out(Part::Tag(key, value));
        i = value_end;
    }
    Ok(i)
}

/// The fields from `i` (at least one, comma-separated); where the space before a timestamp is,
/// or `None` when the line ends with them.
#[inline]
fn scan_fields<'a>(
    line: &'a [u8],
    mut i: usize,
    out: &mut impl FnMut(Part<'a>),
) -> Result<Option<usize>, LineError> {
    loop {
        let (key, value, vend) = field(line, i)?;
        out(Part::Field(key, value));
        match line.get(vend) {
            None => return Ok(None),
            Some(b',') => {
                i = vend + 1;
                if i == line.len() {
                    return fail(i, "a field is missing after the last comma");
                }
            }
            Some(b' ') => return Ok(Some(vend)),
            Some(_) => {
                return fail(
                    vend,
                    format!(
                        "after the value of field {:?}: expected a comma, a space or the end",
                        shown(key)
                    ),
                );
            }
        }
    }
}

/// One field `key=value` from `start`: its key, its value, and where the value ends.
#[inline]
fn field(line: &[u8], start: usize) -> Result<(&[u8], Raw<'_>, usize), LineError> {
    let (key, key_end) = key_at(line, start, "field")?;
    let vstart = key_end + 1;
    if line.get(vstart) == Some(&b'"') {
        let close = string_end(line, vstart, key)?;
        return Ok((key, Raw::Str(&line[vstart + 1..close]), close + 1));
    }
    let vend = element_end(line, vstart, b", ")?;
    Ok((key, field_value(key, &line[vstart..vend], vstart)?, vend))
}

/// The key of a `kind` (tag or field) from `start`, and where its `=` is: it must have one, and
/// not be empty.
#[inline]
fn key_at<'a>(line: &'a [u8], start: usize, kind: &str) -> Result<(&'a [u8], usize), LineError> {
    let key_end = element_end(line, start, b"=, ")?;
    let key = &line[start..key_end];
    if line.get(key_end) != Some(&b'=') {
        return fail(
            key_end,
            format!(
                "{kind} {:?} has no value ({kind}s are key=value)",
                shown(key)
            ),
        );
    }
    if key.is_empty() {
        return fail(start, format!("a {kind} without a key"));
    }
    Ok((key, key_end))
}

/// The closing quote of the string value of field `key` that opens at `open`.
#[inline]
fn string_end(line: &[u8], open: usize, key: &[u8]) -> Result<usize, LineError> {
    let mut j = open + 1;
    loop {
        match line.get(j) {
            None => {
                return fail(
                    open,
                    format!(
                        "the string value of field {:?} is not closed with \" (a string cannot span lines here)",
                        shown(key)
                    ),
                );
            }
            Some(b'\\') => j += 2,
            Some(b'"') => return Ok(j),
            Some(_) => j += 1,
        }
    }
}

/// The timestamp after the space at `i`: nothing else may follow.
#[inline]
fn scan_timestamp<'a>(
    line: &'a [u8],
    i: usize,
    out: &mut impl FnMut(Part<'a>),
) -> Result<(), LineError> {
    let start = skip_spaces(line, i);
    let ts = &line[start..];
    if ts.is_empty() {
        return fail(i, "trailing space: nothing after it");
    }
    match integer(ts).and_then(|t| std::str::from_utf8(t).ok()?.parse::<i64>().ok()) {
        Some(t) => {
            out(Part::Timestamp(t));
            Ok(())
        }
        None => fail(
            start,
            format!(
                "timestamp {:?} is not an integer (a Unix time in the sink's precision)",
                shown(ts)
            ),
        ),
    }
}

/// `-?digits` (returned whole) or `None`.
fn integer(b: &[u8]) -> Option<&[u8]> {
    let digits = b.strip_prefix(b"-").unwrap_or(b);
    (!digits.is_empty() && digits.iter().all(u8::is_ascii_digit)).then_some(b)
}

/// An unquoted field value.
fn field_value<'a>(key: &[u8], v: &[u8], at: usize) -> Result<Raw<'a>, LineError> {
    let bad = |why: &str| {
        fail(
            at,
            format!(
                "field {:?}: {:?} {why} (a float like 1.5, an integer like 1i, true, false or a \"string\")",
                shown(key),
                shown(v)
            ),
        )
    };
    if v.is_empty() {
        return bad("is empty");
    }
    let text = std::str::from_utf8(v).unwrap_or("");
    match v {
        b"t" | b"T" | b"true" | b"True" | b"TRUE" => return Ok(Raw::Bool(true)),
        b"f" | b"F" | b"false" | b"False" | b"FALSE" => return Ok(Raw::Bool(false)),
        _ => {}
    }
    if let Some(n) = v.strip_suffix(b"i") {
        return match integer(n).and_then(|_| text[..n.len()].parse::<i64>().ok()) {
            Some(x) => Ok(Raw::Int(x)),
            None => bad("is not an integer within 64 bits"),
        };
    }
    if let Some(n) = v.strip_suffix(b"u") {
        return match (n.first() != Some(&b'-'))
            .then(|| integer(n))
            .flatten()
            .and_then(|_| text[..n.len()].parse::<u64>().ok())
        {
            Some(x) => Ok(Raw::UInt(x)),
            None => bad("is not an unsigned integer within 64 bits"),
        };
    }
    if !float_syntax(v) {
        return bad("is not a value");
    }
    match text.parse::<f64>() {
        Ok(x) if x.is_finite() => Ok(Raw::Float(x)),
        _ => bad("is too large for a float"),
    }
}

/// `-?digits[.digits][(e|E)[+-]digits]`.
fn float_syntax(v: &[u8]) -> bool {
    let digits = |b: &[u8], i: &mut usize| {
        let start = *i;
        while b.get(*i).is_some_and(u8::is_ascii_digit) {
            *i += 1;
        }
        *i > start
    };
    let mut i = usize::from(v.first() == Some(&b'-'));
    if !digits(v, &mut i) {
        return false;
    }
    if v.get(i) == Some(&b'.') {
        i += 1;
        if !digits(v, &mut i) {
            return false;
        }
    }
    if matches!(v.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(v.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if !digits(v, &mut i) {
            return false;
        }
    }
    i == v.len()
}

/// An element's text with the backslash dropped before a byte of `escaped` or a backslash.
fn unescape(b: &[u8], escaped: &[u8]) -> String {
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 1 < b.len() && (b[i + 1] == b'\\' || escaped.contains(&b[i + 1])) {
            out.push(b[i + 1]);
            i += 2;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_point_on_the_jobs_clock_is_shifted_in_its_own_precision() {
        let created = 1_000_000_000_000u64; // 2001, by the wrong clock
        let hour = 3_600_000i64;
        let ns = format!("m v=1 {}", 999_999_990_000i64 * 1_000_000);
        assert_eq!(
            shift_time(ns.as_bytes(), hour, created).unwrap(),
            format!("m v=1 {}", (999_999_990_000i64 + hour) * 1_000_000).into_bytes()
        );
        let ms = b"m,t=a v=1i 999999990000";
        assert_eq!(
            shift_time(ms, hour, created).unwrap(),
            b"m,t=a v=1i 1000003590000".to_vec()
        );
        let s = b"m v=1 999999990";
        assert_eq!(
            shift_time(s, hour, created).unwrap(),
            b"m v=1 1000003590".to_vec()
        );
        // A producer's own time (an hour after the wrong clock), none, and a string field.
        assert_eq!(shift_time(b"m v=1 1000003600000", hour, created), None);
        assert_eq!(shift_time(b"m v=1", hour, created), None);
        assert_eq!(shift_time(b"m s=\"a 999999990000\"", hour, created), None);
        // Minutes after a boot at 1970: milliseconds, not nanoseconds that would round to 0.
        assert_eq!(
            shift_time(b"m v=1 120000", hour, 120_005).unwrap(),
            b"m v=1 3720000".to_vec()
        );
    }

    use super::super::lineproto::{FieldValue, LineBuilder, line};
    use super::*;

    fn err(line: &str) -> LineError {
        match check(line.as_bytes()) {
            Err(e) => e,
            Ok(_) => panic!("{line:?} should be refused"),
        }
    }

    #[test]
    fn points_parse_into_their_parts() {
        let p = parse(
            br#"cpu,host=edge-7,core=0 usage=1.5,n=-3i,u=7u,ok=T,msg="a \"q\", b=c" 1700000000"#,
        )
        .expect("a point");
        assert_eq!(p.measurement, "cpu");
        assert_eq!(
            p.tags,
            [
                ("host".into(), "edge-7".into()),
                ("core".into(), "0".into())
            ]
        );
        assert_eq!(
            p.fields,
            [
                ("usage".into(), Value::Float(1.5)),
                ("n".into(), Value::Int(-3)),
                ("u".into(), Value::UInt(7)),
                ("ok".into(), Value::Bool(true)),
                ("msg".into(), Value::Str("a \"q\", b=c".into())),
            ]
        );
        assert_eq!(p.timestamp, Some(1_700_000_000));
        assert_eq!(check(b"m v=1"), Ok(false));
        assert_eq!(check(b"m v=1 -5"), Ok(true));
        // Runs of spaces between the sections are read as one (every parser does).
        assert_eq!(check(b"m  v=1   5"), Ok(true));
        for v in [
            "0",
            "-0",
            "1e5",
            "1E+5",
            "2.5e-7",
            "007",
            "true",
            "True",
            "TRUE",
            "f",
            "F",
            "false",
            "False",
            "FALSE",
            "\"\"",
            "1i",
            "-9223372036854775808i",
            "18446744073709551615u",
        ] {
            assert!(check(format!("m v={v}").as_bytes()).is_ok(), "{v}");
        }
    }

    #[test]
    fn escapes_keep_separators_inside_elements() {
        let p = parse(br"my\ cpu\,x,ho\=st=a\ b\,c v\ 1=1,w=2").expect("a point");
        assert_eq!(p.measurement, "my cpu,x");
        assert_eq!(p.tags, [("ho=st".into(), "a b,c".into())]);
        assert_eq!(p.fields[0].0, "v 1");
        assert_eq!(p.fields.len(), 2);
        // `=` needs no escape in a measurement; other backslashes are kept.
        let p = parse(br"a=b,path=C:\dir v=1").expect("a point");
        assert_eq!(
            (p.measurement.as_str(), p.tags[0].1.as_str()),
            ("a=b", r"C:\dir")
        );
        // A backslash before a quote keeps the string open; a doubled one does not.
        let p = parse(br#"m s="x\\",t="a\"b""#).expect("a point");
        assert_eq!(
            p.fields,
            [
                ("s".into(), Value::Str(r"x\".into())),
                ("t".into(), Value::Str("a\"b".into()))
            ]
        );
    }

    #[test]
    fn each_kind_of_bad_line_is_named() {
        let cases = [
            ("", "no measurement"),
            (",a=b v=1", "no measurement"),
            (" m v=1", "no measurement"),
            ("m", "no field"),
            ("m,a=b", "no field"),
            ("m ", "no field after the space"),
            ("{\"measurement\":\"m\",\"v\":1}", "looks like JSON"),
            ("[1]", "looks like JSON"),
            ("\"m v=1\"", "looks like JSON"),
            ("m,a v=1", "tag \"a\" has no value"),
            ("m,a= v=1", "tag \"a\" has an empty value"),
            ("m,=b v=1", "a tag without a key"),
            ("m, v=1", "tag \"\" has no value"),
            ("m,a=b=c v=1", "an unescaped = in the value of tag \"a\""),
            ("m v", "field \"v\" has no value"),
            ("m =1", "a field without a key"),
            ("m v=", "is empty"),
            ("m v=1,", "a field is missing after the last comma"),
            ("m v=1.", "is not a value"),
            ("m v=.5", "is not a value"),
            ("m v=+1", "is not a value"),
            ("m v=0x10", "is not a value"),
            ("m v=NaN", "is not a value"),
            ("m v=inf", "is not a value"),
            ("m v=1e999", "too large for a float"),
            ("m v=tRue", "is not a value"),
            ("m v=1i2", "is not a value"),
            ("m v=99999999999999999999i", "not an integer within 64 bits"),
            ("m v=-1u", "not an unsigned integer"),
            ("m v=\"open", "is not closed"),
            ("m v=\"a\"b", "expected a comma, a space or the end"),
            ("m v=1 ", "trailing space"),
            ("m v=1 1.5", "timestamp \"1.5\" is not an integer"),
            ("m v=1 12 34", "timestamp \"12 34\" is not an integer"),
            ("m v=1 99999999999999999999", "is not an integer"),
            ("m\tv=1", "a tab"),
            ("m v=1\r", "a line break"),
            ("m\\", "ends with a backslash"),
            ("# comment", "a comment"),
        ];
        for (line, want) in cases {
            let e = err(line);
            assert!(e.message.contains(want), "{line:?}: {e}");
            assert!(e.column >= 1 && e.column <= line.len() + 1, "{line:?}: {e}");
        }
        assert_eq!(err("m,a v=1").column, 4);
        assert_eq!(
            check(b"m v=\xff"),
            Err(LineError {
                column: 5,
                message: "not UTF-8".into()
            })
        );
        // Tabs are fine inside a string value.
        assert!(check(b"m s=\"a\tb\"").is_ok());
        assert!(err("m\"x\ty\" v=1").message.contains("a tab"));
    }

    #[test]
    fn records_are_trimmed_and_stamped_when_they_have_no_time() {
        assert_eq!(record(b"  m v=1 \r", 42), Ok(Some(b"m v=1 42".to_vec())));
        assert_eq!(record(b"m v=1 7", 42), Ok(Some(b"m v=1 7".to_vec())));
        assert_eq!(record(b"   ", 42), Ok(None));
        assert_eq!(record(b"# a comment", 42), Ok(None));
        assert!(record(b"m", 42).is_err());
        let stamped = record(b"m v=1", -3).expect("ok").expect("a record");
        assert_eq!(parse(&stamped).expect("a point").timestamp, Some(-3));
    }

    /// What `lineproto` writes is always a point that reads back the same (values without
    /// backslash runs or line breaks, which the writer documents as lossy).
    #[test]
    fn the_writer_output_reads_back() {
        let rec = line(
            "cpu load,total",
            &[("host name", "edge 1,rack=2"), ("path", r"C:\dir")],
            &[
                ("user time,s=1", FieldValue::Int(-1)),
                ("f", FieldValue::Float(-2.5e-7)),
                ("b", FieldValue::Bool(false)),
                ("s", FieldValue::Str("say \"hi\" C:\\x, a=b".into())),
            ],
            Some(-5),
        )
        .expect("a record");
        let p = parse(&rec).expect("the writer's output parses");
        assert_eq!(p.measurement, "cpu load,total");
        assert_eq!(
            p.tags,
            [
                ("host name".into(), "edge 1,rack=2".into()),
                ("path".into(), r"C:\dir".into())
            ]
        );
        assert_eq!(
            p.fields,
            [
                ("user time,s=1".into(), Value::Int(-1)),
                ("f".into(), Value::Float(-2.5e-7)),
                ("b".into(), Value::Bool(false)),
                ("s".into(), Value::Str("say \"hi\" C:\\x, a=b".into())),
            ]
        );
        assert_eq!(p.timestamp, Some(-5));
        // The lossy cases still give a point with the same parts.
        let mut b = LineBuilder::new("m\\\\");
        b.tag("k\n", r"a\\,b").tag("t", "x\\");
        let mut f = b.fields();
        f.field_str("s", "line\nbreak\\");
        f.field("x", &FieldValue::Float(f64::MAX));
        let rec = f.finish(None).expect("a record");
        let p = parse(&rec).expect("lossy values still parse");
        assert_eq!((p.tags.len(), p.fields.len(), p.timestamp), (2, 2, None));
    }
}
