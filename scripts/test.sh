#!/usr/bin/env bash
# Installs what colibri's tests need (Debian packages, when missing) and runs every check CI runs:
# formatting, clippy, unit tests and integration tests against the real binary, then the binary as
# shipped: the static release build, the Debian package and the deployment files (deploy/).
# Usage: scripts/test.sh            (from anywhere; needs Rust stable with rustfmt and clippy)
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the tests use, as "command:package" pairs. Installed only when the command is missing.
APT_NEEDS=(
  "sh:dash"
  "sleep:coreutils"
  "date:coreutils"
  "victoria-metrics:victoria-metrics"   # tests/it/tsdb.rs, remote_write.rs: scrapes delivered to a real time-series database
  "prometheus:prometheus"               # tests/it/remote_write.rs: a real remote write receiver
  "/usr/sbin/mosquitto:mosquitto"       # tests/it/mqtt{,_source}.rs, benches/{brokers,mqtt_source}.rs: a real MQTT broker (and mosquitto_passwd)
  "mosquitto_sub:mosquitto-clients"     # tests/it/mqtt.rs: the subscriber that counts what arrives; mqtt_source.rs: mosquitto_pub
  "/usr/sbin/nats-server:nats-server"   # tests/it/nats.rs, benches/brokers.rs: a real NATS JetStream cluster
  "/usr/sbin/rsyslogd:rsyslog"          # tests/it/syslog.rs: a real rsyslog forwarding over TCP with octet counting
  "logger:bsdutils"                     # tests/it/syslog.rs: util-linux logger, the senders over UDP and TCP
  "mount:mount"                         # tests/it/file_move.rs: a tmpfs for the cross-filesystem test (as root)
  "file:file"                           # the release binary is checked to be statically linked
  "dpkg-deb:dpkg"                       # scripts/package.sh: builds and inspects the .deb
  "cmp:diffutils"                       # scripts/package.sh: packaged files against their sources
  "lintian:lintian"                     # scripts/package.sh: Debian's checks of the .deb (no E: or W:)
  "dpkg-parsechangelog:dpkg-dev"        # scripts/package.sh: the changelog's version is the package's
  "groff:groff-base"                    # tests/it/man.rs: the generated man pages format without warnings
  "systemd-analyze:systemd"             # scripts/check-deploy.sh: verify the unit (no running systemd needed)
  "python3:python3"                     # scripts/check-deploy.sh: the Grafana dashboard's JSON and queries
  "tmux:tmux"                           # tests/it/live.rs: colibri top in a terminal, read with capture-pane
  "socat:socat"                         # tests/it/kafka.rs: TLS (and mutual TLS) in front of the Kafka broker
)
missing=()
for pair in "${APT_NEEDS[@]}"; do
  cmd="${pair%%:*}" pkg="${pair##*:}"
  command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
done
# Named time zones are read from the system's tz database (the schedule and zone tests use it).
[[ -e /usr/share/zoneinfo/Europe/Berlin ]] || missing+=("tzdata")
# tests/it/operate.rs parses /metrics with the reference Prometheus text parser (Debian's python3).
/usr/bin/python3 -c 'import prometheus_client.parser' >/dev/null 2>&1 || missing+=("python3-prometheus-client")
# The venv below needs Debian's venv module (python3-venv) for Debian's python3.
/usr/bin/python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=("python3-venv")
if ((${#missing[@]})); then
  echo "==> installing Debian packages: ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# tests/it/modbus.rs: a Modbus TCP device from PyPI's pymodbus; tests/it/opcua.rs: an OPC UA server
# from PyPI's asyncua; tests/it/sparkplug.rs: a Sparkplug B host on PyPI's pysparkplug. All in a venv of its own under target/ (Debian's python3 refuses pip
# installs into the system, PEP 668). The tests find it there, or through COLIBRI_TEST_PYTHON.
venv=target/test-venv
if ! "$venv/bin/python3" -c 'import pymodbus' >/dev/null 2>&1; then
  echo "==> installing pymodbus from PyPI into $venv"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check pymodbus==3.16.1   # the version tests/fixtures/modbus_device.py is written for
fi
if ! "$venv/bin/python3" -c 'import asyncua' >/dev/null 2>&1; then
  echo "==> installing asyncua from PyPI into $venv"
  "$venv/bin/pip" install -q --disable-pip-version-check asyncua==2.1.0   # the version tests/fixtures/opcua_server.py is written for (and patches)
fi
if ! "$venv/bin/python3" -c 'import pysparkplug' >/dev/null 2>&1; then
  echo "==> installing pysparkplug from PyPI into $venv"
  "$venv/bin/pip" install -q --disable-pip-version-check pysparkplug==0.6.1   # the version tests/fixtures/sparkplug_host.py is written for
fi
if ! "$venv/bin/python3" -c 'import kafka' >/dev/null 2>&1; then
  echo "==> installing kafka-python from PyPI into $venv"
  "$venv/bin/pip" install -q --disable-pip-version-check kafka-python==3.0.12   # the version tests/fixtures/kafka_client.py is written for
fi
export COLIBRI_TEST_PYTHON="$PWD/$venv/bin/python3"

# tests/it/kafka.rs, benches/brokers.rs: a Kafka-protocol broker that needs no JVM, tansu 0.6 from
# crates.io, with its in-memory (dynostore) and SQLite (libsql) storage engines (its default build
# has none). Building it takes ~11 minutes on 2 cores (optimised at level 1, which the tests'
# volumes do not notice), so it is built once into a cache outside the clone that later runs reuse:
# COLIBRI_TEST_CACHE, by default ~/.cache/colibri-test.
cache="${COLIBRI_TEST_CACHE:-$HOME/.cache/colibri-test}"
tansu="$cache/tansu-0.6.0/bin/tansu"
if [[ ! -x "$tansu" ]]; then
  echo "==> building tansu 0.6.0 from crates.io into $cache (once, ~11 minutes on 2 cores)"
  CARGO_PROFILE_RELEASE_OPT_LEVEL=1 CARGO_PROFILE_RELEASE_LTO=off CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
    CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_TARGET_DIR="$cache/tansu-build" \
    cargo install --locked --quiet tansu --version 0.6.0 --features dynostore,libsql --root "$cache/tansu-0.6.0"
  rm -rf "$cache/tansu-build"
fi
export COLIBRI_TEST_TANSU="$tansu"

echo "==> cargo fmt --check"
cargo fmt --all --check

echo "==> cargo clippy --all-targets -- -D warnings"
cargo clippy --locked --all-targets -- -D warnings
# The minimal build (no protocol beyond HTTP and files, no schema generator) must build clean too.
echo "==> cargo clippy --no-default-features --lib --bins -- -D warnings"
cargo clippy --locked --no-default-features --lib --bins -- -D warnings

echo "==> cargo test"
test_log="$(mktemp)"
# One closing line for the whole run, however it ends after this point (a failed test or a failed
# step below included), from cargo's "test result:" lines (its last block is the doc-tests,
# usually empty); the script's exit status stays what it was.
counts() {
  awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed;?$/) p += $(i-1); if ($i ~ /^failed;?$/) f += $(i-1); if ($i ~ /^ignored;?$/) s += $(i-1) } }
       END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, s }' "$test_log"
}
trap 'rc=$?; counts; rm -f "$test_log"; exit "$rc"' EXIT
# Not stopped by `set -e` here: a failure must say what it leaves unchecked. With pipefail the
# pipeline's status is cargo's (tee's is 0).
test_rc=0
cargo test --locked 2>&1 | tee "$test_log" || test_rc=$?
if ((test_rc != 0)); then
  echo "error: cargo test failed (exit $test_rc); not run: the fuzz targets, the static build (scripts/build-static.sh), the package (scripts/package.sh) and the deploy checks (scripts/check-deploy.sh)" >&2
  exit "$test_rc"
fi

# Fuzz targets: built with cargo-fuzz on nightly (the project's toolchain machines carry one) and
# run briefly, so a decoder or config-loader panic fails the build. cargo-fuzz comes from crates.io.
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  if ! command -v cargo-fuzz >/dev/null 2>&1; then
    echo "==> installing cargo-fuzz"
    cargo install --locked cargo-fuzz
  fi
  for target in job_decode config prometheus lineproto salvage; do
    echo "==> cargo +nightly fuzz run $target (20 s)"
    cargo +nightly fuzz run "$target" -- -max_total_time=20 -print_final_stats=0
  done
else
  echo "==> no nightly toolchain: building the fuzz targets on stable, uninstrumented"
  CARGO_TARGET_DIR=target cargo build --locked --manifest-path fuzz/Cargo.toml --bins
fi

# The binary as shipped (a fat-LTO release build into its own target dir: ~3.5 minutes on 2 cores),
# its Debian package and the deployment files that go with it.
echo "==> scripts/build-static.sh target/static"
scripts/build-static.sh target/static
static_bin=target/static/x86_64-unknown-linux-gnu/release/colibri
if [[ -x scripts/release.sh ]]; then
  scripts/release.sh --check target/static
else
  # Until scripts/release.sh carries the release checks: static, runs, within its size budget.
  echo "==> checking $static_bin"
  file -b "$static_bin" | grep -q 'statically linked' \
    || { echo "error: $static_bin is not statically linked: $(file -b "$static_bin")" >&2; exit 1; }
  "$static_bin" version
  size="$(stat -c %s "$static_bin")"
  budget=16850000  # bytes, stripped, with every protocol (scripts/release.sh says why not 10 MB)
  echo "static binary: $size bytes (budget $budget)"
  ((size <= budget)) || { echo "error: $static_bin is $size bytes, over the $budget-byte budget" >&2; exit 1; }
fi
# The minimal binary (HTTP and files only) is built and checked against its own budget as well.
echo "==> COLIBRI_FEATURES= scripts/build-static.sh target/static-min"
COLIBRI_FEATURES= scripts/build-static.sh target/static-min
scripts/release.sh --check-minimal target/static-min
# cargo-deb from crates.io (~40 s to build here), like cargo-fuzz above; pinned: its asset and
# maintainer-script handling is what scripts/package.sh checks.
if ! command -v cargo-deb >/dev/null 2>&1; then
  echo "==> installing cargo-deb"
  cargo install --locked cargo-deb --version 3.8.0   # the version scripts/package.sh was written against
fi
echo "==> scripts/package.sh target/static"
scripts/package.sh target/static
echo "==> scripts/check-deploy.sh $static_bin"
scripts/check-deploy.sh "$static_bin"

# The counts line is written by the EXIT trap above.
