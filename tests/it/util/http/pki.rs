//! A throw-away PKI for the TLS tests: CA, server and client certificates in a directory (rcgen).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// A throw-away PKI in a directory: a CA, a server certificate for `localhost` and `127.0.0.1`
/// and a client certificate both signed by it, and a second, unrelated CA with a client
/// certificate of its own. Every path is a PEM file; keys are PKCS#8.
pub struct TestPki {
    pub dir: PathBuf,
    /// `ca.pem`: the CA that signed the server and client certificates.
    pub ca: PathBuf,
    /// `server.pem` / `server.key`: for DNS `localhost` and IP `127.0.0.1`.
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    /// `client.pem` / `client.key`: a client certificate signed by the CA.
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// `other-ca.pem`: a CA that signed neither of the above.
    pub other_ca: PathBuf,
    /// `other-client.pem` / `other-client.key`: a client certificate signed by the other CA.
    pub other_client_cert: PathBuf,
    pub other_client_key: PathBuf,
    ca_der: CertificateDer<'static>,
    server_der: CertificateDer<'static>,
    server_key_der: Vec<u8>,
}

impl TestPki {
    /// Generates everything (ECDSA P-256, valid 1975-4096) and writes it into `dir`.
    pub fn generate(dir: &Path) -> TestPki {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
            KeyPair, KeyUsagePurpose,
        };

        fn ca(name: &str) -> (rcgen::Certificate, Issuer<'static, KeyPair>) {
            let mut params = CertificateParams::new(Vec::<String>::new()).expect("no names");
            params.distinguished_name = rcgen::DistinguishedName::new();
            params.distinguished_name.push(DnType::CommonName, name);
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.key_usages = vec![
                KeyUsagePurpose::KeyCertSign,
                KeyUsagePurpose::CrlSign,
                KeyUsagePurpose::DigitalSignature,
            ];
            let key = KeyPair::generate().expect("generate a CA key");
            let cert = params.self_signed(&key).expect("self-sign the CA");
            (cert, Issuer::new(params, key))
        }

        fn leaf(
            name: &str,
            sans: &[&str],
            purpose: ExtendedKeyUsagePurpose,
            issuer: &Issuer<'static, KeyPair>,
        ) -> (rcgen::Certificate, KeyPair) {
            let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
            let mut params = CertificateParams::new(sans).expect("valid names");
            params.distinguished_name = rcgen::DistinguishedName::new();
            params.distinguished_name.push(DnType::CommonName, name);
            params.use_authority_key_identifier_extension = true;
            params.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            params.extended_key_usages = vec![purpose];
            let key = KeyPair::generate().expect("generate a key");
            let cert = params.signed_by(&key, issuer).expect("sign a certificate");
            (cert, key)
        }

        let (ca_cert, ca_issuer) = ca("colibri test CA");
        let (other_cert, other_issuer) = ca("colibri unrelated test CA");
        let (server, server_key) = leaf(
            "localhost",
            &["localhost", "127.0.0.1"],
            ExtendedKeyUsagePurpose::ServerAuth,
            &ca_issuer,
        );
        let (client, client_key) = leaf(
            "colibri test client",
            &[],
            ExtendedKeyUsagePurpose::ClientAuth,
            &ca_issuer,
        );
        let (other_client, other_client_key) = leaf(
            "colibri unrelated test client",
            &[],
            ExtendedKeyUsagePurpose::ClientAuth,
            &other_issuer,
        );

        let write = |name: &str, pem: String| {
            let path = dir.join(name);
            std::fs::write(&path, pem).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
            path
        };
        TestPki {
            dir: dir.to_path_buf(),
            ca: write("ca.pem", ca_cert.pem()),
            server_cert: write("server.pem", server.pem()),
            server_key: write("server.key", server_key.serialize_pem()),
            client_cert: write("client.pem", client.pem()),
            client_key: write("client.key", client_key.serialize_pem()),
            other_ca: write("other-ca.pem", other_cert.pem()),
            other_client_cert: write("other-client.pem", other_client.pem()),
            other_client_key: write("other-client.key", other_client_key.serialize_pem()),
            ca_der: ca_cert.der().clone(),
            server_der: server.der().clone(),
            server_key_der: server_key.serialize_der(),
        }
    }

    /// The CA certificate (DER), e.g. for a test's own TLS client.
    pub fn ca_der(&self) -> CertificateDer<'static> {
        self.ca_der.clone()
    }

    pub(super) fn server_config(&self, require_client_cert: bool) -> rustls::ServerConfig {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions");
        let builder = if require_client_cert {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(self.ca_der()).expect("the CA certificate parses");
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .expect("a client verifier");
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.server_key_der.clone()));
        builder
            .with_single_cert(vec![self.server_der.clone()], key)
            .expect("the server certificate and key match")
    }
}

/// A TLS client's settings for the test PKIs: trusts the CA in `ca` (a PEM file) and presents
/// `client` (certificate and key files) when given.
pub fn client_config(ca: &Path, client: Option<(&Path, &Path)>) -> Arc<rustls::ClientConfig> {
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    Arc::new(match client {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_file_iter(cert)
                    .unwrap()
                    .map(|c| c.unwrap())
                    .collect(),
                PrivateKeyDer::from_pem_file(key).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    })
}
