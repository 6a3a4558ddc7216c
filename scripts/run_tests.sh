#!/usr/bin/env bash
# Runs each test binary given, prints one line per binary and a summary;
# exits non-zero if any failed. Output of failing binaries is shown in full.
set -u
pass=0; fail=0; failed=()
t0=$(date +%s)
for t in "$@"; do
    s=$EPOCHREALTIME
    out=$("$t" 2>&1); rc=$?
    e=$(awk -v a="$s" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
    if [ $rc -eq 0 ]; then
        pass=$((pass+1)); printf 'PASS %-50s %6ss\n' "${t#*/tests/}" "$e"
    else
        fail=$((fail+1)); failed+=("$t"); printf 'FAIL %-50s %6ss\n' "${t#*/tests/}" "$e"
        printf '%s\n' "$out" | sed 's/^/    /'
    fi
done
echo "tests: $pass passed, $fail failed, $(( $(date +%s) - t0 ))s"
[ $fail -eq 0 ]
