//! The sources: producers that append records to a stream on their own, a closed set with one
//! folder per kind (`tail`, `syslog`, `mqtt`), and `ingest`, the HTTP API applications push
//! records to (a source too, though configured once at the top of the file rather than under
//! `sources:`: it is a listener that turns requests into appends, as `syslog` turns messages).
//! Owns the compiled [`Source`] (what `config` makes of a `sources:` entry and the agent starts,
//! restarts on reload and stops) and the counters of every source by kind. Does not know YAML
//! (`config::sources`) or how a kind reads (its folder).

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::metrics::Registry;
use crate::store::writer::StoreHandle;
use tail::{TailConfig, TailStats};

pub mod ingest;
#[cfg(feature = "mqtt")]
pub mod mqtt;
#[cfg(feature = "syslog")]
pub mod syslog;
pub mod tail;

/// Every source's counters, by kind and name (kept by the agent, read by the metrics page): a
/// source restarted by a reload, or removed and added again, goes on counting into the same ones.
#[derive(Default)]
pub struct SourceStats {
    pub tail: Registry<TailStats>,
    #[cfg(feature = "syslog")]
    pub syslog: Registry<syslog::SyslogStats>,
    #[cfg(feature = "mqtt")]
    pub mqtt: Registry<mqtt::MqttSourceStats>,
}

/// A compiled `sources:` entry.
#[derive(Debug, Clone)]
pub enum Source {
    Tail(Arc<TailConfig>),
    #[cfg(feature = "syslog")]
    Syslog(Arc<syslog::SyslogConfig>),
    #[cfg(feature = "mqtt")]
    Mqtt(Arc<mqtt::MqttSourceConfig>),
}

impl Source {
    pub fn name(&self) -> &str {
        match self {
            Source::Tail(t) => &t.name,
            #[cfg(feature = "syslog")]
            Source::Syslog(s) => &s.name,
            #[cfg(feature = "mqtt")]
            Source::Mqtt(m) => &m.name,
        }
    }

    /// The streams its records go to (an mqtt source's routes may name more than one).
    pub fn streams(&self) -> Vec<&str> {
        match self {
            Source::Tail(t) => vec![&t.stream],
            #[cfg(feature = "syslog")]
            Source::Syslog(s) => vec![&s.stream],
            #[cfg(feature = "mqtt")]
            Source::Mqtt(m) => m.streams(),
        }
    }

    /// For `colibri check`.
    pub fn describe(&self) -> String {
        match self {
            Source::Tail(t) => t.describe(),
            #[cfg(feature = "syslog")]
            Source::Syslog(s) => s.describe(),
            #[cfg(feature = "mqtt")]
            Source::Mqtt(m) => m.describe(),
        }
    }

    /// The kind, as `type:` names it.
    pub fn kind(&self) -> &'static str {
        match self {
            Source::Tail(_) => "tail",
            #[cfg(feature = "syslog")]
            Source::Syslog(_) => "syslog",
            #[cfg(feature = "mqtt")]
            Source::Mqtt(_) => "mqtt",
        }
    }
}

/// Listening sockets a source holds before it runs (a syslog source's ports), so that at
/// colibri's start a taken port stops the start. Empty for a source a reload starts: it binds on
/// its own, and retries while the port is taken.
#[derive(Default)]
pub struct Sockets {
    #[cfg(feature = "syslog")]
    syslog: syslog::Bound,
}

/// A socket a source listens on: `(setting, protocol, address)`, e.g. `("tcp", "tcp",
/// 127.0.0.1:514)`.
pub type Listen = (&'static str, &'static str, std::net::SocketAddr);

impl Source {
    /// The addresses the source listens on (what `colibri check --bind` tries).
    pub fn listens(&self) -> Vec<Listen> {
        match self {
            #[cfg(feature = "syslog")]
            Source::Syslog(cfg) => {
                let udp = cfg.udp.map(|a| ("udp", "udp", a));
                let tcp = cfg.tcp.map(|a| ("tcp", "tcp", a));
                udp.into_iter().chain(tcp).collect()
            }
            _ => Vec::new(),
        }
    }

    /// Binds the source's sockets now (inside the runtime); the error names the address.
    pub fn bind(&self) -> anyhow::Result<Sockets> {
        match self {
            #[cfg(feature = "syslog")]
            Source::Syslog(cfg) => Ok(Sockets {
                syslog: syslog::bind(cfg)
                    .map_err(|e| anyhow::anyhow!("{e} (sources.{}.{})", cfg.name, e.proto))?,
            }),
            _ => Ok(Sockets::default()),
        }
    }

    /// Runs the source until `stopping` (the agent's task for it), on `sockets` when bound.
    pub async fn run(
        self,
        stats: &SourceStats,
        store: StoreHandle,
        stopping: CancellationToken,
        sockets: Sockets,
    ) {
        // Only a syslog source takes sockets (without that kind built in, none does).
        let _ = &sockets;
        match self {
            Source::Tail(cfg) => {
                let stats = stats.tail.get(&cfg.name);
                crate::source::tail::run(cfg, stats, store, stopping).await;
            }
            #[cfg(feature = "syslog")]
            Source::Syslog(cfg) => {
                let stats = stats.syslog.get(&cfg.name);
                syslog::run(cfg, stats, store, stopping, sockets.syslog).await;
            }
            #[cfg(feature = "mqtt")]
            Source::Mqtt(cfg) => {
                let stats = stats.mqtt.get(&cfg.name);
                mqtt::run(cfg, stats, store, stopping).await;
            }
        }
    }
}
