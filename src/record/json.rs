//! The JSON work on the sources' hot path: escaping a line into a JSON string (eight bytes at a
//! time, runs of plain bytes copied whole) and the check that a line is one JSON object
//! (a tail source's `format: json`, whose objects become records as they are). Used by the tail and
//! mqtt sources; pure, nothing here allocates.
//!
//! The check is strict where receivers are: a line it accepts is read by any JSON parser, so a
//! passed-through object can never be the record that makes a receiver refuse (or silently drop)
//! a whole request. Beyond RFC 8259's grammar it refuses what common parsers refuse: an unpaired
//! UTF-16 surrogate escape (`"\ud800"`), a number past the range of a double (`1e400`), nesting
//! deeper than [`MAX_DEPTH`]. A refused line is not lost: the caller wraps it as text.

/// Deepest nesting of objects and arrays accepted (serde_json refuses past 128).
pub const MAX_DEPTH: u32 = 64;

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGH: u64 = 0x8080_8080_8080_8080;

/// The high bit of the lowest byte of `x` below `n` (at most 0x80), and possibly of bytes above
/// it (a borrow runs up from a flagged byte), never of bytes below it: zero exactly when no byte
/// is below `n`, and the lowest bit set is exact. That is all the callers use.
#[inline(always)]
fn below(x: u64, n: u8) -> u64 {
    x.wrapping_sub(ONES * u64::from(n)) & !x & HIGH
}

/// Whether a byte cannot stand as it is inside a JSON string: `"`, `\` and the control bytes.
#[inline(always)]
fn special(b: u8) -> bool {
    b < 0x20 || b == b'"' || b == b'\\'
}

/// The position of the first byte of `bytes` that cannot stand inside a JSON string as it is,
/// eight bytes at a time.
#[inline]
pub fn find_special(bytes: &[u8]) -> Option<usize> {
    let mut chunks = bytes.chunks_exact(8);
    let mut at = 0;
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let hits = specials(u64::from_le_bytes(word));
        if hits != 0 {
            // The lowest flagged byte is the first in the slice (little-endian load).
            return Some(at + (hits.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&b| special(b))
        .map(|p| at + p)
}

/// In the little-endian word `x`, the high bit of the first byte that cannot stand inside a
/// JSON string as it is (see [`special`]), and maybe of later ones: zero when there is none.
#[inline(always)]
fn specials(x: u64) -> u64 {
    below(x, 0x20)
        | below(x ^ (ONES * u64::from(b'"')), 1)
        | below(x ^ (ONES * u64::from(b'\\')), 1)
}

/// Appends `s` as the inside of a JSON string (no quotes), escaped as serde_json escapes: `\"`,
/// `\\`, `\n`, `\r`, `\t`, `\b`, `\f`, other control bytes as `\u00XX`; everything else as it is.
///
/// Eight bytes at a time, through a buffer on the stack: each step stores the next eight bytes
/// whole and keeps those before the first byte to escape (all eight when there is none), then
/// writes that byte's escape. The output reaches `out` in a few large copies: a copy per run
/// between quotes (a `memcpy` call each, in a build for size) made escaping the costliest part
/// of a JSON line's record.
pub fn escape_into(out: &mut Vec<u8>, s: &str) {
    const BUF: usize = 256;
    let bytes = s.as_bytes();
    let mut buf = [0u8; BUF];
    // Bytes of `buf` in use; at most BUF - 16 at the top of each step, so a step's writes fit
    // (eight bytes; or up to seven kept and an escape of six).
    let mut n = 0;
    let mut i = 0;
    while i + 8 <= bytes.len() {
        if n > BUF - 16 {
            out.extend_from_slice(&buf[..n]);
            n = 0;
        }
        let mut word = [0u8; 8];
        word.copy_from_slice(&bytes[i..i + 8]);
        buf[n..n + 8].copy_from_slice(&word);
        let hits = specials(u64::from_le_bytes(word));
        if hits == 0 {
            i += 8;
            n += 8;
            continue;
        }
        let k = (hits.trailing_zeros() / 8) as usize;
        n += k;
        n += escape_at(&mut buf[n..], word[k]);
        i += k + 1;
    }
    for &b in &bytes[i..] {
        if n > BUF - 8 {
            out.extend_from_slice(&buf[..n]);
            n = 0;
        }
        if special(b) {
            n += escape_at(&mut buf[n..], b);
        } else {
            buf[n] = b;
            n += 1;
        }
    }
    out.extend_from_slice(&buf[..n]);
}

/// Writes the escape of `b` (a byte [`special`] says needs one) at the start of `dst` (at least
/// six bytes long); returns its length.
#[inline(always)]
fn escape_at(dst: &mut [u8], b: u8) -> usize {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let short = match b {
        b'"' => b'"',
        b'\\' => b'\\',
        b'\n' => b'n',
        b'\r' => b'r',
        b'\t' => b't',
        0x08 => b'b',
        0x0c => b'f',
        _ => 0,
    };
    if short != 0 {
        dst[..2].copy_from_slice(&[b'\\', short]);
        2
    } else {
        dst[..6].copy_from_slice(&[
            b'\\',
            b'u',
            b'0',
            b'0',
            HEX[usize::from(b >> 4)],
            HEX[usize::from(b & 15)],
        ]);
        6
    }
}

/// A line that is one JSON object: where the object is in it (the line without the whitespace
/// around it) and whether it has no member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Object {
    pub start: usize,
    pub end: usize,
    pub empty: bool,
}

/// Whether `text` is exactly one JSON object (with whitespace around it allowed), checked
/// strictly (see the module docs). `key` is called with each top-level member's name as it is
/// written (escapes not decoded: the caller decodes the rare name that has a `\`).
pub fn object(text: &str, mut key: impl FnMut(&[u8])) -> Option<Object> {
    let mut w = Walk {
        p: Parser {
            s: text.as_bytes(),
            i: 0,
        },
        stack: 0,
        depth: 0,
        empty: true,
    };
    w.p.ws();
    let start = w.p.i;
    if w.p.peek()? != b'{' {
        return None;
    }
    let mut state = State::Value;
    loop {
        state = match state {
            State::Value => w.value()?,
            State::Key => w.key(&mut key)?,
            State::After if w.depth == 0 => return w.end(start),
            State::After => w.after()?,
        };
    }
}

/// [`object`]'s walk through the text: where it is and the containers open around it. A method
/// per [`State`], each returning the next (`None`: not one JSON object); each has one call site,
/// in `object`'s loop, and is inlined there as the loop's arms were.
struct Walk<'a> {
    p: Parser<'a>,
    /// One bit per open container, innermost lowest: 1 an object, 0 an array.
    stack: u64,
    depth: u32,
    /// Whether the top-level object has no member (so far).
    empty: bool,
}

impl Walk<'_> {
    /// A value: a scalar read whole, or a container opened (an empty one read whole).
    #[inline(always)]
    fn value(&mut self) -> Option<State> {
        let p = &mut self.p;
        p.ws();
        Some(match p.peek()? {
            open @ (b'{' | b'[') => {
                p.i += 1;
                if self.depth >= MAX_DEPTH {
                    return None;
                }
                let is_object = open == b'{';
                p.ws();
                if p.peek()? == if is_object { b'}' } else { b']' } {
                    p.i += 1;
                    State::After
                } else {
                    self.depth += 1;
                    self.stack = (self.stack << 1) | u64::from(is_object);
                    if is_object {
                        self.empty &= self.depth != 1;
                        State::Key
                    } else {
                        // An array's first element is a value: the state stays.
                        State::Value
                    }
                }
            }
            b'"' => {
                p.i += 1;
                p.string()?;
                State::After
            }
            b't' => {
                p.word(b"true")?;
                State::After
            }
            b'f' => {
                p.word(b"false")?;
                State::After
            }
            b'n' => {
                p.word(b"null")?;
                State::After
            }
            b'-' | b'0'..=b'9' => {
                p.number()?;
                State::After
            }
            _ => return None,
        })
    }

    /// A member's name and its colon; `key` is told the top-level ones.
    #[inline(always)]
    fn key(&mut self, key: &mut impl FnMut(&[u8])) -> Option<State> {
        let p = &mut self.p;
        p.ws();
        if p.peek()? != b'"' {
            return None;
        }
        p.i += 1;
        let from = p.i;
        p.string()?;
        if self.depth == 1 {
            key(&p.s[from..p.i - 1]);
        }
        p.ws();
        if p.peek()? != b':' {
            return None;
        }
        p.i += 1;
        Some(State::Value)
    }

    /// After a value inside a container: a comma (its next member or element) or its closing
    /// bracket.
    #[inline(always)]
    fn after(&mut self) -> Option<State> {
        let p = &mut self.p;
        p.ws();
        let in_object = self.stack & 1 == 1;
        match (p.peek()?, in_object) {
            (b',', true) => {
                p.i += 1;
                Some(State::Key)
            }
            (b',', false) => {
                p.i += 1;
                Some(State::Value)
            }
            (b'}', true) | (b']', false) => {
                p.i += 1;
                self.depth -= 1;
                self.stack >>= 1;
                Some(State::After)
            }
            _ => None,
        }
    }

    /// The top-level object (from `start`) has closed: only whitespace may follow it.
    #[inline(always)]
    fn end(mut self, start: usize) -> Option<Object> {
        let end = self.p.i;
        self.p.ws();
        (self.p.i == self.p.s.len()).then_some(Object {
            start,
            end,
            empty: self.empty,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// A value is next.
    Value,
    /// A member's name is next (after `{` or `,` in an object).
    Key,
    /// A value ended: `,`, a closing bracket, or (at depth 0) the end of the text.
    After,
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    #[inline]
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    #[inline]
    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.s.get(self.i) {
            self.i += 1;
        }
    }

    fn word(&mut self, w: &[u8]) -> Option<()> {
        if self.s.get(self.i..self.i + w.len())? == w {
            self.i += w.len();
            Some(())
        } else {
            None
        }
    }

    /// The rest of a string whose opening quote was read; leaves `i` past its closing quote. The
    /// text is UTF-8 already (a `&str`), so only escapes and control bytes need a look.
    fn string(&mut self) -> Option<()> {
        loop {
            let at = self.i + find_special(&self.s[self.i..])?;
            match self.s[at] {
                b'"' => {
                    self.i = at + 1;
                    return Some(());
                }
                b'\\' => {
                    self.i = at + 1;
                    self.escape()?;
                }
                _ => return None, // a raw control byte
            }
        }
    }

    /// One escape, its `\` read.
    fn escape(&mut self) -> Option<()> {
        let b = self.peek()?;
        self.i += 1;
        match b {
            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Some(()),
            b'u' => {
                let unit = self.hex4()?;
                match unit {
                    // A high surrogate must be followed by a low one.
                    0xd800..=0xdbff => {
                        self.word(b"\\u")?;
                        matches!(self.hex4()?, 0xdc00..=0xdfff).then_some(())
                    }
                    0xdc00..=0xdfff => None,
                    _ => Some(()),
                }
            }
            _ => None,
        }
    }

    fn hex4(&mut self) -> Option<u16> {
        let digits = self.s.get(self.i..self.i + 4)?;
        let mut v = 0u16;
        for &d in digits {
            let n = match d {
                b'0'..=b'9' => d - b'0',
                b'a'..=b'f' => d - b'a' + 10,
                b'A'..=b'F' => d - b'A' + 10,
                _ => return None,
            };
            v = (v << 4) | u16::from(n);
        }
        self.i += 4;
        Some(v)
    }

    fn digits(&mut self) -> usize {
        let from = self.i;
        while let Some(b'0'..=b'9') = self.s.get(self.i) {
            self.i += 1;
        }
        self.i - from
    }

    /// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`, within a double's range: its
    /// magnitude is below `10^(integer digits + exponent)`, refused past `10^308`.
    fn number(&mut self) -> Option<()> {
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        let int_digits = match self.peek()? {
            b'0' => {
                self.i += 1;
                0
            }
            b'1'..=b'9' => self.digits(),
            _ => return None,
        };
        if self.peek() == Some(b'.') {
            self.i += 1;
            if self.digits() == 0 {
                return None;
            }
        }
        let mut exp: i64 = 0;
        if let Some(b'e' | b'E') = self.peek() {
            self.i += 1;
            let negative = match self.peek() {
                Some(b'-') => {
                    self.i += 1;
                    true
                }
                Some(b'+') => {
                    self.i += 1;
                    false
                }
                _ => false,
            };
            let from = self.i;
            if self.digits() == 0 {
                return None;
            }
            for &d in &self.s[from..self.i] {
                exp = (exp * 10 + i64::from(d - b'0')).min(1 << 32);
            }
            if negative {
                exp = -exp;
            }
        }
        (int_digits as i64 + exp <= 308).then_some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serde_escaped(s: &str) -> Vec<u8> {
        let quoted = serde_json::to_vec(s).unwrap();
        quoted[1..quoted.len() - 1].to_vec()
    }

    fn escaped(s: &str) -> Vec<u8> {
        let mut out = Vec::new();
        escape_into(&mut out, s);
        out
    }

    /// A small deterministic generator (xorshift), so a failure names its seed.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    #[test]
    fn the_word_scan_finds_the_first_special_byte_wherever_it_is() {
        for b in 0..=255u8 {
            for at in 0..8 {
                for filler in [b'a', b' ', 0x21, 0x7f, 0x80, 0xc3, 0xff] {
                    for later in [None, Some(0u8), Some(b'"'), Some(0x1f)] {
                        let mut word = [filler; 8];
                        word[at] = b;
                        if let Some(l) = later
                            && at < 7
                        {
                            word[7] = l;
                        }
                        let want = word.iter().position(|&c| special(c));
                        let hits = specials(u64::from_le_bytes(word));
                        let got = (hits != 0).then(|| (hits.trailing_zeros() / 8) as usize);
                        assert_eq!(got, want, "{word:02x?}");
                        assert_eq!(find_special(&word), want, "{word:02x?}");
                    }
                }
            }
        }
    }

    #[test]
    fn escaping_is_serde_jsons_for_every_byte_and_character() {
        let all_ascii: String = (0u8..0x80).map(char::from).collect();
        assert_eq!(escaped(&all_ascii), serde_escaped(&all_ascii));
        // Each special byte at every position of a word, before and after plain runs.
        for b in (0u8..0x20).chain([b'"', b'\\', 0x7f]) {
            for pad in 0..17 {
                let s = format!("{}{}{}", "a".repeat(pad), char::from(b), "é".repeat(pad));
                assert_eq!(escaped(&s), serde_escaped(&s), "byte {b:#x} after {pad}");
            }
        }
        // Long runs of what grows most (six bytes a byte) and of plain bytes, at every length
        // around the stack buffer's flushes.
        for len in 0..600 {
            for s in [
                "\u{1}".repeat(len),
                format!("{}\u{1f}", "a".repeat(len)),
                format!("{}\"", "\u{1}a".repeat(len / 2)),
            ] {
                assert_eq!(escaped(&s), serde_escaped(&s), "{len}");
            }
        }
        for s in [
            "",
            "plain",
            "\"",
            "\\\\\"\"",
            "aé€😀\u{2028}\u{fffd}",
            "{\"ts\":\"2026\",\"msg\":\"xxxxxxxxxxxxxxxx\"}",
        ] {
            assert_eq!(escaped(s), serde_escaped(s), "{s:?}");
        }
    }

    #[test]
    fn escaping_random_strings_matches_serde_json_and_reads_back() {
        let alphabet: Vec<char> = "ab \"\\/\n\r\t\u{0}\u{1}\u{8}\u{c}\u{1f}\u{7f}é€😀\u{2028}"
            .chars()
            .collect();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for seed in 0..5000 {
            // Now and then a long one: the stack buffer is flushed several times.
            let len = if seed % 50 == 0 {
                rng.below(3000)
            } else {
                rng.below(70)
            };
            let s: String = (0..len)
                .map(|_| alphabet[rng.below(alphabet.len())])
                .collect();
            let e = escaped(&s);
            assert_eq!(e, serde_escaped(&s), "case {seed}: {s:?}");
            let mut quoted = vec![b'"'];
            quoted.extend_from_slice(&e);
            quoted.push(b'"');
            let back: String = serde_json::from_slice(&quoted).unwrap();
            assert_eq!(back, s, "case {seed}");
        }
    }

    fn accepted(s: &str) -> bool {
        object(s, |_| {}).is_some()
    }

    #[test]
    fn objects_are_recognised_strictly() {
        for ok in [
            "{}",
            " { } ",
            "\t{\"a\":1}\r",
            r#"{"a":[1,-2.5e-3,0,true,false,null,"x",{"b":[]},[[]]],"c":{"d":{}}}"#,
            r#"{"s":"\"\\\/\b\f\n\r\t\u00e9\uD83D\uDE00"}"#,
            r#"{"n":-0.0E+10,"m":1e307,"l":9.99e307,"k":123456789012345678901234567890}"#,
            "{\"é\":\"😀\"}",
            r#"{"a":1,"a":2}"#,
            "{\n\"a\" : 1 ,\n \"b\":[ 1 , 2 ]\n}",
        ] {
            assert!(accepted(ok), "{ok:?}");
            assert!(
                serde_json::from_str::<serde_json::Value>(ok).is_ok(),
                "serde_json agrees: {ok:?}"
            );
        }
        for bad in [
            "",
            "   ",
            "[]",
            "1",
            "\"x\"",
            "null",
            "{",
            "}",
            "{}{}",
            "{} x",
            "{\"a\"}",
            "{\"a\":}",
            "{\"a\":1,}",
            "{,}",
            "{\"a\":[1,]}",
            "{\"a\":[,1]}",
            "{\"a\" 1}",
            "{a:1}",
            "{'a':1}",
            "{\"a\":01}",
            "{\"a\":1.}",
            "{\"a\":.5}",
            "{\"a\":1e}",
            "{\"a\":+1}",
            "{\"a\":-}",
            "{\"a\":NaN}",
            "{\"a\":tru}",
            "{\"a\":True}",
            "{\"a\":\"\u{1}\"}",
            "{\"a\":\"\t\"}",
            "{\"a\":\"\\x\"}",
            "{\"a\":\"\\u12\"}",
            "{\"a\":\"\\u12g4\"}",
            "{\"a\":\"open}",
            "{\"a\":[}",
            "{\"a\":{]}",
            r#"{"a":"\ud800"}"#,
            r#"{"a":"\udc00"}"#,
            r#"{"a":"\ud800\u0041"}"#,
            r#"{"a":1e309}"#,
            r#"{"a":12345e306}"#,
            "{\"a\":1}\u{0}",
            "\u{feff}{}",
        ] {
            assert!(!accepted(bad), "{bad:?}");
        }
        let deep_ok = format!(
            "{{\"a\":{}{}}}",
            "[".repeat(MAX_DEPTH as usize - 1),
            "]".repeat(MAX_DEPTH as usize - 1)
        );
        assert!(accepted(&deep_ok));
        let too_deep = format!(
            "{{\"a\":{}{}}}",
            "[".repeat(MAX_DEPTH as usize),
            "]".repeat(MAX_DEPTH as usize)
        );
        assert!(!accepted(&too_deep));
    }

    #[test]
    fn the_object_span_emptiness_and_top_level_keys_are_reported() {
        let mut keys = Vec::new();
        let o = object(r#"  {"host":{"path":1},"of\"f":[{"x":2}],"":0}  "#, |k| {
            keys.push(String::from_utf8(k.to_vec()).unwrap())
        })
        .unwrap();
        assert_eq!((o.start, o.end, o.empty), (2, 44, false));
        assert_eq!(keys, ["host", "of\\\"f", ""]);
        let o = object("{ }", |_| panic!("no member")).unwrap();
        assert!(o.empty && o.end == 3);
    }

    /// Every text serde_json reads as an object without a lone surrogate, a number past f64 or
    /// deep nesting is accepted, and nothing else: random mutations of valid objects.
    #[test]
    fn random_texts_agree_with_serde_json() {
        let seeds = [
            r#"{"a":[1,-2.5e-3,{"b":"x\"y\\u00e9"}],"c":null,"d":true}"#,
            r#"{"ts":"2026-11-30T12:00:00.000Z","level":"info","seq":7,"msg":"xx"}"#,
            "{\"k\":\"\\uD83D\\uDE00\",\"n\":[0,1E5,-0.5]}",
        ];
        let pieces = [
            "{", "}", "[", "]", ",", ":", "\"", "\\", "\\u", "d83d", "dc00", "0", "-", ".", "e",
            "1", " ", "\n", "\u{1}", "true", "nul", "é", "x",
        ];
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        let mut agreed = (0, 0);
        for case in 0..20_000 {
            let mut s = seeds[rng.below(seeds.len())].to_string();
            for _ in 0..1 + rng.below(3) {
                let mut at = rng.below(s.len() + 1);
                while !s.is_char_boundary(at) {
                    at -= 1;
                }
                match rng.below(3) {
                    0 => s.insert_str(at, pieces[rng.below(pieces.len())]),
                    1 => {
                        let mut to = (at + 1 + rng.below(3)).min(s.len());
                        while !s.is_char_boundary(to) {
                            to += 1;
                        }
                        s.replace_range(at..to, "");
                    }
                    _ => {
                        let mut to = (at + 1).min(s.len());
                        while !s.is_char_boundary(to) {
                            to += 1;
                        }
                        s.replace_range(at..to, pieces[rng.below(pieces.len())]);
                    }
                }
            }
            let theirs = matches!(
                serde_json::from_str::<serde_json::Value>(&s),
                Ok(serde_json::Value::Object(_))
            );
            let ours = accepted(&s);
            assert_eq!(ours, theirs, "case {case}: {s:?}");
            if ours {
                agreed.0 += 1;
            } else {
                agreed.1 += 1;
            }
        }
        assert!(agreed.0 > 1000 && agreed.1 > 1000, "{agreed:?}");
    }
}
