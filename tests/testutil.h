// Shared helpers for the cmocka tests: random inputs, error norms, and the one
// finite-difference gradient check every backward test uses.
#pragma once
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
// cmocka needs the three includes above first
#include <cmocka.h>

#include "backend/backend.h"
#include "model/layer.h"
#include "model/arch.h"
#include "model/params.h"

// Fills x with N(0, std^2) from a seeded generator.
void tu_randn(float *x, int64_t n, uint64_t seed, float std);
void tu_randu(float *x, int64_t n, uint64_t seed, float lo, float hi);
// ||a - b|| / max(||b||, tiny)
double tu_rel_err(const float *a, const float *b, int64_t n);
double tu_max_abs_diff(const float *a, const float *b, int64_t n);
// Accumulating outputs (dW += ...): the relative error of the increment,
// ||(a - a0) - (b - a0)|| / ||b - a0||, where a0 is what both started from (an
// op that overwrote instead of accumulating fails, and a0 does not dilute the
// error); +inf when a holds a NaN.
double tu_inc_rel_err(const float *a, const float *b, const float *a0, int64_t n);
// sum_i a_i b_i in double
double tu_dot(const float *a, const float *b, int64_t n);

// Loss callback for gradient checks: recomputes the scalar loss (in double)
// from the current contents of the parameters/inputs under test, and stores in
// *l1 the sum of the absolute values of the terms summed into it (the loss is
// usually sum(out * R); then l1 = sum |out * R|, see tu_dot_l1). l1 sets the
// resolution of the finite difference in fp32.
typedef double (*tu_loss_fn)(void *ctx, double *l1);
// sum_i a_i b_i, with sum_i |a_i b_i| into *l1
double tu_dot_l1(const float *a, const float *b, int64_t n, double *l1);

// Finite-difference check of an analytic gradient g of f with respect to the
// n floats at x (x is perturbed in place and restored):
//  1. directional: for 3 random unit directions v, central difference
//     (f(x + eps v) - f(x - eps v)) / 2 eps against <g, v>;
//  2. n_elems randomly chosen single elements (all when n <= n_elems).
// Each comparison passes when |fd - an| <= tol * max(|fd|, |an|) + noise, where
// noise = 4 * 2^-24 * l1 / eps is the resolution of an fp32 central difference
// (every output carries a relative rounding error of up to 2^-24, summed with
// the weights of the loss). Prints every failure; returns the number of
// failures (0 = pass).
int tu_gradcheck(const char *what, tu_loss_fn f, void *ctx, float *x, const float *g, int64_t n, float eps, float tol,
                 int n_elems);

// A flat fp32 parameter buffer for table t: weights N(0, std^2), 1-D `no_decay`
// parameters (norm weights, A_log, dt_bias, D) 1 + N(0, 0.1^2).
float *tu_params(const ptable_t *t, uint64_t seed, float std);
// A CPU layer context for layer `layer` of arch a: a fresh 512 MiB host arena
// (reset by tu_ctx_reset) and RoPE tables for that layer kind (attention: a->rope
// over dh; MLA: a->mla.rope over d_rope) covering 4096 positions.
void tu_ctx(layer_ctx_t *c, const arch_t *a, int layer);
void tu_ctx_reset(layer_ctx_t *c);
void tu_ctx_free(layer_ctx_t *c);

// ---- CUDA-vs-CPU tests (tests/cuda/, run on the GPU machine) ----
// The CUDA backend, created once per binary; the test is skipped (not passed)
// when hylo was built without CUDA or no GPU is present, and fails instead
// under HYLO_REQUIRE_GPU=1 (make test-cuda, scripts/gpu/tests.sh), so a GPU
// machine whose backend cannot start never reports green.
be_t *tu_cuda(void);
// Rounds host values to bf16 in place, so the CPU reference and the GPU see
// the same inputs and differences come only from the computation.
void tu_round_bf16(float *x, int64_t n);
// Device copies: act (bf16 on CUDA) from host fp32, float from host fp32; and back.
void *tu_dev_act(be_t *be, const float *h, int64_t n);
float *tu_dev_f32(be_t *be, const float *h, int64_t n);
float *tu_host_act(be_t *be, const void *d, int64_t n);  // malloc'ed host copy
float *tu_host_f32(be_t *be, const float *d, int64_t n); // malloc'ed host copy

// The CPU backend, created once per test binary.
be_t *tu_cpu(void);
// Path of the default model (HYLO_MODEL), or skip the test when it is unset.
const char *tu_model_path(void);

// ---- a temporary folder per test binary, /tmp/hylo_<program>_XXXXXX ----
// Group setup / teardown for cmocka_run_group_tests: tu_tmpdir_setup creates the
// folder, tu_tmpdir_teardown removes it with everything in it (nothing when it
// was never created). tu_tmpdir() is its path, creating it on first use.
int tu_tmpdir_setup(void **state);
int tu_tmpdir_teardown(void **state);
const char *tu_tmpdir(void);
// tu_tmpdir()/name in one of 4 rotating static buffers (up to 4 in use at once).
const char *tu_tmp_path(const char *name);
// Seed corpus for the fuzz targets: with HYLO_CORPUS_OUT set, a file a test
// built is also copied there when it is at most 64 KiB (docs/FUZZING.md).
void tu_corpus_save(const char *path);

// Runs `$HYLO_BIN ARGS` (the test is skipped when HYLO_BIN is unset) and
// returns its exit status. The output is captured in tu_tmpdir():
//  - err != NULL: stdout is discarded and stderr returned in *err (malloc'ed);
//    the run must end by exit, not by a signal. Prints
//    "  hylo ARGS\n    -> exit N: STDERR".
//  - err == NULL: stdout and stderr go together to tu_tmpdir()/out.txt, which
//    is printed after "  hylo ARGS -> N".
int tu_run_hylo(const char *args, char **err);

// ---- rows of [B, T, d] sequences (decode / prefill-in-pieces tests) ----
// dst [B, n, d] = rows [t0, t0 + n) of each of the B sequences of x [B, T, d].
void tu_rows_gather(float *dst, const float *x, int B, int T, int t0, int n, int d);
// The reverse: rows [t0, t0 + n) of each sequence of x [B, T, d] = src [B, n, d].
void tu_rows_scatter(float *x, const float *src, int B, int T, int t0, int n, int d);

// ---- the CUDA-vs-CPU test harness (tests/cuda/) ----
// HYLO_TEST_CPU_AS_GPU=1 puts a second CPU backend in the GPU's place (the
// "fake GPU"): a self-check of a test file's buffers, poisoning, bindings and
// comparisons on a machine without a GPU (try it under MODE=asan too); every
// difference is then that of two CPU runs. Cases that need the real device
// (a second CUDA backend, a CUDA-only error path) skip themselves.
int tu_fake_gpu(void);
// Whether a comma-separated list of numbers (e.g. "0,3,10", from an
// environment variable that picks a test's cases for a short run) holds k.
int tu_list_has(const char *list, long k);
// The backend under test: the fake GPU under HYLO_TEST_CPU_AS_GPU=1, else
// tu_cuda() (skips without a GPU, or fails under HYLO_REQUIRE_GPU=1).
be_t *tu_gpu(void);

// Host buffers, malloc'ed, room for at least one float.
float *tu_hbuf(int64_t n);
float *tu_hdup(const float *h, int64_t n);
// n NaNs: what output buffers hold before the op under test, so that an
// element it does not write fails the comparison.
float *tu_nans(int64_t n);
// N(0, std^2) from `seed`, rounded to bf16 (tu_round_bf16).
float *tu_rnd(int64_t n, uint64_t seed, float std);

// Device buffers: element `off` of an act buffer, an int32 copy of h, a free
// that takes NULL.
void *tu_gat(be_t *be, void *d, int64_t off);
int32_t *tu_dev_i32(be_t *be, const int32_t *h, int64_t n);
void tu_dev_free(be_t *be, void *d);
// Uploads n host values into an existing device buffer (act, or float): how a
// test re-poisons an output with NaN before calling an op a second time.
void tu_upload_act(be_t *be, void *d, const float *h, int64_t n);
void tu_upload_f32(be_t *be, float *d, const float *h, int64_t n);
// Waits for the backend; on an error (asynchronous or from an argument check)
// prints "FAIL OP SHAPE: cuda error: ..." and returns 0; 1 when all is well.
int tu_sync(be_t *be, const char *op, const char *shape);

// got against ref over n values. An element is "off" when |got - ref| >
// rtol |ref| + rms_tol rms(ref) + abs_tol, or when either is NaN.
typedef struct {
    double rel;     // ||got - ref|| / ||ref|| as tu_rel_err; +inf when got holds a NaN or inf
    double max_abs; // max |got - ref|; +inf when got holds a NaN or inf
    double rms;     // rms(ref)
    double se, ss;  // sum (got - ref)^2 and sum ref^2 (for another normalisation)
    int64_t n_off;  // elements off
    int64_t first;  // the first one off, -1 when none
    int64_t worst;  // the largest |got - ref| (a NaN or inf counts as the largest)
    int nonfinite;  // got holds a NaN or inf: an element was not written or blew up
} tu_cmp_t;
tu_cmp_t tu_compare(const float *got, const float *ref, int64_t n, double rtol, double rms_tol, double abs_tol);
// Prints "PREFIX [a=.. b=.. c=.. d=..]: gpu G cpu R (rms S)" for element i of
// a tensor of dims[0..3] named by the 4 letters of axes (unused leading dims 1).
void tu_print_elem(const char *prefix, const float *got, const float *ref, int64_t i, const int64_t dims[4],
                   const char *axes, double rms);

// A tiny hybrid of the given layer plan (n <= 6 layers, any mixer kinds):
// d 32, 4 query / 2 KV heads of 8, vocabulary 61, MLA r_q 16 / r_kv 12 /
// nope 4 / rope 4 / v 8, Mamba-2 chunks of 8 (so sequences cross chunks),
// GDN with its output gate; YaRN (factor 4 over 16) on the MLA rope when
// yarn; tied embeddings when tied.
arch_t tu_tiny_arch(const layer_kind_t *plan, int n, int yarn, int tied);
