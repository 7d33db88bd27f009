#!/usr/bin/env bash
# Checks rdmx as users install it, without touching the machine:
#  1. fi_rdmx(7) renders without a groff warning;
#  2. scripts/package.sh builds build-out/rdmx_<ver>_<arch>.deb, whose file list
#     (dpkg-deb -c) and control fields are the expected ones;
#  3. in a private mount namespace whose /usr and /var are overlays on a tmpfs
#     (writes land in the tmpfs and vanish with the namespace; nothing outside
#     sees them, so tests that load rdmx from FI_PROVIDER_PATH meanwhile never
#     find a second copy in libfabric's default directory), with FI_PROVIDER_PATH,
#     FI_PROVIDER and every FI_RDMX_* variable unset:
#       - before: fi_info -p rdmx finds nothing;
#       - dpkg -i the .deb; fi_info -p rdmx lists rdmx; man finds fi_rdmx(7);
#         two-process fi_pingpong -p rdmx (default device, then -d udp), data
#         checked (-c), the server loading the installed library (LD_DEBUG);
#       - dpkg -r: the files are gone and fi_info -p rdmx finds nothing again;
#       - make install (default PREFIX/PROVDIR): the same fi_info and man
#         checks, a fi_pingpong; make uninstall leaves /usr as it found it.
# Needs root (unshare, mount). A missing tool skips, or fails under CI=true.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

say() { echo "check-package: $*"; }
fail() { printf 'check-package: FAIL: %b\n' "$*" >&2; exit 1; }
skip() {
  if [[ "${CI:-}" == "true" || "${CI:-}" == "1" ]]; then fail "CI=true and the check cannot run: $*"; fi
  say "SKIP: $*"; exit 0
}

PORT=${RDMX_CHECK_PORT:-47660}
MULTIARCH=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || true)
PROVDIR=/usr/lib/$MULTIARCH/libfabric

# What runs inside the namespace (this script again, with --inside DEB).
inside() {
  local deb=$1 tmp=$2
  mount -t tmpfs -o mode=0700 rdmx-check "$tmp"
  for d in usr var; do
    mkdir -p "$tmp/$d-upper" "$tmp/$d-work"
    mount -t overlay "rdmx-check-$d" -o "lowerdir=/$d,upperdir=$tmp/$d-upper,workdir=$tmp/$d-work" "/$d"
  done
  # Nothing from the caller's environment may point libfabric at rdmx.
  unset FI_PROVIDER_PATH FI_PROVIDER
  while read -r v; do unset "$v"; done < <(env | grep -o '^FI_RDMX_[A-Za-z0-9_]*' || true)
  export FI_LOG_LEVEL=warn

  # A copy of rdmx already installed on this machine would answer for the
  # one under test: remove it in this private view.
  if dpkg-query -W -f='${Status}' rdmx 2>/dev/null | grep -q installed; then
    say "rdmx is installed on this machine; purging it inside the private view"
    dpkg --purge rdmx >/dev/null
  fi
  rm -f "$PROVDIR/librdmx-fi.so" /usr/local/share/man/man7/fi_rdmx.7

  absent "before dpkg -i"
  local before_lib
  before_lib=$(listing)

  say "dpkg -i $(basename "$deb")"
  DEBIAN_FRONTEND=noninteractive dpkg -i "$deb" || fail "dpkg -i failed"
  dpkg-query -W -f='${Status}\n' rdmx | grep -qx 'install ok installed' || fail "dpkg does not list rdmx as installed"
  for f in "$PROVDIR/librdmx-fi.so" /usr/share/man/man7/fi_rdmx.7.gz /usr/share/doc/rdmx/copyright; do
    [[ -f "$f" ]] || fail "$f missing after dpkg -i"
    [[ $(dpkg -L rdmx | grep -cx "$f") != 0 ]] || fail "dpkg -L rdmx lacks $f"
  done
  present /usr/share/man/man7/fi_rdmx.7.gz
  pingpong "" "$PROVDIR/librdmx-fi.so"
  pingpong "-d udp" "$PROVDIR/librdmx-fi.so"

  say "dpkg -r rdmx"
  DEBIAN_FRONTEND=noninteractive dpkg -r rdmx >/dev/null || fail "dpkg -r failed"
  for f in "$PROVDIR/librdmx-fi.so" /usr/share/man/man7/fi_rdmx.7.gz /usr/share/doc/rdmx; do
    [[ ! -e "$f" ]] || fail "$f still there after dpkg -r"
  done
  [[ ! -e "$PROVDIR" ]] || fail "$PROVDIR still there after dpkg -r (it was created by dpkg -i)"
  absent "after dpkg -r"
  [[ "$(listing)" == "$before_lib" ]] || fail "dpkg -r left /usr different from before dpkg -i: $(diff <(echo "$before_lib") <(listing))"

  say "make install"
  make --no-print-directory install >/dev/null || fail "make install failed"
  [[ -f "$PROVDIR/librdmx-fi.so" ]] || fail "make install did not put librdmx-fi.so into $PROVDIR"
  present /usr/local/share/man/man7/fi_rdmx.7
  pingpong "" "$PROVDIR/librdmx-fi.so"
  say "make uninstall"
  make --no-print-directory uninstall >/dev/null || fail "make uninstall failed"
  absent "after make uninstall"
  [[ "$(listing)" == "$before_lib" ]] || fail "make uninstall left /usr different from before make install: $(diff <(echo "$before_lib") <(listing))"
  say "inside the private view: all checks passed"
}

# Every path under the directories install and dpkg touch.
listing() {
  # (find fails on the paths that do not exist: that is part of the answer.)
  { find "/usr/lib/$MULTIARCH" -maxdepth 1 -name 'libfabric*' -print 2>/dev/null || true; } | sort
  { find "/usr/lib/$MULTIARCH/libfabric" /usr/share/man/man7 /usr/local/share/man /usr/share/doc/rdmx -print 2>/dev/null || true; } | sort
}

absent() {
  local out
  if out=$(fi_info -p rdmx 2>&1); then fail "fi_info -p rdmx found rdmx $1 (FI_PROVIDER_PATH unset):\n$out"; fi
  ! man -w fi_rdmx >/dev/null 2>&1 || fail "man -w fi_rdmx finds a page $1: $(man -w fi_rdmx)"
  say "$1: fi_info -p rdmx finds nothing, no fi_rdmx(7) (as expected)"
}

present() {
  local page=$1 out
  out=$(fi_info -p rdmx 2>&1) || fail "fi_info -p rdmx failed with FI_PROVIDER_PATH unset:\n$out"
  grep -q 'provider: rdmx' <<<"$out" || fail "fi_info -p rdmx does not name rdmx:\n$out"
  # (Debian's /usr/local/man is a link to /usr/local/share/man.)
  [[ "$(realpath -e "$(man -w fi_rdmx)")" == "$(realpath -e "$page")" ]] || fail "man -w fi_rdmx is '$(man -w fi_rdmx 2>&1)', not $page"
  # (grep -c reads it all: grep -q could stop man early, SIGPIPE under pipefail)
  [[ $(MANWIDTH=80 man -P cat fi_rdmx 2>/dev/null | grep -c 'RUNTIME PARAMETERS') != 0 ]] || fail "man fi_rdmx does not render"
  say "fi_info -p rdmx lists rdmx with no variable set; man fi_rdmx shows $page"
}

# Two fi_pingpong processes over rdmx, data checked, on loopback.
pingpong() {
  local extra=$1 lib=$2 hex srv slog clog i ok=0 others
  slog=$(mktemp) clog=$(mktemp)
  # shellcheck disable=SC2086
  # LD_DEBUG=files: the loader names every library it opens, dlopen included.
  LD_DEBUG=files fi_pingpong -p rdmx -e rdm $extra -B "$PORT" -I 100 -c -S 4096 >"$slog" 2>&1 &
  srv=$!
  hex=$(printf ':%04X' "$PORT")
  for ((i = 0; i < 200; i++)); do
    if awk -v p="$hex" '$2 ~ p"$" && $4 == "0A" {f=1} END {exit !f}' /proc/net/tcp /proc/net/tcp6 2>/dev/null; then ok=1; break; fi
    kill -0 "$srv" 2>/dev/null || break
    sleep 0.05
  done
  if ((!ok)); then kill "$srv" 2>/dev/null || true; fail "fi_pingpong server ($extra) did not listen:\n$(cat "$slog")"; fi
  # shellcheck disable=SC2086
  if ! timeout 120 fi_pingpong -p rdmx -e rdm $extra -P "$PORT" -I 100 -c -S 4096 127.0.0.1 >"$clog" 2>&1; then
    kill "$srv" 2>/dev/null || true
    fail "fi_pingpong client ($extra) failed:\n$(cat "$clog")\nserver:\n$(cat "$slog")"
  fi
  wait "$srv" || fail "fi_pingpong server ($extra) failed:\n$(cat "$slog")"
  grep -q 'usec/xfer' "$clog" || fail "fi_pingpong printed no result:\n$(cat "$clog")"
  grep -q "file=$lib \[0\]; *dynamically loaded" "$slog" || fail "the fi_pingpong server did not load $lib:\n$(grep 'file=' "$slog")"
  others=$(grep -o 'file=[^ ]*rdmx[^ ]*' "$slog" | sort -u | grep -vx "file=$lib" || true)
  [[ -z "$others" ]] || fail "the fi_pingpong server also opened another rdmx: $others"
  say "two-process fi_pingpong -p rdmx -e rdm ${extra:+$extra }-c -S 4096: data checked, both ends ok, the server loaded $lib"
  rm -f "$slog" "$clog"
}

if [[ "${1:-}" == "--inside" ]]; then
  inside "$2" "$3"
  exit 0
fi

[[ -n "$MULTIARCH" ]] || skip "dpkg-architecture (dpkg-dev) is missing"
for tool in unshare mount dpkg-deb dpkg fi_info fi_pingpong groff man make timeout; do
  command -v "$tool" >/dev/null || skip "$tool is missing (scripts/setup.sh installs it)"
done
[[ $(id -u) -eq 0 ]] || skip "needs root for unshare --mount and the overlay mounts"
grep -qw overlay /proc/filesystems || modprobe overlay 2>/dev/null || true
grep -qw overlay /proc/filesystems || skip "the kernel has no overlay filesystem"

# 1. The man page renders without a warning.
warnings=$(groff -man -Tutf8 -ww -z docs/fi_rdmx.7 2>&1) || fail "groff failed on docs/fi_rdmx.7: $warnings"
[[ -z "$warnings" ]] || fail "groff warns about docs/fi_rdmx.7:\n$warnings"
say "docs/fi_rdmx.7 renders without groff warnings"

# 2. The package and its contents.
DEB=$(./scripts/package.sh | tail -1)
[[ -f "$DEB" ]] || fail "scripts/package.sh made no .deb"
VERSION=$(awk '/^\[workspace.package\]/{s=1; next} /^\[/{s=0} s && /^version *=/{gsub(/[" ]/,"",$0); sub(/^version=/,"",$0); print; exit}' Cargo.toml)
ARCH=$(dpkg --print-architecture)
[[ "$(basename "$DEB")" == "rdmx_${VERSION}_${ARCH}.deb" ]] || fail "package named $(basename "$DEB"), expected rdmx_${VERSION}_${ARCH}.deb"
expected=$(printf '%s\n' "$PROVDIR/librdmx-fi.so" /usr/share/doc/rdmx/copyright /usr/share/man/man7/fi_rdmx.7.gz)
actual=$(dpkg-deb -c "$DEB" | awk '$1 !~ /^d/ {print $6}' | sed 's|^\./|/|' | sort)
[[ "$actual" == "$expected" ]] || fail "dpkg-deb -c lists other files than expected:\n$(diff <(echo "$expected") <(echo "$actual"))"
dpkg-deb -c "$DEB" | awk '{print $1, $2}' | grep -v '^[-d]rw[-x]r-[-x]r-[-x] root/root$' && fail "files not root-owned or with odd modes in the .deb"
[[ "$(dpkg-deb -f "$DEB" Package)" == rdmx ]] || fail "Package is not rdmx"
[[ "$(dpkg-deb -f "$DEB" Version)" == "$VERSION" ]] || fail "Version is not $VERSION"
[[ "$(dpkg-deb -f "$DEB" Architecture)" == "$ARCH" ]] || fail "Architecture is not $ARCH"
depends=$(dpkg-deb -f "$DEB" Depends)
grep -q 'libfabric1 (>= 1\.1[7-9]' <<<"$depends" || grep -q 'libfabric1 (>= 1\.[2-9][0-9]' <<<"$depends" || fail "Depends lacks libfabric1 (>= 1.17): $depends"
# No upper bound: rdmx loads into libfabric 2.x (same libfabric.so.1, appended ABI).
if grep -q 'libfabric1 (<<' <<<"$depends"; then fail "Depends bounds libfabric1 from above, so the package cannot meet libfabric 2.x: $depends"; fi
for lib in $(readelf -d build-out/lib/librdmx-fi.so | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p'); do
  [[ "$lib" == ld-linux* ]] && continue
  # (awk reads to the end: an early exit would kill ldconfig with SIGPIPE,
  # which pipefail turns into a silent exit of this script under set -e)
  path=$(ldconfig -p | awk -v l="$lib" '$1 == l && !found {print $NF; found = 1}')
  pkg=""
  # dpkg knows the /usr path of a usrmerged /lib; the symlink's target too.
  for p in "$path" "/usr$path" "$(realpath -e "$path" 2>/dev/null)"; do
    [[ -n "$p" ]] && pkg=$(dpkg -S "$p" 2>/dev/null | awk -F: 'NR == 1 {print $1}') && [[ -n "$pkg" ]] && break
  done
  [[ -n "$pkg" ]] || fail "no Debian package owns $lib"
  grep -q "\b$pkg\b" <<<"$depends" || fail "the provider needs $lib from $pkg, which Depends ($depends) does not name"
done
say "$(basename "$DEB"): files, modes and control fields as expected; Depends: $depends"

# 3. Install, use and remove it where nobody else can see it.
tmp=$(mktemp -d /tmp/rdmx-check-package.XXXXXX)
rc=0
unshare --mount --propagation private "$0" --inside "$DEB" "$tmp" || rc=$?
rmdir "$tmp" 2>/dev/null || true
((rc == 0)) || fail "the install check in the private mount namespace failed (rc $rc)"
[[ ! -e "$PROVDIR/librdmx-fi.so" ]] || say "note: $PROVDIR/librdmx-fi.so exists outside the check (installed on this machine before it ran)"
say "passed"
