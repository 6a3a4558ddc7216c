#include "io/weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/checked.h"
#include "base/err.h"
#include "base/fs.h"
#include "base/log.h"
#include "io/config.h"
#include "io/safetensors.h"

struct wsrc {
    char path[1024];
    int is_gguf;
    gguf_t gguf;
    st_set_t st;         // a checkpoint folder
    char gdn_prefix[32]; // the module name the folder's GDN tensors use
    int permute_qk;      // llama GGUFs store q/k rows permuted for interleaved RoPE
    int H, Hkv;          // the head counts of the q/k rows to un-permute
    int qtype;           // folders: the block format of their U8 matrices (WSRC_QUANT_KEY), or -1
};

// ---- GGUF metadata -> arch ------------------------------------------------

// "<arch>.<suffix>" as an int; required keys must exist, optional ones default.
static int arch_int(const gguf_t *g, const arch_t *a, const char *suffix, int required, int def, int *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", a->model_type, suffix);
    int64_t v = def;
    TRY(required ? gguf_get_int(g, key, &v) : gguf_opt_int(g, key, &v));
    // Only what fits an int here; arch_validate then holds each field to its limit.
    TRY(ck_int(g->mf.path, key, v, 0, INT32_MAX));
    *out = (int)v;
    return 0;
}

static int arch_float(const gguf_t *g, const arch_t *a, const char *suffix, int required, float def, float *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", a->model_type, suffix);
    double v = def;
    TRY(required ? gguf_get_float(g, key, &v) : gguf_opt_float(g, key, &v));
    // Finite and within fp32; the field's own range (positive eps, theta, factor) is arch_validate's.
    TRY(ck_real(g->mf.path, key, v, -3.0e38, 3.0e38));
    *out = (float)v;
    return 0;
}

// A special token id: -1 when absent, negative or the "unset" marker
// UINT32_MAX some converters write (as the tokenizer loader reads them); any
// other value must be a token id.
static int special_id(const gguf_t *g, const char *key, int *out) {
    int64_t v = -1;
    TRY(gguf_opt_int(g, key, &v));
    if (v < 0 || v == (int64_t)UINT32_MAX)
        v = -1;
    else
        TRY(ck_int(g->mf.path, key, v, 0, LIM_VOCAB - 1));
    *out = (int)v;
    return 0;
}

int gguf_arch(const gguf_t *g, arch_t *a) {
    arch_init(a);
    const char *arch;
    size_t alen;
    TRY(gguf_get_str(g, "general.architecture", &arch, &alen));
    if (alen >= sizeof a->model_type) alen = sizeof a->model_type - 1;
    memcpy(a->model_type, arch, alen);
    a->model_type[alen] = 0;
    if (strcmp(a->model_type, "llama") && strcmp(a->model_type, "qwen3"))
        return err_set(ERR_UNSUP, "%s: general.architecture '%s' is not supported (llama, qwen3)", g->mf.path,
                       a->model_type);
    TRY(arch_int(g, a, "block_count", 1, 0, &a->n_layers));
    TRY(arch_int(g, a, "embedding_length", 1, 0, &a->d));
    TRY(arch_int(g, a, "feed_forward_length", 1, 0, &a->ffn));
    TRY(arch_int(g, a, "attention.head_count", 1, 0, &a->H));
    TRY(arch_int(g, a, "attention.head_count_kv", 0, a->H, &a->Hkv));
    TRY(arch_int(g, a, "attention.key_length", 0, a->H ? a->d / a->H : 0, &a->dh));
    TRY(arch_int(g, a, "context_length", 0, 0, &a->max_pos));
    const gguf_kv_t *toks = gguf_find(g, "tokenizer.ggml.tokens");
    // The default is the token count, clamped so that a huge one fails arch_validate instead of wrapping.
    int vdef = !toks || toks->type != GGUF_ARRAY ? 0 : toks->arr_n > LIM_VOCAB ? (int)LIM_VOCAB + 1 : (int)toks->arr_n;
    TRY(arch_int(g, a, "vocab_size", 0, vdef, &a->V));
    TRY(arch_float(g, a, "attention.layer_norm_rms_epsilon", 1, 0, &a->eps));
    TRY(arch_float(g, a, "rope.freq_base", 0, 10000.0f, &a->rope.theta));
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", a->model_type);
    if (gguf_find(g, key)) {
        const char *s;
        size_t sl;
        TRY(gguf_get_str(g, key, &s, &sl));
        if (sl == 4 && !memcmp(s, "none", 4)) {
        } else if ((sl == 6 && !memcmp(s, "linear", 6)) || (sl == 4 && !memcmp(s, "yarn", 4))) {
            a->rope.scaling = sl == 6 ? ROPE_SCALE_LINEAR : ROPE_SCALE_YARN;
            TRY(arch_float(g, a, "rope.scaling.factor", 1, 0, &a->rope.factor));
            TRY(arch_int(g, a, "rope.scaling.original_context_length", 0, a->max_pos, &a->rope.orig_max_pos));
        } else {
            return err_set(ERR_UNSUP, "%s: %s '%.*s' is not supported", g->mf.path, key, (int)sl, s);
        }
    }
    if (!strcmp(a->model_type, "qwen3")) a->qk_norm = 1;
    a->tie_embeddings = gguf_find_tensor(g, "output.weight") == NULL;
    const gguf_tensor_t *rf = gguf_find_tensor(g, "rope_freqs.weight");
    if (rf) { // Llama 3.1 frequency scaling stored as divisors
        if (rf->nelem != a->dh / 2 || rf->nelem > 128)
            return err_set(ERR_INPUT, "%s: rope_freqs.weight has %lld values, expected head_dim/2 = %d", g->mf.path,
                           (long long)rf->nelem, a->dh / 2);
        TRY(gguf_read_tensor_f32(g, rf, a->rope.freq_div));
        a->rope.n_freq_div = (int)rf->nelem;
    }
    TRY(special_id(g, "tokenizer.ggml.bos_token_id", &a->bos_id));
    TRY(special_id(g, "tokenizer.ggml.eos_token_id", &a->eos_id));
    if (a->eos_id >= 0) a->eos_ids[0] = a->eos_id, a->n_eos = 1;
    TRY(special_id(g, "tokenizer.ggml.padding_token_id", &a->pad_id));
    for (int l = 0; l < a->n_layers && l < ARCH_MAX_LAYERS; l++)
        a->kind[l] = LAYER_ATTN;
    a->mla.rope = a->rope;
    return arch_validate(a, g->mf.path);
}

// ---- HF <-> GGUF names ----------------------------------------------------

int gguf_name_for(const char *hf, char *out, size_t cap) {
    static const char *global[][2] = {
        {"model.embed_tokens.weight", "token_embd.weight"},
        {"model.norm.weight", "output_norm.weight"},
        {"lm_head.weight", "output.weight"},
    };
    for (size_t i = 0; i < sizeof global / sizeof global[0]; i++)
        if (!strcmp(hf, global[i][0])) return snprintf(out, cap, "%s", global[i][1]) < (int)cap ? 0 : ERR_INPUT;
    static const char *layer[][2] = {
        {"input_layernorm.weight", "attn_norm.weight"},    {"self_attn.q_proj.weight", "attn_q.weight"},
        {"self_attn.k_proj.weight", "attn_k.weight"},      {"self_attn.v_proj.weight", "attn_v.weight"},
        {"self_attn.o_proj.weight", "attn_output.weight"}, {"self_attn.q_norm.weight", "attn_q_norm.weight"},
        {"self_attn.k_norm.weight", "attn_k_norm.weight"}, {"post_attention_layernorm.weight", "ffn_norm.weight"},
        {"mlp.gate_proj.weight", "ffn_gate.weight"},       {"mlp.up_proj.weight", "ffn_up.weight"},
        {"mlp.down_proj.weight", "ffn_down.weight"},
    };
    int l, n = 0;
    if (sscanf(hf, "model.layers.%d.%n", &l, &n) == 1 && n > 0)
        for (size_t i = 0; i < sizeof layer / sizeof layer[0]; i++)
            if (!strcmp(hf + n, layer[i][0]))
                return snprintf(out, cap, "blk.%d.%s", l, layer[i][1]) < (int)cap ? 0 : ERR_INPUT;
    return err_set(ERR_INPUT, "no GGUF tensor name for %s", hf);
}

// llama.cpp stores llama q/k rows per head as [dh/2, 2] pairs (interleaved
// RoPE); HF uses [2, dh/2] (rotate_half). GGUF row 2i = HF row i, GGUF row
// 2i+1 = HF row i + dh/2 within each head. Rows of row_bytes bytes: fp32 rows
// or rows of quantised blocks alike.
static int unpermute_rows(void *w_, int64_t rows, size_t row_bytes, int heads) {
    char *w = w_;
    int64_t dh = rows / heads;
    char *tmp = malloc((size_t)rows * row_bytes);
    if (!tmp) return err_set(ERR_NOMEM, "out of memory");
    memcpy(tmp, w, (size_t)rows * row_bytes);
    for (int h = 0; h < heads; h++)
        for (int64_t i = 0; i < dh / 2; i++) {
            memcpy(w + (h * dh + i) * row_bytes, tmp + (h * dh + 2 * i) * row_bytes, row_bytes);
            memcpy(w + (h * dh + i + dh / 2) * row_bytes, tmp + (h * dh + 2 * i + 1) * row_bytes, row_bytes);
        }
    free(tmp);
    return 0;
}

// ---- the source ------------------------------------------------------------

int wsrc_open(wsrc_t **out, const char *path, arch_t *arch) {
    *out = NULL;
    wsrc_t *s = calloc(1, sizeof *s);
    if (!s) return err_set(ERR_NOMEM, "out of memory");
    snprintf(s->path, sizeof s->path, "%s", path);
    if (fs_is_dir(path)) {
        int rc = cfg_load_dir(path, arch);
        if (rc == 0) rc = st_set_open(&s->st, path);
        if (rc < 0) {
            free(s);
            return rc;
        }
        // Zebra-Llama / HyLo checkpoints store lm_head.weight even when the base
        // config ties it; the two are then independent parameters.
        if (arch->tie_embeddings && st_set_find(&s->st, "lm_head.weight", NULL)) arch->tie_embeddings = 0;
        s->qtype = -1;
        for (int fi = 0; fi < s->st.n_files; fi++)
            for (int k = 0; k < s->st.files[fi].n_meta; k++)
                if (!strcmp(s->st.files[fi].meta_key[k], WSRC_QUANT_KEY)) {
                    int t = ggml_type_from_name(s->st.files[fi].meta_val[k]);
                    int blk, bytes;
                    if (t < 0 || !ggml_type_supported((uint32_t)t) || !ggml_type_block((uint32_t)t, &blk, &bytes) ||
                        blk == 1) {
                        err_set(ERR_INPUT, "%s: %s '%s' is not a block format hylo reads", s->st.files[fi].path,
                                WSRC_QUANT_KEY, s->st.files[fi].meta_val[k]);
                        st_set_close(&s->st);
                        free(s);
                        return ERR_INPUT;
                    }
                    s->qtype = t;
                }
        // GDN module name: ours is "gdn"; accept the other names in use.
        snprintf(s->gdn_prefix, sizeof s->gdn_prefix, "gdn");
        static const char *alias[] = {"gdn", "linear_attn", "gated_deltanet", "attn"};
        for (int l = 0; l < arch->n_layers; l++) {
            if (arch->kind[l] != LAYER_GDN) continue;
            for (size_t i = 0; i < sizeof alias / sizeof alias[0]; i++) {
                char name[160];
                snprintf(name, sizeof name, "model.layers.%d.%s.q_proj.weight", l, alias[i]);
                if (st_set_find(&s->st, name, NULL)) {
                    snprintf(s->gdn_prefix, sizeof s->gdn_prefix, "%s", alias[i]);
                    break;
                }
            }
            break;
        }
        *out = s;
        return 0;
    }
    int rc = gguf_open(&s->gguf, path);
    if (rc == 0) rc = gguf_arch(&s->gguf, arch);
    if (rc < 0) {
        gguf_close(&s->gguf);
        free(s);
        return rc;
    }
    s->is_gguf = 1;
    s->permute_qk = !strcmp(arch->model_type, "llama");
    s->H = arch->H, s->Hkv = arch->Hkv;
    *out = s;
    return 0;
}

void wsrc_close(wsrc_t *s) {
    if (!s) return;
    if (s->is_gguf)
        gguf_close(&s->gguf);
    else
        st_set_close(&s->st);
    free(s);
}

// The folder's name for one of our parameter names (the GDN module alias).
static void folder_name(const wsrc_t *s, const char *name, char *out, size_t cap) {
    int l, n = 0;
    if (strcmp(s->gdn_prefix, "gdn") && sscanf(name, "model.layers.%d.gdn.%n", &l, &n) == 1 && n > 0)
        snprintf(out, cap, "model.layers.%d.%s.%s", l, s->gdn_prefix, name + n);
    else
        snprintf(out, cap, "%s", name);
}

const gguf_t *wsrc_gguf(const wsrc_t *s) { return s->is_gguf ? &s->gguf : NULL; }
const char *wsrc_path(const wsrc_t *s) { return s->path; }

int wsrc_has(const wsrc_t *s, const char *name) {
    char gname[160];
    if (s->is_gguf) return gguf_name_for(name, gname, sizeof gname) == 0 && gguf_find_tensor(&s->gguf, gname);
    folder_name(s, name, gname, sizeof gname);
    return st_set_find(&s->st, gname, NULL) != NULL;
}

static void shape_str(char *buf, size_t cap, const int64_t *shape, int nd) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < nd && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

static int same_shape(const int64_t *a, int na, const int64_t *b, int nb) {
    if (na != nb) return 0;
    for (int i = 0; i < na; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}

static int read_folder(wsrc_t *s, const char *name, const int64_t *shape, int nd, float *out) {
    char fname[160], want[96], got[96];
    folder_name(s, name, fname, sizeof fname);
    const st_file_t *f;
    const st_tensor_t *t = st_set_find(&s->st, fname, &f);
    if (!t) return err_set(ERR_INPUT, "%s: missing tensor %s", s->path, fname);
    uint32_t qt;
    size_t rb;
    if (t->dtype == ST_U8 && wsrc_raw_info(s, name, shape, nd, &qt, &rb)) { // a quantised matrix
        for (int64_t r = 0; r < shape[0]; r++)
            ggml_dequant(qt, t->data + (size_t)r * rb, out + r * shape[1], shape[1]);
        return 0;
    }
    if (!same_shape(t->shape, t->ndim, shape, nd)) {
        shape_str(want, sizeof want, shape, nd);
        shape_str(got, sizeof got, t->shape, t->ndim);
        return err_set(ERR_INPUT, "%s: tensor %s has shape %s, expected %s", s->path, fname, got, want);
    }
    return st_read_f32(f, t, out);
}

// Llama GGUFs: q/k rows back into HF order (rows of row_bytes bytes).
static int unpermute_qk(const wsrc_t *s, const char *name, void *rows, const int64_t *shape, int nd, size_t row_bytes) {
    if (!s->permute_qk || nd != 2) return 0;
    if (strstr(name, "self_attn.q_proj.weight")) return unpermute_rows(rows, shape[0], row_bytes, s->H);
    if (strstr(name, "self_attn.k_proj.weight")) return unpermute_rows(rows, shape[0], row_bytes, s->Hkv);
    return 0;
}

int wsrc_read(wsrc_t *s, const char *name, const int64_t *shape, int nd, float *out) {
    if (!s->is_gguf) return read_folder(s, name, shape, nd, out);
    char gname[128], want[96], got[96];
    TRY(gguf_name_for(name, gname, sizeof gname));
    const gguf_tensor_t *t = gguf_find_tensor(&s->gguf, gname);
    if (!t) return err_set(ERR_INPUT, "%s: missing tensor %s (for %s)", s->path, gname, name);
    // GGUF dims are reversed PyTorch dims.
    int64_t gshape[4];
    for (uint32_t i = 0; i < t->n_dims; i++)
        gshape[i] = t->ne[t->n_dims - 1 - i];
    if (!same_shape(gshape, (int)t->n_dims, shape, nd)) {
        shape_str(want, sizeof want, shape, nd);
        shape_str(got, sizeof got, gshape, (int)t->n_dims);
        return err_set(ERR_INPUT, "%s: tensor %s has shape %s, expected %s", s->path, gname, got, want);
    }
    TRY(gguf_read_tensor_f32(&s->gguf, t, out));
    return unpermute_qk(s, name, out, shape, nd, (size_t)shape[nd - 1] * sizeof(float));
}

// Block formats (and bf16) a matrix can stay in for inference.
static int raw_type(uint32_t type) {
    switch (type) {
    case GGML_Q4_0:
    case GGML_Q4_1:
    case GGML_Q8_0:
    case GGML_Q4_K:
    case GGML_Q6_K:
    case GGML_BF16: return 1;
    default: return 0;
    }
}

int wsrc_raw_info(const wsrc_t *s, const char *name, const int64_t *shape, int nd, uint32_t *type, size_t *row_bytes) {
    if (nd != 2) return 0;
    if (!s->is_gguf) { // checkpoint folders: bf16 matrices (what convert and train write)
        char fname[160];
        folder_name(s, name, fname, sizeof fname);
        const st_tensor_t *t = st_set_find(&s->st, fname, NULL);
        if (t && t->dtype == ST_BF16 && same_shape(t->shape, t->ndim, shape, nd)) {
            *type = GGML_BF16;
            *row_bytes = (size_t)shape[1] * 2;
            return 1;
        }
        int blk, bytes;
        if (!t || t->dtype != ST_U8 || s->qtype < 0 || t->ndim != 2 || t->shape[0] != shape[0] ||
            !ggml_type_block((uint32_t)s->qtype, &blk, &bytes) || shape[1] % blk ||
            t->shape[1] != shape[1] / blk * bytes)
            return 0;
        *type = (uint32_t)s->qtype;
        *row_bytes = (size_t)t->shape[1];
        return 1;
    }
    char gname[128];
    if (gguf_name_for(name, gname, sizeof gname) < 0) return 0;
    const gguf_tensor_t *t = gguf_find_tensor(&s->gguf, gname);
    int blk, bytes;
    if (!t || t->n_dims != 2 || t->ne[0] != shape[1] || t->ne[1] != shape[0] || !raw_type(t->type) ||
        !ggml_type_block(t->type, &blk, &bytes) || t->ne[0] % 32)
        return 0;
    *type = t->type;
    *row_bytes = (size_t)(t->ne[0] / blk) * (size_t)bytes;
    return 1;
}

int wsrc_raw_permuted(const wsrc_t *s, const char *name) {
    return s->is_gguf && s->permute_qk &&
           (strstr(name, "self_attn.q_proj.weight") || strstr(name, "self_attn.k_proj.weight"));
}

int wsrc_read_raw(wsrc_t *s, const char *name, const int64_t *shape, int nd, int64_t row0, int64_t nrows, void *out) {
    uint32_t type;
    size_t rb;
    if (!wsrc_raw_info(s, name, shape, nd, &type, &rb))
        return err_set(ERR_INPUT, "%s: tensor %s is not a matrix stored in a block format", s->path, name);
    int perm = wsrc_raw_permuted(s, name);
    if (row0 < 0 || nrows < 0 || row0 + nrows > shape[0] || (perm && (row0 != 0 || nrows != shape[0])))
        return err_set(ERR_INPUT, "%s: rows [%lld, +%lld) of %s (%lld rows%s)", s->path, (long long)row0,
                       (long long)nrows, name, (long long)shape[0], perm ? ", read whole: permuted" : "");
    size_t len = (size_t)nrows * rb;
    if (!s->is_gguf) {
        char fname[160];
        folder_name(s, name, fname, sizeof fname);
        const st_file_t *f;
        const st_tensor_t *t = st_set_find(&s->st, fname, &f);
        const uint8_t *src = t->data + (size_t)row0 * rb; // st_open checked that the tensor lies in the file
        memcpy(out, src, len);
        mfile_release(&f->mf, (size_t)(src - f->buf), len);
        return 0;
    }
    char gname[128];
    TRY(gguf_name_for(name, gname, sizeof gname));
    const gguf_tensor_t *t = gguf_find_tensor(&s->gguf, gname);
    size_t off = (size_t)t->offset + (size_t)row0 * rb;
    memcpy(out, s->gguf.mf.data + off, len); // gguf_open checked that the tensor lies in the file
    mfile_release(&s->gguf.mf, off, len);
    return perm ? unpermute_qk(s, name, out, shape, nd, rb) : 0;
}

void wsrc_dtype_summary(const wsrc_t *s, char *buf, size_t cap) {
    int counts[64] = {0};
    buf[0] = 0;
    if (!s->is_gguf) {
        int64_t c[ST_N_DTYPES] = {0};
        for (int64_t i = 0; i < s->st.n_index; i++)
            c[s->st.index[i].t->dtype]++;
        size_t n = 0;
        for (int t = 0; t < ST_N_DTYPES && n < cap; t++)
            if (c[t])
                n += (size_t)snprintf(buf + n, cap - n, "%s%s: %lld", n ? ", " : "", st_dtype_name(t), (long long)c[t]);
        return;
    }
    for (uint64_t i = 0; i < s->gguf.n_tensors; i++)
        if (s->gguf.tensors[i].type < 64) counts[s->gguf.tensors[i].type]++;
    size_t n = 0;
    for (int t = 0; t < 64 && n < cap; t++)
        if (counts[t])
            n += (size_t)snprintf(buf + n, cap - n, "%s%s: %d", n ? ", " : "", ggml_type_name((uint32_t)t), counts[t]);
}

static int cmp_strp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int wsrc_check_unknown(const wsrc_t *s, const char *const *known, int n_known, int allow) {
    if (s->is_gguf) return 0;
    // The known names as the folder spells them, sorted: one binary search per
    // tensor (a folder of any size is checked in n log n).
    char **ours = calloc((size_t)(n_known ? n_known : 1), sizeof *ours);
    int rc = ours ? 0 : err_set(ERR_NOMEM, "%s: out of memory for %d parameter names", s->path, n_known);
    for (int k = 0; k < n_known && rc == 0; k++) {
        char buf[160];
        folder_name(s, known[k], buf, sizeof buf);
        if (!(ours[k] = strdup(buf))) rc = err_set(ERR_NOMEM, "%s: out of memory for parameter names", s->path);
    }
    if (rc == 0) qsort(ours, (size_t)n_known, sizeof *ours, cmp_strp);
    int bad = 0;
    for (int64_t i = 0; rc == 0 && i < s->st.n_index; i++) {
        const char *name = s->st.index[i].t->name;
        size_t nl = strlen(name);
        // Buffers the published inference wrappers may have saved alongside the weights.
        if ((nl > 5 && !strcmp(name + nl - 5, ".wk_b")) || (nl > 5 && !strcmp(name + nl - 5, ".wv_b")) ||
            strstr(name, "rotary_emb.inv_freq"))
            continue;
        if (bsearch(&name, ours, (size_t)n_known, sizeof *ours, cmp_strp)) continue;
        if (!allow)
            rc = err_set(ERR_INPUT, "%s: unknown tensor %s (not part of the architecture its config describes)",
                         s->path, name);
        else if (bad++ < 8)
            log_warn("%s: ignoring unknown tensor %s", s->path, name);
    }
    for (int k = 0; ours && k < n_known; k++)
        free(ours[k]);
    free(ours);
    return rc;
}
