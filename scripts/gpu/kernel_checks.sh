#!/usr/bin/env bash
# One short device call after kernel work, carrying only .carry/t (upcycle.sh
# pack) and .carry/lib (and .carry/tv for VARIANTS and ATTN_DQB): the
# production CUDA tests of attention, the model, GDN,
# the core ops and Mamba-2's SSD side by side (TESTS: another list) (correctness only, so they may share the GPU),
# the bench-variants attention test under the variants listed in
# VARIANTS (none: not run) (test_cuda_attn's HYLO_ATTN_TEST_VARIANTS; default 5, the mma.sync
# backward), then, one after the other: decode attention against a device
# copy (bench_decode --quick), single-stream decode of SmolLM2-shaped models
# (bench_long --smollm2; also .carry/base/bench_long.xz, an older build to
# compare against on the same card, when carried), bench_attn --compare and
# torch SDPA (cuDNN, flash) on the same shapes (REF=0 skips these two); with
# MLA_DIAG=1 also the failing MLA decode point bisected (below), with
# MLA_SPLIT=1 the MLA decode's slices swept at B = 1 (below), with GEMV=1
# the few-row products' columns per warp (below), with
# PREFILL=1 bench_long --batch-prefill, with CORE_BENCH=1
# bench_cuda_core (below), with TRACE=1 the SmolLM2 decode steps' kernel
# timelines (bench_long --smollm2 --trace; CUPTI from the CUDA toolkit, else
# the first libcupti.so.13 on the machine, torch's among them), with
# ATTN_DQB=1 the attention backward's dQ variants at 8K and 64K. Logs in
# $OUT/r.tar.gz (one file: a call brings back only so many), which the script
# writes itself and then removes $OUT/r: a command that runs it must not tar
# $OUT/r again (run 30 lost its logs so: an empty archive over the script's).
tar xJf .carry/t/tests.tar.xz || exit 1
# the bench-variants attention and GDN binaries (VARIANTS, ATTN_DQB): upcycle.sh
# pack's .carry/tv, carried when those parts run
[ -f .carry/tv/variants.tar.xz ] && { tar xJf .carry/tv/variants.tar.xz || exit 1; }
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/lib64 HYLO_REQUIRE_GPU=1
R=$OUT/r; mkdir -p $R; nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
s=$(date +%s)
for t in ${TESTS:-attn model gdn core ssd}; do (timeout ${TESTS_LIMIT:-170} build/tests/cuda/test_cuda_$t > $R/test_cuda_$t.txt 2>&1; echo "test_cuda_$t rc=$? $(( $(date +%s) - s )) s" >> $R/summary.txt) & done
if [ "${VARIANTS:-5}" != none ] && [ ! -x build/bench-variants/tests/cuda/test_cuda_attn ]; then
    echo "variants_test_cuda_attn skipped: .carry/tv not carried" >> $R/summary.txt
    VARIANTS=none
fi
[ "${VARIANTS:-5}" = none ] ||
    (HYLO_ATTN_TEST_VARIANTS=${VARIANTS:-5} timeout ${VARIANTS_LIMIT:-300} build/bench-variants/tests/cuda/test_cuda_attn > $R/variants_test_cuda_attn.txt 2>&1; echo "variants_test_cuda_attn rc=$? $(( $(date +%s) - s )) s" >> $R/summary.txt) &
wait
timeout ${DECODE_LIMIT:-120} build/bench/bench_decode --quick > $R/bench_decode.txt 2>&1; echo "bench_decode rc=$?" >> $R/summary.txt
# MLA_DIAG=1: the MLA decode point that fails (B = 8, 1M rows; runs 25-27:
# a fault or a hang, memcheck clean) bisected: batch and rows (the first pool
# over 2 GiB: B = 8 at 768K rows of the first shape), then at B = 8, 1M rows
# the bench-variants build's loads (3: a bulk copy per row, no tensor map;
# 1: v1) and the default once more; 20 s each, output line by line
if [ "${MLA_DIAG:-0}" = 1 ]; then
    for point in "B8_512K -- --batch=8 --rows=524288" "B8_768K -- --batch=8 --rows=786432" \
        "B4_1M -- --batch=4 --rows=1048576" "B8_1M_rows HYLO_MLA_DECODE=3 --batch=8 --rows=1048576" \
        "B8_1M_v1 HYLO_MLA_DECODE=1 --batch=8 --rows=1048576" "B8_1M -- --batch=8 --rows=1048576"; do
        set -- $point
        name=$1; knob=$2; shift 2
        [ "$knob" = -- ] && knob=HYLO_MLA_DECODE=0
        env $knob timeout 20 stdbuf -oL build/bench-variants/bench/bench_decode --no-attn "$@" > $R/mla_diag_$name.txt 2>&1
        echo "mla_diag $name rc=$?" >> $R/summary.txt
    done
fi
# MLA_SPLIT=1: MLA decode at B = 1 with its slices per sequence capped
# (HYLO_MLA_SLICES, bench-variants build; 0: the default, one wave) and the
# slices merged by the combine kernel (default rule) or by the last block
# (HYLO_MLA_MERGE=1), at 64K and 256K rows: the split-K choice per shape
if [ "${MLA_SPLIT:-0}" = 1 ]; then
    for rows in 65536 262144; do
        for sl in 0 96 66 48 33 24 16; do
            for mg in 0 1; do
                echo "== rows $rows slices $sl merge $mg" >> $R/mla_split.txt
                HYLO_MLA_SLICES=$sl HYLO_MLA_MERGE=$mg timeout 20 build/bench-variants/bench/bench_decode --no-attn \
                    --batch=1 --rows=$rows >> $R/mla_split.txt 2>&1
                echo "rc=$?" >> $R/mla_split.txt
            done
        done
    done
    echo "mla split: $(grep -c '^==' $R/mla_split.txt) runs (their return codes in the log)" >> $R/summary.txt
fi
# GEMV=1: the plain few-row products with 2 and 4 columns a warp at every
# row count (bench-variants HYLO_GEMV_COLS; production: 4 columns from 5
# rows, else 1): test_cuda_core through each, then bench_cuda_core --decode
# (1 to 8 rows, the fused products beside) with 1, 2 and 4 columns a warp
# forced, and production's choice
if [ "${GEMV:-0}" = 1 ]; then
    for c in 2 4; do
        HYLO_GEMV_COLS=$c timeout 120 build/bench-variants/tests/cuda/test_cuda_core > $R/gemv_test_$c.txt 2>&1
        echo "gemv test cols $c rc=$?" >> $R/summary.txt
    done
    for c in 1 2 4 0; do
        HYLO_GEMV_COLS=$c timeout 60 build/bench-variants/bench/bench_cuda_core --decode > $R/gemv_bench_$c.txt 2>&1
        echo "gemv bench cols $c rc=$?" >> $R/summary.txt
    done
fi
# ATTN_DQB=1: the attention backward's dQ by bulk reductions against register adds at
# 8K and 64K: production, dQ by bulk reductions everywhere (5), by register
# adds everywhere (6), each f+b beside cuDNN SDPA in the same call
if [ "${ATTN_DQB:-0}" = 1 ]; then
    timeout 100 build/bench/bench_attn --no-decode > $R/attn_dqb_prod.txt 2>&1; echo "attn prod rc=$?" >> $R/summary.txt
    for v in 5 6; do
        HYLO_ATTN_BWD=$v timeout 100 build/bench-variants/bench/bench_attn --no-decode > $R/attn_dqb_$v.txt 2>&1
        echo "attn bwd $v rc=$?" >> $R/summary.txt
    done
    timeout 150 python3 scripts/ref/bench_sdpa.py --backends cudnn > $R/sdpa_cudnn.txt 2>&1; echo "sdpa cudnn rc=$?" >> $R/summary.txt
fi
timeout ${LONG_LIMIT:-90} build/bench/bench_long --smollm2 > $R/bench_long_smollm2.txt 2>&1; echo "bench_long rc=$?" >> $R/summary.txt
# PREFILL=1: a server's prefill turns, 8 requests apart and in one forward
# (bench_turns.h), for the SmolLM2 shape, its 10MLA20GDN hybrid and HyLo-3B
# 6MLA22GDN
if [ "${PREFILL:-0}" = 1 ]; then
    timeout 150 build/bench/bench_long --batch-prefill > $R/batch_prefill.txt 2>&1; echo "batch prefill rc=$?" >> $R/summary.txt
fi
# CORE_BENCH=1: the shared ops, the decode products' weight bandwidth among them
if [ "${CORE_BENCH:-0}" = 1 ]; then
    timeout 90 build/bench/bench_cuda_core > $R/bench_cuda_core.txt 2>&1; echo "bench_cuda_core rc=$?" >> $R/summary.txt
fi
if [ "${TRACE:-0}" = 1 ]; then
    cupti=$(ls /usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13 /usr/local/cuda/lib64/libcupti.so.13 2>/dev/null | head -1)
    [ -n "$cupti" ] || cupti=$(find / -name 'libcupti.so.13*' -not -path '/proc/*' 2>/dev/null | head -1)
    echo "cupti: $cupti" >> $R/summary.txt
    LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(dirname "${cupti:-/nonexistent/x}") timeout 90 build/bench/bench_long --smollm2 --trace > $R/trace_smollm2.txt 2>&1
    echo "trace rc=$?" >> $R/summary.txt
fi
[ -f .carry/base/bench_long.xz ] && xz -dkf .carry/base/bench_long.xz && chmod +x .carry/base/bench_long # (xz keeps the .xz file's mode)
if [ -x .carry/base/bench_long ]; then
    timeout ${LONG_LIMIT:-90} .carry/base/bench_long --smollm2 > $R/base_bench_long_smollm2.txt 2>&1; echo "base bench_long rc=$?" >> $R/summary.txt
fi
if [ "${REF:-1}" = 1 ]; then
    timeout 45 build/bench-variants/bench/bench_attn --compare --quick --no-decode > $R/bench_attn_compare.txt 2>&1; echo "bench_attn rc=$?" >> $R/summary.txt
    timeout 45 python3 scripts/ref/bench_sdpa.py --quick > $R/bench_sdpa.txt 2>&1; echo "bench_sdpa rc=$?" >> $R/summary.txt
fi
cat $R/summary.txt; grep -h 'PASSED\|FAILED' $R/*.txt | sort | uniq -c
grep -h ' FAILED \|failed' $R/test_*.txt | head -20
grep -H 'T=' $R/*bench_long*.txt | sed 's/prefill.*decode/decode/; s/cache.*//'
# the optional parts' main figures, so that the call's printed tail holds them
# even when the archive does not come back
[ -f $R/batch_prefill.txt ] && grep 'turn' $R/batch_prefill.txt
[ -f $R/mla_split.txt ] && grep '^==\|hylo-3b *| 1 ' $R/mla_split.txt | paste - - | cut -c1-160
for f in $R/gemv_bench_*.txt; do [ -f $f ] && { echo "$f"; grep 'rows=[18] ' $f | cut -c1-90; }; done
for f in $R/gemv_test_*.txt; do [ -f $f ] && grep -H 'PASSED\|FAILED' $f; done
[ -f $R/trace_smollm2.txt ] && grep -A40 'per step, by kernel' $R/trace_smollm2.txt | head -80
tar czf $OUT/r.tar.gz -C $OUT r && rm -rf $R
