#!/usr/bin/env python3
"""Reference timings of FLA's chunked gated delta rule (Triton) on the shapes and
in the table format of bench/bench_gdn.c, for the hylo / FLA ratio in
docs/PERFORMANCE.md. Timing only: FLA's gradients are NOT used as a reference
(spec linear_blocks.md 6.4; the oracle is the naive recurrence / hylo's CPU op).

    python3 scripts/ref/bench_fla_gdn.py --fla /path/to/flash-linear-attention [--quick] [--T N] [--layer 1B|3B]

FLA is not installed on the GPU machine: --fla names a source checkout (the
folder that holds the `fla` package), which is put first on sys.path. Its pure
Python dependencies (einops, transformers, ...) are in the machine's image.

Shapes: the HyLo GDN layer core, B = 1, K = 256, Dv = 512, H = HV = 6
(HyLo-Llama-1B) and H = HV = 9 (HyLo-Llama-3B), T = 8192 and 65536 (--quick:
8192). Inputs as in bench_gdn.c: q, k, v, dout ~ N(0, 1) bf16, q and k
L2-normalised inside the kernel (use_qk_l2norm_in_kernel=True, so the norms are
in FLA's time; bench_gdn.c adds hylo's l2norm ops to match), g = -exp(A_log)
softplus(a + dt_bias) (fp32 log decays; A_log in [0, 2.8], dt_bias in [-5, -2],
a ~ N(0, 1)), beta = sigmoid(b) (b ~ N(0, 1)), no initial or final state.
Forward = one call with inputs that require grad (so FLA saves what its
backward needs); fwd+bwd = that call plus o.backward(dout). Median of
triton.testing.do_bench (CUDA events) with its warm-up, after explicit warm-up
calls that run Triton's autotuning. Each shape gets two rows: "eager" (that
median, launch overhead included: FLA as users run it) and "kernel sum" (the
sum of the durations of the kernels one call launches, from the PyTorch
profiler's CUDA activity over 10 calls: FLA's GPU time without its Python /
Triton launch cost, issue 11's fair comparison). TFLOP/s by the spec's 2.5 cost model, as
bench_gdn.c: forward L (3K + 2Dv) + 6 K Dv + L^2/1.5 per token per value head
(L = 64), fwd+bwd = 3.5 x forward.

FLA refuses the gated chunk backward on Hopper with 3.4.0 <= Triton < 3.7.1
(FLA issue #640: chunk_bwd_dqkwg's dbeta / dg come out wrong there) and this
machine's Triton is 3.6. To time the backward anyway this script patches, at
run time and only in this process:
  0. FLA_TILELANG=0 in the environment (unless set): FLA's TileLang backend,
     its own workaround for #640, stays off, so the Triton kernels are timed;
  1. every loaded `fla.*` module that holds a global TRITON_ABOVE_3_7_1 (the
     flag fla/utils computes from triton.__version__; fla/ops/common/chunk_o.py
     guards chunk_bwd_dqkwg with `IS_NVIDIA_HOPPER and TRITON_ABOVE_3_4_0 and
     not TRITON_ABOVE_3_7_1`): set to True, so the guard passes and the Triton
     kernels run (no kernel, autotune list or Hopper-specific path changes);
  2. only if a probe backward still raises the #640 error (a version whose
     guard has another form): the module whose code raised gets its globals
     IS_NVIDIA_HOPPER (and IS_NVIDIA_HOPPER_CONSTEXPR if present) set to False.
     That can also switch that module's other Hopper-only branches; the script
     prints so.
Every patched (module, name, old, new) is printed. Nothing on disk changes.
"""
import argparse
import inspect
import os
import subprocess
import sys
import traceback

SHAPES = [  # name, B, H, HV, K, Dv
    ("1B GDN", 1, 6, 6, 256, 512),
    ("3B GDN", 1, 9, 9, 256, 512),
]


def fla_commit(path):
    try:
        # only the checkout's own repository: a copy without .git inside another
        # repository (hylo's .carry/) would otherwise report that one's HEAD
        top = subprocess.run(["git", "-C", path, "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                             timeout=10)
        out = subprocess.run(["git", "-C", path, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if top.returncode == 0 and os.path.realpath(top.stdout.strip()) == os.path.realpath(path) \
                and out.returncode == 0:
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    head = os.path.join(path, ".git", "HEAD")
    try:
        with open(head) as f:
            ref = f.read().strip()
        if ref.startswith("ref:"):
            with open(os.path.join(path, ".git", ref[5:].strip())) as f:
                return f.read().strip()
        return ref
    except OSError:
        return "unknown (no git metadata in the checkout)"


def import_fla(path):
    """`import fla`; if fla/__init__.py fails (it imports fla.layers / fla.models,
    which need a matching transformers), a bare package object stands in for it
    so that fla.ops imports on its own."""
    try:
        import fla
        return fla
    except Exception as e:  # noqa: BLE001
        import re
        import types
        for name in [m for m in sys.modules if m == "fla" or m.startswith("fla.")]:
            del sys.modules[name]
        print("note: import fla failed (%s: %s); importing fla.ops without fla/__init__.py"
              % (type(e).__name__, str(e).splitlines()[0][:120] if str(e) else ""), flush=True)
        pkg = types.ModuleType("fla")
        pkg.__path__ = [os.path.join(path, "fla")]
        pkg.__file__ = os.path.join(path, "fla", "__init__.py")
        try:
            with open(pkg.__file__) as f:
                m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", f.read())
            pkg.__version__ = m.group(1) if m else "?"
        except OSError:
            pkg.__version__ = "?"
        sys.modules["fla"] = pkg
        return pkg


def patch_flag(patched):
    """Step 1: TRITON_ABOVE_3_7_1 = True in every loaded fla module that holds it."""
    for name, mod in sorted(sys.modules.items()):
        if mod is None or not (name == "fla" or name.startswith("fla.")):
            continue
        if getattr(mod, "TRITON_ABOVE_3_7_1", None) is False:
            mod.TRITON_ABOVE_3_7_1 = True
            patched.append((name, "TRITON_ABOVE_3_7_1", False, True))


def patch_hopper_in(mod_globals, modname, patched):
    """Step 2: the module that raised #640 stops believing it runs on Hopper."""
    for flag in ("IS_NVIDIA_HOPPER", "IS_NVIDIA_HOPPER_CONSTEXPR"):
        if mod_globals.get(flag) is True:
            mod_globals[flag] = False
            patched.append((modname, flag, True, False))


def is_640(exc):
    msg = str(exc)
    return "640" in msg or "chunk_bwd_dqkwg" in msg or ("3.7.1" in msg and "Triton" in msg)


def make_inputs(B, T, H, HV, K, Dv, device, seed=0):
    import torch
    import torch.nn.functional as F

    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(B, T, H, K, device=device, dtype=torch.bfloat16, generator=gen)
    k = torch.randn(B, T, H, K, device=device, dtype=torch.bfloat16, generator=gen)
    v = torch.randn(B, T, HV, Dv, device=device, dtype=torch.bfloat16, generator=gen)
    dout = torch.randn(B, T, HV, Dv, device=device, dtype=torch.bfloat16, generator=gen)
    A_log = torch.rand(HV, device=device, generator=gen) * 2.8
    dt_bias = torch.rand(HV, device=device, generator=gen) * 3.0 - 5.0
    a = torch.randn(B, T, HV, device=device, generator=gen)
    b = torch.randn(B, T, HV, device=device, generator=gen)
    g = (-A_log.exp() * F.softplus(a + dt_bias)).float()
    beta = torch.sigmoid(b).float()
    return q, k, v, g, beta, dout


def make_call(chunk_gated_delta_rule):
    """chunk_gated_delta_rule(q, k, v, g, beta) with the keyword arguments this
    FLA version accepts (the signature changed over releases)."""
    params = inspect.signature(chunk_gated_delta_rule).parameters
    kw = {}
    if "use_qk_l2norm_in_kernel" in params:
        kw["use_qk_l2norm_in_kernel"] = True
    else:
        raise SystemExit("this FLA has no use_qk_l2norm_in_kernel; refusing to time a different computation")
    if "output_final_state" in params:
        kw["output_final_state"] = False
    if "initial_state" in params:
        kw["initial_state"] = None
    if "head_first" in params:
        kw["head_first"] = False
    if "state_v_first" in params:  # hylo's and FLA's GatedDeltaNet layer state layout
        kw["state_v_first"] = True

    def call(q, k, v, g, beta, scale):
        out = chunk_gated_delta_rule(q, k, v, g=g, beta=beta, scale=scale, **kw)
        return out[0] if isinstance(out, tuple) else out

    return call, kw


def probe_backward(call, patched):
    """Runs a small fwd+bwd; applies step 2 if the #640 guard still fires."""
    import torch

    for attempt in range(2):
        q, k, v, g, beta, dout = make_inputs(1, 128, 2, 2, 256, 512, "cuda", seed=1)
        for t in (q, k, v, g, beta):
            t.requires_grad_(True)
        try:
            o = call(q, k, v, g, beta, 256 ** -0.5)
            o.backward(dout)
            torch.cuda.synchronize()
            return
        except RuntimeError as e:
            if attempt or not is_640(e):
                raise
            tb = e.__traceback__
            frame = None
            while tb is not None:  # innermost fla frame: the module whose code raised
                mod = tb.tb_frame.f_globals.get("__name__", "")
                if mod == "fla" or mod.startswith("fla."):
                    frame = tb.tb_frame
                tb = tb.tb_next
            if frame is None:
                raise
            print("note: the #640 guard still raised after step 1 (%s); applying step 2 in %s"
                  % (str(e).splitlines()[0][:120], frame.f_globals.get("__name__")), flush=True)
            patch_hopper_in(frame.f_globals, frame.f_globals.get("__name__"), patched)


def fwd_flops(B, T, HV, K, Dv):
    L = 64.0
    return B * T * HV * (L * (3 * K + 2 * Dv) + 6 * K * Dv + L * L / 1.5)


def bench_shape(call, name, B, T, H, HV, K, Dv):
    import torch
    import triton
    from cuda_timing import kernel_ms  # scripts/ref/, the script's own folder

    q, k, v, g, beta, dout = make_inputs(B, T, H, HV, K, Dv, "cuda")
    for t in (q, k, v, g, beta):
        t.requires_grad_(True)
    scale = K ** -0.5

    def clear():
        for t in (q, k, v, g, beta):
            t.grad = None

    def fwd():
        return call(q, k, v, g, beta, scale)

    def fwd_bwd():
        o = fwd()
        o.backward(dout)

    for _ in range(3):  # Triton autotuning happens in these calls
        clear()
        fwd_bwd()
    torch.cuda.synchronize()
    rep = 200 if T <= 8192 else 1000  # ms of timed runs: >= 10 runs at both sizes
    t_f = triton.testing.do_bench(fwd, warmup=50, rep=rep, return_mode="median")
    t_fb = triton.testing.do_bench(fwd_bwd, warmup=50, rep=rep, grad_to_none=[q, k, v, g, beta],
                                   return_mode="median")
    k_f = kernel_ms(fwd, 10)
    k_fb = kernel_ms(fwd_bwd, 10, before=clear)
    F = fwd_flops(B, T, HV, K, Dv)
    lines = []
    for tf, tfb, how in ((t_f, t_fb, "eager"), (k_f, k_fb, "kernel sum")):
        lines.append("| %-8s | %d | %6d | %2d | %2d | %3d | %3d | %9.3f | %8.1f | %10.3f | %8.1f | FLA Triton, %s" % (
            name, B, T, H, HV, K, Dv, tf, F / (tf * 1e-3) / 1e12, tfb, 3.5 * F / (tfb * 1e-3) / 1e12, how))
        print(lines[-1], flush=True)
    del q, k, v, g, beta, dout
    torch.cuda.empty_cache()
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fla", required=True, help="path of a flash-linear-attention source checkout")
    ap.add_argument("--quick", action="store_true", help="T = 8192 only")
    ap.add_argument("--T", type=int, action="append", help="only this T (repeatable); Triton's autotuning per "
                    "shape takes minutes, so a device call may hold only part of the table")
    ap.add_argument("--layer", action="append", help="only this layer, 1B or 3B (repeatable)")
    args = ap.parse_args()
    path = os.path.abspath(args.fla)
    if not os.path.isdir(os.path.join(path, "fla")):
        raise SystemExit("--fla %s: no fla/ package folder there" % path)
    sys.path.insert(0, path)
    # the Triton kernels, not FLA's TileLang backend (not installed on the GPU machine anyway)
    os.environ.setdefault("FLA_TILELANG", "0")

    import torch
    import triton

    fla = import_fla(path)
    import fla.ops.common.chunk_o  # noqa: F401  (the module holding the #640 guard)
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    print("bench_fla_gdn: FLA %s (commit %s) from %s" % (getattr(fla, "__version__", "?"), fla_commit(path),
                                                         os.path.dirname(fla.__file__)))
    print("torch %s, triton %s, %s" % (torch.__version__, triton.__version__, torch.cuda.get_device_name()))
    patched = []
    patch_flag(patched)
    call, kw = make_call(chunk_gated_delta_rule)
    print("chunk_gated_delta_rule keyword arguments: %s" % kw)
    probe_backward(call, patched)
    if patched:
        print("runtime patches (module, name, old -> new):")
        for m, n, old, new in patched:
            print("  %s.%s: %s -> %s" % (m, n, old, new))
    else:
        print("runtime patches: none needed (no #640 guard in this FLA / Triton)")
    print("FLA's gradients on this Triton are not checked and not used: timing only.", flush=True)

    hdr = ("| layer    | B |      T |  H | HV |   K |  Dv |    fwd ms | fwd TF/s | fwd+bwd ms | f+b TF/s | note")
    print(hdr)
    rows = []
    Ts = args.T if args.T else (8192,) if args.quick else (8192, 65536)
    for T in Ts:
        for (name, B, H, HV, K, Dv) in SHAPES:
            if args.layer and name.split()[0] not in args.layer:
                continue
            try:
                rows.append(bench_shape(call, name, B, T, H, HV, K, Dv))
            except Exception as e:  # keep the other shapes' numbers
                traceback.print_exc()
                rows.append("| %-8s | %d | %6d | %2d | %2d | %3d | %3d | failed: %s" % (
                    name, B, T, H, HV, K, Dv, str(e).splitlines()[0][:100] if str(e) else type(e).__name__))
                torch.cuda.empty_cache()
    print("\n==== summary (FLA chunk_gated_delta_rule, Triton) ====")
    print("TFLOP/s by the spec's 2.5 cost model: fwd 0.90 MFLOP/token/head (K 256, Dv 512), fwd+bwd 3.5x.")
    print(hdr)
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
