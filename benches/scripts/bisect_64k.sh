#!/bin/bash
one() { local port=$((20000 + RANDOM % 20000)); local lib=$1
  FI_PROVIDER_PATH=$lib timeout 60 fi_pingpong -p rdmx -e rdm -m tagged -I 1000 -S 65536 -B $port >/dev/null 2>&1 &
  sleep 0.3
  FI_PROVIDER_PATH=$lib timeout 60 fi_pingpong -p rdmx -e rdm -m tagged -I 1000 -S 65536 -P $port 127.0.0.1 2>/dev/null | awk 'NR==2{printf "%.0f", $6}'
  wait; }
for r in $(seq 1 ${1:-15}); do echo "$r base $(one /tmp/prof/baselib) quiet $(one /tmp/prof/b-13e5aad) handle $(one /tmp/prof/b-d7a484d) match $(one /tmp/prof/b-f6228c8) head $(one /tmp/prof/headnolto)"; done
