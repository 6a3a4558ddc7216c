// hylo info PATH: what a model is, without loading its weights onto a device.
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "base/err.h"
#include "cli/cli.h"
#include "io/weights.h"
#include "model/arch.h"
#include "model/params.h"

static const char *help = "usage: hylo info PATH\n"
                          "\n"
                          "Prints the architecture (per-layer mixer kinds for hybrids), the parameter\n"
                          "count, the bytes of KV / latent cache per token of one sequence and the fixed\n"
                          "recurrent-state bytes per sequence, and a summary of tensor dtypes. Caches\n"
                          "are kept in the device's activation dtype, so the bytes are given for each\n"
                          "device: fp32 on the CPU (--device cpu), bf16 on CUDA; they are what\n"
                          "generate, chat, eval and bench allocate per token (recurrent states: fp32, plus\n"
                          "conv windows in the activation dtype). For a hybrid, the cache of its teacher\n"
                          "(all layers attention) is shown beside it.\n";

// 134515008 -> "134,515,008"
static const char *commas(int64_t v, char *buf) {
    char tmp[32];
    int n = snprintf(tmp, sizeof tmp, "%lld", (long long)(v < 0 ? -v : v)), o = 0;
    if (v < 0) buf[o++] = '-';
    for (int i = 0; i < n; i++) {
        if (i && (n - i) % 3 == 0) buf[o++] = ',';
        buf[o++] = tmp[i];
    }
    buf[o] = 0;
    return buf;
}

static void print_rope(const char *what, const rope_cfg_t *r) {
    static const char *names[] = {"none", "llama3", "yarn", "linear"};
    printf("%-22s theta %g, scaling %s", what, r->theta, names[r->scaling]);
    if (r->scaling != ROPE_SCALE_NONE) printf(" (factor %g, original context %d)", r->factor, r->orig_max_pos);
    if (r->n_freq_div) printf(" (rope_freqs divisors)");
    printf("\n");
}

int cmd_info(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        fputs(help, stdout);
        return 0;
    }
    if (argc != 2) return cli_usage("info", "expected exactly one PATH");
    arch_t a;
    wsrc_t *src;
    int rc = wsrc_open(&src, argv[1], &a);
    if (rc < 0) return cli_fail(rc);
    ptable_t pt;
    if ((rc = ptable_build(&pt, &a)) < 0) {
        wsrc_close(src);
        return cli_fail(rc);
    }
    int n_mla = arch_count(&a, LAYER_MLA), n_gdn = arch_count(&a, LAYER_GDN), n_m2 = arch_count(&a, LAYER_M2);
    int hybrid = arch_count(&a, LAYER_ATTN) != a.n_layers;
    printf("%-22s %s\n", "path", argv[1]);
    printf("%-22s %s%s\n", "architecture", a.model_type, hybrid ? " (hybrid)" : "");
    printf("%-22s %d\n", "layers", a.n_layers);
    printf("%-22s attention %d, MLA %d, GDN %d, Mamba-2 %d\n", "mixers", arch_count(&a, LAYER_ATTN), n_mla, n_gdn,
           n_m2);
    if (hybrid) {
        printf("%-22s", "layer plan");
        for (int l = 0; l < a.n_layers; l++)
            printf(" %d:%s", l, layer_kind_name(a.kind[l]));
        printf("\n");
    }
    printf("%-22s d %d, heads %d, kv heads %d, head dim %d, ffn %d, vocab %d\n", "dimensions", a.d, a.H, a.Hkv, a.dh,
           a.ffn, a.V);
    printf("%-22s %g\n", "rms_norm_eps", a.eps);
    print_rope("rope", &a.rope);
    if (n_mla) {
        printf("%-22s r_q %d, r_kv %d, d_nope %d, d_rope %d, d_v %d, kv heads %d%s\n", "MLA", a.mla.r_q, a.mla.r_kv,
               a.mla.d_nope, a.mla.d_rope, a.mla.d_v, a.mla.n_kv, a.mla.latent_norm ? ", latent norms" : "");
        print_rope("MLA rope", &a.mla.rope);
    }
    if (n_gdn)
        printf("%-22s heads %d, value heads %d, head k %d, head v %d, conv %d%s\n", "GDN", a.gdn.n_heads,
               a.gdn.n_v_heads, a.gdn.head_k, a.gdn.head_v, a.gdn.conv, a.gdn.use_gate ? ", gated" : "");
    if (n_m2)
        printf("%-22s d_inner %d, d_xb %d, heads %d, headdim %d, d_state %d, conv %d\n", "Mamba-2", a.m2.d_inner,
               a.m2.d_xb, a.m2.n_heads, a.m2.headdim, a.m2.d_state, a.m2.conv);
    printf("%-22s %s\n", "tied embeddings", a.tie_embeddings ? "yes" : "no");
    int64_t np = ptable_count(&pt), emb = (int64_t)a.V * a.d;
    int64_t nemb = emb * (a.tie_embeddings ? 1 : 2);
    char b1[32], b2[32], b3[32];
    printf("%-22s %s (%s embedding + %s non-embedding)\n", "parameters", commas(np, b1), commas(nemb, b2),
           commas(np - nemb, b3));
    // the devices' act element sizes: what model_state_t allocates per token
    int ec = (int)be_act_size_of("cpu"), eg = (int)be_act_size_of("cuda");
    char b4[32];
    int64_t cache = arch_cache_bytes_per_token(&a, ec);
    printf("%-22s %s bytes per token on cpu (fp32), %s on cuda (bf16)\n", "KV cache", commas(cache, b1),
           commas(arch_cache_bytes_per_token(&a, eg), b2));
    if (hybrid) {
        arch_t t = a;
        for (int l = 0; l < t.n_layers; l++)
            t.kind[l] = LAYER_ATTN;
        int64_t tc = arch_cache_bytes_per_token(&t, ec);
        printf("%-22s %s bytes per token on cpu (fp32), %s on cuda (bf16); the hybrid's cache is %.2f%% of it\n",
               "teacher KV cache", commas(tc, b1), commas(arch_cache_bytes_per_token(&t, eg), b2),
               tc ? 100.0 * (double)cache / (double)tc : 0.0);
        printf("%-22s %s bytes per sequence on cpu, %s on cuda (fp32 states; conv windows fp32 / bf16)\n",
               "recurrent state", commas(arch_state_bytes(&a, 4, ec), b3), commas(arch_state_bytes(&a, 4, eg), b4));
    }
    char dt[512];
    wsrc_dtype_summary(src, dt, sizeof dt);
    printf("%-22s %s\n", "tensor dtypes", dt);
    ptable_free(&pt);
    wsrc_close(src);
    return 0;
}
