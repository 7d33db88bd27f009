#!/usr/bin/env bash
# Builds the Debian package build-out/rdmx_<version>_<arch>.deb from this tree
# with dpkg-deb (no cargo-deb, no debhelper):
#   /usr/lib/<multiarch>/libfabric/librdmx-fi.so   libfabric's default provider
#                                                   directory (FI_PROVIDER_PATH unset)
#   /usr/share/man/man7/fi_rdmx.7.gz
#   /usr/share/doc/rdmx/copyright
# Version: [workspace.package] version of Cargo.toml. Architecture: dpkg
# --print-architecture. Depends: what dpkg-shlibdeps finds for the shared
# libraries the provider really links (readelf -d: libfabric.so.1, libc,
# libgcc_s), with libfabric1 raised to the libfabric API of the headers the
# provider was built against (rdmx refuses an older one at load, see
# prov/src/version.rs), with no upper bound: libfabric 2.x keeps libfabric.so.1
# and its ABI, and rdmx loads into it.
# Prints the path of the .deb on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

for tool in dpkg-deb dpkg-shlibdeps dpkg-architecture readelf strip gzip pkg-config; do
  command -v "$tool" >/dev/null || { echo "package: $tool is missing (scripts/setup.sh installs dpkg-dev, binutils, pkg-config)" >&2; exit 1; }
done

./scripts/build.sh >&2

VERSION=$(awk '/^\[workspace.package\]/{s=1; next} /^\[/{s=0} s && /^version *=/{gsub(/[" ]/,"",$0); sub(/^version=/,"",$0); print; exit}' Cargo.toml)
[[ -n "$VERSION" ]] || { echo "package: no [workspace.package] version in Cargo.toml" >&2; exit 1; }
ARCH=$(dpkg --print-architecture)
MULTIARCH=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null)
PROVDIR=/usr/lib/$MULTIARCH/libfabric
# The provider directory libfabric scans must be this one: check libfabric
# agrees (pkg-config's libdir is where libfabric.so lives; PROVDLDIR is
# $libdir/libfabric).
LIBDIR=$(pkg-config --variable=libdir libfabric)
[[ "$LIBDIR/libfabric" == "$PROVDIR" ]] || { echo "package: libfabric's libdir $LIBDIR is not /usr/lib/$MULTIARCH" >&2; exit 1; }

FABRIC_H=$(pkg-config --variable=includedir libfabric)/rdma/fabric.h
API_MAJOR=$(awk '/#define FI_MAJOR_VERSION/{print $3}' "$FABRIC_H")
API_MINOR=$(awk '/#define FI_MINOR_VERSION/{print $3}' "$FABRIC_H")
[[ -n "$API_MAJOR" && -n "$API_MINOR" ]] || { echo "package: no FI_MAJOR_VERSION/FI_MINOR_VERSION in $FABRIC_H" >&2; exit 1; }

OUT=build-out
STAGE=$OUT/deb/rdmx_${VERSION}_${ARCH}
rm -rf "$OUT/deb"
mkdir -p "$STAGE/DEBIAN" "$STAGE$PROVDIR" "$STAGE/usr/share/man/man7" "$STAGE/usr/share/doc/rdmx"

# The library without debug info (the release profile keeps line tables for
# backtraces in development builds); symbols stay for panic messages.
strip --strip-debug --remove-section=.comment -o "$STAGE$PROVDIR/librdmx-fi.so" build-out/lib/librdmx-fi.so
chmod 0644 "$STAGE$PROVDIR/librdmx-fi.so"
gzip -9n -c docs/fi_rdmx.7 > "$STAGE/usr/share/man/man7/fi_rdmx.7.gz"
chmod 0644 "$STAGE/usr/share/man/man7/fi_rdmx.7.gz"
cat > "$STAGE/usr/share/doc/rdmx/copyright" <<'EOF'
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: rdmx

Files: *
Copyright: the rdmx developers
License: BSD-2-Clause or GPL-2.0-only

License: BSD-2-Clause
 Redistribution and use in source and binary forms, with or without
 modification, are permitted provided that the following conditions are met:
 .
 1. Redistributions of source code must retain the above copyright notice,
    this list of conditions and the following disclaimer.
 .
 2. Redistributions in binary form must reproduce the above copyright notice,
    this list of conditions and the following disclaimer in the documentation
    and/or other materials provided with the distribution.
 .
 THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS AND CONTRIBUTORS "AS IS"
 AND ANY EXPRESS OR IMPLIED WARRANTIES, INCLUDING, BUT NOT LIMITED TO, THE
 IMPLIED WARRANTIES OF MERCHANTABILITY AND FITNESS FOR A PARTICULAR PURPOSE
 ARE DISCLAIMED. IN NO EVENT SHALL THE COPYRIGHT HOLDER OR CONTRIBUTORS BE
 LIABLE FOR ANY DIRECT, INDIRECT, INCIDENTAL, SPECIAL, EXEMPLARY, OR
 CONSEQUENTIAL DAMAGES (INCLUDING, BUT NOT LIMITED TO, PROCUREMENT OF
 SUBSTITUTE GOODS OR SERVICES; LOSS OF USE, DATA, OR PROFITS; OR BUSINESS
 INTERRUPTION) HOWEVER CAUSED AND ON ANY THEORY OF LIABILITY, WHETHER IN
 CONTRACT, STRICT LIABILITY, OR TORT (INCLUDING NEGLIGENCE OR OTHERWISE)
 ARISING IN ANY WAY OUT OF THE USE OF THIS SOFTWARE, EVEN IF ADVISED OF THE
 POSSIBILITY OF SUCH DAMAGE.

License: GPL-2.0-only
 On Debian systems the full text of the GNU General Public License version 2
 is in /usr/share/common-licenses/GPL-2.
EOF
chmod 0644 "$STAGE/usr/share/doc/rdmx/copyright"

# Dependencies of the shared libraries the provider links. dpkg-shlibdeps
# wants a debian/control naming the package; give it one in a scratch dir.
SHL=$OUT/deb/shlibdeps
mkdir -p "$SHL/debian"
printf 'Source: rdmx\n\nPackage: rdmx\nArchitecture: any\n' > "$SHL/debian/control"
SHLIBS=$(cd "$SHL" && dpkg-shlibdeps -O -e "$ROOT/$STAGE$PROVDIR/librdmx-fi.so" 2>/dev/null)
SHLIBS=${SHLIBS#shlibs:Depends=}
[[ "$SHLIBS" == *libfabric1* ]] || { echo "package: dpkg-shlibdeps found no libfabric1 dependency: '$SHLIBS'" >&2; exit 1; }
if readelf -d build-out/lib/librdmx-fi.so | grep -q 'libibverbs'; then
  [[ "$SHLIBS" == *libibverbs1* ]] || { echo "package: the provider links libibverbs but shlibdeps says '$SHLIBS'" >&2; exit 1; }
fi
# Replace dpkg-shlibdeps' libfabric1 (>= <first version with the symbols>)
# with the API versions rdmx accepts at load.
DEPENDS=$(echo "$SHLIBS" | tr ',' '\n' | sed 's/^ *//' | grep -v '^libfabric1' | paste -sd, | sed 's/,/, /g')
DEPENDS="${DEPENDS:+$DEPENDS, }libfabric1 (>= $API_MAJOR.$API_MINOR)"

INSTALLED_SIZE=$(du -sk --exclude=DEBIAN "$STAGE" | cut -f1)
cat > "$STAGE/DEBIAN/control" <<EOF
Package: rdmx
Version: $VERSION
Architecture: $ARCH
Maintainer: ${RDMX_MAINTAINER:-rdmx developers <rdmx@invalid>}
Installed-Size: $INSTALLED_SIZE
Depends: $DEPENDS
Section: libs
Priority: optional
Description: libfabric provider: reliable datagrams over UDP and shared memory
 rdmx is an external libfabric provider (FI_PROVIDER=rdmx) that gives MPI
 libraries, fabtests and benchmarks reliable-datagram (FI_EP_RDM) endpoints
 over UDP sockets and shared memory. This package installs librdmx-fi.so into
 libfabric's provider directory, where libfabric finds it when
 FI_PROVIDER_PATH is unset, and the fi_rdmx(7) manual page.
EOF
(cd "$STAGE" && find usr -type f -print0 | sort -z | xargs -0 md5sum) > "$STAGE/DEBIAN/md5sums"
chmod 0644 "$STAGE/DEBIAN/control" "$STAGE/DEBIAN/md5sums"

DEB=$OUT/rdmx_${VERSION}_${ARCH}.deb
dpkg-deb --root-owner-group --build "$STAGE" "$DEB" >&2
echo "package: Depends: $DEPENDS" >&2
echo "$ROOT/$DEB"
