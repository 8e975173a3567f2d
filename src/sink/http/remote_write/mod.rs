//! The `prometheus_remote_write` sink (feature `remote-write`): each job (or part of one, after a
//! 413) becomes one Prometheus remote write 1.0 request, a protobuf `WriteRequest` compressed with
//! snappy, sent over the `http` sink's transport (client, TLS, headers, timeout, the classification
//! of answers; see [`super`]). It owns the records-to-samples mapping and the request's
//! framing; it does not scrape (the `http_scrape` task does) or retry (the delivery worker does).
//! Its file shape is [`config`]'s. Built by `sink::Sink::new` from the compiled config.
//!
//! The mapping, from the line-protocol records an `http_scrape` task writes
//! (`<measurement>,<labels> <metric>=<value> <time in ms>`): every numeric field is one sample of the
//! series named by the field (`__name__`), labelled by the record's tags, `job` = the measurement
//! when no tag names a job, and the sink's `external_labels` where the record has no label of that
//! name (as Prometheus applies its own). Names are made valid Prometheus names (any character
//! outside `[a-zA-Z0-9_]`, and `:` in label names, becomes `_`; a leading digit gets a `_` before
//! it). Integers and booleans become floats; a string field cannot be a sample: such a record
//! makes the job a dead letter naming it, never dropped unsaid. Samples keep their record's
//! timestamp (the scrape time) and are sent in the order stored, each series' in time order; a
//! receiver that refuses samples older than its newest (Prometheus without
//! `out_of_order_time_window`) answers 400, and the dead-letter reason says so.

use std::borrow::Cow;
use std::collections::HashMap;

use reqwest::header::HeaderValue;

use super::{HttpConfig, HttpSink};
use crate::net::client::shown_url;
use crate::record::RecordFormat;
use crate::scrape::lineparse::{self, Value};
use crate::scrape::lineproto::Precision;
use crate::setting::SettingError;
use crate::sink::SinkConfig;
use crate::sink::deliver::{Batch, Deliver, DeliveryError, Payload, Probe};
use crate::sink::kind::{KindConfig, Settings};
use crate::store::FileJob;
pub use config::RemoteWriteSinkSpec as Spec;

mod config;

/// The compiled `type: prometheus_remote_write` settings: the HTTP transport's, and the labels
/// added to every series.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteWriteConfig {
    pub http: HttpConfig,
    /// Sorted by name; valid Prometheus label names, never `__name__`.
    pub external_labels: Vec<(String, String)>,
}

impl Settings for RemoteWriteConfig {
    /// Line-protocol samples timestamped in milliseconds, as remote write carries them.
    fn record_format(&self) -> RecordFormat {
        RecordFormat::LineProtocol(Precision::Ms)
    }

    /// For logs: the sink's type, name and URL (no credentials).
    fn describe(&self, name: &str) -> String {
        format!(
            "prometheus_remote_write sink {name} ({})",
            shown_url(&self.http.url)
        )
    }

    /// The key is a header: a request may carry several jobs.
    fn sends_groups(&self) -> bool {
        true
    }
}

impl KindConfig for RemoteWriteConfig {
    type Built = RemoteWriteSink;

    fn build(&self, sink: &SinkConfig) -> Result<RemoteWriteSink, SettingError> {
        RemoteWriteSink::new(self, sink)
    }
}

/// Whether `name` is a valid Prometheus label name (`[a-zA-Z_][a-zA-Z0-9_]*`).
pub fn valid_label_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// `name` made a valid metric name (`colon`: `:` is kept) or label name.
fn sanitized(name: &str, colon: bool) -> Cow<'_, str> {
    let ok = |c: char| c.is_ascii_alphanumeric() || c == '_' || (colon && c == ':');
    let digit_first = name.bytes().next().is_none_or(|b| b.is_ascii_digit());
    if !digit_first && name.chars().all(ok) {
        return Cow::Borrowed(name);
    }
    let mut out = String::with_capacity(name.len() + 1);
    if digit_first {
        out.push('_');
    }
    out.extend(name.chars().map(|c| if ok(c) { c } else { '_' }));
    Cow::Owned(out)
}

/// The protobuf messages of remote write 1.0 (`prometheus/prompb/{remote,types}.proto`), the
/// fields colibri sends.
mod prompb {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct WriteRequest {
        #[prost(message, repeated, tag = "1")]
        pub timeseries: Vec<TimeSeries>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TimeSeries {
        #[prost(message, repeated, tag = "1")]
        pub labels: Vec<Label>,
        #[prost(message, repeated, tag = "2")]
        pub samples: Vec<Sample>,
    }

    #[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
    pub struct Label {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "2")]
        pub value: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        #[prost(double, tag = "1")]
        pub value: f64,
        #[prost(int64, tag = "2")]
        pub timestamp: i64,
    }
}

/// The `WriteRequest` for these records (line protocol, timestamps in ms): series in the order of
/// their first sample, each series' samples in record order. An error names the record (its index
/// in the batch) and why it cannot be sent as samples.
fn write_request<'a>(
    records: impl Iterator<Item = &'a [u8]>,
    external: &[(String, String)],
) -> Result<prompb::WriteRequest, (usize, String)> {
    let mut series: Vec<prompb::TimeSeries> = Vec::new();
    // Records share label sets (a scrape's series differ by name more than by labels): each set
    // is hashed once per record, and a field finds its series by name within its set, so a label
    // set is copied only for a series not seen before.
    let mut sets: HashMap<Vec<prompb::Label>, usize> = HashMap::new();
    // Per set: its labels, and its series by metric name.
    let mut by_set: Vec<(Vec<prompb::Label>, HashMap<String, usize>)> = Vec::new();
    for (i, rec) in records.enumerate() {
        let point = lineparse::parse(rec).map_err(|e| (i, format!("is not line protocol: {e}")))?;
        let timestamp = point
            .timestamp
            .ok_or_else(|| (i, "has no timestamp".to_string()))?;
        // The record's tags, then `job`, then the external labels; a name already there (two tags
        // that sanitize alike, a tag named like an external label) keeps its first value, as a
        // series holds a label once (a receiver refuses a name twice). Sorted by name, once.
        let mut labels: Vec<prompb::Label> =
            Vec::with_capacity(point.tags.len() + external.len() + 2);
        let job =
            (!point.measurement.is_empty()).then(|| ("job".into(), point.measurement.as_str()));
        let named = point
            .tags
            .iter()
            .map(|(k, v)| (sanitized(k, false), v.as_str()))
            .chain(job)
            .chain(
                external
                    .iter()
                    .map(|(k, v)| (Cow::Borrowed(k.as_str()), v.as_str())),
            );
        for (name, value) in named {
            if !labels.iter().any(|l| l.name == name) {
                labels.push(prompb::Label {
                    name: name.into_owned(),
                    value: value.to_string(),
                });
            }
        }
        labels.sort_by(|a, b| a.name.cmp(&b.name));
        let set = match sets.get(&labels) {
            Some(&set) => set,
            None => {
                by_set.push((labels.clone(), HashMap::new()));
                sets.insert(labels, by_set.len() - 1);
                by_set.len() - 1
            }
        };
        let (labels, names) = &mut by_set[set];
        for (field, value) in &point.fields {
            let value = match value {
                Value::Float(x) => *x,
                Value::Int(x) => *x as f64,
                Value::UInt(x) => *x as f64,
                Value::Bool(b) => f64::from(u8::from(*b)),
                Value::Str(_) => {
                    return Err((
                        i,
                        format!(
                            "has field {field:?} as a string, and remote write carries numbers only"
                        ),
                    ));
                }
            };
            let name = sanitized(field, true);
            let at = match names.get(name.as_ref()) {
                Some(&at) => at,
                None => {
                    // `__name__` goes where it sorts among the set's labels.
                    let mut all = labels.clone();
                    let name_at = all.partition_point(|l| l.name.as_str() < "__name__");
                    all.insert(
                        name_at,
                        prompb::Label {
                            name: "__name__".into(),
                            value: name.to_string(),
                        },
                    );
                    series.push(prompb::TimeSeries {
                        labels: all,
                        samples: Vec::new(),
                    });
                    names.insert(name.into_owned(), series.len() - 1);
                    series.len() - 1
                }
            };
            series[at].samples.push(prompb::Sample { value, timestamp });
        }
    }
    Ok(prompb::WriteRequest { timeseries: series })
}

/// A ready-to-use remote write sink: the HTTP transport and the labels to add.
pub struct RemoteWriteSink {
    http: HttpSink,
    external: Vec<(String, String)>,
}

impl RemoteWriteSink {
    /// Builds the HTTP client (reads TLS files) with the settings every sink has (`sink`). Errors
    /// name the setting.
    pub fn new(
        spec: &RemoteWriteConfig,
        sink: &SinkConfig,
    ) -> Result<RemoteWriteSink, SettingError> {
        Ok(RemoteWriteSink {
            http: HttpSink::new(&spec.http, &sink.link.probe, sink.timeout, sink.concurrency)?,
            external: spec.external_labels.clone(),
        })
    }
}

/// What a refusal for order says, so that the operator knows which receivers take a backlog.
const OUT_OF_ORDER_HINT: &str = "; samples older than the receiver's newest are refused by Prometheus \
     without storage.tsdb.out_of_order_time_window: a backlog needs that window (or VictoriaMetrics)";

impl Deliver for RemoteWriteSink {
    /// The `WriteRequest`, snappy-compressed (the block format, as remote write requires).
    async fn body(&self, batch: &Batch<'_>) -> Result<Vec<u8>, DeliveryError> {
        let req = match batch.payload {
            Payload::Records(records) => write_request(records.iter().copied(), &self.external),
            Payload::Lines(lines) => write_request(
                lines
                    .strip_suffix(b"\n")
                    .unwrap_or(lines)
                    .split(|b| *b == b'\n'),
                &self.external,
            ),
            // Never handed here: this sink does not send stored frames as they are.
            Payload::ZstdLines(_) => {
                return Err(DeliveryError::transient(
                    "a compressed job reached a sink that cannot send it as it is".into(),
                ));
            }
        }
        .map_err(|(i, reason)| DeliveryError::Record {
            index: batch.first + i as u32,
            reason,
        })?;
        let proto = prost::Message::encode_to_vec(&req);
        snap::raw::Encoder::new()
            .compress_vec(&proto)
            .map_err(|e| DeliveryError::transient(format!("cannot compress the body: {e}")))
    }

    async fn send(&self, batch: &Batch<'_>, body: Vec<u8>) -> Result<(), DeliveryError> {
        let sent = self
            .http
            .send_as(
                batch,
                body,
                HeaderValue::from_static("application/x-protobuf"),
                Some(HeaderValue::from_static("snappy")),
                &[(
                    "x-prometheus-remote-write-version",
                    HeaderValue::from_static("0.1.0"),
                )],
            )
            .await;
        match sent {
            Err(DeliveryError::Permanent(reason))
                if ["out of order", "out of bounds", "too old"]
                    .iter()
                    .any(|m| reason.contains(m)) =>
            {
                Err(DeliveryError::Permanent(format!(
                    "{reason}{OUT_OF_ORDER_HINT}"
                )))
            }
            other => other,
        }
    }

    async fn send_file(&self, _batch: &Batch<'_>, file: &FileJob) -> Result<(), DeliveryError> {
        Err(DeliveryError::Permanent(format!(
            "{} is a file, and a prometheus_remote_write sink sends samples only",
            file.name.to_string_lossy()
        )))
    }

    async fn probe(&self, how: &Probe) -> Result<(), String> {
        self.http.probe(how).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(s: &prompb::TimeSeries) -> Vec<(&str, &str)> {
        s.labels
            .iter()
            .map(|l| (l.name.as_str(), l.value.as_str()))
            .collect()
    }

    #[test]
    fn records_become_series_in_order_with_sorted_labels() {
        let recs: [&[u8]; 3] = [
            b"node,instance=a,mode=idle cpu_seconds_total=1.5,up=1i 1000",
            b"node,instance=b cpu_seconds_total=2 1000",
            b"node,instance=a,mode=idle cpu_seconds_total=2.5,up=1i 2000",
        ];
        let ext = vec![
            ("gateway".to_string(), "gw-1".to_string()),
            ("instance".to_string(), "ignored".to_string()),
        ];
        let req = write_request(recs.iter().copied(), &ext).unwrap();
        assert_eq!(req.timeseries.len(), 3);
        let s = &req.timeseries[0];
        assert_eq!(
            labels(s),
            [
                ("__name__", "cpu_seconds_total"),
                ("gateway", "gw-1"),
                ("instance", "a"),
                ("job", "node"),
                ("mode", "idle"),
            ]
        );
        let samples: Vec<(f64, i64)> = s.samples.iter().map(|x| (x.value, x.timestamp)).collect();
        assert_eq!(samples, [(1.5, 1000), (2.5, 2000)]);
        assert_eq!(labels(&req.timeseries[1])[0], ("__name__", "up"));
        assert_eq!(req.timeseries[1].samples.len(), 2);
        assert_eq!(labels(&req.timeseries[2])[2], ("instance", "b"));
    }

    #[test]
    fn names_are_made_valid_and_a_job_tag_wins_over_the_measurement() {
        let recs: [&[u8]; 1] = [b"m,job=j,a.b=1 9temp.c=true 5"];
        let req = write_request(recs.iter().copied(), &[]).unwrap();
        assert_eq!(
            labels(&req.timeseries[0]),
            [("__name__", "_9temp_c"), ("a_b", "1"), ("job", "j")]
        );
        assert_eq!(req.timeseries[0].samples[0].value, 1.0);
    }

    #[test]
    fn a_label_name_twice_keeps_its_first_value() {
        let recs: [&[u8]; 1] = [b"m,a.b=1,a_b=2,gateway=own v=1 5"];
        let ext = vec![("gateway".to_string(), "ext".to_string())];
        let req = write_request(recs.iter().copied(), &ext).unwrap();
        assert_eq!(
            labels(&req.timeseries[0]),
            [
                ("__name__", "v"),
                ("a_b", "1"),
                ("gateway", "own"),
                ("job", "m")
            ]
        );
    }

    #[test]
    fn a_string_field_or_a_missing_timestamp_names_the_record() {
        let recs: [&[u8]; 2] = [b"m v=1 5", b"m s=\"x\" 6"];
        let (i, e) = write_request(recs.iter().copied(), &[]).unwrap_err();
        assert!(i == 1 && e.contains("string"), "{i}: {e}");
        let recs: [&[u8]; 1] = [b"m v=1"];
        let (i, e) = write_request(recs.iter().copied(), &[]).unwrap_err();
        assert!(i == 0 && e.contains("no timestamp"), "{i}: {e}");
    }

    #[test]
    fn label_names_are_checked() {
        assert!(valid_label_name("gateway_1"));
        assert!(valid_label_name("_x"));
        assert!(!valid_label_name("1x"));
        assert!(!valid_label_name("a-b"));
        assert!(!valid_label_name(""));
    }
}
