#!/usr/bin/env bash
# run 37 call 1: run 36's unrun commits and k_qgemv's loop on counters on a
# GPU. (a) tests: test_cuda_quant (k_qgemv: 6 stages, counters instead of
# divisions, the norm's squares summed by all warps; a 12,007-row case where
# warps take several rows; qproj's test_qproj with SwiGLU's input inside the
# product), test_cuda_core (norms' 8-deep pass), test_cuda_model;
# (b) bench_long --smollm2, production (decode products prefetch into L2 only
# for matrices <= 8 MB) against the bench-variants build with
# HYLO_GEMV_PREFETCH=1000000000 (every row prefetched, as before 5f64a94),
# alternating twice; the hybrid's traced step; (c) the 3B hybrid's traced
# step after 8K in Q4_0: 5f64a94 (build/base: before lin_joint and qproj),
# 6d0ac40 (build/r36), this build (also: the down product takes SwiGLU in its
# x rounding), the bench-variants build with HYLO_QGEMV_BULK=1 (a step's bytes
# by one bulk copy; its test_cuda_quant too); then bf16 of this build.
tar xJf .carry/x/x.tar.xz || exit 1
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/lib64 HYLO_REQUIRE_GPU=1
S=$OUT/summary.txt; nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
for t in test_cuda_quant test_cuda_core test_cuda_model; do
    (timeout 200 build/tests/cuda/$t > /tmp/$t.txt 2>&1; echo "$t rc=$?" >> $S) &
done
(HYLO_QGEMV_BULK=1 timeout 200 build/var/test_cuda_quant > /tmp/bulk_test_cuda_quant.txt 2>&1; echo "bulk test_cuda_quant rc=$?" >> $S) &
wait
for t in test_cuda_quant test_cuda_core test_cuda_model bulk_test_cuda_quant; do
    echo "==== $t" >> $OUT/tests.txt; cat /tmp/$t.txt >> $OUT/tests.txt
done
A=$OUT/ab.txt
for v in prod full prod full; do
    echo "== $v" >> $A
    case $v in
    prod) timeout 60 build/bench/bench_long --smollm2 > /tmp/t.txt 2>&1 ;;
    full) HYLO_GEMV_PREFETCH=1000000000 timeout 60 build/var/bench_long --smollm2 > /tmp/t.txt 2>&1 ;;
    esac
    echo "rc=$?" >> $A; grep -E "decode|fail|rror" /tmp/t.txt >> $A
done
cupti=$(ls /usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13 /usr/local/cuda/lib64/libcupti.so.13 2>/dev/null | head -1)
export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(dirname "${cupti:-/nonexistent/x}")
timeout 60 build/bench/bench_long --smollm2 --trace > $OUT/trace_smollm2.txt 2>&1; echo "trace smollm2 rc=$?" >> $S
T=$OUT/traces.txt
for v in "base --q4_0" "r36 --q4_0" "new --q4_0" "bulk --q4_0" "new"; do
    set -- $v; b=build/bench/bench_long; bulk=0
    [ $1 = base ] || [ $1 = r36 ] && b=build/$1/bench_long
    [ $1 = bulk ] && b=build/var/bench_long && bulk=1
    echo "==== $v" >> $T
    HYLO_QGEMV_BULK=$bulk timeout 100 $b --6mla22gdn --trace $2 >> $T 2>&1; echo "trace $v rc=$?" >> $S
done
# ncu of k_qgemv in the 3B hybrid's Q4_0 decode (this build): is it bound by
# issue or by memory
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1); echo "ncu=$NCU" > $OUT/ncu.txt
timeout 120 $NCU --clock-control none -k regex:k_qgemv --launch-skip 600 --launch-count 4 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats build/bench/bench_long --6mla22gdn --q4_0 --upto128k >> $OUT/ncu.txt 2>&1
echo "ncu rc=$?" >> $OUT/ncu.txt
ls -la $OUT
