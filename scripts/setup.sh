#!/usr/bin/env bash
# Installs hylo's build and test dependencies from Debian packages (idempotent).
# The CUDA toolkit (nvcc, cuBLASLt) is used when present; it is not installed here.
set -euo pipefail
# python3 + pip: scripts/fetch_model.sh; libzstd: hylo data (.jsonl.zst); libmicrohttpd: hylo serve;
# libopenmpi-dev + openmpi-bin: hylo train's ranks (mpirun; docs/TRAINING.md); libcmocka: the tests;
# curl: the hylo serve tests' HTTP client; clang-format: make format; clang + libclang-rt (libFuzzer):
# make fuzz / fuzz-smoke (docs/FUZZING.md).
pkgs=(build-essential make python3 python3-pip
      libopenblas-dev liblapacke-dev libpcre2-dev libcjson-dev libyaml-dev
      libzstd-dev libmicrohttpd-dev libopenmpi-dev openmpi-bin libcmocka-dev curl clang-format clang libclang-rt-14-dev)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "hylo: installing ${missing[*]}" >&2
    sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
