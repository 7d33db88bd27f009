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
#     (default "verbs"), one at a time (--exact), with RDMX_VERBS_REQUIRED=1 (where a
#     verbs test would skip for want of a device, it fails), each within its budget
#     (`budget` below): past it the stacks of its processes are printed and it is
#     ended, and the next test runs.
# Each step and test prints one PASS or FAIL line with its seconds; the exit status is
# 1 if any failed. Under emulation (RDMX_VM_TCG=1, set by scripts/rxe-vm.sh) the
# tests scale themselves down (fi_tests::vm_tcg).
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
echo "test-verbs: RDMX_VM_TCG=${RDMX_VM_TCG:-unset} ($( [[ ${RDMX_VM_TCG:-} == 1 ]] && echo "software emulation: tests scale down" || echo "full size"))"
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

# Each test's budget in seconds, sized for software emulation (qemu TCG, the CI
# machines': ~10x slower than KVM) on a loaded 2-core host: about three times the
# time measured there with RDMX_VM_TCG=1 (a host busy with other work made the same
# runs 1.5-2.5x slower), so that only a stall, never a slow run, meets it. A test
# past its budget is a hang to report (stacks printed), not noise to retry.
budget() {
  case $1 in
    # Device conformance and unit tests (rdm): 0-4 s each; the slowest waits out
    # a short read timeout.
    verbs::* | verbs_ud::* | device::verbs::*) echo 60 ;;
    # A reader killed mid RDMA read: bounded by their own checks (8 s after the
    # kill) and their processes' start (20 s each at most); 8 s measured.
    verbs_sigkill_*) echo 90 ;;
    # Job isolation, fork+exec, the cache under munmap: 3-7 s.
    verbs_jobs_are_isolated_by_the_nic | verbs_a_child_that_execs_* | verbs_a_send_buffer_unmapped_*) echo 60 ;;
    # One fi_pingpong -S all tagged run, ~45 s.
    verbs_pingpong_every_size_with_data_checks_on_one_device) echo 150 ;;
    # fi_pingpong -S all between two devices, 31-43 s; 2 x 20 MiB by rendezvous, 14-22 s.
    verbs_pulls_by_rdma_read_between_two_devices) echo 150 ;;
    verbs_rendezvous_moves_the_registration_cache_counters) echo 90 ;;
    # 7 fi_pingpong runs under loss and faults (see the test), 66 s (167 s at full size).
    verbs_pingpong_between_two_devices_under_wire_loss_and_injected_faults) echo 300 ;;
    # 2 x 200 small round trips, -S all between two hosts, 1 MiB x 10: 63-85 s.
    verbs_auto_lists_the_verbs_domain_and_reaches_other_hosts_over_ud) echo 240 ;;
    # MPI (mpirun's start alone is ~5 s there): p2p np 2, rma np 2, 21 s.
    verbs_p2p_collectives_and_one_sided) echo 120 ;;
    # np 4 on two hosts: p2p to 16 MiB and an alltoall, 51 s.
    verbs_auto_np4_on_two_hosts_with_no_rdmx_variable) echo 180 ;;
    # np 4 p2p to 64 MiB, coll, p2p to 16 MiB under loss and under faults: 108 s
    # (175 s with 64 MiB under loss, where one p2p run alone took 131-200 s).
    verbs_np4_over_two_devices_plain_under_wire_loss_and_injected_faults) echo 420 ;;
    # 250 rounds of the alltoall: 28 s (1002 took 60-160 s).
    verbs_rc_bound_of_two_with_four_peers_closes_and_reopens_without_leaking) echo 150 ;;
    # A new test until it is measured and listed here.
    *) echo 300 ;;
  esac
}

# The processes of session $1 (a test past its budget), and the stacks of every thread
# of each but the launchers (gdb; under emulation an attach takes seconds): where it
# stood, for the report a hang needs.
stacks() {
  local p comm
  ps -s "$1" -o pid=,ppid=,stat=,etime=,wchan:24=,args= | cut -c1-240 | sed 's/^/  ps| /'
  command -v gdb >/dev/null || { echo "  (no gdb: no stacks)"; return 0; }
  for p in $(ps -s "$1" -o pid=); do
    comm=$(cat "/proc/$p/comm" 2>/dev/null) || continue
    case $comm in sh | bash | env | unshare | mpirun | orterun | orted | timeout | setsid) continue ;; esac
    echo "  stacks of $p ($(tr '\0' ' ' <"/proc/$p/cmdline" | cut -c1-200)):"
    timeout 120 gdb -p "$p" -batch -nx -ex 'thread apply all bt 24' </dev/null 2>&1 |
      grep -E '^(Thread|#)' | sed 's/^/  gdb| /' || true
  done
}

# Runs CMD ARGS... in a session of its own, at most $1 seconds. Past them: stacks (above),
# then the whole session ended (TERM, KILL 5 s later: MPI ranks and fi_pingpong
# children too), netem taken off the veths (a test ended under its loss guard would
# leave its loss to the tests after it), and status 124.
run_within() {
  local limit=$1 pid deadline
  shift
  # A background job of this (non-interactive) shell leads no process group, so
  # setsid does not fork: $! is the new session's id.
  setsid "$@" </dev/null &
  pid=$!
  deadline=$((SECONDS + limit))
  while kill -0 "$pid" 2>/dev/null; do
    if ((SECONDS >= deadline)); then
      echo "test-verbs: $* is past its budget of $limit s:"
      stacks "$pid"
      pkill -TERM -s "$pid" || true
      sleep 5
      pkill -KILL -s "$pid" || true
      wait "$pid" 2>/dev/null || true
      for d in veth0 veth1; do tc qdisc del dev "$d" root 2>/dev/null || true; done
      return 124
    fi
    sleep 1
  done
  wait "$pid"
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
# One test at a time (--exact), each within its budget (below): a test that hangs is
# ended at its budget with the stacks of its stuck processes printed, and the tests
# after it still run. (Whole executables under one RDMX_VM_TIMEOUT let one stall eat
# the VM's time and say neither which test nor where it stood.)
for exe in "${tests[@]}"; do
  name=${exe#"$PWD"/}
  mapfile -t names < <("$exe" --list "$filter" 2>/dev/null | sed -n 's/: test$//p')
  if ((${#names[@]} == 0)); then
    fail "$name: no test matches '$filter'"
    continue
  fi
  for t in "${names[@]}"; do
    b=$(budget "$t")
    t0=$SECONDS rc=0
    run_within "$b" env RDMX_VERBS_REQUIRED=1 "$exe" --test-threads=1 --exact "$t" || rc=$?
    if ((rc == 0)); then
      pass "$name $t ($((SECONDS - t0)) s of $b; at $((SECONDS - start)) s)"
    elif ((rc == 124)); then
      fail "$name $t: over its budget of $b s, ended (stacks above; at $((SECONDS - start)) s)"
    else
      fail "$name $t: exit $rc ($((SECONDS - t0)) s of $b; at $((SECONDS - start)) s)"
    fi
  done
done

if ((${#failed[@]})); then
  echo "test-verbs: FAILED ${#failed[@]} step(s) in $((SECONDS - start)) s"
  exit 1
fi
echo "test-verbs: all passed in $((SECONDS - start)) s (VM up $(cut -d' ' -f1 /proc/uptime) s)"
