#!/usr/bin/env bash
# On the GPU machine: the training pipeline on CUDA (README command 1 with
# DEVICE=cuda, larger rows and more steps), then an exact-resume check on the
# GPU (KD killed with SIGKILL after a checkpoint, resumed, logged losses
# compared with an uninterrupted run). Logs, metrics and plots go to $OUT.
# STEPS, SEQ, BATCH size the pipeline's stages (defaults 300, 1024, 8).
# Training text: the licences and docs/ as on the CPU, plus the English .txt /
# .md / .rst files the machine has under /usr/share/doc and the Python
# packages' folders (their composition is written to $OUT/corpus.txt).
# .carry/essays/ (ignored by git), when carried, is the text compare reads.
source scripts/gpu/env.sh
set -u
mkdir -p /tmp/hc && ln -sf /tmp/smol.gguf /tmp/hc/SmolLM2-135M-Instruct.Q4_1.gguf
export HYLO_CACHE=/tmp/hc
corpus=/tmp/gpu_corpus
rm -rf "$corpus" && mkdir -p "$corpus"
i=0
while IFS= read -r f; do
    i=$((i + 1))
    cp "$f" "$corpus/$i.txt"
done < <(find /usr/share/doc /usr/lib/python3* /usr/local/lib/python3* -type f \
              \( -name '*.txt' -o -name '*.md' -o -name '*.rst' \) -size +2k -size -2M 2>/dev/null | sort | head -n 20000)
{ echo "files: $i"; du -sh "$corpus"; } | tee "$OUT/corpus.txt"
text=README.md
[ -d .carry/essays ] && text=.carry/essays
DEVICE=cuda DEMO_STEPS="${STEPS:-300}" DEMO_SEQ="${SEQ:-1024}" DEMO_BATCH="${BATCH:-8}" DEMO_OUT=/tmp/demo \
    DEMO_TEXT="$text" DEMO_CORPUS="$corpus" DEMO_WINDOWS=32 DEMO_TOKENS=512 BIN=build/hylo bash scripts/demo.sh > "$OUT/demo_cuda.txt" 2>&1
echo "pipeline rc=$?"
for s in ild-mla ild-gdn kd; do
    cp /tmp/demo/$s/metrics.jsonl "$OUT/$s.metrics.jsonl" 2>/dev/null
    cp /tmp/demo/$s/loss.svg "$OUT/$s.loss.svg" 2>/dev/null
done
grep -E 'KL|all positions|first generated|^step|stage|memory|capital|Paris' "$OUT/demo_cuda.txt" | tail -40

# exact resume on the GPU
r=/tmp/resume && rm -rf $r && mkdir -p $r
for x in a b; do
    cat > $r/$x.yaml <<YAML
model_name_or_path: /tmp/demo/kd/init
teacher_model_name_or_path: /tmp/smol.gguf
ILD: false
max_seq_length: 512
per_device_train_batch_size: 4
gradient_accumulation_steps: 2
learning_rate: 2.0e-4
warmup_steps: 2
max_steps: 8
ce_weight: 0.5
dataset_mixer:
  /tmp/demo/corpus.shard: 1.0
output_dir: $r/out_$x
save_steps: 1
save_total_limit: 2
logging_steps: 1
device: cuda
seed: 3
YAML
done
build/hylo train $r/a.yaml > "$OUT/resume_a.txt" 2>&1; echo "uninterrupted rc=$?"
build/hylo train $r/b.yaml > "$OUT/resume_b1.txt" 2>&1 &
pid=$!
while [ ! -f $r/out_b/checkpoint-4/trainer_state.json ] && kill -0 $pid 2>/dev/null; do sleep 0.05; done
kill -9 $pid 2>/dev/null; wait $pid; echo "killed: rc=$? (137 = SIGKILL)"
ls $r/out_b
build/hylo train $r/b.yaml --resume > "$OUT/resume_b2.txt" 2>&1; echo "resumed rc=$?"
strip() { sed 's/, "tokens_per_s".*//' "$1"; }
if diff <(strip $r/out_a/metrics.jsonl) <(strip $r/out_b/metrics.jsonl) > "$OUT/resume_diff.txt"; then
    echo "resume: all $(wc -l < $r/out_a/metrics.jsonl) logged steps identical"
else
    echo "resume: DIFFERENT (see resume_diff.txt)"
fi
cp $r/out_a/metrics.jsonl "$OUT/resume_a.metrics.jsonl"; cp $r/out_b/metrics.jsonl "$OUT/resume_b.metrics.jsonl"
