#!/usr/bin/env python3
"""Independent check of hylo eval's multiple-choice scorer (issue 9, item 7):
rebuilds lm-evaluation-harness's prompts for arc_easy / piqa (and ARC-C,
OpenBookQA) from the JSONL files, scores every choice with an independent
model implementation in float32 (no BOS: lm-eval <= 0.4.9.1 and SmolLM2's own
default agree), takes acc / acc_norm decisions as lm-eval does, and compares
prompts, log-likelihoods and decisions item by item with the samples file
`hylo eval` wrote (DIR/samples/<task>.jsonl; items beyond it are not scored).

Backends: torch = Hugging Face transformers' LlamaForCausalLM (on the GPU
machine); numpy = a plain float32 NumPy forward of a Llama checkpoint
(RMSNorm, rotate-half RoPE, grouped-query causal attention, SwiGLU MLP, tied
head) for machines without torch. Tokenisation by Hugging Face `tokenizers`
from the checkpoint's tokenizer.json (or transformers' AutoTokenizer).

usage: mc_agree.py HF_MODEL_DIR DATA_DIR HYLO_SAMPLES_DIR TASK... [--backend torch|numpy] [--device cuda|cpu]
       [--dtype float32|bfloat16] (torch: the weights' and activations' type; default float32)
A reference tool only (numpy, tokenizers, safetensors; or torch, transformers).
"""
import json
import sys

import numpy as np


class NumpyLlama:
    """Float32 forward of a Hugging Face Llama folder (config.json + model.safetensors)."""

    def __init__(self, d):
        from safetensors.numpy import load_file
        c = json.load(open(f"{d}/config.json"))
        self.W = load_file(f"{d}/model.safetensors")
        self.L, self.H, self.Hkv = c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"]
        self.dh = c.get("head_dim") or c["hidden_size"] // self.H
        self.eps, self.theta = c["rms_norm_eps"], c.get("rope_theta", 10000.0)
        self.max_len = c["max_position_embeddings"]
        assert not c.get("rope_scaling"), "rope scaling not implemented here"
        self.head = self.W.get("lm_head.weight", self.W["model.embed_tokens.weight"])

    def norm(self, x, w):
        return x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + self.eps).astype(np.float32) * w

    def logits(self, ids):
        W, T, dh = self.W, len(ids), self.dh
        x = W["model.embed_tokens.weight"][ids]
        inv = 1.0 / self.theta ** (np.arange(0, dh, 2, dtype=np.float64) / dh)
        ang = np.arange(T)[:, None] * inv[None, :]
        cos = np.cos(np.concatenate([ang, ang], -1)).astype(np.float32)
        sin = np.sin(np.concatenate([ang, ang], -1)).astype(np.float32)

        def rope(q):  # [h, T, dh]
            rot = np.concatenate([-q[..., dh // 2:], q[..., :dh // 2]], -1)
            return q * cos + rot * sin

        mask = np.triu(np.full((T, T), -np.inf, dtype=np.float32), 1)
        for l in range(self.L):
            p = f"model.layers.{l}."
            h = self.norm(x, W[p + "input_layernorm.weight"])
            q = (h @ W[p + "self_attn.q_proj.weight"].T).reshape(T, self.H, dh).transpose(1, 0, 2)
            k = (h @ W[p + "self_attn.k_proj.weight"].T).reshape(T, self.Hkv, dh).transpose(1, 0, 2)
            v = (h @ W[p + "self_attn.v_proj.weight"].T).reshape(T, self.Hkv, dh).transpose(1, 0, 2)
            q, k = rope(q), rope(k)
            rep = self.H // self.Hkv
            k, v = np.repeat(k, rep, 0), np.repeat(v, rep, 0)
            s = q @ k.transpose(0, 2, 1) / np.sqrt(dh) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            a = (s / s.sum(-1, keepdims=True)) @ v
            x = x + a.transpose(1, 0, 2).reshape(T, -1) @ W[p + "self_attn.o_proj.weight"].T
            h = self.norm(x, W[p + "post_attention_layernorm.weight"])
            g, u = h @ W[p + "mlp.gate_proj.weight"].T, h @ W[p + "mlp.up_proj.weight"].T
            x = x + (g / (1 + np.exp(-g)) * u) @ W[p + "mlp.down_proj.weight"].T
        return self.norm(x, W["model.norm.weight"]) @ self.head.T


def docs(task, data):
    """(contexts, continuations, choice lengths, gold) per item, as lm-eval builds them."""
    f = {"arc_easy": "arc_easy", "arc_challenge": "arc_challenge", "piqa": "piqa", "openbookqa": "openbook_qa",
         "copa": "copa", "siqa": "siqa", "boolq": "boolq", "winogrande": "winogrande"}[task]
    for line in open(f"{data}/eval/{f}.jsonl", encoding="utf-8"):
        d = json.loads(line)
        if task == "winogrande":  # partial scoring: one context per option, one continuation
            cont = " " + d["continuation"].strip()
            yield d["context_options"], [cont, cont], [len(o) for o in d["context_options"]], d["gold"]
            continue
        q, ch = d["query"], d["choices"]
        if task.startswith("arc"):
            ctx = q + "\nAnswer:"  # "Question: {question}\nAnswer:"
        elif task == "piqa":
            ctx = q + "Answer:"  # the file's query is "Question: {goal}\n"
        elif task == "copa":  # premise[:-1] + " because" / " therefore"; choices first letter lowered
            head, conn = q.rsplit(", ", 1)
            ctx = head + " " + conn
            ch = [c[0].lower() + c[1:] for c in ch]
        elif task == "siqa":  # "Q: {context} {question}\nA:", the answers (2 in this copy)
            lines = q.split("\n")
            ctx = "Q: " + lines[0][len("Context: "):] + " " + lines[1][len("Question: "):] + "\nA:"
            ch = [l[3:] for l in lines[3:-1]]
        elif task == "boolq":  # "{passage}\nQuestion: {question}?\nAnswer:"
            ctx = q[len("Passage: "):] + "\nAnswer:"
        else:
            ctx = q
        yield [ctx] * len(ch), [" " + c for c in ch], [len(c) for c in ch], d["gold"]


def option(name, default):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def main():
    device, backend = option("--device", "cpu"), option("--backend", "torch")
    skip = {option("--device", None), option("--backend", None), option("--dtype", None)}
    args = [a for a in sys.argv[1:] if not a.startswith("--") and a not in skip]
    model_dir, data, samples, tasks = args[0], args[1], args[2], args[3:]
    if backend == "torch":
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        tok = AutoTokenizer.from_pretrained(model_dir)
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[option("--dtype", "float32")]
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
        max_len = model.config.max_position_embeddings
        enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]

    else:
        from tokenizers import Tokenizer
        tk = Tokenizer.from_file(f"{model_dir}/tokenizer.json")
        model = NumpyLlama(model_dir)
        max_len = model.max_len
        enc = lambda s: tk.encode(s, add_special_tokens=False).ids
        row_logits = lambda inp, n: model.logits(np.array(inp))[-n:].astype(np.float64)

    def request(ctx, cont):
        # lm-eval _encode_pair: trailing whitespace moves to the continuation
        n = len(ctx) - len(ctx.rstrip())
        if n:
            cont, ctx = ctx[-n:] + cont, ctx[:-n]
        whole, c = enc(ctx + cont), enc(ctx)
        cont_ids = whole[len(c):]
        return (c + cont_ids)[-(max_len + 1):][:-1], cont_ids

    def logliks(reqs):
        """Sum of the continuation's log-probabilities for each (input, continuation ids)."""
        if backend != "torch":
            out = []
            for inp, cont_ids in reqs:
                lg = row_logits(inp, len(cont_ids))
                m = lg.max(-1, keepdims=True)
                lp = lg - m - np.log(np.exp(lg - m).sum(-1, keepdims=True))
                out.append(float(lp[np.arange(len(cont_ids)), cont_ids].sum()))
            return out
        # transformers: batches of similar lengths, right-padded under an
        # attention mask (a causal row never sees the padding after it); only
        # the continuation's rows go through a float64 log-softmax
        out = [0.0] * len(reqs)
        order = sorted(range(len(reqs)), key=lambda i: len(reqs[i][0]))
        for b0 in range(0, len(order), 64):
            idx = order[b0:b0 + 64]
            L = max(len(reqs[i][0]) for i in idx)
            ids = torch.zeros((len(idx), L), dtype=torch.long)
            mask = torch.zeros((len(idx), L), dtype=torch.long)
            for j, i in enumerate(idx):
                ids[j, :len(reqs[i][0])] = torch.tensor(reqs[i][0])
                mask[j, :len(reqs[i][0])] = 1
            with torch.no_grad():
                lg = model(ids.to(device), attention_mask=mask.to(device)).logits
                for j, i in enumerate(idx):
                    inp, cont_ids = reqs[i]
                    rows = lg[j, len(inp) - len(cont_ids):len(inp)].double().log_softmax(-1)
                    out[i] = float(rows[torch.arange(len(cont_ids)), torch.tensor(cont_ids)].sum())
        return out

    ref = "transformers" if backend == "torch" else "numpy reference"
    for task in tasks:
        hylo = [json.loads(l) for l in open(f"{samples}/{task}.jsonl", encoding="utf-8")]
        n = same_prompt = same_acc = same_norm = acc = acc_h = norm = norm_h = 0
        max_dll, max_at = 0.0, ""
        diffs = []
        items = [d for _, d in zip(range(len(hylo)), docs(task, data))]
        flat = logliks([request(x, c) for ctxs, conts, _, _ in items for x, c in zip(ctxs, conts)])
        at = 0
        for i, (ctxs, conts, lens, gold) in enumerate(items):
            h = hylo[i]
            same_prompt += h["ctx"] == ctxs and h["cont"] == conts
            lls, at = flat[at:at + len(conts)], at + len(conts)
            p = max(range(len(lls)), key=lambda k: (lls[k], -k))
            pn = max(range(len(lls)), key=lambda k: (lls[k] / lens[k], -k))
            n += 1
            same_acc += p == h["pred"]
            same_norm += pn == h["pred_norm"]
            acc += p == gold
            norm += pn == gold
            acc_h += h["pred"] == gold
            norm_h += h["pred_norm"] == gold
            both = f"ll {ref} {[round(x, 4) for x in lls]} hylo {[round(x, 4) for x in h['ll']]}"
            dll = max(abs(a - b) for a, b in zip(lls, h["ll"]))
            if dll > max_dll:
                max_dll, max_at = dll, f"doc {i}: {both}"
            if p != h["pred"] or pn != h["pred_norm"]:
                srt = sorted(lls, reverse=True)
                srtn = sorted((l / n_ for l, n_ in zip(lls, lens)), reverse=True)
                diffs.append(f"  doc {i}: {ref} pred {p} / norm {pn}, hylo {h['pred']} / {h['pred_norm']}; "
                             f"{ref} margins: ll {srt[0] - srt[1]:.4f}, ll/char {srtn[0] - srtn[1]:.5f}; {both}")
        print(f"{task}: {n} items; prompts identical {same_prompt}/{n}; acc decisions identical {same_acc}/{n}, "
              f"acc_norm decisions identical {same_norm}/{n}; max |ll difference| {max_dll:.4f} nats ({max_at})")
        print(f"  {ref} acc {100 * acc / n:.2f} acc_norm {100 * norm / n:.2f}; "
              f"hylo acc {100 * acc_h / n:.2f} acc_norm {100 * norm_h / n:.2f}")
        for d in diffs:
            print(d)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
