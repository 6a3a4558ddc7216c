#!/usr/bin/env bash
# Issue 14's "the NCCL path with one rank, no slower than without it", on one
# GPU: the same short KD run (deterministic: true) twice, plainly and under
# `mpirun -np 1 hylo train --force-collectives` (NCCL set up over MPI, each
# layer's gradient reduced on the reduction stream as its backward ends, the
# weights broadcast after AdamW: over one rank they leave every buffer as it
# is). Every logged loss, learning rate and gradient norm must be identical;
# the tokens/s of both are printed (the mean over the steps after the first 5).
#
#   scripts/gpu/nccl_check.sh HYLO TEACHER STUDENT_INIT DATA OUT [device]
#   (T=2048 B=4 by default)
set -u
H=$1 M=$2 S=$3 D=$4 O=$5 DEV=${6:-cuda} T=${T:-2048} B=${B:-4}
mkdir -p "$O"
recipe() { # name
    printf '%s\n' "model_name_or_path: $S" "teacher_model_name_or_path: $M" "ILD: false" \
        "max_seq_length: $T" "per_device_train_batch_size: $B" "gradient_accumulation_steps: 2" \
        "learning_rate: 1.0e-4" "warmup_ratio: 0.1" "max_steps: 25" "kl_weight: 1.0" "ce_weight: 0.5" \
        "dataset_mixer:" "  $D: 1.0" "output_dir: $O/$1" "save_steps: 1000" "save_total_limit: 1" \
        "logging_steps: 1" "device: $DEV" "seed: 7" "deterministic: true" > "$O/$1.yaml"
}
recipe plain
recipe nccl
"$H" train "$O/plain.yaml" > "$O/plain.log" 2>&1 || { echo "FAIL: the plain run failed"; tail -5 "$O/plain.log"; exit 1; }
launch=()
command -v mpirun > /dev/null && launch=(mpirun --allow-run-as-root --bind-to none -np 1)
"${launch[@]}" "$H" train "$O/nccl.yaml" --force-collectives > "$O/nccl.log" 2>&1 ||
    { echo "FAIL: the --force-collectives run failed"; tail -5 "$O/nccl.log"; exit 1; }
# step, loss terms, lr and grad norm of every step
cut_fields() { sed -n 's/^\({"step": [0-9]*,.*"grad_norm": [^,]*\).*/\1/p' "$1"; }
cut_fields "$O/plain/metrics.jsonl" > "$O/plain.steps"
cut_fields "$O/nccl/metrics.jsonl" > "$O/nccl.steps"
rate() { sed -n 's/.*"tokens_per_s": *\([0-9.]*\).*/\1/p' "$1" | tail -n +6 | awk '{s += $1; n++} END {printf "%.0f", n ? s / n : 0}'; }
echo "launched as: ${launch[*]:-(no mpirun)} $H train nccl.yaml --force-collectives"
echo "tokens/s, mean of steps 6-25: plain $(rate "$O/plain/metrics.jsonl"), through the collectives $(rate "$O/nccl/metrics.jsonl")"
grep -m1 'NCCL' "$O/nccl.log" # the communicator's line (on cuda)
n=$(wc -l < "$O/plain.steps")
# the runs' checkpoints are not needed past here (two of 1.6 GB each for SmolLM2's hybrid)
rm -rf "$O"/plain/checkpoint-* "$O"/nccl/checkpoint-* "$O"/plain/final "$O"/nccl/final
if [ "$n" -gt 0 ] && cmp -s "$O/plain.steps" "$O/nccl.steps"; then
    echo "PASS: $n steps, every logged loss, lr and grad norm identical"
else
    echo "FAIL: the logs differ ($n steps in the plain run)"
    diff "$O/plain.steps" "$O/nccl.steps" | head -10
    exit 1
fi
