//! One syslog message made one JSON record: RFC 5424 and RFC 3164 parsed by `syslog_loose` (the
//! parser Vector uses) into `time`, `host`, `app`, `procid`, `msgid`, `facility`, `severity`,
//! `structured_data` and `message`; a message without a `<PRI>` header, or that neither RFC
//! describes, is kept whole as `message` with `"unparsed": true`. Owns the record's shape and the
//! year of an RFC 3164 time (which has none); does not read sockets or filter. Called by the
//! listeners of [`super`].

use chrono::{DateTime, Datelike, FixedOffset, Local, SecondsFormat};
use syslog_loose::{Message, Protocol, Variant};

/// What the listeners know of a message besides its bytes.
pub struct Context<'a> {
    /// When it was read (RFC 3339, UTC), as a JSON string.
    pub received: &'a str,
    /// Who sent it (`address:port`), as a JSON string.
    pub peer: &'a str,
    /// `,"labels":{...}` or empty.
    pub labels: &'a str,
}

/// A message, parsed or not.
pub struct Parsed<'a> {
    text: &'a str,
    message: Option<Message<&'a str>>,
}

impl<'a> Parsed<'a> {
    /// Parses `text`, one message without its framing. RFC 3164 times are read in the machine's
    /// local time zone (they carry none), in the year that puts them nearest to now.
    pub fn new(text: &'a str) -> Parsed<'a> {
        let message = has_pri(text)
            .then(|| {
                syslog_loose::parse_message_with_year_exact_tz(
                    text,
                    year_of,
                    None::<Local>,
                    Variant::Either,
                )
                .ok()
            })
            .flatten();
        Parsed { text, message }
    }

    pub fn is_parsed(&self) -> bool {
        self.message.is_some()
    }

    /// The severity (0 emergency .. 7 debug), when the message has one.
    pub fn severity(&self) -> Option<u8> {
        self.message
            .as_ref()
            .and_then(|m| m.severity)
            .map(|s| s as u8)
    }

    /// Writes the record (one line of JSON) to `out`; `cut` marks a message cut at the limit.
    pub fn write(&self, out: &mut Vec<u8>, ctx: &Context<'_>, cut: bool) {
        out.push(b'{');
        match &self.message {
            Some(m) => write_message(out, m),
            None => {
                field(out, "message", self.text);
                out.extend_from_slice(b",\"unparsed\":true");
            }
        }
        out.extend_from_slice(b",\"received\":");
        out.extend_from_slice(ctx.received.as_bytes());
        out.extend_from_slice(b",\"peer\":");
        out.extend_from_slice(ctx.peer.as_bytes());
        if cut {
            out.extend_from_slice(b",\"truncated\":true");
        }
        out.extend_from_slice(ctx.labels.as_bytes());
        out.push(b'}');
    }
}

fn write_message(out: &mut Vec<u8>, m: &Message<&str>) {
    // `message` first, so the record always starts with a field (the others are optional).
    field(out, "message", m.msg);
    if let Some(t) = m.timestamp {
        out.extend_from_slice(b",\"time\":");
        string(out, &time(t));
    }
    let optional = [
        ("host", m.hostname),
        ("app", m.appname),
        ("msgid", m.msgid),
        ("facility", m.facility.map(|f| f.as_str())),
        ("severity", m.severity.map(|s| s.as_str())),
    ];
    for (name, value) in optional {
        if let Some(v) = value {
            out.push(b',');
            field(out, name, v);
        }
    }
    if let Some(p) = &m.procid {
        out.extend_from_slice(b",\"procid\":");
        string(out, &p.to_string());
    }
    if !m.structured_data.is_empty() {
        out.extend_from_slice(b",\"structured_data\":{");
        for (i, e) in m.structured_data.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            string(out, e.id);
            out.extend_from_slice(b":{");
            for (j, (k, v)) in e.params.iter().enumerate() {
                if j > 0 {
                    out.push(b',');
                }
                field(out, k, v);
            }
            out.push(b'}');
        }
        out.push(b'}');
    }
    out.extend_from_slice(match m.protocol {
        Protocol::RFC3164 => b",\"protocol\":\"rfc3164\"",
        Protocol::RFC5424(_) => b",\"protocol\":\"rfc5424\"",
    });
}

fn field(out: &mut Vec<u8>, name: &str, value: &str) {
    string(out, name);
    out.push(b':');
    string(out, value);
}

/// `s` as a JSON string (escaped; never holds a raw newline).
pub fn string(out: &mut Vec<u8>, s: &str) {
    // Writing a `str` into a `Vec` cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

fn time(t: DateTime<FixedOffset>) -> String {
    t.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// `<PRI>`: `<`, one to three digits, `>`. Without it a line is not taken for syslog: the loose
/// RFC 3164 grammar would read any text's first word as a host name.
fn has_pri(text: &str) -> bool {
    let b = text.as_bytes();
    let digits = b
        .iter()
        .skip(1)
        .take(4)
        .take_while(|c| c.is_ascii_digit())
        .count();
    b.first() == Some(&b'<') && (1..=3).contains(&digits) && b.get(1 + digits) == Some(&b'>')
}

/// The year of an RFC 3164 time (month, day, ...): this year's, unless that puts it more than a
/// month ahead of now (a December message read in January is last year's), or it is January's
/// read in December (a sender whose clock is ahead).
fn year_of((month, ..): syslog_loose::IncompleteDate) -> i32 {
    let now = Local::now();
    let (year, this) = (now.year(), now.month());
    if month > this + 1 {
        year - 1
    } else if month == 1 && this == 12 {
        year + 1
    } else {
        year
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn record(text: &str, cut: bool) -> Value {
        let mut out = Vec::new();
        let ctx = Context {
            received: "\"2026-12-02T10:00:00.000Z\"",
            peer: "\"127.0.0.1:5000\"",
            labels: ",\"labels\":{\"site\":\"a\"}",
        };
        Parsed::new(text).write(&mut out, &ctx, cut);
        assert!(!out.contains(&b'\n'), "one line");
        serde_json::from_slice(&out)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out)))
    }

    #[test]
    fn rfc5424_with_structured_data() {
        let r = record(
            r#"<165>1 2003-10-11T22:14:15.003Z mymachine.example.com evntslog 1234 ID47 [exampleSDID@32473 iut="3" eventSource="Application"] An application event"#,
            false,
        );
        assert_eq!(
            r,
            json!({
                "message": "An application event",
                "time": "2003-10-11T22:14:15.003Z",
                "host": "mymachine.example.com",
                "app": "evntslog",
                "procid": "1234",
                "msgid": "ID47",
                "facility": "local4",
                "severity": "notice",
                "structured_data": {"exampleSDID@32473": {"iut": "3", "eventSource": "Application"}},
                "protocol": "rfc5424",
                "received": "2026-12-02T10:00:00.000Z",
                "peer": "127.0.0.1:5000",
                "labels": {"site": "a"},
            })
        );
        assert_eq!(Parsed::new("<165>1 - - - - - - x").severity(), Some(5));
    }

    #[test]
    fn rfc3164_in_local_time_of_this_year() {
        let r = record(
            "<34>Oct 11 22:14:15 mymachine su[99]: 'su root' failed",
            true,
        );
        assert_eq!(r["message"], "'su root' failed");
        assert_eq!(r["host"], "mymachine");
        assert_eq!(r["app"], "su");
        assert_eq!(r["procid"], "99");
        assert_eq!(r["facility"], "auth");
        assert_eq!(r["severity"], "crit");
        assert_eq!(r["protocol"], "rfc3164");
        assert_eq!(r["truncated"], true);
        let t = DateTime::parse_from_rfc3339(r["time"].as_str().unwrap()).unwrap();
        let local = t.with_timezone(&Local);
        assert_eq!((local.month(), local.day()), (10, 11));
        let year = Local::now().year();
        assert!((year - 1..=year).contains(&local.year()));
    }

    #[test]
    fn text_without_a_header_is_kept_whole_and_marked() {
        for text in ["plain text from a script", "<>x", "<1234>x", "<12 x"] {
            let p = Parsed::new(text);
            assert!(!p.is_parsed(), "{text}");
            assert_eq!(p.severity(), None);
            let r = record(text, false);
            assert_eq!(r["message"], text);
            assert_eq!(r["unparsed"], true);
            assert!(r.get("truncated").is_none());
        }
    }

    #[test]
    fn escapes_what_json_needs() {
        let r = record("<13>1 - h a - - - say \"hi\"\\\t\u{1}é", false);
        assert_eq!(r["message"], "say \"hi\"\\\t\u{1}é");
    }

    #[test]
    fn year_of_a_3164_time() {
        let now = Local::now();
        let (y, m) = (now.year(), now.month());
        assert_eq!(year_of((m, 1, 0, 0, 0)), y);
        if m <= 10 {
            assert_eq!(year_of((m + 2, 1, 0, 0, 0)), y - 1);
        }
    }
}
