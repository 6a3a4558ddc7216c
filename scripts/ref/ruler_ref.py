#!/usr/bin/env python3
"""Reference RULER generator for the tasks whose data needs no sentence
splitter (niah_single_1, niah_multikey_2, niah_multikey_3, vt, cwe, fwe),
written from ../shared/spec/eval.md §1 with CPython's own `random`, numpy's
legacy RandomState and the Hugging Face `tokenizers` library, to check that
`hylo eval --generate-only` draws the same random numbers in the same order
and builds the same prompt bytes.

usage: ruler_ref.py TOKENIZER_JSON WORDS_DIR LENGTH SAMPLES OUT_DIR [TASK...]
writes OUT_DIR/ruler_<task>_<length>.jsonl with input, answer_prefix, outputs,
length, as hylo writes them. A reference tool only (needs numpy, tokenizers).
"""
import json
import math
import random
import string
import sys

import numpy as np
from tokenizers import Tokenizer

SEED = 42
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NIAH_T = ("Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. "
          "I will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic "
          "{type_needle_v} for {query} mentioned in the provided text?")
NIAH_P = " The special magic {type_needle_v} for {query} mentioned in the provided text are"
VT_T = ("Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
        "Question: Find all variables that are assigned the value {query} in the text above.")
VT_P = (" Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are "
        "assigned the value {query}, they are: ")
CWE_T = ("Below is a numbered list of words. In these words, some appear more often than others. Memorize the "
         "ones that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list?")
CWE_P = " Answer: The top 10 words that appear most often in the list are:"
FWE_T = ("Read the following coded text and track the frequency of each coded word. Find the three most "
         "frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore the "
         "dots '....'. What are the three most frequently appeared words in the above coded text?")
FWE_P = " Answer: According to the coded text above, the three most frequently appeared words are:"

TASKS = {
    "niah_single_1": dict(hay="noise", k="words", v="numbers", K=1, V=1, Q=1, new=128),
    "niah_multikey_2": dict(hay="needle", k="words", v="numbers", K=1, V=1, Q=1, new=128),
    "niah_multikey_3": dict(hay="needle", k="uuids", v="uuids", K=1, V=1, Q=1, new=128),
}


def lines(path):
    return [l.rstrip() for l in open(path, encoding="utf-8") if l.rstrip()]


def main():
    tok_path, words_dir, max_len, n_samples, out_dir = sys.argv[1:6]
    tasks = sys.argv[6:] or ["niah_single_1", "niah_multikey_2", "niah_multikey_3", "vt", "cwe", "fwe"]
    max_len, n_samples = int(max_len), int(n_samples)
    tk = Tokenizer.from_file(tok_path)
    count = lambda s: len(tk.encode(s, add_special_tokens=False).ids)
    adj, noun, verb = (lines(f"{words_dir}/{n}list.txt") for n in ("adjective", "noun", "verb"))
    WORDS = sorted(set(a + "-" + n for a in adj for n in noun))

    def rand(kind):
        if kind == "words":
            return random.choice(WORDS)
        if kind == "numbers":
            return str(random.randint(10**6, 10**7 - 1))
        import uuid
        return str(uuid.UUID(int=random.getrandbits(128), version=4))

    def search(build, inc, probe, extra, cwe=False, cap=None):
        t = count(build(probe)[0])
        per = t / probe
        upper = max(int(max_len // per) * 2, 2 * inc) if cwe else max(int(max_len / per * 3), 2 * inc)
        lo, hi, best = inc, upper, None
        while lo <= hi:
            mid = (lo + hi) // 2
            if cap is not None and mid > cap:
                hi = mid - 1
                continue
            if count(build(mid)[0]) + extra <= max_len:
                best, lo = mid, mid + 1
            else:
                hi = mid - 1
        return best if best is not None else inc

    def fit(build, n, inc, extra):
        while True:
            text, ans = build(n)
            t = count(text)
            if t + extra <= max_len:
                return text, ans, t, n
            assert n > inc
            n -= inc

    def split(text, prefix):
        i = text.rfind(prefix[:10])
        return text[:i], text[i:]

    for name in tasks:
        random.seed(SEED)
        np.random.seed(SEED)
        out = []
        if name in TASKS:
            c = TASKS[name]

            def build(n, c=c):
                keys, values, needles = [], [], []
                for _ in range(c["K"]):
                    keys.append(rand(c["k"]))
                    vs = []
                    for _ in range(c["V"]):
                        vs.append(rand(c["v"]))
                        needles.append(f"One of the special magic {c['v']} for {keys[-1]} is: {vs[-1]}.")
                    values.append(vs)
                random.Random(SEED).shuffle(needles)
                if c["hay"] == "noise":
                    sents = [NOISE] * n
                else:
                    sents = []
                    for _ in range(n):
                        k = rand(c["k"])
                        v = rand(c["v"])
                        sents.append(f"One of the special magic {c['v']} for {k} is: {v}.")
                idx = sorted(random.sample(range(n), len(needles)), reverse=True)
                for i, e in zip(idx, needles):
                    sents.insert(i, e)
                context = "\n".join(sents)
                sel = random.sample(range(c["K"]), c["Q"])
                qs = [keys[i] for i in sel]
                ans = [a for i in sel for a in values[i]]
                query = ", ".join(qs[:-1]) + ", and " + qs[-1] if len(qs) > 1 else qs[0]
                t, tv = NIAH_T + NIAH_P, c["v"]
                if c["Q"] * c["V"] == 1:
                    for a, b in (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer")):
                        t = t.replace(a, b)
                    tv = tv[:-1]
                return t.format(type_needle_v=tv, context=context, query=query), ans

            inc = 25 if max_len >= 4096 else 5
            N = search(build, inc, inc, c["new"])
            for s in range(n_samples):
                text, ans, t, used = fit(build, N, inc, c["new"])
                out.append((text, ans, t + c["new"], NIAH_P))
        elif name == "vt":
            icl_mode = [True]

            def build(n):
                is_icl = icl_mode[0]
                k, hops = (3 if is_icl else 5), 4
                names = ["".join(random.choices(string.ascii_uppercase, k=k)) for _ in range(hops + 1)]
                while len(set(names)) < hops + 1:
                    names.append("".join(random.choices(string.ascii_uppercase, k=k)))
                names = names[:hops + 1]
                val = "12345" if is_icl else str(np.random.randint(10000, 99999))
                chain = [f"VAR {names[0]} = {val}"] + [f"VAR {names[j + 1]} = VAR {names[j]} " for j in range(hops)]
                sents = [NOISE] * n
                pos = sorted(random.sample(range(len(sents)), len(chain)))
                for j, p in enumerate(pos):
                    sents.insert(p + j, chain[j])
                context = "\n".join(sents).replace(". \n", ".\n")
                return (VT_T + VT_P).format(context=context, query=val, num_v=hops + 1), names

            # the one-shot example: 500 tokens, nothing generated
            saved = max_len
            max_len = 500
            n = search(build, 5, 5, 0)
            text, ans, _, _ = fit(build, n, 5, 0)
            max_len = saved
            icl = text + " " + " ".join(ans) + "\n"
            icl_mode[0] = False
            extra = 30 + count(icl)
            inc = 10 if max_len >= 4096 else 5
            N = search(build, inc, inc, extra)
            for s in range(n_samples):
                text, ans, t, used = fit(build, N, inc, extra)
                ex = icl
                for item in ex.split()[-5:]:
                    ex = ex.replace(item, "".join(random.choices(string.ascii_uppercase, k=len(item))))
                ex = ex.replace("12345", str(np.random.randint(10000, 99999)))
                cut = text.index("Memorize and track t")
                text = text[:cut] + ex + "\n" + text[cut:]
                out.append((text, ans, count(text) + 30, VT_P))
        elif name == "cwe":
            W = sorted(set(noun + adj + verb))
            random.Random(SEED).shuffle(W)
            small = max_len < 4096

            def ex(n, cr, ur):
                L = random.sample(W, n)
                common, unc = L[:10], L[10:]
                lst = common * cr + unc * ur
                random.Random(SEED).shuffle(lst)
                return " ".join(f"{i + 1}. {w}" for i, w in enumerate(lst)), common

            def build(n):
                fc, fa = ex(20, 3, 1) if small else ex(40, 10, 3)
                mc, ma = ex(n, 6, 1) if small else ex(n, 30, 3)
                t = CWE_T + CWE_P
                text = (t.format(context=fc) + " " + " ".join(f"{i + 1}. {w}" for i, w in enumerate(fa)) + "\n"
                        + t.format(context=mc))
                return text, ma

            N = search(build, 10, 4096, 120, cwe=True, cap=len(W))
            for s in range(n_samples):
                text, ans, t, used = fit(build, N, 10, 120)
                out.append((text, ans, t + 120, CWE_P))
        elif name == "fwe":
            L = max_len - 50
            vs, inc = L // 50, L // 32
            zeta = 1.6449340668482264

            def vocab():
                v = ["".join(random.choices(string.ascii_lowercase, k=6)) for _ in range(vs)]
                while len(set(v)) < vs:
                    v.append("".join(random.choices(string.ascii_lowercase, k=6)))
                v = sorted(set(v))
                random.Random(SEED).shuffle(v)
                v[0] = "..."
                return v

            def text_of(v, n):
                k = np.arange(1, len(v) + 1)
                cnt = (n * (k ** -2.0) / zeta).astype(int)
                ws = [w for w, c in zip(v, cnt) for _ in range(c)]
                random.Random(SEED).shuffle(ws)
                return (FWE_T + FWE_P).format(context=" ".join(ws))

            n = L // 6
            for s in range(n_samples):
                v = vocab()
                m = n
                t = text_of(v, m)
                if s == 0:
                    while count(t) < L:
                        m += inc
                        t = text_of(v, m)
                    m -= inc
                    n = m
                    t = text_of(v, m)
                else:
                    while count(t) > L:
                        m -= inc
                        t = text_of(v, m)
                out.append((t, v[1:4], count(t) + 50, FWE_P))
        with open(f"{out_dir}/ruler_{name}_{max_len}.jsonl", "w") as f:
            for i, (text, ans, length, prefix) in enumerate(out):
                inp, ap = split(text, prefix)
                f.write(json.dumps({"index": i, "input": inp, "outputs": ans, "length": length,
                                    "answer_prefix": ap}) + "\n")


if __name__ == "__main__":
    main()
