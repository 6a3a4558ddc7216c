// hylo convert end to end on a tiny teacher folder built in the test: the
// stage-1 pure models, the stage-2 assembly from them by a layer plan, the
// recipe YAML path, reproducible seeds, and the recipe's strictness; and the
// recipe reader's typed getters on their own (these are the recipe tests).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/fs.h"
#include "base/parse.h"
#include "io/config.h"
#include "io/recipe.h"
#include "io/safetensors.h"
#include "model/checkpoint.h"
#include "testutil.h"

static void teacher(const char *dir) {
    arch_t a;
    arch_init(&a);
    a.d = 32, a.n_layers = 4, a.H = 4, a.Hkv = 2, a.dh = 8, a.ffn = 48, a.V = 100, a.tie_embeddings = 1;
    a.eos_id = 2, a.eos_ids[0] = 2, a.n_eos = 1;
    for (int l = 0; l < a.n_layers; l++)
        a.kind[l] = LAYER_ATTN;
    ptable_t pt;
    assert_int_equal(ptable_build(&pt, &a), 0);
    float *w = tu_params(&pt, 5, 0.2f);
    assert_int_equal(ckpt_write(dir, &a, &pt, w, ST_F32, NULL, NULL), 0);
    free(w);
    ptable_free(&pt);
}

// Reads tensor `name` of the checkpoint in dir (malloc'ed), n elements.
static float *read_tensor(const char *dir, const char *name, int64_t *n) {
    st_set_t s;
    assert_int_equal(st_set_open(&s, dir), 0);
    const st_tensor_t *t = st_set_find(&s, name, NULL);
    if (!t) printf("  %s: no tensor %s\n", dir, name);
    assert_non_null(t);
    float *p = malloc((size_t)t->numel * sizeof(float));
    assert_int_equal(st_set_read_f32(&s, name, p), 0);
    *n = t->numel;
    st_set_close(&s);
    return p;
}

static void same_tensor(const char *d1, const char *d2, const char *name) {
    int64_t n1, n2;
    float *a = read_tensor(d1, name, &n1), *b = read_tensor(d2, name, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(a, b, (size_t)n1 * sizeof(float));
    free(a), free(b);
}

static void test_stage1_and_assembly(void **st) {
    char T[300], A[300], B[300], H[300], args[1600];
    snprintf(T, sizeof T, "%s/teacher", tu_tmpdir()), snprintf(A, sizeof A, "%s/mla", tu_tmpdir());
    snprintf(B, sizeof B, "%s/gdn", tu_tmpdir()), snprintf(H, sizeof H, "%s/hybrid", tu_tmpdir());
    teacher(T);
    snprintf(args, sizeof args, "convert --teacher %s --out %s --all-mla --r-q 16 --r-kv 16", T, A);
    assert_int_equal(tu_run_hylo(args, NULL), 0);
    snprintf(args, sizeof args,
             "convert --teacher %s --out %s --all-linear --linear gdn --gdn-heads 2 --gdn-head-dim 16", T, B);
    assert_int_equal(tu_run_hylo(args, NULL), 0);
    // the summary is one line per item: without MLA layers it once began the
    // GDN line with an empty one
    char out_path[400], *out;
    snprintf(out_path, sizeof out_path, "%s/out.txt", tu_tmpdir());
    assert_int_equal(fs_read_all(out_path, &out, NULL), 0);
    assert_non_null(strstr(out, " parameters\n  GDN: 2 heads x 16 (value 32)\n  cache: "));
    free(out);
    snprintf(args, sizeof args, "convert --teacher %s --out %s --mla-layers 1,3 --from-mla %s --from-linear %s", T, H,
             A, B);
    assert_int_equal(tu_run_hylo(args, NULL), 0);
    arch_t a;
    assert_int_equal(cfg_load_dir(H, &a), 0);
    layer_kind_t want[4] = {LAYER_GDN, LAYER_MLA, LAYER_GDN, LAYER_MLA};
    for (int l = 0; l < 4; l++)
        assert_int_equal(a.kind[l], want[l]);
    assert_int_equal(a.mla.r_kv, 16);
    assert_int_equal(a.gdn.n_heads, 2);
    // layer i whole from its stage-1 model; embedding and final norm from the teacher
    same_tensor(H, A, "model.layers.1.mla.kv_b_proj.weight");
    same_tensor(H, A, "model.layers.3.mlp.down_proj.weight");
    same_tensor(H, A, "model.layers.3.input_layernorm.weight");
    same_tensor(H, B, "model.layers.0.gdn.q_proj.weight");
    same_tensor(H, B, "model.layers.2.gdn.A_log");
    same_tensor(H, B, "model.layers.2.mlp.up_proj.weight");
    same_tensor(H, T, "model.embed_tokens.weight");
    same_tensor(H, T, "model.norm.weight");
    // the hybrid runs
    snprintf(args, sizeof args, "info %s", H);
    assert_int_equal(tu_run_hylo(args, NULL), 0);
    // MLA layer indices must be layers of the teacher, each listed once, on both
    // paths (the assembly used to write kind[100000]: a crash; kind[5] of a
    // 4-layer teacher: a hybrid with one MLA layer instead of two)
    const char *plans[][2] = {{"1,5", "index 5 is out of range (the teacher has 4 layers)"},
                              {"1,100000", "index 100000 is out of range"},
                              {"3,1,3", "index 3 is listed twice"}};
    char bad[400];
    snprintf(bad, sizeof bad, "%s/bad_plan", tu_tmpdir());
    for (int i = 0; i < 3; i++)
        for (int assembly = 0; assembly < 2; assembly++) {
            int n = snprintf(args, sizeof args, "convert --teacher %s --out %s --mla-layers %s", T, bad, plans[i][0]);
            if (assembly) snprintf(args + n, sizeof args - (size_t)n, " --from-mla %s --from-linear %s", A, B);
            char *err;
            assert_int_equal(tu_run_hylo(args, &err), 2);
            assert_non_null(strstr(err, plans[i][1]));
            free(err);
            assert_false(fs_exists(bad));
        }
    // a stage-1 checkpoint of the wrong kind is refused with its name
    snprintf(args, sizeof args, "convert --teacher %s --out %s/bad --mla-layers 1 --from-mla %s --from-linear %s", T,
             tu_tmpdir(), B, A);
    assert_int_equal(tu_run_hylo(args, NULL), 2);
}

static void test_recipe_and_seed(void **st) {
    char T[300], R[300], yaml[300], args[1600];
    snprintf(T, sizeof T, "%s/teacher2", tu_tmpdir()), snprintf(R, sizeof R, "%s/from_recipe", tu_tmpdir());
    snprintf(yaml, sizeof yaml, "%s/recipe.yaml", tu_tmpdir());
    teacher(T);
    char text[2048];
    snprintf(text, sizeof text,
             "# a HyLo-style stage-1 recipe\n"
             "model_name_or_path: %s\n"
             "output_dir: %s\n"
             "linear_type: mamba\n"
             "mla_layers: [0, 2]\n"
             "q_lora_rank: 16\n"
             "kv_lora_rank: 16\n"
             "factor: 4.0\n"
             "original_max_position_embeddings: 64\n"
             "seed: 7\n"
             "learning_rate: 2.0e-4\n"
             "dataset_mixer:\n  JunxiongWang/sftdatasetv3: 1.0\n",
             T, R);
    assert_int_equal(fs_write_all(yaml, text, strlen(text)), 0);
    snprintf(args, sizeof args, "convert --recipe %s", yaml);
    assert_int_equal(tu_run_hylo(args, NULL), 0);
    arch_t a;
    assert_int_equal(cfg_load_dir(R, &a), 0);
    layer_kind_t want[4] = {LAYER_MLA, LAYER_M2, LAYER_MLA, LAYER_M2};
    for (int l = 0; l < 4; l++)
        assert_int_equal(a.kind[l], want[l]);
    assert_int_equal(a.mla.r_q, 16);
    assert_int_equal(a.mla.rope.scaling, ROPE_SCALE_YARN);
    assert_float_equal(a.mla.rope.factor, 4.0f, 0);
    assert_int_equal(a.mla.rope.orig_max_pos, 64);
    // the same seed reproduces the random initialisations, another one does not
    char R2[300], R3[300];
    snprintf(R2, sizeof R2, "%s/again", tu_tmpdir()), snprintf(R3, sizeof R3, "%s/seed8", tu_tmpdir());
    snprintf(args, sizeof args, "convert --recipe %s --out %s", yaml, R2);
    assert_int_equal(tu_run_hylo(args, NULL), 0);
    same_tensor(R, R2, "model.layers.1.mamba.in_proj.weight");
    same_tensor(R, R2, "model.layers.1.mamba.dt_bias");
    snprintf(args, sizeof args, "convert --recipe %s --out %s --seed 8", yaml, R3);
    assert_int_equal(tu_run_hylo(args, NULL), 0);
    int64_t n1, n2;
    float *x = read_tensor(R, "model.layers.1.mamba.dt_bias", &n1),
          *y = read_tensor(R3, "model.layers.1.mamba.dt_bias", &n2);
    assert_true(memcmp(x, y, (size_t)n1 * sizeof(float)) != 0);
    free(x), free(y);
    // an unknown key is an error naming it and its line
    const char *bad = "model_name_or_path: x\nmla_layer: [0]\n";
    assert_int_equal(fs_write_all(yaml, bad, strlen(bad)), 0);
    snprintf(args, sizeof args, "convert --recipe %s", yaml);
    assert_int_equal(tu_run_hylo(args, NULL), 2);
    char *out, p[400];
    snprintf(p, sizeof p, "%s/out.txt", tu_tmpdir());
    assert_int_equal(fs_read_all(p, &out, NULL), 0);
    assert_non_null(strstr(out, "recipe.yaml:2: unknown key 'mla_layer'"));
    free(out);
}

// The recipe getters: YAML null (~, null, nothing) is an absent key for every
// type; the number and list spellings are those of the command line.
static void test_recipe_getters(void **st) {
    const char *yaml = tu_tmp_path("getters.yaml");
    const char *text = "seed: ~\n"
                       "factor:\n"
                       "q_lora_rank: null\n"
                       "output_dir: ~\n"
                       "mla_layers: ~\n"
                       "kv_lora_rank: 16\n"
                       "learning_rate: 2.0e-4\n"
                       "attn_layers: \"[0, 2, 4]\"\n"
                       "ssm_layers: [1, 3]\n"
                       "max_steps: 12x\n"
                       "warmup_ratio: .\n"
                       "layer_rank_list: [1, x]\n";
    assert_int_equal(fs_write_all(yaml, text, strlen(text)), 0);
    recipe_t r;
    assert_int_equal(recipe_load(&r, yaml), 0);
    int64_t v = -7;
    double f = -7;
    const char *s = "unset";
    int *l = (int *)&v, n = -1;
    assert_int_equal(recipe_int(&r, "seed", 0, 1000, &v), 0); // was: "expected an integer, found '~'"
    assert_int_equal(v, -7);
    assert_int_equal(recipe_float(&r, "factor", 0, 1000, &f), 0);
    assert_float_equal(f, -7, 0);
    assert_int_equal(recipe_int(&r, "q_lora_rank", 0, 1000, &v), 0);
    assert_int_equal(v, -7);
    assert_int_equal(recipe_str(&r, "output_dir", &s), 0);
    assert_string_equal(s, "unset");
    assert_int_equal(recipe_int_list(&r, "mla_layers", &l, &n), 0);
    assert_null(l);
    assert_int_equal(n, 0);
    assert_int_equal(recipe_int(&r, "save_steps", 0, 1000, &v), 0); // absent
    assert_int_equal(v, -7);
    // present values
    assert_int_equal(recipe_int(&r, "kv_lora_rank", 0, 1000, &v), 0);
    assert_int_equal(v, 16);
    assert_int_equal(recipe_float(&r, "learning_rate", 0, 1000, &f), 0);
    assert_float_equal(f, 2.0e-4, 0);
    assert_int_equal(recipe_int_list(&r, "attn_layers", &l, &n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(l[2], 4);
    free(l);
    assert_int_equal(recipe_int_list(&r, "ssm_layers", &l, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(l[1], 3);
    free(l);
    // wrong forms name the file, line and key
    assert_int_equal(recipe_int(&r, "max_steps", 0, 1000, &v), ERR_INPUT);
    assert_non_null(strstr(err_msg(), "getters.yaml:10: key max_steps: expected an integer in [0, 1000], found '12x'"));
    assert_int_equal(recipe_float(&r, "warmup_ratio", 0, 1000, &f), ERR_INPUT);
    assert_non_null(strstr(err_msg(), "getters.yaml:11: key warmup_ratio"));
    assert_int_equal(recipe_int_list(&r, "layer_rank_list", &l, &n), ERR_INPUT);
    assert_non_null(strstr(err_msg(), "'x' is not a list"));
    assert_int_equal(v, 16); // unchanged by the failures
    recipe_free(&r);
    // the list grammar shared with --mla-layers
    int out[8];
    assert_int_equal(parse_int_list("0,3,6", 0, 100, out, 8), 3);
    assert_int_equal(parse_int_list(" [ 1 , 2 ] ", 0, 100, out, 8), 2);
    assert_int_equal(out[1], 2);
    assert_int_equal(parse_int_list("[]", 0, 100, out, 8), 0);
    const char *bad[] = {"", "0,x", "0,", ",0", "0 1", "[0", "0]", "-1", "101", "1,,2", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(parse_int_list(bad[i], 0, 100, out, 8), -1);
    assert_int_equal(parse_int_list("1,2,3", 0, 100, out, 2), -1); // over cap
}

// Recipe numbers past their field's limit are errors naming the file, line,
// key and limit, and convert writes nothing. A rank beyond 32 bits used to be
// truncated silently (2^32 + 16 became 16), and a YaRN factor of 1e39 wrote a
// checkpoint with "factor": null that could not be loaded, with exit 0.
static void test_recipe_limits(void **st) {
    char T[300], R[300], text[2048], args[1200], *err;
    const char *yaml = tu_tmp_path("limits.yaml");
    snprintf(T, sizeof T, "%s/teacher4", tu_tmpdir()), snprintf(R, sizeof R, "%s/limits_out", tu_tmpdir());
    teacher(T);
    static const struct {
        const char *line, *want;
    } c[] = {
        {"q_lora_rank: 4294967312", "limits.yaml:4: key q_lora_rank = 4294967312 is out of range [1, 1048576]"},
        {"kv_lora_rank: -16", "limits.yaml:4: key kv_lora_rank = -16 is out of range [1, 1048576]"},
        {"factor: 1e39", "limits.yaml:4: key factor = 1e+39 is out of range [1, 1024]"},
        {"factor: nan", "limits.yaml:4: key factor: expected a finite number in [1, 1024], found 'nan'"},
        {"factor: 0.5", "limits.yaml:4: key factor = 0.5 is out of range [1, 1024]"},
        {"seed: 99999999999", "limits.yaml:4: key seed = 99999999999 is out of range [0, 2147483647]"},
        {"original_max_position_embeddings: 99999999999999999999",
         "key original_max_position_embeddings: expected an integer in [1, 1073741824]"},
    };
    for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
        snprintf(text, sizeof text, "model_name_or_path: %s\noutput_dir: %s\nmla_layers: [0]\n%s\n", T, R, c[i].line);
        assert_int_equal(fs_write_all(yaml, text, strlen(text)), 0);
        snprintf(args, sizeof args, "convert --recipe %s", yaml);
        assert_int_equal(tu_run_hylo(args, &err), 2);
        if (!strstr(err, c[i].want)) fail_msg("\"%s\" lacks \"%s\"", err, c[i].want);
        free(err);
        assert_false(fs_exists(R));
    }
    // The getters take the field's range.
    recipe_t r;
    assert_int_equal(recipe_load(&r, yaml), 0);
    int64_t v = 7;
    assert_int_equal(recipe_int(&r, "original_max_position_embeddings", 0, INT64_MAX, &v), ERR_INPUT);
    assert_int_equal(v, 7);
    recipe_free(&r);
    snprintf(text, sizeof text, "seed: 11\nfactor: 3.5\n");
    assert_int_equal(fs_write_all(yaml, text, strlen(text)), 0);
    assert_int_equal(recipe_load(&r, yaml), 0);
    assert_int_equal(recipe_int(&r, "seed", 0, 10, &v), ERR_INPUT);
    assert_non_null(strstr(err_msg(), "limits.yaml:1: key seed = 11 is out of range [0, 10]"));
    assert_int_equal(recipe_int(&r, "seed", 0, 11, &v), 0);
    assert_int_equal(v, 11);
    double f = 0;
    assert_int_equal(recipe_float(&r, "factor", 1, 3, &f), ERR_INPUT);
    assert_int_equal(recipe_float(&r, "factor", 1, 4, &f), 0);
    assert_float_equal(f, 3.5, 0);
    recipe_free(&r);
}

// Renames a tensor inside a safetensors file (names of equal length, so the
// header keeps its size): the old name goes missing and the new one is unknown.
static void rename_tensor(const char *path, const char *from, const char *to) {
    char *data;
    size_t len;
    assert_int_equal(fs_read_all(path, &data, &len), 0);
    char *at = strstr(data + 8, from); // the JSON header follows its 8-byte length
    assert_non_null(at);
    assert_int_equal(strlen(from), strlen(to));
    memcpy(at, to, strlen(to));
    assert_int_equal(fs_write_all(path, data, len), 0);
    free(data);
}

// The assembly reads its stage-1 checkpoints as strictly as model_load does:
// a missing or unknown tensor is an error naming it, or with --allow-missing a
// warning (missing ones left at zero). It used to read only the tensors it
// took, never looked for unknown ones, and ignored --allow-missing.
static void test_assembly_strictness(void **st) {
    char T[300], A[300], B[300], H[300], part1[400], part2[400], args[1600], *err;
    snprintf(T, sizeof T, "%s/teacher3", tu_tmpdir()), snprintf(A, sizeof A, "%s/mla3", tu_tmpdir());
    snprintf(B, sizeof B, "%s/gdn3", tu_tmpdir()), snprintf(H, sizeof H, "%s/hybrid3", tu_tmpdir());
    teacher(T);
    snprintf(args, sizeof args, "convert --teacher %s --out %s --all-mla --r-q 16 --r-kv 16", T, A);
    assert_int_equal(tu_run_hylo(args, NULL), 0);
    snprintf(args, sizeof args, "convert --teacher %s --out %s --all-linear --gdn-heads 2 --gdn-head-dim 16", T, B);
    assert_int_equal(tu_run_hylo(args, NULL), 0);
    // the MLA checkpoint as two files (a folder without model.safetensors is
    // read from all its *.safetensors), the second holding an unknown tensor
    snprintf(part1, sizeof part1, "%s/model.safetensors", A);
    snprintf(part2, sizeof part2, "%s/part1.safetensors", A);
    assert_int_equal(rename(part1, part2), 0);
    snprintf(part1, sizeof part1, "%s/part1.safetensors", A);
    snprintf(part2, sizeof part2, "%s/part2.safetensors", A);
    st_writer_t w;
    st_writer_init(&w);
    float extra[2] = {1, 2};
    assert_int_equal(st_writer_add(&w, "model.layers.0.mla.extra.weight", ST_F32, 1, (int64_t[]){2}, extra), 0);
    assert_int_equal(st_writer_write(&w, part2, NULL), 0);
    st_writer_free(&w);
    snprintf(args, sizeof args, "convert --teacher %s --out %s --mla-layers 1,3 --from-mla %s --from-linear %s", T, H,
             A, B);
    assert_int_equal(tu_run_hylo(args, &err), 2);
    assert_non_null(strstr(err, "unknown tensor model.layers.0.mla.extra.weight"));
    free(err);
    assert_false(fs_exists(H));
    // a missing tensor of a layer the plan takes
    rename_tensor(part1, "model.layers.1.mla.kv_b_proj.weight", "model.layers.1.mla.kv_b_prxj.weight");
    assert_int_equal(tu_run_hylo(args, &err), 2);
    assert_non_null(strstr(err, "missing tensor model.layers.1.mla.kv_b_proj.weight"));
    free(err);
    assert_false(fs_exists(H));
    strcat(args, " --allow-missing");
    assert_int_equal(tu_run_hylo(args, &err), 0);
    assert_non_null(strstr(err, "missing tensor model.layers.1.mla.kv_b_proj.weight: left at zero"));
    assert_non_null(strstr(err, "ignoring unknown tensor model.layers.0.mla.extra.weight"));
    assert_non_null(strstr(err, "ignoring unknown tensor model.layers.1.mla.kv_b_prxj.weight"));
    free(err);
    int64_t n;
    float *kv = read_tensor(H, "model.layers.1.mla.kv_b_proj.weight", &n);
    for (int64_t i = 0; i < n; i++)
        assert_true(kv[i] == 0.0f);
    free(kv);
    same_tensor(H, A, "model.layers.3.mla.kv_b_proj.weight");
    same_tensor(H, B, "model.layers.0.gdn.q_proj.weight");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stage1_and_assembly), cmocka_unit_test(test_recipe_and_seed),
        cmocka_unit_test(test_recipe_getters),      cmocka_unit_test(test_recipe_limits),
        cmocka_unit_test(test_assembly_strictness),
    };
    return cmocka_run_group_tests(tests, tu_tmpdir_setup, tu_tmpdir_teardown);
}
