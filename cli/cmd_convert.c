// hylo convert: a teacher Transformer -> an MLA + GDN / Mamba-2 hybrid
// checkpoint, either upcycled from the teacher directly or assembled from two
// stage-1 (layer-wise distilled) checkpoints by a layer plan.
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/checked.h"
#include "base/err.h"
#include "base/parse.h"
#include "base/timer.h"
#include "cli/cli.h"
#include "io/recipe.h"
#include "io/safetensors.h"
#include "io/weights.h"
#include "model/checkpoint.h"
#include "model/model.h"
#include "tok/tok.h"
#include "upcycle/upcycle.h"

static const char *help = "usage: hylo convert --teacher PATH --out DIR PLAN [options]\n"
                          "\n"
                          "Upcycles the teacher (a GGUF file or a Hugging Face folder) into a hybrid\n"
                          "checkpoint folder: MLA layers initialised by truncated SVD of the teacher's\n"
                          "projections, GDN (HyLo: GQA expansion + truncation) or Mamba-2 (MambaInLlama\n"
                          "mapping) for the other layers; MLPs, norms, embedding and head copied.\n"
                          "DIR must not exist or be empty (checked before anything is read; a trailing\n"
                          "slash is fine); it is written as DIR.hylo-tmp.PID and appears only when\n"
                          "complete (one left by an interrupted run is removed by the next run).\n"
                          "\n"
                          "plan (one of):\n"
                          "  --mla-layers LIST   MLA at these layer indices, e.g. 0,3,6 (the rest linear)\n"
                          "  --mla-every K       MLA at layers 0, K, 2K, ...\n"
                          "  --all-mla           every layer MLA (the stage-1 pure MLA model)\n"
                          "  --all-linear        every layer linear (the stage-1 pure linear model)\n"
                          "\n"
                          "options:\n"
                          "  --linear gdn|mamba2 the linear block (default gdn)\n"
                          "  --r-q N, --r-kv N, --d-rope N, --d-nope N, --d-v N\n"
                          "                      MLA dimensions (default by the recipe rules, printed)\n"
                          "  --gdn-heads N, --gdn-head-dim K   GDN: N heads of K key dims and 2K value dims\n"
                          "                      (default K 256, N floor(0.75 d / K), at least 1)\n"
                          "  --yarn-factor F, --yarn-orig N    YaRN on the MLA RoPE when F > 1 (default\n"
                          "                      none), over N original positions (default 2048)\n"
                          "  --from-mla DIR --from-linear DIR  assemble the hybrid from two stage-1\n"
                          "                      checkpoints: layer i whole from the MLA one when i is in\n"
                          "                      the plan, else from the linear one; embedding, final norm\n"
                          "                      and head from the teacher\n"
                          "  --recipe FILE.yaml  read model_name_or_path (teacher), mla_layers, linear_type,\n"
                          "                      q_lora_rank, kv_lora_rank, qk_rope_head_dim,\n"
                          "                      qk_nope_head_dim, v_head_dim, factor,\n"
                          "                      original_max_position_embeddings, mla_ILD_path,\n"
                          "                      linear_ILD_path, output_dir, seed; flags override it\n"
                          "  --seed S            seed of the random initialisations (default 42)\n"
                          "  --dtype f32|bf16|f16  matrices' dtype in model.safetensors (default f32)\n"
                          "  --quantize q8_0|q4_0|q4_1  projection and embedding matrices stored in that\n"
                          "                      ggml block format (inference: hylo generate keeps them so),\n"
                          "                      the other matrices bf16\n"
                          "  --allow-missing     a tensor missing from the teacher or a stage-1 checkpoint\n"
                          "                      is left at zero, an unknown one ignored, each with a\n"
                          "                      warning (default: an error naming it)\n";

typedef struct {
    const char *teacher, *out, *from_mla, *from_lin, *recipe;
    int *mla;
    int n_mla, every, all_mla, all_lin, have_plan;
    layer_kind_t lin;
    upc_dims_t dims;
    long seed;
    int dtype, flags;
} conv_opts_t;

// --mla-layers LIST into o->mla: ERR_INPUT when LIST is not a list of indices.
static int parse_mla_layers(const char *s, conv_opts_t *o) {
    int cap = (int)(strlen(s) / 2 + 1);
    free(o->mla); // a second --mla-layers is refused later as a second plan
    if (!(o->mla = malloc((size_t)cap * sizeof(int)))) return err_set(ERR_NOMEM, "out of memory");
    if ((o->n_mla = parse_int_list(s, 0, INT_MAX, o->mla, cap)) < 0)
        return err_set(ERR_INPUT,
                       "--mla-layers expects comma-separated layer indices, got '%s' (see 'hylo convert --help')", s);
    return 0;
}

// The YaRN factor of --yarn-factor and a recipe's factor.
#define YARN_FACTOR_MAX 1024

static int int_opt(const char *name, const char *v, int64_t hi, int *out) {
    long x;
    TRY(cli_int("convert", name, v, 1, (long)hi, &x));
    *out = (int)x;
    return 0;
}

static int parse(int argc, char **argv, conv_opts_t *o) {
    // options taking a string or a positive integer, by table
    struct {
        const char *flag;
        const char **field;
    } strs[] = {{"--teacher", &o->teacher},
                {"--out", &o->out},
                {"--from-mla", &o->from_mla},
                {"--from-linear", &o->from_lin},
                {"--recipe", &o->recipe}};
    struct {
        const char *flag;
        int *field;
        int64_t hi; // the limit of a model dimension, or of a position count
    } ints[] = {{"--r-q", &o->dims.r_q, LIM_DIM},
                {"--r-kv", &o->dims.r_kv, LIM_DIM},
                {"--d-rope", &o->dims.d_rope, LIM_DIM},
                {"--d-nope", &o->dims.d_nope, LIM_DIM},
                {"--d-v", &o->dims.d_v, LIM_DIM},
                {"--gdn-heads", &o->dims.gdn_heads, LIM_DIM},
                {"--gdn-head-dim", &o->dims.gdn_head_dim, LIM_DIM},
                {"--yarn-orig", &o->dims.yarn_orig, LIM_POS},
                {"--mla-every", &o->every, ARCH_MAX_LAYERS}};
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        int r = 0, done = 0;
        for (size_t k = 0; k < sizeof strs / sizeof strs[0] && !done; k++)
            if ((r = cli_opt("convert", argc, argv, &i, strs[k].flag, &v))) {
                TRY(r);
                *strs[k].field = v;
                done = 1;
            }
        for (size_t k = 0; k < sizeof ints / sizeof ints[0] && !done; k++)
            if ((r = cli_opt("convert", argc, argv, &i, ints[k].flag, &v))) {
                TRY(r);
                TRY(int_opt(ints[k].flag, v, ints[k].hi, ints[k].field));
                done = 1;
            }
        if (done) continue;
        if ((r = cli_opt("convert", argc, argv, &i, "--mla-layers", &v))) {
            TRY(r);
            TRY(parse_mla_layers(v, o));
            o->have_plan++;
        } else if ((r = cli_opt("convert", argc, argv, &i, "--linear", &v))) {
            TRY(r);
            if (strcmp(v, "gdn") && strcmp(v, "mamba2") && strcmp(v, "mamba"))
                return cli_usage("convert", "--linear must be gdn or mamba2");
            o->lin = strcmp(v, "gdn") ? LAYER_M2 : LAYER_GDN;
        } else if ((r = cli_opt("convert", argc, argv, &i, "--yarn-factor", &v))) {
            TRY(r);
            double f;
            TRY(cli_float("convert", "--yarn-factor", v, 1, YARN_FACTOR_MAX, &f));
            o->dims.yarn_factor = (float)f;
        } else if ((r = cli_opt("convert", argc, argv, &i, "--seed", &v))) {
            TRY(r);
            TRY(cli_int("convert", "--seed", v, 0, 0x7fffffffL, &o->seed));
        } else if ((r = cli_opt("convert", argc, argv, &i, "--dtype", &v))) {
            TRY(r);
            if ((o->dtype = cli_dtype(v)) < 0) return cli_usage("convert", "--dtype must be f32, bf16 or f16");
        } else if ((r = cli_opt("convert", argc, argv, &i, "--quantize", &v))) {
            TRY(r);
            if ((o->dtype = cli_quant_dtype(v)) < 0)
                return cli_usage("convert", "--quantize must be q8_0, q4_0 or q4_1 (got '%s')", v);
        } else if (cli_flag(argv, i, "--all-mla")) {
            o->all_mla = 1, o->have_plan++;
        } else if (cli_flag(argv, i, "--all-linear")) {
            o->all_lin = 1, o->have_plan++;
        } else if (cli_flag(argv, i, "--allow-missing")) {
            o->flags |= MODEL_ALLOW_MISSING;
        } else {
            return cli_usage("convert", "unknown argument '%s'", argv[i]);
        }
    }
    if (o->every) o->have_plan++;
    return 0;
}

// Recipe keys fill what the flags left unset.
static int apply_recipe(conv_opts_t *o, recipe_t *r) {
    const char *s = NULL;
    TRY(recipe_str(r, "model_name_or_path", &s));
    if (!o->teacher && s) o->teacher = s;
    s = NULL;
    TRY(recipe_str(r, "output_dir", &s));
    if (!o->out && s) o->out = s;
    s = NULL;
    TRY(recipe_str(r, "mla_ILD_path", &s));
    if (!o->from_mla && s) o->from_mla = s;
    s = NULL;
    TRY(recipe_str(r, "linear_ILD_path", &s));
    if (!s) TRY(recipe_str(r, "mamba_ILD_path", &s));
    if (!o->from_lin && s) o->from_lin = s;
    s = NULL;
    TRY(recipe_str(r, "linear_type", &s));
    if (s && !o->lin) o->lin = !strcmp(s, "gdn") ? LAYER_GDN : LAYER_M2;
    if (s && strcmp(s, "gdn") && strcmp(s, "mamba") && strcmp(s, "mamba2"))
        return err_set(ERR_INPUT, "%s: linear_type must be gdn or mamba (found '%s')", r->path, s);
    if (!o->have_plan) {
        TRY(recipe_int_list(r, "mla_layers", &o->mla, &o->n_mla));
        if (o->mla) o->have_plan = 1; // a list, possibly empty (all linear); null is no plan
    }
    // Each key in the range of its command-line flag (a dimension: 1..2^20).
    int64_t v;
    struct {
        const char *key;
        int *field;
        int64_t hi;
    } ints[] = {{"q_lora_rank", &o->dims.r_q, LIM_DIM},
                {"kv_lora_rank", &o->dims.r_kv, LIM_DIM},
                {"qk_rope_head_dim", &o->dims.d_rope, LIM_DIM},
                {"qk_nope_head_dim", &o->dims.d_nope, LIM_DIM},
                {"v_head_dim", &o->dims.d_v, LIM_DIM},
                {"original_max_position_embeddings", &o->dims.yarn_orig, LIM_POS}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        v = 0;
        TRY(recipe_int(r, ints[i].key, 1, ints[i].hi, &v));
        if (v > 0 && !*ints[i].field) *ints[i].field = (int)v;
    }
    double f = 0;
    TRY(recipe_float(r, "factor", 1, YARN_FACTOR_MAX, &f));
    if (f > 0 && !o->dims.yarn_factor) o->dims.yarn_factor = (float)f;
    v = -1;
    TRY(recipe_int(r, "seed", 0, 0x7fffffff, &v));
    if (v >= 0 && o->seed < 0) o->seed = (long)v;
    return 0;
}

// What the flags and the recipe together must give; a usage error (printed,
// status 2) otherwise.
static int usage_check(const conv_opts_t *o) {
    if (!o->teacher) return cli_usage("convert", "missing --teacher PATH");
    if (!o->out) return cli_usage("convert", "missing --out DIR");
    if (!o->from_mla != !o->from_lin) return cli_usage("convert", "--from-mla and --from-linear go together");
    if (o->have_plan != 1)
        return cli_usage("convert", "give exactly one plan: --mla-layers, --mla-every, --all-mla or --all-linear");
    return 0;
}

// The layer plan as a list of MLA indices (upc_plan checks them against the
// teacher, for the upcycling and the assembly alike).
static int plan_layers(const conv_opts_t *o, const arch_t *t, int **mla, int *n) {
    int listed = !o->all_mla && !o->every, cap = listed ? o->n_mla : t->n_layers;
    *mla = malloc((size_t)(cap ? cap : 1) * sizeof(int));
    *n = 0;
    if (!*mla) return err_set(ERR_NOMEM, "out of memory");
    if (listed) {
        if (o->n_mla) memcpy(*mla, o->mla, (size_t)o->n_mla * sizeof(int));
        *n = o->n_mla;
    } else {
        for (int l = 0; l < t->n_layers; l += o->all_mla ? 1 : o->every)
            (*mla)[(*n)++] = l;
    }
    return 0;
}

// Reads a whole model source (the teacher or a stage-1 checkpoint, architecture
// a) as model_load does: every tensor of its own table, missing or unknown ones
// an error unless --allow-missing. Then copies into sw the student parameters
// it supplies: the global ones (embedding, final norm, head) for kind -1, else
// those of the student's layers of that kind. Holds one source at a time in
// host memory beside the student, as the upcycling holds the teacher.
static int take_params(wsrc_t *src, const arch_t *a, int flags, int kind, const arch_t *s, const ptable_t *spt,
                       float *sw) {
    ptable_t pt = {0};
    float *w = NULL;
    int rc = ptable_build(&pt, a);
    char what[1200];
    snprintf(what, sizeof what, "the weights of %s", wsrc_path(src));
    if (rc == 0) rc = ptable_alloc_host(&pt, what, 0, &w);
    if (rc == 0) rc = model_read_host(src, &pt, w, flags);
    for (int i = 0; rc == 0 && i < spt->n; i++) {
        const param_t *p = &spt->p[i];
        if (p->layer < 0 ? kind != -1 : (int)s->kind[p->layer] != kind) continue;
        const param_t *q = ptable_find(&pt, p->name);
        if (!q || q->nd != p->nd || memcmp(q->shape, p->shape, (size_t)p->nd * sizeof p->shape[0]))
            rc = err_set(ERR_INPUT, "%s: %s does not have the assembled hybrid's shape", wsrc_path(src), p->name);
        else
            memcpy(sw + p->off, w + q->off, (size_t)p->numel * sizeof(float));
    }
    free(w);
    ptable_free(&pt);
    return rc;
}

// Stage-1 assembly: student layer l comes whole from the MLA checkpoint when
// it is an MLA layer, else from the linear one; the rest from the teacher.
static int assemble(const conv_opts_t *o, const arch_t *t, const int *mla, int n_mla, arch_t *s, wsrc_t *teacher,
                    ptable_t *spt, float **host_out) {
    arch_t am, al;
    wsrc_t *wm = NULL, *wl = NULL;
    TRY(wsrc_open(&wm, o->from_mla, &am));
    int rc = wsrc_open(&wl, o->from_lin, &al);
    if (rc == 0 && (am.d != t->d || am.n_layers != t->n_layers || al.d != t->d || al.n_layers != t->n_layers))
        rc = err_set(ERR_INPUT, "%s / %s: the stage-1 checkpoints do not match the teacher's width and depth",
                     o->from_mla, o->from_lin);
    for (int l = 0; rc == 0 && l < t->n_layers; l++) {
        if (am.kind[l] != LAYER_MLA)
            rc = err_set(ERR_INPUT, "%s: layer %d is not MLA (expected a pure MLA model)", o->from_mla, l);
        else if (al.kind[l] != al.kind[0] || (al.kind[l] != LAYER_GDN && al.kind[l] != LAYER_M2))
            rc = err_set(ERR_INPUT,
                         "%s: layer %d is not a linear layer of one kind (expected a pure GDN or Mamba-2 model)",
                         o->from_lin, l);
    }
    if (rc == 0) {
        *s = *t;
        s->is_hybrid = 1;
        s->mla = am.mla;
        memcpy(s->mla_rank_q, am.mla_rank_q, sizeof s->mla_rank_q);
        memcpy(s->mla_rank_kv, am.mla_rank_kv, sizeof s->mla_rank_kv);
        s->gdn = al.gdn;
        s->m2 = al.m2;
        rc = upc_plan(t->n_layers, mla, n_mla, al.kind[0], s->kind);
    }
    if (rc == 0) rc = arch_validate(s, "assembled hybrid");
    float *host = NULL;
    if (rc == 0) rc = ptable_build(spt, s);
    if (rc == 0) rc = ptable_alloc_host(spt, "the assembled hybrid's weights", 0, &host);
    if (rc == 0) rc = take_params(teacher, t, o->flags, -1, s, spt, host);
    if (rc == 0) rc = take_params(wm, &am, o->flags, LAYER_MLA, s, spt, host);
    if (rc == 0) rc = take_params(wl, &al, o->flags, al.kind[0], s, spt, host);
    wsrc_close(wm);
    wsrc_close(wl);
    if (rc < 0)
        free(host);
    else
        *host_out = host;
    return rc;
}

int cmd_convert(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        fputs(help, stdout);
        return 0;
    }
    conv_opts_t o = {.seed = -1, .dtype = ST_F32};
    recipe_t rec = {0};
    int rc = parse(argc, argv, &o);
    if (rc == 0 && o.recipe && (rc = recipe_load(&rec, o.recipe)) == 0) rc = apply_recipe(&o, &rec);
    if (rc == 0) rc = usage_check(&o);
    if (rc) {
        free(o.mla);
        recipe_free(&rec);
        return rc < 0 ? cli_fail(rc) : rc;
    }
    if (!o.lin) o.lin = LAYER_GDN;
    if (o.seed < 0) o.seed = 42;
    double t0 = time_now();
    // The output is checked (and its temporary made) before anything is read,
    // the tokenizer against the teacher before the conversion.
    outdir_t od;
    if ((rc = fs_outdir_begin(&od, o.out)) < 0) {
        free(o.mla);
        recipe_free(&rec);
        return cli_fail(rc);
    }
    arch_t t, s;
    wsrc_t *src = NULL;
    ptable_t tpt = {0}, spt = {0};
    float *tw = NULL, *sw = NULL;
    int *mla = NULL, n_mla = 0;
    tok_t tok = {0};
    int have_tok = 0; // a teacher folder without tokenizer files still converts (without them)
    rc = wsrc_open(&src, o.teacher, &t);
    if (rc == 0 && (rc = cli_source_tokenizer(src, &tok)) > 0) have_tok = 1, rc = 0;
    if (rc == 0) rc = ckpt_check(od.path, &t, have_tok ? &tok : NULL);
    if (rc == 0) rc = plan_layers(&o, &t, &mla, &n_mla);
    if (rc == 0 && o.from_mla) {
        rc = assemble(&o, &t, mla, n_mla, &s, src, &spt, &sw);
    } else if (rc == 0) {
        rc = upc_student_arch(&t, mla, n_mla, o.lin, &o.dims, &s);
        if (rc == 0) rc = ptable_build(&tpt, &t);
        if (rc == 0) rc = ptable_build(&spt, &s);
        if (rc == 0) rc = ptable_alloc_host(&tpt, "the teacher's weights", 0, &tw);
        if (rc == 0) rc = ptable_alloc_host(&spt, "the student's weights", 1, &sw);
        if (rc == 0) rc = model_read_host(src, &tpt, tw, o.flags);
        if (rc == 0) rc = upc_convert(&t, &tpt, tw, &s, &spt, sw, (uint64_t)o.seed);
    }
    char seed_s[32];
    snprintf(seed_s, sizeof seed_s, "%ld", o.seed);
    const char *meta[] = {"format", "pt", "converted_by", "hylo convert", "teacher", o.teacher, "seed", seed_s, NULL};
    if (rc == 0)
        rc = ckpt_write_out(&od, &s, &spt, sw, o.dtype, have_tok ? &tok : NULL, meta); // commits, or removes it
    else
        fs_outdir_abort(&od);
    if (rc == 0) {
        int n_gdn = arch_count(&s, LAYER_GDN), n_m2 = arch_count(&s, LAYER_M2); // n_mla: the plan's
        int64_t hc = arch_cache_bytes_per_token(&s, 2), tc = arch_cache_bytes_per_token(&t, 2);
        printf("hylo: wrote %s in %.1f s: %d MLA + %d GDN + %d Mamba-2 layers, %lld parameters\n", od.path,
               time_now() - t0, n_mla, n_gdn, n_m2, (long long)ptable_count(&spt));
        if (n_mla) {
            printf("  MLA layers:");
            for (int l = 0; l < s.n_layers; l++)
                if (s.kind[l] == LAYER_MLA) printf(" %d", l);
            printf("\n  MLA: r_q %d, r_kv %d, d_nope %d, d_rope %d, d_v %d", s.mla.r_q, s.mla.r_kv, s.mla.d_nope,
                   s.mla.d_rope, s.mla.d_v);
            if (s.mla.rope.scaling == ROPE_SCALE_YARN)
                printf(", YaRN factor %g over %d", s.mla.rope.factor, s.mla.rope.orig_max_pos);
            printf("\n");
        }
        if (n_gdn) printf("  GDN: %d heads x %d (value %d)\n", s.gdn.n_heads, s.gdn.head_k, s.gdn.head_v);
        if (n_m2) printf("  Mamba-2: %d heads, headdim %d, d_state %d\n", s.m2.n_heads, s.m2.headdim, s.m2.d_state);
        printf("  cache: %lld bytes/token (f16) vs the teacher's %lld (%.2f%%)\n", (long long)hc, (long long)tc,
               tc ? 100.0 * hc / tc : 0.0);
    }
    tok_free(&tok);
    free(tw), free(sw), free(mla), free(o.mla);
    ptable_free(&tpt), ptable_free(&spt);
    wsrc_close(src);
    recipe_free(&rec);
    return rc < 0 ? cli_fail(rc) : 0;
}
