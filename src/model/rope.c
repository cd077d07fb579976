/* RoPE inverse frequencies (default and llama3 scaling). */
#include "model/rope.h"

#include <math.h>

void rp_rope_inv_freq(const rp_model_config *c, float *inv_freq) {
    int half = c->head_dim / 2;
    for (int i = 0; i < half; i++) {
        float expo = (float)(2 * i) / (float)c->head_dim;
        inv_freq[i] = 1.0f / powf((float)c->rope.theta, expo);
    }
    if (c->rope.type != RP_ROPE_LLAMA3) return;
    const double pi = 3.14159265358979323846;
    double factor = c->rope.factor, lo = c->rope.low_freq_factor, hi = c->rope.high_freq_factor;
    double old_ctx = c->rope.original_max_position_embeddings;
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
