#!/usr/bin/env bash
# Every verbs test of rdmx, in one boot of the Soft-RoCE VM (scripts/rxe-vm.sh):
#
#   scripts/rxe-vm.sh scripts/test-verbs.sh [TEST_EXECUTABLE...]
#
#  1. devices: ibv_devinfo lists rxe0 and rxe1, port 1 PORT_ACTIVE, and each has a
#     RoCE v2 IPv4-mapped GID (its index is what -g / ibv_query_gid need);
#  2. ibv_ud_pingpong from rxe1 (10.11.12.2) to rxe0 (10.11.12.1), messages of 4096
#     bytes (rxe's active MTU on the VM's MTU 9000 veths), and each device's packet
#     counters show the traffic left one device and entered the other (not a device
#     talking to itself, which a ping-pong alone cannot tell when both QPNs are equal);
#  3. each test executable given (arguments, and the paths listed one a line in the
#     file $RDMX_VERBS_TESTS) runs its tests whose name contains $RDMX_VERBS_FILTER
#     (default "verbs"), --test-threads=1, with RDMX_VERBS_REQUIRED=1 (where a verbs
#     test would skip for want of a device, it fails).
# Each step prints one PASS or FAIL line; the exit status is 1 if any failed.
#
# Cargo cannot build in the VM (read-only tree, and emulation is slow), so the
# executables are found on the host before the boot:
#
#   scripts/test-verbs.sh --list > FILE
#
# builds the test executables of $RDMX_VERBS_CARGO (default: the whole workspace) like
# `cargo test --release` and prints those that have a test matching the filter.
# scripts/test.sh does both. So a new verbs test needs nothing here: name it (or its
# module) with "verbs", have it skip without a device unless RDMX_VERBS_REQUIRED=1.
set -euo pipefail
cd "$(dirname "$0")/.."
filter=${RDMX_VERBS_FILTER:-verbs}

if [[ ${1:-} == --list ]]; then
  export PATH="$HOME/.cargo/bin:$PATH"
  # shellcheck disable=SC2086  # RDMX_VERBS_CARGO is a list of cargo arguments
  json=$(cargo test --release ${RDMX_VERBS_CARGO:---workspace} --no-run --message-format=json)
  # libtest executables: artifacts built with the test profile (benches with
  # harness = false are not built by `cargo test`)
  grep -E '"profile":\{[^}]*"test":true\}' <<<"$json" |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | sort -u |
    while read -r exe; do
      # (grep -c reads it all: grep -q could end the listing with EPIPE)
      if [[ $("$exe" --list "$filter" 2>/dev/null | grep -c ': test$') != 0 ]]; then echo "$exe"; fi
    done
  exit 0
fi

start=$SECONDS
# mpirun refuses a host name the VM leaves unset ("(none)").
if [[ $(hostname) == "(none)" || -z $(hostname) ]]; then hostname rdmx-vm; fi
failed=()
pass() { echo "test-verbs: PASS: $*"; }
fail() { echo "test-verbs: FAIL: $*"; failed+=("$1"); }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The index of the RoCE v2 GID of device $1 (port 1) that maps an IPv4 address.
gid_index() {
  local port=/sys/class/infiniband/$1/ports/1 f i
  for f in "$port"/gids/*; do
    i=${f##*/}
    if [[ $(cat "$f" 2>/dev/null) == 0000:0000:0000:0000:0000:ffff:* &&
      $(cat "$port/gid_attrs/types/$i" 2>/dev/null) == "RoCE v2" ]]; then
      echo "$i"
      return 0
    fi
  done
  return 1
}

# Packets sent and received by rxe0, then by rxe1, on one line.
counters() {
  local c=/sys/class/infiniband
  cat $c/rxe0/ports/1/hw_counters/{sent,rcvd}_pkts $c/rxe1/ports/1/hw_counters/{sent,rcvd}_pkts | paste -sd ' '

}

# ------------------------------------------------------------------ 1. devices
declare -A gid
devs_ok=1
for d in rxe0 rxe1; do
  if ! info=$(ibv_devinfo -d "$d" 2>&1); then
    fail "devices: ibv_devinfo -d $d: $info"; devs_ok=0; continue
  fi
  state=$(awk '/state:/ {print $2; exit}' <<<"$info")
  mtu=$(awk '/active_mtu:/ {print $2; exit}' <<<"$info")
  if [[ $state != PORT_ACTIVE ]]; then
    fail "devices: $d port 1 is ${state:-absent}, not PORT_ACTIVE"; devs_ok=0; continue
  fi
  if ! gid[$d]=$(gid_index "$d"); then
    fail "devices: $d has no RoCE v2 IPv4 GID"; devs_ok=0; continue
  fi
  pass "devices: $d PORT_ACTIVE, active_mtu $mtu, RoCE v2 IPv4 GID index ${gid[$d]} ($(cat "/sys/class/infiniband/$d/ports/1/gids/${gid[$d]}"))"
done

# ------------------------------------------------------------------ 2. UD ping-pong rxe1 -> rxe0
if ((devs_ok)); then
  addr0=$(ip -4 -o addr show dev "$(rdma link show rxe0/1 | awk '{ for (i = 1; i < NF; i++) if ($i == "netdev") print $(i + 1) }')" | awk '{split($4, a, "/"); print a[1]; exit}')
  port=18515
  args=(-s 4096 -n 1000 -p "$port")
  timeout 120 ibv_ud_pingpong -d rxe0 -g "${gid[rxe0]}" "${args[@]}" >"$tmp/server" 2>&1 &
  server=$!
  for _ in $(seq 100); do  # until the server listens (its TCP exchange of addresses)
    ss -Hltn "sport = :$port" | grep -q . && break
    sleep 0.1
  done
  crc=0 src=0
  read -r sent0 rcvd0 sent1 rcvd1 < <(counters)
  timeout 120 ibv_ud_pingpong -d rxe1 -g "${gid[rxe1]}" "${args[@]}" "$addr0" >"$tmp/client" 2>&1 || crc=$?
  wait "$server" || src=$?
  read -r s0 r0 s1 r1 < <(counters)
  moved="rxe0 sent $((s0 - sent0)) and received $((r0 - rcvd0)) packets, rxe1 $((s1 - sent1)) and $((r1 - rcvd1))"
  if ((crc == 0 && src == 0 && s0 - sent0 >= 1000 && r0 - rcvd0 >= 1000 && s1 - sent1 >= 1000 && r1 - rcvd1 >= 1000)); then
    pass "ibv_ud_pingpong rxe1 -> rxe0 ($addr0) ${args[*]}: $(grep -h 'usec/iter' "$tmp/client" | head -n 1); $moved"
  else
    sed 's/^/  server| /' "$tmp/server"
    sed 's/^/  client| /' "$tmp/client"
    fail "ibv_ud_pingpong rxe1 -> rxe0 ($addr0) ${args[*]}: client exit $crc, server exit $src; $moved"
  fi
else
  fail "ibv_ud_pingpong: not run (no usable rxe0/rxe1)"
fi

# ------------------------------------------------------------------ 3. the project's verbs tests
tests=("$@")
if [[ -n ${RDMX_VERBS_TESTS:-} ]]; then
  [[ -r $RDMX_VERBS_TESTS ]] || { fail "RDMX_VERBS_TESTS: cannot read $RDMX_VERBS_TESTS"; tests=(); }
  [[ ! -r $RDMX_VERBS_TESTS ]] || mapfile -t -O "${#tests[@]}" tests < <(grep -v '^[[:space:]]*$' "$RDMX_VERBS_TESTS")
fi
if ((${#tests[@]} == 0)); then
  # A run that finds no verbs test has tested nothing: a listing gone wrong
  # (a filter renamed, a build that dropped them) must not pass as green.
  fail "no test executable has a test matching '$filter'"
fi
for exe in "${tests[@]}"; do
  name=${exe#"$PWD"/}
  n=$("$exe" --list "$filter" 2>/dev/null | grep -c ': test$' || true)
  if ((n == 0)); then
    fail "$name: no test matches '$filter'"
    continue
  fi
  t=$SECONDS
  if RDMX_VERBS_REQUIRED=1 "$exe" --test-threads=1 "$filter"; then
    pass "$name: $n tests matching '$filter' ($((SECONDS - t)) s)"
  else
    fail "$name: $n tests matching '$filter', exit $? ($((SECONDS - t)) s)"
  fi
done

if ((${#failed[@]})); then
  echo "test-verbs: FAILED ${#failed[@]} step(s) in $((SECONDS - start)) s"
  exit 1
fi
echo "test-verbs: all passed in $((SECONDS - start)) s (VM up $(cut -d' ' -f1 /proc/uptime) s)"
