#!/usr/bin/env bash
# On the GPU machine: hylo eval with the CUDA backend on the default SmolLM2
# teacher (and a converted hybrid), and the independent scorer check against
# transformers (scripts/ref/mc_agree.py). Prepared by an earlier call that
# unpacked the carried files into /tmp/ev (see docs/EVALUATION.md, "On the
# GPU"): /tmp/ev/p1 (the GGUF's first half), /tmp/ev/lib, /tmp/ev/data; this
# call carries .carry/p2. Everything lands in $OUT/<step>.tar.xz.
#   bash scripts/gpu/eval.sh short|ruler|hybrid
set -uo pipefail
export LD_LIBRARY_PATH=/tmp/ev/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
B=build/hylo D=/tmp/ev/data M=/tmp/ev/smol.gguf O=/tmp/ev/out/$1
mkdir -p "$O"
if [ ! -f $M ] && [ -f .carry/p2/gguf.part ]; then
    sha=$(sed -n 's/^sha="\([0-9a-f]*\)"$/\1/p' scripts/fetch_model.sh)
    cat /tmp/ev/p1 .carry/p2/gguf.part > $M.part
    echo "$sha  $M.part" | sha256sum -c --quiet - && mv $M.part $M || echo "GGUF halves do not match" >&2
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$O/gpu.txt"
step() { # name, timeout, command...
    local name=$1 t=$2; shift 2
    echo "\$ $*" > "$O/$name.log"
    local s=$(date +%s)
    timeout "$t" "$@" >> "$O/$name.log" 2>&1
    echo "# exit $? after $(( $(date +%s) - s )) s" >> "$O/$name.log"
}
case $1 in
short)
    step short_gpu 300 $B eval $M --task mc,lambada_openai --device cuda --data $D --out $O/short_gpu
    [ -d /tmp/ev/smol_hf ] || $B export $M --out /tmp/ev/smol_hf > /dev/null
    step agree_gpu 200 python3 scripts/ref/mc_agree.py /tmp/ev/smol_hf $D $O/short_gpu/samples arc_easy piqa --device cuda
    # the same check against hylo's fp32 CPU backend on the first 300 items
    step cpu300 120 $B eval $M --task arc_easy,piqa --limit 300 --device cpu --data $D --out $O/cpu300
    step agree_cpu300 60 python3 scripts/ref/mc_agree.py /tmp/ev/smol_hf $D $O/cpu300/samples arc_easy piqa --device cuda
    ;;
ruler)
    step ruler_gpu 330 $B eval $M --task ruler --lengths 4K,8K --samples 20 --device cuda --chunk 8192 --data $D --out $O/ruler_gpu
    step gsm8k_gpu 120 $B eval $M --task gsm8k --limit 100 --device cuda --data $D --out $O/gsm8k_gpu
    step ppl_gpu 60 $B eval $M --task ppl --device cuda --data $D --ppl-stride 2048 --out $O/ppl_gpu
    ;;
hybrid)
    [ -d /tmp/ev/hyb ] || step convert 120 $B convert --teacher $M --out /tmp/ev/hyb --mla-every 3
    step hybrid_gpu 300 $B eval /tmp/ev/hyb --task mc,lambada_openai,ruler,ppl --limit 500 --lengths 4K --samples 10 \
        --device cuda --chunk 8192 --data $D --out $O/hybrid_gpu
    step bench_gpu 120 $B bench /tmp/ev/hyb --against $M --lengths 1K,4K,16K,32K --decode 32 --device cuda --chunk 8192 --out $O/bench_gpu
    ;;
esac
tar cJf "$OUT/$1.tar.xz" -C /tmp/ev/out "$1"
ls -la "$OUT"
