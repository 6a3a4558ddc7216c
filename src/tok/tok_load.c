// Tokenizer loaders: GGUF `tokenizer.ggml.*` metadata and Hugging Face
// tokenizer.json + tokenizer_config.json. Both fill the same tok_t and finish
// with tok_build (tok.c).
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "base/checked.h"
#include "base/err.h"
#include "base/fs.h"
#include "base/log.h"
#include "tok/tok_internal.h"

static void tok_reset(tok_t *t) {
    memset(t, 0, sizeof *t);
    t->bos = t->eos = t->unk = t->pad = t->eot = t->eom = -1;
}

// ---------------------------------------------------------------------------
// GGUF

// GGUF `tokenizer.ggml.pre` names and the family each uses (llama-vocab.cpp).
static int pre_from_name(const char *s, tok_pre_t *p) {
    static const char *smollm[] = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"};
    for (size_t i = 0; i < sizeof smollm / sizeof *smollm; i++)
        if (!strcmp(s, smollm[i])) return *p = TOK_PRE_SMOLLM, 1;
    if (!strcmp(s, "llama-bpe") || !strcmp(s, "llama3") || !strcmp(s, "llama-v3")) return *p = TOK_PRE_LLAMA3, 1;
    if (!strcmp(s, "qwen2")) return *p = TOK_PRE_QWEN2, 1;
    if (!strcmp(s, "gpt-2") || !strcmp(s, "gpt2") || !strcmp(s, "default")) return *p = TOK_PRE_GPT2, 1;
    return 0;
}

static int gguf_special_id(const gguf_t *g, const tok_t *t, const char *key, int32_t *out) {
    int64_t v = -1;
    TRY(gguf_opt_int(g, key, &v));
    if (v < 0 || v == (int64_t)UINT32_MAX) { // absent, or the "unset" marker some converters write
        *out = -1;
        return 0;
    }
    if (v >= t->n_vocab)
        return err_set(ERR_INPUT, "%s: %s = %lld is out of range [0, %d)", g->mf.path, key, (long long)v, t->n_vocab);
    *out = (int32_t)v;
    return 0;
}

static int load_gguf(tok_t *t, const gguf_t *g) {
    const char *src = g->mf.path;
    const char *model;
    size_t mlen;
    TRY(gguf_get_str(g, "tokenizer.ggml.model", &model, &mlen));
    if (mlen == 5 && !memcmp(model, "llama", 5))
        return err_set(ERR_UNSUP,
                       "%s: tokenizer.ggml.model = llama (SentencePiece) is not supported; only byte-level BPE "
                       "(gpt2) tokenizers are",
                       src);
    if (!(mlen == 4 && !memcmp(model, "gpt2", 4)))
        return err_set(ERR_UNSUP, "%s: tokenizer.ggml.model = %.*s is not supported; only byte-level BPE (gpt2)", src,
                       (int)mlen, model);

    // Pre-tokenizer family.
    const char *pre = "default";
    size_t plen = 7;
    if (gguf_find(g, "tokenizer.ggml.pre")) TRY(gguf_get_str(g, "tokenizer.ggml.pre", &pre, &plen));
    snprintf(t->pre_name, sizeof t->pre_name, "%.*s", (int)plen, pre);
    tok_pre_t fam;
    if (!pre_from_name(t->pre_name, &fam))
        return err_set(ERR_UNSUP,
                       "%s: tokenizer.ggml.pre = %s is not supported (known: smollm, gpt2, llama-bpe, qwen2 and "
                       "their aliases)",
                       src, t->pre_name);
    TRY(tok_set_pre_family(t, fam));
    // Llama 3's tokenizer.json has ignore_merges; GGUF has no key for it
    // (llama.cpp too ties it to the llama-bpe pre-tokenizer).
    t->ignore_merges = fam == TOK_PRE_LLAMA3;
    int space_prefix = 0;
    TRY(gguf_opt_bool(g, "tokenizer.ggml.add_space_prefix", &space_prefix));
    if (space_prefix) return err_set(ERR_UNSUP, "%s: tokenizer.ggml.add_space_prefix = true is not supported", src);

    // Vocabulary.
    const gguf_kv_t *tk, *tt = NULL, *mg;
    TRY(gguf_get_arr(g, "tokenizer.ggml.tokens", GGUF_STRING, &tk));
    if (tk->arr_n == 0 || tk->arr_n > (uint64_t)LIM_VOCAB)
        return err_set(ERR_INPUT, "%s: tokenizer.ggml.tokens: %llu entries (expected 1 .. %lld)", src,
                       (unsigned long long)tk->arr_n, (long long)LIM_VOCAB);
    int n = (int)tk->arr_n;
    const gguf_kv_t *ttkv = gguf_find(g, "tokenizer.ggml.token_type");
    if (ttkv) {
        if (ttkv->type != GGUF_ARRAY || (ttkv->arr_type != GGUF_INT32 && ttkv->arr_type != GGUF_UINT32))
            return err_set(ERR_INPUT, "%s: tokenizer.ggml.token_type: expected an int32 array", src);
        tt = ttkv;
        if (tt->arr_n != tk->arr_n)
            return err_set(ERR_INPUT, "%s: tokenizer.ggml.token_type has %llu entries, tokenizer.ggml.tokens %d", src,
                           (unsigned long long)tt->arr_n, n);
    }
    size_t blob = 0;
    for (int i = 0; i < n; i++) {
        size_t l;
        gguf_arr_str(tk, (uint64_t)i, &l);
        blob += l;
    }
    if (blob > UINT32_MAX) return err_set(ERR_INPUT, "%s: tokenizer.ggml.tokens: %zu bytes of text", src, blob);
    TRY(tok_alloc_vocab(t, n, blob));
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        size_t l;
        const char *s = gguf_arr_str(tk, (uint64_t)i, &l);
        memcpy(t->blob + o, s, l);
        t->off[i] = (uint32_t)o;
        t->len[i] = (uint32_t)l;
        o += l;
        int64_t ty = tt ? gguf_arr_int(tt, (uint64_t)i) : TOK_NORMAL;
        if (ty < 1 || ty > 6)
            return err_set(ERR_INPUT, "%s: tokenizer.ggml.token_type[%d] = %lld (expected 1..6)", src, i,
                           (long long)ty);
        t->type[i] = (uint8_t)ty;
    }
    TRY(tok_build_vocab(t, src));

    // Merges "a b" in rank order. Byte-level token texts never contain a
    // space, so the first space (after the first char) separates the parts.
    TRY(gguf_get_arr(g, "tokenizer.ggml.merges", GGUF_STRING, &mg));
    if (mg->arr_n > (uint64_t)LIM_ENTRIES)
        return err_set(ERR_INPUT, "%s: tokenizer.ggml.merges: %llu entries (the limit is %lld)", src,
                       (unsigned long long)mg->arr_n, (long long)LIM_ENTRIES);
    TRY(tok_alloc_merges(t, (int)mg->arr_n));
    for (int i = 0; i < t->n_merges; i++) {
        size_t l;
        const char *s = gguf_arr_str(mg, (uint64_t)i, &l);
        const char *sp = l > 1 ? memchr(s + 1, ' ', l - 1) : NULL;
        if (!sp)
            return err_set(ERR_INPUT, "%s: tokenizer.ggml.merges[%d] = \"%.*s\": expected \"a b\"", src, i, (int)l, s);
        TRY(tok_set_merge(t, i, s, (size_t)(sp - s), sp + 1, l - (size_t)(sp - s) - 1, src, "tokenizer.ggml.merges"));
    }

    TRY(gguf_special_id(g, t, "tokenizer.ggml.bos_token_id", &t->bos));
    TRY(gguf_special_id(g, t, "tokenizer.ggml.eos_token_id", &t->eos));
    TRY(gguf_special_id(g, t, "tokenizer.ggml.unknown_token_id", &t->unk));
    TRY(gguf_special_id(g, t, "tokenizer.ggml.padding_token_id", &t->pad));
    TRY(gguf_special_id(g, t, "tokenizer.ggml.eot_token_id", &t->eot));
    TRY(gguf_special_id(g, t, "tokenizer.ggml.eom_token_id", &t->eom));
    TRY(gguf_opt_bool(g, "tokenizer.ggml.add_bos_token", &t->add_bos));
    TRY(gguf_opt_bool(g, "tokenizer.ggml.add_eos_token", &t->add_eos));

    const gguf_kv_t *ct = gguf_find(g, "tokenizer.chat_template");
    if (ct) {
        const char *s;
        size_t l;
        TRY(gguf_get_str(g, "tokenizer.chat_template", &s, &l));
        if (!(t->chat_template = tok_strndup(s, l))) return err_set(ERR_NOMEM, "out of memory");
    }
    // The model's context length stands in for model_max_length.
    const char *arch;
    size_t alen;
    if (gguf_find(g, "general.architecture") && gguf_get_str(g, "general.architecture", &arch, &alen) == 0) {
        char key[128];
        snprintf(key, sizeof key, "%.*s.context_length", (int)(alen < 100 ? alen : 100), arch);
        int64_t ctx = 0;
        if (gguf_opt_int(g, key, &ctx) == 0 && ctx > 0) t->model_max_length = ctx;
    }
    snprintf(t->tokenizer_class, sizeof t->tokenizer_class, "%s",
             fam == TOK_PRE_LLAMA3  ? "PreTrainedTokenizerFast"
             : fam == TOK_PRE_QWEN2 ? "Qwen2Tokenizer"
                                    : "GPT2Tokenizer");
    return tok_build(t, src);
}

int tok_load_gguf(tok_t *t, const gguf_t *g) {
    tok_reset(t);
    int rc = load_gguf(t, g);
    if (rc < 0) tok_free(t);
    return rc;
}

// ---------------------------------------------------------------------------
// tokenizer.json

static const char *jstr(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int jbool(const cJSON *o, const char *k, int dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

// Integer value of a JSON number, or 0 if it is not an integer in [lo, hi].
static int jint(const cJSON *v, double lo, double hi, int64_t *out) {
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!(d >= lo && d <= hi) || d != (double)(int64_t)d) return 0;
    *out = (int64_t)d;
    return 1;
}

static int cmp_strp(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

static int read_json(const char *path, cJSON **out) {
    char *txt;
    size_t len;
    TRY(fs_read_all(path, &txt, &len));
    *out = cJSON_ParseWithLength(txt, len);
    if (!*out) {
        const char *e = cJSON_GetErrorPtr();
        long at = e && e >= txt && e <= txt + len ? (long)(e - txt) : -1;
        free(txt);
        return err_set(ERR_INPUT, "%s: invalid JSON near byte %ld", path, at);
    }
    free(txt);
    return 0;
}

// One pre-tokenizer step of tokenizer.json -> regex passes.
static int json_pre_step(tok_t *t, const cJSON *p, const char *src, const char *field, int *bytelevel, int *bl_regex,
                         int *digits) {
    const char *ty = jstr(p, "type");
    if (!ty) return err_set(ERR_INPUT, "%s: %s.type: missing", src, field);
    if (!strcmp(ty, "ByteLevel")) {
        if (jbool(p, "add_prefix_space", 0))
            return err_set(ERR_UNSUP, "%s: %s: ByteLevel add_prefix_space = true is not supported", src, field);
        *bytelevel = 1;
        *bl_regex = jbool(p, "use_regex", 1);
        if (*bl_regex) TRY(tok_add_pass(t, TOK_RE_GPT2));
        return 0;
    }
    if (!strcmp(ty, "Digits")) {
        *digits = jbool(p, "individual_digits", 0) ? 1 : 2;
        return tok_add_pass(t, *digits == 1 ? TOK_RE_DIGIT : TOK_RE_DIGITS);
    }
    if (!strcmp(ty, "Split")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
        const char *re = jstr(pat, "Regex");
        const char *beh = jstr(p, "behavior");
        if (!re) return err_set(ERR_UNSUP, "%s: %s.pattern: only {\"Regex\": ...} patterns are supported", src, field);
        if (!beh || strcmp(beh, "Isolated") != 0 || jbool(p, "invert", 0))
            return err_set(ERR_UNSUP,
                           "%s: %s: only Split with behavior Isolated and invert false is supported (got %s)", src,
                           field, beh ? beh : "none");
        return tok_add_pass(t, re);
    }
    return err_set(ERR_UNSUP, "%s: %s: pre-tokenizer type %s is not supported", src, field, ty);
}

static int json_pre(tok_t *t, const cJSON *root, const char *src) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    if (!p || cJSON_IsNull(p))
        return err_set(ERR_UNSUP, "%s: pre_tokenizer: null (not a byte-level BPE tokenizer)", src);
    int bytelevel = 0, bl_regex = 0, digits = 0;
    const char *ty = jstr(p, "type");
    if (ty && !strcmp(ty, "Sequence")) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        if (!cJSON_IsArray(arr)) return err_set(ERR_INPUT, "%s: pre_tokenizer.pretokenizers: expected an array", src);
        int i = 0;
        const cJSON *s;
        cJSON_ArrayForEach(s, arr) {
            char f[64];
            snprintf(f, sizeof f, "pre_tokenizer.pretokenizers[%d]", i++);
            TRY(json_pre_step(t, s, src, f, &bytelevel, &bl_regex, &digits));
        }
    } else {
        TRY(json_pre_step(t, p, src, "pre_tokenizer", &bytelevel, &bl_regex, &digits));
    }
    if (!bytelevel) return err_set(ERR_UNSUP, "%s: pre_tokenizer has no ByteLevel step (not byte-level BPE)", src);
    // Name the family when the passes are exactly a known one.
    t->pre = TOK_PRE_CUSTOM;
    if (t->n_pass == 2 && digits == 1 && bl_regex && !strcmp(t->pass_src[0], TOK_RE_DIGIT))
        t->pre = TOK_PRE_SMOLLM;
    else if (t->n_pass == 1 && bl_regex)
        t->pre = TOK_PRE_GPT2;
    else if (t->n_pass == 1 && !strcmp(t->pass_src[0], TOK_RE_LLAMA3))
        t->pre = TOK_PRE_LLAMA3;
    else if (t->n_pass == 1 && !strcmp(t->pass_src[0], TOK_RE_QWEN2))
        t->pre = TOK_PRE_QWEN2;
    snprintf(t->pre_name, sizeof t->pre_name, "%s", tok_pre_name(t->pre));
    return 0;
}

// A token in tokenizer_config.json: "text" or {"content": "text", ...}.
static int config_token(const tok_t *t, const cJSON *cfg, const char *key, const char *src, int32_t *id) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (!v || cJSON_IsNull(v)) return 0;
    const char *s = cJSON_IsString(v) ? v->valuestring : jstr(v, "content");
    if (!s) return err_set(ERR_INPUT, "%s: %s: expected a string or {\"content\": ...}", src, key);
    int32_t i = tok_find(t, s, strlen(s));
    if (i < 0) return err_set(ERR_INPUT, "%s: %s = \"%s\" is not in the vocabulary", src, key, s);
    *id = i;
    return 0;
}

static int load_config(tok_t *t, const char *path) {
    cJSON *cfg;
    TRY(read_json(path, &cfg));
    int rc = 0;
    if (!cJSON_IsObject(cfg)) {
        rc = err_set(ERR_INPUT, "%s: expected a JSON object", path);
        goto out;
    }
    if ((rc = config_token(t, cfg, "bos_token", path, &t->bos)) < 0) goto out;
    if ((rc = config_token(t, cfg, "eos_token", path, &t->eos)) < 0) goto out;
    if ((rc = config_token(t, cfg, "pad_token", path, &t->pad)) < 0) goto out;
    if ((rc = config_token(t, cfg, "unk_token", path, &t->unk)) < 0) goto out;
    t->add_bos = jbool(cfg, "add_bos_token", t->add_bos);
    t->add_eos = jbool(cfg, "add_eos_token", t->add_eos);
    const char *cls = jstr(cfg, "tokenizer_class");
    if (cls) snprintf(t->tokenizer_class, sizeof t->tokenizer_class, "%s", cls);
    int64_t mml;
    // transformers writes 1e30 for "no limit"; that stays 0 (unknown) here.
    if (jint(cJSON_GetObjectItemCaseSensitive(cfg, "model_max_length"), 1, 1e15, &mml)) t->model_max_length = mml;

    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    const char *tmpl = NULL;
    if (cJSON_IsString(ct)) {
        tmpl = ct->valuestring;
    } else if (cJSON_IsArray(ct)) { // [{"name": "default", "template": ...}, ...]
        const cJSON *e;
        cJSON_ArrayForEach(e, ct) {
            const char *nm = jstr(e, "name");
            if (nm && !strcmp(nm, "default")) tmpl = jstr(e, "template");
        }
    }
    if (tmpl) {
        if (!(t->chat_template = tok_strndup(tmpl, strlen(tmpl)))) rc = err_set(ERR_NOMEM, "out of memory");
    }
out:
    cJSON_Delete(cfg);
    return rc;
}

// Newer transformers keep the template in chat_template.jinja beside the config.
static int load_jinja(tok_t *t, const char *dir_of) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", dir_of);
    char *sl = strrchr(dir, '/');
    if (sl)
        *sl = 0;
    else
        snprintf(dir, sizeof dir, ".");
    char p[1100];
    TRY(fs_join(p, sizeof p, dir, "chat_template.jinja"));
    if (!fs_exists(p)) return 0;
    size_t len;
    return fs_read_all(p, &t->chat_template, &len);
}

static int load_json(tok_t *t, const char *path, const char *cfg_path) {
    cJSON *root;
    TRY(read_json(path, &root));
    int rc = 0;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    const char *mt = jstr(model, "type");
    int n_vocab = 0, n_added = 0, i;
    const cJSON *e;
    char **text = NULL;
    const char **sorted = NULL;
    uint8_t *ty = NULL;

    if (!cJSON_IsObject(model)) {
        rc = err_set(ERR_INPUT, "%s: model: missing or not an object", path);
        goto out;
    }
    if (mt && strcmp(mt, "BPE") != 0) {
        rc = err_set(ERR_UNSUP, "%s: model.type = %s is not supported (only BPE)", path, mt);
        goto out;
    }
    if (!cJSON_IsObject(vocab)) {
        rc = err_set(ERR_INPUT, "%s: model.vocab: missing or not an object", path);
        goto out;
    }
    if (!cJSON_IsArray(merges)) {
        rc = err_set(ERR_INPUT, "%s: model.merges: missing or not an array", path);
        goto out;
    }
    if (added && !cJSON_IsArray(added) && !cJSON_IsNull(added)) {
        rc = err_set(ERR_INPUT, "%s: added_tokens: expected an array", path);
        goto out;
    }
    if (jbool(model, "byte_fallback", 0)) {
        rc = err_set(ERR_UNSUP, "%s: model.byte_fallback = true is not supported", path);
        goto out;
    }
    const char *csp = jstr(model, "continuing_subword_prefix"), *eows = jstr(model, "end_of_word_suffix");
    if ((csp && *csp) || (eows && *eows)) {
        rc = err_set(ERR_UNSUP, "%s: model.continuing_subword_prefix / end_of_word_suffix are not supported", path);
        goto out;
    }
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (norm && !cJSON_IsNull(norm)) {
        const char *nt = jstr(norm, "type");
        // Qwen2/3 declare NFC. Text is almost always NFC already; we do not
        // re-normalise, which only matters for decomposed input.
        if (nt && !strcmp(nt, "NFC")) {
            log_warn("%s: normalizer NFC is not applied (input text is taken as NFC)", path);
        } else {
            rc = err_set(ERR_UNSUP, "%s: normalizer %s is not supported", path, nt ? nt : "?");
            goto out;
        }
    }

    // Every id in model.vocab and added_tokens must be distinct and together
    // cover 0..n-1: n is the number of distinct tokens.
    n_vocab = cJSON_GetArraySize(vocab);
    if (n_vocab > LIM_VOCAB || cJSON_GetArraySize(added) > LIM_VOCAB) {
        rc = err_set(ERR_INPUT, "%s: model.vocab has %d entries and added_tokens %d (the limit is %lld tokens)", path,
                     n_vocab, cJSON_GetArraySize(added), (long long)LIM_VOCAB);
        goto out;
    }
    // The vocabulary's texts sorted, so each added token's lookup is a binary
    // search (cJSON's object lookup is a linear scan: quadratic over a file).
    if (!(sorted = malloc(((size_t)n_vocab + 1) * sizeof *sorted))) {
        rc = err_set(ERR_NOMEM, "%s: out of memory sorting %d vocabulary entries", path, n_vocab);
        goto out;
    }
    i = 0;
    cJSON_ArrayForEach(e, vocab) sorted[i++] = e->string;
    qsort(sorted, (size_t)n_vocab, sizeof *sorted, cmp_strp);
    i = 0;
    cJSON_ArrayForEach(e, added) {
        int64_t id;
        const char *c = jstr(e, "content");
        if (!c || !jint(cJSON_GetObjectItemCaseSensitive(e, "id"), 0, (double)(LIM_VOCAB - 1), &id)) {
            rc =
                err_set(ERR_INPUT, "%s: added_tokens[%d]: expected {\"id\": integer in [0, %lld], \"content\": string}",
                        path, i, (long long)(LIM_VOCAB - 1));
            goto out;
        }
        if (!bsearch(&c, sorted, (size_t)n_vocab, sizeof *sorted, cmp_strp)) n_added++;
        i++;
    }
    int n = n_vocab + n_added;
    if (n > LIM_VOCAB) {
        rc = err_set(ERR_INPUT, "%s: %d tokens in model.vocab and added_tokens (the limit is %lld)", path, n,
                     (long long)LIM_VOCAB);
        goto out;
    }
    text = calloc((size_t)n + 1, sizeof(char *));
    ty = calloc((size_t)n + 1, 1);
    if (!text || !ty) {
        rc = err_set(ERR_NOMEM, "%s: out of memory for a vocabulary of %d tokens", path, n);
        goto out;
    }
    cJSON_ArrayForEach(e, vocab) {
        int64_t id;
        if (!jint(e, -1e18, 1e18, &id)) {
            rc = err_set(ERR_INPUT, "%s: model.vocab[\"%s\"]: expected an integer id", path, e->string);
            goto out;
        }
        if (id < 0 || id >= n) {
            rc = err_set(ERR_INPUT, "%s: model.vocab[\"%s\"] = %lld: id out of range [0, %d)", path, e->string,
                         (long long)id, n);
            goto out;
        }
        if (text[id]) {
            rc = err_set(ERR_INPUT, "%s: model.vocab[\"%s\"] = %lld: id already used by \"%s\"", path, e->string,
                         (long long)id, text[id]);
            goto out;
        }
        text[id] = e->string;
        ty[id] = TOK_NORMAL;
    }
    i = 0;
    cJSON_ArrayForEach(e, added) {
        int64_t id = 0;
        const char *c = jstr(e, "content");
        jint(cJSON_GetObjectItemCaseSensitive(e, "id"), 0, (double)(LIM_VOCAB - 1), &id);
        if (id >= n) {
            rc = err_set(ERR_INPUT, "%s: added_tokens[%d] (\"%s\"): id %lld out of range [0, %d)", path, i, c,
                         (long long)id, n);
            goto out;
        }
        if (text[id] && strcmp(text[id], c) != 0) {
            rc = err_set(ERR_INPUT, "%s: added_tokens[%d] (\"%s\"): id %lld is already \"%s\" in model.vocab", path, i,
                         c, (long long)id, text[id]);
            goto out;
        }
        if (jbool(e, "lstrip", 0) || jbool(e, "rstrip", 0) || jbool(e, "single_word", 0))
            log_warn("%s: added_tokens[%d] (\"%s\"): lstrip/rstrip/single_word are not applied", path, i, c);
        text[id] = (char *)c;
        ty[id] = jbool(e, "special", 0) ? TOK_CONTROL : TOK_USER;
        i++;
    }
    size_t blob = 0;
    for (i = 0; i < n; i++) {
        if (!text[i]) { // a hole means some id lies outside 0..n-1
            rc = err_set(ERR_INPUT, "%s: model.vocab / added_tokens: no token has id %d (ids must cover 0..%d)", path,
                         i, n - 1);
            goto out;
        }
        blob += strlen(text[i]);
    }
    if (blob > UINT32_MAX) { // token offsets are uint32
        rc = err_set(ERR_INPUT, "%s: model.vocab / added_tokens: %zu bytes of token text (the limit is %u)", path, blob,
                     UINT32_MAX);
        goto out;
    }
    if ((rc = tok_alloc_vocab(t, n, blob)) < 0) goto out;
    size_t o = 0;
    for (i = 0; i < n; i++) {
        size_t l = strlen(text[i]);
        memcpy(t->blob + o, text[i], l);
        t->off[i] = (uint32_t)o;
        t->len[i] = (uint32_t)l;
        t->type[i] = ty[i];
        o += l;
    }
    if ((rc = tok_build_vocab(t, path)) < 0) goto out;

    // Merges: "a b" strings or ["a", "b"] pairs.
    if (cJSON_GetArraySize(merges) > LIM_ENTRIES) {
        rc = err_set(ERR_INPUT, "%s: model.merges: %d entries (the limit is %lld)", path, cJSON_GetArraySize(merges),
                     (long long)LIM_ENTRIES);
        goto out;
    }
    if ((rc = tok_alloc_merges(t, cJSON_GetArraySize(merges))) < 0) goto out;
    i = 0;
    cJSON_ArrayForEach(e, merges) {
        const char *l = NULL, *r = NULL;
        size_t ll = 0, rl = 0;
        if (cJSON_IsString(e)) {
            const char *s = e->valuestring;
            size_t sl = strlen(s);
            const char *sp = sl > 1 ? memchr(s + 1, ' ', sl - 1) : NULL;
            if (sp) l = s, ll = (size_t)(sp - s), r = sp + 1, rl = sl - ll - 1;
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(cJSON_GetArrayItem(e, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(e, 1))) {
            l = cJSON_GetArrayItem(e, 0)->valuestring, ll = strlen(l);
            r = cJSON_GetArrayItem(e, 1)->valuestring, rl = strlen(r);
        }
        if (!l) {
            char *p = cJSON_PrintUnformatted(e);
            rc = err_set(ERR_INPUT, "%s: model.merges[%d] = %.80s: expected \"a b\" or [\"a\", \"b\"]", path, i,
                         p ? p : "?");
            free(p);
            goto out;
        }
        if ((rc = tok_set_merge(t, i, l, ll, r, rl, path, "model.merges")) < 0) goto out;
        i++;
    }
    t->ignore_merges = jbool(model, "ignore_merges", 0);
    const char *unk = jstr(model, "unk_token");
    if (unk) {
        t->unk = tok_find(t, unk, strlen(unk));
        if (t->unk < 0) {
            rc = err_set(ERR_INPUT, "%s: model.unk_token = \"%s\" is not in the vocabulary", path, unk);
            goto out;
        }
        t->unk_model = 1;
    }
    if ((rc = json_pre(t, root, path)) < 0) goto out;

    // Llama 3 adds BOS in the post-processor (TemplateProcessing), not via a flag.
    const cJSON *pp = cJSON_GetObjectItemCaseSensitive(root, "post_processor");
    const char *ppt = jstr(pp, "type");
    if (ppt && !strcmp(ppt, "Sequence")) {
        const cJSON *s;
        cJSON_ArrayForEach(s, cJSON_GetObjectItemCaseSensitive(pp, "processors")) {
            const char *st = jstr(s, "type");
            if (st && !strcmp(st, "TemplateProcessing")) pp = s, ppt = st;
        }
    }
    if (ppt && !strcmp(ppt, "TemplateProcessing")) {
        // A SpecialToken first in "single" is BOS, one last is EOS.
        const cJSON *single = cJSON_GetObjectItemCaseSensitive(pp, "single");
        int ns = cJSON_GetArraySize(single);
        for (int k = 0; k < ns; k++) {
            if (k != 0 && k != ns - 1) continue;
            const cJSON *st = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(single, k), "SpecialToken");
            const char *sid = jstr(st, "id");
            if (!sid) continue;
            int32_t id = tok_find(t, sid, strlen(sid));
            if (id < 0) {
                rc = err_set(ERR_INPUT, "%s: post_processor.single[%d]: \"%s\" is not in the vocabulary", path, k, sid);
                goto out;
            }
            if (k == 0)
                t->add_bos = 1, t->bos = id;
            else
                t->add_eos = 1, t->eos = id;
        }
    }
    snprintf(t->tokenizer_class, sizeof t->tokenizer_class, "%s",
             t->pre == TOK_PRE_LLAMA3  ? "PreTrainedTokenizerFast"
             : t->pre == TOK_PRE_QWEN2 ? "Qwen2Tokenizer"
                                       : "GPT2Tokenizer");
    if (cfg_path) {
        if ((rc = load_config(t, cfg_path)) < 0) goto out;
        if (!t->chat_template && (rc = load_jinja(t, cfg_path)) < 0) goto out;
    }
    rc = tok_build(t, path);
out:
    free(text);
    free(sorted);
    free(ty);
    cJSON_Delete(root);
    return rc;
}

int tok_load_json(tok_t *t, const char *tokenizer_json_path, const char *tokenizer_config_path) {
    tok_reset(t);
    int rc = load_json(t, tokenizer_json_path, tokenizer_config_path);
    if (rc < 0) tok_free(t);
    return rc;
}
