// Writes a loaded tokenizer as Hugging Face files: tokenizer.json,
// tokenizer_config.json, special_tokens_map.json (formats.md §3.4). The
// tokenizer.json loads in HF `tokenizers` and gives the ids tok_encode gives
// (scripts/ref/tok_fixture.py checks that).
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/fs.h"
#include "tok/tok_internal.h"

static cJSON *byte_level(int prefix, int trim, int regex) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "ByteLevel");
    cJSON_AddBoolToObject(o, "add_prefix_space", prefix);
    cJSON_AddBoolToObject(o, "trim_offsets", trim);
    cJSON_AddBoolToObject(o, "use_regex", regex);
    return o;
}

static cJSON *pre_tokenizer(const tok_t *t) {
    cJSON *seq = cJSON_CreateObject(), *arr = cJSON_CreateArray();
    cJSON_AddStringToObject(seq, "type", "Sequence");
    cJSON_AddItemToObject(seq, "pretokenizers", arr);
    if (t->pre == TOK_PRE_SMOLLM || t->pre == TOK_PRE_GPT2) {
        if (t->pre == TOK_PRE_SMOLLM) {
            cJSON *d = cJSON_CreateObject();
            cJSON_AddStringToObject(d, "type", "Digits");
            cJSON_AddBoolToObject(d, "individual_digits", 1);
            cJSON_AddItemToArray(arr, d);
        }
        cJSON_AddItemToArray(arr, byte_level(0, 1, 1));
        return seq;
    }
    // Every other family: its regex passes as Split(Isolated), then the byte
    // mapping alone.
    for (int i = 0; i < t->n_pass; i++) {
        cJSON *s = cJSON_CreateObject(), *pat = cJSON_CreateObject();
        cJSON_AddStringToObject(s, "type", "Split");
        cJSON_AddStringToObject(pat, "Regex", t->pass_src[i]);
        cJSON_AddItemToObject(s, "pattern", pat);
        cJSON_AddStringToObject(s, "behavior", "Isolated");
        cJSON_AddBoolToObject(s, "invert", 0);
        cJSON_AddItemToArray(arr, s);
    }
    cJSON_AddItemToArray(arr, byte_level(0, 1, 0));
    return seq;
}

static cJSON *special_ref(const tok_t *t, int32_t id, int type_id) {
    cJSON *o = cJSON_CreateObject(), *st = cJSON_CreateObject();
    size_t l;
    const char *s = tok_text(t, id, &l);
    char *z = tok_strndup(s, l);
    cJSON_AddStringToObject(st, "id", z ? z : "");
    cJSON_AddNumberToObject(st, "type_id", type_id);
    cJSON_AddItemToObject(o, "SpecialToken", st);
    free(z);
    return o;
}

static cJSON *seq_ref(const char *name, int type_id) {
    cJSON *o = cJSON_CreateObject(), *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "id", name);
    cJSON_AddNumberToObject(s, "type_id", type_id);
    cJSON_AddItemToObject(o, "Sequence", s);
    return o;
}

// BOS/EOS added by the tokenizer live in a TemplateProcessing post-processor
// (as in Llama 3's tokenizer.json); otherwise the ByteLevel one (offsets only).
static cJSON *post_processor(const tok_t *t) {
    int bos = t->add_bos && t->bos >= 0, eos = t->add_eos && t->eos >= 0;
    if (!bos && !eos) return byte_level(1, 0, 1);
    cJSON *o = cJSON_CreateObject(), *single = cJSON_CreateArray(), *pair = cJSON_CreateArray();
    cJSON *sp = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "TemplateProcessing");
    for (int p = 0; p < 2; p++) {
        cJSON *arr = p == 0 ? single : pair;
        for (int k = 0; k <= p; k++) {
            if (bos) cJSON_AddItemToArray(arr, special_ref(t, t->bos, k));
            cJSON_AddItemToArray(arr, seq_ref(k == 0 ? "A" : "B", k));
            if (eos) cJSON_AddItemToArray(arr, special_ref(t, t->eos, k));
        }
    }
    cJSON_AddItemToObject(o, "single", single);
    cJSON_AddItemToObject(o, "pair", pair);
    int32_t ids[2] = {bos ? t->bos : -1, eos ? t->eos : -1};
    for (int k = 0; k < 2; k++) {
        if (ids[k] < 0) continue;
        size_t l;
        const char *s = tok_text(t, ids[k], &l);
        char *z = tok_strndup(s, l);
        if (!z || cJSON_GetObjectItemCaseSensitive(sp, z)) {
            free(z);
            continue;
        }
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "id", z);
        cJSON *il = cJSON_CreateArray(), *tl = cJSON_CreateArray();
        cJSON_AddItemToArray(il, cJSON_CreateNumber(ids[k]));
        cJSON_AddItemToArray(tl, cJSON_CreateString(z));
        cJSON_AddItemToObject(e, "ids", il);
        cJSON_AddItemToObject(e, "tokens", tl);
        cJSON_AddItemToObject(sp, z, e);
        free(z);
    }
    cJSON_AddItemToObject(o, "special_tokens", sp);
    return o;
}

static int is_added(const tok_t *t, int i) { return t->type[i] == TOK_CONTROL || t->type[i] == TOK_USER; }

static cJSON *added_entry(const tok_t *t, int i, int with_id) {
    cJSON *o = cJSON_CreateObject();
    size_t l;
    const char *s = tok_text(t, i, &l);
    char *z = tok_strndup(s, l);
    if (with_id) cJSON_AddNumberToObject(o, "id", i);
    cJSON_AddStringToObject(o, "content", z ? z : "");
    cJSON_AddBoolToObject(o, "single_word", 0);
    cJSON_AddBoolToObject(o, "lstrip", 0);
    cJSON_AddBoolToObject(o, "rstrip", 0);
    cJSON_AddBoolToObject(o, "normalized", 0);
    cJSON_AddBoolToObject(o, "special", t->type[i] == TOK_CONTROL);
    free(z);
    return o;
}

static cJSON *build_tokenizer_json(const tok_t *t) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON_AddNullToObject(root, "truncation");
    cJSON_AddNullToObject(root, "padding");
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    for (int i = 0; i < t->n_vocab; i++)
        if (is_added(t, i)) cJSON_AddItemToArray(added, added_entry(t, i, 1));
    cJSON_AddNullToObject(root, "normalizer");
    cJSON_AddItemToObject(root, "pre_tokenizer", pre_tokenizer(t));
    cJSON_AddItemToObject(root, "post_processor", post_processor(t));
    cJSON_AddItemToObject(root, "decoder", byte_level(1, 1, 1));

    cJSON *m = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(m, "type", "BPE");
    cJSON_AddNullToObject(m, "dropout");
    if (t->unk_model && t->unk >= 0) {
        size_t l;
        const char *s = tok_text(t, t->unk, &l);
        char *z = tok_strndup(s, l);
        cJSON_AddStringToObject(m, "unk_token", z ? z : "");
        free(z);
    } else {
        cJSON_AddNullToObject(m, "unk_token");
    }
    cJSON_AddNullToObject(m, "continuing_subword_prefix");
    cJSON_AddNullToObject(m, "end_of_word_suffix");
    cJSON_AddBoolToObject(m, "fuse_unk", 0);
    cJSON_AddBoolToObject(m, "byte_fallback", 0);
    cJSON_AddBoolToObject(m, "ignore_merges", t->ignore_merges);
    cJSON *v = cJSON_AddObjectToObject(m, "vocab");
    char buf[1024];
    for (int i = 0; i < t->n_vocab; i++) {
        size_t l;
        const char *s = tok_text(t, i, &l);
        // A duplicated text keeps its lowest id (JSON keys must be unique).
        if (tok_find(t, s, l) != i) continue;
        char *z = l < sizeof buf ? buf : malloc(l + 1);
        if (!z) continue;
        memcpy(z, s, l);
        z[l] = 0;
        cJSON_AddNumberToObject(v, z, i);
        if (z != buf) free(z);
    }
    cJSON *mg = cJSON_AddArrayToObject(m, "merges");
    for (int i = 0; i < t->n_merges; i++) {
        size_t ll, rl;
        const char *l = tok_text(t, t->merge_l[i], &ll), *r = tok_text(t, t->merge_r[i], &rl);
        char *z = ll + rl + 2 <= sizeof buf ? buf : malloc(ll + rl + 2);
        if (!z) continue;
        memcpy(z, l, ll);
        z[ll] = ' ';
        memcpy(z + ll + 1, r, rl);
        z[ll + rl + 1] = 0;
        cJSON_AddItemToArray(mg, cJSON_CreateString(z));
        if (z != buf) free(z);
    }
    return root;
}

static void add_tok(cJSON *o, const char *key, const tok_t *t, int32_t id) {
    if (id < 0) {
        cJSON_AddNullToObject(o, key);
        return;
    }
    size_t l;
    const char *s = tok_text(t, id, &l);
    char *z = tok_strndup(s, l);
    cJSON_AddStringToObject(o, key, z ? z : "");
    free(z);
}

static cJSON *build_config(const tok_t *t) {
    cJSON *c = cJSON_CreateObject();
    cJSON_AddBoolToObject(c, "add_bos_token", t->add_bos);
    cJSON_AddBoolToObject(c, "add_eos_token", t->add_eos);
    cJSON_AddBoolToObject(c, "add_prefix_space", 0);
    cJSON *dec = cJSON_AddObjectToObject(c, "added_tokens_decoder");
    for (int i = 0; i < t->n_vocab; i++) {
        if (!is_added(t, i)) continue;
        char k[16];
        snprintf(k, sizeof k, "%d", i);
        cJSON_AddItemToObject(dec, k, added_entry(t, i, 0));
    }
    add_tok(c, "bos_token", t, t->bos);
    if (t->chat_template) cJSON_AddStringToObject(c, "chat_template", t->chat_template);
    cJSON_AddBoolToObject(c, "clean_up_tokenization_spaces", 0);
    add_tok(c, "eos_token", t, t->eos);
    if (t->model_max_length > 0) cJSON_AddNumberToObject(c, "model_max_length", (double)t->model_max_length);
    add_tok(c, "pad_token", t, t->pad);
    cJSON_AddStringToObject(c, "tokenizer_class", t->tokenizer_class[0] ? t->tokenizer_class : "GPT2Tokenizer");
    add_tok(c, "unk_token", t, t->unk);
    cJSON_AddNumberToObject(c, "vocab_size", t->n_vocab);
    return c;
}

static cJSON *build_special_map(const tok_t *t) {
    cJSON *c = cJSON_CreateObject();
    const char *keys[4] = {"bos_token", "eos_token", "pad_token", "unk_token"};
    int32_t ids[4] = {t->bos, t->eos, t->pad, t->unk};
    for (int k = 0; k < 4; k++)
        if (ids[k] >= 0) add_tok(c, keys[k], t, ids[k]);
    return c;
}

static int write_json(const char *dir, const char *name, cJSON *j, int pretty) {
    char path[1100];
    int rc = fs_join(path, sizeof path, dir, name);
    if (rc < 0) {
        cJSON_Delete(j);
        return rc;
    }
    char *s = pretty ? cJSON_Print(j) : cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!s) return err_set(ERR_NOMEM, "%s: out of memory while building JSON", path);
    size_t n = strlen(s);
    s[n] = '\n'; // cJSON leaves no final newline; the NUL is not written
    rc = fs_write_all(path, s, n + 1);
    free(s);
    return rc;
}

int tok_write_hf(const tok_t *t, const char *dir) {
    if (!t || !t->loaded) return err_set(ERR_INPUT, "tok_write_hf: tokenizer not loaded");
    TRY(fs_mkdir_p(dir));
    cJSON *j = build_tokenizer_json(t);
    if (!j) return err_set(ERR_NOMEM, "%s/tokenizer.json: out of memory", dir);
    TRY(write_json(dir, "tokenizer.json", j, 0));
    if (!(j = build_config(t))) return err_set(ERR_NOMEM, "%s/tokenizer_config.json: out of memory", dir);
    TRY(write_json(dir, "tokenizer_config.json", j, 1));
    if (!(j = build_special_map(t))) return err_set(ERR_NOMEM, "%s/special_tokens_map.json: out of memory", dir);
    return write_json(dir, "special_tokens_map.json", j, 1);
}
