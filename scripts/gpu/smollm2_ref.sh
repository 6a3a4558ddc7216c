#!/usr/bin/env bash
# On the GPU machine, after both halves of the GGUF were carried (.carry/p1,
# .carry/p2): reassemble and check it, export the HF folder with hylo, compute
# transformers' reference logits and greedy tokens, and run hylo on CUDA.
source scripts/gpu/env.sh
cat .carry/p1/gguf.part .carry/p2/gguf.part > /tmp/smol.gguf
sha=$(sed -n 's/^sha="\([0-9a-f]*\)"$/\1/p' scripts/fetch_model.sh) # the one place it is written
echo "$sha  /tmp/smol.gguf" | sha256sum -c - || exit 1
rm -rf /tmp/smol_hf
build/hylo export /tmp/smol.gguf --out /tmp/smol_hf || exit 1
mkdir -p "$OUT/fixtures"
python3 scripts/ref/smollm2_logits.py /tmp/smol_hf "$OUT/fixtures/smollm2_ref.json" 2>&1 | tail -5
echo "== hylo chat on cuda"
build/hylo chat /tmp/smol.gguf --device cuda --prompt "What is the capital of France?" -n 64 --stats
echo "== hylo generate on cuda (greedy 32, prompt 0 of the fixture)"
build/hylo generate /tmp/smol.gguf --device cuda --prompt "The capital of France is" -n 32 --stats
