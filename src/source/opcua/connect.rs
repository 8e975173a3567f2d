//! One connection to an OPC UA server ([`open`]): colibri's client (its application
//! certificate and key in the pki directory, generated on first start; the server's checked
//! against `trusted/`, or trusted on first use), the endpoint matched by security policy and
//! mode, the user's identity, and the library's event loop driven until the connection is lost
//! (its reason, said plainly for a refused password or an untrusted certificate). The library's
//! own reconnection is off: a lost session is made again from nothing by the caller. Also the
//! requests every caller makes: the namespace table, and any request bounded in time. Used by
//! the source's sessions and by `colibri opcua browse`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use opcua_client::transport::TcpConnector;
use opcua_client::{
    Client, ClientBuilder, IdentityToken, Password, Session, SessionEventLoop, SessionPollResult,
};
use opcua_types::{
    AttributeId, EndpointDescription, MessageSecurityMode, ReadValueId, StatusCode,
    TimestampsToReturn, UserTokenPolicy, VariableId, Variant,
};
use tokio_util::sync::CancellationToken;

use super::Endpoint;

/// Longest wait for a connection and its session.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for one request once connected.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Elements of one array at most (a message's changes), and chunks of one message (of 64 KiB
/// each: 16 MiB, the most one message holds in memory).
const MOST_ARRAY: usize = 100_000;
const MOST_CHUNKS: usize = 256;
/// How long the server keeps a session (and its subscriptions) without colibri.
pub const SESSION_TIMEOUT: Duration = Duration::from_secs(300);

/// A session that is up, and the task that drives it (it ends, with the reason, when the
/// connection is lost).
pub struct Up {
    pub session: Arc<Session>,
    pub driver: tokio::task::JoinHandle<String>,
}

/// Connects and activates a session named `name` (for the source `source`). `Err(None)`:
/// `stopping` came first; `Err(Some(reason))`: it could not be made. A server certificate
/// trusted on first use is logged (once: from then on it is the trusted one), whether the
/// session then comes up or not.
pub async fn open(
    ep: &Endpoint,
    (source, name): (&str, &str),
    stopping: &CancellationToken,
) -> Result<Up, Option<String>> {
    let tofu = ep.trust_on_first_use && trusted_certs(&ep.pki_dir).is_empty();
    let mut client = client(ep, tofu, name).map_err(Some)?;
    let connected = connect(&mut client, ep);
    let connected = tokio::time::timeout(CONNECT_TIMEOUT, connected);
    let connected = tokio::select! {
        _ = stopping.cancelled() => return Err(None),
        r = connected => r,
    };
    let up = match connected {
        Ok(Ok((session, event_loop))) => Up::wait(session, event_loop, stopping).await,
        Ok(Err(e)) => Err(Some(e)),
        Err(_) => Err(Some("no answer within 10s".into())),
    };
    if tofu {
        for cert in trusted_certs(&ep.pki_dir) {
            tracing::warn!(source, url = %ep.url, certificate = %cert, "opcua server certificate trusted on first use (its thumbprint is in the name): only it is accepted from now on");
        }
    }
    up
}

impl Up {
    /// The session once the library's event loop has activated it.
    async fn wait(
        session: Arc<Session>,
        event_loop: SessionEventLoop<TcpConnector>,
        stopping: &CancellationToken,
    ) -> Result<Up, Option<String>> {
        let mut driver = tokio::spawn(drive(event_loop));
        let up = tokio::select! {
            _ = stopping.cancelled() => None,
            up = tokio::time::timeout(CONNECT_TIMEOUT, session.wait_for_connection()) => Some(up),
            r = &mut driver => return Err(Some(r.unwrap_or_else(|e| e.to_string()))),
        };
        match up {
            Some(Ok(true)) => Ok(Up { session, driver }),
            None => {
                driver.abort();
                Err(None)
            }
            Some(_) => {
                driver.abort();
                Err(Some("no session within 10s".into()))
            }
        }
    }
}

/// The server's namespace table (index → URI).
pub async fn namespace_table(session: &Session) -> Result<Vec<String>, String> {
    let read = ReadValueId {
        node_id: VariableId::Server_NamespaceArray.into(),
        attribute_id: AttributeId::Value as u32,
        ..Default::default()
    };
    let values = request(session.read(&[read], TimestampsToReturn::Neither, 0.0)).await?;
    match values.into_iter().next().and_then(|v| v.value) {
        Some(Variant::Array(a)) => Ok(a
            .values
            .iter()
            .map(|v| match v {
                Variant::String(s) => s.as_ref().to_string(),
                _ => String::new(),
            })
            .collect()),
        other => Err(format!(
            "the server's namespace table is not a list of strings: {other:?}"
        )),
    }
}

/// A request of the session, bounded in time; its error as text.
pub async fn request<T, E: std::fmt::Display>(
    f: impl Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(REQUEST_TIMEOUT, f).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => Err("no answer within 10s".into()),
    }
}

/// Polls the library's event loop until the connection is lost (or cannot be made); the reason.
async fn drive(event_loop: SessionEventLoop<TcpConnector>) -> String {
    use futures_util::StreamExt;
    let events = event_loop.enter();
    let mut events = std::pin::pin!(events);
    while let Some(e) = events.next().await {
        match e {
            Ok(
                SessionPollResult::ConnectionLost(code) | SessionPollResult::ReconnectFailed(code),
            ) => {
                return reason(code);
            }
            Err(code) => return reason(code),
            Ok(_) => {}
        }
    }
    "the session was closed".into()
}

/// A status as the reason a connection failed, with what to do for the two an operator fixes.
fn reason(code: StatusCode) -> String {
    match code {
        StatusCode::BadIdentityTokenRejected
        | StatusCode::BadUserAccessDenied
        | StatusCode::BadIdentityTokenInvalid => {
            format!(
                "{code}: the server refused the user (its name and password, or its certificate)"
            )
        }
        StatusCode::BadCertificateUntrusted | StatusCode::BadSecurityChecksFailed => format!(
            "{code}: the server's certificate is not trusted (move it from rejected/ to trusted/ under the pki_dir, or set trust_on_first_use)"
        ),
        StatusCode::BadCommunicationError
        | StatusCode::BadConnectionClosed
        | StatusCode::BadNotConnected
        | StatusCode::BadTcpInternalError
        | StatusCode::BadTimeout => format!("{code}: the server cannot be reached"),
        StatusCode::BadSecurityPolicyRejected | StatusCode::BadTcpEndpointUrlInvalid => format!(
            "{code}: the server has no endpoint at this URL with this security policy and mode, or none that takes this identity (anonymous, a user name or a certificate)"
        ),
        other => other.to_string(),
    }
}

/// The client for one session: colibri's certificate in the pki directory (generated on first
/// start), the server's checked against `trusted/` unless trusted on first use now, and the
/// library's reconnection off.
fn client(ep: &Endpoint, trust_now: bool, name: &str) -> Result<Client, String> {
    let host = crate::net::hostname().unwrap_or_else(|| "unknown".into());
    ClientBuilder::new()
        .application_name("colibri")
        .application_uri(format!("urn:colibri:{host}"))
        .product_uri("urn:colibri")
        .pki_dir(&ep.pki_dir)
        .create_sample_keypair(true)
        .trust_server_certs(trust_now)
        .verify_server_certs(true)
        .session_retry_limit(0)
        // A notification message carries every change of a publishing interval: with thousands of
        // items that is more than the library's defaults (arrays of 1,000, messages of 320 KiB),
        // which it refuses to decode (BadDecodingError, the session lost, again and again).
        .max_array_length(MOST_ARRAY)
        .max_chunk_count(MOST_CHUNKS)
        .max_message_size(MOST_CHUNKS * 65_535)
        .session_timeout(u32::try_from(SESSION_TIMEOUT.as_millis()).unwrap_or(u32::MAX))
        .keep_alive_interval(Duration::from_secs(5))
        .request_timeout(REQUEST_TIMEOUT)
        .publish_timeout(REQUEST_TIMEOUT)
        .session_name(name)
        .client()
        .map_err(|e| format!("client settings refused: {}", e.join("; ")))
}

/// Connects to the endpoint that matches the source's policy and mode, as its user.
async fn connect(
    client: &mut Client,
    ep: &Endpoint,
) -> Result<(Arc<Session>, SessionEventLoop<TcpConnector>), String> {
    let policy = format!(
        "http://opcfoundation.org/UA/SecurityPolicy#{}",
        ep.security.policy
    );
    let mode = match ep.security.mode.as_str() {
        "Sign" => MessageSecurityMode::Sign,
        "SignAndEncrypt" => MessageSecurityMode::SignAndEncrypt,
        _ => MessageSecurityMode::None,
    };
    let identity = identity(ep)?;
    let token = UserTokenPolicy::anonymous();
    let endpoint: EndpointDescription = (ep.url.as_str(), policy.as_str(), mode, token).into();
    client
        .connect_to_matching_endpoint(endpoint, identity)
        .await
        .map_err(|e| reason(e.status()))
}

/// The identity colibri logs in with: a user certificate, a user name, or anonymous.
fn identity(ep: &Endpoint) -> Result<IdentityToken, String> {
    if let Some((cert, key)) = &ep.user_certificate {
        let read = |p: &Path| {
            std::fs::read(p)
                .map_err(|e| format!("{}: {}", p.display(), crate::shape::io_reason(&e)))
        };
        let bytes = read(cert)?;
        let x509 = opcua_crypto::X509::from_der(&bytes)
            .or_else(|_| opcua_crypto::X509::from_pem(&bytes))
            .map_err(|e| format!("{}: not a certificate: {e}", cert.display()))?;
        let pkey = opcua_crypto::PrivateKey::from_pem(&read(key)?)
            .map_err(|e| format!("{}: not a PEM private key: {e:?}", key.display()))?;
        return Ok(IdentityToken::X509(Box::new(x509), Box::new(pkey)));
    }
    Ok(match &ep.username {
        Some(user) => IdentityToken::UserName(
            user.clone(),
            Password(
                ep.password
                    .as_ref()
                    .map(|p| p.0.clone())
                    .unwrap_or_default(),
            ),
        ),
        None => IdentityToken::Anonymous,
    })
}

/// The certificates in `<pki_dir>/trusted`, by file name.
pub fn trusted_certs(pki_dir: &Path) -> Vec<String> {
    std::fs::read_dir(pki_dir.join("trusted"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}
