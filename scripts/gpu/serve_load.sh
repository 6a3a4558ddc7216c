#!/bin/bash
# Load test of `hylo serve` (issue 12): STREAMS concurrent streaming chat
# completions of mixed prompt lengths and max_tokens, ROUNDS rounds, against
# one server; checks every answer (HTTP 200, a finish_reason, [DONE], no error
# event), that the server's memory did not grow between the end of the first
# round and the end of the last (GPU memory.used from nvidia-smi when there is
# one, the process RSS; the prefix cache's own growth excepted: on CUDA its
# recurrent-state snapshots, each cudaMalloc'd and so up to 2 MiB more than its
# bytes, its cache rows being pages of the pool allocated at start; on the CPU
# all its bytes), that /metrics
# shows nothing running afterwards, and
# that SIGTERM stops the server with exit status 0. bash + curl (+ awk, sort).
#
#   scripts/gpu/serve_load.sh MODEL TEXT_FILE
#
# TEXT_FILE: any long text; prompt i is a run of its words (wrapping around).
# Settings (environment, defaults for the H200):
#   HYLO=build/hylo DEVICE=cuda STREAMS=64 ROUNDS=2 PORT=18480 CTX=8192
#   MIN_WORDS=12 MAX_WORDS=3000    prompt lengths in words (~16 .. ~4000 tokens)
#   MIN_TOK=32 MAX_TOK=256         max_tokens range
#   RSS_TOL_MIB=64 GPU_TOL_MIB=0   allowed growth between the first and last round
#   SERVE_ARGS="..."               more `hylo serve` options (e.g. --threads 2)
#   OUT=...                        where the logs go (default ./serve_load_out)
# Writes into OUT: requests.tsv (one line per request), metrics_round_R.txt,
# server.log, memory.txt, summary.txt; exits 1 when a check fails.
set -u
MODEL=${1:?usage: serve_load.sh MODEL TEXT_FILE}
TEXT=${2:?usage: serve_load.sh MODEL TEXT_FILE}
HYLO=${HYLO:-build/hylo} DEVICE=${DEVICE:-cuda} STREAMS=${STREAMS:-64} ROUNDS=${ROUNDS:-2}
PORT=${PORT:-18480} CTX=${CTX:-8192} MIN_WORDS=${MIN_WORDS:-12} MAX_WORDS=${MAX_WORDS:-3000}
MIN_TOK=${MIN_TOK:-32} MAX_TOK=${MAX_TOK:-256} RSS_TOL_MIB=${RSS_TOL_MIB:-64} GPU_TOL_MIB=${GPU_TOL_MIB:-0}
SERVE_ARGS=${SERVE_ARGS:-}
OUT=${OUT:-./serve_load_out}
mkdir -p "$OUT/resp"
URL=http://127.0.0.1:$PORT
fail=0
note() { echo "$*" | tee -a "$OUT/summary.txt"; }
bad() {
    note "FAIL: $*"
    fail=1
}
: >"$OUT/summary.txt"
note "# $(date -u +%F' '%T) UTC; $(hostname); $(nproc) cores; model $MODEL; device $DEVICE"
note "# streams $STREAMS, rounds $ROUNDS, prompts $MIN_WORDS..$MAX_WORDS words, max_tokens $MIN_TOK..$MAX_TOK"

# The words of the text, quotes, backslashes and control characters dropped
# (so a prompt is a JSON string as it stands).
mapfile -t WORDS < <(tr -s '[:space:]' '\n' <"$TEXT" | tr -d '"\\\000-\011\013-\037' | grep -v '^$')
NW=${#WORDS[@]}
[ "$NW" -gt 0 ] || {
    echo "serve_load: no words in $TEXT" >&2
    exit 2
}

# shellcheck disable=SC2086
"$HYLO" serve "$MODEL" --device "$DEVICE" --max-seqs "$STREAMS" --queue "$STREAMS" --ctx "$CTX" --port "$PORT" \
    $SERVE_ARGS >"$OUT/server.log" 2>&1 &
SPID=$!
for _ in $(seq 1200); do # up to 10 minutes to load
    curl -sf "$URL/health" >/dev/null 2>&1 && break
    kill -0 "$SPID" 2>/dev/null || break
    sleep 0.5
done
if ! curl -sf "$URL/health" >/dev/null 2>&1; then
    echo "serve_load: the server did not come up; its log:" >&2
    cat "$OUT/server.log" >&2
    kill -TERM "$SPID" 2>/dev/null
    exit 1
fi
note "# server pid $SPID: $(head -1 "$OUT/server.log")"

HAVE_SMI=0
command -v nvidia-smi >/dev/null 2>&1 && [ "$DEVICE" = cuda ] && HAVE_SMI=1
mem() { # "rss_kib gpu_mib" of the server now
    local rss gpu=-
    rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$SPID/status" 2>/dev/null)
    [ $HAVE_SMI = 1 ] && gpu=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1 | tr -d ' ')
    echo "${rss:-0} $gpu"
}

# Request i of round r: prompt length and max_tokens spread over their ranges
# in a shuffled order (i * 37 mod STREAMS), its words from offset
# i * 997 + r * 7919 (each round other text: no prefix-cache hits from the
# round before).
words_of() { # i -> prompt length in words
    local k=$((($1 * 37) % STREAMS))
    echo $((MIN_WORDS + (MAX_WORDS - MIN_WORDS) * k / (STREAMS > 1 ? STREAMS - 1 : 1)))
}
tok_of() { # i -> max_tokens
    local k=$((($1 * 23 + 5) % STREAMS))
    echo $((MIN_TOK + (MAX_TOK - MIN_TOK) * k / (STREAMS > 1 ? STREAMS - 1 : 1)))
}
prompt_of() { # r i n -> n words starting at word i * 997 + r * 7919 (wrapping)
    local n=$3 j s=$((($2 * 997 + $1 * 7919) % NW)) p=""
    for ((j = 0; j < n; j++)); do
        p+="${WORDS[$(((s + j) % NW))]} "
    done
    echo "Summarise the following text. ${p% }"
}

one() { # r i: one streaming request; prints its tab-separated line
    local r=$1 i=$2 nw mt f w status ttft total fin ntok fin_done err
    nw=$(words_of "$i") mt=$(tok_of "$i") f="$OUT/resp/r${r}_$i.sse"
    w=$(curl -sN -o "$f" -w '%{http_code} %{time_starttransfer} %{time_total}' "$URL/v1/chat/completions" \
        -H 'Content-Type: application/json' \
        -d "{\"messages\":[{\"role\":\"user\",\"content\":\"$(prompt_of "$r" "$i" "$nw")\"}],\"max_tokens\":$mt,\"temperature\":0.7,\"seed\":$i,\"stream\":true,\"stream_options\":{\"include_usage\":true}}")
    read -r status ttft total <<<"$w"
    fin=$(grep -o '"finish_reason":"[a-z_]*"' "$f" | tail -1 | cut -d'"' -f4)
    ntok=$(grep -o '"completion_tokens":[0-9]*' "$f" | tail -1 | cut -d: -f2)
    grep -q '^data: \[DONE\]' "$f" && fin_done=1 || fin_done=0
    grep -q '^data: {"error"' "$f" && err=1 || err=0
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$i" "$nw" "$mt" "$status" "$ttft" "$total" \
        "${fin:--}" "${ntok:-0}" "$fin_done" "$err"
}

printf 'round\treq\tprompt_words\tmax_tokens\tstatus\tttft_s\ttotal_s\tfinish_reason\tcompletion_tokens\tdone\terror_event\n' \
    >"$OUT/requests.tsv"
: >"$OUT/memory.txt"
for r in $(seq "$ROUNDS"); do
    t0=$EPOCHREALTIME
    pids=()
    for i in $(seq 0 $((STREAMS - 1))); do
        one "$r" "$i" >"$OUT/resp/line_${r}_$i" &
        pids+=($!)
    done
    wait "${pids[@]}"
    t1=$EPOCHREALTIME
    for i in $(seq 0 $((STREAMS - 1))); do cat "$OUT/resp/line_${r}_$i"; done >>"$OUT/requests.tsv"
    sleep 1 # let the engine retire the last requests before reading its gauges
    curl -s "$URL/metrics" >"$OUT/metrics_round_$r.txt"
    m=$(mem)
    echo "round $r: rss_kib gpu_mib $m" >>"$OUT/memory.txt"
    [ "$r" = 1 ] && m1=$m
    awk -F'\t' -v r="$r" -v wall="$(awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}')" '
        $1 == r { n++; tok += $9; if ($5 != 200) bad++; else if ($8 == "-" || !$10 || $11) bad++ }
        END { printf "round %d: %d requests, %d failed, %d tokens in %.2f s: %.1f tokens/s aggregate\n",
              r, n, bad, tok, wall, tok / wall }' "$OUT/requests.tsv" | tee -a "$OUT/summary.txt"
done

# Checks and the summary over every request.
nbad=$(awk -F'\t' 'NR > 1 && ($5 != 200 || $8 == "-" || !$10 || $11)' "$OUT/requests.tsv" | wc -l)
nreq=$(($(wc -l <"$OUT/requests.tsv") - 1))
[ "$nreq" = $((STREAMS * ROUNDS)) ] || bad "$nreq request lines, expected $((STREAMS * ROUNDS))"
[ "$nbad" = 0 ] || bad "$nbad request(s) without 200 + finish_reason + [DONE] (requests.tsv)"
pct() { # column p -> the p-th percentile (nearest rank) over every request
    awk -F'\t' -v c="$1" 'NR > 1 {print $c}' "$OUT/requests.tsv" | sort -g |
        awk -v p="$2" '{v[NR] = $1} END {k = int((p * NR + 99) / 100); if (k < 1) k = 1; printf "%.3f", v[k]}'
}
note "requests $nreq, errors $nbad"
note "TTFT s: p50 $(pct 6 50) p90 $(pct 6 90) p99 $(pct 6 99); total latency s: p50 $(pct 7 50) p90 $(pct 7 90)"

# The prefix cache (--prefix-cache-mb, device memory: host RSS on the CPU,
# GPU memory on CUDA) keeps each round's prompts up to its budget: its growth
# (hylo_prefix_cache_bytes) is taken off the growth of its device's memory.
read -r rss1 gpu1 <<<"$m1"
read -r rss2 gpu2 <<<"$(mem)"
gauge() { awk -v g="$2" '$1 == g {printf "%d", $2}' "$OUT/metrics_round_$1.txt"; }
mib() { echo $(($1 / 1048576)); }
pc=$(mib $(($(gauge "$ROUNDS" hylo_prefix_cache_bytes) - $(gauge 1 hylo_prefix_cache_bytes))))
ps=$(($(gauge "$ROUNDS" hylo_prefix_cache_snapshots) - $(gauge 1 hylo_prefix_cache_snapshots)))
psb=$(mib $(($(gauge "$ROUNDS" hylo_prefix_cache_snapshot_bytes) - $(gauge 1 hylo_prefix_cache_snapshot_bytes))))
drss=$(((rss2 - rss1) / 1024)) dgpu=0 gtol=$GPU_TOL_MIB
[ "$gpu1" != - ] && dgpu=$((gpu2 - gpu1))
note "memory after round 1: RSS $((rss1 / 1024)) MiB, GPU ${gpu1} MiB; after round $ROUNDS: RSS $((rss2 / 1024)) MiB, GPU ${gpu2} MiB; prefix cache $pc MiB more, of which snapshots: $ps more, $psb MiB"
if [ "$DEVICE" = cuda ]; then
    dgpu=$((dgpu - psb))
    [ "$ps" -gt 0 ] && gtol=$((gtol + 2 * ps)) # each snapshot's allocation rounded up to 2 MiB
else
    drss=$((drss - pc))
fi
[ "$drss" -le "$RSS_TOL_MIB" ] || bad "RSS grew by $drss MiB beyond the prefix cache (> $RSS_TOL_MIB)"
if [ "$gpu1" != - ] && [ "$dgpu" -gt "$gtol" ]; then
    bad "GPU memory grew by $dgpu MiB beyond the prefix cache's snapshots (> $gtol)"
fi
note "growth beyond the prefix cache: RSS $drss MiB (tolerance $RSS_TOL_MIB), GPU $dgpu MiB (tolerance $gtol)"
for g in hylo_running_sequences hylo_queue_length hylo_cache_bytes; do
    v=$(awk -v g=$g '$1 == g {print $2}' "$OUT/metrics_round_$ROUNDS.txt")
    [ "${v:-x}" = 0 ] || bad "/metrics $g = ${v:-missing} after the last round (expected 0)"
done
note "metrics: $(grep -E '^hylo_(requests_total|generation_tokens_total|prompt_tokens_total)' \
    "$OUT/metrics_round_$ROUNDS.txt" | tr '\n' ' ')"

kill -TERM "$SPID"
wait "$SPID"
rc=$?
[ "$rc" = 0 ] || bad "the server exited with status $rc after SIGTERM"
note "server exit status after SIGTERM: $rc"
rm -f "$OUT"/resp/line_*
if [ $fail = 0 ]; then note "PASS"; else note "FAILED (see above)"; fi
exit $fail
