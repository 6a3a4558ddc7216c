#!/usr/bin/env bash
# The main job on the default model (README command 1), the whole HyLo
# pipeline: fetch SmolLM2-135M-Instruct, show what it is, ask it a question
# through its chat template; upcycle it into a hybrid (MLA at every third
# layer, Gated DeltaNet or Mamba-2 elsewhere) and measure its distance to the
# teacher; then distil: stage 1 (layer-wise, pure-MLA and pure-linear students), assembly
# by the layer plan, stage 2 (end-to-end KD); measure again and chat with it.
# The training text is built here from text every Debian system has (the
# licences in /usr/share/common-licenses) and this repository's docs/: no
# ../shared needed.
# BIN may point at another hylo build (default: the one a plain 'make' builds,
# build/hylo when nvcc is on the PATH, else build-cpu/hylo); DEMO_OUT is where
# everything goes and stays (models, checkpoints with optimizer state, recipes,
# metrics, loss plots: 6.3 GB; default a temporary folder, removed when the
# demo ends); DEMO_STEPS the optimizer steps
# of each training stage (default 24); DEMO_SEQ and DEMO_BATCH the tokens per
# row and rows per step (default 128 and 2); DEMO_TEXT the text compare reads
# (default ../shared/data/essays when it exists, else README.md); DEMO_CORPUS
# a folder of extra training text (.txt); DEMO_WINDOWS and DEMO_TOKENS the
# windows compare reads (default 4 x 48); DEVICE cpu or cuda (default cpu);
# LINEAR gdn or mamba2, the linear block (default gdn: 10MLA20GDN).
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v "${NVCC:-nvcc}" >/dev/null 2>&1; then bin=build/hylo; else bin=build-cpu/hylo; fi
bin="${BIN:-$bin}"
[ -x "$bin" ] || { echo "hylo: error: demo: $bin does not exist (run 'make demo', or set BIN)" >&2; exit 1; }
model=$(scripts/fetch_model.sh)
if [ -n "${DEMO_OUT:-}" ]; then
    work="$DEMO_OUT"
else # the checkpoints hold fp32 weights and AdamW moments: gigabytes, not left in /tmp
    work=$(mktemp -d /tmp/hylo-demo.XXXXXX)
    trap 'rm -rf "$work"' EXIT
fi
linear="${LINEAR:-gdn}"
case $linear in
gdn) lin_name=GDN lin_recipe=gdn ;;
mamba2) lin_name=Mamba-2 lin_recipe=mamba ;;
*) echo "hylo: error: demo: LINEAR must be gdn or mamba2 (got '$linear')" >&2; exit 1 ;;
esac
out="$work/smollm2-10mla20$linear"
steps="${DEMO_STEPS:-24}"
seq="${DEMO_SEQ:-128}"
batch="${DEMO_BATCH:-2}"
device="${DEVICE:-cpu}"
echo "== hylo info $model"
"$bin" info "$model"
echo
echo "== hylo chat (one turn; greedy. Its first token is a near-tie: on the GGUF's quantised weights hylo, like"
echo "   llama.cpp, starts with \"L'\"; with --f32 the answer is \"The capital of France is Paris.\")"
"$bin" chat "$model" --prompt "What is the capital of France?" -n 64 --stats
echo
echo "== hylo convert: 10 MLA + 20 $lin_name layers"
"$bin" convert --teacher "$model" --out "$out" --mla-every 3 --linear "$linear"
echo
echo "== hylo info (hybrid)"
"$bin" info "$out" | grep -E "mixers|KV cache|recurrent|parameters"
echo
echo "== hylo generate (untrained hybrid: its text is not meaningful before distillation)"
"$bin" generate "$out" --prompt "The capital of France is" -n 16
echo
text="${DEMO_TEXT:-../shared/data/essays}"
[ -e "$text" ] || text=README.md # any English text will do
echo "== hylo compare teacher vs untrained hybrid"
"$bin" compare "$model" "$out" --device "$device" --text "$text" --windows "${DEMO_WINDOWS:-4}" --tokens "${DEMO_TOKENS:-48}" | tee "$work/compare_untrained.txt"
echo
echo "== hylo data: a training corpus from /usr/share/common-licenses and docs/"
mkdir -p "$work/text"
for f in /usr/share/common-licenses/*; do [ -f "$f" ] && cp "$f" "$work/text/$(basename "$f").txt"; done
for f in docs/*.md; do cp "$f" "$work/text/$(basename "$f" .md).txt"; done
[ -z "${DEMO_CORPUS:-}" ] || cp -r "$DEMO_CORPUS" "$work/text/extra"
"$bin" data --tokenizer "$model" --out "$work/corpus.shard" "$work/text"
# A recipe per stage (the published keys; docs/TRAINING.md), sized for minutes.
recipe() { # name ild mla_layers lr [extra lines]
    cat > "$work/$1.yaml" <<EOF
model_name_or_path: $model
teacher_model_name_or_path: $model
linear_type: $lin_recipe
mla_layers: $3
ILD: $2
max_seq_length: $seq
per_device_train_batch_size: $batch
gradient_accumulation_steps: 1
learning_rate: $4
warmup_ratio: 0.1
max_steps: $steps
dataset_mixer:
  $work/corpus.shard: 1.0
output_dir: $work/$1
save_steps: -1
logging_steps: 4
device: $device
seed: 42
${5:-}
EOF
}
all=$(seq -s, 0 29)
recipe ild-mla true "[$all]" 1.0e-3
recipe "ild-$linear" true "[]" 1.0e-3
recipe kd false "[0,3,6,9,12,15,18,21,24,27]" 2.0e-4 "mla_ILD_path: $work/ild-mla/final
linear_ILD_path: $work/ild-$linear/final"
echo
echo "== hylo train: stage 1, pure-MLA student"
"$bin" train "$work/ild-mla.yaml"
echo
echo "== hylo train: stage 1, pure-$lin_name student"
"$bin" train "$work/ild-$linear.yaml"
echo
echo "== hylo train: stage 2, KD of the hybrid assembled from both (MLA at every third layer)"
"$bin" train "$work/kd.yaml"
echo
echo "== hylo compare teacher vs distilled hybrid (untrained: $(awk '/all positions/ {print $3}' "$work/compare_untrained.txt") nats)"
"$bin" compare "$model" "$work/kd/final" --device "$device" --text "$text" --windows "${DEMO_WINDOWS:-4}" --tokens "${DEMO_TOKENS:-48}"
echo
echo "== hylo generate with the distilled hybrid (plain text, what this corpus trains)"
"$bin" generate "$work/kd/final" --device "$device" --prompt "The capital of France is" -n 24
echo
echo "== hylo chat with the distilled hybrid (one turn; the corpus has no conversations)"
"$bin" chat "$work/kd/final" --device "$device" --prompt "What is the capital of France?" -n 32
echo
if [ -n "${DEMO_OUT:-}" ]; then
    echo "(models, recipes, metrics.jsonl and loss.svg of each stage: $work)"
else
    echo "(the models and checkpoints were in $work, removed now: set DEMO_OUT=DIR to keep them)"
fi
