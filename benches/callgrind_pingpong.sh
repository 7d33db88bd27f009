#!/usr/bin/env bash
# Where the time of an 8-byte shm round trip goes, in instructions (callgrind
# counts instructions, so the figure repeats whatever else the machine does):
# the client of `fi_pingpong -p rdmx -e rdm -m tagged -d shm -S 8 -I <iters>`
# under valgrind --tool=callgrind, the server plain. Writes the raw
# callgrind_annotate output (inclusive, with the rdmx build's commit) to OUT.
#   benches/callgrind_pingpong.sh OUT [iters]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$1
ITERS=${2:-5000}
# RDMX_LIB_DIR: another build (e.g. a before/after comparison).
DIR=${RDMX_LIB_DIR:-$PWD/build-out/lib}
tmp=$(mktemp -d)
port=47700
FI_PROVIDER_PATH="$DIR" fi_pingpong -p rdmx -e rdm -m tagged -d shm -S 8 -I "$ITERS" -B "$port" >/dev/null 2>&1 &
sleep 0.5
FI_PROVIDER_PATH="$DIR" valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.out" \
  fi_pingpong -p rdmx -e rdm -m tagged -d shm -S 8 -I "$ITERS" -P "$port" 127.0.0.1 > "$tmp/client.txt" 2>&1
wait || true
{
  echo "# library $DIR; rdmx tree $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- prov rdm rndv mr_cache || echo '+dirty'); command: benches/callgrind_pingpong.sh OUT $ITERS"
  echo "# client output:"
  sed 's/^/#   /' "$tmp/client.txt"
  callgrind_annotate --inclusive=yes --threshold=99.9 "$tmp/cg.out"
} > "$OUT"
rm -rf "$tmp"
echo "callgrind: wrote $OUT"
