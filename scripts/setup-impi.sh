#!/usr/bin/env bash
# Installs Intel MPI (an MPICH-derived ch4:ofi MPI that runs over the system
# libfabric) from PyPI into build-out/impi, for the MPICH-family tests. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=build-out/impi
if [[ -x "$VENV/bin/mpiexec" && -x "$VENV/bin/mpicc" ]]; then
  echo "setup-impi: present in $VENV"
  exit 0
fi
if ! python3 -m venv --help >/dev/null 2>&1; then
  echo "setup-impi: python3 venv module missing; installing python3-venv"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv >/dev/null
fi
rm -rf "$VENV"
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --no-deps impi-rt impi-devel
echo "setup-impi: installed Intel MPI (impi-rt, impi-devel from PyPI) into $VENV"
