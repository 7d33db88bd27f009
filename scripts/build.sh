#!/usr/bin/env bash
# Builds the provider in release mode and installs it as
# build-out/lib/librdmx-fi.so (the directory to put in FI_PROVIDER_PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release -p rdmx-prov
mkdir -p build-out/lib
install -m 0755 target/release/librdmx_fi.so build-out/lib/librdmx-fi.so
echo "build: installed $(pwd)/build-out/lib/librdmx-fi.so"
