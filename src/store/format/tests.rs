//! Tests of the job format: round trips of every version, bounds, damaged bytes never panic.

use super::*;

fn meta(attempts: u32) -> Meta {
    Meta::V2 {
        attempts,
        last_error: Some("503 from upstream".into()),
        last_failed_ms: 42,
        offset: 5,
    }
}

/// A version 1 value exactly as releases before issue 16 wrote it (their encoder, kept here
/// to prove those values stay readable).
pub(in crate::store) fn encode_v1<R: AsRef<[u8]>>(
    created_ms: u64,
    meta: &Meta,
    records: &[R],
) -> Vec<u8> {
    let meta_bytes = postcard::to_stdvec(meta).unwrap();
    let mut out = vec![VERSION_V1];
    out.extend_from_slice(&(records.len() as u32).to_le_bytes());
    out.extend_from_slice(&created_ms.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&(meta_bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(&meta_bytes);
    for r in records {
        let r = r.as_ref();
        out.extend_from_slice(&(r.len() as u32).to_le_bytes());
        out.extend_from_slice(r);
    }
    seal(&mut out);
    out
}

fn records_of(v: &[u8]) -> Vec<Vec<u8>> {
    decode(v).unwrap().area.to_records().unwrap()
}

#[test]
fn round_trip_as_lines() {
    let recs: Vec<&[u8]> = vec![b"{\"a\":1}", b"", b"line three"];
    let v = encode(1_700_000_000_000, &meta(2), &recs);
    let d = decode(&v).unwrap();
    assert_eq!(d.header.version, VERSION_AREA);
    assert_eq!(d.header.records, 3);
    assert_eq!(d.header.created_ms, 1_700_000_000_000);
    assert_eq!(d.header.file_len, None);
    assert_eq!((d.attempts, d.last_failed_ms, d.offset), (2, 42, 5));
    assert_eq!(d.last_error.as_deref(), Some("503 from upstream"));
    // Lines: the area is the NDJSON body as it is.
    assert_eq!(
        (d.area.codec, d.area.framing),
        (Codec::None, Framing::Lines)
    );
    assert_eq!(d.area.bytes, b"{\"a\":1}\n\nline three\n");
    assert_eq!(records_of(&v), recs);
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
    assert_eq!(records_of(&v2), recs);
    assert_eq!(
        size(&v),
        Size {
            records: 3,
            bytes: v.len() as u64,
            raw: v.len() as u64
        }
    );
}

#[test]
fn a_record_with_a_newline_is_framed_by_lengths() {
    let recs: Vec<&[u8]> = vec![b"one", b"two\nlines", b""];
    let v = encode(7, &meta(0), &recs);
    let d = decode(&v).unwrap();
    assert_eq!(d.area.framing, Framing::Lengths);
    assert_eq!(records_of(&v), recs);
    let c = encode_area(
        7,
        &meta(0),
        &frame(&recs).0,
        Framing::Lengths,
        3,
        Codec::Zstd,
    );
    assert_eq!(records_of(&c), recs, "compressed or not");
}

#[test]
fn compressed_jobs_round_trip_and_count_raw_bytes() {
    let recs: Vec<Vec<u8>> = (0..500)
        .map(|i| format!("{{\"seq\":{i},\"msg\":\"{}\"}}", "x".repeat(150)).into_bytes())
        .collect();
    let (plain, framing) = frame(&recs);
    let v = encode_area(9, &meta(1), &plain, framing, 500, Codec::Zstd);
    let d = decode(&v).unwrap();
    assert_eq!(d.area.codec, Codec::Zstd);
    assert_eq!(d.area.plain_len, plain.len() as u64);
    assert!(
        v.len() < plain.len() / 10,
        "{} of {} bytes",
        v.len(),
        plain.len()
    );
    assert_eq!(d.area.plain().unwrap().as_ref(), plain.as_slice());
    assert_eq!(records_of(&v), recs);
    let s = size(&v);
    assert_eq!((s.records, s.bytes), (500, v.len() as u64));
    let plain_job = encode_area(9, &meta(1), &plain, framing, 500, Codec::None);
    assert_eq!(
        s.raw,
        plain_job.len() as u64,
        "raw is what the job takes uncompressed"
    );
    // A new attempt keeps the compressed area as it is (no recompression).
    let again = with_meta(&v, |d| Meta::V2 {
        attempts: d.attempts + 1,
        last_error: Some("503".into()),
        last_failed_ms: 1,
        offset: d.offset,
    })
    .unwrap();
    assert_eq!(decode(&again).unwrap().area.bytes, d.area.bytes);
    // Incompressible records are stored as they are.
    let mut rng = fastrand::Rng::with_seed(3);
    let noise: Vec<Vec<u8>> = (0..20)
        .map(|_| (0..64).map(|_| rng.u8(..)).collect())
        .collect();
    let (plain, framing) = frame(&noise);
    let v = encode_area(9, &meta(0), &plain, framing, 20, Codec::Zstd);
    assert_eq!(decode(&v).unwrap().area.codec, Codec::None);
}

/// Values written before this version stay readable: version 1 with either metadata variant.
#[test]
fn version_1_values_decode() {
    let old = Meta::V1 {
        attempts: 4,
        last_error: Some("timeout".into()),
        last_failed_ms: 9,
    };
    let v = encode_v1(7, &old, &[b"x".as_slice(), b"{\"y\":2}"]);
    let d = decode(&v).unwrap();
    assert_eq!(d.header.version, VERSION_V1);
    assert_eq!(
        (
            d.attempts,
            d.last_error.as_deref(),
            d.last_failed_ms,
            d.offset
        ),
        (4, Some("timeout"), 9, 0)
    );
    assert_eq!(records_of(&v), [b"x".to_vec(), b"{\"y\":2}".to_vec()]);
    assert_eq!(
        size(&v),
        Size {
            records: 2,
            bytes: v.len() as u64,
            raw: v.len() as u64
        }
    );
    let v = encode_v1(7, &meta(3), &[b"a".as_slice()]);
    assert_eq!(decode(&v).unwrap().offset, 5);
    // Re-encoded (a failed attempt), it becomes version 3 with the same records.
    let again = with_meta(&v, |d| d.meta()).unwrap();
    assert_eq!(again[0], VERSION_AREA);
    assert_eq!(records_of(&again), [b"a".to_vec()]);
    assert_eq!(decode(&again).unwrap().offset, 5);
}

/// A salvaged job's origin survives decoding and re-encoding (a failed attempt rewrites the
/// metadata); a job without one is written as V2, byte for byte what the release before wrote.
#[test]
fn a_salvaged_jobs_origin_round_trips_and_other_jobs_stay_v2() {
    let origin = Origin {
        store: 0xabc,
        job: 77,
        stream: None,
    };
    let m = Meta::new(2, Some("503".into()), 9, 3, Some(origin.clone()));
    assert!(matches!(m, Meta::V3 { .. }));
    let v = encode(1, &m, &[b"a".as_slice(), b"b"]);
    let d = decode(&v).unwrap();
    assert_eq!(
        (d.origin.clone(), d.offset, d.attempts),
        (Some(origin.clone()), 3, 2)
    );
    assert_eq!(d.meta(), m);
    let again = with_meta(&v, |d| {
        Meta::new(d.attempts + 1, None, 10, d.offset, d.origin.clone())
    })
    .unwrap();
    assert_eq!(decode(&again).unwrap().origin, Some(origin));
    let plain = Meta::new(2, Some("503".into()), 9, 3, None);
    assert_eq!(
        plain,
        Meta::V2 {
            attempts: 2,
            last_error: Some("503".into()),
            last_failed_ms: 9,
            offset: 3
        }
    );
    assert_eq!(decode(&encode(1, &plain, &[b"a"])).unwrap().origin, None);
}

/// A moved job's origin names its stream too (V4), and survives a re-encode; V3's bytes, which
/// earlier releases read, are unchanged by the variant after them.
#[test]
fn a_moved_jobs_origin_round_trips_as_v4() {
    let origin = Origin {
        store: 0xabc,
        job: 77,
        stream: Some("metrics".into()),
    };
    let m = Meta::new(0, None, 0, 2, Some(origin.clone()));
    assert!(matches!(m, Meta::V4 { .. }));
    let v = encode(1, &m, &[b"a".as_slice()]);
    assert_eq!(decode(&v).unwrap().origin, Some(origin.clone()));
    let again = with_meta(&v, |d| {
        Meta::new(
            d.attempts + 1,
            Some("x".into()),
            5,
            d.offset,
            d.origin.clone(),
        )
    })
    .unwrap();
    let d = decode(&again).unwrap();
    assert_eq!((d.origin, d.offset, d.attempts), (Some(origin), 2, 1));
    let v3 = Meta::V3 {
        attempts: 1,
        last_error: None,
        last_failed_ms: 0,
        offset: 0,
        origin: StoreJob { store: 1, job: 2 },
    };
    // Variant index 2, then the fields as V3 always had them.
    assert_eq!(postcard::to_stdvec(&v3).unwrap(), [2, 1, 0, 0, 0, 1, 2]);
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
    assert_eq!(file_ref(file_record(&d.area)).unwrap(), file());
    assert_eq!(stored_len(&v), v.len() as u64 + (50 << 20));
    assert_eq!(size(&v).raw, size(&v).bytes);
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
    assert_eq!(file_ref(file_record(&d2.area)).unwrap(), file());
    for i in 0..v.len() {
        let mut c = v.clone();
        c[i] ^= 0x10;
        assert!(decode(&c).is_err(), "byte {i} flipped and still decoded");
    }
    for n in 0..v.len() {
        assert!(decode(&v[..n]).is_err(), "a {n}-byte prefix decoded");
    }
}

fn samples() -> Vec<Vec<u8>> {
    let recs = [b"hello".as_slice(), b"world"];
    let long: Vec<Vec<u8>> = (0..50)
        .map(|i| format!("{{\"n\":{i},\"pad\":\"aaaaaaaaaaaaaaaa\"}}").into_bytes())
        .collect();
    let (plain, framing) = frame(&long);
    vec![
        encode(7, &meta(0), &recs),
        encode_v1(7, &meta(0), &recs),
        encode(7, &meta(0), &[b"a\nb".as_slice()]),
        encode_area(7, &meta(0), &plain, framing, 50, Codec::Zstd),
    ]
}

#[test]
fn every_flipped_bit_is_detected() {
    for v in samples() {
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
}

#[test]
fn truncations_never_panic() {
    for v in samples() {
        for n in 0..v.len() {
            assert!(decode(&v[..n]).is_err(), "a {n}-byte prefix decoded");
        }
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
        if n > 0 {
            b[0] = rng.u8(1..4);
        }
        let _ = size(&b);
        let _ = decode(&b);
    }
}

/// Random bytes almost never pass the checksum, so the test above never reaches the metadata,
/// record or decompression code. Here valid jobs (every version, either metadata variant,
/// offsets up to u32::MAX, compressed or not) get a few bytes changed and their checksum
/// fixed, so the parsers see input close to real.
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
            .map(|_| vec![rng.u8(..); rng.usize(0..40)])
            .collect();
        let mut b = match rng.u8(0..4) {
            0 => encode_file(rng.u64(..), &meta, &file(), rng.u64(..)),
            1 => encode_v1(rng.u64(..), &meta, &records),
            2 => {
                let (plain, framing) = frame(&records);
                encode_area(
                    rng.u64(..),
                    &meta,
                    &plain,
                    framing,
                    records.len() as u32,
                    Codec::Zstd,
                )
            }
            _ => encode(rng.u64(..), &meta, &records),
        };
        for _ in 0..rng.usize(0..3) {
            let at = rng.usize(1..b.len());
            b[at] = rng.u8(..);
        }
        seal(&mut b);
        let _ = size(&b);
        match decode(&b) {
            Ok(d) => {
                decoded += 1;
                assert!(d.offset.checked_add(d.header.records).is_some());
                let _ = d.area.to_records();
                let again = reencode(&d, &d.meta());
                let d2 = decode(&again).expect("a decoded job re-encodes");
                assert_eq!(d2.area, d.area, "re-encodes its area unchanged");
                assert_eq!(d2.meta(), d.meta());
            }
            Err(_) => refused += 1,
        }
    }
    assert!(
        decoded > 1000 && refused > 1000,
        "{decoded} decoded, {refused} refused"
    );
}
