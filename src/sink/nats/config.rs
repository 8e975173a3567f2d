//! The `type: nats` sink entry: its file shape ([`NatsSinkSpec`]) and its compilation into
//! [`NatsConfig`] (the servers, the subject template, the stream, one way to authenticate, TLS),
//! each problem under its field. It connects to nothing: the sink does. Called through the sinks'
//! list (`sink::compile_kind`) for `type: nats`.

use std::collections::BTreeSet;
use std::path::Path;

use serde::Deserialize;

use super::{Auth, NatsConfig, NatsSink};
use crate::setting::Secret;
use crate::shape::Problems;
use crate::shape::tls::TlsSpec;
#[cfg(feature = "schema")]
use crate::shape::units::u32_schema;
use crate::shape::units::{self, Dur, Size};
use crate::sink::config::{LinkSpec, RetrySpec, broker_link, template};
use crate::sink::kind::{Compile, KindSpec};
use crate::sink::template::NATS_SUBJECT;

/// `type: nats` settings.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct NatsSinkSpec {
    /// The server, or the servers of one cluster: `nats://host:4222`, or `tls://host:4222` for
    /// TLS (the port defaults to 4222). The client also learns the cluster's other servers from
    /// the one it reaches.
    pub url: NatsUrls,
    /// Where each message goes: fixed text with `{stream}` (the colibri stream's name) and
    /// `{field.<name>}` (a JSON record's field), e.g. `plant.{stream}.{field.line}`. A record
    /// without the field goes to the dead letters with the reason. No wildcards (`*`, `>`).
    pub subject: String,
    /// The JetStream stream expected to take the subjects, e.g. `PLANT`: before the first publish
    /// to a subject colibri checks that the stream exists and takes it, and says which subject it
    /// lacks (deliveries wait, the data is kept). Unset: any stream that takes the subject.
    #[serde(default)]
    pub stream: Option<String>,
    /// `true`: one message per job, its records as ndjson, instead of one message per record.
    /// Default false. A subject with `{field...}` needs a message per record.
    #[serde(default)]
    pub batch: bool,
    /// User name (with `password`), e.g. `${NATS_USER}`.
    #[serde(default)]
    pub username: Option<String>,
    /// Password for `username`; never logged.
    #[serde(default)]
    pub password: Option<String>,
    /// An authentication token, e.g. `${NATS_TOKEN}`; never logged.
    #[serde(default)]
    pub token: Option<String>,
    /// A `.creds` file (a user JWT and its NKey seed). Relative to the config file.
    #[serde(default)]
    pub credentials_file: Option<String>,
    /// A file holding a user NKey seed (`SU...`). Relative to the config file.
    #[serde(default)]
    pub nkey_file: Option<String>,
    /// The connection's name in the servers' monitoring. Default `colibri-<host name>-<sink name>`.
    #[serde(default)]
    pub name: Option<String>,
    /// Longest wait for a connection and for a job's PubAcks. Default 10s.
    #[serde(default)]
    pub timeout: Option<Dur>,
    /// Jobs in flight at once, 1-64. Default 1, which keeps strict order.
    #[serde(default, deserialize_with = "units::de_opt_u32")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "u32_schema"))]
    pub concurrency: Option<u32>,
    /// TLS for `tls://` URLs (rustls; the system's roots unless `ca_file` is set).
    #[serde(default)]
    pub tls: TlsSpec,
    #[serde(default)]
    pub retry: RetrySpec,
    /// When the servers count as unreachable. The link is probed by connecting (and looking up
    /// `stream`): `probe` and `probe_url` do not apply.
    #[serde(default)]
    pub link: LinkSpec,
    /// Bytes per second of payload while a backlog is replayed. Unset: unlimited.
    #[serde(default)]
    pub replay_rate: Option<Size>,
}

/// One server URL or a list of them.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(untagged)]
pub enum NatsUrls {
    One(String),
    Many(Vec<String>),
}

impl KindSpec for NatsSinkSpec {
    type Config = NatsConfig;

    /// A `nats` entry compiled; `None` when a problem stops it (each one reported).
    fn compile(mut self, cx: &mut Compile<'_, '_>) -> Option<NatsConfig> {
        cx.link = broker_link(std::mem::take(&mut self.link), "a nats", cx.err);
        cx.retry = std::mem::take(&mut self.retry);
        let err = &mut *cx.err;
        let (servers, tls) = servers(self.url, err)?;
        let tls = crate::shape::tls::client(self.tls, tls, "tls", cx.base, err);
        let subject = template("subject", &self.subject, NATS_SUBJECT, self.batch, err);
        if let Some(s) = &self.stream
            && (s.is_empty() || s.contains(['.', '*', '>', ' ', '/', '\\']))
        {
            err.add(
                "stream",
                format!("{s:?} is not a JetStream stream name (no . * > / \\ or spaces)"),
            );
        }
        let auth = auth(
            Ways {
                username: self.username,
                password: self.password,
                token: self.token,
                credentials_file: self.credentials_file,
                nkey_file: self.nkey_file,
            },
            cx.base,
            err,
        );
        cx.limits(self.timeout, self.concurrency, self.replay_rate);
        let config = NatsConfig {
            servers,
            tls,
            subject: subject?,
            stream: self.stream,
            batch: self.batch,
            auth,
            name: self
                .name
                .unwrap_or_else(|| crate::shape::client_name::default_client_name(cx.name)),
        };
        // Reads the credentials and TLS files: a bad one is reported now, not at the first delivery.
        if let Err(e) = NatsSink::new(&config, cx.timeout) {
            cx.err.add(&e.field, e.message);
        }
        Some(config)
    }
}

/// The servers of `url` (`nats://` or `tls://`, the same for all) and whether they use TLS;
/// `None` when there is none.
fn servers(url: NatsUrls, err: &mut Problems<'_>) -> Option<(Vec<String>, bool)> {
    let urls = match url {
        NatsUrls::One(u) => vec![u],
        NatsUrls::Many(u) => u,
    };
    if urls.is_empty() {
        err.add("url", "names no server".into());
        return None;
    }
    let mut servers = Vec::new();
    let mut schemes = BTreeSet::new();
    for (i, u) in urls.iter().enumerate() {
        let field = if urls.len() == 1 {
            "url".to_string()
        } else {
            format!("url[{i}]")
        };
        match crate::shape::url::broker(u, ("nats", 4222), ("tls", 4222)) {
            Ok((host, port, tls)) => {
                schemes.insert(tls);
                let host = if host.contains(':') {
                    format!("[{host}]")
                } else {
                    host
                };
                servers.push(format!(
                    "{}://{host}:{port}",
                    if tls { "tls" } else { "nats" }
                ));
            }
            Err(m) => err.add(&field, m),
        }
    }
    if schemes.len() > 1 {
        err.add(
            "url",
            "mixes nats:// and tls://: the servers of one cluster are reached one way".into(),
        );
    }
    Some((servers, schemes.contains(&true)))
}

/// The ways to authenticate an entry gives (at most one may be set).
struct Ways {
    username: Option<String>,
    password: Option<String>,
    token: Option<String>,
    credentials_file: Option<String>,
    nkey_file: Option<String>,
}

/// The one way to authenticate `ways` gives; two ways, or half of user and password, refused.
fn auth(ways: Ways, base: &Path, err: &mut Problems<'_>) -> Auth {
    let spec = ways;
    let file = |p: String| base.join(p);
    let mut ways = Vec::new();
    if spec.username.is_some() || spec.password.is_some() {
        ways.push("username/password");
    }
    if spec.token.is_some() {
        ways.push("token");
    }
    if spec.credentials_file.is_some() {
        ways.push("credentials_file");
    }
    if spec.nkey_file.is_some() {
        ways.push("nkey_file");
    }
    if ways.len() > 1 {
        err.add(
            ways[1],
            format!("set with {}: give one way to authenticate", ways[0]),
        );
    }
    match (spec.username, spec.password) {
        (Some(user), Some(password)) => Auth::UserPassword {
            user,
            password: Secret(password),
        },
        (Some(_), None) => {
            err.add("password", "missing: username needs it".into());
            Auth::None
        }
        (None, Some(_)) => {
            err.add("username", "missing: password needs it".into());
            Auth::None
        }
        (None, None) => {
            if let Some(t) = spec.token {
                Auth::Token(Secret(t))
            } else if let Some(c) = spec.credentials_file {
                Auth::CredsFile(file(c))
            } else if let Some(k) = spec.nkey_file {
                Auth::NkeyFile(file(k))
            } else {
                Auth::None
            }
        }
    }
}
