#!/usr/bin/env bash
# The measurements behind two defaults (fi_rdmx(7); benches/HISTORY.md quotes them), on the
# current build (build-out/lib), in one sitting with the settings alternating,
# REPS runs each, medians with min-max:
#  - FI_RDMX_RNDV_THRESHOLD (shm): fi_pingpong -d shm -m tagged at 8, 16, 32,
#    64 and 256 KiB, every message eager (threshold 1 GiB) vs every one
#    pulled with process_vm_readv (threshold 1 byte): latency per transfer.
#  - FI_RDMX_WINDOW_THRESHOLD (udp): fi_pingpong -d udp -m tagged at 1 MiB,
#    segmented eagerly (threshold 1 GiB) vs windowed rendezvous (threshold 1 byte):
#    bandwidth.
#   benches/threshold_crossover.sh [reps] > raw.txt
# Prints one raw line per run ("<setting> <device> <size> <usec/xfer> <MB/s>"),
# then a Markdown table of medians.
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
DIR=$PWD/build-out/lib
out=$(mktemp)
port=47300
run() { # setting device size iterations env...
  local setting=$1 dev=$2 size=$3 it=$4; shift 4
  port=$((port + 1))
  env "$@" FI_PROVIDER_PATH="$DIR" fi_pingpong -p rdmx -e rdm -m tagged -d "$dev" -S "$size" -I "$it" -B "$port" >/dev/null 2>&1 &
  sleep 0.3
  local line
  line=$(env "$@" FI_PROVIDER_PATH="$DIR" timeout 60 fi_pingpong -p rdmx -e rdm -m tagged -d "$dev" -S "$size" -I "$it" -P "$port" 127.0.0.1 2>&1 | tail -1 || true)
  wait || true
  echo "$setting $dev $size $(echo "$line" | awk '{print $7, $6}')" | tee -a "$out"
}
for rep in $(seq 1 "$REPS"); do
  for setting in eager pull; do
    t=1073741824; [ "$setting" = pull ] && t=1
    for size in 8192 16384 32768 65536 262144; do
      run "$setting" shm "$size" 5000 FI_RDMX_RNDV_THRESHOLD=$t
    done
    w=1073741824; [ "$setting" = pull ] && w=1
    run "$setting" udp 1048576 300 FI_RDMX_WINDOW_THRESHOLD=$w FI_RDMX_IFACE=127.0.0.1
  done
done
python3 - "$out" <<'PY'
import collections, statistics, sys
d = collections.defaultdict(list)
for l in open(sys.argv[1]):
    f = l.split()
    try:
        d[(f[1], int(f[2]), f[0])].append((float(f[3]), float(f[4])))
    except (IndexError, ValueError):
        pass
def cell(v):
    return f"{statistics.median(v):.1f} ({min(v):.1f}–{max(v):.1f})"
print()
print("| device | size | eager: µs/xfer | pulled or windowed: µs/xfer | eager MB/s | pulled or windowed MB/s |")
print("|---|---:|---:|---:|---:|---:|")
for (dev, size) in sorted({(k[0], k[1]) for k in d}):
    e, p = d.get((dev, size, "eager"), []), d.get((dev, size, "pull"), [])
    if e and p:
        print(f"| {dev} | {size} | {cell([x[0] for x in e])} | {cell([x[0] for x in p])} | {cell([x[1] for x in e])} | {cell([x[1] for x in p])} |")
PY
