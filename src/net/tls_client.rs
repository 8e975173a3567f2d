//! The client side of TLS for every outgoing connection that is not reqwest's: the settings of a
//! `tls` block ([`TlsConfig`]: a CA bundle instead of the system's roots, a client certificate and
//! key, the server name), shared by the `http` sink (which hands them to reqwest), the broker sinks
//! and the mqtt source, and the rustls client settings made from them ([`client_config`], errors
//! naming the setting). Compiled by `config`.

#[cfg(any(feature = "mqtt", feature = "nats", feature = "kafka"))]
use crate::setting::SettingError;

/// A `tls` block of an outgoing connection.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsConfig {
    /// Trust only this CA bundle (PEM) instead of the system's roots.
    pub ca_file: Option<std::path::PathBuf>,
    /// Client certificate and key (PEM) for mutual TLS; both or neither.
    pub client_cert: Option<std::path::PathBuf>,
    pub client_key: Option<std::path::PathBuf>,
    /// The name the server's certificate is checked against (and sent as SNI) when the URL's host
    /// is an address or another name.
    pub server_name: Option<String>,
}

#[cfg(any(feature = "mqtt", feature = "nats", feature = "kafka"))]
/// rustls settings: the CA file's roots (else the system's) and the client certificate.
pub fn client_config(tls: &TlsConfig) -> Result<rustls::ClientConfig, SettingError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    crate::net::client::install_crypto_provider();
    let mut roots = rustls::RootCertStore::empty();
    match &tls.ca_file {
        Some(ca) => {
            let bad =
                |m: String| SettingError::new("tls.ca_file", format!("{}: {m}", ca.display()));
            let pem = std::fs::read(ca).map_err(|e| bad(format!("cannot read: {e}")))?;
            for cert in CertificateDer::pem_slice_iter(&pem) {
                let cert = cert.map_err(|e| bad(format!("not a PEM certificate bundle: {e}")))?;
                roots
                    .add(cert)
                    .map_err(|e| bad(format!("not a usable CA certificate: {e}")))?;
            }
            if roots.is_empty() {
                return Err(bad("holds no PEM certificate".into()));
            }
        }
        None => {
            // Unreadable system certificates are skipped (as reqwest does); none at all leaves the
            // handshake to fail with a clear "unknown issuer".
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
        }
    }
    let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
    match (&tls.client_cert, &tls.client_key) {
        (Some(cert), Some(key)) => {
            let certs: Result<Vec<_>, _> = CertificateDer::pem_file_iter(cert)
                .map_err(|e| {
                    SettingError::new("tls.client_cert", format!("{}: {e}", cert.display()))
                })?
                .collect();
            let certs = certs.map_err(|e| {
                SettingError::new("tls.client_cert", format!("{}: {e}", cert.display()))
            })?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                SettingError::new("tls.client_key", format!("{}: {e}", key.display()))
            })?;
            builder.with_client_auth_cert(certs, key).map_err(|e| {
                SettingError::new(
                    "tls.client_cert",
                    format!("not a usable certificate and key: {e}"),
                )
            })
        }
        (None, None) => Ok(builder.with_no_client_auth()),
        (Some(_), None) => Err(SettingError::new(
            "tls.client_key",
            "missing: tls.client_cert needs it".into(),
        )),
        (None, Some(_)) => Err(SettingError::new(
            "tls.client_cert",
            "missing: tls.client_key needs it".into(),
        )),
    }
}
