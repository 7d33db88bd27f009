#!/usr/bin/env bash
# The Debian package on Debian 13 (trixie): built and installed in a Debian 13
# userland, where `fi_info -p rdmx` and a two-process `fi_pingpong` work for an
# ordinary user with no variable set. Run as root on a Debian 12 machine (CI:
# scripts/test.sh); nothing on the machine changes but ~/.cache:
#
#   0. the userland: `debootstrap --variant=minbase trixie` from
#      the Debian archive apt uses here (scripts/debian-mirror.sh) plus the build dependencies (libfabric-dev
#      2.1, libclang, dpkg-dev, man-db, ...), made once and cached as
#      $RDMX_STACKS_CACHE/debian13-userland-r<RECIPE>.tar.zst
#      (default ~/.cache/rdmx-stacks; bump RECIPE below to remake it);
#   each run extracts it into a fresh temporary directory (the cache is never
#   written by a run) and, in a private mount namespace (nothing it mounts is
#   seen outside, and it all goes when the run ends; a trap unmounts it anyway),
#   mounts /proc, /sys (read-only), /dev (bind), a fresh /dev/pts and /dev/shm,
#   the host's Rust toolchain (~/.rustup read-only, ~/.cargo with its registry
#   cache: no crate downloads again) and a cargo target directory cached as
#   $RDMX_STACKS_CACHE/target-trixie; the source is a copy (git ls-files:
#   tracked and untracked-not-ignored files, as they are in the worktree;
#   RDMX_DEBIAN13_TREE=head takes the committed HEAD instead). Then, in the chroot:
#   1. scripts/package.sh builds the .deb there (bindgen over trixie's libfabric
#      2.1 headers, dpkg-shlibdeps over trixie's libraries);
#   2. as an ordinary user, before the install: `fi_info -p rdmx` finds nothing;
#   3. `apt-get install ./rdmx_<ver>_<arch>.deb` (its Depends must resolve);
#   4. `dpkg -L rdmx` puts librdmx-fi.so into the directory libfabric scans
#      (the default of FI_PROVIDER_PATH that trixie's `fi_info -e` names);
#   5. as the user, no FI_* variable: `fi_info -p rdmx` lists rdmx with
#      api_version 2.1, `fi_info -l` names it;
#   6. as the user: two-process `fi_pingpong -p rdmx -e rdm -S all -c` on 127.0.0.1;
#   7. as the user: `man fi_rdmx` renders, with nothing on stderr (trixie's
#      groff 1.23 warns where Debian 12's 1.22 did not);
#   7c. as the user: Debian 13's OpenMPI p2p np 2 again with sealed job traffic
#      (the job's secret in a file, -x FI_RDMX_JOB_SECRET_FILE, over udp);
#   8. `apt-get remove rdmx`: its files are gone, fi_info and man find nothing.
# Each step prints PASS or FAIL, and the run its seconds (fresh setup or cached);
# the exit status is 1 if any failed. Needs root (debootstrap, chroot, unshare;
# installs debootstrap and zstd when missing); without it it skips, or fails
# under CI=true. Knobs: RDMX_STACKS_CACHE, RDMX_DEBIAN_MIRROR, RDMX_DEBIAN13_PORT
# (fi_pingpong's, default 47700), RDMX_DEBIAN13_TMP (default /var/tmp: about
# 1 GB per run, removed at the end), RDMX_DEBIAN13_TREE=head.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$(pwd)
SELF="$SRC/scripts/$(basename "$0")"

# Bumped when the userland below changes (suite, packages, setup), so a cached
# tarball is remade.
RECIPE=2
SUITE=trixie
# The Debian archive this machine's apt uses (RDMX_DEBIAN_MIRROR overrides).
MIRROR=$("$SRC/scripts/debian-mirror.sh")
CACHE=${RDMX_STACKS_CACHE:-$HOME/.cache/rdmx-stacks}
USERLAND="$CACHE/debian13-userland-r$RECIPE.tar.zst"
TARGET_CACHE="$CACHE/target-trixie"
PORT=${RDMX_DEBIAN13_PORT:-47700}
# Where each run extracts its userland (about 1 GB; /var/tmp is on disk).
TMP=${RDMX_DEBIAN13_TMP:-/var/tmp}
TREE=${RDMX_DEBIAN13_TREE:-worktree}
PKGS=(
  libfabric-dev libfabric-bin          # libfabric 2.1: headers, fi_info, fi_pingpong
  libibverbs-dev ibverbs-providers     # rdma-core headers for bindgen, libibverbs/libefa
  libclang-dev clang pkg-config        # bindgen
  dpkg-dev binutils make gcc           # scripts/package.sh (dpkg-shlibdeps, strip), cc for the linker
  groff-base man-db                    # man fi_rdmx
  openmpi-bin libopenmpi-dev           # Debian 13's own OpenMPI 5.0.7 (mpirun, mpicc) over the installed rdmx
  ca-certificates                      # cargo over https, should a crate be missing from ~/.cargo
)
TAR_OPTS=(--numeric-owner --xattrs --xattrs-include='*')
# The user that runs fi_info, fi_pingpong and man in the chroot.
TUSER=rdmxuser

say() { echo "test-debian13: $*"; }
failed=()
pass() { echo "test-debian13: PASS: $*"; }
fail() { echo "test-debian13: FAIL: $2"; failed+=("$1"); }
indent() { sed 's/^/    | /'; }
skip() {
  if [[ "${CI:-}" == "true" || "${CI:-}" == "1" ]]; then echo "test-debian13: FAIL: CI=true and the test cannot run: $*"; exit 1; fi
  say "SKIP: $*"; exit 0
}

# ----------------------------------------------------------------------------
# Mounts (always inside a private mount namespace), undone in reverse order.
MOUNTED=()
mnt() { # mount ARGS... TARGET (the last argument is the mount point)
  mount "$@"
  MOUNTED+=("${!#}")
}
bind_ro() { # SRC DST
  mnt --bind "$1" "$2"
  mount -o remount,bind,ro "$2"
}
mount_base() { # ROOT: /proc, /sys, /dev, /dev/pts, /dev/shm
  local r=$1
  mnt -t proc -o nosuid,nodev,noexec proc "$r/proc"
  mnt -t sysfs -o ro,nosuid,nodev,noexec sysfs "$r/sys"
  mnt --bind /dev "$r/dev"
  mkdir -p "$r/dev/pts" "$r/dev/shm" 2>/dev/null || true
  mnt -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts "$r/dev/pts"
  mnt -t tmpfs -o mode=1777,nosuid,nodev shm "$r/dev/shm"
}
unmount_all() {
  local i
  for ((i = ${#MOUNTED[@]} - 1; i >= 0; i--)); do
    umount "${MOUNTED[i]}" 2>/dev/null || umount -l "${MOUNTED[i]}" 2>/dev/null || say "could not unmount ${MOUNTED[i]}"
  done
  MOUNTED=()
}

# ----------------------------------------------------------------------------
# 0. The userland tarball (in the private mount namespace: --make-userland DIR).
make_userland() {
  local dir=$1
  trap unmount_all EXIT
  trap 'exit 130' INT TERM
  nice debootstrap --variant=minbase --components=main "$SUITE" "$dir" "$MIRROR"
  mount_base "$dir"
  cp -L /etc/resolv.conf "$dir/etc/resolv.conf" 2>/dev/null || true
  # No daemon may start in the chroot.
  printf '#!/bin/sh\nexit 101\n' >"$dir/usr/sbin/policy-rc.d"
  chmod 0755 "$dir/usr/sbin/policy-rc.d"
  local pkgs=() p
  for p in "${PKGS[@]}"; do [[ "$p" == \#* ]] || pkgs+=("$p"); done
  chroot "$dir" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 \
    ${http_proxy:+http_proxy=$http_proxy} /bin/sh -c '
      set -e
      apt-get update -q
      apt-get install -y -q --no-install-recommends "$@" || apt-get -f install -y -q --no-install-recommends
      apt-get -f install -y -q --no-install-recommends
      # Every package asked for must really be there.
      for p in "$@"; do dpkg-query -W -f="\${Status}\n" "$p" | grep -qx "install ok installed" || { echo "$p is not installed" >&2; exit 1; }; done
      apt-get clean' sh "${pkgs[@]}"
  unmount_all
  trap - EXIT
}

# ----------------------------------------------------------------------------
# 1.-8. The test, in the private mount namespace (--inside WORK).
inside() {
  local work=$1
  local r="$work/root"
  server=""
  cleanup() {
    if [[ -n "${server:-}" ]]; then kill "$server" 2>/dev/null || true; fi
    unmount_all
  }
  trap cleanup EXIT
  trap 'exit 130' INT TERM

  mount_base "$r"
  cp -L /etc/resolv.conf "$r/etc/resolv.conf" 2>/dev/null || true
  mkdir -p "$r/root/.cargo" "$r/root/.rustup" "$r/build/target"
  mnt --bind "${CARGO_HOME:-$HOME/.cargo}" "$r/root/.cargo"
  bind_ro "${RUSTUP_HOME:-$HOME/.rustup}" "$r/root/.rustup"
  mnt --bind "$TARGET_CACHE" "$r/build/target"

  as_root() {
    chroot "$r" /usr/bin/env -i HOME=/root LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive \
      PATH=/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      CARGO_HOME=/root/.cargo RUSTUP_HOME=/root/.rustup ${RUSTUP_TOOLCHAIN:+RUSTUP_TOOLCHAIN=$RUSTUP_TOOLCHAIN} \
      ${http_proxy:+http_proxy=$http_proxy} ${https_proxy:+https_proxy=$https_proxy} "$@"
  }
  chroot "$r" /usr/sbin/useradd --create-home --shell /bin/bash --user-group "$TUSER"
  local uid gid
  uid=$(chroot "$r" /usr/bin/id -u "$TUSER") gid=$(chroot "$r" /usr/bin/id -g "$TUSER")
  # The ordinary user, with nothing in the environment but the basics: no
  # FI_PROVIDER_PATH, FI_PROVIDER or FI_RDMX_* (nor anything else).
  as_user() {
    chroot --userspec="$uid:$gid" --groups="$gid" "$r" /usr/bin/env -i HOME="/home/$TUSER" USER="$TUSER" \
      LOGNAME="$TUSER" PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 "$@"
  }
  say "in the chroot: Debian $(cat "$r/etc/debian_version"), $(as_user fi_info --version | paste -sd, | sed 's/,/, /g'), $(as_root rustc --version)"

  local multiarch provdir deb
  multiarch=$(as_root dpkg-architecture -qDEB_HOST_MULTIARCH)
  provdir=/usr/lib/$multiarch/libfabric

  # ------------------------------------------------------------ 1. build
  local log="$work/build.log" t0=$SECONDS
  if as_root nice -n 10 /bin/bash -c 'cd /build/rdmx && ./scripts/package.sh' >"$log" 2>&1; then
    deb=$(tail -n 1 "$log")
    local depends
    depends=$(chroot "$r" dpkg-deb -f "$deb" Depends)
    pass "scripts/package.sh in the chroot: $(basename "$deb") in $((SECONDS - t0)) s ($(grep -E '^ *Finished' "$log" | tail -1 | sed 's/^ *//'))"
    say "  Depends: $depends"
    # libfabric1 from the API of trixie's headers on, with no upper bound (rdmx
    # loads into later 2.x); and every library the provider links (readelf -d)
    # from a package Depends names.
    local needed lib path pkg missing=()
    needed=$(as_root readelf -d "/build/rdmx/build-out/lib/librdmx-fi.so" | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p') || true
    for lib in $needed; do
      [[ "$lib" == ld-linux* ]] && continue
      path=$(as_root ldconfig -p | awk -v l="$lib" '$1 == l && !found {print $NF; found = 1}') || true
      pkg=""
      for p in "$path" "/usr$path" "$(as_root realpath -e "$path" 2>/dev/null)"; do
        [[ -n "$p" && "$p" != /usr ]] || continue
        pkg=$(as_root dpkg -S "$p" 2>/dev/null | awk -F: 'NR == 1 {print $1}') || true
        [[ -n "$pkg" ]] && break
      done
      if [[ -z "$pkg" ]] || ! grep -qE "(^|, )$pkg( |,|$)" <<<"$depends"; then missing+=("$lib (${pkg:-no package})"); fi
    done
    if grep -qF 'libfabric1 (>= 2.1)' <<<"$depends" && ! grep -qF 'libfabric1 (<<' <<<"$depends" && ((${#missing[@]} == 0)) && [[ -n "$needed" ]]; then
      pass "Depends: libfabric1 (>= 2.1) with no upper bound, and a package for each library it links ($(paste -sd' ' <<<"$needed"))"
    else
      fail depends "Depends lacks libfabric1 (>= 2.1), bounds it from above, or misses linked libraries (${missing[*]:-none missing}): $depends"
    fi
    chroot "$r" dpkg-deb -c "$deb" | awk '{print $1, $2, $6}' | indent
  else
    fail build "scripts/package.sh in the chroot failed after $((SECONDS - t0)) s; its log's tail:"
    tail -n 40 "$log" | indent
    return 1
  fi
  say "build seconds: $((SECONDS - t0))"

  # ------------------------------------------------------------ 2. before
  local out
  if out=$(as_user fi_info -p rdmx 2>&1); then
    fail before "before the install, fi_info -p rdmx already finds rdmx:"; indent <<<"$out"
  else
    pass "before the install: fi_info -p rdmx finds nothing ($(tail -n 1 <<<"$out"))"
  fi

  # ------------------------------------------------------------ 3. install
  if out=$(as_root apt-get install -y -q --no-install-recommends "$deb" 2>&1) &&
    [[ $(chroot "$r" dpkg-query -W -f='${Status}' rdmx) == "install ok installed" ]]; then
    pass "apt-get install ./$(basename "$deb"): rdmx $(chroot "$r" dpkg-query -W -f='${Version}' rdmx) installed"
  else
    fail install "apt-get install ./$(basename "$deb") failed:"; indent <<<"$out"
    return 1
  fi

  # ------------------------------------------------------------ 4. dpkg -L
  local scanned listing
  listing=$(chroot "$r" dpkg -L rdmx 2>&1) || true
  # trixie's libfabric names the directory it scans as FI_PROVIDER_PATH's default.
  scanned=$(as_user fi_info -e 2>/dev/null | sed -n '/^# FI_PROVIDER_PATH:/,/^$/p' | sed -n 's/.*(default: \([^)]*\)).*/\1/p' | head -n 1) || true
  if grep -qx "$provdir/librdmx-fi.so" <<<"$listing" && [[ "$scanned" == "$provdir" ]] &&
    [[ -f "$r$provdir/librdmx-fi.so" ]]; then
    pass "dpkg -L rdmx: $provdir/librdmx-fi.so, the directory trixie's libfabric scans (fi_info -e: FI_PROVIDER_PATH default $scanned)"
  else
    fail dpkg-L "dpkg -L rdmx lacks $provdir/librdmx-fi.so or libfabric scans '$scanned':"; indent <<<"$listing"
  fi
  indent <<<"$listing"

  # ------------------------------------------------------------ 5. fi_info
  local info infov list
  info=$(as_user fi_info -p rdmx 2>&1) || true
  infov=$(as_user fi_info -p rdmx -v 2>&1) || true
  if grep -q '^provider: rdmx$' <<<"$info" && grep -qE '^\s+api_version: 2\.1$' <<<"$infov" &&
    ! grep -qE '^\s+api_version: ' <<<"$(grep -vE '^\s+api_version: 2\.1$' <<<"$infov")"; then
    pass "fi_info -p rdmx as $TUSER, no variable: lists rdmx ($(grep -c '^provider: rdmx$' <<<"$info") entries), api_version 2.1"
  else
    fail fi_info "fi_info -p rdmx as $TUSER: not listed, or api_version not 2.1:"
    grep -E 'api_version|prov_name' <<<"$infov" | sort | uniq -c | indent
  fi
  indent <<<"$info"
  list=$(as_user fi_info -l 2>&1) || true
  if grep -qx 'rdmx:' <<<"$list"; then
    pass "fi_info -l names rdmx: $(grep -A1 -x 'rdmx:' <<<"$list" | paste -sd' ' | tr -s ' ')"
  else
    fail fi_info-l "fi_info -l does not name rdmx:"; indent <<<"$list"
  fi

  # ------------------------------------------------------------ 6. fi_pingpong
  local port=$PORT i ok=0 s=0 c=0
  listening() { awk -v p="$(printf ':%04X' "$1")" '$2 ~ p"$" && $4 == "0A" {f=1} END {exit !f}' /proc/net/tcp /proc/net/tcp6 2>/dev/null; }
  for ((i = 0; i < 20; i++)); do
    if listening "$port"; then port=$((port + 1)); else break; fi
  done
  # (timeout --foreground: both stay in this process group, so a signal to the
  # test's group reaches them and the cleanup runs at once.)
  as_user timeout --foreground 120 fi_pingpong -p rdmx -e rdm -B "$port" -S all -c -I 100 >"$work/pp.s" 2>&1 &
  server=$!
  for ((i = 0; i < 300; i++)); do
    if listening "$port"; then ok=1; break; fi
    kill -0 "$server" 2>/dev/null || break
    sleep 0.1
  done
  if ((ok)); then
    as_user timeout --foreground 120 fi_pingpong -p rdmx -e rdm -P "$port" -S all -c -I 100 127.0.0.1 >"$work/pp.c" 2>&1 || c=$?
    wait "$server" || s=$?
  else
    kill "$server" 2>/dev/null || true
    wait "$server" || s=$?
    : >"$work/pp.c"
  fi
  server=""
  if ((ok && s == 0 && c == 0)) && grep -q 'usec/xfer' "$work/pp.c"; then
    pass "two-process fi_pingpong -p rdmx -e rdm -S all -c -I 100 as $TUSER (port $port), data checked, both ends exit 0:"
    indent <"$work/pp.c"
  else
    fail fi_pingpong "two-process fi_pingpong (port $port): server listened: $ok, server exit $s, client exit $c"
    sed 's/^/    server| /' "$work/pp.s"; sed 's/^/    client| /' "$work/pp.c"
  fi

  # ------------------------------------------------------------ 7. man
  # What the user sees: the page, and nothing on stderr (man-db passes groff's
  # default warnings through; the user cannot write cat pages, so every man
  # formats the page again). groff -ww (every warning) is counted too.
  local where rendered warnings ww
  where=$(as_user man -w fi_rdmx 2>&1) || true
  rendered=$(as_user env MANWIDTH=80 man -P cat fi_rdmx 2>/dev/null) || true
  warnings=$(as_user env MANWIDTH=80 man -P cat fi_rdmx 2>&1 >/dev/null) || true
  ww=$(as_user /bin/sh -c 'zcat /usr/share/man/man7/fi_rdmx.7.gz | groff -man -Tutf8 -ww -z 2>&1' | grep -c . || true)
  if [[ "$where" == /usr/share/man/man7/fi_rdmx.7.gz ]] && grep -q 'RUNTIME PARAMETERS' <<<"$rendered" && [[ -z "$warnings" ]]; then
    pass "man fi_rdmx as $TUSER: $where renders ($(wc -l <<<"$rendered") lines) with nothing on stderr; groff $(as_user groff --version | sed -n '1s/.* //p') -ww: $ww warnings"
  else
    fail man "man fi_rdmx as $TUSER: man -w says '$where', rendered $(grep -c . <<<"$rendered") lines, $(grep -c . <<<"$warnings") lines on stderr (groff $(as_user groff --version | sed -n '1s/.* //p'); -ww: $ww warnings), distinct:"
    sed 's/^troff:<standard input>:[0-9]*: //' <<<"$warnings" | sort | uniq -c | sort -rn | head -n 5 | indent
    grep -m 3 . <<<"$warnings" | indent
  fi

  # ------------------------------------------------------------ 7b. OpenMPI 5.0.7
  # Debian 13's own OpenMPI over the installed rdmx, as the ordinary user: the
  # provider from libfabric's own directory (no FI_PROVIDER_PATH), no FI_RDMX_*
  # variable; FI_PROVIDER and the FI_LOG_* lines that show which provider each
  # fabric opened are libfabric's. p2p, collectives and one-sided (osc rdma over
  # btl ofi, OpenMPI 5 has no osc pt2pt), np 2 and 4; each run must pass its own
  # checks, every rank's mtl ofi must have chosen rdmx, every fabric opened must
  # be rdmx's from $provdir, and one-sided must have selected btl ofi.
  local ompi prog np mpiout want fabrics opened extra pml
  ompi=$(as_user mpirun --version 2>&1 | head -n 1) || true
  as_user mkdir -p "/home/$TUSER/mpi"
  for prog in p2p coll rma; do
    if ! out=$(as_user mpicc -O2 -Wall -o "/home/$TUSER/mpi/$prog" "/build/rdmx/fi_tests/mpi/$prog.c" -lpthread 2>&1); then
      fail "ompi-build-$prog" "mpicc $prog.c as $TUSER failed:"; indent <<<"$out"
      continue
    fi
    for np in 2 4; do
      pml=(--mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include rdmx --mca mtl_ofi_verbose 1)
      extra=(--mca btl self) fabrics=1
      if [[ $prog == rma ]]; then
        # One-sided: OpenMPI 5 has no osc pt2pt, and osc rdma cannot use the
        # mtl: it runs over btl ofi. 5.0.7 brings btls up only under pml ob1
        # (5.0.11, as mpi_wheels.rs runs it, also under pml cm), so here ob1
        # carries the two-sided traffic over btl ofi too (btl_ofi_mode 2: one-
        # and two-sided; its default is one-sided only): one rdmx fabric per
        # rank and no mtl.
        pml=(--mca pml ob1)
        extra=(--mca btl self,ofi --mca btl_ofi_mode 2 --mca btl_ofi_provider_include rdmx --mca osc rdma --mca osc_rdma_btls ofi --mca osc_base_verbose 50) fabrics=1
      fi
      want="$prog: all checks passed on $np ranks"
      # --output tag: each line of each rank whole, prefixed with its rank (the
      # counts below read lines that ranks write at once).
      mpiout=$(as_user timeout --foreground -k 10 180 mpirun -np "$np" --oversubscribe --output tag \
        "${pml[@]}" "${extra[@]}" \
        -x FI_PROVIDER=rdmx -x FI_LOG_LEVEL=info -x FI_LOG_PROV=core -x FI_LOG_SUBSYS=core \
        "/home/$TUSER/mpi/$prog" 2>&1 | tr -d '\0') && s=0 || s=$?
      # Counted as tokens, not lines: a rank's log line may be cut by another's.
      # Every fabric opened names its provider; every rdmx path printed is the
      # installed one.
      local rdmx_opened chose osc_ofi=$np elsewhere
      # (`|| true`: a grep that finds nothing must not end the script.)
      opened=$({ grep -oE '<info> Using [^ ]+ provider' <<<"$mpiout" || true; } | wc -l)
      rdmx_opened=$({ grep -oE '<info> Using rdmx provider' <<<"$mpiout" || true; } | wc -l)
      elsewhere=$({ grep -oE 'path:[^ ]*librdmx-fi\.so' <<<"$mpiout" || true; } | grep -vcxF "path:$provdir/librdmx-fi.so" || true)
      ((elsewhere == 0)) || rdmx_opened=-1
      chose=$(grep -cE 'mtl:ofi:provider: rdmx\s*$' <<<"$mpiout" || true)
      [[ $prog == rma ]] && chose=$np # no mtl: the osc line below says btl ofi carried it
      [[ $prog == rma ]] && osc_ofi=$(grep -cE 'accelerated_query: selected btl: ofi\s*$' <<<"$mpiout" || true)
      if ((s == 0)) && grep -qF "$want" <<<"$mpiout" && ((opened == rdmx_opened && rdmx_opened >= np * fabrics)) &&
        ((chose == np && osc_ofi == np)); then
        pass "$ompi, $prog np $np as $TUSER over the installed rdmx: '$want'; $rdmx_opened fabrics opened, all rdmx's ($provdir)$([[ $prog == rma ]] && echo " (pml ob1: two-sided over btl ofi too), osc rdma selected btl ofi on $osc_ofi" || echo ", mtl ofi chose rdmx on $chose of $np ranks")"
      else
        fail "ompi-$prog-np$np" "$ompi, $prog np $np: exit $s, '$want' $(grep -qF "$want" <<<"$mpiout" && echo found || echo missing), fabrics opened $opened (rdmx's $rdmx_opened, want >= $((np * fabrics)) and all), mtl ofi chose rdmx on $chose of $np, osc btl ofi on $osc_ofi of $np; the output's tail:"
        printf '%s\n' "$mpiout" >"$CACHE/test-debian13-$prog-np$np.log"
        say "  the whole output: $CACHE/test-debian13-$prog-np$np.log"
        # What the MPI said of its btl and osc choice, then the end of the output.
        { grep -iE 'btl|osc' <<<"$mpiout" | grep -v 'libfabric:' | head -n 40 || true; } | indent
        tail -n 25 <<<"$mpiout" | indent
      fi
    done
  done

  # ------------------------------------------------------------ 7c. OpenMPI 5.0.7, sealed
  # The same p2p job with authenticated job traffic (docs/security.md): the one
  # run here that sets variables: the job's secret, in a file of the user's
  # handed to every rank by the launcher (`-x FI_RDMX_JOB_SECRET_FILE`, as
  # fi_rdmx(7) says), the udp device (on one host the default device would
  # carry everything through shared memory, untagged) and FI_RDMX_STATS to
  # read back that every endpoint's traffic was tagged and nothing refused.
  local secret="/home/$TUSER/job-secret" stats="/home/$TUSER/sealed-stats.jsonl" tagged refused
  as_user sh -c "umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n' >$secret; rm -f $stats"
  mpiout=$(as_user timeout --foreground -k 10 180 mpirun -np 2 --oversubscribe --output tag \
    --mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include rdmx --mca btl self \
    -x FI_PROVIDER=rdmx -x FI_RDMX_JOB_SECRET_FILE="$secret" -x FI_RDMX_DEVICE=udp -x FI_RDMX_STATS="$stats" \
    "/home/$TUSER/mpi/p2p" 2>&1 | tr -d '\0') && s=0 || s=$?
  tagged=$(as_user cat "$stats" 2>/dev/null | grep -c '"job_traffic":"tagged"' || true)
  refused=$(as_user cat "$stats" 2>/dev/null | grep -oE '"dropped_auth":[0-9]+' | grep -vc ':0$' || true)
  if ((s == 0)) && grep -qF "p2p: all checks passed on 2 ranks" <<<"$mpiout" && ((tagged == 2 && refused == 0)); then
    pass "$ompi, p2p np 2 with the job's secret from a file (-x FI_RDMX_JOB_SECRET_FILE) over udp: passed; $tagged of 2 endpoints' traffic tagged, none refused a datagram"
  else
    fail "ompi-p2p-sealed" "$ompi, p2p np 2 sealed: exit $s, endpoints tagged $tagged of 2, endpoints that refused datagrams $refused; the output's tail:"
    tail -n 25 <<<"$mpiout" | indent
  fi

  # ------------------------------------------------------------ 8. remove
  local left=() f owner
  if out=$(as_root apt-get remove -y -q rdmx 2>&1); then
    for f in "$provdir/librdmx-fi.so" /usr/share/man/man7/fi_rdmx.7.gz /usr/share/doc/rdmx; do
      if [[ -e "$r$f" ]]; then left+=("$f"); fi
    done
    # The provider directory goes too, unless another package owns it.
    owner=$(chroot "$r" dpkg -S "$provdir" 2>/dev/null || true)
    if [[ -z "$owner" && -e "$r$provdir" ]]; then left+=("$provdir"); fi
    if ((${#left[@]} == 0)) && ! as_user fi_info -p rdmx >/dev/null 2>&1 && ! as_user man -w fi_rdmx >/dev/null 2>&1 &&
      ! chroot "$r" dpkg-query -W -f='${Status}' rdmx 2>/dev/null | grep -q 'ok installed'; then
      pass "apt-get remove rdmx: its files are gone${owner:+ ($provdir stays: $owner)}, fi_info -p rdmx and man -w fi_rdmx find nothing"
    else
      fail remove "after apt-get remove rdmx: left ${left[*]:-nothing}; fi_info -p rdmx: $(as_user fi_info -p rdmx 2>&1 | head -n 1)"
    fi
  else
    fail remove "apt-get remove rdmx failed:"; indent <<<"$out"
  fi
  ((${#failed[@]} == 0)) || { say "${#failed[@]} failed in the chroot: ${failed[*]}"; return 1; }
}

if [[ "${1:-}" == "--make-userland" ]]; then make_userland "$2"; exit 0; fi
if [[ "${1:-}" == "--inside" ]]; then inside "$2"; exit $?; fi

# ----------------------------------------------------------------------------
# The host side.
[[ $(id -u) -eq 0 ]] || skip "needs root (debootstrap, chroot, unshare --mount)"
[[ -x "${CARGO_HOME:-$HOME/.cargo}/bin/cargo" && -d "${RUSTUP_HOME:-$HOME/.rustup}/toolchains" ]] ||
  skip "no rustup toolchain in ${CARGO_HOME:-$HOME/.cargo} and ${RUSTUP_HOME:-$HOME/.rustup} (scripts/setup.sh installs one)"
need=()
for tool in debootstrap:debootstrap zstd:zstd unshare:util-linux flock:util-linux chroot:coreutils; do
  command -v "${tool%%:*}" >/dev/null || need+=("${tool#*:}")
done
if ((${#need[@]})); then
  say "installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

mkdir -p "$CACHE"
# One run at a time (the target directory and the port are shared).
exec 9>"$CACHE/.test-debian13.lock"
flock 9
start=$SECONDS
fresh=()

# ------------------------------------------------------------ 0. the userland
if [[ -s "$USERLAND" ]]; then
  pass "Debian 13 userland: cached $USERLAND ($(du -h "$USERLAND" | cut -f1))"
else
  fresh+=(userland)
  t0=$SECONDS
  say "making the Debian 13 userland (debootstrap $SUITE from $MIRROR, then ${PKGS[*]//\#*/})"
  ulwork=$(mktemp -d "$TMP/rdmx-debian13-userland.XXXXXX")
  ullog="$CACHE/debian13-userland-r$RECIPE.log"
  if unshare --mount --propagation private bash "$SELF" --make-userland "$ulwork/root" >"$ullog" 2>&1; then
    (cd "$ulwork/root" && tar "${TAR_OPTS[@]}" -cf - .) | zstd -q -T0 -6 -o "$USERLAND.part"
    mv "$USERLAND.part" "$USERLAND"
    pass "Debian 13 userland: made $USERLAND ($(du -h "$USERLAND" | cut -f1)) in $((SECONDS - t0)) s (log: $ullog)"
  else
    fail userland "making the Debian 13 userland failed after $((SECONDS - t0)) s; the log's tail ($ullog):"
    tail -n 30 "$ullog" | indent
    rm -f "$USERLAND.part"
  fi
  grep -qF "$ulwork" /proc/self/mountinfo || rm -rf --one-file-system "$ulwork"
  [[ -s "$USERLAND" ]] || exit 1
fi
# The target directory belongs to one userland: a new tarball starts it afresh.
stamp="$(basename "$USERLAND") $(stat -c %Y "$USERLAND")"
if [[ "$(cat "$TARGET_CACHE/.userland" 2>/dev/null)" != "$stamp" ]]; then
  rm -rf "$TARGET_CACHE"
  mkdir -p "$TARGET_CACHE"
  echo "$stamp" >"$TARGET_CACHE/.userland"
fi
[[ -d "$TARGET_CACHE/release" ]] || fresh+=(target-trixie)

# ------------------------------------------------------------ a fresh copy
t0=$SECONDS
work=$(mktemp -d "$TMP/rdmx-debian13.XXXXXX")
# (Nothing is mounted under $work out here: the mounts live in the test's own
# mount namespace. Checked all the same before removing it.)
remove_work() {
  if [[ -n "${work:-}" && -d "$work" ]]; then
    if grep -qF "$work" /proc/self/mountinfo; then say "something is still mounted under $work: left in place"
    else rm -rf --one-file-system "$work"; fi
  fi
  work=""
}
trap remove_work EXIT
trap 'say "interrupted: cleaning up"; exit 130' INT TERM
mkdir -p "$work/root"
zstd -q -dc "$USERLAND" | tar "${TAR_OPTS[@]}" -xpf - -C "$work/root"
mkdir -p "$work/root/build/rdmx"
if [[ "$TREE" == head ]]; then
  git -c safe.directory='*' archive --format=tar HEAD | tar -xf - -C "$work/root/build/rdmx"
  what="HEAD $(git -c safe.directory='*' rev-parse --short HEAD)"
elif git -c safe.directory='*' rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  # Tracked and untracked-but-not-ignored files as they are now (deleted ones skipped).
  git -c safe.directory='*' ls-files -z -co --exclude-standard |
    while IFS= read -r -d '' f; do if [[ -e "$f" || -L "$f" ]]; then printf '%s\0' "$f"; fi; done |
    tar --null -T - -cf - | tar -xpf - -C "$work/root/build/rdmx"
  what="the worktree ($(git -c safe.directory='*' status --porcelain | wc -l) files differ from HEAD $(git -c safe.directory='*' rev-parse --short HEAD))"
else
  tar --exclude=./target --exclude=./build-out --exclude=./.git --exclude=./fuzz/target -cf - . | tar -xpf - -C "$work/root/build/rdmx"
  what="the source directory"
fi
# cargo's target directory: the cached one, mounted at /build/target.
ln -s /build/target "$work/root/build/rdmx/target"
say "fresh userland and a copy of $what in $work: $((SECONDS - t0)) s"

rc=0
unshare --mount --propagation private bash "$SELF" --inside "$work" || rc=$?
remove_work

secs=$((SECONDS - start))
if ((${#fresh[@]})); then
  say "seconds: $secs (fresh setup: made ${fresh[*]})"
else
  say "seconds: $secs (cached run: userland tarball and target-trixie reused)"
fi
if ((rc != 0)) || ((${#failed[@]})); then
  say "FAILED"
  exit 1
fi
say "all passed"
