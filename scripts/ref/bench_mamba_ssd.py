#!/usr/bin/env python3
"""Reference timings of the Mamba-2 chunked SSD written in plain PyTorch (einsum
products, bf16 operands), on the same shapes and in the same table format as
bench/bench_ssd.c, so that the ratio hylo / PyTorch can go into
docs/PERFORMANCE.md. mamba_ssm is not installed on the GPU machine; this is the
"minimal" chunked algorithm of the Mamba-2 paper, written from
shared/spec/linear_blocks.md §3.5 (S1-S5) with autograd for the backward.

    python3 scripts/ref/bench_mamba_ssd.py [--quick] [--compile]

Shapes (B = 1, chunk L = 256, T = 8192 and 65536; --quick: 8192 only):
  1B 64/64   H = 32, P = N = 64,  Hx = GB = 8, GC = 32
  3B 128/128 H = 24, P = N = 128, Hx = GB = 8, GC = 24
Layout as hylo: x [B,T,Hx,P], Bm [B,T,GB,N], Cm [B,T,GC,N] column slices of
one bf16 buffer, dt [B,T,H] fp32 (softplus of N(-3, 1)), A_log = ln U(1, 16)
fp32, D = 1. x and B are repeated to the H heads first (repeat_interleave, as
MambaInLlama does before its scan); that repeat is inside the timed region.

Algorithm, per (b, h), chunk-local cumsum cs of dA = dt A (fp32):
  intra  y_l += sum_{s<=l} (C_l.B_s) exp(cs_l - cs_s) dt_s x_s   (L x L mask, fp32 decays,
         weights rounded to bf16 before the product with x, as the CUDA kernels do)
  states S_c = sum_s exp(cs_last - cs_s) dt_s x_s B_s^T           (fp32)
  pass   prev_c = sum_{c' < c} exp(cs_last(c'+1..c-1) ...) S_c'  (one [nc, nc] decay
         matrix per head: the quadratic form of the paper's ssd_minimal, no Python loop)
  inter  y_l += exp(cs_l) C_l prev_c^T (prev rounded to bf16), + D x_l
Forward = one call with inputs that require grad; fwd+bwd = that call plus
y.backward(dy). CUDA events, 2 warm-up runs, median of 20 (T = 8192) or 10
(T = 65536). FLOPs as bench_ssd.c (per token and head): fwd L(N+P) + 4PN,
bwd L(3N+2P) + 10PN; the reference does more (full L x L products, masked
afterwards) but is credited with the same count.

A small self-check against the token-by-token recurrence (fp64) runs first.
--compile wraps the function in torch.compile (timed after its warm-up).
"""
import argparse
import math

import torch
import torch.nn.functional as F

from cuda_timing import timed  # scripts/ref/, the script's own folder

SHAPES = [  # name, H, P, N, Hx, GB, GC
    ("1B 64/64", 32, 64, 64, 8, 8, 32),
    ("3B 128/128", 24, 128, 128, 8, 8, 24),
]
CHUNK = 256


def ssd_chunked(x, Bm, Cm, dt, A_log, D, H, L):
    """x [b,T,Hx,P], Bm [b,T,GB,N], Cm [b,T,GC,N] (bf16), dt [b,T,H] fp32,
    A_log, D [H] fp32 -> y [b,T,H,P] bf16. T must be a multiple of L."""
    b, T, Hx, P = x.shape
    GB, N, GC = Bm.shape[2], Bm.shape[3], Cm.shape[2]
    nc = T // L
    cdt = x.dtype
    xh = x.repeat_interleave(H // Hx, dim=2)  # [b,T,H,P]
    Bh = Bm.repeat_interleave(H // GB, dim=2)  # [b,T,H,N]
    Ch = Cm.repeat_interleave(H // GC, dim=2)
    A = -torch.exp(A_log.float())  # fp32
    xc = xh.reshape(b, nc, L, H, P)
    Bc = Bh.reshape(b, nc, L, H, N)
    Cc = Ch.reshape(b, nc, L, H, N)
    dtc = dt.float().reshape(b, nc, L, H).permute(0, 3, 1, 2)  # [b,h,c,l]
    cs = torch.cumsum(dtc * A[None, :, None, None], dim=-1)  # [b,h,c,l], chunk-local

    # intra-chunk: W[l,s] = (C_l . B_s) exp(cs_l - cs_s) dt_s, s <= l
    CB = torch.einsum("bclhn,bcshn->bhcls", Cc, Bc)  # bf16 operands, fp32 accumulation
    seg = cs[..., :, None] - cs[..., None, :]  # [b,h,c,l,s]
    causal = torch.ones(L, L, dtype=torch.bool, device=x.device).tril()
    decay = torch.exp(seg.masked_fill(~causal, -math.inf))
    W = (CB.float() * decay * dtc[..., None, :]).to(cdt)
    y = torch.einsum("bhcls,bcshp->bclhp", W, xc).float()

    # chunk states (fp32)
    wst = torch.exp(cs[..., -1:] - cs) * dtc  # [b,h,c,l]
    Bw = (Bc.float() * wst.permute(0, 2, 3, 1)[..., None]).to(cdt)
    states = torch.einsum("bclhp,bclhn->bchpn", xc, Bw).float()  # [b,c,h,P,N]

    # state passing: prev_z = sum_{c<z} exp(Lc_{z-1} - Lc_c) S_c, Lc = cumsum of chunk totals
    tot = cs[..., -1]  # [b,h,c]
    Lc = torch.cumsum(tot, dim=-1)
    Lprev = F.pad(Lc, (1, 0))[..., :-1]  # Lc_{z-1}, 0 for z = 0
    segc = Lprev[..., :, None] - Lc[..., None, :]  # [b,h,z,c]
    strict = torch.ones(nc, nc, dtype=torch.bool, device=x.device).tril(-1)
    Dc = torch.exp(segc.masked_fill(~strict, -math.inf))
    prev = torch.einsum("bhzc,bchpn->bzhpn", Dc, states)  # fp32

    # inter-chunk: exp(cs_l) C_l prev^T
    Ce = (Cc.float() * torch.exp(cs).permute(0, 2, 3, 1)[..., None]).to(cdt)
    y = y + torch.einsum("bclhn,bchpn->bclhp", Ce, prev.to(cdt)).float()
    y = y.reshape(b, T, H, P) + D.float()[None, None, :, None] * xh.float()
    return y.to(cdt)


def recurrence(x, Bm, Cm, dt, A_log, D, H):
    """Token-by-token reference in fp64 (small sizes only)."""
    b, T, Hx, P = x.shape
    GB, N, GC = Bm.shape[2], Bm.shape[3], Cm.shape[2]
    x, Bm, Cm, dt = x.double(), Bm.double(), Cm.double(), dt.double()
    A = -torch.exp(A_log.double())
    y = torch.zeros(b, T, H, P, dtype=torch.float64, device=x.device)
    for h in range(H):
        S = torch.zeros(b, P, N, dtype=torch.float64, device=x.device)
        for t in range(T):
            xt, bt, ct = x[:, t, h // (H // Hx)], Bm[:, t, h // (H // GB)], Cm[:, t, h // (H // GC)]
            S = torch.exp(dt[:, t, h] * A[h])[:, None, None] * S + dt[:, t, h][:, None, None] * xt[:, :, None] * bt[:, None, :]
            y[:, t, h] = torch.einsum("bpn,bn->bp", S, ct) + D[h] * xt
    return y


def make_inputs(T, H, P, N, Hx, GB, GC, dev, seed=0):
    g = torch.Generator(device=dev).manual_seed(seed)
    ld = Hx * P + GB * N + GC * N
    xbc = (0.7 * torch.randn(1, T, ld, device=dev, generator=g)).to(torch.bfloat16)
    x = xbc[..., : Hx * P].unflatten(-1, (Hx, P))
    Bm = xbc[..., Hx * P : Hx * P + GB * N].unflatten(-1, (GB, N))
    Cm = xbc[..., Hx * P + GB * N :].unflatten(-1, (GC, N))
    dt = F.softplus(torch.randn(1, T, H, device=dev, generator=g) - 3.0)
    A_log = torch.log(1.0 + 15.0 * (torch.arange(H, device=dev, dtype=torch.float32) + 0.5) / H)
    D = torch.ones(H, device=dev)
    return xbc, x, Bm, Cm, dt, A_log, D


def flops(B, T, H, P, N, L):
    f = B * T * H * (L * (N + P) + 4.0 * P * N)
    b = B * T * H * (L * (3.0 * N + 2.0 * P) + 10.0 * P * N)
    return f, f + b


def self_check(fn, dev):
    # T = 96 in chunks of 32, GQA 4 heads over 2 x heads / B groups, P != N
    T, H, P, N, Hx, GB, GC, L = 96, 4, 16, 32, 2, 2, 4, 32
    _, x, Bm, Cm, dt, A_log, D = make_inputs(T, H, P, N, Hx, GB, GC, dev, seed=1)
    y = fn(x, Bm, Cm, dt, A_log, D, H, L).double()
    ref = recurrence(x, Bm, Cm, dt, A_log, D, H)
    err = ((y - ref).norm() / ref.norm()).item()
    print("self-check vs the fp64 recurrence (T 96, L 32, bf16): rel L2 %.2e %s" % (err, "ok" if err < 2e-2 else "FAIL"))
    if not err < 2e-2:
        raise SystemExit("the reference SSD does not match the recurrence")


def bench_shape(fn, name, H, P, N, Hx, GB, GC, T):
    dev = torch.device("cuda")
    xbc, x, Bm, Cm, dt, A_log, D = make_inputs(T, H, P, N, Hx, GB, GC, dev)
    leaves = [xbc, dt, A_log, D]
    for t in leaves:
        t.requires_grad_(True)
    dy = torch.randn(1, T, H, P, device=dev, dtype=torch.bfloat16)
    reps = 20 if T <= 8192 else 10

    def views():
        o1, o2 = Hx * P, Hx * P + GB * N
        return (xbc[..., :o1].unflatten(-1, (Hx, P)), xbc[..., o1:o2].unflatten(-1, (GB, N)),
                xbc[..., o2:].unflatten(-1, (GC, N)))

    def clear():
        for t in leaves:
            t.grad = None

    def fwd():
        xv, bv, cv = views()
        return fn(xv, bv, cv, dt, A_log, D, H, CHUNK)

    def fwd_bwd():
        fwd().backward(dy)

    t_f = timed(fwd, 2, reps)
    t_fb = timed(fwd_bwd, 2, reps, before=clear)
    ff, ffb = flops(1, T, H, P, N, CHUNK)
    line = "| %-10s | %d | %6d | %2d | %3d | %3d | %d/%d/%2d | %9.3f | %7.1f | %10.3f | %7.1f |" % (
        name, 1, T, H, P, N, Hx, GB, GC, t_f, ff / (t_f * 1e-3) / 1e12, t_fb, ffb / (t_fb * 1e-3) / 1e12)
    print(line, flush=True)
    del xbc, dt, A_log, D, dy, leaves
    torch.cuda.empty_cache()
    return line


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="T = 8192 only")
    ap.add_argument("--compile", action="store_true", help="torch.compile the SSD function")
    args = ap.parse_args()
    print("bench_mamba_ssd: torch %s, %s" % (torch.__version__, torch.cuda.get_device_name()))
    fn = ssd_chunked
    if args.compile:
        fn = torch.compile(ssd_chunked, dynamic=False)
    self_check(ssd_chunked, torch.device("cuda"))
    hdr = ("| shape      | B |      T |  H |   P |   N | Hx/GB/GC |    fwd ms | fwd TF/s | fwd+bwd ms | "
           "f+b TF/s |")
    print(hdr)
    rows = []
    for T in (8192,) if args.quick else (8192, 65536):
        for (name, H, P, N, Hx, GB, GC) in SHAPES:
            try:
                rows.append(bench_shape(fn, name, H, P, N, Hx, GB, GC, T))
            except torch.OutOfMemoryError:
                line = "| %-10s | 1 | %6d | out of memory |" % (name, T)
                print(line, flush=True)
                rows.append(line)
                torch.cuda.empty_cache()
    print("\n==== summary (PyTorch einsum SSD%s, chunk %d) ====" % (", torch.compile" if args.compile else "", CHUNK))
    print("cost model per token and head: fwd L(N+P) + 4PN, bwd L(3N+2P) + 10PN FLOPs")
    print(hdr)
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
