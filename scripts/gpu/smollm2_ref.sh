#!/usr/bin/env bash
# On the GPU machine, after both halves of the GGUF were carried (.carry/p1,
# .carry/p2): export the HF folder with hylo, compute
# transformers' reference logits and greedy tokens, and run hylo on CUDA.
source scripts/gpu/env.sh # reassembles and checks /tmp/smol.gguf
[ -f /tmp/smol.gguf ] || { echo "smollm2_ref.sh: no /tmp/smol.gguf (carry .carry/p1 and .carry/p2)" >&2; exit 1; }
rm -rf /tmp/smol_hf
build/hylo export /tmp/smol.gguf --out /tmp/smol_hf || exit 1
mkdir -p "$OUT/fixtures"
python3 scripts/ref/smollm2_logits.py /tmp/smol_hf "$OUT/fixtures/smollm2_ref.json" 2>&1 | tail -5
echo "== hylo chat on cuda"
build/hylo chat /tmp/smol.gguf --device cuda --prompt "What is the capital of France?" -n 64 --stats
echo "== hylo generate on cuda (greedy 32, prompt 0 of the fixture)"
build/hylo generate /tmp/smol.gguf --device cuda --prompt "The capital of France is" -n 32 --stats
