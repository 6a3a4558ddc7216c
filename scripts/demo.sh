#!/usr/bin/env bash
# The main job on the default model (README command 1): fetch SmolLM2-135M-
# Instruct, show what it is, ask it a question through its chat template.
# BIN may point at another hylo build (default build/hylo).
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${BIN:-build/hylo}"
model=$(scripts/fetch_model.sh)
echo "== hylo info $model"
"$bin" info "$model"
echo
echo "== hylo chat (one turn)"
"$bin" chat "$model" --prompt "What is the capital of France?" -n 64 --stats
