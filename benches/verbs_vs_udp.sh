#!/usr/bin/env bash
# In the Soft-RoCE VM: fi_pingpong -m tagged between two processes, one on rxe0 and
# one on rxe1, over rdmx's verbs UD device (-d verbs, FI_RDMX_IFACE=rxe0/rxe1), and
# over its UDP device between the same two addresses (-d udp, FI_RDMX_IFACE=10.11.12.1
# and .2: the kernel carries those datagrams through loopback, rxe's through the veth
# pair), the devices alternating, REPS runs each; medians with min-max and the
# verbs/udp ratios as a markdown table. The VM is emulated (qemu TCG), so only the
# ratios mean anything, never the absolute figures.
#   scripts/rxe-vm.sh benches/verbs_vs_udp.sh [reps]
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
SIZES=${SIZES:-8 4096 65536 1048576}
export FI_PROVIDER_PATH=${RDMX_LIB_DIR:-$PWD/build-out/lib}
out=$(mktemp)
port=45100
for rep in $(seq 1 "$REPS"); do
  for dev in verbs udp; do
    case $dev in
      verbs) s_if=rxe0; c_if=rxe1 ;;
      udp) s_if=10.11.12.1; c_if=10.11.12.2 ;;
    esac
    for size in $SIZES; do
      it=1000; [ "$size" -ge 65536 ] && it=200; [ "$size" -ge 1048576 ] && it=30
      port=$((port + 1))
      FI_RDMX_IFACE=$s_if fi_pingpong -p rdmx -e rdm -d "$dev" -m tagged -S "$size" -I "$it" -B "$port" >/dev/null 2>&1 &
      sleep 1
      line=$(FI_RDMX_IFACE=$c_if timeout 300 fi_pingpong -p rdmx -e rdm -d "$dev" -m tagged -S "$size" -I "$it" -P "$port" 127.0.0.1 2>&1 | tail -1 || true)
      wait || true
      echo "$dev $size $(echo "$line" | awk '{print $7, $6}')" >>"$out"
    done
  done
done
SIZES="$SIZES" python3 - "$out" "$REPS" <<'PY'
import collections, os, statistics, sys
d = collections.defaultdict(list)
for l in open(sys.argv[1]):
    f = l.split()
    try:
        d[(f[0], int(f[1]))].append((float(f[2]), float(f[3])))
    except (IndexError, ValueError):
        pass
m = statistics.median
print(f"| size | verbs UD: us median (min-max) | UDP: us median (min-max) | verbs/udp latency | verbs MB/s | UDP MB/s | runs |")
print("|---:|---:|---:|---:|---:|---:|---:|")
for s in map(int, os.environ["SIZES"].split()):
    v, u = d.get(("verbs", s), []), d.get(("udp", s), [])
    if not v or not u:
        print(f"| {s} | {len(v)} runs | {len(u)} runs | - | - | - | - |")
        continue
    vl, ul = [x[0] for x in v], [x[0] for x in u]
    print(f"| {s} | {m(vl):.1f} ({min(vl):.1f}-{max(vl):.1f}) | {m(ul):.1f} ({min(ul):.1f}-{max(ul):.1f}) | {m(vl)/m(ul):.2f} | {m([x[1] for x in v]):.0f} | {m([x[1] for x in u]):.0f} | {len(v)}/{len(u)} of {sys.argv[2]} |")
PY
