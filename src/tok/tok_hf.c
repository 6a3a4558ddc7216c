// Writes a loaded tokenizer as Hugging Face files: tokenizer.json,
// tokenizer_config.json, special_tokens_map.json (formats.md §3.4). The
// tokenizer.json loads in HF `tokenizers` and gives the ids tok_encode gives
// (scripts/ref/tok_fixture.py checks that).
//
// The three trees are built (base/jsonb: an allocation failure anywhere is
// remembered) and printed before any file is written, so running out of memory
// is an error that leaves no file, never a tokenizer.json with entries missing.
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/fs.h"
#include "base/jsonb.h"
#include "tok/tok_internal.h"

// The vocabulary text of id as a C string (malloc'ed; NULL and oom set when
// the allocation fails).
static char *text_of(jb_t *jb, const tok_t *t, int32_t id) {
    size_t l;
    const char *s = tok_text(t, id, &l);
    char *z = tok_strndup(s, l);
    if (!z) jb->oom = 1;
    return z;
}

static void add_tok_str(jb_t *jb, cJSON *o, const char *key, const tok_t *t, int32_t id) {
    char *z = text_of(jb, t, id);
    jb_str(jb, o, key, z);
    free(z);
}

static void byte_level(jb_t *jb, cJSON *o, const char *key, int prefix, int trim, int regex) {
    cJSON *b = jb_obj(jb, o, key);
    jb_str(jb, b, "type", "ByteLevel");
    jb_bool(jb, b, "add_prefix_space", prefix);
    jb_bool(jb, b, "trim_offsets", trim);
    jb_bool(jb, b, "use_regex", regex);
}

static void pre_tokenizer(jb_t *jb, cJSON *o, const tok_t *t) {
    cJSON *seq = jb_obj(jb, o, "pre_tokenizer");
    jb_str(jb, seq, "type", "Sequence");
    cJSON *arr = jb_arr(jb, seq, "pretokenizers");
    if (t->pre == TOK_PRE_SMOLLM || t->pre == TOK_PRE_GPT2) {
        if (t->pre == TOK_PRE_SMOLLM) {
            cJSON *d = jb_obj(jb, arr, NULL);
            jb_str(jb, d, "type", "Digits");
            jb_bool(jb, d, "individual_digits", 1);
        }
        byte_level(jb, arr, NULL, 0, 1, 1);
        return;
    }
    // Every other family: its regex passes as Split(Isolated), then the byte
    // mapping alone.
    for (int i = 0; i < t->n_pass; i++) {
        cJSON *s = jb_obj(jb, arr, NULL);
        jb_str(jb, s, "type", "Split");
        jb_str(jb, jb_obj(jb, s, "pattern"), "Regex", t->pass_src[i]);
        jb_str(jb, s, "behavior", "Isolated");
        jb_bool(jb, s, "invert", 0);
    }
    byte_level(jb, arr, NULL, 0, 1, 0);
}

static void special_ref(jb_t *jb, cJSON *arr, const tok_t *t, int32_t id, int type_id) {
    cJSON *st = jb_obj(jb, jb_obj(jb, arr, NULL), "SpecialToken");
    add_tok_str(jb, st, "id", t, id);
    jb_int(jb, st, "type_id", type_id);
}

static void seq_ref(jb_t *jb, cJSON *arr, const char *name, int type_id) {
    cJSON *s = jb_obj(jb, jb_obj(jb, arr, NULL), "Sequence");
    jb_str(jb, s, "id", name);
    jb_int(jb, s, "type_id", type_id);
}

// BOS/EOS added by the tokenizer live in a TemplateProcessing post-processor
// (as in Llama 3's tokenizer.json); otherwise the ByteLevel one (offsets only).
static void post_processor(jb_t *jb, cJSON *root, const tok_t *t) {
    int bos = t->add_bos && t->bos >= 0, eos = t->add_eos && t->eos >= 0;
    if (!bos && !eos) {
        byte_level(jb, root, "post_processor", 1, 0, 1);
        return;
    }
    cJSON *o = jb_obj(jb, root, "post_processor");
    jb_str(jb, o, "type", "TemplateProcessing");
    for (int p = 0; p < 2; p++) {
        cJSON *arr = jb_arr(jb, o, p == 0 ? "single" : "pair");
        for (int k = 0; k <= p; k++) {
            if (bos) special_ref(jb, arr, t, t->bos, k);
            seq_ref(jb, arr, k == 0 ? "A" : "B", k);
            if (eos) special_ref(jb, arr, t, t->eos, k);
        }
    }
    cJSON *sp = jb_obj(jb, o, "special_tokens");
    int32_t ids[2] = {bos ? t->bos : -1, eos ? t->eos : -1};
    for (int k = 0; k < 2; k++) {
        if (ids[k] < 0) continue;
        char *z = text_of(jb, t, ids[k]);
        if (z && sp && !cJSON_GetObjectItemCaseSensitive(sp, z)) { // bos == eos: listed once
            cJSON *e = jb_obj(jb, sp, z);
            jb_str(jb, e, "id", z);
            jb_int(jb, jb_arr(jb, e, "ids"), NULL, ids[k]);
            jb_str(jb, jb_arr(jb, e, "tokens"), NULL, z);
        }
        free(z);
    }
}

static int is_added(const tok_t *t, int i) { return t->type[i] == TOK_CONTROL || t->type[i] == TOK_USER; }

static void added_entry(jb_t *jb, cJSON *o, const char *key, const tok_t *t, int i, int with_id) {
    cJSON *e = jb_obj(jb, o, key);
    if (with_id) jb_int(jb, e, "id", i);
    add_tok_str(jb, e, "content", t, i);
    jb_bool(jb, e, "single_word", 0);
    jb_bool(jb, e, "lstrip", 0);
    jb_bool(jb, e, "rstrip", 0);
    jb_bool(jb, e, "normalized", 0);
    jb_bool(jb, e, "special", t->type[i] == TOK_CONTROL);
}

static cJSON *build_tokenizer_json(jb_t *jb, const tok_t *t) {
    cJSON *root = jb_root(jb);
    jb_str(jb, root, "version", "1.0");
    jb_null(jb, root, "truncation");
    jb_null(jb, root, "padding");
    cJSON *added = jb_arr(jb, root, "added_tokens");
    for (int i = 0; i < t->n_vocab; i++)
        if (is_added(t, i)) added_entry(jb, added, NULL, t, i, 1);
    jb_null(jb, root, "normalizer");
    pre_tokenizer(jb, root, t);
    post_processor(jb, root, t);
    byte_level(jb, root, "decoder", 1, 1, 1);

    cJSON *m = jb_obj(jb, root, "model");
    jb_str(jb, m, "type", "BPE");
    jb_null(jb, m, "dropout");
    if (t->unk_model && t->unk >= 0)
        add_tok_str(jb, m, "unk_token", t, t->unk);
    else
        jb_null(jb, m, "unk_token");
    jb_null(jb, m, "continuing_subword_prefix");
    jb_null(jb, m, "end_of_word_suffix");
    jb_bool(jb, m, "fuse_unk", 0);
    jb_bool(jb, m, "byte_fallback", 0);
    jb_bool(jb, m, "ignore_merges", t->ignore_merges);
    cJSON *v = jb_obj(jb, m, "vocab");
    char buf[1024];
    for (int i = 0; i < t->n_vocab && !jb->oom; i++) {
        size_t l;
        const char *s = tok_text(t, i, &l);
        // A duplicated text keeps its lowest id (JSON keys must be unique).
        if (tok_find(t, s, l) != i) continue;
        char *z = l < sizeof buf ? buf : malloc(l + 1);
        if (!z) {
            jb->oom = 1;
            break;
        }
        memcpy(z, s, l);
        z[l] = 0;
        jb_int(jb, v, z, i);
        if (z != buf) free(z);
    }
    cJSON *mg = jb_arr(jb, m, "merges");
    for (int i = 0; i < t->n_merges && !jb->oom; i++) {
        size_t ll, rl;
        const char *l = tok_text(t, t->merge_l[i], &ll), *r = tok_text(t, t->merge_r[i], &rl);
        char *z = ll + rl + 2 <= sizeof buf ? buf : malloc(ll + rl + 2);
        if (!z) {
            jb->oom = 1;
            break;
        }
        memcpy(z, l, ll);
        z[ll] = ' ';
        memcpy(z + ll + 1, r, rl);
        z[ll + rl + 1] = 0;
        jb_str(jb, mg, NULL, z);
        if (z != buf) free(z);
    }
    return root;
}

static void add_tok(jb_t *jb, cJSON *o, const char *key, const tok_t *t, int32_t id) {
    if (id < 0)
        jb_null(jb, o, key);
    else
        add_tok_str(jb, o, key, t, id);
}

static cJSON *build_config(jb_t *jb, const tok_t *t) {
    cJSON *c = jb_root(jb);
    jb_bool(jb, c, "add_bos_token", t->add_bos);
    jb_bool(jb, c, "add_eos_token", t->add_eos);
    jb_bool(jb, c, "add_prefix_space", 0);
    cJSON *dec = jb_obj(jb, c, "added_tokens_decoder");
    for (int i = 0; i < t->n_vocab; i++) {
        if (!is_added(t, i)) continue;
        char k[16];
        snprintf(k, sizeof k, "%d", i);
        added_entry(jb, dec, k, t, i, 0);
    }
    add_tok(jb, c, "bos_token", t, t->bos);
    if (t->chat_template) jb_str(jb, c, "chat_template", t->chat_template);
    jb_bool(jb, c, "clean_up_tokenization_spaces", 0);
    add_tok(jb, c, "eos_token", t, t->eos);
    if (t->model_max_length > 0) jb_int(jb, c, "model_max_length", t->model_max_length);
    add_tok(jb, c, "pad_token", t, t->pad);
    jb_str(jb, c, "tokenizer_class", t->tokenizer_class[0] ? t->tokenizer_class : "GPT2Tokenizer");
    add_tok(jb, c, "unk_token", t, t->unk);
    jb_int(jb, c, "vocab_size", t->n_vocab);
    return c;
}

static cJSON *build_special_map(jb_t *jb, const tok_t *t) {
    cJSON *c = jb_root(jb);
    const char *keys[4] = {"bos_token", "eos_token", "pad_token", "unk_token"};
    int32_t ids[4] = {t->bos, t->eos, t->pad, t->unk};
    for (int k = 0; k < 4; k++)
        if (ids[k] >= 0) add_tok(jb, c, keys[k], t, ids[k]);
    return c;
}

int tok_write_hf(const tok_t *t, const char *dir) {
    if (!t || !t->loaded) return err_set(ERR_INPUT, "tok_write_hf: tokenizer not loaded");
    static const char *const names[3] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"};
    char *text[3] = {NULL, NULL, NULL};
    int rc = 0;
    for (int f = 0; f < 3 && rc == 0; f++) {
        jb_t jb = {0};
        cJSON *j = f == 0 ? build_tokenizer_json(&jb, t) : f == 1 ? build_config(&jb, t) : build_special_map(&jb, t);
        // tokenizer.json compact (it is large), the other two indented.
        if (!jb.oom) text[f] = f == 0 ? cJSON_PrintUnformatted(j) : cJSON_Print(j);
        cJSON_Delete(j);
        if (!text[f]) rc = err_set(ERR_NOMEM, "%s/%s: out of memory while building JSON", dir, names[f]);
    }
    if (rc == 0) rc = fs_mkdir_p(dir);
    for (int f = 0; f < 3 && rc == 0; f++) {
        char path[1100];
        rc = fs_join(path, sizeof path, dir, names[f]);
        size_t n = rc == 0 ? strlen(text[f]) : 0;
        if (rc == 0) text[f][n] = '\n'; // cJSON leaves no final newline; the NUL is not written
        if (rc == 0) rc = fs_write_all(path, text[f], n + 1);
    }
    for (int f = 0; f < 3; f++)
        free(text[f]);
    return rc;
}
