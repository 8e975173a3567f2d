//! The file shape's toolkit, below the edges: what every component's `config.rs` reads its entry
//! with. The problem reporter ([`Problems`]), durations and sizes as written ([`units`]), every
//! problem of an entry at once ([`de_all`]), a string YAML may have typed otherwise ([`scalar`]),
//! an outgoing connection's and a listener's `tls` block ([`tls`], [`listener_tls`]), URLs
//! ([`url`]), report by exception's `deadband` and `heartbeat` ([`deadband`]), a broker
//! connection's default name (`client_name`), an I/O error in words
//! ([`io_reason`]) and the refusal of a component left out of the build ([`built_without`]). It
//! knows no component and no YAML: `config` parses the file and hands each component its entry as
//! a JSON value; the compiled values it makes are the layers' below (`net`, `setting`, `scrape`).

#[cfg(any(feature = "mqtt", feature = "nats", feature = "kafka"))]
pub mod client_name;
pub mod de_all;
pub mod deadband;
pub mod listener_tls;
pub mod problems;
pub mod scalar;
pub mod tls;
pub mod units;
pub mod url;

pub use de_all::de_all;
pub use problems::{Problem, Problems};

/// An I/O error in words for a problem: the common kinds plainly, the rest as the system says.
pub fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => e.to_string(),
    }
}

/// What an entry of a `type:` this binary was built without says, at `type` (`what`: the
/// component's word, `sink`, `source`, `task`; `feature`: the cargo feature that builds it in).
#[allow(
    dead_code,
    reason = "only a build without some component refuses one; `allow`: which build that is varies"
)]
pub fn built_without(err: &mut Problems<'_>, what: &str, kind: &str, feature: &str) {
    err.add(
        "type",
        format!("this colibri was built without the {kind} {what} (cargo feature {feature})"),
    );
}
