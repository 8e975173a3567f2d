//! Syslog over TCP cut into messages (RFC 6587): octet counting (`LEN SP MSG`, what rsyslog's
//! `omfwd` sends with `TCP_Framing="octet-counted"` and `logger --octet-count`) and newline
//! framing (`MSG LF`, the older way), chosen per message as rsyslog's `imtcp` does: a message that
//! starts with a digit is octet-counted (a syslog message starts with `<`). A message longer than
//! the limit is cut there (and marked) and the rest of it skipped, so a connection's memory is
//! bounded by the limit whatever it sends. Owns no socket: the TCP listener feeds it what it
//! reads. Pure, so the framing is tested without a network.

/// A frame length prefix longer than this many digits is not syslog (RFC 6587 lengths are
/// decimal, and no message is a gigabyte).
const MAX_LENGTH_DIGITS: usize = 9;

/// The sender broke the framing; the connection is closed (what it sent before is kept).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("bad octet-counting frame: a length prefix of more than {MAX_LENGTH_DIGITS} digits")]
    LengthTooLong,
    #[error("bad octet-counting frame: {0:?} is not a length")]
    BadLength(String),
}

/// What is left over from earlier reads.
#[derive(Debug, Default)]
pub struct Framer {
    buf: Vec<u8>,
    max: usize,
    /// Bytes of an octet-counted message past the limit still to be skipped.
    skip_octets: usize,
    /// A newline-framed message past the limit: skip to its end.
    skip_line: bool,
    /// Bytes of the message being read already searched for its newline (so a long message
    /// that arrives in many reads is searched once, not once per read).
    scanned: usize,
}

impl Framer {
    /// Messages longer than `max` bytes are cut to `max`.
    pub fn new(max: usize) -> Framer {
        Framer {
            max: max.max(1),
            ..Framer::default()
        }
    }

    /// Takes `data` (what one read returned) and calls `on_message(message, cut)` for each message
    /// it completes. An error ends the connection; the messages before it were given.
    pub fn feed(
        &mut self,
        data: &[u8],
        mut on_message: impl FnMut(&[u8], bool),
    ) -> Result<(), FrameError> {
        self.buf.extend_from_slice(data);
        let mut pos = 0;
        let result = loop {
            match self.next(pos) {
                Ok(Step::Message {
                    start,
                    end,
                    cut,
                    next,
                }) => {
                    on_message(&self.buf[start..end], cut);
                    pos = next;
                }
                Ok(Step::Skip(next)) => pos = next,
                Ok(Step::More) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        self.buf.drain(..pos);
        result
    }

    /// The connection was cut: what is left is not a message. Whether there was a part of one.
    pub fn discard(&mut self) -> bool {
        let partial = !self.buf.is_empty() && !self.skip_line && self.skip_octets == 0;
        self.buf.clear();
        partial
    }

    /// The connection ended: a last newline-framed message without its newline is still a
    /// message. Returns whether an octet-counted message was cut short by the end (lost).
    pub fn finish(&mut self, mut on_message: impl FnMut(&[u8], bool)) -> bool {
        let rest = std::mem::take(&mut self.buf);
        if rest.is_empty() || self.skip_line || self.skip_octets > 0 {
            return false;
        }
        if rest[0].is_ascii_digit() {
            return true;
        }
        let end = trim_end(&rest, rest.len());
        if end > 0 {
            on_message(&rest[..end.min(self.max)], end > self.max);
        }
        false
    }

    fn next(&mut self, pos: usize) -> Result<Step, FrameError> {
        let avail = &self.buf[pos..];
        if avail.is_empty() {
            return Ok(Step::More);
        }
        if self.skip_octets > 0 {
            let n = self.skip_octets.min(avail.len());
            self.skip_octets -= n;
            return Ok(Step::Skip(pos + n));
        }
        if self.skip_line {
            return Ok(match memchr::memchr(b'\n', avail) {
                Some(i) => {
                    self.skip_line = false;
                    Step::Skip(pos + i + 1)
                }
                None => Step::Skip(pos + avail.len()),
            });
        }
        if avail[0].is_ascii_digit() {
            self.octet_counted(pos)
        } else {
            Ok(self.newline_framed(pos))
        }
    }

    fn octet_counted(&mut self, pos: usize) -> Result<Step, FrameError> {
        let avail = &self.buf[pos..];
        let Some(sp) = avail
            .iter()
            .take(MAX_LENGTH_DIGITS + 1)
            .position(|&b| b == b' ')
        else {
            return if avail.len() > MAX_LENGTH_DIGITS {
                Err(FrameError::LengthTooLong)
            } else {
                Ok(Step::More)
            };
        };
        let digits = &avail[..sp];
        let len: usize = std::str::from_utf8(digits)
            .ok()
            .filter(|d| d.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|d| d.parse().ok())
            .ok_or_else(|| FrameError::BadLength(String::from_utf8_lossy(digits).into_owned()))?;
        let start = pos + sp + 1;
        let have = self.buf.len() - start;
        if len <= self.max {
            if have < len {
                return Ok(Step::More);
            }
            let end = trim_end(&self.buf, start + len).max(start);
            if end == start {
                // `0 ` or a frame of line ends only: nothing to keep.
                return Ok(Step::Skip(start + len));
            }
            return Ok(Step::Message {
                start,
                end,
                cut: false,
                next: start + len,
            });
        }
        if have < self.max {
            return Ok(Step::More);
        }
        self.skip_octets = len - self.max;
        Ok(Step::Message {
            start,
            end: start + self.max,
            cut: true,
            next: start + self.max,
        })
    }

    fn newline_framed(&mut self, pos: usize) -> Step {
        let avail = &self.buf[pos..];
        let window = avail.len().min(self.max + 2);
        let from = self.scanned.min(window);
        let found = memchr::memchr(b'\n', &avail[from..window]).map(|i| from + i);
        match found {
            Some(i) => {
                self.scanned = 0;
                let end = trim_end(&self.buf, pos + i).max(pos);
                if end == pos {
                    // An empty line (or a lone CR): nothing to keep.
                    return Step::Skip(pos + i + 1);
                }
                let cut = end - pos > self.max;
                Step::Message {
                    start: pos,
                    end: if cut { pos + self.max } else { end },
                    cut,
                    next: pos + i + 1,
                }
            }
            None if avail.len() > self.max + 1 => {
                self.scanned = 0;
                self.skip_line = true;
                Step::Message {
                    start: pos,
                    end: pos + self.max,
                    cut: true,
                    next: pos + self.max,
                }
            }
            None => {
                self.scanned = window;
                Step::More
            }
        }
    }
}

enum Step {
    Message {
        start: usize,
        end: usize,
        cut: bool,
        next: usize,
    },
    Skip(usize),
    More,
}

/// `end` moved back over trailing `\r`, `\n` and NUL bytes (senders end messages with any).
fn trim_end(buf: &[u8], mut end: usize) -> usize {
    while end > 0 && matches!(buf[end - 1], b'\r' | b'\n' | 0) {
        end -= 1;
    }
    end
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(max: usize, reads: &[&[u8]]) -> (Vec<(String, bool)>, Result<(), FrameError>) {
        let mut f = Framer::new(max);
        let mut out = Vec::new();
        for r in reads {
            let res = f.feed(r, |m, cut| {
                out.push((String::from_utf8_lossy(m).into_owned(), cut));
            });
            if res.is_err() {
                return (out, res);
            }
        }
        f.finish(|m, cut| out.push((String::from_utf8_lossy(m).into_owned(), cut)));
        (out, Ok(()))
    }

    fn m(s: &str) -> (String, bool) {
        (s.to_string(), false)
    }

    #[test]
    fn newline_framing_across_reads_with_crlf_and_empty_lines() {
        let (out, r) = frames(100, &[b"<13>one\r\n\n<13>tw", b"o\n<13>three"]);
        assert_eq!(r, Ok(()));
        assert_eq!(out, [m("<13>one"), m("<13>two"), m("<13>three")]);
    }

    #[test]
    fn octet_counting_across_reads_and_mixed_with_newlines() {
        // rsyslog sends octet-counted frames back to back; the length counts the message only.
        let (out, r) = frames(
            100,
            &[b"7 <13>one8 <13>two\n", b"<13>three\n1", b"0 <13>four\n\n"],
        );
        assert_eq!(r, Ok(()));
        assert_eq!(
            out,
            [m("<13>one"), m("<13>two"), m("<13>three"), m("<13>four")]
        );
    }

    #[test]
    fn a_long_message_is_cut_and_the_rest_skipped_in_both_framings() {
        let (out, _) = frames(5, &[b"<13>abcdefgh\n<13>x\n"]);
        assert_eq!(out, [("<13>a".into(), true), m("<13>x")]);
        let (out, _) = frames(5, &[b"<13>abc", b"defgh", b"ijk\n<13>y\n"]);
        assert_eq!(out, [("<13>a".into(), true), m("<13>y")]);
        let (out, _) = frames(5, &[b"12 <13>abcd", b"efgh5 <13>z"]);
        assert_eq!(out, [("<13>a".into(), true), m("<13>z")]);
        // Exactly the limit is not cut.
        let (out, _) = frames(5, &[b"<13>a\n5 <13>b"]);
        assert_eq!(out, [m("<13>a"), m("<13>b")]);
    }

    #[test]
    fn a_bad_length_prefix_ends_the_connection_after_what_came_before() {
        let (out, r) = frames(100, &[b"5 <13>a1234567890 x"]);
        assert_eq!(out, [m("<13>a")]);
        assert_eq!(r, Err(FrameError::LengthTooLong));
        let (out, r) = frames(100, &[b"<13>a\n12x4 <13>b"]);
        assert_eq!(out, [m("<13>a")]);
        assert_eq!(r, Err(FrameError::BadLength("12x4".into())));
    }

    #[test]
    fn the_end_of_the_connection_keeps_a_last_line_and_reports_a_cut_frame() {
        let mut f = Framer::new(100);
        f.feed(b"9 <13>a", |_, _| panic!("incomplete")).unwrap();
        assert!(
            f.finish(|_, _| panic!("incomplete")),
            "a cut frame is reported"
        );
        let mut f = Framer::new(100);
        let mut got = Vec::new();
        f.feed(b"<13>last", |_, _| panic!("no newline yet"))
            .unwrap();
        assert!(!f.finish(|m, _| got.push(m.to_vec())));
        assert_eq!(got, [b"<13>last".to_vec()]);
    }

    #[test]
    fn a_long_line_in_many_reads_is_searched_once() {
        let mut f = Framer::new(1 << 20);
        let mut got = Vec::new();
        for _ in 0..100 {
            f.feed(&[b'x'; 1000], |_, _| panic!("no newline yet"))
                .unwrap();
            assert_eq!(f.scanned, f.buf.len(), "searched up to what is there");
        }
        f.feed(b"\n<13>next\n", |m, _| got.push(m.len())).unwrap();
        assert_eq!(got, [100_000, 8]);
        assert_eq!(f.scanned, 0);
    }

    #[test]
    fn memory_stays_bounded_by_the_limit_without_a_newline() {
        let mut f = Framer::new(1000);
        let chunk = vec![b'x'; 4096];
        let mut n = 0;
        for _ in 0..100 {
            f.feed(&chunk, |_, cut| {
                assert!(cut);
                n += 1;
            })
            .unwrap();
            assert!(f.buf.len() <= 4096 + 1002, "buffer grew to {}", f.buf.len());
        }
        assert_eq!(n, 1, "one cut message, the rest skipped");
    }
}
