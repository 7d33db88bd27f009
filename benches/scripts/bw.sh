#!/bin/bash
# bw.sh DIR PROV DOMAIN SIZE ITERS -> MB/sec line
d=$1; p=$2; dom=$3; sz=$4; it=${5:-200}
port=$((20000 + RANDOM % 20000))
FI_PROVIDER_PATH=$d fi_pingpong -p "$p" -d "$dom" -e rdm -m tagged -S $sz -I $it -B $port >/dev/null 2>&1 &
sleep 0.3
FI_PROVIDER_PATH=$d fi_pingpong -p "$p" -d "$dom" -e rdm -m tagged -S $sz -I $it -P $port 127.0.0.1 2>/dev/null | awk 'NR>1 && $1 ~ /^[0-9]/ {print $6}'
wait
