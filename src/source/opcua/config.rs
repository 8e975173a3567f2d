//! A `type: opcua` source entry: its file shape ([`OpcuaSourceSpec`]) and its compilation into
//! `source::opcua::OpcuaSourceConfig` (the endpoint and its security checked, every node id
//! parsed, the intervals and deadbands settled per node, the record format taken from the
//! stream's sink). It connects to nothing: `source::opcua` does. Called through the sources'
//! list (`source::compile_kind`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::node::NodeRef;
use super::record::Output;
use super::{Deadband, Endpoint, Folder, Mode, Node, OpcuaSourceConfig, Security};
use crate::record::RecordFormat;
use crate::scrape::lineproto::Precision;
use crate::setting::Secret;
use crate::shape::Problems;
use crate::shape::units::Dur;
use crate::source::config::check_stream;
use crate::source::kind::{Compile, KindSpec};

/// `type: opcua` source settings.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct OpcuaSourceSpec {
    /// The server's endpoint, e.g. `opc.tcp://plc1:4840`.
    pub url: String,
    /// The stream each data change goes to, as one record: an influx line-protocol point when
    /// the stream's sink takes line protocol (measurement `measurement`, tags `node` and `tags`,
    /// fields `value`, `status`, `quality` and `server_time_ms`, at the source timestamp), else
    /// a JSON object (`node`, `id`, `value`, `status`, `quality`, `source_time_ms`,
    /// `server_time_ms`, `tags`).
    pub stream: String,
    /// `subscribe` (default): monitored items in one subscription, the server reports each
    /// change; `poll`: a Read of every node each `poll_interval`, for servers that limit
    /// monitored items.
    #[serde(default)]
    pub mode: Option<ModeSpec>,
    /// `None` (default), `Basic256Sha256`, `Aes128_Sha256_RsaOaep` or `Aes256_Sha256_RsaPss`.
    #[serde(default)]
    pub security_policy: Option<String>,
    /// `None` (default with the `None` policy), `Sign` or `SignAndEncrypt` (default with any
    /// other policy).
    #[serde(default)]
    pub security_mode: Option<String>,
    /// User name; anonymous when unset.
    #[serde(default)]
    pub username: Option<String>,
    /// Password for `username`, e.g. `${OPCUA_PASSWORD}`; never logged.
    #[serde(default)]
    pub password: Option<String>,
    /// A user certificate (DER or PEM) to log in with instead of a user name, with
    /// `user_private_key` (PEM).
    #[serde(default)]
    pub user_certificate: Option<PathBuf>,
    /// The private key of `user_certificate` (PEM).
    #[serde(default)]
    pub user_private_key: Option<PathBuf>,
    /// Where colibri keeps its application certificate, private key and the servers it
    /// trusts (`own/`, `private/`, `trusted/`, `rejected/`). Default
    /// `<data_dir>/opcua-pki/<source name>`; a certificate and key are generated there on first
    /// start when none is present.
    #[serde(default)]
    pub pki_dir: Option<PathBuf>,
    /// Trust the first certificate the server presents, once: it is written to the trusted
    /// directory (and its thumbprint logged), and from then on only it is accepted. Default
    /// false: the server's certificate must be in `<pki_dir>/trusted/` (a server refused
    /// for that is written to `rejected/`, to be moved by the operator).
    #[serde(default)]
    pub trust_on_first_use: bool,
    /// How often the server sends what changed (subscribe). Default 1s.
    #[serde(default)]
    pub publishing_interval: Option<Dur>,
    /// How often the server samples each node (subscribe), for every node that does not say.
    /// Default the publishing interval.
    #[serde(default)]
    pub sampling_interval: Option<Dur>,
    /// Changes the server keeps per node between two publishes (subscribe). Default 10.
    #[serde(default)]
    pub queue_size: Option<u32>,
    /// The server-side data change filter for every node that does not say: `{absolute: 0.5}`
    /// or `{percent: 2}` (of the node's EURange). Default none: every change.
    #[serde(default)]
    pub deadband: Option<DeadbandSpec>,
    /// How often every node is read (poll). Default 1s.
    #[serde(default)]
    pub poll_interval: Option<Dur>,
    /// The measurement of line-protocol records. Default `opcua`.
    #[serde(default)]
    pub measurement: Option<String>,
    /// Tags on every record (a node's own tags win).
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// The nodes to read.
    #[serde(default)]
    pub nodes: Vec<NodeSpec>,
    /// Folders whose variables are read too, found by browsing at every session (a variable
    /// added to the folder is read from the next session on).
    #[serde(default)]
    pub browse: Vec<BrowseSpec>,
}

/// One of an opcua source's `browse` entries: the variables under a folder whose browse name
/// matches a pattern, each read as a node named by its browse name.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct BrowseSpec {
    /// The folder (or any node), as a node's `id`.
    pub folder: String,
    /// A regex the browse name must match (default: every variable).
    #[serde(default)]
    pub pattern: Option<String>,
    /// Levels below the folder, 1 to 10 (default 1: its own variables).
    #[serde(default)]
    pub depth: Option<u32>,
    /// Their sampling interval (subscribe).
    #[serde(default)]
    pub sampling_interval: Option<Dur>,
    /// Their queue size (subscribe).
    #[serde(default)]
    pub queue_size: Option<u32>,
    /// Their data change filter (subscribe).
    #[serde(default)]
    pub deadband: Option<DeadbandSpec>,
    /// Tags on their records, over the source's.
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
}

/// How an opcua source reads.
#[derive(Debug, Clone, Copy, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ModeSpec {
    Subscribe,
    Poll,
}

/// A server-side data change filter.
#[derive(Debug, Clone, Copy, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum DeadbandSpec {
    /// A change smaller than this is not reported.
    Absolute(f64),
    /// A change smaller than this percentage of the node's EURange is not reported.
    Percent(f64),
}

/// One of an opcua source's `nodes`.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    /// The node: `nsu=<namespace URI>;s=Name` (kept across a server restart that renumbers its
    /// namespaces: the index is looked up at each connection) or `ns=2;s=Name`, `i=`, `g=`,
    /// `b=` identifiers as OPC UA writes them.
    pub id: String,
    /// The name its records carry (the `node` tag or field). Default the id's identifier.
    #[serde(default)]
    pub name: Option<String>,
    /// This node's sampling interval (subscribe).
    #[serde(default)]
    pub sampling_interval: Option<Dur>,
    /// This node's queue size (subscribe).
    #[serde(default)]
    pub queue_size: Option<u32>,
    /// This node's data change filter (subscribe).
    #[serde(default)]
    pub deadband: Option<DeadbandSpec>,
    /// Tags on this node's records, over the source's.
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
}

/// The security policies colibri offers, as the file names them and as OPC UA's URIs end.
pub const POLICIES: &[&str] = &[
    "None",
    "Basic256Sha256",
    "Aes128_Sha256_RsaOaep",
    "Aes256_Sha256_RsaPss",
];

impl KindSpec for OpcuaSourceSpec {
    type Config = OpcuaSourceConfig;

    fn compile(self, cx: &mut Compile<'_, '_>) -> Option<OpcuaSourceConfig> {
        let before = cx.err.count();
        check_stream(&self.stream, cx.streams, cx.err);
        let output = match (cx.format)(&self.stream) {
            RecordFormat::LineProtocol(p) => Output::Line(p),
            RecordFormat::Json => Output::Json,
            RecordFormat::Lines => Output::Line(Precision::Ns),
        };
        let err = &mut *cx.err;
        if !self.url.starts_with("opc.tcp://") {
            err.add(
                "url",
                format!("{:?} is not an opc.tcp:// endpoint", self.url),
            );
        }
        let security = security(&self, err);
        let nodes = nodes(&self, err);
        let folders = folders(&self, err);
        if self.nodes.is_empty() && self.browse.is_empty() {
            err.add(
                "nodes",
                "name at least one node to read (or a folder under browse:)".into(),
            );
        }
        let measurement = self.measurement.unwrap_or_else(|| "opcua".into());
        if let Err(m) = crate::scrape::lineproto::check_measurement(&measurement) {
            err.add("measurement", m);
        }
        let publishing = self
            .publishing_interval
            .map_or(Duration::from_secs(1), |d| d.0);
        let poll = self.poll_interval.map_or(Duration::from_secs(1), |d| d.0);
        for (field, d) in [("publishing_interval", publishing), ("poll_interval", poll)] {
            if d < Duration::from_millis(10) {
                err.add(field, "must be at least 10ms".into());
            }
        }
        if self.password.is_some() && self.username.is_none() {
            err.add("password", "is set without username".into());
        }
        let user_certificate = match (&self.user_certificate, &self.user_private_key) {
            (Some(c), Some(k)) => Some((cx.base.join(c), cx.base.join(k))),
            (None, None) => None,
            (Some(_), None) => {
                err.add("user_private_key", "is needed with user_certificate".into());
                None
            }
            (None, Some(_)) => {
                err.add("user_certificate", "is needed with user_private_key".into());
                None
            }
        };
        if user_certificate.is_some() && self.username.is_some() {
            err.add(
                "user_certificate",
                "and username are two identities: choose one".into(),
            );
        }
        if err.count() > before {
            return None;
        }
        Some(OpcuaSourceConfig {
            name: cx.name.to_string(),
            endpoint: Endpoint {
                url: self.url,
                security: security?,
                username: self.username,
                password: self.password.map(Secret),
                user_certificate,
                pki_dir: self.pki_dir.map_or_else(
                    || cx.data_dir.join("opcua-pki").join(cx.name),
                    |p| cx.base.join(p),
                ),
                trust_on_first_use: self.trust_on_first_use,
            },
            stream: self.stream,
            mode: match self.mode {
                Some(ModeSpec::Poll) => Mode::Poll(poll),
                None | Some(ModeSpec::Subscribe) => Mode::Subscribe(publishing),
            },
            state_file: cx.data_dir.join(format!("opcua-{}.subscription", cx.name)),
            measurement,
            output,
            nodes,
            folders,
        })
    }
}

/// The policy and mode, checked against each other.
fn security(spec: &OpcuaSourceSpec, err: &mut Problems<'_>) -> Option<Security> {
    checked_security(
        spec.security_policy.as_deref(),
        spec.security_mode.as_deref(),
    )
    .map_err(|(field, m)| err.add(field, m))
    .ok()
}

/// A security policy and mode as written (`None` for unset), checked against each other;
/// the field at fault and why. Also for `opcua browse`'s options.
pub fn checked_security(
    policy: Option<&str>,
    mode: Option<&str>,
) -> Result<Security, (&'static str, String)> {
    let policy = policy.unwrap_or("None");
    if !POLICIES.contains(&policy) {
        return Err((
            "security_policy",
            format!("{policy:?} is not one of {}", POLICIES.join(", ")),
        ));
    }
    let default_mode = if policy == "None" {
        "None"
    } else {
        "SignAndEncrypt"
    };
    let mode = mode.unwrap_or(default_mode);
    if !["None", "Sign", "SignAndEncrypt"].contains(&mode) {
        return Err((
            "security_mode",
            format!("{mode:?} is not one of None, Sign, SignAndEncrypt"),
        ));
    }
    if (policy == "None") != (mode == "None") {
        return Err((
            "security_mode",
            format!("{mode} does not go with security_policy {policy}: None goes with None only"),
        ));
    }
    Ok(Security {
        policy: policy.to_string(),
        mode: mode.to_string(),
    })
}

/// Every node parsed, its settings the node's own over the source's.
fn nodes(spec: &OpcuaSourceSpec, err: &mut Problems<'_>) -> Vec<Node> {
    let mut out: Vec<Node> = Vec::with_capacity(spec.nodes.len());
    for (i, n) in spec.nodes.iter().enumerate() {
        let at = |f: &str| format!("nodes[{i}].{f}");
        let id = match NodeRef::parse(&n.id) {
            Ok(id) => id,
            Err(m) => {
                err.add(&at("id"), m);
                continue;
            }
        };
        let name = n.name.clone().unwrap_or_else(|| id.identifier());
        if name.is_empty() {
            err.add(&at("name"), "must not be empty".into());
        }
        if let Some(other) = out.iter().find(|o| o.name == name) {
            err.add(
                &at("name"),
                format!("{name:?} is also the name of node {}", other.id.text),
            );
        }
        let own = Own {
            sampling: n.sampling_interval,
            queue_size: n.queue_size,
            deadband: n.deadband,
            tags: &n.tags,
        };
        out.push(node(spec, id, name, &own, &format!("nodes[{i}]"), err));
    }
    out
}

/// A node's or a folder's own settings, over the source's.
struct Own<'a> {
    sampling: Option<Dur>,
    queue_size: Option<u32>,
    deadband: Option<DeadbandSpec>,
    tags: &'a BTreeMap<String, String>,
}

/// A node with its settings settled (its own over the source's); problems under `at`.
fn node(
    spec: &OpcuaSourceSpec,
    id: NodeRef,
    name: String,
    own: &Own<'_>,
    at: &str,
    err: &mut Problems<'_>,
) -> Node {
    let deadband = own.deadband.or(spec.deadband).map(|d| match d {
        DeadbandSpec::Absolute(v) => Deadband::Absolute(v),
        DeadbandSpec::Percent(v) => Deadband::Percent(v),
    });
    if let Some(Deadband::Absolute(v) | Deadband::Percent(v)) = deadband
        && !(v.is_finite() && v >= 0.0)
    {
        err.add(
            &format!("{at}.deadband"),
            format!("{v} is not a non-negative number"),
        );
    }
    let mut tags = spec.tags.clone();
    tags.extend(own.tags.clone());
    if tags.iter().any(|(k, v)| k.is_empty() || v.is_empty()) {
        err.add(
            &format!("{at}.tags"),
            "keys and values must not be empty".into(),
        );
    }
    Node {
        id,
        name,
        sampling: own
            .sampling
            .or(spec.sampling_interval)
            .or(spec.publishing_interval)
            .map_or(Duration::from_secs(1), |d| d.0),
        queue_size: own.queue_size.or(spec.queue_size).unwrap_or(10).max(1),
        deadband,
        tags: tags.into_iter().collect(),
    }
}

/// Every `browse` entry checked: its folder parsed, its pattern compiled, its depth in range.
fn folders(spec: &OpcuaSourceSpec, err: &mut Problems<'_>) -> Vec<Folder> {
    let mut out = Vec::new();
    for (i, b) in spec.browse.iter().enumerate() {
        let at = format!("browse[{i}]");
        let folder = NodeRef::parse(&b.folder).map_err(|m| err.add(&format!("{at}.folder"), m));
        let pattern = match b.pattern.as_deref().map(regex_lite::Regex::new) {
            None => None,
            Some(Ok(re)) => Some(re),
            Some(Err(e)) => {
                err.add(&format!("{at}.pattern"), format!("bad regex: {e}"));
                None
            }
        };
        let depth = b.depth.unwrap_or(1);
        if !(1..=10).contains(&depth) {
            err.add(
                &format!("{at}.depth"),
                format!("must be 1 to 10, not {depth}"),
            );
        }
        let own = Own {
            sampling: b.sampling_interval,
            queue_size: b.queue_size,
            deadband: b.deadband,
            tags: &b.tags,
        };
        let Ok(folder) = folder else { continue };
        // The template every variable found is read with (its id and name filled in then).
        let template = node(spec, folder.clone(), String::new(), &own, &at, err);
        out.push(Folder {
            folder,
            pattern,
            depth: depth as usize,
            template,
        });
    }
    out
}
