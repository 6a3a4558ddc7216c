#!/usr/bin/env bash
# The main job on the default model (README command 1): fetch SmolLM2-135M-
# Instruct, show what it is, ask it a question through its chat template, then
# upcycle it into a hybrid (MLA at every third layer, Gated DeltaNet elsewhere),
# show the hybrid's cache next to the teacher's, let the untrained hybrid
# generate, and measure how far its next-token distributions are from the
# teacher's before any training (the gap distillation closes).
# BIN may point at another hylo build (default: the one a plain 'make' builds,
# build/hylo when nvcc is on the PATH, else build-cpu/hylo); DEMO_OUT is where
# the hybrid goes (default a temporary folder).
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v "${NVCC:-nvcc}" >/dev/null 2>&1; then bin=build/hylo; else bin=build-cpu/hylo; fi
bin="${BIN:-$bin}"
[ -x "$bin" ] || { echo "hylo: error: demo: $bin does not exist (run 'make demo', or set BIN)" >&2; exit 1; }
model=$(scripts/fetch_model.sh)
out="${DEMO_OUT:-$(mktemp -d /tmp/hylo-demo.XXXXXX)}/smollm2-10mla20gdn"
echo "== hylo info $model"
"$bin" info "$model"
echo
echo "== hylo chat (one turn)"
"$bin" chat "$model" --prompt "What is the capital of France?" -n 64 --stats
echo
echo "== hylo convert: 10 MLA + 20 GDN layers"
"$bin" convert --teacher "$model" --out "$out" --mla-every 3 --linear gdn
echo
echo "== hylo info (hybrid)"
"$bin" info "$out" | grep -E "mixers|KV cache|recurrent|parameters"
echo
echo "== hylo generate (untrained hybrid: its text is not meaningful before distillation)"
"$bin" generate "$out" --prompt "The capital of France is" -n 16
echo
echo "== hylo compare teacher vs untrained hybrid"
text=../shared/data/essays
[ -d "$text" ] || text=README.md # any English text will do
"$bin" compare "$model" "$out" --text "$text" --windows 4 --tokens 48
