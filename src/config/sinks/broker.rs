//! What the broker sinks' entries (`mqtt`, `nats`) check alike: the message template and `batch`,
//! the default client name, `timeout`, `concurrency`, `replay_rate`, and a `tls` block that
//! applies only to TLS URLs. Called by `sinks::mqtt` and `sinks::nats`.

use std::path::Path;
use std::time::Duration;

use super::super::Problems;
use super::super::units::{Dur, Size};
use super::TlsSpec;
use crate::net::tls_client::TlsConfig;
use crate::sink::template::{Rules, Template};

/// `template` (under `field`) parsed; with `batch`, one naming a record's field is refused.
pub(super) fn template(
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

/// The name a connection has unless the file gives one: stable across restarts, different for
/// each machine and sink (two sinks with one MQTT client id would throw each other off).
pub(in crate::config) fn default_client_name(sink: &str) -> String {
    let host = crate::net::hostname().unwrap_or_else(|| "unknown".into());
    format!("colibri-{host}-{sink}")
}

/// An MQTT client id unless the file gives one: the default name (`name`: the sink's, or
/// `source-<name>` for a source) and a key of the store (`colibri-<host>-<name>-<8 hex digits>`).
/// Two agents on one host (each its own `data_dir`) with an entry of one name must not share it:
/// a source would resume the other's session and take the messages meant for it, and two sinks
/// would throw each other off the broker at every reconnect. The key is of the store's place, not
/// of its store id, which changes when a damaged store is salvaged: a source's session must
/// outlive that.
#[cfg(feature = "mqtt")]
pub(in crate::config) fn default_mqtt_client_id(name: &str, data_dir: &Path) -> String {
    format!("{}-{:08x}", default_client_name(name), store_key(data_dir))
}

/// 32 bits of the FNV-1a hash of `data_dir`'s canonical path: the same for every spelling of one
/// directory (relative, through a symlink, with `..`), before the directory exists as after.
#[cfg(feature = "mqtt")]
fn store_key(data_dir: &Path) -> u32 {
    use std::os::unix::ffi::OsStrExt as _;
    let hash = crate::files::fnv1a(canonical(data_dir).as_os_str().as_bytes());
    (hash ^ (hash >> 32)) as u32
}

/// `path` made absolute with its symlinks resolved, as far as it exists: the part that does not
/// exist yet (a data_dir made at the first run) is appended as written, which is what it resolves
/// to once made.
#[cfg(feature = "mqtt")]
fn canonical(path: &Path) -> std::path::PathBuf {
    let mut rest = Vec::new();
    let mut at = path;
    loop {
        if let Ok(real) = std::fs::canonicalize(at) {
            return rest.iter().rev().fold(real, |p, c| p.join(c));
        }
        match (at.parent(), at.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                at = parent;
            }
            // Nothing of it exists (a relative path's first component, `..`): as written.
            _ => return std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()),
        }
    }
}

/// `timeout` (default 10s), `concurrency` (1-64, default 1) and `replay_rate` checked.
pub(super) fn limits(
    timeout: Option<Dur>,
    concurrency: Option<u32>,
    replay_rate: Option<Size>,
    err: &mut Problems<'_>,
) -> (Duration, usize, Option<u64>) {
    let timeout = timeout.map_or(Duration::from_secs(10), |d| d.0);
    if timeout.is_zero() {
        err.add("timeout", "must be positive".into());
    }
    let concurrency = concurrency.unwrap_or(1);
    if !(1..=64).contains(&concurrency) {
        err.add(
            "concurrency",
            format!("must be between 1 and 64, not {concurrency}"),
        );
    }
    if replay_rate.is_some_and(|r| r.0 == 0) {
        err.add(
            "replay_rate",
            "must be positive (leave it out for unlimited)".into(),
        );
    }
    (timeout, concurrency as usize, replay_rate.map(|r| r.0))
}

/// The `tls` block for a connection that uses TLS (`tls`), its files read from `base`; set on a
/// connection without TLS, it is refused (`scheme` names the TLS URL scheme).
pub(in crate::config) fn tls(
    spec: TlsSpec,
    tls: bool,
    scheme: &str,
    base: &Path,
    err: &mut Problems<'_>,
) -> Option<TlsConfig> {
    let set = spec.ca_file.is_some()
        || spec.client_cert.is_some()
        || spec.client_key.is_some()
        || spec.server_name.is_some();
    if set && !tls {
        err.add("tls", format!("applies to {scheme}:// URLs only"));
    }
    let file = |p: Option<String>| p.map(|p| base.join(p));
    tls.then(|| TlsConfig {
        ca_file: file(spec.ca_file),
        client_cert: file(spec.client_cert),
        client_key: file(spec.client_key),
        server_name: spec.server_name,
    })
}

/// The host, port and whether TLS is used, from a broker URL of the `plain` or `tls` scheme (each
/// with its default port): a host and a port, no path, no credentials (they have settings of their
/// own, which are never logged).
pub(in crate::config) fn url(
    s: &str,
    plain: (&str, u16),
    tls: (&str, u16),
) -> Result<(String, u16, bool), String> {
    let url = reqwest::Url::parse(s).map_err(|e| format!("{s:?} is not a valid URL: {e}"))?;
    let (tls, default_port) = match url.scheme() {
        scheme if scheme == plain.0 => (false, plain.1),
        scheme if scheme == tls.0 => (true, tls.1),
        other => {
            return Err(format!(
                "{s:?}: the scheme must be {} or {}, not {other}",
                plain.0, tls.0
            ));
        }
    };
    if !url.username().is_empty() || url.password().is_some() {
        return Err(format!(
            "{s:?} holds credentials: set them in their own settings instead (they are never logged)"
        ));
    }
    if !matches!(url.path(), "" | "/") || url.query().is_some() {
        return Err(format!("{s:?}: a broker URL is a host and a port, no path"));
    }
    let host = url
        .host_str()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| format!("{s:?} has no host"))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    Ok((host, url.port().unwrap_or(default_port), tls))
}
