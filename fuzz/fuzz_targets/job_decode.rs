//! Fuzzes the stored-job decoder: any bytes decode to a job or an error, never a panic, and a job
//! that decodes survives a re-encode unchanged. Run: `cargo +nightly fuzz run job_decode`.
#![no_main]

use colibri::store::format;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = format::header(data);
    if let Ok(job) = format::decode(data) {
        let again = format::reencode(&job, &job.meta());
        assert_eq!(
            format::decode(&again).as_ref(),
            Ok(&job),
            "a decoded job survives a re-encode"
        );
    }
});
