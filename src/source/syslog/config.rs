//! A `type: syslog` source entry: its file shape ([`SyslogSpec`]) and its compilation into
//! [`SyslogConfig`]. Called through the sources' list (`source::compile_kind`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

use serde::Deserialize;

use super::SyslogConfig;
use crate::shape::Problems;
#[cfg(feature = "schema")]
use crate::shape::units::u32_schema;
use crate::shape::units::{Dur, Size, de_opt_u32};
use crate::source::config::{check_stream, regexes};
use crate::source::kind::{Compile, KindSpec};

/// Longest `max_message_bytes` accepted.
const MAX_MESSAGE_LIMIT: u64 = 16 << 20;
/// Most `max_connections` accepted.
const MAX_CONNECTIONS_LIMIT: u32 = 65_536;

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct SyslogSpec {
    /// The stream the messages go to. Its records are JSON objects: `message`, and as the message
    /// gives them `time` (RFC 3339), `host`, `app`, `procid`, `msgid`, `facility`, `severity`
    /// (names such as `daemon` and `warning`), `structured_data` (`{"id": {"param": "value"}}`)
    /// and `protocol` (`rfc5424` or `rfc3164`); always `received` (when colibri read it) and
    /// `peer` (the sender's address); `truncated: true` when cut at `max_message_bytes`; `labels`
    /// when set. A message that neither RFC describes is kept whole as `message` with
    /// `unparsed: true`. RFC 3164 times carry no zone and no year: they are read in the machine's
    /// local zone, in the year that puts them nearest to now.
    pub stream: String,
    /// Address to receive UDP datagrams on (one message each, RFC 5426), e.g. `0.0.0.0:514` or
    /// `127.0.0.1:5514`. At least one of `udp` and `tcp` is needed.
    #[serde(default)]
    pub udp: Option<String>,
    /// The UDP socket's receive buffer (`SO_RCVBUF`), e.g. `8MiB`: what a burst can fill before
    /// the kernel drops datagrams (counted in `colibri_syslog_udp_receive_buffer_dropped_total`).
    /// The kernel caps it at `net.core.rmem_max` (a smaller grant is logged). Default: the
    /// kernel's (`net.core.rmem_default`); at most 1GiB.
    #[serde(default)]
    pub receive_buffer: Option<Size>,
    /// Address to accept TCP connections on. Each message is framed by octet counting (`LEN MSG`,
    /// rsyslog's `TCP_Framing="octet-counted"`) or ends with a newline; both are recognised per
    /// message.
    #[serde(default)]
    pub tcp: Option<String>,
    /// TCP connections open at once. When all are open, the one idle longest is closed for a
    /// newcomer (and counted), so idle connections cannot lock a sender out. Default 256.
    #[serde(default, deserialize_with = "de_opt_u32")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "u32_schema"))]
    pub max_connections: Option<u32>,
    /// Longer messages are cut to this many bytes (marked `"truncated": true`, and counted); the
    /// rest is skipped. Default 64KiB; at most 16MiB.
    #[serde(default)]
    pub max_message_bytes: Option<Size>,
    /// Drops messages less severe than this: `emerg`, `alert`, `crit`, `err`, `warning`,
    /// `notice`, `info` or `debug` (the default keeps all). Messages without a severity are kept.
    #[serde(default)]
    pub min_severity: Option<SeveritySpec>,
    /// Regular expressions; when given, only messages (as received) matching at least one are kept.
    #[serde(default)]
    pub include_lines: Vec<String>,
    /// Regular expressions; messages matching any are dropped (after `include_lines`).
    #[serde(default)]
    pub exclude_lines: Vec<String>,
    /// A TCP connection that sends nothing for this long is closed. Default 10m: a quiet sender
    /// connects again for its next message; a connection a vanished or hostile peer left open
    /// gives back its slot.
    #[serde(default)]
    pub idle_timeout: Option<Dur>,
    /// Fields added to every record under `labels`.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// TLS on the TCP listener (RFC 5425, syslog over TLS: rsyslog's `gtls`/`ossl` stream drivers
    /// send octet-counted frames). Without it TCP is plain.
    #[serde(default)]
    pub tls: Option<crate::shape::listener_tls::ListenerTlsSpec>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum SeveritySpec {
    Emerg,
    Alert,
    Crit,
    Err,
    Warning,
    Notice,
    Info,
    Debug,
}

impl KindSpec for SyslogSpec {
    type Config = SyslogConfig;

    fn compile(self, cx: &mut Compile<'_, '_>) -> Option<SyslogConfig> {
        compile(cx.name, self, cx.base, cx.streams, cx.err)
    }
}

/// Compiles one syslog source; problems go to `err` with paths relative to the source.
fn compile(
    name: &str,
    spec: SyslogSpec,
    base: &Path,
    streams: &[&str],
    err: &mut Problems<'_>,
) -> Option<SyslogConfig> {
    check_stream(&spec.stream, streams, err);
    let addr = |field: &str, text: &Option<String>, err: &mut Problems<'_>| {
        let text = text.as_deref()?;
        match text.parse::<SocketAddr>() {
            Ok(a) => Some(a),
            Err(_) => {
                err.add(
                    field,
                    format!("{text:?} is not an address and port (e.g. 0.0.0.0:514 or [::]:514)"),
                );
                None
            }
        }
    };
    let udp = addr("udp", &spec.udp, err);
    let tcp = addr("tcp", &spec.tcp, err);
    if spec.udp.is_none() && spec.tcp.is_none() {
        err.add("", "a syslog source needs `udp`, `tcp` or both".into());
    }
    let max_connections = spec
        .max_connections
        .unwrap_or(crate::source::syslog::DEFAULT_MAX_CONNECTIONS as u32);
    if max_connections == 0 || max_connections > MAX_CONNECTIONS_LIMIT {
        err.add(
            "max_connections",
            format!("must be between 1 and {MAX_CONNECTIONS_LIMIT}, not {max_connections}"),
        );
    }
    let max_message_bytes = spec.max_message_bytes.map_or(
        crate::source::syslog::DEFAULT_MAX_MESSAGE_BYTES as u64,
        |s| s.0,
    );
    if max_message_bytes == 0 || max_message_bytes > MAX_MESSAGE_LIMIT {
        err.add(
            "max_message_bytes",
            format!("must be between 1 byte and 16MiB, not {max_message_bytes} bytes"),
        );
    }
    if let Some(d) = &spec.idle_timeout
        && d.0.is_zero()
    {
        err.add("idle_timeout", "must be more than 0".into());
    }
    let receive_buffer = spec.receive_buffer.map(|s| s.0);
    if let Some(bytes) = receive_buffer {
        let max = crate::source::syslog::udp::MAX_RECEIVE_BUFFER;
        if spec.udp.is_none() {
            err.add(
                "receive_buffer",
                "is the UDP socket's: set `udp` too".into(),
            );
        } else if !(1024..=max).contains(&bytes) {
            err.add(
                "receive_buffer",
                format!("must be between 1KiB and 1GiB, not {bytes} bytes"),
            );
        }
    }
    let tls = spec.tls.and_then(|t| {
        if spec.tcp.is_none() {
            err.add("tls", "TLS is for the TCP listener: set `tcp` too".into());
            return None;
        }
        crate::shape::listener_tls::compile(t, base, err).map(|t| t.config())
    });
    let filter = crate::record::filter::Filter {
        include: regexes("include_lines", &spec.include_lines, err),
        exclude: regexes("exclude_lines", &spec.exclude_lines, err),
        min_level: None,
    };
    Some(SyslogConfig {
        name: name.to_string(),
        stream: spec.stream,
        udp,
        receive_buffer: receive_buffer.map(|b| b as usize),
        tcp,
        max_connections: max_connections as usize,
        max_message_bytes: max_message_bytes as usize,
        min_severity: spec.min_severity.map(|s| s as u8),
        filter,
        idle_timeout: spec
            .idle_timeout
            .map_or(crate::source::syslog::DEFAULT_IDLE_TIMEOUT, |d| d.0),
        labels: spec.labels.into_iter().collect(),
        tls,
    })
}

#[cfg(test)]
mod tests {
    use crate::config::{ConfigError, load_str};
    use crate::source::Source;
    use std::path::Path;

    fn load(source: &str) -> Result<crate::source::syslog::SyslogConfig, Vec<String>> {
        let text =
            format!("data_dir: /tmp/x\nstreams:\n  logs: {{}}\nsources:\n  plant: {source}\n");
        match load_str(&text, Path::new("/etc/colibri/colibri.yaml"), &|_| None) {
            Ok(c) => match &c.sources[0] {
                Source::Syslog(s) => Ok((**s).clone()),
                other => panic!("not a syslog source: {other:?}"),
            },
            Err(ConfigError::Invalid { problems, .. }) => {
                Err(problems.iter().map(|p| p.to_string()).collect())
            }
            Err(other) => Err(vec![other.to_string()]),
        }
    }

    #[test]
    fn a_full_syslog_source_compiles() {
        let s = load(
            "{ type: syslog, stream: logs, udp: '127.0.0.1:5514', tcp: '[::1]:6514', max_connections: 8, max_message_bytes: 8KiB, min_severity: warning, include_lines: [plc], exclude_lines: [heartbeat], idle_timeout: 5m, receive_buffer: 4MiB, labels: { site: a } }",
        )
        .unwrap();
        assert_eq!(s.udp.unwrap().to_string(), "127.0.0.1:5514");
        assert_eq!(s.tcp.unwrap().to_string(), "[::1]:6514");
        assert_eq!((s.max_connections, s.max_message_bytes), (8, 8192));
        assert_eq!(s.min_severity, Some(4));
        assert!(s.filter.keeps("a plc said", "") && !s.filter.keeps("plc heartbeat", ""));
        assert_eq!(s.idle_timeout, std::time::Duration::from_secs(300));
        assert_eq!(s.receive_buffer, Some(4 << 20));
        assert_eq!(s.labels, [("site".to_string(), "a".to_string())]);
        let d = load("{ type: syslog, stream: logs, tcp: '0.0.0.0:514' }").unwrap();
        assert_eq!((d.max_connections, d.max_message_bytes), (256, 65536));
        assert_eq!(
            (d.udp, d.min_severity, d.idle_timeout, d.receive_buffer),
            (
                None,
                None,
                crate::source::syslog::DEFAULT_IDLE_TIMEOUT,
                None
            )
        );
    }

    #[test]
    fn bad_settings_are_named() {
        let p = load(
            "{ type: syslog, stream: nope, udp: 'localhost', max_connections: 0, max_message_bytes: 32MiB, include_lines: ['('], idle_timeout: 0s }",
        )
        .unwrap_err();
        let want = [
            "sources.plant.stream: stream \"nope\" is not defined",
            "sources.plant.udp: \"localhost\" is not an address and port",
            "sources.plant.max_connections: must be between 1 and 65536, not 0",
            "sources.plant.max_message_bytes: must be between 1 byte and 16MiB",
            "sources.plant.include_lines[0]: bad regex",
            "sources.plant.idle_timeout: must be more than 0",
        ];
        for w in want {
            assert!(p.iter().any(|x| x.starts_with(w)), "no {w:?} in {p:#?}");
        }
        assert_eq!(p.len(), want.len(), "{p:#?}");
        let p = load("{ type: syslog, stream: logs }").unwrap_err();
        assert!(
            p[0].starts_with("sources.plant: a syslog source needs `udp`, `tcp` or both"),
            "{p:?}"
        );
        let p = load("{ type: syslog, stream: logs, tcp: '127.0.0.1:6514', tls: { cert_file: no.pem, key_file: no.key } }").unwrap_err();
        assert!(
            p[0].starts_with("sources.plant.tls.cert_file: /etc/colibri/no.pem: "),
            "{p:?}"
        );
        let p = load("{ type: syslog, stream: logs, udp: '127.0.0.1:514', tls: { cert_file: a, key_file: b } }").unwrap_err();
        assert!(
            p[0].starts_with("sources.plant.tls: TLS is for the TCP listener"),
            "{p:?}"
        );
        let p =
            load("{ type: syslog, stream: logs, tcp: ':514', min_severity: loud }").unwrap_err();
        assert!(
            p[0].starts_with("sources.plant.min_severity: unknown variant `loud`"),
            "{p:?}"
        );
    }
}
