//! Prometheus metrics: a fixed-bucket [`Histogram`] that the hot paths observe with two atomic adds,
//! and [`Text`], the text exposition format (0.0.4) written by hand: `# HELP`/`# TYPE` per family,
//! escaped label values, `_bucket`/`_sum`/`_count` for histograms. What is exported, and from where,
//! is `admin::render`; this module only knows the format. Counters themselves live with the code
//! that counts (task, delivery, store writer, tail), so nothing here is on a hot path; a
//! [`Registry`] keeps such counters by name for the agent, which owns them.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Seconds: task runs (a scrape takes milliseconds, a backup hours).
pub const TASK_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0,
];
/// Seconds: one request to a sink.
pub const REQUEST_BUCKETS: &[f64] = &[
    0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Seconds: one store commit (its fsync).
pub const COMMIT_BUCKETS: &[f64] = &[
    0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// Counters by name that outlive what counts into them (a task replaced by a reload, a source
/// rebuilt after a store error): the agent creates one per kind, hands each task or source its
/// counters when it is built ([`Registry::get`]) and the metrics page reads them all, by name.
pub struct Registry<T> {
    by_name: Mutex<BTreeMap<String, Arc<T>>>,
}

impl<T> Default for Registry<T> {
    fn default() -> Self {
        Registry {
            by_name: Mutex::new(BTreeMap::new()),
        }
    }
}

impl<T: Default> Registry<T> {
    /// The counters of `name`, created on first use.
    pub fn get(&self, name: &str) -> Arc<T> {
        let mut all = self.by_name.lock().unwrap_or_else(|e| e.into_inner());
        Arc::clone(all.entry(name.to_string()).or_default())
    }

    /// Every counter set, by name.
    pub fn all(&self) -> Vec<(String, Arc<T>)> {
        let all = self.by_name.lock().unwrap_or_else(|e| e.into_inner());
        all.iter()
            .map(|(k, v)| (k.clone(), Arc::clone(v)))
            .collect()
    }

    /// Drops the counters of `name` (what counted into them is gone), so its series leave the
    /// metrics; a later [`Registry::get`] starts from zero.
    pub fn forget(&self, name: &str) {
        self.by_name
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
    }
}

/// One counter per key (names from the file, such as a stream and a status code), created at its
/// first count: for families whose label values are only known as things happen.
#[derive(Debug)]
pub struct CountsBy<K> {
    counts: Mutex<BTreeMap<K, u64>>,
}

impl<K> Default for CountsBy<K> {
    fn default() -> Self {
        CountsBy {
            counts: Mutex::new(BTreeMap::new()),
        }
    }
}

impl<K: Ord + Clone> CountsBy<K> {
    pub fn add(&self, key: K) {
        *self
            .counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key)
            .or_insert(0) += 1;
    }

    /// Every key and its count, in key order.
    pub fn all(&self) -> Vec<(K, u64)> {
        let counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        counts.iter().map(|(k, n)| (k.clone(), *n)).collect()
    }
}

/// Counts of observations per upper bound (not cumulative until rendered), and their sum.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// One per bound, then +Inf.
    counts: Box<[AtomicU64]>,
    sum_nanos: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_nanos: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = self
            .bounds
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(self.bounds.len());
        self.counts[i].fetch_add(1, Relaxed);
        self.sum_nanos
            .fetch_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX), Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Relaxed)).sum()
    }
}

/// A page of metrics in the text exposition format.
#[derive(Default)]
pub struct Text {
    out: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Text {
    /// Starts a family: every sample of it must follow, before the next family.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) {
        let kind = match kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    /// One sample. Integers are written without a fraction.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.out.push_str(name);
        self.labels(labels, None);
        self.out.push(' ');
        push_value(&mut self.out, value);
        self.out.push('\n');
    }

    /// A family with one sample: a convenience for the many single-valued metrics.
    pub fn single(&mut self, name: &str, kind: Kind, help: &str, value: f64) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }

    /// The samples of one histogram (its family must have been started).
    pub fn histogram(&mut self, name: &str, labels: &[(&str, &str)], h: &Histogram) {
        let mut cumulative = 0u64;
        for (i, c) in h.counts.iter().enumerate() {
            cumulative += c.load(Relaxed);
            let le = match h.bounds.get(i) {
                Some(b) => format_f64(*b),
                None => "+Inf".to_string(),
            };
            let _ = write!(self.out, "{name}_bucket");
            self.labels(labels, Some(&le));
            let _ = writeln!(self.out, " {cumulative}");
        }
        let _ = write!(self.out, "{name}_sum");
        self.labels(labels, None);
        self.out.push(' ');
        push_value(&mut self.out, h.sum_nanos.load(Relaxed) as f64 / 1e9);
        self.out.push('\n');
        let _ = write!(self.out, "{name}_count");
        self.labels(labels, None);
        let _ = writeln!(self.out, " {cumulative}");
    }

    fn labels(&mut self, labels: &[(&str, &str)], le: Option<&str>) {
        if labels.is_empty() && le.is_none() {
            return;
        }
        self.out.push('{');
        let mut first = true;
        for (k, v) in labels.iter().copied().chain(le.map(|l| ("le", l))) {
            if !first {
                self.out.push(',');
            }
            first = false;
            self.out.push_str(k);
            self.out.push_str("=\"");
            for c in v.chars() {
                match c {
                    '\\' => self.out.push_str("\\\\"),
                    '"' => self.out.push_str("\\\""),
                    '\n' => self.out.push_str("\\n"),
                    c => self.out.push(c),
                }
            }
            self.out.push('"');
        }
        self.out.push('}');
    }

    pub fn finish(self) -> String {
        self.out
    }
}

fn format_f64(v: f64) -> String {
    let mut s = String::new();
    push_value(&mut s, v);
    s
}

fn push_value(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        let _ = write!(out, "{}", v as i64);
    } else {
        let _ = write!(out, "{v}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_format_escapes_labels_and_renders_cumulative_buckets() {
        let h = Histogram::new(&[0.1, 1.0]);
        h.observe(Duration::from_millis(50));
        h.observe(Duration::from_millis(500));
        h.observe(Duration::from_secs(3));
        let mut t = Text::default();
        t.family("x_seconds", Kind::Histogram, "a test");
        t.histogram("x_seconds", &[("task", "a\"b\\c\nd")], &h);
        t.single("y_total", Kind::Counter, "ys", 3.0);
        t.single("z", Kind::Gauge, "a fraction", 0.25);
        let text = t.finish();
        let want = "# HELP x_seconds a test\n# TYPE x_seconds histogram\n\
            x_seconds_bucket{task=\"a\\\"b\\\\c\\nd\",le=\"0.1\"} 1\n\
            x_seconds_bucket{task=\"a\\\"b\\\\c\\nd\",le=\"1\"} 2\n\
            x_seconds_bucket{task=\"a\\\"b\\\\c\\nd\",le=\"+Inf\"} 3\n\
            x_seconds_sum{task=\"a\\\"b\\\\c\\nd\"} 3.55\n\
            x_seconds_count{task=\"a\\\"b\\\\c\\nd\"} 3\n\
            # HELP y_total ys\n# TYPE y_total counter\ny_total 3\n\
            # HELP z a fraction\n# TYPE z gauge\nz 0.25\n";
        assert_eq!(text, want);
        assert_eq!(h.count(), 3);
    }
}
