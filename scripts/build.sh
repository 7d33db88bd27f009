#!/usr/bin/env bash
# Builds the provider (the `provider` profile: release with whole-program
# optimization, see Cargo.toml) and installs it as
# build-out/lib/librdmx-fi.so (the directory to put in FI_PROVIDER_PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --profile provider -p rdmx-prov
mkdir -p build-out/lib
install -m 0755 target/provider/librdmx_fi.so build-out/lib/librdmx-fi.so
echo "build: installed $(pwd)/build-out/lib/librdmx-fi.so"
