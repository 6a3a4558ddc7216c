#!/usr/bin/env bash
# run 34 call 2: greedy steps with the argmax over slices, the ids written
# into the host ring, the final norm inside the head (b50ffa3) against the
# greedy path of 05082d7 (build/base): CUDA tests, bench_long --smollm2 A/B, traces
tar xJf .carry/x/x.tar.xz || exit 1
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/lib64 HYLO_REQUIRE_GPU=1
S=$OUT/summary.txt; nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
for t in core model; do (timeout 170 build/tests/cuda/test_cuda_$t > $OUT/test_cuda_$t.txt 2>&1; echo "test_cuda_$t rc=$?" >> $S) & done
wait
A=$OUT/ab.txt
for v in base new base new; do
    echo "== $v" >> $A
    case $v in
    base) timeout 60 build/base/bench_long --smollm2 > /tmp/t.txt 2>&1 ;;
    new) timeout 60 build/bench/bench_long --smollm2 > /tmp/t.txt 2>&1 ;;
    esac
    echo "rc=$?" >> $A; grep -E "decode|fail|rror" /tmp/t.txt >> $A
done
cupti=$(ls /usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13 /usr/local/cuda/lib64/libcupti.so.13 2>/dev/null | head -1)
export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(dirname "${cupti:-/nonexistent/x}")
timeout 60 build/bench/bench_long --smollm2 --trace > $OUT/trace.txt 2>&1; echo "trace rc=$?" >> $S
ls -la $OUT
