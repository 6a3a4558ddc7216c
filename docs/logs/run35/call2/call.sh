#!/usr/bin/env bash
# run 35 call 2: k_mla_short as production and MLA_MERGE_BYTES 32 KB (c6cf52d):
# the production CUDA tests of MLA decode and the model, then bench_long
# --smollm2 against 2fb9f96 (build/base), once each.
tar xJf .carry/x/x.tar.xz || exit 1
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/lib64 HYLO_REQUIRE_GPU=1
S=$OUT/summary.txt; nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
(timeout 120 build/tests/cuda/test_cuda_attn > $OUT/test_cuda_attn.txt 2>&1; echo "test_cuda_attn rc=$?" >> $S) &
(timeout 120 build/tests/cuda/test_cuda_model > $OUT/test_cuda_model.txt 2>&1; echo "test_cuda_model rc=$?" >> $S) &
wait
A=$OUT/ab.txt
for v in base bench; do
    echo "== $v" >> $A
    timeout 35 build/$v/bench_long --smollm2 > /tmp/t.txt 2>&1
    echo "rc=$?" >> $A; grep -E "decode|fail|rror" /tmp/t.txt >> $A
done
ls -la $OUT
