#!/usr/bin/env bash
# The CPU evaluation of the default SmolLM2 teacher behind docs/EVALUATION.md's
# results table: short benchmarks on the first items of each set, RULER at 4K
# on one sample per task (a 4K prompt takes minutes on 2 shared cores),
# perplexity of the first 10 essays; and the same for an untrained hybrid
# converted from it. Each run's command, stdout and stderr go to
# docs/logs/cpu/eval/<name>.log beside its result.json and report.html. Run
# from the repository root after `make CUDA=0`.
#   scripts/eval_cpu.sh [short|ruler|ppl|hybrid]...   (default: all)
set -euo pipefail
BIN=${BIN:-build-cpu/hylo}
M=${M:-$(scripts/fetch_model.sh --path)}
LOGS=docs/logs/cpu/eval
WORK=${WORK:-/tmp/hylo_eval_cpu}
mkdir -p "$LOGS" "$WORK"
run() { # name, then the hylo arguments (the model is $MODEL, default the teacher)
    local name=$1; shift
    local cmd=("$BIN" eval "${MODEL:-$M}" "$@" --out "$WORK/$name")
    { echo "\$ ${cmd[*]}"; echo "# $(date -u +%FT%TZ) on $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)";
      /usr/bin/time -v "${cmd[@]}" 2>&1; } > "$LOGS/$name.log"
    cp "$WORK/$name/result.json" "$LOGS/$name.result.json"
    cp "$WORK/$name/report.html" "$LOGS/$name.report.html"
}
ESSAYS=$(ls ../shared/data/essays/*.txt | head -10 | sed 's/^/--text /')
HYB=$WORK/hybrid_mla3
todo=("${@:-short ruler ppl hybrid}")
for what in ${todo[@]}; do
    case $what in
    short) run short --task mc,lambada_openai --limit 100 --threads 2 && \
           run gsm8k --task gsm8k --limit 25 --threads 2 ;;
    ruler) run ruler4k --task ruler --lengths 4K --samples 1 --threads 2 ;;
    ppl) run ppl_essays --task ppl $ESSAYS --ppl-len 2048 --threads 2 ;;
    hybrid)
        [ -d "$HYB" ] || "$BIN" convert --teacher "$M" --out "$HYB" --mla-every 3 > "$LOGS/hybrid_convert.log" 2>&1
        MODEL=$HYB run hybrid_short --task mc,lambada_openai --limit 100 --threads 2 \
            --against "$LOGS/short.result.json"
        MODEL=$HYB run hybrid_ppl --task ppl $ESSAYS --ppl-len 2048 --threads 2 --against "$LOGS/ppl_essays.result.json"
        MODEL=$HYB run hybrid_ruler4k --task niah_single_1,niah_single_2,vt,fwe --lengths 4K --samples 1 --threads 2 ;;
    *) echo "unknown: $what" >&2; exit 2 ;;
    esac
done
