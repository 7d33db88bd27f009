#!/usr/bin/env bash
# Streaming bandwidth and latency across two simulated hosts (issue 44 item 7):
# benches/mpi/stream_bw.c (osu_bw / osu_latency style) at np 2, one rank on
# each of two network namespaces joined by a veth pair, under Debian's OpenMPI
# 4.1, the configurations alternating, RUNS rounds; prints every run's figures
# and, per configuration, size and figure, the median, min and max.
#
#   benches/two_host_stream.sh [RUNS]        (default 3)
#
# Configurations (CONFIGS, in the order each round alternates them):
#   rdmx[@DIR]   pml cm + mtl ofi over rdmx (from build-out/lib, or DIR)
#   tcp          pml ob1 + btl tcp (OpenMPI's own TCP)
#   rxm          pml cm + mtl ofi over libfabric's tcp;ofi_rxm
# Environment:
#   SIZES=16384,65536    message sizes (default 8,16384,65536,262144,4194304)
#   SECS=1               seconds per size and test (default 1)
#   MODE=bw              bw, lat or both (default both)
#   MTU=1500             the veth pair's MTU (default 1500)
#   WINDOW=64            messages in flight per window (default 64, as osu_bw)
#   RDMX_ENV="FI_RDMX_UDP_MTU=8972"  variables for the ranks under rdmx (none by default)
#   OUT=dir              raw outputs (default target/two_host_stream/<date-time>)
#   BIN_DIR=dir          where stream_bw, the hostfile and the launcher's agent
#                        go (default OUT)
#   PROVIDER_DIR=dir     rdmx's directory for the `rdmx` configuration (default build-out/lib)
# Any FI_RDMX_* variable of the caller's environment is removed. Needs root.
set -uo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
SIZES=${SIZES:-8,16384,65536,262144,4194304}
SECS=${SECS:-1}
MODE=${MODE:-both}
MTU=${MTU:-1500}
WINDOW=${WINDOW:-64}
CONFIGS=${CONFIGS:-rdmx tcp rxm}
RDMX_ENV=${RDMX_ENV:-}
OUT=${OUT:-target/two_host_stream/$(date +%Y%m%d-%H%M%S)}
for v in $(env | grep -o '^FI_RDMX_[A-Z0-9_]*'); do unset "$v"; done
BIN_DIR=${BIN_DIR:-$OUT}
PROVIDER_DIR=${PROVIDER_DIR:-build-out/lib}
mkdir -p "$OUT" "$BIN_DIR"
OUT=$(realpath "$OUT")
BIN_DIR=$(realpath "$BIN_DIR")

tag=ths$$
A=${tag}a B=${tag}b
IP_A=10.231.0.1 IP_B=10.231.0.2
cleanup() { ip netns del "$A" 2>/dev/null; ip netns del "$B" 2>/dev/null; rm -f "$BIN_DIR/agent.sh" "$BIN_DIR/hostfile"; }
trap cleanup EXIT
ip netns add "$A" && ip netns add "$B" || exit 1
ip link add "${tag}va" type veth peer name "${tag}vb"
ip link set "${tag}va" netns "$A"
ip link set "${tag}vb" netns "$B"
ip -n "$A" addr add $IP_A/24 dev "${tag}va"
ip -n "$B" addr add $IP_B/24 dev "${tag}vb"
for ns in "$A" "$B"; do ip -n "$ns" link set lo up; done
ip -n "$A" link set "${tag}va" mtu "$MTU" up
ip -n "$B" link set "${tag}vb" mtu "$MTU" up

# The launcher's agent: <agent> [ssh options] <host> <command...>.
cat >"$BIN_DIR/agent.sh" <<EOF
#!/bin/sh
while [ \$# -gt 0 ]; do case "\$1" in -o|-p|-l|-i) shift 2;; -*) shift;; *) break;; esac; done
host=\$1; shift
case "\$host" in $IP_A) ns=$A ;; $IP_B) ns=$B ;; *) echo "unknown host \$host" >&2; exit 1 ;; esac
exec ip netns exec "\$ns" unshare --uts sh -c "hostname \$ns; \$*"
EOF
chmod +x "$BIN_DIR/agent.sh"
printf '%s slots=1\n%s slots=1\n' $IP_A $IP_B >"$BIN_DIR/hostfile"

exe=$BIN_DIR/stream_bw
mpicc -O2 -o "$exe" benches/mpi/stream_bw.c || exit 1

run() { # config round
    local cfg=$1 dir
    local args=(--allow-run-as-root -np 2 --hostfile "$BIN_DIR/hostfile" --map-by node --bind-to none
        --mca plm_rsh_agent "$BIN_DIR/agent.sh" --mca oob_tcp_if_include 10.231.0.0/24)
    case $cfg in
    rdmx | rdmx@*)
        dir=$PROVIDER_DIR
        [[ $cfg == rdmx@* ]] && dir=${cfg#rdmx@}
        args+=(--mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include rdmx --mca btl self
            -x FI_PROVIDER=rdmx -x FI_PROVIDER_PATH="$(realpath "$dir")")
        for e in $RDMX_ENV; do args+=(-x "$e"); done ;;
    tcp) args+=(--mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include 10.231.0.0/24) ;;
    rxm) args+=(--mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include "tcp;ofi_rxm" --mca btl self
        -x FI_PROVIDER="tcp;ofi_rxm") ;;
    *) echo "unknown configuration $cfg" >&2; return 1 ;;
    esac
    timeout 600 ip netns exec "$A" mpirun "${args[@]}" "$exe" -s "$SIZES" -t "$SECS" -m "$MODE" -w "$WINDOW" 2>&1
}

for r in $(seq 1 "$RUNS"); do
    for cfg in $CONFIGS; do
        name=${cfg##*/}
        f="$OUT/$name.$r.txt"
        run "$cfg" >"$f" 2>&1
        echo "round $r $cfg: $(grep -c '^bw\|^lat' "$f") lines"
    done
done

# Per configuration, test, size: median (min-max).
for cfg in $CONFIGS; do
    name=${cfg##*/}
    cat "$OUT/$name".*.txt | awk -v c="$name" '
        /^bw / { split($2,s,"="); split($3,v,"="); k="bw " s[2] " MB/s"; x[k]=x[k] " " v[2] }
        /^lat / { split($2,s,"="); split($4,v,"="); k="lat " s[2] " p50_us"; x[k]=x[k] " " v[2] }
        END { for (k in x) print c, k, x[k] }'
done | while read -r c t s u rest; do
    sorted=$(tr ' ' '\n' <<<"$rest" | grep . | sort -g | tr '\n' ' ')
    set -- $sorted
    n=$#
    eval "med=\${$(((n + 1) / 2))}"
    eval "max=\${$n}"
    printf '%-12s %-4s %8s %-7s median %9s  (min %s, max %s, n %d)\n' "$c" "$t" "$s" "$u" "$med" "$1" "$max" "$n"
done | sort -k2,2 -k3,3n -k1,1 | tee "$OUT/summary.txt"

# Ratios within a round (this machine's speed drifts between rounds; a ratio
# of two configurations run back to back does not): the first configuration
# against each other one, per figure and size, median (min-max) over rounds.
# Bandwidth: first/other (above 1 = the first is faster); latency: first/other
# (below 1 = the first is faster). Each round's ratios: ratios.raw (other
# configuration, bw|lat, size, ratio, round).
first=${CONFIGS%% *}
first=${first##*/}
for cfg in ${CONFIGS#* }; do
    other=${cfg##*/}
    for r in $(seq 1 "$RUNS"); do
        paste <(awk '/^(bw|lat) /' "$OUT/$first.$r.txt") <(awk '/^(bw|lat) /' "$OUT/$other.$r.txt") |
            awk -v o="$other" -v r="$r" '{
                split($2,s,"="); i = ($1=="bw") ? 3 : 4; split($i,a,"="); split($(NF/2+i),b,"=")
                if (b[2] > 0) printf "%s %s %s %.3f %s\n", o, $1, s[2], a[2]/b[2], r }'
    done
done | tee "$OUT/ratios.raw" | sort -k1,1 -k2,2 -k3,3n -k4,4g | awk -v f="$first" '
    function flush() { if (n) { printf "%s/%-12s %-4s %8s  median %.2f  (min %.2f, max %.2f, n %d)\n", f, k1, k2, k3, v[int((n+1)/2)], v[1], v[n], n } n=0 }
    { if ($1!=k1 || $2!=k2 || $3!=k3) { flush(); k1=$1; k2=$2; k3=$3 } v[++n]=$4 }
    END { flush() }' | tee "$OUT/ratios.txt"
