#include "model/rope.h"

#include <math.h>

// DeepSeek / HF get_mscale: 1 for s <= 1, else 0.1 m ln s + 1.
static double get_mscale(double s, double m) { return s <= 1.0 ? 1.0 : 0.1 * m * log(s) + 1.0; }

// Dimension index at which a wavelength completes `rot` rotations over the
// original context (YaRN's correction range).
static double corr_dim(double rot, int dr, double base, int orig) {
    return dr * log(orig / (rot * 2.0 * M_PI)) / (2.0 * log(base));
}

void rope_inv_freq(const rope_cfg_t *r, int dr, float *inv_freq, float *mscale) {
    int half = dr / 2;
    *mscale = 1.0f;
    for (int i = 0; i < half; i++)
        inv_freq[i] = (float)(1.0 / pow((double)r->theta, (2.0 * i) / dr));
    if (r->n_freq_div == half)
        for (int i = 0; i < half; i++)
            inv_freq[i] /= r->freq_div[i];
    switch (r->scaling) {
    case ROPE_SCALE_NONE: break;
    case ROPE_SCALE_LINEAR:
        for (int i = 0; i < half; i++)
            inv_freq[i] = inv_freq[i] / r->factor;
        break;
    case ROPE_SCALE_LLAMA3: {
        double lo_wl = r->orig_max_pos / r->low_freq_factor, hi_wl = r->orig_max_pos / r->high_freq_factor;
        for (int i = 0; i < half; i++) {
            double f = inv_freq[i], wl = 2.0 * M_PI / f;
            if (wl < hi_wl) continue;
            if (wl > lo_wl) {
                inv_freq[i] = (float)(f / r->factor);
            } else {
                double s = (r->orig_max_pos / wl - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
                inv_freq[i] = (float)((1.0 - s) * f / r->factor + s * f);
            }
        }
        break;
    }
    case ROPE_SCALE_YARN: {
        double base = r->theta, F = r->factor;
        double low = floor(corr_dim(r->beta_fast, dr, base, r->orig_max_pos));
        double high = ceil(corr_dim(r->beta_slow, dr, base, r->orig_max_pos));
        if (low < 0) low = 0;
        if (high > dr - 1) high = dr - 1;
        if (low == high) high += 0.001;
        for (int i = 0; i < half; i++) {
            float extra = (float)(1.0 / pow(base, (2.0 * i) / dr));
            float inter = (float)(1.0 / (F * pow(base, (2.0 * i) / dr)));
            double ramp = (i - low) / (high - low);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            // low index -> original frequency, high index -> frequency / F
            inv_freq[i] = (float)(inter * ramp + extra * (1.0 - ramp));
        }
        if (r->attn_factor > 0)
            *mscale = r->attn_factor;
        else
            *mscale = (float)(get_mscale(F, r->mscale) / get_mscale(F, r->mscale_all_dim));
        break;
    }
    }
}

void rope_tables(const rope_cfg_t *r, int dr, int n_pos, float *cos_out, float *sin_out) {
    float inv[512], ms;
    int half = dr / 2;
    rope_inv_freq(r, dr, inv, &ms);
#pragma omp parallel for schedule(static)
    for (int t = 0; t < n_pos; t++)
        for (int i = 0; i < half; i++) {
            float ang = (float)t * inv[i]; // fp32 product as the reference implementations
            cos_out[(int64_t)t * half + i] = (float)(ms * cos((double)ang));
            sin_out[(int64_t)t * half + i] = (float)(ms * sin((double)ang));
        }
}

float rope_softmax_mult(const rope_cfg_t *r) {
    if (r->scaling != ROPE_SCALE_YARN || r->mscale_all_dim == 0.0f) return 1.0f;
    double m = get_mscale(r->factor, r->mscale_all_dim);
    return (float)(m * m);
}
