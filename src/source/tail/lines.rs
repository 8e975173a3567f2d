//! Cutting file bytes into lines (with the `max_line_bytes` bound) and lines into multiline groups.
//! Pure: the tailer feeds bytes in and gets lines and groups out.

use std::time::{Duration, Instant};

/// The first `\n` in `bytes`, eight bytes at a time.
pub fn find_newline(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    let nl = ONES * u64::from(b'\n');
    let mut i = 0;
    while i + 8 <= bytes.len() {
        let x = u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes")) ^ nl;
        // High bit set exactly in the bytes of `x` that are zero (the newlines).
        let zero = !(((x & LOW7) + LOW7) | x | LOW7) & HIGH;
        if zero != 0 {
            return Some(i + (zero.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    bytes[i..].iter().position(|&b| b == b'\n').map(|p| i + p)
}

/// Where a split of a buffer ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    /// Bytes of the buffer that belong to emitted lines (or to a long line being skipped); the rest
    /// is an incomplete last line, to be read again with more data.
    pub consumed: usize,
    /// The buffer ended inside a line longer than the limit: the rest of it up to its newline is
    /// skipped (its start was emitted, truncated).
    pub skipping: bool,
}

/// Cuts `data` (bytes starting at file offset `base`) into complete lines and calls
/// `emit(line, offset, truncated)` for each, line endings (`\n`, `\r\n`) removed. A line longer than
/// `max_line` is emitted cut to `max_line` bytes (at a character boundary) as soon as that is known,
/// and the rest of it is skipped. `skipping` continues a skip from the previous buffer. When `emit`
/// returns false the line was not taken: the split stops before it.
pub fn split(
    data: &[u8],
    base: u64,
    skipping: bool,
    max_line: usize,
    mut emit: impl FnMut(&[u8], u64, bool) -> bool,
) -> Split {
    let mut start = 0;
    if skipping {
        match find_newline(data) {
            Some(i) => start = i + 1,
            None => {
                return Split {
                    consumed: data.len(),
                    skipping: true,
                };
            }
        }
    }
    while let Some(i) = find_newline(&data[start..]) {
        let mut line = &data[start..start + i];
        if let [rest @ .., b'\r'] = line {
            line = rest;
        }
        let offset = base + start as u64;
        let taken = if line.len() > max_line {
            emit(
                crate::source::tail::record::cut_at_char(line, max_line),
                offset,
                true,
            )
        } else {
            emit(line, offset, false)
        };
        if !taken {
            return Split {
                consumed: start,
                skipping: false,
            };
        }
        start += i + 1;
    }
    // An incomplete line: emitted (cut) once it is certainly too long, with room for a `\r`.
    let rest = &data[start..];
    if rest.len() > max_line + 1
        && emit(
            crate::source::tail::record::cut_at_char(rest, max_line),
            base + start as u64,
            true,
        )
    {
        return Split {
            consumed: data.len(),
            skipping: true,
        };
    }
    Split {
        consumed: start,
        skipping: false,
    }
}

/// `multiline:` settings.
#[derive(Debug, Clone)]
pub struct MultilineConfig {
    /// A line matching this starts a new record; other lines continue the current one.
    pub start: regex_lite::Regex,
    pub max_lines: u32,
    pub max_bytes: usize,
    /// A group with no new line for this long is complete.
    pub timeout: Duration,
}

/// Lines of one multiline record being assembled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// The lines joined with `\n`.
    pub text: Vec<u8>,
    /// The first line's offset.
    pub offset: u64,
    pub lines: u32,
    /// Some line in it was cut at `max_line_bytes`.
    pub truncated: bool,
    /// The tail fingerprint at `offset` (see the tailer), kept for the checkpoint.
    pub tail: u64,
    /// When its last line was added.
    pub last: Instant,
}

/// One line as split from a file: its bytes (without the newline, cut at `max_line_bytes`),
/// where it starts, and whether it was cut.
#[derive(Debug, Clone, Copy)]
pub struct Line<'a> {
    pub bytes: &'a [u8],
    pub offset: u64,
    pub truncated: bool,
}

/// Assembles groups: a line matching `start` begins a group; lines that do not are added to the
/// current one (a file that starts with them begins a group with them). A group is complete when the
/// next one begins, when adding a line would pass `max_lines` or `max_bytes` (the line then begins
/// the next group: nothing is dropped), or when nothing was added for `timeout` (the caller asks
/// [`Assembler::deadline`]). The caller takes a completed group out of `pending` (see
/// [`Assembler::completes`]) before it pushes the line that completed it.
#[derive(Debug, Default)]
pub struct Assembler {
    pub pending: Option<Group>,
}

impl Assembler {
    /// Adds one line to the pending group, or begins a group with it when there is none (a group
    /// the line completes was taken by the caller). `tail` is called only when the line begins a
    /// group.
    pub fn push(
        &mut self,
        cfg: &MultilineConfig,
        line: Line<'_>,
        starts: bool,
        now: Instant,
        tail: impl FnOnce() -> u64,
    ) {
        let Line {
            bytes: line,
            offset,
            truncated,
        } = line;
        if let Some(g) = &mut self.pending
            && !starts
            && g.lines < cfg.max_lines
            && g.text.len() + 1 + line.len() <= cfg.max_bytes
        {
            g.text.push(b'\n');
            g.text.extend_from_slice(line);
            g.lines += 1;
            g.truncated |= truncated;
            g.last = now;
            return;
        }
        debug_assert!(
            self.pending.is_none(),
            "the caller takes the group a line completes first"
        );
        let text = crate::source::tail::record::cut_at_char(line, cfg.max_bytes);
        self.pending = Some(Group {
            truncated: truncated || text.len() < line.len(),
            text: text.to_vec(),
            offset,
            lines: 1,
            tail: tail(),
            last: now,
        });
    }

    /// Whether a line (`len` bytes, matching the start pattern or not) completes the pending group
    /// instead of joining it.
    pub fn completes(&self, cfg: &MultilineConfig, len: usize, starts: bool) -> bool {
        self.pending.as_ref().is_some_and(|g| {
            starts || g.lines >= cfg.max_lines || g.text.len() + 1 + len > cfg.max_bytes
        })
    }

    /// When the pending group's timeout passes.
    pub fn deadline(&self, cfg: &MultilineConfig) -> Option<Instant> {
        self.pending.as_ref().map(|g| g.last + cfg.timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines_of(data: &[u8], skipping: bool, max: usize) -> (Vec<(String, u64, bool)>, Split) {
        let mut out = Vec::new();
        let s = split(data, 100, skipping, max, |l, o, t| {
            out.push((String::from_utf8_lossy(l).into_owned(), o, t));
            true
        });
        (out, s)
    }

    #[test]
    fn newlines_are_found_at_every_position() {
        for len in 0..40 {
            for at in 0..len {
                let mut v = vec![b'x'; len];
                v[at] = b'\n';
                assert_eq!(find_newline(&v), Some(at), "len {len} at {at}");
                if at + 1 < len {
                    v[len - 1] = b'\n';
                    assert_eq!(find_newline(&v), Some(at));
                }
            }
            assert_eq!(find_newline(&vec![b'x'; len]), None);
        }
        // Bytes that differ from '\n' by one bit or by a borrow are not newlines.
        let tricky = [0x0b, 0x0a ^ 0x80, 0x09, 0x8a, 0x00, 0x0b, 0x0b, 0x0b, 0x0b];
        assert_eq!(find_newline(&tricky), None);
    }

    #[test]
    fn complete_lines_are_emitted_with_offsets_and_crlf_removed() {
        let (lines, s) = lines_of(b"one\ntwo\r\n\nthree", false, 100);
        assert_eq!(
            lines,
            vec![
                ("one".into(), 100, false),
                ("two".into(), 104, false),
                ("".into(), 109, false)
            ]
        );
        assert_eq!(
            s,
            Split {
                consumed: 10,
                skipping: false
            },
            "the incomplete last line is left for later"
        );
    }

    #[test]
    fn long_lines_are_cut_and_the_rest_skipped_across_buffers() {
        // Complete long line: cut, and the next line is intact.
        let (lines, s) = lines_of(b"abcdefghij\nok\n", false, 4);
        assert_eq!(
            lines,
            vec![("abcd".into(), 100, true), ("ok".into(), 111, false)]
        );
        assert_eq!(s.consumed, 14);
        // An incomplete line already too long: emitted now, the rest skipped.
        let (lines, s) = lines_of(b"ok\nabcdefgh", false, 4);
        assert_eq!(
            lines,
            vec![("ok".into(), 100, false), ("abcd".into(), 103, true)]
        );
        assert_eq!(
            s,
            Split {
                consumed: 11,
                skipping: true
            }
        );
        // The next buffer: still inside the long line.
        let (lines, s) = lines_of(b"ijklmnop", true, 4);
        assert!(lines.is_empty());
        assert_eq!(
            s,
            Split {
                consumed: 8,
                skipping: true
            }
        );
        // Its end, then normal lines.
        let (lines, s) = lines_of(b"qr\nnext\npart", true, 4);
        assert_eq!(lines, vec![("next".into(), 103, false)]);
        assert_eq!(
            s,
            Split {
                consumed: 8,
                skipping: false
            }
        );
        // An incomplete line of exactly the limit (plus a possible \r) waits.
        let (lines, s) = lines_of(b"abcd\r", false, 4);
        assert!(lines.is_empty());
        assert_eq!(s.consumed, 0);
        let (lines, _) = lines_of(b"abcd\r\n", false, 4);
        assert_eq!(lines, vec![("abcd".into(), 100, false)]);
    }

    fn ml(max_lines: u32, max_bytes: usize) -> MultilineConfig {
        MultilineConfig {
            start: regex_lite::Regex::new(r"^\d{4}-").unwrap(),
            max_lines,
            max_bytes,
            timeout: Duration::from_secs(1),
        }
    }

    fn feed(a: &mut Assembler, cfg: &MultilineConfig, lines: &[&str], t: Instant) -> Vec<Group> {
        let mut out = Vec::new();
        let mut off = 0;
        for l in lines {
            let starts = cfg.start.is_match(l);
            if a.completes(cfg, l.len(), starts) {
                out.push(a.pending.take().unwrap());
            }
            let line = Line {
                bytes: l.as_bytes(),
                offset: off,
                truncated: false,
            };
            a.push(cfg, line, starts, t, || off * 10);
            off += l.len() as u64 + 1;
        }
        out
    }

    fn texts(groups: &[Group]) -> Vec<String> {
        groups
            .iter()
            .map(|g| String::from_utf8_lossy(&g.text).into_owned())
            .collect()
    }

    #[test]
    fn a_stack_trace_stays_one_group() {
        let cfg = ml(100, 10_000);
        let t = Instant::now();
        let mut a = Assembler::default();
        let done = feed(
            &mut a,
            &cfg,
            &[
                "2024-01-01 boom",
                "Traceback:",
                "  at x",
                "  at y",
                "2024-01-01 next",
            ],
            t,
        );
        assert_eq!(
            texts(&done),
            vec!["2024-01-01 boom\nTraceback:\n  at x\n  at y"]
        );
        assert_eq!(done[0].lines, 4);
        assert_eq!(done[0].offset, 0);
        assert_eq!(done[0].tail, 0);
        let pending = a.pending.as_ref().unwrap();
        assert_eq!(pending.text, b"2024-01-01 next");
        assert_eq!(pending.offset, 41);
        assert_eq!(pending.tail, 410);
        // It expires a timeout after its last line; a line added moves that on.
        assert_eq!(a.deadline(&cfg), Some(t + Duration::from_secs(1)));
        let later = t + Duration::from_millis(500);
        let line = Line {
            bytes: b"  more",
            offset: 57,
            truncated: false,
        };
        a.push(&cfg, line, false, later, || unreachable!());
        assert_eq!(a.deadline(&cfg), Some(later + Duration::from_secs(1)));
        a.pending = None;
        assert!(a.deadline(&cfg).is_none());
    }

    #[test]
    fn leading_continuations_form_a_group_and_bounds_split_without_loss() {
        let t = Instant::now();
        let mut a = Assembler::default();
        let done = feed(
            &mut a,
            &ml(100, 10_000),
            &["  orphan", "  orphan 2", "2024-x"],
            t,
        );
        assert_eq!(texts(&done), vec!["  orphan\n  orphan 2"]);

        let cfg = ml(3, 10_000);
        let mut a = Assembler::default();
        let done = feed(&mut a, &cfg, &["2024-a", "b", "c", "d", "e", "2024-f"], t);
        assert_eq!(texts(&done), vec!["2024-a\nb\nc", "d\ne"]);

        let cfg = ml(100, 8);
        let mut a = Assembler::default();
        let done = feed(&mut a, &cfg, &["2024-a", "bb", "cc", "2024-z"], t);
        assert_eq!(texts(&done), vec!["2024-a", "bb\ncc"]);
        // A single line longer than max_bytes is cut and marked.
        let mut a = Assembler::default();
        let done = feed(&mut a, &cfg, &["2024-abcdefgh", "2024-x"], t);
        assert_eq!(texts(&done), vec!["2024-abc"]);
        assert!(done[0].truncated);
    }
}
