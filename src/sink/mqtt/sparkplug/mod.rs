//! Sparkplug B on the `mqtt` sink (`encoding: sparkplug_b`; the session's code under the cargo
//! feature `sparkplug`): colibri as an edge node that a SCADA host understands. It owns the
//! `sparkplug:` settings (their file shape [`SparkplugSpec`], compiled into [`SparkplugConfig`])
//! and, in its files, the payload (`payload`), what the node has announced (`registry`), the
//! session (`node`: bdSeq, seq, births, rebirth, the primary host's STATE) and a job's messages
//! (`data`). The connection's
//! driver (`conn`) tells the node what happens to the connection; the sink asks it for a job's
//! messages and waits for their acknowledgements itself.
//!
//! A record (line protocol, ms) is one or more metrics of one device: the device is named by the
//! stream, the record's measurement or one of its tags (`device`); each field is a metric, named
//! by the field, after the values of the `metric_tags` (`<tag value>/.../<field>`).

use std::path::PathBuf;

use serde::Deserialize;

use crate::shape::Problems;

#[cfg(feature = "sparkplug")]
mod data;
#[cfg(feature = "sparkplug")]
pub mod node;
/// Without the feature no node exists (the config refuses the encoding): the type the sink and
/// the driver hold as `Option<Arc<Node>>`, always `None`.
#[cfg(not(feature = "sparkplug"))]
pub mod node {
    use std::sync::Arc;

    use crate::sink::mqtt::client::Client;
    use crate::sink::mqtt::settings::Qos;

    pub enum Node {}

    impl Node {
        pub fn new(_: super::SparkplugConfig, _: Qos) -> Option<Arc<Node>> {
            None
        }
        pub fn will(&self) -> (String, Vec<u8>) {
            match *self {}
        }
        pub fn connected(self: &Arc<Self>, _: &Client, _: Option<u32>) {
            match **self {}
        }
        pub fn lost(&self) -> (String, Vec<u8>) {
            match *self {}
        }
        pub fn incoming(self: &Arc<Self>, _: &Client, _: &str, _: &[u8]) -> bool {
            match **self {}
        }
        pub fn waiting(&self) -> Option<String> {
            match *self {}
        }
    }
}
#[cfg(feature = "sparkplug")]
mod payload;
#[cfg(feature = "sparkplug")]
mod registry;

/// `sparkplug:` of an `mqtt` sink with `encoding: sparkplug_b`.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct SparkplugSpec {
    /// The Sparkplug group, e.g. `plant1` (the second part of every topic).
    pub group_id: String,
    /// This edge node's id within the group, e.g. `gw-17`.
    pub edge_node_id: String,
    /// What names a record's device: `stream` (default: a device per stream, named for it),
    /// `measurement` (the line-protocol measurement, e.g. a modbus task's name), or
    /// `tag:<name>` (that tag's value; a record without it goes to the dead letters).
    #[serde(default)]
    pub device: Option<String>,
    /// Tags whose values name a metric's folders, before the field: with `[node]`, an opcua
    /// record `opcua,node=Temp value=21.5` is metric `Temp/value`. Default none: the field alone.
    #[serde(default)]
    pub metric_tags: Vec<String>,
    /// The primary host application's id: colibri births and sends only while its STATE
    /// (`spBv1.0/STATE/<id>`) says online; otherwise data waits in the stream (no attempt spent)
    /// and goes out afterwards with `is_historical: true`.
    #[serde(default)]
    pub primary_host_id: Option<String>,
}

/// The compiled `sparkplug:` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SparkplugConfig {
    pub group_id: String,
    pub edge_node_id: String,
    pub device: DeviceFrom,
    pub metric_tags: Vec<String>,
    pub primary_host_id: Option<String>,
    /// `<data_dir>/sparkplug-<sink>.bdseq`: the next connection's bdSeq, kept across restarts
    /// so that each connection's NBIRTH and NDEATH carry a number the one before did not.
    pub bd_seq_file: PathBuf,
}

/// What names a record's device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceFrom {
    Stream,
    Measurement,
    Tag(String),
}

/// Whether `id` may be a Sparkplug group, node, device or host id (a topic level without
/// wildcards); the error completes "... which".
pub fn check_id(id: &str) -> Result<(), &'static str> {
    if id.is_empty() {
        Err("is empty")
    } else if id.contains(['/', '+', '#', '\0']) {
        Err("contains `/`, `+`, `#` or NUL (a Sparkplug id is one topic level)")
    } else if id.len() > MAX_ID {
        Err("is longer than 1024 bytes")
    } else {
        Ok(())
    }
}

/// The longest id taken: four of them make a topic, which MQTT caps at 65,535 bytes.
const MAX_ID: usize = 1024;

impl SparkplugSpec {
    /// The settings, each problem under `sparkplug.<field>`.
    pub fn compile(self, bd_seq_file: PathBuf, err: &mut Problems<'_>) -> SparkplugConfig {
        let mut id = |field: &str, v: &str| {
            if let Err(m) = check_id(v) {
                err.add(&format!("sparkplug.{field}"), format!("{v:?} {m}"));
            }
        };
        id("group_id", &self.group_id);
        id("edge_node_id", &self.edge_node_id);
        if let Some(h) = &self.primary_host_id {
            id("primary_host_id", h);
        }
        let device = match self.device.as_deref() {
            None | Some("stream") => DeviceFrom::Stream,
            Some("measurement") => DeviceFrom::Measurement,
            Some(t) if t.starts_with("tag:") && t.len() > 4 => DeviceFrom::Tag(t[4..].to_string()),
            Some(other) => {
                err.add(
                    "sparkplug.device",
                    format!("must be stream, measurement or tag:<name>, not {other:?}"),
                );
                DeviceFrom::Stream
            }
        };
        SparkplugConfig {
            group_id: self.group_id,
            edge_node_id: self.edge_node_id,
            device,
            metric_tags: self.metric_tags,
            primary_host_id: self.primary_host_id,
            bd_seq_file,
        }
    }
}
