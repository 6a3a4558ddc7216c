#!/usr/bin/env python3
"""Reference KD training step in PyTorch + FLA + transformers, for the ratio in
docs/PERFORMANCE.md's training section (bench/bench_train.c is hylo's side;
same shapes, same phases, timing only, random weights).

    python3 scripts/ref/bench_kd_ref.py --fla .carry/fla [--teacher8b] [--T 8192] [--recompute]

Student: HyLo-Llama-1B-4MLA12GDN as a user builds it in PyTorch: Llama-3.2-1B
blocks (transformers' LlamaRMSNorm and LlamaMLP) whose mixer is FLA's
GatedDeltaNet layer (fla.layers, chunk mode: hidden 2048, 6 heads of 256,
expand_v 2, gate, short convs) or, at layers 1, 5, 10 and 14, an MLA module
(q_a 2048->1344, q_b 1344->32x(32+32), kv_a 2048->128+32, kv_b 128->32x(32+64),
o 32x64->2048, RoPE on the 32 rope dims with the shared rope key, attention by
torch SDPA with the cuDNN backend allowed first). fp32 parameters under bf16
autocast (transformers Trainer's bf16=True), tied embedding and head.
Teacher: transformers LlamaForCausalLM (Llama-3.2-1B or Llama-3.1-8B shaped)
in bf16, sdpa attention, eval, no grad; its final hidden states only.
Loss: FLA's fused_kl_div_loss from hidden states (reduction batchmean).
Optimizer: torch.optim.AdamW(fused=True), clip_grad_norm_ 1.0.
--recompute: torch.utils.checkpoint around every student block.
Prints per-phase ms (CUDA-synchronised), tokens/s and peak memory
(torch.cuda.max_memory_allocated). Eager, as users run it (no CUDA graph).
"""
import argparse
import math
import os
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fla", required=True)
    ap.add_argument("--teacher8b", action="store_true")
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--recompute", action="store_true")
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    os.environ.setdefault("FLA_TILELANG", "0")
    sys.path.insert(0, os.path.abspath(args.fla))
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import torch.utils.checkpoint as ckpt
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm
    import bench_fla_gdn as bfg

    bfg.import_fla(os.path.abspath(args.fla))
    from fla.layers import GatedDeltaNet
    from fla.modules.fused_kl_div import fused_kl_div_loss
    patched = []
    bfg.patch_flag(patched)
    print("torch", torch.__version__, "fla patches:", patched, flush=True)

    dev = "cuda"
    T = args.T
    cfg1 = LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                       num_key_value_heads=8, head_dim=64, vocab_size=128256, rms_norm_eps=1e-5,
                       rope_theta=500000.0, tie_word_embeddings=True, max_position_embeddings=131072)
    if args.teacher8b:
        cfgt = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                           num_key_value_heads=8, head_dim=128, vocab_size=128256, rms_norm_eps=1e-5,
                           rope_theta=500000.0, tie_word_embeddings=False, max_position_embeddings=131072)
    else:
        cfgt = cfg1
    cfgt._attn_implementation = "sdpa"
    with torch.device(dev):
        teacher = LlamaForCausalLM(cfgt).to(torch.bfloat16).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)

    H, dn, dr, dv, rq, rkv = 32, 32, 32, 64, 1344, 128

    def rope_tables(T, dim, base, factor):
        inv = 1.0 / (base ** (torch.arange(0, dim, 2, device=dev).float() / dim)) / factor
        t = torch.arange(T, device=dev).float()
        f = torch.outer(t, inv)
        emb = torch.cat([f, f], -1)
        return emb.cos(), emb.sin()

    cos, sin = rope_tables(T, dr, 10000.0, 4.0 if T <= 8192 else 32.0)

    def rot(x):
        a, b = x.chunk(2, -1)
        return torch.cat([-b, a], -1)

    class MLA(nn.Module):
        def __init__(self):
            super().__init__()
            d = 2048
            self.q_a = nn.Linear(d, rq, bias=False)
            self.q_b = nn.Linear(rq, H * (dn + dr), bias=False)
            self.kv_a = nn.Linear(d, rkv + dr, bias=False)
            self.kv_b = nn.Linear(rkv, H * (dn + dv), bias=False)
            self.o = nn.Linear(H * dv, d, bias=False)

        def forward(self, x):
            B, L, _ = x.shape
            q = self.q_b(self.q_a(x)).view(B, L, H, dn + dr)
            q_nope, q_pe = q.split([dn, dr], -1)
            kv = self.kv_a(x)
            c, k_pe = kv.split([rkv, dr], -1)
            kvb = self.kv_b(c).view(B, L, H, dn + dv)
            k_nope, v = kvb.split([dn, dv], -1)
            q_pe = q_pe * cos[None, :L, None] + rot(q_pe) * sin[None, :L, None]
            k_pe = (k_pe * cos[None, :L] + rot(k_pe) * sin[None, :L])[:, :, None].expand(B, L, H, dr)
            qq = torch.cat([q_nope, q_pe], -1).transpose(1, 2)
            kk = torch.cat([k_nope, k_pe], -1).transpose(1, 2)
            vv = v.transpose(1, 2)
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
                o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True)
            return self.o(o.transpose(1, 2).reshape(B, L, H * dv))

    class Block(nn.Module):
        def __init__(self, i, mla):
            super().__init__()
            self.n1 = LlamaRMSNorm(2048, eps=1e-5)
            self.n2 = LlamaRMSNorm(2048, eps=1e-5)
            self.mix = MLA() if mla else GatedDeltaNet(hidden_size=2048, expand_v=2, head_dim=256, num_heads=6,
                                                        mode="chunk", use_gate=True, use_short_conv=True,
                                                        layer_idx=i, norm_eps=1e-6)
            self.is_mla = mla
            self.mlp = LlamaMLP(cfg1)

        def forward(self, x):
            h = self.n1(x)
            a = self.mix(h) if self.is_mla else self.mix(h)[0]
            x = x + a
            return x + self.mlp(self.n2(x))

    class Student(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(128256, 2048)
            self.blocks = nn.ModuleList([Block(i, i in (1, 5, 10, 14)) for i in range(16)])
            self.norm = LlamaRMSNorm(2048, eps=1e-5)

        def forward(self, ids):
            x = self.embed(ids)
            for b in self.blocks:
                x = ckpt.checkpoint(b, x, use_reentrant=False) if args.recompute else b(x)
            return self.norm(x)

    with torch.device(dev):
        student = Student()
    opt = torch.optim.AdamW(student.parameters(), lr=1e-5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                            fused=True)
    ns = sum(p.numel() for p in student.parameters())
    nt = sum(p.numel() for p in teacher.parameters())
    print(f"student {ns} parameters, teacher {nt} parameters, B 1 x T {T}{', blocks recomputed' if args.recompute else ''}",
          flush=True)
    ids = (torch.arange(T, device=dev) * 7919 % 128256).view(1, T)
    ph = [0.0] * 5
    torch.cuda.reset_peak_memory_stats()

    def sync():
        torch.cuda.synchronize()
        return time.perf_counter()

    for it in range(1 + args.steps):
        t0 = sync()
        with torch.no_grad():
            ht = teacher.model(ids).last_hidden_state
        t1 = sync()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            hs = student(ids)
        t2 = sync()
        loss = fused_kl_div_loss(hs.view(T, -1).to(torch.bfloat16), ht.view(T, -1),
                                 student.embed.weight.to(torch.bfloat16), teacher.lm_head.weight, reduction="batchmean")
        t3 = sync()
        loss.backward()
        t4 = sync()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        t5 = sync()
        if it:
            for i, (a, b) in enumerate([(t0, t1), (t1, t2), (t2, t3), (t3, t4), (t4, t5)]):
                ph[i] += (b - a) * 1e3 / args.steps
        del ht, hs, loss
    tot = sum(ph)
    tps = T / (tot * 1e-3)
    mfu = tps * (6.0 * ns + 2.0 * nt) / 989.4e12
    print("phase ms: teacher %.1f  student fwd %.1f  loss %.1f  backward %.1f  optimizer %.1f  = step %.1f"
          % (ph[0], ph[1], ph[2], ph[3], ph[4], tot))
    print("tokens/s %.0f  MFU %.1f%%  peak memory %.2f GiB" % (tps, 100 * mfu, torch.cuda.max_memory_allocated() / 2 ** 30))


if __name__ == "__main__":
    main()
