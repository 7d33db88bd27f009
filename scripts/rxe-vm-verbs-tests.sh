#!/bin/bash
# Runs rdm's verbs UD device tests inside the rxe VM (a real Soft-RoCE
# device; see /work/shared/tools/rxe-vm/README.md). Run it through the
# runner, as root in the VM, from the workspace root:
#   run-in-rxe-vm.sh scripts/rxe-vm-verbs-tests.sh [TEST_BIN] [FILTER]
# TEST_BIN defaults to the newest release device_conformance binary
# (`cargo test --release -p rdm --no-run` builds it); FILTER to "verbs".
# The runner brings up rxe0 on dummy0 (10.11.12.1/24); this adds three
# more addresses to dummy0 (more GIDs on rxe0, for the address-handle cache
# test) and a second device rxe1 on dummy1 (10.11.13.1/24).
set -eu
BIN=${1:-$(ls -t target/release/deps/device_conformance-* | grep -v '\.d$' | head -1)}
FILTER=${2:-verbs}
for i in 2 3 4; do ip addr add 10.11.12.$i/24 dev dummy0; done
ip link add dummy1 type dummy
ip link set dummy1 up mtu 9000
ip addr add 10.11.13.1/24 dev dummy1
rdma link add rxe1 type rxe netdev dummy1
# Wait until the GID tables carry the new addresses.
for _ in $(seq 50); do
  n=$(cat /sys/class/infiniband/rxe0/ports/1/gids/* /sys/class/infiniband/rxe1/ports/1/gids/* 2>/dev/null | grep -c ffff:0a0b || true)
  [ "$n" -ge 5 ] && break
  sleep 0.1
done
rdma link show
export RDMX_VERBS_REQUIRED=1
exec "$BIN" "$FILTER" --test-threads=1 ${NOCAPTURE:+--nocapture}
