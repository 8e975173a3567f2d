//! How the lines of a followed file become records in a [`Batch`]: multiline grouping, the
//! source's filters, encoding (written in place into the batch, in the source's [`record::Shape`]:
//! its `fields`, `host`, `labels` and `format`), a record cut to what the stream holds, and the
//! line counters. [`Settings`] are what a source's records (and reads) are made
//! with.
//!
//! It does not read files or know where a line came from beyond its path and offset: the tailer
//! splits what it reads into lines and hands them here, with the file's [`Assembler`].

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use super::batch::Batch;
use super::lines::{Assembler, Group, Line};
use super::record;
use super::{Format, TailConfig, TailStats};

/// Smallest read.
const MIN_CHUNK: usize = 256 << 10;

/// What one source needs at run time besides its config.
#[derive(Debug, Clone)]
pub struct Settings {
    pub cfg: Arc<TailConfig>,
    /// How its records are made (fields, host, labels, `format`).
    pub shape: record::Shape,
    /// Bytes read at once (past the 256 bytes of context before the position).
    pub chunk: usize,
    /// Largest record the stream can hold.
    pub record_limit: usize,
}

impl Settings {
    pub fn new(cfg: Arc<TailConfig>, host: Option<&str>, stream_max_bytes: u64) -> Settings {
        let shape = record::Shape::new(cfg.fields, host, &cfg.labels, cfg.format == Format::Json);
        let chunk = MIN_CHUNK.max(2 * cfg.max_line_bytes + 2);
        let record_limit = usize::try_from(stream_max_bytes.saturating_sub(256))
            .unwrap_or(usize::MAX)
            .max(64);
        Settings {
            cfg,
            shape,
            chunk,
            record_limit,
        }
    }
}

/// What the records of one file are made with at one step: the source's settings and counters,
/// the file's path (as a JSON string, as records carry it) and the time they are read at.
pub struct Emit<'a> {
    pub settings: &'a Settings,
    pub stats: &'a TailStats,
    pub path_json: &'a str,
    pub now: Instant,
}

/// A record before it is encoded: its text, its first line (what the filters look at), and the
/// lines of the file it covers.
struct Draft<'a> {
    text: &'a str,
    first: &'a str,
    offset: u64,
    lines: u32,
    truncated: bool,
}

impl Emit<'_> {
    /// Takes one line of a file into its multiline group or, without multiline, into the batch
    /// as a record. False when the batch has no room for what the line completes (nothing
    /// changed then).
    pub fn take_line(
        &self,
        group: &mut Assembler,
        batch: &mut Batch,
        line: Line<'_>,
        tail: impl FnOnce() -> u64,
    ) -> bool {
        let stats = self.stats;
        let text = crate::record::text(line.bytes);
        match &self.settings.cfg.multiline {
            Some(ml) => {
                let starts = ml.start.is_match(&text);
                if group.completes(ml, line.bytes.len(), starts) {
                    let g = group
                        .pending
                        .as_ref()
                        .expect("completes only a pending group");
                    if !self.offer_group(batch, g, false) {
                        return false;
                    }
                    group.pending = None;
                }
                group.push(ml, line, starts, self.now, tail);
            }
            None => {
                let draft = Draft {
                    text: &text,
                    first: &text,
                    offset: line.offset,
                    lines: 1,
                    truncated: line.truncated,
                };
                if !self.offer(batch, &draft, false) {
                    return false;
                }
            }
        }
        stats.lines_read.fetch_add(1, Relaxed);
        if line.truncated {
            stats.truncated_lines.fetch_add(1, Relaxed);
        }
        true
    }

    /// Offers a completed multiline group as one record (see [`Emit::offer`]).
    pub fn offer_group(&self, batch: &mut Batch, g: &Group, force: bool) -> bool {
        let text = crate::record::text(&g.text);
        let first = match text.find('\n') {
            Some(i) => &text[..i],
            None => &text[..],
        };
        let draft = Draft {
            text: &text,
            first,
            offset: g.offset,
            lines: g.lines,
            truncated: g.truncated,
        };
        self.offer(batch, &draft, force)
    }

    /// Filters a record and, when kept, writes it into the batch if it fits (or `force`). False
    /// when it did not fit (nothing changed then).
    fn offer(&self, batch: &mut Batch, d: &Draft<'_>, force: bool) -> bool {
        let (s, stats, path_json) = (self.settings, self.stats, self.path_json);
        if !s.cfg.filter.is_empty() && !s.cfg.filter.keeps(d.text, d.first) {
            stats.filtered_lines.fetch_add(u64::from(d.lines), Relaxed);
            return true;
        }
        let shape = &s.shape;
        // Under `format: json`, a line that is a JSON object is the record (a cut one never is:
        // it is not the object that was written).
        let mut wrapped = shape.json;
        let mut cut = false;
        let taken = batch.push_with(force, self.now, |out| {
            let start = out.len();
            if shape.json && !d.truncated {
                wrapped = shape
                    .object(out, d.text, path_json, d.offset, d.lines)
                    .is_none();
            }
            if wrapped || !shape.json {
                shape.wrap(out, d.text, path_json, d.offset, d.lines, d.truncated);
            }
            if out.len() - start > s.record_limit {
                // Only for streams whose max_bytes is smaller than a line: cut it to what surely
                // fits (escaping can make a byte six).
                out.truncate(start);
                let room = s
                    .record_limit
                    .saturating_sub(path_json.len() + shape.overhead())
                    / 6;
                let text = crate::record::text(record::cut_at_char(d.text.as_bytes(), room));
                shape.wrap(out, &text, path_json, d.offset, d.lines, true);
                cut = !d.truncated;
            }
        });
        if !taken {
            return false;
        }
        if cut {
            stats.truncated_lines.fetch_add(1, Relaxed);
        }
        if shape.json && (wrapped || cut) {
            stats.wrapped_lines.fetch_add(u64::from(d.lines), Relaxed);
        }
        true
    }
}
