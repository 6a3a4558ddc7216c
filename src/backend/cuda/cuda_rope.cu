// Rotary embeddings, in place, both pair conventions (see backend.h).
// One warp per (row n, head h); lane l handles pairs j = l + 32k, k < 8, so a
// head has at most 256 pairs (dr <= 512, the CPU twin's limit too). The
// interleaved layout moves values between lanes (pair (2j, 2j+1) lands at
// (j, j + dr/2)), so the whole head is read into registers, the warp
// synchronises, then writes: the in-place update never reads a written value.
#include "backend/cuda/cuda_vec.cuh"

enum { ROPE_MAX_K = 8, ROPE_WARPS = 8 };

__global__ void k_rope(bf16 *x, int64_t ld, int64_t hs, const int32_t *pos, const float *cosb, const float *sinb,
                       int64_t N, int nh, int dr, int style, int bwd) {
    const int lane = threadIdx.x & 31;
    const int64_t wid = (int64_t)blockIdx.x * ROPE_WARPS + (threadIdx.x >> 5);
    if (wid >= N * nh) return; // uniform per warp
    const int64_t n = wid / nh;
    const int h = (int)(wid - n * nh);
    const int half = dr / 2;
    bf16 *v = x + n * ld + (int64_t)h * hs;
    const float *c = cosb + (int64_t)pos[n] * half, *s = sinb + (int64_t)pos[n] * half;

    if (style == ROPE_NEOX) { // pairs (j, j + half): each lane owns its pairs, no exchange
        const float sign = bwd ? -1.0f : 1.0f;
        for (int j = lane; j < half; j += 32) {
            float x0 = __bfloat162float(v[j]), x1 = __bfloat162float(v[j + half]);
            float cj = c[j], sn = sign * s[j];
            v[j] = __float2bfloat16_rn(x0 * cj - x1 * sn);
            v[j + half] = __float2bfloat16_rn(x1 * cj + x0 * sn);
        }
        return;
    }
    float a[ROPE_MAX_K], b[ROPE_MAX_K];
#pragma unroll
    for (int k = 0; k < ROPE_MAX_K; k++) {
        int j = lane + 32 * k;
        a[k] = b[k] = 0.0f;
        if (j < half) {
            if (!bwd) { // inputs interleaved (2j, 2j+1)
                a[k] = __bfloat162float(v[2 * j]);
                b[k] = __bfloat162float(v[2 * j + 1]);
            } else { // gradients de-interleaved (j, j + half)
                a[k] = __bfloat162float(v[j]);
                b[k] = __bfloat162float(v[j + half]);
            }
        }
    }
    __syncwarp(); // every read of the head precedes every write
#pragma unroll
    for (int k = 0; k < ROPE_MAX_K; k++) {
        int j = lane + 32 * k;
        if (j < half) {
            float cj = c[j], sj = s[j];
            if (!bwd) { // outputs de-interleaved (j, j + half)
                v[j] = __float2bfloat16_rn(a[k] * cj - b[k] * sj);
                v[j + half] = __float2bfloat16_rn(b[k] * cj + a[k] * sj);
            } else { // transpose: back to the interleaved pair (2j, 2j+1)
                v[2 * j] = __float2bfloat16_rn(a[k] * cj + b[k] * sj);
                v[2 * j + 1] = __float2bfloat16_rn(-a[k] * sj + b[k] * cj);
            }
        }
    }
}

static void rope_launch(be_t *be, void *x, int64_t ld, int64_t hs, const int32_t *pos, const float *cosb,
                        const float *sinb, int64_t N, int nh, int dr, int style, int bwd) {
    const char *what = bwd ? "rope_bwd" : "rope_fwd";
    if (N <= 0 || nh <= 0 || dr <= 0) return;
    if (dr % 2 || dr > 64 * ROPE_MAX_K || (style != ROPE_NEOX && style != ROPE_INTERLEAVED)) {
        cu_op_error(be, "cuda %s: rotary dim %d must be even and at most %d; style %d must be NEOX or INTERLEAVED",
                    what, dr, 64 * ROPE_MAX_K, style);
        return;
    }
    int64_t warps = N * nh;
    unsigned blocks = (unsigned)((warps + ROPE_WARPS - 1) / ROPE_WARPS);
    k_rope<<<blocks, 32 * ROPE_WARPS, 0, cuda_stream(be)>>>((bf16 *)x, ld, hs, pos, cosb, sinb, N, nh, dr, style, bwd);
    cuda_check_launch(be, what);
}

static void cu_rope_fwd(be_t *be, void *x, int64_t ld, int64_t hs, const int32_t *pos, const float *cosb,
                        const float *sinb, int64_t N, int nh, int dr, int style) {
    rope_launch(be, x, ld, hs, pos, cosb, sinb, N, nh, dr, style, 0);
}

static void cu_rope_bwd(be_t *be, void *dx, int64_t ld, int64_t hs, const int32_t *pos, const float *cosb,
                        const float *sinb, int64_t N, int nh, int dr, int style) {
    rope_launch(be, dx, ld, hs, pos, cosb, sinb, N, nh, dr, style, 1);
}

// Grid N (one block per row): a warp per head of q (rotated in place) and of
// k (rotated into the row's K cache entry), with k_rope's NEOX formulas; then
// the block copies v into the row's V cache entry.
__global__ void k_rope_kv_append(bf16 *q, int64_t ldq, const bf16 *__restrict__ k, int64_t ldk,
                                 const bf16 *__restrict__ v, int64_t ldv, const int32_t *__restrict__ pos,
                                 const float *__restrict__ cosb, const float *__restrict__ sinb,
                                 bf16 *const *__restrict__ k_rows, bf16 *const *__restrict__ v_rows, be_pages_t pg,
                                 int H, int Hkv, int dh) {
    griddep_enter(); // a programmatic dependent launch (cuda_vec.cuh)
    const int r = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int64_t p = pos[r], kw = (int64_t)Hkv * dh;
    const int half = dh / 2;
    const float *c = cosb + p * half, *s = sinb + p * half;
    const int64_t row = cu_page_row(pg, r, p);
    bf16 *kd = k_rows[r] + row * kw, *vd = v_rows[r] + row * kw;
    for (int h = warp; h < H + Hkv; h += warps) {
        const bf16 *src = h < H ? q + r * ldq + (int64_t)h * dh : k + r * ldk + (int64_t)(h - H) * dh;
        bf16 *dst = h < H ? q + r * ldq + (int64_t)h * dh : kd + (int64_t)(h - H) * dh;
        for (int j = lane; j < half; j += 32) { // the lane reads its pair before writing it (q in place)
            float x0 = __bfloat162float(src[j]), x1 = __bfloat162float(src[j + half]);
            float cj = c[j], sn = s[j];
            dst[j] = __float2bfloat16_rn(x0 * cj - x1 * sn);
            dst[j + half] = __float2bfloat16_rn(x1 * cj + x0 * sn);
        }
    }
    for (int64_t i = threadIdx.x; i < kw; i += blockDim.x)
        vd[i] = v[r * ldv + i];
}

static void cu_rope_kv_append(be_t *be, void *q, int64_t ldq, const void *k, int64_t ldk, const void *v, int64_t ldv,
                              const int32_t *pos, const float *cosb, const float *sinb, void *const *k_rows,
                              void *const *v_rows, be_pages_t pg, int N, int H, int Hkv, int dh) {
    if (N <= 0) return;
    if (dh <= 0 || dh % 2) {
        cu_op_error(be, "cuda rope_kv_append: head dim %d must be even", dh);
        return;
    }
    cu_launch_pdl(k_rope_kv_append, dim3((unsigned)N), dim3(32 * ROPE_WARPS), 0, cuda_stream(be), (bf16 *)q, ldq,
                  (const bf16 *)k, ldk, (const bf16 *)v, ldv, pos, cosb, sinb, (bf16 *const *)k_rows,
                  (bf16 *const *)v_rows, pg, H, Hkv, dh);
    cuda_check_launch(be, "k_rope_kv_append");
}

// mla_rope_append: block r = row r. Warp h < H rotates head h's q_pe in
// place, warp H the rope key into the cache row; the interleaved pairs are
// read into registers before any write, as in k_rope. Then the block copies
// the latent into the row.
__global__ void k_mla_rope_append(bf16 *q, int64_t ldq, int64_t hs, const bf16 *__restrict__ c, int64_t ldc,
                                  const bf16 *__restrict__ kpe, int64_t ldk, const int32_t *__restrict__ pos,
                                  const float *__restrict__ cosb, const float *__restrict__ sinb,
                                  bf16 *const *__restrict__ rows, be_pages_t pg, int H, int r_kv, int dr) {
    griddep_enter(); // a programmatic dependent launch (cuda_vec.cuh)
    const int r = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int64_t p = pos[r];
    const int half = dr / 2;
    const float *cs = cosb + p * half, *sn = sinb + p * half;
    bf16 *row = rows[r] + cu_page_row(pg, r, p) * (r_kv + dr);
    for (int h = warp; h <= H; h += warps) {
        const bf16 *src = h < H ? q + r * ldq + (int64_t)h * hs : kpe + r * ldk;
        bf16 *dst = h < H ? q + r * ldq + (int64_t)h * hs : row + r_kv;
        float a[ROPE_MAX_K], b[ROPE_MAX_K];
#pragma unroll
        for (int k = 0; k < ROPE_MAX_K; k++) {
            const int j = lane + 32 * k;
            a[k] = j < half ? __bfloat162float(src[2 * j]) : 0.0f;
            b[k] = j < half ? __bfloat162float(src[2 * j + 1]) : 0.0f;
        }
        __syncwarp(); // q is rotated in place: every read of the head precedes every write
#pragma unroll
        for (int k = 0; k < ROPE_MAX_K; k++) {
            const int j = lane + 32 * k;
            if (j < half) {
                dst[j] = __float2bfloat16_rn(a[k] * cs[j] - b[k] * sn[j]);
                dst[j + half] = __float2bfloat16_rn(b[k] * cs[j] + a[k] * sn[j]);
            }
        }
    }
    for (int i = threadIdx.x; i < r_kv; i += blockDim.x)
        row[i] = c[r * ldc + i];
}

static void cu_mla_rope_append(be_t *be, void *q, int64_t ldq, int64_t hs, const void *c, int64_t ldc, const void *kpe,
                               int64_t ldk, const int32_t *pos, const float *cosb, const float *sinb, void *const *rows,
                               be_pages_t pg, int N, int H, int r_kv, int dr) {
    if (N <= 0) return;
    if (dr <= 0 || dr % 2 || dr > 64 * ROPE_MAX_K || H <= 0 || r_kv < 0) {
        cu_op_error(be, "cuda mla_rope_append: H=%d r_kv=%d dr=%d not supported (dr even, at most %d)", H, r_kv, dr,
                    64 * ROPE_MAX_K);
        return;
    }
    cu_launch_pdl(k_mla_rope_append, dim3((unsigned)N), dim3(32 * ROPE_WARPS), 0, cuda_stream(be), (bf16 *)q, ldq, hs,
                  (const bf16 *)c, ldc, (const bf16 *)kpe, ldk, pos, cosb, sinb, (bf16 *const *)rows, pg, H, r_kv, dr);
    cuda_check_launch(be, "k_mla_rope_append");
}

extern "C" void cuda_register_rope(be_t *be) {
    be->rope_kv_append = cu_rope_kv_append;
    be->mla_rope_append = cu_mla_rope_append;
    be->rope_fwd = cu_rope_fwd;
    be->rope_bwd = cu_rope_bwd;
}
