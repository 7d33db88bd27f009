#!/usr/bin/env bash
# Copies a harness run's summary (DIR/summary.md, written by
# `cargo run --release -p rdmx-benches --bin harness`) into README.md's speed
# section, between the lines `<!-- speed summary: begin -->` and
# `<!-- speed summary: end -->`, each block marked as quoted from that file, so
# that prov/tests/docs_quotes.rs fails when the README and the file differ.
#
#   benches/readme_summary.sh benches/results/<run>
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: benches/readme_summary.sh benches/results/<run>}
dir=${dir%/}
src="$dir/summary.md"
[ -f "$src" ] || { echo "readme_summary: no $src" >&2; exit 1; }
case $dir in benches/results/*) ;; *) echo "readme_summary: $dir is not under benches/results/" >&2; exit 1 ;; esac
grep -q '^<!-- speed summary: begin -->$' README.md || { echo "readme_summary: README.md has no speed summary markers" >&2; exit 1; }
block=$(mktemp)
# Every paragraph or table of the summary gets its own marker (a quote runs to
# the first blank line).
awk -v src="$src" 'BEGIN { start = 1 }
    /^[[:space:]]*$/ { print; start = 1; next }
    { if (start) print "<!-- quoted from " src " -->"; start = 0; print }' "$src" > "$block"
awk -v block="$block" '
    /^<!-- speed summary: begin -->$/ { print; while ((getline l < block) > 0) print l; skip = 1; next }
    /^<!-- speed summary: end -->$/ { skip = 0 }
    !skip { print }' README.md > README.md.new
mv README.md.new README.md
rm -f "$block"
echo "readme_summary: README.md now quotes $src"
