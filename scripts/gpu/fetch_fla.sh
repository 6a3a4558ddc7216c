#!/usr/bin/env bash
# Here (PyPI reachable): FLA's Python package for the GPU references
# (scripts/ref/bench_fla_gdn.py, bench_kd_ref.py), unpacked into .carry/fla
# from the fla-core and flash-linear-attention wheels of one version (the
# second brings fla/layers). Timing only: the references run FLA's Triton
# kernels as users do. FLA_VERSION picks another version (default 0.6.0, the
# one runs 26-30 used).
set -euo pipefail
cd "$(dirname "$0")/../.."
v=${FLA_VERSION:-0.6.0}
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
python3 -m pip download --quiet --no-deps --no-cache-dir --only-binary=:all: \
    "fla-core==$v" "flash-linear-attention==$v" -d "$w"
rm -rf .carry/fla.part && mkdir -p .carry/fla.part
for f in "$w"/*.whl; do
    python3 -m zipfile -e "$f" .carry/fla.part
done
[ -d .carry/fla.part/fla/ops ] && [ -d .carry/fla.part/fla/layers ] || { echo "fetch_fla: no fla/ops or fla/layers in the wheels" >&2; exit 1; }
rm -rf .carry/fla && mv .carry/fla.part .carry/fla
echo "fetch_fla: FLA $v in .carry/fla ($(du -sh .carry/fla | cut -f1))"
