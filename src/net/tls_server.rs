//! rustls server settings for a listener from its `tls` block: the certificate chain and key
//! (PEM files), and when a client CA is given, client certificates required and checked against
//! it (mutual TLS). Errors name the setting and the file. Used by the syslog source's TCP
//! listener; it knows nothing of what the listener serves.

use std::path::Path;
use std::sync::Arc;

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
