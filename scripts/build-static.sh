#!/bin/sh
# Builds the release binary as shipped: statically linked (glibc static, DNS still works), not
# position-independent, optimised for size, without the schema generator (the committed schema is
# embedded instead). Not static-pie: a static-pie binary applies ~38,000
# relocations at every start, which dirties 1.2 MB of pages in every process (idle RSS 6.3 MB against
# 4.7 MB) and carries 0.9 MB of relocation entries; see BENCHMARKS.md.
# Every upstream protocol is in (the `protocols` feature); COLIBRI_FEATURES= (empty) builds the
# minimal binary, HTTP and files only (its budget and the release build's: scripts/release.sh).
# Usage: scripts/build-static.sh [target-dir]   (prints the binary's path and size)
set -eu
cd "$(dirname "$0")/.."
target_dir=${1:-target/static}
features=${COLIBRI_FEATURES-protocols}
RUSTFLAGS="-C target-feature=+crt-static -C relocation-model=static" \
    cargo build --release --locked --no-default-features --features "$features" --target x86_64-unknown-linux-gnu --target-dir "$target_dir"
bin="$target_dir/x86_64-unknown-linux-gnu/release/colibri"
ls -l "$bin" | awk '{print $5 " bytes"}'
echo "$bin"
