// hylo export PATH --out DIR: a Hugging Face folder from any model source.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "cli/cli.h"
#include "io/safetensors.h"
#include "io/weights.h"
#include "model/checkpoint.h"
#include "model/model.h"
#include "tok/tok.h"

static const char *help = "usage: hylo export PATH --out DIR [--dtype f32|bf16|f16] [--quantize q8_0|q4_0|q4_1]\n"
                          "\n"
                          "Writes a Hugging Face folder: model.safetensors (Hugging Face / Zebra-Llama /\n"
                          "HyLo tensor names; GGUF weights dequantised and llama q/k rows un-permuted),\n"
                          "config.json (+ hybrid_config.json for hybrids), generation_config.json,\n"
                          "tokenizer.json, tokenizer_config.json (with the chat template) and\n"
                          "special_tokens_map.json. DIR must not exist or be empty (checked before\n"
                          "anything is read; a trailing slash is fine); it is written as DIR.hylo-tmp.PID\n"
                          "and appears only when complete (one left by an interrupted run is removed by\n"
                          "the next run). A tokenizer with more tokens than the model's vocabulary is\n"
                          "refused. --dtype applies to matrices (1-D tensors stay f32); default f32.\n"
                          "--quantize stores the projection and embedding matrices in that ggml block\n"
                          "format (U8 tensors, named in the file's metadata; only hylo reads them), the\n"
                          "other matrices bf16.\n";

int cmd_export(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        fputs(help, stdout);
        return 0;
    }
    const char *path = NULL, *out = NULL, *dt = "f32", *quant = NULL;
    for (int i = 1; i < argc; i++) {
        const char *v;
        int r;
        if ((r = cli_opt("export", argc, argv, &i, "--out", &v))) {
            if (r < 0) return cli_fail(r);
            out = v;
        } else if ((r = cli_opt("export", argc, argv, &i, "--dtype", &v))) {
            if (r < 0) return cli_fail(r);
            dt = v;
        } else if ((r = cli_opt("export", argc, argv, &i, "--quantize", &v))) {
            if (r < 0) return cli_fail(r);
            quant = v;
        } else if (argv[i][0] == '-') {
            return cli_usage("export", "unknown option '%s'", argv[i]);
        } else if (!path) {
            path = argv[i];
        } else {
            return cli_usage("export", "unexpected argument '%s'", argv[i]);
        }
    }
    if (!path) return cli_usage("export", "missing PATH");
    if (!out) return cli_usage("export", "missing --out DIR");
    int dtype = quant ? cli_quant_dtype(quant) : cli_dtype(dt);
    if (dtype < 0 && quant) return cli_usage("export", "--quantize must be q8_0, q4_0 or q4_1 (got '%s')", quant);
    if (dtype < 0) return cli_usage("export", "--dtype must be f32, bf16 or f16 (got '%s')", dt);
    // The output is checked (and its temporary made) before anything is read,
    // and the tokenizer against the model before the weights are.
    outdir_t od;
    int rc = fs_outdir_begin(&od, out);
    if (rc < 0) return cli_fail(rc);
    arch_t a;
    wsrc_t *src = NULL;
    ptable_t pt = {0};
    float *host = NULL;
    tok_t tok = {0};
    int have_tok = 0; // a source folder without tokenizer files still exports (without them)
    rc = wsrc_open(&src, path, &a);
    if (rc == 0 && (rc = cli_source_tokenizer(src, &tok)) > 0) have_tok = 1, rc = 0;
    if (rc == 0) rc = ckpt_check(od.path, &a, have_tok ? &tok : NULL);
    if (rc == 0) rc = ptable_build(&pt, &a);
    if (rc == 0) rc = ptable_alloc_host(&pt, "the weights to export", 0, &host);
    if (rc == 0) rc = model_read_host(src, &pt, host, 0);
    const char *meta[] = {"format", "pt", "exported_by", "hylo export", NULL};
    if (rc == 0)
        rc = ckpt_write_out(&od, &a, &pt, host, dtype, have_tok ? &tok : NULL, meta); // commits, or removes it
    else
        fs_outdir_abort(&od);
    if (rc == 0) printf("hylo: wrote %s (%lld parameters, %s)\n", od.path, (long long)ptable_count(&pt), dt);
    tok_free(&tok);
    free(host);
    ptable_free(&pt);
    wsrc_close(src);
    return rc < 0 ? cli_fail(rc) : 0;
}
