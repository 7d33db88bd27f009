#!/usr/bin/env bash
# Prints the Debian archive this machine's apt uses (its main archive, not the
# security one), so that downloads from Debian (a source tarball, a debootstrap
# userland) go where apt goes: behind a local mirror or proxy too.
#
#   scripts/debian-mirror.sh          -> e.g. http://deb.debian.org/debian
#   MIRROR=$(scripts/debian-mirror.sh)
#
# RDMX_DEBIAN_MIRROR, when set, wins. Read from the deb822 files
# (/etc/apt/sources.list.d/*.sources: "URIs:" of a "Types: deb" stanza) and the
# one-line format (/etc/apt/sources.list and sources.list.d/*.list: "deb [opts]
# URI suite ..."); the first archive whose suites are not only *-security and
# whose path ends in /debian is taken. None found: Debian's own address, with a
# warning on stderr.
set -euo pipefail

if [[ -n ${RDMX_DEBIAN_MIRROR:-} ]]; then
  echo "${RDMX_DEBIAN_MIRROR%/}"
  exit 0
fi

APT_DIR=${RDMX_APT_DIR:-/etc/apt}
found=""

# deb822 stanzas: blank-line separated; want Types containing deb, a URI, and a
# suite that is not a security suite.
for f in "$APT_DIR"/sources.list.d/*.sources; do
  [[ -f $f ]] || continue
  found=$(awk '
    function flush() {
      if (found) return
      if (types ~ /(^| )deb( |$)/ && uris != "" && suites != "") {
        n = split(suites, s, " ")
        m = split(uris, u, " ")
        for (i = 1; i <= n; i++) if (s[i] !~ /-security$/) {
          for (k = 1; k <= m; k++) if (u[k] ~ /\/debian\/?$/) { print u[k]; found = 1; exit }
        }
      }
      types = ""; uris = ""; suites = ""
    }
    /^[ \t]*#/ { next }
    /^[ \t]*$/ { flush(); next }
    /^Types:/  { sub(/^Types:[ \t]*/, "");  types = $0 }
    /^URIs:/   { sub(/^URIs:[ \t]*/, "");   uris = $0 }
    /^Suites:/ { sub(/^Suites:[ \t]*/, ""); suites = $0 }
    END { flush() }
  ' "$f" || true)
  [[ -n $found ]] && break
done

if [[ -z $found ]]; then
  for f in "$APT_DIR"/sources.list "$APT_DIR"/sources.list.d/*.list; do
    [[ -f $f ]] || continue
    found=$(awk '
      $1 == "deb" {
        i = 2
        if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
        uri = $i; suite = $(i + 1)
        if (suite !~ /-security$/ && uri ~ /\/debian\/?$/) { print uri; exit }
      }
    ' "$f" || true)
    [[ -n $found ]] && break
  done
fi

if [[ -z $found ]]; then
  echo "debian-mirror: no Debian archive in $APT_DIR's sources; using http://deb.debian.org/debian" >&2
  found=http://deb.debian.org/debian
fi
echo "${found%/}"
