//! How the operator's commands reach a running agent: its admin endpoint, at the address, with the
//! token and (for HTTPS) the certificate of the config's `admin:` section, or at `--admin URL`.
//! Requests are blocking for the command (a small runtime of their own). A connection refused or
//! no answer is [`AdminError::NotRunning`], so a command can fall back to the store; an answer is
//! the caller's to read. Used by `cli::task`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;

use crate::config::Config;

/// Every request: a local agent answers at once; a busy one within this.
const TIMEOUT: Duration = Duration::from_secs(30);

/// Where the running agent's admin endpoint is, beyond what the config says.
#[derive(Debug, Args, Default)]
pub struct AdminArgs {
    /// The admin endpoint's URL (default: from `admin.listen`, with https when `admin.tls` is set)
    #[arg(long, value_name = "URL")]
    pub admin: Option<String>,
    /// For HTTPS: trust this CA bundle (PEM; default: the certificates of `admin.tls.cert_file`)
    #[arg(long, value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// For mutual TLS: the client certificate (PEM) to present, with --key
    #[arg(long, value_name = "FILE", requires = "key")]
    pub cert: Option<PathBuf>,
    /// The client certificate's key (PEM)
    #[arg(long, value_name = "FILE", requires = "cert")]
    pub key: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// Nothing answers at the address: the agent is not running (or listens elsewhere).
    #[error("no agent answers at {0}")]
    NotRunning(String),
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

/// An answer: its status and body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: String,
}

pub struct AdminClient {
    base: String,
    /// For HTTPS: the CA file trusted and where it came from (`--ca`, or the default), to say
    /// which when the agent's certificate is not trusted.
    trust: Option<(PathBuf, &'static str)>,
    token: Option<String>,
    client: reqwest::Client,
    rt: tokio::runtime::Runtime,
}

impl AdminClient {
    pub fn new(config: &Config, args: &AdminArgs) -> anyhow::Result<AdminClient> {
        let admin = config.admin.as_ref();
        let base = match (&args.admin, admin) {
            (Some(url), _) => url.trim_end_matches('/').to_string(),
            (None, None) => anyhow::bail!(
                "{}: admin.enabled is false, so a running agent cannot be asked: pass --admin URL",
                config.source.display()
            ),
            (None, Some(a)) => {
                if a.listen.port() == 0 {
                    anyhow::bail!(
                        "{}: admin.listen has port 0 (chosen at start): pass --admin URL",
                        config.source.display()
                    );
                }
                let mut addr = a.listen;
                // An agent listening on every address answers on loopback.
                if addr.ip().is_unspecified() {
                    addr.set_ip(if addr.is_ipv4() {
                        std::net::Ipv4Addr::LOCALHOST.into()
                    } else {
                        std::net::Ipv6Addr::LOCALHOST.into()
                    });
                }
                let scheme = if a.tls.is_some() { "https" } else { "http" };
                format!("{scheme}://{addr}")
            }
        };
        let mut builder = crate::net::client::builder().timeout(TIMEOUT);
        let mut trust = None;
        if base.starts_with("https://") {
            trust = match &args.ca {
                Some(ca) => Some((ca.clone(), "--ca")),
                None => admin.and_then(|a| a.tls.as_ref()).map(|t| {
                    (
                        t.files.cert_file.clone(),
                        "admin.tls.cert_file, the default --ca",
                    )
                }),
            };
            let ca = trust.as_ref().map(|(f, _)| f.clone());
            builder = builder.use_preconfigured_tls(tls(ca, args)?);
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start a runtime")?;
        Ok(AdminClient {
            base,
            trust,
            token: admin
                .and_then(|a| a.token.as_ref())
                .map(|t| t.secret().to_string()),
            client: builder.build().context("cannot build an HTTP client")?,
            rt,
        })
    }

    pub fn get(&self, path: &str) -> Result<Answer, AdminError> {
        self.send(self.client.get(self.url(path)))
    }

    /// A GET that gives up after `within` (a side question, not worth the default's wait).
    pub fn get_within(&self, path: &str, within: Duration) -> Result<Answer, AdminError> {
        self.send(self.client.get(self.url(path)).timeout(within))
    }

    pub fn post(&self, path: &str, body: String) -> Result<Answer, AdminError> {
        self.send(self.client.post(self.url(path)).body(body))
    }

    /// A POST answered 200 with JSON; another answer is an error with the agent's reason.
    pub fn post_json(&self, path: &str, body: String) -> anyhow::Result<serde_json::Value> {
        let a = self.post(path, body)?;
        let v: serde_json::Value = serde_json::from_str(&a.body).unwrap_or_default();
        if a.status != 200 {
            let why = v["error"]
                .as_str()
                .map_or_else(|| a.body.trim().to_string(), str::to_string);
            anyhow::bail!("{why} ({} answered {})", self.base, a.status);
        }
        Ok(v)
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn send(&self, mut req: reqwest::RequestBuilder) -> Result<Answer, AdminError> {
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        self.rt.block_on(async {
            let answer = req.send().await.map_err(|e| {
                // A failed handshake reads as a failed connection: say what failed instead. (A
                // client certificate refused, with TLS 1.3, comes at the answer: told below.)
                if let Some(tls) = tls_error(&e).filter(|t| {
                    e.is_connect() || matches!(t, rustls::Error::InvalidCertificate(_))
                }) {
                    AdminError::Other(anyhow::anyhow!("{}: {}", self.base, self.untrusted(tls)))
                } else if e.is_connect() {
                    AdminError::NotRunning(self.base.clone())
                } else if e.is_timeout() {
                    AdminError::Other(anyhow::anyhow!(
                        "{}: no answer within {}s (what was asked may have been done: look before asking again)",
                        self.base,
                        TIMEOUT.as_secs()
                    ))
                } else {
                    AdminError::Other(anyhow::anyhow!(
                        "{}: {}",
                        self.base,
                        crate::net::client::chain(&e)
                    ))
                }
            })?;
            let status = answer.status().as_u16();
            let body = answer
                .text()
                .await
                .with_context(|| format!("{}: the answer broke off", self.base))?;
            if status == 401 {
                return Err(AdminError::Other(anyhow::anyhow!(
                    "{}: refused (401): admin.token in the config is not the running agent's",
                    self.base
                )));
            }
            Ok(Answer { status, body })
        })
    }
}

impl AdminClient {
    /// What failed in a TLS handshake, for the operator: which name or which CA file when the
    /// agent's certificate is not trusted.
    fn untrusted(&self, e: &rustls::Error) -> String {
        use rustls::CertificateError as C;
        let (ca, from) = self
            .trust
            .as_ref()
            .map_or(("(none)".into(), "--ca"), |(f, from)| {
                (f.display().to_string(), *from)
            });
        let host = reqwest::Url::parse(&self.base)
            .ok()
            .and_then(|u| u.host_str().map(str::to_string))
            .unwrap_or_default();
        match e {
            rustls::Error::InvalidCertificate(C::UnknownIssuer | C::BadSignature) => format!(
                "the agent's certificate is not trusted: no certificate in {ca} ({from}) signed it \
                 (when admin.tls.cert_file is signed by a CA, pass that CA with --ca)"
            ),
            rustls::Error::InvalidCertificate(
                C::NotValidForName | C::NotValidForNameContext { .. },
            ) => format!(
                "the agent's certificate is not valid for the name {host} (connect by a name or \
                 address it was issued for, with --admin URL): {e}"
            ),
            rustls::Error::InvalidCertificate(_) => {
                format!("the agent's certificate is not trusted ({ca}, {from}): {e}")
            }
            _ => format!("TLS handshake failed: {e}"),
        }
    }
}

/// The rustls error under a request's error, if the TLS handshake is what failed. It sits inside
/// `io::Error`s (one in another), whose `source()` skips the error they wrap: an `io::Error`'s
/// next link is its inner error itself.
fn tls_error(e: &reqwest::Error) -> Option<&rustls::Error> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    // Bounded: a chain is a handful of links.
    for _ in 0..16 {
        let c = cur?;
        if let Some(t) = c.downcast_ref::<rustls::Error>() {
            return Some(t);
        }
        cur = match c.downcast_ref::<std::io::Error>() {
            Some(io) => io
                .get_ref()
                .map(|inner| inner as &(dyn std::error::Error + 'static)),
            None => c.source(),
        };
    }
    None
}

/// rustls settings trusting `ca` (PEM certificates) and presenting `--cert`/`--key`.
fn tls(ca: Option<PathBuf>, args: &AdminArgs) -> anyhow::Result<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let ca = ca.context("the admin endpoint serves https: pass --ca FILE")?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in
        CertificateDer::pem_file_iter(&ca).with_context(|| format!("--ca {}", ca.display()))?
    {
        let cert = cert.with_context(|| format!("--ca {}", ca.display()))?;
        roots
            .add(cert)
            .with_context(|| format!("--ca {}: not a usable certificate", ca.display()))?;
    }
    let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
    Ok(match (&args.cert, &args.key) {
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .and_then(|c| c.collect::<Result<Vec<_>, _>>())
                .with_context(|| format!("--cert {}", cert.display()))?;
            let key = PrivateKeyDer::from_pem_file(key)
                .with_context(|| format!("--key {}", key.display()))?;
            builder
                .with_client_auth_cert(chain, key)
                .context("--cert and --key do not go together")?
        }
        _ => builder.with_no_client_auth(),
    })
}
