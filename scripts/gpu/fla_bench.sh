#!/usr/bin/env bash
# Issue 11's fair GDN comparison in one device call: hylo's bench_gdn, then
# FLA's chunked rule (scripts/ref/bench_fla_gdn.py: eager and kernel sum) one
# shape at a time, each under its own time limit, so that Triton's autotuning
# (minutes per new shape: run 30 reached only the first of four in 420 s)
# costs one shape, not the call. Triton's compiled kernels and autotuning
# results persist in .carry/triton (TRITON_CACHE_DIR, TRITON_CACHE_AUTOTUNING):
# the script copies that folder to $OUT/triton.tar.gz when it is under 60 MB, so
# that a later call can carry it back (unpack it into .carry/triton here) and
# skip the tuning. Carry .carry/t (or a warm machine's build/), .carry/lib,
# .carry/fla (scripts/gpu/fetch_fla.sh) and, when there is one, .carry/triton. SHAPE_LIMIT bounds each
# FLA shape (default 240 s; all of them end by 540 s). Logs in $OUT/fla.tar.gz.
[ -x build/bench/bench_gdn ] || tar xJf .carry/t/tests.tar.xz || exit 1
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/lib64
export TRITON_CACHE_DIR=$PWD/.carry/triton TRITON_CACHE_AUTOTUNING=1
mkdir -p "$TRITON_CACHE_DIR"
R=$OUT/fla; mkdir -p $R; nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
s=$(date +%s)
timeout 90 build/bench/bench_gdn > $R/bench_gdn.txt 2>&1; echo "bench_gdn rc=$?" >> $R/summary.txt
for T in 8192 65536; do
    for layer in 1B 3B; do
        # every shape ends within the call's 10 minutes (540 s, the rest for the copies)
        left=$((540 - ($(date +%s) - s))) lim=${SHAPE_LIMIT:-240}
        [ $lim -lt $left ] || lim=$left
        [ $lim -gt 10 ] || { echo "fla $layer $T skipped: no time left" >> $R/summary.txt; continue; }
        timeout $lim python3 scripts/ref/bench_fla_gdn.py --fla .carry/fla --T $T --layer $layer \
            > $R/fla_${layer}_$T.txt 2>&1
        echo "fla $layer $T rc=$?" >> $R/summary.txt
    done
done
cat $R/summary.txt; grep -h '^| [13]B' $R/*.txt
[ "$(du -sm "$TRITON_CACHE_DIR" | cut -f1)" -lt 60 ] && tar czf $OUT/triton.tar.gz -C .carry triton
tar czf $OUT/fla.tar.gz -C $OUT fla && rm -rf $R
