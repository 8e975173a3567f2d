//! The sources: producers that append records to a stream on their own, a closed set with one
//! module per kind (`tail`, `syslog`, `mqtt_source`). Owns the compiled [`Source`] (what `config` makes of a
//! `sources:` entry and the agent starts, restarts on reload and stops) and the counters of every
//! source by kind. Does not know YAML (`config::sources`) or how a
//! kind reads (its module).

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::metrics::Registry;
use crate::store::writer::StoreHandle;
use crate::tail::{TailConfig, TailStats};

/// Every source's counters, by kind and name (kept by the agent, read by the metrics page): a
/// source restarted by a reload, or removed and added again, goes on counting into the same ones.
#[derive(Default)]
pub struct SourceStats {
    pub tail: Registry<TailStats>,
    #[cfg(feature = "syslog")]
    pub syslog: Registry<crate::syslog::SyslogStats>,
    #[cfg(feature = "mqtt")]
    pub mqtt: Registry<crate::mqtt_source::MqttSourceStats>,
}

/// A compiled `sources:` entry.
#[derive(Debug, Clone)]
pub enum Source {
    Tail(Arc<TailConfig>),
    #[cfg(feature = "syslog")]
    Syslog(Arc<crate::syslog::SyslogConfig>),
    #[cfg(feature = "mqtt")]
    Mqtt(Arc<crate::mqtt_source::MqttSourceConfig>),
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

impl Source {
    /// Runs the source until `stopping` (the agent's task for it).
    pub async fn run(self, stats: &SourceStats, store: StoreHandle, stopping: CancellationToken) {
        match self {
            Source::Tail(cfg) => {
                let stats = stats.tail.get(&cfg.name);
                crate::tail::run(cfg, stats, store, stopping).await;
            }
            #[cfg(feature = "syslog")]
            Source::Syslog(cfg) => {
                let stats = stats.syslog.get(&cfg.name);
                crate::syslog::run(cfg, stats, store, stopping).await;
            }
            #[cfg(feature = "mqtt")]
            Source::Mqtt(cfg) => {
                let stats = stats.mqtt.get(&cfg.name);
                crate::mqtt_source::run(cfg, stats, store, stopping).await;
            }
        }
    }
}
