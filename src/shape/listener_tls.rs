//! The `tls` block of a listener (the syslog source's TCP listener, `ingest`, `admin`): its file
//! shape and its compilation into the listener's rustls settings, with problems named by field
//! and file. Reading the files is `crate::net::tls_server`'s; called by the sections that have a
//! listener.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::Problems;
use crate::net::tls_server::{ServerTls, TlsFiles};

/// A listener's certificate, and the CA its clients' certificates must be signed by.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ListenerTlsSpec {
    /// The server's certificate chain (PEM), leaf first. Relative paths are read from the config
    /// file's directory. Read when the config is checked or loaded, and again at each reload
    /// (SIGHUP): a replaced certificate is taken by new connections (syslog: when the source
    /// restarts), open ones keep theirs.
    pub cert_file: PathBuf,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// When set, a client must present a certificate signed by this CA (PEM bundle): mutual TLS.
    #[serde(default)]
    pub client_ca_file: Option<PathBuf>,
}

/// Reads the block's files (relative to `base`); problems go to `tls.<field>` under `err`. For a
/// command that serves nothing the files are only named ([`ServerTls::unread`]).
pub fn compile(spec: ListenerTlsSpec, base: &Path, err: &mut Problems<'_>) -> Option<ServerTls> {
    let files = TlsFiles {
        cert_file: base.join(&spec.cert_file),
        key_file: base.join(&spec.key_file),
        client_ca_file: spec.client_ca_file.map(|c| base.join(c)),
    };
    if !err.read_keys() {
        return Some(ServerTls::unread(files));
    }
    ServerTls::load(files)
        .map_err(|e| err.add(&format!("tls.{}", e.field), e.message))
        .ok()
}
