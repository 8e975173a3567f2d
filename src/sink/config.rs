//! The file shape every sink kind shares, below the kinds: `retry` ([`RetrySpec`]), `link`
//! ([`LinkSpec`], compiled by [`compile_link`], or [`broker_link`] for a sink probed by connecting)
//! and a broker's message [`template`]. `timeout`, `concurrency` and `replay_rate` are checked by
//! `kind::Compile::limits`. Each kind's `config.rs` declares the fields its entry has and calls
//! these; `kind::Compile::finish` checks `retry`.

use serde::Deserialize;

#[cfg(any(feature = "mqtt", feature = "nats", feature = "kafka"))]
use super::template::{Rules, Template};
use super::{LinkConfig, Probe};
use crate::shape::Problems;
#[cfg(feature = "schema")]
use crate::shape::units::u32_schema;
use crate::shape::units::{self, Dur};
use crate::shape::url::http as parse_http_url;

/// How failed deliveries are retried.
#[derive(Debug, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RetrySpec {
    /// First retry delay; attempt n waits `base * 2^n * (0.5 + random)`, at most `cap`. Default 1s.
    #[serde(default)]
    pub base: Option<Dur>,
    /// Longest retry delay. Default 5m.
    #[serde(default)]
    pub cap: Option<Dur>,
    /// Attempts before a job goes to the dead letters. Default 8.
    #[serde(default, deserialize_with = "units::de_opt_u32")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "u32_schema"))]
    pub max_attempts: Option<u32>,
}

/// When the destination counts as unreachable and how it is probed until it answers.
#[derive(Debug, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
// The schema keeps the name the type had when `LinkSpec` was a runtime type: the committed schema
// (and editors' references into it) stay as they are.
#[cfg_attr(feature = "schema", schemars(rename = "LinkSpecFile"))]
pub struct LinkSpec {
    /// `tcp` (default: connect to the URL's host and port) or `http` (a GET of `probe_url`, or of
    /// `url`, that gets any answer).
    #[serde(default)]
    pub probe: Option<ProbeSpec>,
    /// The URL an `http` probe GETs. Default: the sink's `url`.
    #[serde(default)]
    pub probe_url: Option<String>,
    /// Consecutive requests without an answer that turn the link down. Default 3.
    #[serde(default, deserialize_with = "units::de_opt_u32")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "u32_schema"))]
    pub down_after: Option<u32>,
    /// First probe delay; then doubling with jitter. Default 1s.
    #[serde(default)]
    pub backoff_base: Option<Dur>,
    /// Longest probe delay. Default: 2s with `probe: tcp` (a connect is cheap, so it runs every 2s
    /// however long the outage, and the link's return is noticed within about 2s, plus the
    /// connect's SYN retries, within the sink's `timeout`, on a path that drops packets), 60s with
    /// `probe: http` (a GET costs the receiver a request); never below a `backoff_base` that is
    /// set. A probe that passes while requests still get no answer (TLS, credentials) makes the
    /// next tries back off to 60s, or to this when it is set.
    #[serde(default)]
    pub backoff_cap: Option<Dur>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ProbeSpec {
    Tcp,
    Http,
}

/// `template` (under `field`) parsed; with `batch`, one naming a record's field is refused.
#[cfg(any(feature = "mqtt", feature = "nats", feature = "kafka"))]
pub fn template(
    field: &str,
    template: &str,
    rules: Rules,
    batch: bool,
    err: &mut Problems<'_>,
) -> Option<Template> {
    let t = Template::parse(template, rules)
        .map_err(|m| err.add(field, m))
        .ok()?;
    if batch && t.uses_fields() {
        err.add(
            field,
            "names a record's field, and batch: true sends a job's records as one message".into(),
        );
    }
    Some(t)
}

/// A broker sink's link: probed by connecting (only the broker's answer proves it takes messages),
/// so `probe` and `probe_url` are refused; the rest as for any sink.
#[cfg(any(feature = "mqtt", feature = "nats", feature = "kafka"))]
pub fn broker_link(spec: LinkSpec, what: &str, err: &mut Problems<'_>) -> LinkConfig {
    if spec.probe.is_some() || spec.probe_url.is_some() {
        err.add(
            "link.probe",
            format!("does not apply: {what} sink is probed by connecting to the broker"),
        );
    }
    let spec = LinkSpec {
        probe: None,
        probe_url: None,
        ..spec
    };
    compile_link(&spec, "", err)
}

pub fn compile_link(spec: &LinkSpec, url: &str, err: &mut Problems<'_>) -> LinkConfig {
    let probe = match (spec.probe, &spec.probe_url) {
        (None | Some(ProbeSpec::Tcp), None) => Probe::Tcp,
        (None | Some(ProbeSpec::Tcp), Some(_)) => {
            err.add("link.probe_url", "is only used with probe: http".into());
            Probe::Tcp
        }
        (Some(ProbeSpec::Http), u) => {
            match parse_http_url(u.as_deref().unwrap_or(url)) {
                Ok(u) => Probe::Http(u),
                // A bad sink URL is reported under `url` already.
                Err(m) => {
                    if u.is_some() {
                        err.add("link.probe_url", m);
                    }
                    Probe::Tcp
                }
            }
        }
    };
    let d = LinkConfig::for_probe(probe);
    let backoff_base = spec.backoff_base.map_or(d.backoff_base, |x| x.0);
    // A cap that is set is honoured for probes and trials alike (and refused below a base); an
    // unset one is the probe kind's, never below a base that is set, so a file that sets only a
    // long `backoff_base` stays valid whatever the kind's default cap.
    let (backoff_cap, trial_cap) = match spec.backoff_cap {
        Some(cap) => (cap.0, cap.0),
        None => (
            d.backoff_cap.max(backoff_base),
            d.trial_cap.max(backoff_base),
        ),
    };
    let link = LinkConfig {
        down_after: spec.down_after.unwrap_or(d.down_after),
        backoff_base,
        backoff_cap,
        trial_cap,
        ..d
    };
    if link.down_after == 0 {
        err.add("link.down_after", "must be at least 1".into());
    }
    if link.backoff_base.is_zero() {
        err.add("link.backoff_base", "must be positive".into());
    }
    if link.backoff_cap < link.backoff_base {
        err.add(
            "link.backoff_cap",
            "must not be shorter than link.backoff_base".into(),
        );
    }
    link
}
