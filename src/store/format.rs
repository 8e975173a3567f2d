//! The bytes of a stored transfer job. A value in a `ready`, `retry` or `dead` table is:
//!
//! ```text
//! 0      version      u8      1 (a new layout gets a new number; old ones stay readable)
//! 1..5   records      u32 LE  record count: readable without decoding, so accounting survives a bad body
//! 5..13  created_ms   u64 LE  creation time: TTL expiry reads only the header
//! 13..17 crc32        u32 LE  of every other byte: bit rot is detected, not decoded into data
//! 17..21 meta_len     u32 LE
//! 21..   meta         postcard `Meta` (an enum: variants only ever appended)
//! then   records      (u32 LE length, bytes) x records
//! ```
//!
//! Records are kept as the bytes they arrived as and are read back as slices of the value, without a
//! copy per record. Decoding never panics: any byte string yields a job or a [`FormatError`]. Used only
//! by `store`; the fuzz target `job_decode` feeds it arbitrary bytes.

use serde::{Deserialize, Serialize};

pub const VERSION: u8 = 1;
pub const HEADER_LEN: usize = 21;

/// The parts of a job that change over its life (attempts, errors), as postcard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Meta {
    V1 {
        attempts: u32,
        /// Why the last attempt failed (for dead letters: why it was dead-lettered).
        last_error: Option<String>,
        /// When the last attempt failed, Unix ms; 0 when it never did.
        last_failed_ms: u64,
    },
}

/// The fixed part, readable from any value at least [`HEADER_LEN`] long with the right version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub records: u32,
    pub created_ms: u64,
}

/// A decoded job, borrowing its records from the stored bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded<'a> {
    pub header: Header,
    pub attempts: u32,
    pub last_error: Option<String>,
    pub last_failed_ms: u64,
    pub records: Vec<&'a [u8]>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("value of {0} bytes is shorter than the {HEADER_LEN}-byte header")]
    Short(usize),
    #[error("unknown format version {0}")]
    Version(u8),
    #[error("checksum mismatch (stored {stored:08x}, computed {computed:08x})")]
    Checksum { stored: u32, computed: u32 },
    #[error("bad metadata: {0}")]
    Meta(String),
    #[error("record area is malformed: {0}")]
    Records(&'static str),
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

/// Encodes a job.
pub fn encode<R: AsRef<[u8]>>(created_ms: u64, meta: &Meta, records: &[R]) -> Vec<u8> {
    let meta_bytes = postcard::to_stdvec(meta).expect("postcard encodes a plain enum into a Vec");
    let body: usize = records.iter().map(|r| 4 + r.as_ref().len()).sum();
    let mut out = Vec::with_capacity(HEADER_LEN + meta_bytes.len() + body);
    out.push(VERSION);
    let count = u32::try_from(records.len()).expect("a job holds at most u32::MAX records");
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&created_ms.to_le_bytes());
    out.extend_from_slice(&[0; 4]); // crc, filled below
    let meta_len = u32::try_from(meta_bytes.len()).expect("metadata is small");
    out.extend_from_slice(&meta_len.to_le_bytes());
    out.extend_from_slice(&meta_bytes);
    for r in records {
        let r = r.as_ref();
        let len = u32::try_from(r.len()).expect("a record is smaller than 4 GiB");
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(r);
    }
    let crc = checksum(&out);
    out[13..17].copy_from_slice(&crc.to_le_bytes());
    out
}

/// CRC-32 of the value without its own checksum field.
fn checksum(b: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&b[..13]);
    h.update(&b[17..]);
    h.finalize()
}

/// Reads the header without checking the body.
pub fn header(b: &[u8]) -> Result<Header, FormatError> {
    if b.len() < HEADER_LEN {
        return Err(FormatError::Short(b.len()));
    }
    if b[0] != VERSION {
        return Err(FormatError::Version(b[0]));
    }
    let mut created = [0u8; 8];
    created.copy_from_slice(&b[5..13]);
    Ok(Header {
        records: u32_at(b, 1),
        created_ms: u64::from_le_bytes(created),
    })
}

/// Decodes and verifies a whole job.
pub fn decode(b: &[u8]) -> Result<Decoded<'_>, FormatError> {
    let header = header(b)?;
    let stored = u32_at(b, 13);
    let computed = checksum(b);
    if stored != computed {
        return Err(FormatError::Checksum { stored, computed });
    }
    let meta_len = u32_at(b, 17) as usize;
    let meta_end = HEADER_LEN
        .checked_add(meta_len)
        .filter(|e| *e <= b.len())
        .ok_or(FormatError::Records("metadata runs past the end"))?;
    let (meta, rest): (Meta, &[u8]) = postcard::take_from_bytes(&b[HEADER_LEN..meta_end])
        .map_err(|e| FormatError::Meta(e.to_string()))?;
    if !rest.is_empty() {
        return Err(FormatError::Meta(format!(
            "{} stray bytes after the metadata",
            rest.len()
        )));
    }
    let Meta::V1 {
        attempts,
        last_error,
        last_failed_ms,
    } = meta;
    // Never trust the count for an allocation size beyond what the bytes can hold.
    let mut records = Vec::with_capacity((header.records as usize).min((b.len() - meta_end) / 4));
    let mut walk = Records {
        rest: &b[meta_end..],
        left: header.records,
    };
    records.extend(&mut walk);
    if records.len() != header.records as usize {
        return Err(FormatError::Records("a record runs past the end"));
    }
    if !walk.rest.is_empty() {
        return Err(FormatError::Records("bytes left after the last record"));
    }
    Ok(Decoded {
        header,
        attempts,
        last_error,
        last_failed_ms,
        records,
    })
}

/// The records of a value, as slices of it, without verifying the checksum again: for a value that
/// [`decode`] accepted (a delivery reads each record once, with no copy). A malformed value simply
/// ends early.
pub fn records(b: &[u8]) -> Records<'_> {
    let empty = Records { rest: &[], left: 0 };
    let Ok(h) = header(b) else { return empty };
    let start = HEADER_LEN.saturating_add(u32_at(b, 17) as usize);
    match b.get(start..) {
        Some(rest) => Records {
            rest,
            left: h.records,
        },
        None => empty,
    }
}

/// Iterator over the records of a stored job.
#[derive(Debug, Clone)]
pub struct Records<'a> {
    rest: &'a [u8],
    left: u32,
}

impl<'a> Iterator for Records<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.left == 0 || self.rest.len() < 4 {
            return None;
        }
        let len = u32_at(self.rest, 0) as usize;
        let record = self.rest.get(4..4 + len)?;
        self.rest = &self.rest[4 + len..];
        self.left -= 1;
        Some(record)
    }
}

/// Re-encodes a job with new metadata (after a failed attempt), keeping its records and age.
pub fn with_meta(b: &[u8], meta: &Meta) -> Result<Vec<u8>, FormatError> {
    let d = decode(b)?;
    Ok(encode(d.header.created_ms, meta, &d.records))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(attempts: u32) -> Meta {
        Meta::V1 {
            attempts,
            last_error: Some("503 from upstream".into()),
            last_failed_ms: 42,
        }
    }

    #[test]
    fn round_trip() {
        let recs: Vec<&[u8]> = vec![b"{\"a\":1}", b"", b"line three"];
        let v = encode(1_700_000_000_000, &meta(2), &recs);
        let d = decode(&v).unwrap();
        assert_eq!(
            d.header,
            Header {
                records: 3,
                created_ms: 1_700_000_000_000
            }
        );
        assert_eq!(d.attempts, 2);
        assert_eq!(d.last_error.as_deref(), Some("503 from upstream"));
        assert_eq!(d.last_failed_ms, 42);
        assert_eq!(d.records, recs);
        assert_eq!(records(&v).collect::<Vec<_>>(), recs);
        let v2 = with_meta(&v, &meta(3)).unwrap();
        assert_eq!(decode(&v2).unwrap().attempts, 3);
        assert_eq!(decode(&v2).unwrap().records, recs);
    }

    #[test]
    fn every_flipped_bit_is_detected() {
        let v = encode(7, &meta(0), &[b"hello".as_slice(), b"world"]);
        for i in 0..v.len() {
            for bit in 0..8 {
                let mut c = v.clone();
                c[i] ^= 1 << bit;
                assert!(
                    decode(&c).is_err(),
                    "byte {i} bit {bit} flipped and still decoded"
                );
            }
        }
    }

    #[test]
    fn truncations_never_panic() {
        let v = encode(7, &meta(0), &[b"hello".as_slice(), b"world"]);
        for n in 0..v.len() {
            assert!(decode(&v[..n]).is_err(), "a {n}-byte prefix decoded");
        }
        assert_eq!(decode(&[]), Err(FormatError::Short(0)));
        assert_eq!(header(&[9; 30]), Err(FormatError::Version(9)));
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..20_000 {
            let n = rng.usize(0..64);
            let mut b: Vec<u8> = (0..n).map(|_| rng.u8(..)).collect();
            if n > 0 && rng.bool() {
                b[0] = VERSION;
            }
            let _ = decode(&b);
        }
    }
}
