//! The JSON work on a tail source's hot path: escaping a line into a JSON string, eight bytes at a
//! time, runs of plain bytes copied whole. Pure.

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
}
