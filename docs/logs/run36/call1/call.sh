#!/usr/bin/env bash
# run 36 call 1: (a) the production build of c6cf52d (k_mla_short for caches
# of up to 4,096 rows, MLA_MERGE_BYTES 32 KB) on a GPU for the first time: the
# CUDA tests, and bench_long --smollm2 against the bench-variants build with
# HYLO_MLA_SHORT=0 (v2); (b) k_qgemv on integer dot products (x rounded to
# 8-bit blocks as the CPU does) and the norms' batched loads: test_cuda_quant
# against the CPU's arithmetic, and the 3B hybrid's traced decode step in
# Q4_0 / Q8_0 against the build of 5cab5a3 (build/base); (c) the bf16 step
# with the decode products' L2 prefetch capped (HYLO_GEMV_PREFETCH, bench-variants).
tar xJf .carry/x/x.tar.xz || exit 1
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/lib64 HYLO_REQUIRE_GPU=1
S=$OUT/summary.txt; nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
for t in test_cuda_attn test_cuda_model test_cuda_quant test_cuda_core; do
    (timeout 200 build/tests/cuda/$t > /tmp/$t.txt 2>&1; echo "$t rc=$?" >> $S) &
done
(timeout 200 build/var/test_cuda_attn > /tmp/var_test_cuda_attn.txt 2>&1; echo "var test_cuda_attn rc=$?" >> $S) &
wait
for t in test_cuda_attn test_cuda_model test_cuda_quant test_cuda_core var_test_cuda_attn; do
    echo "==== $t" >> $OUT/tests.txt; cat /tmp/$t.txt >> $OUT/tests.txt
done
A=$OUT/ab.txt
for v in prod v2 prod v2; do
    echo "== $v" >> $A
    case $v in
    prod) timeout 60 build/bench/bench_long --smollm2 > /tmp/t.txt 2>&1 ;;
    v2) HYLO_MLA_SHORT=0 timeout 60 build/var/bench_long --smollm2 > /tmp/t.txt 2>&1 ;;
    esac
    echo "rc=$?" >> $A; grep -E "decode|fail|rror" /tmp/t.txt >> $A
done
cupti=$(ls /usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13 /usr/local/cuda/lib64/libcupti.so.13 2>/dev/null | head -1)
export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(dirname "${cupti:-/nonexistent/x}")
T=$OUT/traces.txt
for v in "base --q4_0" "new --q4_0" "new --q8_0" "var -1" "var 0" "var 2048"; do
    set -- $v; b=build/bench/bench_long; q=$2; pf=-1
    [ $1 = base ] && b=build/base/bench_long
    [ $1 = var ] && b=build/var/bench_long && q= && pf=$2
    echo "==== $v" >> $T
    HYLO_GEMV_PREFETCH=$pf timeout 100 $b --6mla22gdn --trace $q >> $T 2>&1; echo "trace $v rc=$?" >> $S
done
ls -la $OUT
