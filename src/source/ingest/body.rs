//! Request bodies: what `Content-Type` and `Content-Encoding` mean here for a stream (its sink's
//! [`RecordFormat`]), bounded gzip decompression, and the split of a body into records (NDJSON
//! lines, the elements of a JSON array, or line-protocol points for a stream whose sink speaks
//! InfluxDB line protocol). Pure and synchronous: the server runs it inline for small bodies and on
//! the blocking pool for large ones. Every record is checked to be what its stream carries (JSON, or
//! a point by [`crate::scrape::lineparse`]); one bad record refuses the whole body.

use std::io::Read as _;

use serde::de::IgnoredAny;

use crate::record::RecordFormat;
use crate::record::line::{json_error, json_record};
use crate::scrape::lineparse;

/// Records one request may carry: each costs a small allocation besides its bytes, so a body of
/// tiny records (`1\n` over and over) stays within a few MiB of bookkeeping.
pub const MAX_RECORDS: usize = 100_000;

fn too_many() -> BadBody {
    BadBody::TooLarge(format!(
        "more than {MAX_RECORDS} records in one request: send smaller batches"
    ))
}

/// How records are laid out in the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `application/x-ndjson` (or `application/ndjson`): one record per non-empty line.
    Ndjson,
    /// `application/json`: an array, one record per element (stored compact).
    JsonArray,
    /// `text/plain`, for a stream whose sink speaks line protocol: a point per non-empty line
    /// (`#` comments skipped); a point without a timestamp is stored with `stamp` (the request's
    /// time in the sink's precision).
    LineProtocol { stamp: i64 },
}

/// The request body's `Content-Encoding` (the sink's body format is `sink::http::Encoding`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentEncoding {
    Identity,
    Gzip,
}

/// Why a body is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BadBody {
    /// Decompressed past `max_body`, or more than [`MAX_RECORDS`] records (413).
    TooLarge(String),
    /// Not what the content type says (400), with the 1-based line (NDJSON) or the 0-based array
    /// index at fault when one is.
    Invalid {
        message: String,
        line: Option<u64>,
        index: Option<u64>,
    },
}

fn invalid(message: impl Into<String>) -> BadBody {
    BadBody::Invalid {
        message: message.into(),
        line: None,
        index: None,
    }
}

/// The record format a `Content-Type` names for a stream that carries `carries`; `Err` (415)
/// explains what is accepted. JSON for every stream but those whose sink speaks line protocol,
/// which take `text/plain` only (`now_ns`: the request's time, for points without one). A
/// `charset` parameter other than UTF-8 is refused too: both are UTF-8.
pub fn format_of(
    content_type: Option<&str>,
    carries: RecordFormat,
    now_ns: i64,
) -> Result<Format, String> {
    const ACCEPTED: &str =
        "send application/x-ndjson (a record per line) or application/json (an array of records)";
    const LINES: &str = "send text/plain, a line-protocol point per line";
    let influx = match carries {
        RecordFormat::LineProtocol(precision) => Some(precision),
        RecordFormat::Json | RecordFormat::Lines => None,
    };
    let Some(ct) = content_type else {
        return Err(match influx {
            Some(_) => {
                format!("no Content-Type: the stream's sink speaks influx line protocol: {LINES}")
            }
            None => format!("no Content-Type: {ACCEPTED}"),
        });
    };
    let mut parts = ct.split(';');
    let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
    let json = matches!(
        media.as_str(),
        "application/x-ndjson" | "application/ndjson" | "application/json"
    );
    let format = match (media.as_str(), influx) {
        ("text/plain", Some(p)) => Format::LineProtocol {
            stamp: p.from_unix_ns(now_ns),
        },
        (_, Some(_)) if json => {
            return Err(format!(
                "{media} is not accepted here: the stream's sink speaks influx line protocol (encoding: influx_line) and would send JSON records unreadable: {LINES}"
            ));
        }
        (_, Some(_)) => {
            return Err(format!("Content-Type {media:?} is not accepted: {LINES}"));
        }
        ("application/x-ndjson" | "application/ndjson", None) => Format::Ndjson,
        ("application/json", None) => Format::JsonArray,
        (_, None) => {
            return Err(format!(
                "Content-Type {media:?} is not accepted: {ACCEPTED}"
            ));
        }
    };
    for param in parts {
        let Some((name, value)) = param.split_once('=') else {
            continue;
        };
        let value = value.trim().trim_matches('"');
        if name.trim().eq_ignore_ascii_case("charset")
            && !value.eq_ignore_ascii_case("utf-8")
            && !value.eq_ignore_ascii_case("utf8")
        {
            return Err(format!(
                "charset {value:?} is not accepted: records are UTF-8 {}",
                if influx.is_some() {
                    "line protocol"
                } else {
                    "JSON"
                }
            ));
        }
    }
    Ok(format)
}

/// The `Content-Encoding`; `Err` (415) for anything but none, `identity` and `gzip`.
pub fn encoding_of(content_encoding: Option<&str>) -> Result<ContentEncoding, String> {
    match content_encoding
        .map(|e| e.trim().to_ascii_lowercase())
        .as_deref()
    {
        None | Some("") | Some("identity") => Ok(ContentEncoding::Identity),
        Some("gzip") | Some("x-gzip") => Ok(ContentEncoding::Gzip),
        Some(other) => Err(format!(
            "Content-Encoding {other:?} is not accepted: send gzip or no encoding"
        )),
    }
}

/// The records of a body as received (at most `max_body` bytes on the wire), decompressed to at
/// most `max_body` bytes.
pub fn records(
    wire: Vec<u8>,
    format: Format,
    encoding: ContentEncoding,
    max_body: u64,
) -> Result<Vec<Vec<u8>>, BadBody> {
    let body = match encoding {
        ContentEncoding::Identity => wire,
        ContentEncoding::Gzip => {
            let body = gunzip(&wire, max_body)?;
            // Freed before the records are split out: at most the body and its records are held
            // at once (about twice max_body), not the compressed copy too.
            drop(wire);
            body
        }
    };
    match format {
        Format::Ndjson => ndjson(&body),
        Format::JsonArray => json_array(&body),
        Format::LineProtocol { stamp } => line_protocol(&body, stamp),
    }
}

/// One point per non-empty line (`\n`, optionally `\r\n`), trimmed, `#` comments skipped; a point
/// without a timestamp gets `stamp`.
fn line_protocol(body: &[u8], stamp: i64) -> Result<Vec<Vec<u8>>, BadBody> {
    let mut out = Vec::new();
    for (i, line) in body.split(|&b| b == b'\n').enumerate() {
        match lineparse::record(line, stamp) {
            Ok(None) => {}
            Ok(Some(point)) => {
                if out.len() == MAX_RECORDS {
                    return Err(too_many());
                }
                out.push(point);
            }
            Err(e) => {
                return Err(BadBody::Invalid {
                    message: format!("line {} is not line protocol: {e}", i + 1),
                    line: Some(i as u64 + 1),
                    index: None,
                });
            }
        }
    }
    Ok(out)
}

/// Decompresses one or more gzip members, stopping one byte past `max`: a small body that inflates
/// to gigabytes costs `max` bytes of memory, then 413.
fn gunzip(wire: &[u8], max: u64) -> Result<Vec<u8>, BadBody> {
    let guess = wire.len().saturating_mul(4).min(max as usize);
    let mut out = Vec::with_capacity(guess + 1);
    flate2::read::MultiGzDecoder::new(wire)
        .take(max + 1)
        .read_to_end(&mut out)
        .map_err(|e| invalid(format!("the body is not valid gzip: {e}")))?;
    if out.len() as u64 > max {
        return Err(BadBody::TooLarge(format!(
            "the body decompresses to more than max_body ({max} bytes)"
        )));
    }
    Ok(out)
}

/// serde_json's message without its position, which is relative to the record, not the body.
/// One record per non-empty line (`\n`, optionally `\r\n`); surrounding whitespace is trimmed.
fn ndjson(body: &[u8]) -> Result<Vec<Vec<u8>>, BadBody> {
    let mut out = Vec::new();
    for (i, line) in body.split(|&b| b == b'\n').enumerate() {
        let line = match json_record(line) {
            Ok(None) => continue,
            Ok(Some(line)) => line,
            Err(message) => {
                return Err(BadBody::Invalid {
                    message: format!("line {} is not JSON: {message}", i + 1),
                    line: Some(i as u64 + 1),
                    index: None,
                });
            }
        };
        if out.len() == MAX_RECORDS {
            return Err(too_many());
        }
        out.push(line.to_vec());
    }
    Ok(out)
}

fn skip_ws(body: &[u8], mut i: usize) -> usize {
    while i < body.len() && matches!(body[i], b' ' | b'\t' | b'\n' | b'\r') {
        i += 1;
    }
    i
}

/// A JSON array, one record per element, each stored as its compact text. The array is cut into
/// elements by a scan that follows strings and nesting, then each element is checked on its own,
/// so an error names the element at fault.
fn json_array(body: &[u8]) -> Result<Vec<Vec<u8>>, BadBody> {
    let at = |index: usize, message: String| BadBody::Invalid {
        message: format!("record [{index}] of the array is not JSON: {message}"),
        line: None,
        index: Some(index as u64),
    };
    let n = body.len();
    let mut i = skip_ws(body, 0);
    match body.get(i) {
        Some(b'[') => i += 1,
        None => return Err(invalid("the body is empty: send a JSON array of records")),
        Some(_) => {
            return Err(invalid(
                "an application/json body must be an array of records ([...]); send application/x-ndjson for a record per line",
            ));
        }
    }
    let mut out = Vec::new();
    i = skip_ws(body, i);
    if body.get(i) == Some(&b']') {
        i += 1;
    } else {
        loop {
            let index = out.len();
            let start = i;
            let (mut depth, mut strings) = (0usize, Strings::default());
            while i < n {
                let b = body[i];
                if !strings.takes(b) {
                    match b {
                        b'[' | b'{' => depth += 1,
                        b']' | b'}' if depth == 0 => break,
                        b']' | b'}' => depth -= 1,
                        b',' if depth == 0 => break,
                        _ => {}
                    }
                }
                i += 1;
            }
            let elem = body[start..i].trim_ascii();
            if elem.is_empty() {
                return Err(at(index, "it is missing (a stray comma?)".into()));
            }
            let text = std::str::from_utf8(elem).map_err(|e| {
                at(
                    index,
                    format!("not UTF-8 at byte {} of the record", e.valid_up_to() + 1),
                )
            })?;
            serde_json::from_str::<IgnoredAny>(text).map_err(|e| at(index, json_error(&e)))?;
            if out.len() == MAX_RECORDS {
                return Err(too_many());
            }
            out.push(compact(elem));
            match body.get(i) {
                Some(b',') => i += 1,
                Some(b']') => {
                    i += 1;
                    break;
                }
                Some(&other) => {
                    return Err(at(
                        index,
                        format!("expected , or ] after it, found {:?}", other as char),
                    ));
                }
                None => return Err(at(index, "the array is not closed with ]".into())),
            }
        }
    }
    let i = skip_ws(body, i);
    if i < n {
        return Err(invalid(format!(
            "unexpected data after the array at byte {}",
            i + 1
        )));
    }
    Ok(out)
}

/// Valid JSON without the whitespace outside strings (numbers and strings kept exactly as sent).
fn compact(elem: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(elem.len());
    let mut strings = Strings::default();
    for &b in elem {
        if strings.takes(b) || !matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
            out.push(b);
        }
    }
    out
}

/// Follows JSON strings byte by byte (escapes included): the one scanner of the array split and
/// of [`compact`], which must not look inside strings.
#[derive(Default)]
struct Strings {
    open: bool,
    escaped: bool,
}

impl Strings {
    /// Whether `b` is part of a string, its quotes included.
    fn takes(&mut self, b: u8) -> bool {
        if self.open {
            if self.escaped {
                self.escaped = false;
            } else if b == b'\\' {
                self.escaped = true;
            } else if b == b'"' {
                self.open = false;
            }
            true
        } else {
            self.open = b == b'"';
            self.open
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    fn texts(r: Result<Vec<Vec<u8>>, BadBody>) -> Vec<String> {
        r.expect("valid")
            .into_iter()
            .map(|v| String::from_utf8(v).expect("utf-8"))
            .collect()
    }

    fn bad(r: Result<Vec<Vec<u8>>, BadBody>) -> (String, Option<u64>, Option<u64>) {
        match r {
            Err(BadBody::Invalid {
                message,
                line,
                index,
            }) => (message, line, index),
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    fn json_format(ct: Option<&str>) -> Result<Format, String> {
        format_of(ct, RecordFormat::Json, 0)
    }

    #[test]
    fn content_types_and_encodings() {
        assert_eq!(
            json_format(Some("application/x-ndjson")),
            Ok(Format::Ndjson)
        );
        assert_eq!(
            json_format(Some("Application/NDJSON; charset=UTF-8")),
            Ok(Format::Ndjson)
        );
        assert_eq!(
            json_format(Some("application/json;charset=\"utf-8\"")),
            Ok(Format::JsonArray)
        );
        assert!(json_format(None).is_err());
        assert!(json_format(Some("text/plain")).is_err());
        assert!(json_format(Some("application/json; charset=latin1")).is_err());
        // A stream without a sink, or with a file or stdout one, takes JSON too.
        assert_eq!(
            format_of(Some("application/json"), RecordFormat::Lines, 0),
            Ok(Format::JsonArray)
        );
        assert!(format_of(Some("text/plain"), RecordFormat::Lines, 0).is_err());
        assert_eq!(encoding_of(None), Ok(ContentEncoding::Identity));
        assert_eq!(encoding_of(Some("identity")), Ok(ContentEncoding::Identity));
        assert_eq!(encoding_of(Some("GZIP")), Ok(ContentEncoding::Gzip));
        assert!(encoding_of(Some("br")).is_err());
        assert!(encoding_of(Some("gzip, gzip")).is_err());
    }

    #[test]
    fn ndjson_lines_are_records_and_a_bad_line_is_named() {
        let body = b"{\"a\":1}\r\n\n  [1, 2]  \n\"s\"\n".to_vec();
        let r = records(body, Format::Ndjson, ContentEncoding::Identity, 1 << 20);
        assert_eq!(texts(r), ["{\"a\":1}", "[1, 2]", "\"s\""]);
        assert!(
            texts(records(
                vec![],
                Format::Ndjson,
                ContentEncoding::Identity,
                10
            ))
            .is_empty()
        );
        let (m, line, index) = bad(ndjson(b"{}\n\n{\"a\":}\n{}"));
        assert_eq!((line, index), (Some(3), None), "{m}");
        assert!(m.starts_with("line 3 is not JSON: "), "{m}");
        let (_, line, _) = bad(ndjson(b"1\n2 3\n"));
        assert_eq!(line, Some(2));
        let (m, line, _) = bad(ndjson(b"\"\xff\"\n"));
        assert_eq!(line, Some(1), "{m}");
    }

    #[test]
    fn array_elements_are_compact_records_and_a_bad_one_is_named() {
        let body = br#" [ {"a" : 1, "s": "x , ] } \" y"} ,
            [1, [2]], "t", 1.50e3 , null ] "#;
        let r = json_array(body);
        assert_eq!(
            texts(r),
            [
                r#"{"a":1,"s":"x , ] } \" y"}"#,
                "[1,[2]]",
                "\"t\"",
                "1.50e3",
                "null"
            ]
        );
        assert!(texts(json_array(b" [ ] ")).is_empty());
        for (body, index) in [
            (&br#"[{"a":1}, {"a":}, 3]"#[..], 1),
            (b"[1,2,]", 2),
            (b"[1,2", 1),
            (b"[1}", 0),
            (b"[{]", 0),
            (b"[\"abc", 0),
            (b"[1, \"\xff\"]", 1),
            (b"[1 2]", 0),
        ] {
            let (m, line, at) = bad(json_array(body));
            assert_eq!(
                (line, at),
                (None, Some(index)),
                "{}: {m}",
                String::from_utf8_lossy(body)
            );
            assert!(m.starts_with(&format!("record [{index}] ")), "{m}");
        }
        for body in [&b""[..], b"{}", b"[1] x", b"  "] {
            let (_, line, index) = bad(json_array(body));
            assert_eq!((line, index), (None, None));
        }
    }

    #[test]
    fn records_per_request_are_bounded() {
        let lines = "1\n".repeat(MAX_RECORDS);
        assert_eq!(
            ndjson(lines.as_bytes()).expect("at the limit").len(),
            MAX_RECORDS
        );
        let over = format!("{lines}1\n");
        assert!(matches!(ndjson(over.as_bytes()), Err(BadBody::TooLarge(_))));
        let array = format!("[{}1]", "1,".repeat(MAX_RECORDS));
        assert!(matches!(
            json_array(array.as_bytes()),
            Err(BadBody::TooLarge(_))
        ));
    }

    fn gz(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).expect("compress");
        e.finish().expect("compress")
    }

    #[test]
    fn gzip_is_bounded_by_the_decompressed_size() {
        let r = records(gz(b"1\n2\n"), Format::Ndjson, ContentEncoding::Gzip, 4);
        assert_eq!(texts(r), ["1", "2"]);
        let bomb = gz(&vec![b' '; 10 << 20]);
        assert!(bomb.len() < 64 << 10);
        assert!(matches!(
            records(bomb, Format::Ndjson, ContentEncoding::Gzip, 1 << 20),
            Err(BadBody::TooLarge(_))
        ));
        let (m, _, _) = bad(records(
            b"not gzip".to_vec(),
            Format::Ndjson,
            ContentEncoding::Gzip,
            100,
        ));
        assert!(m.contains("gzip"), "{m}");
    }

    #[test]
    fn a_line_protocol_stream_takes_text_plain_and_refuses_json_with_the_reason() {
        use crate::scrape::lineproto::Precision;
        let lp = RecordFormat::LineProtocol(Precision::Ms);
        let now_ns = 1_700_000_000_123_456_789;
        let stamp = 1_700_000_000_123;
        assert_eq!(
            format_of(Some("text/plain"), lp, now_ns),
            Ok(Format::LineProtocol { stamp })
        );
        assert_eq!(
            format_of(Some("Text/Plain; charset=utf-8"), lp, now_ns),
            Ok(Format::LineProtocol { stamp })
        );
        for ct in [
            "application/json",
            "application/x-ndjson",
            "application/ndjson",
        ] {
            let why = format_of(Some(ct), lp, now_ns).expect_err("JSON is refused");
            assert!(
                why.contains("influx line protocol") && why.contains("send text/plain"),
                "{ct}: {why}"
            );
        }
        let why = format_of(None, lp, now_ns).expect_err("no type");
        assert!(why.contains("send text/plain"), "{why}");
        let why = format_of(Some("text/csv"), lp, now_ns).expect_err("csv");
        assert!(why.contains("send text/plain"), "{why}");
        let why = format_of(Some("text/plain; charset=latin1"), lp, now_ns).expect_err("latin1");
        assert!(why.contains("UTF-8 line protocol"), "{why}");
    }

    #[test]
    fn line_protocol_bodies_are_points_and_a_bad_line_is_named() {
        let body = b"# comment\ncpu,host=a v=1 5\r\n\n  cpu v=2  \n".to_vec();
        let r = records(
            body,
            Format::LineProtocol { stamp: 9 },
            ContentEncoding::Identity,
            1 << 20,
        );
        assert_eq!(texts(r), ["cpu,host=a v=1 5", "cpu v=2 9"]);
        let (m, line, index) = bad(line_protocol(b"cpu v=1\n{\"v\":1}\n", 0));
        assert_eq!((line, index), (Some(2), None), "{m}");
        assert!(m.starts_with("line 2 is not line protocol: "), "{m}");
        let (m, line, _) = bad(line_protocol(b"cpu v=1\ncpu,host v=1\n", 0));
        assert_eq!(line, Some(2));
        assert!(m.contains("tag \"host\" has no value"), "{m}");
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(b"m v=1\nm v=2 3\n").expect("gzip");
        let r = records(
            gz.finish().expect("gzip"),
            Format::LineProtocol { stamp: 1 },
            ContentEncoding::Gzip,
            1 << 20,
        );
        assert_eq!(texts(r), ["m v=1 1", "m v=2 3"]);
        let many = "m v=1\n".repeat(MAX_RECORDS + 1);
        assert!(matches!(
            line_protocol(many.as_bytes(), 0),
            Err(BadBody::TooLarge(_))
        ));
    }
}
