#!/usr/bin/env python3
"""Reference timing for `hylo data`: Hugging Face `tokenizers` batch encoding of
the same documents, for the hylo / HF ratio in docs/PERFORMANCE.md ("Data").

    python3 scripts/ref/bench_tokenizers.py --tokenizer DIR/tokenizer.json [--repeat 3] [--fast] INPUT...

INPUT: .txt files (one document each, as `hylo data` reads them), .jsonl files
of {"text": ...} lines, or folders of .txt files (sorted, recursive). The files
are read and parsed before the clock starts: the time is `encode_batch` alone
(add_special_tokens=False; hylo adds the EOS itself; --fast: encode_batch_fast,
which skips the offsets), on the threads of the tokenizers library
(RAYON_NUM_THREADS, default all cores). Prints the best wall time of --repeat
runs with the CPU time of that run (all threads: time.process_time), and the
token count, which must equal hylo's minus one EOS per document
(scripts/bench_data.sh checks it).
"""
import argparse
import json
import os
import sys
import time

from tokenizers import Tokenizer


def documents(inputs):
    for p in inputs:
        if os.path.isdir(p):
            files = []
            for root, _, names in os.walk(p):
                files += [os.path.join(root, n) for n in names if n.endswith(".txt")]
            for f in sorted(files):
                with open(f, encoding="utf-8") as fh:
                    yield fh.read()
        elif p.endswith(".jsonl"):
            with open(p, encoding="utf-8") as fh:
                for line in fh:
                    if line.strip():
                        yield json.loads(line)["text"]
        else:
            with open(p, encoding="utf-8") as fh:
                yield fh.read()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--fast", action="store_true", help="encode_batch_fast (no offsets)")
    ap.add_argument("inputs", nargs="+")
    a = ap.parse_args()
    tok = Tokenizer.from_file(a.tokenizer)
    texts = list(documents(a.inputs))
    nbytes = sum(len(t.encode("utf-8")) for t in texts)
    encode = tok.encode_batch_fast if a.fast else tok.encode_batch
    best, cpu, ntok = None, None, 0
    for _ in range(a.repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        enc = encode(texts, add_special_tokens=False)
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        ntok = sum(len(e.ids) for e in enc)
        if best is None or dt < best:
            best, cpu = dt, dc
        print(f"  run: {dt:.3f} s wall, {dc:.3f} s CPU", file=sys.stderr)
    threads = os.environ.get("RAYON_NUM_THREADS", str(os.cpu_count()))
    fn = "encode_batch_fast" if a.fast else "encode_batch"
    print(f"tokenizers {__import__('tokenizers').__version__} {fn}: {len(texts)} documents, {nbytes / 1e6:.2f} MB, "
          f"{ntok} tokens, best of {a.repeat}: {best:.3f} s = {ntok / best:.0f} tokens/s, "
          f"{nbytes / 1e6 / best:.2f} MB/s, {cpu:.2f} s CPU ({threads} threads)")


if __name__ == "__main__":
    main()
