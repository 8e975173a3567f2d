//! What the compiled settings of the edges share, below them: a setting that cannot be used
//! ([`SettingError`], which a sink or source reports when it reads its files: TLS certificates,
//! credentials) and a secret that is never shown ([`Secret`]). Made by the file shape (`shape`,
//! each component's `config.rs`), held by sinks and sources.

/// A password or token from the config, never shown by `Debug`.
#[cfg(any(feature = "mqtt", feature = "nats", feature = "kafka"))]
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

#[cfg(any(feature = "mqtt", feature = "nats", feature = "kafka"))]
impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<secret>")
    }
}

/// A setting that cannot be used, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{}{message}", .field, if .field.is_empty() { "" } else { ": " })]
pub struct SettingError {
    /// The setting's path within the entry (a sink, a source), e.g. `tls.ca_file`; empty for the sink as a whole.
    pub field: String,
    pub message: String,
}

impl SettingError {
    pub fn new(field: impl Into<String>, message: String) -> Self {
        SettingError {
            field: field.into(),
            message,
        }
    }
}
