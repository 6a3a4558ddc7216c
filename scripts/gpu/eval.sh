#!/usr/bin/env bash
# hylo eval with the CUDA backend on the default SmolLM2 teacher and a
# converted hybrid, and the scorer check against transformers
# (scripts/ref/mc_agree.py), on the GPU machine. Steps (one device call each,
# back to back: the machine is given back 30 s after a call):
#   here:   bash scripts/gpu/eval.sh pack    builds build/hylo (CUDA) and fills .carry/
#   call 1: bash scripts/gpu/eval.sh prep    carry .carry/bins.tar.xz .carry/lib .carry/p1 .carry/data.tar.xz
#   call 2: bash scripts/gpu/eval.sh short   carry .carry/p2 (the GGUF's second half)
#   call 3: bash scripts/gpu/eval.sh ruler
#   call 4: bash scripts/gpu/eval.sh hybrid
# Each of 2-4 returns $OUT/<step>.tar.xz (results, reports, samples, logs).
set -uo pipefail
if [ "$1" = pack ]; then
    set -e
    make -j2 build/hylo >/dev/null
    mkdir -p .carry/stage/build .carry/lib .carry/p1 .carry/p2
    cp build/hylo .carry/stage/build/ && strip .carry/stage/build/hylo
    tar cf - -C .carry/stage build | xz -9 -T2 > .carry/bins.tar.xz && rm -rf .carry/stage
    scripts/gpu/carry_libs.sh
    model=$(scripts/fetch_model.sh) half=$(( ($(stat -c %s "$(scripts/fetch_model.sh --path)") + 1) / 2 ))
    head -c $half "$model" > .carry/p1/gguf.part && tail -c +$((half + 1)) "$model" > .carry/p2/gguf.part
    tar cf - -C .. shared/data/eval shared/data/essays shared/data/words | xz -6 -T2 > .carry/data.tar.xz
    exit 0
fi
if [ "$1" = prep ]; then
    tar xJf .carry/bins.tar.xz && mkdir -p /tmp/ev && cp .carry/p1/gguf.part /tmp/ev/p1 && cp -r .carry/lib /tmp/ev/lib &&
        tar xJf .carry/data.tar.xz -C /tmp/ev && mv /tmp/ev/shared/data /tmp/ev/data
    LD_LIBRARY_PATH=/tmp/ev/lib:/usr/local/cuda/lib64 ldd build/hylo | grep "not found"
    exit 0
fi
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
    step short_gpu 200 $B eval $M --task mc,lambada_openai --device cuda --data $D --out $O/short_gpu
    [ -d /tmp/ev/smol_hf ] || $B export $M --out /tmp/ev/smol_hf > /dev/null
    step agree_gpu 130 python3 scripts/ref/mc_agree.py /tmp/ev/smol_hf $D $O/short_gpu/samples arc_easy piqa --device cuda
    # the same check against hylo's fp32 CPU backend on the first 300 items
    step cpu300 100 $B eval $M --task arc_easy,piqa --limit 300 --device cpu --data $D --out $O/cpu300
    step agree_cpu300 50 python3 scripts/ref/mc_agree.py /tmp/ev/smol_hf $D $O/cpu300/samples arc_easy piqa --device cuda
    ;;
ruler)
    step ruler_gpu 260 $B eval $M --task ruler --lengths 4K,8K --samples 20 --device cuda --chunk 8192 --data $D --out $O/ruler_gpu
    step gsm8k_gpu 100 $B eval $M --task gsm8k --limit 100 --device cuda --data $D --out $O/gsm8k_gpu
    step ppl_gpu 60 $B eval $M --task ppl --device cuda --data $D --ppl-stride 2048 --out $O/ppl_gpu
    ;;
hybrid)
    [ -d /tmp/ev/hyb ] || step convert 90 $B convert --teacher $M --out /tmp/ev/hyb --mla-every 3
    step hybrid_gpu 220 $B eval /tmp/ev/hyb --task mc,lambada_openai,ruler,ppl --limit 500 --lengths 4K --samples 10 \
        --device cuda --chunk 8192 --data $D --out $O/hybrid_gpu
    step bench_gpu 100 $B bench /tmp/ev/hyb --against $M --lengths 1K,4K,16K,32K --decode 32 --device cuda --chunk 8192 --out $O/bench_gpu
    ;;
esac
tar cJf "$OUT/$1.tar.xz" -C /tmp/ev/out "$1"
ls -la "$OUT"
