//! Fuzzes the config loader: any bytes, any environment lookups, never a panic; either a config or
//! a list of problems. Run: `cargo +nightly fuzz run config` from the repository root.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let lookup = |name: &str| (name.len() % 2 == 0).then(|| name.to_lowercase());
        let _ = colibri::config::load_str(text, std::path::Path::new("/fuzz/colibri.yaml"), &lookup);
    }
});
