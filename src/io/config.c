#include "io/config.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/checked.h"
#include "base/err.h"
#include "base/fs.h"
#include "base/jsonb.h"
#include "base/log.h"
#include "base/strbuf.h"

// ---- reading helpers ----------------------------------------------------------
// Every getter names the file and the field ("rope_scaling.factor") when the
// value has the wrong type. An absent key or null leaves *out unchanged unless
// the field is required.

static const cJSON *jget(const cJSON *o, const char *key) {
    return cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
}
static int present(const cJSON *j) { return j && !cJSON_IsNull(j); }

static const char *jdesc(const cJSON *j, char *buf, size_t cap) {
    if (!j) return "nothing";
    if (cJSON_IsNull(j)) return "null";
    if (cJSON_IsBool(j)) return cJSON_IsTrue(j) ? "true" : "false";
    if (cJSON_IsNumber(j)) {
        snprintf(buf, cap, "the number %.17g", j->valuedouble);
        return buf;
    }
    if (cJSON_IsString(j)) {
        snprintf(buf, cap, "the string \"%.60s\"", j->valuestring);
        return buf;
    }
    if (cJSON_IsArray(j)) return "an array";
    if (cJSON_IsObject(j)) return "an object";
    return "an invalid value";
}

static int bad(const char *src, const char *pre, const char *key, const char *want, const cJSON *j) {
    char buf[128];
    return err_set(ERR_INPUT, "%s: field %s%s: expected %s, found %s", src, pre, key, want, jdesc(j, buf, sizeof buf));
}

static int missing(const char *src, const char *pre, const char *key) {
    return err_set(ERR_INPUT, "%s: missing field %s%s", src, pre, key);
}

static int j_int(const char *src, const cJSON *o, const char *pre, const char *key, int required, int *out) {
    const cJSON *j = jget(o, key);
    if (!present(j)) return required ? missing(src, pre, key) : 0;
    if (!cJSON_IsNumber(j) || j->valuedouble != floor(j->valuedouble) || fabs(j->valuedouble) > INT_MAX)
        return bad(src, pre, key, "an integer", j);
    *out = (int)j->valuedouble;
    return 0;
}

static int j_double(const char *src, const cJSON *o, const char *pre, const char *key, int required, double *out) {
    const cJSON *j = jget(o, key);
    if (!present(j)) return required ? missing(src, pre, key) : 0;
    if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble)) return bad(src, pre, key, "a number", j);
    *out = j->valuedouble;
    return 0;
}

static int j_float(const char *src, const cJSON *o, const char *pre, const char *key, int required, float *out) {
    double v = *out;
    TRY(j_double(src, o, pre, key, required, &v));
    if (fabs(v) > 3.0e38) return bad(src, pre, key, "a number in fp32 range", jget(o, key));
    *out = (float)v;
    return 0;
}

static int j_bool(const char *src, const cJSON *o, const char *pre, const char *key, int *out) {
    const cJSON *j = jget(o, key);
    if (!present(j)) return 0;
    if (!cJSON_IsBool(j)) return bad(src, pre, key, "true or false", j);
    *out = cJSON_IsTrue(j);
    return 0;
}

static int j_str(const char *src, const cJSON *o, const char *pre, const char *key, int required, const char **out) {
    const cJSON *j = jget(o, key);
    if (!present(j)) return required ? missing(src, pre, key) : 0;
    if (!cJSON_IsString(j)) return bad(src, pre, key, "a string", j);
    *out = j->valuestring;
    return 0;
}

static int cmp_strp(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

// Python's json keeps the last of duplicate keys, cJSON the first: refuse them.
// pre is the object's path ("gdn_cfg."), so the message names the key in full.
// The keys are sorted, so an object of any size is checked in n log n.
static int no_dup_keys(const char *src, const char *pre, const cJSON *o) {
    int n = cJSON_IsObject(o) ? cJSON_GetArraySize(o) : 0;
    if (n < 2) return 0;
    const char **k = malloc((size_t)n * sizeof *k);
    if (!k) return err_set(ERR_NOMEM, "%s: out of memory checking the %d keys of %s", src, n, *pre ? pre : "the root");
    int m = 0;
    for (const cJSON *e = o->child; e; e = e->next)
        if (e->string) k[m++] = e->string;
    qsort(k, (size_t)m, sizeof *k, cmp_strp);
    int rc = 0;
    for (int i = 1; i < m && rc == 0; i++)
        if (!strcmp(k[i - 1], k[i])) rc = err_set(ERR_INPUT, "%s: duplicate key %s%s", src, pre, k[i]);
    free(k);
    return rc;
}

static int parse_root(const char *text, const char *src, cJSON **root) {
    const char *end = NULL;
    *root = cJSON_ParseWithOpts(text, &end, 1);
    if (!*root)
        return err_set(ERR_INPUT, "%s: not valid JSON (error near byte %ld)", src, end ? (long)(end - text) : -1L);
    if (!cJSON_IsObject(*root)) {
        cJSON_Delete(*root);
        *root = NULL;
        return err_set(ERR_INPUT, "%s: expected a JSON object at the top level", src);
    }
    int rc = no_dup_keys(src, "", *root);
    if (rc < 0) {
        cJSON_Delete(*root);
        *root = NULL;
    }
    return rc;
}

// ---- RoPE ---------------------------------------------------------------------------

// What every rope dict starts with: absent or null (*type stays NULL), else an
// object without duplicate keys whose scaling type is given as "rope_type" or
// "type" (older transformers, X-EcoMLA), the two agreeing when both are there.
// p receives "<name>." for the field names in messages.
static int rope_dict(const char *src, const char *name, const cJSON *rs, char *p, size_t cap, const char **type) {
    *type = NULL;
    snprintf(p, cap, "%s.", name);
    if (!present(rs)) return 0;
    if (!cJSON_IsObject(rs)) return bad(src, "", name, "an object or null", rs);
    TRY(no_dup_keys(src, p, rs));
    const char *t1 = NULL, *t2 = NULL;
    TRY(j_str(src, rs, p, "rope_type", 0, &t1));
    TRY(j_str(src, rs, p, "type", 0, &t2));
    if (t1 && t2 && strcmp(t1, t2))
        return err_set(ERR_INPUT, "%s: field %srope_type \"%s\" and %stype \"%s\" disagree", src, p, t1, p, t2);
    *type = t1 ? t1 : t2;
    if (!*type) return missing(src, p, "rope_type");
    return 0;
}

// transformers' rope dict (rope_scaling, or v5 rope_parameters) for the teacher
// attention. max_pos is the default of yarn's original_max_position_embeddings.
static int parse_rope_hf(const char *src, const char *pre, const cJSON *rs, int max_pos, rope_cfg_t *r) {
    char p[64];
    const char *type;
    TRY(rope_dict(src, pre, rs, p, sizeof p, &type));
    if (!type) return 0;
    if (!strcmp(type, "default")) {
        r->scaling = ROPE_SCALE_NONE;
    } else if (!strcmp(type, "linear")) {
        r->scaling = ROPE_SCALE_LINEAR;
        TRY(j_float(src, rs, p, "factor", 1, &r->factor));
    } else if (!strcmp(type, "llama3")) {
        r->scaling = ROPE_SCALE_LLAMA3;
        TRY(j_float(src, rs, p, "factor", 1, &r->factor));
        TRY(j_float(src, rs, p, "low_freq_factor", 1, &r->low_freq_factor));
        TRY(j_float(src, rs, p, "high_freq_factor", 1, &r->high_freq_factor));
        TRY(j_int(src, rs, p, "original_max_position_embeddings", 1, &r->orig_max_pos));
    } else if (!strcmp(type, "yarn")) {
        r->scaling = ROPE_SCALE_YARN;
        TRY(j_float(src, rs, p, "factor", 1, &r->factor));
        r->orig_max_pos = max_pos;
        TRY(j_int(src, rs, p, "original_max_position_embeddings", 0, &r->orig_max_pos));
        TRY(j_float(src, rs, p, "beta_fast", 0, &r->beta_fast));
        TRY(j_float(src, rs, p, "beta_slow", 0, &r->beta_slow));
        TRY(j_float(src, rs, p, "attention_factor", 0, &r->attn_factor));
        // transformers uses mscale / mscale_all_dim only when both are given (and
        // not attention_factor); it then scales cos/sin by their ratio and leaves
        // the softmax alone, which is what attn_factor expresses.
        double ms = 0, msa = 0;
        TRY(j_double(src, rs, p, "mscale", 0, &ms));
        TRY(j_double(src, rs, p, "mscale_all_dim", 0, &msa));
        if (r->attn_factor == 0 && ms != 0 && msa != 0 && r->factor > 1) {
            double g1 = 0.1 * ms * log(r->factor) + 1.0, g2 = 0.1 * msa * log(r->factor) + 1.0;
            r->attn_factor = (float)(g1 / g2);
        }
    } else {
        return err_set(ERR_UNSUP, "%s: field %srope_type: \"%s\" is not supported (default, linear, llama3, yarn)", src,
                       p, type);
    }
    return 0; // the values' ranges: arch_validate, for every source alike
}

// The MLA rope of hybrid_config.json (DeepSeek's YaRN: mscale keys go to the
// rope as they are; original_max_position_embeddings defaults to 4096 as in
// X-EcoMLA, whose configs omit it).
static int parse_rope_mla(const char *src, const cJSON *rs, rope_cfg_t *r) {
    r->scaling = ROPE_SCALE_NONE;
    char p[64];
    const char *type;
    TRY(rope_dict(src, "rope_scaling", rs, p, sizeof p, &type));
    if (!type) return 0;
    if (!strcmp(type, "yarn")) {
        r->scaling = ROPE_SCALE_YARN;
        r->orig_max_pos = 4096;
        r->beta_fast = 32.0f;
        r->beta_slow = 1.0f;
        r->mscale = 1.0f;
        r->mscale_all_dim = 0.0f;
        r->attn_factor = 0.0f;
        TRY(j_float(src, rs, p, "factor", 1, &r->factor));
        TRY(j_int(src, rs, p, "original_max_position_embeddings", 0, &r->orig_max_pos));
        TRY(j_float(src, rs, p, "beta_fast", 0, &r->beta_fast));
        TRY(j_float(src, rs, p, "beta_slow", 0, &r->beta_slow));
        TRY(j_float(src, rs, p, "mscale", 0, &r->mscale));
        TRY(j_float(src, rs, p, "mscale_all_dim", 0, &r->mscale_all_dim));
    } else if (!strcmp(type, "linear")) {
        r->scaling = ROPE_SCALE_LINEAR;
        TRY(j_float(src, rs, p, "factor", 1, &r->factor));
    } else {
        // Zebra-Llama builds no rotary module for "llama3" and we have no dynamic NTK.
        return err_set(ERR_UNSUP, "%s: field %srope_type: \"%s\" is not supported for MLA layers (yarn, linear)", src,
                       p, type);
    }
    return 0; // the values' ranges: arch_validate
}

// ---- config.json ----------------------------------------------------------------------

// bos/eos: an integer, a list of integers, or null.
static int parse_ids(const char *src, const cJSON *o, const char *key, int *ids, int cap, int *n) {
    const cJSON *j = jget(o, key);
    *n = 0;
    if (!present(j)) return 0;
    if (cJSON_IsNumber(j)) { // one id, held to what a list's ids are
        int v;
        TRY(j_int(src, o, "", key, 1, &v));
        if (v < 0) return bad(src, "", key, "a non-negative integer", j);
        ids[(*n)++] = v;
        return 0;
    }
    if (!cJSON_IsArray(j)) return bad(src, "", key, "an integer or a list of integers", j);
    const cJSON *e;
    cJSON_ArrayForEach(e, j) {
        if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < 0 ||
            e->valuedouble > INT_MAX)
            return bad(src, "", key, "a list of non-negative integers", j);
        if (*n == cap) return err_set(ERR_UNSUP, "%s: field %s: more than %d ids", src, key, cap);
        ids[(*n)++] = (int)e->valuedouble;
    }
    return 0;
}

static int fill_config(const cJSON *root, const char *src, arch_t *a) {
    // Which model: architectures, else model_type.
    int qwen3 = -1;
    const cJSON *archs = jget(root, "architectures");
    if (present(archs)) {
        if (!cJSON_IsArray(archs) || cJSON_GetArraySize(archs) == 0)
            return bad(src, "", "architectures", "a non-empty list of strings", archs);
        const cJSON *e;
        cJSON_ArrayForEach(e, archs) {
            if (!cJSON_IsString(e)) return bad(src, "", "architectures", "a list of strings", archs);
            if (!strcmp(e->valuestring, "LlamaForCausalLM"))
                qwen3 = 0;
            else if (!strcmp(e->valuestring, "Qwen3ForCausalLM"))
                qwen3 = 1;
            if (qwen3 >= 0) break;
        }
        if (qwen3 < 0)
            return err_set(ERR_UNSUP,
                           "%s: field architectures: \"%s\" is not supported (LlamaForCausalLM, Qwen3ForCausalLM)", src,
                           archs->child->valuestring);
    }
    const char *mt = NULL;
    TRY(j_str(src, root, "", "model_type", 0, &mt));
    if (qwen3 < 0) {
        if (!mt) return missing(src, "", "architectures");
        if (!strcmp(mt, "llama"))
            qwen3 = 0;
        else if (!strcmp(mt, "qwen3"))
            qwen3 = 1;
        else
            return err_set(ERR_UNSUP, "%s: field model_type: \"%s\" is not supported (llama, qwen3)", src, mt);
    }
    const char *want = qwen3 ? "qwen3" : "llama";
    if (mt && strcmp(mt, want))
        return err_set(ERR_INPUT, "%s: field model_type: expected \"%s\" for %s, found \"%s\"", src, want,
                       qwen3 ? "Qwen3ForCausalLM" : "LlamaForCausalLM", mt);
    snprintf(a->model_type, sizeof a->model_type, "%s", want);
    a->qk_norm = qwen3;

    // transformers' class defaults for keys a config may omit.
    a->eps = 1e-6f;
    a->rope.theta = 10000.0f;
    a->max_pos = qwen3 ? 32768 : 2048;
    a->tie_embeddings = 0;
    TRY(j_int(src, root, "", "hidden_size", 1, &a->d));
    TRY(j_int(src, root, "", "intermediate_size", 1, &a->ffn));
    TRY(j_int(src, root, "", "num_hidden_layers", 1, &a->n_layers));
    TRY(j_int(src, root, "", "num_attention_heads", 1, &a->H));
    a->Hkv = a->H;
    TRY(j_int(src, root, "", "num_key_value_heads", 0, &a->Hkv));
    if (a->H <= 0) return err_set(ERR_INPUT, "%s: field num_attention_heads must be positive (found %d)", src, a->H);
    a->dh = qwen3 ? 128 : a->d / a->H;
    TRY(j_int(src, root, "", "head_dim", 0, &a->dh));
    TRY(j_int(src, root, "", "vocab_size", 1, &a->V));
    TRY(j_float(src, root, "", "rms_norm_eps", 0, &a->eps));
    TRY(j_int(src, root, "", "max_position_embeddings", 0, &a->max_pos));
    TRY(j_bool(src, root, "", "tie_word_embeddings", &a->tie_embeddings));

    // Features our layers do not have.
    const char *act = NULL;
    TRY(j_str(src, root, "", "hidden_act", 0, &act));
    if (act && strcmp(act, "silu"))
        return err_set(ERR_UNSUP, "%s: field hidden_act: \"%s\" is not supported (silu)", src, act);
    static const char *const no_bias[] = {"attention_bias", "mlp_bias", "use_sliding_window"};
    for (int i = 0; i < 3; i++) {
        int on = 0;
        TRY(j_bool(src, root, "", no_bias[i], &on));
        if (on) return err_set(ERR_UNSUP, "%s: field %s: true is not supported", src, no_bias[i]);
    }

    // RoPE: transformers v5 keeps theta and scaling in rope_parameters.
    const cJSON *rp = jget(root, "rope_parameters");
    if (present(rp)) {
        if (!cJSON_IsObject(rp)) return bad(src, "", "rope_parameters", "an object", rp);
        TRY(j_float(src, rp, "rope_parameters.", "rope_theta", 1, &a->rope.theta));
        TRY(parse_rope_hf(src, "rope_parameters", rp, a->max_pos, &a->rope));
    } else {
        TRY(j_float(src, root, "", "rope_theta", 0, &a->rope.theta));
        TRY(parse_rope_hf(src, "rope_scaling", jget(root, "rope_scaling"), a->max_pos, &a->rope));
    }
    // MLA layers inherit the base frequency until hybrid_config.json says otherwise.
    a->mla.rope.theta = a->rope.theta;

    // Special ids: transformers' LlamaConfig defaults are bos 1, eos 2.
    int ids[8], n;
    TRY(parse_ids(src, root, "bos_token_id", ids, 8, &n));
    a->bos_id = n ? ids[0] : (qwen3 || jget(root, "bos_token_id") ? -1 : 1);
    TRY(parse_ids(src, root, "eos_token_id", a->eos_ids, 8, &a->n_eos));
    if (a->n_eos == 0 && !qwen3 && !jget(root, "eos_token_id")) {
        a->eos_ids[0] = 2;
        a->n_eos = 1;
    }
    a->eos_id = a->n_eos ? a->eos_ids[0] : -1;
    TRY(parse_ids(src, root, "pad_token_id", ids, 8, &n));
    a->pad_id = n ? ids[0] : -1;
    return 0;
}

int cfg_parse_config_json(const char *text, const char *src, arch_t *a) {
    arch_init(a);
    cJSON *root;
    TRY(parse_root(text, src, &root));
    int rc = fill_config(root, src, a);
    cJSON_Delete(root);
    TRY(rc);
    return arch_validate(a, src);
}

static int read_text(const char *path, char **text) {
    size_t len;
    TRY(fs_read_all(path, text, &len));
    if (strlen(*text) != len) {
        free(*text);
        *text = NULL;
        return err_set(ERR_INPUT, "%s: contains a NUL byte", path);
    }
    return 0;
}

int cfg_read_config_json(const char *path, arch_t *a) {
    char *text;
    TRY(read_text(path, &text));
    int rc = cfg_parse_config_json(text, path, a);
    free(text);
    return rc;
}

// ---- hybrid_config.json ---------------------------------------------------------------

// A list of distinct layer indices in [0, n_layers); marks[l] = 1 for each.
static int parse_layer_list(const char *src, const cJSON *root, const char *key, int n_layers, char *marks) {
    const cJSON *j = jget(root, key);
    if (!present(j)) return 0;
    if (!cJSON_IsArray(j)) return bad(src, "", key, "a list of layer indices", j);
    const cJSON *e;
    cJSON_ArrayForEach(e, j) {
        if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble))
            return bad(src, "", key, "a list of integer layer indices", j);
        double v = e->valuedouble;
        if (v < 0 || v >= n_layers)
            return err_set(ERR_INPUT, "%s: field %s: layer %.0f out of range 0..%d", src, key, v, n_layers - 1);
        if (marks[(int)v]) return err_set(ERR_INPUT, "%s: field %s: layer %d listed twice", src, key, (int)v);
        marks[(int)v] = 1;
    }
    return 0;
}

// A hybrid key that restates a config.json value must agree with it.
static int same_int(const char *src, const cJSON *root, const char *key, int have) {
    int v = have;
    TRY(j_int(src, root, "", key, 0, &v));
    if (v != have) return err_set(ERR_INPUT, "%s: field %s: %d does not match config.json (%d)", src, key, v, have);
    return 0;
}

static int parse_gdn(const char *src, const cJSON *root, arch_t *a) {
    gdn_dims_t *g = &a->gdn;
    const cJSON *gc = jget(root, "gdn_cfg");
    // Defaults: the HyLo recipe (arch_gdn_hylo: d_k = 0.75 d in heads of 256,
    // d_v = 2 d_k, gate, conv 4, FLA's model-level norm eps).
    *g = arch_gdn_hylo(a->d, 0);
    double expand_v = 2.0;
    if (!present(gc)) {
        log_warn("%s: no gdn_cfg: using the HyLo defaults (%d heads of 256, expand_v 2, conv 4, gate)", src,
                 g->n_heads);
    } else {
        const char *p = "gdn_cfg.";
        if (!cJSON_IsObject(gc)) return bad(src, "", "gdn_cfg", "an object", gc);
        TRY(no_dup_keys(src, p, gc));
        TRY(j_int(src, gc, p, "num_heads", 1, &g->n_heads));
        TRY(j_int(src, gc, p, "head_dim", 1, &g->head_k));
        g->n_v_heads = g->n_heads;
        TRY(j_int(src, gc, p, "num_v_heads", 0, &g->n_v_heads));
        TRY(j_double(src, gc, p, "expand_v", 0, &expand_v));
        TRY(j_int(src, gc, p, "conv_size", 0, &g->conv));
        TRY(j_bool(src, gc, p, "use_gate", &g->use_gate));
        TRY(j_float(src, gc, p, "norm_eps", 0, &g->norm_eps));
        TRY(j_bool(src, gc, p, "allow_neg_eigval", &g->allow_neg_eigval));
    }
    // FLA: head_v_dim = int(head_dim * expand_v), which must be (close to) integral.
    double hv = g->head_k * expand_v;
    if (!(hv >= 1 && hv < INT_MAX) || fabs(hv - floor(hv)) > 1e-5 * hv)
        return err_set(ERR_INPUT, "%s: field gdn_cfg.expand_v: head_dim %d x expand_v %g = %g is not an integer", src,
                       g->head_k, expand_v, hv);
    g->head_v = (int)floor(hv); // Python's int(); the check above allows only a small excess over it
    if (g->n_heads <= 0 || g->n_v_heads <= 0)
        return err_set(ERR_INPUT, "%s: field gdn_cfg.num_heads / num_v_heads must be positive", src);
    return 0;
}

static int parse_m2(const char *src, const cJSON *root, arch_t *a) {
    m2_dims_t *m = &a->m2;
    const cJSON *sc = jget(root, "ssm_cfg");
    const char *p = "ssm_cfg.";
    if (present(sc) && !cJSON_IsObject(sc)) return bad(src, "", "ssm_cfg", "an object", sc);
    TRY(no_dup_keys(src, p, sc));
    int ngroups = 0, d_state = 0, expand = 1, repeat = 0;
    TRY(j_int(src, sc, p, "ngroups", 1, &ngroups));
    TRY(j_int(src, sc, p, "d_state", 1, &d_state));
    TRY(j_int(src, sc, p, "expand", 0, &expand));
    TRY(j_bool(src, sc, p, "repeat_kv_before_conv", &repeat));
    if (repeat)
        return err_set(ERR_UNSUP,
                       "%s: field ssm_cfg.repeat_kv_before_conv: true is not supported (conv over x|B|C "
                       "before the head repetition only)",
                       src);
    // MambaInLlama forces heads = ngroups and headdim = d_state (linear_blocks.md 4.1).
    m->n_heads = ngroups;
    m->headdim = d_state;
    m->d_state = d_state;
    m->d_inner = 0;
    TRY(j_int(src, root, "", "d_inner", 0, &m->d_inner));
    if (!present(jget(root, "d_inner"))) { // d_model x expand, formed in 64 bits and held to its limit
        int64_t di;
        TRY(ck_mul(src, "d_inner (hidden_size x ssm_cfg.expand)", a->d, expand > 0 ? expand : 1, LIM_DIM, &di));
        m->d_inner = (int)di;
    }
    TRY(j_int(src, root, "", "d_xb", 1, &m->d_xb));
    return 0;
}

// X-EcoMLA's {"<layer>": {"q_rank": r_q, "kv_rank": r_kv}}. As in its layer
// constructor, an MLA layer missing from the map keeps the previous layer's
// ranks. Ranks equal to the shared ones are stored as 0 (= shared).
static int parse_ranks(const char *src, const cJSON *root, arch_t *a) {
    const cJSON *lr = jget(root, "layer_rank_list");
    if (!present(lr)) return 0;
    if (!cJSON_IsObject(lr)) return bad(src, "", "layer_rank_list", "an object", lr);
    TRY(no_dup_keys(src, "layer_rank_list.", lr));
    const cJSON *e;
    cJSON_ArrayForEach(e, lr) {
        char *end;
        long l = strtol(e->string, &end, 10);
        if (!e->string[0] || *end || l < 0 || l >= a->n_layers)
            return err_set(ERR_INPUT, "%s: field layer_rank_list: key \"%s\" is not a layer index 0..%d", src,
                           e->string, a->n_layers - 1);
        if (!cJSON_IsObject(e)) return bad(src, "layer_rank_list.", e->string, "an object", e);
    }
    int rq = a->mla.r_q, rkv = a->mla.r_kv;
    for (int l = 0; l < a->n_layers; l++) {
        if (a->kind[l] != LAYER_MLA) continue;
        char key[16], pre[48];
        snprintf(key, sizeof key, "%d", l);
        snprintf(pre, sizeof pre, "layer_rank_list.%d.", l);
        const cJSON *e2 = jget(lr, key);
        if (e2) {
            TRY(j_int(src, e2, pre, "q_rank", 0, &rq));
            TRY(j_int(src, e2, pre, "kv_rank", 0, &rkv));
            if (rq < 0 || rkv <= 0)
                return err_set(ERR_INPUT, "%s: field layer_rank_list.%d: ranks %d / %d out of range", src, l, rq, rkv);
        }
        a->mla_rank_q[l] = rq == a->mla.r_q ? 0 : rq;
        a->mla_rank_kv[l] = rkv == a->mla.r_kv ? 0 : rkv;
    }
    return 0;
}

static int fill_hybrid(const cJSON *root, const char *src, arch_t *a) {
    // Keys that restate config.json.
    TRY(same_int(src, root, "hidden_size", a->d));
    TRY(same_int(src, root, "d_model", a->d));
    TRY(same_int(src, root, "intermediate_size", a->ffn));
    TRY(same_int(src, root, "n_layer", a->n_layers));
    TRY(same_int(src, root, "num_attention_heads", a->H));
    float eps = a->eps;
    TRY(j_float(src, root, "", "rms_norm_eps", 0, &eps));
    if (eps != a->eps)
        return err_set(ERR_INPUT, "%s: field rms_norm_eps: %g does not match config.json (%g)", src, eps, a->eps);
    const char *act = NULL;
    TRY(j_str(src, root, "", "hidden_act", 0, &act));
    if (act && strcmp(act, "silu"))
        return err_set(ERR_UNSUP, "%s: field hidden_act: \"%s\" is not supported (silu)", src, act);
    int bias = 0;
    TRY(j_bool(src, root, "", "attention_bias", &bias));
    if (bias) return err_set(ERR_UNSUP, "%s: field attention_bias: true is not supported", src);

    // The layer plan.
    char mla[ARCH_MAX_LAYERS] = {0}, attn[ARCH_MAX_LAYERS] = {0};
    TRY(parse_layer_list(src, root, "mla_layers", a->n_layers, mla));
    TRY(parse_layer_list(src, root, "attn_layers", a->n_layers, attn));
    const char *lt = "mamba";
    TRY(j_str(src, root, "", "linear_type", 0, &lt));
    layer_kind_t lin;
    if (!strcmp(lt, "gdn"))
        lin = LAYER_GDN;
    else if (!strcmp(lt, "mamba") || !strcmp(lt, "mamba2"))
        lin = LAYER_M2;
    else
        return err_set(ERR_INPUT, "%s: field linear_type: expected \"gdn\" or \"mamba\", found \"%s\"", src, lt);
    int n_mla = 0, n_lin = 0;
    for (int l = 0; l < a->n_layers; l++) {
        if (mla[l] && attn[l]) return err_set(ERR_INPUT, "%s: layer %d is in both mla_layers and attn_layers", src, l);
        a->kind[l] = mla[l] ? LAYER_MLA : attn[l] ? LAYER_ATTN : lin;
        n_mla += mla[l];
        n_lin += !mla[l] && !attn[l];
    }

    if (n_mla) {
        // Missing keys take HybridConfig's dataclass defaults, as its loader does.
        mla_dims_t *m = &a->mla;
        int full_kv = 0;
        m->r_kv = 128;
        m->r_q = 1536;
        m->d_rope = 64;
        m->d_v = 128;
        m->d_nope = 128;
        m->n_kv = 8;
        m->latent_norm = 0;
        TRY(j_int(src, root, "", "kv_lora_rank", 0, &m->r_kv));
        const cJSON *q = jget(root, "q_lora_rank");
        if (q && cJSON_IsNull(q))
            m->r_q = 0; // null: a plain q_proj
        else
            TRY(j_int(src, root, "", "q_lora_rank", 0, &m->r_q));
        TRY(j_int(src, root, "", "qk_rope_head_dim", 0, &m->d_rope));
        TRY(j_int(src, root, "", "qk_nope_head_dim", 0, &m->d_nope));
        TRY(j_int(src, root, "", "v_head_dim", 0, &m->d_v));
        TRY(j_int(src, root, "", "num_key_value_heads", 0, &m->n_kv));
        TRY(j_bool(src, root, "", "use_lora_layer_norm", &m->latent_norm));
        TRY(j_bool(src, root, "", "use_full_kv_head", &full_kv));
        if (full_kv) m->n_kv = a->H;
        int div = 8; // only asserted on in Zebra-Llama: checked for its type, then unused
        TRY(j_int(src, root, "", "qkv_rank_divisor", 0, &div));
        // The MLA rope starts plain from the teacher's base (the teacher's own
        // scaling does not carry over: Zebra builds the MLA rope from these keys only).
        memset(&m->rope, 0, sizeof m->rope);
        m->rope.theta = a->rope.theta;
        m->rope.beta_fast = 32.0f;
        m->rope.beta_slow = 1.0f;
        m->rope.mscale = 1.0f;
        TRY(j_float(src, root, "", "rope_theta", 0, &m->rope.theta));
        TRY(parse_rope_mla(src, jget(root, "rope_scaling"), &m->rope));
        TRY(parse_ranks(src, root, a));
    } else if (present(jget(root, "layer_rank_list"))) {
        return err_set(ERR_INPUT, "%s: field layer_rank_list given but the plan has no MLA layer", src);
    }
    if (n_lin && lin == LAYER_M2) TRY(parse_m2(src, root, a));
    if (n_lin && lin == LAYER_GDN) TRY(parse_gdn(src, root, a));
    a->is_hybrid = 1;
    return 0;
}

int cfg_parse_hybrid_config(const char *text, const char *src, arch_t *a) {
    cJSON *root;
    TRY(parse_root(text, src, &root));
    // Our extension and X-EcoMLA's rank map on top of Zebra's dataclass fields.
    static const char *const known[] = {"hidden_size",
                                        "intermediate_size",
                                        "hidden_act",
                                        "n_layer",
                                        "mla_layers",
                                        "rms_norm_eps",
                                        "num_attention_heads",
                                        "num_key_value_heads",
                                        "kv_lora_rank",
                                        "q_lora_rank",
                                        "use_lora_layer_norm",
                                        "use_full_kv_head",
                                        "qk_rope_head_dim",
                                        "v_head_dim",
                                        "qk_nope_head_dim",
                                        "qkv_rank_divisor",
                                        "max_position_embeddings",
                                        "rope_theta",
                                        "rope_scaling",
                                        "attention_bias",
                                        "attention_dropout",
                                        "rope_type",
                                        "d_model",
                                        "ssm_cfg",
                                        "d_inner",
                                        "d_xb",
                                        "linear_type",
                                        "gdn_cfg",
                                        "attn_layers",
                                        "layer_rank_list"};
    for (const cJSON *e = root->child; e; e = e->next) {
        int ok = 0;
        for (size_t i = 0; i < sizeof known / sizeof *known && !ok; i++)
            ok = !strcmp(e->string, known[i]);
        if (!ok) log_warn("%s: ignoring unknown key %s", src, e->string);
    }
    int rc = fill_hybrid(root, src, a);
    cJSON_Delete(root);
    TRY(rc);
    return arch_validate(a, src);
}

int cfg_read_hybrid_config(const char *path, arch_t *a) {
    char *text;
    TRY(read_text(path, &text));
    int rc = cfg_parse_hybrid_config(text, path, a);
    free(text);
    return rc;
}

int cfg_parse_generation_config(const char *text, const char *src, arch_t *a) {
    cJSON *root;
    TRY(parse_root(text, src, &root));
    int ids[8], n, rc;
    if ((rc = parse_ids(src, root, "bos_token_id", ids, 8, &n)) == 0 && n && a->bos_id < 0) a->bos_id = ids[0];
    if (rc == 0) rc = parse_ids(src, root, "eos_token_id", ids, 8, &n);
    for (int i = 0; rc == 0 && i < n; i++) {
        int seen = 0;
        for (int k = 0; k < a->n_eos && !seen; k++)
            seen = a->eos_ids[k] == ids[i];
        if (seen) continue;
        if (a->n_eos == 8)
            rc = err_set(ERR_UNSUP, "%s: field eos_token_id: more than 8 end ids in all", src);
        else
            a->eos_ids[a->n_eos++] = ids[i];
    }
    if (rc == 0 && a->n_eos) a->eos_id = a->eos_ids[0];
    cJSON_Delete(root);
    return rc;
}

int cfg_load_dir(const char *dir, arch_t *a) {
    char path[1024];
    TRY(fs_join(path, sizeof path, dir, "config.json"));
    TRY(cfg_read_config_json(path, a));
    TRY(fs_join(path, sizeof path, dir, "hybrid_config.json"));
    if (fs_exists(path)) TRY(cfg_read_hybrid_config(path, a));
    TRY(fs_join(path, sizeof path, dir, "generation_config.json"));
    if (fs_exists(path)) {
        char *text;
        TRY(read_text(path, &text));
        int rc = cfg_parse_generation_config(text, path, a);
        free(text);
        TRY(rc);
    }
    return 0;
}

// ---- writing ----------------------------------------------------------------------
// The writers build a cJSON tree (floats as raw text, so 1e-5f prints as 1e-05
// rather than its double expansion) and print it the way Python's json.dumps
// with indent does, so the files look like the ones transformers writes.

// Python's repr of a float: the shortest digits that read back to the same
// value (compared in fp32 when `single`), fixed notation for decimal exponents
// -4..15, and ".0" on whole numbers.
static void fmt_num(double v, int single, char *out, size_t cap) {
    if (!isfinite(v)) {
        snprintf(out, cap, "null");
        return;
    }
    char e[48];
    int p = 1;
    for (; p < 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, v);
        double back = strtod(e, NULL);
        if (single ? (float)back == (float)v : back == v) break;
    }
    snprintf(e, sizeof e, "%.*e", p - 1, v);
    int x = atoi(strchr(e, 'e') + 1);
    if (x >= -4 && x < 16) {
        snprintf(out, cap, "%.*f", p - 1 - x > 0 ? p - 1 - x : 0, v);
        if (!strchr(out, '.')) strncat(out, ".0", cap - strlen(out) - 1);
    } else {
        snprintf(out, cap, "%s", e);
    }
}

static void put_indent(strbuf_t *b, int n) {
    for (int i = 0; i < n; i++)
        strbuf_puts(b, " ");
}

static void put_value(strbuf_t *b, const cJSON *j, int indent, int level) {
    char t[64];
    if (cJSON_IsRaw(j))
        strbuf_puts(b, j->valuestring);
    else if (cJSON_IsNull(j))
        strbuf_puts(b, "null");
    else if (cJSON_IsTrue(j))
        strbuf_puts(b, "true");
    else if (cJSON_IsFalse(j))
        strbuf_puts(b, "false");
    else if (cJSON_IsString(j))
        strbuf_json_str(b, j->valuestring);
    else if (cJSON_IsNumber(j)) {
        snprintf(t, sizeof t, "%lld", (long long)j->valuedouble); // the writers make integers only
        strbuf_puts(b, t);
    } else {
        int obj = cJSON_IsObject(j);
        if (!j->child) {
            strbuf_puts(b, obj ? "{}" : "[]");
            return;
        }
        strbuf_puts(b, obj ? "{\n" : "[\n");
        for (const cJSON *e = j->child; e; e = e->next) {
            put_indent(b, indent * (level + 1));
            if (obj) {
                strbuf_json_str(b, e->string);
                strbuf_puts(b, ": ");
            }
            put_value(b, e, indent, level + 1);
            strbuf_puts(b, e->next ? ",\n" : "\n");
        }
        put_indent(b, indent * level);
        strbuf_puts(b, obj ? "}" : "]");
    }
}

static int cmp_item(const void *x, const void *y) {
    return strcmp((*(cJSON *const *)x)->string, (*(cJSON *const *)y)->string);
}

// json.dumps(sort_keys=True): sorts the members of every object.
static int sort_keys(cJSON *o) {
    for (cJSON *e = o->child; e; e = e->next)
        TRY(sort_keys(e));
    if (!cJSON_IsObject(o) || !o->child) return 0;
    int n = cJSON_GetArraySize(o);
    cJSON **v = malloc((size_t)n * sizeof *v);
    if (!v) return err_set(ERR_NOMEM, "out of memory");
    int i = 0;
    for (cJSON *e = o->child; e; e = e->next)
        v[i++] = e;
    qsort(v, (size_t)n, sizeof *v, cmp_item);
    for (i = 0; i < n; i++) {
        v[i]->next = i + 1 < n ? v[i + 1] : NULL;
        v[i]->prev = i ? v[i - 1] : v[n - 1]; // cJSON: the first item's prev is the last
    }
    o->child = v[0];
    free(v);
    return 0;
}

// A number as Python prints it, written as raw text.
static cJSON *add_num(jb_t *jb, cJSON *o, const char *key, double v, int single) {
    char t[64];
    fmt_num(v, single, t, sizeof t);
    return jb_add(jb, o, key, cJSON_CreateRaw(t));
}
static cJSON *add_flt(jb_t *jb, cJSON *o, const char *key, float v) { return add_num(jb, o, key, v, 1); }

// An id list as transformers writes it: one integer, or a list when several.
static void add_ids(jb_t *jb, cJSON *o, const char *key, const int *ids, int n) {
    if (n == 0) {
        jb_null(jb, o, key);
    } else if (n == 1) {
        jb_int(jb, o, key, ids[0]);
    } else {
        cJSON *l = jb_arr(jb, o, key);
        for (int i = 0; i < n; i++)
            jb_int(jb, l, NULL, ids[i]);
    }
}

static int write_tree(cJSON *root, jb_t *jb, int indent, int sorted, const char *path) {
    int rc = jb->oom ? err_set(ERR_NOMEM, "%s: out of memory", path) : 0;
    if (rc == 0 && sorted) rc = sort_keys(root);
    strbuf_t b = {0};
    if (rc == 0) {
        put_value(&b, root, indent, 0);
        strbuf_puts(&b, "\n");
        if (b.oom) rc = err_set(ERR_NOMEM, "%s: out of memory", path);
    }
    if (rc == 0) rc = fs_write_all(path, b.s, b.n);
    free(b.s);
    cJSON_Delete(root);
    return rc;
}

// The teacher rope as a transformers rope_scaling dict (or null).
static void add_rope_hf(jb_t *jb, cJSON *o, const char *key, const rope_cfg_t *r) {
    if (r->scaling == ROPE_SCALE_NONE) {
        jb_null(jb, o, key);
        return;
    }
    cJSON *s = jb_obj(jb, o, key);
    add_flt(jb, s, "factor", r->factor);
    if (r->scaling == ROPE_SCALE_LINEAR) {
        jb_str(jb, s, "rope_type", "linear");
    } else if (r->scaling == ROPE_SCALE_LLAMA3) {
        add_flt(jb, s, "low_freq_factor", r->low_freq_factor);
        add_flt(jb, s, "high_freq_factor", r->high_freq_factor);
        jb_int(jb, s, "original_max_position_embeddings", r->orig_max_pos);
        jb_str(jb, s, "rope_type", "llama3");
    } else {
        jb_int(jb, s, "original_max_position_embeddings", r->orig_max_pos);
        if (r->beta_fast != 32.0f) add_flt(jb, s, "beta_fast", r->beta_fast);
        if (r->beta_slow != 1.0f) add_flt(jb, s, "beta_slow", r->beta_slow);
        if (r->attn_factor > 0) add_flt(jb, s, "attention_factor", r->attn_factor);
        jb_str(jb, s, "rope_type", "yarn");
    }
}

int cfg_write_config_json(const arch_t *a, const char *path) {
    jb_t jb = {0};
    int qwen3 = !strcmp(a->model_type, "qwen3");
    cJSON *o = jb_root(&jb);
    cJSON *arr = jb_arr(&jb, o, "architectures");
    jb_str(&jb, arr, NULL, qwen3 ? "Qwen3ForCausalLM" : "LlamaForCausalLM");
    jb_str(&jb, o, "model_type", qwen3 ? "qwen3" : "llama");
    jb_bool(&jb, o, "attention_bias", 0);
    add_num(&jb, o, "attention_dropout", 0.0, 0);
    add_ids(&jb, o, "bos_token_id", &a->bos_id, a->bos_id >= 0);
    add_ids(&jb, o, "eos_token_id", a->eos_ids, a->n_eos);
    if (a->pad_id >= 0) jb_int(&jb, o, "pad_token_id", a->pad_id);
    jb_int(&jb, o, "head_dim", a->dh);
    jb_str(&jb, o, "hidden_act", "silu");
    jb_int(&jb, o, "hidden_size", a->d);
    add_num(&jb, o, "initializer_range", 0.02, 0);
    jb_int(&jb, o, "intermediate_size", a->ffn);
    jb_int(&jb, o, "max_position_embeddings", a->max_pos);
    jb_int(&jb, o, "num_attention_heads", a->H);
    jb_int(&jb, o, "num_hidden_layers", a->n_layers);
    jb_int(&jb, o, "num_key_value_heads", a->Hkv);
    add_flt(&jb, o, "rms_norm_eps", a->eps);
    add_rope_hf(&jb, o, "rope_scaling", &a->rope);
    add_flt(&jb, o, "rope_theta", a->rope.theta);
    jb_bool(&jb, o, "tie_word_embeddings", a->tie_embeddings);
    jb_str(&jb, o, "torch_dtype", "bfloat16");
    jb_bool(&jb, o, "use_cache", 1);
    jb_int(&jb, o, "vocab_size", a->V);
    if (qwen3) {
        jb_int(&jb, o, "max_window_layers", a->n_layers);
        jb_null(&jb, o, "sliding_window");
        jb_bool(&jb, o, "use_sliding_window", 0);
    } else {
        jb_bool(&jb, o, "mlp_bias", 0);
        jb_int(&jb, o, "pretraining_tp", 1);
    }
    return write_tree(o, &jb, 2, 1, path);
}

int cfg_write_hybrid_config(const arch_t *a, const char *path) {
    jb_t jb = {0};
    int n_gdn = arch_count(a, LAYER_GDN), n_m2 = arch_count(a, LAYER_M2), n_attn = arch_count(a, LAYER_ATTN);
    int ranks = 0;
    for (int l = 0; l < a->n_layers; l++)
        ranks |= a->kind[l] == LAYER_MLA && (a->mla_rank_q[l] || a->mla_rank_kv[l]);
    if (n_gdn && n_m2)
        return err_set(ERR_UNSUP, "%s: a plan with both GDN and Mamba-2 layers has no hybrid_config.json form", path);
    const mla_dims_t *m = &a->mla;
    // Without Mamba-2 layers, write the MambaInLlama dims Zebra derives from the teacher.
    m2_dims_t m2 = a->m2;
    if (!n_m2 && m2.n_heads == 0) m2 = arch_m2_from_attention(a);
    cJSON *o = jb_root(&jb);
    jb_int(&jb, o, "hidden_size", a->d);
    jb_int(&jb, o, "intermediate_size", a->ffn);
    jb_str(&jb, o, "hidden_act", "silu");
    jb_int(&jb, o, "n_layer", a->n_layers);
    cJSON *ml = jb_arr(&jb, o, "mla_layers");
    for (int l = 0; l < a->n_layers; l++)
        if (a->kind[l] == LAYER_MLA) jb_int(&jb, ml, NULL, l);
    add_flt(&jb, o, "rms_norm_eps", a->eps);
    jb_int(&jb, o, "num_attention_heads", a->H);
    jb_int(&jb, o, "num_key_value_heads", m->n_kv);
    jb_int(&jb, o, "kv_lora_rank", m->r_kv);
    if (m->r_q > 0)
        jb_int(&jb, o, "q_lora_rank", m->r_q);
    else
        jb_null(&jb, o, "q_lora_rank");
    jb_bool(&jb, o, "use_lora_layer_norm", m->latent_norm);
    jb_bool(&jb, o, "use_full_kv_head", m->n_kv == a->H && a->Hkv != a->H);
    jb_int(&jb, o, "qk_rope_head_dim", m->d_rope);
    jb_int(&jb, o, "v_head_dim", m->d_v);
    jb_int(&jb, o, "qk_nope_head_dim", m->d_nope);
    jb_int(&jb, o, "qkv_rank_divisor", 8);
    jb_int(&jb, o, "max_position_embeddings", a->max_pos);
    add_flt(&jb, o, "rope_theta", m->rope.theta);
    if (m->rope.scaling == ROPE_SCALE_NONE) {
        jb_null(&jb, o, "rope_scaling");
    } else {
        const rope_cfg_t *r = &m->rope;
        cJSON *s = jb_obj(&jb, o, "rope_scaling");
        add_flt(&jb, s, "factor", r->factor);
        if (r->scaling == ROPE_SCALE_YARN) {
            jb_int(&jb, s, "original_max_position_embeddings", r->orig_max_pos);
            jb_str(&jb, s, "rope_type", "yarn");
            if (r->beta_fast != 32.0f) add_flt(&jb, s, "beta_fast", r->beta_fast);
            if (r->beta_slow != 1.0f) add_flt(&jb, s, "beta_slow", r->beta_slow);
            if (r->mscale != 1.0f) add_flt(&jb, s, "mscale", r->mscale);
            if (r->mscale_all_dim != 0.0f) add_flt(&jb, s, "mscale_all_dim", r->mscale_all_dim);
        } else if (r->scaling == ROPE_SCALE_LINEAR) {
            jb_str(&jb, s, "rope_type", "linear");
        } else {
            cJSON_Delete(o);
            return err_set(ERR_UNSUP, "%s: MLA rope scaling llama3 has no hybrid_config.json form", path);
        }
    }
    jb_bool(&jb, o, "attention_bias", 0);
    add_num(&jb, o, "attention_dropout", 0.0, 0);
    jb_str(&jb, o, "rope_type", "yarn");
    jb_int(&jb, o, "d_model", a->d);
    cJSON *sc = jb_obj(&jb, o, "ssm_cfg");
    jb_int(&jb, sc, "expand", 1);
    jb_int(&jb, sc, "ngroups", m2.n_heads);
    jb_int(&jb, sc, "d_state", m2.d_state);
    jb_bool(&jb, sc, "repeat_kv_before_conv", 0);
    jb_int(&jb, o, "d_inner", m2.d_inner);
    jb_int(&jb, o, "d_xb", m2.d_xb);
    jb_str(&jb, o, "linear_type", n_gdn ? "gdn" : "mamba");
    if (n_gdn) {
        const gdn_dims_t *g = &a->gdn;
        cJSON *gc = jb_obj(&jb, o, "gdn_cfg");
        jb_int(&jb, gc, "num_heads", g->n_heads);
        jb_int(&jb, gc, "num_v_heads", g->n_v_heads);
        jb_int(&jb, gc, "head_dim", g->head_k);
        add_num(&jb, gc, "expand_v", (double)g->head_v / g->head_k, 0);
        jb_int(&jb, gc, "conv_size", g->conv);
        jb_bool(&jb, gc, "use_gate", g->use_gate);
        add_flt(&jb, gc, "norm_eps", g->norm_eps);
        jb_bool(&jb, gc, "allow_neg_eigval", g->allow_neg_eigval);
    }
    if (n_attn) {
        cJSON *al = jb_arr(&jb, o, "attn_layers");
        for (int l = 0; l < a->n_layers; l++)
            if (a->kind[l] == LAYER_ATTN) jb_int(&jb, al, NULL, l);
    }
    if (ranks) {
        // Every MLA layer listed: the reader's inheritance rule would otherwise
        // give an unlisted layer its predecessor's ranks.
        cJSON *lr = jb_obj(&jb, o, "layer_rank_list");
        for (int l = 0; l < a->n_layers; l++) {
            if (a->kind[l] != LAYER_MLA) continue;
            char key[16];
            snprintf(key, sizeof key, "%d", l);
            cJSON *e = jb_obj(&jb, lr, key);
            jb_int(&jb, e, "q_rank", arch_mla_rq(a, l));
            jb_int(&jb, e, "kv_rank", arch_mla_rkv(a, l));
        }
    }
    return write_tree(o, &jb, 4, 0, path);
}

int cfg_write_generation_config(const arch_t *a, const char *path) {
    jb_t jb = {0};
    cJSON *o = jb_root(&jb);
    if (a->bos_id >= 0) jb_int(&jb, o, "bos_token_id", a->bos_id);
    if (a->n_eos) add_ids(&jb, o, "eos_token_id", a->eos_ids, a->n_eos);
    if (a->pad_id >= 0) jb_int(&jb, o, "pad_token_id", a->pad_id);
    return write_tree(o, &jb, 2, 1, path);
}
