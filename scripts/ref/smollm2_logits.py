#!/usr/bin/env python3
"""Reference logits and greedy tokens from Hugging Face transformers.

Loads the Hugging Face folder that `hylo export` wrote (safetensors in float32,
config.json, tokenizer.json) into transformers' LlamaForCausalLM on the CPU in
float32 (no TF32, no bf16), and for each prompt records:
  - the token ids (HF tokenizer, no special tokens added),
  - per position the 20 largest logits and their ids,
  - 32 greedy tokens (argmax, fed back, no stopping at end-of-sequence).
It writes tests/fixtures/model/smollm2_ref.json, read by
tests/model/test_smollm2_ref.c.

Usage:  python3 scripts/ref/smollm2_logits.py HF_DIR OUT.json
"""
import json
import sys

import torch
import transformers
from transformers import AutoTokenizer, LlamaForCausalLM

PROMPTS = [
    "The capital of France is",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "One of the most surprising things I've learned about startups is how much of it comes down to "
    "persistence. Numbers like 3.14159 and 2024 appear, and so do words in other scripts: 東京, café.",
]


def main():
    hf_dir, out = sys.argv[1], sys.argv[2]
    torch.set_num_threads(max(1, torch.get_num_threads()))
    tok = AutoTokenizer.from_pretrained(hf_dir)
    model = LlamaForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    model.eval()
    res = {"source": "transformers %s, torch %s, LlamaForCausalLM float32 on CPU" %
           (transformers.__version__, torch.__version__), "prompts": []}
    for text in PROMPTS:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float()
            top = logits.topk(20, dim=-1)
            seq = list(ids)
            greedy = []
            for _ in range(32):
                nxt = int(model(torch.tensor([seq])).logits[0, -1].argmax())
                greedy.append(nxt)
                seq.append(nxt)
        res["prompts"].append({
            "text": text,
            "ids": ids,
            "top_ids": top.indices.tolist(),
            "top_logits": [[round(v, 5) for v in row] for row in top.values.tolist()],
            "greedy": greedy,
            "greedy_text": tok.decode(greedy),
        })
        print(repr(text[:40]), len(ids), "tokens; greedy:", repr(tok.decode(greedy)))
    with open(out, "w") as f:
        json.dump(res, f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
