#!/usr/bin/env bash
# Run here (no GPU): builds hylo with CUDA, packs the binaries the GPU machine
# needs into .carry/ (ignored by git) for the device tool's `carry`:
#   .carry/bins.tar.xz   stripped build/hylo, build/tests/cuda/*, build/bench/*, and the bench-variants
#                        build's build/bench-variants/{bench,tests/cuda}/* (Makefile header)
#   .carry/lib/          shared libraries the GPU image lacks (scripts/gpu/carry_libs.sh)
#   .carry/p1, .carry/p2 the default GGUF in two halves (one call carries at most 64 MiB)
set -euo pipefail
cd "$(dirname "$0")/../.."
make -j2 build/hylo $(ls tests/cuda/test_*.c | sed 's|^tests/\(.*\)\.c$|build/tests/\1|') bench \
    build/bench-variants/tests/cuda/test_cuda_attn >/dev/null
mkdir -p .carry/stage/build/tests/cuda .carry/stage/build/bench .carry/lib .carry/p1 .carry/p2
mkdir -p .carry/stage/build/bench-variants/tests/cuda .carry/stage/build/bench-variants/bench
cp build/hylo .carry/stage/build/
cp build/tests/cuda/test_* .carry/stage/build/tests/cuda/
cp build/bench/* .carry/stage/build/bench/
cp build/bench-variants/tests/cuda/test_* .carry/stage/build/bench-variants/tests/cuda/
cp build/bench-variants/bench/* .carry/stage/build/bench-variants/bench/
strip .carry/stage/build/hylo .carry/stage/build/tests/cuda/* .carry/stage/build/bench/* \
    .carry/stage/build/bench-variants/tests/cuda/* .carry/stage/build/bench-variants/bench/*
tar cf - -C .carry/stage build | xz -9 -T2 > .carry/bins.tar.xz
rm -rf .carry/stage
scripts/gpu/carry_libs.sh
model=$(scripts/fetch_model.sh)
if [ ! -f .carry/p1/gguf.part ]; then
    half=$(( ($(stat -c %s "$model") + 1) / 2 ))
    head -c "$half" "$model" > .carry/p1/gguf.part
    tail -c +"$((half + 1))" "$model" > .carry/p2/gguf.part
fi
ls -la .carry/bins.tar.xz .carry/p1/gguf.part .carry/p2/gguf.part
du -sh .carry/lib
