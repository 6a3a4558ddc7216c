#!/usr/bin/env bash
# Issue 8's "--resume gives bitwise-identical losses, once on the GPU too":
# the same short KD run (deterministic: true) twice, the second killed with
# SIGKILL once its first checkpoint is written and resumed; every metrics line
# after that checkpoint must be identical to the uninterrupted run's (losses,
# learning rate, gradient norm; the timing fields differ and are cut).
#
#   scripts/gpu/resume_check.sh HYLO TEACHER STUDENT_INIT DATA OUT [device]
#   (T=2048 B=4 by default: rows of T tokens, B a step; smaller for a CPU try)
#
# STUDENT_INIT: a hybrid folder (e.g. hylo convert's output); DATA: a shard or
# folder of shards; OUT: a fresh folder for the two runs and resume.log.
set -u
H=$1 M=$2 S=$3 D=$4 O=$5 DEV=${6:-cuda} T=${T:-2048} B=${B:-4}
mkdir -p "$O"
recipe() { # name
    printf '%s\n' "model_name_or_path: $S" "teacher_model_name_or_path: $M" "ILD: false" \
        "max_seq_length: $T" "per_device_train_batch_size: $B" "gradient_accumulation_steps: 1" \
        "learning_rate: 1.0e-4" "warmup_ratio: 0.1" "max_steps: 20" "kl_weight: 1.0" "ce_weight: 0.5" \
        "dataset_mixer:" "  $D: 1.0" "output_dir: $O/$1" "save_steps: 10" "save_total_limit: 2" \
        "logging_steps: 1" "device: $DEV" "seed: 7" "deterministic: true" > "$O/$1.yaml"
}
recipe whole
recipe killed
"$H" train "$O/whole.yaml" > "$O/whole.log" 2>&1 || { echo "FAIL: the uninterrupted run failed"; exit 1; }
"$H" train "$O/killed.yaml" > "$O/killed.log" 2>&1 &
pid=$!
for _ in $(seq 1 3000); do
    [ -d "$O/killed/checkpoint-10" ] && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
done
kill -9 $pid 2>/dev/null && echo "killed at $(ls -d $O/killed/checkpoint-* 2>/dev/null | tr '\n' ' ')"
wait $pid 2>/dev/null
[ -d "$O/killed/checkpoint-20" ] && { echo "FAIL: the run ended before it was killed"; exit 1; }
"$H" train "$O/killed.yaml" --resume > "$O/resumed.log" 2>&1 || { echo "FAIL: --resume failed"; exit 1; }
# step, loss terms, lr and grad norm of every step after 10
cut_fields() { sed -n 's/^\({"step": \([0-9]*\),.*"grad_norm": [^,]*\).*/\2 \1/p' "$1" | awk '$1 > 10' | cut -d' ' -f2-; }
cut_fields "$O/whole/metrics.jsonl" > "$O/whole.steps"
cut_fields "$O/killed/metrics.jsonl" > "$O/resumed.steps"
n=$(wc -l < "$O/whole.steps")
if [ "$n" -eq 10 ] && cmp -s "$O/whole.steps" "$O/resumed.steps"; then
    echo "PASS: steps 11-20 identical after kill -9 and --resume ($n lines)"
else
    echo "FAIL: steps after the checkpoint differ ($n lines in the uninterrupted run)"
    diff "$O/whole.steps" "$O/resumed.steps" | head -20
    exit 1
fi
