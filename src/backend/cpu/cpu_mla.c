// MLA decode attention over the latent cache (the absorbed form, spec §3.3).
// One query per sequence and head; the keys are the cached rows themselves:
// score_u = (q_lat . c_u + q_pe . kpe_u) * scale, out = sum_u softmax(score)_u c_u.
// The caller has folded wk_b into q_lat and applies wv_b to the output, so the
// attention never leaves the r_kv-dimensional latent space.
#include <math.h>
#include <omp.h>
#include <string.h>

#include "backend/cpu/cpu.h"

// q_lat [B, H, r_kv], q_pe [B, H, dr] (rotated), rows[b]: row b's cache, rows
// [c | rotated k_pe] of r_kv + dr (row u at row be_page_row(pg, b, u) of it),
// len[b] visible rows of it, out [B, H, r_kv]. pool is for the CUDA kernel's
// tiled copies; the CPU reads through rows[].
static void cpu_mla_decode_attn(be_t *be, void *out_, const void *q_lat_, const void *q_pe_, int64_t ldqp, int64_t hsqp,
                                void *const *rows_, be_pages_t pg, const int32_t *len, int max_len, const void *pool,
                                int64_t pool_rows, int B, int H, int r_kv, int dr, float scale) {
    float *out = out_;
    const float *q_lat = q_lat_, *q_pe = q_pe_;
    int64_t L = (int64_t)r_kv + dr; // one cache row
    int maxlen = max_len > 0 ? max_len : 0;
    int nthr = omp_get_max_threads(), per = maxlen > 0 ? maxlen : 1;
    cpu_tmp_t tmp; // one row of scores per thread
    float *scores = cpu_tmp_take(be, &tmp, (int64_t)nthr * per, "MLA decode attention");
    if (!scores) {
        cpu_fill_nan(out, (int64_t)B * H * r_kv);
        return;
    }
#pragma omp parallel num_threads(nthr) if ((int64_t)B * H * maxlen * L > CPU_PAR_MIN)
    {
        float *p = scores + (int64_t)omp_get_thread_num() * per;
#pragma omp for collapse(2) schedule(dynamic, 1)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++) {
                const float *ql = q_lat + ((int64_t)b * H + h) * r_kv,
                            *qp = q_pe + (int64_t)b * ldqp + (int64_t)h * hsqp;
                const float *rows = rows_[b];
                float *o = out + ((int64_t)b * H + h) * r_kv;
                int n = len[b] < maxlen ? len[b] : maxlen; // max_len bounds the scores buffer
                memset(o, 0, (size_t)r_kv * sizeof(float));
                if (n <= 0) continue; // nothing cached: a zero output rather than 0/0
                float m = -INFINITY;
                for (int u = 0; u < n; u++) {
                    const float *row = rows + be_page_row(pg, b, u) * L;
                    float s = 0;
                    for (int i = 0; i < r_kv; i++)
                        s += ql[i] * row[i];
                    for (int i = 0; i < dr; i++)
                        s += qp[i] * row[r_kv + i];
                    p[u] = s * scale;
                    if (p[u] > m) m = p[u];
                }
                double sum = cpu_exp_shift(p, n, m);
                float inv = (float)(1.0 / sum);
                for (int u = 0; u < n; u++) {
                    const float *row = rows + be_page_row(pg, b, u) * L;
                    float wgt = p[u] * inv;
                    for (int i = 0; i < r_kv; i++)
                        o[i] += wgt * row[i];
                }
            }
    }
    cpu_tmp_give(be, &tmp);
}

void cpu_register_mla(be_t *be) { be->mla_decode_attn = cpu_mla_decode_attn; }
