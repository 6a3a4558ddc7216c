# Sourced on the GPU machine: unpack the carried binaries, set library paths.
cd "$(git rev-parse --show-toplevel 2>/dev/null || pwd)"
[ -f .carry/bins.tar.xz ] && tar xJf .carry/bins.tar.xz
export LD_LIBRARY_PATH="$PWD/.carry/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export PYTHONUNBUFFERED=1
# the machine, into the run's logs too (docs/PERFORMANCE.md quotes it)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used,memory.total --format=csv |
    tee "${OUT:-/tmp}/gpu.txt"
