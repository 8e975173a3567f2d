//! A `modbus` task's points and the requests that read them: what each point is (its table,
//! address, type with word and byte order, scale and offset), the reads that cover them (per
//! table, joined while the span stays within the device's limit and the holes within `max_gap`),
//! and a read's registers or bits decoded into each point's value. Pure: no I/O. Built by
//! `task::modbus::config`; used by `task::modbus`.

/// The four Modbus tables; also the file's word for a point's `register:`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Table {
    /// Read-write bits.
    Coil,
    /// Read-only bits (discrete inputs).
    Discrete,
    /// Read-only 16-bit registers.
    Input,
    /// Read-write 16-bit registers.
    Holding,
}

impl Table {
    /// Coils and discrete inputs are read as bits, the others as 16-bit registers.
    pub fn bits(self) -> bool {
        matches!(self, Table::Coil | Table::Discrete)
    }

    /// For messages: `holding registers 4-5`.
    pub fn plural(self) -> &'static str {
        match self {
            Table::Coil => "coils",
            Table::Discrete => "discrete inputs",
            Table::Input => "input registers",
            Table::Holding => "holding registers",
        }
    }
}

/// A point's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Bool,
    U16,
    I16,
    U32,
    I32,
    U64,
    F32,
    F64,
    /// Text in this many registers (two bytes each), NULs and spaces at the end dropped.
    Str(u16),
}

impl Kind {
    /// Registers (or bits) the point takes.
    pub fn width(self) -> u16 {
        match self {
            Kind::Bool | Kind::U16 | Kind::I16 => 1,
            Kind::U32 | Kind::I32 | Kind::F32 => 2,
            Kind::U64 | Kind::F64 => 4,
            Kind::Str(n) => n,
        }
    }
}

/// Which comes first: the most significant word (byte) or the least; also the file's word for a
/// point's `word_order:` and `byte_order:`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Order {
    /// Most significant first (the default; Modbus' own order for the bytes of a register).
    #[default]
    Big,
    /// Least significant first.
    Little,
}

/// One value read from the device.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub name: String,
    pub table: Table,
    pub address: u16,
    pub kind: Kind,
    pub word_order: Order,
    pub byte_order: Order,
    /// A number is `raw * scale + offset`.
    pub scale: f64,
    pub offset: f64,
    /// Tags of this point beside the task's (sorted by key).
    pub tags: Vec<(String, String)>,
}

impl Point {
    /// The last address the point takes.
    pub fn end(&self) -> u32 {
        u32::from(self.address) + u32::from(self.kind.width()) - 1
    }
}

/// One request: `count` registers or bits of `table` from `start`, covering `points` (indexes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    pub table: Table,
    pub start: u16,
    pub count: u16,
    pub points: Vec<usize>,
}

/// The device's limits on one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Registers per request (the protocol allows 125).
    pub registers: u16,
    /// Bits per request (the protocol allows 2000).
    pub bits: u16,
    /// Unused addresses a request may read over to join two points (a device may refuse a read
    /// that touches an address it does not have, hence 0 by default).
    pub max_gap: u16,
}

/// The fewest reads that cover `points` within `limits`: per table in address order, a point joins
/// the read before it when the read then spans at most the limit and the hole between them is at
/// most `max_gap`. A point wider than the limit cannot be read (the config refuses it).
pub fn plan(points: &[Point], limits: Limits) -> Vec<Read> {
    let mut order: Vec<usize> = (0..points.len()).collect();
    order.sort_by_key(|&i| (points[i].table, points[i].address));
    let mut reads: Vec<Read> = Vec::new();
    for i in order {
        let p = &points[i];
        let limit = u32::from(if p.table.bits() {
            limits.bits
        } else {
            limits.registers
        });
        if let Some(r) = reads.last_mut()
            && r.table == p.table
        {
            let end = u32::from(r.start) + u32::from(r.count) - 1;
            let gap = u32::from(p.address).saturating_sub(end + 1);
            let new_end = end.max(p.end());
            if gap <= u32::from(limits.max_gap) && new_end - u32::from(r.start) < limit {
                r.count = u16::try_from(new_end - u32::from(r.start) + 1)
                    .expect("within a limit that is a u16");
                r.points.push(i);
                continue;
            }
        }
        reads.push(Read {
            table: p.table,
            start: p.address,
            count: p.kind.width(),
            points: vec![i],
        });
    }
    reads
}

/// A point's value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Number(f64),
    Bool(bool),
    Text(String),
}

/// What one read answered.
pub enum Answer<'a> {
    Registers(&'a [u16]),
    Bits(&'a [bool]),
}

/// The value of `p`, which `read` (starting at `start`) covers; `None` when the answer is shorter
/// than asked (a device's fault, reported by the caller).
pub fn decode(p: &Point, start: u16, answer: &Answer<'_>) -> Option<Value> {
    let at = usize::from(p.address - start);
    let width = usize::from(p.kind.width());
    match answer {
        Answer::Bits(bits) => bits.get(at).map(|b| Value::Bool(*b)),
        Answer::Registers(words) => {
            let words = words.get(at..at + width)?;
            Some(from_words(p, words))
        }
    }
}

fn from_words(p: &Point, words: &[u16]) -> Value {
    // Most significant word first, each word's bytes most significant first.
    let mut ordered: Vec<u16> = words.to_vec();
    if p.word_order == Order::Little {
        ordered.reverse();
    }
    let mut bytes: Vec<u8> = Vec::with_capacity(ordered.len() * 2);
    for w in ordered {
        let b = w.to_be_bytes();
        match p.byte_order {
            Order::Big => bytes.extend_from_slice(&b),
            Order::Little => bytes.extend_from_slice(&[b[1], b[0]]),
        }
    }
    let raw = match p.kind {
        Kind::Bool => return Value::Bool(words[0] != 0),
        Kind::Str(_) => {
            let text = String::from_utf8_lossy(&bytes);
            return Value::Text(text.trim_end_matches(['\0', ' ']).to_string());
        }
        Kind::U16 => f64::from(u16::from_be_bytes([bytes[0], bytes[1]])),
        Kind::I16 => f64::from(i16::from_be_bytes([bytes[0], bytes[1]])),
        Kind::U32 => f64::from(u32::from_be_bytes(four(&bytes))),
        Kind::I32 => f64::from(i32::from_be_bytes(four(&bytes))),
        Kind::F32 => decimal(f32::from_be_bytes(four(&bytes))),
        // Past 2^53 a u64 loses its last digits as a float, as every field of this task is one.
        Kind::U64 => u64::from_be_bytes(eight(&bytes)) as f64,
        Kind::F64 => f64::from_be_bytes(eight(&bytes)),
    };
    Value::Number(raw * p.scale + p.offset)
}

/// An f32 as the f64 nearest its shortest decimal digits, so it is written as the device meant it
/// (`3.14159`), not with the digits of its binary widening (`3.141590118408203`); scaled after
/// that like every other type.
fn decimal(v: f32) -> f64 {
    // `{:?}` is the shortest text that reads back to the same f32 (NaN and infinities too).
    format!("{v:?}").parse().unwrap_or(f64::from(v))
}

fn four(b: &[u8]) -> [u8; 4] {
    [b[0], b[1], b[2], b[3]]
}

fn eight(b: &[u8]) -> [u8; 8] {
    [b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(name: &str, table: Table, address: u16, kind: Kind) -> Point {
        Point {
            name: name.into(),
            table,
            address,
            kind,
            word_order: Order::Big,
            byte_order: Order::Big,
            scale: 1.0,
            offset: 0.0,
            tags: vec![],
        }
    }

    const LIMITS: Limits = Limits {
        registers: 125,
        bits: 2000,
        max_gap: 0,
    };

    #[test]
    fn adjacent_points_share_a_read_and_holes_or_limits_split_them() {
        let points = [
            point("a", Table::Holding, 0, Kind::U16),
            point("c", Table::Holding, 3, Kind::U16),
            point("b", Table::Holding, 1, Kind::F32),
            point("x", Table::Coil, 0, Kind::Bool),
            point("y", Table::Coil, 1, Kind::Bool),
            point("far", Table::Holding, 200, Kind::F64),
            point("edge", Table::Holding, 120, Kind::U32),
            point("i", Table::Input, 5, Kind::U16),
        ];
        let reads = plan(&points, LIMITS);
        let shape: Vec<(Table, u16, u16, Vec<usize>)> = reads
            .into_iter()
            .map(|r| (r.table, r.start, r.count, r.points))
            .collect();
        assert_eq!(
            shape,
            [
                (Table::Coil, 0, 2, vec![3, 4]),
                (Table::Input, 5, 1, vec![7]),
                (Table::Holding, 0, 4, vec![0, 2, 1]),
                (Table::Holding, 120, 2, vec![6]),
                (Table::Holding, 200, 4, vec![5]),
            ]
        );
        // With holes allowed, 0-3 and 120-121 join only if the span fits 125 registers.
        let wide = plan(
            &points,
            Limits {
                max_gap: 200,
                ..LIMITS
            },
        );
        let holding: Vec<(u16, u16)> = wide
            .iter()
            .filter(|r| r.table == Table::Holding)
            .map(|r| (r.start, r.count))
            .collect();
        assert_eq!(holding, [(0, 122), (200, 4)]);
    }

    #[test]
    fn words_and_bytes_in_either_order_make_the_same_numbers() {
        let regs = [0x41ac, 0x0000, 0x0000, 0xc050, 0xffff, 0xfffb, 0x3412];
        let answer = Answer::Registers(&regs);
        let mut p = point("f", Table::Holding, 0, Kind::F32);
        assert_eq!(decode(&p, 0, &answer), Some(Value::Number(21.5)));
        p.address = 2;
        p.word_order = Order::Little;
        assert_eq!(decode(&p, 0, &answer), Some(Value::Number(-3.25)));
        let mut i = point("i", Table::Holding, 4, Kind::I32);
        assert_eq!(decode(&i, 0, &answer), Some(Value::Number(-5.0)));
        i.kind = Kind::U16;
        i.address = 6;
        i.byte_order = Order::Little;
        i.scale = 0.1;
        i.offset = 1.0;
        let Some(Value::Number(v)) = decode(&i, 0, &answer) else {
            panic!()
        };
        assert!((v - (f64::from(0x1234u16) * 0.1 + 1.0)).abs() < 1e-9, "{v}");
        // Past the answer: nothing.
        i.address = 7;
        assert_eq!(decode(&i, 0, &answer), None);
    }

    #[test]
    fn an_f32_keeps_its_own_shortest_digits() {
        let bits = 21.3_f32.to_bits();
        let regs = [(bits >> 16) as u16, bits as u16];
        let answer = Answer::Registers(&regs);
        let mut p = point("t", Table::Holding, 0, Kind::F32);
        let Some(Value::Number(v)) = decode(&p, 0, &answer) else {
            panic!()
        };
        // Not 21.299999237060547, the digits of its widening to f64.
        assert_eq!(format!("{v:?}"), "21.3");
        p.scale = 0.5;
        let Some(Value::Number(v)) = decode(&p, 0, &answer) else {
            panic!()
        };
        // Scaled from those digits.
        assert_eq!(format!("{v:?}"), "10.65");
    }

    #[test]
    fn text_and_bits() {
        let regs = [0x636f, 0x6c69, 0x6272, 0x6921, 0x2000];
        let s = point("s", Table::Holding, 0, Kind::Str(5));
        assert_eq!(
            decode(&s, 0, &Answer::Registers(&regs)),
            Some(Value::Text("colibri!".into()))
        );
        let b = point("b", Table::Coil, 3, Kind::Bool);
        assert_eq!(
            decode(&b, 2, &Answer::Bits(&[false, true])),
            Some(Value::Bool(true))
        );
    }
}
