#!/bin/bash
# ODP probe inside scripts/rxe-vm.sh: rxe0 (veth0, 10.11.12.1) <-> rxe1 (veth1, 10.11.12.2)
export LD_LIBRARY_PATH=/tmp/odpapt/pt/root/usr/lib/x86_64-linux-gnu
PT=/tmp/odpapt/pt/root/usr/bin
echo "### uname -r: $(uname -r)"
echo "### /proc/version: $(cat /proc/version)"
gidx() { local f; for f in /sys/class/infiniband/$1/ports/1/gids/*; do grep -q ":ffff:$2\$" "$f" && { basename "$f"; return; }; done; }
G0=$(gidx rxe0 0a0b:0c01); G1=$(gidx rxe1 0a0b:0c02)
echo "### gid index rxe0=$G0 rxe1=$G1"
echo "### ibv_devinfo -v -d rxe0"
ibv_devinfo -v -d rxe0
port=20000
pair() {  # $1: label; $2: server/client command prefix...; rest: options for both
  local label=$1 tool=$2; shift 2
  port=$((port + 1))
  echo
  echo "### $label: server: $tool -d rxe0 -g/-x $G0 -p $port $*; client: ... -d rxe1 ... 10.11.12.1"
  local gopt=-g; [[ $tool == ib_* ]] && { gopt=-x; tool=$PT/$tool; }
  timeout 120 $tool -d rxe0 $gopt "$G0" -p $port "$@" >/tmp/srv.out 2>&1 &
  local spid=$!
  sleep 1
  timeout 120 $tool -d rxe1 $gopt "$G1" -p $port "$@" 10.11.12.1 >/tmp/cli.out 2>&1
  local crc=$?
  wait $spid; local src=$?
  echo "--- server (rc $src):"; cat /tmp/srv.out
  echo "--- client (rc $crc):"; cat /tmp/cli.out
  echo "### RESULT $label: server rc=$src client rc=$crc"
}
pair "rc_pingpong plain" ibv_rc_pingpong -n 1000
pair "rc_pingpong plain -c" ibv_rc_pingpong -n 1000 -c
pair "rc_pingpong -o (ODP)" ibv_rc_pingpong -n 1000 -o
pair "rc_pingpong -o -c (ODP, validate)" ibv_rc_pingpong -n 1000 -o -c
pair "rc_pingpong -o -P (ODP, prefetch)" ibv_rc_pingpong -n 1000 -o -P
pair "rc_pingpong -o -s 1048576 (ODP, 1 MiB)" ibv_rc_pingpong -n 100 -o -s 1048576
pair "rc_pingpong -O (implicit ODP)" ibv_rc_pingpong -n 1000 -O
pair "ib_read_bw plain 1 MiB" ib_read_bw -F -s 1048576 -n 200
pair "ib_read_bw --odp 1 MiB" ib_read_bw -F -s 1048576 -n 200 --odp
pair "ib_write_bw --odp 1 MiB" ib_write_bw -F -s 1048576 -n 200 --odp
echo
echo "### dmesg (rxe/odp/warn lines)"
dmesg | grep -iE 'rxe|odp|warn|bug|error' | tail -40
