#!/usr/bin/env bash
# Runs CMD [ARGS...] as root inside a throw-away qemu VM that has real kernel verbs
# devices: Soft-RoCE (rdma_rxe) rxe0 on veth0 and rxe1 on veth1, the two ends of one
# veth pair, so that traffic leaves one verbs device and enters the other. For the
# verbs tests on machines without RDMA hardware, or whose kernel has no RDMA subsystem
# (CI); scripts/test-verbs.sh is what scripts/test.sh runs in it.
#
#   scripts/rxe-vm.sh CMD [ARGS...]
#
# The VM boots Debian's stock kernel (the linux-image-amd64 of this machine's Debian
# release: `apt-get download`ed and unpacked into the cache, never installed here) with a
# busybox initramfs built once (the modules it loads: 9p, virtio, overlay, veth,
# sch_netem, rdma_rxe, ib_uverbs, ...). Its root filesystem is this machine's `/`,
# shared read-only over virtio-9p under a tmpfs overlay (writes vanish with the VM), so
# host-built binaries, test executables and ibv_* tools run unchanged. CMD runs in the
# same working directory, memlock unlimited, stdin /dev/null; its stdout and stderr
# stream back here.
#
# In the VM: dummy0 (10.11.13.1-4/24, the first interface, so rdmx's default) with
# rxe2, whose queue pairs reach each other through loopback like a NIC's; and
# veth0 10.11.12.1/24 with rxe0 and veth1 10.11.12.2/24 with rxe1, MTU
# RDMX_VM_MTU (9000: rxe's active_mtu is 4096, its largest); packets of rxe1 for
# 10.11.12.1 leave through veth1 and arrive on veth0 (see the setup below), so
# `tc qdisc add dev veth1 root netem loss 5%` drops 5% of what rxe1 sends (sch_netem is
# loaded); `lo` up; RDMX_VM=1. Two devices in one network namespace, not one in each
# of two namespaces: rxe in the 6.1 kernel keeps its UDP socket in the initial
# namespace, so it does not work across namespaces.
#
# Exit status: CMD's; 125 when the VM itself failed (no qemu or busybox-static, kernel
# not downloadable, the guest never ran CMD: the reason and the guest console's tail are
# printed); 124 when RDMX_VM_TIMEOUT passed (the VM is killed).
#
# Knobs (environment):
#   RDMX_VM_CACHE    kernel package, kernel, initramfs   (default $HOME/.cache/rdmx-vm)
#   RDMX_VM_KERNEL   a kernel image to boot instead of the downloaded one (its modules
#                    must be those of the package: for debugging)
#   RDMX_VM_KERNEL_PKG  another Debian kernel to boot, kernel and modules (e.g. a newer
#                    one, for what newer rxe can do): space-separated .deb files and/or
#                    package names (NAME or NAME=VERSION) that `apt-get download` fetches
#                    with their linux-{image,binary,modules,base}-* dependencies (newer
#                    Debian kernels, e.g. 7.3 of trixie-backports, come split into
#                    these); apt's sources are this machine's, or those of an APT_CONFIG
#                    file (e.g. Dir::Etc::sourcelist naming trixie-backports,
#                    Dir::Etc::sourceparts, Dir::State::Lists and Dir::Cache elsewhere;
#                    `apt-get update` with it first). Cached in a directory of its own in
#                    RDMX_VM_CACHE named after the value. Unset: linux-image-amd64, above
#   RDMX_VM_TIMEOUT  seconds until the VM is killed (default 1800)
#   RDMX_VM_SMP      vCPUs (default nproc, at least 2 and at most 4: with 1, a blocking
#                    ping-pong costs ~8 ms a round trip)
#   RDMX_VM_MEM      MiB of guest memory (default 2048; the tmpfs overlay takes from it)
#   RDMX_VM_MTU      MTU of veth0/veth1 (default 9000)
#   RDMX_VM_RW       space-separated host directories mounted read-write at the same
#                    path (e.g. "$PWD/target" to keep test output); all else is
#                    read-only, and writes there go to the overlay
#   RDMX_VM_ENV      names of more variables to pass (PATH HOME CI RUST_* CARGO_* FI_*
#                    RDMAV_* IBV_* RDMX_* always pass)
#   RDMX_VM_ACCEL    auto | kvm | tcg (auto: kvm when /dev/kvm is usable and not PVM,
#                    which cannot boot a stock kernel; else tcg, ~8 s a boot)
#   RDMX_VM_DEBUG=1  the guest's kernel console on stderr
# In the guest RDMX_VM=1, and RDMX_VM_TCG=1 under software emulation (0 under KVM;
# tests size themselves down with it), unless set here.
set -euo pipefail

say() { echo "rxe-vm: $*" >&2; }
vmfail() { say "FAIL: the VM could not run the command: $*"; exit 125; }

[[ $# -ge 1 ]] || { echo "usage: $0 CMD [ARGS...]" >&2; exit 2; }

CACHE=${RDMX_VM_CACHE:-$HOME/.cache/rdmx-vm}
TIMEOUT=${RDMX_VM_TIMEOUT:-1800}
SMP=${RDMX_VM_SMP:-$(n=$(nproc); ((n < 2)) && n=2; ((n > 4)) && n=4; echo "$n")}
MEM=${RDMX_VM_MEM:-2048}
MTU=${RDMX_VM_MTU:-9000}
ACCEL=${RDMX_VM_ACCEL:-auto}

# ------------------------------------------------------------------ prerequisites
command -v qemu-system-x86_64 >/dev/null || vmfail "qemu-system-x86_64 missing (scripts/setup.sh installs qemu-system-x86)"
BUSYBOX=/bin/busybox
if [[ ! -x $BUSYBOX ]] || ldd "$BUSYBOX" >/dev/null 2>&1; then
  vmfail "no static $BUSYBOX for the initramfs (scripts/setup.sh installs busybox-static)"
fi
command -v rdma >/dev/null || vmfail "rdma (iproute2) missing: the VM uses it to create rxe0/rxe1"

# ------------------------------------------------------------------ kernel and initramfs (cached)
# The kernel package linux-image-amd64 points to now (e.g. linux-image-6.1.0-56-amd64),
# at apt's candidate version; its directory in the cache is named after both. The
# initramfs is named after a hash of this script, so editing the script rebuilds it
# (from the kept .deb, without downloading again).
mkdir -p "$CACHE"
exec 9>"$CACHE/lock"
flock 9
if [[ -n ${RDMX_VM_KERNEL_PKG:-} ]]; then
  # RDMX_VM_KERNEL_PKG: its .debs in $kdir/debs, fetched or copied once.
  kdir=$CACHE/pkg_$(for p in $RDMX_VM_KERNEL_PKG; do basename "$p" .deb; done | paste -sd, | tr -c 'A-Za-z0-9.+=,_\n-' _ | cut -c1-200)
  if ! compgen -G "$kdir/debs/*.deb" >/dev/null; then
    dl=$(mktemp -d "$CACHE/dl.XXXXXX")
    # shellcheck disable=SC2064  # $dl is known now
    trap "rm -rf '$dl'" EXIT
    names=()
    for p in $RDMX_VM_KERNEL_PKG; do
      if [[ $p == *.deb ]]; then
        cp "$p" "$dl/" || vmfail "RDMX_VM_KERNEL_PKG: cannot read $p"
      else names+=("$p")
      fi
    done
    seen=" "
    while ((${#names[@]})); do
      p=${names[0]}; names=("${names[@]:1}")
      [[ $seen != *" ${p%%=*} "* ]] || continue
      seen+="${p%%=*} "
      say "downloading $p into $kdir"
      (cd "$dl" && apt-get download -q -o APT::Sandbox::User=root "$p" >&2) ||
        vmfail "RDMX_VM_KERNEL_PKG: apt-get download $p failed"
      for d in $(apt-cache depends "$p" 2>/dev/null | awk '$1 == "Depends:" && $2 ~ /^linux-(image|binary|modules|base)-/ {print $2}'); do
        names+=("$d")
      done
    done
    mkdir -p "$kdir/debs"
    mv "$dl"/*.deb "$kdir/debs/"
    rm -rf "$dl"
    trap - EXIT
  fi
  debs=("$kdir"/debs/*.deb)
else
kpkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ && !found {print $2; found = 1}' || true)
kver=
[[ -z $kpkg ]] || kver=$(apt-cache policy "$kpkg" 2>/dev/null | awk '/Candidate:/ {print $2}')
if [[ -z $kpkg || -z $kver || $kver == "(none)" ]]; then
  # No apt lists (offline, or `apt-get update` never ran): the newest kernel cached.
  kdir=$(find "$CACHE" -mindepth 2 -maxdepth 2 -name kernel.deb -printf '%h\n' 2>/dev/null | sort -V | tail -n 1)
  [[ -n $kdir ]] || vmfail "apt cannot resolve linux-image-amd64 (run apt-get update) and nothing is cached in $CACHE"
  say "apt cannot resolve linux-image-amd64: using the cached $(basename "$kdir")"
else
  kdir=$CACHE/${kpkg}_$kver
fi
if [[ ! -s $kdir/kernel.deb ]]; then
  say "downloading $kpkg $kver (~70 MB, once) into $kdir"
  mkdir -p "$kdir"
  dl=$(mktemp -d "$CACHE/dl.XXXXXX")
  fetch() { (cd "$dl" && apt-get download -q -o APT::Sandbox::User=root "$kpkg=$kver" >&2); }
  if ! fetch; then
    # the mirror moved on since the apt lists were fetched
    SUDO=; [[ $(id -u) -eq 0 ]] || SUDO=sudo
    $SUDO apt-get update -qq >&2 || true
    kver=$(apt-cache policy "$kpkg" 2>/dev/null | awk '/Candidate:/ {print $2}')
    fetch || { rm -rf "$dl" "$kdir"; vmfail "apt-get download $kpkg failed"; }
  fi
  mv "$dl"/*.deb "$kdir/kernel.deb"
  rm -rf "$dl"
fi
debs=("$kdir/kernel.deb")
fi
initrd=$kdir/initrd-$(sha256sum "$0" | cut -c1-12).img
if [[ ! -s $initrd || ! -s $kdir/vmlinuz ]]; then
  work=$(mktemp -d "$CACHE/build.XXXXXX")
  # shellcheck disable=SC2064  # $work is known now
  trap "rm -rf '$work'" EXIT
  for deb in "${debs[@]}"; do dpkg-deb -x "$deb" "$work/root" || vmfail "cannot unpack $deb"; done
  # newer packages: /usr/lib/modules/$kv, with the kernel image in it
  [[ -e $work/root/lib/modules || ! -d $work/root/usr/lib/modules ]] ||
    { mkdir -p "$work/root/lib"; ln -s ../usr/lib/modules "$work/root/lib/modules"; }
  kv=$(ls "$work/root/lib/modules")
  if [[ -f $work/root/boot/vmlinuz-$kv ]]; then cp "$work/root/boot/vmlinuz-$kv" "$kdir/vmlinuz"
  else cp "$work/root/lib/modules/$kv/vmlinuz" "$kdir/vmlinuz" || vmfail "no kernel image in ${debs[*]}"
  fi
  mods=$work/root/lib/modules/$kv
  "$BUSYBOX" depmod -b "$work/root" "$kv" || vmfail "depmod failed"
  # Loaded in this order, each after what it depends on (modules.dep). Those built
  # into the kernel are not in modules.dep and are skipped. crc32 is what rxe's ICRC
  # asks the crypto API for: there is no modprobe in the VM to load it on demand
  # (kernels >= 6.15 have neither crc32 module: their rxe calls the crc32 library).
  want="virtio_pci virtio_console 9pnet_virtio 9p overlay veth dummy sch_netem
        crc32_generic crc32_pclmul ib_core ib_uverbs rdma_rxe"
  : >"$work/order"
  add() {  # $1: path of a module relative to $mods; its dependencies first
    local d
    grep -qxF "$1" "$work/order" && return
    # shellcheck disable=SC2013  # module paths have no spaces
    for d in $(awk -v m="$1:" '$1 == m { for (i = 2; i <= NF; i++) print $i }' "$mods/modules.dep"); do add "$d"; done
    echo "$1" >>"$work/order"
  }
  for m in $want; do
    rel=$(awk -F: -v n="$m" '{ f = $1; sub(".*/", "", f); sub("[.]ko.*$", "", f); gsub("-", "_", f); if (f == n) { print $1; exit } }' "$mods/modules.dep")
    if [[ -n $rel ]]; then add "$rel"
    elif grep -q "/${m//_/[_-]}\.ko" "$mods/modules.builtin"; then :
    elif [[ $m == crc32_* && -n ${RDMX_VM_KERNEL_PKG:-} ]]; then :
    else vmfail "kernel $kv has no module $m"
    fi
  done
  ird=$work/initramfs
  mkdir -p "$ird"/{bin,dev,proc,sys,mods,lower,upper,newroot,xfer}
  cp "$BUSYBOX" "$ird/bin/busybox"
  i=0
  while read -r rel; do
    i=$((i + 1))
    case $rel in
      *.ko) cp "$mods/$rel" "$ird/mods/$(printf %02d $i)-${rel##*/}" ;;
      *.ko.xz) xz -dc "$mods/$rel" >"$ird/mods/$(printf %02d $i)-$(basename "$rel" .xz)" ;;
      *) vmfail "cannot handle module file $rel" ;;
    esac
  done <"$work/order"
  # The guest's /init. Mounts the host's / (9p tag hostroot) read-only under a tmpfs
  # overlay, the per-run directory (tag xfer) and the read-write directories (tags
  # rw1..), then, chrooted into the host's root: /xfer/setup.sh (the devices), then
  # /xfer/cmd.sh with stdout/stderr on the virtio-serial ports "out"/"err"; its exit
  # status goes to /xfer/rc. A failure before CMD writes /xfer/failed.
  cat >"$ird/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
echo /bin/true >/proc/sys/kernel/modprobe
fail() { echo "rxe-vm init: $*"; echo "$*" >/xfer/failed; sync; poweroff -f; }
for m in /mods/*.ko; do insmod "$m" || echo "rxe-vm init: insmod $m failed"; done
O=trans=virtio,version=9p2000.L,msize=262144
mount -t 9p -o $O xfer /xfer || { echo "rxe-vm init: cannot mount xfer"; poweroff -f; }
mount -t 9p -o $O,ro,cache=loose hostroot /lower || fail "cannot mount the host's root (9p)"
mount -t tmpfs -o mode=0755 upper /upper && mkdir /upper/u /upper/w
mount -t overlay -o lowerdir=/lower,upperdir=/upper/u,workdir=/upper/w root /newroot ||
  fail "cannot mount the overlay over the host's root"
R=/newroot
mount -t proc proc $R/proc; mount -t sysfs sys $R/sys; mount -t devtmpfs dev $R/dev
mkdir -p $R/dev/pts $R/dev/shm; mount -t devpts devpts $R/dev/pts; mount -t tmpfs shm $R/dev/shm
ln -s /proc/self/fd $R/dev/fd; ln -s fd/0 $R/dev/stdin; ln -s fd/1 $R/dev/stdout; ln -s fd/2 $R/dev/stderr
mount -t tmpfs run $R/run
mkdir -p $R/xfer; mount --bind /xfer $R/xfer
n=0
while read -r d; do
  n=$((n + 1)); mkdir -p "$R$d"; mount -t 9p -o $O rw$n "$R$d" || fail "cannot mount $d read-write"
done </xfer/rw
OUT=/dev/null; ERR=/dev/null
for p in /sys/class/virtio-ports/*; do
  case "$(cat $p/name)" in out) OUT=/dev/${p##*/} ;; err) ERR=/dev/${p##*/} ;; esac
done
chroot $R /bin/bash /xfer/setup.sh >/xfer/setup.log 2>&1 || fail "device setup failed (/xfer/setup.sh)"
chroot $R /bin/bash /xfer/cmd.sh </dev/null >$OUT 2>$ERR
echo $? >/xfer/rc
sync
poweroff -f
INIT
  chmod +x "$ird/init"
  (cd "$ird" && find . | "$BUSYBOX" cpio -o -H newc 2>/dev/null) | gzip -1 >"$initrd.tmp"
  mv "$initrd.tmp" "$initrd"
  find "$kdir" -name 'initrd-*.img' ! -path "$initrd" -delete
  say "built $initrd ($(du -h "$initrd" | cut -f1)), kernel $kv, modules: $(xargs -n1 basename <"$work/order" | tr '\n' ' ')"
  rm -rf "$work"
  trap - EXIT
fi
flock -u 9
exec 9>&-
KERNEL=${RDMX_VM_KERNEL:-$kdir/vmlinuz}
[[ -f $KERNEL ]] || vmfail "no kernel image $KERNEL"

# ------------------------------------------------------------------ accelerator
if [[ $ACCEL == auto ]]; then
  ACCEL=tcg
  if [[ -r /dev/kvm && -w /dev/kvm && ! -d /sys/module/kvm_pvm ]]; then ACCEL=kvm; fi
fi
case $ACCEL in
  kvm) accel=(-accel kvm -accel "tcg,thread=multi") ;;  # tcg if kvm cannot start
  tcg) accel=(-accel "tcg,thread=multi") ;;
  *) vmfail "RDMX_VM_ACCEL=$ACCEL: auto, kvm or tcg" ;;
esac

# ------------------------------------------------------------------ this run's directory
X=$(mktemp -d "${TMPDIR:-/tmp}/rdmx-vm.XXXXXX")
QPID='' CATS=()
# shellcheck disable=SC2317  # run by the trap
cleanup() {
  [[ -z $QPID ]] || kill "$QPID" 2>/dev/null || true
  ((${#CATS[@]} == 0)) || kill "${CATS[@]}" 2>/dev/null || true
  rm -rf "$X"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Two rxe devices whose traffic crosses a wire: a veth pair. Over two dummy netdevs
# (or any two netdevs with local addresses) the kernel routes a packet for the other
# device's address back into the sender: rxe1 would talk to itself. So rxe's route
# lookups, which name the device's netdev as output interface, get a table of their
# own (rules before the local table); the peer's MAC is a permanent neighbour (no ARP);
# a packet from the other, local, address is accepted (accept_local, no rp_filter).
# Sockets that name no output device still reach local addresses through lo.
cat >"$X/setup.sh" <<EOF
set -eu
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
ip link set lo up
for k in all default; do
  echo 1 >/proc/sys/net/ipv4/conf/\$k/accept_local
  echo 0 >/proc/sys/net/ipv4/conf/\$k/rp_filter
done
# First (the lowest interface index, so the interface rdmx picks by default):
# dummy0 with rxe2, whose queue pairs talk to each other through loopback as a
# NIC's do (over the veth pair below, a device's traffic to its own address
# would leave on the wire). Four addresses: four GIDs, distinct peers.
# (loading the dummy module may have created it already)
ip link show dummy0 >/dev/null 2>&1 || ip link add dummy0 type dummy
ip link set dummy0 mtu $MTU up
for a in 1 2 3 4; do ip addr add 10.11.13.\$a/24 dev dummy0; done
ip link add veth0 mtu $MTU type veth peer name veth1 mtu $MTU
ip rule add pref 1000 lookup local
ip rule del pref 0
for i in 0 1; do
  ip addr add 10.11.12.\$((i + 1))/24 dev veth\$i
  ip link set veth\$i up
  ip rule add pref \$((10 + i)) oif veth\$i lookup \$((100 + i))
  ip route add 10.11.12.0/24 dev veth\$i table \$((100 + i))
done
ip neigh add 10.11.12.2 lladdr "\$(cat /sys/class/net/veth1/address)" dev veth0 nud permanent
ip neigh add 10.11.12.1 lladdr "\$(cat /sys/class/net/veth0/address)" dev veth1 nud permanent
# Each device's own address as a neighbour at its own MAC: rxe delivers a packet
# whose destination MAC is its netdev's own in place (loopback, as a NIC does),
# so two queue pairs of one veth-backed device reach each other too.
for i in 0 1; do
  ip neigh add 10.11.12.\$((i + 1)) lladdr "\$(cat /sys/class/net/veth\$i/address)" dev veth\$i nud permanent
done
for i in 0 1; do rdma link add rxe\$i type rxe netdev veth\$i; done
rdma link add rxe2 type rxe netdev dummy0
# rxe adds the IPv4-mapped GIDs of the addresses shortly after
for t in \$(seq 100); do
  grep -qs ':ffff:0a0b:0c01\$' /sys/class/infiniband/rxe0/ports/1/gids/* &&
    grep -qs ':ffff:0a0b:0c02\$' /sys/class/infiniband/rxe1/ports/1/gids/* &&
    grep -qs ':ffff:0a0b:0d04\$' /sys/class/infiniband/rxe2/ports/1/gids/* && exit 0
  sleep 0.1
done
echo "no IPv4 GID on rxe0/rxe1/rxe2 after 10 s"; rdma link show
grep -s . /sys/class/infiniband/rxe[01]/ports/1/gids/[0-3] /sys/class/infiniband/rxe[01]/ports/1/gid_attrs/types/[0-3]
exit 1
EOF

{
  echo 'ulimit -l unlimited'
  for v in PATH HOME USER LANG TERM CI ${RDMX_VM_ENV:-} \
    $(compgen -e | grep -E '^(RUST_|CARGO_|FI_|RDMAV_|IBV_|RDMX_)' || true); do
    [[ -z ${!v+x} ]] || printf 'export %s=%q\n' "$v" "${!v}"
  done
  echo 'export RDMX_VM=1'
  # RDMX_VM_TCG=1 under software emulation (tests scale down there: fi_tests::vm_tcg),
  # told by the guest itself: KVM gives it kvm-clock, TCG never does (also when
  # RDMX_VM_ACCEL=kvm fell back to TCG). Set on the host, it is passed as it is.
  echo '[[ -n ${RDMX_VM_TCG:-} ]] || { grep -qsw kvm-clock /sys/devices/system/clocksource/clocksource0/available_clocksource && export RDMX_VM_TCG=0 || export RDMX_VM_TCG=1; }'
  printf 'cd %q || exit 126\n' "$PWD"
  printf '%q ' "$@"
  echo
} >"$X/cmd.sh"

rw=()
: >"$X/rw"
n=0
for d in ${RDMX_VM_RW:-}; do
  [[ -d $d ]] || vmfail "RDMX_VM_RW: $d is not a directory"
  d=$(realpath "$d")
  n=$((n + 1))
  rw+=(-virtfs "local,path=$d,mount_tag=rw$n,security_model=none,multidevs=remap")
  echo "$d" >>"$X/rw"
done

# ------------------------------------------------------------------ boot
# The guest's stdout/stderr arrive through FIFOs copied by cat to ours (works whether
# ours are pipes, files or terminals, and keeps their order within each stream).
mkfifo "$X/out" "$X/err"
cat "$X/out" &
CATS+=($!)
cat "$X/err" >&2 &
CATS+=($!)
console=$X/console.log
[[ -z ${RDMX_VM_DEBUG:-} ]] || console=/proc/self/fd/2
say "booting ${RDMX_VM_KERNEL:-$(basename "$kdir")} (${ACCEL}, $SMP vCPUs, $MEM MiB) for: $*"
timeout -k 5 "$TIMEOUT" qemu-system-x86_64 "${accel[@]}" -cpu max -smp "$SMP" -m "$MEM" \
  -nodefaults -no-user-config -display none -no-reboot -nic none \
  -kernel "$KERNEL" -initrd "$initrd" \
  -append "console=ttyS0 quiet loglevel=4 panic=-1 mitigations=off tsc=reliable ${RDMX_VM_DEBUG:+ignore_loglevel}" \
  -chardev file,id=con,path="$console",append=on -serial chardev:con \
  -device virtio-serial-pci,id=vser \
  -chardev file,id=out,path="$X/out" -device virtserialport,bus=vser.0,chardev=out,name=out \
  -chardev file,id=err,path="$X/err" -device virtserialport,bus=vser.0,chardev=err,name=err \
  -virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap" \
  -virtfs "local,path=$X,mount_tag=xfer,security_model=none,multidevs=remap" \
  "${rw[@]}" </dev/null >>"$console" 2>&1 &
QPID=$!
qrc=0
wait "$QPID" || qrc=$?
QPID=''
# The cats end at EOF when qemu exits; if qemu never opened the FIFOs they wait in
# open(): give them a moment, then end them.
for _ in $(seq 20); do
  kill -0 "${CATS[@]}" 2>/dev/null || break
  sleep 0.1
done
kill "${CATS[@]}" 2>/dev/null || true
wait "${CATS[@]}" 2>/dev/null || true
CATS=()

if [[ -s $X/rc ]]; then
  exit "$(cat "$X/rc")"
fi
if ((qrc == 124)); then
  say "FAIL: timeout: the command did not end within RDMX_VM_TIMEOUT=${TIMEOUT}s, VM killed"
  exit 124
fi
if [[ -s $X/failed ]]; then
  say "guest: $(cat "$X/failed")"
  [[ ! -s $X/setup.log ]] || sed 's/^/rxe-vm: setup: /' "$X/setup.log" >&2
fi
say "qemu exited with $qrc; guest console (last 40 lines):"
[[ -n ${RDMX_VM_DEBUG:-} ]] || tail -n 40 "$console" | sed 's/^/rxe-vm: | /' >&2
vmfail "see above (RDMX_VM_DEBUG=1 shows the whole console)"
