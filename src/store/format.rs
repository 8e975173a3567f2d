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
//! Version 2 is a *file job* (one spooled file, shipped as a whole): the same fields, then the
//! file's length, so that byte accounting (the stream's and the store's bounds count spooled files)
//! reads only the header; its one record is a postcard [`FileRef`] naming the file:
//!
//! ```text
//! 0..21  as version 1 (version 2, records = 1)
//! 21..29 file_len     u64 LE  bytes of the spooled file
//! 29..   meta, then the one record (a FileRef)
//! ```
//!
//! `Meta` variants:
//!
//! ```text
//! V1  attempts, last_error, last_failed_ms            read only (decoded as offset 0)
//! V2  attempts, last_error, last_failed_ms, offset    written by this version
//! ```
//!
//! `offset` is how many records of the job as first appended were settled (delivered or
//! dead-lettered) and cut from its front since: a sink that splits a job keeps its place in it, so
//! the records still stored are records `offset..offset + records` of the original job.
//!
//! Records are kept as the bytes they arrived as and are read back as slices of the value, without a
//! copy per record. Decoding never panics: any byte string yields a job or a [`FormatError`], and a
//! decoded job's `offset + records` always fits in a u32, so callers may add them without a check.
//! Used only by `store`; the fuzz target `job_decode` feeds it arbitrary bytes.

use serde::{Deserialize, Serialize};

pub const VERSION: u8 = 1;
pub const HEADER_LEN: usize = 21;
/// A file job (see the module header).
pub const VERSION_FILE: u8 = 2;
pub const HEADER_LEN_FILE: usize = 29;

/// The spooled file a file job ships. Variants are only ever appended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileRef {
    V1 {
        /// Where the file waits, relative to the data directory (`spool/<task>/<unique name>`).
        spool: Vec<u8>,
        /// The file's name where it was taken from: sent with the upload.
        name: Vec<u8>,
        /// Its modification time there, Unix ms.
        mtime_ms: u64,
        /// After delivery: moved into this directory (absolute), else deleted.
        archive: Option<Vec<u8>>,
    },
}

/// The parts of a job that change over its life (attempts, errors, offset), as postcard. Variants
/// are only ever appended: postcard stores the variant's index, so old values stay readable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Meta {
    /// Before offsets: decoded as offset 0. Never written any more.
    V1 {
        attempts: u32,
        /// Why the last attempt failed (for dead letters: why it was dead-lettered).
        last_error: Option<String>,
        /// When the last attempt failed, Unix ms; 0 when it never did.
        last_failed_ms: u64,
    },
    V2 {
        attempts: u32,
        /// Why the last attempt failed (for dead letters: why it was dead-lettered).
        last_error: Option<String>,
        /// When the last attempt failed, Unix ms; 0 when it never did.
        last_failed_ms: u64,
        /// Records of the job as first appended already settled and cut from its front.
        offset: u32,
    },
}

/// `Meta::V1` by reference, to encode without cloning the error text (same variant index and
/// field order, so the same bytes).
#[derive(Serialize)]
enum MetaRef<'a> {
    V1 {
        attempts: u32,
        last_error: Option<&'a str>,
        last_failed_ms: u64,
    },
}

/// The fixed part, readable from any value at least [`HEADER_LEN`] long with the right version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub records: u32,
    pub created_ms: u64,
    /// For a file job, the spooled file's length.
    pub file_len: Option<u64>,
}

impl Header {
    fn meta_at(&self) -> usize {
        if self.file_len.is_some() {
            HEADER_LEN_FILE
        } else {
            HEADER_LEN
        }
    }
}

/// A decoded job, borrowing its records from the stored bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded<'a> {
    pub header: Header,
    pub attempts: u32,
    pub last_error: Option<String>,
    pub last_failed_ms: u64,
    /// Records of the job as first appended already settled and cut from its front (0 for V1).
    pub offset: u32,
    pub records: Vec<&'a [u8]>,
}

impl Decoded<'_> {
    /// This job's metadata as the current variant: what re-encoding it unchanged writes.
    pub fn meta(&self) -> Meta {
        Meta::V2 {
            attempts: self.attempts,
            last_error: self.last_error.clone(),
            last_failed_ms: self.last_failed_ms,
            offset: self.offset,
        }
    }
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

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Encodes a job. A job with no settled prefix is written as `V1`, so a previous release (which
/// knows only `V1`) can still read everything but the rare split job.
pub fn encode<R: AsRef<[u8]>>(created_ms: u64, meta: &Meta, records: &[R]) -> Vec<u8> {
    encode_as(None, created_ms, meta, records)
}

/// Encodes a file job: one spooled file of `file_len` bytes, named by `file`.
pub fn encode_file(created_ms: u64, meta: &Meta, file: &FileRef, file_len: u64) -> Vec<u8> {
    let rec = postcard::to_stdvec(file).expect("postcard encodes a plain enum into a Vec");
    encode_as(Some(file_len), created_ms, meta, &[rec])
}

/// Encodes a decoded job again with new metadata, as the kind it is (records or a file).
pub fn reencode(d: &Decoded<'_>, meta: &Meta) -> Vec<u8> {
    encode_as(d.header.file_len, d.header.created_ms, meta, &d.records)
}

fn encode_as<R: AsRef<[u8]>>(
    file_len: Option<u64>,
    created_ms: u64,
    meta: &Meta,
    records: &[R],
) -> Vec<u8> {
    let meta_bytes = match meta {
        Meta::V2 {
            attempts,
            last_error,
            last_failed_ms,
            offset: 0,
        } => postcard::to_stdvec(&MetaRef::V1 {
            attempts: *attempts,
            last_error: last_error.as_deref(),
            last_failed_ms: *last_failed_ms,
        }),
        m => postcard::to_stdvec(m),
    }
    .expect("postcard encodes a plain enum into a Vec");
    let body: usize = records.iter().map(|r| 4 + r.as_ref().len()).sum();
    let mut out = Vec::with_capacity(HEADER_LEN_FILE + meta_bytes.len() + body);
    out.push(if file_len.is_some() {
        VERSION_FILE
    } else {
        VERSION
    });
    let count = u32::try_from(records.len()).expect("a job holds at most u32::MAX records");
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&created_ms.to_le_bytes());
    out.extend_from_slice(&[0; 4]); // crc, filled below
    let meta_len = u32::try_from(meta_bytes.len()).expect("metadata is small");
    out.extend_from_slice(&meta_len.to_le_bytes());
    if let Some(len) = file_len {
        out.extend_from_slice(&len.to_le_bytes());
    }
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

/// What a stored value occupies: its own bytes and, for a file job, the spooled file's. The bounds
/// (`max_bytes`, `storage.max_bytes`) and the byte counters count this.
pub fn stored_len(b: &[u8]) -> u64 {
    let file = header(b).ok().and_then(|h| h.file_len).unwrap_or(0);
    (b.len() as u64).saturating_add(file)
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
    let file_len = match b[0] {
        VERSION => None,
        VERSION_FILE if b.len() >= HEADER_LEN_FILE => Some(u64_at(b, 21)),
        VERSION_FILE => return Err(FormatError::Short(b.len())),
        v => return Err(FormatError::Version(v)),
    };
    Ok(Header {
        records: u32_at(b, 1),
        created_ms: u64_at(b, 5),
        file_len,
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
    let meta_at = header.meta_at();
    let meta_end = meta_at
        .checked_add(meta_len)
        .filter(|e| *e <= b.len())
        .ok_or(FormatError::Records("metadata runs past the end"))?;
    let (meta, rest): (Meta, &[u8]) = postcard::take_from_bytes(&b[meta_at..meta_end])
        .map_err(|e| FormatError::Meta(e.to_string()))?;
    if !rest.is_empty() {
        return Err(FormatError::Meta(format!(
            "{} stray bytes after the metadata",
            rest.len()
        )));
    }
    let (attempts, last_error, last_failed_ms, offset) = match meta {
        Meta::V1 {
            attempts,
            last_error,
            last_failed_ms,
        } => (attempts, last_error, last_failed_ms, 0),
        Meta::V2 {
            attempts,
            last_error,
            last_failed_ms,
            offset,
        } => (attempts, last_error, last_failed_ms, offset),
    };
    // A job never held more than u32::MAX records, so its settled prefix and what is left of it
    // add up to at most that; refusing anything else lets callers add them without overflow.
    if offset.checked_add(header.records).is_none() {
        return Err(FormatError::Meta(format!(
            "offset {offset} and {} records exceed a job's size",
            header.records
        )));
    }
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
    if header.file_len.is_some() {
        // A file job is one file, never split: exactly one record, a FileRef.
        if records.len() != 1 || offset != 0 {
            return Err(FormatError::Records("a file job holds one file reference"));
        }
        file_ref(records[0])?;
    }
    Ok(Decoded {
        header,
        attempts,
        last_error,
        last_failed_ms,
        offset,
        records,
    })
}

/// The file reference of a file job's one record.
pub fn file_ref(record: &[u8]) -> Result<FileRef, FormatError> {
    match postcard::take_from_bytes::<FileRef>(record) {
        Ok((f, [])) => Ok(f),
        Ok(_) => Err(FormatError::Records("stray bytes after the file reference")),
        Err(e) => Err(FormatError::Meta(format!("bad file reference: {e}"))),
    }
}

/// The records of a value, as slices of it, without verifying the checksum again: for a value that
/// [`decode`] accepted (a delivery reads each record once, with no copy). A malformed value simply
/// ends early.
pub fn records(b: &[u8]) -> Records<'_> {
    let empty = Records { rest: &[], left: 0 };
    let Ok(h) = header(b) else { return empty };
    let start = h.meta_at().saturating_add(u32_at(b, 17) as usize);
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

/// Re-encodes a job with new metadata, keeping its records and age. The new metadata is built from
/// the decoded job, so what is not meant to change (the offset above all) is carried over from it
/// rather than forgotten.
pub fn with_meta(
    b: &[u8],
    meta: impl FnOnce(&Decoded<'_>) -> Meta,
) -> Result<Vec<u8>, FormatError> {
    let d = decode(b)?;
    Ok(reencode(&d, &meta(&d)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_without_a_settled_prefix_is_written_as_v1() {
        let recs = ["a", "b"];
        let v2 = Meta::V2 {
            attempts: 2,
            last_error: Some("503".into()),
            last_failed_ms: 9,
            offset: 0,
        };
        let v1 = Meta::V1 {
            attempts: 2,
            last_error: Some("503".into()),
            last_failed_ms: 9,
        };
        assert_eq!(encode(5, &v2, &recs), encode(5, &v1, &recs));
        let split = Meta::V2 {
            attempts: 2,
            last_error: None,
            last_failed_ms: 9,
            offset: 3,
        };
        assert_eq!(decode(&encode(5, &split, &recs)).unwrap().offset, 3);
    }

    fn meta(attempts: u32) -> Meta {
        Meta::V2 {
            attempts,
            last_error: Some("503 from upstream".into()),
            last_failed_ms: 42,
            offset: 5,
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
                created_ms: 1_700_000_000_000,
                file_len: None,
            }
        );
        assert_eq!(d.attempts, 2);
        assert_eq!(d.last_error.as_deref(), Some("503 from upstream"));
        assert_eq!(d.last_failed_ms, 42);
        assert_eq!(d.offset, 5);
        assert_eq!(d.records, recs);
        assert_eq!(records(&v).collect::<Vec<_>>(), recs);
        assert_eq!(
            d.meta(),
            meta(2),
            "a decoded job re-encodes to the same metadata"
        );
        let v2 = with_meta(&v, |d| Meta::V2 {
            attempts: d.attempts + 1,
            last_error: None,
            last_failed_ms: 0,
            offset: d.offset,
        })
        .unwrap();
        let d2 = decode(&v2).unwrap();
        assert_eq!((d2.attempts, d2.offset, d2.last_error), (3, 5, None));
        assert_eq!(d2.records, recs);
    }

    /// Values written before offsets existed stay readable, as offset 0.
    #[test]
    fn v1_values_decode_as_offset_zero() {
        let old = Meta::V1 {
            attempts: 4,
            last_error: Some("timeout".into()),
            last_failed_ms: 9,
        };
        let v = encode(7, &old, &[b"x".as_slice()]);
        // The variant index postcard writes first: V1 is 0, so this is a V1 value.
        assert_eq!(v[HEADER_LEN], 0);
        let d = decode(&v).unwrap();
        assert_eq!(
            (
                d.attempts,
                d.last_error.as_deref(),
                d.last_failed_ms,
                d.offset
            ),
            (4, Some("timeout"), 9, 0)
        );
        assert_eq!(d.records, [b"x".as_slice()]);
        assert_eq!(
            d.meta(),
            Meta::V2 {
                attempts: 4,
                last_error: Some("timeout".into()),
                last_failed_ms: 9,
                offset: 0
            }
        );
    }

    #[test]
    fn an_offset_past_a_jobs_size_is_refused() {
        let at = |offset: u32| Meta::V2 {
            attempts: 0,
            last_error: None,
            last_failed_ms: 0,
            offset,
        };
        let recs = [b"a".as_slice(), b"b"];
        assert_eq!(
            decode(&encode(7, &at(u32::MAX - 2), &recs)).unwrap().offset,
            u32::MAX - 2
        );
        assert!(matches!(
            decode(&encode(7, &at(u32::MAX - 1), &recs)),
            Err(FormatError::Meta(_))
        ));
        assert!(matches!(
            decode(&encode(7, &at(u32::MAX), &recs)),
            Err(FormatError::Meta(_))
        ));
    }

    fn file() -> FileRef {
        FileRef::V1 {
            spool: b"spool/ship/0000000000007-0000002a-scan.pdf".to_vec(),
            name: b"scan.pdf".to_vec(),
            mtime_ms: 99,
            archive: Some(b"/srv/archive".to_vec()),
        }
    }

    #[test]
    fn a_file_job_round_trips_and_counts_its_file() {
        let m = Meta::V2 {
            attempts: 1,
            last_error: Some("503".into()),
            last_failed_ms: 42,
            offset: 0,
        };
        let v = encode_file(7, &m, &file(), 50 << 20);
        let d = decode(&v).unwrap();
        assert_eq!(d.header.file_len, Some(50 << 20));
        assert_eq!(d.header.records, 1);
        assert_eq!(file_ref(d.records[0]).unwrap(), file());
        assert_eq!(stored_len(&v), v.len() as u64 + (50 << 20));
        assert_eq!(stored_len(&encode(7, &meta(0), &[b"x"])), {
            encode(7, &meta(0), &[b"x"]).len() as u64
        });
        // Re-encoded with new metadata it stays a file job.
        let again = with_meta(&v, |d| Meta::V2 {
            attempts: d.attempts + 1,
            last_error: None,
            last_failed_ms: 0,
            offset: 0,
        })
        .unwrap();
        let d2 = decode(&again).unwrap();
        assert_eq!((d2.header.file_len, d2.attempts), (Some(50 << 20), 2));
        assert_eq!(records(&again).collect::<Vec<_>>(), d2.records);
        for i in 0..v.len() {
            let mut c = v.clone();
            c[i] ^= 0x10;
            assert!(decode(&c).is_err(), "byte {i} flipped and still decoded");
        }
        for n in 0..v.len() {
            assert!(decode(&v[..n]).is_err(), "a {n}-byte prefix decoded");
        }
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

    /// Random bytes almost never pass the checksum, so the test above never reaches the metadata
    /// or record parsers. Here valid jobs (either metadata variant, offsets up to u32::MAX) get a
    /// few bytes changed and their checksum fixed, so the parsers see input close to real.
    #[test]
    fn damaged_values_with_a_valid_checksum_never_panic() {
        let mut rng = fastrand::Rng::with_seed(11);
        let (mut decoded, mut refused) = (0, 0);
        for _ in 0..50_000 {
            let attempts = rng.u32(..);
            let last_error = rng.bool().then(|| "e".repeat(rng.usize(0..4)));
            let last_failed_ms = rng.u64(..);
            let meta = if rng.bool() {
                Meta::V1 {
                    attempts,
                    last_error,
                    last_failed_ms,
                }
            } else {
                let offset = if rng.bool() {
                    u32::MAX - rng.u32(0..4)
                } else {
                    rng.u32(..)
                };
                Meta::V2 {
                    attempts,
                    last_error,
                    last_failed_ms,
                    offset,
                }
            };
            let records: Vec<Vec<u8>> = (0..rng.usize(0..4))
                .map(|_| vec![rng.u8(..); rng.usize(0..4)])
                .collect();
            let mut b = if rng.u8(..) < 64 {
                encode_file(rng.u64(..), &meta, &file(), rng.u64(..))
            } else {
                encode(rng.u64(..), &meta, &records)
            };
            for _ in 0..rng.usize(0..3) {
                let at = rng.usize(1..b.len());
                b[at] = rng.u8(..);
            }
            let crc = checksum(&b);
            b[13..17].copy_from_slice(&crc.to_le_bytes());
            match decode(&b) {
                Ok(d) => {
                    decoded += 1;
                    assert!(d.offset.checked_add(d.header.records).is_some());
                    let again = reencode(&d, &d.meta());
                    assert_eq!(decode(&again).as_ref(), Ok(&d), "re-encodes unchanged");
                }
                Err(_) => refused += 1,
            }
        }
        assert!(
            decoded > 1000 && refused > 1000,
            "{decoded} decoded, {refused} refused"
        );
    }
}
