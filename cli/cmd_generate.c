// hylo generate / hylo chat: load a model and its tokenizer, stream tokens.
#include <omp.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/strbuf.h"
#include "cli/cli.h"
#include "infer/gen.h"
#include "io/weights.h"
#include "model/model.h"
#include "tok/tok.h"

static const char *gen_help = "usage: hylo generate PATH --prompt TEXT [options]\n"
                              "\n"
                              "Continues TEXT (no chat template; special tokens in TEXT are recognised),\n"
                              "printing tokens as they are generated.\n"
                              "\n"
                              "options:\n"
                              "  --prompt TEXT     the text to continue (required)\n"
                              "  -n N              new tokens at most (default 128)\n"
                              "  --temp T          temperature, 0 = greedy (default 0)\n"
                              "  --top-k K         keep the K most likely tokens (default 0 = off)\n"
                              "  --top-p P         nucleus sampling mass in (0, 1] (default 1 = off)\n"
                              "  --seed S          sampling seed (default 1)\n"
                              "  --ctx N           context capacity in tokens (default 4096); the cache grows\n"
                              "                    with use up to it\n"
                              "  --chunk N         prefill chunk in tokens (default 512)\n"
                              "  --device D        cpu or cuda (default cpu)\n"
                              "  --threads N       CPU threads (default: all)\n"
                              "  --f32             dequantise a GGUF's weights to fp32 (default on the CPU:\n"
                              "                    matrices stay in the file's block format, 8-bit activations)\n"
                              "  --gpu-blocks      on CUDA, keep the block-format matrices as they are (less\n"
                              "                    memory; default: dequantised to bf16; which decodes faster\n"
                              "                    depends on the model: docs/PERFORMANCE.md)\n"
                              "  --stats           print prefill and decode speed to stderr\n";

static const char *chat_help = "usage: hylo chat PATH [options]\n"
                               "\n"
                               "Multi-turn chat with the model's chat template (ChatML for SmolLM2 / Qwen,\n"
                               "Llama-3 headers). Reads one user message per line from standard input;\n"
                               "'/reset' starts a new conversation, '/quit' or end of input stops.\n"
                               "Messages are text: only the template writes control tokens (a message\n"
                               "spelling <|im_end|> is those characters). A message that does not fit the\n"
                               "context (--ctx) is refused with a note and the chat goes on; an answer\n"
                               "stops where the context is full.\n"
                               "With --prompt, answers that single message and exits.\n"
                               "\n"
                               "options:\n"
                               "  --prompt TEXT     one message, answered non-interactively\n"
                               "  --system TEXT     system message (default: the template's own, if any)\n"
                               "  -n N              new tokens per answer at most (default 512)\n"
                               "  --temp T, --top-k K, --top-p P, --seed S, --ctx N, --chunk N,\n"
                               "  --device D, --threads N, --f32, --gpu-blocks, --stats   as for 'hylo generate'\n";

typedef struct {
    const char *path, *prompt, *system, *device;
    long n, top_k, seed, ctx, chunk, threads;
    double temp, top_p;
    int stats, f32, gpu_blocks;
} gen_opts_t;

static int parse(const char *cmd, int argc, char **argv, gen_opts_t *o) {
    o->n = !strcmp(cmd, "chat") ? 512 : 128, o->top_k = 0, o->seed = 1, o->ctx = 4096, o->chunk = 512;
    o->threads = 0, o->temp = 0, o->top_p = 1, o->device = "cpu";
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        int r;
        if ((r = cli_opt(cmd, argc, argv, &i, "--prompt", &v))) {
            TRY(r);
            o->prompt = v;
        } else if ((r = cli_opt(cmd, argc, argv, &i, "--system", &v))) {
            TRY(r);
            o->system = v;
        } else if ((r = cli_opt(cmd, argc, argv, &i, "--device", &v))) {
            TRY(r);
            o->device = v;
        } else if ((r = cli_opt(cmd, argc, argv, &i, "-n", &v))) {
            TRY(r);
            TRY(cli_int(cmd, "-n", v, 1, 1 << 24, &o->n));
        } else if ((r = cli_opt(cmd, argc, argv, &i, "--top-k", &v))) {
            TRY(r);
            TRY(cli_int(cmd, "--top-k", v, 0, 1 << 24, &o->top_k));
        } else if ((r = cli_opt(cmd, argc, argv, &i, "--seed", &v))) {
            TRY(r);
            TRY(cli_int(cmd, "--seed", v, 0, 0x7fffffffL, &o->seed));
        } else if ((r = cli_opt(cmd, argc, argv, &i, "--ctx", &v))) {
            TRY(r);
            TRY(cli_int(cmd, "--ctx", v, 16, 1 << 30, &o->ctx));
        } else if ((r = cli_opt(cmd, argc, argv, &i, "--chunk", &v))) {
            TRY(r);
            TRY(cli_int(cmd, "--chunk", v, 1, 1 << 20, &o->chunk));
        } else if ((r = cli_opt(cmd, argc, argv, &i, "--threads", &v))) {
            TRY(r);
            TRY(cli_int(cmd, "--threads", v, 1, 1024, &o->threads));
        } else if ((r = cli_opt(cmd, argc, argv, &i, "--temp", &v))) {
            TRY(r);
            TRY(cli_float(cmd, "--temp", v, 0, 100, &o->temp));
        } else if ((r = cli_opt(cmd, argc, argv, &i, "--top-p", &v))) {
            TRY(r);
            TRY(cli_float(cmd, "--top-p", v, 1e-6, 1, &o->top_p));
        } else if (cli_flag(argv, i, "--stats")) {
            o->stats = 1;
        } else if (cli_flag(argv, i, "--f32")) {
            o->f32 = 1;
        } else if (cli_flag(argv, i, "--gpu-blocks")) {
            o->gpu_blocks = 1;
        } else if (argv[i][0] == '-') {
            return cli_usage(cmd, "unknown option '%s'", argv[i]);
        } else if (!o->path) {
            o->path = argv[i];
        } else {
            return cli_usage(cmd, "unexpected argument '%s'", argv[i]);
        }
    }
    if (!o->path) return cli_usage(cmd, "missing PATH (a GGUF file or a checkpoint folder)");
    if (o->threads) omp_set_num_threads((int)o->threads);
    return 0;
}

typedef struct {
    be_t *be;
    model_t m;
    model_run_t run;
    model_state_t st;
    tok_t tok;
    int32_t stop[16];
    int n_stop;
} session_t;

static int session_open(session_t *s, const gen_opts_t *o) {
    memset(s, 0, sizeof *s);
    TRY(cli_backend(o->device, &s->be));
    TRY(cli_load_model(o->path, s->be, &s->m, &s->tok,
                       o->f32 ? 0 : MODEL_QUANT | (o->gpu_blocks ? CLI_GPU_BLOCKS : 0)));
    if (s->tok.n_vocab > s->m.a.V)
        return err_set(ERR_INPUT, "%s: the tokenizer has %d tokens but the model's vocabulary is %d", o->path,
                       s->tok.n_vocab, s->m.a.V);
    s->n_stop = gen_stop_ids(&s->tok, &s->m.a, s->stop, 16);
    TRY(model_run_create(&s->run, &s->m, CLI_RUN_ARENA));
    return model_state_alloc(&s->m, &s->st, 1, (int)o->ctx);
}

static void session_close(session_t *s) {
    if (s->m.be) {
        model_state_free(&s->m, &s->st);
        model_run_free(&s->run);
        model_free(&s->m);
    }
    tok_free(&s->tok);
    be_destroy(s->be);
}

typedef struct {
    tok_stream_t ts;
    strbuf_t text; // everything emitted (chat keeps it as the assistant message)
} printer_t;

// Prints and keeps n bytes; nonzero (stopping the generation) when the copy
// could not grow: the caller reports text.oom.
static int emit(printer_t *p, const char *s, size_t n) {
    if (n == 0) return 0;
    fwrite(s, 1, n, stdout);
    fflush(stdout);
    strbuf_putn(&p->text, s, n);
    return p->text.oom;
}

static int print_token(void *user, int32_t id) {
    printer_t *p = user;
    const char *s;
    size_t n;
    if (tok_stream_feed(&p->ts, id, &s, &n) < 0) return 0;
    return emit(p, s, n);
}

// Prints what the stream still holds and ends the line; ERR_NOMEM when the
// emitted text could not be kept.
static int print_finish(printer_t *p) {
    const char *s;
    size_t n;
    if (tok_stream_flush(&p->ts, &s, &n) == 0) emit(p, s, n);
    fputc('\n', stdout);
    fflush(stdout);
    return p->text.oom ? err_set(ERR_NOMEM, "out of memory keeping the generated text") : 0;
}

static void report(const gen_opts_t *o, const gen_stats_t *st) {
    if (!o->stats) return;
    fprintf(stderr, "hylo: prefill %d tokens in %.3f s (%.1f tok/s), decode %d tokens in %.3f s (%.1f tok/s)\n",
            st->n_prompt, st->prefill_s, st->prefill_s > 0 ? st->n_prompt / st->prefill_s : 0.0, st->n_new,
            st->decode_s, st->decode_s > 0 ? st->n_new / st->decode_s : 0.0);
}

// Feeds ids and generates, printing the new text as it comes (decoded with
// stream_flags) into a printer emptied first; then ends the line and reports
// the speeds (--stats). On return p->text holds the emitted text, and
// *fed_stop (when not NULL) the stop id the cache holds after it (gen_run's
// stop_fed), else -1. The ids and
// at least one new token must fit the context: ERR_INPUT before anything is
// fed otherwise. The answer stops, with a note, where the context is full.
static int generate_print(session_t *s, const gen_opts_t *o, const int32_t *ids, int n, int stream_flags, printer_t *p,
                          int32_t *fed_stop) {
    if (fed_stop) *fed_stop = -1;
    p->text.n = 0;
    if (p->text.s) p->text.s[0] = 0;
    int64_t room = (int64_t)s->st.ctx - s->st.len - n; // tokens left for the answer
    if (room < 1)
        return err_set(ERR_INPUT,
                       "the input of %d tokens does not fit: %d of the context's %d tokens are free, and the answer "
                       "needs at least one (--ctx sets the capacity)",
                       n, s->st.ctx - s->st.len, s->st.ctx);
    tok_stream_free(&p->ts);
    tok_stream_init(&p->ts, &s->tok, stream_flags);
    int max_new = o->n < room ? (int)o->n : (int)room;
    gen_cfg_t c = {.max_new = max_new, .stop = s->stop, .n_stop = s->n_stop, .prefill_chunk = (int)o->chunk};
    c.sampler.temperature = (float)o->temp;
    c.sampler.top_k = (int)o->top_k;
    c.sampler.top_p = (float)o->top_p;
    c.sampler.seed = (uint64_t)o->seed;
    gen_stats_t st;
    int rc = gen_run(&s->run, &s->st, ids, n, &c, print_token, p, &st);
    int frc = print_finish(p);
    if (rc == 0) rc = frc;
    if (rc == 0 && !st.stopped && st.n_new == max_new && max_new < o->n)
        fprintf(stderr, "hylo: the context is full (%d tokens, --ctx): the answer stops here\n", s->st.ctx);
    if (rc == 0) report(o, &st);
    if (fed_stop && st.stop_fed) *fed_stop = st.stop_id;
    return rc;
}

int cmd_generate(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        fputs(gen_help, stdout);
        return 0;
    }
    gen_opts_t o = {0};
    int rc = parse("generate", argc, argv, &o);
    if (rc) return rc < 0 ? cli_fail(rc) : rc;
    if (!o.prompt) return cli_usage("generate", "missing --prompt");
    session_t s;
    rc = session_open(&s, &o);
    int32_t *ids = NULL;
    int n = 0;
    if (rc == 0) rc = tok_encode(&s.tok, o.prompt, strlen(o.prompt), 1, &ids, &n);
    if (rc == 0 && n == 0) rc = err_set(ERR_INPUT, "the prompt encodes to no tokens");
    printer_t p = {0};
    if (rc == 0) {
        fputs(o.prompt, stdout);
        fflush(stdout);
        rc = generate_print(&s, &o, ids, n, 0, &p, NULL);
    }
    tok_stream_free(&p.ts);
    free(ids);
    free(p.text.s);
    session_close(&s);
    return rc < 0 ? cli_fail(rc) : 0;
}

// ---- chat -------------------------------------------------------------------

typedef struct {
    tok_msg_t *msgs;
    int n, cap;
} convo_t;

static int convo_add(convo_t *c, const char *role, const char *content) {
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 16;
        tok_msg_t *m = realloc(c->msgs, (size_t)cap * sizeof *m);
        if (!m) return err_set(ERR_NOMEM, "out of memory");
        c->msgs = m, c->cap = cap;
    }
    char *r = strdup(role), *t = strdup(content);
    if (!r || !t) { // the slot is not counted, so convo_clear would not free a half-made one
        free(r), free(t);
        return err_set(ERR_NOMEM, "out of memory");
    }
    c->msgs[c->n++] = (tok_msg_t){r, t};
    return 0;
}

static void convo_clear(convo_t *c, int keep) {
    for (int i = keep; i < c->n; i++) {
        free((char *)c->msgs[i].role);
        free((char *)c->msgs[i].content);
    }
    c->n = keep;
}

// One turn: render the whole conversation, its messages' text marked so
// that it is encoded as text (a user typing "<|im_end|><|im_start|>system"
// gets those characters, not control tokens: only the template makes them).
// When the text already fed to the model is a prefix of it, only the new
// suffix is encoded and fed (the hybrid cache cannot be rewound: recurrent
// states only move forward); otherwise the cache is reset and the
// conversation re-fed. A turn that does not fit the context is refused before
// anything is fed (*refused = 1, ERR_INPUT): the cache is as it was, and the
// caller drops the message.
static int chat_turn(session_t *s, const gen_opts_t *o, convo_t *c, strbuf_t *fed, printer_t *p, int *refused) {
    *refused = 0;
    char *text = NULL;
    uint8_t *plain = NULL;
    TRY(tok_chat_render_marked(&s->tok, c->msgs, c->n, 1, &text, &plain));
    int keep = fed->s && !strncmp(text, fed->s, fed->n);
    size_t from = keep ? fed->n : 0;
    int32_t *ids = NULL;
    int n = 0;
    int rc = tok_encode_marked(&s->tok, text + from, strlen(text + from), TOK_SPECIAL, plain + from, &ids, &n);
    if (rc == 0 && n == 0) rc = err_set(ERR_INPUT, "nothing to feed");
    int64_t held = keep ? s->st.len : 0; // what stays in the cache
    if (rc == 0 && held + n + 1 > s->st.ctx) {
        *refused = 1;
        if (keep)
            rc = err_set(ERR_INPUT,
                         "message refused: it needs %d tokens with the template and the answer at least one more, but "
                         "the conversation already holds %lld of the context's %d ('/reset' starts a new "
                         "conversation, --ctx sets the capacity)",
                         n, (long long)held, s->st.ctx);
        else
            rc = err_set(ERR_INPUT,
                         "message refused: the conversation needs %d tokens with the template and the answer at "
                         "least one more, but the context holds %d (--ctx sets the capacity)",
                         n, s->st.ctx);
    }
    if (rc == 0 && !keep) model_state_reset(&s->m, &s->st);
    int32_t stop = -1;
    if (rc == 0) rc = generate_print(s, o, ids, n, TOK_SKIP_SPECIAL, p, &stop);
    free(ids);
    free(plain);
    const char *answer = p->text.s ? p->text.s : "";
    if (rc == 0) {
        // What the cache now holds: the rendered text plus the answer, and
        // the stop id that greedy decoding fed after it (as the template
        // writes it: the next turn's text then still starts with all of it).
        fed->n = 0;
        strbuf_puts(fed, text);
        strbuf_putn(fed, answer, p->text.n);
        size_t stop_len = 0;
        const char *stop_text = stop < 0                        ? NULL
                                : tok_is_special(&s->tok, stop) ? tok_text(&s->tok, stop, &stop_len)
                                                                : tok_bytes(&s->tok, stop, &stop_len);
        if (stop_text) strbuf_putn(fed, stop_text, stop_len);
        if (fed->oom) rc = err_set(ERR_NOMEM, "out of memory");
    }
    if (rc == 0) rc = convo_add(c, "assistant", answer);
    free(text);
    return rc;
}

int cmd_chat(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        fputs(chat_help, stdout);
        return 0;
    }
    gen_opts_t o = {0};
    int rc = parse("chat", argc, argv, &o);
    if (rc) return rc < 0 ? cli_fail(rc) : rc;
    session_t s;
    rc = session_open(&s, &o);
    if (rc == 0 && s.tok.chat == TOK_CHAT_NONE)
        rc = err_set(ERR_INPUT, "%s has no chat template; use 'hylo generate'", o.path);
    char *probe = NULL; // a template that cannot be rendered fails before the first message is read
    if (rc == 0 && (rc = tok_chat_render(&s.tok, NULL, 0, 1, &probe)) == 0) free(probe);
    convo_t c = {0};
    int keep = 0;
    if (rc == 0 && o.system) rc = convo_add(&c, "system", o.system), keep = 1;
    strbuf_t fed = {0};
    char *line = NULL;
    size_t lcap = 0;
    printer_t p = {0};
    int refused = 0;
    if (rc == 0 && o.prompt) {
        rc = convo_add(&c, "user", o.prompt);
        if (rc == 0) rc = chat_turn(&s, &o, &c, &fed, &p, &refused);
    } else if (rc == 0) {
        int tty = isatty(fileno(stdin));
        for (;;) {
            if (tty) fputs("> ", stderr);
            ssize_t got = getline(&line, &lcap, stdin);
            if (got < 0) break;
            while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r'))
                line[--got] = 0;
            if (!strcmp(line, "/quit")) break;
            if (!strcmp(line, "/reset")) {
                convo_clear(&c, keep);
                free(fed.s);
                fed = (strbuf_t){0};
                model_state_reset(&s.m, &s.st);
                continue;
            }
            if (!*line) continue;
            if ((rc = convo_add(&c, "user", line)) < 0) break;
            if ((rc = chat_turn(&s, &o, &c, &fed, &p, &refused)) < 0 && refused) {
                // That message alone is refused; the conversation goes on without it.
                fprintf(stderr, "hylo: %s\n", err_msg());
                convo_clear(&c, c.n - 1);
                rc = 0;
                continue;
            }
            if (rc < 0) break;
        }
    }
    free(line);
    free(fed.s);
    tok_stream_free(&p.ts);
    free(p.text.s);
    convo_clear(&c, 0);
    free(c.msgs);
    session_close(&s);
    return rc < 0 ? cli_fail(rc) : 0;
}
