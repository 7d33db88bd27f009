#!/usr/bin/env bash
# The first 1000 round trips of a fresh process pair against the steady state
# (issue: "first 1000 messages within 1.5x of the steady state"), rdmx (no
# variable set: auto, two processes of one host, so shared memory) and
# libfabric's shm, alternating, RUNS times each; medians with min and max.
#
#   benches/warmup.sh [RUNS=3] [SIZE=4096]
#
# Needs the provider built (scripts/build.sh: build-out/lib), libfabric's headers
# and a C compiler (benches/fi/fi_msgrate.c, run with -W, is compiled here).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
size=${2:-4096}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cc -O2 -o "$tmp/fi_msgrate" benches/fi/fi_msgrate.c -lfabric
export FI_PROVIDER_PATH=${RDMX_PROVIDER_DIR:-$PWD/build-out/lib}
for ((i = 0; i < runs; i++)); do
  for prov in rdmx shm; do
    "$tmp/fi_msgrate" -W -p "$prov" -s "$size" -n 20000 | awk -v p="$prov" '/^warmup/ {print p, $4, $6, $8}' >>"$tmp/out"
  done
done
med() { sort -n | awk '{a[NR]=$1} END {printf "%.2f (%.2f-%.2f)", a[int((NR+1)/2)], a[1], a[NR]}'; }
echo "fi_msgrate -W, $size B ping-pong, $runs alternating runs: median (min-max)"
printf '%-6s %-28s %-28s %s\n' provider "first 1000 round trips, us" "steady (10000-19999), us" "ratio"
for prov in rdmx shm; do
  f=$(awk -v p="$prov" '$1 == p {print $2}' "$tmp/out" | med)
  s=$(awk -v p="$prov" '$1 == p {print $3}' "$tmp/out" | med)
  r=$(awk -v p="$prov" '$1 == p {print $4}' "$tmp/out" | med)
  printf '%-6s %-28s %-28s %s\n' "$prov" "$f" "$s" "$r"
done
