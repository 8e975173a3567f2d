//! The file shape every source kind shares, below the kinds: the `stream` an entry names checked
//! against the file's streams, and lists of regexes compiled with each bad one named. Each kind's
//! `config.rs` calls these.

use crate::shape::Problems;

/// `stream` must be one of `streams`.
pub fn check_stream(stream: &str, streams: &[&str], err: &mut Problems<'_>) {
    if !streams.contains(&stream) {
        let known = if streams.is_empty() {
            "none".to_string()
        } else {
            streams.join(", ")
        };
        err.add(
            "stream",
            format!("stream {stream:?} is not defined under streams: (defined: {known})"),
        );
    }
}

/// `list` compiled, each bad one named as `field[i]`.
pub fn regexes(field: &str, list: &[String], err: &mut Problems<'_>) -> Vec<regex_lite::Regex> {
    let mut out = Vec::new();
    for (i, r) in list.iter().enumerate() {
        match regex_lite::Regex::new(r) {
            Ok(re) => out.push(re),
            Err(e) => err.add(&format!("{field}[{i}]"), format!("bad regex {r:?}: {e}")),
        }
    }
    out
}
