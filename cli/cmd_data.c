// hylo data: training text -> token shard (train/corpus.h), or documents
// sampled from a teacher (--generate: offline sequence-level KD data).
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/fs.h"
#include "base/log.h"
#include "base/timer.h"
#include "base/utf8.h"
#include "cli/cli.h"
#include "infer/gen.h"
#include "io/weights.h"
#include "model/model.h"
#include "tok/tok.h"
#include "train/corpus.h"
#include "train/shard.h"

static const char *help = "usage: hylo data --tokenizer PATH --out FILE.shard [options] INPUT...\n"
                          "       hylo data --generate N --model PATH --out FILE.shard [options]\n"
                          "\n"
                          "Encodes training text into a token shard for hylo's trainer (format in\n"
                          "docs/FORMATS.md). PATH is a GGUF file or a checkpoint folder; only its\n"
                          "tokenizer is loaded. INPUT: .txt (the whole file is one document), .jsonl or\n"
                          ".jsonl.zst with one object per line, {\"text\": ...} (special tokens in the\n"
                          "text are NOT parsed) or {\"messages\": [{\"role\": ..., \"content\": ...}, ...]}\n"
                          "(rendered with the chat template, special tokens parsed); a folder: every such\n"
                          "file under it, sorted. Every document is followed by the EOS token. Documents\n"
                          "keep their input order whatever the thread count.\n"
                          "A malformed line is reported as FILE:LINE: what is wrong, and skipped.\n"
                          "\n"
                          "options:\n"
                          "  --tokenizer PATH   the model whose tokenizer encodes (weights are not read)\n"
                          "  --out FILE         the shard to write (appears only when complete)\n"
                          "  --split-lines      .txt: one document per line that is not blank\n"
                          "  --assistant-only   conversations: loss only on assistant content and its\n"
                          "                     end-of-turn token (default: every token)\n"
                          "  --strict           a malformed line is an error instead of a skip\n"
                          "  --threads N        encoding threads (default: all cores)\n"
                          "\n"
                          "--generate N: N documents sampled from the model itself, each a rendered user\n"
                          "prompt, the model's answer and its end-of-turn token (when it stopped within -n):\n"
                          "  --model PATH       the teacher (GGUF or checkpoint folder)\n"
                          "  --prompts FILE     one user message per line (default: 8 built-in prompts);\n"
                          "                     document i answers prompt i mod the number of prompts\n"
                          "  -n N               new tokens per document at most (default 512)\n"
                          "  --temp T           temperature (default 1)\n"
                          "  --top-k K, --top-p P   as for 'hylo generate' (default off)\n"
                          "  --seed S           document i is sampled with seed S + i (default 1)\n"
                          "  --ctx N            context capacity (default 4096)\n"
                          "  --device D         cpu or cuda (default cpu)\n"
                          "  --assistant-only   loss only on the answer and its end-of-turn token\n";

static const char *builtin_prompts[] = {
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how photosynthesis works in simple terms.",
    "What are some good habits for learning a new language?",
    "Give me a recipe for a simple vegetable soup.",
    "Summarise the main causes of the French Revolution.",
    "How does a computer store numbers in memory?",
    "Write a polite email asking a colleague to move a meeting to next week.",
    "What should someone consider before adopting a dog?",
};

typedef struct {
    const char *tokenizer, *out, *model, *prompts, *device;
    long generate, n, top_k, seed, ctx, threads;
    double temp, top_p;
    int split_lines, assistant_only, strict;
    const char **inputs;
    int n_inputs;
} data_opts_t;

static int parse(int argc, char **argv, data_opts_t *o) {
    o->n = 512, o->seed = 1, o->ctx = 4096, o->temp = 1, o->top_p = 1, o->device = "cpu", o->generate = -1;
    o->inputs = calloc((size_t)argc, sizeof *o->inputs);
    if (!o->inputs) return err_set(ERR_NOMEM, "out of memory");
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        int r;
        if ((r = cli_opt("data", argc, argv, &i, "--tokenizer", &v))) {
            TRY(r);
            o->tokenizer = v;
        } else if ((r = cli_opt("data", argc, argv, &i, "--out", &v))) {
            TRY(r);
            o->out = v;
        } else if ((r = cli_opt("data", argc, argv, &i, "--model", &v))) {
            TRY(r);
            o->model = v;
        } else if ((r = cli_opt("data", argc, argv, &i, "--prompts", &v))) {
            TRY(r);
            o->prompts = v;
        } else if ((r = cli_opt("data", argc, argv, &i, "--device", &v))) {
            TRY(r);
            o->device = v;
        } else if ((r = cli_opt("data", argc, argv, &i, "--generate", &v))) {
            TRY(r);
            TRY(cli_int("data", "--generate", v, 1, 1L << 30, &o->generate));
        } else if ((r = cli_opt("data", argc, argv, &i, "-n", &v))) {
            TRY(r);
            TRY(cli_int("data", "-n", v, 1, 1 << 24, &o->n));
        } else if ((r = cli_opt("data", argc, argv, &i, "--top-k", &v))) {
            TRY(r);
            TRY(cli_int("data", "--top-k", v, 0, 1 << 24, &o->top_k));
        } else if ((r = cli_opt("data", argc, argv, &i, "--seed", &v))) {
            TRY(r);
            TRY(cli_int("data", "--seed", v, 0, 0x7fffffffL, &o->seed));
        } else if ((r = cli_opt("data", argc, argv, &i, "--ctx", &v))) {
            TRY(r);
            TRY(cli_int("data", "--ctx", v, 16, 1 << 30, &o->ctx));
        } else if ((r = cli_opt("data", argc, argv, &i, "--threads", &v))) {
            TRY(r);
            TRY(cli_int("data", "--threads", v, 1, 1024, &o->threads));
        } else if ((r = cli_opt("data", argc, argv, &i, "--temp", &v))) {
            TRY(r);
            TRY(cli_float("data", "--temp", v, 0, 100, &o->temp));
        } else if ((r = cli_opt("data", argc, argv, &i, "--top-p", &v))) {
            TRY(r);
            TRY(cli_float("data", "--top-p", v, 1e-6, 1, &o->top_p));
        } else if (cli_flag(argv, i, "--split-lines")) {
            o->split_lines = 1;
        } else if (cli_flag(argv, i, "--assistant-only")) {
            o->assistant_only = 1;
        } else if (cli_flag(argv, i, "--strict")) {
            o->strict = 1;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return cli_usage("data", "unknown option '%s'", argv[i]);
        } else {
            o->inputs[o->n_inputs++] = argv[i];
        }
    }
    if (!o->out) return cli_usage("data", "missing --out FILE.shard");
    if (o->generate > 0) {
        if (!o->model) return cli_usage("data", "--generate needs --model PATH (the teacher)");
        if (o->tokenizer) return cli_usage("data", "--generate uses the model's own tokenizer; drop --tokenizer");
        if (o->n_inputs) return cli_usage("data", "--generate takes no INPUT files (got '%s')", o->inputs[0]);
        if (o->split_lines || o->strict) return cli_usage("data", "--split-lines and --strict apply to INPUT files");
    } else {
        if (o->model || o->prompts) return cli_usage("data", "--model and --prompts go with --generate N");
        if (!o->tokenizer) return cli_usage("data", "missing --tokenizer PATH (a GGUF file or a checkpoint folder)");
        if (!o->n_inputs) return cli_usage("data", "missing INPUT files or folders");
    }
    if (o->threads) omp_set_num_threads((int)o->threads);
    return 0;
}

static int load_tokenizer(const char *path, tok_t *tok) {
    arch_t a;
    wsrc_t *src;
    TRY(wsrc_open(&src, path, &a));
    int rc = cli_load_tokenizer(src, tok);
    wsrc_close(src);
    return rc;
}

static int run_encode(const data_opts_t *o) {
    tok_t tok = {0};
    int rc = load_tokenizer(o->tokenizer, &tok);
    data_build_cfg_t cfg = {.split_lines = o->split_lines,
                            .assistant_only = o->assistant_only,
                            .strict = o->strict,
                            .threads = (int)o->threads};
    data_build_stats_t st;
    if (rc == 0) rc = data_build(o->out, &tok, o->inputs, o->n_inputs, &cfg, &st);
    if (rc == 0) {
        double s = st.seconds > 0 ? st.seconds : 1e-9;
        printf("hylo: wrote %s: %lld documents from %lld files, %lld tokens (%lld in the loss), %lld lines skipped; "
               "%.1f MB of text in %.2f s: %.0f tokens/s, %.2f MB/s, %d threads\n",
               o->out, (long long)st.docs, (long long)st.files, (long long)st.tokens, (long long)st.loss_tokens,
               (long long)st.skipped, st.bytes / 1e6, st.seconds, st.tokens / s, st.bytes / 1e6 / s,
               o->threads ? (int)o->threads : omp_get_max_threads());
    }
    tok_free(&tok);
    return rc;
}

// ---- --generate -------------------------------------------------------------

typedef struct {
    char **v;
    int n;
} prompts_t;

static void prompts_free(prompts_t *p) {
    for (int i = 0; i < p->n; i++)
        free(p->v[i]);
    free(p->v);
}

// One user message per non-blank line of path (valid UTF-8).
static int prompts_read(const char *path, prompts_t *p) {
    memset(p, 0, sizeof *p);
    char *s;
    size_t len;
    TRY(fs_read_all(path, &s, &len));
    size_t bad = utf8_check((const uint8_t *)s, len);
    int rc = 0;
    if (bad < len) rc = err_set(ERR_INPUT, "%s: invalid UTF-8 at byte %zu", path, bad);
    p->v = calloc(len / 2 + 2, sizeof *p->v); // a line takes at least 2 bytes with its newline
    if (rc == 0 && !p->v) rc = err_set(ERR_NOMEM, "out of memory");
    for (char *line = s; rc == 0 && line < s + len;) {
        char *nl = memchr(line, '\n', (size_t)(s + len - line));
        size_t n = nl ? (size_t)(nl - line) : (size_t)(s + len - line);
        size_t k = n;
        while (k > 0 && (line[k - 1] == '\r' || line[k - 1] == ' ' || line[k - 1] == '\t'))
            k--;
        if (k > 0 && !(p->v[p->n++] = strndup(line, k))) rc = err_set(ERR_NOMEM, "out of memory");
        line += n + 1;
    }
    free(s);
    if (rc == 0 && p->n == 0) rc = err_set(ERR_INPUT, "%s: no prompts (every line is blank)", path);
    if (rc < 0) prompts_free(p);
    return rc;
}

typedef struct {
    int32_t *ids;
    int n, cap;
} idvec_t;

static int collect(void *user, int32_t id) {
    idvec_t *v = user;
    if (v->n == v->cap) {
        int cap = v->cap ? 2 * v->cap : 256;
        int32_t *ni = realloc(v->ids, (size_t)cap * sizeof *ni);
        if (!ni) return 1; // stops generation; the caller sees n < stats.n_new
        v->ids = ni, v->cap = cap;
    }
    v->ids[v->n++] = id;
    return 0;
}

static int run_generate(const data_opts_t *o) {
    prompts_t pr = {0};
    if (o->prompts) TRY(prompts_read(o->prompts, &pr));
    int n_prompts = o->prompts ? pr.n : (int)(sizeof builtin_prompts / sizeof builtin_prompts[0]);
    be_t *be = NULL;
    model_t m = {0};
    model_run_t run = {0};
    model_state_t st = {0};
    tok_t tok = {0};
    data_shard_writer_t *w = NULL;
    int loaded = 0, rc = cli_backend(o->device, &be);
    if (rc == 0 && (rc = cli_load_model(o->model, be, &m, &tok, MODEL_QUANT)) == 0) loaded = 1;
    if (rc == 0 && tok.n_vocab > m.a.V)
        rc = err_set(ERR_INPUT, "%s: the tokenizer has %d tokens but the model's vocabulary is %d", o->model,
                     tok.n_vocab, m.a.V);
    if (rc == 0 && tok.eos < 0) rc = err_set(ERR_INPUT, "%s: the tokenizer has no EOS token", o->model);
    if (rc == 0) rc = model_run_create(&run, &m, CLI_RUN_ARENA);
    if (rc == 0) rc = model_state_alloc(&m, &st, 1, (int)o->ctx);
    int32_t stop[16];
    int n_stop = rc == 0 ? gen_stop_ids(&tok, &m.a, stop, 16) : 0;
    if (rc == 0) rc = data_shard_create(&w, o->out, tok_hash(&tok), tok.n_vocab);
    idvec_t doc = {0};
    uint8_t *mask = NULL;
    int64_t tokens = 0, budget_hit = 0;
    double t0 = time_now();
    for (long i = 0; rc == 0 && i < o->generate; i++) {
        const char *prompt = o->prompts ? pr.v[i % n_prompts] : builtin_prompts[i % n_prompts];
        tok_msg_t msg = {"user", prompt};
        char *text = NULL;
        int32_t *pids = NULL;
        int np = 0;
        rc = tok_chat_render(&tok, &msg, 1, 1, &text);
        if (rc == 0) rc = tok_encode_ex(&tok, text, strlen(text), TOK_SPECIAL, &pids, &np);
        free(text);
        if (rc == 0 && np + 2 > o->ctx)
            rc = err_set(ERR_INPUT, "prompt %ld is %d tokens, more than --ctx %ld leaves room for", i % n_prompts, np,
                         o->ctx);
        // doc = prompt, the sampled answer (collected as it comes), end of turn, EOS
        doc.n = 0;
        for (int k = 0; rc == 0 && k < np; k++)
            collect(&doc, pids[k]);
        gen_stats_t gs = {0};
        if (rc == 0) {
            model_state_reset(&m, &st);
            gen_cfg_t c = {.stop = stop, .n_stop = n_stop, .prefill_chunk = 512};
            c.max_new = (int)(o->n < o->ctx - np ? o->n : o->ctx - np);
            c.sampler.temperature = (float)o->temp;
            c.sampler.top_k = (int)o->top_k;
            c.sampler.top_p = (float)o->top_p;
            c.sampler.seed = (uint64_t)o->seed + (uint64_t)i;
            rc = gen_run(&run, &st, pids, np, &c, collect, &doc, &gs);
        }
        free(pids);
        if (rc == 0 && gs.stopped) collect(&doc, gs.stop_id);
        if (rc == 0) collect(&doc, tok.eos);
        if (rc == 0 && doc.n != np + gs.n_new + gs.stopped + 1) rc = err_set(ERR_NOMEM, "out of memory");
        if (rc < 0) break;
        budget_hit += !gs.stopped;
        if (o->assistant_only) {
            uint8_t *nm = realloc(mask, (size_t)doc.n);
            if (!nm) {
                rc = err_set(ERR_NOMEM, "out of memory");
                break;
            }
            mask = nm;
            for (int k = 0; k < doc.n; k++)
                mask[k] = k >= np && k < doc.n - 1; // the answer and its end of turn
        }
        rc = data_shard_add(w, doc.ids, o->assistant_only ? mask : NULL, doc.n);
        tokens += doc.n;
        log_info("data: document %ld/%ld: %d prompt + %d sampled tokens%s (%.1f s so far)", i + 1, o->generate, np,
                 gs.n_new, gs.stopped ? "" : ", cut at -n", time_now() - t0);
    }
    free(doc.ids);
    free(mask);
    if (w) {
        if (rc == 0)
            rc = data_shard_finish(w);
        else
            data_shard_abort(w);
    }
    if (rc == 0)
        printf("hylo: wrote %s: %ld documents sampled from %s, %lld tokens, %lld cut at -n %ld; %.1f s\n", o->out,
               o->generate, o->model, (long long)tokens, (long long)budget_hit, o->n, time_now() - t0);
    if (loaded) {
        model_state_free(&m, &st);
        model_run_free(&run);
        model_free(&m);
    }
    tok_free(&tok);
    be_destroy(be);
    prompts_free(&pr);
    return rc;
}

int cmd_data(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        fputs(help, stdout);
        return 0;
    }
    data_opts_t o = {0};
    int rc = parse(argc, argv, &o);
    if (rc == 0) rc = o.generate > 0 ? run_generate(&o) : run_encode(&o);
    free(o.inputs);
    return rc < 0 ? cli_fail(rc) : rc;
}
