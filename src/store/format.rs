//! The bytes of a stored transfer job. A value in a `ready`, `retry` or `dead` table starts with a
//! version byte; every version stays readable, and this release writes versions 2 and 3.
//!
//! Version 3, a job of records (written since issue 16):
//!
//! ```text
//! 0      version      u8      3
//! 1..5   records      u32 LE  record count: readable without decoding, so accounting survives a bad body
//! 5..13  created_ms   u64 LE  creation time: TTL expiry reads only the header
//! 13..17 crc32        u32 LE  of every other byte: bit rot is detected, not decoded into data
//! 17..21 meta_len     u32 LE
//! 21..29 plain_len    u64 LE  bytes of the record area uncompressed (raw bytes, for `queue stats`)
//! 29     codec        u8      0: the area is as it is; 1: the area is one zstd frame (see `codec`)
//! 30     framing      u8      0 (lines): each record followed by `\n`; 1 (lengths): u32 LE length, bytes
//! 31..   meta         postcard `Meta` (an enum: variants only ever appended)
//! then   the record area
//! ```
//!
//! Lines are the framing whenever no record holds a `\n` (every producer's records are single
//! lines): the uncompressed area is then exactly an NDJSON or line-protocol body, sent without
//! building it again, and a compressed one is a `Content-Encoding: zstd` body as it is.
//!
//! Version 1, a job of records (written before issue 16; read only): bytes 0..21 as above, then
//! meta, then the records framed by lengths, never compressed.
//!
//! Version 2, a *file job* (one spooled file, shipped as a whole): bytes 0..21 as above, then the
//! file's length, so that byte accounting (the bounds count spooled files) reads only the header;
//! its one record is a postcard [`FileRef`] naming the file, framed by length:
//!
//! ```text
//! 21..29 file_len     u64 LE  bytes of the spooled file
//! 29..   meta, then the one record (a FileRef)
//! ```
//!
//! `Meta` variants:
//!
//! ```text
//! V1  attempts, last_error, last_failed_ms            read only (decoded as offset 0)
//! V2  attempts, last_error, last_failed_ms, offset    written by this version
//! V3  as V2, and origin (store id, job id)              a salvaged job (issue 17)
//! V4  as V3, and the stream the key names               a job moved by `on_max_age` (issue 33)
//! V5  as V4 with origin optional, a clock stamp and    held for the clock (issue 34)
//!     a window (0), both optional
//! ```
//!
//! A job appended to a `hold_until_clock_synced` stream while the wall clock was unsynchronised
//! carries V5: its boot and time since boot ([`ClockStamp`]), from which its true time is known
//! once the clock is synchronised; its records' times are corrected then and it is written again
//! without the stamp (`tx::clock`).
//!
//! `origin` is where a salvaged job came from: the damaged file's store id and the job's id in it.
//! A sink builds its idempotency key from it, so a receiver sees the same key it saw before the
//! damage. A job moved to another stream (`on_max_age: stream:NAME`) carries V4: its store, id
//! and stream before the move, so it keeps its key in its new stream. Only salvaged and moved jobs
//! carry V3 or V4 (a release before them quarantines such a job instead of reading it; every other
//! job is still V2).
//!
//! `offset` is how many records of the job as first appended were settled (delivered or
//! dead-lettered) and cut from its front since: a sink that splits a job keeps its place in it, so
//! the records still stored are records `offset..offset + records` of the original job.
//!
//! Decoding never panics: any byte string yields a job or a [`FormatError`], and a decoded job's
//! `offset + records` always fits in a u32, so callers may add them without a check. An
//! uncompressed area is checked whole by [`decode`]; a compressed one when it is decompressed
//! ([`Area::plain`]). Used only by `store`; the fuzz target `job_decode` feeds it arbitrary bytes.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use super::codec;
use crate::timesync::ClockStamp;

/// A job of records framed by lengths, never compressed (read only).
pub const VERSION_V1: u8 = 1;
pub const HEADER_LEN: usize = 21;
/// A file job (see the module header).
pub const VERSION_FILE: u8 = 2;
pub const HEADER_LEN_FILE: usize = 29;
/// A job of records with its area's codec and framing (see the module header).
pub const VERSION_AREA: u8 = 3;
pub const HEADER_LEN_AREA: usize = 31;

/// How a record area is kept on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    /// As it is.
    None,
    /// One zstd frame (level 1, with content size and checksum).
    Zstd,
}

/// How the records of an (uncompressed) area are separated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// Each record followed by `\n` (no record holds one).
    Lines,
    /// Each record preceded by its length, u32 LE.
    Lengths,
}

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
    V3 {
        attempts: u32,
        last_error: Option<String>,
        last_failed_ms: u64,
        offset: u32,
        origin: StoreJob,
    },
    V4 {
        attempts: u32,
        last_error: Option<String>,
        last_failed_ms: u64,
        offset: u32,
        origin: StoreJob,
        /// The stream the job's key names (the one it was moved from).
        stream: String,
    },
    V5 {
        attempts: u32,
        last_error: Option<String>,
        last_failed_ms: u64,
        offset: u32,
        origin: Option<StoreJob>,
        stream: Option<String>,
        clock: Option<ClockStamp>,
        /// For a job of aggregates (`when_full: downsample`): their window; 0 for raw records.
        window_ms: u64,
    },
}

/// A store file's id and a job's id in it, as V3 and V4 store them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreJob {
    pub store: u64,
    pub job: u64,
}

/// Whose idempotency key a job carries when it is not its own: where a salvaged job came from
/// (the store file it was in, its id there), and for a job moved to another stream, the stream it
/// was moved from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Origin {
    pub store: u64,
    pub job: u64,
    /// For a moved job: the stream its key names.
    pub stream: Option<String>,
}

impl Meta {
    /// The variant that holds these: V4 with a moved job's origin, V3 with a salvaged one's, else
    /// V2 (what earlier releases read).
    pub fn new(
        attempts: u32,
        last_error: Option<String>,
        last_failed_ms: u64,
        offset: u32,
        origin: Option<Origin>,
    ) -> Meta {
        let Some(Origin { store, job, stream }) = origin else {
            return Meta::V2 {
                attempts,
                last_error,
                last_failed_ms,
                offset,
            };
        };
        let origin = StoreJob { store, job };
        match stream {
            None => Meta::V3 {
                attempts,
                last_error,
                last_failed_ms,
                offset,
                origin,
            },
            Some(stream) => Meta::V4 {
                attempts,
                last_error,
                last_failed_ms,
                offset,
                origin,
                stream,
            },
        }
    }

    /// This metadata with a clock stamp and a window of aggregates (V5), or as it is with
    /// neither. Every re-encoding of a job passes its own on ([`Decoded::meta`]).
    pub fn with_extras(self, clock: Option<ClockStamp>, window_ms: u64) -> Meta {
        if clock.is_none() && window_ms == 0 {
            return self;
        }
        let (attempts, last_error, last_failed_ms, offset, origin, ..) = self.into_parts();
        Meta::V5 {
            attempts,
            last_error,
            last_failed_ms,
            offset,
            origin: origin.as_ref().map(|o| StoreJob {
                store: o.store,
                job: o.job,
            }),
            stream: origin.and_then(|o| o.stream),
            clock,
            window_ms,
        }
    }

    /// Its fields, whichever variant: (attempts, last error, when it failed, offset, origin,
    /// clock stamp, window).
    fn into_parts(self) -> Parts {
        let (attempts, last_error, last_failed_ms, offset, origin) = match self {
            Meta::V5 {
                attempts,
                last_error,
                last_failed_ms,
                offset,
                origin,
                stream,
                clock,
                window_ms,
            } => {
                let origin = origin.map(|StoreJob { store, job }| Origin { store, job, stream });
                return (
                    attempts,
                    last_error,
                    last_failed_ms,
                    offset,
                    origin,
                    clock,
                    window_ms,
                );
            }
            Meta::V1 {
                attempts,
                last_error,
                last_failed_ms,
            } => (attempts, last_error, last_failed_ms, 0, None),
            Meta::V2 {
                attempts,
                last_error,
                last_failed_ms,
                offset,
            } => (attempts, last_error, last_failed_ms, offset, None),
            Meta::V3 {
                attempts,
                last_error,
                last_failed_ms,
                offset,
                origin: StoreJob { store, job },
            } => {
                let origin = Origin {
                    store,
                    job,
                    stream: None,
                };
                (attempts, last_error, last_failed_ms, offset, Some(origin))
            }
            Meta::V4 {
                attempts,
                last_error,
                last_failed_ms,
                offset,
                origin: StoreJob { store, job },
                stream,
            } => {
                let origin = Origin {
                    store,
                    job,
                    stream: Some(stream),
                };
                (attempts, last_error, last_failed_ms, offset, Some(origin))
            }
        };
        (
            attempts,
            last_error,
            last_failed_ms,
            offset,
            origin,
            None,
            0,
        )
    }
}

impl Meta {
    /// The metadata of a job of aggregates (`when_full: downsample`): fresh, with its window and
    /// the key it is sent under (`origin`: derived from what it replaced, see `tx::downsample`).
    pub fn aggregate(origin: StoreJob, window_ms: u64) -> Meta {
        Meta::V5 {
            attempts: 0,
            last_error: None,
            last_failed_ms: 0,
            offset: 0,
            origin: Some(origin),
            stream: None,
            clock: None,
            window_ms,
        }
    }
}

/// A job's metadata, read from its header only (no checksum, no records: for a scan that picks
/// jobs; a damaged job is found when its records are read).
fn meta_of(b: &[u8]) -> Option<Meta> {
    let h = header(b).ok()?;
    let meta_len = u32_at(b, 17) as usize;
    let at = h.meta_at();
    postcard::from_bytes::<Meta>(b.get(at..at.saturating_add(meta_len))?).ok()
}

/// The window of a job of aggregates, 0 for any other (see [`meta_of`]).
pub fn window_ms(b: &[u8]) -> u64 {
    match meta_of(b) {
        Some(Meta::V5 { window_ms, .. }) => window_ms,
        _ => 0,
    }
}

/// Whether a job carries a clock stamp (see [`meta_of`]).
pub fn held_for_clock(b: &[u8]) -> bool {
    matches!(meta_of(b), Some(Meta::V5 { clock: Some(_), .. }))
}

/// [`Meta`]'s fields: attempts, last error, when it failed, offset, origin, clock stamp, window.
type Parts = (
    u32,
    Option<String>,
    u64,
    u32,
    Option<Origin>,
    Option<ClockStamp>,
    u64,
);

/// `Meta::V1` by reference, to encode a file job without cloning the error text (same variant
/// index and field order, so the same bytes).
#[derive(Serialize)]
enum MetaRef<'a> {
    V1 {
        attempts: u32,
        last_error: Option<&'a str>,
        last_failed_ms: u64,
    },
}

/// The fixed part, readable from any value at least as long as its version's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub version: u8,
    pub records: u32,
    pub created_ms: u64,
    /// For a file job, the spooled file's length.
    pub file_len: Option<u64>,
    /// For a version 3 job: the area's codec, framing and uncompressed length.
    pub area: Option<(Codec, Framing, u64)>,
}

impl Header {
    fn meta_at(&self) -> usize {
        match self.version {
            VERSION_FILE => HEADER_LEN_FILE,
            VERSION_AREA => HEADER_LEN_AREA,
            _ => HEADER_LEN,
        }
    }
}

/// What a stored value counts for: records, bytes on disk (the value and, for a file job, its
/// file) and raw bytes (what the value would take uncompressed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Size {
    pub records: u64,
    pub bytes: u64,
    pub raw: u64,
}

/// A record area as stored: borrowed from the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Area<'a> {
    pub codec: Codec,
    pub framing: Framing,
    pub records: u32,
    /// The uncompressed length.
    pub plain_len: u64,
    /// The area's bytes as stored (a zstd frame when compressed).
    pub bytes: &'a [u8],
}

impl<'a> Area<'a> {
    /// The area uncompressed: borrowed when stored as it is; decompressed (and checked: length,
    /// framing, record count) otherwise.
    pub fn plain(&self) -> Result<Cow<'a, [u8]>, FormatError> {
        match self.codec {
            Codec::None => Ok(Cow::Borrowed(self.bytes)),
            Codec::Zstd => {
                let plain = codec::decompress(self.bytes, self.plain_len)
                    .map_err(FormatError::Compressed)?;
                check_framing(&plain, self.framing, self.records)?;
                Ok(Cow::Owned(plain))
            }
        }
    }

    /// The records, decompressed when needed (each an owned copy only when they had to be).
    pub fn to_records(&self) -> Result<Vec<Vec<u8>>, FormatError> {
        let plain = self.plain()?;
        Ok(split(&plain, self.framing, self.records)?
            .into_iter()
            .map(<[u8]>::to_vec)
            .collect())
    }
}

/// A decoded job, borrowing its record area from the stored bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded<'a> {
    pub header: Header,
    pub attempts: u32,
    pub last_error: Option<String>,
    pub last_failed_ms: u64,
    /// Records of the job as first appended already settled and cut from its front (0 for V1).
    pub offset: u32,
    /// For a salvaged job, where it came from.
    pub origin: Option<Origin>,
    /// For a job held for the clock, when it was appended (see [`ClockStamp`]).
    pub clock: Option<ClockStamp>,
    /// For a job of aggregates, their window (`when_full: downsample`); 0 for raw records.
    pub window_ms: u64,
    pub area: Area<'a>,
}

impl Decoded<'_> {
    /// This job's metadata as the current variant: what re-encoding it unchanged writes.
    pub fn meta(&self) -> Meta {
        Meta::new(
            self.attempts,
            self.last_error.clone(),
            self.last_failed_ms,
            self.offset,
            self.origin.clone(),
        )
        .with_extras(self.clock, self.window_ms)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("value of {0} bytes is shorter than its header")]
    Short(usize),
    #[error("unknown format version {0}")]
    Version(u8),
    #[error("checksum mismatch (stored {stored:08x}, computed {computed:08x})")]
    Checksum { stored: u32, computed: u32 },
    #[error("bad metadata: {0}")]
    Meta(String),
    #[error("record area is malformed: {0}")]
    Records(&'static str),
    #[error("compressed record area cannot be read: {0}")]
    Compressed(String),
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

/// Frames records as an area: lines when no record holds a `\n`, else lengths.
pub fn frame<R: AsRef<[u8]>>(records: &[R]) -> (Vec<u8>, Framing) {
    let lines = records
        .iter()
        .all(|r| memchr::memchr(b'\n', r.as_ref()).is_none());
    let len: usize = records.iter().map(|r| r.as_ref().len() + 4).sum();
    let mut out = Vec::with_capacity(len);
    for r in records {
        let r = r.as_ref();
        if lines {
            out.extend_from_slice(r);
            out.push(b'\n');
        } else {
            let n = u32::try_from(r.len()).expect("a record is smaller than 4 GiB");
            out.extend_from_slice(&n.to_le_bytes());
            out.extend_from_slice(r);
        }
    }
    (
        out,
        if lines {
            Framing::Lines
        } else {
            Framing::Lengths
        },
    )
}

/// Encodes a job of `records`, uncompressed (tests, and parts of split jobs).
pub fn encode<R: AsRef<[u8]>>(created_ms: u64, meta: &Meta, records: &[R]) -> Vec<u8> {
    let (plain, framing) = frame(records);
    let n = u32::try_from(records.len()).expect("a job holds at most u32::MAX records");
    encode_area(created_ms, meta, &plain, framing, n, Codec::None)
}

/// Encodes a job whose records are already framed in `plain` (`records` of them), compressed
/// with `codec` when that makes it smaller.
pub fn encode_area(
    created_ms: u64,
    meta: &Meta,
    plain: &[u8],
    framing: Framing,
    records: u32,
    codec: Codec,
) -> Vec<u8> {
    let compressed = match codec {
        Codec::None => None,
        Codec::Zstd => codec::compress(plain),
    };
    let (codec, area) = match &compressed {
        Some(frame) => (Codec::Zstd, frame.as_slice()),
        None => (Codec::None, plain),
    };
    write_v3(
        created_ms,
        meta,
        Area {
            codec,
            framing,
            records,
            plain_len: plain.len() as u64,
            bytes: area,
        },
    )
}

fn write_v3(created_ms: u64, meta: &Meta, area: Area<'_>) -> Vec<u8> {
    let meta_bytes = postcard::to_stdvec(meta).expect("postcard encodes a plain enum into a Vec");
    let mut out = Vec::with_capacity(HEADER_LEN_AREA + meta_bytes.len() + area.bytes.len());
    out.push(VERSION_AREA);
    out.extend_from_slice(&area.records.to_le_bytes());
    out.extend_from_slice(&created_ms.to_le_bytes());
    out.extend_from_slice(&[0; 4]); // crc, filled below
    let meta_len = u32::try_from(meta_bytes.len()).expect("metadata is small");
    out.extend_from_slice(&meta_len.to_le_bytes());
    out.extend_from_slice(&area.plain_len.to_le_bytes());
    out.push(match area.codec {
        Codec::None => 0,
        Codec::Zstd => 1,
    });
    out.push(match area.framing {
        Framing::Lines => 0,
        Framing::Lengths => 1,
    });
    out.extend_from_slice(&meta_bytes);
    out.extend_from_slice(area.bytes);
    seal(&mut out);
    out
}

/// Encodes a file job: one spooled file of `file_len` bytes, named by `file`.
pub fn encode_file(created_ms: u64, meta: &Meta, file: &FileRef, file_len: u64) -> Vec<u8> {
    let rec = postcard::to_stdvec(file).expect("postcard encodes a plain enum into a Vec");
    write_file(created_ms, meta, &rec, file_len)
}

/// A file job (version 2): written with `Meta::V1` when it has no settled prefix (a file job never
/// has one), as earlier releases wrote it.
fn write_file(created_ms: u64, meta: &Meta, file_ref: &[u8], file_len: u64) -> Vec<u8> {
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
    let mut out = Vec::with_capacity(HEADER_LEN_FILE + meta_bytes.len() + 4 + file_ref.len());
    out.push(VERSION_FILE);
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&created_ms.to_le_bytes());
    out.extend_from_slice(&[0; 4]); // crc, filled below
    let meta_len = u32::try_from(meta_bytes.len()).expect("metadata is small");
    out.extend_from_slice(&meta_len.to_le_bytes());
    out.extend_from_slice(&file_len.to_le_bytes());
    out.extend_from_slice(&meta_bytes);
    let n = u32::try_from(file_ref.len()).expect("a file reference is small");
    out.extend_from_slice(&n.to_le_bytes());
    out.extend_from_slice(file_ref);
    seal(&mut out);
    out
}

pub(in crate::store) fn seal(out: &mut [u8]) {
    let crc = checksum(out);
    out[13..17].copy_from_slice(&crc.to_le_bytes());
}

/// Encodes a decoded job again with new metadata, keeping its records as they are stored
/// (compressed or not) and its kind (records or a file). A version 1 job becomes version 3.
pub fn reencode(d: &Decoded<'_>, meta: &Meta) -> Vec<u8> {
    match d.header.file_len {
        Some(len) => write_file(d.header.created_ms, meta, file_record(&d.area), len),
        None => write_v3(d.header.created_ms, meta, d.area),
    }
}

/// The one record of a file job's area (checked by `decode`).
fn file_record<'a>(area: &Area<'a>) -> &'a [u8] {
    area.bytes.get(4..).unwrap_or_default()
}

/// What a stored value occupies and holds; from its header only (a damaged header counts as
/// no records, its own bytes as both sizes).
pub fn size(b: &[u8]) -> Size {
    let Ok(h) = header(b) else {
        let n = b.len() as u64;
        return Size {
            records: 0,
            bytes: n,
            raw: n,
        };
    };
    let bytes = (b.len() as u64).saturating_add(h.file_len.unwrap_or(0));
    let raw = match h.area {
        Some((Codec::Zstd, _, plain_len)) => {
            let meta_len = u64::from(u32_at(b, 17));
            (HEADER_LEN_AREA as u64)
                .saturating_add(meta_len)
                .saturating_add(plain_len)
        }
        _ => bytes,
    };
    Size {
        records: u64::from(h.records),
        bytes,
        raw,
    }
}

/// What a stored value occupies: its own bytes and, for a file job, the spooled file's. The bounds
/// (`max_bytes`, `storage.max_bytes`) and the byte counters count this.
pub fn stored_len(b: &[u8]) -> u64 {
    size(b).bytes
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
    let version = *b.first().ok_or(FormatError::Short(0))?;
    let need = match version {
        VERSION_V1 => HEADER_LEN,
        VERSION_FILE => HEADER_LEN_FILE,
        VERSION_AREA => HEADER_LEN_AREA,
        v => return Err(FormatError::Version(v)),
    };
    if b.len() < need {
        return Err(FormatError::Short(b.len()));
    }
    let area = if version == VERSION_AREA {
        let codec = match b[29] {
            0 => Codec::None,
            1 => Codec::Zstd,
            _ => return Err(FormatError::Records("unknown codec")),
        };
        let framing = match b[30] {
            0 => Framing::Lines,
            1 => Framing::Lengths,
            _ => return Err(FormatError::Records("unknown framing")),
        };
        Some((codec, framing, u64_at(b, 21)))
    } else {
        None
    };
    Ok(Header {
        version,
        records: u32_at(b, 1),
        created_ms: u64_at(b, 5),
        file_len: (version == VERSION_FILE).then(|| u64_at(b, 21)),
        area,
    })
}

/// Decodes and verifies a whole job (a compressed area is verified when it is decompressed).
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
    let (attempts, last_error, last_failed_ms, offset, origin, clock, window_ms) =
        meta.into_parts();
    // A job never held more than u32::MAX records, so its settled prefix and what is left of it
    // add up to at most that; refusing anything else lets callers add them without overflow.
    if offset.checked_add(header.records).is_none() {
        return Err(FormatError::Meta(format!(
            "offset {offset} and {} records exceed a job's size",
            header.records
        )));
    }
    let bytes = &b[meta_end..];
    let (codec, framing, plain_len) =
        header
            .area
            .unwrap_or((Codec::None, Framing::Lengths, bytes.len() as u64));
    let area = Area {
        codec,
        framing,
        records: header.records,
        plain_len,
        bytes,
    };
    match codec {
        Codec::None => {
            if plain_len != bytes.len() as u64 {
                return Err(FormatError::Records(
                    "the area's length is not its header's",
                ));
            }
            check_framing(bytes, framing, header.records)?;
        }
        Codec::Zstd => {
            if bytes.is_empty() {
                return Err(FormatError::Records("an empty compressed area"));
            }
        }
    }
    if header.file_len.is_some() {
        // A file job is one file, never split: exactly one record, a FileRef.
        if header.records != 1 || offset != 0 {
            return Err(FormatError::Records("a file job holds one file reference"));
        }
        file_ref(file_record(&area))?;
    }
    Ok(Decoded {
        header,
        attempts,
        last_error,
        last_failed_ms,
        offset,
        origin,
        clock,
        window_ms,
        area,
    })
}

/// Whether an uncompressed area holds exactly `records` records in `framing`.
fn check_framing(plain: &[u8], framing: Framing, records: u32) -> Result<(), FormatError> {
    match framing {
        Framing::Lines => {
            if memchr::memchr_iter(b'\n', plain).count() != records as usize {
                return Err(FormatError::Records(
                    "the line count is not the record count",
                ));
            }
            if plain.last().is_some_and(|&c| c != b'\n') {
                return Err(FormatError::Records("bytes left after the last record"));
            }
        }
        Framing::Lengths => {
            let mut walk = LengthRecords {
                rest: plain,
                left: records,
            };
            let n = walk.by_ref().count();
            if n != records as usize {
                return Err(FormatError::Records("a record runs past the end"));
            }
            if !walk.rest.is_empty() {
                return Err(FormatError::Records("bytes left after the last record"));
            }
        }
    }
    Ok(())
}

/// The records of an uncompressed area, as slices of it; checked: exactly `records` of them.
pub fn split(plain: &[u8], framing: Framing, records: u32) -> Result<Vec<&[u8]>, FormatError> {
    // Never trust the count for an allocation size beyond what the bytes can hold.
    let mut out = Vec::with_capacity((records as usize).min(plain.len()));
    match framing {
        Framing::Lines => {
            let mut start = 0;
            for end in memchr::memchr_iter(b'\n', plain) {
                out.push(&plain[start..end]);
                start = end + 1;
            }
            if start != plain.len() {
                return Err(FormatError::Records("bytes left after the last record"));
            }
        }
        Framing::Lengths => {
            let mut walk = LengthRecords {
                rest: plain,
                left: records,
            };
            out.extend(&mut walk);
            if !walk.rest.is_empty() {
                return Err(FormatError::Records("bytes left after the last record"));
            }
        }
    }
    if out.len() != records as usize {
        return Err(FormatError::Records("the record count is not the header's"));
    }
    Ok(out)
}

/// The file reference of a file job's one record.
pub fn file_ref(record: &[u8]) -> Result<FileRef, FormatError> {
    match postcard::take_from_bytes::<FileRef>(record) {
        Ok((f, [])) => Ok(f),
        Ok(_) => Err(FormatError::Records("stray bytes after the file reference")),
        Err(e) => Err(FormatError::Meta(format!("bad file reference: {e}"))),
    }
}

/// The file reference of a file job's value.
pub fn file_of(b: &[u8]) -> Result<FileRef, FormatError> {
    let d = decode(b)?;
    if d.header.file_len.is_none() {
        return Err(FormatError::Records("not a file job"));
    }
    file_ref(file_record(&d.area))
}

/// Iterator over records framed by lengths.
#[derive(Debug, Clone)]
struct LengthRecords<'a> {
    rest: &'a [u8],
    left: u32,
}

impl<'a> Iterator for LengthRecords<'a> {
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
mod tests;
