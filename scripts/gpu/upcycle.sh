#!/usr/bin/env bash
# The first real HyLo model (docs/RESULTS.md, issue 10): SmolLM2-135M-Instruct
# upcycled to 10MLA20GDN on one H200, trained through both stages and
# evaluated against its teacher, within the device limits (10 minutes a call,
# 64 MiB carried a call, the machine given back 30 s after a call: the calls
# run back to back). Here:
#   bash scripts/gpu/upcycle.sh pack      build, corpus (scripts/corpus.sh), fill .carry/
#                                         (a .carry/corpus.tar.xz already there is reused unless CORPUS=DIR)
# then one device call each, in this order:
#   call 1: bash scripts/gpu/upcycle.sh prep     carry .carry/bins.tar.xz .carry/p1 .carry/evaldata.tar.xz
#           (the working tree grows with docs/logs: where the evaluation data no
#           longer fits beside them, carry it in the next call instead, which
#           unpacks it; and .carry/ca when it still fits the 64 MiB; else
#   call 1b: bash scripts/gpu/upcycle.sh ca      carry .carry/ca)
#   call 2: bash scripts/gpu/upcycle.sh stage1   carry .carry/p2 .carry/cb [.carry/chat]
#           (.carry/chat: teacher chat shards sampled beforehand on any machine with
#           hylo data --generate --self-instruct, mixed in beside those made there)
#   call 3: bash scripts/gpu/upcycle.sh stage2   carry .carry/t (the CUDA test binaries)
#   call 4: bash scripts/gpu/upcycle.sh eval
# or, in a lease after prep without trained weights (one call):
#   bash scripts/gpu/upcycle.sh checks   carry .carry/p2 .carry/t2 (CUDA tests, then
#                                        decode speed and kernel profile, latency
#                                        sweep, serve load test of teacher and hybrid;
#                                        CHECKS=decode,... picks some of them)
# or, when one call is all the device time allows after prep:
#   call 2: bash scripts/gpu/upcycle.sh quick    carry .carry/p2 .carry/cb
#           (short stage 1, KD at 2K and 8K, evaluation: docs/logs/run18/quick)
# LINEAR=mamba2 before each call trains and evaluates 10MLA20M2 instead of
# 10MLA20GDN (Mamba-2 as the linear block of the pure-linear student and the hybrid).
# or issue 12's long-context sweep (random weights, one model a call; after prep, or
# carrying .carry/lib beside .carry/t):
#   LONG_MODEL=--teacher bash scripts/gpu/upcycle.sh long   (or --6mla22gdn, --14mla14gdn;
#                                        carry .carry/t unless a call of the lease did)
# and here, afterwards: bash scripts/gpu/upcycle.sh tally DIR... (scores of
# evaluations the time limit stopped, from their per-item files).
# Each of 2-4 returns $OUT/<step>.tar.xz: logs, recipes, metrics, loss plots,
# evaluation results and samples (the weights stay on the machine).
#   stage1: tokenize the corpus; sample chat documents from the teacher
#           (hylo data --generate --self-instruct, batched); the teacher's
#           evaluation; stage 1 (ILD at 2K) of the pure-MLA and the pure-GDN
#           students, side by side on the GPU.
#   stage2: the hybrid assembled by the layer plan (MLA at every third layer),
#           KD at 2K, then 8K (YaRN factor 4 over 2,048), then 32K (factor 16);
#           meanwhile the untrained and the assembled (ILD-only) hybrids are
#           evaluated, the CUDA tests run, and a short deterministic KD run is
#           killed and resumed (scripts/gpu/resume_check.sh).
#   eval:   latency and cache memory of the KD 8K hybrid against the teacher, then
#           its serve load test (64 streams), each alone on the GPU; then the three
#           KD checkpoints evaluated side by side, with chat answers of every model
#           (DEADLINE=S to end the call sooner when the device time left is short).
# The calls must follow each other within the 30 s the machine stays warm: a
# cold start is a bare machine, and the trained weights are gone with it.
# Training lengths are set in steps from the throughput each stage measured
# before (metrics.jsonl), so that a stage ends inside its time slot with its
# learning-rate schedule complete; a stage that would still overrun is stopped
# by SIGTERM, which saves a checkpoint.
set -uo pipefail
W=/tmp/u
# the linear block of the hybrid and of the pure-linear stage-1 student:
# LINEAR=gdn (10MLA20GDN, the default) or LINEAR=mamba2 (10MLA20M2), the same
# in every call of a lease
LINEAR=${LINEAR:-gdn}
case $LINEAR in
gdn) lin_recipe=gdn ;;
mamba2) lin_recipe=mamba ;;
*) echo "upcycle.sh: LINEAR must be gdn or mamba2 (got '$LINEAR')" >&2; exit 2 ;;
esac
if [ "$1" = tally ]; then
    # Here, on the returned folders: the score of every task whose per-item
    # file (DIR/samples/*.jsonl) is complete, also for an evaluation that the
    # time limit stopped before it wrote result.json (a file still being
    # written has a .hylo-tmp suffix and is left out). MC: acc, acc_norm
    # (WinoGrande: acc in both, as lm-eval reports it and result.json holds);
    # LAMBADA: acc; RULER: mean score. Then, per folder with MC tasks, their
    # averages (the means of the per-task scores).
    shift
    for d in "$@"; do
        for f in "$d"/samples/*.jsonl; do
            [ -f "$f" ] || continue
            awk -v t="$(basename "$f" .jsonl)" -v d="$(basename "$d")" '
                { n++
                  if (match($0, /"acc":[0-9.]+/)) a += substr($0, RSTART + 6, RLENGTH - 6)
                  if (t != "winogrande" && match($0, /"acc_norm":[0-9.]+/)) an += substr($0, RSTART + 11, RLENGTH - 11); else if (match($0, /"acc":[0-9.]+/)) an += substr($0, RSTART + 6, RLENGTH - 6)
                  if (match($0, /"score":[0-9.]+/)) sc += substr($0, RSTART + 8, RLENGTH - 8) }
                END { if (t ~ /^ruler_/) printf "%s %s n=%d score %.1f\n", d, t, n, 100 * sc / n
                      else printf "%s %s n=%d acc %.2f acc_norm %.2f\n", d, t, n, 100 * a / n, 100 * an / n }' "$f"
        done | tee /tmp/tally.$$
        awk '$2 != "lambada_openai" && $4 == "acc" { k++; a += $5; an += $7 }
             END { if (k) printf "%s MC average of %d tasks: acc %.2f acc_norm %.2f\n", $1, k, a / k, an / k }' /tmp/tally.$$
        rm -f /tmp/tally.$$
    done
    exit 0
fi
if [ "$1" = pack ]; then
    set -e
    make -j2 build/hylo build/bench/bench_long build/bench/bench_decode build/bench/bench_attn build/bench/bench_gdn \
        build/bench/bench_cuda_core >/dev/null
    mkdir -p .carry/stage/build .carry/lib .carry/p1 .carry/p2 .carry/ca .carry/cb
    cp build/hylo .carry/stage/build/ && strip .carry/stage/build/hylo
    # the libraries go in the same tarball (prep's carry is near its limit)
    scripts/gpu/carry_libs.sh
    tar cf - -C .carry/stage build -C "$PWD" .carry/lib | xz -6 -T2 > .carry/bins.tar.xz && rm -rf .carry/stage
    # the CUDA tests, run beside stage 2 (scripts/gpu/tests.sh), and bench_long
    # (the first call carries all else it can)
    make -j2 $(ls tests/cuda/*.c | sed 's|^tests/\(.*\)\.c$|build/tests/\1|') \
        build/bench-variants/tests/cuda/test_cuda_attn build/bench-variants/bench/bench_attn \
        build/bench-variants/tests/cuda/test_cuda_gdn build/bench-variants/bench/bench_gdn \
        build/bench-variants/bench/bench_decode build/bench-variants/tests/cuda/test_cuda_core \
        build/bench-variants/bench/bench_cuda_core >/dev/null
    # in two tarballs, so that the first fits one call beside .carry/lib and
    # the working tree (which grows with docs/logs): .carry/t, the production
    # tests and benches and the bench-variants builds of the core ops and
    # decode (kernel_checks.sh's GEMV and MLA_SPLIT); .carry/tv, the
    # bench-variants attention and GDN (VARIANTS, ATTN_DQB), carried when needed
    mkdir -p .carry/stage/build/tests/cuda .carry/stage/build/bench .carry/t .carry/tv \
        .carry/stage/build/bench-variants/tests/cuda .carry/stage/build/bench-variants/bench \
        .carry/stagev/build/bench-variants/tests/cuda .carry/stagev/build/bench-variants/bench &&
        cp build/tests/cuda/test_* .carry/stage/build/tests/cuda/ && strip .carry/stage/build/tests/cuda/test_* &&
        for f in bench/bench_decode tests/cuda/test_cuda_core bench/bench_cuda_core; do
            cp build/bench-variants/$f .carry/stage/build/bench-variants/$f && strip .carry/stage/build/bench-variants/$f
        done &&
        for f in tests/cuda/test_cuda_attn bench/bench_attn tests/cuda/test_cuda_gdn bench/bench_gdn; do
            cp build/bench-variants/$f .carry/stagev/build/bench-variants/$f &&
                strip .carry/stagev/build/bench-variants/$f
        done &&
        for b in bench_long bench_decode bench_attn bench_gdn bench_cuda_core; do
            cp build/bench/$b .carry/stage/build/bench/ && strip .carry/stage/build/bench/$b || exit 1
        done
    tar cf - -C .carry/stage build | xz -6 -T2 > .carry/t/tests.tar.xz && rm -rf .carry/stage
    tar cf - -C .carry/stagev build | xz -6 -T2 > .carry/tv/variants.tar.xz && rm -rf .carry/stagev
    model=$(scripts/fetch_model.sh) half=$(( ($(stat -c %s "$model") + 1) / 2 ))
    head -c $half "$model" > .carry/p1/gguf.part && tail -c +$((half + 1)) "$model" > .carry/p2/gguf.part
    tar cf - -C .. shared/data/eval shared/data/essays shared/data/words | xz -6 -T2 > .carry/evaldata.tar.xz
    # the corpus: built (or taken from CORPUS=DIR) and compressed, unless a
    # compressed one is already here and CORPUS is not given
    if [ -n "${CORPUS:-}" ] || [ ! -f .carry/corpus.tar.xz ]; then
        corpus=${CORPUS:-.carry/corpus}
        [ -d "$corpus" ] || scripts/corpus.sh "$corpus" ../shared/data
        tar cf - -C "$corpus" . | xz -9e -T2 > .carry/corpus.tar.xz
    fi
    n=$(stat -c %s .carry/corpus.tar.xz)
    head -c $((n * 35 / 100)) .carry/corpus.tar.xz > .carry/ca/part && tail -c +$((n * 35 / 100 + 1)) .carry/corpus.tar.xz > .carry/cb/part
    du -sh .carry/*
    exit 0
fi
if [ "$1" = prep ]; then
    rm -rf $W && mkdir -p $W/out
    tar xJf .carry/bins.tar.xz && cp .carry/p1/gguf.part $W/p1 && cp -r .carry/lib $W/lib || exit 1
    # the evaluation data, when it fits this call's carry (else a later call
    # carries .carry/evaldata.tar.xz: unpack_evaldata below)
    [ -f .carry/evaldata.tar.xz ] && tar xJf .carry/evaldata.tar.xz -C $W && mv $W/shared/data $W/data
    # the corpus's first part, when it fits this call's carry (the working
    # tree grows with docs/logs: else carry it in a call of its own, `ca`)
    [ -f .carry/ca/part ] && cp .carry/ca/part $W/ca
    LD_LIBRARY_PATH=$W/lib:/usr/local/cuda/lib64 ldd build/hylo | grep "not found"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    ls -la $W
    exit 0
fi
if [ "$1" = ca ]; then # the corpus's first part alone (carry .carry/ca), between prep and stage1
    cp .carry/ca/part $W/ca && ls -la $W/ca
    exit $?
fi
# $W/lib after prep; .carry/lib where a call carries it without prep (long)
export LD_LIBRARY_PATH=$W/lib:$PWD/.carry/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
H=$PWD/build/hylo D=$W/data M=$W/smol.gguf O=$W/out/$1
# the evaluation data (essays, evaluation sets, word lists), from whichever
# call of the lease carried .carry/evaldata.tar.xz
if [ ! -d $D ] && [ -f .carry/evaldata.tar.xz ]; then
    tar xJf .carry/evaldata.tar.xz -C $W && mv $W/shared/data $D
fi
mkdir -p "$O"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$O/gpu.txt"
T0=$(date +%s)
since() { echo $(( $(date +%s) - T0 )); }
DEADLINE=${DEADLINE:-540} # every step ends by then, so the call returns inside its 10 minutes
step() { # name, timeout (s), command...: logged to $O/name.log with its exit status and time
    local name=$1 t=$2; shift 2
    local left=$((DEADLINE - $(since)))
    [ $t -lt $left ] || t=$left
    [ $t -gt 5 ] || { echo "$name: skipped (no time left)"; echo "# skipped: no time left" > "$O/$name.log"; return; }
    echo "\$ $*" > "$O/$name.log"
    local s=$(date +%s)
    timeout -s TERM -k 20 "$t" "$@" >> "$O/$name.log" 2>&1
    local rc=$?
    echo "# exit $rc after $(( $(date +%s) - s )) s (started at +$(( s - T0 )) s)" >> "$O/$name.log"
    echo "$name: exit $rc, $(( $(date +%s) - s )) s"
}
# tokens/s of the last logged step of a run (0 when none)
tps() { tail -n 1 "$1/metrics.jsonl" 2>/dev/null | sed -n 's/.*"tokens_per_s": *\([0-9.]*\).*/\1/p' | cut -d. -f1 | grep . || echo 0; }
# steps of `tokens` tokens that fit in `seconds` at `rate` tokens/s, at least lo, at most hi
fit() { local s=$(( $2 * $3 / $1 )); [ $s -lt $4 ] && s=$4; [ $s -gt $5 ] && s=$5; echo $s; }
recipe() { # file, then key: value lines
    local f=$1; shift
    printf '%s\n' "$@" > "$f"
}
# The quality measurements of one model (teacher or student), into $O/ev_NAME*:
# next-token KL / top-1 against the teacher on the essays, perplexity, the
# multiple-choice sets and LAMBADA (first 500 items each), needle retrieval
# from 2K to 32K, and three chat answers.
evaluate() { # name, model folder or GGUF
    local n=$1 p=$2
    [ "$p" = "$M" ] || step ev_${n}_compare 200 $H compare $M "$p" --device cuda --text $D/essays --windows 32 --tokens 1024 &
    step ev_${n}_short 300 $H eval "$p" --task mc,lambada_openai,ppl --limit 500 --device cuda --data $D --out $O/ev_${n}_short &
    step ev_${n}_niah 300 $H eval "$p" --task niah_single_1,niah_single_2,niah_multikey_1,niah_multivalue \
        --lengths 2K,4K,8K,16K,32K --samples ${NIAH_SAMPLES:-20} --device cuda --chunk 8192 --data $D --out $O/ev_${n}_niah &
    for q in "What is the capital of France?" "Write a haiku about the sea." "Explain in two sentences what a hash table is."; do
        echo "## $q"
        timeout 60 $H chat "$p" --prompt "$q" -n 96 --temp 0 --device cuda 2>&1
        echo
    done > "$O/ev_${n}_chat.txt"
    wait
}
assemble() { # GGUF halves -> $M, checked against the sha256 fetch_model.sh holds
    [ -f $M ] && return
    sha=$(sed -n 's/^sha="\([0-9a-f]*\)"$/\1/p' scripts/fetch_model.sh)
    cat $W/p1 .carry/p2/gguf.part > $M.part
    echo "$sha  $M.part" | sha256sum -c --quiet - && mv $M.part $M || echo "GGUF halves do not match" >&2
}
# the CUDA tests against the CPU ops, from a carried tarball of test binaries
cuda_tests() { # tarball
    [ -f "$1" ] && (tar xJf "$1" && mkdir -p $O/tests &&
        OUT=$O/tests HYLO_MODEL=$M FIXTURES=0 TEST_TIMEOUT=200 bash scripts/gpu/tests.sh) > $O/tests.txt 2>&1
}
# issue 12's load test: 64 streaming requests of mixed lengths against a model
# (fewer streams: throughput only. With 1-16 requests a round, round 2 brings
# request shapes round 1 did not, so the run arena and the recorded decode
# steps still grow: 2-19 MiB of GPU memory on an H100, 2026-12-06. The leak
# check is the 64-stream run's, whose first round covers the shapes.)
serve_load() { # name, model[, timeout (s)[, streams (default 64)]]
    [ -s $W/essays.txt ] || cat $D/essays/*.txt > $W/essays.txt ||
        { echo "serve_load_$1: no essays in $D (carry .carry/evaldata.tar.xz in this call or an earlier one of the lease)"; return; }
    local tol=0
    [ ${4:-64} -ge 64 ] || tol=1024
    step serve_load_$1 ${3:-200} env HYLO=$H DEVICE=cuda STREAMS=${4:-64} ROUNDS=2 OUT=$O/serve_load_$1 \
        GPU_TOL_MIB=$tol SERVE_ARGS="--max-seqs 64" bash scripts/gpu/serve_load.sh $2 $W/essays.txt
}
# issue 12: single-stream greedy decode of a model (tokens/s from --stats),
# and with a third argument `ncu` the kernels of 24 decode tokens under Nsight
# Compute (their GPU times; run 21's extra/ncu_*.csv), each alone on the GPU
decode_speed() { # name, model[, ncu]
    step gen_$1 40 $H generate $2 --prompt "The history of the city begins" -n 256 --temp 0 --device cuda --stats
    [ "${3:-}" = ncu ] && [ -x /usr/local/cuda/bin/ncu ] || return 0
    step ncu_$1 60 sh -c "/usr/local/cuda/bin/ncu --metrics gpu__time_duration.sum --csv --launch-skip 1500 \
        --launch-count 700 $H generate $2 --prompt 'The history of the city begins' -n 24 --temp 0 --device cuda \
        > $O/ncu_$1.csv"
}
mla=$(seq -s, 0 3 29)
# the corpus carried in two parts (ca, cb), unpacked; shards go to mix/ (the
# documentation) and chat/ (the teacher's samples)
unpack_corpus() {
    mkdir -p $W/corpus $W/mix $W/chat
    cat $W/ca .carry/cb/part | xz -d | tar xf - -C $W/corpus
}
# stage 1 of the pure-MLA and the pure-GDN students at 2K, side by side
ild() { # steps, save_steps, timeout (s)
    for s in mla $LINEAR; do
        if [ $s = mla ]; then layers="[$(seq -s, 0 29)]"; else layers="[]"; fi
        recipe $W/ild_$s.yaml "model_name_or_path: $M" "teacher_model_name_or_path: $M" "linear_type: $lin_recipe" \
            "mla_layers: $layers" "ILD: true" "max_seq_length: 2048" "per_device_train_batch_size: 16" \
            "gradient_accumulation_steps: 1" "learning_rate: 1.0e-3" "warmup_ratio: 0.05" "max_steps: $1" \
            "dataset_mixer:" "  $W/mix/docs.shard: 1.0" "output_dir: $W/ild_$s" "save_steps: $2" \
            "save_total_limit: 1" "logging_steps: 10" "device: cuda" "seed: 42"
        step ild_$s $3 $H train $W/ild_$s.yaml &
    done
    wait
}
# stage 2's first student: the hybrid assembled from both stage-1 results
from_ild="model_name_or_path: $M
mla_ILD_path: $W/ild_mla/final
linear_ILD_path: $W/ild_$LINEAR/final"
# the teacher's chat samples, when any shard was written, weighted 2 (each
# sample twice per epoch beside the documentation)
chat_entry=()
ls $W/chat/*.shard > /dev/null 2>&1 && chat_entry=("  $W/chat: 2.0")
kd() { # name, T, rows, lr, factor, init lines..., seconds
    local n=$1 T=$2 rows=$3 lr=$4 f=$5 init=$6 secs=$7 ce=${8:-0.0}
    local steps=$(fit $((T * rows)) $secs $rate 20 3000)
    recipe $W/$n.yaml "$init" "teacher_model_name_or_path: $M" "linear_type: $lin_recipe" "mla_layers: [$mla]" \
        "ILD: false" "max_seq_length: $T" "per_device_train_batch_size: $rows" "gradient_accumulation_steps: 1" \
        "learning_rate: $lr" "warmup_ratio: 0.03" "max_steps: $steps" "factor: $f" \
        "original_max_position_embeddings: 2048" "kl_weight: 1.0" "ce_weight: $ce" "gradient_checkpointing: true" \
        "dataset_mixer:" "  $W/mix: 1.0" "${chat_entry[@]}" "output_dir: $W/$n" "save_steps: 1000000" "save_total_limit: 1" \
        "logging_steps: 10" "device: cuda" "seed: 42"
    step $n $((secs + 60)) $H train $W/$n.yaml
    rate=$(tps $W/$n)
    [ "$rate" -gt 0 ] || rate=50000
    rate=$((rate * 80 / 100)) # longer rows run slower
}
case $1 in
stage1)
    assemble
    unpack_corpus
    cp .carry/chat/*.shard $W/chat/ 2>/dev/null
    cp $W/corpus/SOURCES.tsv $W/corpus/OVERLAP.log "$O/" 2>/dev/null
    step data 120 $H data --tokenizer $M --out $W/mix/docs.shard --threads 16 $W/corpus
    # chat documents sampled from the teacher, 1,024 a shard, while the slot
    # lasts and at most CHAT_SHARDS shards (up to 448 new tokens a document;
    # weighted 2 in KD beside the 25.7M tokens of documentation)
    (
        k=0
        while [ $(since) -lt 300 ] && [ $k -lt ${CHAT_SHARDS:-8} ]; do
            step chat_$k 150 $H data --generate 1024 --batch 512 --self-instruct -n 448 --ctx 640 --temp 0.7 \
                --seed $((1 + 1024 * k)) --device cuda --model $M --out $W/chat/chat_$k.shard
            k=$((k + 1))
        done
    ) > $O/chat_gen.txt 2>&1 &
    (evaluate teacher $M) > $O/ev_teacher.txt 2>&1 &
    # the issue-9 scorer check: every ARC-Easy and PIQA item against transformers
    (
        step ev_teacher_agree_mc 280 $H eval $M --task arc_easy,piqa --device cuda --data $D --out $O/ev_teacher_agree
        $H export $M --out $W/smol_hf > /dev/null 2>&1
        step agree 120 python3 scripts/ref/mc_agree.py $W/smol_hf $D $O/ev_teacher_agree/samples arc_easy piqa --device cuda
        step agree_bf16 120 python3 scripts/ref/mc_agree.py $W/smol_hf $D $O/ev_teacher_agree/samples arc_easy piqa \
            --device cuda --dtype bfloat16
    ) > $O/agree.txt 2>&1 &
    ild 450 150 380
    ;;
stage2)
    mkdir -p $W/kd
    # the teacher samples' share of the mixture, and their text, for the record
    for f in $(ls $W/chat/*.shard 2>/dev/null | head -2); do
        $H data --show 3 --tokenizer $M $f
    done > $O/chat_samples.txt 2>&1
    ls -la $W/mix $W/chat > $O/mix.txt
    rate=$(tps $W/ild_mla) # ILD's rate stands in for KD's before KD has run
    [ "$rate" -gt 0 ] || rate=100000
    # untrained hybrid of the same layout, for the table
    step convert 60 $H convert --teacher $M --out $W/untrained --mla-every 3 --linear $LINEAR
    # issue 8: kill -9 and --resume give the same losses on the GPU (deterministic: true)
    step resume_check 150 bash scripts/gpu/resume_check.sh $H $M $W/untrained $W/mix $W/resume_check cuda &
    cuda_tests .carry/t/tests.tar.xz & # beside the training
    (evaluate untrained $W/untrained) > $O/ev_untrained.txt 2>&1 &
    kd kd2k 2048 16 3.0e-4 1.0 "$from_ild" 170
    (evaluate ild $W/kd2k/init) > $O/ev_ild.txt 2>&1 &
    kd kd8k 8192 4 1.5e-4 4.0 "model_name_or_path: $W/kd2k/final" 130
    kd kd32k 32768 1 1.0e-4 16.0 "model_name_or_path: $W/kd8k/final" 130 0.5
    wait
    ;;
quick)
    # everything after prep in one call, when the device time left allows no
    # more: a short stage 1, KD at 2K and 8K, the evaluation of both results
    DEADLINE=${QUICK_DEADLINE:-380}
    assemble
    unpack_corpus
    step data 60 $H data --tokenizer $M --out $W/mix/docs.shard --threads 16 $W/corpus
    ild ${ILD_STEPS:-200} 100000 130
    rate=$(tps $W/ild_$LINEAR)
    [ "$rate" -gt 0 ] || rate=60000
    kd kd2k 2048 16 3.0e-4 1.0 "$from_ild" ${KD2K_S:-80}
    NIAH_SAMPLES=${NIAH_SAMPLES:-10}
    (evaluate ild $W/kd2k/init) > $O/ev_ild.txt 2>&1 &
    kd kd8k 8192 4 1.5e-4 4.0 "model_name_or_path: $W/kd2k/final" ${KD8K_S:-40}
    evaluate kd8k $W/kd8k/final > $O/ev_kd8k.txt 2>&1
    wait
    ;;
checks)
    # a lease without trained weights (after prep; carry .carry/p2 and .carry/t2,
    # the test binaries rebuilt since pack, else .carry/t): the CUDA tests,
    # then, each alone on the GPU, single-stream decode speed and kernel
    # profile of the teacher and of its untrained hybrid, their latency sweep,
    # and the serve load test of both. CHECKS=tests,decode,bench,serve (the
    # default) picks among them, e.g. CHECKS=decode after another phase's tests;
    # CHECKS=concurrency (not in the default) runs the hybrid's load test at 1,
    # 4, 16 and 64 streams; CHECKS=prefix (not in the default) times a 32K-token chat's second turn
    # with and without the prefix cache (scripts/bench_prefix.sh);
    # CHECKS=variants (not in the default) runs the bench-variants build's
    # test_cuda_attn and bench_attn --compare --quick --no-decode, then its
    # test_cuda_gdn and bench_gdn --compare (GDN's state passes on mma.sync
    # against the production wgmma ones);
    # CHECKS=profile_long (not in the default) profiles the 3B hybrid's decode
    # kernels at 8K-128K (Nsight Compute); CHECKS=fla (not in the default, a
    # call of its own, with .carry/fla) times FLA's GDN chunk at 8K and 64K;
    # CHECKS=nccl (not in the default) runs scripts/gpu/nccl_check.sh;
    # CHECKS=serve_base (not in the default) runs the hybrid's load test with
    # this build and with the older build .carry/sb/hylo.xz;
    # CHECKS=kernels (not in the default) times decode attention against a
    # device copy (bench_decode), attention against PyTorch SDPA's cuDNN and
    # flash backends (bench_attn with scripts/ref/bench_sdpa.py) and, when
    # .carry/fla (a folder holding FLA's fla package, e.g. the fla-core wheel
    # unzipped) is carried, the GDN chunk against FLA eager and by its kernel
    # sum (bench_gdn with scripts/ref/bench_fla_gdn.py), all --quick.
    DEADLINE=${CHECKS_DEADLINE:-540}
    CHECKS=,${CHECKS:-tests,decode,bench,serve},
    assemble
    U=$W/untrained_$LINEAR
    [ -d $U ] || step convert 60 $H convert --teacher $M --out $U --mla-every 3 --linear $LINEAR
    t=.carry/t2/tests.tar.xz
    [ -f $t ] || t=.carry/t/tests.tar.xz
    case $CHECKS in *,tests,*) cuda_tests $t ;; esac
    case $CHECKS in *,decode,*) decode_speed teacher $M ncu; decode_speed untrained_$LINEAR $U ncu ;; esac
    case $CHECKS in *,bench,*) step bench 90 $H bench $U --against $M --lengths 2K,8K,32K --decode 64 --device cuda \
        --chunk 8192 --out $O/bench ;; esac
    case $CHECKS in *,serve,*) serve_load teacher $M 110; serve_load untrained_$LINEAR $U 110 ;; esac
    # the hybrid's load test by this build and by an older one
    # (.carry/sb/hylo.xz, carried with this call) on the same machine
    case $CHECKS in *,serve_base,*)
        serve_load untrained_$LINEAR $U 110
        xz -dkf .carry/sb/hylo.xz && H=$PWD/.carry/sb/hylo serve_load base_untrained_$LINEAR $U 110 ;;
    esac
    # aggregate throughput and latency against concurrency (the hybrid)
    case $CHECKS in *,concurrency,*)
        for n in 1 4 16 64; do
            serve_load conc${n}_untrained_$LINEAR $U 100 $n
        done ;;
    esac
    # issue 12's prefix-cache target: the second turn of a 32K-token chat (an
    # untrained hybrid with YaRN 16 on its MLA RoPE: timing only)
    case $CHECKS in *,prefix,*)
        [ -d $U.32k ] || step convert32k 60 $H convert --teacher $M --out $U.32k --mla-every 3 --linear $LINEAR \
            --yarn-factor 16 --yarn-orig 2048
        step prefix 200 env MODEL=$U.32k SERVE_ARGS="--device cuda --ctx 32768" PREFIX_MB=4096 \
            bash scripts/bench_prefix.sh $H 3 22000 ;;
    esac
    # the 3B hybrid's decode kernels at 8K, 32K and 128K under Nsight Compute
    # (why its decode grows with the context, run 23; bench_long from $t)
    case $CHECKS in *,profile_long,*)
        [ -x build/bench/bench_long ] || tar xJf $t
        step profile_long 300 sh -c "/usr/local/cuda/bin/ncu --kernel-name \
            regex:'k_gemv|k_recurrent|k_step_inputs|k_mla|k_gnorm|k_rmsnorm|k_embed|k_bf16|nvjet' \
            --metrics gpu__time_duration.sum --csv build/bench/bench_long --6mla22gdn --upto128k \
            > $O/ncu_long.csv" ;;
    esac
    # FLA's GDN chunk alone (Triton's autotuning takes minutes: run 23's 200 s
    # inside the kernels step did not finish the first shape)
    # issue 14: the NCCL path over one rank against a plain run (identical
    # losses, tokens/s of both; scripts/gpu/nccl_check.sh)
    case $CHECKS in *,nccl,*)
        [ -f $W/docs.shard ] || step data_docs 60 $H data --tokenizer $M --out $W/docs.shard docs
        step nccl 200 bash scripts/gpu/nccl_check.sh $H $M $U $W/docs.shard $O/nccl cuda ;;
    esac
    case $CHECKS in *,fla,*)
        [ -d .carry/fla ] && step bench_fla_full 520 python3 scripts/ref/bench_fla_gdn.py --fla .carry/fla ;;
    esac
    # the bench-only kernel variants (the wgmma attention forward, the wgmma
    # GDN state passes): their CUDA tests against the CPU, then every variant
    # timed (attention at 8K; GDN at 8K and 64K, default vs HYLO_GDN_STATE=1)
    case $CHECKS in *,variants,*)
        [ -x build/bench-variants/tests/cuda/test_cuda_attn ] && [ -x build/bench-variants/tests/cuda/test_cuda_gdn ] ||
            tar xJf $t
        step variants_test 200 env HYLO_REQUIRE_GPU=1 build/bench-variants/tests/cuda/test_cuda_attn
        step variants_bench 150 build/bench-variants/bench/bench_attn --compare --quick --no-decode
        step variants_gdn_test 200 env HYLO_REQUIRE_GPU=1 build/bench-variants/tests/cuda/test_cuda_gdn
        step variants_gdn_bench 120 build/bench-variants/bench/bench_gdn --compare ;;
    esac
    case $CHECKS in *,kernels,*)
        [ -x build/bench/bench_decode ] || tar xJf $t
        step bench_decode 150 build/bench/bench_decode --quick
        step bench_attn 150 build/bench/bench_attn --quick
        step bench_sdpa 150 python3 scripts/ref/bench_sdpa.py --quick
        step bench_gdn 120 build/bench/bench_gdn --quick
        [ -d .carry/fla ] && step bench_fla 200 python3 scripts/ref/bench_fla_gdn.py --fla .carry/fla --quick ;;
    esac
    ;;
long)
    # issue 12's long-context sweep at the HyLo-Llama-3B shapes with random
    # weights (bench/bench_long.c, from .carry/t; after prep), one model
    # a call: LONG_MODEL=--teacher, --6mla22gdn (default) or --14mla14gdn,
    # LONG_ARGS="--2m" adds 2M tokens
    [ -x build/bench/bench_long ] || tar xJf .carry/t/tests.tar.xz
    step bench_long 560 build/bench/bench_long ${LONG_MODEL:---6mla22gdn} ${LONG_ARGS:-}
    ;;
eval)
    # the speed figures first, each alone on the GPU: latency and cache
    # memory of the distilled hybrid against the teacher (single-stream
    # decode), then the serve load test of the hybrid; then the three KD
    # checkpoints' evaluations side by side until DEADLINE
    step bench 90 $H bench $W/kd8k/final --against $M --lengths 2K,8K,32K --decode 64 --device cuda --chunk 8192 \
        --out $O/bench
    decode_speed kd8k $W/kd8k/final
    decode_speed teacher $M
    serve_load kd8k $W/kd8k/final 110
    NIAH_SAMPLES=${NIAH_SAMPLES:-10}
    (evaluate kd2k $W/kd2k/final) > $O/ev_kd2k.txt 2>&1 &
    (evaluate kd8k $W/kd8k/final) > $O/ev_kd8k.txt 2>&1 &
    (evaluate kd32k $W/kd32k/final) > $O/ev_kd32k.txt 2>&1 &
    wait
    ;;
esac
for r in $W/ild_mla $W/ild_$LINEAR $W/kd2k $W/kd8k $W/kd32k; do
    [ "$1" != prep ] || break
    [ $r/metrics.jsonl -nt "$O/gpu.txt" ] || continue # trained in this call (gpu.txt: its start)
    n=$(basename $r)
    mkdir -p $O/train && cp $r/metrics.jsonl $O/train/$n.metrics.jsonl 2>/dev/null
    cp $r/loss.svg $O/train/$n.loss.svg 2>/dev/null
    cp $W/$n.yaml $O/train/ 2>/dev/null
done
echo "total $(since) s"
# logs and figures only: weights and token shards stay on the machine (run
# 31's checks archive took nccl_check's checkpoints, 3 GB of xz and the rest of the call)
tar cJf "$OUT/$1.tar.xz" --exclude='*.safetensors' --exclude='*.shard' --exclude='*.gguf' -C $W/out "$1"
ls -la "$OUT"
