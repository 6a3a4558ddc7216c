#!/usr/bin/env bash
# The untrained baselines of docs/RESULTS.md: the default teacher exported and
# re-read, and five upcycled students, each compared with the teacher by
# `hylo compare` (16 essays x 64 tokens). Prints every command and its output.
#   scripts/baselines.sh [HYLO_BIN] > docs/logs/cpu/baselines.txt
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-build/hylo}"
model=$(scripts/fetch_model.sh)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
run() { echo "\$ hylo $*"; "$bin" "$@"; echo; }
date -u +"%Y-%m-%d %H:%M UTC, $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
run export "$model" --out "$work/teacher"
run compare "$model" "$work/teacher" --windows 16 --tokens 64
i=0
while read -r label args; do
    i=$((i + 1))
    echo "== $label"
    # shellcheck disable=SC2086 # args is a list of flags
    run convert --teacher "$model" --out "$work/s$i" $args --seed 42
    run compare "$model" "$work/s$i" --windows 16 --tokens 64
done <<'LIST'
10MLA20GDN --mla-every 3 --linear gdn
10MLA20M2 --mla-every 3 --linear mamba2
30MLA --all-mla
30MLA_full_rank --all-mla --r-q 576 --r-kv 384
30GDN --all-linear --linear gdn
LIST
