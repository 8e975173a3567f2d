#!/usr/bin/env bash
# Checks the deployment files against a built colibri:
#   deploy/colibri.service     systemd-analyze verify (any warning fails), the timeout nesting, and an
#                              offline sandbox exposure score
#   deploy/grafana/colibri.json  valid JSON, core panel types only, unique ids, every query on the
#                              DS_PROMETHEUS data source
#   metric names               alerts.yml and the dashboard use only deploy/prometheus/metrics.txt
#   deploy/prometheus/         with promtool: the scrape config, the rules, their unit tests
#                              (alerts.test.yml) and the dashboard's PromQL; skipped without it
# Usage: scripts/check-deploy.sh BINARY   (e.g. target/static/x86_64-unknown-linux-gnu/release/colibri;
#        a relative path is read from the repository root, as by the other scripts)
#
# promtool is not installed by CI (Debian's prometheus package is 19 MB, 96 MB installed, and its
# postinst starts a Prometheus server). To check locally, either `apt-get install prometheus`, or
# take promtool out of the package without installing it:
#   apt-get download prometheus && dpkg-deb -x prometheus_*_amd64.deb /tmp/prom
#   PROMTOOL=/tmp/prom/usr/bin/promtool scripts/check-deploy.sh BINARY
set -euo pipefail

die() { echo "check-deploy: $*" >&2; exit 1; }

[[ $# -eq 1 ]] || die "usage: scripts/check-deploy.sh BINARY (a built colibri)"
cd "$(dirname "$0")/.."
[[ -x $1 && -f $1 ]] || die "$1: not an executable file (build it with scripts/build-static.sh)"
bin="$(realpath "$1")"

for cmd in systemd-analyze python3; do
  command -v "$cmd" >/dev/null 2>&1 || die "$cmd not found (Debian: apt-get install systemd python3)"
done

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# --- the systemd unit --------------------------------------------------------------------------
# verify needs no running systemd (there is none in CI containers), but it checks that every Exec*
# program exists: a copy of the unit points at the binary under test instead of /usr/bin/colibri.
unit=deploy/colibri.service
grep -q '/usr/bin/colibri' "$unit" || die "$unit: no /usr/bin/colibri in it (the package installs the binary there)"
sed "s#/usr/bin/colibri#$bin#g" "$unit" > "$tmp/colibri.service"
echo "==> systemd-analyze verify $unit (with /usr/bin/colibri -> $bin)"
# An unknown key or a bad value is only a warning for verify (exit 0): any output fails here.
if ! out="$(systemd-analyze verify "$tmp/colibri.service" 2>&1)" || [[ -n $out ]]; then
  echo "$out" >&2
  die "$unit: systemd-analyze verify reported the problems above"
fi
echo "ok"

# Timeouts nest: every task timeout < shutdown_grace (colibri checks that) < TimeoutStopSec (the
# unit carries it). Compared for the packaged default config.
conf=deploy/debian/colibri.yaml
summary="$("$bin" check --config "$conf")" || die "$conf: colibri check failed"
grace="$(awk '$1 == "shutdown_grace" { print $2 }' <<<"$summary")"
stop="$(sed -n 's/^TimeoutStopSec=//p' "$unit")"
[[ -n $grace && -n $stop ]] || die "could not read shutdown_grace from '$bin check' or TimeoutStopSec from $unit"
usec() { systemd-analyze timespan "$1" | awk '$1 == "μs:" { print $2 }'; }
if (( $(usec "$grace") >= $(usec "$stop") )); then
  die "$unit: TimeoutStopSec=$stop must stay above shutdown_grace ($grace in $conf)"
fi
echo "==> timeouts nest: shutdown_grace $grace < TimeoutStopSec $stop"

# The sandbox, scored offline (0 = locked down, 10 = unprotected). 2.3 when written; a change that
# drops sandboxing options raises it. Kept below 3.0 rather than exact, so systemd updates that
# rescore options do not fail the build.
exposure="$(systemd-analyze security --offline=yes --no-pager "$tmp/colibri.service" 2>&1 \
  | sed -n 's/.*Overall exposure level for colibri.service: \([0-9.]*\).*/\1/p')"
[[ -n $exposure ]] || die "systemd-analyze security printed no exposure level for $unit"
echo "==> sandbox exposure (systemd-analyze security --offline): $exposure"
python3 -c "import sys; sys.exit(0 if float('$exposure') < 3.0 else 1)" \
  || die "$unit: exposure $exposure >= 3.0: a sandboxing option was dropped or weakened"

# --- the Grafana dashboard ---------------------------------------------------------------------
dash=deploy/grafana/colibri.json
echo "==> $dash"
python3 -m json.tool "$dash" >/dev/null || die "$dash: not valid JSON"
python3 - "$dash" <<'EOF' || die "$dash: see the problems above"
import json, sys
path = sys.argv[1]
d = json.load(open(path))
problems = []
# Panel types that ship with Grafana (no plugin needed).
core = {"row", "timeseries", "stat", "gauge", "bargauge", "table", "state-timeline", "status-history",
        "heatmap", "histogram", "text", "piechart", "barchart", "logs", "alertlist", "dashlist"}
if not 36 <= d.get("schemaVersion", 0) <= 41:
    problems.append(f"schemaVersion {d.get('schemaVersion')}: expected 36..41 (Grafana 9-11)")
names = {v["name"] for v in d.get("templating", {}).get("list", [])}
for want in ("DS_PROMETHEUS", "instance"):
    if want not in names:
        problems.append(f"no template variable {want}")
ids = set()
def walk(panels):
    for p in panels:
        yield p
        yield from walk(p.get("panels", []))
for p in walk(d.get("panels", [])):
    t, title = p.get("type"), p.get("title", "?")
    if t not in core:
        problems.append(f"panel {title!r}: type {t!r} is not a core panel")
    if p.get("id") in ids:
        problems.append(f"panel {title!r}: duplicate id {p.get('id')}")
    ids.add(p.get("id"))
    g = p.get("gridPos", {})
    if not all(k in g for k in "hwxy") or g["x"] + g["w"] > 24:
        problems.append(f"panel {title!r}: bad gridPos {g}")
    if t == "row":
        continue
    if not p.get("targets"):
        problems.append(f"panel {title!r}: no queries")
    for q in p.get("targets", []) + [p]:
        ds = q.get("datasource", {})
        if ds.get("uid") != "${DS_PROMETHEUS}":
            problems.append(f"panel {title!r}: data source {ds} is not ${{DS_PROMETHEUS}}")
for m in problems:
    print(f"{path}: {m}", file=sys.stderr)
sys.exit(1 if problems else 0)
EOF
echo "ok ($(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sum(1 for p in d['panels'] if p['type'] != 'row'))" "$dash") panels)"

# --- metric names ------------------------------------------------------------------------------
echo "==> metric names in deploy/prometheus/alerts.yml and $dash"
python3 - deploy/prometheus/metrics.txt deploy/prometheus/alerts.yml "$dash" <<'EOF' || die "unknown metric names (see above): fix the file or deploy/prometheus/metrics.txt"
import re, sys
known = {}
for line in open(sys.argv[1]):
    if line.strip() and not line.startswith("#"):
        name, kind = line.split()
        known[name] = kind
bad = []
for path in sys.argv[2:]:
    for name in sorted(set(re.findall(r"\bcolibri_[a-z0-9_]+", open(path).read()))):
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        if name in known or (base != name and known.get(base) == "histogram"):
            continue
        bad.append(f"{path}: {name} is not a colibri metric")
if bad:
    print("\n".join(bad), file=sys.stderr)
sys.exit(1 if bad else 0)
EOF
echo "ok"

# --- Prometheus, with promtool -----------------------------------------------------------------
promtool="${PROMTOOL:-$(command -v promtool || true)}"
if [[ -z $promtool ]]; then
  echo "==> promtool not installed: skipped (scrape config, alert rules and their tests, dashboard PromQL)"
  exit 0
fi
echo "==> $promtool check config --syntax-only deploy/prometheus/scrape.yml"
# --syntax-only: the example names a bearer token file that exists only on a real Prometheus host.
"$promtool" check config --syntax-only deploy/prometheus/scrape.yml \
  || die "deploy/prometheus/scrape.yml: promtool check config failed"
echo "==> $promtool check rules deploy/prometheus/alerts.yml"
"$promtool" check rules deploy/prometheus/alerts.yml || die "deploy/prometheus/alerts.yml: promtool check rules failed"
echo "==> $promtool test rules deploy/prometheus/alerts.test.yml"
(cd deploy/prometheus && "$promtool" test rules alerts.test.yml) \
  || die "deploy/prometheus/alerts.test.yml: an alert does not fire (or read) as its test expects"
# The dashboard's queries, parsed by Prometheus: each becomes a recording rule, with Grafana's
# variables replaced by what they stand for.
echo "==> dashboard PromQL, parsed by $promtool check rules"
python3 - "$dash" > "$tmp/dashboard-rules.yml" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
def walk(panels):
    for p in panels:
        yield p
        yield from walk(p.get("panels", []))
rules = []
for p in walk(d["panels"]):
    for i, t in enumerate(p.get("targets", [])):
        expr = (t["expr"].replace("$__rate_interval", "2m").replace("$__interval", "1m")
                .replace("$instance", ".*").replace("$stream", ".*").replace("$sink", ".*"))
        rules.append({"record": f"dashboard:panel{p['id']}:{i}", "expr": expr})
print(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
EOF
"$promtool" check rules "$tmp/dashboard-rules.yml" || die "$dash: a query does not parse (rule names say panel id and query index)"
