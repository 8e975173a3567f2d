//! Compression of a job's record area at rest: zstd at level 1, one frame per job, with the
//! content size and a content checksum in the frame (so a frame that decompresses to other bytes
//! than were compressed is caught even if its job's CRC-32 was fooled). The same frame is a valid
//! `Content-Encoding: zstd` body, so a sink that sends zstd can send it as it is.
//!
//! Why zstd level 1 (BENCHMARKS.md, issue 16): on this kind of machine it compressed real log text
//! (loghub samples) 11-14x at ~0.6 GB/s and decompressed at ~1.8 GB/s, against lz4's 6-8x at a
//! similar compression speed; ruzstd (pure Rust) compresses 5-10x slower than libzstd.
//!
//! Decompression is bounded by the length the job's header claims, so a damaged header cannot make
//! it allocate more than that. Used by `format`; the store writer drops its thread's contexts when
//! it goes idle ([`release_contexts`]).

use std::cell::RefCell;
use std::io::Read;

/// Above this claimed length a job is decompressed as a stream, not into one buffer of that size
/// (jobs are cut at about 1 MiB; a length past this is as likely a damaged header).
const BULK_MAX: usize = 16 << 20;

/// The zstd level: the fastest of the standard levels that still finds long matches.
const LEVEL: i32 = 1;

thread_local! {
    /// One compression context per thread (the store writer; `queue` commands): building one per
    /// job would allocate and clear its tables each time.
    static COMPRESSOR: RefCell<Option<zstd::bulk::Compressor<'static>>> = const { RefCell::new(None) };
    /// One decompression context per thread (the sinks' event loop; `queue` commands).
    static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
}

/// Drops this thread's contexts (about 1.3 MB for compression at level 1, 0.1 MB for
/// decompression, plus their window buffers): the store writer calls it when it goes idle after a
/// drain, so an agent that had a burst idles as small as one that never had one. The next job
/// builds them again.
pub(super) fn release_contexts() {
    COMPRESSOR.with(|c| c.borrow_mut().take());
    DECOMPRESSOR.with(|d| d.borrow_mut().take());
}

/// `plain` as one zstd frame, or `None` when that is not smaller (or the library refused, which
/// a plain buffer never makes it do).
pub(super) fn compress(plain: &[u8]) -> Option<Vec<u8>> {
    COMPRESSOR.with(|c| {
        let mut c = c.borrow_mut();
        if c.is_none() {
            let mut z = zstd::bulk::Compressor::new(LEVEL).ok()?;
            z.include_checksum(true).ok()?;
            z.include_contentsize(true).ok()?;
            *c = Some(z);
        }
        let z = c.as_mut()?;
        let out = z.compress(plain).ok()?;
        (out.len() < plain.len()).then_some(out)
    })
}

/// Decompresses one frame that must hold exactly `plain_len` bytes.
pub(super) fn decompress(frame: &[u8], plain_len: u64) -> Result<Vec<u8>, String> {
    let cap = usize::try_from(plain_len).map_err(|_| "record area too large".to_string())?;
    if frame.is_empty() {
        // zstd reads no bytes as no frames; a compressed job always has one.
        return Err("zstd: empty frame".to_string());
    }
    let out = if cap <= BULK_MAX {
        // One context per thread, as for compression: a new one per job was 2.6% of the send
        // path's CPU in a profile (allocating and clearing its window).
        DECOMPRESSOR.with(|d| {
            let mut d = d.borrow_mut();
            if d.is_none() {
                *d = Some(zstd::bulk::Decompressor::new().map_err(|e| format!("zstd: {e}"))?);
            }
            let d = d.as_mut().ok_or_else(|| "zstd: no context".to_string())?;
            // A frame that holds more than `plain_len` fails here ("destination buffer is too
            // small").
            d.decompress(frame, cap).map_err(|e| format!("zstd: {e}"))
        })?
    } else {
        // A length this large is most likely a damaged header: grow the output as the frame
        // really yields bytes instead of trusting it for one allocation.
        let mut dec = zstd::stream::read::Decoder::with_buffer(frame)
            .map_err(|e| format!("zstd: {e}"))?
            .single_frame();
        let mut out = Vec::new();
        (&mut dec)
            .take(plain_len.saturating_add(1))
            .read_to_end(&mut out)
            .map_err(|e| format!("zstd: {e}"))?;
        out
    };
    if out.len() as u64 != plain_len {
        return Err(format!(
            "the record area decompresses to {} bytes, not {plain_len}",
            out.len()
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_bounds() {
        let plain = b"{\"line\":\"GET /health 200\"}\n".repeat(500);
        let frame = compress(&plain).expect("repetitive text compresses");
        assert!(frame.len() < plain.len() / 20, "{} bytes", frame.len());
        assert_eq!(decompress(&frame, plain.len() as u64).unwrap(), plain);
        // A header that claims another length is refused, whichever way it is wrong.
        assert!(decompress(&frame, plain.len() as u64 - 1).is_err());
        assert!(decompress(&frame, plain.len() as u64 + 1).is_err());
        // Not smaller: not compressed.
        assert_eq!(compress(b"x"), None);
        // Damaged frames are errors, never panics.
        for i in 0..frame.len() {
            let mut bad = frame.clone();
            bad[i] ^= 0x41;
            if let Ok(out) = decompress(&bad, plain.len() as u64) {
                assert_eq!(
                    out, plain,
                    "byte {i}: a damaged frame decoded to other bytes"
                );
            }
        }
        assert!(decompress(b"not zstd", 3).is_err());
        assert!(decompress(&[], 0).is_err());
    }

    /// The frame is a standard one: an independent decoder (ruzstd, as receivers might use)
    /// reads it.
    #[test]
    fn frames_are_standard_zstd() {
        let plain = b"cpu,host=gw-7 usage=0.5 1700000000000000000\n".repeat(100);
        let frame = compress(&plain).unwrap();
        let mut out = Vec::new();
        ruzstd::decoding::StreamingDecoder::new(&frame[..])
            .unwrap()
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, plain);
    }
}
