#!/usr/bin/env bash
# `hylo data` encoding speed next to Hugging Face `tokenizers` (batch encoder)
# on the same documents, for docs/PERFORMANCE.md ("Data").
#
#   PYTHON=/tmp/hfvenv/bin/python scripts/bench_data.sh [TEXT_DIR] | tee docs/logs/cpu/bench_data.txt
#
# TEXT_DIR: a folder of .txt files, one document each (default: the reST
# sources of the Python 3.11 documentation from Debian's python3-doc, plain
# text). PYTHON must have `tokenizers` (python3 -m venv /tmp/hfvenv &&
# /tmp/hfvenv/bin/pip install tokenizers). The tokenizer is SmolLM2's as
# `hylo export` writes it. hylo runs end to end (read, encode, write the shard;
# the summary line's time) on the folder and on the same documents as one
# .jsonl; tokenizers is timed on encode_batch (and encode_batch_fast) alone,
# the files read before the clock. Best wall time of 3 runs each, with 1 and 2
# threads, and the CPU time (user + sys, all threads) of that run, which other
# work on a shared machine disturbs less. The token counts of the two must
# agree (hylo's minus one EOS per document); the script fails otherwise.
set -euo pipefail
BIN=${BIN:-build-cpu/hylo}
PY=${PYTHON:-python3}
TEXT=${1:-/usr/share/doc/python3.11/html/_sources}
WORK=${WORK:-/tmp/hylo_bench_data}
MODEL=$(scripts/fetch_model.sh --path)
[ -d "$TEXT" ] || { echo "bench_data: no folder $TEXT (apt-get install python3-doc, or pass one)" >&2; exit 2; }
mkdir -p "$WORK"
export HYLO_LOG=warn

echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(uname -m) $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# hylo $(git rev-parse --short HEAD 2>/dev/null || echo '?'), text: $TEXT"
[ -f "$WORK/smol/tokenizer.json" ] || "$BIN" export "$MODEL" --out "$WORK/smol" --dtype bf16 >/dev/null
# The same documents as {"text": ...} lines, in hylo's order (paths sorted).
"$PY" - "$TEXT" "$WORK/corpus.jsonl" <<'EOF'
import json, os, sys
files = sorted(os.path.join(r, n) for r, _, ns in os.walk(sys.argv[1]) for n in ns if n.endswith(".txt"))
with open(sys.argv[2], "w", encoding="utf-8") as out:
    for f in files:
        out.write(json.dumps({"text": open(f, encoding="utf-8").read()}, ensure_ascii=False) + "\n")
EOF

# Best of 3 runs of `hylo data ARGS`: the summary line with the highest
# tokens/s, followed by that run's CPU seconds.
hylo_best() {
    local line top="" topv=0 v cpu topcpu=""
    for r in 1 2 3; do
        line=$(/usr/bin/time -f "cpu %U %S" -o "$WORK/time.txt" "$BIN" data --tokenizer "$MODEL" --out "$WORK/out.shard" "$@")
        cpu=$(awk '{ printf "%.2f", $2 + $3 }' "$WORK/time.txt")
        v=$(echo "$line" | sed 's/.*: \([0-9]*\) tokens\/s.*/\1/')
        echo "  run $r: $line; $cpu s CPU" >&2
        if [ "$v" -gt "$topv" ]; then top=$line topv=$v topcpu=$cpu; fi
    done
    echo "$top; $topcpu s CPU"
}

cat "$TEXT"/*.txt >/dev/null 2>&1 || true # warm the page cache
for th in 1 2; do
    echo "\$ $BIN data --tokenizer MODEL --out OUT --threads $th $TEXT"
    h=$(hylo_best --threads $th "$TEXT")
    echo "$h"
    echo "\$ $BIN data --tokenizer MODEL --out OUT --threads $th $WORK/corpus.jsonl"
    hylo_best --threads $th "$WORK/corpus.jsonl"
    for fast in "" --fast; do
        echo "\$ RAYON_NUM_THREADS=$th $PY scripts/ref/bench_tokenizers.py $fast --tokenizer $WORK/smol/tokenizer.json $TEXT"
        f=$(RAYON_NUM_THREADS=$th "$PY" scripts/ref/bench_tokenizers.py $fast --tokenizer "$WORK/smol/tokenizer.json" "$TEXT")
        echo "$f"
    done
    docs=$(echo "$h" | sed 's/.*: \([0-9]*\) documents.*/\1/')
    ht=$(echo "$h" | sed 's/.*files, \([0-9]*\) tokens.*/\1/')
    ft=$(echo "$f" | sed 's/.* MB, \([0-9]*\) tokens.*/\1/')
    if [ $((ht - docs)) -ne "$ft" ]; then
        echo "bench_data: token counts differ: hylo $ht - $docs EOS vs tokenizers $ft" >&2
        exit 1
    fi
    echo "# token counts agree: hylo $ht = tokenizers $ft + $docs EOS"
done
echo "# done, load $(cut -d' ' -f1-3 /proc/loadavg)"
