#!/bin/bash
# ab_sizes.sh BASE_DIR HEAD_DIR [ROUNDS] -> per round, fi_pingpong -m tagged MB/s
# at 8 B (20000 iterations), 64 KiB (1000) and 1 MiB (100) over the default
# device, the two builds alternating within each size; no FI_RDMX_* variable.
base=$1; head=$2; rounds=${3:-5}
one() { # DIR SIZE ITERS -> MB/s
  local port=$((20000 + RANDOM % 20000))
  FI_PROVIDER_PATH=$1 timeout 60 fi_pingpong -p rdmx -e rdm -m tagged -I "$3" -S "$2" -B $port >/dev/null 2>&1 &
  sleep 0.3
  FI_PROVIDER_PATH=$1 timeout 60 fi_pingpong -p rdmx -e rdm -m tagged -I "$3" -S "$2" -P $port 127.0.0.1 2>/dev/null | awk 'NR==2{print $6}'
  wait
}
echo "round size base_MBps head_MBps"
for r in $(seq 1 "$rounds"); do
  for s in "8 20000" "65536 1000" "1048576 100"; do
    set -- $s
    echo "$r $1 $(one "$base" $1 $2) $(one "$head" $1 $2)"
  done
done
