// Mamba-2 SSD (state space duality) on the CPU, fp32: softplus(dt + dt_bias),
// the token-by-token recurrence (decode steps, and the oracle), its naive
// backward through time (cpu_ssd.h, for the tests) and the chunked algorithm,
// forward and backward (spec linear_blocks.md §3.5-3.6).
//
// Per (sequence b, head h), with A = -exp(A_log[h]) and a state S [P, N]:
//   S_t = exp(dt_t A) S_{t-1} + dt_t x_t B_t^T,   y_t = S_t C_t + D[h] x_t
// x_t is x head h/(H/Hx), B_t group h/(H/GB), C_t group h/(H/GC) (MambaInLlama
// GQA: several heads read one x head / B group, repeat_interleave order).
//
// Chunked form. Time is cut into chunks of L tokens. Inside a chunk (local
// indices l, s), cs is the chunk-local inclusive cumsum of dA = dt A. dA <= 0,
// so cs is non-increasing and every decay exp(cs_l - cs_s), l >= s, lies in
// (0, 1]: nothing can overflow, whatever T.
//   S2 states[c] = sum_s exp(cs_last - cs_s) dt_s x_s B_s^T        (zero entering state)
//   S3 prev[c+1] = exp(cs_last) prev[c] + states[c], prev[0] = S_0  (state passing)
//   S4 CB[l,s]   = C_l . B_s
//   S5 y_l       = exp(cs_l) prev[c] C_l + sum_{s<=l} CB[l,s] exp(cs_l - cs_s) dt_s x_s + D x_l
// The code is laid out as the GPU kernels run: per (b, h) a loop over chunks
// with named intermediates, where only the state passing (and its backward) is
// sequential over chunks. OpenMP runs over (b, h).
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_ssd.h"
#include "base/err.h"

// ---- dt' = softplus(dt + dt_bias) -------------------------------------------

static void cpu_softplus_bias_fwd(be_t *be, float *out, const void *dt_, int64_t ld, const void *dt_bias_, int64_t N,
                                  int H) {
    const float *dt = dt_, *bias = dt_bias_;
#pragma omp parallel for schedule(static) if (N * H > CPU_PAR_MIN)
    for (int64_t n = 0; n < N; n++)
        for (int h = 0; h < H; h++)
            out[n * H + h] = cpu_softplus(dt[n * ld + h] + bias[h]);
}

static void cpu_softplus_bias_bwd(be_t *be, void *ddt_, int64_t ldd, float *ddt_bias, const float *dout,
                                  const void *dt_, int64_t ld, const void *dt_bias_, int64_t N, int H) {
    float *ddt = ddt_;
    const float *dt = dt_, *bias = dt_bias_;
#pragma omp parallel for schedule(static) if (N * H > CPU_PAR_MIN)
    for (int64_t n = 0; n < N; n++)
        for (int h = 0; h < H; h++) {
            float v = dt[n * ld + h] + bias[h], g = dout[n * H + h];
            ddt[n * ldd + h] = g * cpu_dsoftplus(v);
        }
        // One sum per head, each owned by one thread: no race, fixed order.
#pragma omp parallel for schedule(static) if (N * H > CPU_PAR_MIN)
    for (int h = 0; h < H; h++) {
        double s = 0;
        for (int64_t n = 0; n < N; n++)
            s += ddt[n * ldd + h];
        ddt_bias[h] += (float)s;
    }
}

// ---- shapes and per-(b, h) views ----------------------------------------------

typedef struct {
    int B, T, H, Hx, GB, GC, P, N;
    int L;  // chunk length actually used: min(chunk, T), which gives the same chunks
    int nc; // number of chunks, the last one possibly short
    int64_t ldx, ldb, ldc;
} ssd_shape_t;

// The inputs of one (sequence b, head h): row t of x at x + t * ldx, etc.;
// dt (and ddt) of token t at dt[t * H].
typedef struct {
    const float *x, *Bm, *Cm, *dt;
    float A, D;
} ssd_head_t;

static ssd_shape_t make_shape(int B, int T, int H, int Hx, int GB, int GC, int P, int N, int chunk, int64_t ldx,
                              int64_t ldb, int64_t ldc) {
    ssd_shape_t s = {
        .B = B, .T = T, .H = H, .Hx = Hx, .GB = GB, .GC = GC, .P = P, .N = N, .ldx = ldx, .ldb = ldb, .ldc = ldc};
    s.L = chunk < T ? chunk : (T > 0 ? T : 1);
    s.nc = (T + s.L - 1) / s.L;
    return s;
}

static ssd_head_t head_view(const ssd_shape_t *s, int b, int h, const float *x, const float *Bm, const float *Cm,
                            const float *dt, const float *A_log, const float *D) {
    int64_t row0 = (int64_t)b * s->T;
    ssd_head_t v;
    v.x = x + row0 * s->ldx + (int64_t)(h / (s->H / s->Hx)) * s->P;
    v.Bm = Bm + row0 * s->ldb + (int64_t)(h / (s->H / s->GB)) * s->N;
    v.Cm = Cm + row0 * s->ldc + (int64_t)(h / (s->H / s->GC)) * s->N;
    v.dt = dt + row0 * s->H + h;
    v.A = -expf(A_log[h]); // fp32, as upstream: A must not round to -inf
    v.D = D[h];
    return v;
}

static inline const float *x_at(const ssd_shape_t *s, const ssd_head_t *v, int t) { return v->x + t * s->ldx; }
static inline const float *b_at(const ssd_shape_t *s, const ssd_head_t *v, int t) { return v->Bm + t * s->ldb; }
static inline const float *c_at(const ssd_shape_t *s, const ssd_head_t *v, int t) { return v->Cm + t * s->ldc; }
static inline float dt_at(const ssd_shape_t *s, const ssd_head_t *v, int t) { return v->dt[(int64_t)t * s->H]; }
static inline int chunk_end(const ssd_shape_t *s, int c) { return (c + 1) * s->L < s->T ? (c + 1) * s->L : s->T; }

static inline float dot(const float *a, const float *b, int n) {
    float s = 0;
    for (int i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

// ---- S1-S3: cumsums, chunk states, state passing (forward and backward) ------

// For one (b, h): cs [T] chunk-local inclusive cumsums of dA, states [nc, P, N]
// the chunk-local end states, prev [nc + 1, P, N] the state entering each
// chunk, prev[nc] being the final state. state0 [P, N] or NULL (zeros).
static void head_states(const ssd_shape_t *s, const ssd_head_t *v, const float *state0, float *cs, float *states,
                        float *prev) {
    int P = s->P, N = s->N;
    int64_t PN = (int64_t)P * N;
    // S1: chunk-local inclusive cumsum of dA = dt A
    for (int c = 0; c < s->nc; c++) {
        float acc = 0;
        for (int t = c * s->L; t < chunk_end(s, c); t++)
            cs[t] = acc += dt_at(s, v, t) * v->A;
    }
    // S2: the state each chunk produces from a zero entering state
    for (int c = 0; c < s->nc; c++) {
        int t0 = c * s->L, t1 = chunk_end(s, c);
        float *st = states + c * PN, cs_last = cs[t1 - 1];
        memset(st, 0, (size_t)PN * sizeof(float));
        for (int t = t0; t < t1; t++) {
            float w = expf(cs_last - cs[t]) * dt_at(s, v, t);
            const float *xt = x_at(s, v, t), *bt = b_at(s, v, t);
            for (int p = 0; p < P; p++) {
                float wx = w * xt[p], *row = st + (int64_t)p * N;
                for (int n = 0; n < N; n++)
                    row[n] += wx * bt[n];
            }
        }
    }
    // S3: state passing, the only sequential step
    if (state0)
        memcpy(prev, state0, (size_t)PN * sizeof(float));
    else
        memset(prev, 0, (size_t)PN * sizeof(float));
    for (int c = 0; c < s->nc; c++) {
        float decay = expf(cs[chunk_end(s, c) - 1]);
        const float *in = prev + c * PN, *st = states + c * PN;
        float *out = prev + (c + 1) * PN;
        for (int64_t i = 0; i < PN; i++)
            out[i] = decay * in[i] + st[i];
    }
}

// ---- chunked forward ---------------------------------------------------------

static int64_t fwd_ws_floats(const ssd_shape_t *s) {
    int64_t PN = (int64_t)s->P * s->N;
    return s->T + s->nc * PN + (s->nc + 1) * PN + (int64_t)s->L * s->L;
}

// One (b, h): y rows at y + t * ldy. state_out [P, N] (may alias state0) gets
// the final state when non-NULL.
static void head_fwd(const ssd_shape_t *s, const ssd_head_t *v, const float *state0, float *y, int64_t ldy,
                     float *state_out, float *ws) {
    int P = s->P, N = s->N, L = s->L;
    int64_t PN = (int64_t)P * N;
    float *cs = ws, *states = cs + s->T, *prev = states + s->nc * PN, *CB = prev + (s->nc + 1) * PN;
    head_states(s, v, state0, cs, states, prev);
    for (int c = 0; c < s->nc; c++) { // independent chunks (parallel on a GPU)
        int t0 = c * L, len = chunk_end(s, c) - t0;
        const float *pv = prev + c * PN;
        // S4: CB[l, s] = C_l . B_s, lower triangle
        for (int l = 0; l < len; l++)
            for (int j = 0; j <= l; j++)
                CB[l * L + j] = dot(c_at(s, v, t0 + l), b_at(s, v, t0 + j), N);
        // S5: inter-chunk (entering state) + intra-chunk + skip
        for (int l = 0; l < len; l++) {
            int t = t0 + l;
            const float *ct = c_at(s, v, t), *xt = x_at(s, v, t);
            float *yt = y + t * ldy, e = expf(cs[t]);
            for (int p = 0; p < P; p++)
                yt[p] = e * dot(pv + (int64_t)p * N, ct, N) + v->D * xt[p];
            for (int j = 0; j <= l; j++) {
                float w = CB[l * L + j] * expf(cs[t] - cs[t0 + j]) * dt_at(s, v, t0 + j);
                const float *xs = x_at(s, v, t0 + j);
                for (int p = 0; p < P; p++)
                    yt[p] += w * xs[p];
            }
        }
    }
    if (state_out) memcpy(state_out, prev + s->nc * PN, (size_t)PN * sizeof(float));
}

static void cpu_ssd_chunk_fwd(be_t *be, void *y_, float *state, int init, const void *x, int64_t ldx, const void *Bm,
                              int64_t ldb, const void *Cm, int64_t ldc, const float *dt, const void *A_log,
                              const void *D, int B, int T, int H, int Hx, int GB, int GC, int P, int N, int chunk) {
    float *y = y_;
    ssd_shape_t s = make_shape(B, T, H, Hx, GB, GC, P, N, chunk, ldx, ldb, ldc);
    int64_t PN = (int64_t)P * N;
    if (T == 0) { // the final state is the initial one
        if (state && !init) memset(state, 0, (size_t)B * H * PN * sizeof(float));
        return;
    }
    int nthr = omp_get_max_threads();
    int64_t ws_n = fwd_ws_floats(&s);
    cpu_tmp_t tmp;
    float *ws = cpu_tmp_take(be, &tmp, nthr * ws_n, "ssd chunk forward");
    if (!ws) {
        cpu_fill_nan(y, (int64_t)B * T * H * P);
        if (state) cpu_fill_nan(state, (int64_t)B * H * PN);
        return;
    }
#pragma omp parallel num_threads(nthr)
    {
        float *w = ws + omp_get_thread_num() * ws_n;
#pragma omp for collapse(2) schedule(dynamic)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++) {
                ssd_head_t v = head_view(&s, b, h, x, Bm, Cm, dt, A_log, D);
                float *st = state ? state + ((int64_t)b * H + h) * PN : NULL;
                head_fwd(&s, &v, init ? st : NULL, y + ((int64_t)b * T * H + h) * P, (int64_t)H * P, st, w);
            }
    }
    cpu_tmp_give(be, &tmp);
}

// ---- chunked backward --------------------------------------------------------
//
// With G[c] the gradient of prev[c] (G[nc] = dstate_final):
//   R3/R4 dstates[c] = G[c+1] (gradient of states[c]);
//         ddA_chunk[c] = exp(cs_last) sum(prev[c] * G[c+1]) (through the decay of S3);
//         G[c] = exp(cs_last) G[c+1] + sum_l exp(cs_l) dy_l C_l^T;  dstate0 = G[0].
// Per chunk, for a source position s:
//   acc_s = exp(cs_last - cs_s) dstates B_s + sum_{l>=s} CB[l,s] exp(cs_l - cs_s) dy_l
//   dx_s = dt_s acc_s + D dy_s,  ddt_s (as input scale) = acc_s . x_s
//   dCB[l,s] = dt_s exp(cs_l - cs_s) (dy_l . x_s)
//   dB_s = dt_s exp(cs_last - cs_s) dstates^T x_s + sum_{l>=s} dCB[l,s] C_l
// and for a target position l:
//   dC_l = exp(cs_l) prev^T dy_l + sum_{s<=l} dCB[l,s] B_s
// Decays, the "stable" way of §3.6 R10: the gradient of every per-step dA_r
// is accumulated from the terms whose exponent contains it, never by
// differencing large sums:
//   cs_l in exp(cs_l) prev C_l        -> ddA_r += sum_{l>=r} ddAcs_prev_l (+ ddA_chunk at the last l)
//   cs_last - cs_s in states[c]       -> ddA_r += sum_{s<r} u_s,  u_s = dt_s exp(cs_last - cs_s) x_s.(dstates B_s)
//   cs_l - cs_s in the intra term     -> ddA_r += sum_{l>=r} sum_{s<r} dCB[l,s] CB[l,s]
// then ddt = ddA A + ddt(direct), dA = sum ddA dt, dA_log = dA A.

static int64_t bwd_ws_floats(const ssd_shape_t *s) {
    int64_t PN = (int64_t)s->P * s->N, L = s->L;
    return s->T + s->nc * PN + (s->nc + 1) * PN + s->nc * PN + PN + s->nc + 2 * L * L + 3 * L + 2 * s->P + s->N;
}

// One (b, h). dy rows at dy + t * ldy; dx, dB, dC are this head's own rows
// (stride lddx, lddb, lddc; summed over the heads of a group by the caller);
// ddt at ddt[t * H]; *dA (gradient of A) and *dD are this head's totals.
static void head_bwd(const ssd_shape_t *s, const ssd_head_t *v, const float *dy, int64_t ldy, const float *dstate_final,
                     const float *state0, float *dx, int64_t lddx, float *dB, int64_t lddb, float *dC, int64_t lddc,
                     float *ddt, float *dA, float *dD, float *dstate0, float *ws) {
    int P = s->P, N = s->N, L = s->L, H = s->H;
    int64_t PN = (int64_t)P * N;
    float *cs = ws, *states = cs + s->T, *prev = states + s->nc * PN, *dstates = prev + (s->nc + 1) * PN;
    float *G = dstates + s->nc * PN, *ddA_chunk = G + PN, *CB = ddA_chunk + s->nc, *dCB = CB + (int64_t)L * L;
    float *ddA = dCB + (int64_t)L * L, *ddAcs_prev = ddA + L, *u = ddAcs_prev + L, *acc = u + L, *accS = acc + P;
    float *dyprev = accS + P;

    // R1: recompute cumsums, chunk states and the states entering each chunk
    head_states(s, v, state0, cs, states, prev);

    // R3 + R4: state-passing backward, last chunk first
    if (dstate_final)
        memcpy(G, dstate_final, (size_t)PN * sizeof(float));
    else
        memset(G, 0, (size_t)PN * sizeof(float));
    for (int c = s->nc - 1; c >= 0; c--) {
        int t0 = c * L, t1 = chunk_end(s, c);
        float decay = expf(cs[t1 - 1]);
        const float *pv = prev + c * PN;
        memcpy(dstates + c * PN, G, (size_t)PN * sizeof(float));
        float pg = 0;
        for (int64_t i = 0; i < PN; i++)
            pg += pv[i] * G[i];
        ddA_chunk[c] = decay * pg;
        for (int64_t i = 0; i < PN; i++)
            G[i] *= decay;
        for (int t = t0; t < t1; t++) { // dprev: sum_l exp(cs_l) dy_l C_l^T
            float e = expf(cs[t]);
            const float *dyt = dy + t * ldy, *ct = c_at(s, v, t);
            for (int p = 0; p < P; p++) {
                float a = e * dyt[p], *row = G + (int64_t)p * N;
                for (int n = 0; n < N; n++)
                    row[n] += a * ct[n];
            }
        }
    }
    if (dstate0) memcpy(dstate0, G, (size_t)PN * sizeof(float));

    float dA_h = 0, dD_h = 0;
    for (int c = 0; c < s->nc; c++) { // independent chunks (parallel on a GPU)
        int t0 = c * L, len = chunk_end(s, c) - t0;
        float cs_last = cs[t0 + len - 1];
        const float *pv = prev + c * PN, *ds = dstates + c * PN;

        // CB (S4 again) and dCB, lower triangles
        for (int l = 0; l < len; l++) {
            const float *cl = c_at(s, v, t0 + l), *dyl = dy + (t0 + l) * ldy;
            for (int j = 0; j <= l; j++) {
                int ts = t0 + j;
                CB[l * L + j] = dot(cl, b_at(s, v, ts), N);
                dCB[l * L + j] = dt_at(s, v, ts) * expf(cs[t0 + l] - cs[ts]) * dot(dyl, x_at(s, v, ts), P);
            }
        }

        // Source positions: dx, direct ddt, dB, dD, u
        for (int j = 0; j < len; j++) {
            int t = t0 + j;
            float e = expf(cs_last - cs[t]), dts = dt_at(s, v, t);
            const float *xs = x_at(s, v, t), *bs = b_at(s, v, t), *dys = dy + t * ldy;
            for (int p = 0; p < P; p++)
                acc[p] = accS[p] = e * dot(ds + (int64_t)p * N, bs, N);
            for (int l = j; l < len; l++) {
                float w = CB[l * L + j] * expf(cs[t0 + l] - cs[t]);
                const float *dyl = dy + (t0 + l) * ldy;
                for (int p = 0; p < P; p++)
                    acc[p] += w * dyl[p];
            }
            float *dxs = dx + t * lddx;
            for (int p = 0; p < P; p++)
                dxs[p] = dts * acc[p] + v->D * dys[p];
            ddt[(int64_t)t * H] = dot(acc, xs, P); // ddA * A added below
            u[j] = dts * dot(accS, xs, P);
            dD_h += dot(dys, xs, P);
            float *dbs = dB + t * lddb;
            for (int n = 0; n < N; n++) {
                float a = 0;
                for (int p = 0; p < P; p++)
                    a += xs[p] * ds[(int64_t)p * N + n];
                dbs[n] = dts * e * a;
            }
            for (int l = j; l < len; l++) {
                float w = dCB[l * L + j];
                const float *cl = c_at(s, v, t0 + l);
                for (int n = 0; n < N; n++)
                    dbs[n] += w * cl[n];
            }
        }

        // Target positions: dC and the gradient of cs_l through exp(cs_l) prev C_l
        for (int l = 0; l < len; l++) {
            int t = t0 + l;
            float e = expf(cs[t]);
            const float *dyl = dy + t * ldy, *cl = c_at(s, v, t);
            for (int n = 0; n < N; n++) {
                float a = 0;
                for (int p = 0; p < P; p++)
                    a += dyl[p] * pv[(int64_t)p * N + n];
                dyprev[n] = a;
            }
            ddAcs_prev[l] = e * dot(dyprev, cl, N);
            float *dcl = dC + t * lddc;
            for (int n = 0; n < N; n++)
                dcl[n] = e * dyprev[n];
            for (int j = 0; j <= l; j++) {
                float w = dCB[l * L + j];
                const float *bs = b_at(s, v, t0 + j);
                for (int n = 0; n < N; n++)
                    dcl[n] += w * bs[n];
            }
        }

        // Decay gradients (stable form, see above)
        ddAcs_prev[len - 1] += ddA_chunk[c];
        float run = 0;
        for (int r = len - 1; r >= 0; r--)
            ddA[r] = run += ddAcs_prev[r];
        run = 0;
        for (int r = 0; r < len; r++) { // exclusive prefix sum of u
            ddA[r] += run;
            run += u[r];
        }
        for (int l = 1; l < len; l++) { // row cumsums of the intra-chunk terms
            float row = 0;
            for (int r = 1; r <= l; r++) {
                row += dCB[l * L + r - 1] * CB[l * L + r - 1];
                ddA[r] += row;
            }
        }
        for (int r = 0; r < len; r++) {
            int t = t0 + r;
            ddt[(int64_t)t * H] += ddA[r] * v->A;
            dA_h += ddA[r] * dt_at(s, v, t);
        }
    }
    *dA = dA_h;
    *dD = dD_h;
}

// Sums the per-head gradient rows src [B*T, H, w] over the heads that read each
// of the G groups into dst (row stride ld, G*w columns, overwritten).
static void sum_groups(float *dst, int64_t ld, const float *src, int64_t rows, int H, int G, int w) {
    int rep = H / G;
#pragma omp parallel for schedule(static) if (rows * H * w > CPU_PAR_MIN)
    for (int64_t r = 0; r < rows; r++)
        for (int g = 0; g < G; g++) {
            float *o = dst + r * ld + (int64_t)g * w;
            const float *in = src + (r * H + (int64_t)g * rep) * w;
            memcpy(o, in, (size_t)w * sizeof(float));
            for (int k = 1; k < rep; k++)
                for (int i = 0; i < w; i++)
                    o[i] += in[(int64_t)k * w + i];
        }
}

static void cpu_ssd_chunk_bwd(be_t *be, void *dx_, void *dB_, void *dC_, float *ddt, float *dA_log, float *dD,
                              float *dstate0, const void *dy_, const float *dstate_final, const void *x, int64_t ldx,
                              const void *Bm, int64_t ldb, const void *Cm, int64_t ldc, const float *dt,
                              const void *A_log_, const void *D, const float *state0, int B, int T, int H, int Hx,
                              int GB, int GC, int P, int N, int chunk) {
    const float *dy = dy_, *A_log = A_log_;
    ssd_shape_t s = make_shape(B, T, H, Hx, GB, GC, P, N, chunk, ldx, ldb, ldc);
    int64_t PN = (int64_t)P * N, rows = (int64_t)B * T;
    if (T == 0) { // the initial state is the final one
        if (dstate0) {
            if (dstate_final)
                memcpy(dstate0, dstate_final, (size_t)B * H * PN * sizeof(float));
            else
                memset(dstate0, 0, (size_t)B * H * PN * sizeof(float));
        }
        return;
    }
    // A tensor read by several heads (GQA) gets per-head gradient rows first,
    // summed over each group afterwards: heads sharing a group never write the
    // same memory (no race, deterministic). One read by one head is written in place.
    int share_x = Hx < H, share_b = GB < H, share_c = GC < H;
    int nthr = omp_get_max_threads();
    int64_t ws_n = bwd_ws_floats(&s);
    int64_t nx = share_x ? rows * H * P : 0, nb = share_b ? rows * H * N : 0, ncg = share_c ? rows * H * N : 0;
    cpu_tmp_t tmp;
    float *dxh = cpu_tmp_take(be, &tmp, nx + nb + ncg + 2 * (int64_t)B * H + nthr * ws_n, "ssd chunk backward");
    if (!dxh) {
        cpu_fill_nan_rows((float *)dx_, ldx, rows, (int64_t)Hx * P);
        cpu_fill_nan_rows((float *)dB_, ldb, rows, (int64_t)GB * N);
        cpu_fill_nan_rows((float *)dC_, ldc, rows, (int64_t)GC * N);
        cpu_fill_nan(ddt, rows * H), cpu_fill_nan(dA_log, H), cpu_fill_nan(dD, H);
        cpu_fill_nan(dstate0, (int64_t)B * H * PN);
        return;
    }
    float *dBh = dxh + nx, *dCh = dBh + nb, *pdA = dCh + ncg, *pdD = pdA + (int64_t)B * H, *ws = pdD + (int64_t)B * H;
    float *dx = dx_, *dBo = dB_, *dCo = dC_;
#pragma omp parallel num_threads(nthr)
    {
        float *w = ws + omp_get_thread_num() * ws_n;
#pragma omp for collapse(2) schedule(dynamic)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++) {
                ssd_head_t v = head_view(&s, b, h, x, Bm, Cm, dt, A_log, D);
                int64_t bh = (int64_t)b * H + h, r0 = (int64_t)b * T * H + h, row0 = (int64_t)b * T;
                // this head's gradient rows: per-head buffer (shared) or the output itself
                float *gx = share_x ? dxh + r0 * P : dx + row0 * ldx + (int64_t)h * P;
                float *gb = share_b ? dBh + r0 * N : dBo + row0 * ldb + (int64_t)h * N;
                float *gc = share_c ? dCh + r0 * N : dCo + row0 * ldc + (int64_t)h * N;
                head_bwd(&s, &v, dy + r0 * P, (int64_t)H * P, dstate_final ? dstate_final + bh * PN : NULL,
                         state0 ? state0 + bh * PN : NULL, gx, share_x ? (int64_t)H * P : ldx, gb,
                         share_b ? (int64_t)H * N : ldb, gc, share_c ? (int64_t)H * N : ldc, ddt + r0, &pdA[bh],
                         &pdD[bh], dstate0 ? dstate0 + bh * PN : NULL, w);
            }
    }
    if (share_x) sum_groups(dx, ldx, dxh, rows, H, Hx, P);
    if (share_b) sum_groups(dBo, ldb, dBh, rows, H, GB, N);
    if (share_c) sum_groups(dCo, ldc, dCh, rows, H, GC, N);
    for (int h = 0; h < H; h++) { // over sequences in a fixed order
        float a = 0, d = 0;
        for (int b = 0; b < B; b++)
            a += pdA[(int64_t)b * H + h], d += pdD[(int64_t)b * H + h];
        dA_log[h] += a * -expf(A_log[h]); // dA/dA_log = A
        dD[h] += d;
    }
    cpu_tmp_give(be, &tmp);
}

// ---- recurrence: decode steps and the oracle ----------------------------------

// Sequence b, head h over its T tokens; S its state [P, N], updated in place.
static void recurrent_head(const ssd_shape_t *s, int b, int h, float *S, float *y, const float *x, const float *Bm,
                           const float *Cm, const float *dt, const float *A_log, const float *D) {
    int T = s->T, H = s->H, P = s->P, N = s->N;
    ssd_head_t v = head_view(s, b, h, x, Bm, Cm, dt, A_log, D);
    for (int t = 0; t < T; t++) {
        float dtt = dt_at(s, &v, t), a = expf(dtt * v.A);
        const float *xt = x_at(s, &v, t), *bt = b_at(s, &v, t), *ct = c_at(s, &v, t);
        float *yt = y + (((int64_t)b * T + t) * H + h) * P;
        for (int p = 0; p < P; p++) {
            float wx = dtt * xt[p], *row = S + (int64_t)p * N, o = 0;
            for (int n = 0; n < N; n++) {
                row[n] = a * row[n] + wx * bt[n];
                o += row[n] * ct[n];
            }
            yt[p] = o + v.D * xt[p];
        }
    }
}

static void cpu_ssd_recurrent_fwd(be_t *be, void *y_, float *state, const void *x, int64_t ldx, const void *Bm,
                                  int64_t ldb, const void *Cm, int64_t ldc, const float *dt, const void *A_log,
                                  const void *D, int B, int T, int H, int Hx, int GB, int GC, int P, int N) {
    float *y = y_;
    ssd_shape_t s = make_shape(B, T, H, Hx, GB, GC, P, N, 1, ldx, ldb, ldc);
    int64_t PN = (int64_t)P * N;
#pragma omp parallel for collapse(2) schedule(static) if ((int64_t)B * T * H * PN > CPU_PAR_MIN)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            recurrent_head(&s, b, h, state + ((int64_t)b * H + h) * PN, y, x, Bm, Cm, dt, A_log, D);
}

// One token per row, each row's state at its own address: row r is sequence
// r of a step of B = N sequences of T = 1, through the same recurrent_head.
static void cpu_ssd_recurrent_step(be_t *be, void *y, void *const *rows, const void *x, int64_t ldx, const void *Bm,
                                   int64_t ldb, const void *Cm, int64_t ldc, const float *dt, const void *A_log,
                                   const void *D, int N, int H, int Hx, int GB, int GC, int P, int Ns) {
    ssd_shape_t s = make_shape(N, 1, H, Hx, GB, GC, P, Ns, 1, ldx, ldb, ldc);
    int64_t PN = (int64_t)P * Ns;
#pragma omp parallel for collapse(2) schedule(static) if ((int64_t)N * H * PN > CPU_PAR_MIN)
    for (int r = 0; r < N; r++)
        for (int h = 0; h < H; h++)
            recurrent_head(&s, r, h, (float *)rows[r] + h * PN, y, x, Bm, Cm, dt, A_log, D);
}

// Naive backward through time (the test oracle). Serial and in double, with
// every state S_0..S_T of a (b, h) recomputed and kept: slow, but each line is
// the chain rule of one line of the recurrence.
int cpu_ssd_recurrent_bwd(float *dx, float *dB, float *dC, float *ddt, float *dA_log, float *dD, float *dstate0,
                          const float *dy, const float *dstate_final, const float *x, int64_t ldx, const float *Bm,
                          int64_t ldb, const float *Cm, int64_t ldc, const float *dt, const float *A_log,
                          const float *D, const float *state0, int B, int T, int H, int Hx, int GB, int GC, int P,
                          int N) {
    ssd_shape_t s = make_shape(B, T, H, Hx, GB, GC, P, N, 1, ldx, ldb, ldc);
    int64_t PN = (int64_t)P * N;
    for (int64_t r = 0; r < (int64_t)B * T; r++) { // the shared-group gradients accumulate below
        memset(dx + r * ldx, 0, (size_t)Hx * P * sizeof(float));
        memset(dB + r * ldb, 0, (size_t)GB * N * sizeof(float));
        memset(dC + r * ldc, 0, (size_t)GC * N * sizeof(float));
    }
    double *S = malloc((size_t)(T + 1) * PN * sizeof(double)), *G = malloc((size_t)PN * sizeof(double));
    if (!S || !G) {
        free(S), free(G);
        return err_set(ERR_NOMEM, "ssd recurrent bwd: out of memory (T %d, P %d, N %d)", T, P, N);
    }
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            ssd_head_t v = head_view(&s, b, h, x, Bm, Cm, dt, A_log, D);
            int64_t bh = (int64_t)b * H + h, off_x = (int64_t)(h / (H / Hx)) * P;
            int64_t off_b = (int64_t)(h / (H / GB)) * N, off_c = (int64_t)(h / (H / GC)) * N;
            double A = v.A;
            // forward, keeping S_t at S + t*PN (S_0 = the initial state)
            for (int64_t i = 0; i < PN; i++)
                S[i] = state0 ? state0[bh * PN + i] : 0.0;
            for (int t = 0; t < T; t++) {
                double dtt = dt_at(&s, &v, t), a = exp(dtt * A);
                const float *xt = x_at(&s, &v, t), *bt = b_at(&s, &v, t);
                for (int p = 0; p < P; p++)
                    for (int n = 0; n < N; n++)
                        S[(t + 1) * PN + p * N + n] = a * S[t * PN + p * N + n] + dtt * xt[p] * bt[n];
            }
            // backward: G = d loss / d S_t, starting from the final state's gradient
            for (int64_t i = 0; i < PN; i++)
                G[i] = dstate_final ? dstate_final[bh * PN + i] : 0.0;
            double dA = 0, dDh = 0;
            for (int t = T - 1; t >= 0; t--) {
                int64_t row = (int64_t)b * T + t;
                double dtt = dt_at(&s, &v, t), a = exp(dtt * A);
                const float *xt = x_at(&s, &v, t), *bt = b_at(&s, &v, t), *ct = c_at(&s, &v, t);
                const float *dyt = dy + (row * H + h) * P;
                const double *St = S + (t + 1) * PN, *Sp = S + t * PN;
                float *dxt = dx + row * ldx + off_x, *dbt = dB + row * ldb + off_b, *dct = dC + row * ldc + off_c;
                // y_t = S_t C_t + D x_t
                for (int n = 0; n < N; n++) {
                    double g = 0;
                    for (int p = 0; p < P; p++)
                        g += dyt[p] * St[p * N + n];
                    dct[n] += (float)g;
                }
                for (int p = 0; p < P; p++) {
                    for (int n = 0; n < N; n++)
                        G[p * N + n] += (double)dyt[p] * ct[n];
                    dxt[p] += (float)(v.D * dyt[p]);
                    dDh += (double)dyt[p] * xt[p];
                }
                // S_t = a S_{t-1} + dt x_t B_t^T, a = exp(dt A)
                double da = 0, ddt_in = 0;
                for (int p = 0; p < P; p++) {
                    double gb = 0;
                    for (int n = 0; n < N; n++) {
                        da += G[p * N + n] * Sp[p * N + n];
                        gb += G[p * N + n] * bt[n];
                    }
                    dxt[p] += (float)(dtt * gb);
                    ddt_in += gb * xt[p];
                }
                for (int n = 0; n < N; n++) {
                    double gx = 0;
                    for (int p = 0; p < P; p++)
                        gx += G[p * N + n] * xt[p];
                    dbt[n] += (float)(dtt * gx);
                }
                ddt[row * H + h] = (float)(ddt_in + da * a * A);
                dA += da * a * dtt;
                for (int64_t i = 0; i < PN; i++)
                    G[i] *= a;
            }
            if (dstate0)
                for (int64_t i = 0; i < PN; i++)
                    dstate0[bh * PN + i] = (float)G[i];
            dA_log[h] += (float)(dA * A);
            dD[h] += (float)dDh;
        }
    free(S);
    free(G);
    return 0;
}

// Each packed sequence in turn, from its own state.
static void cpu_ssd_chunk_seqs(be_t *be, void *y_, void *const *state, const void *x_, int64_t ldx, const void *Bm_,
                               int64_t ldb, const void *Cm_, int64_t ldc, const float *dt, const void *A_log,
                               const void *D, be_seqs_t sq, int H, int Hx, int GB, int GC, int P, int N, int chunk) {
    float *y = y_;
    const float *x = x_, *Bm = Bm_, *Cm = Cm_;
    for (int s = 0; s < sq.n; s++) {
        int64_t r = sq.cu[s];
        int T = sq.cu[s + 1] - sq.cu[s];
        if (T <= 0) continue;
        cpu_ssd_chunk_fwd(be, y + r * H * P, state[s], 1, x + r * ldx, ldx, Bm + r * ldb, ldb, Cm + r * ldc, ldc,
                          dt + r * H, A_log, D, 1, T, H, Hx, GB, GC, P, N, chunk);
    }
}

void cpu_register_ssd(be_t *be) {
    be->softplus_bias_fwd = cpu_softplus_bias_fwd;
    be->softplus_bias_bwd = cpu_softplus_bias_bwd;
    be->ssd_chunk_fwd = cpu_ssd_chunk_fwd;
    be->ssd_chunk_bwd = cpu_ssd_chunk_bwd;
    be->ssd_recurrent_fwd = cpu_ssd_recurrent_fwd;
    be->ssd_recurrent_step = cpu_ssd_recurrent_step;
    be->ssd_chunk_seqs = cpu_ssd_chunk_seqs;
}
