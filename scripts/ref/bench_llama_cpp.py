#!/usr/bin/env python3
"""llama.cpp's CPU prefill and decode speed on a GGUF, through llama-cpp-python,
measured the way bench/bench_vs_llama.c measures hylo, which runs this script
and prints the ratio:

    python3 scripts/ref/bench_llama_cpp.py MODEL.gguf [--prompt 256] [--decode 64] [--threads 2]

Tokens: the same ids as bench_vs_llama.c, token i = (i * 7919 + 13) % V (the
prompt, then the decode tokens fed one at a time, not sampled), so both
programs do the same work. Prefill: one eval of the prompt (n_batch = the
prompt length, n_ubatch = 512 or the prompt if shorter, as hylo's chunks of
512); decode: one eval per
token after it, logits of the last token only (the same as hylo's steps). One
warm-up of 32 tokens first. Prints one line `llama.cpp prefill TOK_S decode
TOK_S rss_mb MB` for the C program to read, preceded by the library's version
and system info.

Install (it builds llama.cpp from source, ~10 minutes on 2 cores): the AVX2
build the issue measured,
    python3 -m venv .venv-llama
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF" \\
        .venv-llama/bin/pip install llama-cpp-python==0.3.36
and an AVX-512 one (bench_vs_llama --python .venv-llama-native/bin/python).
GGML_NATIVE=ON does not run on the development VM: its cpuid lists AMX, and
the native build's first tile instruction (ldtilecfg) faults, so AMX is
turned off by hand:
    python3 -m venv .venv-llama-native
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX_VNNI=ON \\
        -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF \\
        -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" \\
        .venv-llama-native/bin/pip install --no-cache-dir llama-cpp-python==0.3.36
(--no-cache-dir: pip would otherwise reuse the first build's wheel.)
"""
import argparse
import resource
import sys
import time

import llama_cpp
from llama_cpp import Llama


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    n_ctx = a.prompt + a.decode + 16
    ub = min(max(a.prompt, 32), 512)  # hylo's prefill chunk; llama.cpp's default n_ubatch
    llm = Llama(model_path=a.model, n_ctx=n_ctx, n_batch=max(a.prompt, 32), n_ubatch=ub,
                n_threads=a.threads, n_threads_batch=a.threads, logits_all=False, verbose=False)
    V = llm.n_vocab()
    ids = [(i * 7919 + 13) % V for i in range(a.prompt + a.decode)]
    print(f"llama-cpp-python {llama_cpp.__version__}; {llama_cpp.llama_print_system_info().decode().strip()}",
          file=sys.stderr)
    llm.reset()
    llm.eval(ids[:32])  # warm-up
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids[:a.prompt])
    tp = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(a.decode):
        llm.eval([ids[a.prompt + i]])
    td = time.perf_counter() - t0
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(f"llama.cpp prefill {a.prompt / tp:.2f} decode {a.decode / td:.2f} rss_mb {rss_mb:.1f}")


if __name__ == "__main__":
    main()
