#!/usr/bin/env python3
"""Independent check of hylo eval's multiple-choice scorer (issue 9, item 7):
rebuilds lm-evaluation-harness's prompts for arc_easy / piqa (and the other
multiple-choice sets) from the JSONL files, scores every choice with Hugging
Face transformers (float32, no BOS: lm-eval <= 0.4.9.1 and SmolLM2's own
default agree), takes acc / acc_norm decisions as lm-eval does, and compares
prompts, log-likelihoods and decisions item by item with the samples file
`hylo eval` wrote (DIR/samples/<task>.jsonl).

usage: mc_agree.py HF_MODEL_DIR DATA_DIR HYLO_SAMPLES_DIR TASK... [--device cuda]
A reference tool only (torch, transformers).
"""
import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def docs(task, data):
    f = {"arc_easy": "arc_easy", "arc_challenge": "arc_challenge", "piqa": "piqa", "openbookqa": "openbook_qa"}[task]
    for line in open(f"{data}/eval/{f}.jsonl", encoding="utf-8"):
        d = json.loads(line)
        q = d["query"]
        if task.startswith("arc"):
            ctx = q + "\nAnswer:"  # "Question: {question}\nAnswer:"
        elif task == "piqa":
            ctx = q + "Answer:"  # the file's query is "Question: {goal}\n"
        else:
            ctx = q
        yield ctx, [" " + c for c in d["choices"]], [len(c) for c in d["choices"]], d["gold"]


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    device = "cuda" if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1] == "cuda" else "cpu"
    if device == "cuda":
        args = [a for a in args if a != "cuda"]
    model_dir, data, samples, tasks = args[0], args[1], args[2], args[3:]
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).to(device).eval()
    max_len = model.config.max_position_embeddings

    def enc(s):
        return tok(s, add_special_tokens=False)["input_ids"]

    @torch.no_grad()
    def loglik(ctx, cont):
        # lm-eval _encode_pair: trailing whitespace moves to the continuation
        n = len(ctx) - len(ctx.rstrip())
        if n:
            cont, ctx = ctx[-n:] + cont, ctx[:-n]
        whole, c = enc(ctx + cont), enc(ctx)
        cont_ids = whole[len(c):]
        inp = (c + cont_ids)[-(max_len + 1):][:-1]
        logits = model(torch.tensor([inp], device=device)).logits[0].float()
        lp = torch.log_softmax(logits.double(), dim=-1)[-len(cont_ids):]
        tgt = torch.tensor(cont_ids, device=device)
        return lp.gather(1, tgt[:, None]).sum().item(), (lp.argmax(-1) == tgt).all().item()

    for task in tasks:
        hylo = [json.loads(l) for l in open(f"{samples}/{task}.jsonl", encoding="utf-8")]
        n = same_prompt = same_acc = same_norm = acc = acc_h = norm = norm_h = 0
        max_dll = 0.0
        diffs = []
        for i, (ctx, conts, lens, gold) in enumerate(docs(task, data)):
            if i >= len(hylo):
                break
            h = hylo[i]
            same_prompt += h["ctx"][0] == ctx and h["cont"] == conts
            lls = [loglik(ctx, c)[0] for c in conts]
            p = max(range(len(lls)), key=lambda k: (lls[k], -k))
            pn = max(range(len(lls)), key=lambda k: (lls[k] / lens[k], -k))
            n += 1
            same_acc += p == h["pred"]
            same_norm += pn == h["pred_norm"]
            acc += p == gold
            norm += pn == gold
            acc_h += h["pred"] == gold
            norm_h += h["pred_norm"] == gold
            max_dll = max(max_dll, max(abs(a - b) for a, b in zip(lls, h["ll"])))
            if p != h["pred"] or pn != h["pred_norm"]:
                srt = sorted(lls, reverse=True)
                srtn = sorted((l / n_ for l, n_ in zip(lls, lens)), reverse=True)
                diffs.append(f"  doc {i}: transformers pred {p} / norm {pn}, hylo {h['pred']} / {h['pred_norm']}; "
                             f"transformers margins: ll {srt[0] - srt[1]:.4f}, ll/char {srtn[0] - srtn[1]:.5f}; "
                             f"ll transformers {[round(x, 4) for x in lls]} hylo {[round(x, 4) for x in h['ll']]}")
        print(f"{task}: {n} items; prompts identical {same_prompt}/{n}; acc decisions identical {same_acc}/{n}, "
              f"acc_norm decisions identical {same_norm}/{n}; max |ll difference| {max_dll:.4f} nats")
        print(f"  transformers acc {100 * acc / n:.2f} acc_norm {100 * norm / n:.2f}; "
              f"hylo acc {100 * acc_h / n:.2f} acc_norm {100 * norm_h / n:.2f}")
        for d in diffs:
            print(d)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
