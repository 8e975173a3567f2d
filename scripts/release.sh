#!/usr/bin/env bash
# Release builds of colibri: the static x86_64 binary (glibc static, not PIE, stripped, size-optimised;
# see scripts/build-static.sh and BENCHMARKS.md) and, where rustup can add the target and Debian's
# cross compiler is installed, a static aarch64 one. Each is checked: statically linked, runs
# `colibri version` (the aarch64 one under qemu-user when it is installed), within the size budget.
#
# Usage:
#   scripts/release.sh [target-dir]           build both (aarch64 when possible), check, copy to dist/
#   scripts/release.sh --check [target-dir]   only check the x86_64 binary already built there (CI)
#   scripts/release.sh --check-minimal [dir]  the same for the minimal binary (`COLIBRI_FEATURES=
#                                             scripts/build-static.sh DIR`), against its own budget
# target-dir defaults to target/static. Needs for aarch64: `rustup target add
# aarch64-unknown-linux-gnu` and Debian's gcc-aarch64-linux-gnu + libc6-dev-arm64-cross
# (qemu-user-static to run it); without them the aarch64 build is skipped with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."

check_only=false
minimal=false
if [[ "${1:-}" == "--check" ]]; then
  check_only=true
  shift
elif [[ "${1:-}" == "--check-minimal" ]]; then
  check_only=true
  minimal=true
  shift
fi
target_dir=${1:-target/static}
# Bytes, stripped (BENCHMARKS.md has the history): the release build has every upstream protocol
# (the `protocols` feature). DESIGN.md's 10 MB was passed by the NATS client (+1.6 MB); as issue 18
# says for that case, each sink is a cargo feature the release build includes, and the minimal
# build (`COLIBRI_FEATURES= scripts/build-static.sh`, HTTP and files) has an 8 MB budget, which
# it passed with TLS on its listeners and the operator's commands (8.55 MB: BENCHMARKS.md). This
# caps what the protocols may add from here (10.5 MB until MQTT 3.1.1's client added 253 KB, 10.6
# until the modbus task's client added 196 KB, 10.75 until the syslog source's parser added 143 KB,
# 10.9 until TLS on its listener added rustls' server side, 152 KB, which the ingest and admin
# listeners will share; 11.1 until the mqtt source added 134 KB; 11.2 until the operator's view,
# `colibri top`, `tap`, `task` and the live queue operations, added about 330 KB: crossterm, the
# admin client and the views, all in the one binary as a user expects; 11.55 until issue 31's
# hardening added 138 KB: connection slots shared with the syslog listener, the UDP drop count and
# receive buffer, `check --bind`, every problem of an entry read again, `top` across a restart, the
# admin client's TLS diagnosis, plain HTTP refused on TLS ports; not yet attributed part by part;
# 11.7 until issue 33's replay order added 40 KB: the live and backlog lanes, stream priorities and
# their gate, max_age, the replayed marker, the lane latency and the delivered tap's lane; 11.8
# until issue 33's archive moves and issue 34's report by exception and grouped requests added
# about 100 KB together, in every build: the filter and its per-series state, the deadband
# entries of two tasks, the values counters, a request of several jobs and its key; 11.9 until
# issue 34's held clock and downsampling added 94 KB, in every build: the clock's watch and the
# correction of held jobs, `Meta::V5`, the aggregator and the store's rewrite; 12.0 until issue
# 35's opcua source added 3.19 MB, in the release build only: async-opcua, the one maintained
# pure-Rust OPC UA stack (its predecessor, locka99/opcua, is archived), whose generated codecs for
# OPC UA's type system are most of it, with the RSA, AES and X.509 its security policies need, and
# a YAML crate for its config files; its crates are built at opt-level "z" (-232 KB); 15.2 until
# issue 36's Sparkplug B added 84 KB: 55 KB the `sparkplug` feature (the payload's protobuf codec,
# the edge node's session, the registry of devices and aliases), 28 KB in every build with mqtt
# (the encoding's settings, messages received on the sink's connection); 15.3 until issue 37's
# kafka sink added 1.54 MB, in the release build only: krafka, the one maintained pure-Rust Kafka
# client with an idempotent producer (rskafka has none; rdkafka is librdkafka in C), whose
# protocol layer, producer engine, SCRAM and codecs come with it, with webpki-roots it always
# links; built at opt-level "z" (-100 KB, the drain's CPU unchanged). BENCHMARKS.md has the split.
budget=16850000
# The minimal build (HTTP and files, no other protocol): 8 MB was set before every build carried
# TLS on its listeners (rustls' server side) and the operator's commands (`top`, `tap`, `task`, the
# admin client and crossterm), which a user expects of any colibri, and issue 31's hardening
# (8.55 MB, then 8,648,880 bytes). Putting those behind features would take them from the builds
# that need them most (a small box is run by an operator too). This caps what the core may add
# (8.7 MB until issue 33's replay order, in every build, added 41 KB: 8,704,464 bytes; 8.8 MB
# until issue 34's report by exception and grouped requests, core code too: 8,814,576 bytes; 8.9
# MB until its held clock and downsampling, core code too: 8,902,736 bytes).
if $minimal; then
  budget=9000000
fi

check() { # <binary> <arch label> [runner...]
  local bin=$1 arch=$2
  shift 2
  [[ -x "$bin" ]] || { echo "error: $bin does not exist (build it first)" >&2; exit 1; }
  local kind
  kind=$(file -b "$bin")
  [[ "$kind" == *"statically linked"* ]] \
    || { echo "error: $bin ($arch) is not statically linked: $kind" >&2; exit 1; }
  local size
  size=$(stat -c %s "$bin")
  if (($# > 0)) || [[ "$arch" == x86_64 ]]; then
    local v
    v=$("$@" "$bin" version) || { echo "error: $bin ($arch) does not run" >&2; exit 1; }
    echo "$arch: $v"
  else
    echo "$arch: not run (no qemu-aarch64-static)"
  fi
  echo "$arch: $size bytes, static (budget $budget)"
  ((size <= budget)) || { echo "error: $bin ($arch) is $size bytes, over the $budget-byte budget" >&2; exit 1; }
}

x86="$target_dir/x86_64-unknown-linux-gnu/release/colibri"
if $check_only; then
  check "$x86" x86_64
  exit 0
fi

scripts/build-static.sh "$target_dir" >/dev/null
check "$x86" x86_64
mkdir -p dist
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
cp "$x86" "dist/colibri-$version-x86_64-linux"

arm_target=aarch64-unknown-linux-gnu
if ! rustup target list --installed 2>/dev/null | grep -qx "$arm_target"; then
  rustup target add "$arm_target" >/dev/null 2>&1 || true
fi
if ! rustup target list --installed 2>/dev/null | grep -qx "$arm_target"; then
  echo "aarch64: skipped (rustup cannot add $arm_target here)"
elif ! command -v aarch64-linux-gnu-gcc >/dev/null 2>&1; then
  echo "aarch64: skipped (no aarch64-linux-gnu-gcc: apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross)"
else
  # The same flags as the x86_64 build; ring's C and assembly are built by the cross compiler.
  CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc \
  CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
  RUSTFLAGS="-C target-feature=+crt-static -C relocation-model=static" \
    cargo build --release --locked --no-default-features --features protocols --target "$arm_target" --target-dir "$target_dir"
  arm="$target_dir/$arm_target/release/colibri"
  if command -v qemu-aarch64-static >/dev/null 2>&1; then
    check "$arm" aarch64 qemu-aarch64-static
  else
    check "$arm" aarch64
  fi
  cp "$arm" "dist/colibri-$version-aarch64-linux"
fi
ls -l dist/
