//! What the edge node has announced: its devices, each device's metrics with their aliases and
//! datatypes, and the last value of each (a birth carries them). Records are read into samples
//! ([`samples`]: the device, the metric's name, its value and time) and observed one by one
//! ([`Registry::observe`]); a metric new to its device, or whose datatype changed, marks the device
//! unborn, so the next messages begin with its DBIRTH. It knows no topic, connection or seq:
//! `node` keeps one under its session lock and turns what it says into messages.

use std::collections::HashMap;

use super::payload::{Metric, Value, datatype};
use super::{DeviceFrom, SparkplugConfig};
use crate::scrape::lineparse::{self, Value as Field};

/// One metric of one record.
pub struct Sample {
    pub device: String,
    pub metric: String,
    pub value: Value,
    pub datatype: u32,
    /// Milliseconds since the epoch.
    pub time_ms: u64,
}

/// Every device the node announced, and the aliases handed out.
#[derive(Default)]
pub struct Registry {
    devices: Vec<Device>,
    by_id: HashMap<String, usize>,
    /// Aliases are unique across the edge node (the spec's rule), handed out from 1.
    next_alias: u64,
}

/// A device: its metrics in the order first seen, and whether its current set was born.
pub struct Device {
    pub id: String,
    metrics: Vec<Known>,
    by_name: HashMap<String, usize>,
    pub born: bool,
}

struct Known {
    name: String,
    alias: u64,
    datatype: u32,
    value: Value,
    time_ms: u64,
}

impl Registry {
    /// Records a sample: its metric's alias, the device's index. A metric new to the device (or a
    /// datatype that changed) marks the device unborn.
    pub fn observe(&mut self, s: Sample) -> (usize, u64) {
        let d = match self.by_id.get(&s.device) {
            Some(&d) => d,
            None => {
                self.devices.push(Device {
                    id: s.device.clone(),
                    metrics: Vec::new(),
                    by_name: HashMap::new(),
                    born: false,
                });
                self.by_id.insert(s.device, self.devices.len() - 1);
                self.devices.len() - 1
            }
        };
        let device = &mut self.devices[d];
        let alias = match device.by_name.get(&s.metric) {
            Some(&m) => {
                let known = &mut device.metrics[m];
                let retyped = known.datatype != s.datatype;
                if retyped {
                    known.datatype = s.datatype;
                    device.born = false;
                }
                // A birth carries the newest value: an older one (a backlog replayed after
                // the present) does not replace it, unless its type is the new one.
                if retyped || s.time_ms >= known.time_ms {
                    known.value = s.value;
                    known.time_ms = s.time_ms;
                }
                known.alias
            }
            None => {
                self.next_alias += 1;
                device
                    .by_name
                    .insert(s.metric.clone(), device.metrics.len());
                device.metrics.push(Known {
                    name: s.metric,
                    alias: self.next_alias,
                    datatype: s.datatype,
                    value: s.value,
                    time_ms: s.time_ms,
                });
                device.born = false;
                self.next_alias
            }
        };
        (d, alias)
    }

    /// A known metric of a device: the device's index, the metric's alias and datatype.
    pub fn known(&self, device: &str, metric: &str) -> Option<(usize, u64, u32)> {
        let d = *self.by_id.get(device)?;
        let k = &self.devices[d].metrics[*self.devices[d].by_name.get(metric)?];
        Some((d, k.alias, k.datatype))
    }

    pub fn device(&mut self, d: usize) -> &mut Device {
        &mut self.devices[d]
    }

    pub fn len(&self) -> usize {
        self.devices.len()
    }

    pub fn devices(&mut self) -> impl Iterator<Item = &mut Device> {
        self.devices.iter_mut()
    }
}

impl Device {
    /// The DBIRTH's metrics: every metric by name, alias and datatype, with its last value.
    pub fn birth_metrics(&self) -> Vec<Metric> {
        self.metrics
            .iter()
            .map(|k| Metric {
                name: Some(k.name.clone()),
                alias: Some(k.alias),
                timestamp: Some(k.time_ms),
                datatype: Some(k.datatype),
                value: Some(k.value.clone()),
                ..Metric::default()
            })
            .collect()
    }
}

/// The samples of one line-protocol record (timestamps in ms; `now_ms` for a record without one):
/// a metric per field, named by the configured tags' values and the field. An error says why the
/// record cannot be sent as Sparkplug metrics.
pub fn samples(
    record: &[u8],
    stream: &str,
    cfg: &SparkplugConfig,
    now_ms: u64,
    out: &mut Vec<Sample>,
) -> Result<(), String> {
    let point = lineparse::parse(record).map_err(|e| format!("is not line protocol: {e}"))?;
    let tag = |name: &str| {
        point
            .tags
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let device = match &cfg.device {
        DeviceFrom::Stream => stream,
        DeviceFrom::Measurement => point.measurement.as_str(),
        DeviceFrom::Tag(t) => {
            tag(t).ok_or_else(|| format!("has no tag {t:?} to name its device"))?
        }
    };
    if let Err(m) = super::check_id(device) {
        return Err(format!("names device {device:?}, which {m}"));
    }
    let mut prefix = String::new();
    for t in &cfg.metric_tags {
        let v = tag(t).ok_or_else(|| format!("has no tag {t:?} to name its metrics"))?;
        prefix.push_str(v);
        prefix.push('/');
    }
    let time_ms = point
        .timestamp
        .map_or(now_ms, |t| u64::try_from(t).unwrap_or(0));
    for (field, value) in point.fields {
        let (value, datatype) = match value {
            // Sparkplug carries an Int64 as its two's complement in the uint64 member.
            Field::Int(i) => (Value::Long(i as u64), datatype::INT64),
            Field::UInt(u) => (Value::Long(u), datatype::UINT64),
            Field::Float(f) => (Value::Double(f), datatype::DOUBLE),
            Field::Bool(b) => (Value::Boolean(b), datatype::BOOLEAN),
            Field::Str(s) => (Value::String(s), datatype::STRING),
        };
        out.push(Sample {
            device: device.to_string(),
            metric: format!("{prefix}{field}"),
            value,
            datatype,
            time_ms,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(device: DeviceFrom, metric_tags: &[&str]) -> SparkplugConfig {
        SparkplugConfig {
            group_id: "g".into(),
            edge_node_id: "n".into(),
            device,
            metric_tags: metric_tags.iter().map(|t| t.to_string()).collect(),
            primary_host_id: None,
            bd_seq_file: "unused".into(),
        }
    }

    #[test]
    fn a_record_becomes_a_metric_per_field_of_its_device() {
        let mut out = Vec::new();
        let c = cfg(DeviceFrom::Tag("unit".into()), &["node"]);
        samples(
            b"m,unit=pump1,node=Temp value=21.5,ok=true,n=-3i 1700000000000",
            "s",
            &c,
            5,
            &mut out,
        )
        .expect("a point");
        let names: Vec<_> = out
            .iter()
            .map(|s| (s.device.as_str(), s.metric.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("pump1", "Temp/value"),
                ("pump1", "Temp/ok"),
                ("pump1", "Temp/n")
            ]
        );
        assert_eq!(out[2].value, Value::Long(-3i64 as u64));
        assert_eq!(out[0].time_ms, 1_700_000_000_000);
        let e = samples(b"m,node=T v=1", "s", &c, 5, &mut out).expect_err("no unit");
        assert!(e.contains("no tag \"unit\""), "{e}");
        let e = samples(b"m,unit=a/b,node=T v=1", "s", &c, 5, &mut out).expect_err("bad id");
        assert!(e.contains("device \"a/b\""), "{e}");
    }

    #[test]
    fn a_new_metric_or_a_changed_datatype_unbears_its_device() {
        let mut r = Registry::default();
        let s = |m: &str, v: Value, t: u32| Sample {
            device: "d".into(),
            metric: m.into(),
            value: v,
            datatype: t,
            time_ms: 1,
        };
        let (d, a) = r.observe(s("x", Value::Double(1.0), datatype::DOUBLE));
        assert_eq!(a, 1);
        assert!(!r.device(d).born);
        r.device(d).born = true;
        assert_eq!(
            r.observe(s("x", Value::Double(2.0), datatype::DOUBLE)),
            (d, 1)
        );
        assert!(r.device(d).born, "a known metric keeps the birth");
        assert_eq!(
            r.observe(s("y", Value::Boolean(true), datatype::BOOLEAN)),
            (d, 2)
        );
        assert!(!r.device(d).born, "a new metric needs a new DBIRTH");
        r.device(d).born = true;
        r.observe(s("x", Value::Long(3), datatype::INT64));
        assert!(!r.device(d).born, "a changed datatype needs a new DBIRTH");
        let birth = r.device(d).birth_metrics();
        assert_eq!(birth.len(), 2);
        assert_eq!(birth[0].value, Some(Value::Long(3)));
        assert_eq!(birth[0].datatype, Some(datatype::INT64));
    }
}
