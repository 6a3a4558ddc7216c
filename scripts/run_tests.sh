#!/usr/bin/env bash
# Runs each test binary given, prints one line per binary (with the cases it
# skipped, e.g. for a missing GPU or fixture) and a summary; exits non-zero if
# any failed. Output of failing binaries is shown in full.
set -u
# The runtime settings hylo chooses for itself (cli/main.c, tune_runtime), for
# the test binaries too, by the same rule: passive OpenMP waiting; and, only
# when OpenBLAS falls back to its generic "Prescott" kernels, the AVX-512 or
# AVX2 ones the CPU has. OpenBLAS names the kernels it picked when
# OPENBLAS_VERBOSE=2; hylo is asked with HYLO_TUNED=1 so that it does not tune
# and re-run itself. An explicit setting in the environment wins, as in hylo.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
if [ -z "${OPENBLAS_CORETYPE:-}" ] && [ -n "${HYLO_BIN:-}" ] &&
    OPENBLAS_VERBOSE=2 HYLO_TUNED=1 "$HYLO_BIN" --help 2>&1 >/dev/null | grep -qx "Core: Prescott"; then
    if grep -qw avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX
    elif grep -qw avx2 /proc/cpuinfo; then export OPENBLAS_CORETYPE=Haswell; fi
fi
pass=0; fail=0; skipped=0
t0=$(date +%s)
for t in "$@"; do
    s=$EPOCHREALTIME
    out=$("$t" 2>&1); rc=$?
    e=$(awk -v a="$s" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
    skips=$(printf '%s\n' "$out" | grep '^\[  SKIPPED \] [A-Za-z_0-9]*$' | sed 's/.*\] //' | sort -u | tr '\n' ' ')
    nskip=$(printf '%s' "$skips" | wc -w)
    if [ $rc -eq 0 ]; then
        pass=$((pass+1)); skipped=$((skipped+nskip))
        if [ "$nskip" -gt 0 ]; then
            printf 'PASS %-40s %6ss  (skipped: %s)\n' "${t#*/tests/}" "$e" "$skips"
        else
            printf 'PASS %-40s %6ss\n' "${t#*/tests/}" "$e"
        fi
    else
        fail=$((fail+1)); printf 'FAIL %-40s %6ss\n' "${t#*/tests/}" "$e"
        printf '%s\n' "$out" | sed 's/^/    /'
    fi
done
echo "tests: $pass binaries passed, $fail failed, $skipped test cases skipped, $(( $(date +%s) - t0 ))s"
[ $fail -eq 0 ]
