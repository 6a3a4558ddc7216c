// Helpers shared by several commands.
#include <string.h>

#include "base/err.h"
#include "base/fs.h"
#include "base/log.h"
#include "cli/cli.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "model/checkpoint.h"
#include "model/model.h"
#include "backend/backend.h"
#include "tok/tok.h"

int cli_load_tokenizer(const wsrc_t *src, tok_t *tok) {
    const gguf_t *g = wsrc_gguf(src);
    if (g) return tok_load_gguf(tok, g);
    const char *path = wsrc_path(src);
    char tj[1100], tc[1100];
    TRY(fs_join(tj, sizeof tj, path, "tokenizer.json"));
    TRY(fs_join(tc, sizeof tc, path, "tokenizer_config.json"));
    return tok_load_json(tok, tj, fs_exists(tc) ? tc : NULL);
}

int cli_source_tokenizer(const wsrc_t *src, tok_t *tok) {
    const char *path = wsrc_path(src);
    char tj[1100];
    if (!wsrc_gguf(src) && !(fs_join(tj, sizeof tj, path, "tokenizer.json") == 0 && fs_exists(tj))) {
        log_warn("%s has no tokenizer.json: the output is written without tokenizer files", path);
        return 0;
    }
    TRY(cli_load_tokenizer(src, tok));
    return 1;
}

int cli_load_model(const char *path, be_t *be, model_t *m, tok_t *tok, int flags) {
    arch_t a;
    wsrc_t *src;
    TRY(wsrc_open(&src, path, &a));
    if (be->kind != BE_CPU && !(flags & CLI_GPU_BLOCKS)) flags &= ~MODEL_QUANT;
    int rc = model_load_src(m, src, &a, be, flags & ~CLI_GPU_BLOCKS);
    if (rc == 0 && tok && (rc = cli_load_tokenizer(src, tok)) < 0) model_free(m);
    wsrc_close(src);
    return rc;
}

int cli_quant_dtype(const char *s) {
    int t = ggml_type_from_name(s);
    return t == GGML_Q8_0 || t == GGML_Q4_0 || t == GGML_Q4_1 ? CKPT_QUANT + t : -1;
}

int cli_dtype(const char *s) {
    if (!strcmp(s, "f32") || !strcmp(s, "float32")) return ST_F32;
    if (!strcmp(s, "bf16") || !strcmp(s, "bfloat16")) return ST_BF16;
    if (!strcmp(s, "f16") || !strcmp(s, "float16")) return ST_F16;
    return -1;
}

int cli_backend(const char *device, be_t **be) {
    size_t scratch = !strcmp(device, "cuda") ? (size_t)2 << 30 : (size_t)64 << 20;
    return be_create(be, device, scratch);
}
