//! Fuzzes the stored-job decoder: any bytes decode to a job or an error, never a panic; a job that
//! decodes survives a re-encode with its records and metadata unchanged, and its records (a
//! compressed area decompressed) are read without a panic. Run: `cargo +nightly fuzz run job_decode`.
#![no_main]

use colibri::store::format;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = format::header(data);
    let _ = format::size(data);
    if let Ok(job) = format::decode(data) {
        let _ = job.area.to_records();
        let again = format::reencode(&job, &job.meta());
        let d = format::decode(&again).expect("a decoded job re-encodes");
        assert_eq!(d.area, job.area, "a decoded job keeps its area");
        assert_eq!(d.meta(), job.meta(), "and its metadata");
    }
});
