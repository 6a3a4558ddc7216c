#!/usr/bin/env bash
# run 35 call 2: k_mla_short as production and MLA_MERGE_BYTES 32 KB (c6cf52d):
# the CUDA tests (production; the bench-variants build's v2 for short caches,
# HYLO_MLA_SHORT=0), bench_long --smollm2 against 2fb9f96 (build/base).
tar xJf .carry/x/x.tar.xz || exit 1
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/lib64 HYLO_REQUIRE_GPU=1
S=$OUT/summary.txt; nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
(timeout 170 build/tests/cuda/test_cuda_attn > $OUT/test_cuda_attn.txt 2>&1; echo "test_cuda_attn rc=$?" >> $S) &
(timeout 170 build/tests/cuda/test_cuda_model > $OUT/test_cuda_model.txt 2>&1; echo "test_cuda_model rc=$?" >> $S) &
(HYLO_ATTN_TEST_VARIANTS=0 HYLO_MLA_TEST_VARIANTS=1 timeout 170 build/var/test_cuda_attn > /tmp/var.txt 2>&1; echo "var test_cuda_attn (HYLO_MLA_SHORT=0) rc=$?" >> $S; grep -E "failed|FAIL|OK|PASS" /tmp/var.txt > $OUT/var_test_cuda_attn_summary.txt) &
wait
A=$OUT/ab.txt
for v in base new base new; do
    echo "== $v" >> $A
    timeout 40 build/$( [ $v = base ] && echo base || echo bench )/bench_long --smollm2 > /tmp/t.txt 2>&1
    echo "rc=$?" >> $A; grep -E "decode|fail|rror" /tmp/t.txt >> $A
done
ls -la $OUT
