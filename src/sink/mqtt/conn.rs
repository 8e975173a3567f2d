//! The `mqtt` sink's connection to its broker: a driver task that polls the client's event loop,
//! reconnects when asked or after a pause, and publishes the retained `online` status at each
//! connect, and the connection's state as deliveries and probes see it ([`Link`]). The client
//! options (TLS, credentials, keep-alive, the session, the `offline` will) are each protocol
//! version's (`v5`, `v311`, behind `client`); what a job's outcome is, is the sink's
//! ([`super`]). Created by `MqttSink::new`; the driver starts when the agent starts the sink
//! (`Sink::start`; a sink built only to be checked never dials), or at the first delivery or
//! probe, and ends when the sink is dropped (a reload that changed it, or the stop), closing the
//! connection without a DISCONNECT so that the broker publishes the will.
//!
//! With `encoding: sparkplug_b` the driver tells the edge node (`sparkplug::node::Node`) each
//! connect, each lost connection (then sets the next connection's NDEATH will) and each message
//! on the topics it subscribed to.
//!
//! The session: at start colibri always begins a clean one (what was in flight when it last
//! stopped is re-sent from its own store, and a session the broker kept from then would hold packet
//! ids this process does not know); with `clean_session: false` every reconnect after that resumes
//! it, so messages in flight across a dropped connection are completed under their packet ids
//! instead of published anew.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, watch};

use super::client::{Client, Events};
use super::common::Polled;
use super::settings::{MqttConfig, Status};
use super::sparkplug::node::Node;
use crate::setting::SettingError;

/// The connection as a delivery sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Link {
    /// Connected; the largest packet it takes: the smaller of the broker's (when its CONNACK
    /// says) and the settings' `max_packet_size`.
    Up { max_packet: Option<u32> },
    /// Not connected, and why (the last attempt's error).
    Down(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Connecting,
    Link(Link),
}

/// The longest pause between reconnects nobody asked for (deliveries and the link's probes ask).
const IDLE_RECONNECT: Duration = Duration::from_secs(30);

/// The client, its driver (until started) and the connection's state.
pub struct Connection {
    client: Client,
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
    /// The client options from the settings (a connect takes at most `timeout`); reads the TLS
    /// files. Nothing is dialled.
    pub fn new(
        spec: &MqttConfig,
        timeout: Duration,
        node: Option<Arc<Node>>,
    ) -> Result<Connection, SettingError> {
        let shown = format!(
            "{}://{}:{}",
            if spec.tls.is_some() { "mqtts" } else { "mqtt" },
            spec.host,
            spec.port
        );
        // With `tls.server_name`, the certificate is checked for (and SNI sent to) that name while
        // the URL's host is dialled.
        let dial =
            (spec.server_name() != spec.host).then(|| format!("{}:{}", spec.host, spec.port));
        let (client, mut events) = super::client::build(spec, timeout, dial)?;
        if let Some(n) = &node {
            let (topic, payload) = n.will();
            events.set_will(topic, payload);
        }
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
            node,
            max_packet: spec.max_packet,
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

    pub fn client(&self) -> &Client {
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
    events: Events,
    /// For the `online` status message.
    client: Client,
    state: watch::Sender<State>,
    kick: Arc<Notify>,
    stop: Arc<Notify>,
    persistent: bool,
    status: Option<Status>,
    shown: String,
    /// The Sparkplug edge node, told what happens to the connection.
    node: Option<Arc<Node>>,
    /// The settings' largest packet (the broker's own comes with each CONNACK).
    max_packet: Option<u32>,
}

impl Driver {
    async fn run(mut self) {
        let mut pause = Duration::from_secs(1);
        loop {
            let event = tokio::select! {
                e = self.events.poll(&self.shown) => e,
                () = self.stop.notified() => return,
            };
            match event {
                Polled::Connected {
                    max_packet,
                    session_present,
                } => {
                    pause = Duration::from_secs(1);
                    if self.persistent {
                        // Reconnects from now on resume this session (see the module's note).
                        self.events.resume_sessions();
                    }
                    tracing::debug!(broker = %self.shown, session_present, "connected");
                    let max_packet = max_packet.into_iter().chain(self.max_packet).min();
                    self.state
                        .send_replace(State::Link(Link::Up { max_packet }));
                    if let Some(s) = &self.status
                        && let Err(e) = self.client.announce(s)
                    {
                        tracing::debug!(broker = %self.shown, "online status not queued: {e}");
                    }
                    if let Some(n) = &self.node {
                        n.connected(&self.client, max_packet);
                    }
                }
                Polled::Message { topic, payload } => {
                    if let Some(n) = &self.node
                        && n.incoming(&self.client, &topic, &payload)
                    {
                        // The edge node's session ends: the broker publishes its will, and the
                        // next poll connects again under the next bdSeq.
                        let (topic, payload) = n.lost();
                        self.events.set_will(topic, payload);
                        self.events.drop_connection();
                    }
                }
                Polled::Other => {}
                Polled::Failed(reason) => {
                    self.state.send_replace(State::Link(Link::Down(reason)));
                    if let Some(n) = &self.node {
                        let (topic, payload) = n.lost();
                        self.events.set_will(topic, payload);
                    }
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
