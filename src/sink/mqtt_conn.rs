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
/// Messages awaiting their acknowledgement at once (fewer if the broker's Receive Maximum says so).
const MAX_IN_FLIGHT: u16 = 128;
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
            let config = super::tls::client_config(tls)?;
            opts.set_transport(Transport::tls_with_config(TlsConfiguration::Rustls(
                Arc::new(config),
            )));
        }
        // With `tls.server_name`, the certificate is checked for (and SNI sent to) that name while
        // the URL's host is dialled.
        let dial = spec
            .tls
            .as_ref()
            .and_then(|t| t.server_name.as_ref())
            .map(|_| format!("{}:{}", spec.host, spec.port));
        opts.set_socket_connector(move |addr, net| {
            let addr = dial.clone().unwrap_or(addr);
            async move {
                let stream = rumqttc::default_socket_connect(addr, net).await?;
                Ok(QuickAck(stream))
            }
        });
        let keep_alive = u16::try_from(spec.keep_alive.as_secs()).unwrap_or(u16::MAX);
        // colibri's own small publishes go out at once (no Nagle); see `QuickAck` for the broker's.
        let mut net = rumqttc::NetworkOptions::new();
        net.set_tcp_nodelay(true);
        opts.set_network_options(net)
            // The client keeps a slot per packet id it may have in flight, sized by this bound
            // (65,535 slots unless the broker sets a smaller Receive Maximum: 16 MB of memory).
            .set_outgoing_inflight_upper_limit(MAX_IN_FLIGHT);
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

/// The broker's TCP stream, with TCP_QUICKACK re-armed after every read. A broker that leaves
/// Nagle's algorithm on (mosquitto does unless `set_tcp_nodelay true`) holds back a job's last
/// PUBACKs until colibri's kernel acknowledges the segment before them, which it delays by up to
/// 40 ms when it has nothing to send: a job of 100 records took 48 ms (2,000 records/s; 31,000
/// with quick ACKs, BENCHMARKS.md). Linux clears the flag on its own, hence after each read.
struct QuickAck(tokio::net::TcpStream);

impl QuickAck {
    fn arm(&self) {
        use std::os::fd::AsRawFd as _;
        let one: libc::c_int = 1;
        // SAFETY: the descriptor is the open socket `self.0` owns for as long as this call; the
        // option value points at a live c_int and the length given is its size. A failure (not a
        // TCP socket) only leaves the kernel's default ACK timing, so the result is not checked.
        unsafe {
            libc::setsockopt(
                self.0.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_QUICKACK,
                (&raw const one).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
}

impl tokio::io::AsyncRead for QuickAck {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let read = std::pin::Pin::new(&mut self.0).poll_read(cx, buf);
        if read.is_ready() {
            self.arm();
        }
        read
    }
}

impl tokio::io::AsyncWrite for QuickAck {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
