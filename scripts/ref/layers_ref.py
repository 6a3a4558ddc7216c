#!/usr/bin/env python3
"""Independent PyTorch transcription of the layer specs, for hylo's fixtures.

Written from ../shared/spec (hybrid_model.md §2 MLA with YaRN, linear_blocks.md
§1 Gated DeltaNet with the naive recurrence, hybrid_model.md §6 Mamba-2 with the
naive recurrence), not from hylo's C code. float64 throughout; gradients by
autograd. For each layer it draws seeded random weights and inputs and writes a
safetensors file with the weights (hylo parameter names), the input x, the
upstream gradient dout, the output `out`, and the gradients `grad.x` and
`grad.<param>`, plus the dimensions in __metadata__.

Run (GPU machine or anywhere with torch + safetensors):
    python3 scripts/ref/layers_ref.py OUTDIR
The files are committed under tests/fixtures/model/ and checked by
tests/model/test_layer_fixtures.c.
"""
import json
import math
import sys

import torch
from safetensors.torch import save_file

torch.manual_seed(0)
F64 = torch.float64


def rmsnorm(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def causal_conv_silu(x, w, bias=None):
    """x [T, C], w [C, W]: y_t = bias + sum_i w[:, i] x_{t-W+1+i} (zero padding), then SiLU."""
    T, C = x.shape
    W = w.shape[1]
    xp = torch.cat([torch.zeros(W - 1, C, dtype=x.dtype), x], 0)
    y = torch.zeros(T, C, dtype=x.dtype)
    for i in range(W):
        y = y + w[:, i] * xp[i:i + T]
    if bias is not None:
        y = y + bias
    return torch.nn.functional.silu(y)


# ---------------------------------------------------------------- MLA (hybrid_model.md §2)
def yarn_tables(p, base, F, O, T, beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=0.0):
    j = torch.arange(p // 2, dtype=torch.float32)
    freq_extra = 1.0 / (base ** (2 * j / p))
    freq_inter = 1.0 / (F * base ** (2 * j / p))

    def corr_dim(r):
        return p * math.log(O / (2 * math.pi * r)) / (2 * math.log(base))

    low = max(math.floor(corr_dim(beta_fast)), 0)
    high = min(math.ceil(corr_dim(beta_slow)), p - 1)
    if low == high:
        high += 0.001
    ramp = ((j - low) / (high - low)).clamp(0, 1)
    inv_freq = freq_inter * ramp + freq_extra * (1 - ramp)

    def get_mscale(s, m):
        return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0

    ms = get_mscale(F, mscale) / get_mscale(F, mscale_all_dim)
    ang = torch.outer(torch.arange(T, dtype=torch.float32), inv_freq)  # fp32 as the reference
    return (torch.cos(ang.double()) * ms), (torch.sin(ang.double()) * ms)


def rope_interleaved(x, cos, sin):
    """x [T, ..., p]: pairs (2j, 2j+1) rotated by angle j, output de-interleaved (spec §2.1)."""
    xe, xo = x[..., 0::2], x[..., 1::2]
    shape = [x.shape[0]] + [1] * (x.dim() - 2) + [cos.shape[1]]
    c, s = cos.view(shape), sin.view(shape)
    return torch.cat([xe * c - xo * s, xo * c + xe * s], -1)


def mla_ref():
    d, H, G, rq, rkv, n, p, v, T = 48, 4, 2, 24, 16, 8, 8, 12, 20
    base, F, O = 10.0, 4.0, 16
    qd = n + p
    W = {
        "q_a_proj": torch.randn(rq, d, dtype=F64) * 0.2,
        "q_b_proj": torch.randn(H * qd, rq, dtype=F64) * 0.2,
        "kv_a_proj_with_mqa": torch.randn(rkv + p, d, dtype=F64) * 0.2,
        "kv_b_proj": torch.randn(G * (n + v), rkv, dtype=F64) * 0.2,
        "out_proj": torch.randn(d, H * v, dtype=F64) * 0.2,
    }
    for t in W.values():
        t.requires_grad_(True)
    x = torch.randn(T, d, dtype=F64, requires_grad=True)
    cos, sin = yarn_tables(p, base, F, O, T)
    q = (x @ W["q_a_proj"].T) @ W["q_b_proj"].T
    q = q.view(T, H, qd)
    q_nope, q_pe = q[..., :n], q[..., n:]
    ckv = x @ W["kv_a_proj_with_mqa"].T
    c, k_pe = ckv[:, :rkv], ckv[:, rkv:]
    kv = (c @ W["kv_b_proj"].T).view(T, G, n + v)
    k_nope, val = kv[..., :n], kv[..., n:]
    q_pe = rope_interleaved(q_pe, cos, sin)
    k_pe = rope_interleaved(k_pe, cos, sin)  # [T, p], shared by all heads
    rep = H // G
    k_nope = k_nope.repeat_interleave(rep, dim=1)
    val = val.repeat_interleave(rep, dim=1)
    scale = qd ** -0.5
    s = (torch.einsum("thd,uhd->htu", q_nope, k_nope) + torch.einsum("thd,ud->htu", q_pe, k_pe)) * scale
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    s = s.masked_fill(mask, float("-inf"))
    o = torch.einsum("htu,uhd->thd", s.softmax(-1), val).reshape(T, H * v)
    out = o @ W["out_proj"].T
    meta = dict(kind="mla", d=d, H=H, Hkv=G, n_kv=G, r_q=rq, r_kv=rkv, d_nope=n, d_rope=p, d_v=v, T=T,
                rope_theta=base, yarn_factor=F, yarn_orig=O)
    return finish("mla", W, x, out, meta)


# ---------------------------------------------------------------- GDN (linear_blocks.md §1)
def gdn_ref():
    d, H, K, Dv, Wc, T = 32, 2, 16, 24, 4, 70
    kd, vd = H * K, H * Dv
    W = {
        "q_proj": torch.randn(kd, d, dtype=F64) * 0.2,
        "k_proj": torch.randn(kd, d, dtype=F64) * 0.2,
        "v_proj": torch.randn(vd, d, dtype=F64) * 0.2,
        "a_proj": torch.randn(H, d, dtype=F64) * 0.2,
        "b_proj": torch.randn(H, d, dtype=F64) * 0.2,
        "A_log": torch.log(torch.rand(H, dtype=F64) * 15 + 1),
        "dt_bias": torch.randn(H, dtype=F64) * 0.5 - 3,
        "q_conv1d": torch.randn(kd, 1, Wc, dtype=F64) * 0.4,
        "k_conv1d": torch.randn(kd, 1, Wc, dtype=F64) * 0.4,
        "v_conv1d": torch.randn(vd, 1, Wc, dtype=F64) * 0.4,
        "g_proj": torch.randn(vd, d, dtype=F64) * 0.2,
        "o_norm": 1 + 0.1 * torch.randn(Dv, dtype=F64),
        "o_proj": torch.randn(d, vd, dtype=F64) * 0.2,
    }
    for t in W.values():
        t.requires_grad_(True)
    x = torch.randn(T, d, dtype=F64, requires_grad=True)
    q = causal_conv_silu(x @ W["q_proj"].T, W["q_conv1d"][:, 0])
    k = causal_conv_silu(x @ W["k_proj"].T, W["k_conv1d"][:, 0])
    vv = causal_conv_silu(x @ W["v_proj"].T, W["v_conv1d"][:, 0])
    q, k, vv = q.view(T, H, K), k.view(T, H, K), vv.view(T, H, Dv)
    q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    beta = torch.sigmoid(x @ W["b_proj"].T)  # [T, H]
    g = -torch.exp(W["A_log"]) * torch.nn.functional.softplus(x @ W["a_proj"].T + W["dt_bias"])
    scale = K ** -0.5
    S = torch.zeros(H, K, Dv, dtype=F64)
    outs = []
    for t in range(T):  # decay first, delta-rule residual, write, read the updated state (§1.5)
        Sb = torch.exp(g[t]).view(H, 1, 1) * S
        u = beta[t].view(H, 1) * (vv[t] - torch.einsum("hkv,hk->hv", Sb, k[t]))
        S = Sb + torch.einsum("hk,hv->hkv", k[t], u)
        outs.append(scale * torch.einsum("hkv,hk->hv", S, q[t]))
    o = torch.stack(outs)  # [T, H, Dv]
    z = (x @ W["g_proj"].T).view(T, H, Dv)
    y = rmsnorm(o, W["o_norm"], 1e-6) * torch.nn.functional.silu(z)  # norm, then gate (§1.4 step 7)
    out = y.reshape(T, vd) @ W["o_proj"].T
    meta = dict(kind="gdn", d=d, gdn_heads=H, gdn_v_heads=H, head_k=K, head_v=Dv, conv=Wc, norm_eps=1e-6, T=T)
    return finish("gdn", W, x, out, meta)


# ---------------------------------------------------------------- Mamba-2 (hybrid_model.md §6)
def m2_ref():
    d, H, Hkv, hd, Wc, T = 32, 4, 2, 8, 4, 40
    di, dxb = H * hd, Hkv * hd
    W = {
        "in_proj": torch.randn(2 * di + 2 * dxb + H, d, dtype=F64) * 0.2,
        "conv1d.weight": torch.randn(di + 2 * dxb, 1, Wc, dtype=F64) * 0.4,
        "conv1d.bias": torch.randn(di + 2 * dxb, dtype=F64) * 0.2,
        "dt_bias": torch.randn(H, dtype=F64) * 0.5 - 2,
        "A_log": torch.log(torch.rand(H, dtype=F64) * 15 + 1),
        "D": 1 + 0.1 * torch.randn(H, dtype=F64),
        "norm.weight": 1 + 0.1 * torch.randn(di, dtype=F64),
        "out_proj": torch.randn(d, di, dtype=F64) * 0.2,
    }
    for t in W.values():
        t.requires_grad_(True)
    x = torch.randn(T, d, dtype=F64, requires_grad=True)
    zxbcdt = x @ W["in_proj"].T
    z, xBC, dt = zxbcdt[:, :di], zxbcdt[:, di:2 * di + 2 * dxb], zxbcdt[:, 2 * di + 2 * dxb:]
    xBC = causal_conv_silu(xBC, W["conv1d.weight"][:, 0], W["conv1d.bias"])
    xs, Bm, Cm = xBC[:, :dxb], xBC[:, dxb:2 * dxb], xBC[:, 2 * dxb:]
    rep = H // Hkv
    xs = xs.view(T, Hkv, hd).repeat_interleave(rep, 1)  # head h uses group h // rep
    Bm = Bm.view(T, Hkv, hd).repeat_interleave(rep, 1)
    Cm = Cm.view(T, H, hd)
    delta = torch.nn.functional.softplus(dt + W["dt_bias"])  # [T, H]
    A = -torch.exp(W["A_log"])
    S = torch.zeros(H, hd, hd, dtype=F64)  # [H, P, N]
    ys = []
    for t in range(T):  # S_t = exp(dt A) S + dt x B^T; y = S C + D x (§6.1 step 4)
        S = torch.exp(delta[t] * A).view(H, 1, 1) * S + delta[t].view(H, 1, 1) * torch.einsum(
            "hp,hn->hpn", xs[t], Bm[t])
        ys.append(torch.einsum("hpn,hn->hp", S, Cm[t]) + W["D"].view(H, 1) * xs[t])
    y = torch.stack(ys).reshape(T, di)
    u = (y * torch.nn.functional.silu(z)).view(T, H, hd)  # gate, then grouped norm (§6.1 step 5)
    y = rmsnorm(u, W["norm.weight"].view(H, hd), 1e-5).reshape(T, di)
    out = y @ W["out_proj"].T
    meta = dict(kind="m2", d=d, H=H, Hkv=Hkv, dh=hd, d_inner=di, d_xb=dxb, conv=Wc, norm_eps=1e-5, T=T)
    return finish("m2", W, x, out, meta)


PREFIX = {"mla": "model.layers.0.mla.", "gdn": "model.layers.0.gdn.", "m2": "model.layers.0.mamba."}


def pname(kind, k):
    # hylo parameter names: Linear / conv weights end in ".weight"; A_log, dt_bias, D do not
    if kind == "m2" and k in ("conv1d.weight", "conv1d.bias", "norm.weight"):
        return PREFIX[kind] + k
    if k in ("A_log", "dt_bias", "D"):
        return PREFIX[kind] + k
    return PREFIX[kind] + k + ".weight"


def finish(kind, W, x, out, meta):
    dout = torch.randn_like(out)
    (out * dout).sum().backward()
    t = {"x": x.detach(), "dout": dout, "out": out.detach(), "grad.x": x.grad}
    for k, w in W.items():
        t[pname(kind, k)] = w.detach()
        t["grad." + pname(kind, k)] = w.grad
    t = {k: v.float().contiguous() for k, v in t.items()}
    return t, {k: str(v) for k, v in meta.items()}


if __name__ == "__main__":
    out_dir = sys.argv[1]
    for name, fn in [("mla", mla_ref), ("gdn", gdn_ref), ("m2", m2_ref)]:
        tensors, meta = fn()
        path = f"{out_dir}/layer_{name}.safetensors"
        save_file(tensors, path, metadata=meta)
        print(path, json.dumps(meta), sum(v.numel() for v in tensors.values()) * 4, "bytes")
