#!/usr/bin/env bash
# Intel MPI over rdmx beside Intel MPI over libfabric's own shm provider, in
# one sitting (issue: "report Intel MPI beside libfabric shm in the same run"):
# benches/mpi/mpi_bench.c built with Intel MPI's mpicc, two ranks on this
# host, I_MPI_FABRICS=ofi so that every message goes through libfabric, the
# two providers alternating RUNS times; Intel MPI's own shared-memory
# transport (I_MPI_FABRICS=shm) runs beside them as the floor, the way
# OpenMPI's btl vader is in the harness. No FI_RDMX_* variable is set.
# Prints each figure's median (min-max) and rdmx's ratio to libfabric shm.
#
#   benches/impi_vs_shm.sh [RUNS=3] [ITERS=2000] [SIZES=8,1024,8192,65536,1048576]
#
# Needs Intel MPI in build-out/impi (scripts/setup-impi.sh) and the provider
# built (scripts/build.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
iters=${2:-2000}
sizes=${3:-8,1024,8192,65536,1048576}
impi=${RDMX_IMPI_DIR:-$PWD/build-out/impi}
[ -x "$impi/bin/mpiexec" ] || { echo "no Intel MPI in $impi (scripts/setup-impi.sh)" >&2; exit 2; }
export I_MPI_ROOT=$impi PATH=$impi/bin:$PATH LD_LIBRARY_PATH=$impi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export FI_PROVIDER_PATH=${RDMX_PROVIDER_DIR:-$PWD/build-out/lib}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$impi/bin/mpicc" -O2 -o "$tmp/mpi_bench" benches/mpi/mpi_bench.c
for ((i = 0; i < runs; i++)); do
  for label in rdmx shm impi-shm; do
    case $label in
      rdmx) env=(I_MPI_FABRICS=ofi FI_PROVIDER=rdmx) ;;
      shm) env=(I_MPI_FABRICS=ofi FI_PROVIDER=shm) ;;
      impi-shm) env=(I_MPI_FABRICS=shm) ;;
    esac
    env "${env[@]}" I_MPI_DEBUG=5 mpiexec -n 2 "$tmp/mpi_bench" "$iters" "$sizes" >"$tmp/run" 2>&1 || { echo "run $label failed:" >&2; cat "$tmp/run" >&2; exit 1; }
    if [ "$label" != impi-shm ] && ! grep -q "libfabric provider: $label" "$tmp/run"; then
      echo "Intel MPI did not choose $label:" >&2; cat "$tmp/run" >&2; exit 1
    fi
    awk -v l="$label" 'NF == 3 && $2 ~ /^[0-9]+$/ {print l, $1, $2, $3}' "$tmp/run" >>"$tmp/all"
  done
done
python3 - "$tmp/all" "$runs" <<'PY'
import collections, statistics, sys
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    label, what, size, v = line.split()
    d[(what, int(size), label)].append(float(v))
print(f"Intel MPI, np 2 on one host, {sys.argv[2]} alternating runs; median (min-max)")
print("| figure | size | rdmx | libfabric shm | Intel MPI shm | rdmx / libfabric shm |")
print("|---|---:|---:|---:|---:|---:|")
def cell(v):
    return f"{statistics.median(v):.3g} ({min(v):.3g}-{max(v):.3g})" if v else "-"
for what, size in sorted({(w, s) for w, s, _ in d}):
    r, s, i = (d[(what, size, l)] for l in ("rdmx", "shm", "impi-shm"))
    ratio = f"{statistics.median(r) / statistics.median(s):.2f}x" if r and s and statistics.median(s) else "-"
    print(f"| {what} | {size} | {cell(r)} | {cell(s)} | {cell(i)} | {ratio} |")
PY
