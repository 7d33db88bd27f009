#!/usr/bin/env bash
# Before/after comparison of two rdmx builds in one sitting: fi_pingpong -e rdm
# -m tagged over loopback, the two builds alternating, REPS runs each, on the
# shm, auto and udp devices and SIZES (default 8 B, 4 KiB, 64 KiB, 1 MiB);
# prints medians with min-max and
# the after/before ratios as a markdown table.
#   benches/ab_providers.sh <dir with the old librdmx-fi.so> <dir with the new one> [reps]
# Both builds bind 127.0.0.1 (FI_RDMX_IFACE) so that they use the same interface.
set -euo pipefail
OLD=$1; NEW=$2; REPS=${3:-5}
SIZES=${SIZES:-8 4096 65536 1048576}
out=$(mktemp)
port=48300
for rep in $(seq 1 "$REPS"); do
  for prov in old new; do
    dir=$OLD; [ "$prov" = new ] && dir=$NEW
    for dev in shm auto udp; do
      for size in $SIZES; do
        it=10000; [ "$size" -ge 65536 ] && it=1000; [ "$size" -ge 1048576 ] && it=200
        port=$((port+1))
        FI_RDMX_IFACE=127.0.0.1 FI_PROVIDER_PATH=$dir FI_RDMX_DEVICE=$dev fi_pingpong -p rdmx -e rdm -m tagged -S "$size" -I "$it" -B "$port" >/dev/null 2>&1 &
        sleep 0.25
        line=$(FI_RDMX_IFACE=127.0.0.1 FI_PROVIDER_PATH=$dir FI_RDMX_DEVICE=$dev timeout 60 fi_pingpong -p rdmx -e rdm -m tagged -S "$size" -I "$it" -P "$port" 127.0.0.1 2>&1 | tail -1 || true)
        wait || true
        echo "$prov $dev $size $(echo "$line" | awk '{print $7, $6}')" >> "$out"
      done
    done
  done
done
SIZES="$SIZES" python3 - "$out" <<'PY'
import collections, os, statistics, sys
d = collections.defaultdict(list)
for l in open(sys.argv[1]):
    f = l.split()
    try:
        d[(f[1], int(f[2]), f[0])].append((float(f[3]), float(f[4])))
    except (IndexError, ValueError):
        pass
m = statistics.median
print("| device | size | before: µs median (min–max) | after: µs median (min–max) | after/before latency | before MB/s | after MB/s | after/before bandwidth |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for dev in ["shm", "auto", "udp"]:
    for size in [int(x) for x in os.environ["SIZES"].split()]:
        o, n = d[(dev, size, "old")], d[(dev, size, "new")]
        if not o or not n:
            continue
        ol, nl = [x[0] for x in o], [x[0] for x in n]
        ob, nb = [x[1] for x in o], [x[1] for x in n]
        print(f"| {dev} | {size} | {m(ol):.2f} ({min(ol):.2f}–{max(ol):.2f}) | {m(nl):.2f} ({min(nl):.2f}–{max(nl):.2f}) | {m(nl)/m(ol):.2f} | {m(ob):.0f} | {m(nb):.0f} | {m(nb)/m(ob):.2f} |")
PY
rm -f "$out"
