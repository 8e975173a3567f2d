//! Fuzzes the salvager's walk of a damaged store file: any bytes, read as a file through the
//! in-memory source, give a result (jobs, checkpoints, counts) or an error, never a panic; every
//! job it reports lies inside the bytes and decodes. Run: `cargo +nightly fuzz run salvage`.
#![no_main]

use colibri::store::format;
use colibri::store::salvage::scan;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // One stream (unattributed leaves fall back to it) and two (they cannot).
    for streams in [&["a"][..], &["a", "b"][..]] {
        let found = scan(data, streams).expect("reading memory never fails");
        for j in &found.jobs {
            let at = usize::try_from(j.at).expect("an offset in memory");
            let v = data.get(at..at + j.len).expect("a job lies inside the file");
            assert!(format::decode(v).is_ok(), "a salvaged job decodes");
        }
    }
});
