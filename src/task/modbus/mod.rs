//! The `modbus` handler (feature `modbus`): one poll of a Modbus TCP device per run: a connection,
//! the reads `points::plan` made (as few as the device's limits allow), each point decoded, and
//! one sample per tag set appended to the task's stream in one append, stamped with the time taken
//! before the first request (a line-protocol point in the sink's precision, or a JSON record,
//! as the stream's sink sends). A device that cannot be reached or does not answer within the
//! task's timeout, or answers a read with a Modbus exception (the points and the exception named),
//! is a failed attempt with the reason; `task::run` logs, counts and retries it; nothing of that
//! poll is stored. Built by its `config` (through the tasks' list), called by `task::run`.

pub mod points;

use std::time::Duration;

use tokio_modbus::client::Reader as _;
use tokio_modbus::slave::Slave;

use self::points::{Answer, Point, Read, Table, Value};
use super::{Attempt, Needs, RunContext};
use crate::scrape::exception::{Decided, Exceptions, Rule, Sample};
use crate::scrape::lineproto::{self, FieldValue, Precision};
pub use config::ModbusSpec as Spec;

mod config;

/// The compiled `modbus` settings.
#[derive(Debug)]
pub struct Modbus {
    /// `host:port` of the device or gateway.
    pub address: String,
    /// The unit (slave) id the requests carry.
    pub unit: u8,
    pub stream: String,
    pub measurement: String,
    /// The task's tags, sorted by key.
    pub tags: Vec<(String, String)>,
    pub points: Vec<Point>,
    pub reads: Vec<Read>,
    pub output: Output,
    /// With a `deadband` or `heartbeat`: each point's rule, and the values last sent.
    pub exceptions: Option<ByException>,
}

/// Report by exception: a rule per point (by index), and the task's state.
#[derive(Debug)]
pub struct ByException {
    rules: Vec<Rule>,
    state: Exceptions,
}

impl ByException {
    pub fn new(rules: Vec<Rule>) -> ByException {
        ByException {
            rules,
            state: Exceptions::default(),
        }
    }

    /// Drops from `values` what is not worth sending; what was decided, to settle once stored.
    fn filter(&self, values: &mut [Option<Value>], now_ms: u64) -> Decided {
        let mut decided = Decided::default();
        for (i, (slot, rule)) in values.iter_mut().zip(&self.rules).enumerate() {
            let Some(v) = slot else { continue };
            let sample = match v {
                Value::Number(n) => Sample::Number(*n),
                Value::Bool(b) => Sample::Other(b.to_string()),
                Value::Text(s) => Sample::Other(s.clone()),
            };
            if !self.state.decide(
                (i.to_string(), String::new()),
                sample,
                rule,
                now_ms,
                &mut decided,
            ) {
                *slot = None;
            }
        }
        decided
    }
}

/// What a sample is, as the stream's sink sends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// A line-protocol point, its time in this precision.
    LineProtocol(Precision),
    /// `{"time_ms", "task", "device", "unit", "tags", "values"}`.
    Json,
}

impl crate::task::kind::Settings for Modbus {
    fn is_scrape(&self) -> bool {
        true
    }

    fn by_exception(&self) -> bool {
        self.exceptions.is_some()
    }

    fn timed_out(&self, timeout: Duration) -> String {
        format!(
            "{} unit {}: no answer within the timeout ({})",
            self.address,
            self.unit,
            crate::units::fmt_duration(timeout)
        )
    }

    /// Its stream, and its sink's settings (the samples' format and precision).
    fn needs(&self) -> Needs<'_> {
        Needs {
            stream: Some(&self.stream),
            spool: None,
            sink_settings: true,
        }
    }
}

impl crate::task::kind::Handler for Modbus {
    fn run(
        &self,
        task: &str,
        _due: chrono::DateTime<chrono::Utc>,
        timeout: Duration,
        ctx: &RunContext,
    ) -> impl std::future::Future<Output = Attempt> + Send {
        Modbus::run(self, task, timeout, ctx)
    }
}

impl Modbus {
    /// One poll within `timeout`, until colibri aborts runs. By exception, what the poll decided
    /// stands once its samples are stored.
    pub async fn run(&self, task: &str, timeout: Duration, ctx: &RunContext) -> Attempt {
        let state = self.exceptions.as_ref().map(|x| &x.state);
        Attempt::of_samples(timeout, ctx, &self.stream, state, || self.poll(task)).await
    }

    /// Connect, read, decode, and by exception keep what is worth sending: the samples to append.
    async fn poll(&self, task: &str) -> Result<(Vec<Vec<u8>>, Option<Decided>), String> {
        // The time of the measurement, whenever it is delivered.
        let ts_ns = crate::clock::unix_ns();
        let socket = tokio::net::TcpStream::connect(&self.address)
            .await
            .map_err(|e| format!("cannot connect to {}: {e}", self.address))?;
        // Small requests and answers: each goes out at once.
        let _ = socket.set_nodelay(true);
        let mut device = tokio_modbus::client::tcp::attach_slave(socket, Slave(self.unit));
        let mut values: Vec<Option<Value>> = vec![None; self.points.len()];
        for read in &self.reads {
            let what = || self.describe(read);
            let answer = match read.table {
                Table::Holding => device
                    .read_holding_registers(read.start, read.count)
                    .await
                    .map(|r| r.map(Words::Registers)),
                Table::Input => device
                    .read_input_registers(read.start, read.count)
                    .await
                    .map(|r| r.map(Words::Registers)),
                Table::Coil => device
                    .read_coils(read.start, read.count)
                    .await
                    .map(|r| r.map(Words::Bits)),
                Table::Discrete => device
                    .read_discrete_inputs(read.start, read.count)
                    .await
                    .map(|r| r.map(Words::Bits)),
            };
            let words = match answer {
                Err(e) => return Err(format!("{}: {e}", what())),
                Ok(Err(code)) => {
                    return Err(format!(
                        "{}: the device answered the Modbus exception {:#04x} ({code})",
                        what(),
                        u8::from(code)
                    ));
                }
                Ok(Ok(w)) => w,
            };
            let answer = match &words {
                Words::Registers(r) => Answer::Registers(r),
                Words::Bits(b) => Answer::Bits(b),
            };
            for &i in &read.points {
                let v = points::decode(&self.points[i], read.start, &answer).ok_or_else(|| {
                    format!("{}: the device answered fewer values than asked", what())
                })?;
                values[i] = Some(v);
            }
        }
        let decided = self.exceptions.as_ref().map(|x| {
            let now_ms = u64::try_from(ts_ns.div_euclid(1_000_000)).unwrap_or(0);
            x.filter(&mut values, now_ms)
        });
        Ok((self.samples(task, ts_ns, &values), decided))
    }

    /// `points speed, temp (holding registers 0-3 of 127.0.0.1:502 unit 1)`.
    fn describe(&self, read: &Read) -> String {
        let names: Vec<&str> = read
            .points
            .iter()
            .map(|&i| self.points[i].name.as_str())
            .collect();
        let last = u32::from(read.start) + u32::from(read.count) - 1;
        format!(
            "point{} {} ({} {}-{last} of {} unit {})",
            if names.len() == 1 { "" } else { "s" },
            names.join(", "),
            read.table.plural(),
            read.start,
            self.address,
            self.unit
        )
    }

    /// One record per distinct set of point tags, in the order the points are written.
    fn samples(&self, task: &str, ts_ns: i64, values: &[Option<Value>]) -> Vec<Vec<u8>> {
        let mut groups: Vec<(&[(String, String)], Fields<'_>)> = Vec::new();
        for (p, v) in self.points.iter().zip(values) {
            let Some(v) = v else { continue };
            match groups
                .iter_mut()
                .find(|(tags, _)| *tags == p.tags.as_slice())
            {
                Some((_, fields)) => fields.push((&p.name, v)),
                None => groups.push((&p.tags, vec![(&p.name, v)])),
            }
        }
        groups
            .into_iter()
            .filter_map(|(point_tags, fields)| {
                // The point's tags over the task's.
                let mut tags: Vec<(&str, &str)> = point_tags
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect();
                for (k, v) in &self.tags {
                    if !point_tags.iter().any(|(pk, _)| pk == k) {
                        tags.push((k, v));
                    }
                }
                tags.sort_by(|a, b| a.0.cmp(b.0));
                match self.output {
                    Output::LineProtocol(precision) => {
                        let fields: Vec<(&str, FieldValue)> =
                            fields.into_iter().map(|(k, v)| (k, field(v))).collect();
                        lineproto::line(
                            &self.measurement,
                            &tags,
                            &fields,
                            Some(precision.from_unix_ns(ts_ns)),
                        )
                    }
                    Output::Json => {
                        let tags: serde_json::Map<String, serde_json::Value> = tags
                            .into_iter()
                            .map(|(k, v)| (k.to_string(), v.into()))
                            .collect();
                        let values: serde_json::Map<String, serde_json::Value> = fields
                            .into_iter()
                            .map(|(k, v)| (k.to_string(), json(v)))
                            .collect();
                        let record = serde_json::json!({
                            "time_ms": ts_ns.div_euclid(1_000_000),
                            "task": task,
                            "device": self.address,
                            "unit": self.unit,
                            "tags": tags,
                            "values": values,
                        });
                        Some(record.to_string().into_bytes())
                    }
                }
            })
            .collect()
    }
}

/// A sample's fields: each point's name and value.
type Fields<'a> = Vec<(&'a str, &'a Value)>;

/// A read's answer as the client returns it.
enum Words {
    Registers(Vec<u16>),
    Bits(Vec<bool>),
}

fn field(v: &Value) -> FieldValue {
    match v {
        Value::Number(n) => FieldValue::Float(*n),
        Value::Bool(b) => FieldValue::Bool(*b),
        Value::Text(s) => FieldValue::Str(s.clone()),
    }
}

fn json(v: &Value) -> serde_json::Value {
    match v {
        // NaN and infinities have no JSON: null.
        Value::Number(n) => {
            serde_json::Number::from_f64(*n).map_or(serde_json::Value::Null, Into::into)
        }
        Value::Bool(b) => (*b).into(),
        Value::Text(s) => s.as_str().into(),
    }
}
