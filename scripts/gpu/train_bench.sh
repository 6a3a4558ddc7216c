#!/usr/bin/env bash
# Issue 8's KD step table in one device call: hylo's bench_train and the
# PyTorch + FLA + transformers reference (scripts/ref/bench_kd_ref.py) on the
# same shapes, one after the other on the same card. Carry .carry/tb
# (build/bench/bench_train, xz-compressed), .carry/lib and .carry/fla: FLA's
# Python package from the fla-core and flash-linear-attention 0.6.0 wheels
# (scripts/gpu/fetch_fla.sh makes it). SHAPES lists
# the cases (default: 1B 8K, 1B 64K, 8B 64K, all with blocks recomputed);
# LIMIT bounds each run in seconds, FIRST_LIMIT the first reference run,
# which compiles FLA's Triton kernels (run 26: over 150 s; later runs reuse
# the cache). Logs in $OUT/r.tar.gz.
xz -dkf .carry/tb/bench_train.xz || exit 1
chmod +x .carry/tb/bench_train
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/lib64
R=$OUT/r; mkdir -p $R; nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
warm=
for s in ${SHAPES:-1b8k 1b64k 8b64k}; do
    case $s in
        1b8k) h="--T8k"; p="--T 8192" ;;
        1b64k) h="--T64k"; p="--T 65536" ;;
        8b64k) h="--teacher8b --T64k"; p="--teacher8b --T 65536" ;;
        8b128k) h="--teacher8b --T128k"; p="--teacher8b --T 131072" ;;
        *) echo "unknown shape $s"; exit 2 ;;
    esac
    echo "== bench_train $h --recompute" >> $R/bench_train.txt
    timeout ${LIMIT:-150} .carry/tb/bench_train $h --recompute >> $R/bench_train.txt 2>&1
    echo "bench_train $s rc=$?" >> $R/summary.txt
    echo "== bench_kd_ref $p --recompute" >> $R/bench_kd_ref.txt
    lim=${LIMIT:-150}; [ -z "$warm" ] && lim=${FIRST_LIMIT:-300}; warm=1
    timeout $lim python3 scripts/ref/bench_kd_ref.py --fla .carry/fla $p --recompute 2>&1 | grep -v Warning >> $R/bench_kd_ref.txt
    [ ${PIPESTATUS[0]} = 0 ] || echo "bench_kd_ref $s failed or timed out" >> $R/summary.txt
done
cat $R/summary.txt; cat $R/bench_train.txt | grep -v '^\s*$' | tail -40; grep -h '==\|phase\|tokens/s' $R/bench_kd_ref.txt
tar czf $OUT/r.tar.gz -C $OUT r && rm -rf $R
