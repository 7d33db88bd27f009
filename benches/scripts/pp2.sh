#!/bin/bash
# pp2.sh DIR PROV : 8 B tagged latency with libfabric 2.1's fi_pingpong
L=/root/.cache/rdmx-stacks/libfabric-2.1.0
d=$1; p=$2
port=$((20000 + RANDOM % 20000))
LD_LIBRARY_PATH=$L/lib FI_PROVIDER_PATH=$d $L/bin/fi_pingpong -p "$p" -e rdm -m tagged -S 8 -I 50000 -B $port >/dev/null 2>&1 &
sleep 0.3
LD_LIBRARY_PATH=$L/lib FI_PROVIDER_PATH=$d $L/bin/fi_pingpong -p "$p" -e rdm -m tagged -S 8 -I 50000 -P $port 127.0.0.1 2>/dev/null | awk '/^8 /{print $7}'
wait
