// hylo: convert a pretrained Transformer into a long-context hybrid, run it,
// compare it with its teacher and serve it over HTTP.
// This file dispatches to the subcommands.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/err.h"
#include "base/parse.h"
#include "cli/cli.h"

static const char *usage =
    "usage: hylo <command> [options]\n"
    "\n"
    "commands:\n"
    "  info PATH         architecture, parameter count, cache bytes per token, tensor dtypes\n"
    "  generate PATH     complete a prompt, streaming tokens as they come\n"
    "  chat PATH         multi-turn chat with the model's chat template\n"
    "  export PATH       write a Hugging Face folder (safetensors, config, tokenizer)\n"
    "  convert           upcycle a teacher into an MLA / GDN / Mamba-2 hybrid\n"
    "  compare T S       KL and top-1 agreement of a student's next-token distributions vs its teacher's\n"
    "  train RECIPE      distil a hybrid from its teacher (stage 1 ILD or stage 2 KD), with exact resume\n"
    "  data              encode training text (txt, jsonl, jsonl.zst, chat) into a token shard\n"
    "  eval PATH         RULER, lm-eval-style short benchmarks and perplexity, with an HTML report\n"
    "  bench PATH        prefill / decode latency and cache memory over a sweep of context lengths\n"
    "  serve PATH        OpenAI-compatible HTTP server (chat / completions, streaming, metrics)\n"
    "\n"
    "PATH is a GGUF file or a Hugging Face / hybrid checkpoint folder.\n"
    "Run 'hylo <command> --help' for the options of a command.\n";

int cli_fail(int rc) {
    fprintf(stderr, "hylo: error: %s\n", err_msg());
    return rc == ERR_INPUT || rc == ERR_UNSUP ? 2 : 1;
}

int cli_usage(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "hylo: error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(see 'hylo %s --help')\n", cmd);
    va_end(ap);
    return 2;
}

int cli_opt(const char *cmd, int argc, char **argv, int *i, const char *name, const char **val) {
    size_t n = strlen(name);
    if (strncmp(argv[*i], name, n)) return 0;
    if (argv[*i][n] == '=') {
        *val = argv[*i] + n + 1;
        return 1;
    }
    if (argv[*i][n] != 0) return 0;
    if (*i + 1 >= argc) return err_set(ERR_INPUT, "%s needs a value (see 'hylo %s --help')", name, cmd);
    *val = argv[++*i];
    return 1;
}

int cli_flag(char **argv, int i, const char *name) { return !strcmp(argv[i], name); }

int cli_int(const char *cmd, const char *name, const char *s, long lo, long hi, long *out) {
    int64_t v;
    if (!parse_int(s, lo, hi, &v))
        return err_set(ERR_INPUT, "%s expects an integer in [%ld, %ld], got '%s' (see 'hylo %s --help')", name, lo, hi,
                       s ? s : "", cmd);
    *out = (long)v;
    return 0;
}

int cli_float(const char *cmd, const char *name, const char *s, double lo, double hi, double *out) {
    if (!parse_double(s, lo, hi, out))
        return err_set(ERR_INPUT, "%s expects a number in [%g, %g], got '%s' (see 'hylo %s --help')", name, lo, hi,
                       s ? s : "", cmd);
    return 0;
}

int cli_wants_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return 1;
    return 0;
}

// Two runtime settings can only be chosen through the environment before the
// libraries load, so hylo sets them and runs itself again once:
//  - OpenBLAS picks its kernels from cpuid; in virtual machines that report a
//    generic CPU it falls back to "Prescott" (SSE3) kernels, 4x slower than the
//    AVX-512 ones on the same machine (measured: 21 vs 83 GFLOP/s).
//  - OpenMP threads spin between parallel regions by default, which on a
//    few shared cores starves whatever else runs (measured when OpenBLAS ran
//    its own threads: decode of SmolLM2 on 2 cores, 2.1 tok/s spinning, 9.3
//    tok/s with passive waiting), except in generate / chat / serve (below).
// An explicit setting in the environment always wins. scripts/run_tests.sh
// applies the same rule to the test binaries (keep the two in step).
char *openblas_get_corename(void);
static void tune_runtime(char **argv) {
    if (getenv("HYLO_TUNED")) return;
    int change = 0;
    if (!getenv("OPENBLAS_CORETYPE") && !strcmp(openblas_get_corename(), "Prescott")) {
        const char *core = __builtin_cpu_supports("avx512f") ? "SkylakeX"
                           : __builtin_cpu_supports("avx2")  ? "Haswell"
                                                             : NULL;
        if (core) setenv("OPENBLAS_CORETYPE", core, 1), change = 1;
    }
    // generate / chat / serve run ~8 parallel regions per layer and token
    // (OpenBLAS runs single-threaded inside them: backend/cpu/cpu.h
    // cpu_sgemm): waking passive threads costs ~40 us per region on this
    // 2-core VM (decode 38 tok/s), spinning ~1 us (92 tok/s). A bounded spin
    // (GOMP_SPINCOUNT pause loops, ~0.1 ms) keeps the threads awake across
    // one token's regions and lets them sleep between user turns. serve
    // gains from it only because its engine runs on the thread that loaded
    // the model (srv_engine_run in serve/engine.h says why).
    const int infer =
        argv[1] && (!strcmp(argv[1], "generate") || !strcmp(argv[1], "chat") || !strcmp(argv[1], "serve"));
    if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT")) {
        if (infer)
            setenv("GOMP_SPINCOUNT", "10000", 1);
        else
            setenv("OMP_WAIT_POLICY", "passive", 1);
        change = 1;
    }
    if (!change) return;
    setenv("HYLO_TUNED", "1", 1);
    execv("/proc/self/exe", argv); // returns only on failure: then run as we are
}

int main(int argc, char **argv) {
    tune_runtime(argv);
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "info")) return cmd_info(argc - 1, argv + 1);
    if (!strcmp(cmd, "generate")) return cmd_generate(argc - 1, argv + 1);
    if (!strcmp(cmd, "chat")) return cmd_chat(argc - 1, argv + 1);
    if (!strcmp(cmd, "export")) return cmd_export(argc - 1, argv + 1);
    if (!strcmp(cmd, "convert")) return cmd_convert(argc - 1, argv + 1);
    if (!strcmp(cmd, "compare")) return cmd_compare(argc - 1, argv + 1);
    if (!strcmp(cmd, "train")) return cmd_train(argc - 1, argv + 1);
    if (!strcmp(cmd, "data")) return cmd_data(argc - 1, argv + 1);
    if (!strcmp(cmd, "eval")) return cmd_eval(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return cmd_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve")) return cmd_serve(argc - 1, argv + 1);
    fprintf(stderr, "hylo: error: unknown command '%s'\n\n%s", cmd, usage);
    return 2;
}
