#!/bin/bash
# Serve vs generate on the CPU (docs/SERVING.md): 64 greedy tokens of "Once
# upon a time" on the default model from `hylo generate --stats` (prefill and
# decode apart from loading) and, over HTTP, from two servers at once -- binary
# B on port 18431 and binary A on 18432 -- with the requests alternated so that
# both see the same machine load. Ends with each server's mean time per output
# token from /metrics and checks that the answers agree.
#   scripts/bench_serve.sh B A ROUNDS      (GEN=binary for generate, default A;
#                                          CONC=4 requests at once after, 0: none)
# B and A may carry an environment: "env GOMP_SPINCOUNT=10000 build-cpu/hylo".
set -u
B=$1 A=$2 N=${3:-5}
M=$(scripts/fetch_model.sh --path)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
echo "# $(date -u +%F' '%T) UTC; $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# B = $B (port 18431), A = $A (port 18432), generate: ${GEN:-$A}"
$B serve "$M" --port 18431 --threads 2 >"$T/b.out" 2>"$T/b.err" &
PB=$!
$A serve "$M" --port 18432 --threads 2 >"$T/a.out" 2>"$T/a.err" &
PA=$!
for _ in $(seq 100); do
    grep -q serving "$T/b.out" && grep -q serving "$T/a.out" && break
    sleep 0.2
done
req() {
    curl -s -o "$T/r$1.json" -w '%{time_total}' "http://127.0.0.1:$1/v1/completions" \
        -d '{"prompt":"Once upon a time","max_tokens":64,"temperature":0}'
}
for i in $(seq "$N"); do
    g=$({ /usr/bin/time -f "%e s wall" ${GEN:-$A} generate "$M" --prompt "Once upon a time" -n 64 --temp 0 --stats \
        >"$T/gen.txt"; } 2>&1 | tr '\n' ' ')
    echo "round $i: generate: $g"
    echo "round $i: serve B $(req 18431) s"
    echo "round $i: serve A $(req 18432) s"
done
for p in 18431 18432; do
    curl -s "http://127.0.0.1:$p/metrics" | awk -v p=$p '
        /^hylo_time_per_output_token_seconds_sum/ {s = $2} /^hylo_time_per_output_token_seconds_count/ {c = $2}
        END {printf "# port %s: time per output token %.2f ms (mean of %d)\n", p, 1000 * s / c, c}'
done
text() { jq -r '.choices[0].text' "$1"; }
[ "Once upon a time$(text "$T/r18432.json")" = "$(cat "$T/gen.txt")" ] && echo "# A answers as generate does"
[ "$(text "$T/r18431.json")" = "$(text "$T/r18432.json")" ] && echo "# B answers as A does"
# Then CONC requests at once (default 4; 0: none), each 64 greedy tokens of
# its own prompt, on B then A, ROUNDS times: the wall time until all are
# answered, and every answer checked against the same request sent alone to
# the same server.
conc() { # port -> wall seconds of CONC requests at once
    local t0 t1 i
    t0=$EPOCHREALTIME
    for i in $(seq "$CONC"); do
        curl -s -o "$T/c$1_$i.json" "http://127.0.0.1:$1/v1/completions" \
            -d "{\"prompt\":\"Story $i: once upon a time\",\"max_tokens\":64,\"temperature\":0}" &
    done
    wait
    t1=$EPOCHREALTIME
    awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }'
}
CONC=${CONC:-4}
if [ "$CONC" -gt 0 ]; then
    for i in $(seq "$N"); do
        echo "round $i: $CONC at once: serve B $(conc 18431) s, serve A $(conc 18432) s ($((CONC * 64)) tokens each)"
    done
    for p in 18431 18432; do
        same=1
        for i in $(seq "$CONC"); do
            curl -s -o "$T/alone.json" "http://127.0.0.1:$p/v1/completions" \
                -d "{\"prompt\":\"Story $i: once upon a time\",\"max_tokens\":64,\"temperature\":0}"
            [ "$(text "$T/alone.json")" = "$(text "$T/c${p}_$i.json")" ] || same=0
        done
        echo "# port $p: the answers of the requests at once $([ $same = 1 ] && echo are || echo are NOT) those alone"
    done
fi
kill $PB $PA
wait $PB $PA
