//! A source's checkpoint: for every file it follows, the file's identity and the offset up to which
//! its lines are in the stream. Stored by the store under the source's name, in the same transaction
//! as the records read up to those offsets.
//!
//! Bytes: a version byte (1), then postcard of [`Checkpoint`]. An entry identifies its file by
//! device and inode plus two fingerprints (FNV-1a 64): of the file's first `fp_len` bytes (up to
//! 256), and of the up to 256 bytes just before `offset` (`tail`). A file whose inode was reused, or
//! that was truncated and written again, fails them and is read from its start; a copy of a file
//! (copy-truncate rotation) passes them and is read from `offset`.

use serde::{Deserialize, Serialize};

pub const VERSION: u8 = 1;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub files: Vec<Entry>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The path the file had when colibri first saw it (raw bytes of the OS path).
    pub path: Vec<u8>,
    pub dev: u64,
    pub ino: u64,
    /// How many of the file's first bytes `fp` covers (fewer than 256 while the file was shorter).
    pub fp_len: u16,
    pub fp: u64,
    /// Lines before this byte offset are in the stream (or were filtered out).
    pub offset: u64,
    /// The fingerprint of the bytes `[offset - min(offset, 256), offset)`.
    pub tail: u64,
    /// `offset` lies inside a line longer than `max_line_bytes` whose start was already emitted:
    /// the rest of that line is skipped.
    pub skipping: bool,
}

pub fn encode(cp: &Checkpoint) -> Vec<u8> {
    let mut out = vec![VERSION];
    out.extend(postcard::to_stdvec(cp).expect("postcard encodes plain structs into a Vec"));
    out
}

pub fn decode(bytes: &[u8]) -> Result<Checkpoint, String> {
    match bytes.split_first() {
        Some((&VERSION, rest)) => postcard::from_bytes(rest).map_err(|e| format!("{e}")),
        Some((v, _)) => Err(format!("unknown checkpoint version {v}")),
        None => Err("empty checkpoint".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoints_round_trip_and_bad_bytes_are_errors() {
        let cp = Checkpoint {
            files: vec![Entry {
                path: b"/var/log/a\xff.log".to_vec(),
                dev: 2049,
                ino: u64::MAX,
                fp_len: 256,
                fp: 0x0123_4567_89ab_cdef,
                offset: 1 << 40,
                tail: 7,
                skipping: true,
            }],
        };
        let bytes = encode(&cp);
        assert_eq!(bytes[0], VERSION);
        assert_eq!(decode(&bytes).unwrap(), cp);
        assert_eq!(
            decode(&encode(&Checkpoint::default())).unwrap(),
            Checkpoint::default()
        );
        assert!(decode(&[]).is_err());
        assert!(decode(&[9, 0]).unwrap_err().contains("version 9"));
        assert!(decode(&bytes[..bytes.len() - 3]).is_err());
        // Never panics on arbitrary bytes.
        let mut rng = fastrand::Rng::with_seed(5);
        for _ in 0..2000 {
            let n = rng.usize(0..64);
            let mut v: Vec<u8> = (0..n).map(|_| rng.u8(..)).collect();
            if !v.is_empty() && rng.bool() {
                v[0] = VERSION;
            }
            let _ = decode(&v);
        }
    }
}
