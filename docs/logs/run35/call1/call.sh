#!/usr/bin/env bash
# run 35 call 1 (cut to fit what device time was left): the two kernels
# written in run 34 and never run on a GPU, k_mla_short (HYLO_MLA_SHORT=1)
# and k_gemv_argmax (HYLO_HEAD_ARGMAX=1), from the bench-variants build; the
# quantised products (test_cuda_quant); bench_long --smollm2 with the knobs
# off and on; MLA decode's split at 8K rows; a traced decode step of the 3B
# hybrid after 8K, bf16 and Q4_0.
tar xJf .carry/x/x.tar.xz || exit 1
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/lib64 HYLO_REQUIRE_GPU=1
S=$OUT/summary.txt; nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
(HYLO_ATTN_TEST_VARIANTS=0 HYLO_MLA_TEST_VARIANTS=0,1 timeout 150 build/var/test_cuda_attn > $OUT/var_test_cuda_attn.txt 2>&1; echo "var test_cuda_attn rc=$?" >> $S) &
(HYLO_HEAD_ARGMAX=1 timeout 150 build/var/test_cuda_core > $OUT/var_test_cuda_core_argmax.txt 2>&1; echo "var test_cuda_core HEAD_ARGMAX=1 rc=$?" >> $S) &
(timeout 150 build/tests/cuda/test_cuda_quant > $OUT/test_cuda_quant.txt 2>&1; echo "test_cuda_quant rc=$?" >> $S) &
(timeout 150 build/tests/cuda/test_cuda_model > $OUT/test_cuda_model.txt 2>&1; echo "test_cuda_model rc=$?" >> $S) &
wait
A=$OUT/ab.txt
for v in off both off both; do
    echo "== $v" >> $A
    case $v in
    off) timeout 40 build/var/bench_long --smollm2 > /tmp/t.txt 2>&1 ;;
    both) HYLO_MLA_SHORT=1 HYLO_HEAD_ARGMAX=1 timeout 40 build/var/bench_long --smollm2 > /tmp/t.txt 2>&1 ;;
    esac
    echo "rc=$?" >> $A; grep -E "decode|fail|rror" /tmp/t.txt >> $A
done
M=$OUT/mla_split.txt
for sl in 0 16; do for mg in 0 2; do
    echo "== rows=8192 HYLO_MLA_SLICES=$sl HYLO_MLA_MERGE=$mg" >> $M
    HYLO_MLA_SLICES=$sl HYLO_MLA_MERGE=$mg timeout 20 build/var/bench_decode --no-attn --b1 --rows=8192 2>&1 | grep -E "mla|rror" >> $M
done; done
cupti=$(ls /usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13 /usr/local/cuda/lib64/libcupti.so.13 2>/dev/null | head -1)
export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(dirname "${cupti:-/nonexistent/x}")
timeout 60 build/bench/bench_long --6mla22gdn --trace > $OUT/trace_6mla22gdn.txt 2>&1; echo "trace 6mla22gdn rc=$?" >> $S
timeout 100 build/bench/bench_long --6mla22gdn --trace --q4_0 > $OUT/trace_6mla22gdn_q4_0.txt 2>&1; echo "trace 6mla22gdn q4_0 rc=$?" >> $S
ls -la $OUT
