#!/usr/bin/env bash
# Builds the Debian package (cargo-deb, [package.metadata.deb] in Cargo.toml) from the static binary
# that scripts/build-static.sh already built, packaged as it is (no rebuild, no strip), then checks
# the .deb: its files, modes, control fields, conffiles and maintainer scripts, runs the packaged
# binary on the packaged config, and runs lintian: any error or warning it reports fails, except the
# ones deploy/debian/lintian-overrides keeps (each with its reason).
# Usage: scripts/package.sh [static-target-dir]   (default target/static: the dir given to
#        scripts/build-static.sh, and like there a relative path is read from the repository root;
#        the .deb goes to <dir>/debian/). Prints the package's path and size.
# Needs cargo-deb (`cargo install --locked cargo-deb`), dpkg-deb and lintian.
set -euo pipefail

die() { echo "package: $*" >&2; exit 1; }

cd "$(dirname "$0")/.."
target_dir="${1:-target/static}"
[[ -d $target_dir ]] || die "$target_dir: no such directory (run scripts/build-static.sh $target_dir first)"
target_dir="$(realpath "$target_dir")"

triple=x86_64-unknown-linux-gnu
bin="$target_dir/$triple/release/colibri"
[[ -x $bin ]] || die "$bin: missing (run scripts/build-static.sh ${1:-target/static} first)"
command -v cargo-deb >/dev/null 2>&1 || die "cargo-deb not found: cargo install --locked cargo-deb"
command -v dpkg-deb >/dev/null 2>&1 || die "dpkg-deb not found: apt-get install dpkg"
command -v lintian >/dev/null 2>&1 || die "lintian not found: apt-get install lintian"

# The package ships the static binary; a dynamically linked one would need Depends on libc6.
if command -v file >/dev/null 2>&1; then
  file -b "$bin" | grep -q 'statically linked' || die "$bin is not statically linked: $(file -b "$bin")"
fi

out_dir="$target_dir/debian"
rm -rf "$out_dir"
mkdir -p "$out_dir"
echo "==> cargo deb --no-build --no-strip --target $triple (CARGO_TARGET_DIR=$target_dir)"
# cargo-deb finds the binary as <CARGO_TARGET_DIR>/<triple>/release/colibri (the asset is written
# target/release/colibri in Cargo.toml). --no-strip: build-static.sh's binary is already stripped
# and must be packaged byte for byte.
CARGO_TARGET_DIR="$target_dir" cargo deb --no-build --no-strip --locked --target "$triple" \
  --output "$out_dir/" >"$out_dir/cargo-deb.log" 2>&1 \
  || { cat "$out_dir/cargo-deb.log" >&2; die "cargo deb failed (output above)"; }
debs=("$out_dir"/*.deb)
[[ ${#debs[@]} -eq 1 && -f ${debs[0]} ]] || die "expected one .deb in $out_dir, found: ${debs[*]}"
deb="${debs[0]}"

problems=()
fail() { problems+=("$*"); }

# --- files, at their paths, with their modes (dpkg-deb -c) --------------------------------------
listing="$(dpkg-deb -c "$deb")"
expect_file() { # path mode
  local line
  line="$(awk -v p="./$1" '$6 == p { print }' <<<"$listing")"
  if [[ -z $line ]]; then
    fail "/$1 is not in the package"
  elif [[ ${line%% *} != "$2" ]]; then
    fail "/$1 has mode ${line%% *}, expected $2"
  fi
}
expect_file usr/bin/colibri                          -rwxr-xr-x
expect_file lib/systemd/system/colibri.service       -rw-r--r--
expect_file etc/colibri/colibri.yaml                 -rw-r-----
expect_file usr/share/colibri/colibri.schema.json    -rw-r--r--
expect_file usr/share/doc/colibri/README.md          -rw-r--r--
expect_file usr/share/doc/colibri/ARCHITECTURE.md    -rw-r--r--
expect_file usr/share/doc/colibri/copyright          -rw-r--r--
expect_file usr/share/doc/colibri/changelog.Debian.gz -rw-r--r--
expect_file usr/share/man/man1/colibri.1.gz          -rw-r--r--
expect_file usr/share/man/man5/colibri.yaml.5.gz     -rw-r--r--
expect_file usr/share/lintian/overrides/colibri      -rw-r--r--
# Files are owned by root in the package; postinst gives the config to group colibri.
if awk '$2 != "0/0"' <<<"$listing" | grep -q .; then
  fail "files not owned by root/root: $(awk '$2 != "0/0" { print $6 }' <<<"$listing" | tr '\n' ' ')"
fi

# --- control fields, conffiles, maintainer scripts (dpkg-deb -I / -e) ----------------------------
field() { dpkg-deb -f "$deb" "$1"; }
[[ $(field Package) == colibri ]] || fail "Package is '$(field Package)', expected colibri"
[[ $(field Architecture) == amd64 ]] || fail "Architecture is '$(field Architecture)', expected amd64"
bin_version="$("$bin" version | awk '{ print $2 }')"
[[ $(field Version) == "$bin_version"-* ]] \
  || fail "Version is '$(field Version)', expected $bin_version-<revision> (from '$bin version')"
# adduser: postinst creates the system user with it. Nothing else: the binary is static.
[[ $(field Depends) == adduser ]] || fail "Depends is '$(field Depends)', expected adduser (and nothing else)"
[[ -n $(field Maintainer) && -n $(field Description) ]] || fail "Maintainer or Description is empty"
# The changelog's newest entry is this package's version, by the same maintainer.
changelog_version="$(dpkg-parsechangelog -l deploy/debian/changelog -S Version 2>/dev/null || true)"
[[ $changelog_version == "$(field Version)" ]] \
  || fail "deploy/debian/changelog's newest entry is '$changelog_version', the package is '$(field Version)'"
[[ $(dpkg-parsechangelog -l deploy/debian/changelog -S Maintainer 2>/dev/null) == "$(field Maintainer)" ]] \
  || fail "deploy/debian/changelog's newest entry is not signed by the Maintainer ($(field Maintainer))"

ctl="$out_dir/control"
dpkg-deb -e "$deb" "$ctl"
grep -qx /etc/colibri/colibri.yaml "$ctl/conffiles" 2>/dev/null \
  || fail "conffiles does not list /etc/colibri/colibri.yaml"
for script in postinst prerm postrm; do
  if [[ ! -f $ctl/$script ]]; then
    fail "maintainer script $script is missing"
  elif [[ ! -x $ctl/$script ]]; then
    fail "maintainer script $script is not executable"
  elif ! sh -n "$ctl/$script"; then
    fail "maintainer script $script is not valid sh"
  elif grep -q '#DEBHELPER#' "$ctl/$script"; then
    fail "maintainer script $script still has a #DEBHELPER# token (nothing fills it in)"
  fi
done
expect_in() { # script, fixed string, what it is for
  grep -qF -- "$2" "$ctl/$1" 2>/dev/null || fail "$1 does not contain '$2' ($3)"
}
expect_in postinst 'adduser --system --group --home /var/lib/colibri --no-create-home' "creates the system user"
expect_in postinst 'install -d -m 0750 /var/lib/colibri' "creates the data directory"
expect_in postinst 'chown colibri:colibri /var/lib/colibri' "gives the data directory to the user"
expect_in postinst 'chgrp colibri /etc/colibri/colibri.yaml' "lets the service read its config"
expect_in postinst 'deb-systemd-helper enable colibri.service' "enables the unit"
# shellcheck disable=SC2016  # the literal text of the script
expect_in postinst 'deb-systemd-invoke "$action" colibri.service' "starts or restarts the unit"
expect_in prerm    'deb-systemd-invoke stop colibri.service' "stops the unit on remove"
expect_in postrm   'deb-systemd-helper purge colibri.service' "forgets the unit on purge"
expect_in postrm   'rm -rf /var/lib/colibri /var/log/colibri' "removes data and logs on purge"
expect_in postrm   'deluser --system' "removes the user on purge"
# remove must leave the data: the rm is inside the purge branch only.
if awk '/"\$1" = "purge"/ { p = 1 } /rm -rf \/var\/lib\/colibri/ && !p { bad = 1 } END { exit !bad }' "$ctl/postrm"; then
  fail "postrm removes /var/lib/colibri outside its purge branch"
fi

# --- the packaged files, extracted and run (dpkg-deb -x) ----------------------------------------
root="$out_dir/root"
dpkg-deb -x "$deb" "$root"
cmp -s "$root/usr/bin/colibri" "$bin" || fail "/usr/bin/colibri differs from $bin (stripped or rebuilt?)"
cmp -s "$root/lib/systemd/system/colibri.service" deploy/colibri.service \
  || fail "/lib/systemd/system/colibri.service differs from deploy/colibri.service"
cmp -s "$root/usr/share/colibri/colibri.schema.json" schemas/colibri.schema.json \
  || fail "/usr/share/colibri/colibri.schema.json differs from schemas/colibri.schema.json"
cmp -s "$root/usr/share/doc/colibri/copyright" deploy/debian/copyright \
  || fail "/usr/share/doc/colibri/copyright differs from deploy/debian/copyright"
for page in man1/colibri.1 man5/colibri.yaml.5; do
  gzip -dc "$root/usr/share/man/$page.gz" | cmp -s - "deploy/man/${page#*/}" \
    || fail "/usr/share/man/$page.gz is not deploy/man/${page#*/}"
done
if ! version_out="$("$root/usr/bin/colibri" version 2>&1)"; then
  fail "packaged 'colibri version' failed: $version_out"
fi
echo "==> packaged colibri version: $version_out"
echo "==> packaged colibri check --config /etc/colibri/colibri.yaml"
if ! "$root/usr/bin/colibri" check --config "$root/etc/colibri/colibri.yaml"; then
  fail "the packaged default config does not pass the packaged 'colibri check'"
fi
# The commented examples in the default config are meant to be uncommented: they must check too.
# Their directories (/srv/...) are made under a scratch root.
examples="$out_dir/examples"
mkdir -p "$examples/srv/outbox" "$examples/srv/scanner/out" "$examples/srv/archive"
sed -e '/^storage:/,$ { s/^#\([^ ]\)/\1/; s/^#\(  \)/\1/ }' -e "s#/srv/#$examples/srv/#g" \
  "$root/etc/colibri/colibri.yaml" > "$examples/colibri.yaml"
if ! err="$(UPLINK_TOKEN=t COLIBRI_INGEST_TOKEN=t COLIBRI_ADMIN_TOKEN=t \
    "$root/usr/bin/colibri" check --config "$examples/colibri.yaml" 2>&1)"; then
  fail "the default config's commented examples do not check once uncommented: $err"
else
  echo "==> the commented examples, uncommented: ok ($(grep -c '^  - name:' "$examples/colibri.yaml") tasks)"
fi

# --- lintian: Debian's checks. Errors and warnings fail; info lines are shown. -----------------
echo "==> lintian $deb"
# lintian warns when run as root (CI containers are root); that notice is not about the package.
if ! lintian_out="$(lintian --fail-on error,warning --tag-display-limit 0 -I "$deb" 2>&1)"; then
  fail "lintian reports errors or warnings (fix them, or override one with its reason in deploy/debian/lintian-overrides)"
fi
grep -v '^running with root privileges is not recommended!$' <<<"$lintian_out" | sed 's/^/  /' || true

if ((${#problems[@]})); then
  printf 'package: %s\n' "${problems[@]}" >&2
  die "$deb: ${#problems[@]} problem(s)"
fi
echo "==> contents"
dpkg-deb -c "$deb" | awk '$1 !~ /^d/ { printf "  %s %9s %s\n", $1, $3, substr($6, 2) }'
echo "==> $deb: $(stat -c %s "$deb") bytes"
