#include "model/checkpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/fs.h"
#include "io/config.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "io/weights.h"

static int write_files(const char *tmp, const arch_t *a, const ptable_t *pt, const float *host, int dtype,
                       const tok_t *tok, const char *const *meta) {
    char path[1200];
    TRY(fs_join(path, sizeof path, tmp, "config.json"));
    TRY(cfg_write_config_json(a, path));
    if (a->is_hybrid) {
        TRY(fs_join(path, sizeof path, tmp, "hybrid_config.json"));
        TRY(cfg_write_hybrid_config(a, path));
    }
    TRY(fs_join(path, sizeof path, tmp, "generation_config.json"));
    TRY(cfg_write_generation_config(a, path));
    if (tok) TRY(tok_write_hf(tok, tmp));
    st_writer_t w;
    st_writer_init(&w);
    int rc = 0, qtype = dtype >= CKPT_QUANT ? dtype - CKPT_QUANT : -1;
    uint8_t **blocks = calloc((size_t)(pt->n ? pt->n : 1), sizeof *blocks); // quantised copies, alive until written
    if (!blocks) rc = err_set(ERR_NOMEM, "out of memory");
    for (int i = 0; i < pt->n && rc == 0; i++) {
        const param_t *p = &pt->p[i];
        int blk, bytes;
        if (qtype >= 0 && p->nd == 2 && ptable_quantisable(p) && p->shape[1] % 32 == 0 &&
            ggml_type_block((uint32_t)qtype, &blk, &bytes)) {
            int64_t rb = p->shape[1] / blk * bytes, shape[2] = {p->shape[0], rb};
            if (!(blocks[i] = malloc((size_t)(p->shape[0] * rb)))) {
                rc = err_set(ERR_NOMEM, "%s: out of memory quantising %s", tmp, p->name);
                break;
            }
#pragma omp parallel for schedule(static)
            for (int64_t r = 0; r < p->shape[0]; r++)
                ggml_quantize((uint32_t)qtype, host + p->off + r * p->shape[1], blocks[i] + r * rb, p->shape[1]);
            rc = st_writer_add_raw(&w, p->name, 2, shape, blocks[i]);
            continue;
        }
        // 1-D parameters (norms, A_log, dt_bias, D) stay fp32 whatever the dtype:
        // they are tiny and the recurrences are sensitive to their precision.
        // Next to quantised matrices the other matrices (MLA's kv_b, convs) are bf16.
        rc = st_writer_add(&w, p->name,
                           p->nd == 1   ? ST_F32
                           : qtype >= 0 ? ST_BF16
                                        : dtype,
                           p->nd, p->shape, host + p->off);
    }
    // __metadata__: the caller's pairs, then the block format of the U8 tensors
    const char *qmeta[64];
    int nm = 0;
    for (; meta && meta[nm] && nm < 60; nm++)
        qmeta[nm] = meta[nm];
    if (qtype >= 0) qmeta[nm++] = WSRC_QUANT_KEY, qmeta[nm++] = ggml_type_name((uint32_t)qtype);
    qmeta[nm] = NULL;
    if (rc == 0) rc = fs_join(path, sizeof path, tmp, "model.safetensors");
    if (rc == 0) rc = st_writer_write(&w, path, qmeta);
    st_writer_free(&w);
    for (int i = 0; blocks && i < pt->n; i++)
        free(blocks[i]);
    free(blocks);
    return rc;
}

// The tokenizer written beside a model must fit its vocabulary: a token id
// past the embedding would make the folder unloadable (hylo refuses such a
// pair when it loads one).
static int check_tokenizer(const char *dir, const arch_t *a, const tok_t *tok) {
    if (tok && tok->n_vocab > a->V)
        return err_set(ERR_INPUT,
                       "%s: the tokenizer has %d tokens but the model's vocabulary is %d: the folder would not load",
                       dir, tok->n_vocab, a->V);
    return 0;
}

int ckpt_check(const char *dir, const arch_t *a, const tok_t *tok) {
    TRY(arch_validate(a, dir));
    return check_tokenizer(dir, a, tok);
}

// Writes into the folder begun (extra, when given, adds its files last) and
// commits it, or removes it on an error.
static int write_out(outdir_t *o, const arch_t *a, const ptable_t *pt, const float *host, int dtype, const tok_t *tok,
                     const char *const *meta, int (*extra)(const char *tmp, void *user), void *user) {
    int rc = ckpt_check(o->path, a, tok);
    if (rc == 0) rc = write_files(o->tmp, a, pt, host, dtype, tok, meta);
    if (rc == 0 && extra) rc = extra(o->tmp, user);
    if (rc == 0) return fs_outdir_commit(o);
    fs_outdir_abort(o);
    return rc;
}

int ckpt_write_out(outdir_t *o, const arch_t *a, const ptable_t *pt, const float *host, int dtype, const tok_t *tok,
                   const char *const *meta) {
    return write_out(o, a, pt, host, dtype, tok, meta, NULL, NULL);
}

int ckpt_write_with(const char *dir, const arch_t *a, const ptable_t *pt, const float *host, int dtype,
                    const tok_t *tok, const char *const *meta, int (*extra)(const char *tmp, void *user), void *user) {
    outdir_t o;
    TRY(ckpt_check(dir, a, tok));
    TRY(fs_outdir_begin(&o, dir));
    return write_out(&o, a, pt, host, dtype, tok, meta, extra, user);
}

int ckpt_write(const char *dir, const arch_t *a, const ptable_t *pt, const float *host, int dtype, const tok_t *tok,
               const char *const *meta) {
    return ckpt_write_with(dir, a, pt, host, dtype, tok, meta, NULL, NULL);
}
