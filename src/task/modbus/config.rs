//! The `type: modbus` task entry (feature `modbus`): its file
//! shape ([`ModbusSpec`], [`PointSpec`]) and its compilation into `task::modbus::Modbus`: the
//! device's address, the points' types, orders and addresses checked, the reads planned, and the
//! samples' format taken from the stream's sink. It talks to no device. Called through the tasks'
//! list (`task::read_kind`, `TaskKind::compile`) for `type: modbus`.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::points::{Order, Table};
use crate::shape::deadband::DeadbandSpec;
#[cfg(feature = "schema")]
use crate::shape::units::u32_schema;
use crate::shape::units::{Dur, de_opt_u32};

/// `type: modbus` settings.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ModbusSpec {
    /// The device (or Modbus TCP gateway): `host:port`, the port 502 when left out.
    pub address: String,
    /// The unit (slave) id, 0-255. Default 1.
    #[serde(default, deserialize_with = "de_opt_u32")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "u32_schema"))]
    pub unit: Option<u32>,
    /// The stream the samples go to: a line-protocol point per poll (in the `precision` of the
    /// stream's sink) or, for a sink that sends JSON, `{"time_ms", "task", "device", "unit",
    /// "tags", "values"}`.
    pub stream: String,
    /// The line-protocol measurement. Default: the task's name.
    #[serde(default)]
    pub measurement: Option<String>,
    /// Tags of every sample.
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// What to read: each point becomes a field of the poll's sample.
    pub points: Vec<PointSpec>,
    /// Registers one request may read: 1-125 (the protocol's limit, the default); some devices
    /// take fewer.
    #[serde(default, deserialize_with = "de_opt_u32")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "u32_schema"))]
    pub max_registers: Option<u32>,
    /// Coils or discrete inputs one request may read: 1-2000 (the default).
    #[serde(default, deserialize_with = "de_opt_u32")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "u32_schema"))]
    pub max_bits: Option<u32>,
    /// Unused addresses one request may read over to cover two points. Default 0: a device may
    /// answer "illegal data address" for an address it does not have.
    #[serde(default, deserialize_with = "de_opt_u32")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "u32_schema"))]
    pub max_gap: Option<u32>,
    /// Report by exception: a number is appended only when it moved more than this from the value
    /// last sent, absolute (`0.5`) or a percent of that value (`"2%"`); a boolean or a string when
    /// it changes. A point may set its own. The first value after start, after a failed poll or a
    /// change of the task, is always sent. Default: every value of every poll.
    #[serde(default)]
    pub deadband: Option<DeadbandSpec>,
    /// Report by exception: a value is sent anyway when this long has passed since it was last
    /// sent (a point may set its own). Default: never.
    #[serde(default)]
    pub heartbeat: Option<Dur>,
}

/// One value of a `modbus` task.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct PointSpec {
    /// The field's name in the sample.
    pub name: String,
    /// `holding` or `input` (16-bit registers), `coil` or `discrete` (bits).
    pub register: Table,
    /// The first register's (or bit's) address as on the wire, from 0.
    #[serde(deserialize_with = "crate::shape::units::de_u32")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "u32_schema"))]
    pub address: u32,
    /// `u16` (the default for registers), `i16`, `u32`, `i32`, `u64`, `f32`, `f64`, `bool` (the
    /// only type of coils and discrete inputs; a register is true when not 0) or `string`
    /// (`length` registers, two bytes each).
    #[serde(default, rename = "type")]
    pub kind: Option<PointType>,
    /// Registers of a `string`.
    #[serde(default, deserialize_with = "de_opt_u32")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "u32_schema"))]
    pub length: Option<u32>,
    /// Of a value over several registers: `big` (the default: the most significant register
    /// first) or `little`.
    #[serde(default)]
    pub word_order: Option<Order>,
    /// Within each register: `big` (the default, Modbus' own) or `little`.
    #[serde(default)]
    pub byte_order: Option<Order>,
    /// A number is written `raw * scale + offset` (always as a float). Default 1.
    #[serde(default)]
    pub scale: Option<f64>,
    /// Default 0.
    #[serde(default)]
    pub offset: Option<f64>,
    /// Tags of this point (beside the task's, winning over them): points with other tags make
    /// a sample of their own.
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// This point's own deadband (see the task's).
    #[serde(default)]
    pub deadband: Option<DeadbandSpec>,
    /// This point's own heartbeat (see the task's).
    #[serde(default)]
    pub heartbeat: Option<Dur>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum PointType {
    Bool,
    U16,
    I16,
    U32,
    I32,
    U64,
    F32,
    F64,
    String,
}

mod compile {
    use std::collections::BTreeMap;

    use super::{ModbusSpec, PointSpec, PointType, device_address};
    use crate::record::RecordFormat;
    use crate::scrape::exception::Rule;
    use crate::scrape::lineproto::{Precision, check_measurement};
    use crate::shape::Problems;
    use crate::shape::deadband;
    use crate::task::kind::{Compile, KindSpec};
    use crate::task::modbus::points::{self, Kind, Limits, Point, Table};
    use crate::task::modbus::{ByException, Modbus, Output};

    impl KindSpec for ModbusSpec {
        type Handler = Modbus;

        fn compile(self, cx: &Compile<'_>, err: &mut Problems<'_>) -> Option<Modbus> {
            compile_modbus(self, cx, err)
        }
    }

    fn compile_modbus(
        spec: ModbusSpec,
        ctx: &Compile<'_>,
        err: &mut Problems<'_>,
    ) -> Option<Modbus> {
        let task = ctx.task;
        // Every check reports and goes on; any problem leaves the task out.
        let before = err.count();
        let address = match device_address(&spec.address) {
            Ok(a) => a,
            Err(m) => {
                err.add("address", m);
                String::new()
            }
        };
        let unit = spec.unit.unwrap_or(1);
        let unit = u8::try_from(unit).unwrap_or_else(|_| {
            err.add("unit", format!("must be 0 to 255, not {unit}"));
            0
        });
        let output = compile_output(&spec.stream, ctx, err);
        let measurement = spec.measurement.unwrap_or_else(|| task.to_string());
        if let Err(m) = check_measurement(&measurement) {
            err.add("measurement", m);
        }
        check_tags(&spec.tags, err);
        let limits = compile_limits(spec.max_registers, spec.max_bits, spec.max_gap, err);
        if spec.points.is_empty() {
            err.add("points", "must name at least one point".into());
        }
        let task_rule = deadband::compile(spec.deadband.as_ref(), spec.heartbeat, err);
        let mut points = Vec::with_capacity(spec.points.len());
        let mut rules = Vec::with_capacity(spec.points.len());
        for (i, p) in spec.points.into_iter().enumerate() {
            let mut err = err.under(&format!("points[{i}]"));
            let own = deadband::compile(p.deadband.as_ref(), p.heartbeat, &mut err);
            rules.push(task_rule.with(own));
            points.push(compile_point(p, limits, &points, &mut err));
        }
        if err.count() > before {
            return None;
        }
        let output = output?;
        let reads = points::plan(&points, limits);
        Some(Modbus {
            address,
            unit,
            stream: spec.stream,
            measurement,
            tags: spec.tags.into_iter().collect(),
            points,
            reads,
            output,
            exceptions: rules
                .iter()
                .any(Rule::filters)
                .then(|| ByException::new(rules)),
        })
    }

    /// What the samples are written as: what the stream's sink sends. `None` when the stream is
    /// not usable (not defined, reported here, or with problems of its own, already reported).
    fn compile_output(stream: &str, ctx: &Compile<'_>, err: &mut Problems<'_>) -> Option<Output> {
        match ctx.stream(stream) {
            Err(m) => {
                if let Some(m) = m {
                    err.add("stream", m);
                }
                None
            }
            Ok(_) => Some(match ctx.format(stream) {
                RecordFormat::LineProtocol(p) => Output::LineProtocol(p),
                RecordFormat::Json => Output::Json,
                // A sink that takes any line (file, stdout, none): line protocol in ns.
                RecordFormat::Lines => Output::LineProtocol(Precision::Ns),
            }),
        }
    }

    /// Tags (the task's or a point's): neither a key nor a value may be empty.
    fn check_tags(tags: &BTreeMap<String, String>, err: &mut Problems<'_>) {
        for (k, v) in tags {
            if k.is_empty() || v.is_empty() {
                err.add(
                    &format!("tags.{k}"),
                    "keys and values must not be empty".into(),
                );
            }
        }
    }

    /// What one request may read: `max_registers`, `max_bits` (each at most the protocol's
    /// limit) and `max_gap`.
    fn compile_limits(
        max_registers: Option<u32>,
        max_bits: Option<u32>,
        max_gap: Option<u32>,
        err: &mut Problems<'_>,
    ) -> Limits {
        let limit = |field: &str, v: Option<u32>, max: u32, err: &mut Problems<'_>| -> u16 {
            let v = v.unwrap_or(max);
            if (1..=max).contains(&v) {
                u16::try_from(v).expect("at most 2000")
            } else {
                err.add(field, format!("must be 1 to {max}, not {v}"));
                1
            }
        };
        Limits {
            registers: limit("max_registers", max_registers, 125, err),
            bits: limit("max_bits", max_bits, 2000, err),
            max_gap: u16::try_from(max_gap.unwrap_or(0).min(65_535)).expect("clamped"),
        }
    }

    /// One point, its problems under `err` (`points[i]`); `taken`: the points before it, whose
    /// names it may not reuse.
    fn compile_point(
        p: PointSpec,
        limits: Limits,
        taken: &[Point],
        err: &mut Problems<'_>,
    ) -> Point {
        if p.name.is_empty() {
            err.add("name", "must not be empty".into());
        } else if taken.iter().any(|q| q.name == p.name) {
            err.add("name", format!("{:?} is named twice", p.name));
        }
        let table = p.register;
        let kind = point_kind(p.kind, p.length, table, err);
        if p.length.is_some() && !matches!(kind, Kind::Str(_)) {
            err.add("length", "applies to type: string only".into());
        }
        check_point_span(p.address, kind, table, limits, err);
        check_point_encoding(&p, kind, table, err);
        check_tags(&p.tags, err);
        Point {
            name: p.name,
            table,
            address: u16::try_from(p.address).unwrap_or(0),
            kind,
            word_order: p.word_order.unwrap_or_default(),
            byte_order: p.byte_order.unwrap_or_default(),
            scale: p.scale.unwrap_or(1.0),
            offset: p.offset.unwrap_or(0.0),
            tags: p.tags.into_iter().collect(),
        }
    }

    /// A point's value type: `type` (the table's default when unset; bits are always bool), a
    /// string with its `length`.
    fn point_kind(
        kind: Option<PointType>,
        length: Option<u32>,
        table: Table,
        err: &mut Problems<'_>,
    ) -> Kind {
        match (kind, table.bits()) {
            (None, true) | (Some(PointType::Bool), _) => Kind::Bool,
            (Some(_), true) => {
                err.add("type", "coils and discrete inputs are bool".into());
                Kind::Bool
            }
            (None | Some(PointType::U16), false) => Kind::U16,
            (Some(PointType::I16), _) => Kind::I16,
            (Some(PointType::U32), _) => Kind::U32,
            (Some(PointType::I32), _) => Kind::I32,
            (Some(PointType::U64), _) => Kind::U64,
            (Some(PointType::F32), _) => Kind::F32,
            (Some(PointType::F64), _) => Kind::F64,
            (Some(PointType::String), _) => match length {
                Some(n @ 1..=125) => Kind::Str(u16::try_from(n).expect("at most 125")),
                Some(n) => {
                    err.add("length", format!("must be 1 to 125 registers, not {n}"));
                    Kind::Str(1)
                }
                None => {
                    err.add("length", "a string needs its length in registers".into());
                    Kind::Str(1)
                }
            },
        }
    }

    /// A point's addresses: within the table's 65536, and few enough for one request.
    fn check_point_span(
        address: u32,
        kind: Kind,
        table: Table,
        limits: Limits,
        err: &mut Problems<'_>,
    ) {
        let end = u64::from(address) + u64::from(kind.width()) - 1;
        if end > 65_535 {
            err.add(
                "address",
                format!(
                    "{} and the {} after it pass 65535",
                    address,
                    kind.width() - 1
                ),
            );
        }
        let width_limit = if table.bits() {
            limits.bits
        } else {
            limits.registers
        };
        if kind.width() > width_limit {
            let field = if matches!(kind, Kind::Str(_)) {
                "length"
            } else {
                "type"
            };
            err.add(
                field,
                format!(
                    "{} registers do not fit one request (max_registers {width_limit})",
                    kind.width()
                ),
            );
        }
    }

    /// The settings that apply to some values only: `scale` and `offset` (numbers),
    /// `word_order` (two registers or more), `byte_order` (registers).
    fn check_point_encoding(p: &PointSpec, kind: Kind, table: Table, err: &mut Problems<'_>) {
        let number = !matches!(kind, Kind::Bool | Kind::Str(_));
        for (set, field) in [(p.scale, "scale"), (p.offset, "offset")] {
            match set {
                Some(_) if !number => err.add(field, "applies to numbers only".into()),
                Some(v) if !v.is_finite() => {
                    err.add(field, "must be a finite number".into());
                }
                _ => {}
            }
        }
        if p.word_order.is_some() && kind.width() < 2 {
            err.add(
                "word_order",
                "applies to values of two registers or more".into(),
            );
        }
        if p.byte_order.is_some() && table.bits() {
            err.add("byte_order", "applies to registers only".into());
        }
    }
}

/// `host:port`, `host` (port 502), `[v6]:port` or `[v6]`, as the task dials it.
#[cfg(feature = "modbus")]
fn device_address(text: &str) -> Result<String, String> {
    let bad = || format!("{text:?} is not host:port (write [address]:port for IPv6)");
    if text.is_empty() || text.contains(['/', ' ']) {
        return Err(bad());
    }
    if let Some(rest) = text.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((_, "")) => Ok(format!("{text}:502")),
            Some((_, port))
                if port
                    .strip_prefix(':')
                    .is_some_and(|p| p.parse::<u16>().is_ok()) =>
            {
                Ok(text.to_string())
            }
            _ => Err(bad()),
        };
    }
    match text.split_once(':') {
        None => Ok(format!("{text}:502")),
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
            Ok(text.to_string())
        }
        Some(_) => Err(bad()),
    }
}
