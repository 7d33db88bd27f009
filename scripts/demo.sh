#!/usr/bin/env bash
# The demo: set up, build, install the provider into build-out/lib, show what
# libfabric sees, and run a real two-process ping-pong over rdmx on loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/build.sh
export FI_PROVIDER_PATH="$(pwd)/build-out/lib"
echo
echo "== fi_info -l (rdmx is loaded from FI_PROVIDER_PATH=$FI_PROVIDER_PATH)"
fi_info -l | grep -A1 '^rdmx:'
echo
echo "== fi_info -p rdmx -t FI_EP_RDM"
fi_info -p rdmx -t FI_EP_RDM
echo
PORT=${RDMX_DEMO_PORT:-47593}
for dev in udp shm; do
  echo "== two processes: fi_pingpong -p rdmx -e rdm (FI_RDMX_DEVICE=$dev, data verified with -c)"
  FI_RDMX_DEVICE=$dev fi_pingpong -p rdmx -e rdm -B "$PORT" -I 1000 -c -S 4096 >/tmp/rdmx-demo-server.log 2>&1 &
  srv=$!
  sleep 0.5
  FI_RDMX_DEVICE=$dev timeout 60 fi_pingpong -p rdmx -e rdm -P "$PORT" -I 1000 -c -S 4096 127.0.0.1
  wait "$srv"
  echo
done
