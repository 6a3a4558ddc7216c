#!/usr/bin/env bash
# Checks hylo's RULER generators against scripts/ref/ruler_ref.py (CPython's
# random, numpy, Hugging Face tokenizers) for the tasks without an essay
# haystack: prompt bytes, gold outputs and token lengths must be identical.
#   scripts/ref/ruler_check.sh [LENGTH...]   (default 2048 4096 8192)
# Needs numpy and tokenizers (pip), and build-cpu/hylo.
set -euo pipefail
BIN=${BIN:-build-cpu/hylo}
M=${M:-$(scripts/fetch_model.sh --path)}
W=${W:-/tmp/hylo_ruler_check}
WORDS=${WORDS:-../shared/data/words}
N=${N:-2}
TASKS=niah_single_1,niah_multikey_2,niah_multikey_3,vt,cwe,fwe
mkdir -p "$W/ref"
[ -f "$W/hf/tokenizer.json" ] || "$BIN" export "$M" --out "$W/hf" >/dev/null
for L in ${@:-2048 4096 8192}; do
    "$BIN" eval "$M" --task $TASKS --samples "$N" --lengths "$L" --generate-only --words "$WORDS" --out "$W/hylo$L" >/dev/null 2>&1
    python3 scripts/ref/ruler_ref.py "$W/hf/tokenizer.json" "$WORDS" "$L" "$N" "$W/ref"
    python3 - "$W" "$L" <<'PY'
import json, sys
w, L = sys.argv[1], sys.argv[2]
bad = 0
for t in ["niah_single_1", "niah_multikey_2", "niah_multikey_3", "vt", "cwe", "fwe"]:
    ref = [json.loads(l) for l in open(f"{w}/ref/ruler_{t}_{L}.jsonl")]
    got = [json.loads(l) for l in open(f"{w}/hylo{L}/samples/ruler_{t}_{L}.jsonl")]
    for r, g in zip(ref, got):
        same = all(r[k] == g[k] for k in ("input", "outputs", "length", "answer_prefix"))
        bad += not same
        print(f"{t:16s} {L:>6s} sample {r['index']}: {'identical' if same else 'DIFFERENT'} "
              f"(length {r['length']} / {g['length']}, {len(r['input'])} characters, outputs {r['outputs'][:3]})")
    bad += len(ref) != len(got)
sys.exit(1 if bad else 0)
PY
done
