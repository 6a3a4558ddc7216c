#!/usr/bin/env python3
"""Reference token ids for tests/tok/test_tok.c, from Hugging Face `tokenizers`.

Writes tests/fixtures/tok/smollm2_ids.json: the ids of every string in
tests/fixtures/tok/strings.json and, per essay, the token count and a hash of
the ids. The ids come from HF `tokenizers` (Rust), independent of src/tok.

The tokenizer can be given two ways (use both to cross-check):
  --gguf FILE            build the HF tokenizer here, in Python, from the GGUF's
                         tokenizer.ggml.* metadata (read with the `gguf` package)
                         and the pre-tokenizer of formats.md §3.4 for its
                         tokenizer.ggml.pre. Nothing of hylo is involved.
  --tokenizer-json FILE  a tokenizer.json, e.g. the one hylo writes:
                           build-tok/tests/tok/test_tok --write-hf /tmp/smol
                         (or HF's original SmolLM2 tokenizer.json).
With both, the ids must agree on every string and essay, else it exits 1.
The fixture records the ids of --gguf when given, else of --tokenizer-json.

Invalid UTF-8 (strings given as "hex") cannot be passed to `tokenizers`, which
takes str. For those, the bytes are cut into maximal valid UTF-8 runs and
maximal invalid runs: valid runs are encoded normally, each invalid run goes
through the BPE model alone (Tokenizer.model.tokenize of its byte-level
characters). That is what the pre-tokenizer regexes do in hylo, where PCRE2
treats invalid bytes as barriers that no pattern item matches.

Usage (pip install tokenizers gguf):
  python3 scripts/ref/tok_fixture.py --gguf ~/.cache/hylo/SmolLM2-135M-Instruct.Q4_1.gguf \
      --tokenizer-json /tmp/smol/tokenizer.json --essays ../shared/data/essays
"""
import argparse
import json
import os
import struct
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
import tokenizers

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
            r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def bytes_to_unicode():
    """GPT-2's byte -> printable char table (written out here, not imported)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


B2U = bytes_to_unicode()


def tokenizer_from_gguf(path):
    from gguf import GGUFReader

    r = GGUFReader(path)

    def field(name):
        return r.fields.get(name)

    def strs(name):
        f = field(name)
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    def scalar(name, default=None):
        f = field(name)
        if f is None:
            return default
        v = f.parts[f.data[0]]
        return bytes(v).decode("utf-8") if f.types[0].name == "STRING" else v.tolist()[0]

    model = scalar("tokenizer.ggml.model")
    if model != "gpt2":
        sys.exit(f"{path}: tokenizer.ggml.model = {model}, only gpt2 is handled")
    pre = scalar("tokenizer.ggml.pre", "default")
    tokens = strs("tokenizer.ggml.tokens")
    tt = field("tokenizer.ggml.token_type")
    types = [int(tt.parts[i][0]) for i in tt.data] if tt else [1] * len(tokens)
    merges = [tuple(m.split(" ", 1)) for m in strs("tokenizer.ggml.merges")]
    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False, byte_fallback=False))
    if pre in ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"):
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    elif pre in ("gpt2", "gpt-2", "default"):
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    elif pre in ("llama-bpe", "llama3", "llama-v3", "qwen2"):
        rx = QWEN2_RE if pre == "qwen2" else LLAMA3_RE
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(rx), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    else:
        sys.exit(f"{path}: tokenizer.ggml.pre = {pre} not handled here")
    tok.decoder = decoders.ByteLevel()
    def added(ty):
        return [AddedToken(tokens[i], special=(ty == 3), normalized=False, lstrip=False, rstrip=False,
                           single_word=False) for i in range(len(tokens)) if types[i] == ty]
    # The texts are already in the vocab, so they keep their ids.
    tok.add_special_tokens(added(3))  # control: split out unless encode_special_tokens
    tok.add_tokens(added(4))  # user-defined: always split out
    if scalar("tokenizer.ggml.add_bos_token", False):
        sys.exit("add_bos_token = true: add a TemplateProcessing post-processor here first")
    return tok


def utf8_runs(b):
    """Split bytes into (is_valid, bytes) maximal runs (strict UTF-8, RFC 3629)."""
    runs = []
    i = 0
    n = len(b)

    def seq_len(i):
        c = b[i]
        if c < 0x80:
            return 1
        if 0xC2 <= c <= 0xDF:
            need, lo, hi = 2, 0x80, 0xBF
        elif 0xE0 <= c <= 0xEF:
            need, lo, hi = 3, (0xA0 if c == 0xE0 else 0x80), (0x9F if c == 0xED else 0xBF)
        elif 0xF0 <= c <= 0xF4:
            need, lo, hi = 4, (0x90 if c == 0xF0 else 0x80), (0x8F if c == 0xF4 else 0xBF)
        else:
            return 0
        if i + need > n or not (lo <= b[i + 1] <= hi):
            return 0
        for k in range(2, need):
            if not (0x80 <= b[i + k] <= 0xBF):
                return 0
        return need

    while i < n:
        l = seq_len(i)
        valid = l > 0
        step = l if valid else 1
        if runs and runs[-1][0] == valid:
            runs[-1][1].extend(b[i:i + step])
        else:
            runs.append((valid, bytearray(b[i:i + step])))
        i += step
    return runs


def encode(tok, data, special):
    tok.encode_special_tokens = not special
    if isinstance(data, str):
        return tok.encode(data, add_special_tokens=True).ids
    ids = []
    for valid, run in utf8_runs(bytes(data)):
        if valid:
            ids += tok.encode(run.decode("utf-8"), add_special_tokens=False).ids
        else:
            ids += [t.id for t in tok.model.tokenize("".join(B2U[c] for c in run))]
    return ids


def fnv1a64(ids):
    h = 0xCBF29CE484222325
    for b in struct.pack(f"<{len(ids)}i", *ids):
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def compute(tok, strings, essays_dir):
    out = {"ids": {}, "essays": {}}
    for s in strings:
        data = bytes.fromhex(s["hex"]) if "hex" in s else s["text"]
        out["ids"][s["name"]] = encode(tok, data, s.get("special", False))
    if essays_dir:
        for name in sorted(os.listdir(essays_dir)):
            if not name.endswith(".txt"):
                continue
            with open(os.path.join(essays_dir, name), "rb") as f:
                raw = f.read()
            try:
                data = raw.decode("utf-8")
            except UnicodeDecodeError:
                data = raw
            ids = encode(tok, data, False)
            out["essays"][name] = {"n": len(ids), "fnv1a64": fnv1a64(ids)}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf")
    ap.add_argument("--tokenizer-json")
    ap.add_argument("--strings", default=os.path.join(ROOT, "tests/fixtures/tok/strings.json"))
    ap.add_argument("--essays", default=os.path.join(ROOT, "../shared/data/essays"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests/fixtures/tok/smollm2_ids.json"))
    a = ap.parse_args()
    if not a.gguf and not a.tokenizer_json:
        ap.error("give --gguf and/or --tokenizer-json")
    strings = json.load(open(a.strings, encoding="utf-8"))["strings"]
    essays = a.essays if a.essays and os.path.isdir(a.essays) else None

    results = {}
    if a.gguf:
        results["gguf"] = compute(tokenizer_from_gguf(a.gguf), strings, essays)
    if a.tokenizer_json:
        results["json"] = compute(Tokenizer.from_file(a.tokenizer_json), strings, essays)
    if len(results) == 2:
        bad = [k for k in results["gguf"]["ids"] if results["gguf"]["ids"][k] != results["json"]["ids"][k]]
        bad += [k for k in results["gguf"]["essays"] if results["gguf"]["essays"][k] != results["json"]["essays"][k]]
        if bad:
            for k in bad:
                print(f"MISMATCH {k}: gguf-built {results['gguf']['ids'].get(k, results['gguf']['essays'].get(k))}"
                      f" vs tokenizer.json {results['json']['ids'].get(k, results['json']['essays'].get(k))}")
            sys.exit(1)
        print(f"gguf-built and tokenizer.json tokenizers agree on {len(strings)} strings and "
              f"{len(results['gguf']['essays'])} essays")
    src = "gguf" if a.gguf else "json"
    r = results[src]
    fixture = {
        "generated_by": "scripts/ref/tok_fixture.py",
        "tokenizers_version": tokenizers.__version__,
        "source": (f"HF tokenizers built from GGUF metadata of {os.path.basename(a.gguf)}" if src == "gguf"
                   else f"HF tokenizers loaded from {a.tokenizer_json}"),
        "cross_checked_with_tokenizer_json": len(results) == 2,
        "essay_hash": "FNV-1a 64 over the ids as little-endian int32",
        "ids": r["ids"],
        "essays": r["essays"],
    }
    tmp = a.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=False, indent=None, separators=(",", ":"))
        f.write("\n")
    os.replace(tmp, a.out)
    print(f"wrote {a.out}: {len(r['ids'])} strings, {len(r['essays'])} essays")


if __name__ == "__main__":
    main()
