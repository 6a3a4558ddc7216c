// Gated DeltaNet (flash-linear-attention semantics), the fp32 CPU reference:
// gates, the token-by-token recurrence (decode and oracle), and the chunked
// WY / UT-transform algorithm forward and backward (spec linear_blocks.md
// sections 1.5, 1.8, 2.1-2.3).
//
// Layouts: q, k [B,T,H,K]; v, o [B,T,HV,Dv]; g, beta [B,T,HV]; state
// [B,HV,Dv,K] "V-first": element (v, x) is S[x, v] of the math (S is K x Dv).
// Internally every state-like matrix (S, dS, the per-chunk history) is kept in
// that same V-first layout, written St[v*K + x], so no transposes are needed
// and the innermost loops run over the contiguous K index.
//
// The chunked code is organised the way the CUDA kernels run it: per (batch,
// head) a loop over chunks of BT = 64 tokens; each chunk gathers its rows into
// small contiguous matrices (the tiles a GPU block would load) and the steps
// are named after the spec's kernels (F1..F4, B1..B7). Only the loop over
// chunks is sequential.
#include "backend/cpu/cpu_gdn.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "base/err.h"

enum { BT = 64 }; // chunk length

// ---------------------------------------------------------------------------
// Gates (spec 1.4 step 5, 1.8)
// ---------------------------------------------------------------------------

// g = -exp(A_log) softplus(a + dt_bias) (natural-log decay, <= 0);
// beta = s sigmoid(b), s = 2 with allow_neg (eigenvalues of I - beta k k^T in (-1, 1]).
static void cpu_gdn_gate_fwd(be_t *be, float *g, float *beta, const void *a_, int64_t lda, const void *b_, int64_t ldb,
                             const void *A_log_, const void *dt_bias_, int64_t N, int HV, int allow_neg) {
    const float *a = a_, *b = b_, *A_log = A_log_, *dt_bias = dt_bias_;
    float s = allow_neg ? 2.0f : 1.0f;
#pragma omp parallel for schedule(static) if (N * HV > 65536)
    for (int64_t n = 0; n < N; n++)
        for (int h = 0; h < HV; h++) {
            g[n * HV + h] = -expf(A_log[h]) * cpu_softplus(a[n * lda + h] + dt_bias[h]);
            beta[n * HV + h] = s * cpu_sigmoid(b[n * ldb + h]);
        }
}

// c = a + dt_bias: dc = dg (-e^{A_log}) softplus'(c) (1 above the identity
// threshold 20, as the forward); da = dc; d dt_bias += sum_n dc;
// dA_log += sum_n dg g (d g / d A_log = g); db = dbeta s sigmoid'(b).
// One head per iteration so the reductions over tokens need no atomics; they
// are summed in double (N can be B*T = 10^5 tokens).
static void cpu_gdn_gate_bwd(be_t *be, void *da_, int64_t ldda, void *db_, int64_t lddb, float *dA_log, float *ddt_bias,
                             const float *dg, const float *dbeta, const void *a_, int64_t lda, const void *b_,
                             int64_t ldb, const void *A_log_, const void *dt_bias_, int64_t N, int HV, int allow_neg) {
    float *da = da_, *db = db_;
    const float *a = a_, *b = b_, *A_log = A_log_, *dt_bias = dt_bias_;
    float s = allow_neg ? 2.0f : 1.0f;
#pragma omp parallel for schedule(static) if (N * HV > 65536)
    for (int h = 0; h < HV; h++) {
        float A = expf(A_log[h]);
        double sum_dc = 0, sum_dA = 0;
        for (int64_t n = 0; n < N; n++) {
            float c = a[n * lda + h] + dt_bias[h];
            float gg = -A * cpu_softplus(c);
            float dgi = dg[n * HV + h];
            float dc = dgi * -A * cpu_dsoftplus(c);
            da[n * ldda + h] = dc;
            sum_dc += dc;
            sum_dA += (double)dgi * gg;
            float sb = cpu_sigmoid(b[n * ldb + h]);
            db[n * lddb + h] = dbeta[n * HV + h] * s * sb * (1.0f - sb);
        }
        ddt_bias[h] += (float)sum_dc;
        dA_log[h] += (float)sum_dA;
    }
}

// ---------------------------------------------------------------------------
// Per-thread workspaces
// ---------------------------------------------------------------------------

// One block of per-thread tiles, taken by the calling thread before the
// parallel region (cpu_tmp_take: scratch arena, else heap); thread i uses
// floats [i * per, (i + 1) * per).
static float *ws_take(be_t *be, cpu_tmp_t *t, size_t per, int *nthreads, const char *what) {
    *nthreads = omp_get_max_threads();
    return cpu_tmp_take(be, t, (int64_t)*nthreads * (int64_t)per, what);
}

// Small problems (the layer tests, one decode token) run on the calling
// thread: waking a team costs more than the work, and much more when the
// cores are shared.
static int worth_threads(int64_t rows, int HV, int K, int Dv) {
    return rows * HV * K * Dv >= (1 << 20) && omp_get_max_threads() > 1;
}

// ---------------------------------------------------------------------------
// Token-by-token recurrence (spec 1.5, 2.6)
// ---------------------------------------------------------------------------

// Per token: S_bar = e^{g} S; u = beta (v - S_bar^T k); S = S_bar + k u^T;
// o = scale S^T q (reads the updated state). In V-first layout row v of St is
// column v of S, so S^T k is one dot product per row.
static void recurrent_head(float *St, float *o, const float *q, const float *k, const float *v, const float *g,
                           const float *beta, float scale, int b, int h, int T, int H, int HV, int K, int Dv) {
    int hq = h / (HV / H);
    for (int t = 0; t < T; t++) {
        int64_t row = (int64_t)b * T + t;
        const float *qt = q + (row * H + hq) * K, *kt = k + (row * H + hq) * K, *vt = v + (row * HV + h) * Dv;
        float alpha = expf(g[row * HV + h]), bt = beta[row * HV + h];
        float *ot = o + (row * HV + h) * Dv;
        for (int i = 0; i < Dv; i++) {
            float *s = St + (int64_t)i * K;
            float sk = 0;
            for (int x = 0; x < K; x++) {
                s[x] *= alpha;
                sk += s[x] * kt[x];
            }
            float u = bt * (vt[i] - sk);
            float sq = 0;
            for (int x = 0; x < K; x++) {
                s[x] += kt[x] * u;
                sq += s[x] * qt[x];
            }
            ot[i] = scale * sq;
        }
    }
}

static void cpu_gdn_recurrent_fwd(be_t *be, void *o_, float *state, const void *q_, const void *k_, const void *v_,
                                  const float *g, const float *beta, float scale, int B, int T, int H, int HV, int K,
                                  int Dv) {
    float *o = o_;
    const float *q = q_, *k = k_, *v = v_;
    int64_t SS = (int64_t)Dv * K;
    cpu_tmp_t tmp = {0};
    float *S = state;
    if (!S) { // zero initial states the caller does not keep
        S = cpu_tmp_take(be, &tmp, (int64_t)B * HV * SS, "gdn recurrent forward");
        if (!S) {
            cpu_fill_nan(o, (int64_t)B * T * HV * Dv);
            return;
        }
        memset(S, 0, (size_t)B * HV * SS * sizeof(float));
    }
#pragma omp parallel for collapse(2) schedule(dynamic, 1) if (worth_threads((int64_t)B * T, HV, K, Dv))
    for (int b = 0; b < B; b++)
        for (int h = 0; h < HV; h++)
            recurrent_head(S + ((int64_t)b * HV + h) * SS, o, q, k, v, g, beta, scale, b, h, T, H, HV, K, Dv);
    if (!state) cpu_tmp_give(be, &tmp);
}

// One token per row, each row's state at its own address: recurrent_head of
// a lone sequence (B = 1, T = 1) on row r's slices, so every row's numbers
// are those of cpu_gdn_recurrent_fwd on that row alone.
static void cpu_gdn_recurrent_step(be_t *be, void *o_, void *const *rows, const void *q_, const void *k_,
                                   const void *v_, const float *g, const float *beta, float scale, int N, int H, int HV,
                                   int K, int Dv) {
    float *o = o_;
    const float *q = q_, *k = k_, *v = v_;
    int64_t SS = (int64_t)Dv * K;
#pragma omp parallel for collapse(2) schedule(dynamic, 1) if (worth_threads(N, HV, K, Dv))
    for (int r = 0; r < N; r++)
        for (int h = 0; h < HV; h++) {
            int64_t qo = (int64_t)r * H * K, vo = (int64_t)r * HV * Dv, go = (int64_t)r * HV;
            recurrent_head((float *)rows[r] + h * SS, o + vo, q + qo, k + qo, v + vo, g + go, beta + go, scale, 0, h, 1,
                           H, HV, K, Dv);
        }
}

// The step's inputs by the ops they fuse on the GPU: three conv1d_step, two
// l2norm_fwd, gdn_gate_fwd (the CPU has no launches to save).
static void cpu_gdn_step_inputs(be_t *be, void *q, void *k, void *v, float *g, float *beta, void *const *rows,
                                const void *xq, int64_t ldq, const void *xk, int64_t ldk, const void *xv, int64_t ldv,
                                const void *a, int64_t lda, const void *b, int64_t ldb, const void *q_conv,
                                const void *k_conv, const void *v_conv, const void *A_log, const void *dt_bias, int N,
                                int H, int HV, int K, int Dv, int W, float eps, int allow_neg) {
    int kd = H * K, vd = HV * Dv;
    cpu_tmp_t tmp;
    float *qc = cpu_tmp_take(be, &tmp, 2 * (int64_t)N * kd, "gdn_step_inputs"), *kc = qc + (int64_t)N * kd;
    if (!qc) {
        cpu_fill_nan(q, (int64_t)N * kd), cpu_fill_nan(k, (int64_t)N * kd), cpu_fill_nan(v, (int64_t)N * vd);
        cpu_fill_nan(g, (int64_t)N * HV), cpu_fill_nan(beta, (int64_t)N * HV);
        return;
    }
    be->conv1d_step(be, qc, xq, ldq, q_conv, NULL, rows + N, N, kd, W, 1);
    be->conv1d_step(be, kc, xk, ldk, k_conv, NULL, rows + 2 * N, N, kd, W, 1);
    be->conv1d_step(be, v, xv, ldv, v_conv, NULL, rows + 3 * N, N, vd, W, 1);
    be->l2norm_fwd(be, q, NULL, qc, K, (int64_t)N * H, K, eps);
    be->l2norm_fwd(be, k, NULL, kc, K, (int64_t)N * H, K, eps);
    be->gdn_gate_fwd(be, g, beta, a, lda, b, ldb, A_log, dt_bias, N, HV, allow_neg);
    cpu_tmp_give(be, &tmp);
}

// A whole decode step by the three ops it fuses on the GPU: this is the
// reference the fused kernel is tested against.
static void cpu_gdn_step(be_t *be, void *y, void *const *rows, const void *xq, int64_t ldq, const void *xk, int64_t ldk,
                         const void *xv, int64_t ldv, const void *a, int64_t lda, const void *b, int64_t ldb,
                         const void *z, int64_t ldz, const void *q_conv, const void *k_conv, const void *v_conv,
                         const void *A_log, const void *dt_bias, const void *o_norm, float scale, int N, int H, int HV,
                         int K, int Dv, int W, float l2_eps, float eps, int allow_neg) {
    const int64_t kd = (int64_t)H * K, vd = (int64_t)HV * Dv;
    cpu_tmp_t tmp;
    float *q = cpu_tmp_take(be, &tmp, (int64_t)N * (2 * kd + 2 * vd + 2 * HV), "gdn_step");
    if (!q) {
        cpu_fill_nan(y, (int64_t)N * vd);
        return;
    }
    float *k = q + (int64_t)N * kd, *v = k + (int64_t)N * kd, *o = v + (int64_t)N * vd, *g = o + (int64_t)N * vd,
          *beta = g + (int64_t)N * HV;
    be->gdn_step_inputs(be, q, k, v, g, beta, rows, xq, ldq, xk, ldk, xv, ldv, a, lda, b, ldb, q_conv, k_conv, v_conv,
                        A_log, dt_bias, N, H, HV, K, Dv, W, l2_eps, allow_neg);
    be->gdn_recurrent_step(be, o, rows, q, k, v, g, beta, scale, N, H, HV, K, Dv);
    if (z)
        be->gated_rmsnorm_fwd(be, y, NULL, o, z, ldz, o_norm, Dv, N, HV, Dv, eps, GNORM_NORM_THEN_GATE);
    else
        be->rmsnorm_fwd(be, y, NULL, o, o_norm, (int64_t)N * HV, Dv, eps);
    cpu_tmp_give(be, &tmp);
}

// Backpropagation through time over the stored states (test oracle).
int cpu_gdn_recurrent_bwd(float *dq, float *dk, float *dv, float *dg, float *dbeta, float *dstate0, const float *dout,
                          const float *dstate_final, const float *q, const float *k, const float *v, const float *g,
                          const float *beta, const float *state0, float scale, int B, int T, int H, int HV, int K,
                          int Dv) {
    int64_t SS = (int64_t)Dv * K;
    // hist[t+1] = S_t (state after token t), hist[0] = S_{-1} = initial state
    float *hist = malloc((size_t)(T + 1) * SS * sizeof(float));
    float *dS = malloc((size_t)SS * sizeof(float)), *r = malloc((size_t)Dv * 2 * sizeof(float));
    if (!hist || !dS || !r) {
        free(hist), free(dS), free(r);
        return err_set(ERR_NOMEM, "gdn recurrent bwd: out of memory (T %d, Dv %d, K %d)", T, Dv, K);
    }
    float *du = r + Dv;
    memset(dq, 0, (size_t)B * T * H * K * sizeof(float)); // accumulated over the value heads of a q/k head
    memset(dk, 0, (size_t)B * T * H * K * sizeof(float));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < HV; h++) {
            int hq = h / (HV / H);
            int64_t sh = ((int64_t)b * HV + h) * SS;
            // forward, keeping every state
            if (state0)
                memcpy(hist, state0 + sh, (size_t)SS * sizeof(float));
            else
                memset(hist, 0, (size_t)SS * sizeof(float));
            for (int t = 0; t < T; t++) {
                int64_t row = (int64_t)b * T + t;
                const float *kt = k + (row * H + hq) * K, *vt = v + (row * HV + h) * Dv;
                float alpha = expf(g[row * HV + h]), bt = beta[row * HV + h];
                const float *Sp = hist + t * SS;
                float *Sn = hist + (t + 1) * SS;
                for (int i = 0; i < Dv; i++) {
                    float sk = 0;
                    for (int x = 0; x < K; x++)
                        sk += alpha * Sp[i * K + x] * kt[x];
                    float u = bt * (vt[i] - sk);
                    for (int x = 0; x < K; x++)
                        Sn[i * K + x] = alpha * Sp[i * K + x] + kt[x] * u;
                }
            }
            // backward, dS = d loss / d S_t
            if (dstate_final)
                memcpy(dS, dstate_final + sh, (size_t)SS * sizeof(float));
            else
                memset(dS, 0, (size_t)SS * sizeof(float));
            for (int t = T - 1; t >= 0; t--) {
                int64_t row = (int64_t)b * T + t;
                const float *qt = q + (row * H + hq) * K, *kt = k + (row * H + hq) * K, *vt = v + (row * HV + h) * Dv;
                const float *dot = dout + (row * HV + h) * Dv;
                float *dqt = dq + (row * H + hq) * K, *dkt = dk + (row * H + hq) * K;
                float alpha = expf(g[row * HV + h]), bt = beta[row * HV + h];
                const float *Sp = hist + t * SS, *St = hist + (t + 1) * SS;
                // o = scale S_t^T q
                for (int i = 0; i < Dv; i++)
                    for (int x = 0; x < K; x++) {
                        dS[i * K + x] += scale * dot[i] * qt[x];
                        dqt[x] += scale * St[i * K + x] * dot[i];
                    }
                // S_t = S_bar + k u^T, u = beta r, r = v - S_bar^T k
                double dbt = 0;
                for (int i = 0; i < Dv; i++) {
                    float sk = 0, dui = 0;
                    for (int x = 0; x < K; x++) {
                        sk += alpha * Sp[i * K + x] * kt[x];
                        dui += dS[i * K + x] * kt[x];
                    }
                    r[i] = vt[i] - sk;
                    du[i] = dui;
                    dbt += (double)dui * r[i];
                    dv[(row * HV + h) * Dv + i] = bt * dui;
                }
                dbeta[row * HV + h] = (float)dbt;
                double dgt = 0;
                for (int i = 0; i < Dv; i++) {
                    float dr = bt * du[i], u = bt * r[i];
                    for (int x = 0; x < K; x++) {
                        float sbar = alpha * Sp[i * K + x];
                        dkt[x] += dS[i * K + x] * u - sbar * dr; // from k u^T and from S_bar^T k
                        float dsbar = dS[i * K + x] - kt[x] * dr;
                        dgt += (double)sbar * dsbar; // d S_bar / d g = S_bar
                        dS[i * K + x] = alpha * dsbar;
                    }
                }
                dg[row * HV + h] = (float)dgt;
            }
            if (dstate0) memcpy(dstate0 + sh, dS, (size_t)SS * sizeof(float));
        }
    free(hist), free(dS), free(r);
    return 0;
}

// ---------------------------------------------------------------------------
// Chunked algorithm: per-chunk pieces (spec 2.1-2.3)
// ---------------------------------------------------------------------------

// One thread's tiles. BT x BT matrices use row stride BT; row i of the chunk
// is token t0 + i.
typedef struct {
    int K, Dv;
    float G[BT], gam[BT], beta[BT]; // chunk-local inclusive cumsum of gam; gam = per-token log decay
    float eG[BT];                   // e^{G_i}
    float *Qc, *Kc, *Vc;            // [BT,K], [BT,K], [BT,Dv] the chunk's rows
    float *Gam;                     // [BT,BT] exp(G_i - G_j) for j <= i, 0 above the diagonal
    float *KK, *QK;                 // [BT,BT] k_i . k_j and q_i . k_j (lower part incl. diagonal)
    float *M, *TA;                  // [BT,BT] M strictly lower; TA = (I + M)^-1 unit lower
    float *U, *Delta;               // [BT,Dv] pseudo-values, delta-rule writes (un-decayed)
    float *W;                       // [BT,K]
    float *St;                      // [Dv,K] state (V-first) at the start of the current chunk
    // backward only
    float dG[BT], dbeta[BT];
    float *dO, *dDelta, *dVc, *TtdU;    // [BT,Dv]
    float *dQc, *dKc, *dKs, *dW, *TtdW; // [BT,K]; dKs: state-path part of dk (for dG)
    float *ds, *dTA, *X, *dM;           // [BT,BT]
    float *dSt;                         // [Dv,K] gradient of the state at the end of the current chunk
    float *hist;                        // [NT,Dv,K] state at the start of every chunk
} ws_t;

static size_t ws_floats(int K, int Dv, int NT, int bwd) {
    size_t n = 2 * BT * K + BT * Dv + 5 * BT * BT + 2 * BT * Dv + BT * K + (size_t)Dv * K;
    if (bwd) n += 4 * BT * Dv + 5 * BT * K + 4 * BT * BT + (size_t)Dv * K + (size_t)NT * Dv * K;
    return n;
}

static ws_t ws_carve(float *p, int K, int Dv, int NT, int bwd) {
    ws_t w;
    memset(&w, 0, sizeof w);
    w.K = K, w.Dv = Dv;
#define TAKE(field, n) (w.field = p, p += (n))
    TAKE(Qc, BT * K), TAKE(Kc, BT * K), TAKE(Vc, BT * Dv);
    TAKE(Gam, BT * BT), TAKE(KK, BT * BT), TAKE(QK, BT * BT), TAKE(M, BT * BT), TAKE(TA, BT * BT);
    TAKE(U, BT * Dv), TAKE(Delta, BT * Dv), TAKE(W, BT * K), TAKE(St, (int64_t)Dv * K);
    if (bwd) {
        TAKE(dO, BT * Dv), TAKE(dDelta, BT * Dv), TAKE(dVc, BT * Dv), TAKE(TtdU, BT * Dv);
        TAKE(dQc, BT * K), TAKE(dKc, BT * K), TAKE(dKs, BT * K), TAKE(dW, BT * K), TAKE(TtdW, BT * K);
        TAKE(ds, BT * BT), TAKE(dTA, BT * BT), TAKE(X, BT * BT), TAKE(dM, BT * BT);
        TAKE(dSt, (int64_t)Dv * K), TAKE(hist, (int64_t)NT * Dv * K);
    }
#undef TAKE
    return w;
}

// The two inner kernels of everything below. `omp simd` because -O2 does not
// vectorise loops of unknown length on its own (the reduction order changes
// with the vector width: fp32 rounding only).
static inline float dotf(const float *restrict a, const float *restrict b, int n) {
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}
static inline void axpy(float *restrict y, float a, const float *restrict x, int n) {
#pragma omp simd
    for (int i = 0; i < n; i++)
        y[i] += a * x[i];
}

// Rows t0 .. t0+L-1 of sequence b: q/k of head hq, v/g/beta of value head h.
static void gather_chunk(ws_t *w, const float *q, const float *k, const float *v, const float *g, const float *beta,
                         int64_t row0, int t0, int L, int hq, int h, int H, int HV) {
    int K = w->K, Dv = w->Dv;
    for (int i = 0; i < L; i++) {
        int64_t row = row0 + t0 + i;
        memcpy(w->Qc + i * K, q + (row * H + hq) * K, (size_t)K * sizeof(float));
        memcpy(w->Kc + i * K, k + (row * H + hq) * K, (size_t)K * sizeof(float));
        memcpy(w->Vc + i * Dv, v + (row * HV + h) * Dv, (size_t)Dv * sizeof(float));
        w->gam[i] = g[row * HV + h];
        w->beta[i] = beta[row * HV + h];
    }
}

// F1 + F2 (also B1): chunk-local cumulative gates, the decay matrix, K K^T and
// Q K^T, M, its inverse T_A, then U = T_A diag(beta) V and
// W = T_A diag(beta e^G) K. Everything here depends on the chunk only.
static void chunk_intra(ws_t *w, int L) {
    int K = w->K, Dv = w->Dv;
    // F1: G restarts at every chunk, so every exponent below is G_i - G_j
    // with i >= j (or G_i itself): <= 0, no overflow.
    for (int i = 0; i < L; i++)
        w->G[i] = (i ? w->G[i - 1] : 0.0f) + w->gam[i];
    for (int i = 0; i < L; i++)
        for (int j = 0; j < BT; j++) {
            int lower = j <= i && j < L;
            w->Gam[i * BT + j] = lower ? expf(w->G[i] - w->G[j]) : 0.0f;
            w->KK[i * BT + j] = lower ? dotf(w->Kc + i * K, w->Kc + j * K, K) : 0.0f;
            w->QK[i * BT + j] = lower ? dotf(w->Qc + i * K, w->Kc + j * K, K) : 0.0f;
            w->M[i * BT + j] = j < i ? w->beta[i] * w->KK[i * BT + j] * w->Gam[i * BT + j] : 0.0f;
        }
    // F2a: T_A = (I + M)^-1 by forward substitution. From (I + M) T_A = I,
    // row i of T_A is e_i - sum_{m<i} M_im (row m of T_A); rows m < i are
    // already final and row m is zero beyond column m.
    for (int i = 0; i < L; i++) {
        float *ta = w->TA + i * BT;
        memset(ta, 0, BT * sizeof(float));
        for (int m = 0; m < i; m++)
            axpy(ta, -w->M[i * BT + m], w->TA + m * BT, m + 1);
        ta[i] = 1.0f;
    }
    // F2b: U = T_A (beta V), W = T_A (beta e^G K)
    for (int i = 0; i < L; i++)
        w->eG[i] = expf(w->G[i]);
    for (int i = 0; i < L; i++) {
        float *u = w->U + i * Dv, *wr = w->W + i * K;
        memset(u, 0, (size_t)Dv * sizeof(float));
        memset(wr, 0, (size_t)K * sizeof(float));
        for (int j = 0; j <= i; j++) {
            float ta = w->TA[i * BT + j];
            axpy(u, ta * w->beta[j], w->Vc + j * Dv, Dv);
            axpy(wr, ta * w->beta[j] * w->eG[j], w->Kc + j * K, K);
        }
    }
}

// F3 (first half, also B2): Delta = U - W S, the token's write in un-decayed
// units, given the state St at the chunk start.
static void chunk_delta(ws_t *w, int L) {
    int K = w->K, Dv = w->Dv;
    for (int i = 0; i < L; i++)
        for (int c = 0; c < Dv; c++)
            w->Delta[i * Dv + c] = w->U[i * Dv + c] - dotf(w->W + i * K, w->St + (int64_t)c * K, K);
}

// F4: o_i = scale (e^{G_i} S^T q_i + sum_{j<=i} Gam_ij (q_i . k_j) Delta_j),
// written to token rows of o [B,T,HV,Dv].
static void chunk_output(const ws_t *w, float *o, float scale, int64_t row0, int t0, int L, int h, int HV) {
    int K = w->K, Dv = w->Dv;
    for (int i = 0; i < L; i++) {
        float *orow = o + ((row0 + t0 + i) * HV + h) * Dv;
        float eg = w->eG[i];
        for (int c = 0; c < Dv; c++)
            orow[c] = eg * dotf(w->St + (int64_t)c * K, w->Qc + i * K, K);
        for (int j = 0; j <= i; j++)
            axpy(orow, w->Gam[i * BT + j] * w->QK[i * BT + j], w->Delta + j * Dv, Dv);
        for (int c = 0; c < Dv; c++)
            orow[c] *= scale;
    }
}

// F3 (second half): S <- e^{G_L} S + sum_j e^{G_L - G_j} k_j Delta_j^T,
// G_L the cumulative gate of the chunk's last token (row L-1 of Gam holds
// e^{G_L - G_j}).
static void chunk_state_update(ws_t *w, int L) {
    int K = w->K, Dv = w->Dv;
    float eL = w->eG[L - 1];
    const float *gL = w->Gam + (L - 1) * BT;
    for (int c = 0; c < Dv; c++) {
        float *s = w->St + (int64_t)c * K;
        for (int x = 0; x < K; x++)
            s[x] *= eL;
        for (int j = 0; j < L; j++)
            axpy(s, gL[j] * w->Delta[j * Dv + c], w->Kc + j * K, K);
    }
}

// ---------------------------------------------------------------------------
// Chunked forward
// ---------------------------------------------------------------------------

// The chunked forward of n sequences: sequence s has len[s] rows from row
// row0[s] of q, k, v, g, beta and o, and its state at st[s] (NULL: none; read
// when init). Its (sequence, head) pairs are the threads' units, so packed
// sequences of a batched prefill run side by side.
static void gdn_fwd_seqs(be_t *be, float *o, float *const *st, int init, const float *q, const float *k, const float *v,
                         const float *g, const float *beta, float scale, int n, const int64_t *row0, const int *len,
                         int H, int HV, int K, int Dv) {
    int64_t SS = (int64_t)Dv * K, rows = 0;
    int nth;
    for (int s = 0; s < n; s++)
        rows += len[s];
    size_t per = ws_floats(K, Dv, 0, 0);
    cpu_tmp_t tmp;
    float *pool = ws_take(be, &tmp, per, &nth, "gdn chunk forward");
    if (!pool) {
        for (int s = 0; s < n; s++) {
            cpu_fill_nan(o + row0[s] * HV * Dv, (int64_t)len[s] * HV * Dv);
            if (st[s]) cpu_fill_nan(st[s], HV * SS);
        }
        return;
    }
#pragma omp parallel num_threads(nth) if (worth_threads(rows, HV, K, Dv))
    {
        ws_t w = ws_carve(pool + (size_t)omp_get_thread_num() * per, K, Dv, 0, 0);
#pragma omp for collapse(2) schedule(dynamic, 1)
        for (int s = 0; s < n; s++)
            for (int h = 0; h < HV; h++) {
                int hq = h / (HV / H), T = len[s], NT = (T + BT - 1) / BT;
                float *sh = st[s] ? st[s] + (int64_t)h * SS : NULL;
                if (sh && init)
                    memcpy(w.St, sh, (size_t)SS * sizeof(float));
                else
                    memset(w.St, 0, (size_t)SS * sizeof(float));
                for (int c = 0; c < NT; c++) {
                    int t0 = c * BT, L = T - t0 < BT ? T - t0 : BT;
                    gather_chunk(&w, q, k, v, g, beta, row0[s], t0, L, hq, h, H, HV);
                    chunk_intra(&w, L);                                // F1, F2
                    chunk_delta(&w, L);                                // F3: Delta = U - W S
                    chunk_output(&w, o, scale, row0[s], t0, L, h, HV); // F4 (reads S at the chunk start)
                    chunk_state_update(&w, L);                         // F3: state passing
                }
                if (sh) memcpy(sh, w.St, (size_t)SS * sizeof(float));
            }
    }
    cpu_tmp_give(be, &tmp);
}

// Per-sequence tables of n sequences (row offsets, lengths, states) in one
// allocation; NULL when out of memory.
static void *seq_tables(int n, int64_t **row0, int **len, float ***st) {
    char *p = malloc((size_t)(n > 0 ? n : 1) * (sizeof(int64_t) + sizeof(int) + sizeof(float *)));
    if (!p) return NULL;
    *row0 = (int64_t *)p, *st = (float **)(p + (size_t)n * sizeof(int64_t));
    *len = (int *)(p + (size_t)n * (sizeof(int64_t) + sizeof(float *)));
    return p;
}

static void cpu_gdn_chunk_fwd(be_t *be, void *o_, float *state, int init, const void *q_, const void *k_,
                              const void *v_, const float *g, const float *beta, float scale, int B, int T, int H,
                              int HV, int K, int Dv) {
    int64_t *row0;
    int *len;
    float **st;
    void *tab = seq_tables(B, &row0, &len, &st);
    if (!tab) {
        cpu_fill_nan(o_, (int64_t)B * T * HV * Dv);
        if (state) cpu_fill_nan(state, (int64_t)B * HV * Dv * K);
        return;
    }
    for (int b = 0; b < B; b++)
        row0[b] = (int64_t)b * T, len[b] = T, st[b] = state ? state + (int64_t)b * HV * Dv * K : NULL;
    gdn_fwd_seqs(be, o_, st, init, q_, k_, v_, g, beta, scale, B, row0, len, H, HV, K, Dv);
    free(tab);
}

// ---------------------------------------------------------------------------
// Chunked backward
// ---------------------------------------------------------------------------
// Per chunk, with S = state at the chunk start (w->St, from the history) and
// dS' = gradient of the state at the chunk end (w->dSt), the chunk computed
//   Delta = T_A (diag(beta) V - diag(beta e^G) K S)
//   o_i   = scale e^{G_i} S^T q_i + sum_{j<=i} P_ij Delta_j,  P_ij = scale Gam_ij (q_i . k_j)
//   S'    = e^{G_L} S + sum_j e^{G_L - G_j} k_j Delta_j^T.
// The steps below differentiate these three lines; dG collects d loss / d G_i
// (the chunk-local cumulative gate) and is turned into d loss / d gamma by a
// reverse cumulative sum within the chunk (B7): G is chunk-local, the
// dependence across chunks goes through S and is carried by dS.

// B3 + B4 (first half): dDelta_j = sum_{i>=j} P_ij dO_i + e^{G_L - G_j} dS'^T k_j.
static void chunk_bwd_ddelta(ws_t *w, int L, float scale) {
    int K = w->K, Dv = w->Dv;
    const float *gL = w->Gam + (L - 1) * BT;
    for (int j = 0; j < L; j++) {
        float *dd = w->dDelta + j * Dv;
        memset(dd, 0, (size_t)Dv * sizeof(float));
        for (int i = j; i < L; i++)
            axpy(dd, scale * w->Gam[i * BT + j] * w->QK[i * BT + j], w->dO + i * Dv, Dv);
        for (int c = 0; c < Dv; c++)
            dd[c] += gL[j] * dotf(w->dSt + (int64_t)c * K, w->Kc + j * K, K);
    }
}

// B5: dq, dk (output and state paths), dW = -dDelta S^T, and the part of dG
// from the output and the state passing:
//   dG_i = q_i . dq_i - k_i . dk_i, plus at the last row
//   e^{G_L} <S, dS'> + sum_j k_j . dk_j^{state}.
static void chunk_bwd_dqkwg(ws_t *w, int L, float scale) {
    int K = w->K, Dv = w->Dv;
    // ds_ij = scale Gam_ij (dO_i . Delta_j), j <= i: gradient of the score q_i . k_j
    for (int i = 0; i < L; i++)
        for (int j = 0; j <= i; j++)
            w->ds[i * BT + j] = scale * w->Gam[i * BT + j] * dotf(w->dO + i * Dv, w->Delta + j * Dv, Dv);
    const float *gL = w->Gam + (L - 1) * BT;
    for (int i = 0; i < L; i++) {
        float *dq = w->dQc + i * K, *dks = w->dKs + i * K, *dwr = w->dW + i * K;
        memset(dq, 0, (size_t)K * sizeof(float));
        memset(dks, 0, (size_t)K * sizeof(float));
        memset(dwr, 0, (size_t)K * sizeof(float));
        float eg = w->eG[i];
        for (int c = 0; c < Dv; c++) {
            const float *s = w->St + (int64_t)c * K, *dsp = w->dSt + (int64_t)c * K;
            axpy(dq, scale * eg * w->dO[i * Dv + c], s, K);  // inter-chunk output term: scale e^G S dO
            axpy(dks, gL[i] * w->Delta[i * Dv + c], dsp, K); // state update: e^{G_L-G_i} dS' Delta_i
            axpy(dwr, -w->dDelta[i * Dv + c], s, K);         // Delta = U - W S
        }
        for (int j = 0; j <= i; j++)
            axpy(dq, w->ds[i * BT + j], w->Kc + j * K, K);
        float *dk = w->dKc + i * K;
        memcpy(dk, dks, (size_t)K * sizeof(float));
        for (int r = i; r < L; r++)
            axpy(dk, w->ds[r * BT + i], w->Qc + r * K, K);
    }
    double last = 0; // e^{G_L} <S, dS'> + sum_j k_j . dk_j^{state}
    for (int64_t e = 0; e < (int64_t)Dv * K; e++)
        last += (double)w->St[e] * w->dSt[e];
    last *= w->eG[L - 1];
    for (int i = 0; i < L; i++) {
        float ks = dotf(w->Kc + i * K, w->dKs + i * K, K);
        last += ks;
        w->dG[i] = dotf(w->Qc + i * K, w->dQc + i * K, K) - dotf(w->Kc + i * K, w->dKc + i * K, K);
    }
    w->dG[L - 1] += (float)last;
}

// B4 (second half): dS <- e^{G_L} dS' + scale sum_i e^{G_i} q_i dO_i^T - sum_i W_i dDelta_i^T,
// the gradient of the state at the chunk start (becomes dS' of the previous chunk).
static void chunk_bwd_dstate(ws_t *w, int L, float scale) {
    int K = w->K, Dv = w->Dv;
    float eL = w->eG[L - 1];
    for (int c = 0; c < Dv; c++) {
        float *ds = w->dSt + (int64_t)c * K;
        for (int x = 0; x < K; x++)
            ds[x] *= eL;
        for (int i = 0; i < L; i++) {
            axpy(ds, scale * w->eG[i] * w->dO[i * Dv + c], w->Qc + i * K, K);
            axpy(ds, -w->dDelta[i * Dv + c], w->W + i * K, K);
        }
    }
}

// B6: through U = T_A diag(beta) V, W = T_A diag(beta e^G) K, T_A = (I + M)^-1
// and M_ij = beta_i (k_i . k_j) Gam_ij. dU = dDelta; dW from B5.
static void chunk_bwd_wy(ws_t *w, int L) {
    int K = w->K, Dv = w->Dv;
    const float *eg = w->eG;
    // T_A^T dU and T_A^T dW (T_A lower: column j meets rows i >= j)
    for (int j = 0; j < L; j++) {
        float *tu = w->TtdU + j * Dv, *tw = w->TtdW + j * K;
        memset(tu, 0, (size_t)Dv * sizeof(float));
        memset(tw, 0, (size_t)K * sizeof(float));
        for (int i = j; i < L; i++) {
            axpy(tu, w->TA[i * BT + j], w->dDelta + i * Dv, Dv);
            axpy(tw, w->TA[i * BT + j], w->dW + i * K, K);
        }
    }
    // the right-hand sides beta V and beta e^G K
    for (int j = 0; j < L; j++) {
        float tv = dotf(w->TtdU + j * Dv, w->Vc + j * Dv, Dv), tk = dotf(w->TtdW + j * K, w->Kc + j * K, K);
        for (int c = 0; c < Dv; c++)
            w->dVc[j * Dv + c] = w->beta[j] * w->TtdU[j * Dv + c];
        w->dbeta[j] = tv + eg[j] * tk;
        axpy(w->dKc + j * K, w->beta[j] * eg[j], w->TtdW + j * K, K);
        w->dG[j] += w->beta[j] * eg[j] * tk; // d(e^{G_j}) / dG_j = e^{G_j}
    }
    // dT_A = dU (beta V)^T + dW (beta e^G K)^T; only the strictly lower part
    // matters (the diagonal of T_A is 1 and its upper part 0 for every M).
    for (int i = 0; i < L; i++)
        for (int j = 0; j < BT; j++)
            w->dTA[i * BT + j] = j < i ? w->beta[j] * (dotf(w->dDelta + i * Dv, w->Vc + j * Dv, Dv) +
                                                       eg[j] * dotf(w->dW + i * K, w->Kc + j * K, K))
                                       : 0.0f;
    // through the inverse: dM = -T_A^T dT_A T_A^T, strictly lower part.
    // X = dT_A T_A^T: X_im = sum_{j<i, j<=m} dTA_ij TA_mj
    for (int i = 0; i < L; i++)
        for (int m = 0; m < L; m++) {
            float s = 0;
            int jmax = i - 1 < m ? i - 1 : m;
            for (int j = 0; j <= jmax; j++)
                s += w->dTA[i * BT + j] * w->TA[m * BT + j];
            w->X[i * BT + m] = s;
        }
    // dM_am = -sum_{n>=a} TA_na X_nm for a > m, then times Gam (chain through M)
    for (int a = 0; a < L; a++)
        for (int m = 0; m < BT; m++) {
            float s = 0;
            if (m < a)
                for (int n = a; n < L; n++)
                    s += w->TA[n * BT + a] * w->X[n * BT + m];
            w->dM[a * BT + m] = m < a ? -s * w->Gam[a * BT + m] : 0.0f; // dM * Gam from here on
        }
    // through M_ij = beta_i (k_i . k_j) Gam_ij, with dMg = dM * Gam:
    // dk_i += beta_i sum_j dMg_ij k_j; dk_j += sum_i dMg_ij beta_i k_i;
    // dbeta_i += sum_j dMg_ij (k_i . k_j); R_ij = dM_ij M_ij: dG_i += sum_j R_ij, dG_j -= sum_i R_ij.
    for (int i = 0; i < L; i++)
        for (int j = 0; j < i; j++) {
            float dmg = w->dM[i * BT + j];
            axpy(w->dKc + i * K, w->beta[i] * dmg, w->Kc + j * K, K);
            axpy(w->dKc + j * K, w->beta[i] * dmg, w->Kc + i * K, K);
            w->dbeta[i] += dmg * w->KK[i * BT + j];
            float R = dmg * w->beta[i] * w->KK[i * BT + j];
            w->dG[i] += R;
            w->dG[j] -= R;
        }
}

static void cpu_gdn_chunk_bwd(be_t *be, void *dq_, void *dk_, void *dv_, float *dg, float *dbeta, float *dstate0,
                              const void *dout_, const float *dstate_final, const void *q_, const void *k_,
                              const void *v_, const float *g, const float *beta, const float *state0, float scale,
                              int B, int T, int H, int HV, int K, int Dv) {
    float *dq = dq_, *dk = dk_, *dv = dv_;
    const float *dout = dout_, *q = q_, *k = k_, *v = v_;
    int64_t SS = (int64_t)Dv * K;
    int NT = (T + BT - 1) / BT, nth, grp = HV / H;
    size_t per = ws_floats(K, Dv, NT, 1);
    cpu_tmp_t tmp;
    float *pool = ws_take(be, &tmp, per, &nth, "gdn chunk backward");
    if (!pool) {
        cpu_fill_nan(dq, (int64_t)B * T * H * K), cpu_fill_nan(dk, (int64_t)B * T * H * K);
        cpu_fill_nan(dv, (int64_t)B * T * HV * Dv), cpu_fill_nan(dg, (int64_t)B * T * HV);
        cpu_fill_nan(dbeta, (int64_t)B * T * HV), cpu_fill_nan(dstate0, (int64_t)B * HV * SS);
        return;
    }
    // Parallel over (batch, q/k head); the value heads of a q/k head run in
    // turn and add their dq, dk into the same rows, so no two threads write
    // one row (the GPU instead writes per-value-head partials and sums them).
#pragma omp parallel num_threads(nth) if (worth_threads((int64_t)B * T, HV, K, Dv))
    {
        ws_t w = ws_carve(pool + (size_t)omp_get_thread_num() * per, K, Dv, NT, 1);
#pragma omp for collapse(2) schedule(dynamic, 1)
        for (int b = 0; b < B; b++)
            for (int hq = 0; hq < H; hq++) {
                for (int t = 0; t < T; t++) {
                    int64_t row = ((int64_t)b * T + t) * H + hq;
                    memset(dq + row * K, 0, (size_t)K * sizeof(float));
                    memset(dk + row * K, 0, (size_t)K * sizeof(float));
                }
                for (int h = hq * grp; h < (hq + 1) * grp; h++) {
                    int64_t sh = ((int64_t)b * HV + h) * SS;
                    // B1 + B2: rebuild the state at every chunk start
                    if (state0)
                        memcpy(w.St, state0 + sh, (size_t)SS * sizeof(float));
                    else
                        memset(w.St, 0, (size_t)SS * sizeof(float));
                    for (int c = 0; c < NT; c++) {
                        int t0 = c * BT, L = T - t0 < BT ? T - t0 : BT;
                        memcpy(w.hist + c * SS, w.St, (size_t)SS * sizeof(float));
                        gather_chunk(&w, q, k, v, g, beta, (int64_t)b * T, t0, L, hq, h, H, HV);
                        chunk_intra(&w, L);
                        chunk_delta(&w, L);
                        chunk_state_update(&w, L);
                    }
                    // reverse pass over the chunks with the running dS (dS' of the chunk)
                    if (dstate_final)
                        memcpy(w.dSt, dstate_final + sh, (size_t)SS * sizeof(float));
                    else
                        memset(w.dSt, 0, (size_t)SS * sizeof(float));
                    for (int c = NT - 1; c >= 0; c--) {
                        int t0 = c * BT, L = T - t0 < BT ? T - t0 : BT;
                        memcpy(w.St, w.hist + c * SS, (size_t)SS * sizeof(float));
                        gather_chunk(&w, q, k, v, g, beta, (int64_t)b * T, t0, L, hq, h, H, HV);
                        for (int i = 0; i < L; i++)
                            memcpy(w.dO + i * Dv, dout + (((int64_t)b * T + t0 + i) * HV + h) * Dv,
                                   (size_t)Dv * sizeof(float));
                        chunk_intra(&w, L);             // B1: G, M, T_A, U, W
                        chunk_delta(&w, L);             // B2: Delta
                        chunk_bwd_ddelta(&w, L, scale); // B3 + B4: dDelta (needs dS')
                        chunk_bwd_dqkwg(&w, L, scale);  // B5: needs S and dS'
                        chunk_bwd_dstate(&w, L, scale); // B4: dS' -> gradient of the chunk-start state
                        chunk_bwd_wy(&w, L);            // B6
                        // B7: dgamma_i = sum_{j>=i, same chunk} dG_j
                        for (int i = L - 2; i >= 0; i--)
                            w.dG[i] += w.dG[i + 1];
                        for (int i = 0; i < L; i++) {
                            int64_t row = (int64_t)b * T + t0 + i;
                            axpy(dq + (row * H + hq) * K, 1.0f, w.dQc + i * K, K);
                            axpy(dk + (row * H + hq) * K, 1.0f, w.dKc + i * K, K);
                            memcpy(dv + (row * HV + h) * Dv, w.dVc + i * Dv, (size_t)Dv * sizeof(float));
                            dg[row * HV + h] = w.dG[i];
                            dbeta[row * HV + h] = w.dbeta[i];
                        }
                    }
                    if (dstate0) memcpy(dstate0 + sh, w.dSt, (size_t)SS * sizeof(float));
                }
            }
    }
    cpu_tmp_give(be, &tmp);
}

// The packed sequences side by side (gdn_fwd_seqs), each from its own state.
static void cpu_gdn_chunk_seqs(be_t *be, void *o_, void *const *state, const void *q_, const void *k_, const void *v_,
                               const float *g, const float *beta, float scale, be_seqs_t sq, int H, int HV, int K,
                               int Dv) {
    int64_t *row0;
    int *len;
    float **st;
    void *tab = seq_tables(sq.n, &row0, &len, &st);
    if (!tab) {
        cpu_fill_nan(o_, (int64_t)sq.cu[sq.n] * HV * Dv);
        return;
    }
    for (int s = 0; s < sq.n; s++)
        row0[s] = sq.cu[s], len[s] = sq.cu[s + 1] - sq.cu[s], st[s] = state[s];
    gdn_fwd_seqs(be, o_, st, 1, q_, k_, v_, g, beta, scale, sq.n, row0, len, H, HV, K, Dv);
    free(tab);
}

void cpu_register_gdn(be_t *be) {
    be->gdn_gate_fwd = cpu_gdn_gate_fwd;
    be->gdn_gate_bwd = cpu_gdn_gate_bwd;
    be->gdn_chunk_fwd = cpu_gdn_chunk_fwd;
    be->gdn_chunk_bwd = cpu_gdn_chunk_bwd;
    be->gdn_recurrent_fwd = cpu_gdn_recurrent_fwd;
    be->gdn_recurrent_step = cpu_gdn_recurrent_step;
    be->gdn_step_inputs = cpu_gdn_step_inputs;
    be->gdn_step = cpu_gdn_step;
    be->gdn_chunk_seqs = cpu_gdn_chunk_seqs;
}
