//! What a record is, below every edge that makes or carries one: the formats a stream's records
//! can have ([`RecordFormat`], what its sink needs and every producer checks), one line checked as
//! a record ([`line`]), JSON escaping ([`json`]), the level of a log line and the filters over
//! records ([`filter`]), and the pieces of a record's JSON every source writes alike (its
//! `labels`, a string). Sources, sinks, tasks and `config` use it; it uses only `scrape`'s line
//! protocol.

use std::borrow::Cow;

pub mod filter;
pub mod json;
pub mod line;

/// What a stream's records must be for its sink to carry them; every producer (ingest, `queue
/// push`, tail sources, scrapes) writes or checks that format, so a sink is never handed a record it
/// would send broken (a receiver that answers 2xx and drops what it cannot read loses it silently).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordFormat {
    /// JSON values: an `http` sink with `encoding: ndjson` or `json_array`.
    Json,
    /// One InfluxDB line-protocol point per record, timestamps in this precision: an `http` sink
    /// with `encoding: influx_line`.
    LineProtocol(crate::scrape::lineproto::Precision),
    /// Any single line: `file` and `stdout` sinks write a record per line, and a stream without a
    /// sink only queues. The ingest API takes JSON for these (its contract); `queue push` and
    /// scrapes may put other lines there.
    Lines,
}

/// What the records of a stream (named) must be: its sink's format, as `config` knows it.
pub type FormatOf<'a> = &'a dyn Fn(&str) -> RecordFormat;

impl RecordFormat {
    /// For messages: what the records are.
    pub fn describe(self) -> &'static str {
        match self {
            RecordFormat::Json => "JSON records",
            RecordFormat::LineProtocol(_) => "influx line protocol",
            RecordFormat::Lines => "lines",
        }
    }
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
    json::escape_into(&mut v, s);
    v.push(b'"');
    String::from_utf8(v).expect("escaping keeps UTF-8")
}

/// The text of a line as UTF-8: borrowed when it is (checked the fast way), with U+FFFD for each
/// invalid sequence when it is not.
pub fn text(line: &[u8]) -> Cow<'_, str> {
    match std::str::from_utf8(line) {
        Ok(s) => Cow::Borrowed(s),
        Err(_) => String::from_utf8_lossy(line),
    }
}
