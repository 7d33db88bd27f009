#!/usr/bin/env bash
# Idempotent setup for a fresh Debian 12 machine: installs the Debian packages rdmx
# needs (only those missing) and checks for a Rust toolchain. Safe to run again.
set -euo pipefail

PKGS=(
  libfabric-dev libfabric-bin          # libfabric 1.17 headers, fi_info, fi_pingpong
  libibverbs-dev ibverbs-providers     # rdma-core headers (verbs.h, efadv.h) for bindgen
  libclang-dev clang pkg-config        # bindgen needs libclang
  openmpi-bin libopenmpi-dev           # MPI programs over rdmx
  iproute2 nftables                    # network-namespace tests with kernel packet drops; ip, rdma, tc, ss in the VM
  procps psmisc                        # pgrep/pkill/fuser used by the test scripts
  valgrind                             # memcheck over fi_pingpong (fi_tests/tests/memcheck.rs)
  dpkg-dev binutils make               # scripts/package.sh (dpkg-shlibdeps, dpkg-architecture, strip), make install
  groff-base man-db                    # fi_rdmx(7): groff -ww and man in scripts/check-package.sh
  gcc                                  # cc: the fi_version shim of fi_tests/tests/version.rs
  qemu-system-x86 busybox-static       # scripts/rxe-vm.sh: the VM of the verbs tests (Debian kernel, busybox initramfs)
  ibverbs-utils                        # ibv_devinfo, ibv_ud_pingpong in scripts/test-verbs.sh (rxe's provider: ibverbs-providers)
)

missing=()
for p in "${PKGS[@]}"; do
  [[ "$p" == \#* ]] && continue
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "setup: Debian packages present"
fi

if ! command -v cargo >/dev/null 2>&1; then
  if [[ -x "$HOME/.cargo/bin/cargo" ]]; then
    export PATH="$HOME/.cargo/bin:$PATH"
  else
    echo "setup: no Rust toolchain found; installing rustup (stable)"
    curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
    export PATH="$HOME/.cargo/bin:$PATH"
  fi
fi
if ! cargo clippy --version >/dev/null 2>&1; then
  echo "setup: adding clippy to the Rust toolchain"
  rustup component add clippy
fi
if ! cargo fmt --version >/dev/null 2>&1; then
  echo "setup: adding rustfmt to the Rust toolchain"
  rustup component add rustfmt
fi
echo "setup: $(cargo --version), $(cargo clippy --version), $(cargo fmt --version)"
