#!/usr/bin/env bash
# A short run of every cargo-fuzz target in fuzz/ (the decoders of the rdm
# header and of every rndv packet; the rdm and rndv engines fed arbitrary
# datagram sequences), each for RDMX_FUZZ_SECS seconds (default 20) from the
# committed seed corpus. New inputs go to a temporary directory; a crash fails
# the run and leaves its input in fuzz/artifacts/<target>/. One input that runs
# for more than 30 s is a hang and fails the run too (libFuzzer's default is
# 20 minutes: a CI run once spent them on a simulated endpoint whose clock
# stood still).
#
# Stable toolchain: cargo-fuzz needs nightly only for its sanitizers, so the
# targets are built with `-s none` (libFuzzer's coverage instrumentation uses
# stable -C flags). cargo-fuzz itself is installed if missing (~1-2 min).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
secs="${RDMX_FUZZ_SECS:-20}"
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz"
  cargo install cargo-fuzz --locked --quiet
fi
# libfuzzer-sys compiles libFuzzer (C++): setup.sh installs clang, not always c++.
if ! command -v c++ >/dev/null 2>&1 && [[ -z "${CXX:-}" ]]; then
  export CXX=clang++
fi
cd fuzz
start=$SECONDS
cargo fuzz build -s none
echo "fuzz: built in $((SECONDS - start)) s"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for t in $(cargo fuzz list); do
  mkdir -p "$work/$t"
  log="$work/$t.log"
  if cargo fuzz run -s none "$t" "$work/$t" "corpus/$t" -- -max_total_time="$secs" -timeout=30 -print_final_stats=1 >"$log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
    echo "fuzz: $t: ${runs:-?} runs in ${secs} s (${rate:-?}/s), no crash"
  else
    grep -v '^#' "$log" | tail -60
    echo "fuzz: $t FAILED (input kept in fuzz/artifacts/$t/)"
    exit 1
  fi
done
echo "fuzz: all targets clean in $((SECONDS - start)) s"
