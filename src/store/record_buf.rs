//! [`RecordBuf`]: records on their way into the store, kept in one buffer the way a stored job
//! frames them (each record followed by `\n`), so a producer builds records in place without an
//! allocation each, and the store cuts jobs out of it as slices. A record that holds a `\n` of its
//! own is allowed (the jobs it lands in are framed by lengths instead). Built by producers (tail
//! sources, ingest, scrapes, `queue push`); read by the store's append.

/// Records, each followed by `\n`, with where each one ends.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecordBuf {
    bytes: Vec<u8>,
    /// The index of each record's terminating `\n` in `bytes`.
    ends: Vec<usize>,
    /// `\n` bytes inside records (not their terminators).
    embedded_newlines: usize,
}

impl RecordBuf {
    pub fn new() -> RecordBuf {
        RecordBuf::default()
    }

    /// Room for `records` records of `bytes` bytes in all.
    pub fn with_capacity(records: usize, bytes: usize) -> RecordBuf {
        RecordBuf {
            bytes: Vec::with_capacity(bytes + records),
            ends: Vec::with_capacity(records),
            embedded_newlines: 0,
        }
    }

    /// Appends a copy of `record`.
    pub fn push(&mut self, record: &[u8]) {
        let mut w = self.record();
        w.buf().extend_from_slice(record);
        w.finish();
    }

    /// Starts a record written in place: extend [`RecordWriter::buf`], then
    /// [`finish`](RecordWriter::finish) it; a writer dropped unfinished leaves nothing behind.
    pub fn record(&mut self) -> RecordWriter<'_> {
        let start = self.bytes.len();
        RecordWriter { buf: self, start }
    }

    /// Records held.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Bytes of the records, without their separators.
    pub fn record_bytes(&self) -> usize {
        self.bytes.len() - self.ends.len()
    }

    /// Record `i`.
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        let end = *self.ends.get(i)?;
        Some(&self.bytes[self.start_of(i)..end])
    }

    fn start_of(&self, i: usize) -> usize {
        if i == 0 { 0 } else { self.ends[i - 1] + 1 }
    }

    /// Length of record `i` (`i` < `len`).
    pub fn record_len(&self, i: usize) -> usize {
        self.ends[i] - self.start_of(i)
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = &[u8]> + '_ {
        (0..self.len()).map(|i| {
            let end = self.ends[i];
            &self.bytes[self.start_of(i)..end]
        })
    }

    /// Records `range`, each followed by `\n`, as one slice: a job's area framed by lines. `None`
    /// when one of them holds a `\n` (that area must be framed by lengths).
    pub fn lines(&self, range: std::ops::Range<usize>) -> Option<&[u8]> {
        if range.is_empty() {
            return Some(&[]);
        }
        if self.embedded_newlines > 0 {
            let inside = &self.bytes[self.start_of(range.start)..self.ends[range.end - 1]];
            if memchr::memchr_iter(b'\n', inside).count() != range.len() - 1 {
                return None;
            }
        }
        Some(&self.bytes[self.start_of(range.start)..=self.ends[range.end - 1]])
    }

    /// Appends copies of `other`'s records (a producer that gathers records from several
    /// readers into one append).
    pub fn extend_from(&mut self, other: &RecordBuf) {
        let offset = self.bytes.len();
        self.bytes.extend_from_slice(&other.bytes);
        self.ends.extend(other.ends.iter().map(|e| e + offset));
        self.embedded_newlines += other.embedded_newlines;
    }

    /// Drops every record from `n` on.
    pub fn truncate(&mut self, n: usize) {
        if n >= self.len() {
            return;
        }
        let cut = self.start_of(n);
        let newlines = memchr::memchr_iter(b'\n', &self.bytes[cut..]).count();
        self.embedded_newlines -= newlines - (self.len() - n);
        self.bytes.truncate(cut);
        self.ends.truncate(n);
    }

    pub fn clear(&mut self) {
        self.truncate(0);
    }
}

/// A record being written into a [`RecordBuf`].
pub struct RecordWriter<'a> {
    buf: &'a mut RecordBuf,
    start: usize,
}

impl RecordWriter<'_> {
    /// The buffer to extend with the record's bytes (only past what it held when the record
    /// began: earlier records must not be changed).
    pub fn buf(&mut self) -> &mut Vec<u8> {
        &mut self.buf.bytes
    }

    /// Bytes written into this record so far.
    pub fn len(&self) -> usize {
        self.buf.bytes.len() - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The record is complete.
    pub fn finish(self) {
        let b = &mut *self.buf;
        b.embedded_newlines += memchr::memchr_iter(b'\n', &b.bytes[self.start..]).count();
        self.end();
    }

    /// The record is complete, and its producer guarantees that it holds no `\n` (JSON it
    /// escaped itself): no scan for one (checked in debug builds).
    pub fn finish_line(self) {
        debug_assert!(
            memchr::memchr(b'\n', &self.buf.bytes[self.start..]).is_none(),
            "a record promised to be one line holds a newline"
        );
        self.end();
    }

    fn end(self) {
        let b = &mut *self.buf;
        b.ends.push(b.bytes.len());
        b.bytes.push(b'\n');
        std::mem::forget(self);
    }
}

impl Drop for RecordWriter<'_> {
    /// An unfinished record is abandoned.
    fn drop(&mut self) {
        self.buf.bytes.truncate(self.start);
    }
}

impl<R: AsRef<[u8]>> FromIterator<R> for RecordBuf {
    fn from_iter<I: IntoIterator<Item = R>>(iter: I) -> Self {
        let mut buf = RecordBuf::new();
        for r in iter {
            buf.push(r.as_ref());
        }
        buf
    }
}

impl<R: AsRef<[u8]>> From<Vec<R>> for RecordBuf {
    fn from(records: Vec<R>) -> Self {
        RecordBuf::from(records.as_slice())
    }
}

impl<R: AsRef<[u8]>> From<&[R]> for RecordBuf {
    fn from(records: &[R]) -> Self {
        let bytes = records.iter().map(|r| r.as_ref().len()).sum();
        let mut buf = RecordBuf::with_capacity(records.len(), bytes);
        for r in records {
            buf.push(r.as_ref());
        }
        buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extend_from_keeps_both_records_and_their_framing() {
        let mut a = RecordBuf::from(vec![&b"one"[..], b"t\nwo"]);
        let b = RecordBuf::from(vec![&b"three"[..], b"fo\nur"]);
        a.extend_from(&b);
        let all: Vec<&[u8]> = a.iter().collect();
        assert_eq!(all, [&b"one"[..], b"t\nwo", b"three", b"fo\nur"]);
        assert_eq!(a.lines(2..3), Some(&b"three\n"[..]));
        assert_eq!(a.lines(0..4), None, "embedded newlines carried over");
        a.truncate(1);
        assert_eq!(a.lines(0..1), Some(&b"one\n"[..]));
    }

    #[test]
    fn records_in_place_and_as_lines() {
        let mut b = RecordBuf::new();
        b.push(b"one");
        {
            let mut w = b.record();
            w.buf().extend_from_slice(b"tw");
            w.buf().push(b'o');
            assert_eq!(w.len(), 3);
            w.finish();
        }
        {
            let mut w = b.record();
            w.buf().extend_from_slice(b"abandoned");
        }
        b.push(b"");
        assert_eq!(b.len(), 3);
        assert_eq!(b.record_bytes(), 6);
        assert_eq!(
            b.iter().collect::<Vec<_>>(),
            [b"one".as_slice(), b"two", b""]
        );
        assert_eq!(b.get(1), Some(b"two".as_slice()));
        assert_eq!(b.get(3), None);
        assert_eq!(b.record_len(0), 3);
        assert_eq!(b.lines(0..3), Some(b"one\ntwo\n\n".as_slice()));
        assert_eq!(b.lines(1..2), Some(b"two\n".as_slice()));
        assert_eq!(b.lines(2..2), Some(b"".as_slice()));
        b.truncate(1);
        assert_eq!(b.iter().collect::<Vec<_>>(), [b"one".as_slice()]);
    }

    #[test]
    fn a_record_with_a_newline_keeps_its_jobs_off_lines() {
        let mut b: RecordBuf = [b"a".as_slice(), b"b\nc", b"d"].into_iter().collect();
        assert_eq!(b.get(1), Some(b"b\nc".as_slice()));
        assert_eq!(b.lines(0..1), Some(b"a\n".as_slice()));
        assert_eq!(b.lines(0..2), None);
        assert_eq!(b.lines(1..3), None);
        assert_eq!(b.lines(2..3), Some(b"d\n".as_slice()));
        b.truncate(1);
        b.push(b"e");
        assert_eq!(b.lines(0..2), Some(b"a\ne\n".as_slice()));
        assert_eq!(b.embedded_newlines, 0);
    }
}
