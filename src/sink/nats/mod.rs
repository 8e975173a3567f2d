//! The `nats` sink (feature `nats`): a job's records published to NATS JetStream, one message per
//! record (or the job as one ndjson message with `batch`), on a subject made from a template. Every
//! message carries `Nats-Msg-Id` (a record's key: the job's key and the record's position, the same
//! after a split or a crash), so JetStream drops a re-send within its duplicate window and the
//! stream holds each record once (a job's messages are published together, so after a partial
//! failure the re-send can store a job's records out of order; jobs stay in order). It owns the settings, the connection (async-nats: the cluster's
//! servers, reconnects, credentials, TLS) and a job's outcome: delivered when every message's
//! PubAck is in (a `duplicate` one too); unreachable (no attempt spent) while no server is
//! connected, when no stream takes the subject (no responders) or when the configured `stream`
//! is missing or lacks the subject; too large over the server's `max_payload` (the delivery worker
//! splits the job, down to the one record, which goes to the dead letters alone). Its file shape is
//! [`config`]'s. Built by `sink::Sink::new`; the connection is opened by `Sink::start` or the first delivery or probe.

use std::collections::HashSet;
use std::future::IntoFuture as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::context::{Context, PublishErrorKind};
use async_nats::jetstream::message::PublishMessage;
use async_nats::{Client, ConnectOptions, Event};
use tokio::sync::OnceCell;

use super::SinkConfig;
use super::deliver::{Batch, Deliver, DeliveryError, Probe};
use super::kind::{KindConfig, Settings};
use super::template::{Message, Template};
use crate::net::tls_client::TlsConfig;
use crate::record::RecordFormat;
use crate::setting::{Secret, SettingError};
use crate::store::FileJob;
pub use config::NatsSinkSpec as Spec;

mod config;

/// The compiled `type: nats` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsConfig {
    /// `nats://host:port` or `tls://host:port`: the servers of one cluster.
    pub servers: Vec<String>,
    /// TLS with these settings (required for every server).
    pub tls: Option<TlsConfig>,
    pub subject: Template,
    /// The JetStream stream expected to take the subjects: checked before the first publish to
    /// each subject.
    pub stream: Option<String>,
    /// One message per job (the records as ndjson) instead of one per record.
    pub batch: bool,
    pub auth: Auth,
    /// The connection's name, as the server's monitoring shows it.
    pub name: String,
}

impl Settings for NatsConfig {
    /// A subject made from records' fields needs JSON records; otherwise any line is a payload.
    fn record_format(&self) -> RecordFormat {
        if self.subject.uses_fields() {
            RecordFormat::Json
        } else {
            RecordFormat::Lines
        }
    }

    /// For logs: the sink's type, name and servers (no credentials).
    fn describe(&self, name: &str) -> String {
        format!("nats sink {name} ({})", self.servers.join(", "))
    }
}

impl KindConfig for NatsConfig {
    type Built = NatsSink;

    fn build(&self, sink: &SinkConfig) -> Result<NatsSink, SettingError> {
        NatsSink::new(self, sink.timeout)
    }
}

/// How colibri authenticates to the servers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    None,
    UserPassword {
        user: String,
        password: Secret,
    },
    Token(Secret),
    /// A `.creds` file (a user JWT and its NKey seed), read when the sink is built.
    CredsFile(PathBuf),
    /// A file holding an NKey seed (`SU...`).
    NkeyFile(PathBuf),
}

/// How a client error event's text starts.
const CLIENT_ERROR: &str = "client error: ";

/// The built sink.
pub struct NatsSink {
    inner: Arc<Inner>,
}

struct Inner {
    spec: NatsConfig,
    /// The longest wait for a connection and for a job's PubAcks (the sink's `timeout`).
    timeout: Duration,
    /// Taken by the first connect.
    options: Mutex<Option<ConnectOptions>>,
    conn: OnceCell<Result<(Client, Context), String>>,
    /// Why the connection is not up, from the client's events.
    last_error: Arc<Mutex<Option<String>>>,
    /// Why each server's last connection attempt failed, read from the client's server pool
    /// before each attempt (see [`attempt_failures`]); cleared at a connect.
    attempts: Arc<Mutex<Vec<String>>>,
    /// Subjects the configured stream is known to take.
    covered: Mutex<HashSet<String>>,
    shown: String,
}

impl NatsSink {
    /// Reads the credentials and TLS files; nothing is dialled yet. Errors name the setting.
    pub fn new(spec: &NatsConfig, timeout: Duration) -> Result<NatsSink, SettingError> {
        let last_error: Arc<Mutex<Option<String>>> = Arc::default();
        let attempts: Arc<Mutex<Vec<String>>> = Arc::default();
        let mut options = ConnectOptions::new()
            .name(&spec.name)
            .retry_on_initial_connect()
            .connection_timeout(timeout)
            .request_timeout(Some(timeout))
            // Publishes wait in the client while it reconnects; a small buffer bounds what a
            // dropped connection holds (deliveries check the state before they publish).
            .client_capacity(1024)
            // The client's events name only the kind of a failed connect ("IO error"); the
            // server pool it hands this callback before each attempt keeps the cause.
            .reconnect_to_server_callback({
                let attempts = Arc::clone(&attempts);
                move |servers, _| {
                    let failures = attempt_failures(&servers);
                    if !failures.is_empty() {
                        *attempts
                            .lock()
                            .expect("never poisoned: no panics while held") = failures;
                    }
                    // The client's own choice of server and delay.
                    std::future::ready(None)
                }
            })
            .event_callback({
                let last = Arc::clone(&last_error);
                let attempts = Arc::clone(&attempts);
                move |event| {
                    let last = Arc::clone(&last);
                    let attempts = Arc::clone(&attempts);
                    async move {
                        let mut last = last.lock().expect("never poisoned: no panics while held");
                        match event {
                            Event::Connected => {
                                *last = None;
                                attempts
                                    .lock()
                                    .expect("never poisoned: no panics while held")
                                    .clear();
                            }
                            Event::Disconnected => {
                                last.get_or_insert_with(|| "disconnected".into());
                            }
                            Event::ServerError(e) => *last = Some(format!("server error: {e}")),
                            Event::ClientError(e) => *last = Some(format!("{CLIENT_ERROR}{e}")),
                            _ => {}
                        }
                    }
                }
            });
        options = match &spec.auth {
            Auth::None => options,
            Auth::UserPassword { user, password } => {
                options.user_and_password(user.clone(), password.0.clone())
            }
            Auth::Token(t) => options.token(t.0.clone()),
            Auth::CredsFile(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    SettingError::new("credentials_file", format!("{}: {e}", path.display()))
                })?;
                options.credentials(&text).map_err(|e| {
                    SettingError::new(
                        "credentials_file",
                        format!("{}: not a NATS credentials file: {e}", path.display()),
                    )
                })?
            }
            Auth::NkeyFile(path) => {
                let seed = std::fs::read_to_string(path).map_err(|e| {
                    SettingError::new("nkey_file", format!("{}: {e}", path.display()))
                })?;
                let seed = seed.trim();
                if !seed.starts_with("SU") {
                    return Err(SettingError::new(
                        "nkey_file",
                        format!("{}: holds no user NKey seed (SU...)", path.display()),
                    ));
                }
                options.nkey(seed.to_string())
            }
        };
        if let Some(tls) = &spec.tls {
            options = options
                .require_tls(true)
                .tls_client_config(crate::net::tls_client::client_config(tls)?);
        }
        Ok(NatsSink {
            inner: Arc::new(Inner {
                spec: spec.clone(),
                timeout,
                options: Mutex::new(Some(options)),
                conn: OnceCell::new(),
                last_error,
                attempts,
                covered: Mutex::default(),
                shown: spec.servers.join(", "),
            }),
        })
    }
}

impl Inner {
    /// The client and its JetStream context, connecting (in the background, retried) the first
    /// time.
    async fn conn(&self) -> Result<&(Client, Context), DeliveryError> {
        let conn = self
            .conn
            .get_or_init(|| async {
                let options = self
                    .options
                    .lock()
                    .expect("never poisoned: no panics while held")
                    .take()
                    .ok_or("the connection was already tried")?;
                let client = options
                    .connect(self.spec.servers.as_slice())
                    .await
                    .map_err(|e| format!("{}: {e}", self.shown))?;
                let js = async_nats::jetstream::ContextBuilder::new()
                    .timeout(self.timeout)
                    .build(client.clone());
                Ok((client, js))
            })
            .await;
        conn.as_ref()
            .map_err(|e| DeliveryError::Unavailable(e.clone()))
    }

    /// The connection when it is up; else why not. Until the client has said why (before its
    /// first attempt has failed, or between a failed attempt's event and the pool's cause),
    /// waits for that, up to `timeout`, so an outage is reported with its cause.
    async fn up(&self) -> Result<&(Client, Context), DeliveryError> {
        let conn = self.conn().await?;
        let connected = || conn.0.connection_state() == async_nats::connection::State::Connected;
        if connected() {
            return Ok(conn);
        }
        // Only a link that is down waits (and reads the clock).
        let deadline = tokio::time::Instant::now() + self.timeout;
        loop {
            let why = self.why_down();
            if why.1 || tokio::time::Instant::now() >= deadline {
                return Err(DeliveryError::Unavailable(format!(
                    "{}: {}",
                    self.shown, why.0
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            if connected() {
                return Ok(conn);
            }
        }
    }

    /// Why the connection is not up, and whether that is the cause: the servers' last failed
    /// attempts, else the client's last event. A client error event names only a kind ("nats:
    /// IO error"), so it is not.
    fn why_down(&self) -> (String, bool) {
        let attempts = self
            .attempts
            .lock()
            .expect("never poisoned: no panics while held")
            .join("; ");
        if !attempts.is_empty() {
            return (attempts, true);
        }
        match self
            .last_error
            .lock()
            .expect("never poisoned: no panics while held")
            .clone()
        {
            Some(e) => {
                let known = !e.starts_with(CLIENT_ERROR);
                (e, known)
            }
            None => ("not connected".into(), false),
        }
    }

    /// Checks that the configured stream exists and takes `subject` (once per subject).
    async fn check_stream(&self, js: &Context, subject: &str) -> Result<(), DeliveryError> {
        let Some(stream) = &self.spec.stream else {
            return Ok(());
        };
        let known = |s: &str| {
            self.covered
                .lock()
                .expect("never poisoned: no panics while held")
                .contains(s)
        };
        if known(subject) {
            return Ok(());
        }
        let info = match js.get_stream(stream).await {
            Ok(s) => s.cached_info().clone(),
            Err(e) => {
                return Err(DeliveryError::Unavailable(format!(
                    "{}: JetStream stream {stream}: {e} (create it; deliveries wait)",
                    self.shown
                )));
            }
        };
        let subjects = info.config.subjects;
        if !subjects.iter().any(|f| subject_matches(f, subject)) {
            return Err(DeliveryError::Unavailable(format!(
                "{}: JetStream stream {stream} does not take subject {subject} (its subjects: {}); add it to the stream, deliveries wait",
                self.shown,
                subjects.join(", ")
            )));
        }
        self.covered
            .lock()
            .expect("never poisoned: no panics while held")
            .insert(subject.to_string());
        Ok(())
    }

    async fn publish(&self, js: &Context, messages: Vec<Message>) -> Result<(), DeliveryError> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let no_answer = || {
            DeliveryError::Unavailable(format!(
                "{}: no PubAck within {:?}",
                self.shown, self.timeout
            ))
        };
        let mut acks = Vec::with_capacity(messages.len());
        let mut checked: Option<String> = None;
        for m in messages {
            let i = m.index;
            // A job's messages mostly share one subject: checked when it changes.
            if checked.as_deref() != Some(m.to.as_str()) {
                self.check_stream(js, &m.to).await?;
                checked = Some(m.to.clone());
            }
            let mut msg = PublishMessage::build()
                .payload(m.payload)
                .message_id(&m.key);
            if m.replayed {
                msg = msg.header(crate::sink::REPLAYED, "true");
            }
            let sent = tokio::time::timeout_at(deadline, js.send_publish(m.to.clone(), msg))
                .await
                .map_err(|_| no_answer())?;
            let ack = sent.map_err(|e| self.classify(i, &m.to, e))?;
            acks.push((i, m.to, ack));
        }
        for (i, subject, ack) in acks {
            let ack = tokio::time::timeout_at(deadline, ack.into_future())
                .await
                .map_err(|_| no_answer())?;
            ack.map_err(|e| self.classify(i, &subject, e))?;
        }
        Ok(())
    }

    /// What a failed publish of the message of record `i` (its position in the job) means for the
    /// job.
    fn classify(
        &self,
        i: usize,
        subject: &str,
        e: async_nats::jetstream::context::PublishError,
    ) -> DeliveryError {
        let shown = &self.shown;
        match e.kind() {
            PublishErrorKind::MaxPayloadExceeded => {
                let what = if self.spec.batch {
                    "the job as one message".to_string()
                } else {
                    format!("record {i} of the job")
                };
                DeliveryError::TooLarge(format!("{shown}: {what}: {e}"))
            }
            // No stream takes the subject: the configuration's problem, not the job's.
            PublishErrorKind::StreamNotFound => DeliveryError::Unavailable(format!(
                "{shown}: no JetStream stream takes subject {subject} (no responders); create one or fix the subject, deliveries wait"
            )),
            PublishErrorKind::TimedOut | PublishErrorKind::BrokenPipe => {
                DeliveryError::Unavailable(format!("{shown}: {subject}: {e}"))
            }
            _ => DeliveryError::transient(format!("{shown}: {subject}: {e}")),
        }
    }
}

/// Why each server's last connection attempt failed, from the client's server pool: what
/// happened ("connection refused (os error 111)", "timed out", "DNS error: ..."), without the
/// client's "IO error" kind in front, which says nothing more. Each is named by its address when
/// the pool has more than one server.
fn attempt_failures(servers: &[async_nats::Server]) -> Vec<String> {
    let named = servers.len() > 1;
    servers
        .iter()
        .filter_map(|s| {
            let error = s.last_error.as_deref()?;
            let cause = error.strip_prefix("IO error: ").unwrap_or(error);
            let cause = lowercase_word(cause);
            Some(if named {
                format!("{}:{}: {cause}", s.addr.host(), s.addr.port())
            } else {
                cause
            })
        })
        .collect()
}

/// `text` with its first letter in lower case ("Connection refused" as colibri's messages
/// write it), unless it starts an acronym ("DNS").
fn lowercase_word(text: &str) -> String {
    let mut chars = text.chars();
    match (chars.next(), chars.next()) {
        (Some(a), Some(b)) if a.is_uppercase() && !b.is_uppercase() => {
            format!("{}{}", a.to_lowercase(), &text[a.len_utf8()..])
        }
        _ => text.to_string(),
    }
}

/// Whether the subject filter `filter` (with `*` for one token and a final `>` for the rest)
/// takes `subject`.
fn subject_matches(filter: &str, subject: &str) -> bool {
    let mut s = subject.split('.');
    for f in filter.split('.') {
        match (f, s.next()) {
            (">", Some(_)) => return true,
            ("*", Some(_)) => {}
            (f, Some(t)) if f == t => {}
            _ => return false,
        }
    }
    s.next().is_none()
}

impl Deliver for NatsSink {
    fn start(&self) {
        let inner = Arc::clone(&self.inner);
        tokio::spawn(async move {
            let _ = inner.conn().await;
        });
    }

    async fn send(&self, batch: &Batch<'_>, body: Vec<u8>) -> Result<(), DeliveryError> {
        let inner = &self.inner;
        let (_, js) = inner.up().await?;
        let messages = inner.spec.subject.messages(batch, body, inner.spec.batch)?;
        inner.publish(js, messages).await
    }

    async fn send_file(&self, _batch: &Batch<'_>, file: &FileJob) -> Result<(), DeliveryError> {
        Err(DeliveryError::Permanent(format!(
            "{} is a file, and a nats sink publishes records",
            file.name.to_string_lossy()
        )))
    }

    /// Connected to a server (whatever `link.probe` says), and the configured stream is there.
    async fn probe(&self, _how: &Probe) -> Result<(), String> {
        let inner = &self.inner;
        // The client reconnects on its own: the probe gives it up to the timeout.
        let deadline = tokio::time::Instant::now() + inner.timeout;
        let (_, js) = loop {
            match inner.up().await {
                Ok(conn) => break conn,
                Err(e) if tokio::time::Instant::now() >= deadline => return Err(e.to_string()),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        };
        if let Some(stream) = &inner.spec.stream {
            js.get_stream(stream)
                .await
                .map_err(|e| format!("{}: JetStream stream {stream}: {e}", inner.shown))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_attempt_is_named_by_its_cause_not_its_kind() {
        let server = |url: &str, error: Option<&str>| async_nats::Server {
            addr: url.parse().expect("a valid server address"),
            failed_attempts: 1,
            did_connect: false,
            is_discovered: false,
            last_error: error.map(str::to_string),
        };
        let refused = "IO error: Connection refused (os error 111)";
        assert_eq!(
            attempt_failures(&[server("nats://127.0.0.1:4222", Some(refused))]),
            ["connection refused (os error 111)"]
        );
        assert_eq!(
            attempt_failures(&[
                server("nats://a:4222", Some("timed out")),
                server("nats://b:4223", None),
                server("nats://c:4224", Some("DNS error: failed to lookup address")),
            ]),
            [
                "a:4222: timed out",
                "c:4224: DNS error: failed to lookup address"
            ]
        );
    }

    #[test]
    fn subject_filters_match_as_nats_does() {
        assert!(subject_matches("plant.>", "plant.a.b"));
        assert!(!subject_matches("plant.>", "plant"));
        assert!(subject_matches("plant.*.t", "plant.a.t"));
        assert!(!subject_matches("plant.*.t", "plant.a.b.t"));
        assert!(subject_matches("plant.a", "plant.a"));
        assert!(!subject_matches("plant.a", "plant.a.b"));
        assert!(!subject_matches("plant.a.b", "plant.a"));
    }
}
