#!/bin/bash
# pp.sh DIR PROV [DOMAIN] -> one-way usec for 8 B tagged
d=$1; p=$2; dom=${3:-}
port=$((20000 + RANDOM % 20000))
extra=(); [ -n "$dom" ] && extra=(-d "$dom")
FI_PROVIDER_PATH=$d fi_pingpong -p "$p" "${extra[@]}" -e rdm -m tagged -S 8 -I 50000 -B $port >/dev/null 2>&1 &
sleep 0.3
FI_PROVIDER_PATH=$d fi_pingpong -p "$p" "${extra[@]}" -e rdm -m tagged -S 8 -I 50000 -P $port 127.0.0.1 2>/dev/null | awk '/^8 /{print $7}'
wait
