#include "serve/openai.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/jsonb.h"
#include "base/strbuf.h"
#include "base/utf8.h"

int srv_oai_err(srv_oai_err_t *e, int status, const char *param, const char *code, const char *fmt, ...) {
    e->status = status;
    snprintf(e->type, sizeof e->type, "%s",
             status >= 500   ? "server_error"
             : status == 429 ? "rate_limit_error"
                             : "invalid_request_error");
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

static int nomem(srv_oai_err_t *e) { return srv_oai_err(e, 503, NULL, NULL, "out of memory"); }

// ---- reading requests ----------------------------------------------------------

// The body as a JSON object (UTF-8 checked first: cJSON takes any bytes).
static cJSON *parse_body(const char *body, size_t n, srv_oai_err_t *e) {
    if (utf8_check((const uint8_t *)body, n) != n) {
        srv_oai_err(e, 400, NULL, "invalid_json", "the request body is not valid UTF-8");
        return NULL;
    }
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(body, n, &end, 0);
    if (!j) {
        size_t at = end && end >= body ? (size_t)(end - body) : 0;
        srv_oai_err(e, 400, NULL, "invalid_json", "the request body is not valid JSON (at byte %zu)", at);
        return NULL;
    }
    while (end && end < body + n && (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n'))
        end++;
    if (end && end < body + n) {
        cJSON_Delete(j);
        srv_oai_err(e, 400, NULL, "invalid_json", "the request body has more after its JSON value (at byte %zu)",
                    (size_t)(end - body));
        return NULL;
    }
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        srv_oai_err(e, 400, NULL, "invalid_json", "the request body must be a JSON object");
        return NULL;
    }
    return j;
}

// A JSON number that is an integer in [lo, hi] (null: absent). 1 when given,
// 0 when absent or null, -1 with *e set.
static int get_int(const cJSON *o, const char *key, double lo, double hi, double *out, srv_oai_err_t *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return 0;
    double d = v->valuedouble;
    if (!cJSON_IsNumber(v) || !isfinite(d) || d != floor(d) || d < lo || d > hi)
        return srv_oai_err(e, 400, key, "invalid_value", "'%s' must be an integer in [%.0f, %.0f]", key, lo, hi);
    *out = d;
    return 1;
}

static int get_num(const cJSON *o, const char *key, double lo, double hi, int lo_open, double *out, srv_oai_err_t *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return 0;
    double d = v->valuedouble;
    if (!cJSON_IsNumber(v) || !isfinite(d) || d < lo || d > hi || (lo_open && d == lo))
        return srv_oai_err(e, 400, key, "invalid_value", "'%s' must be a number in %c%g, %g]", key, lo_open ? '(' : '[',
                           lo, hi);
    *out = d;
    return 1;
}

static int get_bool(const cJSON *o, const char *key, int *out, srv_oai_err_t *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsBool(v)) return srv_oai_err(e, 400, key, "invalid_value", "'%s' must be true or false", key);
    *out = cJSON_IsTrue(v);
    return 1;
}

// OpenAI parameters hylo accepts only with the value that changes nothing.
static int neutral(const cJSON *v) {
    if (cJSON_IsNull(v)) return 1;
    if (cJSON_IsNumber(v)) return v->valuedouble == 0;
    if (cJSON_IsFalse(v)) return 1;
    if (cJSON_IsObject(v) || cJSON_IsArray(v)) return v->child == NULL;
    return 0;
}

// Every key of the request must be one hylo knows: an unknown or unsupported
// one is refused, not silently ignored (OpenAI refuses unknown ones too).
static int check_keys(const cJSON *j, srv_kind_t kind, srv_oai_err_t *e) {
    static const char *common[] = {"model",
                                   "max_tokens",
                                   "temperature",
                                   "top_p",
                                   "top_k",
                                   "seed",
                                   "n",
                                   "stop",
                                   "stream",
                                   "stream_options",
                                   "user",
                                   "logprobs",
                                   "presence_penalty",
                                   "frequency_penalty",
                                   "logit_bias",
                                   NULL};
    static const char *zero[] = {"echo", "suffix", "tools", NULL};
    for (const cJSON *v = j->child; v; v = v->next) {
        const char *k = v->string;
        int ok = 0;
        for (int i = 0; common[i] && !ok; i++)
            ok = !strcmp(k, common[i]);
        if (kind == SRV_CHAT)
            ok |= !strcmp(k, "messages") || !strcmp(k, "max_completion_tokens") || !strcmp(k, "top_logprobs");
        if (kind == SRV_COMPLETION) ok |= !strcmp(k, "prompt");
        if (!strcmp(k, "best_of")) ok = cJSON_IsNull(v) || (cJSON_IsNumber(v) && v->valuedouble == 1);
        if (!strcmp(k, "response_format")) {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(v, "type");
            ok = cJSON_IsNull(v) || (cJSON_IsString(t) && !strcmp(t->valuestring, "text"));
        }
        for (int i = 0; zero[i] && !ok; i++)
            if (!strcmp(k, zero[i])) {
                if (!neutral(v))
                    return srv_oai_err(e, 400, k, "unsupported_parameter", "'%s' is not supported (only its default)",
                                       k);
                ok = 1;
            }
        if (!ok) return srv_oai_err(e, 400, k, "unknown_parameter", "Unrecognized request argument supplied: %s", k);
    }
    return 0;
}

// A message's content: a string, or an array of {"type": "text", "text": ...}
// parts (concatenated); null (an assistant turn with tool calls) is "".
static int content_text(const cJSON *c, int i, char **out, srv_oai_err_t *e) {
    *out = NULL;
    if (!c || cJSON_IsNull(c)) return (*out = strdup("")) ? 0 : nomem(e);
    if (cJSON_IsString(c)) return (*out = strdup(c->valuestring)) ? 0 : nomem(e);
    if (!cJSON_IsArray(c))
        return srv_oai_err(e, 400, "messages", "invalid_value", "messages[%d].content must be a string or an array", i);
    size_t len = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, c) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "type"), *x = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsString(t) || strcmp(t->valuestring, "text") || !cJSON_IsString(x))
            return srv_oai_err(e, 400, "messages", "invalid_value",
                               "messages[%d].content: only parts {\"type\": \"text\", \"text\": ...} are supported", i);
        len += strlen(x->valuestring);
    }
    char *s = malloc(len + 1);
    if (!s) return nomem(e);
    s[0] = 0;
    cJSON_ArrayForEach(p, c) strcat(s, cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring);
    *out = s;
    return 0;
}

// Chat messages rendered with the model's template; the messages' own text
// is marked so that it is encoded as text (a user writing "<|im_end|>" gets
// those characters, never the control token).
static int encode_messages(const tok_t *tok, const cJSON *msgs, int add_gen, int32_t **ids, int *n, srv_oai_err_t *e) {
    if (!cJSON_IsArray(msgs) || !msgs->child)
        return srv_oai_err(e, 400, "messages", "invalid_value", "'messages' must be a non-empty array");
    if (tok->chat == TOK_CHAT_NONE)
        return srv_oai_err(e, 400, "messages", "no_chat_template",
                           "the model has no chat template: use /v1/completions");
    int cnt = cJSON_GetArraySize(msgs);
    tok_msg_t *m = calloc((size_t)cnt, sizeof *m);
    if (!m) return nomem(e);
    int rc = 0, i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, msgs) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(x, "role");
        if (!cJSON_IsObject(x) || !cJSON_IsString(role)) {
            rc = srv_oai_err(e, 400, "messages", "invalid_value", "messages[%d] must be an object with a 'role'", i);
            break;
        }
        const char *r = role->valuestring;
        if (!strcmp(r, "developer")) r = "system"; // OpenAI's newer name for it
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "tool")) {
            rc = srv_oai_err(e, 400, "messages", "invalid_value",
                             "messages[%d].role '%.40s' is not one of system, developer, user, assistant, tool", i,
                             role->valuestring);
            break;
        }
        m[i].role = r;
        char *text;
        if ((rc = content_text(cJSON_GetObjectItemCaseSensitive(x, "content"), i, &text, e)) < 0) break;
        m[i++].content = text;
    }
    char *out = NULL;
    uint8_t *plain = NULL;
    if (rc == 0 && tok_chat_render_marked(tok, m, cnt, add_gen, &out, &plain) < 0)
        rc = srv_oai_err(e, err_code() == ERR_NOMEM ? 503 : 400, "messages", NULL, "%s", err_msg());
    if (rc == 0 && tok_encode_marked(tok, out, strlen(out), TOK_SPECIAL, plain, ids, n) < 0)
        rc = srv_oai_err(e, err_code() == ERR_NOMEM ? 503 : 400, "messages", NULL, "%s", err_msg());
    for (int k = 0; k < i; k++)
        free((char *)m[k].content);
    free(m);
    free(out);
    free(plain);
    return rc;
}

// A completion's prompt: text (encoded as 'hylo generate' does: BOS when the
// tokenizer adds one, special tokens recognised: the client writes the whole
// prompt), a one-element array of it, or an array of token ids.
static int encode_prompt(const tok_t *tok, const cJSON *p, int32_t **ids, int *n, srv_oai_err_t *e) {
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && cJSON_IsString(p->child)) p = p->child;
    if (cJSON_IsString(p)) {
        if (tok_encode(tok, p->valuestring, strlen(p->valuestring), 1, ids, n) < 0)
            return srv_oai_err(e, err_code() == ERR_NOMEM ? 503 : 400, "prompt", NULL, "%s", err_msg());
        return 0;
    }
    if (!cJSON_IsArray(p) || !p->child)
        return srv_oai_err(e, 400, "prompt", "invalid_value",
                           "'prompt' must be a string or a non-empty array of token ids (one prompt: n = 1)");
    int cnt = cJSON_GetArraySize(p), i = 0;
    *ids = malloc((size_t)cnt * sizeof(int32_t));
    if (!*ids) return nomem(e);
    const cJSON *x;
    cJSON_ArrayForEach(x, p) {
        double d = x->valuedouble;
        if (!cJSON_IsNumber(x) || d != floor(d) || d < 0 || d >= tok->n_vocab) {
            free(*ids), *ids = NULL;
            return srv_oai_err(e, 400, "prompt", "invalid_value", "prompt[%d] is not a token id in [0, %d)", i,
                               tok->n_vocab);
        }
        (*ids)[i++] = (int32_t)d;
    }
    *n = cnt;
    return 0;
}

// "logit_bias": {"TOKEN_ID": BIAS, ...}: ids of the vocabulary, biases in
// [-100, 100], at most SRV_MAX_BIAS of them; null or {} for none.
static int parse_bias(const tok_t *tok, const cJSON *j, srv_oai_req_t *r, srv_oai_err_t *e) {
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(j, "logit_bias");
    if (!b || cJSON_IsNull(b)) return 0;
    if (!cJSON_IsObject(b))
        return srv_oai_err(e, 400, "logit_bias", "invalid_value", "'logit_bias' must be an object of token ids");
    int n = cJSON_GetArraySize(b);
    if (n > SRV_MAX_BIAS)
        return srv_oai_err(e, 400, "logit_bias", "invalid_value", "'logit_bias' has %d entries, at most %d", n,
                           SRV_MAX_BIAS);
    if (n == 0) return 0;
    r->bias_id = malloc((size_t)n * sizeof(int32_t));
    r->bias = malloc((size_t)n * sizeof(float));
    if (!r->bias_id || !r->bias) return srv_oai_err(e, 503, NULL, NULL, "out of memory");
    for (const cJSON *v = b->child; v; v = v->next) {
        char *end = NULL;
        long id = strtol(v->string, &end, 10);
        if (!*v->string || *end || id < 0 || id >= tok->n_vocab)
            return srv_oai_err(e, 400, "logit_bias", "invalid_value",
                               "logit_bias key '%.40s' is not a token id in [0, %d)", v->string, tok->n_vocab);
        if (!cJSON_IsNumber(v) || !(fabs(v->valuedouble) <= 100))
            return srv_oai_err(e, 400, "logit_bias", "invalid_value",
                               "logit_bias of token %ld must be a number in [-100, 100]", id);
        r->bias_id[r->n_bias] = (int32_t)id, r->bias[r->n_bias] = (float)v->valuedouble;
        r->n_bias++;
    }
    r->sampler.bias_id = r->bias_id, r->sampler.bias = r->bias, r->sampler.n_bias = r->n_bias;
    return 0;
}

static int parse_stop(const cJSON *j, srv_oai_req_t *r, srv_oai_err_t *e) {
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "stop");
    if (!s || cJSON_IsNull(s)) return 0;
    const cJSON *one[1] = {s};
    int cnt = 1;
    if (cJSON_IsArray(s)) {
        cnt = cJSON_GetArraySize(s);
        if (cnt > SRV_MAX_STOP)
            return srv_oai_err(e, 400, "stop", "invalid_value", "'stop' holds at most %d strings", SRV_MAX_STOP);
    }
    const cJSON *x = cJSON_IsArray(s) ? s->child : one[0];
    for (int i = 0; i < cnt; i++, x = x->next) {
        if (!cJSON_IsString(x) || !x->valuestring[0])
            return srv_oai_err(e, 400, "stop", "invalid_value",
                               "'stop' must be a non-empty string or an array of them");
        if (!(r->stop[r->n_stop++] = strdup(x->valuestring))) return nomem(e);
    }
    return 0;
}

int srv_oai_parse(const tok_t *tok, srv_kind_t kind, const char *body, size_t n, int ctx, srv_oai_req_t *r,
                  srv_oai_err_t *e) {
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->sampler = (sampler_cfg_t){.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
    cJSON *j = parse_body(body, n, e);
    if (!j) return -1;
    int rc = check_keys(j, kind, e);
    double d, mt = -1;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(j, "model");
    if (rc == 0 && model && !cJSON_IsString(model) && !cJSON_IsNull(model))
        rc = srv_oai_err(e, 400, "model", "invalid_value", "'model' must be a string");
    if (rc == 0 && (rc = get_int(j, "n", 1, 1e9, &d, e)) > 0 && d != 1)
        rc = srv_oai_err(e, 400, "n", "invalid_value", "only n = 1 is supported (got %.0f)", d);
    if (rc >= 0 && (rc = get_num(j, "temperature", 0, 2, 0, &d, e)) > 0) r->sampler.temperature = (float)d;
    if (rc >= 0 && (rc = get_num(j, "top_p", 0, 1, 1, &d, e)) > 0) r->sampler.top_p = (float)d;
    if (rc >= 0 && (rc = get_num(j, "presence_penalty", -2, 2, 0, &d, e)) > 0) r->sampler.presence_penalty = (float)d;
    if (rc >= 0 && (rc = get_num(j, "frequency_penalty", -2, 2, 0, &d, e)) > 0) r->sampler.frequency_penalty = (float)d;
    // top_k -1 is vLLM's "off", as 0 is hylo's.
    if (rc >= 0 && (rc = get_int(j, "top_k", -1, 1 << 24, &d, e)) > 0) r->sampler.top_k = d < 0 ? 0 : (int)d;
    if (rc >= 0 && (rc = get_int(j, "seed", -9007199254740991.0, 9007199254740991.0, &d, e)) > 0)
        r->sampler.seed = (uint64_t)(int64_t)d, r->seeded = 1;
    if (rc >= 0 && (rc = get_int(j, "max_tokens", 1, 1 << 30, &d, e)) > 0) mt = d;
    if (rc >= 0 && kind == SRV_CHAT && (rc = get_int(j, "max_completion_tokens", 1, 1 << 30, &d, e)) > 0) mt = d;
    // log-probabilities: chat's "logprobs": true with "top_logprobs" (0-20)
    // alternatives; the completions' "logprobs": N alternatives (0-20; OpenAI
    // stops at 5)
    if (rc >= 0 && kind == SRV_CHAT) {
        rc = get_bool(j, "logprobs", &r->logprobs, e);
        if (rc >= 0 && (rc = get_int(j, "top_logprobs", 0, SAMPLER_MAX_TOP, &d, e)) > 0) {
            if (!r->logprobs)
                rc = srv_oai_err(e, 400, "top_logprobs", "invalid_value", "'top_logprobs' needs \"logprobs\": true");
            r->top_logprobs = (int)d;
        }
    } else if (rc >= 0 && (rc = get_int(j, "logprobs", 0, SAMPLER_MAX_TOP, &d, e)) > 0) {
        r->logprobs = 1, r->top_logprobs = (int)d;
    }
    if (rc >= 0) rc = get_bool(j, "stream", &r->stream, e);
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(j, "stream_options");
    if (rc >= 0 && so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so) || !r->stream)
            rc = srv_oai_err(e, 400, "stream_options", "invalid_value",
                             "'stream_options' must be an object and needs \"stream\": true");
        for (const cJSON *v = so->child; rc >= 0 && v; v = v->next)
            if (strcmp(v->string, "include_usage"))
                rc = srv_oai_err(e, 400, "stream_options", "unknown_parameter", "stream_options.%.40s is not supported",
                                 v->string);
        if (rc >= 0) rc = get_bool(so, "include_usage", &r->include_usage, e);
    }
    const cJSON *user = cJSON_GetObjectItemCaseSensitive(j, "user");
    if (rc >= 0 && user && !cJSON_IsString(user) && !cJSON_IsNull(user))
        rc = srv_oai_err(e, 400, "user", "invalid_value", "'user' must be a string");
    if (rc >= 0) rc = parse_stop(j, r, e);
    if (rc >= 0) rc = parse_bias(tok, j, r, e);
    if (rc >= 0) {
        const char *key = kind == SRV_CHAT ? "messages" : "prompt";
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, key);
        if (!p)
            rc = srv_oai_err(e, 400, key, "missing_required_parameter", "'%s' is required", key);
        else if (kind == SRV_CHAT)
            rc = encode_messages(tok, p, 1, &r->ids, &r->n_ids, e);
        else
            rc = encode_prompt(tok, p, &r->ids, &r->n_ids, e);
        if (rc == 0 && r->n_ids < 1) rc = srv_oai_err(e, 400, key, "invalid_value", "the prompt encodes to no tokens");
    }
    // Prompt and answer must fit the context: refused before anything runs.
    if (rc >= 0) {
        const char *mp = kind == SRV_CHAT && cJSON_GetObjectItemCaseSensitive(j, "max_completion_tokens")
                             ? "max_completion_tokens"
                             : "max_tokens";
        if (r->n_ids >= ctx)
            rc = srv_oai_err(e, 400, kind == SRV_CHAT ? "messages" : "prompt", "context_length_exceeded",
                             "the prompt has %d tokens; this server's context (--ctx) holds %d tokens, prompt and "
                             "answer together",
                             r->n_ids, ctx);
        else if (mt > 0 && r->n_ids + mt > ctx)
            rc = srv_oai_err(e, 400, mp, "context_length_exceeded",
                             "the prompt's %d tokens and %s = %.0f exceed this server's context of %d tokens (--ctx)",
                             r->n_ids, mp, mt, ctx);
        else
            r->max_tokens = mt > 0 ? (int)mt : ctx - r->n_ids;
    }
    cJSON_Delete(j);
    if (rc < 0) {
        srv_oai_req_free(r);
        return -1;
    }
    return 0;
}

void srv_oai_req_free(srv_oai_req_t *r) {
    for (int i = 0; i < r->n_stop; i++)
        free(r->stop[i]);
    free(r->ids);
    free(r->bias_id), free(r->bias);
    memset(r, 0, sizeof *r);
}

// ---- writing responses -----------------------------------------------------------

static char *print(jb_t *jb, cJSON *root) {
    char *s = jb->oom || !root ? NULL : cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

static cJSON *str_or_null(jb_t *jb, cJSON *o, const char *key, const char *v) {
    return v && v[0] ? jb_str(jb, o, key, v) : jb_null(jb, o, key);
}

char *srv_oai_error_json(const srv_oai_err_t *e) {
    jb_t jb = {0};
    cJSON *root = jb_root(&jb), *err = jb_obj(&jb, root, "error");
    jb_str(&jb, err, "message", e->msg);
    jb_str(&jb, err, "type", e->type);
    str_or_null(&jb, err, "param", e->param);
    str_or_null(&jb, err, "code", e->code);
    return print(&jb, root);
}

static cJSON *head(jb_t *jb, const char *object, const char *id, long long created, const char *model) {
    cJSON *root = jb_root(jb);
    jb_str(jb, root, "id", id);
    jb_str(jb, root, "object", object);
    jb_int(jb, root, "created", created);
    jb_str(jb, root, "model", model);
    return root;
}

static void usage(jb_t *jb, cJSON *root, int n_prompt, int n_new) {
    cJSON *u = jb_obj(jb, root, "usage");
    jb_int(jb, u, "prompt_tokens", n_prompt);
    jb_int(jb, u, "completion_tokens", n_new);
    jb_int(jb, u, "total_tokens", (long long)n_prompt + n_new);
}

// A token's text as OpenAI's log-probability entries show it (malloc'ed;
// NULL when out of memory): its bytes, those that are not valid UTF-8 on
// their own (a byte-level piece of a character) as U+FFFD.
static char *token_str(const tok_t *tok, int32_t id) {
    size_t n = 0;
    const char *b = tok_bytes(tok, id, &n);
    strbuf_t t = {0};
    strbuf_puts(&t, ""); // "" for an empty token
    for (size_t i = 0; b && i < n;) {
        uint32_t cp;
        int k = utf8_next((const uint8_t *)b + i, n - i, &cp);
        if (k > 0)
            strbuf_putn(&t, b + i, (size_t)k), i += (size_t)k;
        else
            strbuf_puts(&t, "\xEF\xBF\xBD"), i++;
    }
    if (t.oom) free(t.s), t.s = NULL;
    return t.s;
}

// The token's text under key (its bytes too, for chat).
static void token_text(jb_t *jb, cJSON *o, const char *key, const tok_t *tok, int32_t id, int with_bytes) {
    char *t = token_str(tok, id);
    jb_str(jb, o, key, t);
    free(t);
    if (!with_bytes) return;
    size_t n = 0;
    const char *b = tok_bytes(tok, id, &n);
    cJSON *arr = jb_arr(jb, o, "bytes");
    for (size_t i = 0; b && i < n; i++)
        jb_int(jb, arr, NULL, (unsigned char)b[i]);
}

static void token_entry(jb_t *jb, cJSON *o, const tok_t *tok, int32_t id, float lp) {
    token_text(jb, o, "token", tok, id, 1);
    jb_add(jb, o, "logprob", cJSON_CreateNumber(lp));
}

// choices[0].logprobs: null without l; chat: {"content": [{token, logprob,
// bytes, top_logprobs: [{token, logprob, bytes}]}], "refusal": null}; a
// completion: {"tokens", "token_logprobs", "top_logprobs": [{text: logprob}],
// "text_offset"} (offsets of each token's text in the answer's, from
// l->text_offset).
static void logprobs_json(jb_t *jb, cJSON *ch, srv_kind_t kind, const tok_t *tok, const srv_oai_lps_t *l) {
    if (!l) {
        jb_null(jb, ch, "logprobs");
        return;
    }
    cJSON *o = jb_obj(jb, ch, "logprobs");
    if (kind == SRV_CHAT) {
        cJSON *content = jb_arr(jb, o, "content");
        for (int i = 0; i < l->n; i++) {
            cJSON *e = jb_obj(jb, content, NULL);
            token_entry(jb, e, tok, l->ids[i], l->lp[i].logprob);
            cJSON *tops = jb_arr(jb, e, "top_logprobs");
            for (int k = 0; k < l->lp[i].n_top; k++)
                token_entry(jb, jb_obj(jb, tops, NULL), tok, l->lp[i].top_id[k], l->lp[i].top_lp[k]);
        }
        jb_null(jb, o, "refusal");
        return;
    }
    cJSON *tokens = jb_arr(jb, o, "tokens"), *lps = jb_arr(jb, o, "token_logprobs");
    cJSON *tops = jb_arr(jb, o, "top_logprobs"), *offs = jb_arr(jb, o, "text_offset");
    size_t off = l->text_offset;
    for (int i = 0; i < l->n; i++) {
        token_text(jb, tokens, NULL, tok, l->ids[i], 0);
        jb_add(jb, lps, NULL, cJSON_CreateNumber(l->lp[i].logprob));
        cJSON *t = jb_obj(jb, tops, NULL);
        for (int k = 0; k < l->lp[i].n_top; k++) {
            char *key = token_str(tok, l->lp[i].top_id[k]);
            if (!key)
                jb->oom = 1;
            else if (!cJSON_GetObjectItemCaseSensitive(t, key)) // two ids of one text: the more probable
                jb_add(jb, t, key, cJSON_CreateNumber(l->lp[i].top_lp[k]));
            free(key);
        }
        jb_int(jb, offs, NULL, (long long)off);
        size_t n = 0;
        if (tok_bytes(tok, l->ids[i], &n)) off += n;
    }
}

char *srv_oai_response_json(srv_kind_t kind, const char *id, long long created, const char *model, const char *text,
                            const char *finish, int n_prompt, int n_new, const tok_t *tok, const srv_oai_lps_t *lps) {
    jb_t jb = {0};
    cJSON *root = head(&jb, kind == SRV_CHAT ? "chat.completion" : "text_completion", id, created, model);
    cJSON *ch = jb_obj(&jb, jb_arr(&jb, root, "choices"), NULL);
    jb_int(&jb, ch, "index", 0);
    if (kind == SRV_CHAT) {
        cJSON *m = jb_obj(&jb, ch, "message");
        jb_str(&jb, m, "role", "assistant");
        jb_str(&jb, m, "content", text);
    } else {
        jb_str(&jb, ch, "text", text);
    }
    logprobs_json(&jb, ch, kind, tok, lps);
    str_or_null(&jb, ch, "finish_reason", finish);
    usage(&jb, root, n_prompt, n_new);
    return print(&jb, root);
}

char *srv_oai_chunk_json(srv_kind_t kind, const char *id, long long created, const char *model, const char *role,
                         const char *text, const char *finish, const tok_t *tok, const srv_oai_lps_t *lps) {
    jb_t jb = {0};
    cJSON *root = head(&jb, kind == SRV_CHAT ? "chat.completion.chunk" : "text_completion", id, created, model);
    cJSON *ch = jb_obj(&jb, jb_arr(&jb, root, "choices"), NULL);
    jb_int(&jb, ch, "index", 0);
    if (kind == SRV_CHAT) {
        cJSON *d = jb_obj(&jb, ch, "delta");
        if (role) jb_str(&jb, d, "role", role);
        if (text) jb_str(&jb, d, "content", text);
    } else {
        jb_str(&jb, ch, "text", text ? text : "");
    }
    logprobs_json(&jb, ch, kind, tok, lps);
    str_or_null(&jb, ch, "finish_reason", finish);
    return print(&jb, root);
}

char *srv_oai_usage_chunk_json(srv_kind_t kind, const char *id, long long created, const char *model, int n_prompt,
                               int n_new) {
    jb_t jb = {0};
    cJSON *root = head(&jb, kind == SRV_CHAT ? "chat.completion.chunk" : "text_completion", id, created, model);
    jb_arr(&jb, root, "choices");
    usage(&jb, root, n_prompt, n_new);
    return print(&jb, root);
}

char *srv_oai_models_json(const char *model, long long created, int ctx) {
    jb_t jb = {0};
    cJSON *root = jb_root(&jb);
    jb_str(&jb, root, "object", "list");
    cJSON *m = jb_obj(&jb, jb_arr(&jb, root, "data"), NULL);
    jb_str(&jb, m, "id", model);
    jb_str(&jb, m, "object", "model");
    jb_int(&jb, m, "created", created);
    jb_str(&jb, m, "owned_by", "hylo");
    jb_int(&jb, m, "max_model_len", ctx);
    return print(&jb, root);
}

// ---- /tokenize, /detokenize --------------------------------------------------------

char *srv_oai_tokenize(const tok_t *tok, const char *body, size_t n, int ctx, srv_oai_err_t *e) {
    cJSON *j = parse_body(body, n, e);
    if (!j) return NULL;
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prompt"),
                *m = cJSON_GetObjectItemCaseSensitive(j, "messages");
    int32_t *ids = NULL;
    int cnt = 0, rc = 0, add_gen = 1;
    for (const cJSON *v = j->child; v && rc == 0; v = v->next)
        if (strcmp(v->string, "prompt") && strcmp(v->string, "messages") && strcmp(v->string, "model") &&
            strcmp(v->string, "add_generation_prompt"))
            rc = srv_oai_err(e, 400, v->string, "unknown_parameter", "Unrecognized request argument supplied: %s",
                             v->string);
    if (rc == 0 && !p == !m)
        rc = srv_oai_err(e, 400, NULL, "invalid_value", "give exactly one of 'prompt' and 'messages'");
    if (rc == 0 && m) rc = get_bool(j, "add_generation_prompt", &add_gen, e);
    if (rc >= 0) rc = m ? encode_messages(tok, m, add_gen, &ids, &cnt, e) : encode_prompt(tok, p, &ids, &cnt, e);
    char *s = NULL;
    if (rc == 0) {
        jb_t jb = {0};
        cJSON *root = jb_root(&jb), *a = jb_arr(&jb, root, "tokens");
        for (int i = 0; i < cnt; i++)
            jb_int(&jb, a, NULL, ids[i]);
        jb_int(&jb, root, "count", cnt);
        jb_int(&jb, root, "max_model_len", ctx);
        if (!(s = print(&jb, root))) nomem(e);
    }
    free(ids);
    cJSON_Delete(j);
    return s;
}

char *srv_oai_detokenize(const tok_t *tok, const char *body, size_t n, srv_oai_err_t *e) {
    cJSON *j = parse_body(body, n, e);
    if (!j) return NULL;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "tokens");
    int rc = 0;
    for (const cJSON *v = j->child; v && rc == 0; v = v->next)
        if (strcmp(v->string, "tokens") && strcmp(v->string, "model"))
            rc = srv_oai_err(e, 400, v->string, "unknown_parameter", "Unrecognized request argument supplied: %s",
                             v->string);
    int32_t *ids = NULL;
    int cnt = 0;
    if (rc == 0 && !cJSON_IsArray(t))
        rc = srv_oai_err(e, 400, "tokens", "invalid_value", "'tokens' must be an array of token ids");
    // The same checks as a completion's prompt of ids (an empty list is allowed here).
    if (rc == 0 && t->child && (rc = encode_prompt(tok, t, &ids, &cnt, e)) < 0)
        snprintf(e->param, sizeof e->param, "tokens");
    // Through the streaming decoder: bytes that are not valid UTF-8 (a
    // multi-byte character cut) become U+FFFD, so the JSON stays valid.
    strbuf_t text = {0};
    tok_stream_t ts;
    tok_stream_init(&ts, tok, 0);
    const char *piece;
    size_t len;
    for (int i = 0; rc == 0 && i < cnt; i++)
        if (tok_stream_feed(&ts, ids[i], &piece, &len) == 0) strbuf_putn(&text, piece, len);
    if (rc == 0 && tok_stream_flush(&ts, &piece, &len) == 0) strbuf_putn(&text, piece, len);
    tok_stream_free(&ts);
    char *s = NULL;
    if (rc == 0 && text.oom) rc = nomem(e);
    if (rc == 0) {
        jb_t jb = {0};
        cJSON *root = jb_root(&jb);
        jb_str(&jb, root, "prompt", text.s ? text.s : "");
        if (!(s = print(&jb, root))) nomem(e);
    }
    free(text.s);
    free(ids);
    cJSON_Delete(j);
    return s;
}
