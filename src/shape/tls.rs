//! The `tls` block of an entry that connects out (a sink, the mqtt source): its file shape
//! ([`TlsSpec`]) and how it becomes the `net::tls_client::TlsConfig` the connection is made with,
//! files read from the config file's directory. It reads no file itself: the client does, when it
//! is built.

use std::path::Path;

use serde::Deserialize;

use crate::net::tls_client::TlsConfig;

/// TLS for `https://` URLs (rustls; the system's roots unless `ca_file` is set).
#[derive(Debug, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct TlsSpec {
    /// PEM bundle of the CAs to trust instead of the system's. Relative to the config file.
    #[serde(default)]
    pub ca_file: Option<String>,
    /// PEM client certificate for mutual TLS (with `client_key`).
    #[serde(default)]
    pub client_cert: Option<String>,
    /// PEM private key of `client_cert`.
    #[serde(default)]
    pub client_key: Option<String>,
    /// The name the server certificate must carry (and the SNI sent), when the URL's host differs.
    #[serde(default)]
    pub server_name: Option<String>,
}

#[cfg(any(feature = "mqtt", feature = "nats"))]
/// The `tls` block for a connection that uses TLS (`tls`), its files read from `base`; set on a
/// connection without TLS, it is refused (`scheme` names the TLS URL scheme).
pub fn client(
    spec: TlsSpec,
    tls: bool,
    scheme: &str,
    base: &Path,
    err: &mut super::Problems<'_>,
) -> Option<TlsConfig> {
    let set = spec.ca_file.is_some()
        || spec.client_cert.is_some()
        || spec.client_key.is_some()
        || spec.server_name.is_some();
    if set && !tls {
        err.add("tls", format!("applies to {scheme}:// URLs only"));
    }
    tls.then(|| files(spec, base))
}

/// The `tls` block of an entry that always may use TLS (an `http` sink, whose URL or probe says),
/// its files read from `base`.
pub fn files(spec: TlsSpec, base: &Path) -> TlsConfig {
    let file = |p: Option<String>| p.map(|p| base.join(p));
    TlsConfig {
        ca_file: file(spec.ca_file),
        client_cert: file(spec.client_cert),
        client_key: file(spec.client_key),
        server_name: spec.server_name,
    }
}
