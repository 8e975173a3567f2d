#!/usr/bin/env bash
# Installs what colibri's tests need (Debian packages, when missing) and runs every check CI runs:
# formatting, clippy, unit tests and integration tests against the real binary.
# Usage: scripts/test.sh            (from anywhere; needs Rust stable with rustfmt and clippy)
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the tests use, as "command:package" pairs. Installed only when the command is missing.
APT_NEEDS=(
  "sh:dash"
  "sleep:coreutils"
  "date:coreutils"
)
missing=()
for pair in "${APT_NEEDS[@]}"; do
  cmd="${pair%%:*}" pkg="${pair##*:}"
  command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "==> installing Debian packages: ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

echo "==> cargo fmt --check"
cargo fmt --all --check

echo "==> cargo clippy --all-targets -- -D warnings"
cargo clippy --locked --all-targets -- -D warnings

echo "==> cargo test"
cargo test --locked

echo "==> fuzz targets compile (cargo check of fuzz/)"
CARGO_TARGET_DIR=target cargo check --locked --manifest-path fuzz/Cargo.toml --bins
