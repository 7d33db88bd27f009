#!/bin/bash
# fi_pingpong -d verbs between rxe0 and rxe1, 1 MiB and 64 KiB, copy (c5b63bb) vs gather (new), alternating.
hostname rdmx-vm
port=47300
for r in 1 2 3; do
  for v in old new; do
    if [ $v = old ]; then lib=/tmp/oldtree/build-out/lib; else lib=/work/main/build-out/lib; fi
    for s in 65536 1048576; do
      port=$((port+1))
      env FI_PROVIDER_PATH=$lib FI_PROVIDER=rdmx FI_RDMX_IFACE=rxe0 fi_pingpong -p rdmx -e rdm -d verbs -m tagged -S $s -I 30 -B $port >/dev/null 2>&1 &
      sleep 1
      out=$(env FI_PROVIDER_PATH=$lib FI_PROVIDER=rdmx FI_RDMX_IFACE=rxe1 fi_pingpong -p rdmx -e rdm -d verbs -m tagged -S $s -I 30 -P $port 10.11.12.1 2>&1 | awk '/^[0-9]/ {print $6, $7}')
      wait
      echo "run $r $v size $s MB/s,usec: $out"
    done
  done
done
