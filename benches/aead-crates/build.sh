#!/bin/bash
# Builds this bench once per crate (each alone, so that build times are the
# crate's own) and runs each build; the output is what
# benches/results/2026-11-29-aead-crates/ holds (bench.txt, times.txt).
# Usage: benches/aead-crates/build.sh [outdir]   (2 cores: -j2; about 12 min)
set -u
cd "$(dirname "$0")"
out=${1:-/tmp/aead-crates}
mkdir -p "$out"
b() { # name features extra-env...
  local name=$1 feat=$2; shift 2
  local s=$(date +%s.%N)
  env "$@" timeout 600 cargo build --release -j2 --no-default-features --features "$feat" --target-dir "$out/t-$name" > "$out/log-$name.txt" 2>&1
  local rc=$?
  local e=$(date +%s.%N)
  echo "BUILD $name rc=$rc $(echo "$e - $s" | bc) s" | tee -a "$out/times.txt"
  echo "== $name" >> "$out/bench.txt"
  "$out/t-$name/release/aead-bench" >> "$out/bench.txt"
}
rm -f "$out/times.txt" "$out/bench.txt"
b ring ring
b rcaes rc-aes
b rcchacha rc-chacha
b rchkdf rc-hkdf
b awslc awslc
b rcaesnative rc-aes RUSTFLAGS="-C target-cpu=native"
echo DONE >> "$out/times.txt"
