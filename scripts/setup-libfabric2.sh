#!/usr/bin/env bash
# Builds libfabric 2.1.0 and its fabtests from Debian 13's source package (the
# libfabric of Debian 13 trixie, the current Debian stable) into a prefix cached
# under ~/.cache, for the tests that run rdmx on a libfabric 2.x: rdmx built against
# its headers (scripts/test-libfabric2.sh), its fi_info, fi_pingpong and fabtests'
# runfabtests.sh. Idempotent: a finished prefix is reused.
#
#   scripts/setup-libfabric2.sh     prints the prefix on its last line
#
# The tarball is `libfabric_2.1.0.orig.tar.xz` from Debian's package pool (a git
# archive without configure: autogen.sh first). Only the providers the tests compare
# against are built (shm, tcp, udp, rxm, rxd); no system package is touched.
set -euo pipefail

VERSION=${RDMX_LF2_VERSION:-2.1.0}
CACHE=${RDMX_STACKS_CACHE:-$HOME/.cache/rdmx-stacks}
PREFIX="$CACHE/libfabric-$VERSION"
TARBALL="libfabric_$VERSION.orig.tar.xz"
# From the Debian archive this machine's apt uses (scripts/debian-mirror.sh).
URL="$("$(dirname "$0")/debian-mirror.sh")/pool/main/libf/libfabric/$TARBALL"
# Bumped when the configure line below changes, so a cached prefix is rebuilt.
RECIPE=1

if [[ -f "$PREFIX/.done-$RECIPE" && -x "$PREFIX/bin/fi_info" && -x "$PREFIX/bin/runfabtests.sh" ]]; then
  echo "setup-libfabric2: cached"
  echo "$PREFIX"
  exit 0
fi

need=()
for p in autoconf automake libtool make gcc pkg-config xz-utils curl; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if ((${#need[@]})); then
  echo "setup-libfabric2: installing ${need[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

mkdir -p "$CACHE"
if [[ ! -s "$CACHE/$TARBALL" ]]; then
  echo "setup-libfabric2: downloading $URL"
  curl -sSfL -o "$CACHE/$TARBALL.part" "$URL"
  mv "$CACHE/$TARBALL.part" "$CACHE/$TARBALL"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/rdmx-lf2.XXXXXX")
trap 'rm -rf "$work"' EXIT
tar -C "$work" -xf "$CACHE/$TARBALL"
src="$work/libfabric-$VERSION"
jobs=$(nproc)
log="$CACHE/libfabric-$VERSION.build.log"
: >"$log"
echo "setup-libfabric2: building libfabric $VERSION into $PREFIX (log: $log)"
rm -rf "$PREFIX"
(
  cd "$src"
  ./autogen.sh
  ./configure --prefix="$PREFIX" --disable-static --enable-only \
    --enable-shm --enable-tcp --enable-udp --enable-rxm --enable-rxd \
    --disable-efa --disable-psm2 --disable-psm3 --disable-verbs --disable-usnic
  make -j"$jobs"
  make install
  cd fabtests
  ./autogen.sh
  ./configure --prefix="$PREFIX" --with-libfabric="$PREFIX"
  make -j"$jobs"
  make install
) >>"$log" 2>&1 || { echo "setup-libfabric2: build failed; the log's tail:" >&2; tail -40 "$log" >&2; exit 1; }
touch "$PREFIX/.done-$RECIPE"
echo "setup-libfabric2: built $("$PREFIX/bin/fi_info" --version | head -1 | tr -s ' ')"
echo "$PREFIX"
