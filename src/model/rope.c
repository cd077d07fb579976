/* RoPE inverse frequencies (default, llama3, linear and yarn scaling) and
 * yarn's attention factor, step for step as transformers' modeling_rope_utils
 * computes them: fp32 where it computes on tensors, double where it computes
 * on Python floats. */
#include "model/rope.h"

#include <math.h>

static const double pi = 3.14159265358979323846;

static void llama3_scale(const rp_rope_config *r, int half, float *inv_freq) {
    double factor = r->factor, lo = r->low_freq_factor, hi = r->high_freq_factor;
    double old_ctx = r->original_max_position_embeddings;
    double lo_wavelen = old_ctx / lo, hi_wavelen = old_ctx / hi;
    for (int i = 0; i < half; i++) {
        float f = inv_freq[i];
        float wavelen = (float)(2 * pi) / f;
        float scaled = wavelen > (float)lo_wavelen ? f / (float)factor : f;
        float smooth = ((float)old_ctx / wavelen - (float)lo) / (float)(hi - lo);
        float smoothed = (1.0f - smooth) * scaled / (float)factor + smooth * scaled;
        int medium = !(wavelen < (float)hi_wavelen) && !(wavelen > (float)lo_wavelen);
        inv_freq[i] = medium ? smoothed : scaled;
    }
}

/* The dimension (of dim) at which a frequency turns `rotations` times over
 * the original context: YaRN's inverse of wavelength = 2 pi base^(2d/dim). */
static double yarn_correction_dim(double rotations, int dim, double base, int original_ctx) {
    return (double)dim * log((double)original_ctx / (rotations * 2 * pi)) / (2 * log(base));
}

/* YaRN: dimensions that turn more than beta_fast times over the original
 * context keep their frequency (extrapolation), those turning fewer than
 * beta_slow times are divided by factor (interpolation), a linear ramp
 * between. */
static void yarn_inv_freq(const rp_model_config *c, int half, float *inv_freq) {
    const rp_rope_config *r = &c->rope;
    const int dim = c->head_dim;
    const double beta_fast = r->beta_fast > 0 ? r->beta_fast : 32, beta_slow = r->beta_slow > 0 ? r->beta_slow : 1;
    double low = yarn_correction_dim(beta_fast, dim, r->theta, r->original_max_position_embeddings);
    double high = yarn_correction_dim(beta_slow, dim, r->theta, r->original_max_position_embeddings);
    if (!r->no_truncate) {
        low = floor(low);
        high = ceil(high);
    }
    if (low < 0) low = 0;
    if (high > dim - 1) high = dim - 1;
    if (low == high) high += 0.001; /* a step, not a division by zero */
    for (int i = 0; i < half; i++) {
        float pos_freq = powf((float)r->theta, (float)(2 * i) / (float)dim);
        float extrapolated = 1.0f / pos_freq, interpolated = 1.0f / ((float)r->factor * pos_freq);
        float ramp = ((float)i - (float)low) / (float)(high - low);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        float keep = 1.0f - ramp; /* transformers' inv_freq_extrapolation_factor */
        inv_freq[i] = interpolated * (1.0f - keep) + extrapolated * keep;
    }
}

void rp_rope_inv_freq(const rp_model_config *c, float *inv_freq) {
    int half = c->head_dim / 2;
    for (int i = 0; i < half; i++) {
        float expo = (float)(2 * i) / (float)c->head_dim;
        inv_freq[i] = 1.0f / powf((float)c->rope.theta, expo);
    }
    switch (c->rope.type) {
    case RP_ROPE_DEFAULT: break;
    case RP_ROPE_LLAMA3: llama3_scale(&c->rope, half, inv_freq); break;
    case RP_ROPE_LINEAR:
        for (int i = 0; i < half; i++) inv_freq[i] /= (float)c->rope.factor;
        break;
    case RP_ROPE_YARN: yarn_inv_freq(c, half, inv_freq); break;
    }
}

/* transformers' get_mscale: 0.1 mscale ln(scale) + 1, and 1 where the
 * context is not stretched. */
static double yarn_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * log(scale) + 1.0; }

float rp_rope_attention_scale(const rp_model_config *c) {
    const rp_rope_config *r = &c->rope;
    if (r->type != RP_ROPE_YARN) return 1.0f;
    if (r->attention_factor > 0) return (float)r->attention_factor;
    if (r->mscale != 0 && r->mscale_all_dim != 0)
        return (float)(yarn_mscale(r->factor, r->mscale) / yarn_mscale(r->factor, r->mscale_all_dim));
    return (float)yarn_mscale(r->factor, 1.0);
}
