// Depthwise causal conv1d (+ optional SiLU) with an optional state holding the
// inputs that precede the sequence (GDN short convs, Mamba-2 conv1d).
// y_t[c] = bias[c] + sum_i w[c,i] x_{t-W+1+i}[c], the last tap on x_t.
//
// One thread per (sequence b, chunk of L time steps, channel c), channels
// fastest across a warp so every time step is one coalesced row access. Each
// thread slides a window of the last 8 inputs along its chunk in registers:
// the W <= 8 taps are right-aligned in an 8-slot array (wv[8 - W + i] = w[c,i],
// the first 8 - W slots zero), so every loop has a compile-time trip count and
// the arrays stay in registers whatever W is.
#include "backend/cuda/cuda_vec.cuh"

enum { CONV_WMAX = 8, CONV_THREADS = 128, CONV_MIN_CHUNK = 16, CONV_SEQS = 64 };

// Packed sequences (conv1d_seqs), passed by value: sequence s has rows
// [row0[s], row0[s + 1]) of x and y, and its window at win[s] ([C, W]).
typedef struct {
    int32_t row0[CONV_SEQS + 1];
    bf16 *win[CONV_SEQS];
} conv_seqs_t;
static const conv_seqs_t conv_no_seqs = {}; // the uniform launches' unused table

// Sequence b of a launch: its rows of x (xs, ldx apart) and y (ys), its
// length and its window / state slice (NULL: zeros before it). SEQS: from
// the packed table; else the uniform [B, T] layout and state [B, C, W].
template <bool SEQS>
__device__ __forceinline__ int conv_seq(const conv_seqs_t &sq, const bf16 *x, int64_t ldx, bf16 *y, const bf16 *state,
                                        int b, int T, int C, int W, const bf16 **xs, bf16 **ys, const bf16 **st) {
    if constexpr (SEQS) {
        const int64_t r0 = sq.row0[b];
        *xs = x + r0 * ldx, *ys = y ? y + r0 * C : NULL, *st = sq.win[b];
        return sq.row0[b + 1] - sq.row0[b];
    }
    *xs = x + (int64_t)b * T * ldx, *ys = y ? y + (int64_t)b * T * C : NULL;
    *st = state ? state + (int64_t)b * C * W : NULL;
    return T;
}

// Input at time t of one sequence (rows xs, ldx apart; state st [C, W] or
// NULL), channel c: x for t >= 0, else the state's slot W + t (t = -1 is the
// newest, slot W-1) when there is a state, else 0.
__device__ __forceinline__ float conv_in(const bf16 *xs, int64_t ldx, const bf16 *st, int W, int t, int c) {
    if (t >= 0) return __bfloat162float(xs[(int64_t)t * ldx + c]);
    if (st && t >= -(W - 1)) return __bfloat162float(st[(int64_t)c * W + (W + t)]);
    return 0.0f;
}

// Taps (zero-padded on the left) and the window before t0: win[j] = in(t0 - 8 + j)
// for the slots a tap can reach (j >= 9 - W), else 0 (never NaN from memory).
__device__ __forceinline__ void conv_setup(float (&wv)[CONV_WMAX], float (&win)[CONV_WMAX], const bf16 *xs, int64_t ldx,
                                           const bf16 *w, const bf16 *st, int W, int t0, int c) {
    const int off = CONV_WMAX - W;
#pragma unroll
    for (int j = 0; j < CONV_WMAX; j++) {
        wv[j] = j >= off ? __bfloat162float(w[(int64_t)c * W + (j - off)]) : 0.0f;
        win[j] = j >= off + 1 ? conv_in(xs, ldx, st, W, t0 - CONV_WMAX + j, c) : 0.0f;
    }
}

// Block (sequence b, chunk k) x channel tile. SEQS: the packed sequences of
// sq (chunks past a sequence's end do nothing), else B sequences of T.
template <bool SEQS>
__global__ void k_conv_fwd(bf16 *y, const bf16 *x, int64_t ldx, const bf16 *w, const bf16 *bias, const bf16 *state,
                           int B, int T, int C, int W, int silu, int nch, int L,
                           const __grid_constant__ conv_seqs_t sq) {
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int b = blockIdx.x / nch, k = blockIdx.x % nch;
    const bf16 *xs, *st;
    bf16 *ys;
    const int Tb = conv_seq<SEQS>(sq, x, ldx, y, state, b, T, C, W, &xs, &ys, &st);
    const int t0 = k * L, t1 = t0 + L < Tb ? t0 + L : Tb;
    if (t0 >= Tb) return;
    float wv[CONV_WMAX], win[CONV_WMAX];
    conv_setup(wv, win, xs, ldx, w, st, W, t0, c);
    const float bs = bias ? __bfloat162float(bias[c]) : 0.0f;
    for (int t = t0; t < t1; t++) {
#pragma unroll
        for (int j = 0; j < CONV_WMAX - 1; j++)
            win[j] = win[j + 1];
        win[CONV_WMAX - 1] = __bfloat162float(xs[(int64_t)t * ldx + c]);
        float p = bs; // same summation order as the CPU twin (the padded taps add exact zeros first)
#pragma unroll
        for (int j = 0; j < CONV_WMAX; j++)
            p += wv[j] * win[j];
        ys[(int64_t)t * C + c] = __float2bfloat16_rn(silu ? dev_silu(p) : p);
    }
}

// Backward of one slice, sequence b and chunk k = [t0, t1), for channel c:
// writes its dx (and dstate) and returns its dw taps (right-aligned in dwa, as
// wv) and dbias term. dp_t = dy_t silu'(p_t) (p recomputed).
// dp_t feeds dx_s for s = t - 7 + j with weight wv[j]; dxa[j] accumulates
// dx_{t-7+j}, and dx_{t-7} is final once step t is done (its last
// contribution comes from t - 7 + W - 1 <= t). The thread computes dp on
// [t0, t1 + W - 1) so the chunk's last dx are complete, but adds to dw/dbias
// only on [t0, t1) (the next chunk owns the rest). The first chunk also
// writes dstate[j] = dx_{j-W} (state slot j holds input time j - W; slots
// 1..W-1 come out of the loop at s = j - W >= -7, slot 0 is always 0).
__device__ __forceinline__ void conv_bwd_slice(float (&dwa)[CONV_WMAX], float &dba, bf16 *dx, int64_t lddx,
                                               float *dstate, const bf16 *dy, const bf16 *x, int64_t ldx, const bf16 *w,
                                               const bf16 *bias, const bf16 *state, int b, int k, int c, int T, int C,
                                               int W, int silu, int L) {
    const int t0 = k * L, t1 = t0 + L < T ? t0 + L : T;
    const int tend = t1 + W - 1 < T ? t1 + W - 1 : T;
    float wv[CONV_WMAX], win[CONV_WMAX], dxa[CONV_WMAX];
    conv_setup(wv, win, x + (int64_t)b * T * ldx, ldx, w, state ? state + (int64_t)b * C * W : NULL, W, t0, c);
#pragma unroll
    for (int j = 0; j < CONV_WMAX; j++)
        dxa[j] = dwa[j] = 0.0f;
    dba = 0.0f;
    const float bs = bias ? __bfloat162float(bias[c]) : 0.0f;
    // slot 0 (input time -W) reaches no output: only the last W-1 slots are read
    if (dstate && t0 == 0) dstate[((int64_t)b * C + c) * W] = 0.0f;
    for (int t = t0; t < t1 + CONV_WMAX - 1; t++) {
#pragma unroll
        for (int j = 0; j < CONV_WMAX - 1; j++)
            win[j] = win[j + 1];
        float dp = 0.0f;
        if (t < tend) {
            win[CONV_WMAX - 1] = __bfloat162float(x[((int64_t)b * T + t) * ldx + c]);
            float g = __bfloat162float(dy[((int64_t)b * T + t) * C + c]);
            if (silu) {
                float p = bs;
#pragma unroll
                for (int j = 0; j < CONV_WMAX; j++)
                    p += wv[j] * win[j];
                float sg = dev_sigmoid(p);
                dp = g * sg * (1.0f + p * (1.0f - sg));
            } else {
                dp = g;
            }
            if (t < t1) {
                dba += dp;
#pragma unroll
                for (int j = 0; j < CONV_WMAX; j++)
                    dwa[j] += dp * win[j];
            }
        } else {
            win[CONV_WMAX - 1] = 0.0f;
        }
#pragma unroll
        for (int j = 0; j < CONV_WMAX; j++)
            dxa[j] += wv[j] * dp;
        const int s = t - (CONV_WMAX - 1);
        if (s >= t0)
            dx[((int64_t)b * T + s) * lddx + c] = __float2bfloat16_rn(dxa[0]);
        else if (dstate && t0 == 0 && s > -W)
            dstate[((int64_t)b * C + c) * W + (s + W)] = dxa[0];
#pragma unroll
        for (int j = 0; j < CONV_WMAX - 1; j++)
            dxa[j] = dxa[j + 1];
        dxa[CONV_WMAX - 1] = 0.0f;
    }
}

// Slice sl = b*nch + chunk. dw/dbias: SERIAL false (grid.x = slices, one
// slice per block): to part[sl][c][0..W] (W = bias), summed by k_conv_reduce;
// SERIAL true (no scratch): grid.x = 1 and the thread walks the slices in
// order, adding ((0 + s_0) + s_1) + ... into dw/dbias: the additions of
// k_conv_reduce on the same per-slice sums, so both paths give the same bits.
// No atomics. A template, so that the partial path carries no running totals;
// 9 blocks per multiprocessor keep it at the 56 registers it had before (the
// serial fallback spills a few bytes).
template <bool SERIAL>
__global__ void __launch_bounds__(CONV_THREADS, 9)
    k_conv_bwd(bf16 *dx, int64_t lddx, float *part, float *dw, float *dbias, float *dstate, const bf16 *dy,
               const bf16 *x, int64_t ldx, const bf16 *w, const bf16 *bias, const bf16 *state, int B, int T, int C,
               int W, int silu, int nch, int L) {
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int off = CONV_WMAX - W;
    float dwa[CONV_WMAX], dba;
    if constexpr (SERIAL) {
        float totw[CONV_WMAX], totb = 0.0f;
#pragma unroll
        for (int j = 0; j < CONV_WMAX; j++)
            totw[j] = 0.0f;
        for (int b = 0; b < B; b++)
            for (int k = 0; k < nch; k++) { // slice b*nch + k: k_conv_reduce's order
                conv_bwd_slice(dwa, dba, dx, lddx, dstate, dy, x, ldx, w, bias, state, b, k, c, T, C, W, silu, L);
#pragma unroll
                for (int j = 0; j < CONV_WMAX; j++)
                    totw[j] += dwa[j];
                totb += dba;
            }
#pragma unroll
        for (int j = 0; j < CONV_WMAX; j++)
            if (j >= off && dw) dw[(int64_t)c * W + (j - off)] += totw[j];
        if (dbias) dbias[c] += totb;
    } else {
        const int b = blockIdx.x / nch, k = blockIdx.x % nch;
        conv_bwd_slice(dwa, dba, dx, lddx, dstate, dy, x, ldx, w, bias, state, b, k, c, T, C, W, silu, L);
        float *pp = part + ((int64_t)blockIdx.x * C + c) * (W + 1);
#pragma unroll
        for (int j = 0; j < CONV_WMAX; j++)
            if (j >= off) pp[j - off] = dwa[j];
        pp[W] = dba;
    }
}

// Sums the slices' partials in a fixed order: thread per (channel, tap or bias).
__global__ void k_conv_reduce(float *dw, float *dbias, const float *part, int64_t slices, int C, int W) {
    const int64_t n = (int64_t)C * (W + 1);
    GRID_STRIDE(i, n) {
        float s = 0.0f;
        for (int64_t k = 0; k < slices; k++)
            s += part[k * n + i];
        const int64_t c = i / (W + 1);
        const int j = (int)(i - c * (W + 1));
        if (j < W) {
            if (dw) dw[c * W + j] += s;
        } else if (dbias)
            dbias[c] += s;
    }
}

// New slot j holds input time T - W + j: from x, or (short sequences) from
// the old state's slot T + j. All W values are read before any is written.
// SEQS: the packed sequences of sq, their windows (state unused).
template <bool SEQS>
__global__ void k_conv_state(bf16 *state, const bf16 *x, int64_t ldx, int B, int T, int C, int W,
                             const __grid_constant__ conv_seqs_t sq) {
    const int64_t n = (int64_t)B * C;
    GRID_STRIDE(i, n) {
        const int b = (int)(i / C), c = (int)(i - (int64_t)b * C);
        const bf16 *xs, *st;
        bf16 *ys;
        const int Tb = conv_seq<SEQS>(sq, x, ldx, NULL, state, b, T, C, W, &xs, &ys, &st);
        bf16 *s = (bf16 *)st + (int64_t)c * W;
        bf16 tmp[CONV_WMAX];
#pragma unroll
        for (int j = 0; j < CONV_WMAX; j++) {
            const int t = Tb - W + j;
            if (j < W) tmp[j] = t >= 0 ? xs[(int64_t)t * ldx + c] : s[W + t];
        }
#pragma unroll
        for (int j = 0; j < CONV_WMAX; j++)
            if (j < W) s[j] = tmp[j];
    }
}

// One token per row (blockIdx.y), row r's window at rows[r] ([C, W]): the sum
// of k_conv_fwd at T = 1 (the same terms in the same order; its zero-padded
// taps add exact zeros first), then the roll of k_conv_state. One thread per
// channel: it reads its window before writing it.
__global__ void k_conv_step(bf16 *y, const bf16 *x, int64_t ldx, const bf16 *w, const bf16 *bias, bf16 *const *rows,
                            int C, int W, int silu) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y;
    if (c >= C) return;
    bf16 *s = rows[r] + (int64_t)c * W;
    const bf16 xc = x[(int64_t)r * ldx + c];
    float p = bias ? __bfloat162float(bias[c]) : 0.0f;
    for (int i = 0; i + 1 < W; i++)
        p += __bfloat162float(w[(int64_t)c * W + i]) * __bfloat162float(s[i + 1]);
    p += __bfloat162float(w[(int64_t)c * W + W - 1]) * __bfloat162float(xc);
    y[(int64_t)r * C + c] = __float2bfloat16_rn(silu ? dev_silu(p) : p);
    for (int j = 0; j + 1 < W; j++)
        s[j] = s[j + 1];
    s[W - 1] = xc;
}

static int conv_check(be_t *be, const char *what, int W) {
    if (W >= 1 && W <= CONV_WMAX) return 1;
    cu_op_error(be, "cuda %s: conv width W = %d; the CUDA kernels take 1..%d", what, W, CONV_WMAX);
    return 0;
}

// Chunks per sequence: enough (b, chunk, c) threads for about two waves of a
// full chip, chunks of at least CONV_MIN_CHUNK steps (each chunk re-reads up
// to 7 inputs before it and, backward, recomputes W - 1 steps after it).
static void conv_chunks(be_t *be, int B, int T, int C, int *nch, int *L) {
    int64_t want = (2 * (int64_t)cuda_impl(be)->sm_count * 2048 + C - 1) / C; // slices
    int64_t n = (want + B - 1) / B, nmax = (T + CONV_MIN_CHUNK - 1) / CONV_MIN_CHUNK;
    if (n > nmax) n = nmax;
    if (n < 1) n = 1;
    int64_t l = (T + n - 1) / n;
    *L = (int)l;
    *nch = (int)((T + l - 1) / l);
}

static void cu_conv1d_fwd(be_t *be, void *y, const void *x, int64_t ldx, const void *w, const void *bias,
                          const void *state, int B, int T, int C, int W, int silu) {
    if (!conv_check(be, "conv1d_fwd", W) || B <= 0 || T <= 0 || C <= 0) return;
    int nch, L;
    conv_chunks(be, B, T, C, &nch, &L);
    dim3 grid((unsigned)((int64_t)B * nch), (unsigned)((C + CONV_THREADS - 1) / CONV_THREADS));
    k_conv_fwd<false><<<grid, CONV_THREADS, 0, cuda_stream(be)>>>((bf16 *)y, (const bf16 *)x, ldx, (const bf16 *)w,
                                                                  (const bf16 *)bias, (const bf16 *)state, B, T, C, W,
                                                                  silu, nch, L, conv_no_seqs);
    cuda_check_launch(be, "conv1d_fwd");
}

static void cu_conv1d_bwd(be_t *be, void *dx, int64_t lddx, float *dw, float *dbias, float *dstate, const void *dy,
                          const void *x, int64_t ldx, const void *w, const void *bias, const void *state, int B, int T,
                          int C, int W, int silu) {
    if (!conv_check(be, "conv1d_bwd", W) || B <= 0 || C <= 0) return;
    if (T <= 0) { // nothing reads the state: its gradient is zero
        if (dstate) {
            cudaError_t e = cudaMemsetAsync(dstate, 0, (size_t)B * C * W * sizeof(float), cuda_stream(be));
            if (e != cudaSuccess) cuda_fail(be, "conv1d_bwd: cudaMemsetAsync(dstate)", e);
        }
        return;
    }
    int nch, L;
    conv_chunks(be, B, T, C, &nch, &L);
    int64_t slices = (int64_t)B * nch;
    size_t mark = arena_mark(&be->scratch);
    // no scratch: one block column walks all slices (slow, but the same sums; see k_conv_bwd)
    float *part = (float *)cu_scratch_try(be, (size_t)slices * C * (W + 1) * sizeof(float));
    dim3 grid(part ? (unsigned)slices : 1u, (unsigned)((C + CONV_THREADS - 1) / CONV_THREADS));
    (part ? k_conv_bwd<false> : k_conv_bwd<true>)<<<grid, CONV_THREADS, 0, cuda_stream(be)>>>(
        (bf16 *)dx, lddx, part, dw, dbias, dstate, (const bf16 *)dy, (const bf16 *)x, ldx, (const bf16 *)w,
        (const bf16 *)bias, (const bf16 *)state, B, T, C, W, silu, nch, L);
    cuda_check_launch(be, "conv1d_bwd");
    if (part) {
        k_conv_reduce<<<cu_grid(be, (int64_t)C * (W + 1), 256), 256, 0, cuda_stream(be)>>>(dw, dbias, part, slices, C,
                                                                                           W);
        cuda_check_launch(be, "conv1d_bwd (reduce)");
    }
    arena_reset(&be->scratch, mark);
}

static void cu_conv1d_update_state(be_t *be, void *state, const void *x, int64_t ldx, int B, int T, int C, int W) {
    if (!conv_check(be, "conv1d_update_state", W) || B <= 0 || C <= 0 || T <= 0) return;
    int64_t n = (int64_t)B * C;
    k_conv_state<false><<<cu_grid(be, n, 256), 256, 0, cuda_stream(be)>>>((bf16 *)state, (const bf16 *)x, ldx, B, T, C,
                                                                          W, conv_no_seqs);
    cuda_check_launch(be, "conv1d_update_state");
}

// Up to CONV_SEQS sequences per pair of launches (the table rides in the
// kernel parameters): the convs of every sequence, then every window rolled.
static void cu_conv1d_seqs(be_t *be, void *y, const void *x, int64_t ldx, const void *w, const void *bias,
                           void *const *win, be_seqs_t sq, int C, int W, int silu) {
    if (!conv_check(be, "conv1d_seqs", W) || C <= 0) return;
    for (int s0 = 0; s0 < sq.n; s0 += CONV_SEQS) {
        const int nb = sq.n - s0 < CONV_SEQS ? sq.n - s0 : CONV_SEQS;
        conv_seqs_t t;
        memset(&t, 0, sizeof t);
        int max_T = 0;
        for (int i = 0; i <= nb; i++)
            t.row0[i] = sq.cu[s0 + i];
        for (int i = 0; i < nb; i++) {
            t.win[i] = (bf16 *)win[s0 + i];
            if (t.row0[i + 1] - t.row0[i] > max_T) max_T = t.row0[i + 1] - t.row0[i];
        }
        if (max_T <= 0) continue;
        int nch, L;
        conv_chunks(be, nb, max_T, C, &nch, &L);
        dim3 grid((unsigned)((int64_t)nb * nch), (unsigned)((C + CONV_THREADS - 1) / CONV_THREADS));
        k_conv_fwd<true><<<grid, CONV_THREADS, 0, cuda_stream(be)>>>(
            (bf16 *)y, (const bf16 *)x, ldx, (const bf16 *)w, (const bf16 *)bias, NULL, nb, 0, C, W, silu, nch, L, t);
        cuda_check_launch(be, "conv1d_seqs");
        const int64_t n = (int64_t)nb * C;
        k_conv_state<true>
            <<<cu_grid(be, n, 256), 256, 0, cuda_stream(be)>>>(NULL, (const bf16 *)x, ldx, nb, 0, C, W, t);
        cuda_check_launch(be, "conv1d_seqs (windows)");
    }
}

static void cu_conv1d_step(be_t *be, void *y, const void *x, int64_t ldx, const void *w, const void *bias,
                           void *const *rows, int N, int C, int W, int silu) {
    if (!conv_check(be, "conv1d_step", W) || N <= 0 || C <= 0) return;
    if (N > 65535) {
        cu_op_error(be, "cuda conv1d_step: %d rows; the kernel takes at most 65535", N);
        return;
    }
    dim3 grid((unsigned)((C + CONV_THREADS - 1) / CONV_THREADS), (unsigned)N);
    k_conv_step<<<grid, CONV_THREADS, 0, cuda_stream(be)>>>((bf16 *)y, (const bf16 *)x, ldx, (const bf16 *)w,
                                                            (const bf16 *)bias, (bf16 *const *)rows, C, W, silu);
    cuda_check_launch(be, "conv1d_step");
}

extern "C" void cuda_register_conv(be_t *be) {
    be->conv1d_fwd = cu_conv1d_fwd;
    be->conv1d_bwd = cu_conv1d_bwd;
    be->conv1d_update_state = cu_conv1d_update_state;
    be->conv1d_step = cu_conv1d_step;
    be->conv1d_seqs = cu_conv1d_seqs;
}
