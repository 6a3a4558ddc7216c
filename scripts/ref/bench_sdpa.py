#!/usr/bin/env python3
"""Reference timings of causal attention with torch SDPA, on the same shapes and
in the same table format as bench/bench_attn.c, so that the ratio hylo / SDPA
can go into docs/PERFORMANCE.md. Each shape is timed with the cuDNN backend
(SDPBackend.CUDNN_ATTENTION: what the fast stacks use on Hopper, issue 11's
reference) and with the flash backend, one row each.

    python3 scripts/ref/bench_sdpa.py [--quick | --mid] [--backends cudnn,flash]

Layout: q [B,T,H,dqk], k [B,T,Hkv,dqk], v [B,T,Hkv,dv] bf16 (hylo's layout),
passed to SDPA as [B,H,T,d] views (transpose, no copy). Forward = one SDPA
call with inputs that require grad (so it saves logsumexp, as hylo's forward
writes lse); fwd+bwd = that call plus out.backward(dout). CUDA events, 2
warm-up runs, median of 20 (T = 8192) or 10 (T = 65536) runs. FLOPs as in
bench_attn.c: fwd = 2 B H T^2 (dqk + dv) / 2, bwd = 2.5 x fwd, counted on the
logical shape even where SDPA does more work (padding below).

The `note` column names the backend that ran. Where the asked backend refuses
a shape the script says so there and falls back (cuDNN: the same fallbacks,
never another backend; a shape cuDNN refuses in every form gets a row that
says so):
  - GQA (Hkv < H): enable_gqa=True if flash accepts it, else k and v expanded
    to H heads before timing ("kv expanded"; the backward then returns
    per-query-head dk/dv and the final reduction over the group is not timed).
  - dqk != dv: v zero-padded to dqk ("v padded") and the output sliced back;
    if flash still refuses, the memory-efficient backend ("efficient").
"""
import argparse
import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from cuda_timing import timed  # scripts/ref/, the script's own folder

SHAPES = [  # name, B, H, Hkv, dqk, dv
    ("MLA 64/64", 1, 32, 32, 64, 64),
    ("MLA 128/128", 1, 24, 24, 128, 128),
    ("MLA 192/128", 1, 32, 32, 192, 128),
    ("GQA 64", 1, 32, 8, 64, 64),
    ("GQA 128", 1, 24, 8, 128, 128),
]


def make_call(q, k, v, H, Hkv, dqk, dv, which):
    """Returns (call(q, k, v) -> out [B,H,T,dv], note, backend) for the first
    configuration the backend `which` accepts ("cudnn": cuDNN only; "flash":
    flash, else the efficient backend)."""
    notes = []
    scale = 1.0 / math.sqrt(dqk)

    def attempt(backend, gqa_mode, pad_v):
        def call(q_, k_, v_):
            kk, vv = k_, v_
            if gqa_mode == "expand" and kk.shape[1] != H:  # the timed runs pass k, v expanded already
                kk = kk.repeat_interleave(H // Hkv, dim=1)
                vv = vv.repeat_interleave(H // Hkv, dim=1)
            if pad_v:
                vv = F.pad(vv, (0, dqk - dv))
            kw = {"enable_gqa": True} if (gqa_mode == "native" and kk.shape[1] != H) else {}
            with sdpa_kernel(backend):
                o = F.scaled_dot_product_attention(q_, kk, vv, is_causal=True, scale=scale, **kw)
            return o[..., :dv] if pad_v else o

        # probe on a small slice (same head dims and head counts)
        qs, ks, vs = (t[:, :, :256].detach().clone().requires_grad_(True) for t in (q, k, v))
        o = call(qs, ks, vs)
        o.sum().backward()
        torch.cuda.synchronize()
        return call

    if which == "cudnn":
        backends = ((SDPBackend.CUDNN_ATTENTION, "cudnn"),)
    else:
        backends = ((SDPBackend.FLASH_ATTENTION, "flash"), (SDPBackend.EFFICIENT_ATTENTION, "efficient"))
    for backend, bname in backends:
        for gqa_mode in ("native", "expand") if Hkv != H else ("native",):
            for pad_v in (False, True) if dqk != dv else (False,):
                try:
                    call = attempt(backend, gqa_mode, pad_v)
                except RuntimeError:
                    continue
                notes = [bname]
                if gqa_mode == "expand":
                    notes.append("kv expanded")
                if pad_v:
                    notes.append("v padded")
                return call, ", ".join(notes), (gqa_mode, pad_v)
    raise RuntimeError("no SDPA backend accepted the shape")


def bench_shape(name, B, T, H, Hkv, dqk, dv, which):
    dev = torch.device("cuda")
    torch.manual_seed(0)
    # hylo's [B,T,H,d] layout seen as [B,H,T,d]
    q = torch.randn(B, T, H, dqk, device=dev, dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(B, T, Hkv, dqk, device=dev, dtype=torch.bfloat16).transpose(1, 2)
    v = torch.randn(B, T, Hkv, dv, device=dev, dtype=torch.bfloat16).transpose(1, 2)
    try:
        call, note, (gqa_mode, _) = make_call(q, k, v, H, Hkv, dqk, dv, which)
    except RuntimeError:
        line = "| %-12s | %d | %6d | %2d | %2d | %3d | %3d | %9s | %7s | %10s | %7s | %s refused the shape" % (
            name, B, T, H, Hkv, dqk, dv, "-", "-", "-", "-", which)
        print(line, flush=True)
        return line
    if gqa_mode == "expand" and Hkv != H:
        # expand outside the timed region: leaves of the graph are per-query-head k, v
        k = k.repeat_interleave(H // Hkv, dim=1)
        v = v.repeat_interleave(H // Hkv, dim=1)
    q.requires_grad_(True)
    k.requires_grad_(True)
    v.requires_grad_(True)
    dout = torch.randn(B, T, H, dv, device=dev, dtype=torch.bfloat16).transpose(1, 2)
    reps = 20 if T <= 8192 else 10

    def clear():
        q.grad = k.grad = v.grad = None

    def fwd():
        return call(q, k, v)

    def fwd_bwd():
        o = fwd()
        o.backward(dout)

    t_f = timed(fwd, 2, reps)
    t_fb = timed(fwd_bwd, 2, reps, before=clear)
    flop_f = 2.0 * B * H * T * T * (dqk + dv) / 2.0
    line = "| %-12s | %d | %6d | %2d | %2d | %3d | %3d | %9.3f | %7.1f | %10.3f | %7.1f | %s" % (
        name, B, T, H, Hkv, dqk, dv, t_f, flop_f / (t_f * 1e-3) / 1e12, t_fb,
        3.5 * flop_f / (t_fb * 1e-3) / 1e12, note)
    print(line, flush=True)
    del q, k, v, dout
    torch.cuda.empty_cache()
    return line


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="T = 8192 only")
    ap.add_argument("--mid", action="store_true", help="T = 16384 and 32768 (bench_attn --mid)")
    ap.add_argument("--backends", default="cudnn,flash", help="comma-separated: cudnn, flash (default both)")
    args = ap.parse_args()
    which = [b for b in args.backends.split(",") if b]
    for b in which:
        if b not in ("cudnn", "flash"):
            raise SystemExit("bench_sdpa.py: --backends takes cudnn and flash, got '%s'" % b)
    print("bench_sdpa: torch %s, %s" % (torch.__version__, torch.cuda.get_device_name()))
    hdr = ("| shape        | B |      T |  H | Hkv | dqk |  dv |    fwd ms | fwd TF/s | fwd+bwd ms | "
           "f+b TF/s | note")
    print(hdr)
    rows = []
    Ts = (16384, 32768) if args.mid else (8192, 65536)
    for T in Ts[:1] if args.quick else Ts:
        for (name, B, H, Hkv, dqk, dv) in SHAPES:
            for b in which:
                rows.append(bench_shape(name, B, T, H, Hkv, dqk, dv, b))
    print("\n==== summary (torch SDPA) ====")
    print(hdr)
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
