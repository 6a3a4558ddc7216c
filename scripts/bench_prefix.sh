#!/bin/bash
# Prefix caching on the CPU (docs/SERVING.md): the time to first token of a
# chat's second turn with and without the cache. Two servers of binary BIN up
# at once, --prefix-cache-mb 256 (port 18441) and 0 (port 18442); each round
# sends both a first turn (a system message naming the round, so that rounds
# share nothing but the template's first tokens, and a user message of about
# WORDS words) and then the second turn (that conversation, an assistant
# answer and a new question), alternating the servers. The time to first
# token is curl's time_starttransfer of a streamed request (the headers go
# out with the first token). Ends with each server's prefix-cache metrics.
#   scripts/bench_prefix.sh BIN ROUNDS WORDS     (default build-cpu/hylo 3 1500)
# MODEL=PATH serves another model (default: the default GGUF), SERVE_ARGS
# replaces the servers' other options (default --threads 2), PREFIX_MB the
# cache's size (default 256), e.g. on a GPU for a 32K-token conversation:
#   MODEL=HYBRID SERVE_ARGS="--device cuda --ctx 32768" PREFIX_MB=4096 \
#     scripts/bench_prefix.sh build/hylo 3 22000
set -u
BIN=${1:-build-cpu/hylo} N=${2:-3} W=${3:-1500}
M=${MODEL:-$(scripts/fetch_model.sh --path)}
SERVE_ARGS=${SERVE_ARGS:---threads 2}
T=$(mktemp -d)
trap 'kill $PON $POFF 2>/dev/null; rm -rf "$T"' EXIT
echo "# $(date -u +%F' '%T) UTC; $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg); $BIN ($(git rev-parse --short HEAD))"
$BIN serve "$M" --port 18441 $SERVE_ARGS --prefix-cache-mb "${PREFIX_MB:-256}" >"$T/on.out" 2>"$T/on.err" &
PON=$!
$BIN serve "$M" --port 18442 $SERVE_ARGS --prefix-cache-mb 0 >"$T/off.out" 2>"$T/off.err" &
POFF=$!
for _ in $(seq 300); do
    grep -q serving "$T/on.out" && grep -q serving "$T/off.out" && break
    sleep 0.2
done
words="the quick brown fox jumps over a lazy dog while seven wise owls watch from an old oak tree near river"
text=$(for i in $(seq "$W"); do set -- $words; shift $((i % 20)); printf '%s ' "${1:-sun}"; done)
body() { # round, turn
    local m="[{\"role\":\"system\",\"content\":\"Round $1. You are a helpful assistant.\"},{\"role\":\"user\",\"content\":\"Read this: $text. What is it about?\"}"
    [ "$2" = 2 ] && m="$m,{\"role\":\"assistant\",\"content\":\"It is a list of words about animals and a tree.\"},{\"role\":\"user\",\"content\":\"Which animal comes first?\"}"
    printf '{"messages":%s],"max_tokens":8,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}' "$m"
}
ttft() { # port, round, turn
    body "$2" "$3" >"$T/b.json"
    curl -s -N -o "$T/r.txt" -w '%{time_starttransfer}' "http://127.0.0.1:$1/v1/chat/completions" -d @"$T/b.json"
    printf ' (%s prompt tokens)' "$(grep -o '"prompt_tokens":[0-9]*' "$T/r.txt" | cut -d: -f2)"
}
for r in $(seq "$N"); do
    for p in 18441 18442; do
        name=$([ $p = 18441 ] && echo "cache" || echo "no cache")
        t1=$(ttft $p "$r" 1)
        t2=$(ttft $p "$r" 2)
        echo "round $r, $name: turn 1 ttft $t1 s; turn 2 ttft $t2 s"
    done
done
for p in 18441 18442; do
    echo "# port $p:"
    curl -s "http://127.0.0.1:$p/metrics" | grep '^hylo_prefix_cache'
done
