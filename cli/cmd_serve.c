// hylo serve: an OpenAI-compatible HTTP server over one model (serve/).
#include <errno.h>
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/err.h"
#include "cli/cli.h"
#include "infer/gen.h"
#include "model/model.h"
#include "serve/engine.h"
#include "serve/http.h"
#include "serve/metrics.h"
#include "tok/tok.h"

static const char *help =
    "usage: hylo serve PATH [options]\n"
    "\n"
    "Serves the model at PATH over HTTP with OpenAI's API (docs/SERVING.md):\n"
    "  POST /v1/chat/completions, POST /v1/completions   (\"stream\": true for server-sent events)\n"
    "  GET /v1/models, GET /health, GET /metrics (Prometheus), POST /tokenize, POST /detokenize\n"
    "Chat messages go through the model's chat template; their text never becomes\n"
    "control tokens. Sampling: temperature, top_p, top_k, seed, max_tokens\n"
    "(max_completion_tokens), stop (up to 4 strings), n = 1, presence_penalty,\n"
    "frequency_penalty, logit_bias; log-probabilities (chat: logprobs,\n"
    "top_logprobs; completions: logprobs = 0..20).\n"
    "The engine runs up to --max-seqs requests at once (each with its own cache),\n"
    "one forward a turn: a prefill chunk of each request in its prompt, and the\n"
    "next token of each of the others riding with them (--max-batched-tokens\n"
    "bounds it); --queue more wait, and beyond that a request gets 429. A request\n"
    "whose prompt and max_tokens exceed --ctx gets 400. A client that disconnects\n"
    "cancels its request. SIGINT / SIGTERM stop the server: what is running is\n"
    "cancelled, everything freed.\n"
    "Prints 'hylo: serving NAME on http://HOST:PORT' once it listens.\n"
    "\n"
    "options:\n"
    "  --host H          address to listen on (default 127.0.0.1; 0.0.0.0 or :: for all)\n"
    "  --port P          port (default 8080; 0 = a free one, printed)\n"
    "  --api-key KEY     require 'Authorization: Bearer KEY' (default: $HYLO_API_KEY, else none);\n"
    "                    /health and /metrics stay open\n"
    "  --model-name N    the model's name in the API (default: PATH's file name)\n"
    "  --ctx N           most tokens of one request, prompt and answer (default 4096); each\n"
    "                    request's cache takes pages of 256 tokens as it grows\n"
    "  --max-seqs N      requests generating at once (default 4)\n"
    "  --queue N         requests waiting beyond them (default 16)\n"
    "  --chunk N         prefill tokens of a request per turn (default 512)\n"
    "  --max-batched-tokens N  tokens of one turn's forward (default 0 = no limit but\n"
    "                    max-seqs x chunk), as vLLM's max_num_batched_tokens: the decode tokens\n"
    "                    (one a request) count first and are never deferred, then the prompts'\n"
    "                    chunks, oldest request first, each cut to what is left; a prompt that\n"
    "                    gets nothing waits a turn. The oldest prompt gets a token at least, so\n"
    "                    a forward holds at most max(N, --max-seqs) tokens\n"
    "  --prefix-cache-mb N  bytes (MiB) of the prefix cache (default 256; 0 = off): requests whose\n"
    "                    prompt starts with an earlier prompt (a chat's next turn) restore its\n"
    "                    state and prefill only the rest; least recently used entries go first\n"
    "  --prefix-block N  tokens between the recurrent-state snapshots of a prompt (default 1024)\n"
    "  --cache-mb N      MiB of the running requests' caches (default: 85% of the device's free\n"
    "                    memory after loading, less the prefix cache; printed at start): their\n"
    "                    recurrent states and a pool of pages of 256 tokens, shared with the\n"
    "                    prefix cache. A request starts when its prompt's pages are free; when\n"
    "                    none is for a running one, the newest is preempted and resumed later;\n"
    "                    one that could not run alone in the pool gets 400\n"
    "  --device D        cpu or cuda (default cpu)\n"
    "  --gpu-blocks      on CUDA, keep a GGUF's block-format matrices as they are (less memory;\n"
    "                    default: dequantised to bf16; which decodes faster depends on the model:\n"
    "                    docs/PERFORMANCE.md; the CPU keeps them)\n"
    "  --threads N       CPU threads of the engine (default: all)\n";

// SIGINT / SIGTERM stop the server. The main thread runs the engine, so they
// cannot be taken by sigwait there; nor by sigwait in another thread with the
// signals blocked everywhere else: OpenBLAS starts its threads before main,
// with nothing blocked, and the kernel may hand them the signal. A handler,
// on whichever thread gets it, writes the signal to a pipe; the signal thread
// reads it and stops the server: no new connections; what runs or waits is
// cancelled (its client gets the end of its stream or a 503) by the engine
// loop, which then returns.
static int stop_pipe[2] = {-1, -1};

static void on_stop_signal(int sig) {
    unsigned char c = (unsigned char)sig;
    ssize_t n = write(stop_pipe[1], &c, 1); // async-signal-safe; if full, a signal is there already
    (void)n;
}

typedef struct {
    srv_http_t *h;
    srv_engine_t *e;
} stopper_t;

static void *wait_stop(void *arg) {
    stopper_t *s = arg;
    unsigned char sig = 0;
    while (read(stop_pipe[0], &sig, 1) < 0 && errno == EINTR) {
    }
    fprintf(stderr, "hylo: %s: shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    srv_http_quiesce(s->h);
    srv_engine_shutdown(s->e);
    return NULL;
}

int cmd_serve(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        fputs(help, stdout);
        return 0;
    }
    const char *path = NULL, *host = "127.0.0.1", *key = getenv("HYLO_API_KEY"), *name = NULL, *device = "cpu";
    long port = 8080, ctx = 4096, max_seqs = 4, queue = 16, chunk = 512, threads = 0, prefix_mb = 256, cache_mb = -1,
         prefix_block = 1024, max_batched = 0;
    int gpu_blocks = 0; // CLI_GPU_BLOCKS with --gpu-blocks
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        int r;
        if ((r = cli_opt("serve", argc, argv, &i, "--host", &v))) {
            if (r < 0) return cli_fail(r);
            host = v;
        } else if ((r = cli_opt("serve", argc, argv, &i, "--api-key", &v))) {
            if (r < 0) return cli_fail(r);
            key = v;
        } else if ((r = cli_opt("serve", argc, argv, &i, "--model-name", &v))) {
            if (r < 0) return cli_fail(r);
            name = v;
        } else if ((r = cli_opt("serve", argc, argv, &i, "--device", &v))) {
            if (r < 0) return cli_fail(r);
            device = v;
        } else if (cli_flag(argv, i, "--gpu-blocks")) {
            gpu_blocks = CLI_GPU_BLOCKS;
        } else if ((r = cli_opt("serve", argc, argv, &i, "--port", &v))) {
            if (r < 0 || (r = cli_int("serve", "--port", v, 0, 65535, &port)) < 0) return cli_fail(r);
        } else if ((r = cli_opt("serve", argc, argv, &i, "--ctx", &v))) {
            if (r < 0 || (r = cli_int("serve", "--ctx", v, 16, 1 << 30, &ctx)) < 0) return cli_fail(r);
        } else if ((r = cli_opt("serve", argc, argv, &i, "--max-seqs", &v))) {
            if (r < 0 || (r = cli_int("serve", "--max-seqs", v, 1, 4096, &max_seqs)) < 0) return cli_fail(r);
        } else if ((r = cli_opt("serve", argc, argv, &i, "--queue", &v))) {
            if (r < 0 || (r = cli_int("serve", "--queue", v, 0, 1 << 20, &queue)) < 0) return cli_fail(r);
        } else if ((r = cli_opt("serve", argc, argv, &i, "--chunk", &v))) {
            if (r < 0 || (r = cli_int("serve", "--chunk", v, 1, 1 << 20, &chunk)) < 0) return cli_fail(r);
        } else if ((r = cli_opt("serve", argc, argv, &i, "--max-batched-tokens", &v))) {
            if (r < 0 || (r = cli_int("serve", "--max-batched-tokens", v, 0, 1 << 30, &max_batched)) < 0)
                return cli_fail(r);
        } else if ((r = cli_opt("serve", argc, argv, &i, "--prefix-cache-mb", &v))) {
            if (r < 0 || (r = cli_int("serve", "--prefix-cache-mb", v, 0, 1L << 30, &prefix_mb)) < 0)
                return cli_fail(r);
        } else if ((r = cli_opt("serve", argc, argv, &i, "--cache-mb", &v))) {
            if (r < 0 || (r = cli_int("serve", "--cache-mb", v, 1, 1L << 30, &cache_mb)) < 0) return cli_fail(r);
        } else if ((r = cli_opt("serve", argc, argv, &i, "--prefix-block", &v))) {
            if (r < 0 || (r = cli_int("serve", "--prefix-block", v, 1, 1 << 30, &prefix_block)) < 0) return cli_fail(r);
        } else if ((r = cli_opt("serve", argc, argv, &i, "--threads", &v))) {
            if (r < 0 || (r = cli_int("serve", "--threads", v, 1, 1024, &threads)) < 0) return cli_fail(r);
        } else if (argv[i][0] == '-') {
            return cli_usage("serve", "unknown option '%s'", argv[i]);
        } else if (!path) {
            path = argv[i];
        } else {
            return cli_usage("serve", "unexpected argument '%s'", argv[i]);
        }
    }
    if (!path) return cli_usage("serve", "missing PATH (a GGUF file or a checkpoint folder)");
    if (!name) {
        const char *s = path + strlen(path);
        while (s > path && s[-1] == '/') // a folder's name, not its trailing slash
            s--;
        const char *b = s;
        while (b > path && b[-1] != '/')
            b--;
        static char buf[256];
        snprintf(buf, sizeof buf, "%.*s", (int)(s - b), b);
        name = buf;
    }
    if (threads) omp_set_num_threads((int)threads);

    // SIGINT / SIGTERM: on_stop_signal. A write to a closed socket must not
    // kill the server.
    stopper_t stop = {0};
    if (pipe(stop_pipe) < 0) return cli_fail(err_set(ERR_RUNTIME, "cannot create the signal pipe"));
    struct sigaction sa = {.sa_handler = on_stop_signal, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    be_t *be = NULL;
    model_t m = {0};
    tok_t tok = {0};
    srv_metrics_t met;
    srv_metrics_init(&met);
    srv_engine_t *e = NULL;
    srv_http_t *h = NULL;
    int32_t stop_ids[16];
    int rc = cli_backend(device, &be);
    if (rc == 0) rc = cli_load_model(path, be, &m, &tok, MODEL_QUANT | gpu_blocks);
    if (rc == 0 && tok.n_vocab > m.a.V)
        rc = err_set(ERR_INPUT, "%s: the tokenizer has %d tokens but the model's vocabulary is %d", path, tok.n_vocab,
                     m.a.V);
    // The cache budget: given, or planned from what the device has free now
    // (the weights loaded) less the prefix cache's budget, with 15% left
    // for the run's arena, the decode step's buffers and the prefix cache's
    // recurrent-state snapshots. The engine takes its page pool from it at
    // once (srv_pool_pages).
    int64_t budget = cache_mb > 0 ? (int64_t)cache_mb * 1048576 : 0;
    if (rc == 0 && cache_mb < 0) {
        int64_t fr = be->mem_free ? be->mem_free(be) : -1;
        budget = fr < 0 ? 0 : (fr - ((int64_t)prefix_mb << 20)) / 100 * 85;
        if (fr >= 0 && budget < srv_request_bytes(&m, 64))
            rc = err_set(ERR_NOMEM, "%s: %.0f MiB free on the device leave no room for caches (prefix cache %ld MiB)",
                         device, fr / 1048576.0, prefix_mb);
    }
    if (rc == 0) {
        srv_engine_cfg_t ec = {.max_seqs = (int)max_seqs,
                               .queue = (int)queue,
                               .ctx = (int)ctx,
                               .chunk = (int)chunk,
                               .threads = (int)threads,
                               .stop_ids = stop_ids,
                               .n_stop_ids = gen_stop_ids(&tok, &m.a, stop_ids, 16),
                               .prefix_bytes = (int64_t)prefix_mb << 20,
                               .cache_budget = budget,
                               .prefix_block = (int)prefix_block,
                               .max_batched_tokens = (int)max_batched};
        rc = srv_engine_create(&e, &m, &ec, &met);
    }
    if (rc == 0) {
        srv_http_cfg_t hc = {.host = host,
                             .port = (int)port,
                             .api_key = key,
                             .model_name = name,
                             .ctx = (int)ctx,
                             .max_conns = (int)(max_seqs + queue + 64)};
        rc = srv_http_start(&h, &hc, e, &tok, &met);
    }
    if (rc == 0) {
        int v6 = strchr(host, ':') != NULL;
        char cb[96] = "no cache budget (free memory unknown)";
        if (budget)
            snprintf(cb, sizeof cb, "cache budget %.0f MiB: %lld pages of 256 tokens", budget / 1048576.0,
                     (long long)srv_engine_pages(e));
        char bt[64] = "";
        if (max_batched) snprintf(bt, sizeof bt, ", max-batched-tokens %ld", max_batched);
        printf("hylo: serving %s on http://%s%s%s:%d (ctx %ld, max-seqs %ld, queue %ld%s, %s%s)\n", name, v6 ? "[" : "",
               host, v6 ? "]" : "", srv_http_port(h), ctx, max_seqs, queue, bt, cb,
               key && key[0] ? ", API key required" : "");
        fflush(stdout);
        // The engine runs here, on the thread that loaded the model (its
        // OpenMP pool: srv_engine_run says why), until the signal thread
        // stops it; then the connections close.
        stop.h = h, stop.e = e;
        pthread_t th;
        if (pthread_create(&th, NULL, wait_stop, &stop) != 0) {
            rc = err_set(ERR_RUNTIME, "cannot start the signal thread");
            srv_http_quiesce(h);
            srv_engine_shutdown(e); // the run below cancels what came meanwhile
        }
        srv_engine_run(e);
        if (rc == 0) pthread_join(th, NULL);
        srv_http_stop(h);
    }
    srv_engine_free(e);
    if (m.be) model_free(&m);
    tok_free(&tok);
    be_destroy(be);
    srv_metrics_free(&met);
    signal(SIGINT, SIG_IGN); // the handler must not write to a closed (or reused) descriptor
    signal(SIGTERM, SIG_IGN);
    close(stop_pipe[0]), close(stop_pipe[1]);
    return rc < 0 ? cli_fail(rc) : 0;
}
