#!/usr/bin/env bash
# run 33 call 2: the GDN step (16-block clusters, one barrier), MLA decode over
# a cluster, the absorptions on the few-row kernels: tests, then A/B in the
# bench-variants build (HYLO_GDN_SLICES=8, HYLO_MLA_CLUSTER=1, HYLO_BATCHED_LT=1: the old paths)
# and against build/base/bench_long (the GDN step before its last changes)
tar xJf .carry/x/x.tar.xz || exit 1
chmod +x build/base/bench_long
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/lib64 HYLO_REQUIRE_GPU=1
S=$OUT/summary.txt; nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
for t in core gdn model attn; do (timeout 170 build/tests/cuda/test_cuda_$t > $OUT/test_cuda_$t.txt 2>&1; echo "test_cuda_$t rc=$?" >> $S) & done
(HYLO_ATTN_TEST_VARIANTS=none timeout 170 build/bench-variants/tests/cuda/test_cuda_attn > $OUT/variants_test_cuda_attn.txt 2>&1; echo "variants_test_cuda_attn rc=$?" >> $S) &
wait
cupti=$(ls /usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13 /usr/local/cuda/lib64/libcupti.so.13 2>/dev/null | head -1)
export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(dirname "${cupti:-/nonexistent/x}")
V=build/bench-variants/bench
A=$OUT/ab.txt
# base: the bench-variants bench_long before k_gdn_step's first-pass state
# loads, merged q/k reduction and early v conv (else as this build)
for v in "base" "HYLO_GDN_SLICES=8 HYLO_MLA_CLUSTER=1 HYLO_BATCHED_LT=1" "new" "HYLO_GDN_SLICES=8" "HYLO_MLA_CLUSTER=1" "HYLO_BATCHED_LT=1" "base" "new" "HYLO_GDN_SLICES=8 HYLO_MLA_CLUSTER=1 HYLO_BATCHED_LT=1"; do
    echo "== $v" >> $A
    case $v in
    base) timeout 40 build/base/bench_long --smollm2 > /tmp/t.txt 2>&1 ;;
    new) timeout 40 $V/bench_long --smollm2 > /tmp/t.txt 2>&1 ;;
    *) env $v timeout 40 $V/bench_long --smollm2 > /tmp/t.txt 2>&1 ;;
    esac
    echo "rc=$?" >> $A; grep "decode" /tmp/t.txt >> $A
done
(timeout 60 build/base/bench_long --smollm2 --trace > $OUT/trace_base.txt 2>&1; echo "trace_base rc=$?" >> $S)
timeout 60 build/bench/bench_long --smollm2 --trace > $OUT/trace.txt 2>&1; echo "trace rc=$?" >> $S
(env HYLO_GDN_SLICES=8 HYLO_MLA_CLUSTER=1 HYLO_BATCHED_LT=1 timeout 60 $V/bench_long --smollm2 --trace > $OUT/trace_old.txt 2>&1; echo "trace_old rc=$?" >> $S)
for c in 8 1; do HYLO_MLA_CLUSTER=$c timeout 60 $V/bench_decode --quick --no-attn > $OUT/mla_cluster$c.txt 2>&1; echo "mla_cluster$c rc=$?" >> $S; done
for lt in 0 1; do HYLO_BATCHED_LT=$lt timeout 60 $V/bench_cuda_core --decode > $OUT/core_lt$lt.txt 2>&1; echo "core_lt$lt rc=$?" >> $S; done
cd $OUT && tar czf r.tar.gz *.txt && rm -f test_*.txt variants_*.txt mla_cluster*.txt core_lt*.txt trace*.txt gpu.txt; ls -la $OUT
