// Config files <-> arch: the base models' config.json (SmolLM2, Llama-3.1 with
// llama3 scaling, Llama-3.2, Qwen3, transformers v5 rope_parameters), Zebra /
// HyLo / X-EcoMLA hybrid_config.json, generation_config.json, errors that name
// the field, and write -> read round trips that give back the same arch.
// Fixtures: tests/fixtures/io (README there).
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#include <cjson/cJSON.h>

#include "base/err.h"
#include "base/fs.h"
#include "io/config.h"
#include "model/params.h"

#define FIX "tests/fixtures/io/"

// noinline: once inlined, gcc 12 mistakes the returned buffer for the local pointer holding it.
__attribute__((noinline)) static char *slurp(const char *path) {
    char *t = NULL;
    if (fs_read_all(path, &t, NULL) < 0) fail_msg("%s", err_msg());
    return t;
}

static void load(arch_t *a, const char *config, const char *hybrid) {
    if (cfg_read_config_json(config, a) < 0) fail_msg("%s", err_msg());
    if (hybrid && cfg_read_hybrid_config(hybrid, a) < 0) fail_msg("%s", err_msg());
}

// Parses config text (and hybrid text) and expects an error of `code` whose
// message contains both fragments.
static void expect_err(const char *config, const char *hybrid, int code, const char *f1, const char *f2) {
    arch_t a;
    err_clear();
    int rc = cfg_parse_config_json(config, "test.json", &a);
    if (hybrid && rc == 0) rc = cfg_parse_hybrid_config(hybrid, "hybrid.json", &a);
    if (rc != code || (f1 && !strstr(err_msg(), f1)) || (f2 && !strstr(err_msg(), f2)))
        fail_msg("rc %d (want %d), message \"%s\" (want \"%s\" and \"%s\")", rc, code, err_msg(), f1 ? f1 : "",
                 f2 ? f2 : "");
}

// ---- config.json ----------------------------------------------------------------

static void test_smollm2(void **state) {
    (void)state;
    arch_t a;
    load(&a, FIX "smollm2_135m_instruct_config.json", NULL);
    assert_string_equal(a.model_type, "llama");
    assert_int_equal(a.d, 576);
    assert_int_equal(a.n_layers, 30);
    assert_int_equal(a.H, 9);
    assert_int_equal(a.Hkv, 3);
    assert_int_equal(a.dh, 64);
    assert_int_equal(a.ffn, 1536);
    assert_int_equal(a.V, 49152);
    assert_true(a.eps == 1e-5f);
    assert_true(a.rope.theta == 100000.0f);
    assert_int_equal(a.rope.scaling, ROPE_SCALE_NONE);
    assert_int_equal(a.max_pos, 8192);
    assert_int_equal(a.tie_embeddings, 1);
    assert_int_equal(a.qk_norm, 0);
    assert_int_equal(a.bos_id, 1);
    assert_int_equal(a.eos_id, 2);
    assert_int_equal(a.n_eos, 1);
    assert_int_equal(a.eos_ids[0], 2);
    assert_int_equal(a.pad_id, 2);
    assert_int_equal(a.is_hybrid, 0);
    for (int l = 0; l < a.n_layers; l++)
        assert_int_equal(a.kind[l], LAYER_ATTN);
    // 30 layers x K and V x 3 heads x 64 = 11,520 values per token (23,040 B in fp16, formats.md 6.4).
    assert_int_equal(arch_cache_bytes_per_token(&a, 2), 23040);
}

static void test_llama31(void **state) {
    (void)state;
    arch_t a;
    load(&a, FIX "llama31_8b_instruct_config.json", NULL);
    assert_int_equal(a.d, 4096);
    assert_int_equal(a.dh, 128); // no head_dim key: hidden / heads
    assert_int_equal(a.Hkv, 8);
    assert_int_equal(a.tie_embeddings, 0);
    assert_true(a.rope.theta == 500000.0f);
    assert_int_equal(a.rope.scaling, ROPE_SCALE_LLAMA3);
    assert_true(a.rope.factor == 8.0f);
    assert_true(a.rope.low_freq_factor == 1.0f);
    assert_true(a.rope.high_freq_factor == 4.0f);
    assert_int_equal(a.rope.orig_max_pos, 8192);
    assert_int_equal(a.bos_id, 128000);
    assert_int_equal(a.eos_id, 128001);
    assert_int_equal(a.n_eos, 3);
    assert_int_equal(a.eos_ids[2], 128009);
    assert_int_equal(a.pad_id, -1);
}

static void test_qwen3(void **state) {
    (void)state;
    arch_t a;
    load(&a, FIX "qwen3_8b_config.json", NULL);
    assert_string_equal(a.model_type, "qwen3");
    assert_int_equal(a.qk_norm, 1);
    assert_int_equal(a.dh, 128);
    assert_int_equal(a.n_layers, 36);
    assert_int_equal(a.ffn, 12288);
    assert_int_equal(a.V, 151936);
    assert_true(a.eps == 1e-6f);
    assert_true(a.rope.theta == 1000000.0f);
    assert_int_equal(a.max_pos, 40960);
    assert_int_equal(a.bos_id, 151643);
    assert_int_equal(a.eos_id, 151645);

    // Qwen3's opt-in YaRN: defaults beta 32 / 1, attention factor left to the rope code.
    char *t = slurp(FIX "qwen3_8b_config.json");
    char *p = strstr(t, "\"rope_scaling\": null");
    assert_non_null(p);
    char buf[4096];
    snprintf(buf, sizeof buf,
             "%.*s\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0, "
             "\"original_max_position_embeddings\": 32768}%s",
             (int)(p - t), t, p + strlen("\"rope_scaling\": null"));
    assert_int_equal(cfg_parse_config_json(buf, "qwen3-yarn", &a), 0);
    assert_int_equal(a.rope.scaling, ROPE_SCALE_YARN);
    assert_true(a.rope.factor == 4.0f);
    assert_int_equal(a.rope.orig_max_pos, 32768);
    assert_true(a.rope.beta_fast == 32.0f && a.rope.beta_slow == 1.0f);
    assert_true(a.rope.attn_factor == 0.0f);
    free(t);
}

#define BASE                                                                                                           \
    "\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, \"intermediate_size\": 128, "                     \
    "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 100"

static void test_defaults_and_variants(void **state) {
    (void)state;
    arch_t a;
    // Only the required keys: transformers' LlamaConfig defaults fill the rest.
    assert_int_equal(cfg_parse_config_json("{" BASE "}", "min", &a), 0);
    assert_int_equal(a.Hkv, 4);
    assert_int_equal(a.dh, 16);
    assert_true(a.eps == 1e-6f);
    assert_true(a.rope.theta == 10000.0f);
    assert_int_equal(a.max_pos, 2048);
    assert_int_equal(a.tie_embeddings, 0);
    assert_int_equal(a.bos_id, 1);
    assert_int_equal(a.eos_id, 2);
    // null kv heads and head_dim mean the defaults too; eos null means none.
    assert_int_equal(cfg_parse_config_json("{" BASE ", \"num_key_value_heads\": null, \"head_dim\": null, "
                                           "\"eos_token_id\": null, \"bos_token_id\": null}",
                                           "nulls", &a),
                     0);
    assert_int_equal(a.Hkv, 4);
    assert_int_equal(a.n_eos, 0);
    assert_int_equal(a.eos_id, -1);
    assert_int_equal(a.bos_id, -1);
    // No architectures: model_type decides.
    assert_int_equal(cfg_parse_config_json("{\"model_type\": \"qwen3\", \"hidden_size\": 64, \"intermediate_size\": "
                                           "128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                                           "\"head_dim\": 32, \"vocab_size\": 100}",
                                           "mt", &a),
                     0);
    assert_string_equal(a.model_type, "qwen3");
    assert_int_equal(a.qk_norm, 1);
    // "type" is the older spelling of "rope_type".
    assert_int_equal(
        cfg_parse_config_json("{" BASE ", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}}", "type", &a), 0);
    assert_int_equal(a.rope.scaling, ROPE_SCALE_LINEAR);
    assert_true(a.rope.factor == 2.0f);
    // YaRN: original_max_position_embeddings defaults to max_position_embeddings;
    // mscale + mscale_all_dim become the attention factor.
    assert_int_equal(cfg_parse_config_json("{" BASE ", \"max_position_embeddings\": 4096, \"rope_scaling\": "
                                           "{\"rope_type\": \"yarn\", \"factor\": 4.0, \"mscale\": 1.0, "
                                           "\"mscale_all_dim\": 0.5, \"beta_fast\": 16}}",
                                           "yarn", &a),
                     0);
    assert_int_equal(a.rope.orig_max_pos, 4096);
    assert_true(a.rope.beta_fast == 16.0f);
    float want = (float)((0.1 * log(4.0) + 1.0) / (0.05 * log(4.0) + 1.0));
    assert_true(fabsf(a.rope.attn_factor - want) < 1e-6f);
    assert_true(a.rope.mscale == 1.0f && a.rope.mscale_all_dim == 0.0f); // no softmax change for HF yarn

    // transformers v5: theta and scaling together in rope_parameters.
    assert_int_equal(cfg_parse_config_json("{" BASE ", \"rope_parameters\": {\"rope_type\": \"llama3\", "
                                           "\"rope_theta\": 500000.0, \"factor\": 32.0, \"low_freq_factor\": 1.0, "
                                           "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}}",
                                           "v5", &a),
                     0);
    assert_true(a.rope.theta == 500000.0f);
    assert_int_equal(a.rope.scaling, ROPE_SCALE_LLAMA3);
    assert_true(a.rope.factor == 32.0f);
    assert_int_equal(cfg_parse_config_json("{" BASE ", \"rope_parameters\": {\"rope_type\": \"default\", "
                                           "\"rope_theta\": 1000000.0}}",
                                           "v5default", &a),
                     0);
    assert_true(a.rope.theta == 1000000.0f);
    assert_int_equal(a.rope.scaling, ROPE_SCALE_NONE);
}

static void test_config_errors(void **state) {
    (void)state;
    expect_err("{\"architectures\": [\"MistralForCausalLM\"], \"hidden_size\": 64}", NULL, ERR_UNSUP, "architectures",
               "MistralForCausalLM");
    expect_err("{\"model_type\": \"gemma\"}", NULL, ERR_UNSUP, "model_type", "gemma");
    expect_err("{\"hidden_size\": 64}", NULL, ERR_INPUT, "missing field architectures", NULL);
    expect_err("{" BASE ", \"model_type\": \"qwen3\"}", NULL, ERR_INPUT, "model_type", "LlamaForCausalLM");
    expect_err("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": \"64\"}", NULL, ERR_INPUT,
               "field hidden_size", "expected an integer");
    expect_err("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64.5}", NULL, ERR_INPUT,
               "field hidden_size", "64.5");
    expect_err("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, \"intermediate_size\": 128, "
               "\"num_hidden_layers\": 2, \"num_attention_heads\": 4}",
               NULL, ERR_INPUT, "missing field vocab_size", NULL);
    expect_err("{" BASE ", \"tie_word_embeddings\": 1}", NULL, ERR_INPUT, "field tie_word_embeddings", "true or false");
    expect_err("{" BASE ", \"rms_norm_eps\": \"1e-5\"}", NULL, ERR_INPUT, "field rms_norm_eps", "a number");
    expect_err("{" BASE ", \"eos_token_id\": [1, \"2\"]}", NULL, ERR_INPUT, "field eos_token_id", NULL);
    // a negative id, alone as in a list (fuzz_config: a config written with
    // generation_config.json's -2 among its ids did not read back)
    expect_err("{" BASE ", \"eos_token_id\": -2}", NULL, ERR_INPUT, "field eos_token_id", "non-negative");
    expect_err("{" BASE ", \"eos_token_id\": [2, -2]}", NULL, ERR_INPUT, "field eos_token_id", "non-negative");
    expect_err("{" BASE ", \"rope_scaling\": {\"rope_type\": \"dynamic\", \"factor\": 2.0}}", NULL, ERR_UNSUP,
               "rope_scaling.rope_type", "dynamic");
    expect_err("{" BASE ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"high_freq_factor\": 4.0, "
               "\"original_max_position_embeddings\": 8192}}",
               NULL, ERR_INPUT, "missing field rope_scaling.low_freq_factor", NULL);
    expect_err("{" BASE ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"type\": \"linear\", \"factor\": 2.0}}", NULL,
               ERR_INPUT, "rope_scaling.rope_type", "disagree");
    expect_err("{" BASE ", \"rope_scaling\": [1]}", NULL, ERR_INPUT, "field rope_scaling", "an object or null");
    expect_err("{" BASE ", \"hidden_act\": \"gelu\"}", NULL, ERR_UNSUP, "field hidden_act", "gelu");
    expect_err("{" BASE ", \"attention_bias\": true}", NULL, ERR_UNSUP, "field attention_bias", NULL);
    expect_err("{" BASE ", \"num_key_value_heads\": 3}", NULL, ERR_INPUT, "num_key_value_heads", NULL);
    expect_err("{" BASE ", \"vocab_size\": 7}", NULL, ERR_INPUT, "duplicate key vocab_size", NULL);
    expect_err("{" BASE ", ", NULL, ERR_INPUT, "test.json: not valid JSON", NULL);
    expect_err("[1, 2]", NULL, ERR_INPUT, "JSON object", NULL);
    // A file that is not there names its path.
    arch_t a;
    err_clear();
    assert_true(cfg_read_config_json(FIX "no_such_config.json", &a) < 0);
    assert_non_null(strstr(err_msg(), "no_such_config.json"));
}

// ---- hybrid_config.json ------------------------------------------------------------

static void test_zebra(void **state) {
    (void)state;
    arch_t a;
    load(&a, FIX "llama32_1b_instruct_config.json", FIX "zebra_1b_8mla8m2_hybrid_config.json");
    assert_int_equal(a.is_hybrid, 1);
    for (int l = 0; l < 16; l++)
        assert_int_equal(a.kind[l], l % 2 == 0 ? LAYER_MLA : LAYER_M2);
    const mla_dims_t *m = &a.mla;
    assert_int_equal(m->r_q, 1344);
    assert_int_equal(m->r_kv, 128);
    assert_int_equal(m->d_rope, 32);
    assert_int_equal(m->d_nope, 32);
    assert_int_equal(m->d_v, 64);
    assert_int_equal(m->n_kv, 8);
    assert_int_equal(m->latent_norm, 0);
    assert_true(m->rope.theta == 500000.0f);
    assert_int_equal(m->rope.scaling, ROPE_SCALE_YARN);
    assert_true(m->rope.factor == 32.0f);
    assert_int_equal(m->rope.orig_max_pos, 8192);
    assert_true(m->rope.beta_fast == 32.0f && m->rope.beta_slow == 1.0f);
    assert_true(m->rope.mscale == 1.0f && m->rope.mscale_all_dim == 0.0f);
    // The teacher's rope is untouched by the MLA one.
    assert_int_equal(a.rope.scaling, ROPE_SCALE_LLAMA3);
    const m2_dims_t *s = &a.m2;
    assert_int_equal(s->n_heads, 32);
    assert_int_equal(s->headdim, 64);
    assert_int_equal(s->d_state, 64);
    assert_int_equal(s->d_inner, 2048);
    assert_int_equal(s->d_xb, 512);
    assert_int_equal(s->conv, 4);
    // hybrid_model.md 1.2: MLA cache 160 values per token per layer; Mamba state
    // [32, 64, 64] + conv [3072, 4] per layer.
    assert_int_equal(arch_cache_bytes_per_token(&a, 1), 8 * 160);
    assert_int_equal(arch_state_bytes(&a, 1, 1), 8 * (32 * 64 * 64 + 3072 * 4));
}

static void test_hylo_gdn(void **state) {
    (void)state;
    arch_t a;
    load(&a, FIX "llama32_1b_instruct_config.json", FIX "hylo_1b_4mla12gdn_hybrid_config.json");
    int n_mla = 0;
    for (int l = 0; l < 16; l++) {
        int is_mla = l == 1 || l == 5 || l == 10 || l == 14;
        assert_int_equal(a.kind[l], is_mla ? LAYER_MLA : LAYER_GDN);
        n_mla += is_mla;
    }
    assert_int_equal(n_mla, 4);
    const gdn_dims_t *g = &a.gdn;
    assert_int_equal(g->n_heads, 6);
    assert_int_equal(g->n_v_heads, 6);
    assert_int_equal(g->head_k, 256);
    assert_int_equal(g->head_v, 512);
    assert_int_equal(g->conv, 4);
    assert_int_equal(g->use_gate, 1);
    assert_int_equal(g->allow_neg_eigval, 0);
    assert_true(g->norm_eps == 1e-6f);
    assert_int_equal(a.mla.rope.orig_max_pos, 2048);
    // KV cache vs the backbone: 4 x 160 / (16 x 2 x 8 x 64) = 3.9% (hylo_recipe.md).
    arch_t base;
    load(&base, FIX "llama32_1b_instruct_config.json", NULL);
    double ratio = (double)arch_cache_bytes_per_token(&a, 2) / (double)arch_cache_bytes_per_token(&base, 2);
    assert_true(fabs(ratio - 0.0390625) < 1e-9);
    // Mamba-2 dims are not read for a GDN plan.
    assert_int_equal(a.m2.n_heads, 0);

    // attn_layers keep attention; gdn_cfg absent takes the HyLo recipe defaults.
    char *t = slurp(FIX "hylo_1b_4mla12gdn_hybrid_config.json");
    char *p = strstr(t, ",\n    \"gdn_cfg\"");
    assert_non_null(p);
    strcpy(p, ", \"attn_layers\": [0, 15]}");
    assert_int_equal(cfg_parse_hybrid_config(t, "attn", &a), 0);
    assert_int_equal(a.kind[0], LAYER_ATTN);
    assert_int_equal(a.kind[15], LAYER_ATTN);
    assert_int_equal(a.kind[2], LAYER_GDN);
    assert_int_equal(a.gdn.n_heads, 6); // floor(0.75 * 2048) / 256
    assert_int_equal(a.gdn.head_v, 512);
    free(t);
}

static void test_xecomla(void **state) {
    (void)state;
    arch_t a;
    load(&a, FIX "llama32_1b_instruct_config.json", FIX "xecomla_llama_hybrid_config.json");
    for (int l = 0; l < 16; l++)
        assert_int_equal(a.kind[l], LAYER_MLA);
    assert_int_equal(a.mla.n_kv, 32); // use_full_kv_head: G = H
    const rope_cfg_t *r = &a.mla.rope;
    assert_int_equal(r->scaling, ROPE_SCALE_YARN);
    assert_int_equal(r->orig_max_pos, 4096); // not written by X-EcoMLA: DeepSeek's default
    assert_true(r->mscale == 1.0f && r->mscale_all_dim == 0.0f);
    // Per-layer ranks; layers missing from the map inherit the previous layer's.
    int want_q[16], want_kv[16];
    for (int l = 0; l < 16; l++) {
        want_q[l] = l == 0 ? 1424 : l <= 2 ? 1024 : l < 15 ? 1424 : 2048;
        want_kv[l] = l == 0 ? 64 : l <= 2 ? 96 : l < 15 ? 64 : 128;
        assert_int_equal(arch_mla_rq(&a, l), want_q[l]);
        assert_int_equal(arch_mla_rkv(&a, l), want_kv[l]);
    }
    assert_int_equal(a.mla_rank_q[0], 0); // equal to the shared rank: stored as 0
    assert_int_equal(a.mla_rank_kv[2], 96);
}

static const char *hyb_min =
    "{\"hidden_size\": 64, \"n_layer\": 2, \"mla_layers\": [0], \"num_attention_heads\": 4, "
    "\"num_key_value_heads\": 4, \"kv_lora_rank\": 16, \"q_lora_rank\": null, \"qk_rope_head_dim\": 8, "
    "\"v_head_dim\": 16, \"qk_nope_head_dim\": 8, \"rope_scaling\": null, \"ssm_cfg\": {\"ngroups\": 4, "
    "\"d_state\": 16, \"repeat_kv_before_conv\": false}, \"d_inner\": 64, \"d_xb\": 64%s}";

static void expect_hyb_err(const char *extra, int code, const char *f1, const char *f2) {
    char buf[2048];
    snprintf(buf, sizeof buf, hyb_min, extra);
    expect_err("{" BASE "}", buf, code, f1, f2);
}

// The checks every rope dict starts with, the same in config.json's
// rope_scaling and rope_parameters and in hybrid_config.json's (MLA) rope_scaling.
static void test_rope_dict(void **state) {
    (void)state;
    static const struct {
        const char *dict;
        const char *f1, *f2; // %s: the dict's field name
    } cases[] = {
        {"[1]", "field %s", "expected an object"},
        {"{\"rope_theta\": 1e4, \"factor\": 2.0}", "missing field %s.rope_type", NULL},
        {"{\"rope_theta\": 1e4, \"rope_type\": \"linear\", \"type\": \"yarn\", \"factor\": 2.0}", "%s.rope_type",
         "disagree"},
        {"{\"rope_theta\": 1e4, \"rope_type\": \"linear\", \"factor\": 2.0, \"factor\": 3.0}",
         "duplicate key %s.factor", NULL},
    };
    const char *hyb_null = strstr(hyb_min, "\"rope_scaling\": null");
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        for (int where = 0; where < 3; where++) {
            const char *name = where == 1 ? "rope_parameters" : "rope_scaling";
            char cfg[1024], hyb[2048], f1[96], f2[96];
            if (where < 2) {
                snprintf(cfg, sizeof cfg, "{" BASE ", \"%s\": %s}", name, cases[i].dict);
            } else {
                snprintf(cfg, sizeof cfg, "{" BASE "}");
                char tmpl[2048];
                snprintf(tmpl, sizeof tmpl, "%.*s\"rope_scaling\": %s%s", (int)(hyb_null - hyb_min), hyb_min,
                         cases[i].dict, hyb_null + strlen("\"rope_scaling\": null"));
                snprintf(hyb, sizeof hyb, tmpl, "");
            }
            snprintf(f1, sizeof f1, cases[i].f1, name);
            snprintf(f2, sizeof f2, "%s", cases[i].f2 ? cases[i].f2 : "");
            expect_err(cfg, where == 2 ? hyb : NULL, ERR_INPUT, f1, f2);
        }
    }
}

static void test_hybrid_errors(void **state) {
    (void)state;
    arch_t a;
    char buf[2048];
    snprintf(buf, sizeof buf, hyb_min, "");
    assert_int_equal(cfg_parse_config_json("{" BASE "}", "base", &a), 0);
    assert_int_equal(cfg_parse_hybrid_config(buf, "min", &a), 0);
    assert_int_equal(a.mla.r_q, 0); // null q_lora_rank: plain q_proj
    assert_int_equal(a.kind[1], LAYER_M2);
    assert_int_equal(a.mla.rope.scaling, ROPE_SCALE_NONE);

    expect_hyb_err(", \"ssm_cfg\": {\"ngroups\": 4, \"d_state\": 16, \"repeat_kv_before_conv\": true}", ERR_INPUT,
                   "duplicate key ssm_cfg", NULL);
    // (JSON with the key replaced, not duplicated)
    char rep[2048];
    snprintf(rep, sizeof rep, hyb_min, "");
    char *p = strstr(rep, "\"repeat_kv_before_conv\": false");
    memcpy(p, "\"repeat_kv_before_conv\": true ", strlen("\"repeat_kv_before_conv\": true "));
    expect_err("{" BASE "}", rep, ERR_UNSUP, "ssm_cfg.repeat_kv_before_conv", NULL);

    expect_hyb_err(", \"hidden_size\": 128", ERR_INPUT, "duplicate key", NULL);
    snprintf(rep, sizeof rep, hyb_min, "");
    memcpy(strstr(rep, "\"hidden_size\": 64"), "\"hidden_size\": 96", 17);
    expect_err("{" BASE "}", rep, ERR_INPUT, "field hidden_size", "does not match config.json");
    expect_hyb_err(", \"d_model\": 32", ERR_INPUT, "field d_model", "does not match");
    expect_hyb_err(", \"attn_layers\": [0]", ERR_INPUT, "layer 0 is in both", NULL);
    expect_hyb_err(", \"attn_layers\": [2]", ERR_INPUT, "field attn_layers", "out of range");
    expect_hyb_err(", \"attn_layers\": [1, 1]", ERR_INPUT, "field attn_layers", "twice");
    expect_hyb_err(", \"linear_type\": \"rwkv\"", ERR_INPUT, "field linear_type", "rwkv");
    expect_hyb_err(", \"linear_type\": \"gdn\", \"gdn_cfg\": {\"num_heads\": \"2\", \"head_dim\": 16}", ERR_INPUT,
                   "field gdn_cfg.num_heads", "expected an integer");
    expect_hyb_err(", \"linear_type\": \"gdn\", \"gdn_cfg\": {\"num_heads\": 2, \"head_dim\": 256, \"expand_v\": 1.3}",
                   ERR_INPUT, "gdn_cfg.expand_v", "not an integer");
    expect_hyb_err(", \"linear_type\": \"gdn\", \"gdn_cfg\": {\"num_heads\": 2, \"head_dim\": 16, \"num_v_heads\": 3}",
                   ERR_INPUT, "GDN num_v_heads", NULL);
    expect_hyb_err(", \"use_full_kv_head\": \"yes\"", ERR_INPUT, "field use_full_kv_head", NULL);
    expect_hyb_err(", \"layer_rank_list\": {\"x\": {\"q_rank\": 1}}", ERR_INPUT, "layer_rank_list", "\"x\"");
    expect_hyb_err(", \"layer_rank_list\": {\"0\": {\"q_rank\": 16, \"kv_rank\": -1}}", ERR_INPUT, "layer_rank_list.0",
                   NULL);
    snprintf(rep, sizeof rep, hyb_min, "");
    p = strstr(rep, "\"rope_scaling\": null");
    snprintf(buf, sizeof buf, "%.*s\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0}%s", (int)(p - rep),
             rep, p + strlen("\"rope_scaling\": null"));
    expect_err("{" BASE "}", buf, ERR_UNSUP, "rope_scaling.rope_type", "llama3");
    snprintf(buf, sizeof buf, "%.*s\"rope_scaling\": {\"rope_type\": \"yarn\"}%s", (int)(p - rep), rep,
             p + strlen("\"rope_scaling\": null"));
    expect_err("{" BASE "}", buf, ERR_INPUT, "missing field rope_scaling.factor", NULL);
    snprintf(rep, sizeof rep, hyb_min, "");
    memcpy(strstr(rep, "\"kv_lora_rank\": 16"), "\"kv_lora_rank\":\"1\"", 18); // same length
    expect_err("{" BASE "}", rep, ERR_INPUT, "field kv_lora_rank", NULL);
    snprintf(rep, sizeof rep, hyb_min, "");
    memcpy(strstr(rep, "\"d_xb\": 64"), "\"d_xb\": 24", 10);
    expect_err("{" BASE "}", rep, ERR_INPUT, "d_xb 24", NULL); // arch_validate: not whole heads
    // Found by fuzzing: d_xb below one head (0 or 8 < 16) divided by zero in arch_validate.
    snprintf(rep, sizeof rep, hyb_min, "");
    memcpy(strstr(rep, "\"d_xb\": 64"), "\"d_xb\": 0 ", 10);
    expect_err("{" BASE "}", rep, ERR_INPUT, "d_xb 0", NULL);
    snprintf(rep, sizeof rep, hyb_min, "");
    memcpy(strstr(rep, "\"d_xb\": 64"), "\"d_xb\": 8 ", 10);
    expect_err("{" BASE "}", rep, ERR_INPUT, "d_xb 8", NULL);
}

// ---- sizes past their limits ------------------------------------------------------

// A config.json with the given dimensions.
static const char *dims_config(char *buf, size_t cap, long long d, long long ffn, long long H, long long Hkv,
                               long long dh, long long V, int layers) {
    snprintf(buf, cap,
             "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": %lld, \"intermediate_size\": %lld, "
             "\"num_hidden_layers\": %d, \"num_attention_heads\": %lld, \"num_key_value_heads\": %lld, "
             "\"head_dim\": %lld, \"vocab_size\": %lld, \"tie_word_embeddings\": true}",
             d, ffn, layers, H, Hkv, dh, V);
    return buf;
}

// hyb_min with one "key": value replaced (the key must be in it).
static const char *hyb_with(char *buf, size_t cap, const char *key, const char *value) {
    char base[2048], k[64];
    snprintf(base, sizeof base, hyb_min, "");
    snprintf(k, sizeof k, "\"%s\": ", key);
    char *p = strstr(base, k);
    assert_non_null(p);
    const char *end = p + strlen(k);
    if (*end == '{') // an object value: up to its closing brace (no nesting in hyb_min)
        end = strchr(end, '}') + 1;
    while (*end && *end != ',' && *end != '}')
        end++;
    snprintf(buf, cap, "%.*s%s%s%s", (int)(p - base), base, k, value, end);
    return buf;
}

// Dimensions near INT_MAX (and products of in-range ones past their limit)
// are errors naming the file, the field and the limit (base/checked.h). They
// used to overflow int arithmetic in arch_validate and the parameter table
// (UBSan: signed overflow; `hylo info` printed a negative parameter count).
static void test_size_limits(void **state) {
    (void)state;
    char cfg[1024], hyb[2048];
    const long long big = 2147483647, even = 2147483646;
    expect_err(dims_config(cfg, sizeof cfg, big, 128, 4, 4, 16, 100, 2), NULL, ERR_INPUT,
               "test.json: hidden_size = 2147483647", "out of range [1, 1048576]");
    expect_err(dims_config(cfg, sizeof cfg, 64, big, 4, 4, 16, 100, 2), NULL, ERR_INPUT, "intermediate_size",
               "[1, 1048576]");
    expect_err(dims_config(cfg, sizeof cfg, 64, 128, big, big, 16, 100, 2), NULL, ERR_INPUT, "num_attention_heads",
               "[1, 1048576]");
    expect_err(dims_config(cfg, sizeof cfg, 64, 128, 4, 4, even, 100, 2), NULL, ERR_INPUT, "head_dim = 2147483646",
               "[2, 1048576]");
    expect_err(dims_config(cfg, sizeof cfg, 64, 128, 4, 4, 16, big, 2), NULL, ERR_INPUT, "vocab_size", "[1, 16777216]");
    // each in range, their product not
    expect_err(dims_config(cfg, sizeof cfg, 64, 128, 65536, 1, 65536, 100, 2), NULL, ERR_INPUT,
               "num_attention_heads x head_dim = 65536 x 65536", "exceeds the limit of 16777216");
    // hybrid_config.json: MLA ranks and head dims, Mamba-2 groups / state / expand, GDN heads
    static const struct {
        const char *key, *value, *f1, *f2;
    } hy[] = {
        {"kv_lora_rank", "2147483647", "layer 0: kv_lora_rank = 2147483647", "[1, 1048576]"},
        {"q_lora_rank", "2147483647", "layer 0: q_lora_rank = 2147483647", "[0, 1048576]"},
        {"qk_nope_head_dim", "2147483647", "qk_nope_head_dim = 2147483647", "[0, 1048576]"},
        {"v_head_dim", "2147483647", "v_head_dim = 2147483647", "[1, 1048576]"},
        {"ssm_cfg", "{\"ngroups\": 2147483647, \"d_state\": 16}", "ssm_cfg.ngroups) = 2147483647", "[1, 1048576]"},
        {"ssm_cfg", "{\"ngroups\": 4, \"d_state\": 2147483647}", "d_state", "[1, 1048576]"},
        {"d_inner", "2147483647", "d_inner = 2147483647", "[1, 1048576]"},
        {"d_xb", "2147483647", "d_xb = 2147483647", "[0, 1048576]"},
    };
    for (size_t i = 0; i < sizeof hy / sizeof *hy; i++)
        expect_err("{" BASE "}", hyb_with(hyb, sizeof hyb, hy[i].key, hy[i].value), ERR_INPUT, hy[i].f1, hy[i].f2);
    // ssm_cfg.expand without d_inner: d_model x expand formed in 64 bits
    char base[2048], *p;
    snprintf(base, sizeof base, hyb_min, "");
    p = strstr(base, "\"d_inner\": 64, ");
    memmove(p, p + strlen("\"d_inner\": 64, "), strlen(p + strlen("\"d_inner\": 64, ")) + 1);
    p = strstr(base, "\"d_state\": 16");
    snprintf(hyb, sizeof hyb, "%.*s\"d_state\": 16, \"expand\": 2147483647%s", (int)(p - base), base,
             p + strlen("\"d_state\": 16"));
    expect_err("{" BASE "}", hyb, ERR_INPUT, "d_inner (hidden_size x ssm_cfg.expand) = 64 x 2147483647",
               "exceeds the limit of 1048576");
    expect_hyb_err(", \"linear_type\": \"gdn\", \"gdn_cfg\": {\"num_heads\": 1073741824, \"head_dim\": 16}", ERR_INPUT,
                   "GDN num_heads = 1073741824", "[1, 1048576]");
    expect_hyb_err(", \"linear_type\": \"gdn\", \"gdn_cfg\": {\"num_heads\": 1024, \"head_dim\": 65536}", ERR_INPUT,
                   "GDN num_heads x head_dim = 1024 x 65536", "exceeds the limit of 16777216");
    // (head_dim x expand_v of a large head dim is exact: it used to come out 20 too large)
    expect_hyb_err(", \"linear_type\": \"gdn\", \"gdn_cfg\": {\"num_heads\": 1, \"head_dim\": 1048576}", ERR_INPUT,
                   "GDN value head dim (head_dim x expand_v) = 2097152", "[1, 1048576]");

    // At the limits: a 1-layer model with every size at or just under its limit
    // validates, and its parameter table (64-bit sums, formed without
    // overflow: UBSan in MODE=asan) has the count computed here.
    arch_t a;
    const long long d = 1 << 16, ffn = 1 << 20, H = 1 << 8, dh = 1 << 16, V = 1 << 24;
    if (cfg_parse_config_json(dims_config(cfg, sizeof cfg, d, ffn, H, 1, dh, V, 1), "at_limit", &a) < 0)
        fail_msg("%s", err_msg());
    ptable_t pt;
    if (ptable_build(&pt, &a) < 0) fail_msg("%s", err_msg());
    // embedding, q, k, v, o, gate, up, down, 3 norms of d
    int64_t want = V * d + H * dh * d + 2 * dh * d + d * H * dh + 3 * ffn * d + 3 * d;
    assert_true(ptable_count(&pt) == want);
    assert_true(pt.total >= want);
    ptable_free(&pt);
    // Two such layers pass arch_validate but exceed the parameter limit: an error, no overflow.
    assert_int_equal(cfg_parse_config_json(dims_config(cfg, sizeof cfg, d, ffn, H, 1, dh, V, 2), "two", &a), 0);
    err_clear();
    assert_int_equal(ptable_build(&pt, &a), ERR_INPUT);
    assert_non_null(strstr(err_msg(), "exceeds the limit of 4398046511104 parameters"));
    // A tensor past the element limit (vocabulary x width = 2^24 x 2^20).
    assert_int_equal(cfg_parse_config_json(dims_config(cfg, sizeof cfg, 1 << 20, 64, 4, 4, 16, V, 1), "wide", &a), 0);
    assert_int_equal(ptable_build(&pt, &a), ERR_INPUT);
    assert_non_null(strstr(err_msg(), "model.embed_tokens.weight: shape exceeds the limit of 1099511627776"));
}

// Non-finite and non-positive scalars are refused by arch_validate, whatever
// the source (the GGUF path shares it: tests/io/test_gguf.c).
static void test_nonfinite_scalars(void **state) {
    (void)state;
    arch_t a;
    assert_int_equal(cfg_parse_config_json("{" BASE "}", "base", &a), 0);
    struct {
        float *f;
        float v;
        const char *field;
    } c[] = {{&a.eps, INFINITY, "rms_norm_eps = inf is not finite"},
             {&a.eps, 0, "rms_norm_eps = 0 must be in (0, 1]"},
             {&a.rope.theta, INFINITY, "rope_theta = inf is not finite"},
             {&a.rope.theta, NAN, "rope_theta = nan is not finite"},
             {&a.rope.theta, -4, "rope_theta = -4 must be in (0, 1e+12]"}};
    for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
        arch_t b = a;
        *(float *)((char *)&b + ((char *)c[i].f - (char *)&a)) = c[i].v;
        err_clear();
        assert_int_equal(arch_validate(&b, "src"), ERR_INPUT);
        if (!strstr(err_msg(), c[i].field)) fail_msg("\"%s\" lacks \"%s\"", err_msg(), c[i].field);
    }
    const float factors[] = {0, -4, NAN, INFINITY, 1e30f};
    for (int s = ROPE_SCALE_LLAMA3; s <= ROPE_SCALE_LINEAR; s++)
        for (size_t i = 0; i < sizeof factors / sizeof *factors; i++) {
            arch_t b = a;
            b.rope.scaling = (rope_scale_t)s, b.rope.factor = factors[i];
            b.rope.low_freq_factor = 1, b.rope.high_freq_factor = 4, b.rope.orig_max_pos = 64;
            err_clear();
            assert_int_equal(arch_validate(&b, "src"), ERR_INPUT);
            assert_non_null(strstr(err_msg(), "src: rope_scaling.factor"));
        }
}

// ---- generation_config.json -----------------------------------------------------------

static void test_generation_config(void **state) {
    (void)state;
    arch_t a;
    load(&a, FIX "smollm2_135m_instruct_config.json", NULL);
    assert_int_equal(cfg_parse_generation_config("{\"bos_token_id\": 5, \"eos_token_id\": [2, 7]}", "gen", &a), 0);
    assert_int_equal(a.bos_id, 1); // config.json's wins
    assert_int_equal(a.n_eos, 2);
    assert_int_equal(a.eos_ids[0], 2);
    assert_int_equal(a.eos_ids[1], 7);
    err_clear();
    assert_int_equal(cfg_parse_generation_config("{\"eos_token_id\": \"2\"}", "gen.json", &a), ERR_INPUT);
    assert_non_null(strstr(err_msg(), "gen.json: field eos_token_id"));
    err_clear();
    assert_int_equal(cfg_parse_generation_config("{\"eos_token_id\": -2}", "gen.json", &a), ERR_INPUT);
    assert_non_null(strstr(err_msg(), "gen.json: field eos_token_id"));
    assert_int_equal(a.n_eos, 2); // unchanged
}

// ---- writers and round trips ------------------------------------------------------------

// Field-by-field comparison for a readable failure, then the whole struct.
static void assert_same_arch(const arch_t *x, const arch_t *y, const char *what) {
#define SAME(f)                                                                                                        \
    if (x->f != y->f) fail_msg("%s: " #f " %g != %g", what, (double)x->f, (double)y->f)
    SAME(d);
    SAME(n_layers);
    SAME(H);
    SAME(Hkv);
    SAME(dh);
    SAME(ffn);
    SAME(V);
    SAME(eps);
    SAME(tie_embeddings);
    SAME(qk_norm);
    SAME(max_pos);
    SAME(rope.theta);
    SAME(rope.scaling);
    SAME(rope.factor);
    SAME(rope.orig_max_pos);
    SAME(rope.attn_factor);
    SAME(bos_id);
    SAME(eos_id);
    SAME(pad_id);
    SAME(n_eos);
    SAME(mla.r_q);
    SAME(mla.r_kv);
    SAME(mla.d_rope);
    SAME(mla.d_nope);
    SAME(mla.d_v);
    SAME(mla.n_kv);
    SAME(mla.rope.theta);
    SAME(mla.rope.scaling);
    SAME(mla.rope.factor);
    SAME(mla.rope.orig_max_pos);
    SAME(mla.rope.mscale);
    SAME(gdn.n_heads);
    SAME(gdn.head_v);
    SAME(m2.n_heads);
    SAME(m2.d_xb);
    SAME(is_hybrid);
#undef SAME
    assert_string_equal(x->model_type, y->model_type);
    for (int l = 0; l < ARCH_MAX_LAYERS; l++)
        if (x->kind[l] != y->kind[l] || x->mla_rank_q[l] != y->mla_rank_q[l] || x->mla_rank_kv[l] != y->mla_rank_kv[l])
            fail_msg("%s: layer %d differs", what, l);
    if (memcmp(x, y, sizeof *x)) fail_msg("%s: the archs differ (in a field not listed above)", what);
}

// Loads config (+ hybrid), writes all three files into a fresh folder, loads the
// folder back and compares.
static void roundtrip(const char *config, const char *hybrid, const char *name) {
    arch_t a, b;
    load(&a, config, hybrid);
    char dir[512], p[600];
    snprintf(dir, sizeof dir, "%s/%s", tu_tmpdir(), name);
    assert_int_equal(fs_mkdir_p(dir), 0);
    snprintf(p, sizeof p, "%s/config.json", dir);
    if (cfg_write_config_json(&a, p) < 0) fail_msg("%s", err_msg());
    if (hybrid) {
        snprintf(p, sizeof p, "%s/hybrid_config.json", dir);
        if (cfg_write_hybrid_config(&a, p) < 0) fail_msg("%s", err_msg());
    }
    snprintf(p, sizeof p, "%s/generation_config.json", dir);
    if (cfg_write_generation_config(&a, p) < 0) fail_msg("%s", err_msg());
    if (cfg_load_dir(dir, &b) < 0) fail_msg("%s: %s", name, err_msg());
    assert_same_arch(&a, &b, name);
}

static void test_roundtrip(void **state) {
    (void)state;
    roundtrip(FIX "smollm2_135m_instruct_config.json", NULL, "smollm2");
    roundtrip(FIX "llama31_8b_instruct_config.json", NULL, "llama31");
    roundtrip(FIX "qwen3_8b_config.json", NULL, "qwen3");
    roundtrip(FIX "llama32_1b_instruct_config.json", FIX "zebra_1b_8mla8m2_hybrid_config.json", "zebra");
    roundtrip(FIX "llama32_1b_instruct_config.json", FIX "hylo_1b_4mla12gdn_hybrid_config.json", "hylo");
    roundtrip(FIX "llama32_1b_instruct_config.json", FIX "xecomla_llama_hybrid_config.json", "xecomla");

    // Built in code rather than read: attention layers kept, GDN with GVA and
    // odd expand_v, YaRN with non-default beta and mscale keys, yarn teacher.
    arch_t a, b;
    load(&a, FIX "qwen3_8b_config.json", NULL);
    a.rope.scaling = ROPE_SCALE_YARN;
    a.rope.factor = 4.0f;
    a.rope.orig_max_pos = 32768;
    a.rope.attn_factor = 1.25f;
    a.is_hybrid = 1;
    for (int l = 0; l < a.n_layers; l++)
        a.kind[l] = l % 3 == 0 ? LAYER_MLA : l == 35 ? LAYER_ATTN : LAYER_GDN;
    a.mla = (mla_dims_t){.r_q = 0, .r_kv = 256, .d_nope = 64, .d_rope = 64, .d_v = 128, .n_kv = 8, .latent_norm = 1};
    a.mla.rope = (rope_cfg_t){.theta = 1000000.0f,
                              .scaling = ROPE_SCALE_YARN,
                              .factor = 32.0f,
                              .orig_max_pos = 2048,
                              .beta_fast = 16.0f,
                              .beta_slow = 2.0f,
                              .mscale = 0.707f,
                              .mscale_all_dim = 0.707f};
    a.mla_rank_kv[3] = 192;
    a.gdn = (gdn_dims_t){.n_heads = 4,
                         .n_v_heads = 8,
                         .head_k = 128,
                         .head_v = 192,
                         .conv = 3,
                         .use_gate = 0,
                         .allow_neg_eigval = 1,
                         .norm_eps = 1e-5f};
    assert_int_equal(arch_validate(&a, "built"), 0);
    char dir[512], p[600];
    snprintf(dir, sizeof dir, "%s/built", tu_tmpdir());
    assert_int_equal(fs_mkdir_p(dir), 0);
    snprintf(p, sizeof p, "%s/config.json", dir);
    assert_int_equal(cfg_write_config_json(&a, p), 0);
    snprintf(p, sizeof p, "%s/hybrid_config.json", dir);
    assert_int_equal(cfg_write_hybrid_config(&a, p), 0);
    if (cfg_load_dir(dir, &b) < 0) fail_msg("%s", err_msg());
    assert_same_arch(&a, &b, "built");
}

// The written text: what transformers and Zebra-Llama expect to read.
static void test_written_text(void **state) {
    (void)state;
    arch_t a;
    load(&a, FIX "smollm2_135m_instruct_config.json", NULL);
    char p[600];
    snprintf(p, sizeof p, "%s/smol_config.json", tu_tmpdir());
    assert_int_equal(cfg_write_config_json(&a, p), 0);
    char *t = slurp(p);
    static const char *const frags[] = {
        "{\n  \"architectures\": [\n    \"LlamaForCausalLM\"\n  ],\n  \"attention_bias\": false,\n",
        "\"model_type\": \"llama\"",
        "\"torch_dtype\": \"bfloat16\"",
        "\"rms_norm_eps\": 1e-05,",
        "\"rope_theta\": 100000.0,",
        "\"rope_scaling\": null,",
        "\"tie_word_embeddings\": true,",
        "\"head_dim\": 64,",
        "\"num_key_value_heads\": 3,",
        "\"bos_token_id\": 1,",
        "\"eos_token_id\": 2,",
        "\"attention_dropout\": 0.0,",
        "\"vocab_size\": 49152\n}\n"};
    for (size_t i = 0; i < sizeof frags / sizeof *frags; i++)
        if (!strstr(t, frags[i])) fail_msg("config.json lacks \"%s\":\n%s", frags[i], t);
    // Keys sorted, as transformers writes them.
    cJSON *j = cJSON_Parse(t);
    assert_non_null(j);
    for (cJSON *e = j->child; e && e->next; e = e->next)
        if (strcmp(e->string, e->next->string) >= 0) fail_msg("keys out of order: %s, %s", e->string, e->next->string);
    cJSON_Delete(j);
    free(t);

    // The llama3 rope_scaling dict comes back in full; eos as a list.
    load(&a, FIX "llama31_8b_instruct_config.json", NULL);
    assert_int_equal(cfg_write_config_json(&a, p), 0);
    t = slurp(p);
    j = cJSON_Parse(t);
    cJSON *rs = cJSON_GetObjectItem(j, "rope_scaling");
    assert_int_equal(cJSON_GetArraySize(rs), 5);
    assert_string_equal(cJSON_GetObjectItem(rs, "rope_type")->valuestring, "llama3");
    assert_true(cJSON_GetObjectItem(rs, "factor")->valuedouble == 8.0);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "eos_token_id")), 3);
    assert_non_null(strstr(t, "\"rope_theta\": 500000.0"));
    cJSON_Delete(j);
    free(t);

    // hybrid_config.json: Zebra's keys in the dataclass order (indent 4), then
    // ours; the rope dict as factor, original_max_position_embeddings,
    // rope_type; the Mamba-2 dims of a GDN plan as Zebra derives them from the
    // teacher. The fixture is laid out that way, so the file comes back whole.
    load(&a, FIX "llama32_1b_instruct_config.json", FIX "hylo_1b_4mla12gdn_hybrid_config.json");
    snprintf(p, sizeof p, "%s/hyb.json", tu_tmpdir());
    assert_int_equal(cfg_write_hybrid_config(&a, p), 0);
    t = slurp(p);
    char *want = slurp(FIX "hylo_1b_4mla12gdn_hybrid_config.json");
    assert_string_equal(t, want);
    free(want);
    free(t);

    // A Zebra plan writes no GDN keys; generation_config has just the ids.
    load(&a, FIX "llama32_1b_instruct_config.json", FIX "zebra_1b_8mla8m2_hybrid_config.json");
    assert_int_equal(cfg_write_hybrid_config(&a, p), 0);
    t = slurp(p);
    assert_null(strstr(t, "gdn_cfg"));
    assert_non_null(strstr(t, "\"linear_type\": \"mamba\"\n}"));
    free(t);
    assert_int_equal(cfg_write_generation_config(&a, p), 0);
    t = slurp(p);
    assert_string_equal(t, "{\n  \"bos_token_id\": 128000,\n  \"eos_token_id\": [\n    128001,\n    128008,\n"
                           "    128009\n  ]\n}\n");
    free(t);
}

static void test_write_fails_cleanly(void **state) {
    (void)state;
    arch_t a;
    load(&a, FIX "smollm2_135m_instruct_config.json", NULL);
    char p[600];
    snprintf(p, sizeof p, "%s/missing/config.json", tu_tmpdir());
    err_clear();
    assert_true(cfg_write_config_json(&a, p) < 0);
    assert_non_null(strstr(err_msg(), "missing/config.json"));
    assert_false(fs_exists(p));
    // A plan mixing GDN and Mamba-2 has no hybrid_config.json form.
    a.kind[0] = LAYER_GDN;
    a.kind[1] = LAYER_M2;
    snprintf(p, sizeof p, "%s/mixed.json", tu_tmpdir());
    assert_int_equal(cfg_write_hybrid_config(&a, p), ERR_UNSUP);
    assert_false(fs_exists(p));
    // Nothing but the files written by the tests is in the folder (no temporaries).
    DIR *d = opendir(tu_tmpdir());
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".tmp.") || strstr(e->d_name, ".hylo-tmp.")) fail_msg("leftover temporary %s", e->d_name);
    closedir(d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_smollm2),
        cmocka_unit_test(test_llama31),
        cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_defaults_and_variants),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_rope_dict),
        cmocka_unit_test(test_zebra),
        cmocka_unit_test(test_hylo_gdn),
        cmocka_unit_test(test_xecomla),
        cmocka_unit_test(test_hybrid_errors),
        cmocka_unit_test(test_size_limits),
        cmocka_unit_test(test_nonfinite_scalars),
        cmocka_unit_test(test_generation_config),
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_written_text),
        cmocka_unit_test(test_write_fails_cleanly),
    };
    return cmocka_run_group_tests(tests, tu_tmpdir_setup, tu_tmpdir_teardown);
}
