#!/usr/bin/env bash
# In the Soft-RoCE VM: 4 MiB messages over rdmx's verbs device between rxe0 and
# rxe1 (fi_pingpong -d verbs -m tagged, FI_RDMX_IFACE per process), received by
# RDMA read through an RC connection (the default) and by the windowed push over UD
# (FI_RDMX_RC_MAX_PEERS=0), alternating, REPS runs each: medians (min-max) of the
# time per transfer and of the server's CPU time (user + system, /usr/bin/time) per
# MiB it received, after subtracting the CPU of an 8-byte run of the same mode
# (libfabric's start-up and the progress thread's idle cost). The VM is emulated
# (qemu TCG): only the ratios mean anything, never the absolute figures.
#   scripts/rxe-vm.sh benches/verbs_read_vs_push.sh [reps]
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
SIZE=${SIZE:-4194304}
ITERS=${ITERS:-20}
export FI_PROVIDER_PATH=${RDMX_LIB_DIR:-$PWD/build-out/lib}
out=$(mktemp)
port=45300
run() { # mode size iters -> "usec cpu_seconds"
  local mode=$1 size=$2 it=$3 t
  t=$(mktemp)
  port=$((port + 1))
  local env=()
  [ "$mode" = push ] && env=(FI_RDMX_RC_MAX_PEERS=0)
  env "${env[@]}" FI_RDMX_IFACE=rxe0 /usr/bin/time -f "%U %S" -o "$t" fi_pingpong -p rdmx -e rdm -d verbs -m tagged -S "$size" -I "$it" -B "$port" >/dev/null 2>&1 &
  sleep 1
  local line
  line=$(env "${env[@]}" FI_RDMX_IFACE=rxe1 timeout 600 fi_pingpong -p rdmx -e rdm -d verbs -m tagged -S "$size" -I "$it" -P "$port" 127.0.0.1 2>&1 | tail -1 || true)
  wait || true
  echo "$(echo "$line" | awk '{print $7}') $(awk '{print $1 + $2}' "$t")"
  rm -f "$t"
}
for rep in $(seq 1 "$REPS"); do
  for mode in read push; do
    base=$(run "$mode" 8 "$ITERS")
    big=$(run "$mode" "$SIZE" "$ITERS")
    echo "$mode $big $(echo "$base" | awk '{print $2}')" >>"$out"
  done
done
cat "$out" >&2
SIZE="$SIZE" ITERS="$ITERS" python3 - "$out" "$REPS" <<'PY'
import collections, os, statistics, sys
d = collections.defaultdict(list)
mib = int(os.environ["SIZE"]) / (1 << 20) * int(os.environ["ITERS"])
for l in open(sys.argv[1]):
    f = l.split()
    try:
        d[f[0]].append((float(f[1]), (float(f[2]) - float(f[3])) / mib))
    except (IndexError, ValueError):
        pass
m = statistics.median
def cell(xs, fmt):
    return f"{fmt.format(m(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"
print(f"| {int(os.environ['SIZE']) >> 20} MiB | us per transfer, median (min-max) | server CPU ms per MiB received, median (min-max) | runs |")
print("|---|---:|---:|---:|")
for mode in ("read", "push"):
    v = d.get(mode, [])
    if v:
        print(f"| {mode} | {cell([x[0] for x in v], '{:.0f}')} | {cell([x[1] * 1000 for x in v], '{:.2f}')} | {len(v)} of {sys.argv[2]} |")
r, p = d.get("read"), d.get("push")
if r and p:
    print(f"\nread/push: time per transfer {m([x[0] for x in r]) / m([x[0] for x in p]):.2f}x (bandwidth {m([x[0] for x in p]) / m([x[0] for x in r]):.2f}x), server CPU per MiB {m([x[1] for x in r]) / m([x[1] for x in p]):.2f}x")
PY
