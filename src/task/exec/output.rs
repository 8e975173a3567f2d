//! What an `exec` task with `stream:` appends: its stdout, captured up to `max_output`, made into
//! records after the run ([`Output::records`]: a record per line, checked and converted as the
//! stream's sink needs them, or the whole output as one JSON record) and the marked record a failed
//! run leaves with `append_failed`. It does not run the program or store anything itself: `exec`
//! captures the output and appends what this returns. Built by `task::exec::config`.

use crate::record::RecordFormat;

/// The `stream:` settings of an `exec` task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    pub stream: String,
    pub format: OutputFormat,
    /// The most stdout a run may print; over it the run fails and nothing is appended.
    pub max_output: u64,
    /// A failed or timed-out run appends its output as one record marked with the reason.
    pub append_failed: bool,
}

/// How stdout becomes records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    /// A record per non-empty line, each what the stream's sink needs (JSON, a line-protocol
    /// point, or any line); the config chose `carries` from the sink and the `format`.
    Lines(RecordFormat),
    /// The whole output as one JSON record: `{"task", "time_ms", "output"}`.
    Whole,
}

/// What stdout held: the bytes up to the limit, and whether more was printed.
#[derive(Debug, Default)]
pub struct Captured {
    pub bytes: Vec<u8>,
    pub over: bool,
}

impl Captured {
    /// Keeps `chunk` while within `max` bytes in all; past it keeps nothing more.
    pub fn push(&mut self, chunk: &[u8], max: u64) {
        if self.over {
            return;
        }
        if (self.bytes.len() + chunk.len()) as u64 > max {
            self.over = true;
            self.bytes = Vec::new();
        } else {
            self.bytes.extend_from_slice(chunk);
        }
    }
}

impl Output {
    /// The records of a successful run's output; `started_ns` stamps points without a time. An
    /// error names the line and what it is not, or the limit passed: the run fails, and nothing of
    /// its output is appended (but the marked record of `append_failed`).
    pub fn records(
        &self,
        task: &str,
        started_ns: i64,
        out: &Captured,
    ) -> Result<Vec<Vec<u8>>, String> {
        if out.over {
            return Err(self.over_limit());
        }
        match self.format {
            OutputFormat::Whole => Ok(vec![whole(task, started_ns, &out.bytes, None)]),
            OutputFormat::Lines(carries) => {
                let mut records = Vec::new();
                for (i, line) in out.bytes.split(|b| *b == b'\n').enumerate() {
                    match crate::record::line::line_record(carries, line, started_ns) {
                        Ok(Some(r)) => records.push(r),
                        Ok(None) => {}
                        Err(why) => {
                            return Err(format!("stdout line {} {why}", i + 1));
                        }
                    }
                }
                Ok(records)
            }
        }
    }

    /// With `append_failed`, the one record a failed run leaves: its output (or the limit it
    /// passed) marked with why it failed.
    pub fn failed(&self, task: &str, started_ns: i64, out: &Captured, why: &str) -> Vec<u8> {
        let why = if out.over && !why.contains("max_output") {
            format!("{why}; {}", self.over_limit())
        } else {
            why.to_string()
        };
        whole(task, started_ns, &out.bytes, Some(&why))
    }

    fn over_limit(&self) -> String {
        format!(
            "stdout passed max_output ({})",
            crate::units::fmt_size(self.max_output)
        )
    }
}

/// `{"task", "time_ms", "output"}`, and `"failed"` with the reason for a failed run.
fn whole(task: &str, started_ns: i64, bytes: &[u8], failed: Option<&str>) -> Vec<u8> {
    let mut v = serde_json::json!({
        "task": task,
        "time_ms": started_ns.div_euclid(1_000_000),
        "output": String::from_utf8_lossy(bytes),
    });
    if let Some(why) = failed {
        v["failed"] = why.into();
    }
    v.to_string().into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scrape::lineproto::Precision;

    fn output(format: OutputFormat) -> Output {
        Output {
            stream: "s".into(),
            format,
            max_output: 64,
            append_failed: false,
        }
    }

    fn captured(text: &str) -> Captured {
        let mut c = Captured::default();
        c.push(text.as_bytes(), 64);
        c
    }

    #[test]
    fn lines_become_what_the_stream_carries() {
        let t = 1_700_000_000_123_000_000;
        let lp = output(OutputFormat::Lines(RecordFormat::LineProtocol(
            Precision::Ms,
        )));
        let r = lp.records("t", t, &captured("m v=1\n\nm v=2 5\n")).unwrap();
        assert_eq!(r, [b"m v=1 1700000000123".to_vec(), b"m v=2 5".to_vec()]);
        let json = output(OutputFormat::Lines(RecordFormat::Json));
        let e = json
            .records("t", t, &captured("{\"a\":1}\nnope\n"))
            .unwrap_err();
        assert!(e.starts_with("stdout line 2 is not JSON"), "{e}");
        let any = output(OutputFormat::Lines(RecordFormat::Lines));
        let r = any.records("t", t, &captured("a b\r\nc")).unwrap();
        assert_eq!(r, [b"a b".to_vec(), b"c".to_vec()]);
    }

    #[test]
    fn the_whole_output_is_one_record_and_a_failed_run_is_marked() {
        let o = output(OutputFormat::Whole);
        let r = o.records("t", 2_000_000, &captured("x\ny\n")).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&r[0]).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"task": "t", "time_ms": 2, "output": "x\ny\n"})
        );
        let f = o.failed("t", 2_000_000, &captured("half"), "exited with code 3");
        let v: serde_json::Value = serde_json::from_slice(&f).unwrap();
        assert_eq!(v["failed"], "exited with code 3");
        assert_eq!(v["output"], "half");
    }

    #[test]
    fn output_over_the_limit_keeps_nothing_and_fails_the_run() {
        let mut c = Captured::default();
        c.push(&[b'a'; 40], 64);
        c.push(&[b'b'; 40], 64);
        c.push(b"c", 64);
        assert!(c.over && c.bytes.is_empty());
        let e = output(OutputFormat::Whole).records("t", 0, &c).unwrap_err();
        assert!(e.contains("passed max_output (64B)"), "{e}");
    }
}
