#!/usr/bin/env bash
# fabtests 1.17.0's quick set over rdmx on Debian 12's own libfabric 1.17, with no
# exclude list, plain and again with sealed job traffic; run by hand, not by CI:
# Debian's archive does not serve bookworm's libfabric_1.17.0.orig.tar.xz (the
# .dsc names it; the file answers 404 here), so the source comes from a libfabric
# tree at tag v1.17.0 the caller has (e.g. a clone of ofiwg/libfabric).
#
#   scripts/fabtests-1.17.sh LIBFABRIC_SOURCE_AT_v1.17.0 [OUT_DIR]
#
# 1. fabtests 1.17.0 built against Debian 12's libfabric-dev (1.17) into a prefix
#    cached under ~/.cache/rdmx-stacks (reused when there);
# 2. rdmx built against the 1.17 headers (scripts/build.sh: build-out/lib);
# 3. runfabtests.sh -t quick rdmx, no FI_RDMX_* variable;
# 4. the same with the job's secret (FI_RDMX_JOB_SECRET), the udp device (every
#    datagram crosses a wire) and FI_RDMX_STATS (to read back that every endpoint
#    was tagged): it must count test by test as step 3.
# Writes OUT_DIR/report.txt (default target/fabtests-1.17) with both runs' counts,
# each notrun's reason and each failure; exit 1 if step 4 differs from step 3.
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:?usage: $0 LIBFABRIC_SOURCE_AT_v1.17.0 [OUT_DIR]}
out=${2:-target/fabtests-1.17}
for v in $(env | sed -n 's/^\(FI_RDMX_[A-Z0-9_]*\)=.*/\1/p'); do unset "$v"; done
CACHE=${RDMX_STACKS_CACHE:-$HOME/.cache/rdmx-stacks}
prefix="$CACHE/fabtests-1.17.0"
mkdir -p "$out"

# ------------------------------------------------------------------ 1. fabtests
if [[ ! -x "$prefix/bin/runfabtests.sh" ]]; then
  grep -q 'AC_INIT(\[fabtests\], \[1.17.0\]' "$src/fabtests/configure.ac" ||
    { echo "fabtests-1.17: $src/fabtests is not fabtests 1.17.0" >&2; exit 1; }
  work=$(mktemp -d "${TMPDIR:-/tmp}/rdmx-ft117.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  cp -a "$src/fabtests" "$work/"
  (
    cd "$work/fabtests"
    ./autogen.sh
    ./configure --prefix="$prefix" --with-libfabric=/usr
    make -j"$(nproc)"
    make install
  ) >"$out/build.log" 2>&1 || { echo "fabtests-1.17: build failed; the log's tail:" >&2; tail -30 "$out/build.log" >&2; exit 1; }
fi

# ------------------------------------------------------------------ 2. rdmx
./scripts/build.sh >/dev/null
provdir=$(pwd)/build-out/lib

# ------------------------------------------------------------------ 3, 4. quick set
# One line per test: "RESULT<TAB>NAME", from the YAML runfabtests prints.
results() {
  awk '/^- name:/ { sub(/^- name: +/, ""); name = $0 } /^  result:/ { print $2 "\t" name }' "$1" | sed 's/ -p "rdmx"$//'
}
notrun_reasons() {
  awk '/^- name:/ { sub(/^- name: +/, ""); name = $0; res = "" }
       /^  result:/ { res = $2 }
       res == "Notrun" && /ret=-[0-9]+ \(/ { match($0, /ret=-[0-9]+ \([^)]*\)/); why[name] = substr($0, RSTART, RLENGTH) }
       END { for (n in why) print "  " n ": " why[n] }' "$1" | sed 's/ -p "rdmx"//' | sort
}
count() { grep -c "^$1" <<<"$2" || true; }

t0=$SECONDS
FI_PROVIDER_PATH=$provdir timeout 1500 "$prefix/bin/runfabtests.sh" -vv -T 60 -p "$prefix/bin" -t quick rdmx \
  >"$out/plain.log" 2>&1 || true
plain=$(results "$out/plain.log")
plain_secs=$((SECONDS - t0))
stats=$(mktemp -d)
t0=$SECONDS
FI_PROVIDER_PATH=$provdir FI_RDMX_DEVICE=udp FI_RDMX_JOB_SECRET="fabtests job secret 0123456789" \
  FI_RDMX_STATS="$stats/ep-%p.jsonl" \
  timeout 1500 "$prefix/bin/runfabtests.sh" -vv -T 60 -p "$prefix/bin" -t quick rdmx >"$out/sealed.log" 2>&1 || true
sealed=$(results "$out/sealed.log")
sealed_secs=$((SECONDS - t0))
docs=$(cat "$stats"/*.jsonl 2>/dev/null | grep -c '"reason":"close"' || true)
tagged=$(cat "$stats"/*.jsonl 2>/dev/null | grep '"reason":"close"' | grep -c '"job_traffic":"tagged"' || true)
rm -rf "$stats"
{
  echo "fabtests 1.17.0 runfabtests.sh -t quick over rdmx (no exclude list) on libfabric $(fi_info --version | sed -n 's/^libfabric: //p'), $(date -u +%Y-%m-%d)"
  echo "plain (no FI_RDMX_* variable), $plain_secs s: pass $(count Pass "$plain"), notrun $(count Notrun "$plain"), fail $(count Fail "$plain")"
  echo "sealed (FI_RDMX_JOB_SECRET, FI_RDMX_DEVICE=udp), $sealed_secs s: pass $(count Pass "$sealed"), notrun $(count Notrun "$sealed"), fail $(count Fail "$sealed"); $tagged of $docs endpoints tagged"
  echo
  echo "notrun (both sides' error), plain:"
  notrun_reasons "$out/plain.log"
  echo
  echo "fail, plain:"
  grep '^Fail' <<<"$plain" | cut -f2- | sed 's/^/  /' || true
  echo
  echo "tests whose result differs between the two runs:"
  diff <(echo "$plain") <(echo "$sealed") | sed -n 's/^[<>] /  /p' || true
} >"$out/report.txt"
cat "$out/report.txt"
if [[ "$plain" == "$sealed" ]] && ((docs > 0 && tagged == docs)); then
  echo "fabtests-1.17: PASS: the sealed run counts test by test as the plain one; every endpoint tagged"
else
  echo "fabtests-1.17: FAIL: the sealed run differs from the plain one, or an endpoint was not tagged"
  exit 1
fi
