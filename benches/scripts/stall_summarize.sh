#!/usr/bin/env bash
# Median (min-max) per configuration and figure of every results file of
# benches/results/2026-11-27-stall (run, configuration, figure, value: the
# results.tsv format of benches/stall_check.sh), as its README.md quotes them;
# its output is that directory's medians.txt. The files are in the
# directory's raw.tar.xz:
#
#   tar -xJf benches/results/2026-11-27-stall/raw.tar.xz -C /tmp/stall
#   benches/scripts/stall_summarize.sh /tmp/stall
#
# (Until it moved here it sat in that directory and read the files beside it.)
cd "${1:?usage: stall_summarize.sh DIR (the *.tsv and osu-idle-10.txt of a stall hunt)}" || exit 1
for f in *.tsv; do
    echo "== $f"
    sort -t$'\t' -k2,2 -k3,3 -k4,4g "$f" | awk -F'\t' '$3 != "failed" {
        k = $2 " " $3; if (k != last && last != "") out(); if (k != last) { n = 0; last = k }; v[++n] = $4 }
        function out() { printf "  %-22s %-14s %3d runs  median %-9s (%s-%s)\n", substr(last, 1, index(last, " ") - 1), substr(last, index(last, " ") + 1), n, (n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2), v[1], v[n] }
        END { if (last != "") out() }'
done
echo "== osu-idle-10.txt (OSU 5.3 osu_bw, osu_mbw_mr, osu_latency at 8 B: label run MB/s msgs/s us)"
for d in rdmx vader; do
    for c in 3 4 5; do
        awk -v d=$d -v c=$c '$1 == d { print $c }' osu-idle-10.txt | sort -g | awk -v d=$d -v c=$c '{ a[NR] = $1 } END { printf "  %-6s %-9s median %s (%s-%s)\n", d, c == 3 ? "bw8" : c == 4 ? "mr8" : "lat8", a[int((NR + 1) / 2)], a[1], a[NR] }'
    done
done
