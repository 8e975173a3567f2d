//! Aggregates of line-protocol points per series and window (for a stream's `when_full:
//! downsample`): raw points, or aggregates of a finer window, go in; one point per series and
//! window comes out, at the window's start, with the fields named as Telegraf's `basicstats`
//! names them: `F` the last value (its own type), `F_min`, `F_max` (integers stay integers),
//! `F_mean` (a float) and `F_count` (always: the weight that lets a coarser window be built from
//! finer ones exactly). A boolean or string field keeps its last value and count. A line that is
//! not a point with a timestamp passes through as it is. Pure: no clock, no I/O; called by the
//! store's rewrite (`store::tx::downsample`).

use std::collections::BTreeMap;
use std::io::Write as _;

use super::lineparse::{Raw, raw_point};
use super::lineproto::write_float;

/// Which aggregates are written besides the count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keep {
    pub last: bool,
    pub min: bool,
    pub max: bool,
    pub mean: bool,
}

impl Keep {
    pub const ALL: Keep = Keep {
        last: true,
        min: true,
        max: true,
        mean: true,
    };
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Last,
    Min,
    Max,
    Mean,
}

/// A field's value, typed as it was written.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Float(f64),
    Int(i64),
    UInt(u64),
    Bool(bool),
    /// Between the quotes, still escaped.
    Str(Vec<u8>),
}

impl Value {
    fn of(raw: Raw<'_>) -> Value {
        match raw {
            Raw::Float(v) => Value::Float(v),
            Raw::Int(v) => Value::Int(v),
            Raw::UInt(v) => Value::UInt(v),
            Raw::Bool(v) => Value::Bool(v),
            Raw::Str(s) => Value::Str(s.to_vec()),
        }
    }

    fn number(&self) -> Option<f64> {
        match self {
            Value::Float(v) => Some(*v),
            Value::Int(v) => Some(*v as f64),
            Value::UInt(v) => Some(*v as f64),
            Value::Bool(_) | Value::Str(_) => None,
        }
    }

    fn write(&self, out: &mut Vec<u8>) {
        match self {
            Value::Float(v) => write_float(out, *v),
            Value::Int(v) => write!(out, "{v}i").expect("writing to a Vec cannot fail"),
            Value::UInt(v) => write!(out, "{v}u").expect("writing to a Vec cannot fail"),
            Value::Bool(v) => out.extend_from_slice(if *v { b"true" } else { b"false" }),
            Value::Str(s) => {
                out.push(b'"');
                out.extend_from_slice(s);
                out.push(b'"');
            }
        }
    }

    /// The lesser (`less`) or greater of two numbers of one field, in the type they share (a
    /// float when they differ).
    fn pick(a: &Value, b: &Value, less: bool) -> Value {
        fn one<T: PartialOrd + Copy>(x: T, y: T, less: bool) -> T {
            if (x <= y) == less { x } else { y }
        }
        match (a, b) {
            (Value::Int(x), Value::Int(y)) => Value::Int(one(*x, *y, less)),
            (Value::UInt(x), Value::UInt(y)) => Value::UInt(one(*x, *y, less)),
            _ => {
                let (x, y) = (a.number().unwrap_or(0.0), b.number().unwrap_or(0.0));
                Value::Float(one(x, y, less))
            }
        }
    }
}

/// One field of one series in one window.
#[derive(Debug, Default)]
struct Agg {
    count: u64,
    /// Of the numbers (`mean` × `count` for an aggregate read back).
    sum: f64,
    min: Option<Value>,
    max: Option<Value>,
    /// The last value and when it was taken (an aggregate's: its window's start).
    last: Option<(i64, Value)>,
    /// A number was seen (a sample, or an aggregate's min, max or mean): a mean is written.
    numeric: bool,
}

impl Agg {
    fn add_sample(&mut self, t: i64, v: Value) {
        self.count += 1;
        if let Some(x) = v.number() {
            self.sum += x;
            self.numeric = true;
            self.bound(Some(&v), Some(&v));
        }
        self.set_last(t, v);
    }

    fn bound(&mut self, min: Option<&Value>, max: Option<&Value>) {
        let merge = |now: &Option<Value>, v: Option<&Value>, less: bool| match (now, v) {
            (Some(m), Some(v)) => Some(Value::pick(m, v, less)),
            (None, Some(v)) => Some(v.clone()),
            (now, None) => now.clone(),
        };
        self.min = merge(&self.min, min, true);
        self.max = merge(&self.max, max, false);
    }

    fn set_last(&mut self, t: i64, v: Value) {
        if self.last.as_ref().is_none_or(|(at, _)| t >= *at) {
            self.last = Some((t, v));
        }
    }
}

/// An aggregate point read back, one field's parts.
#[derive(Debug, Default)]
struct Parts {
    last: Option<Value>,
    min: Option<Value>,
    max: Option<Value>,
    mean: Option<f64>,
    count: Option<u64>,
}

/// One series' fields in one window, in the order first seen: key (as written) and aggregate.
type Fields = Vec<(Vec<u8>, Agg)>;

/// Aggregates for one window length (in the points' timestamp unit).
#[derive(Debug)]
pub struct Aggregator {
    window: i64,
    keep: Keep,
    /// Per (window start, series): its fields in the order first seen.
    groups: BTreeMap<(i64, Vec<u8>), Fields>,
    passed: Vec<Vec<u8>>,
}

impl Aggregator {
    pub fn new(window: i64, keep: Keep) -> Aggregator {
        Aggregator {
            window: window.max(1),
            keep,
            groups: BTreeMap::new(),
            passed: Vec::new(),
        }
    }

    /// Adds a raw point (each field a sample).
    pub fn add_raw(&mut self, line: &[u8]) {
        let Ok(p) = raw_point(line) else {
            return self.passed.push(line.to_vec());
        };
        let Some(t) = p.timestamp else {
            return self.passed.push(line.to_vec());
        };
        let fields = self.group(t, p.series);
        for (key, raw) in p.fields {
            field(fields, key).add_sample(t, Value::of(raw));
        }
    }

    /// Adds an aggregate point of a finer window (written by [`Aggregator::finish`]).
    pub fn add_aggregate(&mut self, line: &[u8]) {
        let Ok(p) = raw_point(line) else {
            return self.passed.push(line.to_vec());
        };
        let Some(t) = p.timestamp else {
            return self.passed.push(line.to_vec());
        };
        // A field's parts are written together and end with its count (always written), so a
        // count names the field the parts before it belong to. A key ending in `_count` is a count
        // unless its own count comes later (`x_count` of a Prometheus summary, then
        // `x_count_count`).
        let keys: Vec<&[u8]> = p.fields.iter().map(|(k, _)| *k).collect();
        let mut read: Vec<(&[u8], Parts)> = Vec::new();
        let mut pending: Vec<(&[u8], Raw<'_>)> = Vec::new();
        for (i, (key, raw)) in p.fields.into_iter().enumerate() {
            let counted_later = keys[i + 1..]
                .iter()
                .any(|k| k.strip_suffix(b"_count".as_slice()) == Some(key));
            let Some(base) = key
                .strip_suffix(b"_count".as_slice())
                .filter(|_| !counted_later)
            else {
                pending.push((key, raw));
                continue;
            };
            let mut f = Parts {
                count: Value::of(raw).number().map(|c| c as u64),
                ..Parts::default()
            };
            for (k, raw) in std::mem::take(&mut pending) {
                let v = Value::of(raw);
                match part_of(k, base) {
                    Some(Part::Last) => f.last = Some(v),
                    Some(Part::Min) => f.min = Some(v),
                    Some(Part::Max) => f.max = Some(v),
                    Some(Part::Mean) => f.mean = v.number(),
                    None => read.push((k, sample(v))),
                }
            }
            read.push((base, f));
        }
        // Not an aggregate's (a line written otherwise): each field a sample of its own.
        read.extend(
            pending
                .into_iter()
                .map(|(k, raw)| (k, sample(Value::of(raw)))),
        );
        let fields = self.group(t, p.series);
        for (key, f) in read {
            let a = field(fields, key);
            let count = f.count.unwrap_or(1);
            a.count += count;
            if let Some(mean) = f.mean {
                a.sum += mean * count as f64;
            }
            a.numeric |= f.mean.is_some() || f.min.is_some() || f.max.is_some();
            if f.count.is_none()
                && let Some(x) = f.last.as_ref().and_then(Value::number)
            {
                // A plain sample read back: it counts as one.
                a.sum += x;
                a.numeric = true;
                a.bound(f.last.as_ref(), f.last.as_ref());
            }
            a.bound(f.min.as_ref(), f.max.as_ref());
            if let Some(v) = f.last {
                a.set_last(t, v);
            }
        }
    }

    fn group(&mut self, t: i64, series: &[u8]) -> &mut Fields {
        let start = t.div_euclid(self.window) * self.window;
        self.groups.entry((start, series.to_vec())).or_default()
    }

    /// The aggregate points with their window's start, by window then series, then the lines
    /// that passed through (`i64::MAX`: after every window).
    pub fn finish(self) -> Vec<(i64, Vec<u8>)> {
        let mut out = Vec::with_capacity(self.groups.len() + self.passed.len());
        for ((start, series), fields) in self.groups {
            let mut line = series;
            let mut sep = b' ';
            for (key, a) in &fields {
                let mut put = |suffix: &[u8], write: &dyn Fn(&mut Vec<u8>)| {
                    line.push(sep);
                    sep = b',';
                    line.extend_from_slice(key);
                    line.extend_from_slice(suffix);
                    line.push(b'=');
                    write(&mut line);
                };
                if let (true, Some((_, v))) = (self.keep.last, &a.last) {
                    put(b"", &|o| v.write(o));
                }
                if let (true, Some(v)) = (self.keep.min, &a.min) {
                    put(b"_min", &|o| v.write(o));
                }
                if let (true, Some(v)) = (self.keep.max, &a.max) {
                    put(b"_max", &|o| v.write(o));
                }
                let mean = a.sum / a.count.max(1) as f64;
                if self.keep.mean && a.numeric && mean.is_finite() {
                    put(b"_mean", &|o| write_float(o, mean));
                }
                put(b"_count", &|o| {
                    write!(o, "{}i", a.count).expect("writing to a Vec cannot fail")
                });
            }
            write!(line, " {start}").expect("writing to a Vec cannot fail");
            out.push((start, line));
        }
        out.extend(self.passed.into_iter().map(|l| (i64::MAX, l)));
        out
    }
}

/// A field read back that is no aggregate's part: one sample.
fn sample(v: Value) -> Parts {
    Parts {
        last: Some(v),
        ..Parts::default()
    }
}

/// Which part of field `base` the key `k` is, written as [`Aggregator::finish`] writes them.
fn part_of(k: &[u8], base: &[u8]) -> Option<Part> {
    let rest = k.strip_prefix(base)?;
    match rest {
        b"" => Some(Part::Last),
        b"_min" => Some(Part::Min),
        b"_max" => Some(Part::Max),
        b"_mean" => Some(Part::Mean),
        _ => None,
    }
}

fn field<'f>(fields: &'f mut Fields, key: &[u8]) -> &'f mut Agg {
    let at = match fields.iter().position(|(k, _)| k == key) {
        Some(i) => i,
        None => {
            fields.push((key.to_vec(), Agg::default()));
            fields.len() - 1
        }
    };
    &mut fields[at].1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(lines: Vec<(i64, Vec<u8>)>) -> Vec<String> {
        lines
            .into_iter()
            .map(|(_, l)| String::from_utf8(l).unwrap())
            .collect()
    }

    #[test]
    fn raw_points_become_one_point_per_series_and_window() {
        let mut a = Aggregator::new(60, Keep::ALL);
        for line in [
            "m,s=a v=1,n=5i,ok=true 0",
            "m,s=b v=10 1",
            "m,s=a v=3,n=2i,ok=false 59",
            "m,s=a v=7 60",
            "no time v=1",
        ] {
            a.add_raw(line.as_bytes());
        }
        assert_eq!(
            text(a.finish()),
            [
                "m,s=a v=3,v_min=1,v_max=3,v_mean=2,v_count=2i,n=2i,n_min=2i,n_max=5i,n_mean=3.5,n_count=2i,ok=false,ok_count=2i 0",
                "m,s=b v=10,v_min=10,v_max=10,v_mean=10,v_count=1i 0",
                "m,s=a v=7,v_min=7,v_max=7,v_mean=7,v_count=1i 60",
                "no time v=1",
            ]
        );
    }

    #[test]
    fn aggregates_of_finer_windows_make_the_coarser_window_exactly() {
        let samples: Vec<(i64, f64)> = (0..600).map(|i| (i, ((i * 37) % 101) as f64)).collect();
        let mut direct = Aggregator::new(600, Keep::ALL);
        let mut fine = Aggregator::new(60, Keep::ALL);
        for (t, v) in &samples {
            let line = format!("m v={v} {t}");
            direct.add_raw(line.as_bytes());
            fine.add_raw(line.as_bytes());
        }
        let mut coarse = Aggregator::new(600, Keep::ALL);
        // In two passes, as the store's rewrite merges a window split between two of them.
        let fine = fine.finish();
        let mut first = Aggregator::new(600, Keep::ALL);
        for (_, l) in &fine[..4] {
            first.add_aggregate(l);
        }
        for (_, l) in first.finish().iter().chain(&fine[4..]) {
            coarse.add_aggregate(l);
        }
        assert_eq!(text(coarse.finish()), text(direct.finish()));
    }

    /// Two levels of aggregates equal one, whatever the fields are called (a Prometheus summary's
    /// `x_sum` and `x_count` beside each other) and whatever is kept.
    #[test]
    fn fields_named_like_aggregates_and_a_partial_keep_survive_the_ladder() {
        let lines: Vec<String> = (0..600)
            .map(|i| format!("m x_sum={}.5,x_count={}i,v={} {i}", i * 3, i, (i * 13) % 7))
            .collect();
        for keep in [
            Keep::ALL,
            Keep {
                last: false,
                min: true,
                max: false,
                mean: false,
            },
            Keep {
                last: true,
                min: false,
                max: true,
                mean: true,
            },
        ] {
            let (mut direct, mut fine) = (Aggregator::new(600, keep), Aggregator::new(60, keep));
            for l in &lines {
                direct.add_raw(l.as_bytes());
                fine.add_raw(l.as_bytes());
            }
            let mut coarse = Aggregator::new(600, keep);
            for (_, l) in fine.finish() {
                coarse.add_aggregate(&l);
            }
            assert_eq!(text(coarse.finish()), text(direct.finish()), "{keep:?}");
        }
    }

    #[test]
    fn keep_leaves_out_what_is_not_wanted_but_the_count() {
        let keep = Keep {
            last: false,
            min: true,
            max: false,
            mean: false,
        };
        let mut a = Aggregator::new(10, keep);
        a.add_raw(b"m v=2 3");
        a.add_raw(b"m v=1 4");
        assert_eq!(text(a.finish()), ["m v_min=1,v_count=2i 0"]);
    }
}
