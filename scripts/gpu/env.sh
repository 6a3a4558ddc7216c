# Sourced on the GPU machine: unpack the carried binaries, set library paths.
cd "$(git rev-parse --show-toplevel 2>/dev/null || pwd)"
[ -f .carry/bins.tar.xz ] && tar xJf .carry/bins.tar.xz
export LD_LIBRARY_PATH="$PWD/.carry/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export PYTHONUNBUFFERED=1
# the machine, into the run's logs too (docs/PERFORMANCE.md quotes it)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used,memory.total --format=csv |
    tee "${OUT:-/tmp}/gpu.txt"
# The default GGUF comes in two halves (.carry/p1, .carry/p2: one call carries
# at most 64 MiB); reassembled here once, so that every GPU script finds it at
# /tmp/smol.gguf, and checked against the sha256 scripts/fetch_model.sh holds.
if [ ! -f /tmp/smol.gguf ] && [ -f .carry/p1/gguf.part ] && [ -f .carry/p2/gguf.part ]; then
    sha=$(sed -n 's/^sha="\([0-9a-f]*\)"$/\1/p' scripts/fetch_model.sh)
    cat .carry/p1/gguf.part .carry/p2/gguf.part > /tmp/smol.gguf.part
    if [ -n "$sha" ] && echo "$sha  /tmp/smol.gguf.part" | sha256sum -c --quiet -; then
        mv /tmp/smol.gguf.part /tmp/smol.gguf
    else
        echo "env.sh: .carry/p1 + .carry/p2 do not make the default GGUF (sha256 mismatch)" >&2
        rm -f /tmp/smol.gguf.part
    fi
fi
