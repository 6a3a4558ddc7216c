#!/usr/bin/env bash
# Issue 8's KD step table in one device call: hylo's bench_train and the
# PyTorch + FLA + transformers reference (scripts/ref/bench_kd_ref.py) on the
# same shapes, one after the other on the same card. Carry .carry/tb (the
# bench_train binary, xz; see docs/PERFORMANCE.md for how it is built),
# .carry/lib and .carry/fla (FLA's Python package). SHAPES lists the cases
# (default: 1B 8K, 1B 64K, 8B 64K, all with blocks recomputed); LIMIT bounds
# each run in seconds. Logs in $OUT/r.tar.gz.
xz -dkf .carry/tb/bench_train.xz || exit 1
chmod +x .carry/tb/bench_train
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/lib64
R=$OUT/r; mkdir -p $R; nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
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
    timeout ${LIMIT:-150} python3 scripts/ref/bench_kd_ref.py --fla .carry/fla $p --recompute >> $R/bench_kd_ref.txt 2>&1
    echo "bench_kd_ref $s rc=$?" >> $R/summary.txt
done
cat $R/summary.txt; cat $R/bench_train.txt | grep -v '^\s*$' | tail -40; grep -h '==\|phase\|tokens/s' $R/bench_kd_ref.txt
tar czf $OUT/r.tar.gz -C $OUT r && rm -rf $R
