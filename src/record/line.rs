//! One line as a record of a stream: checked as the stream's sink needs it (a JSON value, a line
//! protocol point stamped when it has no time, any line) and its error said the same way wherever
//! a line comes from (`queue push`, an `exec` task's output, the admin endpoint's push, ingest's
//! NDJSON bodies). Called by those; knows nothing of where lines come from.

use serde::de::IgnoredAny;

use super::RecordFormat;
use crate::scrape::lineparse;

/// One line as a record of a stream whose sink needs `carries` (for `queue push`'s stdin and an
/// `exec` task's output, line by line as NDJSON bodies are): `None` for an empty line (or a
/// line-protocol comment); a point without a timestamp gets `now_ns`, in the sink's precision. The
/// error says what the line is not.
pub fn line_record(
    carries: RecordFormat,
    line: &[u8],
    now_ns: i64,
) -> Result<Option<Vec<u8>>, String> {
    match carries {
        RecordFormat::Lines => {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            Ok((!line.is_empty()).then(|| line.to_vec()))
        }
        RecordFormat::Json => json_record(line)
            .map(|r| r.map(<[u8]>::to_vec))
            .map_err(|why| format!("is not JSON: {why}")),
        RecordFormat::LineProtocol(p) => lineparse::record(line, p.from_unix_ns(now_ns))
            .map_err(|e| format!("is not line protocol: {e}")),
    }
}

/// Checks one line as a JSON record (for `queue push`, line by line as NDJSON bodies are):
/// surrounding whitespace trimmed, `None` for an empty line.
pub fn json_record(line: &[u8]) -> Result<Option<&[u8]>, String> {
    let line = line.trim_ascii();
    if line.is_empty() {
        return Ok(None);
    }
    let text = std::str::from_utf8(line)
        .map_err(|e| format!("not UTF-8 at byte {} of the line", e.valid_up_to() + 1))?;
    serde_json::from_str::<IgnoredAny>(text).map_err(|e| json_error(&e))?;
    Ok(Some(line))
}

/// A JSON parse error in the words of a record: what is wrong and where in the record.
pub fn json_error(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let what = text
        .rsplit_once(" at line ")
        .map_or(text.as_str(), |(w, _)| w);
    format!(
        "{what} (line {} column {} of the record)",
        e.line(),
        e.column()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_records_for_queue_push() {
        assert_eq!(json_record(b"  {\"a\":1}\r"), Ok(Some(&b"{\"a\":1}"[..])));
        assert_eq!(json_record(b" \r"), Ok(None));
        assert!(json_record(b"m v=1").is_err());
        assert!(json_record(b"\"\xff\"").is_err());
    }
}
