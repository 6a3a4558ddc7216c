// Attention (bottom-right causal, or every key visible): one query row at a
// time (scores over the visible keys, softmax, weighted sum), or, for prefill
// and training (many query rows), tiles of query rows that share the keys and
// values they read, with the same arithmetic per row. Saves lse for the
// backward, and merges two attentions by their lse (attn_merge). Also the
// decode ops over per-sequence caches (attn_decode, kv_append).
#include <math.h>
#include <omp.h>
#include <string.h>

#include "backend/cpu/cpu.h"

// q . k over n values in 8 interleaved partial sums: a single running sum is
// a chain the compiler may not reorder (strict fp32), which left the score
// loop scalar. Every score of every path is this sum, in this order.
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

// From this many query rows on, attn_fwd runs by tiles of up to ATTN_TILE
// query rows of one head: the tile's rows share each block of 8 keys (read
// once, transposed, while it is in L1) and each value row, instead of every
// query row streaming the whole cache. Each score and weighted sum is the
// row loop's arithmetic in the same order (dot8's partial sums and their
// tree, weighted_sum key by key), so a row has the same bits whichever path
// ran it: a prompt prefilled whole and the same prompt restored from a
// prefix and finished by a decode step (attn_decode) agree bit for bit.
#define ATTN_TILE_MIN 32
#define ATTN_TILE 64
#define ATTN_TILE_FLOATS ((int64_t)1 << 22) // scores per thread: 16 MB

// 8 floats as one value (GCC / clang vector extension): element-wise + and *
// round as the scalar operations do, so the tiles keep the row loop's bits
// while the accumulators stay in registers.
typedef float v8f __attribute__((vector_size(32)));
static inline v8f ld8(const float *p) {
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void st8(float *p, v8f v) { memcpy(p, &v, sizeof v); }

// s[u] = dot8(q, key u) for the 8 keys of kt ([dqk][8], transposed): the
// same partial sums (element i into sum i % 8), tree and tail as dot8, with
// the 8 keys in the vector lanes.
static inline void dot8_keys8(const float *q, const float *kt, int n, float *s) {
    v8f acc[8] = {{0}}; // [partial sum], lanes: keys
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            acc[j] += q[i + j] * ld8(kt + (i + j) * 8);
    v8f t = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < n; i++)
        t += q[i] * ld8(kt + i * 8);
    st8(s, t);
}

// s[k] = dot8(q, k0 + k ldk) for 4 keys at once: dot8's arithmetic (lane j
// of a vector holds partial sum j), four independent chains instead of one.
static inline void dot8_keys4(const float *q, const float *k0, int64_t ldk, int n, float *s) {
    v8f a[4] = {{0}};
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        v8f x = ld8(q + i);
        for (int k = 0; k < 4; k++)
            a[k] += x * ld8(k0 + k * ldk + i);
    }
    for (int k = 0; k < 4; k++) {
        float t = ((a[k][0] + a[k][4]) + (a[k][1] + a[k][5])) + ((a[k][2] + a[k][6]) + (a[k][3] + a[k][7]));
        for (int r = i; r < n; r++)
            t += q[r] * k0[k * ldk + r];
        s[k] = t;
    }
}

// One row's softmax over its n scores p (dot products, scaled here by
// scale), as the row loop computes it; p becomes the weights p[u] * inv.
// Returns the sum of the exponentials, *m their shift (the maximum).
static double softmax_row(float *p, int64_t n, float scale, float *m) {
    // the maximum in 8 independent chains (a maximum is the same in any order)
    float mx[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int64_t u = 0;
    for (; u + 8 <= n; u += 8)
        for (int j = 0; j < 8; j++) {
            p[u + j] *= scale;
            if (p[u + j] > mx[j]) mx[j] = p[u + j];
        }
    for (; u < n; u++) {
        p[u] *= scale;
        if (p[u] > mx[0]) mx[0] = p[u];
    }
    *m = mx[0];
    for (int j = 1; j < 8; j++)
        if (mx[j] > *m) *m = mx[j];
    double sum = cpu_exp_shift(p, n, *m);
    float inv = (float)(1.0 / sum);
    for (u = 0; u < n; u++)
        p[u] *= inv;
    return sum;
}

// o[i] += w[u] v[u ldv + i] for u in [u0, u1), each element's sum taken key by
// key in order, in registers 32 outputs at a time (four independent add
// chains; one accumulator in memory per key was a chain through the stores).
static void weighted_sum(float *o, const float *w, const float *v, int64_t ldv, int64_t u0, int64_t u1, int dv) {
    int i0 = 0;
    for (; i0 + 32 <= dv; i0 += 32) {
        v8f a0 = ld8(o + i0), a1 = ld8(o + i0 + 8), a2 = ld8(o + i0 + 16), a3 = ld8(o + i0 + 24);
        for (int64_t u = u0; u < u1; u++) {
            const float *vu = v + u * ldv + i0;
            a0 += w[u] * ld8(vu), a1 += w[u] * ld8(vu + 8);
            a2 += w[u] * ld8(vu + 16), a3 += w[u] * ld8(vu + 24);
        }
        st8(o + i0, a0), st8(o + i0 + 8, a1), st8(o + i0 + 16, a2), st8(o + i0 + 24, a3);
    }
    for (; i0 + 8 <= dv; i0 += 8) {
        v8f a0 = ld8(o + i0);
        for (int64_t u = u0; u < u1; u++)
            a0 += w[u] * ld8(v + u * ldv + i0);
        st8(o + i0, a0);
    }
    for (int64_t u = u0; u < u1; u++)
        for (int e = i0; e < dv; e++)
            o[e] += w[u] * v[u * ldv + e];
}

// Keys from u on that lie one after another in memory, at most n - u: the
// rest of u's page with page tables (pg of step row r), else all of them.
static int key_run(be_pages_t pg, int u, int n) {
    int left = n - u;
    if (!pg.pages) return left;
    int page_left = BE_PAGE_ROWS - u % BE_PAGE_ROWS;
    return page_left < left ? page_left : left;
}

// One query row qr against n keys (rows of k and v, strides ldk and ldv;
// row u at row be_page_row(pg, r, u) of each): scores 4 keys at a time,
// softmax_row, weighted_sum into o; p holds n scores. Returns the row's
// log-sum-exp. The row loop of attn_fwd and attn_decode are this function.
// A page holds a multiple of 4 keys, and o carries weighted_sum's running
// sums from one page to the next, so paged keys get the bits of contiguous
// ones.
static float attend_row(const float *qr, const float *k, int64_t ldk, const float *v, int64_t ldv, be_pages_t pg,
                        int64_t r, int n, int dqk, int dv, float scale, float *p, float *o) {
    for (int u = 0; u < n;) {
        int cnt = key_run(pg, u, n), i = 0;
        const float *kp = k + be_page_row(pg, r, u) * ldk;
        for (; i + 4 <= cnt; i += 4)
            dot8_keys4(qr, kp + i * ldk, ldk, dqk, p + u + i);
        for (; i < cnt; i++)
            p[u + i] = dot8(qr, kp + i * ldk, dqk);
        u += cnt;
    }
    float m;
    double sum = softmax_row(p, n, scale, &m);
    memset(o, 0, (size_t)dv * sizeof(float));
    for (int u = 0; u < n;) {
        int cnt = key_run(pg, u, n);
        weighted_sum(o, p + u, v + be_page_row(pg, r, u) * ldv, ldv, 0, cnt, dv);
        u += cnt;
    }
    return m + logf((float)sum);
}

// Row r of a tile that starts at query t0 sees keys [0, min(s0 + r + 1, Tk)):
// s0 = off + t0 when causal, Tk (every key) when not.
static void attn_fwd_tiled(be_t *be, float *out, float *lse, const float *q, const float *k, const float *v, int B,
                           int Tq, int Tk, int H, int Hkv, int dqk, int dv, float scale, int causal) {
    int grp = H / Hkv, off = Tk - Tq, nthr = omp_get_max_threads();
    int64_t qt = ATTN_TILE_FLOATS / (Tk + 8);
    if (qt > ATTN_TILE) qt = ATTN_TILE;
    if (qt < 1) qt = 1;
    int64_t n_tiles = (Tq + qt - 1) / qt, per = qt * (Tk + 8) + 8 * (int64_t)dqk; // scores (8 spare), kt
    cpu_tmp_t tmp;
    float *scores = cpu_tmp_take(be, &tmp, (int64_t)nthr * per, "attention forward (tiles)");
    if (!scores) {
        cpu_fill_nan(out, (int64_t)B * Tq * H * dv);
        if (lse) cpu_fill_nan(lse, (int64_t)B * H * Tq);
        return;
    }
#pragma omp parallel num_threads(nthr)
    {
        float *S = scores + (int64_t)omp_get_thread_num() * per, *kt = S + qt * (Tk + 8);
        // the last tiles (the most keys) first
#pragma omp for collapse(2) schedule(dynamic, 1)
        for (int bh = 0; bh < B * H; bh++)
            for (int64_t i = 0; i < n_tiles; i++) {
                int b = bh / H, h = bh % H, hk = h / grp;
                int64_t t0 = (n_tiles - 1 - i) * qt, n = Tq - t0 < qt ? Tq - t0 : qt;
                int64_t s0 = causal ? off + t0 : Tk;
                int64_t kend = s0 + n < Tk ? s0 + n : Tk, ld = kend + 8;
                int64_t ldq = (int64_t)H * dqk, ldk = (int64_t)Hkv * dqk, ldv = (int64_t)Hkv * dv;
                const float *qr = q + (((int64_t)b * Tq + t0) * H + h) * dqk;
                const float *kr = k + ((int64_t)b * Tk * Hkv + hk) * dqk;
                const float *vr = v + ((int64_t)b * Tk * Hkv + hk) * dv;
                float *o = out + (((int64_t)b * Tq + t0) * H + h) * dv;
                // scores, 8 keys at a time (a last partial block reads zeros)
                for (int64_t u0 = 0; u0 < kend; u0 += 8) {
                    int nk = kend - u0 < 8 ? (int)(kend - u0) : 8;
                    for (int d = 0; d < dqk; d++)
                        for (int u = 0; u < 8; u++)
                            kt[d * 8 + u] = u < nk ? kr[(u0 + u) * ldk + d] : 0.0f;
                    for (int64_t r = 0; r < n; r++)
                        if (u0 < s0 + r + 1) dot8_keys8(qr + r * ldq, kt, dqk, S + r * ld + u0);
                }
                for (int64_t r = 0; r < n; r++) {
                    float m;
                    double sum = softmax_row(S + r * ld, s0 + r + 1 < Tk ? s0 + r + 1 : Tk, scale, &m);
                    if (lse) lse[((int64_t)b * H + h) * Tq + t0 + r] = m + logf((float)sum);
                    memset(o + r * H * dv, 0, (size_t)dv * sizeof(float));
                }
                // weighted sums over blocks of 64 keys (in L1), key by key in order
                for (int64_t u0 = 0; u0 < kend; u0 += 64)
                    for (int64_t r = u0 < s0 ? 0 : u0 - s0; r < n; r++) {
                        int64_t ue = s0 + r + 1 < u0 + 64 ? s0 + r + 1 : u0 + 64;
                        weighted_sum(o + r * H * dv, S + r * ld, vr, ldv, u0, ue < kend ? ue : kend, dv);
                    }
            }
    }
    cpu_tmp_give(be, &tmp);
}

static void cpu_attn_fwd(be_t *be, void *out_, float *lse, const void *q_, const void *k_, const void *v_, int B,
                         int Tq, int Tk, int H, int Hkv, int dqk, int dv, float scale, int causal) {
    if (Tk == 0) { // no keys (only without the causal mask): nothing attended
        memset(out_, 0, (size_t)B * Tq * H * dv * sizeof(float));
        if (lse)
            for (int64_t i = 0; i < (int64_t)B * H * Tq; i++)
                lse[i] = -INFINITY;
        return;
    }
    if (Tq >= ATTN_TILE_MIN) {
        attn_fwd_tiled(be, out_, lse, q_, k_, v_, B, Tq, Tk, H, Hkv, dqk, dv, scale, causal);
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
                    int64_t qi = ((int64_t)b * Tq + t) * H + h, kv = (int64_t)b * Tk * Hkv + h / grp;
                    float l =
                        attend_row(q + qi * dqk, k + kv * dqk, (int64_t)Hkv * dqk, v + kv * dv, (int64_t)Hkv * dv,
                                   (be_pages_t){0}, 0, causal ? off + t + 1 : Tk, dqk, dv, scale, p, out + qi * dv);
                    if (lse) lse[((int64_t)b * H + h) * Tq + t] = l;
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
static void cpu_attn_decode(be_t *be, void *out_, const void *q_, int64_t ldq, void *const *k_rows, void *const *v_rows,
                            be_pages_t pg, const int32_t *len, int max_len, int N, int H, int Hkv, int dqk, int dv,
                            float scale) {
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
                const float *qr = q + (int64_t)r * ldq + (int64_t)h * dqk;
                const float *k = (const float *)k_rows[r] + (int64_t)(h / grp) * dqk;
                const float *v = (const float *)v_rows[r] + (int64_t)(h / grp) * dv;
                int64_t ldk = (int64_t)Hkv * dqk, ldv = (int64_t)Hkv * dv;
                int n = len[r] < per ? len[r] : per; // max_len bounds the scores buffer
                float *o = out + ((int64_t)r * H + h) * dv;
                if (n > 0)
                    attend_row(qr, k, ldk, v, ldv, pg, r, n, dqk, dv, scale, p, o);
                else // nothing cached: a zero output rather than 0/0
                    memset(o, 0, (size_t)dv * sizeof(float));
            }
    }
    cpu_tmp_give(be, &tmp);
}

// (acc, lse) += (out_i, lse_i) by the log-sum-exp rule (backend.h attn_merge);
// act is fp32 here, so out is a copy of acc.
static void cpu_attn_merge(be_t *be, float *acc, float *lse, const void *out_i_, const float *lse_i, void *out_,
                           int first, int B, int Tq, int H, int dv) {
    (void)be;
    float *out = out_;
    const float *out_i = out_i_;
#pragma omp parallel for collapse(2) if ((int64_t)B * Tq * H * dv > CPU_PAR_MIN)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < Tq; t++) {
                int64_t li = ((int64_t)b * H + h) * Tq + t, oi = (((int64_t)b * Tq + t) * H + h) * dv;
                float la = first ? -INFINITY : lse[li], lb = lse_i[li], m = la > lb ? la : lb;
                float wa = 0.0f, wb = 0.0f;
                if (m != -INFINITY) { // else neither set has a key: nothing attended
                    // weights relative to the larger lse, so neither exponential overflows
                    wa = expf(la - m), wb = expf(lb - m);
                    float s = wa + wb;
                    lse[li] = m + logf(s);
                    wa /= s, wb /= s;
                } else {
                    lse[li] = -INFINITY;
                }
                for (int i = 0; i < dv; i++) // a side of weight 0 is not read (first, or no keys)
                    acc[oi + i] = (wa > 0.0f ? wa * acc[oi + i] : 0.0f) + (wb > 0.0f ? wb * out_i[oi + i] : 0.0f);
                if (out) memcpy(out + oi, acc + oi, (size_t)dv * sizeof(float));
            }
}

// Each row's new K / V (or latent / rope key) at its own position of its own
// cache (backend.h kv_append): plain copies.
static void cpu_kv_append(be_t *be, void *const *k_rows, void *const *v_rows, be_pages_t pg, int64_t ld, int64_t v_off,
                          const int32_t *pos, const void *k_, int64_t ldk, int kw, const void *v_, int64_t ldv, int vw,
                          int N) {
    const float *k = k_, *v = v_;
    for (int r = 0; r < N; r++) {
        int64_t row = be_page_row(pg, r, pos[r]);
        memcpy((float *)k_rows[r] + row * ld, k + (int64_t)r * ldk, (size_t)kw * sizeof(float));
        memcpy((float *)v_rows[r] + row * ld + v_off, v + (int64_t)r * ldv, (size_t)vw * sizeof(float));
    }
}

void cpu_register_attn(be_t *be) {
    be->attn_fwd = cpu_attn_fwd;
    be->attn_bwd = cpu_attn_bwd;
    be->attn_merge = cpu_attn_merge;
    be->attn_decode = cpu_attn_decode;
    be->kv_append = cpu_kv_append;
}
