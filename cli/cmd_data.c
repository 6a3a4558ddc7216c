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
                          "       hylo data --show N --tokenizer PATH FILE.shard\n"
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
                          "--show N: prints a shard's header and its first N documents as text (control\n"
                          "tokens as their text; tokens outside the loss mask between [[ and ]]).\n"
                          "\n"
                          "--generate N: N documents sampled from the model itself, each a rendered user\n"
                          "prompt, the model's answer and its end-of-turn token (when it stopped within -n),\n"
                          "then EOS (once: an end of turn that is the EOS is the document's end):\n"
                          "  --model PATH       the teacher (GGUF or checkpoint folder)\n"
                          "  --prompts FILE     one user message per line (default: 8 built-in prompts)\n"
                          "  --self-instruct    no prompts: the model writes the user's message too (the\n"
                          "                     prompt ends where the message would begin; when the model\n"
                          "                     ends that turn, or at half of -n, the assistant header of\n"
                          "                     the chat template follows and it answers)\n"
                          "  --batch B          documents sampled B at a time from one prompt: batch k\n"
                          "                     answers prompt k mod the number of prompts (default 1:\n"
                          "                     document i answers prompt i)\n"
                          "  -n N               new tokens per document at most (default 512)\n"
                          "  --temp T           temperature (default 1)\n"
                          "  --top-k K, --top-p P   as for 'hylo generate' (default off)\n"
                          "  --seed S           document i is sampled with seed S + i (default 1)\n"
                          "  --ctx N            context capacity (default 4096; the cache grows with use up to it)\n"
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
    long generate, n, top_k, seed, ctx, threads, batch, show;
    double temp, top_p;
    int split_lines, assistant_only, strict, self_instruct;
    const char **inputs;
    int n_inputs;
} data_opts_t;

static int parse(int argc, char **argv, data_opts_t *o) {
    o->n = 512, o->seed = 1, o->ctx = 4096, o->temp = 1, o->top_p = 1, o->device = "cpu", o->generate = -1;
    o->batch = 1;
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
        } else if ((r = cli_opt("data", argc, argv, &i, "--show", &v))) {
            TRY(r);
            TRY(cli_int("data", "--show", v, 1, 1L << 30, &o->show));
        } else if ((r = cli_opt("data", argc, argv, &i, "--batch", &v))) {
            TRY(r);
            TRY(cli_int("data", "--batch", v, 1, 4096, &o->batch));
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
        } else if (cli_flag(argv, i, "--self-instruct")) {
            o->self_instruct = 1;
        } else if (cli_flag(argv, i, "--strict")) {
            o->strict = 1;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return cli_usage("data", "unknown option '%s'", argv[i]);
        } else {
            o->inputs[o->n_inputs++] = argv[i];
        }
    }
    if (o->show) {
        if (!o->tokenizer || o->n_inputs != 1 || o->out || o->generate > 0)
            return cli_usage("data", "--show N takes --tokenizer PATH and one FILE.shard");
        return 0;
    }
    if (!o->out) return cli_usage("data", "missing --out FILE.shard");
    if (o->generate > 0) {
        if (!o->model) return cli_usage("data", "--generate needs --model PATH (the teacher)");
        if (o->tokenizer) return cli_usage("data", "--generate uses the model's own tokenizer; drop --tokenizer");
        if (o->n_inputs) return cli_usage("data", "--generate takes no INPUT files (got '%s')", o->inputs[0]);
        if (o->split_lines || o->strict) return cli_usage("data", "--split-lines and --strict apply to INPUT files");
        if (o->self_instruct && o->prompts)
            return cli_usage("data", "--self-instruct has the model write the prompts; drop --prompts");
    } else {
        if (o->self_instruct || o->batch != 1)
            return cli_usage("data", "--self-instruct and --batch go with --generate N");
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

// ---- --show -----------------------------------------------------------------

static int run_show(const data_opts_t *o) {
    tok_t tok = {0};
    data_shard_t sh = {0};
    int opened = 0, rc = load_tokenizer(o->tokenizer, &tok);
    if (rc == 0 && (rc = data_shard_open(&sh, o->inputs[0])) == 0) opened = 1;
    if (rc == 0 && sh.tok_hash != tok_hash(&tok))
        rc = err_set(ERR_INPUT, "%s: made with another tokenizer (hash %016llx) than %s (%016llx)", o->inputs[0],
                     (unsigned long long)sh.tok_hash, o->tokenizer, (unsigned long long)tok_hash(&tok));
    if (rc == 0) {
        int64_t in_loss = 0;
        for (int64_t i = 0; i < sh.n_tokens; i++)
            in_loss += data_shard_mask(&sh, i);
        printf("%s: %lld tokens (%lld in the loss), %lld documents, vocabulary %d, %d bytes per token\n", o->inputs[0],
               (long long)sh.n_tokens, (long long)in_loss, (long long)sh.n_docs, sh.n_vocab, sh.token_bytes);
    }
    for (int64_t d = 0; rc == 0 && d < sh.n_docs && d < o->show; d++) {
        int64_t a = data_shard_doc_start(&sh, d),
                b = d + 1 < sh.n_docs ? data_shard_doc_start(&sh, d + 1) : sh.n_tokens;
        printf("---- document %lld: %lld tokens\n", (long long)d, (long long)(b - a));
        int masked = 1;
        for (int64_t i = a; i < b; i++) {
            int32_t id = data_shard_token(&sh, i);
            int mk = data_shard_mask(&sh, i);
            if (mk != masked) fputs(mk ? "]]" : "[[", stdout), masked = mk;
            char *txt = NULL;
            size_t len = 0;
            if ((rc = tok_decode(&tok, &id, 1, 0, &txt, &len)) < 0) break;
            fwrite(txt, 1, len, stdout);
            free(txt);
        }
        if (!masked) fputs("]]", stdout);
        putchar('\n');
    }
    if (opened) data_shard_close(&sh);
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

static int idvec_push(idvec_t *v, int32_t id) {
    if (v->n == v->cap) {
        int cap = v->cap ? 2 * v->cap : 256;
        int32_t *ni = realloc(v->ids, (size_t)cap * sizeof *ni);
        if (!ni) return err_set(ERR_NOMEM, "out of memory");
        v->ids = ni, v->cap = cap;
    }
    v->ids[v->n++] = id;
    return 0;
}

// The chat template split at a user message: *head = everything before the
// message's text, *tail = what follows it up to the assistant's turn (the
// generation prompt). Rendered with a marker message; template bytes only,
// so both may hold control tokens.
static int chat_split(const tok_t *tok, char **head, char **tail) {
    static const char marker[] = "\x01\x02hylo\x02\x01";
    tok_msg_t msg = {"user", marker};
    char *text = NULL;
    TRY(tok_chat_render(tok, &msg, 1, 1, &text));
    char *at = strstr(text, marker);
    int rc = 0;
    if (!at) rc = err_set(ERR_UNSUP, "the chat template does not show the user's message verbatim");
    if (rc == 0 && (!(*head = strndup(text, (size_t)(at - text))) || !(*tail = strdup(at + strlen(marker)))))
        rc = err_set(ERR_NOMEM, "out of memory");
    free(text);
    return rc;
}

// One sampled document under construction: what was fed, and its phase.
typedef struct {
    idvec_t doc;
    int n_prompt;      // tokens before sampling began
    int answer_at;     // index in doc where the answer begins (after the assistant header)
    int in_user;       // --self-instruct: still writing the user's message
    int done, stopped; // finished; ended by a stop id (else cut at -n)
    int n_forced, forced_at;
} sample_t;

// Sampled documents, B at a time: every sequence of a batch starts from the
// same prompt tokens (one prefill for all) and is sampled with its own seed,
// so the inference state's one shared length serves them all. With
// --self-instruct the prompt ends where the user's message would begin: the
// model writes the question too, and when it ends its turn the template's
// assistant header is fed in place of sampling.
static int run_generate(const data_opts_t *o) {
    prompts_t pr = {0};
    if (o->prompts) TRY(prompts_read(o->prompts, &pr));
    int n_prompts = o->prompts ? pr.n : (int)(sizeof builtin_prompts / sizeof builtin_prompts[0]);
    int B = (int)(o->batch < o->generate ? o->batch : o->generate);
    be_t *be = NULL;
    model_t m = {0};
    model_run_t run = {0};
    model_state_t st = {0};
    tok_t tok = {0};
    data_shard_writer_t *w = NULL;
    char *head = NULL, *tail = NULL;
    int32_t *header = NULL; // --self-instruct: the assistant header's ids
    int n_header = 0;
    sample_t *smp = calloc((size_t)B, sizeof *smp);
    sampler_t *sam = calloc((size_t)B, sizeof *sam);
    int32_t *next = malloc((size_t)B * sizeof *next);
    uint8_t *keep = malloc((size_t)B); // next[s] belongs in document s
    float *logits = NULL;
    uint8_t *mask = NULL;
    int loaded = 0, rc = smp && sam && next && keep ? cli_backend(o->device, &be) : err_set(ERR_NOMEM, "out of memory");
    if (rc == 0 && (rc = cli_load_model(o->model, be, &m, &tok, MODEL_QUANT)) == 0) loaded = 1;
    if (rc == 0 && tok.n_vocab > m.a.V)
        rc = err_set(ERR_INPUT, "%s: the tokenizer has %d tokens but the model's vocabulary is %d", o->model,
                     tok.n_vocab, m.a.V);
    if (rc == 0 && tok.eos < 0) rc = err_set(ERR_INPUT, "%s: the tokenizer has no EOS token", o->model);
    if (rc == 0 && !(logits = malloc((size_t)B * m.a.V * sizeof *logits))) rc = err_set(ERR_NOMEM, "out of memory");
    if (rc == 0) rc = model_run_create(&run, &m, CLI_RUN_ARENA);
    if (rc == 0) rc = model_state_alloc(&m, &st, B, (int)o->ctx);
    int32_t stop[16];
    int n_stop = rc == 0 ? gen_stop_ids(&tok, &m.a, stop, 16) : 0;
    if (rc == 0 && o->self_instruct) rc = chat_split(&tok, &head, &tail);
    if (rc == 0 && o->self_instruct) rc = tok_encode_ex(&tok, tail, strlen(tail), TOK_SPECIAL, &header, &n_header);
    if (rc == 0) rc = data_shard_create(&w, o->out, tok_hash(&tok), tok.n_vocab);
    int64_t tokens = 0, budget_hit = 0, docs = 0;
    double t0 = time_now();
    for (long b0 = 0; rc == 0 && b0 < o->generate; b0 += B) {
        // the batch's prompt: a rendered user message, or the template's head
        int32_t *pids = NULL;
        int np = 0;
        uint8_t *plain = NULL;
        char *text = NULL;
        if (o->self_instruct) {
            rc = tok_encode_ex(&tok, head, strlen(head), TOK_SPECIAL, &pids, &np);
        } else {
            tok_msg_t msg = {"user", o->prompts ? pr.v[(b0 / B) % n_prompts] : builtin_prompts[(b0 / B) % n_prompts]};
            rc = tok_chat_render_marked(&tok, &msg, 1, 1, &text, &plain);
            if (rc == 0) rc = tok_encode_marked(&tok, text, strlen(text), TOK_SPECIAL, plain, &pids, &np);
        }
        free(text);
        free(plain);
        if (rc == 0 && np + 2 > o->ctx)
            rc = err_set(ERR_INPUT, "the prompt of document %ld is %d tokens, more than --ctx %ld leaves room for", b0,
                         np, o->ctx);
        int32_t *rep = rc == 0 ? malloc((size_t)B * np * sizeof *rep) : NULL;
        if (rc == 0 && !rep) rc = err_set(ERR_NOMEM, "out of memory");
        for (int s = 0; rc == 0 && s < B; s++) {
            memcpy(rep + (size_t)s * np, pids, (size_t)np * sizeof *rep);
            sample_t *x = &smp[s];
            x->doc.n = 0, x->n_prompt = np, x->answer_at = o->self_instruct ? -1 : np, x->in_user = o->self_instruct;
            x->done = x->stopped = x->n_forced = x->forced_at = 0;
            for (int k = 0; rc == 0 && k < np; k++)
                rc = idvec_push(&x->doc, pids[k]);
            sampler_cfg_t sc = {.temperature = (float)o->temp,
                                .top_k = (int)o->top_k,
                                .top_p = (float)o->top_p,
                                .seed = (uint64_t)o->seed + (uint64_t)(b0 + s)};
            sampler_free(&sam[s]);
            if (rc == 0) rc = sampler_init(&sam[s], &sc, m.a.V);
        }
        free(pids);
        if (rc == 0) {
            model_state_reset(&m, &st);
            rc = model_prefill(&run, &st, rep, np, 512, logits);
        }
        free(rep);
        int max_new = (int)(o->n < o->ctx - np - 1 ? o->n : o->ctx - np - 1);
        for (int step = 0; rc == 0 && step < max_new; step++) {
            int active = 0;
#pragma omp parallel for reduction(+ : active) schedule(dynamic, 4)
            for (int s = 0; s < B; s++) {
                sample_t *x = &smp[s];
                next[s] = tok.eos, keep[s] = 0; // what a finished sequence is fed, not recorded
                if (x->done) continue;
                if (x->forced_at == x->n_forced) { // sampling
                    int32_t id = sampler_sample(&sam[s], logits + (size_t)s * m.a.V);
                    int is_stop = 0;
                    for (int k = 0; k < n_stop; k++)
                        is_stop |= id == stop[k];
                    if (!(x->in_user && (is_stop || step >= max_new / 2))) {
                        next[s] = id, keep[s] = 1;
                        if (is_stop)
                            x->done = x->stopped = 1;
                        else
                            active++;
                        continue;
                    }
                    // the user's message ends (by a stop id, or at half the
                    // budget): the template's assistant header follows
                    x->in_user = 0, x->n_forced = n_header, x->forced_at = 0;
                }
                next[s] = header[x->forced_at++], keep[s] = 1;
                if (x->forced_at == x->n_forced) x->answer_at = x->doc.n + 1;
                active++;
            }
            for (int s = 0; rc == 0 && s < B; s++)
                if (keep[s]) rc = idvec_push(&smp[s].doc, next[s]);
            if (rc == 0 && active == 0) break;
            if (rc == 0) rc = model_step(&run, &st, next, logits);
            // a batch can take minutes: where it stands, every 64 steps
            if (rc == 0 && step % 64 == 63)
                log_info("data: documents %ld-%ld: step %d of at most %d, %d still sampling (%.1f s)", b0 + 1,
                         b0 + B < o->generate ? b0 + B : o->generate, step + 1, max_new, active, time_now() - t0);
        }
        for (int s = 0; rc == 0 && s < B && b0 + s < o->generate; s++) {
            sample_t *x = &smp[s];
            // A document ends with one EOS: the model's own when it stopped on
            // it (then in the loss: the end of turn it must learn), else one
            // appended here (not in the loss: the model did not write it).
            int appended = !(x->stopped && x->doc.n > 0 && x->doc.ids[x->doc.n - 1] == tok.eos);
            if (appended && (rc = idvec_push(&x->doc, tok.eos)) < 0) break;
            budget_hit += !x->stopped;
            if (o->assistant_only) {
                uint8_t *nm = realloc(mask, (size_t)x->doc.n);
                if (!nm) {
                    rc = err_set(ERR_NOMEM, "out of memory");
                    break;
                }
                mask = nm;
                // the answer and its end of turn (a document cut before its
                // answer began has none)
                for (int k = 0; k < x->doc.n; k++)
                    mask[k] = x->answer_at >= 0 && k >= x->answer_at && k < x->doc.n - appended;
            }
            rc = data_shard_add(w, x->doc.ids, o->assistant_only ? mask : NULL, x->doc.n);
            tokens += x->doc.n;
            docs++;
        }
        if (rc == 0)
            log_info("data: %lld/%ld documents, %lld tokens (%.1f s, %.0f tokens/s)", (long long)docs, o->generate,
                     (long long)tokens, time_now() - t0, tokens / (time_now() - t0 + 1e-9));
    }
    if (w) {
        if (rc == 0)
            rc = data_shard_finish(w);
        else
            data_shard_abort(w);
    }
    if (rc == 0)
        printf("hylo: wrote %s: %ld documents sampled from %s, %lld tokens, %lld cut at -n %ld; %.1f s\n", o->out,
               o->generate, o->model, (long long)tokens, (long long)budget_hit, o->n, time_now() - t0);
    for (int s = 0; s < B && smp; s++)
        free(smp[s].doc.ids);
    for (int s = 0; s < B && sam; s++)
        sampler_free(&sam[s]);
    free(smp), free(sam), free(next), free(keep), free(logits), free(mask), free(head), free(tail), free(header);
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
    if (rc == 0) rc = o.show ? run_show(&o) : o.generate > 0 ? run_generate(&o) : run_encode(&o);
    free(o.inputs);
    return rc < 0 ? cli_fail(rc) : rc;
}
