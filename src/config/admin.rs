//! The `admin:` section: its file shape (`AdminSpec`), the compiled value the admin endpoint is
//! started with (`AdminConfig`), and the checks between them (a loopback address unless remote
//! access is allowed, and then a token). It does not serve anything: `crate::admin` does, with the
//! value compiled here. Called by `config::compile`.

use super::Problems;
use std::net::SocketAddr;

use serde::Deserialize;

use super::yes;
use crate::net::tls_server::ServerTls;
use crate::net::token::Token;
use crate::shape::listener_tls::ListenerTlsSpec;

/// Where the admin endpoint listens when `admin.listen` is not set.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9464";

/// The compiled `admin:` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminConfig {
    pub listen: SocketAddr,
    pub token: Option<Token>,
    /// HTTPS instead of HTTP.
    pub tls: Option<ServerTls>,
}

/// `admin:` settings.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct AdminSpec {
    /// Serve the admin endpoint. Default true.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// `address:port` to listen on. Default `127.0.0.1:9464`. An address other than loopback
    /// (127.0.0.0/8, ::1) needs `allow_remote: true` and a `token`.
    #[serde(default)]
    pub listen: Option<String>,
    /// Allow a non-loopback `listen` address (then `token` is required). Default false.
    #[serde(default)]
    pub allow_remote: bool,
    /// When set, `GET /metrics` and `POST /-/reload` need `Authorization: Bearer <token>`
    /// (`/healthz` and `/readyz` never do). Never logged.
    #[serde(default)]
    pub token: Option<String>,
    /// Serve HTTPS: `cert_file`, `key_file`, and `client_ca_file` to require client certificates
    /// (mutual TLS). The files are read again at each reload (SIGHUP): new connections get a
    /// replaced certificate, open ones keep theirs. A token is still required off loopback.
    #[serde(default)]
    pub tls: Option<ListenerTlsSpec>,
}

pub(super) fn compile_admin(
    spec: Option<AdminSpec>,
    base: &std::path::Path,
    err: &mut Problems<'_>,
) -> Option<AdminConfig> {
    let spec = spec.unwrap_or(AdminSpec {
        enabled: true,
        listen: None,
        allow_remote: false,
        token: None,
        tls: None,
    });
    if !spec.enabled {
        return None;
    }
    let text = spec.listen.as_deref().unwrap_or(DEFAULT_LISTEN);
    let listen: std::net::SocketAddr = match text.parse() {
        Ok(a) => a,
        Err(_) => {
            err.add(
                "admin.listen",
                format!("{text:?} is not an address:port such as 127.0.0.1:9464"),
            );
            return None;
        }
    };
    if !listen.ip().is_loopback() && !spec.allow_remote {
        err.add(
            "admin.listen",
            format!(
                "{listen} is not a loopback address: set admin.allow_remote: true (and a token) to serve metrics and reload beyond this machine"
            ),
        );
    }
    if spec.allow_remote && spec.token.as_deref().is_none_or(str::is_empty) {
        err.add(
            "admin.token",
            "is required with allow_remote: true (Authorization: Bearer <token>)".into(),
        );
    }
    let tls = spec
        .tls
        .and_then(|t| crate::shape::listener_tls::compile(t, base, &mut err.under("admin")));
    Some(AdminConfig {
        listen,
        token: spec.token.filter(|t| !t.is_empty()).map(Token::new),
        tls,
    })
}
