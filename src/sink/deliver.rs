//! The contract between `Sink` and each kind of sink: the [`Deliver`] trait every kind's built sink
//! implements, what passes through it ([`Batch`] in, [`DeliveryError`] out, the [`Probe`] a down
//! link is tested by); how a kind refuses a setting is `crate::setting`'s `SettingError`. It knows
//! no kind: `sink/mod.rs` and the kinds' folders build on it; `delivery` uses its types through
//! `sink`'s re-exports.

use std::time::Duration;

use crate::store::FileJob;

/// How a down link is tested. File sinks check their directory whatever is set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// A TCP connect to the sink's host and port.
    Tcp,
    /// A GET of this URL that gets any answer.
    Http(reqwest::Url),
}

/// Why a delivery failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeliveryError {
    /// The destination cannot be reached at all: no answer (refused, reset, timed out, TLS
    /// handshake failed) or an unmounted directory. No attempt is spent: the job goes back to the
    /// queue and the link monitor decides when to try again, however long that takes.
    #[error("{0}")]
    Unavailable(String),
    /// The destination answered but the delivery failed in a way that may pass (5xx, 408, 429, a
    /// full disk): an attempt is spent and the job is retried later, after `retry_after` when the
    /// peer said so.
    #[error("{reason}")]
    Transient {
        reason: String,
        retry_after: Option<Duration>,
    },
    /// The destination refused the body as too large (413): send fewer records at a time.
    #[error("{0}")]
    TooLarge(String),
    /// Will never succeed: the job goes to the dead letters with this reason.
    #[error("{0}")]
    Permanent(String),
    /// One record can never be sent for what it is (it lacks the field a topic names, it is not
    /// a sample): nothing of the request was sent; that record alone goes to the dead letters
    /// with the reason, and the records around it are delivered. `index` is its position in the
    /// job as first appended (as [`Batch::first`]).
    #[error("record {index} of the job {reason}")]
    Record { index: u32, reason: String },
}

impl DeliveryError {
    pub(super) fn transient(reason: String) -> Self {
        DeliveryError::Transient {
            reason,
            retry_after: None,
        }
    }
}

/// The records of a request, in the form the stored job gives them (the cheapest to send).
#[derive(Debug, Clone, Copy)]
pub enum Payload<'a> {
    /// One slice per record.
    Records(&'a [&'a [u8]]),
    /// The records as lines, each followed by `\n` (no record holds one): an NDJSON or
    /// line-protocol body as it is.
    Lines(&'a [u8]),
    /// The records as lines, compressed as one zstd frame: a `Content-Encoding: zstd` body as it
    /// is. Only handed to a sink whose settings say it sends them (`SinkConfig::sends_zstd_lines`).
    ZstdLines(&'a [u8]),
}

impl Payload<'_> {
    /// The records as lines: a record per line, each followed by `\n`.
    pub fn lines(&self) -> Result<Vec<u8>, DeliveryError> {
        match self {
            Payload::Records(records) => Ok(lines(records)),
            Payload::Lines(body) => Ok(body.to_vec()),
            Payload::ZstdLines(_) => Err(DeliveryError::transient(
                "a compressed job reached a sink that cannot send it as it is".into(),
            )),
        }
    }
}

/// What one request carries: some of a job's records.
#[derive(Debug)]
pub struct Batch<'a> {
    /// The stream it is delivered from.
    pub stream: &'a str,
    /// The stream its idempotency key names: `stream`, or for a job moved by `on_max_age`, the
    /// stream it was moved from.
    pub key_stream: &'a str,
    pub job: u64,
    /// The records' positions in the job as it was first appended: `[first, end)`, and whether
    /// that is the whole job.
    pub first: u32,
    pub end: u32,
    pub whole: bool,
    pub payload: Payload<'a>,
    /// For a file job: the file it ships (`payload` then holds only its reference).
    pub file: Option<&'a crate::store::FileJob>,
    /// The store file's id: job ids restart in a new file, keys must not.
    pub store_id: u64,
    /// The job is backlog (older than its stream's `live_window` as it is sent): it carries the
    /// [`REPLAYED`] marker where the protocol has a place for one.
    pub replayed: bool,
    /// For several small jobs sent in one request (only to a sink that [sends
    /// groups](super::Sink::sends_groups)): the group's key, which is then the request's
    /// (`<store>:<stream>:<first job>+<n>`, see `delivery::group`); `job`, `first` and `end` are
    /// then the first job's id and the group's records.
    pub group: Option<&'a str>,
}

/// The marker of a request or message sent from a backlog (a job older than its stream's
/// `live_window` when it is sent, in either replay order), with the value `true`; absent on live
/// data. An HTTP header (`http`, `prometheus_remote_write`), an MQTT 5 user property, a NATS
/// header: a receiver reads it without parsing records, beside the idempotency key. MQTT 3.1.1
/// has no place for it. Named for colibri: no standard header says "replayed".
pub const REPLAYED: &str = "colibri-replayed";

impl Batch<'_> {
    /// The same for every re-send of the same records, different for any other content: a
    /// receiver can drop a replay after a crash. `:` separates the parts because stream names
    /// cannot contain it (they may contain `-`).
    pub fn idempotency_key(&self) -> String {
        if let Some(key) = self.group {
            return key.to_string();
        }
        if self.whole {
            format!("{:016x}:{}:{}", self.store_id, self.key_stream, self.job)
        } else {
            format!(
                "{:016x}:{}:{}:{}-{}",
                self.store_id, self.key_stream, self.job, self.first, self.end
            )
        }
    }

    /// The key of one record, by its position in the job as first appended (`index`, from
    /// `first`): the same in every part a split makes and in every re-send, for sinks that send a
    /// message per record.
    #[cfg(any(feature = "mqtt", feature = "nats", feature = "kafka", test))]
    pub fn record_key(&self, index: usize) -> String {
        format!(
            "{:016x}:{}:{}#{index}",
            self.store_id, self.key_stream, self.job
        )
    }
}

/// What every kind of built sink does; `Sink` calls it on the kind it was built as. The defaults:
/// nothing of its own to start, a record per line as the body. How many requests run at once, how
/// long one may take and how a replay is paced are the sink's settings (`SinkConfig`), not the
/// built sink's.
#[expect(
    async_fn_in_trait,
    reason = "implemented and awaited only inside this crate, on one runtime: no caller needs a Send bound spelled out"
)]
pub trait Deliver {
    /// Starts what the sink runs on its own (see `Sink::start`); most sinks run nothing.
    fn start(&self) {}
    /// The body that carries `batch`, as it goes over the wire.
    async fn body(&self, batch: &Batch<'_>) -> Result<Vec<u8>, DeliveryError> {
        batch.payload.lines()
    }
    /// Delivers `body` (made by `body` for `batch`).
    async fn send(&self, batch: &Batch<'_>, body: Vec<u8>) -> Result<(), DeliveryError>;
    /// Delivers the file of a file job, streamed from disk.
    async fn send_file(&self, batch: &Batch<'_>, file: &FileJob) -> Result<(), DeliveryError>;
    /// Whether the destination can be reached again (`how`: the sink's `link.probe`).
    async fn probe(&self, how: &Probe) -> Result<(), String>;
}

/// A record per line: the body of every sink that does not say otherwise (`Deliver::body`).
pub fn lines(records: &[&[u8]]) -> Vec<u8> {
    let len: usize = records.iter().map(|r| r.len() + 1).sum();
    let mut body = Vec::with_capacity(len);
    for r in records {
        body.extend_from_slice(r);
        body.push(b'\n');
    }
    body
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(in crate::sink) fn batch<'a>(id: u64, records: &'a [&'a [u8]]) -> Batch<'a> {
        Batch {
            stream: "logs",
            key_stream: "logs",
            job: id,
            first: 0,
            end: records.len() as u32,
            whole: true,
            payload: Payload::Records(records),
            file: None,
            store_id: 0xabc,
            replayed: false,
            group: None,
        }
    }

    #[test]
    fn idempotency_keys_name_the_store_stream_job_and_part() {
        let recs: [&[u8]; 2] = [b"a", b"b"];
        let mut b = batch(7, &recs);
        assert_eq!(b.idempotency_key(), "0000000000000abc:logs:7");
        b.whole = false;
        b.first = 4;
        b.end = 6;
        assert_eq!(b.idempotency_key(), "0000000000000abc:logs:7:4-6");
        assert_eq!(b.record_key(5), "0000000000000abc:logs:7#5");
    }
}
