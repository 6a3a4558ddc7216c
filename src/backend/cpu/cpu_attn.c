// Causal attention: one query row at a time (scores over the visible keys,
// softmax, weighted sum), or, for prefill and training (many query rows),
// tiles of query rows whose scores and weighted sums are sgemm products.
// Saves lse for the backward. Also the decode ops over per-sequence caches
// (attn_decode, kv_append).
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "backend/cpu/cpu.h"

// q . k over n values in 8 interleaved partial sums: a single running sum is
// a chain the compiler may not reorder (strict fp32), which left the score
// loop scalar (with the weighted sum below, a quarter of a 256-token prefill).
static inline float dot8(const float *a, const float *b, int n) {
    float acc[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            acc[j] += a[i + j] * b[i + j];
    float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

// o += w v over n values, in groups of 8 for the same reason (GCC's -O2 cost
// model vectorises a fixed group of 8, not a loop of unknown length).
static inline void axpy8(float *restrict o, float w, const float *restrict v, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            o[i + j] += w * v[i + j];
    for (; i < n; i++)
        o[i] += w * v[i];
}

// From this many query rows on, attn_fwd runs by tiles of up to ATTN_TILE rows
// of one head: S = scale Q K^T over the keys the tile's last row sees, the
// softmax of each row's visible part (the rest zeroed), O = S V, all on one
// thread with OpenBLAS's single-threaded sgemm; the threads take tiles.
// Fewer rows (decode, short chunks) take the row loop below, whose order
// attn_decode repeats bit for bit.
#define ATTN_TILE_MIN 32
#define ATTN_TILE 64
#define ATTN_TILE_FLOATS ((int64_t)1 << 22) // scores per thread: 16 MB

static void attn_fwd_tiled(be_t *be, float *out, float *lse, const float *q, const float *k, const float *v, int B,
                           int Tq, int Tk, int H, int Hkv, int dqk, int dv, float scale) {
    int grp = H / Hkv, off = Tk - Tq, nthr = omp_get_max_threads();
    int64_t qt = ATTN_TILE_FLOATS / (Tk > 0 ? Tk : 1);
    if (qt > ATTN_TILE) qt = ATTN_TILE;
    if (qt < 1) qt = 1;
    int64_t n_tiles = (Tq + qt - 1) / qt;
    cpu_tmp_t tmp;
    float *scores = cpu_tmp_take(be, &tmp, (int64_t)nthr * qt * (Tk > 0 ? Tk : 1), "attention forward (tiles)");
    if (!scores) {
        cpu_fill_nan(out, (int64_t)B * Tq * H * dv);
        if (lse) cpu_fill_nan(lse, (int64_t)B * H * Tq);
        return;
    }
    // OpenBLAS (pthreads) would share one thread pool among the callers; each
    // tile's product is small, so each thread runs its own on itself.
    int blas_threads = openblas_get_num_threads();
    openblas_set_num_threads(1);
#pragma omp parallel num_threads(nthr)
    {
        float *S = scores + (int64_t)omp_get_thread_num() * qt * (Tk > 0 ? Tk : 1);
        // the last tiles (the most keys) first
#pragma omp for collapse(2) schedule(dynamic, 1)
        for (int bh = 0; bh < B * H; bh++)
            for (int64_t i = 0; i < n_tiles; i++) {
                int b = bh / H, h = bh % H, hk = h / grp;
                int64_t t0 = (n_tiles - 1 - i) * qt, n = Tq - t0 < qt ? Tq - t0 : qt;
                int64_t kend = off + t0 + n < Tk ? off + t0 + n : Tk;
                const float *qr = q + (((int64_t)b * Tq + t0) * H + h) * dqk;
                const float *kr = k + ((int64_t)b * Tk * Hkv + hk) * dqk;
                const float *vr = v + ((int64_t)b * Tk * Hkv + hk) * dv;
                float *o = out + (((int64_t)b * Tq + t0) * H + h) * dv;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)kend, dqk, scale, qr, H * dqk, kr,
                            Hkv * dqk, 0.0f, S, (int)kend);
                float inv[ATTN_TILE];
                for (int64_t r = 0; r < n; r++) {
                    float *p = S + r * kend;
                    int64_t vis = off + t0 + r + 1; // keys 0 .. off + t
                    float m = -INFINITY;
                    for (int64_t u = 0; u < vis; u++)
                        if (p[u] > m) m = p[u];
                    double sum = cpu_exp_shift(p, vis, m);
                    memset(p + vis, 0, (size_t)(kend - vis) * sizeof(float));
                    inv[r] = (float)(1.0 / sum);
                    if (lse) lse[((int64_t)b * H + h) * Tq + t0 + r] = m + logf((float)sum);
                }
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, dv, (int)kend, 1.0f, S, (int)kend, vr,
                            Hkv * dv, 0.0f, o, H * dv);
                for (int64_t r = 0; r < n; r++)
                    for (int j = 0; j < dv; j++)
                        o[r * H * dv + j] *= inv[r];
            }
    }
    openblas_set_num_threads(blas_threads);
    cpu_tmp_give(be, &tmp);
}

static void cpu_attn_fwd(be_t *be, void *out_, float *lse, const void *q_, const void *k_, const void *v_, int B,
                         int Tq, int Tk, int H, int Hkv, int dqk, int dv, float scale) {
    if (Tq >= ATTN_TILE_MIN) {
        attn_fwd_tiled(be, out_, lse, q_, k_, v_, B, Tq, Tk, H, Hkv, dqk, dv, scale);
        return;
    }
    float *out = out_;
    const float *q = q_, *k = k_, *v = v_;
    int grp = H / Hkv, off = Tk - Tq, nthr = omp_get_max_threads();
    cpu_tmp_t tmp; // one row of scores per thread
    float *scores = cpu_tmp_take(be, &tmp, (int64_t)nthr * (Tk > 0 ? Tk : 1), "attention forward");
    if (!scores) {
        cpu_fill_nan(out, (int64_t)B * Tq * H * dv);
        cpu_fill_nan(lse, (int64_t)B * H * Tq);
        return;
    }
#pragma omp parallel num_threads(nthr) if ((int64_t)B * H * Tq * Tk * (dqk + dv) > CPU_PAR_MIN)
    {
        float *p = scores + (int64_t)omp_get_thread_num() * (Tk > 0 ? Tk : 1);
#pragma omp for collapse(3) schedule(dynamic, 4)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++)
                for (int t = 0; t < Tq; t++) {
                    const float *qr = q + (((int64_t)b * Tq + t) * H + h) * dqk;
                    int hk = h / grp, last = off + t;
                    float m = -INFINITY;
                    for (int u = 0; u <= last; u++) {
                        const float *kr = k + (((int64_t)b * Tk + u) * Hkv + hk) * dqk;
                        p[u] = dot8(qr, kr, dqk) * scale;
                        if (p[u] > m) m = p[u];
                    }
                    double sum = cpu_exp_shift(p, last + 1, m);
                    float *o = out + (((int64_t)b * Tq + t) * H + h) * dv;
                    memset(o, 0, (size_t)dv * sizeof(float));
                    float inv = (float)(1.0 / sum);
                    for (int u = 0; u <= last; u++) {
                        axpy8(o, p[u] * inv, v + (((int64_t)b * Tk + u) * Hkv + hk) * dv, dv);
                    }
                    if (lse) lse[((int64_t)b * H + h) * Tq + t] = m + logf((float)sum);
                }
    }
    cpu_tmp_give(be, &tmp);
}

// With P = softmax(S), S = scale q k^T: dV = P^T dO; dP = dO V^T;
// dS = P (dP - rowsum(dO * O)); dQ = scale dS K; dK = scale dS^T Q.
// Parallel over (b, kv head) so that dK/dV of a KV head are written by one thread.
static void cpu_attn_bwd(be_t *be, void *dq_, void *dk_, void *dv_, const void *dout_, const void *q_, const void *k_,
                         const void *v_, const void *out_, const float *lse, int B, int Tq, int Tk, int H, int Hkv,
                         int dqk, int dv, float scale) {
    float *dq = dq_, *dk = dk_, *dvv = dv_;
    const float *dout = dout_, *q = q_, *k = k_, *v = v_, *out = out_;
    int grp = H / Hkv, off = Tk - Tq;
    memset(dk, 0, (size_t)B * Tk * Hkv * dqk * sizeof(float));
    memset(dvv, 0, (size_t)B * Tk * Hkv * dv * sizeof(float));
#pragma omp parallel for collapse(2) schedule(dynamic, 1) if ((int64_t)B * H * Tq * Tk * (dqk + dv) > CPU_PAR_MIN)
    for (int b = 0; b < B; b++)
        for (int hk = 0; hk < Hkv; hk++)
            for (int h = hk * grp; h < (hk + 1) * grp; h++)
                for (int t = 0; t < Tq; t++) {
                    int64_t qi = ((int64_t)b * Tq + t) * H + h;
                    const float *qr = q + qi * dqk, *g = dout + qi * dv, *o = out + qi * dv;
                    float *dqr = dq + qi * dqk;
                    float L = lse[((int64_t)b * H + h) * Tq + t];
                    float D = 0;
                    for (int i = 0; i < dv; i++)
                        D += g[i] * o[i];
                    memset(dqr, 0, (size_t)dqk * sizeof(float));
                    for (int u = 0; u <= off + t; u++) {
                        int64_t ki = ((int64_t)b * Tk + u) * Hkv + hk;
                        const float *kr = k + ki * dqk, *vr = v + ki * dv;
                        float s = 0, dp = 0;
                        for (int i = 0; i < dqk; i++)
                            s += qr[i] * kr[i];
                        for (int i = 0; i < dv; i++)
                            dp += g[i] * vr[i];
                        float p = expf(s * scale - L);
                        float ds = p * (dp - D) * scale;
                        float *dkr = dk + ki * dqk, *dvr = dvv + ki * dv;
                        for (int i = 0; i < dv; i++)
                            dvr[i] += p * g[i];
                        for (int i = 0; i < dqk; i++) {
                            dqr[i] += ds * kr[i];
                            dkr[i] += ds * qr[i];
                        }
                    }
                }
}

// Decode: one query row per sequence over its own cache (backend.h
// attn_decode). The same arithmetic, in the same order, as cpu_attn_fwd's row
// for a query at the end of a Tk = len[r] cache, so a step through this op has
// the bits of the former per-row attn_fwd calls.
static void cpu_attn_decode(be_t *be, void *out_, const void *q_, void *const *k_rows, void *const *v_rows,
                            const int32_t *len, int max_len, int N, int H, int Hkv, int dqk, int dv, float scale) {
    float *out = out_;
    const float *q = q_;
    int grp = H / Hkv, nthr = omp_get_max_threads(), per = max_len > 0 ? max_len : 1;
    cpu_tmp_t tmp; // one row of scores per thread
    float *scores = cpu_tmp_take(be, &tmp, (int64_t)nthr * per, "attention decode");
    if (!scores) {
        cpu_fill_nan(out, (int64_t)N * H * dv);
        return;
    }
#pragma omp parallel num_threads(nthr) if ((int64_t)N * H * per * (dqk + dv) > CPU_PAR_MIN)
    {
        float *p = scores + (int64_t)omp_get_thread_num() * per;
#pragma omp for collapse(2) schedule(dynamic, 4)
        for (int r = 0; r < N; r++)
            for (int h = 0; h < H; h++) {
                const float *qr = q + ((int64_t)r * H + h) * dqk;
                const float *k = (const float *)k_rows[r] + (int64_t)(h / grp) * dqk;
                const float *v = (const float *)v_rows[r] + (int64_t)(h / grp) * dv;
                int64_t ldk = (int64_t)Hkv * dqk, ldv = (int64_t)Hkv * dv;
                int n = len[r] < per ? len[r] : per; // max_len bounds the scores buffer
                float *o = out + ((int64_t)r * H + h) * dv;
                memset(o, 0, (size_t)dv * sizeof(float));
                if (n <= 0) continue; // nothing cached: a zero output rather than 0/0
                float m = -INFINITY;
                for (int u = 0; u < n; u++) {
                    p[u] = dot8(qr, k + u * ldk, dqk) * scale;
                    if (p[u] > m) m = p[u];
                }
                double sum = cpu_exp_shift(p, n, m);
                float inv = (float)(1.0 / sum);
                for (int u = 0; u < n; u++)
                    axpy8(o, p[u] * inv, v + u * ldv, dv);
            }
    }
    cpu_tmp_give(be, &tmp);
}

// Each row's new K / V (or latent / rope key) at its own position of its own
// cache (backend.h kv_append): plain copies.
static void cpu_kv_append(be_t *be, void *const *k_rows, void *const *v_rows, int64_t ld, int64_t v_off,
                          const int32_t *pos, const void *k_, int kw, const void *v_, int vw, int N) {
    const float *k = k_, *v = v_;
    for (int r = 0; r < N; r++) {
        memcpy((float *)k_rows[r] + pos[r] * ld, k + (int64_t)r * kw, (size_t)kw * sizeof(float));
        memcpy((float *)v_rows[r] + pos[r] * ld + v_off, v + (int64_t)r * vw, (size_t)vw * sizeof(float));
    }
}

void cpu_register_attn(be_t *be) {
    be->attn_fwd = cpu_attn_fwd;
    be->attn_bwd = cpu_attn_bwd;
    be->attn_decode = cpu_attn_decode;
    be->kv_append = cpu_kv_append;
}
