//! The sources: producers that append records to a stream on their own, a closed set listed once
//! below (`source_kinds!`), a folder each with its file shape (`config.rs`), its compiled settings
//! and how it runs (`tail`, `syslog`, `mqtt`); and `ingest`, the HTTP API applications push
//! records to (a source too, though configured once at the top of the file rather than under
//! `sources:`: it is a listener that turns requests into appends, as `syslog` turns messages).
//! What the kinds share lives here, below them: what a kind provides to the list (`kind`) and the
//! file shape every kind shares (`config`). This file holds the list, from which the compiled
//! [`Source`] (what `config` makes of a `sources:` entry and the agent starts, restarts on reload
//! and stops) and the counters of every source by kind ([`SourceStats`]) are made. Does not know
//! YAML (`config` hands each entry to [`compile_kind`]) or how a kind reads (its folder).
//!
//! A new kind of source is a folder here (its `Spec` implementing `kind::KindSpec`, its compiled
//! settings `kind::KindConfig`) and one entry in the list below.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::store::writer::StoreHandle;
pub use kind::Compile;

pub mod config;
#[macro_use]
mod kind;

pub mod ingest;
#[cfg(feature = "mqtt")]
pub mod mqtt;
#[cfg(feature = "opcua")]
pub mod opcua;
#[cfg(feature = "syslog")]
pub mod syslog;
pub mod tail;

source_kinds! {
    /// Follows log files: each line (or multiline group) becomes one JSON record
    /// `{"line":..., "path":..., "offset":..., "host":..., "labels":{...}}` (the fields as `fields`
    /// names them; with `format: json`, a line that is a JSON object is the record itself).
    /// Rotation by rename or by copy-truncate is followed; what was read is checkpointed with the
    /// records, so a crash neither loses nor repeats a line.
    Tail(tail) = "tail";
    /// Listens for syslog over UDP and TCP (RFC 6587 octet counting or newline framing) and
    /// appends each message, RFC 5424 or RFC 3164 parsed into fields, as one JSON record. Built
    /// only with the `syslog` feature (release builds have it).
    #[feature = "syslog"]
    Syslog(syslog) = "syslog";
    /// Subscribes to topic filters on an MQTT 5 broker with a persistent session and appends each
    /// message as one JSON record, acknowledging it (PUBACK, or PUBREC at QoS 2) only once the
    /// stream has committed it. Built only with the `mqtt` feature (release builds have it).
    #[feature = "mqtt"]
    Mqtt(mqtt) = "mqtt";
    /// Reads nodes of an OPC UA server, by subscription (default) or by polling, and appends each
    /// data change as one record with its source and server timestamps and its status: a
    /// line-protocol point when the stream's sink takes line protocol, else a JSON object. A lost
    /// session is made again by itself, `nsu=` node ids resolved anew. Built only with the
    /// `opcua` feature (release builds have it).
    #[feature = "opcua"]
    Opcua(opcua) = "opcua";
}

impl Source {
    pub fn name(&self) -> &str {
        self.settings().name()
    }

    /// The streams its records go to (an mqtt source's routes may name more than one).
    pub fn streams(&self) -> Vec<&str> {
        self.settings().streams()
    }

    /// For `colibri check`.
    pub fn describe(&self) -> String {
        self.settings().describe()
    }

    /// The addresses the source listens on (what `colibri check --bind` tries).
    pub fn listens(&self) -> Vec<Listen> {
        self.settings().listens()
    }

    /// Binds the source's sockets now (inside the runtime); the error names the address.
    pub fn bind(&self) -> anyhow::Result<Sockets> {
        self.settings().bind()
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
