//! A job's records as the edge node's messages: read into samples, observed by the registry, and
//! turned into a DBIRTH for each device whose metric set is new or changed, then a DDATA per
//! device with its metrics by alias at their records' own times, historical when sent from a
//! backlog or taken before the node's birth; all made and queued under the session's lock, so
//! seq follows the order the broker receives them in. A job's queueing that stops half way (an
//! error, or the delivery's deadline dropping it) births the node again, since the host's count
//! of seq and births no longer holds. Called by the sink (`MqttSink::send`), which waits for the
//! acknowledgements and then asks [`Node::confirmed`].

use std::sync::Arc;
use std::time::Duration;

use super::node::{Node, Session};
use super::payload::Metric;
use super::registry::{Sample, samples};
use crate::clock::now_ms;
use crate::sink::deliver::{Batch, DeliveryError};
use crate::sink::mqtt::client::{Client, Notice};
use crate::sink::template::Message;

/// A job's messages, queued: their acknowledgements to come, and the session they were sent in.
pub struct Queued {
    pub notices: Vec<(String, Notice)>,
    pub epoch: u64,
}

/// Per device, in the order first seen: its DDATA metrics so far.
type Pending = Vec<(usize, Vec<Metric>)>;

impl Node {
    /// The messages of `batch` (its records are `body`'s lines), queued within `limit` from when
    /// the session is this job's. `check` sees them before anything is queued (a size over the
    /// broker's limit refuses the job, as it is).
    pub async fn data(
        self: &Arc<Self>,
        client: &Client,
        batch: &Batch<'_>,
        body: &[u8],
        limit: Duration,
        check: impl Fn(&[Message]) -> Result<(), DeliveryError>,
    ) -> Result<Queued, DeliveryError> {
        let now = now_ms();
        let mut found = Vec::new();
        // Positions as the template counts them: every line, the empty one after the last `\n`
        // included.
        for (i, record) in body.split(|&b| b == b'\n').enumerate() {
            if record.is_empty() {
                continue;
            }
            samples(record, batch.stream, &self.cfg, now, &mut found).map_err(|reason| {
                DeliveryError::Record {
                    index: batch.first + i as u32,
                    reason,
                }
            })?;
        }
        let mut s = self.session.lock().await;
        let epoch = self
            .sending()
            .map_err(|why| DeliveryError::Unavailable(format!("sparkplug: {why}")))?;
        let seq = s.seq;
        let messages = self.messages(&mut s, batch, found, now);
        if let Err(e) = check(&messages) {
            // Nothing went: the seq goes back, and every device is born again with its next data
            // (those of this job may have been marked born by a DBIRTH that was not sent).
            s.seq = seq;
            for d in s.registry.devices() {
                d.born = false;
            }
            return Err(e);
        }
        let mut guard = Unfinished {
            node: self,
            client,
            armed: true,
        };
        let queue = async {
            let mut notices = Vec::with_capacity(messages.len());
            for m in messages {
                let topic = m.to.clone();
                let n = client.publish(m, self.qos).await.map_err(|e| {
                    DeliveryError::Unavailable(format!("cannot publish to {topic:?}: {e}"))
                })?;
                notices.push((topic, n));
            }
            Ok(notices)
        };
        let notices = tokio::time::timeout(limit, queue).await.map_err(|_| {
            DeliveryError::Unavailable(format!(
                "sparkplug: the job's messages could not be queued within {limit:?}"
            ))
        })??;
        guard.armed = false;
        Ok(Queued { notices, epoch })
    }

    /// The DBIRTHs and DDATAs of a job's samples, in order, each with the next seq.
    fn messages(
        &self,
        s: &mut Session,
        batch: &Batch<'_>,
        found: Vec<Sample>,
        now: u64,
    ) -> Vec<Message> {
        let born_at = s.born_at_ms;
        let key = batch.idempotency_key();
        let mut messages = Vec::new();
        let mut pending: Pending = Vec::new();
        let mut part = 0;
        for sample in found {
            // A metric whose type changes within the job: what came before goes out under the
            // birth that declared the old type, and the new DBIRTH follows.
            let changes = s
                .registry
                .known(&sample.device, &sample.metric)
                .is_some_and(|(d, alias, t)| {
                    t != sample.datatype
                        && pending
                            .iter()
                            .any(|(x, m)| *x == d && m.iter().any(|m| m.alias == Some(alias)))
                });
            if changes {
                self.flush(s, &mut pending, &mut messages, now, &key, part);
                part += 1;
            }
            let historical = batch.replayed || sample.time_ms < born_at;
            let (time_ms, value) = (sample.time_ms, sample.value.clone());
            let (d, alias) = s.registry.observe(sample);
            let metric = Metric {
                alias: Some(alias),
                timestamp: Some(time_ms),
                is_historical: historical.then_some(true),
                value: Some(value),
                ..Metric::default()
            };
            match pending.iter_mut().find(|(x, _)| *x == d) {
                Some((_, m)) => m.push(metric),
                None => pending.push((d, vec![metric])),
            }
        }
        self.flush(s, &mut pending, &mut messages, now, &key, part);
        messages
    }

    /// The DBIRTHs of the pending devices not born, then their DDATAs; `part` tells the payloads
    /// of one job apart in their `uuid` after the first.
    fn flush(
        &self,
        s: &mut Session,
        pending: &mut Pending,
        messages: &mut Vec<Message>,
        now: u64,
        key: &str,
        part: u32,
    ) {
        for &(d, _) in pending.iter() {
            if !s.registry.device(d).born {
                messages.push(self.device_birth(s, d, now));
            }
        }
        for (d, metrics) in pending.drain(..) {
            let id = s.registry.device(d).id.clone();
            let topic = self.device_topic("DDATA", &id);
            let uuid = match part {
                0 => format!("{key}/{id}"),
                n => format!("{key}/{id}#{n}"),
            };
            messages.push(self.message(s, topic, now, metrics, uuid));
        }
    }
}

/// A job's queueing under way: dropped before it finished (an error, or the delivery's deadline
/// dropping the future), the node is born again.
struct Unfinished<'a> {
    node: &'a Arc<Node>,
    client: &'a Client,
    armed: bool,
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.node.reborn(self.client);
        }
    }
}
