//! The `type: prometheus_remote_write` sink entry: its file shape ([`RemoteWriteSinkSpec`]) and
//! its compilation into [`RemoteWriteConfig`]: the HTTP transport compiled as an `http` sink's
//! (`http::config::compile_http`), and the external labels checked. Called through the sinks' list
//! (`sink::compile_kind`) for `type: prometheus_remote_write`.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::super::config::{HttpSinkSpec, compile_http};
use super::{RemoteWriteConfig, valid_label_name};
use crate::shape::Problems;
use crate::shape::tls::TlsSpec;
#[cfg(feature = "schema")]
use crate::shape::units::u32_schema;
use crate::shape::units::{self, Dur, Size};
use crate::sink::config::{LinkSpec, RetrySpec, compile_link};
use crate::sink::kind::{Compile, KindSpec};

/// `type: prometheus_remote_write` settings (left out of a build without the sink, which refuses
/// the type by name).
// The transport's fields repeat `HttpSinkSpec`'s: serde's `flatten` would share them but turns
// `deny_unknown_fields` off, and a misspelt key must stay an error naming it.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RemoteWriteSinkSpec {
    /// The receiver's write URL (`http://` or `https://`), e.g.
    /// `http://prometheus:9090/api/v1/write` or `http://victoria:8428/api/v1/write`.
    pub url: String,
    /// Labels added to every series that has no label of that name (e.g. `gateway: gw-17`).
    /// Names are Prometheus label names (`[a-zA-Z_][a-zA-Z0-9_]*`).
    #[serde(default)]
    pub external_labels: BTreeMap<String, String>,
    /// Extra request headers, e.g. `Authorization: "Bearer ${TOKEN}"`. Values are never logged.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Longest wait for a whole request and its answer. Default 10s.
    #[serde(default)]
    pub timeout: Option<Dur>,
    /// Requests in flight at once, 1-64. Default 1, which keeps samples in order (a receiver
    /// without an out-of-order window needs that).
    #[serde(default, deserialize_with = "units::de_opt_u32")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "u32_schema"))]
    pub concurrency: Option<u32>,
    #[serde(default)]
    pub tls: TlsSpec,
    #[serde(default)]
    pub retry: RetrySpec,
    #[serde(default)]
    pub link: LinkSpec,
    /// Bytes per second (compressed) while a backlog is replayed. Unset: unlimited.
    #[serde(default)]
    pub replay_rate: Option<Size>,
}

impl KindSpec for RemoteWriteSinkSpec {
    type Config = RemoteWriteConfig;

    /// Its HTTP transport compiled as an `http` sink's, and its external labels checked.
    fn compile(mut self, cx: &mut Compile<'_, '_>) -> Option<RemoteWriteConfig> {
        cx.link = compile_link(&self.link, &self.url, cx.err);
        cx.retry = std::mem::take(&mut self.retry);
        check_labels(&self.external_labels, cx.err);
        let http = HttpSinkSpec {
            url: self.url,
            method: None,
            encoding: None,
            precision: None,
            compression: None,
            headers: self.headers,
            timeout: self.timeout,
            concurrency: self.concurrency,
            tls: self.tls,
            retry: RetrySpec::default(),
            link: LinkSpec::default(),
            replay_rate: self.replay_rate,
        };
        Some(RemoteWriteConfig {
            http: compile_http(http, cx)?,
            external_labels: self.external_labels.into_iter().collect(),
        })
    }
}

/// Each external label: a Prometheus label name, not one of Prometheus' own, with a value.
fn check_labels(labels: &BTreeMap<String, String>, err: &mut Problems<'_>) {
    for (name, value) in labels {
        let problem = if !valid_label_name(name) {
            Some("is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)")
        } else if name.starts_with("__") {
            Some("names starting with __ are Prometheus' own")
        } else if value.is_empty() {
            Some("an empty value is no label at all in Prometheus")
        } else {
            None
        };
        if let Some(m) = problem {
            err.add(&format!("external_labels.{name}"), m.into());
        }
    }
}
