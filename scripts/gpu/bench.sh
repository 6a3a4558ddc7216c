#!/usr/bin/env bash
# On the GPU machine: the kernel benchmarks and their PyTorch references, each
# log into $OUT; the summary tables are printed last.
# Usage: bench.sh [attn] [sdpa] [loss] [core] [gdn] [fla] [ssd] [torchssd] [e2e] (default: all present)
# e2e: hylo chat / generate --stats on CUDA, the teacher and its two upcycled
# hybrids (HYLO_MODEL: the default GGUF, /tmp/smol.gguf unless set).
source scripts/gpu/env.sh
want=" ${*:-attn sdpa loss core gdn fla ssd torchssd e2e} "
model="${HYLO_MODEL:-/tmp/smol.gguf}"
has() { [[ "$want" == *" $1 "* ]]; }
has attn && [ -x build/bench/bench_attn ] && timeout 300 build/bench/bench_attn > "$OUT/bench_attn.txt" 2>&1
has sdpa && timeout 200 python3 scripts/ref/bench_sdpa.py > "$OUT/bench_sdpa.txt" 2>&1
has loss && [ -x build/bench/bench_loss ] && timeout 200 build/bench/bench_loss > "$OUT/bench_loss.txt" 2>&1
has core && [ -x build/bench/bench_cuda_core ] && timeout 120 build/bench/bench_cuda_core 20 > "$OUT/bench_cuda_core.txt" 2>&1
has gdn && [ -x build/bench/bench_gdn ] && timeout 200 build/bench/bench_gdn > "$OUT/bench_gdn.txt" 2>&1
has fla && [ -d .carry/fla ] && timeout 300 python3 scripts/ref/bench_fla_gdn.py --fla .carry/fla > "$OUT/bench_fla_gdn.txt" 2>&1
has ssd && [ -x build/bench/bench_ssd ] && timeout 200 build/bench/bench_ssd > "$OUT/bench_ssd.txt" 2>&1
has torchssd && timeout 200 python3 scripts/ref/bench_mamba_ssd.py > "$OUT/bench_torch_ssd.txt" 2>&1
if has e2e && [ -f "$model" ]; then
    {
        build/hylo chat "$model" --device cuda --prompt "What is the capital of France?" -n 40 --stats
        for lin in gdn mamba2; do
            rm -rf "/tmp/hybrid_$lin"
            build/hylo convert --teacher "$model" --out "/tmp/hybrid_$lin" --mla-every 3 --linear "$lin" &&
                build/hylo generate "/tmp/hybrid_$lin" --device cuda --prompt "The capital of France is" -n 24 --stats
        done
    } > "$OUT/bench_e2e.txt" 2>&1
fi
for f in "$OUT"/bench_*.txt; do echo "== $(basename "$f")"; tail -n "${TAIL:-14}" "$f"; done
