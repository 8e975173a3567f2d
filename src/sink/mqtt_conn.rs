//! The `mqtt` sink's connection to its broker: the client options (TLS, credentials, keep-alive,
//! the session, the retained `offline` will), a driver task that polls the client's event loop,
//! reconnects when asked or after a pause, and publishes the retained `online` status at each
//! connect, and the connection's state as deliveries and probes see it ([`Link`]). It does not
//! decide what a job's outcome is ([`super::mqtt`] does). Created by `MqttSink::new`; the driver
//! starts when the agent starts the sink (`Sink::start`; a sink built only to be checked never
//! dials), or at the first delivery or probe, and ends when the sink is dropped (a reload that changed it, or the stop), closing the connection without a
//! DISCONNECT so that the broker publishes the will.
//!
//! The session: at start colibri always begins a clean one (what was in flight when it last
//! stopped is re-sent from its own store, and a session the broker kept from then would hold packet
//! ids this process does not know); with `clean_session: false` every reconnect after that resumes
//! it, so messages in flight across a dropped connection are completed under their packet ids
//! instead of published anew.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rumqttc::{
    AsyncClient, ConnectReturnCode, ConnectionError, Event, EventLoop, Incoming, LastWill,
    MqttOptions, PublishOptions, QoS, TlsConfiguration, Transport,
};
use tokio::sync::{Notify, watch};

use super::deliver::SettingError;
use super::http::TlsConfig;
use super::mqtt::MqttConfig;
use crate::net::client::chain;

/// The connection as a delivery sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Link {
    /// Connected; the broker's maximum packet size, when it set one.
    Up { max_packet: Option<u32> },
    /// Not connected, and why (the last attempt's error).
    Down(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Connecting,
    Link(Link),
}

/// Requests the client queues before a publish waits: bounds what a dropped connection holds.
const REQUEST_CAPACITY: usize = 256;
/// The longest pause between reconnects nobody asked for (deliveries and the link's probes ask).
const IDLE_RECONNECT: Duration = Duration::from_secs(30);

/// The client, its driver (until started) and the connection's state.
pub struct Connection {
    client: AsyncClient,
    /// Taken when the driver starts.
    pending: Mutex<Option<Driver>>,
    state: watch::Receiver<State>,
    /// Asks the driver to try a connection now.
    kick: Arc<Notify>,
    /// Ends the driver (the sink is gone).
    stop: Arc<Notify>,
    shown: String,
}

impl Connection {
    /// The client options from the settings; reads the TLS files. Nothing is dialled.
    pub fn new(spec: &MqttConfig) -> Result<Connection, SettingError> {
        let shown = format!(
            "{}://{}:{}",
            if spec.tls.is_some() { "mqtts" } else { "mqtt" },
            spec.host,
            spec.port
        );
        let name = spec
            .tls
            .as_ref()
            .and_then(|t| t.server_name.clone())
            .unwrap_or_else(|| spec.host.clone());
        let mut opts = MqttOptions::new(
            spec.client_id.clone(),
            rumqttc::Broker::tcp(name, spec.port),
        );
        if let Some(tls) = &spec.tls {
            let config = tls_config(tls)?;
            opts.set_transport(Transport::tls_with_config(TlsConfiguration::Rustls(
                Arc::new(config),
            )));
            if tls.server_name.is_some() {
                // Verify (and send SNI for) the configured name, but dial the URL's host.
                let (host, port) = (spec.host.clone(), spec.port);
                opts.set_socket_connector(move |_, _| {
                    let host = host.clone();
                    async move { tokio::net::TcpStream::connect((host.as_str(), port)).await }
                });
            }
        }
        let keep_alive = u16::try_from(spec.keep_alive.as_secs()).unwrap_or(u16::MAX);
        opts.set_keep_alive(keep_alive)
            .set_connect_timeout(spec.timeout)
            .set_clean_start(true);
        if spec.persistent {
            let expiry = u32::try_from(spec.session_expiry.as_secs()).unwrap_or(u32::MAX);
            opts.set_session_expiry_interval(Some(expiry));
        }
        match (&spec.username, &spec.password) {
            (Some(u), Some(p)) => {
                opts.set_credentials(u.clone(), p.0.clone().into_bytes());
            }
            (Some(u), None) => {
                opts.set_username(u.clone());
            }
            (None, Some(p)) => {
                opts.set_password(p.0.clone().into_bytes());
            }
            (None, None) => {}
        }
        if let Some(s) = &spec.status {
            opts.set_last_will(LastWill::new(
                s.topic.clone(),
                s.offline.clone().into_bytes(),
                QoS::AtLeastOnce,
                true,
                None,
            ));
        }
        let (client, events) = AsyncClient::builder(opts)
            .capacity(REQUEST_CAPACITY)
            .build();
        let (tx, state) = watch::channel(State::Connecting);
        let (kick, stop) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let driver = Driver {
            events,
            client: client.clone(),
            state: tx,
            kick: kick.clone(),
            stop: stop.clone(),
            persistent: spec.persistent,
            status: spec.status.clone(),
            shown: shown.clone(),
        };
        Ok(Connection {
            client,
            pending: Mutex::new(Some(driver)),
            state,
            kick,
            stop,
            shown,
        })
    }

    pub fn client(&self) -> &AsyncClient {
        &self.client
    }

    /// The broker's address, for messages.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// Starts the driver on the current runtime, once.
    pub fn start(&self) {
        let driver = self
            .pending
            .lock()
            .expect("nothing panics while holding the driver slot")
            .take();
        if let Some(driver) = driver {
            tokio::spawn(driver.run());
        }
    }

    /// The connection for a delivery: up, or down with the last error (and a reconnect asked
    /// for). While a connection is being made, waits up to `limit` for its outcome.
    pub async fn up(&self, limit: Duration) -> Link {
        self.start();
        let mut state = self.state.clone();
        let now = state.borrow_and_update().clone();
        match now {
            State::Link(Link::Up { max_packet }) => Link::Up { max_packet },
            State::Link(Link::Down(reason)) => {
                self.kick.notify_one();
                Link::Down(reason)
            }
            State::Connecting => self.outcome(&mut state, limit).await,
        }
    }

    /// For the link's probe: up, or the outcome of a connection attempt made now.
    pub async fn connect_now(&self, limit: Duration) -> Link {
        self.start();
        let mut state = self.state.clone();
        if let State::Link(up @ Link::Up { .. }) = state.borrow_and_update().clone() {
            return up;
        }
        self.kick.notify_one();
        self.outcome(&mut state, limit).await
    }

    /// The next state that is not `Connecting`, within `limit`.
    async fn outcome(&self, state: &mut watch::Receiver<State>, limit: Duration) -> Link {
        let wait = state.wait_for(|s| !matches!(s, State::Connecting));
        match tokio::time::timeout(limit, wait).await {
            Ok(Ok(s)) => match &*s {
                State::Link(l) => l.clone(),
                State::Connecting => unreachable!("waited for another state"),
            },
            Ok(Err(_)) => Link::Down(format!("{}: the connection's driver ended", self.shown)),
            Err(_) => Link::Down(format!("{}: no CONNACK within {limit:?}", self.shown)),
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.stop.notify_one();
    }
}

/// The task that owns the event loop.
struct Driver {
    events: EventLoop,
    /// For the `online` status message.
    client: AsyncClient,
    state: watch::Sender<State>,
    kick: Arc<Notify>,
    stop: Arc<Notify>,
    persistent: bool,
    status: Option<super::mqtt::Status>,
    shown: String,
}

impl Driver {
    async fn run(mut self) {
        let mut pause = Duration::from_secs(1);
        loop {
            let event = tokio::select! {
                e = self.events.poll() => e,
                () = self.stop.notified() => return,
            };
            match event {
                Ok(Event::Incoming(Incoming::ConnAck(ack))) => {
                    pause = Duration::from_secs(1);
                    if self.persistent {
                        // Reconnects from now on resume this session (see the module's note).
                        self.events.options.set_clean_start(false);
                    }
                    let max_packet = ack.properties.as_ref().and_then(|p| p.max_packet_size);
                    tracing::debug!(broker = %self.shown, session_present = ack.session_present, "connected");
                    self.state
                        .send_replace(State::Link(Link::Up { max_packet }));
                    if let Some(s) = &self.status {
                        let opts = PublishOptions::new(QoS::AtLeastOnce).retained();
                        // Never waits: the driver is what empties the request queue.
                        if let Err(e) = self.client.try_publish(
                            s.topic.clone(),
                            s.online.clone().into_bytes(),
                            opts,
                        ) {
                            tracing::debug!(broker = %self.shown, "online status not queued: {e}");
                        }
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    self.state
                        .send_replace(State::Link(Link::Down(reason(&self.shown, &e))));
                    tokio::select! {
                        () = self.kick.notified() => {}
                        () = tokio::time::sleep(pause) => {}
                        () = self.stop.notified() => return,
                    }
                    pause = (pause * 2).min(IDLE_RECONNECT);
                    self.state.send_replace(State::Connecting);
                }
            }
        }
    }
}

/// Why the connection is down, for the link's log line and the deliveries it refuses.
fn reason(shown: &str, e: &ConnectionError) -> String {
    use ConnectReturnCode as C;
    match e {
        ConnectionError::ConnectionRefused(
            code @ (C::BadUserNamePassword
            | C::NotAuthorized
            | C::Banned
            | C::BadAuthenticationMethod),
        ) => format!(
            "{shown}: the broker refused colibri's credentials ({code:?}); deliveries wait until they are accepted"
        ),
        ConnectionError::ConnectionRefused(code) => {
            format!("{shown}: the broker refused the connection ({code:?})")
        }
        other => format!("{shown}: {}", chain(other)),
    }
}

/// rustls settings: the CA file's roots (else the system's) and the client certificate.
fn tls_config(tls: &TlsConfig) -> Result<rustls::ClientConfig, SettingError> {
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
