//! One MQTT message made one JSON record: `topic`, `payload` (the JSON value itself when the
//! payload is JSON, else a string; a payload that is not UTF-8 as base64 with
//! `"encoding":"base64"`), `qos`, `retain`, `received` (when colibri read it) and `labels`. Owns
//! the record's shape; does not read the network. Called by the session driver.

use base64::Engine as _;

/// What a payload was kept as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    Json,
    Text,
    Base64,
}

/// Writes the record of one message to `out` (one line: a JSON payload's line breaks, which can
/// only be whitespace between its tokens, are written as spaces). `received` is an RFC 3339 time
/// (nothing in it to escape); `labels` comes rendered: `,"labels":{...}` or nothing.
pub fn write(
    out: &mut Vec<u8>,
    topic: &str,
    payload: &[u8],
    qos: u8,
    retain: bool,
    received: &str,
    labels: &str,
) -> Kept {
    out.extend_from_slice(b"{\"topic\":\"");
    crate::record::json::escape_into(out, topic);
    out.extend_from_slice(b"\",\"payload\":");
    let kept = if is_json(payload) {
        let start = out.len();
        out.extend_from_slice(trim(payload));
        for b in &mut out[start..] {
            if matches!(*b, b'\n' | b'\r') {
                *b = b' ';
            }
        }
        Kept::Json
    } else if let Ok(text) = std::str::from_utf8(payload) {
        out.push(b'"');
        crate::record::json::escape_into(out, text);
        out.push(b'"');
        Kept::Text
    } else {
        out.push(b'"');
        let start = out.len();
        let len = base64::encoded_len(payload.len(), true).unwrap_or(0);
        out.resize(start + len, 0);
        let written = base64::engine::general_purpose::STANDARD
            .encode_slice(payload, &mut out[start..])
            .unwrap_or(0);
        out.truncate(start + written);
        out.extend_from_slice(b"\",\"encoding\":\"base64\"");
        Kept::Base64
    };
    out.extend_from_slice(b",\"qos\":");
    out.push(b'0' + qos.min(2));
    out.extend_from_slice(if retain {
        b",\"retain\":true"
    } else {
        b",\"retain\":false"
    });
    out.extend_from_slice(b",\"received\":\"");
    out.extend_from_slice(received.as_bytes());
    out.push(b'"');
    out.extend_from_slice(labels.as_bytes());
    out.push(b'}');
    kept
}

/// A whole JSON value (an object, array, string, number, `true`, `false` or `null`), nothing
/// after it but whitespace.
fn is_json(payload: &[u8]) -> bool {
    let t = trim(payload);
    // Cheap refusal first: most text payloads do not start like JSON.
    let starts = t.first().is_some_and(|b| {
        matches!(
            b,
            b'{' | b'[' | b'"' | b'-' | b'0'..=b'9' | b't' | b'f' | b'n'
        )
    });
    starts && serde_json::from_slice::<serde::de::IgnoredAny>(t).is_ok()
}

fn trim(b: &[u8]) -> &[u8] {
    b.trim_ascii()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn record(payload: &[u8], retain: bool) -> (Value, Kept) {
        let mut out = Vec::new();
        let labels = format!(
            ",{}",
            crate::record::labels_field(&[("site".into(), "a\"b".into())]).unwrap()
        );
        let k = write(
            &mut out,
            "plant/line-1/temp",
            payload,
            1,
            retain,
            "2026-12-03T07:00:00.000Z",
            &labels,
        );
        assert!(
            !out.contains(&b'\n'),
            "one line: {}",
            String::from_utf8_lossy(&out)
        );
        (serde_json::from_slice(&out).unwrap(), k)
    }

    #[test]
    fn json_payloads_stay_json_text_is_a_string_and_binary_is_base64() {
        let (r, k) = record(b"{\"t\": 21.5,\n \"unit\": \"C\"}\n", false);
        assert_eq!(k, Kept::Json);
        assert_eq!(r["payload"], json!({"t": 21.5, "unit": "C"}));
        assert_eq!(r["topic"], "plant/line-1/temp");
        assert_eq!(
            (r["qos"].clone(), r["retain"].clone()),
            (json!(1), json!(false))
        );
        assert_eq!(r["received"], "2026-12-03T07:00:00.000Z");
        assert_eq!(r["labels"], json!({"site": "a\"b"}));
        assert!(r.get("encoding").is_none());

        let (r, k) = record(b"42", true);
        assert_eq!(
            (k, r["payload"].clone(), r["retain"].clone()),
            (Kept::Json, json!(42), json!(true))
        );

        let (r, k) = record(b"pump 3 on\n\"quoted\"", false);
        assert_eq!(
            (k, r["payload"].clone()),
            (Kept::Text, json!("pump 3 on\n\"quoted\""))
        );
        let (r, k) = record(b"{not json", false);
        assert_eq!((k, r["payload"].clone()), (Kept::Text, json!("{not json")));
        let (r, k) = record(b"", false);
        assert_eq!((k, r["payload"].clone()), (Kept::Text, json!("")));

        let (r, k) = record(&[0xff, 0x00, 0x10, 0x80], false);
        assert_eq!(k, Kept::Base64);
        assert_eq!(r["payload"], "/wAQgA==");
        assert_eq!(r["encoding"], "base64");
    }
}
