// Depthwise causal conv1d (+ optional SiLU) with an optional state holding the
// inputs that precede the sequence: GDN's short convs and Mamba-2's conv1d.
// y_t[c] = bias[c] + sum_i w[c,i] x_{t-W+1+i}[c]; the last tap multiplies x_t.
#include <string.h>

#include "backend/cpu/cpu.h"

// Input at time t (may be negative: then it comes from the state, or is 0).
static inline float conv_in(const float *x, int64_t ldx, const float *state, int b, int T, int C, int W, int t, int c) {
    if (t >= 0) return x[((int64_t)b * T + t) * ldx + c];
    if (!state) return 0.0f;
    return state[((int64_t)b * C + c) * W + (W + t)]; // t = -1 -> slot W-1 (newest)
}

static void cpu_conv1d_fwd(be_t *be, void *y_, const void *x_, int64_t ldx, const void *w_, const void *bias_,
                           const void *state_, int B, int T, int C, int W, int silu) {
    float *y = y_;
    const float *x = x_, *w = w_, *bias = bias_, *state = state_;
#pragma omp parallel for collapse(2) schedule(static) if ((int64_t)B * T * C * W > CPU_PAR_MIN)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *yr = y + ((int64_t)b * T + t) * C;
            for (int c = 0; c < C; c++) {
                float s = bias ? bias[c] : 0.0f;
                for (int i = 0; i < W; i++)
                    s += w[(int64_t)c * W + i] * conv_in(x, ldx, state, b, T, C, W, t - W + 1 + i, c);
                yr[c] = silu ? cpu_silu(s) : s;
            }
        }
}

static void cpu_conv1d_bwd(be_t *be, void *dx_, int64_t lddx, float *dw, float *dbias, float *dstate, const void *dy_,
                           const void *x_, int64_t ldx, const void *w_, const void *bias_, const void *state_, int B,
                           int T, int C, int W, int silu) {
    float *dx = dx_;
    const float *dy = dy_, *x = x_, *w = w_, *bias = bias_, *state = state_;
    // dp = dy * silu'(p), p the pre-activation, recomputed.
    cpu_tmp_t tmp;
    float *dp = cpu_tmp_take(be, &tmp, (int64_t)B * T * C, "conv1d backward");
    if (!dp) {
        cpu_fill_nan_rows(dx, lddx, (int64_t)B * T, C);
        cpu_fill_nan(dw, (int64_t)C * W), cpu_fill_nan(dbias, C), cpu_fill_nan(dstate, (int64_t)B * C * W);
        return;
    }
#pragma omp parallel for collapse(2) schedule(static) if ((int64_t)B * T * C * W > CPU_PAR_MIN)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++) {
                int64_t o = ((int64_t)b * T + t) * C + c;
                if (!silu) {
                    dp[o] = dy[o];
                    continue;
                }
                float p = bias ? bias[c] : 0.0f;
                for (int i = 0; i < W; i++)
                    p += w[(int64_t)c * W + i] * conv_in(x, ldx, state, b, T, C, W, t - W + 1 + i, c);
                dp[o] = dy[o] * cpu_dsilu(p);
            }
            // dx_s = sum_i w[c,i] dp_{s+W-1-i}
#pragma omp parallel for collapse(2) schedule(static) if ((int64_t)B * T * C * W > CPU_PAR_MIN)
    for (int b = 0; b < B; b++)
        for (int s = 0; s < T; s++)
            for (int c = 0; c < C; c++) {
                float g = 0;
                for (int i = 0; i < W; i++) {
                    int t = s + W - 1 - i;
                    if (t < T) g += w[(int64_t)c * W + i] * dp[((int64_t)b * T + t) * C + c];
                }
                dx[((int64_t)b * T + s) * lddx + c] = g;
            }
            // weights, bias and state: reductions over (b, t), per channel in parallel
#pragma omp parallel for schedule(static) if ((int64_t)B * T * C * W > CPU_PAR_MIN)
    for (int c = 0; c < C; c++) {
        for (int b = 0; b < B; b++) {
            for (int t = 0; t < T; t++) {
                float g = dp[((int64_t)b * T + t) * C + c];
                if (dbias) dbias[c] += g;
                for (int i = 0; i < W; i++)
                    dw[(int64_t)c * W + i] += g * conv_in(x, ldx, state, b, T, C, W, t - W + 1 + i, c);
            }
            if (dstate) { // state slot j holds the input at time j - W
                for (int j = 0; j < W; j++) {
                    float g = 0;
                    for (int i = 0; i < W; i++) {
                        int t = (j - W) + W - 1 - i; // output time that reads input time j - W through tap i
                        if (t >= 0 && t < T) g += w[(int64_t)c * W + i] * dp[((int64_t)b * T + t) * C + c];
                    }
                    dstate[((int64_t)b * C + c) * W + j] = g;
                }
            }
        }
    }
    cpu_tmp_give(be, &tmp);
}

static void cpu_conv1d_update_state(be_t *be, void *state_, const void *x_, int64_t ldx, int B, int T, int C, int W) {
    float *state = state_;
    const float *x = x_;
#pragma omp parallel for collapse(2) schedule(static) if ((int64_t)B * T * C * W > CPU_PAR_MIN)
    for (int b = 0; b < B; b++)
        for (int c = 0; c < C; c++) {
            float *s = state + ((int64_t)b * C + c) * W, tmp[16];
            for (int j = 0; j < W; j++) { // new slot j holds input time T - W + j
                int t = T - W + j;
                tmp[j] = t >= 0 ? x[((int64_t)b * T + t) * ldx + c] : s[W + t];
            }
            memcpy(s, tmp, (size_t)W * sizeof(float));
        }
}

// One token per row, each row's window at its own address: the conv of
// cpu_conv1d_fwd at T = 1 (the same terms in the same order: the window's
// slots 1..W-1, then x), then the roll of cpu_conv1d_update_state.
static void cpu_conv1d_step(be_t *be, void *y_, const void *x_, int64_t ldx, const void *w_, const void *bias_,
                            void *const *rows, int N, int C, int W, int silu) {
    float *y = y_;
    const float *x = x_, *w = w_, *bias = bias_;
#pragma omp parallel for schedule(static) if ((int64_t)N * C * W > CPU_PAR_MIN)
    for (int r = 0; r < N; r++) {
        float *st = rows[r];
        const float *xr = x + (int64_t)r * ldx;
        for (int c = 0; c < C; c++) {
            float *s = st + (int64_t)c * W, xc = xr[c];
            float p = bias ? bias[c] : 0.0f;
            for (int i = 0; i < W - 1; i++)
                p += w[(int64_t)c * W + i] * s[i + 1];
            p += w[(int64_t)c * W + W - 1] * xc;
            y[(int64_t)r * C + c] = silu ? cpu_silu(p) : p;
            for (int j = 0; j + 1 < W; j++)
                s[j] = s[j + 1];
            s[W - 1] = xc;
        }
    }
}

// Each packed sequence in turn: its conv from its own window, then the roll.
static void cpu_conv1d_seqs(be_t *be, void *y_, const void *x_, int64_t ldx, const void *w, const void *bias,
                            void *const *win, be_seqs_t sq, int C, int W, int silu) {
    float *y = y_;
    const float *x = x_;
    for (int s = 0; s < sq.n; s++) {
        int T = sq.cu[s + 1] - sq.cu[s];
        if (T <= 0) continue;
        const float *xs = x + (int64_t)sq.cu[s] * ldx;
        cpu_conv1d_fwd(be, y + (int64_t)sq.cu[s] * C, xs, ldx, w, bias, win[s], 1, T, C, W, silu);
        cpu_conv1d_update_state(be, win[s], xs, ldx, 1, T, C, W);
    }
}

void cpu_register_conv(be_t *be) {
    be->conv1d_fwd = cpu_conv1d_fwd;
    be->conv1d_bwd = cpu_conv1d_bwd;
    be->conv1d_update_state = cpu_conv1d_update_state;
    be->conv1d_step = cpu_conv1d_step;
    be->conv1d_seqs = cpu_conv1d_seqs;
}
