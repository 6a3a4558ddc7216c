// libFuzzer target for hylo serve's request reader (serve/openai.c): the
// input's first byte picks the endpoint (chat completions, completions,
// /tokenize, /detokenize), the rest is the HTTP body. A request that parses
// must hold a prompt of at least one id inside the vocabulary, a token budget
// that fits the context, at most SRV_MAX_STOP non-empty stop strings and a
// valid sampler configuration (penalties, log-probabilities and logit biases
// in their ranges); a refusal must carry a 4xx/5xx status and a
// message. The tokenizer (with its ChatML template) is read once from the
// tokenizer corpus's smollm2_first300_tmpl (tokenizer.json, NUL,
// tokenizer_config.json, NUL, template), or from $HYLO_FUZZ_TOKENIZER.
// Build: make fuzz; run: see docs/FUZZING.md.
#include <math.h>

#include "fuzz_util.h"
#include "serve/openai.h"
#include "tok/tok.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { CTX = 256 };

static tok_t *tokenizer(void) {
    static tok_t t;
    static int ready;
    if (ready) return &t;
    const char *path = getenv("HYLO_FUZZ_TOKENIZER");
    if (!path) path = "fuzz/corpus_tokenizer/smollm2_first300_tmpl";
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "fuzz_openai: cannot open %s (run from the repository root or set HYLO_FUZZ_TOKENIZER)\n",
                path);
        abort();
    }
    static uint8_t buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    char *part[FUZZ_MAX_PARTS];
    size_t len[FUZZ_MAX_PARTS];
    int k = fuzz_split(buf, n, part, len);
    const char *tj = fuzz_memfile(0, part[0], len[0]);
    const char *tc = k > 1 ? fuzz_memfile(1, part[1], len[1]) : NULL;
    if (k < 3 || tok_load_json(&t, tj, tc) != 0 || tok_set_chat_template(&t, part[2]) != 0) {
        fprintf(stderr, "fuzz_openai: %s is not a tokenizer with a chat template\n", path);
        abort();
    }
    for (int i = 0; i < FUZZ_MAX_PARTS; i++)
        free(part[i]);
    ready = 1;
    return &t;
}

static void check_error(const srv_oai_err_t *e) {
    if (e->status < 400 || e->status > 599 || !e->msg[0]) abort();
    char *j = srv_oai_error_json(e);
    free(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    log_set_level(LOG_ERROR);
    const tok_t *t = tokenizer();
    const char *body = (const char *)data + 1;
    size_t n = size - 1;
    srv_oai_err_t e = {0};
    switch (data[0] & 3) {
    case 0:
    case 1: {
        srv_oai_req_t r = {0};
        if (srv_oai_parse(t, (data[0] & 3) ? SRV_COMPLETION : SRV_CHAT, body, n, CTX, &r, &e) == 0) {
            if (r.n_ids < 1 || r.max_tokens < 1 || r.n_ids + r.max_tokens > CTX) abort();
            for (int i = 0; i < r.n_ids; i++)
                if (r.ids[i] < 0 || r.ids[i] >= t->n_vocab) abort();
            if (r.n_stop < 0 || r.n_stop > SRV_MAX_STOP) abort();
            for (int i = 0; i < r.n_stop; i++)
                if (!r.stop[i] || !r.stop[i][0]) abort();
            if (!(r.sampler.temperature >= 0) || !(r.sampler.top_p > 0 && r.sampler.top_p <= 1) || r.sampler.top_k < 0)
                abort();
            if (!(fabsf(r.sampler.presence_penalty) <= 2) || !(fabsf(r.sampler.frequency_penalty) <= 2)) abort();
            if (r.top_logprobs < 0 || r.top_logprobs > SAMPLER_MAX_TOP || (r.top_logprobs && !r.logprobs)) abort();
            if (r.n_bias < 0 || r.n_bias > SRV_MAX_BIAS || r.sampler.n_bias != r.n_bias) abort();
            for (int i = 0; i < r.n_bias; i++)
                if (r.sampler.bias_id[i] < 0 || r.sampler.bias_id[i] >= t->n_vocab ||
                    !(fabsf(r.sampler.bias[i]) <= 100))
                    abort();
        } else {
            check_error(&e);
        }
        srv_oai_req_free(&r);
        break;
    }
    case 2: {
        char *j = srv_oai_tokenize(t, body, n, CTX, &e);
        if (!j) check_error(&e);
        free(j);
        break;
    }
    default: {
        char *j = srv_oai_detokenize(t, body, n, &e);
        if (!j) check_error(&e);
        free(j);
    }
    }
    return 0;
}
