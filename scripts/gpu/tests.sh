#!/usr/bin/env bash
# On the GPU machine: every CUDA-vs-CPU test (the production build's, then the
# bench-variants build's, whose logs are named variants_*), then the PyTorch
# layer fixtures. Logs go to $OUT (one file per test binary); a summary is
# printed last.
source scripts/gpu/env.sh
export HYLO_MODEL="${HYLO_MODEL:-/tmp/smol.gguf}"
export HYLO_REQUIRE_GPU=1 # a backend that cannot start fails the tests instead of skipping them
summary=""
for t in build/tests/cuda/test_* build/bench-variants/tests/cuda/test_*; do
    [ -x "$t" ] || continue
    n=$(basename "$t")
    [[ "$t" == build/bench-variants/* ]] && n="variants_$n"
    timeout "${TEST_TIMEOUT:-120}" "$t" > "$OUT/$n.txt" 2>&1
    rc=$?
    summary+="$n rc=$rc: $(grep -E 'PASSED|FAILED|SKIPPED' "$OUT/$n.txt" | tr '\n' ' ')"$'\n'
done
if [ "${FIXTURES:-1}" = 1 ]; then # FIXTURES=0: the tests only
    mkdir -p "$OUT/fixtures"
    python3 scripts/ref/layers_ref.py "$OUT/fixtures" > "$OUT/layers_ref.txt" 2>&1; echo "layers_ref rc=$?"
fi
echo "$summary"
