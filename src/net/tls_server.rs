//! rustls server settings for a listener from its `tls` block: the certificate chain and key
//! (PEM files), and when a client CA is given, client certificates required and checked against
//! it (mutual TLS). Errors name the setting and the file. [`ServerTls`] holds what was read where
//! a reload can replace it: new handshakes take the new certificate, connections already open
//! keep theirs. Used by the syslog source's TCP listener and by the ingest and admin listeners
//! (through `net::server`); it knows nothing of what a listener serves.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A setting of the `tls` block that cannot be used, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsError {
    /// `cert_file`, `key_file` or `client_ca_file`.
    pub field: &'static str,
    pub message: String,
}

fn bad(field: &'static str, path: &Path, what: impl std::fmt::Display) -> TlsError {
    TlsError {
        field,
        message: format!("{}: {what}", path.display()),
    }
}

/// Reads the files now (a listener's TLS settings are checked when the config is).
pub fn server_config(
    cert_file: &Path,
    key_file: &Path,
    client_ca_file: Option<&Path>,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    super::client::install_crypto_provider();
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_file)
        .map_err(|e| bad("cert_file", cert_file, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| bad("cert_file", cert_file, e))?;
    if certs.is_empty() {
        return Err(bad("cert_file", cert_file, "holds no PEM certificate"));
    }
    let key = PrivateKeyDer::from_pem_file(key_file).map_err(|e| bad("key_file", key_file, e))?;
    let builder = rustls::ServerConfig::builder();
    let builder = match client_ca_file {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in
                CertificateDer::pem_file_iter(ca).map_err(|e| bad("client_ca_file", ca, e))?
            {
                let cert = cert.map_err(|e| bad("client_ca_file", ca, e))?;
                roots.add(cert).map_err(|e| {
                    bad(
                        "client_ca_file",
                        ca,
                        format!("not a usable CA certificate: {e}"),
                    )
                })?;
            }
            if roots.is_empty() {
                return Err(bad("client_ca_file", ca, "holds no PEM certificate"));
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots))
                .build()
                .map_err(|e| bad("client_ca_file", ca, e))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder.with_single_cert(certs, key).map_err(|e| {
        bad(
            "key_file",
            key_file,
            format!("does not go with cert_file: {e}"),
        )
    })?;
    Ok(Arc::new(config))
}

/// The files of a listener's `tls` block (paths as the config resolved them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub client_ca_file: Option<PathBuf>,
}

/// A listener's TLS settings, read from [`TlsFiles`], shared by its clones so that the running
/// listener sees what [`ServerTls::replace_with`] puts in. Equal when the files are: a reload
/// with the same files reads them again and replaces the settings, other files need a restart.
#[derive(Clone)]
pub struct ServerTls {
    pub files: TlsFiles,
    current: Arc<ArcSwap<rustls::ServerConfig>>,
}

impl ServerTls {
    /// Reads the files now.
    pub fn load(files: TlsFiles) -> Result<ServerTls, TlsError> {
        let config = server_config(
            &files.cert_file,
            &files.key_file,
            files.client_ca_file.as_deref(),
        )?;
        Ok(ServerTls {
            files,
            current: Arc::new(ArcSwap::new(config)),
        })
    }

    /// The files without reading them, for a command that serves nothing: the operator commands
    /// only need `files` (the admin client trusts `cert_file`), and whoever runs them may not be
    /// allowed to read the key. No certificate is loaded, so a handshake with these settings
    /// fails: they cannot serve by mistake.
    pub fn unread(files: TlsFiles) -> ServerTls {
        super::client::install_crypto_provider();
        let config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(NoCertificate));
        ServerTls {
            files,
            current: Arc::new(ArcSwap::new(Arc::new(config))),
        }
    }

    /// The settings for the next handshake.
    pub fn config(&self) -> Arc<rustls::ServerConfig> {
        self.current.load_full()
    }

    /// Takes the settings `newer` read (the same files, read again by a reload): the listener's
    /// next handshakes use them.
    pub fn replace_with(&self, newer: &ServerTls) {
        self.current.store(newer.config());
    }
}

/// The certificate of [`ServerTls::unread`] settings: none.
#[derive(Debug)]
struct NoCertificate;

impl rustls::server::ResolvesServerCert for NoCertificate {
    fn resolve(
        &self,
        _: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        None
    }
}

impl PartialEq for ServerTls {
    fn eq(&self, other: &ServerTls) -> bool {
        self.files == other.files
    }
}

impl Eq for ServerTls {}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}
